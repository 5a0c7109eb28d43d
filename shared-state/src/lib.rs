//! Runtime-neutral state shared by the monoio data plane (`gateway`) and the Tokio sidecar (`admin`).
//!
//! # Key Components
//! - [`snapshot`]: immutable, versioned snapshots (accounts, client keys, settings) published
//!   through [`arc_swap::ArcSwap`] by the sidecar and `load()`ed by workers per request.
//! - [`account`]: the per-account live atomics every worker sees at once (in-flight count,
//!   cooldown, quota), the one vocabulary of account state changes ([`AccountEffect`]) with
//!   the one function applying them ([`AccountLive::apply`]), and the RAII
//!   [`account::Lease`] on a concurrency slot.
//! - [`board`]: the scheduler board (tier, score and candidate order per account), computed
//!   by the data plane's scheduler and handed to the sidecar as a function.
//! - [`channels`]: the worker -> sidecar fact channel and the sidecar -> worker command channels
//!   (crossbeam queues paired with a cross-runtime waker).
//! - [`config`]: start-up values the gateway's configuration parses and the sidecar uses
//!   ([`config::UsageConfig`]).
//! - [`forecast`]: quota forecast math (when accounts and the pool run out, when capacity
//!   returns) over the live quota atomics and the published burn rates.
//! - [`secret`]: [`secret::Secret`], a string that never reaches logs or `Debug` output, and
//!   [`secret::redact_url`].
//! - [`tasks`]: the sidecar's supervised tasks (restarts, failing) for `/healthz` and
//!   `/metrics`.
//! - [`transcripts`]: HTTP response transcripts for `previous_response_id`, shared by workers.
//! - [`ip_list`]: the data plane's IP allow-list (addresses and CIDR blocks, parsed once).
//! - [`jwt`] and [`keys`]: pure helpers both sides need (JWT claim decoding, client-key hashing).
//!
//! # Usage
//! Nothing here performs I/O or depends on a runtime, so both crates link it freely.

pub mod account;
pub mod board;
pub mod catalog;
pub mod channels;
pub mod config;
pub mod egress;
pub mod forecast;
pub mod ip_list;
pub mod jwt;
pub mod keys;
pub mod secret;
pub mod snapshot;
pub mod tasks;
pub mod transcripts;

pub use account::{AccountEffect, AccountLive, AccountStatus, Lease, QuotaUpdate};
pub use catalog::{ModelCatalog, SharedCatalog};
pub use channels::{
    usage_route, EventSender, Events, Transport, UsageRecord, UsageStats, WorkerCommand,
    WorkerEvent, WorkerMailbox, WorkerMailboxes,
};
pub use egress::{ProxyEntry, ProxyLive, ProxyUrl};
pub use secret::Secret;
pub use snapshot::{AccountEntry, ClientKey, Health, Settings, SharedSnapshot, Snapshot};
pub use tasks::{SidecarTasks, SidecarThread, TaskHealth};
pub use transcripts::TranscriptStore;

/// Milliseconds since the Unix epoch, the one clock unit used in live state.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
