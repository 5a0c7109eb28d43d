//! Account health: what the live feedback says about one account right now.
//!
//! # Key Components
//! - [`FailureKind`]: the failure families that leave a decaying penalty, mapped from
//!   [`FailureClass`] (plus the transport's timeouts and connect failures).
//! - [`record_success`] / [`record_failure`]: lock-free feedback updates (penalties, EWMAs,
//!   streaks) the lifecycle calls after each attempt.
//! - [`assess`]: tier, score and dynamic concurrency of one account at `now_ms`.
//! - [`effective_limit`]: the concurrency limit to pass to `AccountLive::try_acquire`.
//!
//! # Usage
//! Penalties only change the *order* of candidates and the dynamic concurrency; whether an
//! account may be picked at all (status, cooldown) stays with `crate::policy`.

use std::{sync::atomic::Ordering, time::Duration};

use codex_protocol::classify::FailureClass;
use shared_state::{AccountEntry, AccountLive, Settings};

/// Exponential decay halves a penalty every `half_life`; `weight` is what one failure adds.
#[derive(Debug, Clone, Copy)]
struct PenaltySpec {
    weight: f64,
    half_life_ms: u64,
}

const MIN: u64 = 60_000;

/// One spec per [`FailureKind`], indexed by `kind as usize` (a penalty slot in
/// `shared_state::account::SchedulerLive::penalties`).
const SPECS: [PenaltySpec; FailureKind::COUNT] = [
    // Auth: 401 / deactivated; a dead token is a strong signal.
    PenaltySpec {
        weight: 50.0,
        half_life_ms: 180 * MIN,
    },
    // RateLimit: 429 (transient or quota).
    PenaltySpec {
        weight: 22.0,
        half_life_ms: 15 * MIN,
    },
    // Timeout.
    PenaltySpec {
        weight: 18.0,
        half_life_ms: 5 * MIN,
    },
    // Server: 5xx / overloaded.
    PenaltySpec {
        weight: 12.0,
        half_life_ms: 5 * MIN,
    },
    // Blocked: Cloudflare.
    PenaltySpec {
        weight: 15.0,
        half_life_ms: 10 * MIN,
    },
    // Connect: nothing reached the upstream (mostly not the account's fault).
    PenaltySpec {
        weight: 6.0,
        half_life_ms: 2 * MIN,
    },
];

/// Most one penalty slot can hold, so a burst of failures still decays in bounded time.
pub const PENALTY_CAP: f64 = 120.0;
/// Penalty per consecutive failure, and its cap.
const STREAK_PENALTY: f64 = 6.0;
const STREAK_PENALTY_CAP: f64 = 24.0;
/// Bonus per consecutive success, and its cap.
const SUCCESS_BONUS: f64 = 2.0;
const SUCCESS_BONUS_CAP: f64 = 12.0;
/// On success every penalty is multiplied by this: a working account heals faster than
/// the half-life alone would allow.
const SUCCESS_RELIEF: f64 = 0.7;
/// EWMA smoothing of the error rate (about the last 7-10 attempts).
pub const ERROR_RATE_ALPHA: f64 = 0.15;
/// EWMA smoothing of the first-token latency.
pub const LATENCY_ALPHA: f64 = 0.2;
/// Weight of the EWMA error rate in the score (rate 1.0 costs this many points).
const ERROR_RATE_WEIGHT: f64 = 40.0;
/// Score the load term costs at full concurrency.
const LOAD_WEIGHT: f64 = 20.0;
/// For unlimited accounts, the in-flight count that counts as "full" in the load term.
const UNLIMITED_LOAD_REF: f64 = 16.0;
/// Starting score.
pub const BASE_SCORE: f64 = 100.0;

/// Penalty thresholds between tiers.
const WARM_AT: f64 = 10.0;
const RISKY_AT: f64 = 30.0;
const QUARANTINE_AT: f64 = 60.0;

