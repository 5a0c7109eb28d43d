//! The API layer: routing, client authentication, parsing and encoding. It hands requests to
//! the lifecycle and renders whatever comes back; it decides nothing about accounts.
//!
//! # Key Components
//! - [`handle`]: dispatches one parsed request and writes the response; returns whether the
//!   connection may be reused.
//! - `/v1/responses` (JSON and SSE), `/v1/models`, `/healthz`, `/metrics`.
//! - [`write_error`]: the one place an [`Error`] becomes an HTTP response; after the commit,
//!   [`terminal_error_frame`] turns it into one terminal SSE event.

use std::{io, time::Instant};

use bytes::Bytes;
use codex_protocol::{
    events::{self, EventClass, Usage},
    normalize::normalize_responses_with,
    sse::SseEvent,
};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::{ClientKey, UsageRecord, WorkerEvent};
use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait};

use crate::{
    error::{Error, ErrorKind, Side},
    lifecycle::{self, Committed, Next, RequestPlan, PASSTHROUGH_HEADERS},
    models,
    server::h1::{Conn, ReadError, Request},
    ctx::WorkerCtx,
};

const JSON: (&str, &str) = ("content-type", "application/json");

/// Dispatches one request. Returns `Ok(true)` when the connection may serve another request.
pub async fn handle<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    mut req: Request,
) -> io::Result<bool> {
    let keep = req.keep_alive && !ctx.is_draining();
    let path = req.path.trim_end_matches('/');
    let path = if path.is_empty() { "/" } else { path };
    match (req.method.as_str(), path) {
        ("GET", "/healthz") | ("HEAD", "/healthz") => {
            ctx.metrics
                .request("healthz", if ctx.health.storage_up() { 200 } else { 503 });
            if ctx.health.storage_up() && !ctx.is_draining() {
                conn.write_response(200, &[JSON], br#"{"status":"ok"}"#, keep)
                    .await?;
            } else {
                let st = if ctx.is_draining() {
                    "draining"
                } else {
                    "storage_down"
                };
                conn.write_response(
                    503,
                    &[JSON],
                    format!("{{\"status\":\"{st}\"}}").as_bytes(),
                    keep,
                )
                .await?;
            }
            Ok(keep)
        }
        ("GET", "/metrics") => {
            ctx.metrics.request("metrics", 200);
            let body = ctx.registry.render();
            conn.write_response(
                200,
                &[("content-type", "text/plain; version=0.0.4")],
                body.as_bytes(),
                keep,
            )
            .await?;
            Ok(keep)
        }
        ("POST", "/v1/responses") | ("POST", "/responses") => {
            let key = match authenticate(ctx, &req) {
                Ok(k) => k,
                Err(e) => return write_error(ctx, conn, "responses", &e, keep).await,
            };
            if let Err(e) = conn.read_body(&mut req, ctx.cfg.max_body_bytes).await {
                return Ok(write_read_error(ctx, conn, "responses", e).await);
            }
            if let Err(e) = decode_body(ctx, &mut req) {
                return write_error(ctx, conn, "responses", &e, keep).await;
            }
            responses(ctx, conn, req, key, keep).await
        }
        ("POST", "/v1/chat/completions") | ("POST", "/chat/completions") => {
            let key = match authenticate(ctx, &req) {
                Ok(k) => k,
                Err(e) => return write_error(ctx, conn, "chat_completions", &e, keep).await,
            };
            if let Err(e) = conn.read_body(&mut req, ctx.cfg.max_body_bytes).await {
                return Ok(write_read_error(ctx, conn, "chat_completions", e).await);
            }
            if let Err(e) = decode_body(ctx, &mut req) {
                return write_error(ctx, conn, "chat_completions", &e, keep).await;
            }
            Box::pin(crate::chat::chat_completions(ctx, conn, req, key, keep)).await
        }
        ("GET", "/v1/responses") | ("GET", "/responses") => {
            // The Responses WebSocket transport is not served yet: Codex CLI falls back to
            // HTTP+SSE on 426 without retrying (codex-protocol.md §5.4).
            let e = Error::bad_request(
                "WebSocket transport is not available on this gateway; use HTTP POST with stream:true.",
                None,
            );
            let r = e.to_openai();
            ctx.metrics.request("responses", 426);
            conn.write_response(426, &[JSON], &r.body.to_json(), false)
                .await?;
            Ok(false)
        }
        ("GET", "/v1/models") | ("GET", "/models") => {
            if let Err(e) = authenticate(ctx, &req) {
                return write_error(ctx, conn, "models", &e, keep).await;
            }
            let codex_shape = req
                .query
                .as_deref()
                .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("client_version=")));
            let body = models::list(&ctx.catalog.load(), codex_shape);
            ctx.metrics.request("models", 200);
            conn.write_response(200, &[JSON], &body, keep).await?;
            Ok(keep)
        }
        (_, "/healthz" | "/metrics" | "/v1/responses" | "/v1/models" | "/v1/chat/completions") => {
            let e = Error::new(ErrorKind::MethodNotAllowed, Side::Downstream);
            write_error(ctx, conn, "other", &e, keep).await
        }
        _ => {
            let e = Error::new(ErrorKind::NotFound, Side::Downstream);
            write_error(ctx, conn, "other", &e, keep).await
        }
    }
}

