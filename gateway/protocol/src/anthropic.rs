//! Anthropic Messages (`/v1/messages`) <-> Codex Responses translation, the Anthropic
//! counterpart of the chat translation (`crate::chat`), docs/protocol.md#anthropic-messages-mapping.
//!
//! Pure pieces, no I/O and no runtime: the data plane feeds them bytes and events and writes
//! what they return.
//!
//! # Key Components
//! - [`messages_to_responses`]: a client Messages body -> the Codex Responses upstream body
//!   (`stream:true`, `store:false`, `instructions:""`), plus what the response side needs
//!   ([`MessagesRequest`]). Parameters are whitelisted: every documented top-level field is
//!   accepted (its shape checked), and those without a Codex counterpart are dropped:
//!   `max_tokens`, `temperature`, `top_p`, `top_k`, `metadata`, `service_tier`,
//!   `cache_control` (top level and on any block), `container`, `inference_geo`, `speed`,
//!   `diagnostics`, `fallbacks`, `fallback_credit_token`, an empty `mcp_servers` (the Codex
//!   backend rejects most of them, see [`crate::normalize::DROPPED_FIELDS`]); unknown fields
//!   are ignored. `stop_sequences` are applied by the response side; `thinking` and
//!   `output_config.effort` become `reasoning.effort`; `context_management`'s
//!   `clear_thinking_20251015` and `clear_tool_uses_20250919` are applied to the history sent
//!   (`compact_20260112` is accepted).
//!   The `anthropic-beta` header and the `?beta=true` query are never read: a beta the
//!   translator does not know is no reason to refuse.
//! - [`MessagesStream`]: one upstream Responses event in, zero or more Anthropic SSE events
//!   out (`message_start`, `ping`, `content_block_start/delta/stop` with `text_delta`,
//!   `input_json_delta`, `thinking_delta`, `signature_delta`, `message_delta` with
//!   `stop_reason` and usage, `message_stop`), each as `event: <type>\ndata: {...}\n\n`.
//! - [`MessagesAggregator`]: the same events folded into one `message` object.
//! - [`count_tokens`]: the `/v1/messages/count_tokens` estimate (method documented there).
//! - [`error_type_for_status`] / [`error_json`] / [`error_frame`]: Anthropic's error shape
//!   `{"type":"error","error":{"type","message"}}`; the gateway decides the status and message
//!   (its one error mapping) and renders them with these.
//!
//! # Mapping (request)
//! | Anthropic | Codex Responses |
//! | --- | --- |
//! | `system` (string or text blocks) | a leading `developer` message |
//! | a `system` message inside `messages` | a `developer` message at its position |
//! | user `text` / `image` (base64 or url) / `document` | `input_text` / `input_image` / `input_file` |
//! | user `tool_result{tool_use_id, content, is_error}` | `function_call_output{call_id: tool_use_id}` (images follow in a user message) |
//! | assistant `text` | assistant `output_text` |
//! | assistant `tool_use{id, name, input}` | `function_call{call_id: id, name, arguments}` |
//! | assistant `thinking{signature}` / `redacted_thinking{data}` | `reasoning{encrypted_content}` (our signatures are the encrypted reasoning) |
//! | `tools[{name, description, input_schema}]`, `web_search_*` | `function` tools, `web_search` |
//! | `tool_choice` auto / any / tool / none, `disable_parallel_tool_use` | `auto` / `required` / `{type:function,name}` / `none`, `parallel_tool_calls` |
//! | `thinking{type:enabled, budget_tokens}` / `{type:adaptive}`, `output_config.effort` (`max` -> `xhigh`) | `reasoning{effort, summary:auto}` + encrypted reasoning (`display:omitted`: no summary) |
//! | `output_config.format` / `output_format` (`json_schema`) | `text.format` (`json_schema`, strict) |
//! | `context_management` `clear_thinking_20251015{keep}` | thinking of older assistant turns left out |
//! | `context_management` `clear_tool_uses_20250919{trigger, keep, clear_at_least, exclude_tools, clear_tool_inputs}` | older `function_call_output`s (and arguments) replaced by a placeholder |
//! | `tools[{defer_loading}]`, tool search tools, `tool_reference` / `search_result` blocks | sent in full / left out / text |
//!
//! # Mapping (response)
//! Text items -> `text` blocks, function calls -> `tool_use` blocks (`id` = `call_id`),
//! reasoning summaries -> `thinking` blocks whose `signature` is the item's
//! `encrypted_content` (or `redacted_thinking` when there is no summary text; only when the
//! client enabled thinking). `stop_reason`: `stop_sequence` when a stop sequence matched (the
//! text is cut before it), `max_tokens` for `incomplete` / `max_output_tokens`, `refusal` for
//! `content_filter`, `tool_use` when a tool was called, else `end_turn`. Usage:
//! `input_tokens` = upstream input minus cached, `cache_read_input_tokens` = cached,
//! `output_tokens` = upstream output.
//!
//! # Error handling
//! Request translation returns a [`MessagesError`] (an `invalid_request_error`). In a
//! stream, `response.failed` / `error` end the translation silently: the gateway classifies
//! the failure once and writes one `error` event ([`MessagesStream::fail`]); no
//! `message_stop` follows.

