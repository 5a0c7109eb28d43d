//! Client API keys: generation format, the one hash both planes agree on, per-key limits,
//! the per-key live counters every worker shares, and the price table.
//!
//! # Key Components
//! - [`hash_key`]: SHA-256 of the full `sk-...` key; only this is stored and looked up.
//! - [`KEY_PREFIX`]: the prefix every gateway key carries.
//! - [`KeyLimits`]: what the operator set on a key (RPM, concurrency, token and cost budgets
//!   per UTC day and month, model allow-list, account group, service tier policy, expiry,
//!   enabled), published in the snapshot with each [`crate::ClientKey`].
//!   [`KeyLimits::service_tier_policy`] is the one rule for which service tier policy applies
//!   to a request (the key's, else the global setting).
//! - [`KeyLive`]: process-lifetime atomics of one key (in-flight requests, this minute's
//!   requests, today's and this month's requests/tokens/cost), shared by every worker and
//!   kept across snapshots like [`crate::AccountLive`]. Each windowed [`Counter`] holds a
//!   `synced` part (the fleet total at the last Redis reconciliation, or the stored usage
//!   loaded at start) and a `pending` part (this process's increments not pushed yet): the
//!   hot path reads `synced + pending` and never waits for anyone.
//! - [`PriceTable`]: USD per 1M tokens per model slug (input, cached input, output);
//!   [`PriceTable::cost_micros`] is the one cost rule.
//! - Periods: [`minute_of`], [`day_of`], [`month_of`] (UTC) and the ends of each.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};

use sha2::{Digest, Sha256};

use crate::snapshot::ServiceTierPolicy;

/// Every client key the gateway issues starts with this.
pub const KEY_PREFIX: &str = "sk-cg-";

/// The stored form of a client key: its SHA-256 digest. Keys are 192-bit random, so a plain
/// digest is not brute-forceable and keeps the per-request lookup to one hash.
pub fn hash_key(key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.finalize().into()
}

/// Hex form of [`hash_key`], as stored in the database.
pub fn hash_key_hex(key: &str) -> String {
    hex::encode(hash_key(key))
}

/// Limits an operator set on one client key. `None` / empty means "no limit".
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyLimits {
    /// Requests per minute (fixed UTC minute windows, fleet-wide through Redis).
    pub rpm: Option<u32>,
    /// Requests in flight at once (per instance).
    pub max_concurrency: Option<u32>,
    /// Tokens (input + output) per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Tokens (input + output) per UTC month.
    pub tokens_per_month: Option<u64>,
    /// Cost per UTC day, micro-USD.
    pub cost_per_day_micros: Option<u64>,
    /// Cost per UTC month, micro-USD.
    pub cost_per_month_micros: Option<u64>,
    /// Models the key may use (upstream slugs after alias resolution; a trailing `*` matches
    /// a prefix). Empty: every model.
    pub allowed_models: Vec<String>,
    /// The account group the key is served from; `None`: the shared pool (accounts without a
    /// group).
    pub account_group: Option<String>,
    /// What happens to this key's requests asking for the priority (`fast`) service tier;
    /// `None`: the global setting ([`crate::Settings::service_tier`]) applies.
    pub service_tier: Option<ServiceTierPolicy>,
    /// Expiry, Unix ms.
    pub expires_at_ms: Option<u64>,
    /// A disabled key is refused like an unknown one.
    pub enabled: bool,
}

// === impl KeyLimits ===

impl KeyLimits {
    /// No limits, enabled.
    pub fn unlimited() -> Self {
        Self {
            enabled: true,
            ..Self::default()
        }
    }

    /// Whether the key may authenticate at `now_ms` (enabled and not expired).
    pub fn usable_at(&self, now_ms: u64) -> bool {
        self.enabled && self.expires_at_ms.is_none_or(|e| now_ms < e)
    }

    /// The service tier policy for this key's requests: the key's own when set, else
    /// `global` (the published setting). The data plane asks only this.
    pub fn service_tier_policy(&self, global: ServiceTierPolicy) -> ServiceTierPolicy {
        self.service_tier.unwrap_or(global)
    }

    /// Whether `model` (the upstream slug) is allowed.
    pub fn allows_model(&self, model: &str) -> bool {
        self.allowed_models.is_empty()
            || self
                .allowed_models
                .iter()
                .any(|m| match m.strip_suffix('*') {
                    Some(prefix) => model.starts_with(prefix),
                    None => m == model,
                })
    }
}

