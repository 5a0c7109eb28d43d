//! `/v1/chat/completions` <-> Codex Responses translation (docs/protocol.md#chat-completions-mapping).
//!
//! Three pure pieces, no I/O and no runtime: the data plane feeds them bytes and events and
//! writes what they return.
//!
//! # Key Components
//! - [`chat_to_responses`]: a client Chat Completions body -> the Codex Responses upstream body
//!   (docs/protocol.md#request, already normalized per docs/protocol.md#request-bodies: `stream:true`, `store:false`, `instructions:""`,
//!   `include:["reasoning.encrypted_content"]`, `reasoning.summary:"auto"`), plus the
//!   client-facing facts the response side needs ([`ChatRequest`]). Parameters are
//!   *whitelisted*: anything not mapped (temperature, max_tokens, stop, seed, user, ...) is
//!   dropped, so the backend never answers "Unsupported parameter".
//! - [`ToolNameMap`] (from [`crate::tools`], shared with Anthropic): tool names over 64
//!   characters are shortened deterministically (`first 55 chars + "_" + 8 hex`) and restored
//!   on output.
//! - [`ChatStream`]: one upstream Responses event (read by the neutral `turn` layer) in, zero or more complete
//!   `data: {chat.completion.chunk}\n\n` frames out (docs/protocol.md#stream), ending in either a finish chunk,
//!   an optional usage chunk and `data: [DONE]`, or exactly one `data: {"error":{...}}` frame.
//! - [`ChatAggregator`]: the same events folded into one `chat.completion` JSON body
//!   (docs/protocol.md#non-stream-and-usage),
//!   or a [`ChatUpstreamFailure`].
//!
//! # Usage
//! ```
//! use codex_protocol::chat::{chat_to_responses, ChatRequestOptions, ChatStream};
//!
//! let body = br#"{"model":"gpt-5","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
//! let req = chat_to_responses(body, &ChatRequestOptions::default()).unwrap();
//! // ... send `req.body` upstream, then for every upstream SSE event:
//! let mut stream = ChatStream::new(&req.model, 1_700_000_000, req.include_usage, req.name_map.clone());
//! let mut out = Vec::new();
//! stream.on_event("response.output_text.delta", br#"{"type":"response.output_text.delta","item_id":"m1","output_index":0,"delta":"Hi"}"#, &mut out);
//! stream.on_event("response.completed", br#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[]}}"#, &mut out);
//! assert!(out.ends_with(b"data: [DONE]\n\n"));
//! assert!(stream.is_finished());
//! ```
//!
//! # Performance
//! - The request is read in one borrowed serde pass (no DOM); schemas, tool arguments and
//!   unknown built-in tools are copied as raw JSON, and the upstream body is written straight
//!   into one pre-sized `Vec<u8>`.
//! - Delta events (text, reasoning, refusal, arguments: most of a stream) skip serde: the
//!   `turn` layer's validated scanner reads `delta` / `item_id` / indexes in one pass and the
//!   raw `delta` token is copied into the chunk without unescaping. Chunk prefixes are built
//!   once. No allocation per delta event on the streaming path.
//!
//! # Error handling
//! - Request translation returns a [`ChatError`] (message + optional `param`); the gateway maps
//!   it to a 400 `invalid_request_error`.
//! - In a stream, `response.failed` / `error` / upstream EOF without a terminal event become one
//!   OpenAI-shaped error frame and no `[DONE]`; the aggregator returns a [`ChatUpstreamFailure`]
//!   classified by [`crate::classify::classify_stream_error`].
//! - Malformed upstream events are skipped (terminal ones still terminate the stream).

mod aggregate;
mod failure;
mod request;
mod stream;

pub use self::{
    aggregate::ChatAggregator,
    failure::ChatUpstreamFailure,
    request::{chat_to_responses, ChatError, ChatRequest, ChatRequestOptions},
    stream::ChatStream,
};
pub use crate::{
    events::Usage,
    tools::{ToolNameMap, MAX_TOOL_NAME_LEN},
};
use crate::{json::write_u64, turn::Stop};

/// The chat `finish_reason` of a response that ended for `stop`; `tool_calls` when it
/// completed with tool calls.
fn finish_reason(stop: Stop, tool_calls: bool) -> &'static str {
    match stop {
        Stop::Completed if tool_calls => "tool_calls",
        Stop::Completed => "stop",
        Stop::MaxOutputTokens => "length",
        Stop::ContentFilter => "content_filter",
    }
}

/// Appends the chat `usage` object for `u`.
fn write_usage(out: &mut Vec<u8>, u: &Usage) {
    out.extend_from_slice(b"{\"prompt_tokens\":");
    write_u64(out, u.input_tokens);
    out.extend_from_slice(b",\"completion_tokens\":");
    write_u64(out, u.output_tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    write_u64(out, u.total_tokens);
    out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
    write_u64(out, u.cached_tokens);
    out.extend_from_slice(b"},\"completion_tokens_details\":{\"reasoning_tokens\":");
    write_u64(out, u.reasoning_tokens);
    out.extend_from_slice(b"}}");
}
