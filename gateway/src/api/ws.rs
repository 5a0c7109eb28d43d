//! The Responses WebSocket (`GET /v1/responses` with `Upgrade: websocket`): RFC 6455 on our own
//! h1 server, several turns per socket, `generate:false` warm-ups and `previous_response_id`
//! continuations, each turn through the same lifecycle and pipeline as HTTP.
//!
//! # Key Components
//! - [`serve`]: authenticates the handshake head, answers 101 (negotiating
//!   `permessage-deflate`), splits the socket and runs the session.
//! - One task per socket direction (a read is never cancelled and resumed,
//!   docs/io-traps.md#cancellation):
//!   the **reader** decodes client frames, answers pings, refuses a second `response.create`
//!   while one is in flight (an `error` event; nothing is lost) and hands requests to the
//!   session; the **writer** writes frames in order, each write making progress within
//!   `client_write_timeout` (a client that stops reading ends the session, see [`writer`]).
//!   Frames are encoded where they are
//!   produced, synchronously, through the one [`WsShared`] encoder, so the deflate context and
//!   the frame order always agree.
//! - The session runs one turn at a time: [`ResponsesWs`] (the pipeline encoder: each upstream
//!   event's JSON as one text frame, byte-faithful) over [`WsSink`].
//! - Continuations: the socket keeps the transcript of its turns (inputs and outputs, shared
//!   prefixes, bounded); a `previous_response_id` of this socket is replayed upstream as full
//!   history without the id (the upstream keeps no state with `store:false`); an unknown id is
//!   an `error` event `previous_response_not_found`.
//!
//! # Error handling
//! Errors before a turn commits are `error` events in the OpenAI shape
//! ([`Error::ws_error_event`]); after the commit the stream ends with `response.failed`.
//! Protocol violations close the socket with their code (1002, 1007, 1009).

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    io,
    panic::AssertUnwindSafe,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use codex_protocol::{normalize::normalize_responses_with, sse::SseEvent};
use futures_util::FutureExt;
use monoio::{
    buf::{IoBuf, IoBufMut},
    io::{
        AsyncWriteRent, CancelableAsyncReadRent, CancelableAsyncWriteRent, Canceller,
        OwnedReadHalf, OwnedWriteHalf, Splitable,
    },
    net::TcpStream,
};
use shared_state::ClientKey;
use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait};
use tokio::sync::{mpsc, Notify};

use super::{affinity_key, authenticate, passthrough, responses::Capturing, write_error, Route};
use crate::{
    ctx::WorkerCtx,
    deadline::Idle,
    error::{Error, ErrorKind, Side},
    lifecycle::RequestPlan,
    metrics::{Guard, WorkerMetrics},
    models,
    pipeline::{self, Encoder, Sink, UsageGuard},
    server::h1::{Conn, Framing, Request},
    upstream::ws::{Continuation, WsRoute},
    ws::{
        codec::{self, close_code, Limits, Message, Role},
        handshake,
    },
};

/// The WebSocket is the Responses route's (metrics, usage and errors).
const ROUTE: Route = Route::Responses;
/// Frames queued for the writer beyond which the session waits (a slow client slows the
/// stream instead of growing memory).
const HIGH_WATER: usize = 1 << 20;
/// Error events the reader may answer between two turns (unsupported message types, a second
/// `response.create` while one is in flight, JSON nested too deep): past it the session ends
/// with close `1008`. A client that floods invalid messages cannot make the gateway write for
/// it without bound, and a client whose newer message types we do not know keeps working
/// (the budget starts again at each turn).
const READER_ERROR_BUDGET: u32 = 32;

/// How long, and for how many bytes, a session closed on our side keeps reading (and
/// discarding) what its client still sends, so the client reads our Close ([`linger`]).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024 * 1024;
/// Characters of an unsupported message `type` echoed back in the error event.
const MAX_ECHOED_TYPE: usize = 64;

/// The read buffer of a session between messages (see [`read_messages`]).
const IDLE_READ_BUF: usize = 1024;
/// Turns a socket remembers for `previous_response_id`.
const MAX_CHAINS: usize = 32;
/// How often an idle session checks the drain flag and its idle deadline.
const IDLE_TICK: Duration = Duration::from_secs(5);

/// Whether this request asks for the Responses WebSocket.
pub fn wants_upgrade(req: &Request) -> bool {
    req.method == "GET"
        && Route::of_path(&req.path) == ROUTE
        && handshake::is_upgrade_request(&req.headers)
}