/// Client authentication: `Authorization: Bearer sk-...` or `x-api-key`.
fn authenticate(ctx: &WorkerCtx, req: &Request) -> Result<ClientKey, Error> {
    let presented = req
        .header("authorization")
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| req.header("x-api-key"))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let Some(key) = presented else {
        return Err(Error::new(
            ErrorKind::Unauthorized { key_present: false },
            Side::Downstream,
        ));
    };
    ctx.snapshot.load().key(key).cloned().ok_or_else(|| {
        Error::new(
            ErrorKind::Unauthorized { key_present: true },
            Side::Downstream,
        )
    })
}

/// Renders an error as an HTTP response (the one HTTP mapping point).
pub async fn write_error<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    route: &'static str,
    e: &Error,
    keep: bool,
) -> io::Result<bool> {
    let r = e.to_openai();
    ctx.metrics.request(route, r.status);
    if e.side != Side::Downstream {
        tracing::warn!(route, status = r.status, error = %e, "request failed");
    }
    let retry = r.retry_after.map(|s| s.to_string());
    let mut headers: Vec<(&str, &str)> = vec![JSON];
    if let Some(v) = &retry {
        headers.push(("retry-after", v));
    }
    conn.write_response(r.status, &headers, &r.body.to_json(), keep)
        .await?;
    Ok(keep)
}

/// Answers a request that could not be read (malformed framing, over a limit) and returns
/// `false`: the connection closes after it. Nothing is written when the peer is gone.
pub async fn write_read_error<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    route: &'static str,
    e: ReadError,
) -> bool {
    match e {
        ReadError::TooLarge => {
            let e = Error::new(
                ErrorKind::BodyTooLarge {
                    limit: ctx.cfg.max_body_bytes,
                },
                Side::Downstream,
            );
            let _ = write_error(ctx, conn, route, &e, false).await;
        }
        ReadError::Reject { status, message } => {
            let body = codex_protocol::openai_error::ErrorBody::new(
                message,
                "invalid_request_error",
                Some("bad_http_request"),
            );
            ctx.metrics.request(route, status);
            let _ = conn
                .write_response(status, &[JSON], &body.to_json(), false)
                .await;
        }
        ReadError::Closed | ReadError::Io(_) => {}
    }
    false
}

/// One terminal SSE event for a failure after the commit (Responses API shape).
pub fn terminal_error_frame(e: &Error, response_id: Option<&str>) -> Vec<u8> {
    let r = e.to_openai();
    let data = sonic_rs::json!({
        "type": "response.failed",
        "response": {
            "id": response_id.unwrap_or(""),
            "object": "response",
            "status": "failed",
            "error": {"code": r.body.code, "message": r.body.message, "type": r.body.error_type},
        }
    });
    codex_protocol::sse::frame(
        "response.failed",
        &sonic_rs::to_vec(&data).unwrap_or_default(),
    )
}

