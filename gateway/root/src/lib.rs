//! codex-gateway's composition root: the one crate that links the data plane (`gateway`), the
//! sidecar (`admin`) and, for `demo`, the mock upstream (`benches`). The `gateway` library
//! links neither (`tests/tests/deploy.rs` checks the dependency graph).
//!
//! # Key Components
//! - [`app`]: process wiring ([`app::App::spawn`]) shared by the binary and the tests.
//! - [`config`]: the process configuration (flags, environment, file, defaults), validated
//!   into each component's slice ([`config::Config`]).
//! - [`demo`]: `codex-gateway demo`, the gateway in front of a built-in mock-codex (the `demo`
//!   feature, on by default; without it the binary links no part of the harness).
//! - the bin `codex-gateway` (`src/main.rs`): the clap CLI over [`app`], [`demo`] and the
//!   sidecar's blocking helpers (`admin::cli`).

pub mod app;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