/// Serves a WebSocket upgrade request to its end (the connection is not reused for HTTP).
pub async fn serve(ctx: &WorkerCtx, mut conn: Conn<TcpStream>, req: Request) {
    let key = match authenticate(ctx, &req) {
        Ok(k) => k,
        Err(e) => {
            let _ = write_error(ctx, &mut conn, ROUTE, &e, false).await;
            return;
        }
    };
    if req.http10 || req.framing != Framing::None {
        let e = Error::bad_request(
            "A WebSocket upgrade is an HTTP/1.1 GET without a body.",
            None,
        );
        let _ = write_error(ctx, &mut conn, ROUTE, &e, false).await;
        return;
    }
    let hs = match handshake::accept(&req.headers) {
        Ok(h) => h,
        Err(e) => {
            let e = Error::new(ErrorKind::WsHandshake(e), Side::Downstream);
            let _ = write_error(ctx, &mut conn, ROUTE, &e, false).await;
            return;
        }
    };
    // The key's cap on open sessions, held for the socket's life.
    let _session_slot = match crate::limits::open_ws_session(&key, ctx.cfg.max_ws_sessions_per_key)
    {
        Ok(s) => s,
        Err(e) => {
            let _ = write_error(ctx, &mut conn, ROUTE, &e, false).await;
            return;
        }
    };
    let head = handshake::response_head(&hs, &[(crate::request_id::HEADER, conn.request_id())]);
    if conn.write_all(head).await.is_err() {
        return;
    }
    ctx.metrics.request(ROUTE.label(), 101);
    ctx.metrics.ws_sessions_delta(1);
    let _open = scopeguard(|| ctx.metrics.ws_sessions_delta(-1));
    let (io, buffered) = conn.into_parts();
    let (rd, wr) = io.into_split();
    let shared = Rc::new(WsShared::new(hs.deflate));
    let (to_writer, from_session) = mpsc::unbounded_channel();
    *shared.tx.borrow_mut() = Some(to_writer);
    let (to_session, from_reader) = mpsc::channel(4);
    let limits = Limits {
        max_message: ctx.cfg.max_body_bytes,
    };
    monoio::spawn(
        AssertUnwindSafe(writer(
            wr,
            from_session,
            Rc::clone(&shared),
            ctx.cfg.client_write_timeout,
            Arc::clone(&ctx.metrics),
        ))
        .catch_unwind()
        .map(|_| ()),
    );
    monoio::spawn(
        AssertUnwindSafe(reader(
            rd,
            buffered,
            hs.deflate,
            limits,
            Rc::clone(&shared),
            to_session,
            Arc::clone(&ctx.metrics),
        ))
        .catch_unwind()
        .map(|_| ()),
    );
    session(ctx, &req, &shared, from_reader).await;
    shared.close(close_code::GOING_AWAY, "");
    // A write deadline no turn reported (the session was between turns) is counted here; one
    // that comes later is counted by the writer.
    shared.session_over.set(true);
    if shared.write_timeout.get() == WriteTimeout::Pending {
        shared.write_timeout.set(WriteTimeout::Reported);
        ctx.metrics.guard(Guard::WriteTimeout);
    }
}

/// Runs `f` when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

fn scopeguard<F: FnMut()>(f: F) -> OnDrop<F> {
    OnDrop(f)
}

/// One socket's turns, in order.
async fn session(
    ctx: &WorkerCtx,
    req: &Request,
    shared: &WsShared,
    mut requests: mpsc::Receiver<Vec<u8>>,
) {
    let mut chains = Chains::default();
    // This socket's upstream conversation: its turns share a pooled upstream socket.
    let conversation = response_id();
    let idle = ctx.cfg.ws_idle_timeout;
    loop {
        let next = match monoio::time::timeout(IDLE_TICK, requests.recv()).await {
            Ok(Some(p)) => p,
            Ok(None) => return, // the reader ended: client closed or broke the protocol
            Err(_) => {
                if ctx.is_draining() {
                    shared.close(close_code::GOING_AWAY, "server shutting down");
                    return;
                }
                if shared.last_seen.get().elapsed() >= idle {
                    shared.close(close_code::GOING_AWAY, "idle timeout");
                    return;
                }
                continue;
            }
        };
        shared.reader_errors.set(0);
        // Every turn re-resolves the key from the current snapshot: a key revoked, disabled
        // or expired since the handshake loses the socket, and changed limits apply now.
        let key = match authenticate(ctx, req) {
            Ok(k) => k,
            Err(e) => {
                shared.send_text(&e.ws_error_event(&crate::request_id::generate()));
                shared.close(close_code::POLICY, "API key no longer valid");
                return;
            }
        };
        turn(ctx, &key, req, shared, &mut chains, &conversation, next).await;
        shared.in_flight.set(false);
        shared.last_seen.set(Instant::now());
        if shared.closed.get() {
            return;
        }
        if ctx.is_draining() {
            shared.close(close_code::GOING_AWAY, "server shutting down");
            return;
        }
    }
}

/// A turn's node in the socket's transcript: its inputs and outputs, after its parent's.
struct Chain {
    parent: Option<Rc<Chain>>,
    items: Vec<sonic_rs::Value>,
}

/// Response ids of this socket and their transcripts (the most recent [`MAX_CHAINS`]).
#[derive(Default)]
struct Chains(VecDeque<(String, Rc<Chain>)>);

