//! The Responses WebSocket (docs/protocol.md#websocket-mode): `GET {prefix}/responses` with
//! `Upgrade: websocket` on HTTP/1.1 (plain TCP or TLS), one JSON event per text frame.
//!
//! # Key Components
//! - [`is_upgrade`] / [`handshake`]: the upgrade request is authenticated like
//!   `POST /responses` (same statuses and bodies when rejected, as ordinary HTTP answers), or
//!   refused with [`super::MockConfig::ws_refuse_upgrade`]; otherwise 101 and a socket task.
//!   permessage-deflate is declined (no `Sec-WebSocket-Extensions` in the answer).
//! - The socket task: `response.create` frames are answered with the events of the HTTP path
//!   (same renderer and controls), preceded by a `codex.rate_limits` event; `generate: false`
//!   is a warm-up (`response.created` + `response.completed`, empty output);
//!   `previous_response_id` resolves only against responses produced on the same socket; one
//!   response in flight per socket; an age limit
//!   ([`super::MockConfig::ws_max_connection_age`]) answers `websocket_connection_limit_reached`
//!   and closes.
//! - [`WsCommand`]: kill (drop the TCP connection, no close frame) or close (close frame 1001)
//!   every open socket, from [`super::MockHandle`].
//!
//! # Error handling
//! Problems with a frame are answered with an `error` event in the WebSocket shape
//! (`{"type":"error","status":N,"error":{type,code,message,param},"headers"?}`) and the socket
//! stays open. A client that goes away (read or write error) ends the socket task.

use std::{
    collections::{HashSet, VecDeque},
    io,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http::{request::Parts, HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::BodyExt as _;
use hyper::{body::Incoming, upgrade::Upgraded};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::{
    sync::broadcast,
    time::{Instant, Sleep},
};
use tokio_tungstenite::{
    tungstenite::{
        handshake::derive_accept_key,
        protocol::{frame::coding::CloseCode, CloseFrame, Role},
        Message, Utf8Bytes,
    },
    WebSocketStream,
};

use super::{
    errors,
    events::{self, SseStream},
    reply::{self, Body},
    routes::{
        account_header, bearer, check_strict, error_answer, foreign_blob, header, layered_controls,
        plan, quota_headers, request_controls, service_tier, validate,
    },
    state::{rand_hex, QuotaView, Shared, PRIMARY_WINDOW_MIN, SECONDARY_WINDOW_MIN},
    RecordedRequest,
};

/// The socket of one accepted upgrade.
type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// How long a closing socket waits for the client's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A command to every open socket (see [`super::MockHandle::ws_kill_all`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WsCommand {
    /// Drop the connection at once: no close frame, an in-flight response just stops.
    Kill,
    /// Send a close frame (1001 going away), wait briefly for the client's, then drop.
    Close,
    /// Go silent: stop reading and writing (no pongs, no answers) with the TCP connection
    /// left open, as a connection that died without a FIN or RST. `Kill` ends it.
    Freeze,
}

/// Whether `req` is a WebSocket upgrade of `{prefix}/responses` (HTTP/1.1 `GET` with
/// `Upgrade: websocket`).
pub(crate) fn is_upgrade(shared: &Shared, req: &Request<Incoming>) -> bool {
    req.method() == Method::GET
        && req.version() == Version::HTTP_11
        && req.uri().path() == shared.responses_path
        && header(req.headers(), "upgrade").is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
        })
}

/// Answers an upgrade: an HTTP error, or 101 and a spawned socket task.
pub(crate) async fn handshake(shared: Arc<Shared>, mut req: Request<Incoming>) -> Response<Body> {
    let on_upgrade = hyper::upgrade::on(&mut req);
    let (parts, _body) = req.into_parts();
    let (resp, conn) = match accept(&shared, &parts) {
        Ok(x) => x,
        Err(r) => {
            shared.counters.ws_rejected.fetch_add(1, Ordering::SeqCst);
            return r;
        }
    };
    // Counted (and subscribed to the kill / close commands) before the 101 leaves, so a
    // client sees the socket counted as soon as its handshake returns.
    shared.counters.ws_handshakes.fetch_add(1, Ordering::SeqCst);
    let open = OpenGuard::new(shared.clone());
    let control = shared.ws_control.subscribe();
    tokio::spawn(async move {
        let _open = open;
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                conn.run(ws, control).await;
            }
            Err(e) => tracing::debug!(error = %e, "mock-codex WebSocket upgrade failed"),
        }
    });
    resp
}

