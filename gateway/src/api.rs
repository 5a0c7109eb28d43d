//! The API layer: routing, client authentication, body reading and decoding, and the HTTP
//! rendering of errors. Each API surface has its file; all of them hand requests to the
//! lifecycle and stream what it commits through [`crate::pipeline`]. Nothing here decides
//! anything about accounts.
//!
//! # Key Components
//! - [`route`]: the route table ([`Route::dispatch`]: method and path to a [`Route`] and an
//!   [`Action`]); each route knows its label, dialect and front step.
//! - [`handle`]: dispatches one request head through the table: the routes without a client
//!   key are answered directly; every other one goes through the one front step
//!   (`read_authenticated`: authenticate, admit, read and decode the body) and then its
//!   surface.
//! - The surfaces: [`responses`] (`/v1/responses`, also ChatGPT mode's), [`compact`]
//!   (`/v1/responses/compact`: remote compaction v1, served through v2), [`ws`] (the Responses
//!   WebSocket), [`chat`] (`/v1/chat/completions`), [`messages`] (Anthropic `/v1/messages`,
//!   `/v1/messages/count_tokens`), [`chatgpt`] (the Codex CLI's ChatGPT-mode catalog,
//!   `/wham/usage`, `/wham/accounts/check`, cheap side calls), [`ops`] (`/healthz`,
//!   `/metrics`, `/v1/models`).
//! - [`HttpSink`]: the HTTP/1.1 transport of the pipeline (a chunked stream or one response).
//! - [`write_error`]: the one place an [`Error`] becomes an HTTP response, in the route's
//!   dialect ([`Route::dialect`]: OpenAI's, or Anthropic's for the messages routes), counted
//!   under the route's label; the kind decides status, type and headers
//!   ([`Error::render_as`]), its SSE and WebSocket renderings live next to the error type,
//!   [`crate::error`].

pub mod chat;
pub mod chatgpt;
pub mod compact;
pub mod messages;
pub mod ops;
pub mod responses;
pub mod route;
pub mod ws;

use std::io;

use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;

use crate::{
    ctx::WorkerCtx,
    error::{Dialect, Error, ErrorKind, Side},
    lifecycle::PASSTHROUGH_HEADERS,
    pipeline::Sink,
    server::h1::{Conn, ReadError, Request},
};

pub use route::{Action, Route};

pub(crate) const JSON: (&str, &str) = ("content-type", "application/json");

/// Anthropic's name for the request id header (its SDKs read it as `_request_id`): answers in
/// Anthropic's dialect carry the id under it too, beside `x-request-id`.
const ANTHROPIC_REQUEST_ID: &str = "request-id";

/// Dispatches one request through the route table ([`Route::dispatch`]): a method the route
/// does not take is answered here; then the routes without a client key; then, for every
/// other route, the one front step ([`read_authenticated`]: authenticate, admit, read and
/// decode) and the route's surface. Returns `Ok(true)` when the connection may serve another request.
pub async fn handle<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    mut req: Request,
) -> io::Result<bool> {
    let keep = req.keep_alive && !ctx.is_draining();
    let (route, action) = Route::dispatch(&req.method, &req.path);
    match action {
        Action::Serve => {}
        Action::MethodNotAllowed => {
            let e = Error::new(ErrorKind::MethodNotAllowed, Side::Downstream);
            return write_error(ctx, conn, route, &e, keep).await;
        }
        // A GET without `Upgrade: websocket` (upgrades are taken by `ws::serve` before
        // routing): say how to reach this resource, and close.
        Action::UpgradeRequired => {
            let e = Error::new(ErrorKind::UpgradeRequired, Side::Downstream);
            return write_error(ctx, conn, route, &e, false).await;
        }
    }
    if !route.authenticates() {
        return match route {
            Route::Healthz => ops::healthz(ctx, conn, keep).await,
            Route::Metrics if !metrics_allowed(ctx, &req) => {
                let key_present = req.header("authorization").is_some();
                let e = Error::new(ErrorKind::Unauthorized { key_present }, Side::Downstream);
                write_error(ctx, conn, route, &e, keep).await
            }
            Route::Metrics => ops::metrics(ctx, conn, keep).await,
            Route::Probe => ops::probe(ctx, conn, keep).await,
            Route::SideCall => chatgpt::side_call(ctx, conn, req, keep).await,
            _ => {
                let e = Error::new(ErrorKind::NotFound, Side::Downstream);
                write_error(ctx, conn, route, &e, keep).await
            }
        };
    }
    let (key, _slot) = match read_authenticated(ctx, conn, &mut req, route, keep).await {
        Ok(k) => k,
        Err(done) => return done,
    };
    // The surfaces. Boxed where they were: a surface's state is not carried by every
    // connection's task (benches/README.md, "next costs").
    match route {
        Route::Responses => responses::serve(ctx, conn, req, key, keep).await,
        Route::Compact => Box::pin(compact::serve(ctx, conn, req, key, keep)).await,
        Route::Chat => Box::pin(chat::serve(ctx, conn, req, key, keep)).await,
        Route::Messages => Box::pin(messages::serve(ctx, conn, req, key, keep)).await,
        Route::CountTokens => messages::count_tokens(ctx, conn, req, key, keep).await,
        Route::Models => ops::models(ctx, conn, &req, &key, keep).await,
        Route::Model => ops::model(ctx, conn, &req, &key, keep).await,
        Route::Usage => crate::limits::usage(ctx, conn, &key, keep).await,
        Route::CodexModels | Route::PoolUsage | Route::AccountsCheck => {
            Box::pin(chatgpt::serve(ctx, conn, req, route, &key, keep)).await
        }
        // Routes without a key were answered above.
        Route::Healthz | Route::Metrics | Route::Probe | Route::SideCall | Route::NotFound => {
            let e = Error::new(ErrorKind::NotFound, Side::Downstream);
            write_error(ctx, conn, route, &e, keep).await
        }
    }
}

