//! The quota burn estimator and the forecast view (the sidecar's half of the quota forecast;
//! the math is `shared_state::forecast`).
//!
//! # Key Components
//! - [`Forecaster`]: samples every account's quota windows (the live atomics the quota
//!   signals and the `/wham/usage` poller keep current) at its [`Clock`], keeps a short
//!   history per account, and estimates each window's **burn** (percent per hour) as the rise
//!   of its use over the last [`LOOKBACK`] within one window (a reset or a drop starts the
//!   estimate over). An account without an estimate of its own takes its plan's mean burn
//!   (`source: "plan"`). The estimates are published into each account's
//!   `SchedulerLive::burn_*_pct_h`, where the scheduler (`quota_reset_priority`) and the data
//!   plane's `/metrics` read them.
//! - [`Forecaster::view`]: per account and for the pool, when it runs out and when capacity
//!   returns ([`ForecastView`], `GET /api/admin/forecast`), counting the reset credits each
//!   account holds (as the quota poller last read them from `/wham/usage`): a credit is spent
//!   when its account runs out and gives it a fresh window (`shared_state::forecast`). The
//!   pool's run-out without them is shown next to it, so the credits' worth is visible.
//!
//! # Usage
//! The sidecar samples every [`TICK`]; the API samples before each answer. Nothing here
//! changes eligibility: the estimates only feed the order of `quota_reset_priority`.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use serde::Serialize;
use shared_state::{
    forecast::{self, Binding, Clock, Window},
    Snapshot,
};

/// How often the sidecar samples the pool.
pub const TICK: Duration = Duration::from_secs(60);
/// How far back a burn estimate looks.
pub const LOOKBACK: Duration = Duration::from_secs(2 * 3600);
/// The shortest span of samples that gives an estimate.
pub const MIN_SPAN: Duration = Duration::from_secs(60);
/// Samples kept per account.
const MAX_SAMPLES: usize = 256;
/// Closer samples with unchanged values are not kept.
const MIN_GAP_MS: u64 = 30_000;
/// Reset instants this close are the same window (the upstream's jitter).
const SAME_WINDOW_MS: u64 = 120_000;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    t: u64,
    p: f64,
    p_reset: u64,
    s: f64,
    s_reset: u64,
}

/// Where an account's burn figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BurnSource {
    /// Observed on the account.
    Account,
    /// The mean of its plan's accounts.
    Plan,
    /// Nothing known.
    None,
}

/// Samples and burn estimates (see the module docs).
#[derive(Debug)]
pub struct Forecaster {
    clock: Clock,
    history: Mutex<HashMap<i64, VecDeque<Sample>>>,
}

/// The burn of one window: `(percent per hour, source)`.
type Burn = (f64, BurnSource);

// === impl Forecaster ===

