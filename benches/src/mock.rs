//! `mock-codex`: a mock of the ChatGPT Codex upstream, built from docs/protocol.md
//! (docs/protocol.md#the-mock), used by the integration tests in-process and by the load
//! tests as a standalone binary.
//!
//! # Key Components
//! - [`MockConfig`]: process-wide settings (listen address, TLS, prefix, stream shape, delays,
//!   token policy).
//! - [`MockCodex::start`]: spawns the server on its own OS thread (a multi-thread Tokio runtime)
//!   and returns a [`MockHandle`] once the socket is bound.
//! - [`MockHandle`]: addresses, recorded requests, stream counters, and the account registry
//!   (issue tokens, per-account [`Behaviour`], quota).
//! - [`Behaviour`]: the failure / shape controls. The same keys arrive as `x-mock-*` request
//!   headers, as `client_metadata` entries in the request body, per account
//!   ([`MockHandle::set_behaviour`]) and per process ([`MockConfig::default_behaviour`]).
//!
//! # Usage
//! One listener serves HTTP/1.1 and h2c (prior knowledge) on plain TCP, and h2 or HTTP/1.1 via
//! ALPN when [`MockConfig::tls`] is set. Routes:
//! - `POST {prefix}/responses`: validation like the real backend, then an SSE stream with the
//!   full Responses event sequence (one DATA frame / chunk per event).
//! - `GET {prefix}/responses` with `Upgrade: websocket` (HTTP/1.1): the Responses WebSocket
//!   (docs/protocol.md#websocket-mode): `response.create` frames answered with the same events, one per text frame,
//!   connection-local `previous_response_id`, warm-ups, one response in flight per socket
//!   ([`MockConfig::ws_max_connection_age`], [`MockConfig::ws_refuse_upgrade`],
//!   [`MockHandle::ws_kill_all`]).
//! - Account-bound blobs (docs/protocol.md#account-bound-blobs): reasoning `encrypted_content` (only when the request's
//!   `include` asks for it) and remote compaction v2's `compaction` item (answer to a request
//!   whose last input item is `compaction_trigger`) are minted for the serving account; a
//!   request carrying a blob another account minted is refused `400 invalid_encrypted_content`
//!   (or with `code: null`, control `x-mock-blob-error: null`), on HTTP and WebSocket alike
//!   ([`RecordedRequest::foreign_blobs`], [`blob_minted_for`]).
//! - `GET {prefix}/models`: the fixture catalog with an `ETag` (honours `If-None-Match`).
//! - `GET /backend-api/wham/usage`, `GET /backend-api/wham/accounts/check`.
//! - `POST /oauth/token`: `refresh_token` (rotating) and `authorization_code` grants.
//! - `/__mock/*`: operator endpoints (recorded requests, reset, stats, accounts, behaviour).
//!
//! # Error handling
//! Library code never panics on bad input: invalid control values are answered with
//! `400 {"detail":"mock-codex: ..."}` and startup errors are returned from
//! [`MockCodex::start`].

mod blobs;
mod controls;
mod errors;
mod events;
mod jwt;
mod oauth;
mod reply;
mod routes;
mod server;
mod state;
mod ws;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::Ordering, Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use blobs::{verify as blob_minted_for, PREFIX as BLOB_PREFIX};
use bytes::Bytes;
pub use controls::{per_second, Behaviour, ErrorKind, RefreshError};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use self::state::Shared;

/// The default path prefix of the Codex routes (`https://chatgpt.com/backend-api/codex`).
pub const DEFAULT_PREFIX: &str = "/backend-api/codex";

/// The default assistant text streamed by a successful response.
pub const DEFAULT_TEXT: &str =
    "Hello from mock-codex! This answer was streamed by the mock Codex upstream.";

/// The model catalog served at `GET {prefix}/models`.
pub const MODELS_CATALOG: &str = include_str!("../fixtures/codex-models-catalog.json");

