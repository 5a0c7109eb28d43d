//! The worker -> sidecar event loops.
//!
//! # Key Components
//! - [`control_loop`] and [`usage_loop`]: two loops over the two queues of [`Events`], so a usage backlog (a database
//!   outage, a full spool) never delays an account event or a refresh request:
//!   - the **control** loop: [`WorkerEvent::Account`] -> status (then republish) or cooldown
//!     persisted; quota observations coalesced per account, persisted at most every
//!     [`QUOTA_EVERY`]; in-memory effects
//!     skipped; [`WorkerEvent::RefreshRequest`] -> [`super::refresh::request`] at once;
//!   - the **usage** loop: records go into the durable [`Spool`] as soon as they arrive (one
//!     write per wake-up, at most one wake-up per [`INTAKE_EVERY`]), then into the database in batches of [`USAGE_BATCH`] after a short
//!     window ([`BATCH_WINDOW`]), with their hourly rollups; while storage is down the spool
//!     keeps them (on disk, bounded) and the loop retries with backoff; at the spool's bound
//!     the loop stops taking records off the queue (see [`crate::spool`]). Retention prunes
//!     raw records and rollups hourly ([`UsageConfig`]). Each record taken also becomes
//!     an access-log line when `[access_log]` is on ([`crate::access_log`]).
//!
//! # Error handling
//! Failures are logged with counts on transition (not per record). On shutdown both loops
//! drain and flush for at most [`super::FLUSH_ON_SHUTDOWN`]; usage records still not in the
//! database stay in the spool file and are replayed at the next start.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use shared_state::{AccountEffect, AccountStatus, Events, UsageRecord, WorkerEvent};
use tokio::{sync::watch, time::Instant};

use super::{Refresher, Store};
use crate::{access_log::AccessLog, spool::Spool, storage::QuotaUpdate, UsageConfig};

/// Most usage records mirrored in memory (the rest is read back from the spool file).
pub const USAGE_MEM_CAP: usize = 50_000;
/// Usage records per insert transaction.
pub const USAGE_BATCH: usize = 1_000;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long the usage loop lets records accumulate after a wake-up before writing them to
/// the database (they are in the spool file at once).
pub const BATCH_WINDOW: Duration = Duration::from_millis(200);
/// The shortest time between two intakes of the usage queue: a record that arrives within
/// this of the last intake waits for the next one, so under load the sidecar wakes (and
/// writes the spool) about every `INTAKE_EVERY` instead of once per record, and the
/// workers' `notify_one` finds no waiter to wake (an atomic store, no syscall). An isolated
/// record is taken at once.
pub const INTAKE_EVERY: Duration = Duration::from_millis(10);
/// How often the data plane's quota observations are written (coalesced per account, the
/// newest value of each field): every response carries them, and one `UPDATE` per response
/// was most of the sidecar's storage work under load. The workers apply them to the live
/// account state at once; only the stored copy (other instances, restarts) waits.
pub const QUOTA_EVERY: Duration = Duration::from_secs(1);
/// How often retention runs.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

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
    for c in [
        u.error_code.as_mut(),
        u.reasoning_effort.as_mut(),
        u.service_tier.as_mut(),
        u.error_class.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        clean(c);
    }
    if u.id == 0 {
        u.id = UsageRecord::new_id();
    }
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
}

// === impl Backoff ===

impl Backoff {
    fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        let d = Duration::from_millis(500)
            .saturating_mul(1u32 << self.failures.min(6))
            .min(MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + d);
    }

    fn waiting(&self) -> bool {
        self.retry_at.is_some_and(|t| Instant::now() < t)
    }
}

/// Control facts waiting to be persisted.
#[derive(Default)]
struct Pending {
    effects: VecDeque<(i64, AccountEffect)>,
    quota: HashMap<i64, QuotaUpdate>,
    /// When quota observations were last written ([`QUOTA_EVERY`]).
    quota_written: Option<Instant>,
    backoff: Backoff,
}

// === impl Pending ===

impl Pending {
    fn is_empty(&self) -> bool {
        self.effects.is_empty() && self.quota.is_empty()
    }

    /// When pending quota observations are due to be written (`None`: none pending).
    fn quota_due(&self) -> Option<Instant> {
        if self.quota.is_empty() {
            return None;
        }
        Some(
            self.quota_written
                .map_or_else(Instant::now, |t| t + QUOTA_EVERY),
        )
    }