impl Forecaster {
    /// An estimator reading `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            history: Mutex::new(HashMap::new()),
        }
    }

    /// Now, by the forecast's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Samples every counted account of `snap` now, estimates the burns and publishes them
    /// into the accounts' live state. Returns the time sampled and each account's
    /// `(primary, secondary)` burn.
    pub fn sample(&self, snap: &Snapshot) -> (u64, HashMap<i64, (Burn, Burn)>) {
        let now = self.now_ms();
        let mut observed: HashMap<i64, (Option<f64>, Option<f64>)> = HashMap::new();
        {
            let mut hist = self
                .history
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            hist.retain(|id, _| snap.accounts.iter().any(|a| a.id == *id));
            for a in snap.accounts.iter().filter(|a| forecast::counts(a)) {
                let (p, s) = forecast::windows_of(a);
                if p.reset_at_ms == 0
                    && s.reset_at_ms == 0
                    && p.used_pct == 0.0
                    && s.used_pct == 0.0
                {
                    // No quota observation yet: nothing to sample.
                    continue;
                }
                let sample = Sample {
                    t: now,
                    p: p.used_at(now),
                    p_reset: if p.reset_at_ms > now {
                        p.reset_at_ms
                    } else {
                        0
                    },
                    s: s.used_at(now),
                    s_reset: if s.reset_at_ms > now {
                        s.reset_at_ms
                    } else {
                        0
                    },
                };
                let h = hist.entry(a.id).or_default();
                push(h, sample);
                observed.insert(
                    a.id,
                    (estimate(h, Which::Primary), estimate(h, Which::Secondary)),
                );
            }
        }
        // Plan means of the observed burns, for accounts without their own.
        let mut plans: HashMap<&str, (f64, usize, f64, usize)> = HashMap::new();
        for a in snap.accounts.iter() {
            let Some((p, s)) = observed.get(&a.id) else {
                continue;
            };
            let e = plans.entry(plan_of(a.plan.as_deref())).or_default();
            if let Some(p) = p {
                e.0 += p;
                e.1 += 1;
            }
            if let Some(s) = s {
                e.2 += s;
                e.3 += 1;
            }
        }
        let mut burns = HashMap::new();
        for a in snap.accounts.iter() {
            let (p, s) = observed.get(&a.id).copied().unwrap_or((None, None));
            let plan = plans
                .get(plan_of(a.plan.as_deref()))
                .copied()
                .unwrap_or_default();
            let pick = |own: Option<f64>, sum: f64, n: usize| match own {
                Some(v) => (v, BurnSource::Account),
                None if n > 0 => (sum / n as f64, BurnSource::Plan),
                None => (0.0, BurnSource::None),
            };
            let bp = pick(p, plan.0, plan.1);
            let bs = pick(s, plan.2, plan.3);
            let live = a.live.scheduler();
            live.burn_primary_pct_h.store(bp.0);
            live.burn_secondary_pct_h.store(bs.0);
            burns.insert(a.id, (bp, bs));
        }
        (now, burns)
    }

    /// Samples, then forecasts every account and the pool; `credits`: the reset credits per
    /// account id (absent: none known).
    pub fn view(&self, snap: &Snapshot, credits: &HashMap<i64, u64>) -> ForecastView {
        let (now, burns) = self.sample(snap);
        let credits_of = |id: i64| {
            credits
                .get(&id)
                .map_or(0, |&n| u32::try_from(n).unwrap_or(u32::MAX))
        };
        let mut members = Vec::new();
        let mut plans: BTreeMap<String, PlanView> = BTreeMap::new();
        let mut accounts = Vec::with_capacity(snap.accounts.len());
        for a in snap.accounts.iter() {
            let counted = forecast::counts(a);
            let ((bp, sp), (bs, ss)) = burns
                .get(&a.id)
                .copied()
                .unwrap_or(((0.0, BurnSource::None), (0.0, BurnSource::None)));
            let (p, s) = forecast::windows_of(a);
            let member = forecast::Member {
                reset_credits: credits_of(a.id),
                ..forecast::member(a)
            };
            let f = forecast::account(&member, now);
            let plan = plan_of(a.plan.as_deref()).to_owned();
            if counted {
                members.push(member);
                let e = plans.entry(plan.clone()).or_insert_with(|| PlanView {
                    plan: plan.clone(),
                    ..Default::default()
                });
                e.accounts += 1;
                if sp == BurnSource::Account {
                    e.observed += 1;
                    e.burn_primary_pct_per_hour += bp;
                    e.burn_secondary_pct_per_hour += bs;
                }
            }
            accounts.push(AccountForecastView {
                id: a.id,
                label: a.label.clone(),
                plan,
                counted,
                schedulable: a.is_schedulable(now),
                primary: window_view(&p, now, bp, sp),
                secondary: window_view(&s, now, bs, ss),
                exhausts_at_ms: f.exhausts_at_ms,
                binding: f.binding.map(|b| match b {
                    Binding::Primary => "primary",
                    Binding::Secondary => "secondary",
                }),
                capacity_returns_at_ms: f.returns_at_ms.filter(|&r| r != 0),
                reset_credits: credits.get(&a.id).copied(),
                credits_used: f.credits_used,
            });
        }
        for p in plans.values_mut() {
            if p.observed > 0 {
                p.burn_primary_pct_per_hour /= p.observed as f64;
                p.burn_secondary_pct_per_hour /= p.observed as f64;
            }
        }
        let pool = forecast::pool(&members, now);
        let total_credits: u64 = members.iter().map(|m| u64::from(m.reset_credits)).sum();
        // The same pool without its credits, for comparison (only worth simulating with some).
        let without = if total_credits == 0 {
            pool
        } else {
            let bare: Vec<forecast::Member> = members
                .iter()
                .map(|m| forecast::Member {
                    reset_credits: 0,
                    ..*m
                })
                .collect();
            forecast::pool(&bare, now)
        };
        ForecastView {
            now_ms: now,
            pool: PoolView {
                accounts: accounts.iter().filter(|a| a.counted).count(),
                available_now: pool.available_now,
                demand_pct_per_hour: pool.demand_pct_h,
                exhausts_at_ms: pool.exhausts_at_ms,
                capacity_returns_at_ms: pool.returns_at_ms.filter(|&r| r != 0),
                reset_credits: total_credits,
                credits_used: pool.credits_used,
                exhausts_without_credits_at_ms: without.exhausts_at_ms,
            },
            plans: plans.into_values().collect(),
            accounts,
            lookback_s: LOOKBACK.as_secs(),
        }
    }
}

