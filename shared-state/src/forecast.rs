//! Quota forecast math: when an account and the whole pool run out of quota, and when
//! capacity comes back, from the quota windows (used percent and reset instant of the
//! primary 5-hour and the secondary weekly window) and an observed burn rate (percent of the
//! window per hour). Pure functions over plain numbers and the live atomics; no I/O, no
//! clock of its own (every function takes `now_ms`).
//!
//! # Key Components
//! - [`Window`], [`window_exhausts_at`]: one window's run-out instant at a constant burn
//!   (`None` when it lasts until its reset, or nothing burns).
//! - [`account`]: an account's forecast ([`AccountForecast`]): the earlier run-out of its two
//!   windows, and when capacity returns (the reset of every window that binds). Reset
//!   credits the account holds ([`Member::reset_credits`]) push the run-out back: each one is
//!   spent when the account runs out and starts the windows that are out over at that instant
//!   (a full window more), as an operator consuming the credit then would.
//! - [`pool`]: the pool's forecast ([`PoolForecast`]): a small event simulation in which the
//!   pool's demand (the sum of the observed burns) is spread over the accounts that can still
//!   serve, in proportion to their own burn, and moves to the others when one runs out;
//!   windows reset and start over; an account that runs out while holding a reset credit
//!   spends it and serves on. The pool runs out when no account can serve.
//! - [`member`] / [`pool_of`]: the inputs read from an [`AccountEntry`]'s live state (quota
//!   atomics, cooldown, the burn the sidecar's estimator publishes into
//!   [`crate::account::SchedulerLive`]). The live state holds no reset credits (only the
//!   sidecar polls them): these forecasts (the data plane's `/metrics` and scheduler order)
//!   count none; the sidecar's view (`admin::forecast`) sets them on each member.
//!
//! Who uses it: the sidecar's estimator and the admin API (`admin::forecast`), the data
//! plane's `/metrics`, and the scheduler's `quota_reset_priority` order (order only: the
//! forecast never makes an account ineligible).
//!
//! Assumptions (stated where shown to operators): every account's window is 100 units of its
//! own plan's capacity, and demand measured as percent-per-hour on one account moves
//! one-for-one to another; the secondary window burns in the proportion observed on each
//! account (the pool's mean proportion where an account has none); a reset credit is spent
//! the moment its account runs out, restarts every window that is out (a cooldown ending no
//! later than those windows' resets ends with them) and leaves the others as they are.

use std::sync::Arc;

use crate::{AccountEntry, AccountStatus, Snapshot};

/// The clock the forecast's sampling reads (ms since epoch): the system clock, or simulated
/// time in tests.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> u64 + Send + Sync>);

// === impl Clock ===

impl Clock {
    /// The system clock ([`crate::now_ms`]).
    pub fn system() -> Self {
        Self(Arc::new(crate::now_ms))
    }

    /// A clock reading `f`.
    pub fn new(f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Now, ms since epoch.
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// The primary window's length (5 hours), ms.
pub const PRIMARY_WINDOW_MS: u64 = 5 * 3600 * 1000;
/// The secondary window's length (7 days), ms.
pub const SECONDARY_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;
/// How far ahead the pool simulation looks.
pub const HORIZON_MS: u64 = 8 * 24 * 3600 * 1000;
/// Member visits the pool simulation may spend (each step visits every member); past it the
/// forecast says "not within what was simulated" (`exhausts_at_ms: None`).
const MAX_WORK: usize = 4_000_000;
/// Most reset credits one account's forecast spends (more are beyond the horizon anyway).
const MAX_CREDITS: u32 = 64;
const HOUR_MS: f64 = 3_600_000.0;

/// One quota window's state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    /// Used percent (0..=100).
    pub used_pct: f64,
    /// Reset instant, ms since epoch; 0 unknown.
    pub reset_at_ms: u64,
    /// Observed burn, percent of the window per hour (0: none observed).
    pub burn_pct_h: f64,
}

// === impl Window ===

impl Window {
    /// The use at `now_ms`: a window whose reset has passed starts over at 0.
    pub fn used_at(&self, now_ms: u64) -> f64 {
        if self.reset_at_ms != 0 && self.reset_at_ms <= now_ms {
            0.0
        } else {
            self.used_pct.clamp(0.0, 100.0)
        }
    }