/// Answers a request the front door refused (`crate::front_door`), before routing and
/// authentication, in its route's dialect (429 with `Retry-After`, or 403), and counts it.
/// A WebSocket handshake is refused the same way and its connection closed. The body is not
/// read: a request with one is answered `connection: close` (a client must not send its next
/// request behind an unread body), a request without one keeps its connection (the rates;
/// an address not on the allow-list is always closed). Returns whether the connection may
/// serve another request.
pub async fn refuse_front_door<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: &Request,
    refusal: crate::front_door::Refusal,
) -> bool {
    ctx.metrics.guard(refusal.guard());
    let keep = req.keep_alive
        && !ctx.is_draining()
        && req.framing == crate::server::h1::Framing::None
        && !ws::wants_upgrade(req)
        && refusal != crate::front_door::Refusal::NotAllowed;
    let e = Error::new(ErrorKind::FrontDoor(refusal), Side::Downstream);
    write_error(ctx, conn, Route::of_path(&req.path), &e, keep)
        .await
        .unwrap_or(false)
}

/// The one front step of every route that takes a client key ([`Route::authenticates`]):
/// authenticates the head, admits it under the key's limits ([`Route::admitted`]: every
/// route that goes upstream), then reads and decodes the body ([`Route::reads_body`]). `Err`
/// carries the handler's result when the request was already answered (401, 429, 413, 400).
/// The slot holds the key's concurrency unit until dropped (after the handler returns).
async fn read_authenticated<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: &mut Request,
    route: Route,
    keep: bool,
) -> Result<(ClientKey, Option<crate::limits::KeySlot>), io::Result<bool>> {
    let key = match authenticate(ctx, req) {
        Ok(k) => k,
        Err(e) => return Err(write_error(ctx, conn, route, &e, keep).await),
    };
    let slot = if route.admitted() {
        match crate::limits::admit(ctx, &key, shared_state::now_ms()).await {
            Ok(s) => Some(s),
            Err(e) => return Err(write_error(ctx, conn, route, &e, keep).await),
        }
    } else {
        None
    };
    if !route.reads_body() {
        return Ok((key, slot));
    }
    if let Err(e) = conn.read_body(req, ctx.cfg.max_body_bytes).await {
        if matches!(e, ReadError::Reject { status: 408, .. }) {
            ctx.metrics.guard(crate::metrics::Guard::BodyTimeout);
        }
        return Err(Ok(write_read_error(ctx, conn, route, e).await));
    }
    if let Err(e) = decode_body(ctx, req) {
        return Err(write_error(ctx, conn, route, &e, keep).await);
    }
    // Before any recursive reader sees it (a stack overflow aborts the whole process).
    if !codex_protocol::depth::check(&req.body) {
        ctx.metrics.guard(crate::metrics::Guard::JsonTooDeep);
        return Err(write_error(ctx, conn, route, &too_deep(), keep).await);
    }
    Ok((key, slot))
}

