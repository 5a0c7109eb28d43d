//! Per-account live state shared by every worker, and the lease on a concurrency slot.
//!
//! # Key Components
//! - [`AccountStatus`]: the persisted administrative/health status of an account.
//! - [`AccountEffect`] and [`AccountLive::apply`]: the one vocabulary of account state changes
//!   (status, cooldown, quota, token refresh) and the one function that applies them to live
//!   state. The data plane (failure policy, quota signals), the sidecar (quota poller, token
//!   refresher, snapshot publisher) and the admin API all build an effect and call `apply`;
//!   the sidecar persists the same effect. Nothing else writes these atomics.
//! - [`AccountLive`]: atomics updated lock-free by workers (in flight, cooldown, quota). One
//!   instance per account lives for the whole process; snapshots carry an `Arc` to it, so a
//!   snapshot swap never resets live counters.
//! - [`Lease`]: RAII guard for one in-flight slot; dropping it releases the slot.
//! - [`SchedulerLive`]: the scheduler's share of the live state (decaying penalties, EWMA
//!   error rate and first-token latency, success/failure streaks, last request start,
//!   per-model exclusions), built from the lock-free primitives [`AtomicF64`],
//!   [`DecayingPenalty`] and [`ModelExclusions`]. Only the mechanism lives here; what the
//!   values mean (weights, half-lives, tiers) is owned by `gateway::scheduler`.
//!
//! # Usage
//! Workers call [`AccountLive::try_acquire`] while walking the frozen candidate order and keep
//! the returned [`Lease`] until the stream is finalized (or the client goes away).

use std::sync::{
    atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Arc,
};

use arc_swap::ArcSwap;

/// The status of an account as stored and as published in snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountStatus {
    /// Usable.
    Active,
    /// Disabled by an operator, or because the plan lacks Codex.
    Disabled,
    /// The refresh token is dead; an operator must log in again.
    ReauthRequired,
    /// Deactivated/banned upstream.
    Banned,
}

// === impl AccountStatus ===

impl AccountStatus {
    /// The stored text form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Disabled => "disabled",
            Self::ReauthRequired => "reauth_required",
            Self::Banned => "banned",
        }
    }

    /// Parses the stored text form.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => Self::Active,
            "disabled" => Self::Disabled,
            "reauth_required" => Self::ReauthRequired,
            "banned" => Self::Banned,
            _ => return None,
        })
    }
}

/// A quota observation (response headers, a `codex.rate_limits` event, the usage endpoint,
/// or a row another instance stored); `None` fields keep what is known.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuotaUpdate {
    /// Primary (5 h) window used percent.
    pub primary_pct: Option<f64>,
    /// Primary reset, Unix seconds.
    pub primary_reset_at: Option<u64>,
    /// Secondary (7 d) window used percent.
    pub secondary_pct: Option<f64>,
    /// Secondary reset, Unix seconds.
    pub secondary_reset_at: Option<u64>,
}

// === impl QuotaUpdate ===

impl QuotaUpdate {
    /// True when the observation carries nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Every change to an account's state, in one vocabulary. Whoever decides a change builds one
/// and calls [`AccountLive::apply`]; the data plane also reports it to the sidecar
/// (`WorkerEvent::Account`), which persists what [`AccountEffect::is_persisted`] says.
#[derive(Debug, Clone, PartialEq)]
pub enum AccountEffect {
    /// A status decided on the data plane (ban, re-auth, plan without Codex). Live at once as
    /// an override; the persisted status catches up ([`AccountEffect::StatusStored`]).
    Status(AccountStatus),
    /// Do not use the account before this instant (ms since epoch); never shortens a cooldown.
    CooldownUntil {
        /// Deadline, ms since epoch.
        until_ms: u64,
        /// Short machine reason (`usage_limit_reached`, `server_is_overloaded`, ...).
        reason: String,
    },
    /// A quota observation.
    Quota(QuotaUpdate),
    /// The upstream rejected the access token: requests that reach the account wait for the
    /// refreshed token until this instant (ms since epoch) instead of sending doomed requests.
    Refreshing {
        /// Deadline, ms since epoch.
        until_ms: u64,
    },
    /// A new token was published: waiting ends and a pending re-auth override is lifted;
    /// `clear_cooldown` also lifts a cooldown that a token failure caused.
    TokenRefreshed {
        /// Lift the cooldown too.
        clear_cooldown: bool,
    },
    /// The stored status, as the publisher read it: a data-plane override it confirms is
    /// lifted (storage now says the same).
    StatusStored(AccountStatus),
    /// An operator (admin API, CLI, re-import) set the status: any data-plane override is
    /// lifted, and the cooldown becomes `cooldown_until_ms` (0: none).
    OperatorStatus {
        /// The status set.
        status: AccountStatus,
        /// The cooldown that stands afterwards (ms since epoch; 0: none).
        cooldown_until_ms: u64,
    },
}

// === impl AccountEffect ===

impl AccountEffect {
    /// A cooldown until `until_ms` for `reason`.
    pub fn cooldown(until_ms: u64, reason: impl Into<String>) -> Self {
        Self::CooldownUntil {
            until_ms,
            reason: reason.into(),
        }
    }

