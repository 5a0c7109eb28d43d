//! `/v1/chat/completions`: the chat translators (`codex_protocol::chat`) as encoders of the one
//! pipeline, over the same lifecycle as `/v1/responses`, so failover, quota, usage and affinity
//! behave identically. This module only translates; it decides nothing.

use std::io;

use bytes::Bytes;
use codex_protocol::{
    chat::{
        chat_to_responses, ChatAggregator, ChatRequestOptions, ChatStream, ChatUpstreamFailure,
    },
    classify::Failure,
    normalize::{Asked, ModelChoice},
    sse::SseEvent,
};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;

use super::{affinity_key, open_and_forward, passthrough, write_error, Route};
use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    lifecycle::RequestPlan,
    models,
    pipeline::{Aggregate, AggregateJson, Encoder, UsageGuard},
    server::h1::{Conn, Request},
};

/// This surface's route (its metrics and usage label, its error dialect).
pub const ROUTE: Route = Route::Chat;

fn now_s() -> u64 {
    shared_state::now_ms() / 1000
}

/// A translated upstream failure, as the one gateway error type.
fn failure_error(f: ChatUpstreamFailure) -> Error {
    if f.code.as_deref() == Some("stream_disconnected") {
        return Error::new(ErrorKind::UpstreamProtocol, Side::Upstream).with_cause(f.message);
    }
    Error::upstream(Failure {
        class: f.class,
        status: 200,
        message: Some(f.message),
        code: f.code,
        error_type: Some(f.error_type),
        param: None,
    })
}

/// Serves one chat completion request whose body was read and decoded.
pub async fn serve<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    // Resolve the model against the catalog before translating (aliases, unknown models).
    let catalog = ctx.catalog.load();
    let requested = sonic_rs::get(req.body.as_slice(), &["model"])
        .ok()
        .and_then(|v| sonic_rs::JsonValueTrait::as_str(&v).map(str::to_owned));
    let mut opts = ChatRequestOptions::default();
    let resolved;
    if let Some(m) = requested.as_deref() {
        match models::choose(&catalog, ctx.cfg.strict_models, m) {
            ModelChoice::Reject => {
                let e = Error::new(ErrorKind::ModelNotFound(m.to_owned()), Side::Downstream);
                return write_error(ctx, conn, ROUTE, &e, keep).await;
            }
            ModelChoice::Rewrite { slug, .. } => {
                resolved = slug;
                opts.upstream_model = Some(&resolved);
            }
            ModelChoice::Keep => {}
        }
        if let Some(r) = catalog.resolve(m) {
            opts.reasoning_levels = r.levels;
        }
    }
    // Chat has no thread id: without the client's own key, one per conversation of this
    // client key, so its turns hit the prompt cache and stay on their home account.
    let default_cache_key = conversation_cache_key(key.id, &req.body);
    opts.default_prompt_cache_key = default_cache_key.as_deref();
    let mut creq = match chat_to_responses(&req.body, &opts) {
        Ok(c) => c,
        Err(e) => {
            let e = Error::bad_request(e.message, e.param.as_deref());
            return write_error(ctx, conn, ROUTE, &e, keep).await;
        }
    };
    let mut usage = UsageGuard::start(
        ctx,
        &key,
        ROUTE.label(),
        creq.model.clone(),
        creq.stream,
        conn.usage_id(),
    );
    let plan = RequestPlan {
        route: ROUTE.label(),
        model: creq.model.clone(),
        asked: Asked::of_body(&creq.body),
        body: Bytes::from(std::mem::take(&mut creq.body)),
        passthrough: passthrough(&req),
        key_id: key.id,
        key_limits: std::sync::Arc::clone(&key.limits),
        affinity_key: affinity_key(&req).or_else(|| creq.prompt_cache_key.clone()),
        upstream_ws: None,
    };
    // The raw request body is not needed past this point: not held for the stream's life.
    let http10 = req.http10;
    drop(req);
    if creq.stream {
        let mut enc = ChatSse(ChatStream::for_request(&creq, now_s()));
        open_and_forward(ctx, conn, ROUTE, plan, &mut usage, &mut enc, http10, keep).await
    } else {
        let mut enc = AggregateJson::new(ChatAggregator::for_request(&creq, now_s()));
        open_and_forward(ctx, conn, ROUTE, plan, &mut usage, &mut enc, http10, keep).await
    }
}

/// The default `prompt_cache_key` of a chat request: derived from the client key and the
/// conversation's opening (its leading `system`/`developer` messages and first `user`
/// message, role and raw `content`) by [`super::conversation_cache_key`], so every later turn
/// of one conversation from one client key gets the same key (as the Codex CLI sends its
/// thread id), and other conversations or other client keys get others. `None` when the body
/// has no messages to go by (the translator reports what is wrong with it).
fn conversation_cache_key(key_id: i64, body: &[u8]) -> Option<String> {
    use sonic_rs::JsonValueTrait;
    let messages = sonic_rs::get(body, &["messages"]).ok()?;
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for m in sonic_rs::to_array_iter(messages.as_raw_str()) {
        let Ok(m) = m else { return None };
        let raw = m.as_raw_str();
        let role = sonic_rs::get(raw, &["role"]).ok();
        let role = role
            .as_ref()
            .and_then(|r| r.as_str())
            .unwrap_or("")
            .to_owned();
        let content = sonic_rs::get(raw, &["content"]).ok();
        let content = content
            .as_ref()
            .map_or("", |c| c.as_raw_str())
            .as_bytes()
            .to_vec();
        let opening_ends = role != "system" && role != "developer";
        parts.push(role.into_bytes());
        parts.push(content);
        if opening_ends {
            // The first message past the system prompt (normally the first user message)
            // ends the opening.
            break;
        }
    }
    if parts.is_empty() {
        return None;
    }
    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    Some(super::conversation_cache_key("chat", key_id, &parts))
}

/// Chat completion chunks over SSE.
pub struct ChatSse(ChatStream);

impl Encoder for ChatSse {
    fn streaming(&self) -> bool {
        true
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        self.0.on_event(ev.event_type(), &ev.data, out);
    }

    fn broken(&mut self, _e: &Error, _response_id: Option<&str>, out: &mut Vec<u8>) {
        self.0.finish(out); // one error object, no [DONE]
    }

    fn finish(&mut self, _failed: Option<&Error>, _out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(())
    }
}

impl Aggregate for ChatAggregator {
    fn on_event(&mut self, event_type: &str, data: &[u8]) {
        ChatAggregator::on_event(self, event_type, data);
    }

    /// One `chat.completion` object.
    fn render(self) -> Result<Vec<u8>, Error> {
        self.finish().map_err(failure_error)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::conversation_cache_key as key;

    #[test]
    fn conversation_cache_key_follows_the_opening() {
        let one = br#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}"#;
        let later = br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"user","content":"v"}],"model":"m"}"#;
        let other = br#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"w"}]}"#;
        let k = key(1, one).unwrap();
        assert_eq!(k.len(), 36);
        assert_eq!(key(1, later).unwrap(), k);
        assert_ne!(key(1, other).unwrap(), k);
        assert_ne!(key(2, one).unwrap(), k);
        assert_eq!(key(1, br#"{"messages":[]}"#), None);
        assert_eq!(key(1, br#"{"model":"m"}"#), None);
    }
}