    /// The window at `to_ms`, from its state at `from_ms`, burning on (a reset on the way
    /// starts it over; it rolls over by `len_ms`).
    fn advanced(&self, from_ms: u64, to_ms: u64, len_ms: u64) -> Window {
        let burn = if self.burn_pct_h.is_finite() {
            self.burn_pct_h.max(0.0)
        } else {
            0.0
        };
        let reset = self.next_reset(from_ms, len_ms);
        let (start, used, reset) = if reset != 0 && reset <= to_ms {
            let r = self.next_reset(to_ms, len_ms);
            // The window running at `to_ms` started `len_ms` before its reset.
            (r.saturating_sub(len_ms).max(from_ms), 0.0, r)
        } else {
            (from_ms, self.used_at(from_ms), reset)
        };
        Window {
            used_pct: (used + burn * (to_ms - start) as f64 / HOUR_MS).min(100.0),
            reset_at_ms: reset,
            burn_pct_h: self.burn_pct_h,
        }
    }

    /// The window started over at `at_ms` by a reset credit.
    fn restarted(&self, at_ms: u64, len_ms: u64) -> Window {
        Window {
            used_pct: 0.0,
            reset_at_ms: at_ms.saturating_add(len_ms),
            burn_pct_h: self.burn_pct_h,
        }
    }

    /// The next reset after `now_ms` (windows roll over by `len_ms`); 0 unknown.
    fn next_reset(&self, now_ms: u64, len_ms: u64) -> u64 {
        if self.reset_at_ms == 0 {
            return 0;
        }
        let mut r = self.reset_at_ms;
        if r <= now_ms {
            r += ((now_ms - r) / len_ms + 1) * len_ms;
        }
        r
    }
}

/// When a window runs out at its burn: `Some(now)` when it is out already, `None` when it
/// lasts until its reset (or nothing burns).
pub fn window_exhausts_at(w: &Window, now_ms: u64) -> Option<u64> {
    let used = w.used_at(now_ms);
    if used >= 100.0 {
        return Some(now_ms);
    }
    if w.burn_pct_h.is_nan() || w.burn_pct_h <= 0.0 {
        return None;
    }
    let at = now_ms.saturating_add(((100.0 - used) / w.burn_pct_h * HOUR_MS) as u64);
    match w.reset_at_ms {
        r if r > now_ms && at >= r => None,
        _ => Some(at),
    }
}

/// Which window binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The 5-hour window.
    Primary,
    /// The weekly window.
    Secondary,
}

/// One account's forecast.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AccountForecast {
    /// When the account runs out (now when it is out and holds no reset credit), `None` when
    /// it lasts until its resets.
    pub exhausts_at_ms: Option<u64>,
    /// The window that runs out first (after the credits spent).
    pub binding: Option<Binding>,
    /// When it can serve again after running out (0 unknown), `None` when it does not run out.
    pub returns_at_ms: Option<u64>,
    /// Reset credits spent before that run-out (each when the account ran out before).
    pub credits_used: u32,
}