/// The client's session signal, in the order peers use: explicit session/thread ids, then
/// (by the caller) `prompt_cache_key`.
pub(crate) fn affinity_key(req: &Request) -> Option<String> {
    ["session-id", "session_id", "thread-id", "conversation_id"]
        .iter()
        .find_map(|h| req.header(h))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

pub(crate) fn passthrough(req: &Request) -> Vec<(&'static str, String)> {
    PASSTHROUGH_HEADERS
        .iter()
        .filter_map(|n| req.header(n).map(|v| (*n, v.to_owned())))
        .collect()
}

pub(crate) struct Accounting {
    pub(crate) started: Instant,
    pub(crate) started_ms: u64,
    pub(crate) key_id: i64,
    pub(crate) route: &'static str,
    pub(crate) model: String,
    pub(crate) stream: bool,
}

impl Accounting {
    /// Starts accounting for a request.
    pub(crate) fn start(key_id: i64, route: &'static str, model: String, stream: bool) -> Self {
        Self {
            started: Instant::now(),
            started_ms: shared_state::now_ms(),
            key_id,
            route,
            model,
            stream,
        }
    }

    /// Reports the finished request.
    pub(crate) fn finish(
        &self,
        ctx: &WorkerCtx,
        account_id: Option<i64>,
        status: u16,
        usage: Option<Usage>,
        ttfb: Option<std::time::Duration>,
        error: Option<&Error>,
    ) {
        let u = usage.unwrap_or_default();
        ctx.report(WorkerEvent::Usage(UsageRecord {
            key_id: self.key_id,
            account_id,
            route: self.route,
            model: self.model.clone(),
            status,
            stream: self.stream,
            input_tokens: u.input_tokens,
            cached_tokens: u.cached_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
            ttfb_ms: ttfb.map(|d| d.as_millis() as u64),
            latency_ms: self.started.elapsed().as_millis() as u64,
            error_code: error.map(Error::code),
            started_at_ms: self.started_ms,
        }));
    }
}

async fn responses<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    let catalog = ctx.catalog.load();
    let strict = ctx.cfg.strict_models;
    let norm = match normalize_responses_with(&req.body, &|m| models::choose(&catalog, strict, m)) {
        Ok(n) => n,
        Err(e) => {
            let e = match e.unknown_model {
                Some(m) => Error::new(ErrorKind::ModelNotFound(m), Side::Downstream),
                None => Error::bad_request(e.message, e.param),
            };
            return write_error(ctx, conn, "responses", &e, keep).await;
        }
    };
    drop(catalog);
    if norm.previous_response_id.is_some() {
        let e = Error::new(ErrorKind::ContinuationNotFound, Side::Downstream);
        return write_error(ctx, conn, "responses", &e, keep).await;
    }
    let acct = Accounting::start(key.id, "responses", norm.model.clone(), norm.stream);
    let plan = RequestPlan {
        route: "responses",
        model: norm.model,
        body: Bytes::from(norm.body),
        passthrough: passthrough(&req),
        key_id: key.id,
        affinity_key: affinity_key(&req).or_else(|| norm.prompt_cache_key.clone()),
    };
    // Boxed: the attempt machinery (retries, refresh waits) must not stay resident in every
    // connection's task for the whole stream (benches/README.md, "next costs" 2).
    let committed = match Box::pin(lifecycle::open(ctx, &plan)).await {
        Ok(c) => c,
        Err(e) => {
            let status = e.to_openai().status;
            acct.finish(ctx, None, status, None, None, Some(&e));
            return write_error(ctx, conn, "responses", &e, keep).await;
        }
    };
    if norm.stream {
        let panic_after_commit = fault_requested(&req, "panic-after-commit");
        stream_responses(
            ctx,
            conn,
            committed,
            &acct,
            req.http10,
            keep,
            panic_after_commit,
        )
        .await
    } else {
        Box::pin(json_responses(ctx, conn, committed, &acct, keep)).await
    }
}