/// The refusal of JSON nested past [`codex_protocol::depth::MAX_DEPTH`] (a body over HTTP, a
/// message over the WebSocket).
pub(crate) fn too_deep() -> Error {
    Error::bad_request(
        format!(
            "The JSON nests arrays and objects deeper than {} levels.",
            codex_protocol::depth::MAX_DEPTH
        ),
        None,
    )
}

/// The credentials of an `Authorization` header with the `Bearer` scheme, in any case
/// ([`shared_state::secret::bearer_credentials`], the admin API's rule too).
pub(crate) fn bearer(value: &str) -> Option<&str> {
    shared_state::secret::bearer_credentials(value)
}

/// `/metrics` is open unless `metrics_token` is set; then it needs `Authorization: Bearer
/// <token>` (compared in constant time).
fn metrics_allowed(ctx: &WorkerCtx, req: &Request) -> bool {
    let Some(token) = &ctx.cfg.metrics_token else {
        return true;
    };
    let presented = req
        .header("authorization")
        .and_then(bearer)
        .map(str::trim)
        .unwrap_or("");
    let (a, b) = (presented.as_bytes(), token.expose().as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Client authentication: `Authorization: Bearer sk-...` or `x-api-key`. A disabled or
/// expired key is refused exactly like an unknown one (401 `invalid_api_key`).
pub(crate) fn authenticate(ctx: &WorkerCtx, req: &Request) -> Result<ClientKey, Error> {
    let presented = req
        .header("authorization")
        .and_then(bearer)
        .or_else(|| req.header("x-api-key"))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let Some(key) = presented else {
        return Err(Error::new(
            ErrorKind::Unauthorized { key_present: false },
            Side::Downstream,
        ));
    };
    ctx.snapshot
        .load()
        .key(key)
        .filter(|k| k.limits.usable_at(shared_state::now_ms()))
        .cloned()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Unauthorized { key_present: true },
                Side::Downstream,
            )
        })
}

/// Renders an error as an HTTP response in the route's dialect (the one HTTP mapping point).
///
/// The future is boxed: error answers are rare, and an inline write (with its timer, 1.5 KiB)
/// at every call site would be carried by every handler's state, so by every open stream.
pub fn write_error<'a, S: AsyncReadRent + AsyncWriteRent + 'a>(
    ctx: &'a WorkerCtx,
    conn: &'a mut Conn<S>,
    route: Route,
    e: &'a Error,
    keep: bool,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<bool>> + 'a>> {
    Box::pin(async move {
        let request_id = conn.request_id().to_owned();
        let dialect = route.dialect();
        let r = e.render_as(dialect, Some(&request_id));
        ctx.metrics.request(route.label(), r.status);
        if e.side != Side::Downstream {
            let route = route.label();
            tracing::warn!(route, status = r.status, request_id, error = %e, "request failed");
        }
        let retry = r.retry_after.map(|s| s.to_string());
        let mut headers: Vec<(&str, &str)> = vec![JSON];
        if let Some(v) = &retry {
            headers.push(("retry-after", v));
        }
        headers.extend_from_slice(r.headers);
        if dialect == Dialect::Anthropic {
            headers.push((ANTHROPIC_REQUEST_ID, &request_id));
        }
        let written = conn.write_response(r.status, &headers, &r.body, keep).await;
        access_unaccounted(
            ctx,
            conn,
            route,
            r.status,
            e.class(),
            e.code(),
            r.body.len(),
        );
        written?;
        Ok(keep)
    })
}

/// The access-log record of a request answered without a usage record (refused before its
/// lifecycle), while the access log is on; a request with a usage record gets its line from
/// that record.
fn access_unaccounted<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    route: Route,
    status: u16,
    class: &'static str,
    code: String,
    bytes: usize,
) {
    if !ctx.cfg.access_log || conn.accounted() {
        return;
    }
    let took = conn.elapsed().as_millis() as u64;
    ctx.report_access(shared_state::UsageRecord {
        route: route.label(),
        status,
        bytes_out: bytes as u64,
        latency_ms: took,
        started_at_ms: shared_state::now_ms().saturating_sub(took),
        error_class: Some(class.to_owned()),
        error_code: Some(code),
        request_id: conn.request_id().to_owned(),
        ..Default::default()
    });
}

