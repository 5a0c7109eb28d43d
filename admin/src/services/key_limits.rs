//! Fleet-wide per-key counters: reconciles each key's live counters
//! ([`shared_state::keys::KeyLive`]) with Redis, and stores `last_used_at`.
//!
//! # Key Components
//! - [`run`]: every [`SYNC_INTERVAL`], one pipelined round trip for every published key and
//!   every window (this minute's requests; today's and this month's requests, tokens and
//!   cost): `INCRBY codex-gateway:limits:<tag>:<kind>:<period> <local delta>` (plus `EXPIRE`)
//!   returns the fleet total, which replaces what this process knew. The first push of a
//!   budget window is preceded by `SET ... NX` with the stored usage, so a fleet that
//!   restarts (or a Redis that lost its data) starts from what storage says was spent.
//! - The workers never wait for this: they read `synced + pending + transit` from the
//!   atomics. When Redis is not configured or a round fails, deltas stay pending (pushed on
//!   the next good round) and each instance enforces every limit in full against the last
//!   fleet total it saw plus its own traffic since; [`shared_state::Health::key_limits_fleet`]
//!   says which mode is on (`/healthz` `key_limits`, metric `codex_gateway_key_limits_local`).
//! - Under a burst the fleet's limits are not decided from this reconciliation (500 ms is long
//!   enough for a burst to pass every instance's last total): with a worker-side Redis, a key
//!   with an RPM limit or a budget is admitted by `gateway::limits` in one atomic script on the
//!   same counters (RPM unit and budget reservation taken at once), and its finished requests'
//!   usage is added to them by the worker itself (`Counter::add_transit`, never pending, so
//!   never pushed twice). This task pushes what those paths left pending (Redis failed on the
//!   worker, keys without a budget) and refreshes every instance's view of the totals.
//!
//! # Error handling
//! A failed round puts its deltas back (nothing is lost or counted twice locally) and is
//! retried at the next tick; a failed `last_used_at` write is retried later.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use shared_state::keys::{self, Counter};
use tokio::sync::watch;

use super::{Leases, Store};

/// How often counters are reconciled with Redis.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// How often `last_used_at` is written (in sync ticks).
const TOUCH_EVERY: u32 = 10;
/// Bound on one reconciliation round trip.
const ROUND_TIMEOUT: Duration = Duration::from_secs(2);

/// One counter of one key in one window.
struct Slot<'a> {
    redis_key: String,
    counter: &'a Counter,
    period: u64,
    ttl_secs: u64,
    /// Seed the fleet counter with the stored usage the first time (budgets).
    seed: Option<(i64, u8)>,
    delta: u64,
}

/// Runs until `stop`.
pub(crate) async fn run(
    store: Store,
    health: Arc<shared_state::Health>,
    leases: Leases,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(SYNC_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // (key id, counter kind, period) windows already seeded in Redis by this process.
    let mut seeded: HashSet<(i64, u8, u64)> = HashSet::new();
    let mut flushed: HashMap<i64, u64> = HashMap::new();
    let mut ticks = 0u32;
    let mut was_fleet = None;
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopping {
            // Last push: what this instance counted reaches the fleet before it goes.
            if let Some(l) = leases.get() {
                let _ = round(l.connection(), &store, &mut seeded).await;
            }
            touch(&store, &mut flushed).await;
            return;
        }
        ticks = ticks.wrapping_add(1);
        let fleet = match leases.get() {
            None => false,
            Some(l) => {
                let conn = l.connection();
                round(conn, &store, &mut seeded).await
            }
        };
        health.set_key_limits_fleet(fleet);
        if was_fleet != Some(fleet) && leases.get().is_some() {
            if fleet {
                tracing::info!("per-key limits are enforced fleet-wide (Redis)");
            } else {
                tracing::warn!("per-key limits are enforced per instance until Redis answers");
            }
        }
        was_fleet = Some(fleet);
        if ticks.is_multiple_of(TOUCH_EVERY) {
            touch(&store, &mut flushed).await;
        }
    }
}