    /// A quota observation.
    pub fn quota(
        primary_pct: Option<f64>,
        primary_reset_at: Option<u64>,
        secondary_pct: Option<f64>,
        secondary_reset_at: Option<u64>,
    ) -> Self {
        Self::Quota(QuotaUpdate {
            primary_pct,
            primary_reset_at,
            secondary_pct,
            secondary_reset_at,
        })
    }

    /// Whether the sidecar writes this effect to storage when a worker reports it (the others
    /// are in-memory only, or written by whoever decided them).
    pub fn is_persisted(&self) -> bool {
        matches!(
            self,
            Self::Status(_) | Self::CooldownUntil { .. } | Self::Quota(_)
        )
    }
}

/// Bumped whenever a window's reset instant may now sort earlier than a reader assumed: it
/// became known (was 0), moved earlier by more than [`RESET_JITTER_S`], or jumped later by
/// more than [`RESET_RENEWAL_S`] (a new window after the old one passed, which a reader that
/// saw the old instant as passed ranked last). Per-worker orders sorted by reset instants
/// (`gateway::scheduler`, `quota_reset_priority`) are rebuilt when it changes; ordinary
/// header jitter (a few seconds either way) does not bump it.
static RESET_EPOCH: AtomicU64 = AtomicU64::new(0);

/// Earlier moves of a reset instant up to this many seconds do not bump [`reset_epoch`]
/// (`reset_at` is derived from a relative `reset-after` header, so it jitters).
pub const RESET_JITTER_S: u64 = 5;

/// A later move of a reset instant by more than this many seconds is a renewed window and
/// bumps [`reset_epoch`] (a window renews at least its own length after the last reset).
pub const RESET_RENEWAL_S: u64 = 600;

/// The current reset epoch: equal values mean no reset instant
/// of any account moved earlier than the jitter allows in between.
pub fn reset_epoch() -> u64 {
    RESET_EPOCH.load(Ordering::Acquire)
}

/// Length of the reset move log ([`reset_moves`]).
pub const RESET_LOG_LEN: usize = 4_096;

/// One entry of the reset move log: which account (the address of its [`AccountLive`])
/// made the move numbered `seq - 1` (0: never written).
#[derive(Debug)]
struct ResetLogSlot {
    seq: AtomicU64,
    live: AtomicUsize,
}

/// The reset move log: move `e` (the reset epoch before it) sits in slot
/// `e % RESET_LOG_LEN`, so a reader that knows the epoch it last saw can tell which
/// accounts moved since, without reading the pool.
static RESET_LOG: [ResetLogSlot; RESET_LOG_LEN] = [const {
    ResetLogSlot {
        seq: AtomicU64::new(0),
        live: AtomicUsize::new(0),
    }
}; RESET_LOG_LEN];

/// Appends the addresses of the [`AccountLive`]s whose reset instants moved (in the sense
/// of [`reset_epoch`]) between epochs `from` and `to` to `out`, oldest first, and returns
/// the epoch up to which the log was read (a move whose entry is still being written ends
/// the read early: read on from there next time). `None` when the log no longer holds every
/// move since `from` (more than [`RESET_LOG_LEN`] of them): re-read every account instead.
/// Addresses identify an account while its `Arc<AccountLive>` lives (snapshots share it).
pub fn reset_moves(from: u64, to: u64, out: &mut Vec<usize>) -> Option<u64> {
    if to < from || to - from > RESET_LOG_LEN as u64 {
        return None;
    }
    for e in from..to {
        let slot = &RESET_LOG[(e % RESET_LOG_LEN as u64) as usize];
        let seq = slot.seq.load(Ordering::Acquire);
        if seq <= e {
            return Some(e);
        }
        if seq != e + 1 {
            return None;
        }
        let live = slot.live.load(Ordering::Acquire);
        if slot.seq.load(Ordering::Acquire) != e + 1 {
            return None;
        }
        out.push(live);
    }
    Some(to)
}

/// Whether replacing reset instant `old` by `new` (unix seconds, 0 = unknown) may make the
/// account sort earlier for a reader that ranked it by `old` (passed or unknown instants
/// rank last).
fn reset_may_sort_earlier(old: u64, new: u64) -> bool {
    new != 0
        && (old == 0
            || new.saturating_add(RESET_JITTER_S) < old
            || new > old.saturating_add(RESET_RENEWAL_S))
}

/// Lock-free live state of one account, shared by all workers and the sidecar.
#[derive(Debug, Default)]
pub struct AccountLive {
    /// Requests currently holding a [`Lease`] on this account.
    in_flight: AtomicU32,
    /// No new request before this instant (ms since epoch); 0 = none.
    cooldown_until_ms: AtomicU64,
    /// Last seen primary-window usage, in hundredths of a percent.
    primary_used_centi: AtomicU32,
    /// Last seen secondary-window usage, in hundredths of a percent.
    secondary_used_centi: AtomicU32,
    /// Primary window reset instant (unix seconds), 0 = unknown.
    primary_reset_at: AtomicU64,
    /// Secondary window reset instant (unix seconds), 0 = unknown.
    secondary_reset_at: AtomicU64,
    /// Requests served since start (accepted attempts).
    served: AtomicU64,
    /// Failed attempts since start.
    failures: AtomicU64,
    /// Status override set by a worker before the sidecar persists it (0 = none).
    status_override: AtomicU32,
    /// A rejected token is being refreshed until this instant (ms since epoch); 0 = none.
    refreshing_until_ms: AtomicU64,
    /// Scheduling feedback (penalties, EWMAs, exclusions); see [`SchedulerLive`].
    scheduler: SchedulerLive,
}

// === impl AccountLive ===

impl AccountLive {
    /// Current number of leases held.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes one slot if fewer than `limit` are held (`limit == 0` means unlimited).
    pub fn try_acquire(self: &Arc<Self>, limit: u32) -> Option<Lease> {
        let mut cur = self.in_flight.load(Ordering::Relaxed);
        loop {
            if limit != 0 && cur >= limit {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Lease {
                        live: Arc::clone(self),
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Applies `effect`: the one function that changes an account's status override,
    /// cooldown, quota and refresh state (see [`AccountEffect`]).
    pub fn apply(&self, effect: &AccountEffect) {
        match effect {
            AccountEffect::Status(s) => self.set_status_override(Some(*s)),
            AccountEffect::CooldownUntil { until_ms, .. } => self.cool_until(*until_ms),
            AccountEffect::Quota(q) => self.record_quota(q),
            AccountEffect::Refreshing { until_ms } => self.start_refreshing(*until_ms),
            AccountEffect::TokenRefreshed { clear_cooldown } => {
                self.refreshing_until_ms.store(0, Ordering::Release);
                if self.status_override() == Some(AccountStatus::ReauthRequired) {
                    self.set_status_override(None);
                }
                if *clear_cooldown {
                    self.cooldown_until_ms.store(0, Ordering::Release);
                }
            }
            AccountEffect::StatusStored(s) => {
                if self.status_override() == Some(*s) {
                    self.set_status_override(None);
                }
            }
            AccountEffect::OperatorStatus {
                cooldown_until_ms, ..
            } => {
                self.set_status_override(None);
                self.cooldown_until_ms
                    .store(*cooldown_until_ms, Ordering::Release);
            }
        }
    }

    /// Cooldown deadline in ms since epoch (0 when none).
    pub fn cooldown_until_ms(&self) -> u64 {
        self.cooldown_until_ms.load(Ordering::Acquire)
    }

    /// True when the account must not be picked at `now_ms`.
    pub fn is_cooling(&self, now_ms: u64) -> bool {
        self.cooldown_until_ms() > now_ms
    }

    /// Extends the cooldown to at least `until_ms` (never shortens it).
    fn cool_until(&self, until_ms: u64) {
        self.cooldown_until_ms.fetch_max(until_ms, Ordering::AcqRel);
    }

    /// Records quota percentages (0..=100, fractional) and reset instants (unix seconds).
    fn record_quota(&self, q: &QuotaUpdate) {
        let centi = |p: f64| (p.clamp(0.0, 100.0) * 100.0).round() as u32;
        if let Some(p) = q.primary_pct {
            self.primary_used_centi.store(centi(p), Ordering::Release);
        }
        if let Some(r) = q.primary_reset_at {
            self.store_reset(&self.primary_reset_at, r);
        }
        if let Some(p) = q.secondary_pct {
            self.secondary_used_centi.store(centi(p), Ordering::Release);
        }
        if let Some(r) = q.secondary_reset_at {
            self.store_reset(&self.secondary_reset_at, r);
        }
    }

    /// Stores a reset instant; when it may sort earlier than before, bumps the reset epoch
    /// and logs the move ([`reset_moves`]).
    fn store_reset(&self, cell: &AtomicU64, new: u64) {
        let old = cell.swap(new, Ordering::AcqRel);
        if reset_may_sort_earlier(old, new) {
            let e = RESET_EPOCH.fetch_add(1, Ordering::AcqRel);
            let slot = &RESET_LOG[(e % RESET_LOG_LEN as u64) as usize];
            slot.live
                .store(self as *const Self as usize, Ordering::Release);
            slot.seq.store(e + 1, Ordering::Release);
        }
    }

    /// Primary-window usage in percent.
    pub fn primary_used_pct(&self) -> f64 {
        f64::from(self.primary_used_centi.load(Ordering::Acquire)) / 100.0
    }

    /// Secondary-window usage in percent.
    pub fn secondary_used_pct(&self) -> f64 {
        f64::from(self.secondary_used_centi.load(Ordering::Acquire)) / 100.0
    }

    /// Primary-window reset instant (unix seconds), 0 when unknown.
    pub fn primary_reset_at(&self) -> u64 {
        self.primary_reset_at.load(Ordering::Acquire)
    }

    /// Secondary-window reset instant (unix seconds), 0 when unknown.
    pub fn secondary_reset_at(&self) -> u64 {
        self.secondary_reset_at.load(Ordering::Acquire)
    }

    /// Counts an accepted attempt.
    pub fn note_served(&self) {
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed attempt.
    pub fn note_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// (served, failures) since start.
    pub fn counters(&self) -> (u64, u64) {
        (
            self.served.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }

    /// A status decided on the data plane before the sidecar persisted it (e.g. a second 401
    /// marks `ReauthRequired` at once); `None` when the snapshot's status stands.
    pub fn status_override(&self) -> Option<AccountStatus> {
        match self.status_override.load(Ordering::Acquire) {
            1 => Some(AccountStatus::Disabled),
            2 => Some(AccountStatus::ReauthRequired),
            3 => Some(AccountStatus::Banned),
            _ => None,
        }
    }

    /// Sets (or with `None`, clears) the in-memory status override.
    fn set_status_override(&self, s: Option<AccountStatus>) {
        let v = match s {
            None | Some(AccountStatus::Active) => 0,
            Some(AccountStatus::Disabled) => 1,
            Some(AccountStatus::ReauthRequired) => 2,
            Some(AccountStatus::Banned) => 3,
        };
        self.status_override.store(v, Ordering::Release);
    }

    /// The scheduler's feedback state for this account.
    pub fn scheduler(&self) -> &SchedulerLive {
        &self.scheduler
    }

    /// Alias of [`AccountLive::scheduler`].
    pub fn scheduler_state(&self) -> &SchedulerLive {
        &self.scheduler
    }

    /// Marks the account's token as being refreshed until `until_ms` (requests that reach it
    /// wait for the new token instead of sending a doomed request).
    fn start_refreshing(&self, until_ms: u64) {
        self.refreshing_until_ms
            .fetch_max(until_ms, Ordering::AcqRel);
    }

    /// True while a refresh of the account's token is awaited.
    pub fn is_refreshing(&self, now_ms: u64) -> bool {
        self.refreshing_until_ms.load(Ordering::Acquire) > now_ms
    }
}

/// Number of [`DecayingPenalty`] slots per account (one per failure family the scheduler
/// distinguishes; the mapping is `gateway::scheduler`'s).
pub const PENALTY_SLOTS: usize = 8;

/// The scheduler's share of an account's live state. Every field is updated lock-free by any
/// worker; the meaning of each value is owned by `gateway::scheduler`.
#[derive(Debug, Default)]
pub struct SchedulerLive {
    /// Exponentially decaying penalties, one slot per failure family.
    pub penalties: [DecayingPenalty; PENALTY_SLOTS],
    /// EWMA of the attempt error rate (0 = every recent attempt succeeded, 1 = all failed).
    pub error_rate: AtomicF64,
    /// EWMA of the time to first token in milliseconds (0 = no sample yet).
    pub first_token_ms: AtomicF64,
    /// Account-scoped failures since the last success.
    pub consecutive_failures: AtomicU32,
    /// Successes since the last account-scoped failure.
    pub consecutive_successes: AtomicU32,
    /// When the last request started on this account (ms since epoch; 0 = never).
    pub last_request_ms: AtomicU64,
    /// Models this account must not serve for a while ("model not supported").
    pub excluded_models: ModelExclusions,
    /// Observed primary-window burn, percent per hour (0: none observed), published by the
    /// sidecar's quota burn estimator (`admin::forecast`); read through
    /// [`crate::forecast`].
    pub burn_primary_pct_h: AtomicF64,
    /// Observed secondary-window burn, percent per hour (0: none observed).
    pub burn_secondary_pct_h: AtomicF64,
}

// === impl SchedulerLive ===

impl SchedulerLive {
    /// Forgets all feedback (an operator's "reset health", a re-login): penalties, error rate,
    /// first-token latency, both streaks and model exclusions. The one reset: the scheduler
    /// and the admin API both call it. Burn estimates and the last request time are
    /// observations, not feedback, and stay.
    pub fn reset(&self) {
        for p in &self.penalties {
            p.clear();
        }
        self.error_rate.store(0.0);
        self.first_token_ms.store(0.0);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.consecutive_successes.store(0, Ordering::Relaxed);
        self.excluded_models.clear();
    }
}

/// An `f64` in an [`AtomicU64`] (its bit pattern), updated with a CAS loop.
#[derive(Debug, Default)]
pub struct AtomicF64(AtomicU64);

// === impl AtomicF64 ===

impl AtomicF64 {
    /// A cell holding `v`.
    pub fn new(v: f64) -> Self {
        Self(AtomicU64::new(v.to_bits()))
    }

    /// The current value.
    pub fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Acquire))
    }

    /// Replaces the value.
    pub fn store(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Release);
    }

    /// Applies `f` atomically (retrying on contention) and returns the new value.
    pub fn update(&self, mut f: impl FnMut(f64) -> f64) -> f64 {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let new = f(f64::from_bits(cur));
            match self.0.compare_exchange_weak(
                cur,
                new.to_bits(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return new,
                Err(now) => cur = now,
            }
        }
    }
}

/// A penalty that decays exponentially with time. Value and timestamp share one
/// [`AtomicU64`] (high 32 bits: unix seconds of the last update; low 32 bits: the value as
/// `f32` at that instant), so they always change together without a lock.
#[derive(Debug, Default)]
pub struct DecayingPenalty(AtomicU64);

// === impl DecayingPenalty ===

impl DecayingPenalty {
    fn unpack(raw: u64) -> (f64, u64) {
        (f64::from(f32::from_bits(raw as u32)), raw >> 32)
    }

    fn pack(value: f64, at_s: u64) -> u64 {
        ((at_s.min(u64::from(u32::MAX))) << 32) | u64::from((value as f32).to_bits())
    }

    fn decayed(value: f64, at_s: u64, now_ms: u64, half_life_ms: u64) -> f64 {
        let dt_ms = now_ms.saturating_sub(at_s * 1000);
        if half_life_ms == 0 {
            return 0.0;
        }
        value * (-(dt_ms as f64) / half_life_ms as f64).exp2()
    }

    /// The value at `now_ms`, halved every `half_life_ms` since the last update.
    pub fn value(&self, now_ms: u64, half_life_ms: u64) -> f64 {
        let raw = self.0.load(Ordering::Acquire);
        if raw == 0 {
            return 0.0;
        }
        let (v, at_s) = Self::unpack(raw);
        Self::decayed(v, at_s, now_ms, half_life_ms)
    }

    /// Decays the stored value to `now_ms`, adds `amount`, caps the sum at `cap`, and returns
    /// the new value.
    pub fn add(&self, amount: f64, cap: f64, now_ms: u64, half_life_ms: u64) -> f64 {
        let now_s = now_ms / 1000;
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let old = if cur == 0 {
                0.0
            } else {
                let (v, at_s) = Self::unpack(cur);
                Self::decayed(v, at_s, now_ms, half_life_ms)
            };
            let new = (old + amount).clamp(0.0, cap);
            match self.0.compare_exchange_weak(
                cur,
                Self::pack(new, now_s),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return new,
                Err(now) => cur = now,
            }
        }
    }

    /// Decays the stored value to `now_ms` and multiplies it by `factor` (0..=1): relief
    /// after a success. A no-op on an empty slot.
    pub fn scale(&self, factor: f64, now_ms: u64, half_life_ms: u64) {
        let now_s = now_ms / 1000;
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            if cur == 0 {
                return;
            }
            let (v, at_s) = Self::unpack(cur);
            let new = Self::decayed(v, at_s, now_ms, half_life_ms) * factor.clamp(0.0, 1.0);
            let packed = if new < 1e-3 {
                0
            } else {
                Self::pack(new, now_s)
            };
            match self
                .0
                .compare_exchange_weak(cur, packed, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Forgets the penalty.
    pub fn clear(&self) {
        self.0.store(0, Ordering::Release);
    }
}

/// One excluded model and until when (ms since epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelExclusion {
    /// Model name as the upstream saw it.
    pub model: Box<str>,
    /// Excluded until this instant.
    pub until_ms: u64,
}

/// Per-account set of models the account must not serve until a deadline. Reads are a
/// single atomic load while nothing is excluded; the list itself is copy-on-write behind an
/// [`ArcSwap`] (writes are rare: one per "model not supported" answer).
#[derive(Debug, Default)]
pub struct ModelExclusions {
    /// The latest deadline in `list` (0 = never excluded anything): the read fast path.
    until_max_ms: AtomicU64,
    list: ArcSwap<Vec<ModelExclusion>>,
}

// === impl ModelExclusions ===

impl ModelExclusions {
    /// True when `model` is excluded at `now_ms` (model names compare ASCII-case-insensitively).
    pub fn is_excluded(&self, model: &str, now_ms: u64) -> bool {
        if self.until_max_ms.load(Ordering::Acquire) <= now_ms {
            return false;
        }
        self.list
            .load()
            .iter()
            .any(|e| e.until_ms > now_ms && e.model.eq_ignore_ascii_case(model))
    }

    /// Excludes `model` until `until_ms` (extending an existing entry, never shortening it);
    /// expired entries are pruned on the way.
    pub fn exclude(&self, model: &str, until_ms: u64, now_ms: u64) {
        self.list.rcu(|cur| {
            let mut next: Vec<ModelExclusion> = cur
                .iter()
                .filter(|e| e.until_ms > now_ms && !e.model.eq_ignore_ascii_case(model))
                .cloned()
                .collect();
            let prev = cur
                .iter()
                .filter(|e| e.model.eq_ignore_ascii_case(model))
                .map(|e| e.until_ms)
                .max()
                .unwrap_or(0);
            next.push(ModelExclusion {
                model: model.into(),
                until_ms: until_ms.max(prev),
            });
            next
        });
        self.until_max_ms.fetch_max(until_ms, Ordering::AcqRel);
    }

    /// Lifts the exclusion of `model` (an operator action, or a catalog change).
    pub fn lift(&self, model: &str) {
        self.list.rcu(|cur| {
            cur.iter()
                .filter(|e| !e.model.eq_ignore_ascii_case(model))
                .cloned()
                .collect::<Vec<_>>()
        });
    }

    /// Lifts every exclusion.
    pub fn clear(&self) {
        self.list.store(Arc::new(Vec::new()));
    }

    /// The exclusions still in force at `now_ms` (for admin display).
    pub fn active(&self, now_ms: u64) -> Vec<ModelExclusion> {
        if self.until_max_ms.load(Ordering::Acquire) <= now_ms {
            return Vec::new();
        }
        self.list
            .load()
            .iter()
            .filter(|e| e.until_ms > now_ms)
            .cloned()
            .collect()
    }
}

/// One in-flight slot on an account; released on drop.
#[derive(Debug)]
pub struct Lease {
    live: Arc<AccountLive>,
}

// === impl Lease ===

impl Lease {
    /// The account's live state.
    pub fn live(&self) -> &Arc<AccountLive> {
        &self.live
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.live.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn scheduler_reset_forgets_every_piece_of_feedback() {
        let s = SchedulerLive::default();
        let now = 1_700_000_000_000;
        s.penalties[0].add(40.0, 100.0, now, 60_000);
        s.penalties[7].add(10.0, 100.0, now, 60_000);
        s.error_rate.store(0.5);
        s.first_token_ms.store(900.0);
        s.consecutive_failures.store(3, Ordering::Relaxed);
        s.consecutive_successes.store(2, Ordering::Relaxed);
        s.last_request_ms.store(now, Ordering::Relaxed);
        s.excluded_models.exclude("gpt-5.5", now + 60_000, now);
        s.reset();
        assert!(s.penalties.iter().all(|p| p.value(now, 60_000) == 0.0));
        assert_eq!(s.error_rate.load(), 0.0);
        assert_eq!(s.first_token_ms.load(), 0.0);
        assert_eq!(s.consecutive_failures.load(Ordering::Relaxed), 0);
        assert_eq!(s.consecutive_successes.load(Ordering::Relaxed), 0);
        assert!(s.excluded_models.active(now).is_empty());
        assert!(!s.excluded_models.is_excluded("gpt-5.5", now));
        // An observation, not feedback.
        assert_eq!(s.last_request_ms.load(Ordering::Relaxed), now);
    }
    use super::*;

    #[test]
    fn lease_respects_limit_and_releases() {
        let live = Arc::new(AccountLive::default());
        let a = live.try_acquire(2).unwrap();
        let _b = live.try_acquire(2).unwrap();
        assert!(live.try_acquire(2).is_none());
        drop(a);
        assert_eq!(live.in_flight(), 1);
        assert!(live.try_acquire(2).is_some());
        assert!(live.try_acquire(0).is_some(), "0 means unlimited");
    }

    #[test]
    fn reset_epoch_moves_when_a_reset_may_sort_earlier() {
        // Learned, moved clearly earlier, renewed after passing: a reader must re-sort.
        assert!(reset_may_sort_earlier(0, 1_000));
        assert!(reset_may_sort_earlier(1_000, 1_000 - RESET_JITTER_S - 1));
        assert!(reset_may_sort_earlier(1_000, 1_000 + 18_000));
        // Header jitter either way, forgetting, or no change: no re-sort.
        assert!(!reset_may_sort_earlier(1_000, 1_000));
        assert!(!reset_may_sort_earlier(1_000, 1_000 - RESET_JITTER_S));
        assert!(!reset_may_sort_earlier(1_000, 1_000 + 3));
        assert!(!reset_may_sort_earlier(1_000, 0));
        // And `apply` bumps the shared epoch for such a move.
        let live = AccountLive::default();
        let before = reset_epoch();
        live.apply(&AccountEffect::quota(None, Some(5_000), None, None));
        assert!(reset_epoch() > before);
    }

    #[test]
    fn reset_moves_name_the_accounts_that_moved() {
        let (a, b) = (AccountLive::default(), AccountLive::default());
        let from = reset_epoch();
        a.apply(&AccountEffect::quota(None, Some(1_000), None, None));
        b.apply(&AccountEffect::quota(None, None, None, Some(9_000)));
        // Jitter: no move logged.
        a.apply(&AccountEffect::quota(None, Some(1_003), None, None));
        let to = reset_epoch();
        // Other tests may log moves meanwhile; ours are in the log once each, a before b.
        let mut out = Vec::new();
        let mut at = from;
        while at < to {
            at = reset_moves(at, to, &mut out).expect("within the log");
            std::thread::yield_now();
        }
        let (pa, pb) = (&a as *const _ as usize, &b as *const _ as usize);
        assert_eq!(out.iter().filter(|x| **x == pa).count(), 1);
        assert_eq!(out.iter().filter(|x| **x == pb).count(), 1);
        assert!(out.iter().position(|x| *x == pa) < out.iter().position(|x| *x == pb));
        // More moves than the log holds: the reader must re-read everything.
        assert_eq!(
            reset_moves(from, from + RESET_LOG_LEN as u64 + 1, &mut out),
            None
        );
        assert_eq!(reset_moves(to, to, &mut out), Some(to));
    }

    #[test]
    fn cooldown_only_extends() {
        let live = AccountLive::default();
        live.apply(&AccountEffect::cooldown(2_000, "a"));
        live.apply(&AccountEffect::cooldown(1_000, "b"));
        assert_eq!(live.cooldown_until_ms(), 2_000);
        assert!(live.is_cooling(1_999));
        assert!(!live.is_cooling(2_000));
    }

    #[test]
    fn atomic_f64_updates() {
        let a = AtomicF64::default();
        assert_eq!(a.load(), 0.0);
        assert_eq!(a.update(|v| v + 1.5), 1.5);
        a.store(-2.0);
        assert_eq!(a.load(), -2.0);
    }

    #[test]
    fn penalty_decays_by_half_life_and_caps() {
        let p = DecayingPenalty::default();
        assert_eq!(p.value(5_000, 60_000), 0.0);
        let t0 = 1_000_000_000;
        assert_eq!(p.add(40.0, 100.0, t0, 60_000), 40.0);
        assert!((p.value(t0 + 60_000, 60_000) - 20.0).abs() < 1e-3);
        assert!((p.value(t0 + 120_000, 60_000) - 10.0).abs() < 1e-3);
        // Adding later decays first, then adds.
        let v = p.add(5.0, 100.0, t0 + 60_000, 60_000);
        assert!((v - 25.0).abs() < 1e-3);
        assert_eq!(p.add(500.0, 100.0, t0 + 60_000, 60_000), 100.0);
        p.scale(0.5, t0 + 60_000, 60_000);
        assert!((p.value(t0 + 60_000, 60_000) - 50.0).abs() < 1e-3);
        p.clear();
        assert_eq!(p.value(t0, 60_000), 0.0);
    }

    #[test]
    fn model_exclusions_expire_extend_and_lift() {
        let x = ModelExclusions::default();
        assert!(!x.is_excluded("gpt-5", 0));
        x.exclude("gpt-5", 1_000, 0);
        assert!(x.is_excluded("GPT-5", 999));
        assert!(!x.is_excluded("gpt-5", 1_000));
        assert!(!x.is_excluded("gpt-4", 10));
        x.exclude("gpt-5", 500, 10);
        assert!(x.is_excluded("gpt-5", 900), "never shortened");
        x.exclude("o3", 2_000, 10);
        assert_eq!(x.active(10).len(), 2);
        x.lift("gpt-5");
        assert!(!x.is_excluded("gpt-5", 10));
        assert!(x.is_excluded("o3", 1_500));
        assert!(x.active(3_000).is_empty());
    }

    #[test]
    fn status_text_roundtrip() {
        for s in [
            AccountStatus::Active,
            AccountStatus::Disabled,
            AccountStatus::ReauthRequired,
            AccountStatus::Banned,
        ] {
            assert_eq!(AccountStatus::parse(s.as_str()), Some(s));
        }
    }
}
