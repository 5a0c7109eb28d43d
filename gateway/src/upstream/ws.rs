//! The per-worker upstream Responses WebSocket pool (docs/protocol.md#websocket-mode).
//!
//! # Key Components
//! - [`WsRoute`]: what a client WebSocket turn asks of the upstream: its conversation (the
//!   pool key with the account) and, when the turn continues a response, the short body that
//!   continues it by `previous_response_id` on the socket that produced it.
//! - [`WsPool`]: idle upstream sockets keyed by (account, conversation), each remembering the
//!   last response it produced; retired before the upstream's 60-minute limit and after idling;
//!   an origin breaker that stops trying WebSocket after repeated failures and probes later.
//! - [`WsTurn`]: one turn on a socket, read as SSE-shaped bytes so the lifecycle's commit
//!   barrier, classification and the pipeline stay the same for every transport. A turn that
//!   reached its terminal event gives its socket back to the pool; a turn dropped midway (client
//!   gone, upstream broke) closes it.
//!
//! # Error handling
//! A connect or handshake failure, a refused upgrade (404/426...), or a stale pooled socket
//! before any frame is [`UpstreamError::WsUnavailable`]: nothing was sent, the lifecycle sends
//! the same request over HTTP instead. A handshake answered with an account status (401, 403,
//! 429) is returned as that HTTP response, to be classified like any other.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use monoio::io::AsyncWriteRentExt;
use sonic_rs::JsonValueTrait;

use super::{
    h1::{read_head, BodyIo},
    UpstreamBody, UpstreamError, UpstreamRequest, UpstreamResponse,
};
use crate::{
    metrics::WorkerMetrics,
    wire::read_more,
    ws::{
        codec::{Decoder, Encoder, Limits, Message, Role},
        handshake,
    },
};

/// The upstream's hard lifetime is 60 minutes: sockets retire at 55.
const MAX_AGE: Duration = Duration::from_secs(55 * 60);
/// Idle sockets older than this are closed instead of reused.
const MAX_IDLE: Duration = Duration::from_secs(300);
/// Idle sockets kept per worker.
const MAX_IDLE_SOCKETS: usize = 4096;
/// Idle sockets kept per account (its oldest goes first).
const MAX_IDLE_PER_ACCOUNT: usize = 128;
/// Consecutive WebSocket failures that open the breaker, and how long it stays open.
const BREAKER_THRESHOLD: u32 = 3;
const BREAKER_OPEN: Duration = Duration::from_secs(30);
/// The beta header the Codex backend requires on the upgrade.
const BETA: &str = "responses_websockets=2026-02-06";

/// A client WebSocket turn's upstream route.
#[derive(Debug, Clone)]
pub struct WsRoute {
    /// The client conversation (one downstream socket): with the account, the pool key.
    pub conversation: String,
    /// The exact continuation, usable only on the socket that produced its response.
    pub continuation: Option<Continuation>,
}

/// `previous_response_id` plus only the new items, for the socket that holds that response.
#[derive(Debug, Clone)]
pub struct Continuation {
    /// The upstream response this turn continues.
    pub previous_response_id: String,
    /// The short body (already normalised, with `previous_response_id`).
    pub body: Bytes,
}

/// One open upstream WebSocket.
pub struct WsConn {
    io: BodyIo,
    rbuf: Vec<u8>,
    dec: Decoder,
    enc: Encoder,
    created: Instant,
    idle_since: Instant,
    /// When its liveness was last known (a turn, or a pong while idle).
    alive_at: Instant,
    /// The close code the upstream closed it with, if it did.
    closed_with: Option<u16>,
    /// The last response this socket produced (what an exact continuation needs).
    last_response_id: Option<String>,
    /// Client-visible headers of the upgrade response (turn state, model).
    headers: Vec<(String, String)>,
    /// The egress it was opened through (0: direct); a socket is reused only by the same one.
    egress: u64,
}

/// The pool and the breaker of one worker.
pub struct WsPool {
    idle: RefCell<HashMap<(i64, String), WsConn>>,
    /// Sockets out of `idle` for a liveness probe, and a wake-up when any probe ends (a turn
    /// for that key waits for its socket instead of opening another one).
    probing: RefCell<std::collections::HashSet<(i64, String)>>,
    probe_done: tokio::sync::Notify,
    failures: Cell<u32>,
    open_until: Cell<Option<Instant>>,
    metrics: Arc<WorkerMetrics>,
}

// === impl WsPool ===

