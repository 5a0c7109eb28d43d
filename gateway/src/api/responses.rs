//! `/v1/responses` over HTTP: JSON and SSE. The Responses dialect is the upstream's own, so
//! the SSE encoder forwards frames byte-faithfully and the JSON encoder assembles the final
//! `response` object.

use std::{io, rc::Rc, sync::Arc};

use bytes::Bytes;
use codex_protocol::{
    normalize::{normalize_responses_owned, normalize_responses_with},
    sse::SseEvent,
};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;
use sonic_rs::{JsonValueMutTrait, JsonValueTrait};

use super::{fault_requested, header_session, open_and_forward, passthrough, write_error, Route};
use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    lifecycle::RequestPlan,
    models,
    pipeline::{Encoder, UsageGuard},
    server::h1::{Conn, Request},
};

/// This surface's route (ChatGPT-mode inference is the same route).
const ROUTE: Route = Route::Responses;

/// Serves one `POST /v1/responses` whose body was read and decoded.
pub async fn serve<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    // Everything before the stream in its own future: its locals (the client request, the
    // normalised one) are not part of the state a stream keeps for its whole life (this
    // future is inside every connection's task).
    let Turn {
        plan,
        keeper,
        stream,
        http10,
        panic_after_commit,
        mut usage,
    } = match prepare(ctx, conn, req, &key, keep).await {
        Prepared::Turn(t) => t,
        Prepared::Answered(r) => return r,
    };
    if stream {
        let mut enc = Capturing::new(ResponsesSse { panic_after_commit }).keeping(keeper);
        open_and_forward(ctx, conn, ROUTE, plan, &mut usage, &mut enc, http10, keep).await
    } else {
        let mut enc = Capturing::new(ResponsesJson::default()).keeping(keeper);
        open_and_forward(ctx, conn, ROUTE, plan, &mut usage, &mut enc, http10, keep).await
    }
}

/// A turn ready to open: what [`serve`] keeps while it streams.
struct Turn<'a> {
    plan: RequestPlan,
    keeper: Option<Keeper>,
    stream: bool,
    http10: bool,
    panic_after_commit: bool,
    usage: UsageGuard<'a>,
}

/// What [`prepare`] made of a request: a turn, or the answer already written (a refusal).
/// Returned once and taken apart at once: boxing the turn would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Prepared<'a> {
    Turn(Turn<'a>),
    Answered(io::Result<bool>),
}

/// A Responses body normalised for the upstream with the published catalog (the one mapping
/// of its refusals: an unknown model is `model_not_found`, anything else a 400 naming the
/// parameter). `/v1/responses` and remote compaction share it.
pub(crate) fn normalize(
    ctx: &WorkerCtx,
    body: &[u8],
) -> Result<codex_protocol::normalize::Normalized, Error> {
    let catalog = ctx.catalog.load();
    let strict = ctx.cfg.strict_models;
    normalize_responses_with(body, &|m| models::choose(&catalog, strict, m)).map_err(refusal)
}

/// [`normalize`] of a body the caller gives up: a compact body (the Codex CLI's) becomes the
/// upstream body in its own buffer, without a copy
/// ([`codex_protocol::normalize::normalize_responses_owned`]).
fn normalize_owned(
    ctx: &WorkerCtx,
    body: Vec<u8>,
) -> Result<codex_protocol::normalize::Normalized, Error> {
    let catalog = ctx.catalog.load();
    let strict = ctx.cfg.strict_models;
    normalize_responses_owned(body, &|m| models::choose(&catalog, strict, m)).map_err(refusal)
}

/// The answer to a body the normaliser refused.
fn refusal(e: codex_protocol::normalize::NormalizeError) -> Error {
    match e.unknown_model {
        Some(m) => Error::new(ErrorKind::ModelNotFound(m), Side::Downstream),
        None => Error::bad_request(e.message, e.param),
    }
}