/// Test-only fault injection: with the `fault-injection` feature (enabled by the integration
/// test crate only), the request header `x-codex-gateway-fault` names a fault to inject.
fn fault_requested(req: &Request, fault: &str) -> bool {
    cfg!(feature = "fault-injection") && req.header("x-codex-gateway-fault") == Some(fault)
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

/// Decrements the open-stream gauge however the stream ends.
pub(crate) struct StreamGauge<'a>(&'a WorkerCtx);

impl<'a> StreamGauge<'a> {
    /// Counts an open stream until dropped.
    pub(crate) fn open(ctx: &'a WorkerCtx) -> Self {
        ctx.metrics.stream_delta(1);
        Self(ctx)
    }
}

impl Drop for StreamGauge<'_> {
    fn drop(&mut self) {
        self.0.metrics.stream_delta(-1);
    }
}

async fn stream_responses<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    mut c: Committed,
    acct: &Accounting,
    http10: bool,
    keep: bool,
    panic_after_commit: bool,
) -> io::Result<bool> {
    let _gauge = StreamGauge::open(ctx);
    conn.release_read_buffer();
    ctx.metrics.request("responses", 200);
    conn.start_stream(200, &sse_headers(&c.headers), http10)
        .await?;

    let mut usage = None;
    let mut response_id: Option<String> = None;
    let mut finished = false;
    let held = std::mem::take(&mut c.held);
    let mut out = Vec::with_capacity(4096);
    forward(
        ctx,
        &c,
        held,
        &mut out,
        &mut usage,
        &mut response_id,
        &mut finished,
    );
    if let Err(e) = conn.write_chunk(&out, http10).await {
        acct.finish(ctx, Some(c.account.id), 499, usage, Some(c.ttfb), None);
        return Err(e);
    }
    if panic_after_commit {
        panic!("injected fault: panic-after-commit");
    }
    let mut error: Option<Error> = None;
    while !finished {
        match c.next_events().await {
            Next::Events(evs) => {
                out.clear();
                forward(
                    ctx,
                    &c,
                    evs,
                    &mut out,
                    &mut usage,
                    &mut response_id,
                    &mut finished,
                );
                if let Err(e) = conn.write_chunk(&out, http10).await {
                    // Client gone: dropping `c` resets the upstream stream and frees the slot.
                    acct.finish(ctx, Some(c.account.id), 499, usage, Some(c.ttfb), None);
                    return Err(e);
                }
            }
            Next::End => {
                let e = Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                    .with_cause("upstream closed the stream before a terminal event");
                conn.write_chunk(&terminal_error_frame(&e, response_id.as_deref()), http10)
                    .await?;
                error = Some(e);
                break;
            }
            Next::Broken(e) => {
                conn.write_chunk(&terminal_error_frame(&e, response_id.as_deref()), http10)
                    .await?;
                error = Some(e);
                break;
            }
        }
    }
    let account_id = c.account.id;
    let ttfb = c.ttfb;
    drop(c);
    acct.finish(
        ctx,
        Some(account_id),
        200,
        usage,
        Some(ttfb),
        error.as_ref(),
    );
    conn.finish_stream(http10).await?;
    Ok(keep && !http10)
}

/// Appends client-visible frames for `evs` and observes them. Sets `finished` on a terminal.
fn forward(
    ctx: &WorkerCtx,
    c: &Committed,
    evs: Vec<SseEvent>,
    out: &mut Vec<u8>,
    usage: &mut Option<Usage>,
    response_id: &mut Option<String>,
    finished: &mut bool,
) {
    for ev in evs {
        if *finished {
            break;
        }
        let ty = ev.event_type();
        if ty == "codex.rate_limits" {
            lifecycle::observe_event(ctx, &c.account, &ev);
            continue; // quota frames update our state and are not shown to clients
        }
        if ev.is_done_sentinel() {
            continue;
        }
        if response_id.is_none() && ty == "response.created" {
            *response_id = sonic_rs::get(&ev.data, &["response", "id"])
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned));
        }
        match events::classify_event(ty) {
            EventClass::Completed | EventClass::Incomplete => {
                *usage = events::usage_of_terminal(&ev.data);
                *finished = true;
            }
            EventClass::Failed => *finished = true,
            _ => {}
        }
        out.extend_from_slice(&ev.frame);
    }
}

