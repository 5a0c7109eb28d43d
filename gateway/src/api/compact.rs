//! Remote compaction v1: `POST /v1/responses/compact` (and `/responses/compact`,
//! `/backend-api/codex/responses/compact`), the endpoint older Codex CLIs and other tools call
//! to shrink a conversation: a Responses-shaped body in, `{"output":[...]}` out (non-stream
//! JSON), the output holding a `compaction` item that replaces the history.
//!
//! The upstream retired its own `/responses/compact` (docs/protocol.md#compaction: it answers
//! 404; the Codex CLI moved to remote compaction v2, a `{"type":"compaction_trigger"}` item
//! last in an ordinary `/responses` request). So the gateway serves v1 through v2, as the
//! pool's peers do: the request's `input` gains the trigger and goes through the very same
//! lifecycle as `/v1/responses` (one pool, session affinity, account-bound blobs cleaned or
//! recovered, failover before the commit), and the collected answer's `output` is returned in
//! v1's shape.
//!
//! # Key Components
//! - [`serve`]: the handler.
//! - [`with_trigger`]: the request body with the trigger appended to its `input`.
//! - [`CompactJson`]: the pipeline encoder: [`super::responses::ResponsesJson`]'s final
//!   response, reduced to `{"output": ...}`.
//!
//! # Error handling
//! Bad bodies are 400 in OpenAI's shape before anything goes upstream; upstream failures are
//! the lifecycle's, answered through [`super::write_error`].

use std::io;

use bytes::Bytes;
use codex_protocol::{normalize::Normalized, sse::SseEvent};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;
use sonic_rs::{JsonValueMutTrait, JsonValueTrait};

use super::{
    header_session, open_and_forward, passthrough, responses::ResponsesJson, write_error, Route,
};
use crate::{
    ctx::WorkerCtx,
    error::Error,
    lifecycle::RequestPlan,
    pipeline::{Encoder, UsageGuard},
    server::h1::{Conn, Request},
};

/// This surface's route (its metrics and usage label, its error dialect).
pub const ROUTE: Route = Route::Compact;

/// Serves one compaction request whose body was read and decoded.
pub async fn serve<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    // The normaliser first (one validation of the body, a string input already one user
    // message), then the trigger on the normalised input.
    let norm = match super::responses::normalize(ctx, &req.body).and_then(|mut n| {
        n.body = with_trigger(&n)?;
        Ok(n)
    }) {
        Ok(n) => n,
        Err(e) => return write_error(ctx, conn, ROUTE, &e, keep).await,
    };
    let mut usage = UsageGuard::start(
        ctx,
        &key,
        ROUTE.label(),
        norm.model.clone(),
        false,
        conn.usage_id(),
    );
    let plan = RequestPlan {
        route: ROUTE.label(),
        model: norm.model,
        body: Bytes::from(norm.body),
        passthrough: passthrough(&req),
        key_id: key.id,
        key_limits: std::sync::Arc::clone(&key.limits),
        affinity_key: header_session(&req)
            .or(norm.session)
            .or(norm.prompt_cache_key),
        asked: norm.asked,
        upstream_ws: None,
    };
    let mut enc = CompactJson::default();
    open_and_forward(
        ctx, conn, ROUTE, plan, &mut usage, &mut enc, req.http10, keep,
    )
    .await
}

/// The normalised compaction request as a v2 request: its `input` (always an array once
/// normalised) with `{"type":"compaction_trigger"}` last (not twice); `previous_response_id`
/// refused (v1 has none, and the gateway keeps no transcript for compaction).
pub fn with_trigger(norm: &Normalized) -> Result<Vec<u8>, Error> {
    if norm.previous_response_id.is_some() {
        return Err(Error::bad_request(
            "Compaction takes the whole history in `input`; `previous_response_id` is not supported here.",
            Some("previous_response_id"),
        ));
    }
    let mut v: sonic_rs::Value = sonic_rs::from_slice(&norm.body)
        .map_err(|e| Error::bad_request(format!("cannot read body: {e}"), None))?;
    let items = v
        .get_mut("input")
        .and_then(|i| i.as_array_mut())
        .ok_or_else(|| Error::bad_request("`input` is missing.", Some("input")))?;
    let triggered = items
        .iter()
        .last()
        .and_then(|i| i.get("type"))
        .and_then(|t| t.as_str())
        == Some("compaction_trigger");
    if !triggered {
        items.push(sonic_rs::json!({"type": "compaction_trigger"}));
    }
    sonic_rs::to_vec(&v).map_err(|e| Error::bad_request(format!("cannot encode body: {e}"), None))
}