/// Decrements the open-socket count when the socket task ends.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: Arc<Shared>) -> Self {
        shared.counters.ws_open.fetch_add(1, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.counters.ws_open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Checks the upgrade like `POST /responses` checks its request; `Ok` is the 101 answer.
// The error is the HTTP answer itself, built once per rejected handshake.
#[allow(clippy::result_large_err)]
fn accept(shared: &Arc<Shared>, parts: &Parts) -> Result<(Response<Body>, Conn), Response<Body>> {
    let refuse = shared.ws_refuse_upgrade.load(Ordering::SeqCst);
    if refuse != 0 {
        return Err(reply::detail(
            refuse,
            "mock-codex: the WebSocket upgrade is refused (ws_refuse_upgrade)",
        ));
    }
    let h = &parts.headers;
    let Some(token) = bearer(h) else {
        return Err(errors::token_invalidated(401));
    };
    let Some(account_id) = account_header(h) else {
        return Err(reply::detail(400, "Missing ChatGPT-Account-Id header"));
    };
    if let Some(r) = check_strict(shared, account_id, token) {
        return Err(r);
    }
    if let Err(e) = request_controls(h, &Map::new()) {
        return Err(reply::detail(400, &format!("mock-codex: {e}")));
    }
    if header(h, "sec-websocket-version").map(str::trim) != Some("13") {
        let mut r = reply::detail(426, "Unsupported WebSocket version (expected 13)");
        reply::set_header(&mut r, "sec-websocket-version", "13");
        return Err(r);
    }
    let Some(key) = header(h, "sec-websocket-key")
        .map(str::trim)
        .filter(|k| !k.is_empty())
    else {
        return Err(reply::detail(400, "Missing Sec-WebSocket-Key header"));
    };

    let mut r = Response::new(reply::full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    reply::set_header(&mut r, "upgrade", "websocket");
    reply::set_header(&mut r, "connection", "Upgrade");
    reply::set_header(
        &mut r,
        "sec-websocket-accept",
        derive_accept_key(key.as_bytes()),
    );
    reply::set_header(&mut r, "x-request-id", format!("req_{}", rand_hex(16)));
    match h.get("x-codex-turn-state") {
        Some(v) => {
            r.headers_mut().insert("x-codex-turn-state", v.clone());
        }
        None => reply::set_header(&mut r, "x-codex-turn-state", format!("ts-{}", rand_hex(12))),
    }
    reply::set_header(
        &mut r,
        "x-models-etag",
        shared.catalog_etag.trim_matches('"'),
    );
    quota_headers(&mut r, &shared.quota(Some(account_id)));

    let conn = Conn {
        shared: shared.clone(),
        account_id: account_id.to_owned(),
        headers: h.clone(),
        recorded_headers: h
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        version: format!("{:?}", parts.version),
        opened: Instant::now(),
        ids: HashSet::new(),
    };
    Ok((r, conn))
}

/// One open socket: the handshake's identity and the connection-local response ids.
struct Conn {
    shared: Arc<Shared>,
    account_id: String,
    /// Handshake headers: their `x-mock-*` controls apply to every frame.
    headers: HeaderMap,
    recorded_headers: Vec<(String, String)>,
    path: String,
    query: Option<String>,
    version: String,
    opened: Instant,
    /// Responses produced on this socket (what `previous_response_id` may name).
    ids: HashSet<String>,
}

/// What the socket task does next.
enum Step {
    Command(WsCommand),
    Client(Option<Result<Message, tokio_tungstenite::tungstenite::Error>>),
    Event(Option<io::Result<Bytes>>),
}

/// The answer to one client frame.
enum Answer {
    /// Nothing to send (`response.processed`).
    Nothing,
    /// One `error` event; the socket stays open.
    Error(Bytes),
    /// A response (or a delayed error event) streamed by the socket loop.
    Start(Box<Active>),
    /// An `error` event, then a close frame.
    ErrorAndClose(Bytes, CloseCode, &'static str),
}

/// The response in flight on a socket.
struct Active {
    id: Option<String>,
    /// Pending first-byte delay.
    delay: Option<Pin<Box<Sleep>>>,
    /// Events sent before `stream` (`codex.rate_limits`, or a whole warm-up / error answer).
    prelude: VecDeque<Bytes>,
    stream: Option<SseStream>,
    /// Whether a complete answer makes `id` a valid `previous_response_id`.
    registers: bool,
}

// === impl Active ===

impl Active {
    fn new(delay: Duration, prelude: Vec<Bytes>) -> Self {
        Self {
            id: None,
            delay: (!delay.is_zero()).then(|| Box::pin(tokio::time::sleep(delay))),
            prelude: prelude.into(),
            stream: None,
            registers: false,
        }
    }

    /// The next event JSON; `Some(Err)` is a forced disconnect (`disconnect_after`). Cancel
    /// safe: all state lives in `self`.
    async fn next(&mut self) -> Option<io::Result<Bytes>> {
        if let Some(d) = self.delay.as_mut() {
            d.as_mut().await;
            self.delay = None;
        }
        if let Some(p) = self.prelude.pop_front() {
            return Some(Ok(p));
        }
        let frame = self.stream.as_mut()?.next().await?;
        Some(frame.map(|f| events::sse_data(&f.into_data().unwrap_or_default())))
    }

    /// Every event was sent.
    fn finished(&self) -> bool {
        self.delay.is_none()
            && self.prelude.is_empty()
            && self.stream.as_ref().is_none_or(SseStream::is_exhausted)
    }
}

async fn next_event(active: &mut Option<Active>) -> Option<io::Result<Bytes>> {
    match active {
        Some(a) => a.next().await,
        None => std::future::pending().await,
    }
}

// === impl Conn ===

impl Conn {
    async fn run(mut self, mut ws: Ws, mut control: broadcast::Receiver<WsCommand>) {
        let mut active: Option<Active> = None;
        loop {
            let step = tokio::select! {
                // A command first: a socket told to die is dead, whatever the client sent
                // since (an unbiased select could still answer a frame that arrived after the
                // kill, which no dead connection does).
                biased;
                cmd = control.recv() => match cmd {
                    Ok(c) => Step::Command(c),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => Step::Command(WsCommand::Kill),
                },
                msg = ws.next() => Step::Client(msg),
                ev = next_event(&mut active) => Step::Event(ev),
            };
            match step {
                Step::Command(WsCommand::Kill) => return,
                Step::Command(WsCommand::Freeze) => {
                    // Hold the socket, never touch it, until killed.
                    loop {
                        match control.recv().await {
                            Ok(WsCommand::Kill) | Err(broadcast::error::RecvError::Closed) => {
                                return
                            }
                            _ => {}
                        }
                    }
                }
                Step::Command(WsCommand::Close) => {
                    close(&mut ws, CloseCode::Away, "mock-codex: closing").await;
                    return;
                }
                Step::Event(Some(Ok(json))) => {
                    if send(&mut ws, json).await.is_err() {
                        return;
                    }
                    if active.as_ref().is_some_and(Active::finished) {
                        self.finish(active.take());
                    }
                }
                // `disconnect_after`: drop the connection without a close frame.
                Step::Event(Some(Err(_))) => return,
                Step::Event(None) => self.finish(active.take()),
                Step::Client(None | Some(Err(_))) => return,
                Step::Client(Some(Ok(msg))) => match msg {
                    Message::Text(t)
                        if self
                            .shared
                            .cfg
                            .ws_max_message_bytes
                            .is_some_and(|max| t.len() > max) =>
                    {
                        close(&mut ws, CloseCode::Size, "message too big").await;
                        return;
                    }
                    Message::Text(t) => {
                        let answer = self.on_text(Bytes::from(t), active.is_some()).await;
                        match answer {
                            Answer::Nothing => {}
                            Answer::Error(ev) => {
                                if send(&mut ws, ev).await.is_err() {
                                    return;
                                }
                            }
                            Answer::Start(a) => active = Some(*a),
                            Answer::ErrorAndClose(ev, code, reason) => {
                                if send(&mut ws, ev).await.is_ok() {
                                    close(&mut ws, code, reason).await;
                                }
                                return;
                            }
                        }
                    }
                    Message::Binary(_) => {
                        let ev = error_event(
                            400,
                            "invalid_request_error",
                            None,
                            "Binary frames are not supported: send JSON text frames.",
                            None,
                        );
                        if send(&mut ws, ev).await.is_err() {
                            return;
                        }
                    }
                    // tungstenite queued the pong (or the close reply): send it now.
                    Message::Ping(_) => {
                        if ws.flush().await.is_err() {
                            return;
                        }
                    }
                    Message::Close(_) => {
                        let _ = ws.flush().await;
                        return;
                    }
                    Message::Pong(_) | Message::Frame(_) => {}
                },
            }
        }
    }

    /// A response ended: a complete answer becomes a valid `previous_response_id`.
    fn finish(&mut self, a: Option<Active>) {
        if let Some(a) = a {
            if a.registers {
                if let Some(id) = a.id {
                    self.ids.insert(id);
                }
            }
        }
    }

    async fn on_text(&mut self, frame: Bytes, busy: bool) -> Answer {
        let parsed: Option<Value> = serde_json::from_slice(&frame).ok();
        match parsed
            .as_ref()
            .and_then(|v| v.get("type"))
            .and_then(Value::as_str)
        {
            Some("response.create") => self.on_create(frame, parsed, busy).await,
            // The acknowledgement of the newest clients.
            Some("response.processed") => Answer::Nothing,
            Some(other) => Answer::Error(error_event(
                400,
                "invalid_request_error",
                Some("unsupported_event_type"),
                &format!("Unsupported event type '{other}'."),
                Some("type"),
            )),
            None => Answer::Error(error_event(
                400,
                "invalid_request_error",
                None,
                "Invalid message: expected a JSON object with a \"type\".",
                Some("type"),
            )),
        }
    }

    async fn on_create(&mut self, frame: Bytes, parsed: Option<Value>, busy: bool) -> Answer {
        let shared = self.shared.clone();
        shared.counters.ws_requests.fetch_add(1, Ordering::SeqCst);
        let body_len = frame.len();
        if shared.cfg.max_recorded > 0 {
            shared.record(
                RecordedRequest {
                    method: "WS".to_owned(),
                    path: self.path.clone(),
                    query: self.query.clone(),
                    version: self.version.clone(),
                    headers: self.recorded_headers.clone(),
                    body: frame,
                    json: parsed.clone(),
                    received_at_ms: shared.elapsed_ms(),
                },
                false,
            );
        }
        if busy {
            return Answer::Error(error_event(
                400,
                "invalid_request_error",
                Some("conversation_already_has_active_response"),
                "A response is already in progress on this connection: wait for its terminal \
                 event before sending another response.create.",
                None,
            ));
        }
        if let Some(max) = shared.cfg.ws_max_connection_age {
            if self.opened.elapsed() >= max {
                let ev = error_event(
                    400,
                    "invalid_request_error",
                    Some("websocket_connection_limit_reached"),
                    "Responses websocket connection limit reached (60 minutes). Create a new \
                     websocket connection to continue.",
                    None,
                );
                return Answer::ErrorAndClose(ev, CloseCode::Normal, "connection limit reached");
            }
        }
        let Some(Value::Object(mut req)) = parsed else {
            return Answer::Error(error_event(
                400,
                "invalid_request_error",
                None,
                "Request body must be a JSON object",
                None,
            ));
        };
        // The WebSocket envelope: fields the HTTP path rejects.
        req.remove("type");
        let generate = req.remove("generate");
        let previous = req.remove("previous_response_id");
        if let Some(r) = validate(&req) {
            return Answer::Error(ws_error_from_http(r).await);
        }
        match previous {
            None | Some(Value::Null) => {}
            Some(Value::String(id)) if self.ids.contains(&id) => {}
            Some(Value::String(id)) => {
                return Answer::Error(error_event(
                    400,
                    "invalid_request_error",
                    Some("previous_response_not_found"),
                    &format!("Previous response with id '{id}' not found."),
                    Some("previous_response_id"),
                ))
            }
            Some(_) => {
                return Answer::Error(error_event(
                    400,
                    "invalid_request_error",
                    Some("invalid_type"),
                    "Invalid type for 'previous_response_id': expected a string.",
                    Some("previous_response_id"),
                ))
            }
        }
        let model = req.get("model").and_then(Value::as_str).unwrap_or_default();
        let quota = shared.quota(Some(&self.account_id));

        // Warm-up: no model turn, and no controls (a warm-up uses none of an account's
        // `fail_times`).
        if generate == Some(Value::Bool(false)) {
            let rendered = events::warmup(model, service_tier(&req), (body_len as u64 / 4).max(1));
            let mut prelude = vec![rate_limits_event(&quota)];
            prelude.extend(rendered.events.iter().map(events::sse_data));
            let mut a = Active::new(Duration::ZERO, prelude);
            a.id = Some(rendered.id);
            a.registers = true;
            shared.counters.ws_responses.fetch_add(1, Ordering::SeqCst);
            return Answer::Start(Box::new(a));
        }

        // Controls: process → account → handshake headers → client_metadata.
        let request_layer = match request_controls(&self.headers, &req) {
            Ok(b) => b,
            Err(e) => {
                return Answer::Error(error_event(
                    400,
                    "invalid_request_error",
                    None,
                    &format!("mock-codex: {e}"),
                    None,
                ))
            }
        };
        let cfg = &shared.cfg;
        let c = layered_controls(&shared, &self.account_id, &request_layer);
        let first_byte_delay = c.first_byte_delay.unwrap_or(cfg.first_byte_delay);
        if let Some(r) = error_answer(&c, model, &quota) {
            let ev = ws_error_from_http(r).await;
            return Answer::Start(Box::new(Active::new(first_byte_delay, vec![ev])));
        }
        if let Some(r) = foreign_blob(&c, &req, &self.account_id) {
            let ev = ws_error_from_http(r).await;
            return Answer::Start(Box::new(Active::new(first_byte_delay, vec![ev])));
        }
        let plan = plan(cfg, &c, &req, body_len, &self.account_id);
        let failing = plan.fail_in_stream.is_some() || plan.fail_after_output.is_some();
        let rendered = events::build(&plan);
        let id = rendered.id.clone();
        let inter_event_delay = c.inter_event_delay.unwrap_or(cfg.inter_event_delay);
        let mut a = Active::new(first_byte_delay, vec![rate_limits_event(&quota)]);
        a.stream = Some(SseStream::new(
            rendered,
            inter_event_delay,
            c.disconnect_after,
            c.stall_after,
            shared.clone(),
        ));
        a.id = Some(id);
        a.registers = !failing;
        shared.counters.ws_responses.fetch_add(1, Ordering::SeqCst);
        Answer::Start(Box::new(a))
    }
}

/// Sends one event JSON as a text frame (and flushes it).
async fn send(ws: &mut Ws, json: Bytes) -> Result<(), ()> {
    let text = Utf8Bytes::try_from(json).map_err(|_| ())?;
    ws.send(Message::Text(text)).await.map_err(|_| ())
}

/// Sends a close frame, waits briefly for the client's, then returns (the caller drops the
/// socket).
async fn close(ws: &mut Ws, code: CloseCode, reason: &'static str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    if ws.close(Some(frame)).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// `{"type":"error","status":N,"error":{"type","code","message","param"}}`.
fn error_event(
    status: u16,
    ty: &str,
    code: Option<&str>,
    message: &str,
    param: Option<&str>,
) -> Bytes {
    Bytes::from(
        json!({
            "type": "error",
            "status": status,
            "error": {"type": ty, "code": code, "message": message, "param": param},
        })
        .to_string(),
    )
}

/// The WebSocket shape of an HTTP error answer: `{"type":"error","status":N,"error":{...},
/// "headers":{...}}`. A `{"detail":...}` body becomes an `invalid_request_error` with that
/// message; a non-JSON body (Cloudflare) a `server_error` naming it.
async fn ws_error_from_http(r: Response<Body>) -> Bytes {
    let status = r.status().as_u16();
    let (parts, body) = r.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let error = match (v.get("error"), v.get("detail").and_then(Value::as_str)) {
        (Some(e @ Value::Object(_)), _) => e.clone(),
        (_, Some(detail)) => json!({
            "type": "invalid_request_error",
            "code": null,
            "message": detail,
            "param": null,
        }),
        _ => json!({
            "type": "server_error",
            "code": null,
            "message": format!(
                "HTTP {status} {}",
                String::from_utf8_lossy(&body).chars().take(200).collect::<String>()
            ),
            "param": null,
        }),
    };
    let headers: Map<String, Value> = parts
        .headers
        .iter()
        .filter(|(k, _)| *k != http::header::CONTENT_TYPE && *k != http::header::CONTENT_LENGTH)
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), Value::from(v.to_str().ok()?))))
        .collect();
    let mut ev = json!({"type": "error", "status": status, "error": error});
    if !headers.is_empty() {
        ev["headers"] = Value::Object(headers);
    }
    Bytes::from(ev.to_string())
}

/// `codex.rate_limits`: the quota the HTTP path sends as `x-codex-*` headers (docs/protocol.md#quota-signals).
fn rate_limits_event(q: &QuotaView) -> Bytes {
    let reached = q.primary_pct >= 100.0 || q.secondary_pct >= 100.0;
    Bytes::from(
        json!({
            "type": "codex.rate_limits",
            "plan_type": q.plan_type,
            "rate_limits": {
                "allowed": !reached,
                "limit_reached": reached,
                "primary": {
                    "used_percent": q.primary_pct,
                    "window_minutes": PRIMARY_WINDOW_MIN,
                    "reset_at": q.primary_reset_at,
                },
                "secondary": {
                    "used_percent": q.secondary_pct,
                    "window_minutes": SECONDARY_WINDOW_MIN,
                    "reset_at": q.secondary_reset_at,
                },
            },
            "credits": {"has_credits": false, "unlimited": false, "balance": "0"},
            "metered_limit_name": "codex",
        })
        .to_string(),
    )
}
