//! codex-gateway's data plane: per-core monoio workers serving OpenAI-compatible APIs in
//! front of a pool of ChatGPT Codex accounts.
//!
//! This library links neither the sidecar (`admin`) nor the test harness (`benches`): the
//! composition root (`gateway/root`, package `codex-gateway`) starts the sidecar and hands
//! each worker what it publishes ([`worker::WorkerSeed`]: snapshot and catalog cells, the
//! fact and command channels of `shared-state`), then runs [`worker::run`].
//!
//! # Key Components
//! - [`worker`]: thread-per-core workers (io_uring with legacy fallback, SO_REUSEPORT).
//! - [`server`]: our HTTP/1.1 server codec with per-event SSE flushing.
//! - [`api`]: the API layer, one file per surface (`/v1/responses`, `/v1/chat/completions`,
//!   `/v1/models`, `/healthz`, `/metrics`).
//! - [`pipeline`]: the one post-commit forward loop (upstream events -> encoder -> sink) and
//!   the usage guard.
//! - [`ctx`]: the state one worker owns.
//! - [`deadline`]: coarse per-worker deadlines for the idle waits of open streams.
//! - [`lifecycle`]: Request -> Attempt -> Stream with the commit barrier, generic over the
//!   upstream [`connector::Connector`].
//! - [`connector`]: the upstream seam, and the Codex backend (client and account identity) as
//!   its one implementation.
//! - [`policy`]: what a classified failure does: account effects, and the attempt loop's
//!   retry decision (`policy::decide`).
//! - [`scheduler`]: the frozen candidate order (strategies, health tiers, dynamic concurrency).
//! - [`upstream`]: HTTP/2 (TLS, h2c) and streaming HTTP/1.1 client to the Codex backend.
//! - [`wire`]: HTTP/1.1 wire primitives shared by server and client (appending reads, strict
//!   chunk framing).
//! - [`ws`]: the WebSocket protocol, sans IO (handshake, framing, permessage-deflate).
//! - [`front_door`]: request rates (instance, client IP) and the IP allow-list, before routing.
//! - [`error`]: the one error type and its one OpenAI-shaped rendering.
//! - [`request_id`]: the gateway request id (`x-request-id`) of every request and WebSocket turn.
//! - [`config`], [`metrics`], [`models`], [`logging`].
//!
//! See `docs/architecture.md` for the request lifecycle chart.

pub mod api;
pub mod config;
pub mod connector;
pub mod ctx;
pub mod deadline;
pub mod error;
pub mod front_door;
pub mod lifecycle;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod models;
pub mod owners;
pub mod pipeline;
pub mod policy;
pub mod redis;
pub mod request_id;
pub mod scheduler;
pub mod server;
#[cfg(test)]
pub(crate) mod testing;
pub mod transcripts;
pub mod upstream;
pub mod wire;
pub mod worker;
pub mod ws;