/// The answer in v1's shape: `{"output": [...]}`, the items of the final response.
#[derive(Default)]
pub struct CompactJson {
    inner: ResponsesJson,
}

impl Encoder for CompactJson {
    fn streaming(&self) -> bool {
        false
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        self.inner.event(ev, out);
    }

    fn broken(&mut self, e: &Error, response_id: Option<&str>, out: &mut Vec<u8>) {
        self.inner.broken(e, response_id, out);
    }

    fn finish(&mut self, failed: Option<&Error>, out: &mut Vec<u8>) -> Result<(), Error> {
        let mut response = Vec::new();
        self.inner.finish(failed, &mut response)?;
        let output = sonic_rs::get(response.as_slice(), &["output"])
            .ok()
            .filter(|o| o.is_array())
            .map(|o| o.as_raw_str().as_bytes().to_vec())
            .unwrap_or_else(|| b"[]".to_vec());
        out.extend_from_slice(b"{\"output\":");
        out.extend_from_slice(&output);
        out.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sonic_rs::{JsonContainerTrait, Value};

    use super::*;

    /// What `serve` makes of `body` before the lifecycle (the normaliser keeping the model).
    fn compaction_of(body: &[u8]) -> Result<Vec<u8>, Error> {
        let n = codex_protocol::normalize::normalize_responses(body)
            .map_err(|e| Error::bad_request(e.message, e.param))?;
        with_trigger(&n)
    }

    fn input_of(body: &[u8]) -> Value {
        let v: Value = sonic_rs::from_slice(&compaction_of(body).unwrap()).unwrap();
        v.get("input").unwrap().clone()
    }

    #[test]
    fn the_trigger_goes_last_once() {
        let i =
            input_of(br#"{"model":"m","input":[{"type":"message","role":"user","content":"a"}]}"#);
        assert_eq!(i.as_array().unwrap().len(), 2);
        assert_eq!(i[1]["type"].as_str(), Some("compaction_trigger"));
        let i = input_of(br#"{"model":"m","input":[{"type":"compaction_trigger"}]}"#);
        assert_eq!(i.as_array().unwrap().len(), 1);
        let i = input_of(br#"{"model":"m","input":"hello"}"#);
        assert_eq!(i[0]["content"][0]["text"].as_str(), Some("hello"));
        assert_eq!(i[1]["type"].as_str(), Some("compaction_trigger"));
        let i = input_of(br#"{"model":"m"}"#);
        assert_eq!(i.as_array().unwrap().len(), 1);
    }

    #[test]
    fn bad_bodies_are_refused() {
        for (body, param) in [
            (&br#"{"model":"m","input":5}"#[..], Some("input")),
            (
                br#"{"model":"m","previous_response_id":"resp_1"}"#,
                Some("previous_response_id"),
            ),
            (br#"[1]"#, None),
            (br#"{"#, None),
        ] {
            let e = compaction_of(body).unwrap_err();
            assert_eq!(e.to_openai().status, 400);
            assert_eq!(e.to_openai().body.param.as_deref(), param, "{body:?}");
        }
    }

    #[test]
    fn the_answer_is_the_final_output() {
        let mut enc = CompactJson::default();
        let mut out = Vec::new();
        let item = r#"{"type":"compaction","id":"cmp_1","encrypted_content":"gAAA"}"#;
        for (ty, data) in [
            (
                "response.output_item.done",
                format!(r#"{{"type":"response.output_item.done","output_index":0,"item":{item}}}"#),
            ),
            (
                "response.completed",
                r#"{"type":"response.completed","response":{"id":"resp_1","object":"response","output":[]}}"#
                    .to_owned(),
            ),
        ] {
            let mut split = codex_protocol::sse::SseSplitter::new(1 << 20);
            split.push(&codex_protocol::sse::frame(ty, data.as_bytes()));
            let ev = split.next_event().unwrap().unwrap();
            enc.event(&ev, &mut out);
        }
        enc.finish(None, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(r#"{{"output":[{item}]}}"#)
        );
    }
}
