//! The one pipeline after the commit: **upstream events -> observation -> dialect encoder ->
//! transport sink**, for every API surface and transport.
//!
//! # Key Components
//! - [`forward`]: the one owned forward loop. It takes the [`Committed`] stream from the
//!   lifecycle, observes every event once (quota frames, the response id, usage, the terminal,
//!   a post-commit failure and its account effect), hands client-visible events to an
//!   [`Encoder`] and writes what it produced to a [`Sink`]: one write per batch of events
//!   that arrived together (what the upstream connection had already received when the
//!   stream was polled; never waiting for more), the head with the first batch and the last
//!   batch with the end of the response.
//! - [`Encoder`]: a dialect (Responses SSE/JSON/WebSocket frames, Chat SSE/JSON). It only
//!   translates; it decides nothing about accounts and classifies nothing.
//! - [`Sink`]: a transport (our HTTP/1.1 stream or fixed response, WebSocket frames).
//! - [`UsageGuard`]: finalises the usage record of a request exactly once, on every exit,
//!   including drop (client gone, panic): no exit path can forget it.
//!
//! # Error handling
//! A failure after the commit never switches account: the encoder closes the response in its
//! dialect ([`Encoder::broken`]). Sink write errors (client gone) end the loop; dropping the
//! [`Committed`] resets the upstream stream and frees the account's slot.

use std::{
    io,
    time::{Duration, Instant},
};

use codex_protocol::{
    classify::classify_stream_error,
    events::{self, EventClass, Usage},
    sse::SseEvent,
};
use shared_state::{UsageRecord, WorkerEvent};

use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    lifecycle::{self, Committed, Next},
    policy,
};

/// A downstream dialect.
pub trait Encoder {
    /// Streamed encoders write the head at the commit and then each batch of events;
    /// buffered ones answer once, at the end ([`Encoder::finish`]).
    fn streaming(&self) -> bool;

    /// One client-visible upstream event (quota frames and `[DONE]` never reach encoders).
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>);

    /// The upstream ended or broke before a terminal event: close the response in the
    /// dialect (streamed) or remember the error (buffered).
    fn broken(&mut self, e: &Error, response_id: Option<&str>, out: &mut Vec<u8>);

    /// After the last event. Streamed: trailing bytes, if any. Buffered: the response body, or
    /// the error to answer with instead. `failed` is the classified `response.failed` (or the
    /// break) when the stream ended in failure.
    fn finish(&mut self, failed: Option<&Error>, out: &mut Vec<u8>) -> Result<(), Error>;
}

/// A dialect's whole-answer translator: folds the upstream events, then renders one body.
pub trait Aggregate {
    /// One client-visible upstream event.
    fn on_event(&mut self, event_type: &str, data: &[u8]);
    /// The dialect's body, or the error to answer with instead.
    fn render(self) -> Result<Vec<u8>, Error>;
}

/// The buffered encoder of any [`Aggregate`] dialect (Chat JSON, Messages JSON): one answer at
/// the end, or the stream's failure as the dialect's error.
pub struct AggregateJson<A>(Option<A>);

impl<A> AggregateJson<A> {
    /// Answers with what `agg` renders.
    pub fn new(agg: A) -> Self {
        Self(Some(agg))
    }
}

impl<A: Aggregate> Encoder for AggregateJson<A> {
    fn streaming(&self) -> bool {
        false
    }

    fn event(&mut self, ev: &SseEvent, _out: &mut Vec<u8>) {
        if let Some(agg) = &mut self.0 {
            agg.on_event(ev.event_type(), &ev.data);
        }
    }

    fn broken(&mut self, _e: &Error, _response_id: Option<&str>, _out: &mut Vec<u8>) {}

    fn finish(&mut self, failed: Option<&Error>, out: &mut Vec<u8>) -> Result<(), Error> {
        if let Some(e) = failed {
            return Err(e.clone());
        }
        let agg = self
            .0
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Internal, Side::Internal))?;
        out.extend_from_slice(&agg.render()?);
        Ok(())
    }
}