/// The plan name accounts are grouped by.
fn plan_of(plan: Option<&str>) -> &str {
    plan.filter(|p| !p.is_empty()).unwrap_or("unknown")
}

/// Appends a sample unless it repeats the last one within [`MIN_GAP_MS`] (one at the same
/// instant replaces it); keeps at most
/// [`MAX_SAMPLES`] within [`LOOKBACK`] (plus the one before, as the span's start).
fn push(h: &mut VecDeque<Sample>, s: Sample) {
    if let Some(last) = h.back_mut() {
        if s.t < last.t {
            return;
        }
        if s.t == last.t {
            // A newer observation at the same instant supersedes.
            *last = s;
            return;
        }
        let same = last.p == s.p && last.s == s.s;
        if s.t - last.t < MIN_GAP_MS && same {
            return;
        }
    }
    h.push_back(s);
    let horizon = s.t.saturating_sub(LOOKBACK.as_millis() as u64);
    while h.len() > MAX_SAMPLES || (h.len() > 2 && h[1].t <= horizon) {
        h.pop_front();
    }
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Primary,
    Secondary,
}

/// The burn of one window over the newest run of samples of the same window with a
/// non-decreasing use, within [`LOOKBACK`]; `None` below [`MIN_SPAN`].
fn estimate(h: &VecDeque<Sample>, which: Which) -> Option<f64> {
    let get = |s: &Sample| match which {
        Which::Primary => (s.p, s.p_reset),
        Which::Secondary => (s.s, s.s_reset),
    };
    let last = h.back()?;
    let (last_used, last_reset) = get(last);
    let horizon = last.t.saturating_sub(LOOKBACK.as_millis() as u64);
    let mut first = last;
    let mut next_used = last_used;
    for s in h.iter().rev().skip(1) {
        let (used, reset) = get(s);
        let same_window =
            reset == 0 || last_reset == 0 || reset.abs_diff(last_reset) <= SAME_WINDOW_MS;
        if s.t < horizon || !same_window || used > next_used {
            break;
        }
        first = s;
        next_used = used;
    }
    let span = last.t - first.t;
    if span < MIN_SPAN.as_millis() as u64 {
        return None;
    }
    let (first_used, _) = get(first);
    Some(((last_used - first_used) / (span as f64 / 3_600_000.0)).max(0.0))
}

fn window_view(w: &Window, now: u64, burn: f64, source: BurnSource) -> WindowView {
    WindowView {
        used_pct: w.used_at(now),
        reset_at_ms: (w.reset_at_ms > now).then_some(w.reset_at_ms),
        burn_pct_per_hour: burn,
        burn_source: source,
        exhausts_at_ms: forecast::window_exhausts_at(
            &Window {
                burn_pct_h: burn,
                ..*w
            },
            now,
        ),
    }
}

/// `GET /api/admin/forecast`.
#[derive(Debug, Serialize)]
pub struct ForecastView {
    /// When the forecast was made (the forecast's clock), ms since epoch.
    pub now_ms: u64,
    /// The whole pool.
    pub pool: PoolView,
    /// Burn per plan (mean of the accounts with an observed burn).
    pub plans: Vec<PlanView>,
    /// Every account.
    pub accounts: Vec<AccountForecastView>,
    /// How far back burn estimates look, seconds.
    pub lookback_s: u64,
}

