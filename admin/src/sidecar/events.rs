//! The worker -> sidecar event loop.
//!
//! # Key Components
//! - [`run`]: waits on [`Events::wait`], drains, and persists:
//!   - [`WorkerEvent::Usage`] into a bounded in-memory spool flushed in batches
//!     ([`USAGE_BATCH`]); while storage is down the spool keeps the records and retries with
//!     backoff; when the spool is full the loop stops draining, so the crossbeam queue (and
//!     then the workers' own spools) absorb the backlog: usage is never dropped silently;
//!   - [`WorkerEvent::Account`] -> status (then republish) or cooldown persisted; quota
//!     observations coalesced per account, persisted; in-memory effects skipped;
//!   - [`WorkerEvent::RefreshRequest`] -> [`super::refresh::request`].
//!
//! # Error handling
//! Failures are logged with counts on transition (not per record). On shutdown the loop drains
//! everything and flushes for at most [`super::FLUSH_ON_SHUTDOWN`]; what still cannot be
//! written is reported as lost with its count.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use shared_state::{AccountEffect, AccountStatus, Events, UsageRecord, WorkerEvent};
use tokio::{sync::watch, time::Instant};

use super::Core;
use crate::storage::QuotaUpdate;

/// Most usage records kept in memory while storage is unreachable.
pub const USAGE_SPOOL_CAP: usize = 200_000;
/// Usage records per insert transaction.
pub const USAGE_BATCH: usize = 1_000;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Makes a record's client-supplied text storable everywhere: PostgreSQL refuses NUL in
/// `text`, and one such record would fail its whole batch, again and again, stalling every
/// usage record behind it.
fn storable(u: &mut UsageRecord) {
    let clean = |s: &mut String| {
        if s.contains('\0') {
            *s = s.replace('\0', "\u{FFFD}");
        }
    };
    clean(&mut u.model);
    if let Some(c) = u.error_code.as_mut() {
        clean(c);
    }
}

#[derive(Default)]
struct Pending {
    usage: VecDeque<UsageRecord>,
    effects: VecDeque<(i64, AccountEffect)>,
    quota: HashMap<i64, QuotaUpdate>,
    failures: u32,
    retry_at: Option<Instant>,
    persisted_usage: u64,
}

// === impl Pending ===

impl Pending {
    fn is_empty(&self) -> bool {
        self.usage.is_empty() && self.effects.is_empty() && self.quota.is_empty()
    }

    fn take(&mut self, core: &Arc<Core>, ev: WorkerEvent) {
        match ev {
            WorkerEvent::Usage(mut u) => {
                storable(&mut u);
                self.usage.push_back(u)
            }
            WorkerEvent::Account {
                account_id,
                effect: AccountEffect::Quota(u),
            } => {
                // Quota observations coalesce per account: the newest value of each field.
                let q = self.quota.entry(account_id).or_default();
                q.primary_pct = u.primary_pct.or(q.primary_pct);
                q.primary_reset_at = u.primary_reset_at.or(q.primary_reset_at);
                q.secondary_pct = u.secondary_pct.or(q.secondary_pct);
                q.secondary_reset_at = u.secondary_reset_at.or(q.secondary_reset_at);
            }
            WorkerEvent::Account { account_id, effect } if effect.is_persisted() => {
                self.effects.push_back((account_id, effect))
            }
            // In-memory effects (already applied by the worker that decided them).
            WorkerEvent::Account { .. } => {}
            WorkerEvent::RefreshRequest {
                account_id,
                seen_version,
            } => super::refresh::request(core, account_id, seen_version),
        }
    }

    fn backoff(&mut self) {
        self.failures = self.failures.saturating_add(1);
        let d = Duration::from_millis(500)
            .saturating_mul(1u32 << self.failures.min(6))
            .min(MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + d);
    }