/// A downstream transport.
#[allow(async_fn_in_trait)]
pub trait Sink {
    /// Starts a streamed response with these client-visible upstream headers (a transport
    /// may hold the head back until the first [`Sink::send`], which always follows).
    async fn begin(&mut self, headers: &[(&'static str, String)]) -> io::Result<()>;
    /// Writes encoded bytes, with anything held back, in one socket write (a transport with
    /// a held-back head writes it even when `bytes` is empty).
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Writes the last encoded bytes and ends a streamed response, in one socket write where
    /// the transport allows; returns whether the connection may be reused.
    async fn end(&mut self, last: &[u8]) -> io::Result<bool>;
    /// A buffered response, whole.
    async fn whole(&mut self, headers: &[(&'static str, String)], body: &[u8]) -> io::Result<bool>;
    /// An error instead of a response (before anything was written).
    async fn error(&mut self, e: &Error) -> io::Result<bool>;
    /// The stream went quiet: give back buffers kept for the next write.
    fn trim(&mut self) {}
}

/// What the loop learned from the events, once.
#[derive(Default)]
struct Observed {
    response_id: Option<String>,
    /// An output event was seen (time to first token).
    output: bool,
    usage: Option<Usage>,
    finished: bool,
    failed: Option<Error>,
}

// === impl Observed ===

impl Observed {
    /// Observes one event; returns whether clients see it. `held`: the lifecycle read it
    /// before the commit and already recorded its quota.
    fn observe(
        &mut self,
        ctx: &WorkerCtx,
        c: &Committed,
        model: &str,
        ev: &SseEvent,
        held: bool,
    ) -> bool {
        let ty = ev.event_type();
        if ty == "codex.rate_limits" {
            // Quota frames update our state (once) and are not shown to clients.
            if !held {
                lifecycle::observe_event(ctx, &c.account, ev);
            }
            return false;
        }
        if ev.is_done_sentinel() {
            return false;
        }
        if self.response_id.is_none() && ty == "response.created" {
            self.response_id = events::response_id(&ev.data);
        }
        match events::classify_event(ty) {
            EventClass::Output => self.output = true,
            EventClass::Completed | EventClass::Incomplete => {
                self.usage = events::usage_of_terminal(&ev.data);
                self.finished = true;
            }
            EventClass::Failed => {
                let err_json = events::stream_error(&ev.data).unwrap_or_default();
                let failure = classify_stream_error(err_json.as_bytes());
                // Committed: forwarded as it is, but the account still bears the effect
                // (cooldown, refresh) so the next request avoids it.
                policy::apply(
                    ctx,
                    &c.account,
                    &failure.class,
                    model,
                    policy::Prior::default(),
                );
                self.usage = events::usage_of_terminal(&ev.data);
                self.failed = Some(Error::upstream(failure));
                self.finished = true;
            }
            _ => {}
        }
        true
    }
}

/// Forwards a committed stream through `enc` to `sink`, finalising `usage`. Returns whether
/// the downstream connection may be reused.
///
/// Not an `async fn`: that would copy `c` into a local of its state and keep the argument's
/// slot too (two `Committed` in every stream's state for its whole life); the `async move`
/// block keeps the one it captured.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub fn forward<'a, 'u, E: Encoder, S: Sink>(
    ctx: &'a WorkerCtx,
    mut c: Committed,
    usage: &'a mut UsageGuard<'u>,
    enc: &'a mut E,
    sink: &'a mut S,
) -> impl std::future::Future<Output = io::Result<bool>> + use<'a, 'u, E, S> {
    async move {
        usage.committed(c.account.id, c.ttfb);
        let streaming = enc.streaming();
        let _gauge = streaming.then(|| StreamGauge::open(ctx));
        if streaming {
            sink.begin(&c.headers)
                .await
                .map_err(|e| client_failed(ctx, usage, e))?;
        }
        // The per-stream output cap (bytes of upstream frames forwarded; 0: none).
        let cap = ctx.cfg.max_stream_output_bytes;
        let mut forwarded = 0u64;
        let mut over_cap = false;
        let model = usage.model.clone();
        let mut seen = Observed::default();
        let mut broken: Option<Error> = None;
        let mut out = Vec::new();
        let mut batch = std::mem::take(&mut c.held);
        let mut held = true;
        loop {
            let mut events = 0;
            for ev in batch.drain(..) {
                if seen.finished {
                    break;
                }
                if seen.observe(ctx, &c, &model, &ev, held) {
                    forwarded += ev.frame.len() as u64;
                    if cap > 0 && forwarded > cap && !seen.finished {
                        over_cap = true;
                        break;
                    }
                    enc.event(&ev, &mut out);
                    events += 1;
                }
            }
            ctx.metrics.events(events);
            if seen.output {
                usage.first_output();
            }
            if seen.finished {
                // The last events leave with the end of the response, in one write (below).
                usage.tokens(seen.usage);
                break;
            }
            if over_cap {
                // A runaway stream: end it in the dialect, release the upstream and the slot.
                ctx.metrics.guard(crate::metrics::Guard::OutputCap);
                broken = Some(Error::new(
                    ErrorKind::OutputLimit { limit: cap },
                    Side::Internal,
                ));
                break;
            }
            if streaming {
                // One write per batch of events that arrived together (the first one carries
                // the response head). Client gone (or not reading: the write deadline): dropping
                // `c` resets the upstream stream and frees the slot; the guard records a 499.
                usage.bytes_out += out.len() as u64;
                sink.send(&out)
                    .await
                    .map_err(|e| client_failed(ctx, usage, e))?;
            }
            let used = out.len();
            crate::wire::recycle(&mut out, used);
            held = false;
            let next = loop {
                match c.next_events(&mut batch).await {
                    // Silent for a while: what the stream kept for its next write goes back.
                    Next::Quiet => {
                        out = Vec::new();
                        sink.trim();
                    }
                    next => break next,
                }
            };
            match next {
                // (`Quiet` never comes out of the loop above.)
                Next::Events | Next::Quiet => {}
                Next::End => {
                    broken = Some(
                        Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                            .with_cause("upstream closed the stream before a terminal event"),
                    );
                    break;
                }
                Next::Broken(e) => {
                    broken = Some(e);
                    break;
                }
            }
        }
        let visible = std::mem::take(&mut c.headers);
        // A finished HTTP/1.1 stream's connection can carry the next request once read to its
        // end: after the client has its answer, in a task of its own (below).
        let mut h1_tail = if seen.finished {
            c.take_h1_tail()
        } else {
            None
        };
        drop(c); // the account's slot is free before the last bytes are written
        usage.tokens(seen.usage);
        if !streaming {
            // Buffered encoders answer from `finish` alone.
            out.clear();
        }
        if let Some(e) = &broken {
            enc.broken(e, seen.response_id.as_deref(), &mut out);
        }
        let failed = seen.failed.as_ref().or(broken.as_ref());
        if let Some(e) = failed {
            usage.error(e);
        }
        let done = enc.finish(failed, &mut out);
        let answered = if streaming {
            // A streamed response was a 200 whatever happened inside it.
            usage.status(200);
            usage.bytes_out += out.len() as u64;
            sink.end(&out)
                .await
                .map_err(|e| client_failed(ctx, usage, e))
        } else {
            match done {
                Ok(()) => {
                    usage.status(200);
                    usage.bytes_out += out.len() as u64;
                    sink.whole(&visible, &out).await
                }
                Err(e) => {
                    usage.fail(&e);
                    sink.error(&e).await
                }
            }
        };
        if let Some(mut tail) = h1_tail.take() {
            // Off this request's path: the client's connection (or WebSocket turn) is free for
            // its next request at once.
            monoio::spawn(async move { tail.finish().await });
        }
        answered
    }
}

/// A write to the client failed: the client left, or stopped reading past the write deadline
/// (`TimedOut`, counted). The request stays a 499 with a code saying which.
fn client_failed(ctx: &WorkerCtx, usage: &mut UsageGuard<'_>, e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::TimedOut {
        ctx.metrics.guard(crate::metrics::Guard::WriteTimeout);
        usage.error_code = Some("client_write_timeout".to_owned());
        usage.error_class = Some("client_write_timeout");
    } else {
        usage.error_code = Some("client_gone".to_owned());
        usage.error_class = Some("client_gone");
    }
    e
}

/// Decrements the open-stream gauge however the stream ends.
pub struct StreamGauge<'a>(&'a WorkerCtx);

impl<'a> StreamGauge<'a> {
    /// Counts an open stream until dropped.
    pub fn open(ctx: &'a WorkerCtx) -> Self {
        ctx.metrics.stream_delta(1);
        Self(ctx)
    }
}

impl Drop for StreamGauge<'_> {
    fn drop(&mut self) {
        self.0.metrics.stream_delta(-1);
    }
}

/// The usage record of one request, finalised exactly once when dropped: whatever path ends
/// the request (an answer, an error, the client leaving, a panic unwinding the task), one
/// record reaches the sidecar. A request dropped before any status was set is a 499.
pub struct UsageGuard<'a> {
    ctx: &'a WorkerCtx,
    key_id: i64,
    settlement: crate::limits::Settlement,
    route: &'static str,
    /// Model the client asked for (after alias resolution).
    pub model: String,
    stream: bool,
    started: Instant,
    started_ms: u64,
    account_id: Option<i64>,
    ttfb: Option<Duration>,
    usage: Option<Usage>,
    status: Option<u16>,
    error_code: Option<String>,
    error_class: Option<&'static str>,
    ttft: Option<Duration>,
    trace: lifecycle::Trace,
    reasoning_effort: Option<String>,
    service_tier: Option<String>,
    /// The request's id ([`crate::request_id`]).
    request_id: String,
    /// Body bytes handed to the client's transport (the access log's `bytes_out`).
    bytes_out: u64,
}

/// Runs `plan` through the lifecycle ([`lifecycle::open_traced`]) and records on `usage` what
/// the request asked for (reasoning effort, service tier: [`lifecycle::RequestPlan::asked`],
/// read from the normalised body every dialect produces) and what the attempts did
/// (failovers, transport). Every surface opens through here.
pub async fn open(
    ctx: &WorkerCtx,
    plan: &lifecycle::RequestPlan,
    usage: &mut UsageGuard<'_>,
) -> Result<Committed, Error> {
    usage.reasoning_effort = plan.asked.reasoning_effort.clone();
    usage.service_tier = plan.asked.service_tier.clone();
    // The attempt phase's logs (failovers, refresh waits) carry the request id; the stream
    // after the commit is not instrumented (a span entered at every poll of every stream).
    let span = tracing::info_span!("request", request_id = %usage.request_id);
    let res =
        tracing::Instrument::instrument(lifecycle::open_traced(ctx, plan, &mut usage.trace), span)
            .await;
    if let Err(e) = &res {
        usage.fail(e);
    }
    res
}

// === impl UsageGuard ===

impl<'a> UsageGuard<'a> {
    /// Starts the record of a request.
    pub fn start(
        ctx: &'a WorkerCtx,
        key: &shared_state::ClientKey,
        route: &'static str,
        model: String,
        stream: bool,
        request_id: &str,
    ) -> Self {
        Self {
            ctx,
            key_id: key.id,
            settlement: crate::limits::Settlement::of(key),
            route,
            model,
            stream,
            started: Instant::now(),
            started_ms: shared_state::now_ms(),
            account_id: None,
            ttfb: None,
            usage: None,
            status: None,
            error_code: None,
            error_class: None,
            ttft: None,
            trace: lifecycle::Trace::default(),
            reasoning_effort: None,
            service_tier: None,
            request_id: request_id.to_owned(),
            bytes_out: 0,
        }
    }