/// Normalises the request, splices a continuation's history, and plans the turn.
async fn prepare<'a, S: AsyncReadRent + AsyncWriteRent>(
    ctx: &'a WorkerCtx,
    conn: &mut Conn<S>,
    mut req: Request,
    key: &ClientKey,
    keep: bool,
) -> Prepared<'a> {
    // The request body becomes the upstream body (in its own buffer when it can).
    let norm = match normalize_owned(ctx, std::mem::take(&mut req.body)) {
        Ok(n) => n,
        Err(e) => return Prepared::Answered(write_error(ctx, conn, ROUTE, &e, keep).await),
    };
    // previous_response_id: the upstream keeps nothing (store:false), so the gateway replays
    // the chain it kept; a client that sent store:false gets no transcript kept.
    let keep_transcript = norm.store != Some(false);
    let new_items = if keep_transcript {
        input_of(&norm.body)
    } else {
        Vec::new()
    };
    let parent = norm.previous_response_id.clone();
    let mut norm = norm;
    if let Some(id) = &parent {
        // Boxed: the lookup (Redis included) is larger than the rest of this handler.
        let spliced = Box::pin(ctx.transcripts.history(id, key.id))
            .await
            .ok()
            .and_then(|parts| with_history(&norm.body, &parts));
        match spliced {
            Some(body) => norm.body = body,
            None => {
                let e = Error::new(ErrorKind::ContinuationNotFound, Side::Downstream);
                return Prepared::Answered(write_error(ctx, conn, ROUTE, &e, keep).await);
            }
        }
    }
    let usage = UsageGuard::start(
        ctx,
        key,
        ROUTE.label(),
        norm.model.clone(),
        norm.stream,
        conn.usage_id(),
    );
    let plan = RequestPlan {
        route: ROUTE.label(),
        model: norm.model,
        body: Bytes::from(norm.body),
        passthrough: passthrough(&req),
        key_id: key.id,
        key_limits: std::sync::Arc::clone(&key.limits),
        // affinity_key's order, the body's fields read by the normaliser's one pass.
        affinity_key: header_session(&req)
            .or(norm.session)
            .or(norm.prompt_cache_key),
        asked: norm.asked,
        upstream_ws: None,
    };
    // The transcript is kept the moment the terminal event is seen, before the client can
    // read it (and send a continuation to another worker).
    let keeper = keep_transcript.then(|| Keeper {
        store: Rc::clone(&ctx.transcripts),
        key_id: key.id,
        parent,
        input: new_items,
    });
    // The raw request body (a Codex CLI request is 40-60 KB) became the plan's (or was dropped
    // when normalising copied it): the request holds none for the stream's life.
    Prepared::Turn(Turn {
        plan,
        keeper,
        stream: norm.stream,
        http10: req.http10,
        panic_after_commit: fault_requested(&req, "panic-after-commit"),
        usage,
    })
}

/// The `input` items of a normalised body.
pub(crate) fn input_of(body: &[u8]) -> Vec<sonic_rs::Value> {
    sonic_rs::get(body, &["input"])
        .ok()
        .and_then(|raw| sonic_rs::from_str::<sonic_rs::Array>(raw.as_raw_str()).ok())
        .map(|a| a.into_iter().collect())
        .unwrap_or_default()
}

/// `body` with the kept history (item arrays, oldest first) before its own input.
fn with_history(body: &[u8], parts: &[Arc<[u8]>]) -> Option<Vec<u8>> {
    let mut v: sonic_rs::Value = sonic_rs::from_slice(body).ok()?;
    let mut items = sonic_rs::Array::new();
    for part in parts {
        let arr: sonic_rs::Array = sonic_rs::from_slice(part).ok()?;
        for it in arr {
            items.push(it);
        }
    }
    for it in input_of(body) {
        items.push(it);
    }
    v.as_object_mut()?.insert(&"input", items);
    sonic_rs::to_vec(&v).ok()
}

/// What a turn leaves for its continuation: the response id and the output items, as they
/// are replayed upstream (ids of items the upstream did not store dropped; call ids and
/// encrypted reasoning kept).
#[derive(Default)]
pub struct Outputs {
    /// The upstream's response id.
    pub response_id: Option<String>,
    /// Output items, cleaned for replay.
    pub items: Vec<sonic_rs::Value>,
    /// The response completed (or ended incomplete): it can be continued.
    pub done: bool,
}

// === impl Outputs ===

impl Outputs {
    fn observe(&mut self, ev: &SseEvent) {
        match ev.event_type() {
            "response.created" if self.response_id.is_none() => {
                self.response_id = sonic_rs::get(&ev.data, &["response", "id"])
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned));
            }
            "response.output_item.done" => {
                let item = sonic_rs::get(&ev.data, &["item"])
                    .ok()
                    .and_then(|raw| sonic_rs::from_str::<sonic_rs::Value>(raw.as_raw_str()).ok());
                if let Some(mut item) = item {
                    if let Some(o) = item.as_object_mut() {
                        o.remove(&"id");
                        o.remove(&"status");
                    }
                    self.items.push(item);
                }
            }
            "response.completed" | "response.done" | "response.incomplete" => self.done = true,
            _ => {}
        }
    }
}

/// Where and how an HTTP turn is kept for a continuation.
pub struct Keeper {
    store: Rc<crate::transcripts::Transcripts>,
    key_id: i64,
    parent: Option<String>,
    input: Vec<sonic_rs::Value>,
}