impl Chains {
    fn get(&self, id: &str) -> Option<Rc<Chain>> {
        self.0
            .iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, c)| Rc::clone(c))
    }

    fn insert(&mut self, id: String, chain: Chain) {
        if self.0.len() >= MAX_CHAINS {
            self.0.pop_front();
        }
        self.0.push_back((id, Rc::new(chain)));
    }
}

/// The full history up to and including `chain`.
fn history(chain: &Rc<Chain>) -> Vec<sonic_rs::Value> {
    let mut nodes = vec![Rc::clone(chain)];
    while let Some(p) = nodes.last().and_then(|n| n.parent.clone()) {
        nodes.push(p);
    }
    nodes
        .iter()
        .rev()
        .flat_map(|n| n.items.iter().cloned())
        .collect()
}

/// The `input` of a request as items (a string is one user message).
fn input_items(v: &sonic_rs::Value) -> Vec<sonic_rs::Value> {
    match v.get("input") {
        Some(i) if i.is_str() => {
            let text = i.as_str().unwrap_or_default();
            vec![sonic_rs::json!({
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            })]
        }
        Some(i) => i
            .as_array()
            .map(|a| a.iter().cloned().collect())
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

fn response_id() -> String {
    let n: u128 = rand::random();
    format!("resp_{n:032x}")
}

fn items_array(items: impl Iterator<Item = sonic_rs::Value>) -> sonic_rs::Array {
    let mut arr = sonic_rs::Array::new();
    for it in items {
        arr.push(it);
    }
    arr
}

/// One `response.create`.
async fn turn(
    ctx: &WorkerCtx,
    key: &ClientKey,
    req: &Request,
    shared: &WsShared,
    chains: &mut Chains,
    conversation: &str,
    payload: Vec<u8>,
) {
    // Each turn is a request of its own: its own id, in its error events and usage record.
    let request_id = crate::request_id::generate();
    let mut v: sonic_rs::Value = match sonic_rs::from_slice(&payload) {
        Ok(v) => v,
        Err(e) => {
            let e = Error::bad_request(format!("Invalid JSON in the WebSocket message: {e}"), None);
            shared.send_text(&e.ws_error_event(&request_id));
            return;
        }
    };
    // What HTTP refuses the WebSocket refuses too (the input is rebuilt below, so a bad one
    // would otherwise go upstream empty).
    if let Some(i) = v.get("input") {
        if !i.is_str() && !i.is_array() {
            let e = Error::bad_request(codex_protocol::normalize::INPUT_TYPE_ERROR, Some("input"));
            shared.send_text(&e.ws_error_event(&request_id));
            return;
        }
    }
    let generate = v.get("generate").and_then(|g| g.as_bool()) != Some(false);
    let parent = match v.get("previous_response_id").and_then(|p| p.as_str()) {
        Some(id) => match chains.get(id) {
            Some(c) => Some(c),
            None => {
                let e = Error::new(ErrorKind::ContinuationNotFound, Side::Downstream);
                shared.send_text(&e.ws_error_event(&request_id));
                return;
            }
        },
        None => None,
    };
    let new_items = input_items(&v);
    if !generate {
        warm_up(shared, chains, &v, parent, new_items);
        return;
    }
    let prev_id = parent
        .as_ref()
        .and(v.get("previous_response_id").and_then(|p| p.as_str()))
        .map(str::to_owned);
    let catalog = ctx.catalog.load();
    let strict = ctx.cfg.strict_models;
    let normalize = |v: &sonic_rs::Value| {
        let body = sonic_rs::to_vec(v).unwrap_or_default();
        normalize_responses_with(&body, &|m| models::choose(&catalog, strict, m))
    };
    // The exact continuation, for the upstream socket that produced the previous response:
    // only the new items, by `previous_response_id`.
    let continuation = match &prev_id {
        Some(id) if ctx.cfg.upstream.websockets => {
            let mut short = v.clone();
            if let Some(obj) = short.as_object_mut() {
                obj.insert(&"input", items_array(new_items.iter().cloned()));
            }
            normalize(&short).ok().and_then(|n| {
                let mut body: sonic_rs::Value = sonic_rs::from_slice(&n.body).ok()?;
                body.as_object_mut()?
                    .insert(&"previous_response_id", id.as_str());
                Some(Continuation {
                    previous_response_id: id.clone(),
                    body: Bytes::from(sonic_rs::to_vec(&body).ok()?),
                })
            })
        }
        _ => None,
    };
    // Otherwise the full history, replayed (the upstream keeps nothing with store:false).
    if let Some(obj) = v.as_object_mut() {
        let mut items = parent.as_ref().map(history).unwrap_or_default();
        items.extend(new_items.iter().cloned());
        obj.insert(&"input", items_array(items.into_iter()));
        obj.remove(&"previous_response_id");
    }
    let norm = match normalize(&v) {
        Ok(n) => n,
        Err(e) => {
            let e = match e.unknown_model {
                Some(m) => Error::new(ErrorKind::ModelNotFound(m), Side::Downstream),
                None => Error::bad_request(e.message, e.param),
            };
            shared.send_text(&e.ws_error_event(&request_id));
            return;
        }
    };
    drop(catalog);
    // Each turn is one request against the key's limits (as of the handshake).
    let _slot = match crate::limits::admit(ctx, key, shared_state::now_ms()).await {
        Ok(s) => s,
        Err(e) => {
            shared.send_text(&e.ws_error_event(&request_id));
            return;
        }
    };
    let mut usage = UsageGuard::start(
        ctx,
        key,
        ROUTE.label(),
        norm.model.clone(),
        true,
        &request_id,
    );
    let plan = RequestPlan {
        route: ROUTE.label(),
        model: norm.model,
        body: Bytes::from(norm.body),
        asked: norm.asked,
        passthrough: passthrough(req),
        key_id: key.id,
        key_limits: std::sync::Arc::clone(&key.limits),
        // A socket's turns stay on one account while it is healthy (its pooled upstream
        // socket holds the conversation), even when the client sends no session signal.
        affinity_key: affinity_key(req)
            .or_else(|| norm.prompt_cache_key.clone())
            .or_else(|| Some(conversation.to_owned())),
        upstream_ws: Some(WsRoute {
            conversation: conversation.to_owned(),
            continuation,
        }),
    };
    let committed = match Box::pin(pipeline::open(ctx, &plan, &mut usage)).await {
        Ok(c) => c,
        Err(e) => {
            shared.send_text(&e.ws_error_event(&request_id));
            return;
        }
    };
    let mut enc = Capturing::new(ResponsesWs { shared });
    let mut sink = WsSink {
        shared,
        request_id: &request_id,
    };
    let _ = Box::pin(pipeline::forward(
        ctx, committed, &mut usage, &mut enc, &mut sink,
    ))
    .await;
    if let Some(id) = enc.outputs.response_id.take() {
        let mut items = new_items;
        items.append(&mut enc.outputs.items);
        chains.insert(id, Chain { parent, items });
    }
}

/// `generate:false`: answers `response.created` + `response.completed` with an empty output
/// and no upstream turn; the warm-up's input becomes the start of the transcript, so the next
/// turn (by `previous_response_id`, with only its new items) is replayed whole.
fn warm_up(
    shared: &WsShared,
    chains: &mut Chains,
    v: &sonic_rs::Value,
    parent: Option<Rc<Chain>>,
    items: Vec<sonic_rs::Value>,
) {
    let id = response_id();
    let model = v.get("model").and_then(|m| m.as_str()).unwrap_or_default();
    let now = shared_state::now_ms() / 1000;
    let response = |status: &str| {
        sonic_rs::json!({
            "id": id.as_str(), "object": "response", "created_at": now, "status": status,
            "model": model, "output": [], "store": false,
            "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": 0},
        })
    };
    let created = sonic_rs::json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress")});
    let completed = sonic_rs::json!({"type": "response.completed", "sequence_number": 1, "response": response("completed")});
    shared.send_text(&sonic_rs::to_vec(&created).unwrap_or_default());
    shared.send_text(&sonic_rs::to_vec(&completed).unwrap_or_default());
    chains.insert(id, Chain { parent, items });
}

/// Whether the writer hit the write deadline, and whether that was counted (once: by the
/// turn whose stream it ended, as `client_write_timeout`, else by the session or the writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteTimeout {
    None,
    Pending,
    Reported,
}