    /// The first output event reached the pipeline (time to first token; first call wins).
    pub fn first_output(&mut self) {
        if self.ttft.is_none() {
            self.ttft = Some(self.started.elapsed());
        }
    }

    /// The account that committed, and its time to first byte.
    pub fn committed(&mut self, account_id: i64, ttfb: Duration) {
        self.account_id = Some(account_id);
        self.ttfb = Some(ttfb);
    }

    /// Token usage from the terminal event.
    pub fn tokens(&mut self, usage: Option<Usage>) {
        if usage.is_some() {
            self.usage = usage;
        }
    }

    /// The status answered.
    pub fn status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// The error the request ended with (status unchanged).
    pub fn error(&mut self, e: &Error) {
        self.error_code = Some(e.code());
        self.error_class = Some(e.class());
    }

    /// The request failed with `e` (its status, code and class).
    pub fn fail(&mut self, e: &Error) {
        self.status = Some(e.to_openai().status);
        self.error_code = Some(e.code());
        self.error_class = Some(e.class());
    }
}

impl Drop for UsageGuard<'_> {
    fn drop(&mut self) {
        let u = self.usage.unwrap_or_default();
        // Cost is computed here, once per request (the price table in config is the one
        // rule), and counted against the key's budgets at once.
        let cost_micros = self.ctx.cfg.prices.cost_micros(
            &self.model,
            u.input_tokens,
            u.cached_tokens,
            u.output_tokens,
        );
        self.settlement.record(
            self.ctx,
            shared_state::now_ms(),
            u.input_tokens.saturating_add(u.output_tokens),
            cost_micros,
        );
        // Dropped before any status: the client left (or the task unwound).
        let error_class = self
            .error_class
            .or(self.status.is_none().then_some("client_gone"));
        self.ctx.report(WorkerEvent::Usage(Box::new(UsageRecord {
            id: UsageRecord::new_id(),
            key_id: self.key_id,
            account_id: self.account_id,
            route: self.route,
            model: std::mem::take(&mut self.model),
            status: self.status.unwrap_or(499),
            stream: self.stream,
            input_tokens: u.input_tokens,
            cached_tokens: u.cached_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
            ttfb_ms: self.ttfb.map(|d| d.as_millis() as u64),
            latency_ms: self.started.elapsed().as_millis() as u64,
            error_code: self.error_code.take(),
            started_at_ms: self.started_ms,
            cost_micros,
            reasoning_effort: self.reasoning_effort.take(),
            service_tier: self.service_tier.take(),
            transport: self.trace.transport,
            ttft_ms: self.ttft.map(|d| d.as_millis() as u64),
            failovers: self.trace.failovers,
            error_class: error_class.map(str::to_owned),
            request_id: std::mem::take(&mut self.request_id),
            bytes_out: self.bytes_out,
        })));
    }
}

#[cfg(test)]
mod tests;