/// An account's forecast from its two windows, its cooldown (which also keeps it out) and
/// the reset credits it holds (see the module docs).
pub fn account(m: &Member, now_ms: u64) -> AccountForecast {
    let (mut primary, mut secondary) = (m.primary, m.secondary);
    let mut cooldown = m.cooldown_until_ms;
    let mut t = now_ms;
    let mut used = 0u32;
    let credits = m.reset_credits.min(MAX_CREDITS);
    loop {
        let p = window_exhausts_at(&primary, t);
        let s = window_exhausts_at(&secondary, t);
        let (at, binding) = match (p, s) {
            (None, None) => {
                return AccountForecast {
                    credits_used: used,
                    ..AccountForecast::default()
                }
            }
            (Some(a), None) => (a, Binding::Primary),
            (None, Some(b)) => (b, Binding::Secondary),
            (Some(a), Some(b)) if a <= b => (a, Binding::Primary),
            (Some(_), Some(b)) => (b, Binding::Secondary),
        };
        let out = |e: Option<u64>| e.is_some_and(|e| e <= at);
        if used < credits && at < now_ms.saturating_add(HORIZON_MS) {
            // Spend one at `at`: the windows out by then start over, the others burn on.
            used += 1;
            let mut last_reset = 0;
            for (w, e, len) in [
                (&mut primary, p, PRIMARY_WINDOW_MS),
                (&mut secondary, s, SECONDARY_WINDOW_MS),
            ] {
                *w = if out(e) {
                    last_reset = last_reset.max(w.next_reset(at, len));
                    w.restarted(at, len)
                } else {
                    w.advanced(t, at, len)
                };
            }
            if cooldown <= last_reset {
                cooldown = 0;
            }
            t = at;
            continue;
        }
        // Capacity returns when every window that is out by then has reset.
        let mut back = 0u64;
        let mut unknown = false;
        for (w, e, len) in [
            (&primary, p, PRIMARY_WINDOW_MS),
            (&secondary, s, SECONDARY_WINDOW_MS),
        ] {
            if out(e) {
                match w.next_reset(at, len) {
                    0 => unknown = true,
                    r => back = back.max(r),
                }
            }
        }
        let back = if unknown { 0 } else { back.max(cooldown) };
        return AccountForecast {
            exhausts_at_ms: Some(at),
            binding: Some(binding),
            returns_at_ms: Some(back),
            credits_used: used,
        };
    }
}

/// One account as the pool simulation sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Member {
    /// The 5-hour window.
    pub primary: Window,
    /// The weekly window.
    pub secondary: Window,
    /// Not available before this instant (cooldown), ms since epoch; 0 none.
    pub cooldown_until_ms: u64,
    /// Reset credits the account holds (0: none, or not known).
    pub reset_credits: u32,
}

/// The pool's forecast.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolForecast {
    /// The pool's demand: the sum of the observed primary burns (percent of one account's
    /// 5-hour window per hour).
    pub demand_pct_h: f64,
    /// When no account can serve any more (now when none can), `None` beyond the horizon or
    /// when nothing burns.
    pub exhausts_at_ms: Option<u64>,
    /// When the first account can serve again after that (0 unknown).
    pub returns_at_ms: Option<u64>,
    /// Accounts that can serve now.
    pub available_now: usize,
    /// Reset credits the simulation spent before the pool ran out (or by its horizon).
    pub credits_used: u32,
}

struct Sim {
    p_used: f64,
    p_reset: u64,
    s_used: f64,
    s_reset: u64,
    cool: u64,
    weight: f64,
    ratio: f64,
    credits: u32,
}

impl Sim {
    /// Out of quota (not only cooling) while holding a reset credit: spends it at `t`.
    fn spend_credit(&mut self, t: u64) -> bool {
        let p_out = self.p_used >= 100.0 - 1e-9;
        let s_out = self.s_used >= 100.0 - 1e-9;
        if self.credits == 0 || !(p_out || s_out) {
            return false;
        }
        self.credits -= 1;
        let mut last_reset = 0;
        if p_out {
            last_reset = last_reset.max(self.p_reset);
            self.p_used = 0.0;
            self.p_reset = t.saturating_add(PRIMARY_WINDOW_MS);
        }
        if s_out {
            last_reset = last_reset.max(self.s_reset);
            self.s_used = 0.0;
            self.s_reset = t.saturating_add(SECONDARY_WINDOW_MS);
        }
        if self.cool <= last_reset {
            self.cool = 0;
        }
        true
    }

    fn available(&self, t: u64) -> bool {
        self.p_used < 100.0 - 1e-9 && self.s_used < 100.0 - 1e-9 && self.cool <= t
    }

    /// When this member can serve again (after `t`); 0 unknown.
    fn back_at(&self, t: u64) -> u64 {
        let mut at = self.cool.max(t);
        for (used, reset) in [(self.p_used, self.p_reset), (self.s_used, self.s_reset)] {
            if used >= 100.0 - 1e-9 {
                if reset == 0 {
                    return 0;
                }
                at = at.max(reset);
            }
        }
        at
    }
}