/// The socket state the reader, the writer and the session share (one worker, `!Send`).
pub struct WsShared {
    enc: RefCell<codec::Encoder>,
    tx: RefCell<Option<mpsc::UnboundedSender<Vec<u8>>>>,
    queued: Cell<usize>,
    drained: Notify,
    /// A `response.create` was handed to the session and its turn has not ended.
    in_flight: Cell<bool>,
    /// No more frames go out (our Close was queued, or the peer is gone).
    closed: Cell<bool>,
    /// Wakes the reader to cancel its read when the session closes.
    closing: Notify,
    last_seen: Cell<Instant>,
    /// The writer's deadline passed (the client stopped reading).
    write_timeout: Cell<WriteTimeout>,
    /// `serve` has returned: the writer counts a later deadline itself.
    session_over: Cell<bool>,
    /// The payload of the latest ping not yet answered. Only the latest is answered (RFC 6455
    /// §5.5.3 allows it): a client that floods pings and never reads queues one pong, not one
    /// per ping. The writer takes it when it reaches the marker [`WsShared::send_pong`] queued.
    pong: RefCell<Option<Vec<u8>>>,
    /// Error events the reader answered since the last turn began ([`READER_ERROR_BUDGET`]).
    reader_errors: Cell<u32>,
}

// === impl WsShared ===