/// The failure families that leave a decaying penalty on an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FailureKind {
    /// 401 / token invalid / deactivated / plan without Codex.
    Auth = 0,
    /// 429: transient rate limit or quota exhausted.
    RateLimit = 1,
    /// The upstream did not answer in time.
    Timeout = 2,
    /// 5xx / `server_is_overloaded` / `slow_down`.
    Server = 3,
    /// Cloudflare block (HTML 403, empty 404), or another 403 refusing the account.
    Blocked = 4,
    /// The connection could not be established (nothing was sent).
    Connect = 5,
}

// === impl FailureKind ===

impl FailureKind {
    /// Number of kinds (penalty slots in use).
    pub const COUNT: usize = 6;

    /// Every kind, in slot order.
    pub const ALL: [FailureKind; Self::COUNT] = [
        Self::Auth,
        Self::RateLimit,
        Self::Timeout,
        Self::Server,
        Self::Blocked,
        Self::Connect,
    ];

    /// The penalty family of a classified upstream failure; `None` when the failure says
    /// nothing bad about the account (request errors, missing continuation, and "model not
    /// supported", which is handled by [`super::exclude_model`] instead).
    pub fn from_class(class: &FailureClass) -> Option<Self> {
        Some(match class {
            FailureClass::UsageLimit { .. } | FailureClass::RateLimited { .. } => Self::RateLimit,
            FailureClass::UsageNotIncluded
            | FailureClass::AuthExpired
            | FailureClass::Deactivated => Self::Auth,
            FailureClass::Overloaded { .. } => Self::Server,
            FailureClass::Cloudflare | FailureClass::Forbidden => Self::Blocked,
            FailureClass::ModelNotSupported
            | FailureClass::ContinuationNotFound
            | FailureClass::Request => return None,
        })
    }

    /// What one failure of this kind adds to the penalty.
    pub fn weight(self) -> f64 {
        SPECS[self as usize].weight
    }

    /// Half-life of this kind's penalty.
    pub fn half_life(self) -> Duration {
        Duration::from_millis(SPECS[self as usize].half_life_ms)
    }

    /// Stable name (metrics, admin display).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::RateLimit => "rate_limit",
            Self::Timeout => "timeout",
            Self::Server => "server",
            Self::Blocked => "blocked",
            Self::Connect => "connect",
        }
    }
}

/// Health tier: the first sort key of the smart order, and what sets dynamic concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// No recent trouble: full concurrency.
    Healthy = 0,
    /// Minor recent trouble: half concurrency.
    Warm = 1,
    /// Serious recent trouble, or quota exhausted: a quarter of the concurrency (1..=4).
    Risky = 2,
    /// The "banned-ish" tier (repeated 401s, a failure streak): still eligible, but last,
    /// and one request at a time, so it can prove itself again.
    Quarantine = 3,
}

// === impl Tier ===

impl Tier {
    /// Stable name (metrics, admin display).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Warm => "warm",
            Self::Risky => "risky",
            Self::Quarantine => "quarantine",
        }
    }

    /// The concurrency limit of this tier for an account whose configured limit is `base`
    /// (0 = unlimited; the result uses the same convention).
    pub fn limit(self, base: u32) -> u32 {
        match self {
            Self::Healthy => base,
            Self::Warm => base.div_ceil(2),
            Self::Risky if base == 0 => 4,
            Self::Risky => (base / 4).clamp(1, 4),
            Self::Quarantine => 1,
        }
    }
}

