//! Per-account live state shared by every worker, and the lease on a concurrency slot.
//!
//! # Key Components
//! - [`AccountStatus`]: the persisted administrative/health status of an account.
//! - [`AccountLive`]: atomics updated lock-free by workers (in flight, cooldown, quota). One
//!   instance per account lives for the whole process; snapshots carry an `Arc` to it, so a
//!   snapshot swap never resets live counters.
//! - [`Lease`]: RAII guard for one in-flight slot; dropping it releases the slot.
//!
//! # Usage
//! Workers call [`AccountLive::try_acquire`] while walking the frozen candidate order and keep
//! the returned [`Lease`] until the stream is finalized (or the client goes away).

use std::sync::{
    atomic::{AtomicU32, AtomicU64, Ordering},
    Arc,
};

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

    /// Cooldown deadline in ms since epoch (0 when none).
    pub fn cooldown_until_ms(&self) -> u64 {
        self.cooldown_until_ms.load(Ordering::Acquire)
    }

    /// True when the account must not be picked at `now_ms`.
    pub fn is_cooling(&self, now_ms: u64) -> bool {
        self.cooldown_until_ms() > now_ms
    }

    /// Extends the cooldown to at least `until_ms` (never shortens it).
    pub fn cool_until(&self, until_ms: u64) {
        self.cooldown_until_ms.fetch_max(until_ms, Ordering::AcqRel);
    }

    /// Clears any cooldown (operator action, or a successful refresh).
    pub fn clear_cooldown(&self) {
        self.cooldown_until_ms.store(0, Ordering::Release);
    }

    /// Records quota percentages (0..=100, fractional) and reset instants (unix seconds).
    pub fn record_quota(
        &self,
        primary_pct: Option<f64>,
        primary_reset_at: Option<u64>,
        secondary_pct: Option<f64>,
        secondary_reset_at: Option<u64>,
    ) {
        let centi = |p: f64| (p.clamp(0.0, 100.0) * 100.0).round() as u32;
        if let Some(p) = primary_pct {
            self.primary_used_centi.store(centi(p), Ordering::Release);
        }
        if let Some(r) = primary_reset_at {
            self.primary_reset_at.store(r, Ordering::Release);
        }
        if let Some(p) = secondary_pct {
            self.secondary_used_centi.store(centi(p), Ordering::Release);
        }
        if let Some(r) = secondary_reset_at {
            self.secondary_reset_at.store(r, Ordering::Release);
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
    pub fn set_status_override(&self, s: Option<AccountStatus>) {
        let v = match s {
            None | Some(AccountStatus::Active) => 0,
            Some(AccountStatus::Disabled) => 1,
            Some(AccountStatus::ReauthRequired) => 2,
            Some(AccountStatus::Banned) => 3,
        };
        self.status_override.store(v, Ordering::Release);
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
    fn cooldown_only_extends() {
        let live = AccountLive::default();
        live.cool_until(2_000);
        live.cool_until(1_000);
        assert_eq!(live.cooldown_until_ms(), 2_000);
        assert!(live.is_cooling(1_999));
        assert!(!live.is_cooling(2_000));
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