/// Process-wide settings of the mock.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Where to listen. `127.0.0.1:0` picks a free port.
    pub listen: SocketAddr,
    /// `(cert.pem, key.pem)`: serve TLS (ALPN `h2`, `http/1.1`) instead of plain TCP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Prefix of the Codex routes; `/responses` and `/models` hang below it.
    pub prefix: String,
    /// Number of `response.output_text.delta` events (capped by the text's length in chars;
    /// 0 sends no deltas).
    pub deltas: usize,
    /// Assistant text; [`DEFAULT_TEXT`] when `None`.
    pub text: Option<String>,
    /// Delay before the response head of `POST /responses` (errors included).
    pub first_byte_delay: Duration,
    /// Delay between two SSE events of one stream.
    pub inter_event_delay: Duration,
    /// Delay of the OAuth token endpoint before it answers.
    pub token_delay: Duration,
    /// Require the bearer of `/responses` and `/wham/usage` to be the latest access token
    /// issued for the `ChatGPT-Account-Id` (and not expired).
    pub strict_tokens: bool,
    /// Refresh answers carry no new `refresh_token` (the old one stays valid).
    pub omit_rotated_refresh_token: bool,
    /// Lifetime (`exp`, `expires_in`) of issued access tokens.
    pub access_token_ttl: Duration,
    /// Plan type of accounts that were not registered with [`MockHandle::add_account`].
    pub default_plan_type: String,
    /// Quota used (percent) reported for accounts without [`MockHandle::set_quota`].
    pub default_quota: (f64, f64),
    /// Controls applied to every request (below per-account and per-request controls).
    pub default_behaviour: Behaviour,
    /// Per-account behaviours installed at start (same as [`MockHandle::set_behaviour`]).
    pub account_behaviours: Vec<(String, Behaviour)>,
    /// How many `/responses` (and token) requests to keep; the oldest are dropped. 0 disables
    /// recording (load tests).
    pub max_recorded: usize,
    /// Tokio worker threads of the server runtime.
    pub worker_threads: usize,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` advertised on HTTP/2 connections. A gateway that
    /// multiplexes every stream of a worker on one connection holds at most this many streams
    /// per connection (real origins advertise a few hundred).
    pub h2_max_concurrent_streams: u32,
    /// Send GOAWAY (graceful: streams already open finish) on a connection once it has
    /// received this many requests, as origins do when they rotate connections.
    pub goaway_after_requests: Option<usize>,
    /// Responses WebSocket lifetime: a `response.create` on a socket older than this is
    /// answered with an `error` event (`websocket_connection_limit_reached`) and the socket is
    /// closed (close code 1000). The real backend's limit is 60 minutes. `None`: no limit.
    pub ws_max_connection_age: Option<Duration>,
    /// Answer WebSocket upgrades of `{prefix}/responses` with this HTTP status (e.g. 426 or
    /// 404) instead of 101, to test HTTP fallbacks. Changeable at run time with
    /// [`MockHandle::set_ws_refuse_upgrade`].
    pub ws_refuse_upgrade: Option<u16>,
    /// Text frames larger than this are refused with a close 1009 (message too big) before
    /// any answer, as the upstream does for oversized WebSocket payloads.
    pub ws_max_message_bytes: Option<usize>,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            deltas: 8,
            text: None,
            first_byte_delay: Duration::ZERO,
            inter_event_delay: Duration::ZERO,
            token_delay: Duration::ZERO,
            strict_tokens: false,
            omit_rotated_refresh_token: false,
            access_token_ttl: Duration::from_secs(3600),
            default_plan_type: "plus".to_owned(),
            default_quota: (0.0, 0.0),
            default_behaviour: Behaviour::default(),
            account_behaviours: Vec::new(),
            max_recorded: 100_000,
            worker_threads: 2,
            h2_max_concurrent_streams: 4096,
            goaway_after_requests: None,
            ws_max_connection_age: None,
            ws_refuse_upgrade: None,
            ws_max_message_bytes: None,
        }
    }
}

/// A ChatGPT account known to the mock (the identity claims of its tokens).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MockAccount {
    /// `https://api.openai.com/auth`.`chatgpt_account_id`; the `ChatGPT-Account-Id` header.
    pub chatgpt_account_id: String,
    /// `chatgpt_user_id`.
    pub chatgpt_user_id: String,
    /// Top-level `email` claim.
    pub email: String,
    /// `chatgpt_plan_type` (free, plus, pro, team, ...).
    pub plan_type: String,
}

impl MockAccount {
    /// An account with derived user id (`user-<id>`), email (`<id>@mock-codex.test`) and plan
    /// `plus`.
    pub fn new(chatgpt_account_id: impl Into<String>) -> Self {
        let id = chatgpt_account_id.into();
        Self {
            chatgpt_user_id: format!("user-{id}"),
            email: format!("{id}@mock-codex.test"),
            plan_type: "plus".to_owned(),
            chatgpt_account_id: id,
        }
    }

    /// Sets the plan type.
    pub fn with_plan(mut self, plan_type: impl Into<String>) -> Self {
        self.plan_type = plan_type.into();
        self
    }
}

impl Default for MockAccount {
    fn default() -> Self {
        Self::new(format!("acct-mock-{}", state::rand_hex(6)))
    }
}