/// One reconciliation round; true when Redis took every delta.
async fn round(
    mut conn: redis::aio::ConnectionManager,
    store: &Store,
    seeded: &mut HashSet<(i64, u8, u64)>,
) -> bool {
    let snap = store.publisher.current();
    let now = shared_state::now_ms();
    let (minute, day, month) = (keys::minute_of(now), keys::day_of(now), keys::month_of(now));
    let mut slots: Vec<Slot<'_>> = Vec::with_capacity(snap.keys.len() * 7);
    for k in snap.keys.values() {
        let live = &*k.live;
        let (day_ttl, month_ttl) = (2 * 86_400, 33 * 86_400);
        let windows: [(u8, &str, &Counter, u64, u64, bool); 7] = [
            (0, "rpm", &live.minute, minute, 120, false),
            (1, "day_requests", &live.day.requests, day, day_ttl, true),
            (2, "day_tokens", &live.day.tokens, day, day_ttl, true),
            (3, "day_cost", &live.day.cost_micros, day, day_ttl, true),
            (
                4,
                "month_requests",
                &live.month.requests,
                month,
                month_ttl,
                true,
            ),
            (
                5,
                "month_tokens",
                &live.month.tokens,
                month,
                month_ttl,
                true,
            ),
            (
                6,
                "month_cost",
                &live.month.cost_micros,
                month,
                month_ttl,
                true,
            ),
        ];
        for (kind, name, counter, period, ttl_secs, seed) in windows {
            slots.push(Slot {
                redis_key: format!("codex-gateway:limits:{}:{name}:{period}", k.tag),
                counter,
                period,
                ttl_secs,
                seed: seed.then_some((k.id, kind)),
                delta: 0,
            });
        }
    }
    if slots.is_empty() {
        return true;
    }
    let mut pipe = redis::pipe();
    let mut seeding = Vec::new();
    // A counter already in a later window (clock stepped back) sits this round out.
    slots.retain_mut(|s| match s.counter.take_pending(s.period) {
        Some(d) => {
            s.delta = d;
            true
        }
        None => false,
    });
    for s in &slots {
        let d = s.delta;
        if let Some((id, kind)) = s.seed {
            if !seeded.contains(&(id, kind, s.period)) {
                // What storage said before this process counted anything (the pending part
                // was just taken into `synced`; a worker's transit is on its way to Redis by
                // itself and must not be seeded too).
                let base = s.counter.synced(s.period).saturating_sub(d);
                pipe.cmd("SET")
                    .arg(&s.redis_key)
                    .arg(base)
                    .arg("NX")
                    .arg("EX")
                    .arg(s.ttl_secs)
                    .ignore();
                seeding.push((id, kind, s.period));
            }
        }
        pipe.cmd("INCRBY").arg(&s.redis_key).arg(s.delta);
        pipe.cmd("EXPIRE")
            .arg(&s.redis_key)
            .arg(s.ttl_secs)
            .ignore();
    }
    let res: Result<Result<Vec<i64>, redis::RedisError>, _> =
        tokio::time::timeout(ROUND_TIMEOUT, pipe.query_async(&mut conn)).await;
    match res {
        Ok(Ok(totals)) if totals.len() == slots.len() => {
            for (s, total) in slots.iter().zip(totals) {
                s.counter
                    .settle(s.period, u64::try_from(total).unwrap_or(0));
            }
            seeded.extend(seeding);
            seeded.retain(|(_, kind, p)| match kind {
                1..=3 => *p >= day,
                _ => *p >= month,
            });
            true
        }
        other => {
            if let Ok(Err(e)) = &other {
                tracing::debug!(error = %e, "per-key counter reconciliation failed");
            }
            for s in &slots {
                if s.delta > 0 {
                    s.counter.unpush(s.period, s.delta);
                }
            }
            false
        }
    }
}

/// Writes `last_used_at` of keys used since the last write.
async fn touch(store: &Store, flushed: &mut HashMap<i64, u64>) {
    let snap = store.publisher.current();
    let uses: Vec<(i64, i64)> = snap
        .keys
        .values()
        .filter_map(|k| {
            let at = k.live.last_used_ms();
            (at > flushed.get(&k.id).copied().unwrap_or(0))
                .then(|| (k.id, i64::try_from(at).unwrap_or(i64::MAX)))
        })
        .collect();
    if uses.is_empty() {
        return;
    }
    match store.storage.touch_keys(&uses).await {
        Ok(()) => {
            for (id, at) in uses {
                flushed.insert(id, u64::try_from(at).unwrap_or(0));
            }
        }
        Err(e) => tracing::debug!(error = %e, "could not store keys' last use; retrying"),
    }
}
