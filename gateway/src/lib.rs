//! codex-gateway's data plane: per-core monoio workers serving OpenAI-compatible APIs in
//! front of a pool of ChatGPT Codex accounts.
//!
//! # Key Components
//! - [`app`]: process wiring ([`app::App::spawn`]) shared by the binary and the tests.
//! - [`worker`]: thread-per-core workers (io_uring with legacy fallback, SO_REUSEPORT).
//! - [`server`]: our HTTP/1.1 server codec with per-event SSE flushing.
//! - [`routes`]: the API layer (`/v1/responses`, `/v1/models`, `/healthz`, `/metrics`).
//! - [`lifecycle`]: Request -> Attempt -> Stream with the commit barrier.
//! - [`policy`]: account effects of classified failures.
//! - [`scheduler`]: the frozen candidate order (strategies, health tiers, dynamic concurrency).
//! - [`upstream`]: HTTP/2 (TLS, h2c) and streaming HTTP/1.1 client to the Codex backend.
//! - [`wire`]: HTTP/1.1 wire primitives shared by server and client (appending reads, strict
//!   chunk framing).
//! - [`error`]: the one error type and its one OpenAI-shaped rendering.
//! - [`config`], [`metrics`], [`models`], [`demo`].
//!
//! See `docs/architecture.md` for the request lifecycle chart.

pub mod app;
pub mod chat;
pub mod config;
pub mod ctx;
pub mod demo;
pub mod error;
pub mod lifecycle;
pub mod metrics;
pub mod models;
pub mod policy;
pub mod routes;
pub mod scheduler;
pub mod server;
#[cfg(test)]
pub(crate) mod testing;
pub mod upstream;
pub mod wire;
pub mod worker;