impl WsPool {
    /// An empty pool reporting its size to `metrics`.
    pub fn new(metrics: Arc<WorkerMetrics>) -> Self {
        Self {
            idle: RefCell::new(HashMap::new()),
            probing: RefCell::new(std::collections::HashSet::new()),
            probe_done: tokio::sync::Notify::new(),
            failures: Cell::new(0),
            open_until: Cell::new(None),
            metrics,
        }
    }

    fn report(&self, idle: &HashMap<(i64, String), WsConn>) {
        self.metrics.set_ws_upstream_idle(idle.len());
    }

    /// Whether WebSocket may be tried now (breaker closed, or half-open for a probe).
    pub fn allowed(&self) -> bool {
        !matches!(self.open_until.get(), Some(t) if Instant::now() < t)
    }

    fn failed(&self) {
        let n = self.failures.get() + 1;
        self.failures.set(n);
        if n >= BREAKER_THRESHOLD {
            self.open_until.set(Some(Instant::now() + BREAKER_OPEN));
        }
    }

    fn succeeded(&self) {
        self.failures.set(0);
        self.open_until.set(None);
    }

    /// The idle socket of `key`; when it is out for a liveness probe, waits for the probe
    /// (at most `wait`) so the turn keeps its socket and the exact continuation.
    async fn take_waiting(&self, key: &(i64, String), wait: Duration) -> Option<WsConn> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.probe_done.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(c) = self.take(key) {
                return Some(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.probing.borrow().contains(key) || left.is_zero() {
                return None;
            }
            let _ = monoio::time::timeout(left, notified).await;
        }
    }

    fn take(&self, key: &(i64, String)) -> Option<WsConn> {
        let mut idle = self.idle.borrow_mut();
        let conn = idle.remove(key);
        self.report(&idle);
        let conn = conn?;
        (conn.created.elapsed() < MAX_AGE && conn.idle_since.elapsed() < MAX_IDLE).then_some(conn)
    }

    /// Pings the idle sockets every `interval` (those not known alive for that long) and
    /// closes the ones whose pong does not come within `pong_timeout`; reading them also
    /// answers the upstream's own pings and notices closes. Runs while the pool lives.
    pub fn start_liveness(self: &Rc<Self>, interval: Duration, pong_timeout: Duration) {
        let weak = Rc::downgrade(self);
        monoio::spawn(async move {
            loop {
                monoio::time::sleep(interval).await;
                let Some(pool) = weak.upgrade() else {
                    return;
                };
                let due: Vec<(i64, String)> = pool
                    .idle
                    .borrow()
                    .iter()
                    .filter(|(_, c)| c.alive_at.elapsed() >= interval)
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in due {
                    let Some(mut conn) = pool.take(&key) else {
                        continue;
                    };
                    pool.probing.borrow_mut().insert(key.clone());
                    let pool = Rc::clone(&pool);
                    monoio::spawn(async move {
                        let alive = conn.probe(pong_timeout).await;
                        pool.probing.borrow_mut().remove(&key);
                        if alive {
                            conn.alive_at = Instant::now();
                            pool.put_back(key, conn);
                            pool.probe_done.notify_waiters();
                        } else {
                            pool.probe_done.notify_waiters();
                            pool.metrics.ws_upstream_dead();
                            tracing::debug!(
                                account = key.0,
                                "idle upstream websocket did not answer its ping; closed"
                            );
                        }
                    });
                }
            }
        });
    }

    /// Returns a probed socket without touching its idle time; a socket that a turn put
    /// there meanwhile wins (the probed one is closed).
    fn put_back(&self, key: (i64, String), conn: WsConn) {
        let mut idle = self.idle.borrow_mut();
        if idle.len() < MAX_IDLE_SOCKETS {
            idle.entry(key).or_insert(conn);
        }
        self.report(&idle);
    }

