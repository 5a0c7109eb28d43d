//! The scheduler board: the data plane's own assessment of every account (health tier,
//! score, dynamic concurrency) and the candidate order it would use now, for the admin
//! API's ops page.
//!
//! # Key Components
//! - [`SchedulerBoard`] / [`BoardEntry`]: plain data, computed by `gateway::scheduler::board`
//!   (the one owner of the scoring rule and the strategies) over a snapshot and the live
//!   atomics its accounts carry.
//! - [`BoardFn`]: how the admin side gets it without depending on the data-plane crate: the
//!   gateway hands the function to the sidecar (`admin::SidecarConfig::scheduler_board`),
//!   and the ops endpoint calls it on the sidecar thread when polled. No worker does any
//!   work for it and the hot path never waits on it.

use std::sync::Arc;

use serde::Serialize;

use crate::Snapshot;

/// One account as the scheduler sees it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardEntry {
    /// Storage id.
    pub account_id: i64,
    /// 1-based place in the candidate order of the account's group (the shared pool or
    /// its client-key group); `None`: not a candidate now (inactive, cooling, paused by
    /// quota, excluded, or within its minimum request interval).
    pub position: Option<u32>,
    /// Health tier: `healthy`, `warm`, `risky` or `quarantine`.
    pub tier: &'static str,
    /// Score (higher is better; 100 for a fresh idle account).
    pub score: f64,
    /// Sum of the decayed penalties plus the failure-streak penalty.
    pub penalty: f64,
    /// Dynamic concurrency limit (0 = unlimited).
    pub limit: u32,
    /// Leases held now.
    pub in_flight: u32,
    /// A candidate that cannot serve at once (at its limit, or waiting for a refreshed
    /// token): it comes after every ready one.
    pub deferred: bool,
}

/// Every account of a snapshot, in the scheduler's candidate order first (by position,
/// groups interleaved), then the accounts that are not candidates now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchedulerBoard {
    /// The strategy the order follows.
    pub strategy: &'static str,
    /// The snapshot it was computed over.
    pub snapshot_version: u64,
    /// The clock of the assessment (ms since epoch).
    pub now_ms: u64,
    /// One entry per account of the snapshot.
    pub entries: Vec<BoardEntry>,
}

/// Computes the board of a snapshot at a clock (`gateway::scheduler::board`).
pub type BoardFn = fn(&Arc<Snapshot>, u64) -> SchedulerBoard;