impl WsShared {
    fn new(deflate: Option<crate::ws::deflate::DeflateParams>) -> Self {
        Self {
            enc: RefCell::new(codec::Encoder::new(Role::Server, deflate)),
            tx: RefCell::new(None),
            queued: Cell::new(0),
            drained: Notify::new(),
            in_flight: Cell::new(false),
            closed: Cell::new(false),
            closing: Notify::new(),
            last_seen: Cell::new(Instant::now()),
            write_timeout: Cell::new(WriteTimeout::None),
            session_over: Cell::new(false),
            pong: RefCell::new(None),
            reader_errors: Cell::new(0),
        }
    }

    fn push(&self, frame: Vec<u8>) {
        if let Some(tx) = self.tx.borrow().as_ref() {
            self.queued.set(self.queued.get() + frame.len());
            let _ = tx.send(frame);
        }
    }

    /// Queues one text frame (encoded now: the deflate context follows the queue order).
    fn send_text(&self, payload: &[u8]) {
        if self.closed.get() {
            return;
        }
        let mut out = Vec::with_capacity(payload.len() + 16);
        self.enc.borrow_mut().text(&mut out, payload);
        self.push(out);
    }

    /// Answers a ping: the payload waits in [`WsShared::pong`] (replacing an unanswered
    /// one) and an empty marker is queued where the pong goes out. Pongs are control frames
    /// (never compressed), so encoding one at write time leaves the deflate context alone.
    fn send_pong(&self, payload: &[u8]) {
        if self.closed.get() {
            return;
        }
        if self.pong.replace(Some(payload.to_vec())).is_none() {
            self.push(Vec::new());
        }
    }

    /// The pong a marker stands for, encoded (empty when it was answered already).
    fn take_pong(&self) -> Vec<u8> {
        let Some(payload) = self.pong.borrow_mut().take() else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(payload.len() + 8);
        self.enc.borrow_mut().pong(&mut out, &payload);
        out
    }

    /// An error event the reader answers, within the session's [`READER_ERROR_BUDGET`];
    /// `false` when the budget is spent (the session is closed with `1008`).
    fn reader_error(&self, e: &Error, metrics: &WorkerMetrics) -> bool {
        let n = self.reader_errors.get() + 1;
        self.reader_errors.set(n);
        if n > READER_ERROR_BUDGET {
            metrics.guard(Guard::WsErrorBudget);
            self.close(close_code::POLICY, "too many invalid messages");
            return false;
        }
        self.send_text(&e.ws_error_event(&crate::request_id::generate()));
        true
    }

    /// Queues our Close frame (once), then lets the writer finish and the reader stop.
    fn close(&self, code: u16, reason: &str) {
        if !self.closed.replace(true) {
            let mut out = Vec::new();
            self.enc.borrow_mut().close(&mut out, code, reason);
            self.push(out);
        }
        self.tx.borrow_mut().take();
        self.closing.notify_one();
    }

    /// The peer is gone: nothing more is written.
    fn gone(&self) {
        self.closed.set(true);
        self.tx.borrow_mut().take();
        self.closing.notify_one();
        self.drained.notify_waiters();
    }

    /// Why nothing more can be sent: `TimedOut` once for the write deadline (the turn that
    /// meets it reports it), `BrokenPipe` otherwise.
    fn closed_error(&self) -> io::Error {
        if self.write_timeout.get() == WriteTimeout::Pending {
            self.write_timeout.set(WriteTimeout::Reported);
            io::Error::new(
                io::ErrorKind::TimedOut,
                "client did not read the WebSocket in time",
            )
        } else {
            io::ErrorKind::BrokenPipe.into()
        }
    }
}

/// Writes queued frames in order; ends when the queue closes, then half-closes the socket.
///
/// The write deadline is progress-based, like the HTTP response writer's: every `write` must
/// take some bytes within `write_timeout`, however long a large frame takes in all. A client
/// that stops reading meets it: the session ends at once as if the peer had gone (the turn's
/// upstream stream and account slot are released; the turn is recorded as
/// `client_write_timeout`), queued frames are dropped, and the writer finishes the frame it
/// was in and sends Close `1008` under the same progress deadline (a client that reads again
/// sees a clean close; one that never does is cut one deadline later), then closes.
async fn writer(
    mut wr: OwnedWriteHalf<TcpStream>,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    shared: Rc<WsShared>,
    write_timeout: Duration,
    metrics: Arc<WorkerMetrics>,
) {
    let mut deadline = Idle::new(write_timeout);
    while let Some(frame) = frames.recv().await {
        // What `push` counted (a pong's marker counts nothing).
        let counted = frame.len();
        let frame = if counted == 0 {
            shared.take_pong()
        } else {
            frame
        };
        if frame.is_empty() {
            continue;
        }
        let n = frame.len();
        let res = write_progressing(&mut wr, frame, &mut deadline).await;
        shared
            .queued
            .set(shared.queued.get().saturating_sub(counted));
        shared.drained.notify_waiters();
        match res {
            Ok(()) => {}
            Err(WriteFail::Stalled(mut rest)) => {
                shared.write_timeout.set(WriteTimeout::Pending);
                if shared.session_over.get() {
                    shared.write_timeout.set(WriteTimeout::Reported);
                    metrics.guard(Guard::WriteTimeout);
                }
                shared.gone();
                drop(frames);
                if rest.len() == n {
                    // Nothing of this frame left: only the Close goes.
                    rest.clear();
                }
                shared.enc.borrow_mut().close(
                    &mut rest,
                    close_code::POLICY,
                    "client did not read in time",
                );
                if write_progressing(&mut wr, rest, &mut deadline)
                    .await
                    .is_ok()
                {
                    let _ = wr.shutdown().await;
                }
                return;
            }
            Err(WriteFail::Broken) => {
                shared.gone();
                return;
            }
        }
    }
    let _ = wr.shutdown().await;
}