/// One windowed counter: `synced` (fleet total at the last reconciliation, or stored usage)
/// plus `pending` (this process's increments since, pushed by the sidecar) plus `transit`
/// (increments a worker is writing to the fleet counter itself, see
/// [`Counter::add_transit`]), for the window `period`.
#[derive(Debug, Default)]
pub struct Counter {
    period: AtomicU64,
    synced: AtomicU64,
    pending: AtomicU64,
    transit: AtomicU64,
}

// === impl Counter ===

impl Counter {
    /// Moves the counter to `period` (zeroing it) when it holds an older window.
    fn roll(&self, period: u64) {
        let cur = self.period.load(Ordering::Acquire);
        if cur < period
            && self
                .period
                .compare_exchange(cur, period, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.synced.store(0, Ordering::Release);
            self.pending.store(0, Ordering::Release);
            self.transit.store(0, Ordering::Release);
        }
    }

    /// The total in `period` as this process knows it.
    pub fn value(&self, period: u64) -> u64 {
        self.roll(period);
        if self.period.load(Ordering::Acquire) != period {
            return 0;
        }
        self.synced
            .load(Ordering::Acquire)
            .saturating_add(self.pending.load(Ordering::Acquire))
            .saturating_add(self.transit.load(Ordering::Acquire))
    }

    /// Adds `n` in `period`.
    pub fn add(&self, period: u64, n: u64) {
        self.roll(period);
        if n > 0 && self.period.load(Ordering::Acquire) == period {
            self.pending.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Adds one when the total stays at or below `limit`; false (nothing added) otherwise.
    pub fn try_take(&self, period: u64, limit: u64) -> bool {
        self.roll(period);
        let mut p = self.pending.load(Ordering::Acquire);
        loop {
            if self.synced.load(Ordering::Acquire).saturating_add(p) >= limit {
                return false;
            }
            match self
                .pending
                .compare_exchange_weak(p, p + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => p = now,
            }
        }
    }

    /// Takes this process's increments in `period` for a push to the fleet counter; they stay
    /// counted (moved into `synced`) until [`Self::settle`] or [`Self::unpush`]. `None` when
    /// the counter is in another window.
    pub fn take_pending(&self, period: u64) -> Option<u64> {
        self.roll(period);
        if self.period.load(Ordering::Acquire) != period {
            return None;
        }
        let d = self.pending.swap(0, Ordering::AcqRel);
        self.synced.fetch_add(d, Ordering::AcqRel);
        Some(d)
    }

    /// The fleet total after the push (every instance's increments included).
    pub fn settle(&self, period: u64, fleet_total: u64) {
        if self.period.load(Ordering::Acquire) == period {
            self.synced.store(fleet_total, Ordering::Release);
        }
    }

    /// The push failed: the taken increments are pending again.
    pub fn unpush(&self, period: u64, delta: u64) {
        if self.period.load(Ordering::Acquire) == period {
            let _ = self
                .synced
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                    Some(s.saturating_sub(delta))
                });
            self.pending.fetch_add(delta, Ordering::AcqRel);
        }
    }

    /// Adds `n` in `period` that a worker is writing to the fleet counter itself: counted here
    /// at once, never pushed by the sidecar. [`Self::land`] ends it.
    pub fn add_transit(&self, period: u64, n: u64) {
        self.roll(period);
        if n > 0 && self.period.load(Ordering::Acquire) == period {
            self.transit.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Ends a transit of `n` taken by [`Self::add_transit`]: `Some(total)` when the fleet
    /// counter took it (the fleet total it answered, which includes it), `None` when the write
    /// failed (then the sidecar pushes it like any local increment). A transit of a window
    /// that has ended is dropped with its window.
    pub fn land(&self, period: u64, n: u64, fleet_total: Option<u64>) {
        if n == 0 || self.period.load(Ordering::Acquire) != period {
            return;
        }
        match fleet_total {
            Some(total) => {
                // The total first, then the transit: for a moment it counts twice (a refusal
                // too many), never zero times.
                self.synced.fetch_max(total, Ordering::AcqRel);
            }
            None => {
                self.pending.fetch_add(n, Ordering::AcqRel);
            }
        }
        let _ = self
            .transit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_sub(n))
            });
    }

    /// A fleet total read or written by a worker (it includes this process's synced part):
    /// raises what this process knows.
    pub fn observe(&self, period: u64, fleet_total: u64) {
        self.roll(period);
        if self.period.load(Ordering::Acquire) == period {
            self.synced.fetch_max(fleet_total, Ordering::AcqRel);
        }
    }

    /// This process's increments in `period` not pushed to the fleet counter yet.
    pub fn unpushed(&self, period: u64) -> u64 {
        self.roll(period);
        if self.period.load(Ordering::Acquire) != period {
            return 0;
        }
        self.pending.load(Ordering::Acquire)
    }

    /// The part of `period` this process knows the fleet has (synced), for seeding a fleet
    /// counter that is missing.
    pub fn synced(&self, period: u64) -> u64 {
        self.roll(period);
        if self.period.load(Ordering::Acquire) != period {
            return 0;
        }
        self.synced.load(Ordering::Acquire)
    }

    /// Sets the stored base of `period` (usage persisted before this process started).
    pub fn seed(&self, period: u64, stored: u64) {
        self.roll(period);
        if self.period.load(Ordering::Acquire) == period {
            self.synced.fetch_max(stored, Ordering::AcqRel);
        }
    }
}