    /// Writes what is pending; stops at the first storage failure (and backs off).
    async fn flush(&mut self, core: &Arc<Core>) {
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let storage = core.storage.as_ref();
        let mut republish = false;
        while let Some((id, effect)) = self.effects.front().cloned() {
            let res = match &effect {
                AccountEffect::Status(s) => storage.set_status(id, *s).await,
                AccountEffect::CooldownUntil { until_ms, reason } => {
                    storage
                        .set_cooldown(id, *until_ms, Some(reason.as_str()))
                        .await
                }
                // Only persisted effects are queued (`take`); quota is coalesced apart.
                _ => Ok(true),
            };
            match res {
                Ok(found) => {
                    if !found {
                        tracing::debug!(account = id, "account effect for a deleted account");
                    }
                    if let AccountEffect::Status(s) = effect {
                        republish = true;
                        if s != AccountStatus::Active {
                            tracing::warn!(
                                account = id,
                                status = s.as_str(),
                                "account status changed by the data plane"
                            );
                        }
                    }
                    self.effects.pop_front();
                }
                Err(e) => return self.failed("account effects", self.effects.len(), &e),
            }
        }
        if republish {
            core.republish().await;
        }
        let ids: Vec<i64> = self.quota.keys().copied().collect();
        for id in ids {
            let Some(q) = self.quota.get(&id).copied() else {
                continue;
            };
            match storage.record_quota(id, q).await {
                Ok(_) => {
                    self.quota.remove(&id);
                }
                Err(e) => return self.failed("quota", self.quota.len(), &e),
            }
        }
        while !self.usage.is_empty() {
            let n = self.usage.len().min(USAGE_BATCH);
            let batch = &self.usage.make_contiguous()[..n];
            match storage.insert_usage(batch).await {
                Ok(_) => {
                    self.usage.drain(..n);
                    self.persisted_usage += n as u64;
                }
                Err(e) => return self.failed("usage records", self.usage.len(), &e),
            }
        }
        if self.failures > 0 {
            tracing::info!(
                persisted_usage_total = self.persisted_usage,
                "storage writes recovered; spool flushed"
            );
        }
        self.failures = 0;
        self.retry_at = None;
    }

    fn failed(&mut self, what: &str, pending: usize, e: &crate::error::StorageError) {
        if self.failures == 0 {
            tracing::error!(
                error = %e,
                what,
                pending,
                spooled_usage = self.usage.len(),
                "cannot persist worker events; keeping them in memory and retrying"
            );
        } else {
            tracing::debug!(error = %e, what, pending, "persist retry failed");
        }
        self.backoff();
    }
}

/// The event loop; returns after the final flush once `stop` is set.
/// How long the sink lets facts accumulate after a wake-up before writing them.
const BATCH_WINDOW: Duration = Duration::from_millis(200);

pub(crate) async fn run(core: Arc<Core>, events: Events, mut stop: watch::Receiver<bool>) {
    let mut p = Pending::default();
    let mut last_full_warning: Option<Instant> = None;
    loop {
        let room = USAGE_SPOOL_CAP.saturating_sub(p.usage.len());
        let idle = if p.is_empty() {
            Duration::from_secs(3600)
        } else {
            p.retry_at
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_millis(250))
                .max(Duration::from_millis(50))
        };
        let woke_by_event = tokio::select! {
            _ = events.wait(), if room > 0 => true,
            _ = tokio::time::sleep(idle) => false,
            _ = stop.wait_for(|s| *s) => break,
        };
        if woke_by_event {
            // Let a batch form: one transaction per window instead of one per request
            // (benches/README.md, "next costs" 1).
            tokio::select! {
                _ = tokio::time::sleep(BATCH_WINDOW) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
        let room = USAGE_SPOOL_CAP.saturating_sub(p.usage.len());
        for ev in events.drain().take(room) {
            p.take(&core, ev);
        }
        if p.usage.len() >= USAGE_SPOOL_CAP
            && last_full_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
        {
            tracing::error!(
                spooled = p.usage.len(),
                "usage spool full; leaving events queued for the workers to hold"
            );
            last_full_warning = Some(Instant::now());
        }
        p.flush(&core).await;
    }

    // Shutdown: take everything still queued and flush within the budget.
    for ev in events.drain() {
        p.take(&core, ev);
    }
    p.retry_at = None;
    let deadline = Instant::now() + super::FLUSH_ON_SHUTDOWN;
    while !p.is_empty() && Instant::now() < deadline {
        p.retry_at = None;
        if tokio::time::timeout_at(deadline, p.flush(&core))
            .await
            .is_err()
        {
            break;
        }
        if !p.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if !p.is_empty() {
        tracing::error!(
            usage = p.usage.len(),
            effects = p.effects.len(),
            quota = p.quota.len(),
            "shutdown: storage unavailable; these worker events were not persisted"
        );
    } else {
        tracing::debug!(
            persisted_usage_total = p.persisted_usage,
            "event loop flushed"
        );
    }
}
