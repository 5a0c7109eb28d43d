//! The Codex / OpenAI protocol layer: pure functions and small state machines, no I/O, no
//! runtime. The data plane (`gateway`) drives them; benches measure them in isolation.
//!
//! # Key Components
//! - [`depth`]: the nesting depth of JSON text by a flat scan, checked before any recursive
//!   reader sees JSON from outside.
//! - [`sse`]: incremental SSE event splitting of upstream bytes, and frame encoding.
//! - [`normalize`]: client `/v1/responses` body -> Codex upstream body
//!   (docs/protocol.md#request-bodies).
//! - `spans`: where values are in JSON the gateway already validated or wrote (a flat walk,
//!   no second strict parse): the top-level members of a body, the items of an array.
//! - [`bound`]: account-bound blobs (reasoning `encrypted_content`, compaction items) in a
//!   Responses body: fingerprints, and stripping the ones another account would refuse.
//! - [`classify`]: the one failure classifier for upstream errors (HTTP bodies and in-stream
//!   `response.failed`), docs/protocol.md#error-bodies.
//! - [`openai_error`]: OpenAI-shaped error bodies (`{"error":{"message","type","code"}}`).
//! - [`events`]: lazy extraction of the few fields the gateway reads from events.
//! - `turn`: the one dialect-neutral reading of a turn's upstream Responses events (text,
//!   reasoning and tool-argument deltas, tool calls, finished items, finish with its stop
//!   reason and usage, failure); both dialects' response sides translate from it.
//! - [`tools`] (tool-name limit and shortening), `effort` (reasoning-effort clamping) and
//!   `json` (hand-assembled JSON writers): request- and response-side helpers both dialects
//!   share.
//! - [`chat`]: `/v1/chat/completions` <-> Responses translation (request encoder, stream
//!   encoder, non-stream aggregator), docs/protocol.md#chat-completions-mapping.
//! - [`anthropic`]: `/v1/messages` <-> Responses translation (request, stream, aggregator,
//!   token estimate, Anthropic error shape).
//!
//! The two dialects are siblings: `chat` and `anthropic` never name each other; what they
//! share lives in the neutral modules above (`tests/tests/repo_docs.rs` checks it).

pub mod anthropic;
#[cfg(test)]
mod before;
pub mod bound;
pub mod chat;
pub mod classify;
pub mod depth;
mod effort;
pub mod events;
mod json;
pub mod normalize;
pub mod openai_error;
mod spans;
pub mod sse;
pub mod tools;
mod turn;