/// What a budget period has used: requests, tokens, cost.
#[derive(Debug, Default)]
pub struct PeriodCounters {
    /// Requests finished.
    pub requests: Counter,
    /// Tokens (input + output).
    pub tokens: Counter,
    /// Cost, micro-USD.
    pub cost_micros: Counter,
}

/// One key's live state, shared by every worker and kept across snapshots.
#[derive(Debug, Default)]
pub struct KeyLive {
    in_flight: AtomicU32,
    /// Client WebSocket sessions open now (this process).
    ws_sessions: AtomicU32,
    /// Requests admitted in the current UTC minute.
    pub minute: Counter,
    /// Today (UTC).
    pub day: PeriodCounters,
    /// This month (UTC).
    pub month: PeriodCounters,
    last_used_ms: AtomicU64,
    /// Tokens reserved by this process's requests in flight (estimates, see [`Self::reserve`]).
    reserved_tokens: AtomicU64,
    /// Cost reserved by this process's requests in flight, micro-USD.
    reserved_cost: AtomicU64,
    /// Moving average of the tokens of this key's recent requests here (0: none seen yet).
    avg_tokens: AtomicU64,
    /// Moving average of their cost, micro-USD (0: none seen yet).
    avg_cost: AtomicU64,
}

/// What a budget reservation counts: tokens or cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Tokens (input + output).
    Tokens,
    /// Cost, micro-USD.
    Cost,
}

/// Weight of the newest request in the moving averages: 1/`AVG_WEIGHT`.
const AVG_WEIGHT: u64 = 4;

// === impl KeyLive ===