    fn take(&mut self, refresh: &Arc<Refresher>, ev: WorkerEvent) {
        match ev {
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
            } => super::refresh::request(refresh, account_id, seen_version),
            // Usage has its own queue; a stray record is not lost either.
            WorkerEvent::Usage(u) | WorkerEvent::Access(u) => {
                tracing::debug!(key = u.key_id, "usage record on the control queue");
            }
        }
    }

    /// Writes what is pending (quota only when due, or with `all`); stops at the first
    /// storage failure (and backs off).
    async fn flush(&mut self, store: &Store, all: bool) {
        if self.backoff.waiting() {
            return;
        }
        let storage = store.storage.as_ref();
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
                    // The other instances apply it at once (`crate::pubsub`).
                    store.publisher.announce();
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
            store.republish().await;
        }
        if !all && self.quota_due().is_some_and(|t| Instant::now() < t) {
            return self.persisted();
        }
        let ids: Vec<i64> = self.quota.keys().copied().collect();
        for &id in &ids {
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
        if !ids.is_empty() {
            self.quota_written = Some(Instant::now());
        }
        self.persisted();
    }

    /// Storage took what was written: the backoff ends.
    fn persisted(&mut self) {
        if self.backoff.failures > 0 {
            tracing::info!("account effects persisted again");
        }
        self.backoff = Backoff::default();
    }

    fn failed(&mut self, what: &str, pending: usize, e: &crate::error::StorageError) {
        if self.backoff.failures == 0 {
            tracing::error!(
                error = %e,
                what,
                pending,
                "cannot persist account events; keeping them in memory and retrying"
            );
        } else {
            tracing::debug!(error = %e, what, pending, "persist retry failed");
        }
        self.backoff.failed();
    }
}

/// Orders an operator's account action after the data-plane facts decided before it.
///
/// A worker queues an account effect (a cooldown, a status) when it decides it, and the
/// control loop persists it up to [`INTAKE_EVERY`] later. An operator who enables an account
/// (or resets its health) right after a failure would otherwise have the failure's cooldown
/// stored after the enable and undo it. The admin handlers call [`Settle::wait`] first: it
/// returns once every effect queued before the call has been persisted (or after `max`, when
/// the loop cannot: storage down, loop restarting), so the operator's write comes last.
#[derive(Default)]
pub(crate) struct Settle {
    /// Tickets handed out; the loop serves all of them that exist when it drains.
    asked: AtomicU64,
    wake: tokio::sync::Notify,
    /// The highest ticket whose effects were persisted (or attempted).
    done: watch::Sender<u64>,
}

// === impl Settle ===