/// What the live state says about one account at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assessment {
    /// Health tier.
    pub tier: Tier,
    /// Score (higher is better), [`BASE_SCORE`] for a fresh idle account.
    pub score: f64,
    /// Sum of decayed penalties plus the failure-streak penalty.
    pub penalty: f64,
    /// EWMA error rate (0..=1).
    pub error_rate: f64,
    /// EWMA first-token latency in ms (0 = no sample).
    pub first_token_ms: f64,
    /// Primary-window usage in percent (0 when the window has already reset).
    pub primary_pct: f64,
    /// Secondary-window usage in percent (0 when the window has already reset).
    pub secondary_pct: f64,
    /// Leases held now.
    pub in_flight: u32,
    /// Dynamic concurrency limit (0 = unlimited).
    pub limit: u32,
    /// The account's rejected token is being refreshed (requests reaching it would wait).
    pub refreshing: bool,
}

// === impl Assessment ===

impl Assessment {
    /// True when no further lease fits under the dynamic limit.
    pub fn saturated(&self) -> bool {
        self.limit != 0 && self.in_flight >= self.limit
    }

    /// True when the account cannot serve at once (saturated, or waiting for a refreshed
    /// token): such accounts stay candidates but come after every ready one.
    pub fn deferred(&self) -> bool {
        self.refreshing || self.saturated()
    }

    /// True when either window is used up (a request would most likely get a 429).
    pub fn quota_exhausted(&self) -> bool {
        self.primary_pct >= 100.0 || self.secondary_pct >= 100.0
    }
}

/// Usage of a window, or 0 when its reset instant (unix seconds) is already past.
pub(crate) fn window_pct(pct: f64, reset_at_s: u64, now_ms: u64) -> f64 {
    if reset_at_s != 0 && reset_at_s.saturating_mul(1000) <= now_ms {
        0.0
    } else {
        pct
    }
}

/// Current (primary, secondary) usage in percent, stale windows reading 0.
pub(crate) fn quota_pcts(live: &AccountLive, now_ms: u64) -> (f64, f64) {
    (
        window_pct(live.primary_used_pct(), live.primary_reset_at(), now_ms),
        window_pct(live.secondary_used_pct(), live.secondary_reset_at(), now_ms),
    )
}

/// The configured concurrency of an account: its own, else the settings' default.
pub fn base_limit(entry: &AccountEntry, settings: &Settings) -> u32 {
    if entry.max_concurrency > 0 {
        entry.max_concurrency
    } else {
        settings.default_max_concurrency
    }
}

/// Sum of the decayed penalties at `now_ms` (without the streak term).
pub fn decayed_penalty(live: &AccountLive, now_ms: u64) -> f64 {
    let slots = &live.scheduler().penalties;
    FailureKind::ALL
        .iter()
        .map(|k| slots[*k as usize].value(now_ms, SPECS[*k as usize].half_life_ms))
        .sum()
}

fn quota_penalty(primary: f64, secondary: f64) -> f64 {
    0.1 * primary + (primary - 80.0).max(0.0) + 0.1 * secondary + 0.5 * (secondary - 70.0).max(0.0)
}

fn latency_penalty(ms: f64) -> f64 {
    // Nothing under 2 s; up to 15 points at 20 s and beyond.
    ((ms - 2_000.0) / 18_000.0).clamp(0.0, 1.0) * 15.0
}