/// The pool's forecast (see the module docs for the model).
pub fn pool(members: &[Member], now_ms: u64) -> PoolForecast {
    let demand: f64 = members.iter().map(|m| m.primary.burn_pct_h.max(0.0)).sum();
    // The pool's mean secondary-per-primary proportion, for accounts without their own.
    let (rs, rn) = members
        .iter()
        .filter(|m| m.primary.burn_pct_h > 0.0 && m.secondary.burn_pct_h > 0.0)
        .fold((0.0, 0usize), |(s, n), m| {
            (s + m.secondary.burn_pct_h / m.primary.burn_pct_h, n + 1)
        });
    let mean_ratio = if rn == 0 { 0.0 } else { rs / rn as f64 };
    let mut sims: Vec<Sim> = members
        .iter()
        .map(|m| Sim {
            p_used: m.primary.used_at(now_ms),
            p_reset: m.primary.next_reset(now_ms, PRIMARY_WINDOW_MS),
            s_used: m.secondary.used_at(now_ms),
            s_reset: m.secondary.next_reset(now_ms, SECONDARY_WINDOW_MS),
            cool: m.cooldown_until_ms,
            weight: m.primary.burn_pct_h.max(0.0),
            ratio: if m.primary.burn_pct_h > 0.0 && m.secondary.burn_pct_h > 0.0 {
                m.secondary.burn_pct_h / m.primary.burn_pct_h
            } else {
                mean_ratio
            },
            credits: m.reset_credits.min(MAX_CREDITS),
        })
        .collect();
    let available_now = sims.iter().filter(|s| s.available(now_ms)).count();
    let mut out = PoolForecast {
        demand_pct_h: demand,
        available_now,
        ..Default::default()
    };
    let end = now_ms.saturating_add(HORIZON_MS);
    let mut t = now_ms;
    let steps = (MAX_WORK / sims.len().max(1)).max(1_000);
    for _ in 0..steps {
        for s in &mut sims {
            if s.spend_credit(t) {
                out.credits_used += 1;
            }
        }
        let avail: Vec<usize> = (0..sims.len()).filter(|&i| sims[i].available(t)).collect();
        if avail.is_empty() {
            out.exhausts_at_ms = Some(t);
            let backs: Vec<u64> = sims.iter().map(|s| s.back_at(t)).collect();
            // The first member back (members whose return is unknown do not count).
            out.returns_at_ms = Some(backs.into_iter().filter(|&b| b != 0).min().unwrap_or(0));
            return out;
        }
        if demand.is_nan() || demand <= 0.0 || t >= end {
            return out;
        }
        let wsum: f64 = avail.iter().map(|&i| sims[i].weight).sum();
        let shares: Vec<f64> = avail
            .iter()
            .map(|&i| {
                if wsum > 0.0 {
                    demand * sims[i].weight / wsum
                } else {
                    demand / avail.len() as f64
                }
            })
            .collect();
        // The next event: a run-out, a reset, a cooldown end, or the horizon.
        let mut next = end;
        for (&i, &d) in avail.iter().zip(&shares) {
            let s = &sims[i];
            if d > 0.0 {
                let mut hours = (100.0 - s.p_used) / d;
                if s.ratio > 0.0 {
                    hours = hours.min((100.0 - s.s_used) / (d * s.ratio));
                }
                next = next.min(t.saturating_add((hours * HOUR_MS).ceil() as u64).max(t + 1));
            }
        }
        for s in &sims {
            for r in [s.p_reset, s.s_reset, s.cool] {
                if r > t {
                    next = next.min(r);
                }
            }
        }
        let dt_h = (next - t) as f64 / HOUR_MS;
        for (&i, &d) in avail.iter().zip(&shares) {
            let s = &mut sims[i];
            s.p_used = (s.p_used + d * dt_h).min(100.0);
            s.s_used = (s.s_used + d * s.ratio * dt_h).min(100.0);
            // Rounding to whole milliseconds: a member within a hair of its limit is out.
            if s.p_used > 100.0 - 1e-6 {
                s.p_used = 100.0;
            }
            if s.s_used > 100.0 - 1e-6 {
                s.s_used = 100.0;
            }
        }
        t = next;
        for s in &mut sims {
            if s.p_reset != 0 && s.p_reset <= t {
                s.p_used = 0.0;
                s.p_reset += PRIMARY_WINDOW_MS;
            }
            if s.s_reset != 0 && s.s_reset <= t {
                s.s_used = 0.0;
                s.s_reset += SECONDARY_WINDOW_MS;
            }
        }
    }
    out
}