impl Settle {
    /// Waits until the effects queued before this call are persisted; false on timeout.
    pub async fn wait(&self, max: Duration) -> bool {
        let mut done = self.done.subscribe();
        let ticket = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        self.wake.notify_one();
        tokio::time::timeout(max, done.wait_for(|d| *d >= ticket))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The tickets the loop's next drain serves (read before the drain: an effect queued
    /// before a ticket was taken is in the queue by then).
    fn pending(&self) -> Option<u64> {
        let asked = self.asked.load(Ordering::SeqCst);
        (asked > *self.done.borrow()).then_some(asked)
    }
}

/// The control loop (account effects, quota, refresh requests); returns after its final
/// flush once `stop` is set. Supervised on its own (`events.control`), so a crash of the
/// usage loop never stops account events, and the reverse.
pub(crate) async fn control_loop(
    store: Store,
    settle: Arc<Settle>,
    refresh: Arc<Refresher>,
    events: Arc<Events>,
    mut stop: watch::Receiver<bool>,
) {
    let mut p = Pending::default();
    let mut last_intake: Option<Instant> = None;
    loop {
        let idle = if p.is_empty() {
            Duration::from_secs(3600)
        } else if let Some(t) = p.backoff.retry_at {
            t.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(50))
        } else if !p.effects.is_empty() {
            Duration::from_millis(250)
        } else {
            // Only quota observations: when they are due.
            p.quota_due().map_or(Duration::from_millis(250), |t| {
                t.saturating_duration_since(Instant::now())
            })
        };
        tokio::select! {
            _ = events.wait_control() => {}
            _ = settle.wake.notified() => {}
            _ = tokio::time::sleep(idle) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let mut settling = settle.pending();
        if let Some(next) = last_intake.map(|t| t + INTAKE_EVERY) {
            if settling.is_none() && Instant::now() < next {
                // As the usage loop: the facts of the next few milliseconds join these (an
                // operator waiting on `Settle` ends the wait at once).
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = settle.wake.notified() => settling = settle.pending(),
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
        for ev in events.drain_control() {
            p.take(&refresh, ev);
        }
        last_intake = Some(Instant::now());
        p.flush(&store, false).await;
        if let Some(t) = settling {
            settle.done.send_replace(t);
        }
    }
    // Operators waiting now get their answer at once (their own write follows the final
    // flush's or is refused with storage).
    settle
        .done
        .send_replace(settle.asked.load(Ordering::SeqCst));
    for ev in events.drain_control() {
        p.take(&refresh, ev);
    }
    let deadline = Instant::now() + super::FLUSH_ON_SHUTDOWN;
    while !p.is_empty() && Instant::now() < deadline {
        p.backoff.retry_at = None;
        if tokio::time::timeout_at(deadline, p.flush(&store, true))
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
            effects = p.effects.len(),
            quota = p.quota.len(),
            "shutdown: storage unavailable; these account events were not persisted"
        );
    }
}

/// The usage side: the durable spool, or (when the spool file cannot be created) memory.
struct Usage {
    spool: Option<Spool>,
    /// Used only without a spool file (bounded by [`USAGE_MEM_CAP`]).
    mem: VecDeque<UsageRecord>,
    stats: Arc<shared_state::UsageStats>,
    backoff: Backoff,
    /// When the oldest record not yet in the database arrived.
    since: Option<Instant>,
    /// The access log (names from the published snapshot), when on.
    access: Option<(AccessLog, Store)>,
}

// === impl Usage ===

impl Usage {
    fn has_room(&self) -> bool {
        match &self.spool {
            Some(s) => s.has_room(),
            None => self.mem.len() < USAGE_MEM_CAP,
        }
    }

    fn pending(&self) -> u64 {
        match &self.spool {
            Some(s) => s.pending(),
            None => self.mem.len() as u64,
        }
    }

    /// Takes records off the queue while there is room; spools them (one write).
    fn intake(&mut self, events: &Events) -> usize {
        let mut taken = 0;
        while self.has_room() {
            let mut batch = Vec::new();
            // Requests answered without a usage record: an access-log line only.
            let mut access_only = Vec::new();
            let mut drained = 0;
            for ev in events.drain_usage().take(USAGE_BATCH) {
                drained += 1;
                match ev {
                    WorkerEvent::Usage(u) => {
                        let mut u = *u;
                        storable(&mut u);
                        batch.push(u);
                    }
                    WorkerEvent::Access(u) => access_only.push(*u),
                    _ => {}
                }
            }
            if drained == 0 {
                break;
            }
            if let Some((log, store)) = &self.access {
                let snap = store.publisher.current();
                for u in batch.iter().chain(&access_only) {
                    log.push(crate::access_log::line(u, &snap));
                }
            }
            if batch.is_empty() {
                continue;
            }
            taken += batch.len();
            match &mut self.spool {
                Some(s) => s.append(batch),
                None => {
                    self.stats
                        .spooled_records
                        .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    self.mem.extend(batch);
                }
            }
        }
        if let Some(s) = &mut self.spool {
            s.sync_soon();
        }
        if taken > 0 && self.since.is_none() {
            self.since = Some(Instant::now());
        }
        taken
    }

    /// Inserts what is pending, batch by batch; stops at the first failure (and backs off).
    async fn flush(&mut self, store: &Store) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.backoff.waiting() {
            return;
        }
        loop {
            // The records are inserted from where they are (the spool's batch, the memory
            // queue): no copy per record.
            let batch = match &mut self.spool {
                Some(s) => match s.next_batch(USAGE_BATCH) {
                    Ok(Some(b)) => Some(b),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the usage spool");
                        self.backoff.failed();
                        return;
                    }
                },
                None => {
                    if self.mem.is_empty() {
                        break;
                    }
                    None
                }
            };
            let records: &[UsageRecord] = match &batch {
                Some(b) => &b.records,
                None => {
                    let n = self.mem.len().min(USAGE_BATCH);
                    &self.mem.make_contiguous()[..n]
                }
            };
            let n = records.len();
            let res = if n == 0 {
                Ok(0)
            } else {
                store.storage.insert_usage(records).await
            };
            match res {
                Ok(inserted) => {
                    self.stats.persisted.fetch_add(inserted as u64, Relaxed);
                    self.stats
                        .duplicates
                        .fetch_add(n.saturating_sub(inserted) as u64, Relaxed);
                    match (batch, &mut self.spool) {
                        (Some(b), Some(s)) => {
                            if let Err(e) = s.committed(b) {
                                tracing::error!(error = %e, "cannot truncate the usage spool");
                            }
                        }
                        _ => {
                            self.mem.drain(..n);
                            self.stats.spooled_records.fetch_sub(n as u64, Relaxed);
                        }
                    }
                }
                Err(e) => {
                    if self.backoff.failures == 0 {
                        tracing::error!(
                            error = %e,
                            pending = self.pending(),
                            "cannot persist usage records; they stay in the spool and are retried"
                        );
                    }
                    self.backoff.failed();
                    return;
                }
            }
        }
        if self.backoff.failures > 0 {
            tracing::info!(
                persisted_total = self.stats.persisted.load(Relaxed),
                "usage records persisted again; spool flushed"
            );
        }
        self.backoff = Backoff::default();
        self.since = None;
    }
}

