//! The state one worker owns (`!Send`), handed by reference to everything on its hot path.
//!
//! # Key Components
//! - [`WorkerCtx`]: the worker's upstream client, metrics, the snapshot and catalog cells it
//!   reads, and the sender of facts to the sidecar with a local spool (facts are never dropped
//!   while the spool has room).
//! - [`ActiveGuard`]: counts a request in flight for the drain.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    rc::Rc,
    sync::Arc,
};

use shared_state::{
    snapshot::Health, AccountEffect, AccountEntry, EventSender, SharedSnapshot, WorkerEvent,
};

use crate::{
    config::GatewayConfig,
    metrics::{Registry, WorkerMetrics},
    upstream::Upstream,
};

/// Most control facts (account effects, refresh requests) kept locally while their queue is
/// full.
const SPOOL_LIMIT: usize = 1_000_000;
/// Most usage records kept locally while the usage queue is full (the sidecar's durable spool
/// at its bound): past it a record is dropped and counted (`codex_gateway_usage_dropped_total`).
pub const USAGE_SPOOL_LIMIT: usize = 100_000;

/// Per-worker state.
pub struct WorkerCtx {
    /// Worker index.
    pub id: usize,
    /// Configuration.
    pub cfg: Arc<GatewayConfig>,
    /// Snapshot cell.
    pub snapshot: SharedSnapshot,
    /// Health flags.
    pub health: Arc<Health>,
    /// This worker's upstream client.
    pub upstream: Rc<Upstream>,
    /// This worker's metrics.
    pub metrics: Arc<WorkerMetrics>,
    /// All workers' metrics (for `/metrics`).
    pub registry: Registry,
    /// Model catalog cell.
    pub catalog: shared_state::SharedCatalog,
    /// HTTP response transcripts (`previous_response_id`): the workers' shared store, and
    /// Redis when configured (other instances).
    pub transcripts: Rc<crate::transcripts::Transcripts>,
    /// Who minted which account-bound blob: the app's map, and Redis when configured.
    pub owners: Rc<crate::owners::Owners>,
    /// The configured identity header values, built once.
    pub wire: crate::connector::WireValues,
    events: EventSender,
    spool: RefCell<VecDeque<WorkerEvent>>,
    usage_spool: RefCell<VecDeque<WorkerEvent>>,
    draining: Cell<bool>,
    cursor: Cell<usize>,
    active: Cell<usize>,
}

// === impl WorkerCtx ===

impl WorkerCtx {
    /// The context of worker `id`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: usize,
        cfg: Arc<GatewayConfig>,
        snapshot: SharedSnapshot,
        health: Arc<Health>,
        upstream: Rc<Upstream>,
        metrics: Arc<WorkerMetrics>,
        registry: Registry,
        catalog: shared_state::SharedCatalog,
        events: EventSender,
        transcripts: Rc<crate::transcripts::Transcripts>,
        owners: Rc<crate::owners::Owners>,
    ) -> Self {
        Self {
            id,
            wire: crate::connector::WireValues::new(&cfg.wire),
            cfg,
            snapshot,
            health,
            upstream,
            metrics,
            registry,
            catalog,
            transcripts,
            owners,
            events,
            spool: RefCell::new(VecDeque::new()),
            usage_spool: RefCell::new(VecDeque::new()),
            draining: Cell::new(false),
            cursor: Cell::new(id),
            active: Cell::new(0),
        }
    }

    /// Applies an account effect decided on the data plane (live at once: the next pick
    /// already sees it) and reports it to the sidecar, which persists it.
    pub fn account_effect(&self, account: &AccountEntry, effect: AccountEffect) {
        account.live.apply(&effect);
        self.report(WorkerEvent::Account {
            account_id: account.id,
            effect,
        });
    }

    /// The access-log record of a request answered without a usage record: sent once, never
    /// spooled (a full queue drops it and counts): the access log never delays usage.
    pub fn report_access(&self, record: shared_state::UsageRecord) {
        if self
            .events
            .try_send(WorkerEvent::Access(Box::new(record)))
            .is_err()
        {
            self.events
                .stats()
                .access_log_dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sends a fact to the sidecar; a full queue spools it locally (facts are not dropped
    /// unless the spool itself overflows, which is logged and, for usage, counted). Usage
    /// records and control facts have separate queues and spools: a usage backlog never holds
    /// back an account effect or a refresh request.
    pub fn report(&self, ev: WorkerEvent) {
        let usage = ev.is_usage();
        let (mut spool, limit) = if usage {
            (self.usage_spool.borrow_mut(), USAGE_SPOOL_LIMIT)
        } else {
            (self.spool.borrow_mut(), SPOOL_LIMIT)
        };
        while let Some(old) = spool.pop_front() {
            if let Err(old) = self.events.try_send(old) {
                spool.push_front(old);
                break;
            }
        }
        if spool.is_empty() {
            if let Err(ev) = self.events.try_send(ev) {
                spool.push_back(ev);
            }
        } else if spool.len() < limit {
            spool.push_back(ev);
        } else if usage {
            let n = self
                .events
                .stats()
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n.is_multiple_of(10_000) {
                tracing::error!(
                    worker = self.id,
                    dropped_total = n + 1,
                    "usage spool full (sidecar spool at its bound); dropping a usage record"
                );
            }
        } else {
            tracing::error!(worker = self.id, "event spool full; dropping a fact");
        }
    }

    /// The usage path's counters (rendered in `/metrics`).
    pub fn usage_stats(&self) -> &Arc<shared_state::UsageStats> {
        self.events.stats()
    }

    /// Round-robin cursor for the candidate order.
    pub fn next_cursor(&self) -> usize {
        let c = self.cursor.get();
        self.cursor.set(c.wrapping_add(1));
        c
    }

    /// True once a drain started.
    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Starts the drain: connections finish their current request and close.
    pub fn start_drain(&self) {
        self.draining.set(true);
    }

    /// Requests in flight on this worker.
    pub fn active(&self) -> usize {
        self.active.get()
    }

    /// Counts a request in flight until the guard drops.
    pub fn request_started(&self) -> ActiveGuard<'_> {
        self.active.set(self.active.get() + 1);
        ActiveGuard(self)
    }

    /// Hands spooled facts to the sidecar queues while they have room.
    pub fn flush_spool(&self) {
        for spool in [&self.spool, &self.usage_spool] {
            let mut spool = spool.borrow_mut();
            while let Some(old) = spool.pop_front() {
                if let Err(old) = self.events.try_send(old) {
                    spool.push_front(old);
                    break;
                }
            }
        }
    }
}
/// A request in flight (see [`WorkerCtx::request_started`]).
pub struct ActiveGuard<'a>(&'a WorkerCtx);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get() - 1);
    }
}