    fn put(&self, key: (i64, String), mut conn: WsConn) {
        if conn.created.elapsed() >= MAX_AGE {
            return;
        }
        conn.idle_since = Instant::now();
        conn.alive_at = conn.idle_since;
        let mut idle = self.idle.borrow_mut();
        if idle.len() >= MAX_IDLE_SOCKETS {
            idle.retain(|_, c| c.idle_since.elapsed() < MAX_IDLE);
            if idle.len() >= MAX_IDLE_SOCKETS {
                self.report(&idle);
                return;
            }
        }
        let account = key.0;
        let mine = idle.keys().filter(|(a, _)| *a == account).count();
        if mine >= MAX_IDLE_PER_ACCOUNT {
            let oldest = idle
                .iter()
                .filter(|((a, _), _)| *a == account)
                .min_by_key(|(_, c)| c.idle_since)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                idle.remove(&k);
            }
        }
        idle.insert(key, conn);
        self.report(&idle);
    }

    /// Idle sockets in the pool.
    pub fn idle_count(&self) -> usize {
        self.idle.borrow().len()
    }

    /// Closes the idle sockets of an account (eviction command).
    pub fn evict(&self, account_id: i64) {
        let mut idle = self.idle.borrow_mut();
        idle.retain(|(a, _), _| *a != account_id);
        self.report(&idle);
    }
}

/// `{"type":"response.create", ...body}`.
fn create_frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 32);
    out.extend_from_slice(br#"{"type":"response.create""#);
    let rest = body.strip_prefix(b"{").unwrap_or(body);
    if rest.first().is_some_and(|b| *b != b'}') {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out
}

/// One frame's JSON (of event type `ty`) as an SSE event (a multi-line payload becomes
/// several `data:` lines).
fn sse(ty: &str, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(payload.len() + ty.len() + 16);
    if !ty.is_empty() {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(ty.as_bytes());
        out.push(b'\n');
    }
    for line in payload.split(|b| *b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// Why a socket could not serve the turn.
enum Refusal {
    /// Nothing was processed: try a fresh socket (or HTTP).
    Retry(String),
    /// The upstream answered the upgrade with this HTTP status and body.
    Http(u16, Vec<(String, String)>, Vec<u8>),
    /// The account's egress proxy failed (not the origin's fault: no breaker).
    Proxy(UpstreamError),
}

/// One turn on an upstream socket (see the module docs).
pub struct WsTurn {
    conn: Option<WsConn>,
    pool: Rc<WsPool>,
    key: (i64, String),
    /// The first frame, read before the turn was handed out.
    first: Option<Bytes>,
    finished: bool,
    response_id: Option<String>,
}

// === impl WsTurn ===

impl WsTurn {
    /// The next event as SSE bytes; `Ok(None)` when the socket closed.
    pub async fn chunk(&mut self, idle: Duration) -> Result<Option<Bytes>, UpstreamError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        let next = match monoio::time::timeout(idle, conn.next_text()).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout { sent: true }),
        };
        self.settle(next)
    }

    /// [`WsTurn::chunk`] under a committed stream's idle deadline on the worker's wheel (no
    /// runtime timer per event).
    pub async fn chunk_within(
        &mut self,
        idle: &mut crate::deadline::Idle,
    ) -> Result<Option<Bytes>, UpstreamError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        let next = crate::deadline::within(idle, conn.next_text())
            .await
            .unwrap_or(Err(UpstreamError::Timeout { sent: true }));
        self.settle(next)
    }

    /// What a read of the socket means for the turn.
    fn settle(
        &mut self,
        next: Result<Option<Vec<u8>>, UpstreamError>,
    ) -> Result<Option<Bytes>, UpstreamError> {
        match next {
            Ok(Some(payload)) => Ok(Some(self.observe(payload))),
            Ok(None) => {
                self.conn = None;
                Ok(None)
            }
            Err(e) => {
                self.conn = None; // broken mid-turn: never back to the pool
                Err(e)
            }
        }
    }

    fn observe(&mut self, payload: Vec<u8>) -> Bytes {
        let ty = sonic_rs::get(payload.as_slice(), &["type"])
            .ok()
            .and_then(|t| t.as_str().map(str::to_owned))
            .unwrap_or_default();
        match ty.as_str() {
            "response.created" => {
                self.response_id = sonic_rs::get(payload.as_slice(), &["response", "id"])
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned));
            }
            "response.completed"
            | "response.done"
            | "response.incomplete"
            | "response.failed"
            | "error" => self.finished = true,
            _ => {}
        }
        sse(&ty, &payload)
    }
}

impl Drop for WsTurn {
    fn drop(&mut self) {
        // Only a socket whose turn ended cleanly goes back: a half-read turn would leave its
        // remaining events for the next one.
        if let Some(mut conn) = self.conn.take() {
            if self.finished && self.first.is_none() {
                if self.response_id.is_some() {
                    conn.last_response_id = self.response_id.take();
                }
                self.pool.put(self.key.clone(), conn);
            }
        }
    }
}

// === impl WsConn ===