/// Why [`write_progressing`] stopped.
enum WriteFail {
    /// No byte was taken for a whole deadline; the bytes not written (the rest of the buffer).
    Stalled(Vec<u8>),
    /// The socket failed or the peer closed.
    Broken,
}

/// Writes all of `buf`, each `write` taking some bytes within `deadline` (the writer's entry
/// on the worker's deadline wheel, touched per write: no runtime timer per frame). A write
/// past the deadline is cancelled and awaited (never abandoned: io_uring may have completed it), so
/// exactly the bytes not written come back with [`WriteFail::Stalled`] and the frame can still
/// be finished.
async fn write_progressing<W: CancelableAsyncWriteRent>(
    wr: &mut W,
    buf: Vec<u8>,
    deadline: &mut Idle,
) -> Result<(), WriteFail> {
    let mut buf = buf;
    let mut done = 0;
    while done < buf.len() {
        let canceller = Canceller::new();
        let write = wr.cancelable_write(buf.slice(done..), canceller.handle());
        let mut write = std::pin::pin!(write);
        let mut late = false;
        deadline.touch();
        let passed = std::future::poll_fn(|cx| deadline.poll_expired(cx).map(|_| ()));
        let (res, slice) = monoio::select! {
            r = &mut write => r,
            _ = passed => {
                late = true;
                canceller.cancel();
                write.await
            }
        };
        buf = slice.into_inner();
        match res {
            Ok(0) => return Err(WriteFail::Broken),
            // Progress, even when it landed as the deadline passed.
            Ok(n) => done += n,
            Err(_) if late => return Err(WriteFail::Stalled(buf.split_off(done))),
            Err(_) => return Err(WriteFail::Broken),
        }
    }
    Ok(())
}

/// Decodes client frames; hands `response.create` requests to the session.
///
/// What the reader itself answers (pongs, error events) is bounded: only the latest ping is
/// answered, error events come out of a per-turn budget, and the reader stops reading while
/// the writer's queue is above [`HIGH_WATER`] (a client that sends and never reads slows
/// itself down instead of growing the process). Every message's JSON nesting is measured
/// before anything parses it (close `1009` past [`codex_protocol::depth::MAX_DEPTH`]).
async fn reader(
    mut rd: OwnedReadHalf<TcpStream>,
    mut buf: Vec<u8>,
    deflate: Option<crate::ws::deflate::DeflateParams>,
    limits: Limits,
    shared: Rc<WsShared>,
    requests: mpsc::Sender<Vec<u8>>,
    metrics: Arc<WorkerMetrics>,
) {
    let gone = read_messages(
        &mut rd, &mut buf, deflate, limits, &shared, requests, &metrics,
    )
    .await;
    if !gone {
        linger(&mut rd, buf).await;
    }
}

