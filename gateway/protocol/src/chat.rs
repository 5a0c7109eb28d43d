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
//! - [`ToolNameMap`]: tool names over 64 characters are shortened deterministically
//!   (`first 55 chars + "_" + 8 hex`) and restored on output.
//! - [`ChatStream`]: one upstream Responses event in, zero or more complete
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
//! - Delta events (text, reasoning, refusal, arguments: most of a stream) skip serde: a small
//!   validated scanner (`scan.rs`) reads `delta` / `item_id` / indexes in one pass and the raw
//!   `delta` token is copied into the chunk without unescaping. Chunk prefixes are built once.
//!   No allocation per delta event on the streaming path.
//!
//! # Error handling
//! - Request translation returns a [`ChatError`] (message + optional `param`); the gateway maps
//!   it to a 400 `invalid_request_error`.
//! - In a stream, `response.failed` / `error` / upstream EOF without a terminal event become one
//!   OpenAI-shaped error frame and no `[DONE]`; the aggregator returns a [`ChatUpstreamFailure`]
//!   classified by [`crate::classify::classify_stream_error`].
//! - Malformed upstream events are skipped (terminal ones still terminate the stream).

mod aggregate;
pub(crate) mod json;
mod names;
pub(crate) mod request;
pub(crate) mod scan;
mod stream;
pub(crate) mod upstream;

pub use self::{
    aggregate::ChatAggregator,
    names::ToolNameMap,
    request::{chat_to_responses, ChatError, ChatRequest, ChatRequestOptions},
    stream::ChatStream,
    upstream::ChatUpstreamFailure,
};
pub use crate::events::Usage;

/// The longest tool name the Codex backend accepts.
pub const MAX_TOOL_NAME_LEN: usize = 64;