/// Answers a request that could not be read (malformed framing, over a limit) and returns
/// `false`: the connection closes after it. Nothing is written when the peer is gone.
pub async fn write_read_error<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    route: Route,
    e: ReadError,
) -> bool {
    let kind = match e {
        ReadError::TooLarge => ErrorKind::BodyTooLarge {
            limit: ctx.cfg.max_body_bytes,
        },
        ReadError::Reject { status, message } => ErrorKind::BadHttpRequest { status, message },
        ReadError::Closed | ReadError::Io(_) => return false,
    };
    let _ = write_error(ctx, conn, route, &Error::new(kind, Side::Downstream), false).await;
    false
}

/// The client's session signal, in the order peers use: explicit session/thread id headers,
/// then the body's top-level `session_id` / `conversation_id` (strings,
/// [`codex_protocol::normalize::SESSION_FIELDS`]), then (by the caller) `prompt_cache_key`. The scheduler scopes it per client key.
pub(crate) fn affinity_key(req: &Request) -> Option<String> {
    header_session(req).or_else(|| body_session(&req.body))
}

/// The session signal of the headers (the first of [`affinity_key`]'s sources); a caller that
/// already read the body takes the body's from there
/// ([`codex_protocol::normalize::Normalized::session`], which reads the same fields).
pub(crate) fn header_session(req: &Request) -> Option<String> {
    ["session-id", "session_id", "thread-id", "conversation_id"]
        .iter()
        .find_map(|h| req.header(h))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The body's session signal: the first of [`codex_protocol::normalize::SESSION_FIELDS`] that is
/// a non-empty string.
fn body_session(body: &[u8]) -> Option<String> {
    use sonic_rs::JsonValueTrait;
    if body.is_empty() {
        return None;
    }
    // One scan of the body for every field (it can be hundreds of KiB), with a tree of paths
    // built once per worker thread.
    thread_local! {
        static PATHS: sonic_rs::PointerTree = {
            let mut t = sonic_rs::PointerTree::new();
            for f in codex_protocol::normalize::SESSION_FIELDS {
                t.add_path([f]);
            }
            t
        };
    }
    PATHS
        .with(|t| sonic_rs::get_many(body, t))
        .ok()?
        .into_iter()
        .find_map(|v| v.and_then(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned)))
}

pub(crate) fn passthrough(req: &Request) -> Vec<(&'static str, String)> {
    PASSTHROUGH_HEADERS
        .iter()
        .filter_map(|n| req.header(n).map(|v| (*n, v.to_owned())))
        .collect()
}

/// Whether this build carries the test hooks: the `fault-injection` feature (enabled by the
/// integration test crate only) AND a build with debug assertions. Feature unification turns
/// the feature on in any build of the whole workspace (`cargo build --release` included), so
/// the feature alone would let a release binary obey `x-codex-gateway-fault` from any
/// authenticated client; no release profile has debug assertions, so no release build can
/// contain the hooks (`tests/tests/deploy.rs` keeps every use of the feature behind this).
pub(crate) const TEST_HOOKS: bool = cfg!(all(feature = "fault-injection", debug_assertions));

/// Test-only fault injection ([`TEST_HOOKS`]): the request header `x-codex-gateway-fault`
/// names a fault to inject.
pub(crate) fn fault_requested(req: &Request, fault: &str) -> bool {
    TEST_HOOKS && req.header("x-codex-gateway-fault") == Some(fault)
}

/// Decodes a compressed request body in place (`Content-Encoding`: zstd, gzip, deflate),
/// never past the body limit.
fn decode_body(ctx: &WorkerCtx, req: &mut Request) -> Result<(), Error> {
    use crate::server::encoding::{decode, DecodeError};
    let Some(coding) = req.header("content-encoding").map(str::to_owned) else {
        return Ok(());
    };
    let limit = ctx.cfg.max_body_bytes;
    req.body =
        decode(Some(&coding), std::mem::take(&mut req.body), limit).map_err(|e| match e {
            DecodeError::TooLarge => {
                Error::new(ErrorKind::BodyTooLarge { limit }, Side::Downstream)
            }
            DecodeError::Unsupported(c) => Error::bad_request(
                format!(
                    "Unsupported Content-Encoding `{c}`; send identity, zstd, gzip or deflate."
                ),
                None,
            ),
            DecodeError::Malformed(c) => Error::bad_request(
                format!("The request body is not valid {c} data (Content-Encoding: {coding})."),
                None,
            ),
        })?;
    req.headers.retain(|(n, _)| n != "content-encoding");
    Ok(())
}