/// [`reader`]'s loop; `true` when the peer is gone (end of stream or a failed read), `false`
/// when the session was closed on our side with the client's socket still open.
async fn read_messages(
    rd: &mut OwnedReadHalf<TcpStream>,
    buf: &mut Vec<u8>,
    deflate: Option<crate::ws::deflate::DeflateParams>,
    limits: Limits,
    shared: &WsShared,
    requests: mpsc::Sender<Vec<u8>>,
    metrics: &WorkerMetrics,
) -> bool {
    let mut dec = codec::Decoder::new(Role::Server, limits, deflate);
    loop {
        loop {
            match dec.decode(buf) {
                Ok(Some(msg)) => {
                    shared.last_seen.set(Instant::now());
                    match msg {
                        Message::Text(p) | Message::Binary(p) => {
                            if !codex_protocol::depth::check(&p) {
                                // Before `get` below, which recurses through the fields
                                // ahead of `type`.
                                metrics.guard(Guard::JsonTooDeep);
                                let e = super::too_deep();
                                shared.send_text(&e.ws_error_event(&crate::request_id::generate()));
                                shared.close(close_code::TOO_BIG, "JSON nested too deep");
                                return false;
                            }
                            let ty = sonic_rs::get(p.as_slice(), &["type"])
                                .ok()
                                .and_then(|t| t.as_str().map(str::to_owned));
                            match ty.as_deref() {
                                Some("response.create") => {
                                    if shared.in_flight.replace(true) {
                                        let e = Error::bad_request(
                                            "A response is already in progress on this WebSocket; send the next response.create after its terminal event.",
                                            None,
                                        );
                                        if !shared.reader_error(&e, metrics) {
                                            return false;
                                        }
                                    } else if requests.send(p).await.is_err() {
                                        return false;
                                    }
                                }
                                // Acknowledgements of newer clients: nothing to do.
                                Some("response.processed") => {}
                                other => {
                                    let e = Error::bad_request(
                                        format!(
                                            "Unsupported WebSocket message type {:?}; expected response.create.",
                                            echoed(other.unwrap_or(""))
                                        ),
                                        Some("type"),
                                    );
                                    if !shared.reader_error(&e, metrics) {
                                        return false;
                                    }
                                }
                            }
                        }
                        Message::Ping(p) => shared.send_pong(&p),
                        Message::Pong(_) => {}
                        Message::Close(c) => {
                            let code = c.map_or(close_code::NORMAL, |(code, _)| code);
                            let code = if codec::valid_close_code(code) {
                                code
                            } else {
                                close_code::NORMAL
                            };
                            shared.close(code, "");
                            return false;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.close(e.code, e.reason);
                    return false;
                }
            }
        }
        if shared.closed.get() {
            return false;
        }
        // The client is not reading what it is sent: read nothing more from it until the
        // writer has caught up (pongs and error events are queued like the pipeline's frames).
        if shared.queued.get() > HIGH_WATER {
            metrics.guard(Guard::WsReaderPaused);
            while shared.queued.get() > HIGH_WATER && !shared.closed.get() {
                shared.drained.notified().await;
            }
            if shared.closed.get() {
                return false;
            }
        }
        // Append the next read; cancelled (and awaited) only when the session closes.
        // Between messages the buffer is empty, and the read may wait for minutes: an idle
        // session waits with a small buffer (a client's 40 KB turn grew this one), and the
        // next message grows it again as it arrives.
        if buf.is_empty() {
            if buf.capacity() != IDLE_READ_BUF {
                *buf = Vec::with_capacity(IDLE_READ_BUF);
            }
        } else if buf.capacity() - buf.len() < 4096 {
            buf.reserve(buf.capacity().max(8192));
        }
        let len = buf.len();
        let canceller = Canceller::new();
        let read = rd.cancelable_read(std::mem::take(buf).slice_mut(len..), canceller.handle());
        let mut read = std::pin::pin!(read);
        let (res, slice) = monoio::select! {
            r = &mut read => r,
            _ = shared.closing.notified() => {
                canceller.cancel();
                read.await
            }
        };
        *buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => {
                shared.gone();
                return true;
            }
            Ok(_) => {}
        }
    }
}

/// After our side closed the session: reads and discards what the client still sends, until it
/// closes its side, [`LINGER`] passes or [`LINGER_BYTES`] were read. Closing a socket with
/// unread bytes in its receive queue sends a reset, and the client's kernel then drops what the
/// client had not read yet: the error events and the Close that explain why (a client that sent
/// 100 invalid messages saw `ECONNRESET` instead of 32 error events and Close `1008`).
async fn linger(rd: &mut OwnedReadHalf<TcpStream>, mut buf: Vec<u8>) {
    let deadline = Instant::now() + LINGER;
    let mut seen = 0usize;
    buf.clear();
    if buf.capacity() < 8192 {
        buf.reserve(8192);
    }
    while seen < LINGER_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let canceller = Canceller::new();
        let read = rd.cancelable_read(buf, canceller.handle());
        let mut read = std::pin::pin!(read);
        let (res, back) = monoio::select! {
            r = &mut read => r,
            _ = monoio::time::sleep(left) => {
                canceller.cancel();
                read.await
            }
        };
        buf = back;
        buf.clear();
        match res {
            Ok(n) if n > 0 => seen += n,
            _ => return,
        }
    }
}

/// The start of an unsupported message type, as echoed in its error event (at most
/// [`MAX_ECHOED_TYPE`] characters: a 600 KB `type` is not sent back whole).
fn echoed(ty: &str) -> std::borrow::Cow<'_, str> {
    match ty.char_indices().nth(MAX_ECHOED_TYPE) {
        Some((cut, _)) => format!("{}...", &ty[..cut]).into(),
        None => ty.into(),
    }
}

/// The pipeline's WebSocket transport: frames are queued for the writer; the session waits
/// while the client lags behind.
struct WsSink<'a> {
    shared: &'a WsShared,
    /// The turn's id, for its error event.
    request_id: &'a str,
}

