//! `/v1/responses` over HTTP: JSON and SSE. The Responses dialect is the upstream's own, so
//! the SSE encoder forwards frames byte-faithfully and the JSON encoder assembles the final
//! `response` object.

use std::{io, rc::Rc, sync::Arc};

use bytes::Bytes;
use codex_protocol::{normalize::normalize_responses_with, sse::SseEvent};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;
use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait};

use super::{affinity_key, fault_requested, open_and_forward, passthrough, write_error};
use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    lifecycle::RequestPlan,
    models,
    pipeline::{Encoder, UsageGuard},
    server::h1::{Conn, Request},
};

const ROUTE: &str = "responses";

/// Serves one `POST /v1/responses` whose body was read and decoded.
pub async fn serve<S: AsyncReadRent + AsyncWriteRent>(
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
            return write_error(ctx, conn, ROUTE, &e, keep).await;
        }
    };
    drop(catalog);
    // previous_response_id: the upstream keeps nothing (store:false), so the gateway replays
    // the chain it kept; a client that sent store:false gets no transcript kept.
    let keep_transcript = sonic_rs::get(req.body.as_slice(), &["store"])
        .ok()
        .and_then(|v| v.as_bool())
        != Some(false);
    let new_items = if keep_transcript {
        input_of(&norm.body)
    } else {
        Vec::new()
    };
    let parent = norm.previous_response_id.clone();
    let mut norm = norm;
    if let Some(id) = &parent {
        let spliced = ctx
            .transcripts
            .history(id, key.id)
            .await
            .ok()
            .and_then(|parts| with_history(&norm.body, &parts));
        match spliced {
            Some(body) => norm.body = body,
            None => {
                let e = Error::new(ErrorKind::ContinuationNotFound, Side::Downstream);
                return write_error(ctx, conn, ROUTE, &e, keep).await;
            }
        }
    }
    let mut usage = UsageGuard::start(ctx, &key, ROUTE, norm.model.clone(), norm.stream);
    let plan = RequestPlan {
        route: ROUTE,
        model: norm.model,
        body: Bytes::from(norm.body),
        passthrough: passthrough(&req),
        key_id: key.id,
        key_limits: std::sync::Arc::clone(&key.limits),
        affinity_key: affinity_key(&req).or_else(|| norm.prompt_cache_key.clone()),
        upstream_ws: None,
    };
    let http10 = req.http10;
    // The transcript is kept the moment the terminal event is seen, before the client can
    // read it (and send a continuation to another worker).
    let keeper = keep_transcript.then(|| Keeper {
        store: Rc::clone(&ctx.transcripts),
        key_id: key.id,
        parent,
        input: new_items,
    });
    if norm.stream {
        let mut enc = Capturing::new(ResponsesSse {
            panic_after_commit: fault_requested(&req, "panic-after-commit"),
        })
        .keeping(keeper);
        open_and_forward(ctx, conn, ROUTE, &plan, &mut usage, &mut enc, http10, keep).await
    } else {
        let mut enc = Capturing::new(ResponsesJson::default()).keeping(keeper);
        open_and_forward(ctx, conn, ROUTE, &plan, &mut usage, &mut enc, http10, keep).await
    }
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
}

impl<E> Capturing<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            outputs: Outputs::default(),
            keeper: None,
        }
    }

    /// Keeps the transcript with `keeper` (if any) at the terminal event.
    pub fn keeping(mut self, keeper: Option<Keeper>) -> Self {
        self.keeper = keeper;
        self
    }
}

impl<E: Encoder> Encoder for Capturing<E> {
    fn streaming(&self) -> bool {
        self.inner.streaming()
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
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
/// from the `response.output_item.done` items (the upstream sends it empty at times).
#[derive(Default)]
pub struct ResponsesJson {
    items: Vec<(u64, sonic_rs::Value)>,
    terminal: Option<Vec<u8>>,
}

impl Encoder for ResponsesJson {
    fn streaming(&self) -> bool {
        false
    }

    fn event(&mut self, ev: &SseEvent, _out: &mut Vec<u8>) {
        match ev.event_type() {
            "response.output_item.done" => {
                if let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(&ev.data) {
                    let idx = v
                        .get("output_index")
                        .and_then(|i| i.as_u64())
                        .unwrap_or(self.items.len() as u64);
                    if let Some(item) = v.get("item") {
                        self.items.push((idx, item.clone()));
                    }
                }
            }
            "response.completed" | "response.incomplete" | "response.done" => {
                self.terminal = Some(ev.data.to_vec());
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