/// The SSE response head (plus client-visible upstream headers).
pub(crate) fn sse_headers<'a>(
    visible: &'a [(&'static str, String)],
) -> Vec<(&'static str, &'a str)> {
    let mut headers: Vec<(&str, &str)> = vec![
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("x-accel-buffering", "no"),
    ];
    for (n, v) in visible {
        headers.push((n, v.as_str()));
    }
    headers
}

/// Runs `plan` through the lifecycle and forwards what commits through `enc` over HTTP; an
/// error before the commit is answered in the route's dialect. The tail every HTTP surface
/// shares.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn open_and_forward<S, E>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    route: Route,
    plan: crate::lifecycle::RequestPlan,
    usage: &mut crate::pipeline::UsageGuard<'_>,
    enc: &mut E,
    http10: bool,
    keep: bool,
) -> io::Result<bool>
where
    S: AsyncReadRent + AsyncWriteRent,
    E: crate::pipeline::Encoder,
{
    // Boxed: the attempt machinery (retries, refresh waits) must not stay resident in every
    // connection's task for the whole stream (benches/README.md, "next costs" 2).
    let committed = match Box::pin(crate::pipeline::open(ctx, &plan, usage)).await {
        Ok(c) => c,
        Err(e) => {
            return write_error(ctx, conn, route, &e, keep).await;
        }
    };
    // Committed: no other attempt will send the upstream body (a Codex CLI request is 40-60
    // KB), so the stream, which can last minutes, does not hold it.
    drop(plan);
    let mut sink = HttpSink {
        ctx,
        conn,
        route,
        http10,
        keep,
    };
    Box::pin(crate::pipeline::forward(
        ctx, committed, usage, enc, &mut sink,
    ))
    .await
}

/// A stable `prompt_cache_key` for a conversation of one client key, when the client sends
/// none (as the Codex CLI derives one per thread): a UUID-shaped digest of the dialect, the
/// key and the parts that identify the conversation's opening. The one rule for every dialect.
pub(crate) fn conversation_cache_key(dialect: &str, key_id: i64, parts: &[&[u8]]) -> String {
    use sha1::{Digest, Sha1};
    let mut h = Sha1::new();
    h.update(b"codex-gateway conversation\0");
    h.update(dialect.as_bytes());
    h.update(key_id.to_le_bytes());
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        hex(&d[0..4]),
        hex(&d[4..6]),
        hex(&d[6..8]),
        hex(&d[8..10]),
        hex(&d[10..16])
    )
}

/// The HTTP/1.1 transport of the pipeline: a chunked (or, for HTTP/1.0, close-delimited)
/// stream, or one fixed response.
pub(crate) struct HttpSink<'a, S> {
    pub(crate) ctx: &'a WorkerCtx,
    pub(crate) conn: &'a mut Conn<S>,
    pub(crate) route: Route,
    pub(crate) http10: bool,
    pub(crate) keep: bool,
}

impl<S: AsyncReadRent + AsyncWriteRent> HttpSink<'_, S> {
    /// The request id for Anthropic's `request-id` header, on its dialect's routes.
    fn anthropic_id(&mut self) -> Option<String> {
        (self.route.dialect() == Dialect::Anthropic).then(|| self.conn.request_id().to_owned())
    }
}