/// An account's windows from its live state (quota atomics and published burn).
pub fn windows_of(entry: &AccountEntry) -> (Window, Window) {
    let live = &entry.live;
    let s = live.scheduler();
    (
        Window {
            used_pct: live.primary_used_pct(),
            reset_at_ms: live.primary_reset_at().saturating_mul(1000),
            burn_pct_h: s.burn_primary_pct_h.load(),
        },
        Window {
            used_pct: live.secondary_used_pct(),
            reset_at_ms: live.secondary_reset_at().saturating_mul(1000),
            burn_pct_h: s.burn_secondary_pct_h.load(),
        },
    )
}

/// Whether an account counts in the pool: active (with the data plane's override) and
/// holding a token. Cooling accounts count (their cooldown ends).
pub fn counts(entry: &AccountEntry) -> bool {
    entry.effective_status() == AccountStatus::Active && !entry.access_token.is_empty()
}

/// The pool member of an account (no reset credits: the live state holds none).
pub fn member(entry: &AccountEntry) -> Member {
    let (primary, secondary) = windows_of(entry);
    Member {
        primary,
        secondary,
        cooldown_until_ms: entry.live.cooldown_until_ms(),
        reset_credits: 0,
    }
}

/// The forecast of an account from its live state (no reset credits, see [`member`]).
pub fn account_of(entry: &AccountEntry, now_ms: u64) -> AccountForecast {
    account(&member(entry), now_ms)
}