mod aggregate;
mod count;
mod request;
mod stop;
mod stream;
#[cfg(test)]
mod stream_tests;

pub use self::{
    aggregate::MessagesAggregator,
    count::count_tokens,
    request::{
        effort_for_budget, messages_to_responses, MessagesError, MessagesRequest,
        MessagesRequestOptions,
    },
    stream::MessagesStream,
};
pub use crate::{events::Usage, tools::ToolNameMap};
use crate::{
    json::{write_str, write_u64},
    turn::Stop,
};

/// Anthropic's error `type` for an HTTP status (the status is the gateway's one mapping).
pub fn error_type_for_status(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// `{"type":"error","error":{"type":..,"message":..}}`.
pub fn error_json(error_type: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + message.len());
    out.extend_from_slice(b"{\"type\":\"error\",\"error\":{\"type\":");
    write_str(&mut out, error_type);
    out.extend_from_slice(b",\"message\":");
    write_str(&mut out, message);
    out.extend_from_slice(b"}}");
    out
}

/// The same object as an SSE `error` event (a failure after the stream started).
pub fn error_frame(error_type: &str, message: &str) -> Vec<u8> {
    let mut out = b"event: error\ndata: ".to_vec();
    out.extend_from_slice(&error_json(error_type, message));
    out.extend_from_slice(b"\n\n");
    out
}

/// Writes `usage` in Anthropic's shape (cached input reported apart, as Anthropic does).
pub(crate) fn write_usage(out: &mut Vec<u8>, u: &Usage) {
    let cached = u.cached_tokens.min(u.input_tokens);
    out.extend_from_slice(b"{\"input_tokens\":");
    write_u64(out, u.input_tokens - cached);
    out.extend_from_slice(b",\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":");
    write_u64(out, cached);
    out.extend_from_slice(b",\"output_tokens\":");
    write_u64(out, u.output_tokens);
    out.push(b'}');
}

/// The Anthropic message id for an upstream response id (`resp_x` -> `msg_x`).
pub(crate) fn message_id(response_id: Option<&str>, fallback: u64) -> String {
    match response_id.filter(|s| !s.is_empty()) {
        Some(id) => format!("msg_{}", id.strip_prefix("resp_").unwrap_or(id)),
        None => format!("msg_gw{fallback}"),
    }
}

/// The `stop_reason` of a response that ended for `stop` (no stop sequence matched);
/// `tool_use` when it completed with tool calls.
pub(crate) fn stop_reason(stop: Stop, tool_used: bool) -> &'static str {
    match stop {
        Stop::Completed if tool_used => "tool_use",
        Stop::Completed => "end_turn",
        Stop::MaxOutputTokens => "max_tokens",
        Stop::ContentFilter => "refusal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_follow_the_status() {
        for (status, ty) in [
            (400, "invalid_request_error"),
            (405, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (504, "api_error"),
            (503, "overloaded_error"),
        ] {
            assert_eq!(error_type_for_status(status), ty, "{status}");
        }
    }

    #[test]
    fn error_shapes() {
        let v: sonic_rs::Value =
            sonic_rs::from_slice(&error_json("rate_limit_error", "slow \"down\"")).unwrap();
        assert_eq!(
            sonic_rs::to_string(&v).unwrap(),
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow \"down\""}}"#
        );
        let f = error_frame("api_error", "x");
        assert!(f.starts_with(b"event: error\ndata: {\"type\":\"error\""));
        assert!(f.ends_with(b"}}\n\n"));
    }

    #[test]
    fn usage_reports_cache_reads_apart() {
        let mut out = Vec::new();
        write_usage(
            &mut out,
            &Usage {
                input_tokens: 100,
                cached_tokens: 60,
                output_tokens: 7,
                reasoning_tokens: 2,
                total_tokens: 107,
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"input_tokens":40,"cache_creation_input_tokens":0,"cache_read_input_tokens":60,"output_tokens":7}"#
        );
        assert_eq!(message_id(Some("resp_abc"), 1), "msg_abc");
        assert_eq!(message_id(None, 7), "msg_gw7");
    }
}