// === impl Keeper ===

impl Keeper {
    /// Keeps the turn: its new input items, then its outputs.
    fn keep(self, outputs: &Outputs) {
        let Some(id) = outputs.response_id.clone() else {
            return;
        };
        let mut arr = sonic_rs::Array::new();
        for it in self.input.into_iter().chain(outputs.items.iter().cloned()) {
            arr.push(it);
        }
        if let Ok(bytes) = sonic_rs::to_vec(&arr) {
            self.store.put(id, self.key_id, self.parent, bytes);
        }
    }
}

/// An encoder that also records [`Outputs`] (any Responses dialect), and keeps the turn's
/// transcript as soon as its terminal event is seen when given a [`Keeper`].
pub struct Capturing<E> {
    inner: E,
    /// What the turn produced.
    pub outputs: Outputs,
    keeper: Option<Keeper>,
    observe: bool,
}

impl<E> Capturing<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            outputs: Outputs::default(),
            keeper: None,
            observe: true,
        }
    }

    /// Keeps the transcript with `keeper` at the terminal event. Without one (a client that
    /// sent `store: false`), nothing reads the outputs: they are not observed at all (no item
    /// is parsed).
    pub fn keeping(mut self, keeper: Option<Keeper>) -> Self {
        self.observe = keeper.is_some();
        self.keeper = keeper;
        self
    }
}

impl<E: Encoder> Encoder for Capturing<E> {
    fn streaming(&self) -> bool {
        self.inner.streaming()
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        if !self.observe {
            return self.inner.event(ev, out);
        }
        self.outputs.observe(ev);
        if self.outputs.done {
            if let Some(k) = self.keeper.take() {
                k.keep(&self.outputs);
            }
        }
        self.inner.event(ev, out);
    }

    fn broken(&mut self, e: &Error, response_id: Option<&str>, out: &mut Vec<u8>) {
        self.inner.broken(e, response_id, out);
    }

    fn finish(&mut self, failed: Option<&Error>, out: &mut Vec<u8>) -> Result<(), Error> {
        self.inner.finish(failed, out)
    }
}

/// Responses over SSE: the upstream's frames, byte-faithful.
pub struct ResponsesSse {
    /// Test-only fault injection: panic at the first event after the commit.
    pub panic_after_commit: bool,
}

impl Encoder for ResponsesSse {
    fn streaming(&self) -> bool {
        true
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        if self.panic_after_commit {
            panic!("injected fault: panic-after-commit");
        }
        out.extend_from_slice(&ev.frame);
    }

    fn broken(&mut self, e: &Error, response_id: Option<&str>, out: &mut Vec<u8>) {
        out.extend_from_slice(&e.response_failed_frame(response_id));
    }

    fn finish(&mut self, _failed: Option<&Error>, _out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(())
    }
}

/// Responses as one JSON object: the terminal event's `response`, its empty `output` rebuilt
/// from the `response.output_item.done` items (the upstream sends it empty at times). Raw
/// JSON throughout: the items and the `response` object are sliced out of the events and
/// spliced, never parsed into a tree and re-serialized.
#[derive(Default)]
pub struct ResponsesJson {
    items: Vec<(u64, Vec<u8>)>,
    terminal: Option<bytes::Bytes>,
}

impl Encoder for ResponsesJson {
    fn streaming(&self) -> bool {
        false
    }

    fn event(&mut self, ev: &SseEvent, _out: &mut Vec<u8>) {
        match ev.event_type() {
            "response.output_item.done" => {
                let data: &[u8] = &ev.data;
                if let Ok(item) = sonic_rs::get(data, &["item"]) {
                    let idx = sonic_rs::get(data, &["output_index"])
                        .ok()
                        .and_then(|i| i.as_u64())
                        .unwrap_or(self.items.len() as u64);
                    self.items
                        .push((idx, item.as_raw_str().as_bytes().to_vec()));
                }
            }
            "response.completed" | "response.incomplete" | "response.done" => {
                self.terminal = Some(ev.data.clone());
            }
            _ => {}
        }
    }

    fn broken(&mut self, _e: &Error, _response_id: Option<&str>, _out: &mut Vec<u8>) {}

    fn finish(&mut self, failed: Option<&Error>, out: &mut Vec<u8>) -> Result<(), Error> {
        if let Some(e) = failed {
            return Err(e.clone());
        }
        let body = self
            .terminal
            .as_deref()
            .and_then(|t| final_response(t, &mut self.items))
            .ok_or_else(|| {
                Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                    .with_cause("terminal event without a response object")
            })?;
        out.extend_from_slice(&body);
        Ok(())
    }
}