/// The pool's forecast over a snapshot's counted accounts.
pub fn pool_of(snap: &Snapshot, now_ms: u64) -> PoolForecast {
    let members: Vec<Member> = snap
        .accounts
        .iter()
        .filter(|a| counts(a))
        .map(|a| member(a))
        .collect();
    pool(&members, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;
    const T0: u64 = 1_800_000_000_000;

    fn m(primary: Window, secondary: Window) -> Member {
        Member {
            primary,
            secondary,
            ..Member::default()
        }
    }

    fn w(used: f64, reset_in_h: f64, burn: f64) -> Window {
        Window {
            used_pct: used,
            reset_at_ms: T0 + (reset_in_h * H as f64) as u64,
            burn_pct_h: burn,
        }
    }

    #[test]
    fn a_window_runs_out_before_its_reset_or_lasts() {
        // 40% used, 60%/h: the remaining 60% last one hour, the reset is in four.
        assert_eq!(window_exhausts_at(&w(40.0, 4.0, 60.0), T0), Some(T0 + H));
        // 20%/h: three hours, still before the reset.
        assert_eq!(
            window_exhausts_at(&w(40.0, 4.0, 20.0), T0),
            Some(T0 + 3 * H)
        );
        // 10%/h: six hours, after the reset: it lasts.
        assert_eq!(window_exhausts_at(&w(40.0, 4.0, 10.0), T0), None);
        // Nothing burns.
        assert_eq!(window_exhausts_at(&w(40.0, 4.0, 0.0), T0), None);
        // Out already.
        assert_eq!(window_exhausts_at(&w(100.0, 4.0, 0.0), T0), Some(T0));
        // A passed reset starts the window over.
        assert_eq!(window_exhausts_at(&w(100.0, -1.0, 0.0), T0), None);
    }

    #[test]
    fn an_account_returns_when_its_binding_windows_reset() {
        let f = account(&m(w(40.0, 4.0, 60.0), w(10.0, 100.0, 1.0)), T0);
        assert_eq!(f.exhausts_at_ms, Some(T0 + H));
        assert_eq!(f.binding, Some(Binding::Primary));
        assert_eq!(f.returns_at_ms, Some(T0 + 4 * H));
        // The weekly window binds first: back at the weekly reset.
        let f = account(&m(w(0.0, 4.0, 10.0), w(99.0, 50.0, 2.0)), T0);
        assert_eq!(f.binding, Some(Binding::Secondary));
        assert_eq!(f.exhausts_at_ms, Some(T0 + H / 2));
        assert_eq!(f.returns_at_ms, Some(T0 + 50 * H));
        // Lasting accounts have no forecast.
        assert_eq!(
            account(&m(w(10.0, 4.0, 1.0), w(10.0, 50.0, 0.1)), T0),
            AccountForecast::default()
        );
    }

    #[test]
    fn the_pool_moves_demand_to_the_accounts_left() {
        // A burns 60%/h with 60% left (out in 1 h); B idles with 50% left. After A is out,
        // the 60%/h move to B: out 50 minutes later. A is back at its reset (4 h).
        let a = Member {
            primary: w(40.0, 4.0, 60.0),
            secondary: w(0.0, 100.0, 0.0),
            cooldown_until_ms: 0,
            reset_credits: 0,
        };
        let b = Member {
            primary: w(50.0, 4.5, 0.0),
            secondary: w(0.0, 100.0, 0.0),
            cooldown_until_ms: 0,
            reset_credits: 0,
        };
        let f = pool(&[a, b], T0);
        assert_eq!(f.demand_pct_h, 60.0);
        assert_eq!(f.available_now, 2);
        let at = f.exhausts_at_ms.expect("runs out");
        let want = T0 + H + 50 * 60_000;
        assert!(at.abs_diff(want) <= 2, "{at} vs {want}");
        assert_eq!(f.returns_at_ms, Some(T0 + 4 * H));
        // Idle pool: never.
        let idle = Member {
            primary: w(10.0, 4.0, 0.0),
            ..a
        };
        assert_eq!(pool(&[idle, b], T0).exhausts_at_ms, None);
    }

    #[test]
    fn resets_refill_the_pool_in_the_simulation() {
        // 30%/h on one account with 90% left and a reset in two hours: at the reset it starts
        // over, and a full window lasts 3h20 < 5 h: out at 2 h + 3h20.
        let a = Member {
            primary: w(10.0, 2.0, 30.0),
            secondary: w(0.0, 1000.0, 0.0),
            cooldown_until_ms: 0,
            reset_credits: 0,
        };
        let f = pool(&[a], T0);
        let at = f.exhausts_at_ms.expect("runs out");
        let want = T0 + 2 * H + 3 * H + 20 * 60_000;
        assert!(at.abs_diff(want) <= 2, "{at} vs {want}");
        assert_eq!(f.returns_at_ms, Some(T0 + 7 * H));
    }

    #[test]
    fn an_empty_or_exhausted_pool() {
        let f = pool(&[], T0);
        assert_eq!(f.exhausts_at_ms, Some(T0));
        assert_eq!(f.returns_at_ms, Some(0));
        let out = Member {
            primary: w(100.0, 1.0, 0.0),
            secondary: w(0.0, 100.0, 0.0),
            cooldown_until_ms: 0,
            reset_credits: 0,
        };
        let f = pool(&[out], T0);
        assert_eq!(f.exhausts_at_ms, Some(T0));
        assert_eq!(f.returns_at_ms, Some(T0 + H));
        assert_eq!(f.available_now, 0);
    }

    #[test]
    fn a_reset_credit_gives_an_account_one_more_window() {
        // 40% used at 60%/h, reset in four hours: out in one hour without a credit.
        let base = m(w(40.0, 4.0, 60.0), w(10.0, 100.0, 1.0));
        let without = account(&base, T0);
        assert_eq!(without.exhausts_at_ms, Some(T0 + H));
        assert_eq!(without.credits_used, 0);
        // One credit: spent at T0 + 1 h, the 5-hour window starts over (100% at 60%/h:
        // 1h40 more), back at that window's reset (T0 + 1 h + 5 h).
        let one = account(
            &Member {
                reset_credits: 1,
                ..base
            },
            T0,
        );
        let at = one.exhausts_at_ms.expect("runs out");
        let want = T0 + H + H + 40 * 60_000;
        assert!(at.abs_diff(want) <= 1, "{at} vs {want}");
        assert_eq!(one.credits_used, 1);
        assert_eq!(one.binding, Some(Binding::Primary));
        assert_eq!(one.returns_at_ms, Some(T0 + 6 * H));
        // Two credits: 1h40 more again.
        let two = account(
            &Member {
                reset_credits: 2,
                ..base
            },
            T0,
        );
        let at2 = two.exhausts_at_ms.expect("runs out");
        assert!(at2.abs_diff(want + H + 40 * 60_000) <= 2, "{at2}");
        assert_eq!(two.credits_used, 2);
        // A slow burn that lasts after one credit spends only that one.
        let slow = Member {
            primary: w(90.0, 4.0, 20.0),
            secondary: w(10.0, 100.0, 0.0),
            reset_credits: 5,
            ..base
        };
        let f = account(&slow, T0);
        assert_eq!(f.exhausts_at_ms, None, "20%/h lasts a fresh 5-hour window");
        assert_eq!(f.credits_used, 1);
    }

    #[test]
    fn an_account_out_now_with_a_credit_serves_on_and_its_quota_cooldown_ends() {
        // Out now, cooling until its reset in one hour.
        let out = Member {
            primary: w(100.0, 1.0, 30.0),
            secondary: w(10.0, 100.0, 0.0),
            cooldown_until_ms: T0 + H,
            reset_credits: 0,
        };
        let f = account(&out, T0);
        assert_eq!(f.exhausts_at_ms, Some(T0));
        assert_eq!(f.returns_at_ms, Some(T0 + H));
        // With a credit: spent now, a fresh window at 30%/h runs out in 3h20.
        let f = account(
            &Member {
                reset_credits: 1,
                ..out
            },
            T0,
        );
        let at = f.exhausts_at_ms.expect("runs out");
        assert!(at.abs_diff(T0 + 3 * H + 20 * 60_000) <= 1, "{at}");
        assert_eq!(f.returns_at_ms, Some(T0 + 5 * H), "the new window's reset");
        // A cooldown past the window's reset (an overload) is not the quota's: it stays.
        let f = account(
            &Member {
                reset_credits: 1,
                cooldown_until_ms: T0 + 9 * H,
                ..out
            },
            T0,
        );
        assert_eq!(f.credits_used, 1);
        assert_eq!(f.returns_at_ms, Some(T0 + 9 * H));
    }

    #[test]
    fn reset_credits_push_the_pools_run_out_back() {
        // The pool of the_pool_moves_demand_to_the_accounts_left: out at T0 + 1h50.
        let a = Member {
            primary: w(40.0, 4.0, 60.0),
            secondary: w(0.0, 100.0, 0.0),
            cooldown_until_ms: 0,
            reset_credits: 0,
        };
        let b = Member {
            primary: w(50.0, 4.5, 0.0),
            ..a
        };
        let without = pool(&[a, b], T0);
        let out0 = without.exhausts_at_ms.expect("runs out");
        assert_eq!(without.credits_used, 0);
        // A credit on A: when A runs out (T0 + 1 h) it starts over and takes the demand on
        // (a full window at 60%/h: 1h40), then B's 50% (50 min): out at T0 + 3h30.
        let with = pool(
            &[
                Member {
                    reset_credits: 1,
                    ..a
                },
                b,
            ],
            T0,
        );
        let out1 = with.exhausts_at_ms.expect("runs out");
        let want = T0 + H + H + 40 * 60_000 + 50 * 60_000;
        assert!(out1.abs_diff(want) <= 3, "{out1} vs {want}");
        assert!(out1 > out0);
        assert_eq!(with.credits_used, 1);
        assert_eq!(with.available_now, 2);
        // An exhausted pool whose account holds a credit is not out now.
        let dead = Member {
            primary: w(100.0, 1.0, 30.0),
            secondary: w(0.0, 100.0, 0.0),
            cooldown_until_ms: 0,
            reset_credits: 0,
        };
        assert_eq!(pool(&[dead], T0).exhausts_at_ms, Some(T0));
        let f = pool(
            &[Member {
                reset_credits: 1,
                ..dead
            }],
            T0,
        );
        assert_eq!(f.available_now, 0, "nobody spent the credit yet");
        let at = f.exhausts_at_ms.expect("runs out");
        assert!(at.abs_diff(T0 + 3 * H + 20 * 60_000) <= 2, "{at}");
    }
}