async fn prune(store: &Store, cfg: &UsageConfig) {
    let now = crate::storage::now_ms_i64();
    let day = 86_400_000i64;
    let before = |days: u32| (days > 0).then(|| now - i64::from(days) * day);
    let (raw, rollup) = (
        before(cfg.retention_days),
        before(cfg.rollup_retention_days),
    );
    if raw.is_none() && rollup.is_none() {
        return;
    }
    match store.storage.prune_usage(raw, rollup).await {
        Ok((r, h)) if r > 0 || h > 0 => {
            tracing::info!(records = r, rollups = h, "usage retention pruned old rows")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "usage retention failed; retrying later"),
    }
}

/// The usage loop over the durable spool; returns after its final flush once `stop` is set.
/// Supervised (`events.usage`): a run that crashes drops its [`Spool`], whose file (no longer
/// locked) the next run's spool adopts and replays, so no record the loop took is lost.
pub(crate) async fn usage_loop(
    store: Store,
    events: Arc<Events>,
    spool: Option<Spool>,
    cfg: UsageConfig,
    access: Option<AccessLog>,
    mut stop: watch::Receiver<bool>,
) {
    let mut u = Usage {
        stats: Arc::clone(events.stats()),
        spool,
        mem: VecDeque::new(),
        backoff: Backoff::default(),
        since: None,
        access: access.map(|a| (a, store.clone())),
    };
    if u.pending() > 0 {
        // Replayed records from an earlier process: in the database as soon as possible.
        u.since = Some(Instant::now() - BATCH_WINDOW);
    }
    let mut last_full_warning: Option<Instant> = None;
    let mut last_intake: Option<Instant> = None;
    let mut next_prune = Instant::now() + Duration::from_secs(60);
    loop {
        // When to write to the database next: the batch window after the oldest pending
        // record, or the backoff.
        let due = match (u.since, u.pending() > 0) {
            (_, false) => None,
            (Some(t), true) => Some((t + BATCH_WINDOW).max(u.backoff.retry_at.unwrap_or(t))),
            (None, true) => Some(u.backoff.retry_at.unwrap_or_else(Instant::now)),
        };
        let mut wake = due.map_or(next_prune, |d| d.min(next_prune));
        if let Some(s) = &mut u.spool {
            // Bytes written since the last fdatasync get theirs within SYNC_EVERY.
            s.sync_soon();
            if s.needs_sync() {
                wake = wake.min(Instant::now() + crate::spool::SYNC_EVERY);
            }
        }
        let room = u.has_room();
        tokio::select! {
            _ = events.wait_usage(), if room => {}
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        if let Some(next) = last_intake.map(|t| t + INTAKE_EVERY) {
            if Instant::now() < next {
                // Let the records of the next few milliseconds join this one (the stop
                // path below takes whatever is queued).
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
        u.intake(&events);
        last_intake = Some(Instant::now());
        if !u.has_room()
            && events.usage_queued() > 0
            && last_full_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
        {
            tracing::error!(
                spooled = u.pending(),
                queued = events.usage_queued(),
                "usage spool full; records wait in the queue and the workers' spools"
            );
            last_full_warning = Some(Instant::now());
        }
        let now = Instant::now();
        if u.since.is_some_and(|t| now >= t + BATCH_WINDOW) && !u.backoff.waiting() {
            u.flush(&store).await;
            // Room again: take what waited, so it is spooled before the next wait.
            u.intake(&events);
        }
        if now >= next_prune {
            prune(&store, &cfg).await;
            next_prune = Instant::now() + PRUNE_EVERY;
        }
    }

    // Shutdown: spool everything still queued, then flush within the budget; what cannot be
    // written stays in the spool file for the next start.
    u.intake(&events);
    let deadline = Instant::now() + super::FLUSH_ON_SHUTDOWN;
    while u.pending() > 0 && Instant::now() < deadline {
        u.backoff.retry_at = None;
        if tokio::time::timeout_at(deadline, u.flush(&store))
            .await
            .is_err()
        {
            break;
        }
        if u.pending() > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        u.intake(&events);
    }
    if let Some(s) = &u.spool {
        if u.pending() > 0 {
            tracing::warn!(
                usage = u.pending(),
                spool = %s.path().display(),
                "shutdown: storage unavailable; usage records stay in the spool and are replayed at the next start"
            );
        }
        if let Err(e) = std::fs::File::open(s.path()).and_then(|f| f.sync_all()) {
            tracing::warn!(error = %e, "usage spool final sync failed");
        }
    } else if u.pending() > 0 {
        tracing::error!(
            usage = u.pending(),
            "shutdown: storage unavailable; these usage records were not persisted"
        );
    }
}