/// The pool's forecast.
#[derive(Debug, Serialize)]
pub struct PoolView {
    /// Accounts counted (active, with a token).
    pub accounts: usize,
    /// Accounts that can serve now.
    pub available_now: usize,
    /// Sum of the accounts' primary burns (percent of one account's 5-hour window per hour).
    pub demand_pct_per_hour: f64,
    /// When no account can serve any more at this demand (`null`: not within 8 days).
    pub exhausts_at_ms: Option<u64>,
    /// When the first account can serve again after that.
    pub capacity_returns_at_ms: Option<u64>,
    /// Reset credits the counted accounts hold.
    pub reset_credits: u64,
    /// Of those, how many the forecast spends before the pool runs out (each when its
    /// account runs out).
    pub credits_used: u32,
    /// When the pool would run out without any reset credit (`null`: not within 8 days).
    pub exhausts_without_credits_at_ms: Option<u64>,
}

/// One plan's burn.
#[derive(Debug, Default, Serialize)]
pub struct PlanView {
    /// Plan name (`unknown` when the token names none).
    pub plan: String,
    /// Accounts of the plan counted.
    pub accounts: usize,
    /// Accounts with a burn of their own.
    pub observed: usize,
    /// Mean primary burn of those, percent per hour.
    pub burn_primary_pct_per_hour: f64,
    /// Mean secondary burn of those, percent per hour.
    pub burn_secondary_pct_per_hour: f64,
}

/// One window of an account.
#[derive(Debug, Serialize)]
pub struct WindowView {
    /// Used percent now.
    pub used_pct: f64,
    /// Next reset, ms since epoch, when known.
    pub reset_at_ms: Option<u64>,
    /// The burn the forecast uses, percent per hour.
    pub burn_pct_per_hour: f64,
    /// Where it comes from.
    pub burn_source: BurnSource,
    /// When this window runs out at that burn (`null`: it lasts to its reset).
    pub exhausts_at_ms: Option<u64>,
}

/// One account's forecast.
#[derive(Debug, Serialize)]
pub struct AccountForecastView {
    /// Storage id.
    pub id: i64,
    /// Label.
    pub label: String,
    /// Plan.
    pub plan: String,
    /// Counted in the pool (active, with a token).
    pub counted: bool,
    /// Schedulable now.
    pub schedulable: bool,
    /// The 5-hour window.
    pub primary: WindowView,
    /// The weekly window.
    pub secondary: WindowView,
    /// When the account runs out, after spending its reset credits (`null`: it lasts to its
    /// resets).
    pub exhausts_at_ms: Option<u64>,
    /// Which window runs out first.
    pub binding: Option<&'static str>,
    /// When it can serve again after running out.
    pub capacity_returns_at_ms: Option<u64>,
    /// Reset credits it holds, as last polled (`null`: not polled yet).
    pub reset_credits: Option<u64>,
    /// Of those, how many the forecast spends before that run-out.
    pub credits_used: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 60_000;

    fn s(t_min: u64, p: f64, p_reset: u64) -> Sample {
        Sample {
            t: t_min * M,
            p,
            p_reset,
            s: p / 10.0,
            s_reset: 10_000 * M,
        }
    }

    #[test]
    fn burn_is_the_rise_within_one_window() {
        let mut h = VecDeque::new();
        push(&mut h, s(0, 10.0, 300 * M));
        assert_eq!(estimate(&h, Which::Primary), None, "one sample");
        push(&mut h, s(30, 40.0, 300 * M));
        assert_eq!(estimate(&h, Which::Primary), Some(60.0));
        assert_eq!(estimate(&h, Which::Secondary), Some(6.0));
        // A new window (reset moved, use dropped): the estimate starts over.
        push(&mut h, s(40, 2.0, 600 * M));
        assert_eq!(estimate(&h, Which::Primary), None);
        push(&mut h, s(70, 12.0, 600 * M));
        assert_eq!(estimate(&h, Which::Primary), Some(20.0));
    }

    #[test]
    fn repeats_are_not_kept_and_old_samples_age_out() {
        let mut h = VecDeque::new();
        push(&mut h, s(0, 10.0, 300 * M));
        let mut again = s(0, 10.0, 300 * M);
        again.t += 1_000;
        push(&mut h, again);
        assert_eq!(h.len(), 1);
        for m in 1..=200 {
            push(&mut h, s(m, 10.0 + m as f64 * 0.1, 300 * M));
        }
        // Two hours of samples (plus the one starting the span).
        assert!(h.len() <= 122, "{}", h.len());
        let b = estimate(&h, Which::Primary).expect("estimate");
        assert!((b - 6.0).abs() < 1e-6, "{b}");
    }
}