async fn json_responses<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    mut c: Committed,
    acct: &Accounting,
    keep: bool,
) -> io::Result<bool> {
    let mut pending = std::mem::take(&mut c.held);
    let mut items: Vec<(u64, sonic_rs::Value)> = Vec::new();
    loop {
        for ev in pending.drain(..) {
            let ty = ev.event_type().to_owned();
            lifecycle::observe_event(ctx, &c.account, &ev);
            match ty.as_str() {
                "response.output_item.done" => {
                    if let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(&ev.data) {
                        let idx = v
                            .get("output_index")
                            .and_then(|i| i.as_u64())
                            .unwrap_or(items.len() as u64);
                        if let Some(item) = v.get("item") {
                            items.push((idx, item.clone()));
                        }
                    }
                }
                _ => match events::classify_event(&ty) {
                    EventClass::Completed | EventClass::Incomplete => {
                        let usage = events::usage_of_terminal(&ev.data);
                        let body = final_response(&ev.data, &mut items);
                        let account_id = c.account.id;
                        let ttfb = c.ttfb;
                        let visible = std::mem::take(&mut c.headers);
                        drop(c);
                        let Some(body) = body else {
                            let e = Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                                .with_cause("terminal event without a response object");
                            acct.finish(ctx, Some(account_id), 502, None, Some(ttfb), Some(&e));
                            return write_error(ctx, conn, "responses", &e, keep).await;
                        };
                        acct.finish(ctx, Some(account_id), 200, usage, Some(ttfb), None);
                        ctx.metrics.request("responses", 200);
                        let mut headers: Vec<(&str, &str)> = vec![JSON];
                        for (n, v) in &visible {
                            headers.push((n, v.as_str()));
                        }
                        conn.write_response(200, &headers, &body, keep).await?;
                        return Ok(keep);
                    }
                    EventClass::Failed => {
                        let err_json = events::stream_error(&ev.data).unwrap_or_default();
                        let f =
                            codex_protocol::classify::classify_stream_error(err_json.as_bytes());
                        let e = Error::upstream(f);
                        acct.finish(
                            ctx,
                            Some(c.account.id),
                            e.to_openai().status,
                            None,
                            Some(c.ttfb),
                            Some(&e),
                        );
                        return write_error(ctx, conn, "responses", &e, keep).await;
                    }
                    _ => {}
                },
            }
        }
        match c.next_events().await {
            Next::Events(evs) => pending = evs,
            Next::End => {
                let e = Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                    .with_cause("upstream closed the stream before response.completed");
                acct.finish(ctx, Some(c.account.id), 502, None, Some(c.ttfb), Some(&e));
                return write_error(ctx, conn, "responses", &e, keep).await;
            }
            Next::Broken(e) => {
                acct.finish(ctx, Some(c.account.id), 502, None, Some(c.ttfb), Some(&e));
                return write_error(ctx, conn, "responses", &e, keep).await;
            }
        }
    }
}

/// The `response` object of a terminal event; an empty `output` is rebuilt from the
/// `response.output_item.done` items, ordered by `output_index`.
fn final_response(data: &[u8], items: &mut Vec<(u64, sonic_rs::Value)>) -> Option<Vec<u8>> {
    let mut v: sonic_rs::Value = sonic_rs::from_slice(data).ok()?;
    let resp = v.get_mut("response")?;
    let empty = resp
        .get("output")
        .and_then(|o| o.as_array())
        .is_none_or(|a| a.is_empty());
    if empty && !items.is_empty() {
        items.sort_by_key(|(i, _)| *i);
        let mut arr = sonic_rs::Array::new();
        for (_, it) in items.drain(..) {
            arr.push(it);
        }
        resp.as_object_mut()?.insert(&"output", arr);
    }
    sonic_rs::to_vec(resp).ok()
}