impl KeyLive {
    /// Takes a concurrency slot when fewer than `limit` are held (`None`: unlimited).
    pub fn try_enter(&self, limit: Option<u32>) -> bool {
        match limit {
            None => {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(l) => self
                .in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < l).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    /// Releases a slot taken by [`Self::try_enter`].
    pub fn leave(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Opens a WebSocket session when fewer than `limit` are open (0: unlimited).
    pub fn try_open_ws(&self, limit: u32) -> bool {
        self.ws_sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (limit == 0 || n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Closes a session opened by [`Self::try_open_ws`].
    pub fn close_ws(&self) {
        let _ = self
            .ws_sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// WebSocket sessions open now.
    pub fn ws_sessions(&self) -> u32 {
        self.ws_sessions.load(Ordering::Acquire)
    }

    /// Records a finished request at `now_ms` (counted against today's and this month's
    /// budgets).
    pub fn record(&self, now_ms: u64, tokens: u64, cost_micros: u64) {
        let (d, m) = (day_of(now_ms), month_of(now_ms));
        for (p, c) in [(d, &self.day), (m, &self.month)] {
            c.requests.add(p, 1);
            c.tokens.add(p, tokens);
            c.cost_micros.add(p, cost_micros);
        }
    }

    fn reserved_cell(&self, b: Budget) -> &AtomicU64 {
        match b {
            Budget::Tokens => &self.reserved_tokens,
            Budget::Cost => &self.reserved_cost,
        }
    }

    /// What this process's requests in flight hold of budget `b`.
    pub fn reserved(&self, b: Budget) -> u64 {
        self.reserved_cell(b).load(Ordering::Acquire)
    }

    /// Reserves `amount` of budget `b` when `check(reserved now)` allows it, atomically with
    /// every other reservation of this key in the process (a compare-and-swap loop: two
    /// workers cannot both pass on the same figure). The rule itself is the caller's
    /// (`gateway::limits`).
    pub fn reserve<E>(
        &self,
        b: Budget,
        amount: u64,
        check: impl Fn(u64) -> Result<(), E>,
    ) -> Result<(), E> {
        let cell = self.reserved_cell(b);
        let mut r = cell.load(Ordering::Acquire);
        loop {
            check(r)?;
            match cell.compare_exchange_weak(
                r,
                r.saturating_add(amount),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => r = now,
            }
        }
    }

    /// Gives back a reservation taken by [`Self::reserve`].
    pub fn unreserve(&self, b: Budget, amount: u64) {
        let _ = self
            .reserved_cell(b)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(amount))
            });
    }

    /// The moving average of budget `b` per request of this key here; 0 before any request
    /// with usage finished.
    pub fn average(&self, b: Budget) -> u64 {
        match b {
            Budget::Tokens => self.avg_tokens.load(Ordering::Acquire),
            Budget::Cost => self.avg_cost.load(Ordering::Acquire),
        }
    }

    /// Folds a finished request's usage into the moving averages (requests that reported no
    /// tokens, failures before any usage, are left out: they would pull the estimate to 0).
    pub fn learn(&self, tokens: u64, cost_micros: u64) {
        if tokens == 0 {
            return;
        }
        for (cell, x) in [(&self.avg_tokens, tokens), (&self.avg_cost, cost_micros)] {
            let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                Some(if a == 0 {
                    x.max(1)
                } else {
                    // a + (x - a) / w, in integers, never 0
                    (a.saturating_mul(AVG_WEIGHT - 1).saturating_add(x) / AVG_WEIGHT).max(1)
                })
            });
        }
    }

    /// Notes a use of the key.
    pub fn touch(&self, now_ms: u64) {
        self.last_used_ms.fetch_max(now_ms, Ordering::AcqRel);
    }

    /// The last use this process saw (Unix ms; 0: none).
    pub fn last_used_ms(&self) -> u64 {
        self.last_used_ms.load(Ordering::Acquire)
    }
}

const MINUTE_MS: u64 = 60_000;
const DAY_MS: u64 = 86_400_000;

/// The UTC minute of `ms` (minutes since the epoch).
pub fn minute_of(ms: u64) -> u64 {
    ms / MINUTE_MS
}

/// The end of minute `m`, Unix ms.
pub fn minute_end_ms(m: u64) -> u64 {
    (m + 1) * MINUTE_MS
}

/// The UTC day of `ms` (days since the epoch).
pub fn day_of(ms: u64) -> u64 {
    ms / DAY_MS
}

/// The start of day `d`, Unix ms.
pub fn day_start_ms(d: u64) -> u64 {
    d * DAY_MS
}

/// The UTC month of `ms` (`year * 12 + month0`).
pub fn month_of(ms: u64) -> u64 {
    let (y, m, _) = civil_from_days(day_of(ms) as i64);
    (y as u64) * 12 + (m as u64 - 1)
}

/// The start of month `p` (from [`month_of`]), Unix ms.
pub fn month_start_ms(p: u64) -> u64 {
    let (y, m) = ((p / 12) as i64, (p % 12) as u32 + 1);
    (days_from_civil(y, m, 1).max(0) as u64) * DAY_MS
}

// Howard Hinnant's civil calendar algorithms (proleptic Gregorian, UTC).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// USD per 1M tokens for one model.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Price {
    /// Uncached input tokens.
    pub input: f64,
    /// Cached input tokens.
    pub cached_input: f64,
    /// Output tokens (reasoning included).
    pub output: f64,
}

/// Prices per model slug. A model is priced by its exact slug, else by the longest slug that
/// is a prefix of it (`gpt-5.1-codex-max-xyz` -> `gpt-5.1-codex-max`), else by `default`.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceTable {
    /// By slug.
    pub models: HashMap<String, Price>,
    /// Models matching no slug.
    pub default: Price,
}

// === impl PriceTable ===