/// The `response` object of a terminal event, as the upstream wrote it; an empty (or null, or
/// missing) `output` is replaced by the `response.output_item.done` items ordered by
/// `output_index`.
fn final_response(data: &[u8], items: &mut [(u64, Vec<u8>)]) -> Option<Vec<u8>> {
    let resp = sonic_rs::get(data, &["response"]).ok()?;
    if !resp.is_object() {
        return None;
    }
    let raw = resp.as_raw_str().as_bytes();
    if items.is_empty() {
        return Some(raw.to_vec());
    }
    // Where the `output` value sits in `raw` (None: absent).
    let mut at = None;
    if let Ok(output) = sonic_rs::get(raw, &["output"]) {
        let r = output.as_raw_str().as_bytes();
        let trimmed = r.trim_ascii();
        let empty = trimmed == b"null"
            || (trimmed.first() == Some(&b'[')
                && trimmed[1..trimmed.len() - 1].trim_ascii().is_empty());
        if !empty {
            return Some(raw.to_vec());
        }
        let start = (r.as_ptr() as usize).checked_sub(raw.as_ptr() as usize)?;
        if start + r.len() > raw.len() {
            return None;
        }
        at = Some((start, start + r.len()));
    }
    items.sort_by_key(|(i, _)| *i);
    let mut arr = Vec::with_capacity(2 + items.iter().map(|(_, it)| it.len() + 1).sum::<usize>());
    arr.push(b'[');
    for (k, (_, it)) in items.iter().enumerate() {
        if k > 0 {
            arr.push(b',');
        }
        arr.extend_from_slice(it);
    }
    arr.push(b']');
    let mut out = Vec::with_capacity(raw.len() + arr.len() + 12);
    match at {
        Some((start, end)) => {
            out.extend_from_slice(&raw[..start]);
            out.extend_from_slice(&arr);
            out.extend_from_slice(&raw[end..]);
        }
        None => {
            let close = raw.iter().rposition(|&b| b == b'}')?;
            out.extend_from_slice(&raw[..close]);
            if !raw[1..close].trim_ascii().is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(b"\"output\":");
            out.extend_from_slice(&arr);
            out.extend_from_slice(&raw[close..]);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::final_response;
    use sonic_rs::JsonContainerTrait;

    fn items() -> Vec<(u64, Vec<u8>)> {
        vec![
            (
                1,
                br#"{"type":"message","content":[{"text":"b \"q\" \u00e9"}]}"#.to_vec(),
            ),
            (0, br#"{"type":"reasoning","summary":[]}"#.to_vec()),
        ]
    }

    fn parse(b: &[u8]) -> sonic_rs::Value {
        sonic_rs::from_slice(b).expect("valid JSON")
    }

    #[test]
    fn empty_null_or_missing_output_is_rebuilt_in_order() {
        let want = parse(
            br#"{"id":"r","output":[{"type":"reasoning","summary":[]},{"type":"message","content":[{"text":"b \"q\" \u00e9"}]}],"usage":{"input_tokens":1}}"#,
        );
        for terminal in [
            &br#"{"type":"response.completed","response":{"id":"r","output":[],"usage":{"input_tokens":1}}}"#[..],
            br#"{"type":"response.completed","response":{"id":"r","output": [ ] ,"usage":{"input_tokens":1}}}"#,
            br#"{"type":"response.completed","response":{"id":"r","output":null,"usage":{"input_tokens":1}}}"#,
            br#"{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":1}}}"#,
        ] {
            let got = final_response(terminal, &mut items()).expect("a response");
            assert_eq!(parse(&got), want, "{}", String::from_utf8_lossy(&got));
        }
        let got = final_response(br#"{"response":{}}"#, &mut items()).expect("a response");
        assert_eq!(parse(&got)["output"].as_array().map(|a| a.len()), Some(2));
    }

    #[test]
    fn a_full_output_is_forwarded_as_written() {
        let terminal = br#"{"type":"response.completed","response":{"id":"r", "output":[{"type":"message"}]}}"#;
        let got = final_response(terminal, &mut items()).expect("a response");
        assert_eq!(got, br#"{"id":"r", "output":[{"type":"message"}]}"#);
        let got = final_response(terminal, &mut Vec::new()).expect("a response");
        assert_eq!(got, br#"{"id":"r", "output":[{"type":"message"}]}"#);
    }

    #[test]
    fn no_response_object_is_none() {
        assert!(final_response(br#"{"type":"response.completed"}"#, &mut items()).is_none());
        assert!(final_response(br#"{"response":"x"}"#, &mut items()).is_none());
        assert!(final_response(b"not json", &mut items()).is_none());
    }
}