impl<S: AsyncReadRent + AsyncWriteRent> Sink for HttpSink<'_, S> {
    async fn begin(&mut self, headers: &[(&'static str, String)]) -> io::Result<()> {
        self.conn.release_read_buffer();
        self.ctx.metrics.request(self.route.label(), 200);
        let mut h = sse_headers(headers);
        let id = self.anthropic_id();
        if let Some(id) = &id {
            h.push((ANTHROPIC_REQUEST_ID, id));
        }
        self.conn.start_stream(200, &h, self.http10).await
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.conn.write_chunk(bytes, self.http10).await
    }

    async fn end(&mut self, last: &[u8]) -> io::Result<bool> {
        self.conn.finish_stream(last, self.http10).await?;
        Ok(self.keep && !self.http10)
    }

    async fn whole(&mut self, headers: &[(&'static str, String)], body: &[u8]) -> io::Result<bool> {
        self.ctx.metrics.request(self.route.label(), 200);
        let mut h: Vec<(&str, &str)> = vec![JSON];
        for (n, v) in headers {
            h.push((n, v.as_str()));
        }
        let id = self.anthropic_id();
        if let Some(id) = &id {
            h.push((ANTHROPIC_REQUEST_ID, id));
        }
        self.conn.write_response(200, &h, body, self.keep).await?;
        Ok(self.keep)
    }

    async fn error(&mut self, e: &Error) -> io::Result<bool> {
        write_error(self.ctx, self.conn, self.route, e, self.keep).await
    }

    fn trim(&mut self) {
        self.conn.trim_write_buffer();
    }
}

#[cfg(test)]
mod tests {
    use codex_protocol::normalize::normalize_responses;

    use super::{body_session, write_error, write_read_error, Route};
    use crate::{
        error::{Error, ErrorKind, Side},
        server::h1::{Conn, ReadError},
        testing::{Harness, Plan, SegmentedIo},
    };

    /// Checks what one error answer puts on the wire (request id `req_t`): `expected`, and
    /// nothing else.
    async fn wire(h: &Harness, route: Route, answer: Result<Error, ReadError>, expected: String) {
        let mut conn = Conn::new(SegmentedIo::new(b"", Plan::Whole));
        conn.set_request_id("req_t".into());
        match answer {
            Ok(e) => {
                let keep = write_error(&h.ctx, &mut conn, route, &e, false).await;
                assert!(!keep.expect("written"));
            }
            Err(e) => assert!(!write_read_error(&h.ctx, &mut conn, route, e).await),
        }
        let (mut io, _) = conn.into_parts();
        let written = io.written(expected.len() + 1);
        assert_eq!(String::from_utf8(written).expect("utf-8"), expected);
    }

    /// The answers once written by hand in this module (the 426 of a plain
    /// `GET /v1/responses`, the codec's rejections) are the one mapping's now, with the bytes
    /// they had: status line, headers in order, body.
    #[monoio::test_all(timer_enabled = true)]
    async fn the_answers_once_built_by_hand_keep_their_bytes_on_the_wire() {
        let h = Harness::new(1);
        let upgrade = r#"{"error":{"message":"GET /v1/responses is the Responses WebSocket: send Upgrade: websocket, or POST for HTTP.","type":"invalid_request_error","code":"invalid_request","param":null}}"#;
        let e = Error::new(ErrorKind::UpgradeRequired, Side::Downstream);
        wire(
            &h,
            Route::Responses,
            Ok(e),
            format!(
                "HTTP/1.1 426 Upgrade Required\r\nx-request-id: req_t\r\n\
                 content-type: application/json\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
                 connection: close\r\ncontent-length: {}\r\n\r\n{upgrade}",
                upgrade.len()
            ),
        )
        .await;
        let reject = r#"{"error":{"message":"bad chunk size","type":"invalid_request_error","code":"bad_http_request","param":null}}"#;
        let e = ReadError::Reject {
            status: 400,
            message: "bad chunk size".into(),
        };
        wire(
            &h,
            Route::NotFound,
            Err(e),
            format!(
                "HTTP/1.1 400 Bad Request\r\nx-request-id: req_t\r\n\
                 content-type: application/json\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{reject}",
                reject.len()
            ),
        )
        .await;
        // In Anthropic's dialect: its body (with the request id), and now its `request-id`
        // header too, as every other answer on the Messages routes.
        let reject = r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad chunk size"},"request_id":"req_t"}"#;
        let e = ReadError::Reject {
            status: 400,
            message: "bad chunk size".into(),
        };
        wire(
            &h,
            Route::Messages,
            Err(e),
            format!(
                "HTTP/1.1 400 Bad Request\r\nx-request-id: req_t\r\n\
                 content-type: application/json\r\nrequest-id: req_t\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{reject}",
                reject.len()
            ),
        )
        .await;
    }

    #[test]
    fn the_body_scan_reads_the_session_the_normaliser_reads() {
        for body in [
            r#"{"model":"m"}"#,
            r#"{"model":"m","session_id":"s-1","conversation_id":"c-1"}"#,
            r#"{"model":"m","conversation_id":"c-1","session_id":"s-1"}"#,
            r#"{"model":"m","session_id":"","conversation_id":"c-1"}"#,
            r#"{"model":"m","session_id":7,"conversation_id":""}"#,
            r#"{"model":"m","input":[{"session_id":"nested"}]}"#,
        ] {
            let n = normalize_responses(body.as_bytes()).unwrap();
            assert_eq!(body_session(body.as_bytes()), n.session, "{body}");
        }
    }
}