/// Tokens issued by the mock (by [`MockHandle::add_account`] or the token endpoint).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedTokens {
    /// The account the tokens belong to.
    pub account_id: String,
    /// Unsigned JWT with the real claim layout and `exp`.
    pub access_token: String,
    /// Opaque rotating refresh token (`rt_mock_...`).
    pub refresh_token: String,
    /// Unsigned JWT id token.
    pub id_token: String,
    /// Seconds until the access token expires.
    pub expires_in: u64,
}

impl std::fmt::Debug for IssuedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedTokens")
            .field("account_id", &self.account_id)
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

/// One request received by the mock (`/responses`, a WebSocket `response.create` frame, or the
/// token endpoint).
///
/// A WebSocket frame is recorded with `method` `"WS"`, the path, query, version and headers of
/// its socket's upgrade request, and the frame's JSON as the body.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// `POST`, `GET`, ..., or `WS` for a WebSocket `response.create` frame.
    pub method: String,
    /// The URI path, without the query.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// `"HTTP/1.1"` or `"HTTP/2.0"`.
    pub version: String,
    /// Headers in arrival order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Bytes,
    /// The body decoded as JSON (a form-encoded token request is decoded to an object).
    pub json: Option<serde_json::Value>,
    /// Milliseconds since the mock started.
    pub received_at_ms: u64,
}

impl RecordedRequest {
    /// The first value of a header (name matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `ChatGPT-Account-Id` header.
    pub fn account_id(&self) -> Option<&str> {
        self.header("chatgpt-account-id")
    }

    /// Every opaque blob (`encrypted_content` of reasoning, compaction, ... items) in the
    /// body's `input`.
    pub fn blobs(&self) -> Vec<String> {
        match self.json.as_ref().and_then(|j| j.get("input")) {
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .flat_map(blobs::item_blobs)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The blobs of [`Self::blobs`] that the request's account (`ChatGPT-Account-Id`) did not
    /// mint: what the real backend refuses with `invalid_encrypted_content`. Empty for a
    /// gateway that never sends one account's blobs to another.
    pub fn foreign_blobs(&self) -> Vec<String> {
        let account = self.account_id().unwrap_or_default();
        self.blobs()
            .into_iter()
            .filter(|b| !blobs::verify(b, account))
            .collect()
    }

    /// The body as (lossy) UTF-8.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let headers: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        serde_json::json!({
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "version": self.version,
            "headers": headers,
            "json": self.json,
            "body": if self.json.is_some() { serde_json::Value::Null } else { self.body_text().into() },
            "received_at_ms": self.received_at_ms,
        })
    }
}

/// The SSE frames of a default successful answer (`response.created` ... `response.completed`)
/// for `model`, with `text` split into `deltas` deltas: the exact bytes a `/responses` stream
/// sends, for micro-benchmarks and fixtures. One `Bytes` per event.
pub fn render_answer(model: &str, text: &str, deltas: usize) -> Vec<Bytes> {
    events::build(&events::Plan {
        model,
        service_tier: "default",
        text,
        deltas,
        tokens: None,
        reasoning: false,
        encrypted: None,
        compaction: None,
        tool: None,
        incomplete: None,
        empty_completed_output: false,
        fail_in_stream: None,
        fail_after_output: None,
        input_tokens: 100,
        cached_tokens: 0,
    })
    .events
}