impl WsConn {
    /// Reads frames until a text (or binary) message; answers pings. `Ok(None)`: closed.
    async fn next_text(&mut self) -> Result<Option<Vec<u8>>, UpstreamError> {
        loop {
            match self.dec.decode(&mut self.rbuf) {
                Ok(Some(Message::Text(t) | Message::Binary(t))) => return Ok(Some(t)),
                Ok(Some(Message::Ping(p))) => {
                    let mut out = Vec::new();
                    self.enc.pong(&mut out, &p);
                    let (res, _) = self.io.write_all(out).await;
                    res.map_err(|e| proto(format!("ws pong: {e}")))?;
                }
                Ok(Some(Message::Pong(_))) => {}
                Ok(Some(Message::Close(c))) => {
                    self.closed_with = c.map(|(code, _)| code);
                    return Ok(None);
                }
                Ok(None) => {
                    let n = read_more(&mut self.io, &mut self.rbuf, 8192)
                        .await
                        .map_err(|e| proto(format!("ws read: {e}")))?;
                    if n == 0 {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(proto(format!("upstream websocket: {e}"))),
            }
        }
    }

    /// A liveness check of an idle socket: a ping, then frames until its pong (the upstream's
    /// pings answered on the way) within `timeout`. False: dead, closed, or it sent a message
    /// while no turn was running (its state is unknown: not reused).
    async fn probe(&mut self, timeout: Duration) -> bool {
        let mut out = Vec::new();
        self.enc.ping(&mut out, b"codex-gateway");
        let (res, _) = self.io.write_all(out).await;
        if res.is_err() {
            return false;
        }
        let wait = async {
            loop {
                match self.dec.decode(&mut self.rbuf) {
                    Ok(Some(Message::Pong(_))) => return true,
                    Ok(Some(Message::Ping(p))) => {
                        let mut out = Vec::new();
                        self.enc.pong(&mut out, &p);
                        let (res, _) = self.io.write_all(out).await;
                        if res.is_err() {
                            return false;
                        }
                    }
                    Ok(Some(_)) | Err(_) => return false,
                    Ok(None) => match read_more(&mut self.io, &mut self.rbuf, 1024).await {
                        Ok(n) if n > 0 => {}
                        _ => return false,
                    },
                }
            }
        };
        monoio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    async fn send(&mut self, payload: &[u8]) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(payload.len() + 16);
        self.enc.text(&mut out, payload);
        let (res, _) = self.io.write_all(out).await;
        res.map(|_| ())
    }
}

fn proto(message: String) -> UpstreamError {
    UpstreamError::Protocol {
        sent: true,
        message,
    }
}

// === impl Upstream (WebSocket) ===

impl super::Upstream {
    /// Sends a client WebSocket turn over a pooled upstream WebSocket: the exact continuation
    /// when the pooled socket produced the previous response, the full body otherwise.
    /// Returns after the first frame. `WsUnavailable`: use HTTP for this request.
    pub(crate) async fn send_ws(
        &self,
        account_id: i64,
        egress: Option<&shared_state::ProxyEntry>,
        route: &WsRoute,
        req: &UpstreamRequest,
        metrics: &Arc<WorkerMetrics>,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let pool = Rc::clone(&self.ws);
        if !pool.allowed() {
            return Err(UpstreamError::WsUnavailable);
        }
        let key = (account_id, route.conversation.clone());
        let egress_key = egress.map_or(shared_state::egress::DIRECT, |p| p.key);
        for _ in 0..2 {
            // A socket opened through another egress (the account's proxy changed) is closed.
            let pooled = pool
                .take_waiting(&key, self.cfg.ws_pong_timeout)
                .await
                .filter(|c| c.egress == egress_key);
            let (mut conn, reused) = match pooled {
                Some(c) => (c, true),
                None => match self.ws_connect(egress, req).await {
                    Ok(c) => {
                        metrics.ws_upstream_connect();
                        (c, false)
                    }
                    Err(Refusal::Http(status, headers, body)) => {
                        pool.succeeded();
                        return Ok(UpstreamResponse {
                            status,
                            headers: super::Head::Pairs(headers),
                            body: UpstreamBody::Full(Some(Bytes::from(body))),
                            protocol: "ws",
                        });
                    }
                    Err(Refusal::Proxy(e)) => return Err(e),
                    Err(Refusal::Retry(why)) => {
                        tracing::debug!(reason = %why, "upstream websocket unavailable");
                        pool.failed();
                        return Err(UpstreamError::WsUnavailable);
                    }
                },
            };
            let body = match &route.continuation {
                Some(c) if conn.last_response_id.as_deref() == Some(&c.previous_response_id) => {
                    &c.body
                }
                _ => &req.body,
            };
            if conn.send(&create_frame(body)).await.is_err() {
                if reused {
                    continue; // a stale pooled socket: a fresh one
                }
                pool.failed();
                return Err(UpstreamError::WsUnavailable);
            }
            let first =
                match monoio::time::timeout(self.cfg.first_byte_timeout, conn.next_text()).await {
                    Err(_) => return Err(UpstreamError::Timeout { sent: true }),
                    Ok(Ok(Some(f))) => f,
                    // Closed before any frame: a socket the upstream had dropped while idle (our
                    // frame was not processed). A fresh socket once; then HTTP.
                    // 1009: this payload is too big for a frame; the origin is fine (no
                    // breaker), the request goes over HTTP once.
                    Ok(Ok(None)) if conn.closed_with == Some(1009) => {
                        metrics.ws_upstream_too_big();
                        return Err(UpstreamError::WsUnavailable);
                    }
                    Ok(Ok(None)) | Ok(Err(_)) if reused => continue,
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        pool.failed();
                        return Err(UpstreamError::WsUnavailable);
                    }
                };
            if sonic_rs::get(first.as_slice(), &["error", "code"])
                .ok()
                .and_then(|c| {
                    c.as_str()
                        .map(|c| c == "websocket_connection_limit_reached")
                })
                == Some(true)
            {
                continue; // the upstream retired this socket; the turn was not processed
            }
            pool.succeeded();
            metrics.ws_upstream_turn(reused);
            let headers = conn.headers.clone();
            let mut turn = WsTurn {
                conn: Some(conn),
                pool,
                key,
                first: None,
                finished: false,
                response_id: None,
            };
            let first = turn.observe(first);
            turn.first = Some(first);
            return Ok(UpstreamResponse {
                status: 200,
                headers: super::Head::Pairs(headers),
                body: UpstreamBody::Ws(Box::new(turn)),
                protocol: "ws",
            });
        }
        Err(UpstreamError::WsUnavailable)
    }

    /// Connects and upgrades one socket within the WebSocket connect budget.
    async fn ws_connect(
        &self,
        egress: Option<&shared_state::ProxyEntry>,
        req: &UpstreamRequest,
    ) -> Result<WsConn, Refusal> {
        let budget = self.cfg.ws_connect_timeout;
        match monoio::time::timeout(budget, self.ws_upgrade(egress, req)).await {
            Ok(r) => r,
            Err(_) => Err(Refusal::Retry("websocket connect budget exceeded".into())),
        }
    }

    async fn ws_upgrade(
        &self,
        egress: Option<&shared_state::ProxyEntry>,
        req: &UpstreamRequest,
    ) -> Result<WsConn, Refusal> {
        let tcp = self.tcp(egress).await.map_err(|e| match e {
            UpstreamError::Proxy { .. } => Refusal::Proxy(e),
            e => Refusal::Retry(e.to_string()),
        })?;
        let mut io = if self.cfg.tls {
            let Some(tls) = &self.ws_tls else {
                return Err(Refusal::Retry("TLS connector missing".into()));
            };
            let name = rustls::pki_types::ServerName::try_from(self.cfg.host.clone())
                .map_err(|e| Refusal::Retry(format!("invalid TLS server name: {e}")))?;
            BodyIo::Tls(
                tls.connect(name, tcp)
                    .await
                    .map_err(|e| Refusal::Retry(format!("TLS handshake: {e}")))?,
            )
        } else {
            BodyIo::Plain(tcp)
        };
        let mut headers: Vec<(&str, String)> = req
            .headers
            .iter()
            .filter(|(n, _)| !matches!(*n, "content-type" | "accept" | "content-length"))
            .map(|(n, v)| (*n, String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        headers.push(("openai-beta", BETA.to_owned()));
        let (hs, head) =
            handshake::client_request(&self.cfg.authority(), &req.path, &headers, true);
        let (res, _) = io.write_all(head).await;
        res.map_err(|e| Refusal::Retry(format!("upgrade write: {e}")))?;
        let mut buf = Vec::with_capacity(4096);
        let (status, resp_headers, head_len) =
            read_head(&mut io, &mut buf, self.cfg.ws_connect_timeout)
                .await
                .map_err(|e| Refusal::Retry(e.to_string()))?;
        buf.drain(..head_len);
        if status != 101 {
            // An account answer (auth, quota, ban) is classified like HTTP; anything else
            // (404, 426, 5xx) means WebSocket is not available here: HTTP instead.
            if matches!(status, 401 | 402 | 403 | 429) {
                let len = resp_headers
                    .iter()
                    .find(|(n, _)| n == "content-length")
                    .and_then(|(_, v)| v.parse::<usize>().ok())
                    .unwrap_or(0)
                    .min(64 * 1024);
                while buf.len() < len {
                    let want = len - buf.len();
                    match read_more(&mut io, &mut buf, want).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                buf.truncate(len);
                return Err(Refusal::Http(status, resp_headers, buf));
            }
            return Err(Refusal::Retry(format!("upgrade answered {status}")));
        }
        let deflate = handshake::client_verify(&hs, status, &resp_headers)
            .map_err(|e| Refusal::Retry(format!("upgrade: {}", e.message())))?;
        let limits = Limits {
            max_message: 64 << 20,
        };
        Ok(WsConn {
            io,
            rbuf: buf,
            dec: Decoder::new(Role::Client, limits, deflate),
            enc: Encoder::new(Role::Client, deflate),
            created: Instant::now(),
            idle_since: Instant::now(),
            alive_at: Instant::now(),
            closed_with: None,
            last_response_id: None,
            headers: resp_headers,
            egress: egress.map_or(shared_state::egress::DIRECT, |p| p.key),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        testing::{Plan, SegmentedIo},
        ws::deflate::DeflateParams,
    };

    /// A Codex turn as the upstream sends it: one JSON event per text frame, a ping among them.
    fn server_frames(deflate: Option<DeflateParams>) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut enc = Encoder::new(Role::Server, deflate);
        let mut wire = Vec::new();
        let mut events = Vec::new();
        events.push(br#"{"type":"response.created","response":{"id":"resp_1"}}"#.to_vec());
        for i in 0..300 {
            let text = "token ".repeat(i % 50 + 1);
            events.push(
                format!(r#"{{"type":"response.output_text.delta","delta":"{text}","sequence_number":{i}}}"#)
                    .into_bytes(),
            );
        }
        events.push(
            br#"{"type":"response.completed","response":{"id":"resp_1","status":"completed"}}"#
                .to_vec(),
        );
        for (i, e) in events.iter().enumerate() {
            if i == 7 {
                enc.ping(&mut wire, b"keepalive");
            }
            enc.text(&mut wire, e);
        }
        (wire, events)
    }

    /// The upstream socket's read loop under segmentation: the same frames whole, one byte per
    /// read and at seeded random cuts, compressed and not, on both drivers.
    #[monoio::test_all(timer_enabled = true)]
    async fn turn_frames_split_anywhere() {
        for deflate in [None, Some(DeflateParams::default())] {
            let (wire, events) = server_frames(deflate);
            for plan in Plan::standard(8, true) {
                let mut conn = WsConn {
                    io: BodyIo::Segmented(SegmentedIo::new(&wire, plan)),
                    rbuf: Vec::new(),
                    dec: Decoder::new(Role::Client, Limits::default(), deflate),
                    enc: Encoder::new(Role::Client, deflate),
                    created: Instant::now(),
                    idle_since: Instant::now(),
                    alive_at: Instant::now(),
                    closed_with: None,
                    last_response_id: None,
                    headers: Vec::new(),
                    egress: 0,
                };
                let mut got = Vec::new();
                while let Some(t) = conn.next_text().await.expect("frames") {
                    got.push(t);
                }
                assert!(got == events, "{plan:?} deflate={}", deflate.is_some());
            }
        }
    }

    #[test]
    fn create_frames_and_sse_shapes() {
        assert_eq!(
            create_frame(br#"{"model":"m","input":[]}"#),
            br#"{"type":"response.create","model":"m","input":[]}"#
        );
        assert_eq!(create_frame(b"{}"), br#"{"type":"response.create"}"#);
        let s = sse(
            "response.created",
            br#"{"type":"response.created","response":{"id":"r"}}"#,
        );
        assert_eq!(
            &s[..],
            &b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n"[..]
        );
        let multi = sse("x", b"{\"type\":\"x\",\n\"a\":1}");
        assert_eq!(
            &multi[..],
            &b"event: x\ndata: {\"type\":\"x\",\ndata: \"a\":1}\n\n"[..]
        );
    }
}