/// Tier, score and dynamic concurrency of `entry` at `now_ms`.
pub fn assess(entry: &AccountEntry, settings: &Settings, now_ms: u64) -> Assessment {
    let live = &*entry.live;
    let s = live.scheduler();
    let streak = f64::from(s.consecutive_failures.load(Ordering::Relaxed));
    let successes = f64::from(s.consecutive_successes.load(Ordering::Relaxed));
    let penalty = decayed_penalty(live, now_ms) + (streak * STREAK_PENALTY).min(STREAK_PENALTY_CAP);
    let error_rate = s.error_rate.load().clamp(0.0, 1.0);
    let first_token_ms = s.first_token_ms.load().max(0.0);
    let (primary_pct, secondary_pct) = quota_pcts(live, now_ms);
    let exhausted = primary_pct >= 100.0 || secondary_pct >= 100.0;

    let tier = if penalty >= QUARANTINE_AT || error_rate >= 0.75 {
        Tier::Quarantine
    } else if penalty >= RISKY_AT || error_rate >= 0.5 || exhausted {
        Tier::Risky
    } else if penalty >= WARM_AT || error_rate >= 0.25 {
        Tier::Warm
    } else {
        Tier::Healthy
    };
    let limit = tier.limit(base_limit(entry, settings));
    let in_flight = live.in_flight();
    let load = if limit == 0 {
        (f64::from(in_flight) / UNLIMITED_LOAD_REF).min(1.0)
    } else {
        (f64::from(in_flight) / f64::from(limit)).min(1.0)
    };
    let score = BASE_SCORE - penalty - ERROR_RATE_WEIGHT * error_rate
        + (successes * SUCCESS_BONUS).min(SUCCESS_BONUS_CAP)
        - latency_penalty(first_token_ms)
        - quota_penalty(primary_pct, secondary_pct)
        - LOAD_WEIGHT * load;
    Assessment {
        tier,
        score,
        penalty,
        error_rate,
        first_token_ms,
        primary_pct,
        secondary_pct,
        in_flight,
        limit,
        refreshing: live.is_refreshing(now_ms),
    }
}

/// The concurrency limit the lifecycle passes to `AccountLive::try_acquire` (0 = unlimited):
/// the account's configured limit, reduced for unhealthy tiers.
pub fn effective_limit(entry: &AccountEntry, settings: &Settings, now_ms: u64) -> u32 {
    assess(entry, settings, now_ms).limit
}

/// Folds one sample into an EWMA cell; `init_from_first` seeds an empty (0) cell with the
/// sample itself instead of blending it with 0.
pub(crate) fn ewma(prev: f64, sample: f64, alpha: f64, init_from_first: bool) -> f64 {
    if init_from_first && prev == 0.0 {
        sample
    } else {
        prev + alpha * (sample - prev)
    }
}

/// Records an accepted attempt: error-rate EWMA toward 0, first-token latency EWMA, success
/// streak, and relief of every penalty (times 0.7).
pub fn record_success(live: &AccountLive, first_token_latency: Duration) {
    record_success_at(live, first_token_latency, shared_state::now_ms());
}

/// [`record_success`] with an explicit clock (tests).
pub fn record_success_at(live: &AccountLive, first_token_latency: Duration, now_ms: u64) {
    let s = live.scheduler();
    s.error_rate
        .update(|p| ewma(p, 0.0, ERROR_RATE_ALPHA, false));
    let ms = first_token_latency.as_secs_f64() * 1000.0;
    s.first_token_ms
        .update(|p| ewma(p, ms.max(f64::MIN_POSITIVE), LATENCY_ALPHA, true));
    s.consecutive_failures.store(0, Ordering::Relaxed);
    let _ = s
        .consecutive_successes
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_add(1))
        });
    for k in FailureKind::ALL {
        s.penalties[k as usize].scale(SUCCESS_RELIEF, now_ms, SPECS[k as usize].half_life_ms);
    }
}

/// Records an account-scoped failed attempt: adds the kind's penalty (decaying from
/// `now_ms`), error-rate EWMA toward 1, failure streak.
pub fn record_failure(live: &AccountLive, kind: FailureKind, now_ms: u64) {
    let s = live.scheduler();
    let spec = SPECS[kind as usize];
    s.penalties[kind as usize].add(spec.weight, PENALTY_CAP, now_ms, spec.half_life_ms);
    s.error_rate
        .update(|p| ewma(p, 1.0, ERROR_RATE_ALPHA, false));
    s.consecutive_successes.store(0, Ordering::Relaxed);
    let _ = s
        .consecutive_failures
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_add(1))
        });
}

/// Forgets all feedback of an account (operator "reset health", or after re-login):
/// [`shared_state::account::SchedulerLive::reset`], which the admin API calls too.
pub fn reset_feedback(live: &AccountLive) {
    live.scheduler().reset();
}