impl Sink for WsSink<'_> {
    async fn begin(&mut self, _headers: &[(&'static str, String)]) -> io::Result<()> {
        Ok(())
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.shared.closed.get() {
            return Err(self.shared.closed_error());
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.shared.push(bytes.to_vec());
        while self.shared.queued.get() > HIGH_WATER && !self.shared.closed.get() {
            self.shared.drained.notified().await;
        }
        if self.shared.closed.get() {
            return Err(self.shared.closed_error());
        }
        Ok(())
    }

    async fn end(&mut self, last: &[u8]) -> io::Result<bool> {
        self.send(last).await?;
        Ok(true)
    }

    async fn whole(
        &mut self,
        _headers: &[(&'static str, String)],
        body: &[u8],
    ) -> io::Result<bool> {
        self.shared.send_text(body);
        Ok(true)
    }

    async fn error(&mut self, e: &Error) -> io::Result<bool> {
        self.shared.send_text(&e.ws_error_event(self.request_id));
        Ok(true)
    }
}

/// Responses over WebSocket: each upstream event's JSON as one text frame, byte-faithful
/// (wrapped in [`Capturing`] for the socket's transcript).
pub struct ResponsesWs<'a> {
    shared: &'a WsShared,
}

impl Encoder for ResponsesWs<'_> {
    fn streaming(&self) -> bool {
        true
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        self.shared.enc.borrow_mut().text(out, &ev.data);
    }

    fn broken(&mut self, e: &Error, response_id: Option<&str>, out: &mut Vec<u8>) {
        self.shared
            .enc
            .borrow_mut()
            .text(out, &e.response_failed_event(response_id));
    }

    fn finish(&mut self, _failed: Option<&Error>, _out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// A connected pair: our monoio socket (its write half) and the peer, a blocking std socket
    /// with a small receive buffer (set before connecting, so the window agrees).
    fn pair() -> (
        OwnedWriteHalf<TcpStream>,
        OwnedReadHalf<TcpStream>,
        std::net::TcpStream,
    ) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(&listener.local_addr().unwrap().into())
            .unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let (rd, wr) = TcpStream::from_std(server).unwrap().into_split();
        (wr, rd, sock.into())
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    /// Progress, not a total: a peer reading 4 MiB at a time with 300 ms pauses takes about
    /// 2 s for 24 MiB, twice the 1 s deadline, and every byte arrives in order (a deadline
    /// around the whole write would have cut it).
    #[monoio::test_all(timer_enabled = true)]
    async fn a_slow_but_steady_peer_is_never_cut() {
        let (mut wr, _rd, mut peer) = pair();
        let data = pattern(24 << 20);
        let want = data.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(want.len());
            let mut tmp = vec![0u8; 1 << 16];
            let mut since = 0;
            while got.len() < want.len() {
                let n = peer.read(&mut tmp).unwrap();
                assert!(n > 0, "EOF after {} bytes", got.len());
                got.extend_from_slice(&tmp[..n]);
                since += n;
                if since >= 4 << 20 {
                    std::thread::sleep(Duration::from_millis(300));
                    since = 0;
                }
            }
            got == want
        });
        let t0 = Instant::now();
        let res = write_progressing(&mut wr, data, &mut Idle::new(Duration::from_secs(1))).await;
        assert!(res.is_ok(), "cut after {:?}", t0.elapsed());
        assert!(t0.elapsed() > Duration::from_secs(1), "{:?}", t0.elapsed());
        while !reader.is_finished() {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(reader.join().unwrap(), "bytes differ");
    }

    /// A peer that stops reading: the write stops at the deadline with exactly the bytes not
    /// written (the cancelled write was awaited), so the rest can still follow in order once
    /// the peer reads again.
    #[monoio::test_all(timer_enabled = true)]
    async fn a_stalled_write_returns_exactly_the_unwritten_rest() {
        let (mut wr, _rd, mut peer) = pair();
        let data = pattern(16 << 20);
        let t0 = Instant::now();
        let rest = match write_progressing(
            &mut wr,
            data.clone(),
            &mut Idle::new(Duration::from_millis(300)),
        )
        .await
        {
            Err(WriteFail::Stalled(rest)) => rest,
            Err(WriteFail::Broken) => panic!("broken, not stalled"),
            Ok(()) => panic!("16 MiB went into a peer that never read"),
        };
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(
            !rest.is_empty() && rest.len() < data.len(),
            "{}",
            rest.len()
        );
        let sent = data.len() - rest.len();
        assert_eq!(rest[..], data[sent..], "the rest is the tail of the buffer");
        let want = data.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(want.len());
            let mut tmp = vec![0u8; 1 << 16];
            while got.len() < want.len() {
                let n = peer.read(&mut tmp).unwrap();
                assert!(n > 0, "EOF after {} bytes", got.len());
                got.extend_from_slice(&tmp[..n]);
            }
            got == want
        });
        assert!(
            write_progressing(&mut wr, rest, &mut Idle::new(Duration::from_secs(5)))
                .await
                .is_ok(),
            "the rest goes once the peer reads"
        );
        while !reader.is_finished() {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(reader.join().unwrap(), "every byte once, in order");
    }
}
