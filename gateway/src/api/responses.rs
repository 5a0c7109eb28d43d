//! `/v1/responses` over HTTP: JSON and SSE. The Responses dialect is the upstream's own, so
//! the SSE encoder forwards frames byte-faithfully and the JSON encoder assembles the final
//! `response` object.

use std::io;

use bytes::Bytes;
use codex_protocol::{normalize::normalize_responses_with, sse::SseEvent};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;
use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait};

use super::{affinity_key, fault_requested, passthrough, write_error, HttpSink};
use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    lifecycle::{self, RequestPlan},
    models,
    pipeline::{self, Encoder, UsageGuard},
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
    if norm.previous_response_id.is_some() {
        let e = Error::new(ErrorKind::ContinuationNotFound, Side::Downstream);
        return write_error(ctx, conn, ROUTE, &e, keep).await;
    }
    let mut usage = UsageGuard::start(ctx, key.id, ROUTE, norm.model.clone(), norm.stream);
    let plan = RequestPlan {
        route: ROUTE,
        model: norm.model,
        body: Bytes::from(norm.body),
        passthrough: passthrough(&req),
        key_id: key.id,
        affinity_key: affinity_key(&req).or_else(|| norm.prompt_cache_key.clone()),
        upstream_ws: None,
    };
    // Boxed: the attempt machinery (retries, refresh waits) must not stay resident in every
    // connection's task for the whole stream (benches/README.md, "next costs" 2).
    let committed = match Box::pin(lifecycle::open(ctx, &plan)).await {
        Ok(c) => c,
        Err(e) => {
            usage.fail(&e);
            return write_error(ctx, conn, ROUTE, &e, keep).await;
        }
    };
    let mut sink = HttpSink {
        ctx,
        conn,
        route: ROUTE,
        http10: req.http10,
        keep,
    };
    if norm.stream {
        let mut enc = ResponsesSse {
            panic_after_commit: fault_requested(&req, "panic-after-commit"),
        };
        pipeline::forward(ctx, committed, &mut usage, &mut enc, &mut sink).await
    } else {
        let mut enc = ResponsesJson::default();
        Box::pin(pipeline::forward(
            ctx, committed, &mut usage, &mut enc, &mut sink,
        ))
        .await
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
