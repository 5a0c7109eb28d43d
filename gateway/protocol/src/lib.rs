//! The Codex / OpenAI protocol layer: pure functions and small state machines, no I/O, no
//! runtime. The data plane (`gateway`) drives them; benches measure them in isolation.
//!
//! # Key Components
//! - [`depth`]: the nesting depth of JSON text by a flat scan, checked before any recursive
//!   reader sees JSON from outside.
//! - [`sse`]: incremental SSE event splitting of upstream bytes, and frame encoding.
//! - [`normalize`]: client `/v1/responses` body -> Codex upstream body
//!   (docs/protocol.md#request-bodies).
//! - [`bound`]: account-bound blobs (reasoning `encrypted_content`, compaction items) in a
//!   Responses body: fingerprints, and stripping the ones another account would refuse.
//! - [`classify`]: the one failure classifier for upstream errors (HTTP bodies and in-stream
//!   `response.failed`), docs/protocol.md#error-bodies.
//! - [`openai_error`]: OpenAI-shaped error bodies (`{"error":{"message","type","code"}}`).
//! - [`events`]: lazy extraction of the few fields the gateway reads from events.
//! - [`chat`]: `/v1/chat/completions` <-> Responses translation (request encoder, stream
//!   decoder, non-stream aggregator), docs/protocol.md#chat-completions-mapping.
//! - [`anthropic`]: `/v1/messages` <-> Responses translation (request, stream, aggregator,
//!   token estimate, Anthropic error shape).

pub mod anthropic;
pub mod bound;
pub mod chat;
pub mod classify;
pub mod depth;
pub mod events;
pub mod normalize;
pub mod openai_error;
pub mod sse;