impl Default for PriceTable {
    /// OpenAI's published API prices (USD per 1M tokens) for the models Codex serves.
    fn default() -> Self {
        let p = |input, cached_input, output| Price {
            input,
            cached_input,
            output,
        };
        let models = [
            ("gpt-5", p(1.25, 0.125, 10.0)),
            ("gpt-5-codex", p(1.25, 0.125, 10.0)),
            ("gpt-5.1", p(1.25, 0.125, 10.0)),
            ("gpt-5.1-codex", p(1.25, 0.125, 10.0)),
            ("gpt-5.1-codex-max", p(1.25, 0.125, 10.0)),
            ("gpt-5.1-codex-mini", p(0.25, 0.025, 2.0)),
            ("gpt-5-mini", p(0.25, 0.025, 2.0)),
            ("gpt-5-nano", p(0.05, 0.005, 0.4)),
            ("gpt-5.2", p(1.75, 0.175, 14.0)),
            ("gpt-5.2-codex", p(1.75, 0.175, 14.0)),
            ("gpt-5.5", p(1.25, 0.125, 10.0)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Self {
            models,
            default: p(1.25, 0.125, 10.0),
        }
    }
}

impl PriceTable {
    /// The price of `model`.
    pub fn price(&self, model: &str) -> Price {
        if let Some(p) = self.models.get(model) {
            return *p;
        }
        self.models
            .iter()
            .filter(|(k, _)| model.starts_with(k.as_str()))
            .max_by_key(|(k, _)| k.len())
            .map_or(self.default, |(_, p)| *p)
    }

    /// The cost of one request in micro-USD: uncached input, cached input and output tokens
    /// at `model`'s prices (USD per 1M tokens = micro-USD per token). `input` includes the
    /// cached tokens, as the upstream reports them.
    pub fn cost_micros(&self, model: &str, input: u64, cached: u64, output: u64) -> u64 {
        let p = self.price(model);
        let cached = cached.min(input);
        let c = (input - cached) as f64 * p.input
            + cached as f64 * p.cached_input
            + output as f64 * p.output;
        if c.is_finite() && c > 0.0 {
            c.round() as u64
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_periods() {
        // 2026-11-30T17:00:00Z
        let t = 1_796_058_000_000u64;
        let m = month_of(t);
        assert_eq!(m, 2026 * 12 + 10);
        assert_eq!(month_start_ms(m), 1_793_491_200_000); // 2026-11-01
        assert_eq!(month_start_ms(m + 1), 1_796_083_200_000); // 2026-12-01
        assert_eq!(month_of(month_start_ms(m + 1)), m + 1);
        assert_eq!(month_of(month_start_ms(m + 1) - 1), m);
        assert_eq!(month_of(0), 1970 * 12);
        assert_eq!(
            month_start_ms(1971 * 12 + 1),
            2_678_400_000 + 31_536_000_000
        );
        assert_eq!(day_start_ms(day_of(t)), 1_795_996_800_000);
        assert_eq!(minute_end_ms(minute_of(t)), t + 60_000);
    }

    #[test]
    fn counter_limits_pushes_and_rolls() {
        let c = Counter::default();
        assert!(c.try_take(5, 2));
        assert!(c.try_take(5, 2));
        assert!(!c.try_take(5, 2));
        assert_eq!(c.value(5), 2);
        // a push keeps the total while in flight; the fleet total replaces it after
        assert_eq!(c.take_pending(5), Some(2));
        assert_eq!(c.value(5), 2);
        c.settle(5, 7);
        assert_eq!(c.value(5), 7);
        c.add(5, 1);
        let d = c.take_pending(5).unwrap_or_default();
        c.unpush(5, d);
        assert_eq!(c.value(5), 8);
        // a new window starts at zero; an old window's settle is ignored
        assert_eq!(c.value(6), 0);
        c.settle(5, 100);
        assert_eq!(c.value(6), 0);
        c.seed(6, 40);
        assert_eq!(c.value(6), 40);
    }

    #[test]
    fn transit_counts_at_once_and_lands_in_synced_or_pending() {
        let c = Counter::default();
        c.seed(5, 10);
        c.add_transit(5, 4);
        assert_eq!(c.value(5), 14);
        assert_eq!(c.unpushed(5), 0);
        // taken by the fleet counter: the total it answered replaces the transit
        c.land(5, 4, Some(20));
        assert_eq!(c.value(5), 20);
        // not taken: pending, for the sidecar's next push
        c.add_transit(5, 3);
        c.land(5, 3, None);
        assert_eq!(c.value(5), 23);
        assert_eq!(c.unpushed(5), 3);
        assert_eq!(c.synced(5), 20);
        // a fleet total seen by a worker only raises
        c.observe(5, 7);
        assert_eq!(c.value(5), 23);
        // an old window's landing is ignored
        c.add_transit(6, 2);
        c.land(5, 2, None);
        assert_eq!(c.value(6), 2);
    }

    #[test]
    fn reservations_are_taken_by_compare_and_swap_and_given_back() {
        let l = KeyLive::default();
        let fits = |r: u64| if r + 10 <= 25 { Ok(()) } else { Err(r) };
        assert_eq!(l.reserve(Budget::Tokens, 10, fits), Ok(()));
        assert_eq!(l.reserve(Budget::Tokens, 10, fits), Ok(()));
        assert_eq!(l.reserve(Budget::Tokens, 10, fits), Err(20));
        assert_eq!(l.reserved(Budget::Tokens), 20);
        assert_eq!(l.reserved(Budget::Cost), 0);
        l.unreserve(Budget::Tokens, 10);
        l.unreserve(Budget::Tokens, 50);
        assert_eq!(l.reserved(Budget::Tokens), 0);
    }

    #[test]
    fn concurrency_slots_and_usage() {
        let l = KeyLive::default();
        assert!(l.try_enter(Some(1)));
        assert!(!l.try_enter(Some(1)));
        l.leave();
        assert!(l.try_enter(Some(1)));
        assert_eq!(l.in_flight(), 1);
        let t = 1_796_058_000_000u64;
        l.record(t, 30, 1_000);
        l.record(t, 10, 500);
        assert_eq!(l.day.tokens.value(day_of(t)), 40);
        assert_eq!(l.month.cost_micros.value(month_of(t)), 1_500);
        assert_eq!(l.day.requests.value(day_of(t)), 2);
    }

    #[test]
    fn websocket_sessions_are_capped_and_given_back() {
        let l = KeyLive::default();
        assert!(l.try_open_ws(2));
        assert!(l.try_open_ws(2));
        assert!(!l.try_open_ws(2));
        assert_eq!(l.ws_sessions(), 2);
        l.close_ws();
        assert!(l.try_open_ws(2));
        // 0: no cap, still counted
        assert!(l.try_open_ws(0));
        assert_eq!(l.ws_sessions(), 3);
        for _ in 0..5 {
            l.close_ws();
        }
        assert_eq!(l.ws_sessions(), 0);
    }

    #[test]
    fn limits_allow_models_and_expire() {
        let mut k = KeyLimits::unlimited();
        assert!(k.allows_model("gpt-5"));
        k.allowed_models = vec!["gpt-5".into(), "gpt-5.1-codex*".into()];
        assert!(k.allows_model("gpt-5"));
        assert!(k.allows_model("gpt-5.1-codex-mini"));
        assert!(!k.allows_model("gpt-5-mini"));
        k.expires_at_ms = Some(100);
        assert!(k.usable_at(99));
        assert!(!k.usable_at(100));
        k.expires_at_ms = None;
        k.enabled = false;
        assert!(!k.usable_at(0));
    }

    #[test]
    fn the_keys_service_tier_policy_wins_over_the_global_one() {
        let mut k = KeyLimits::unlimited();
        for g in ServiceTierPolicy::ALL {
            assert_eq!(
                k.service_tier_policy(g),
                g,
                "unset follows the global setting"
            );
        }
        for own in ServiceTierPolicy::ALL {
            k.service_tier = Some(own);
            for g in ServiceTierPolicy::ALL {
                assert_eq!(k.service_tier_policy(g), own);
            }
        }
    }

    #[test]
    fn prices_by_slug_prefix_and_default() {
        let t = PriceTable::default();
        // 1M uncached input at 1.25 USD = 1_250_000 micro-USD
        assert_eq!(t.cost_micros("gpt-5", 1_000_000, 0, 0), 1_250_000);
        assert_eq!(t.cost_micros("gpt-5", 1_000, 1_000, 100), 125 + 1_000);
        assert_eq!(t.cost_micros("gpt-5-mini", 0, 0, 1_000_000), 2_000_000);
        assert_eq!(
            t.price("gpt-5.1-codex-mini-2"),
            t.price("gpt-5.1-codex-mini")
        );
        assert_eq!(t.price("unknown-model"), t.default);
        assert_eq!(t.cost_micros("gpt-5", 10, 50, 0), 1); // cached capped at input
    }

    #[test]
    fn hash_is_stable_and_distinct() {
        assert_eq!(hash_key("sk-cg-a"), hash_key("sk-cg-a"));
        assert_ne!(hash_key("sk-cg-a"), hash_key("sk-cg-b"));
        assert_eq!(hash_key_hex("sk-cg-a").len(), 64);
    }
}