/// Polls `done` every 5 ms until it holds or `timeout` passes.
fn wait_until(timeout: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Entry point of the mock.
#[derive(Debug)]
pub struct MockCodex;

impl MockCodex {
    /// Binds `cfg.listen`, spawns the server thread and returns once it is listening.
    pub fn start(cfg: MockConfig) -> anyhow::Result<MockHandle> {
        let tls = match &cfg.tls {
            Some((cert, key)) => Some(server::tls_acceptor(cert, key)?),
            None => None,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let workers = cfg.worker_threads.max(1);
        let thread = std::thread::Builder::new()
            .name("mock-codex".to_owned())
            .spawn(move || server::run(cfg, tls, workers, ready_tx, stop_rx))?;
        let shared = match ready_rx.recv() {
            Ok(Ok(shared)) => shared,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                anyhow::bail!("mock-codex server thread exited before listening");
            }
        };
        Ok(MockHandle {
            shared,
            guard: Arc::new(ServerGuard {
                stop: Mutex::new(Some(stop_tx)),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }
}

/// Stops the server when the last [`MockHandle`] clone is dropped.
struct ServerGuard {
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ServerGuard {
    fn stop(&self) {
        if let Some(tx) = state::lock(&self.stop).take() {
            let _ = tx.send(());
        }
        let thread = state::lock(&self.thread).take();
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running mock. Cloning shares the server; the last clone dropped (or [`Self::shutdown`])
/// stops it.
#[derive(Clone)]
pub struct MockHandle {
    shared: Arc<Shared>,
    guard: Arc<ServerGuard>,
}

impl std::fmt::Debug for MockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHandle")
            .field("addr", &self.shared.addr)
            .field("origin", &self.shared.origin)
            .finish_non_exhaustive()
    }
}

// === impl MockHandle ===

impl MockHandle {
    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http(s)://127.0.0.1:PORT` (an unspecified listen IP is shown as loopback).
    pub fn origin(&self) -> String {
        self.shared.origin.clone()
    }

    /// The Codex base URL: `{origin}{prefix}`, e.g. `http://127.0.0.1:PORT/backend-api/codex`.
    pub fn base_url(&self) -> String {
        format!("{}{}", self.shared.origin, self.shared.prefix)
    }

    /// The OAuth token endpoint: `{origin}/oauth/token`.
    pub fn token_url(&self) -> String {
        format!("{}/oauth/token", self.shared.origin)
    }

    /// The quota endpoint: `{origin}/backend-api/wham/usage`.
    pub fn usage_url(&self) -> String {
        format!("{}/backend-api/wham/usage", self.shared.origin)
    }

    /// Every `POST {prefix}/responses` received (valid or not) and every WebSocket
    /// `response.create` frame (method `"WS"`), oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.iter().cloned().collect()
    }

    /// Every token endpoint request received, oldest first.
    pub fn token_requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().token_requests.iter().cloned().collect()
    }

    /// Every model catalog request (`GET {prefix}/models`) received, oldest first.
    pub fn models_requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().models_requests.iter().cloned().collect()
    }

    /// Forgets the recorded `/responses`, token and model catalog requests.
    pub fn clear_requests(&self) {
        let mut inner = self.shared.lock();
        inner.requests.clear();
        inner.token_requests.clear();
        inner.models_requests.clear();
    }

    /// Changes the token endpoint's delay for requests arriving from now on (`None`: back to
    /// [`MockConfig::token_delay`]); a request already waiting keeps its delay.
    pub fn set_token_delay(&self, delay: Option<Duration>) {
        let v = delay.map_or(0, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1) + 1
        });
        self.shared
            .counters
            .token_delay_ms_plus_one
            .store(v, Ordering::SeqCst);
    }

    /// Number of `POST /oauth/token` calls (counted on arrival, before `token_delay`).
    pub fn token_calls(&self) -> usize {
        self.shared.counters.token_calls.load(Ordering::SeqCst)
    }

    /// Response streams currently open: SSE bodies and WebSocket responses (warm-ups
    /// excepted). A stream is closed when it ends, errors, or the peer goes away.
    pub fn active_streams(&self) -> usize {
        self.shared.counters.active_streams.load(Ordering::SeqCst)
    }

    /// Response streams (SSE bodies and WebSocket responses, warm-ups excepted) that
    /// produced their terminal event (`response.completed`, `response.incomplete` or
    /// `response.failed`).
    pub fn completed_streams(&self) -> usize {
        self.shared
            .counters
            .completed_streams
            .load(Ordering::SeqCst)
    }

    /// Number of `POST {prefix}/responses` requests received (also when not recorded).
    pub fn responses_requests(&self) -> usize {
        self.shared.counters.responses.load(Ordering::SeqCst)
    }

    /// Polls until `active_streams() == n` or `timeout` passes (blocking the calling thread);
    /// returns whether the count was reached.
    pub fn wait_active_streams(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.active_streams() == n)
    }

    /// The Responses WebSocket URL: `ws(s)://127.0.0.1:PORT{prefix}/responses`.
    pub fn ws_url(&self) -> String {
        let origin = &self.shared.origin;
        let rest = origin
            .strip_prefix("https://")
            .map(|r| format!("wss://{r}"))
            .or_else(|| origin.strip_prefix("http://").map(|r| format!("ws://{r}")))
            .unwrap_or_else(|| origin.clone());
        format!("{rest}{}", self.shared.responses_path)
    }

    /// WebSocket upgrades of `{prefix}/responses` answered with 101 (total).
    pub fn ws_handshakes(&self) -> usize {
        self.shared.counters.ws_handshakes.load(Ordering::SeqCst)
    }

    /// WebSocket upgrades answered with an HTTP error instead (refused, auth, bad headers).
    pub fn ws_rejected_handshakes(&self) -> usize {
        self.shared.counters.ws_rejected.load(Ordering::SeqCst)
    }

    /// WebSocket sockets currently open (from the 101 until the socket is dropped).
    pub fn ws_open(&self) -> usize {
        self.shared.counters.ws_open.load(Ordering::SeqCst)
    }

    /// `response.create` frames received over WebSocket (valid or not; each is recorded).
    pub fn ws_requests(&self) -> usize {
        self.shared.counters.ws_requests.load(Ordering::SeqCst)
    }

    /// Responses served over WebSocket: `response.create` frames answered with a response
    /// (warm-ups included; error events excluded).
    pub fn ws_responses(&self) -> usize {
        self.shared.counters.ws_responses.load(Ordering::SeqCst)
    }

    /// Polls until `ws_open() == n` or `timeout` passes (blocking the calling thread); returns
    /// whether the count was reached.
    pub fn wait_ws_open(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.ws_open() == n)
    }

    /// Answer WebSocket upgrades with `status` instead of 101 (`None`: accept them again).
    /// Sockets already open are not affected.
    pub fn set_ws_refuse_upgrade(&self, status: Option<u16>) {
        self.shared
            .ws_refuse_upgrade
            .store(status.unwrap_or(0), Ordering::SeqCst);
    }

    /// Drops every open WebSocket connection abruptly (no close frame; an in-flight response
    /// just stops), as when the upstream socket dies. Returns how many sockets were told; they
    /// are gone shortly after (see [`Self::wait_ws_open`]).
    pub fn ws_kill_all(&self) -> usize {
        self.shared
            .ws_control
            .send(ws::WsCommand::Kill)
            .unwrap_or(0)
    }

    /// Makes every open WebSocket go silent with its TCP connection open (no pongs, no
    /// answers), as a connection that died without a FIN or RST. Returns how many sockets were
    /// told.
    pub fn ws_freeze_all(&self) -> usize {
        self.shared
            .ws_control
            .send(ws::WsCommand::Freeze)
            .unwrap_or(0)
    }

    /// Closes every open WebSocket gracefully: a close frame (1001 going away), then the
    /// connection is dropped once the client answers (or after 2 s). Returns how many sockets
    /// were told.
    pub fn ws_close_all(&self) -> usize {
        self.shared
            .ws_control
            .send(ws::WsCommand::Close)
            .unwrap_or(0)
    }

    /// Registers (or re-registers) an account and issues a fresh token set; the previous
    /// tokens of the account stop being current.
    pub fn add_account(&self, account: MockAccount) -> IssuedTokens {
        oauth::register_account(&self.shared, account)
    }

    /// The current tokens of a registered account.
    pub fn account_tokens(&self, chatgpt_account_id: &str) -> Option<IssuedTokens> {
        oauth::current_tokens(&self.shared, chatgpt_account_id)
    }

    /// Revokes the account's current access token, as the backend does when it invalidates a
    /// session: under `strict_tokens` every request bearing it is answered 401
    /// `token_invalidated` until a refresh issues a new one (the refresh token stays valid),
    /// however many requests arrive meanwhile. [`MockHandle::account_tokens`] is `None` until
    /// then.
    pub fn revoke_access_token(&self, chatgpt_account_id: &str) {
        self.shared
            .lock()
            .account_mut(chatgpt_account_id, &self.shared.cfg)
            .access_token = None;
    }

    /// Installs the behaviour of an account (replacing the previous one and resetting its
    /// `fail_times` counter). The account need not be registered.
    pub fn set_behaviour(&self, chatgpt_account_id: &str, b: Behaviour) {
        self.shared.set_behaviour(chatgpt_account_id, Some(b));
    }

    /// Removes the behaviour of an account.
    pub fn clear_behaviour(&self, chatgpt_account_id: &str) {
        self.shared.set_behaviour(chatgpt_account_id, None);
    }

    /// Sets the used percentages reported in the quota headers and `/wham/usage`.
    pub fn set_quota(&self, chatgpt_account_id: &str, primary_pct: f64, secondary_pct: f64) {
        self.shared
            .lock()
            .account_mut(chatgpt_account_id, &self.shared.cfg)
            .quota = Some((primary_pct, secondary_pct));
    }

    /// Sets the reset credits `/wham/usage` reports (`rate_limit_reset_credits`).
    pub fn set_reset_credits(&self, chatgpt_account_id: &str, available: u64) {
        self.shared
            .lock()
            .account_mut(chatgpt_account_id, &self.shared.cfg)
            .reset_credits = available;
    }

    /// Stops the server now (also done when the last clone is dropped). Open streams are cut.
    pub fn shutdown(&self) {
        self.guard.stop();
    }
}
