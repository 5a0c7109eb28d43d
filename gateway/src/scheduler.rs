//! The account scheduler: the one owner of "which accounts, in which order" for a request
//! (design.md §3, *freeze the candidate order*).
//!
//! # Key Components
//! - [`order`] / [`order_with`]: the frozen candidate order of one request: unique accounts,
//!   schedulable ones only, at most [`PickRequest::max_candidates`] of them, best first.
//! - [`Strategy`] (in [`shared_state::Settings::strategy`]):
//!   - `smart` (default): health [`Tier`] first, then a score ([`assess`]) from decaying
//!     penalties (401, 429, timeouts, 5xx, Cloudflare), the EWMA error rate and first-token
//!     latency, quota usage and load; near-equal scores are broken by weighted randomness
//!     so load spreads. With an affinity key the session's rendezvous-hash home account goes
//!     first while it is `Healthy` or `Warm` (soft affinity). Above [`SMART_SAMPLE`]
//!     accounts it scores a pseudo-random sample instead of the whole pool (power of many
//!     choices), widening the walk only while fewer than `max_candidates` healthy accounts
//!     were seen.
//!   - `round_robin`: rotate by the worker's cursor; an account with weight `w` leads `w`
//!     times per cycle.
//!   - `fill_first`: fixed order by id, so one account fills up to its concurrency limit
//!     before the next one gets traffic.
//!   - `sticky`: rendezvous (highest-random-weight, weight-aware) hashing of the affinity
//!     key over schedulable accounts; deterministic across workers and instances, and a
//!     session moves only when its account stops being schedulable. No key: `smart`.
//!   - `quota_reset_priority`: accounts with quota left whose primary (then secondary)
//!     window resets soonest first; unhealthy or exhausted accounts last. Accounts the quota
//!     forecast (`shared_state::forecast`, over the burn the sidecar observes) sees using up
//!     their quota before their reset anyway come after those that would lose quota at
//!     their reset (use it or lose it); the forecast changes the order only, never
//!     eligibility.
//! - Eligibility ([`is_eligible`]): active status (with the data plane's override), a token,
//!   no cooldown, usage below [`shared_state::Settings::pause_threshold_pct`] in both windows,
//!   the model not excluded for the account ([`exclude_model`]), and
//!   [`shared_state::Settings::min_request_interval_ms`] elapsed since the account's last
//!   request start. Accounts that cannot serve at once (at their dynamic concurrency limit,
//!   or waiting for a refreshed token) stay in the order but come after every ready account
//!   (in the strategy's order), so a pool where everything is busy still yields candidates
//!   to queue on.
//! - Feedback the lifecycle records: [`record_success`], [`record_failure`] (with
//!   [`FailureKind::from_class`]), [`note_request_start`], [`exclude_model`].
//! - Dynamic concurrency: [`effective_limit`] is what the lifecycle passes to
//!   `AccountLive::try_acquire`; unhealthy tiers get fewer slots ([`Tier::limit`]).
//!
//! Penalties only change the order and the dynamic concurrency. Cooldowns and status changes
//! stay with `crate::policy`; the model exclusion is the one eligibility effect recorded
//! here, and `policy` decides when to apply it.
//!
//! # Usage
//! ```ignore
//! let snap = ctx.snapshot.load_full();
//! let now = shared_state::now_ms();
//! let cands = scheduler::order(&snap, &PickRequest {
//!     model: &plan.model,
//!     affinity_key: key.as_deref(), // scoped_affinity_key(plan.key_id, session)
//!     now_ms: now,
//!     cursor: ctx.next_cursor(),
//!     max_candidates: max_attempts + 2,
//! });
//! for account in &cands {
//!     let limit = scheduler::effective_limit(account, &snap.settings, now);
//!     let Some(lease) = account.live.try_acquire(limit) else { continue };
//!     if !scheduler::note_request_start(account, &snap.settings, now) { continue }
//!     // ... attempt; then record_success / record_failure
//! }
//! ```
//!
//! # Cost
//! Nothing here locks or allocates per account: every account read is a handful of atomic
//! loads. Per worker, a [`PickScratch`] (thread-local behind [`order`]) caches per-snapshot
//! arrays (rendezvous hashes, inverse weights, weight prefix sums) and reuses its buffers;
//! selection keeps only the best `max_candidates` (bounded top-k, or `select_nth_unstable`
//! then a sort of k). `round_robin` and `fill_first` stop after `k` ready accounts; `smart`
//! scores a bounded sample; `sticky` hashes the whole pool (a mix and a compare per account;
//! the weighted logarithm only for accounts that can still enter the top) but reads live
//! state only for its top candidates; `quota_reset_priority` needs the global minimum, so it
//! reads every account's reset instants and assesses only those that can still enter the
//! top. `benches/pick.rs` (k = 5, busy mixed pool) measured on the 2-core dev box, per pick
//! at 10 / 1k / 10k accounts: smart 0.6 / 8.7 / 13.5 µs, smart+key 1.2 / 18 / 90 µs,
//! round_robin 0.2 / 0.25 / 0.25 µs, sticky 0.6 / 9.5 / 48 µs, fill_first 0.2 µs,
//! quota_reset_priority 0.6 / 6.7 / 67 µs.
//!
//! # Error handling
//! None: an empty result means no account is schedulable now; the lifecycle turns that into
//! its own "no account" / "quota exhausted" error.

mod hash;
mod health;
#[cfg(test)]
mod tests;

use std::{
    cell::RefCell,
    sync::{Arc, Weak},
    time::Duration,
};

pub(crate) use health::quota_pcts;
pub use health::{
    assess, base_limit, decayed_penalty, effective_limit, record_failure, record_success,
    record_success_at, reset_feedback, Assessment, FailureKind, Tier, BASE_SCORE, ERROR_RATE_ALPHA,
    LATENCY_ALPHA, PENALTY_CAP,
};
pub use shared_state::snapshot::{Strategy, UnknownStrategy};
use shared_state::{AccountEntry, AccountLive, Settings, Snapshot};

use self::hash::{coprime_stride, hrw_hash, hrw_key, id_hash, key_hash, mix64, unit_of, Rng, TopK};

/// Pools up to this size are scored whole by `smart`; larger ones are sampled.
pub const SMART_SAMPLE: usize = 128;
/// `smart` scores at least this many accounts per wanted candidate.
const SMART_SAMPLE_PER_CANDIDATE: usize = 8;
/// Rendezvous candidates `sticky` reads beyond `max_candidates` before falling back to a
/// full pass.
const STICKY_SLACK: usize = 8;
/// Rendezvous candidates examined for the soft-affinity home in `smart`.
const AFFINITY_PROBE: usize = 8;
/// Score points that count as "equal" in `smart` (randomness decides within a bucket).
const SCORE_BUCKET: f64 = 8.0;
/// Selections up to this size use the bounded top-k; larger ones collect and select.
const TOPK_MAX: usize = 32;

/// How long an account stays excluded for a model after "model not supported" (a plan does
/// not gain a model often; a catalog refresh may lift it earlier with `ModelExclusions::lift`).
pub const MODEL_EXCLUSION_TTL: Duration = Duration::from_secs(3600);

/// The affinity key of a client's session signal: scoped per client key, so two client keys
/// sending the same `prompt_cache_key` or session id never share a home account.
pub fn scoped_affinity_key(client_key_id: i64, session: &str) -> String {
    format!("{client_key_id}\u{1f}{session}")
}

/// What the scheduler needs to know about one request.
#[derive(Debug, Clone, Copy)]
pub struct PickRequest<'a> {
    /// The upstream model (after alias resolution): accounts excluded for it are skipped.
    pub model: &'a str,
    /// The client's session signal (session-id / thread-id / body session ids /
    /// prompt_cache_key), chosen by the caller and scoped per client key with
    /// [`scoped_affinity_key`]; drives `sticky` and the soft affinity of `smart`.
    pub affinity_key: Option<&'a str>,
    /// The clock (ms since epoch) every rule of this pick uses.
    pub now_ms: u64,
    /// The worker's round-robin cursor (`WorkerCtx::next_cursor()`); also seeds the
    /// randomness of `smart`.
    pub cursor: usize,
    /// How many candidates to return (the attempt budget plus some headroom for leases
    /// lost to races); 0 = every schedulable account, fully ordered.
    pub max_candidates: usize,
    /// The client key's account group: only accounts of exactly this group (`None`: the
    /// shared pool, accounts without a group) are candidates.
    pub group: Option<&'a str>,
}

/// Per-worker reusable state of [`order_with`]: buffers plus arrays derived from the current
/// snapshot (rebuilt when the snapshot changes).
#[derive(Debug, Default)]
pub struct PickScratch {
    index: Option<SnapshotIndex>,
    sel: Selector,
    hrw: Selector,
    picked: Vec<u32>,
    spill: Vec<u32>,
}

/// Arrays derived from one snapshot's account list.
#[derive(Debug)]
struct SnapshotIndex {
    /// Identity of the snapshot (the `Weak` keeps its allocation, so the address is not reused).
    snap: Weak<Snapshot>,
    /// Rendezvous input per account.
    id_hash: Vec<u64>,
    /// Inverse weights, `None` when all weights are equal (then unweighted hashing gives the
    /// same order, cheaper).
    inv_weights: Option<Vec<f64>>,
    /// Inclusive prefix sums of the weights.
    cum_weight: Vec<u64>,
}

// === impl SnapshotIndex ===

impl SnapshotIndex {
    fn build(snap: &Arc<Snapshot>) -> Self {
        let accounts = &snap.accounts;
        let id_hash = accounts.iter().map(|a| id_hash(a.id)).collect();
        let first = accounts.first().map_or(1, |a| a.weight.max(1));
        let uniform = accounts.iter().all(|a| a.weight.max(1) == first);
        let inv_weights = (!uniform).then(|| {
            accounts
                .iter()
                .map(|a| 1.0 / f64::from(a.weight.max(1)))
                .collect()
        });
        let mut total = 0u64;
        let cum_weight = accounts
            .iter()
            .map(|a| {
                total += u64::from(a.weight.max(1));
                total
            })
            .collect();
        Self {
            snap: Arc::downgrade(snap),
            id_hash,
            inv_weights,
            cum_weight,
        }
    }

    fn is_for(&self, snap: &Arc<Snapshot>) -> bool {
        std::ptr::eq(self.snap.as_ptr(), Arc::as_ptr(snap))
    }

    fn inv_weight(&self, i: usize) -> Option<f64> {
        self.inv_weights.as_ref().map(|w| w[i])
    }
}

/// Keeps the `k` smallest `(key, index)` pairs: a bounded top-k for small `k`, else collect
/// then `select_nth_unstable` and sort the `k`.
#[derive(Debug, Default)]
struct Selector {
    k: usize,
    top: TopK,
    all: Vec<(u128, u32)>,
}

// === impl Selector ===

impl Selector {
    fn begin(&mut self, k: usize) {
        self.k = k;
        self.all.clear();
        if k <= TOPK_MAX {
            self.top.reset(k);
        }
    }

    #[inline]
    fn admits(&self, key: u128) -> bool {
        self.k > TOPK_MAX || self.top.admits(key)
    }

    /// The key a newcomer must beat, when known (bounded top-k and full).
    #[inline]
    fn bound(&self) -> Option<u128> {
        if self.k > TOPK_MAX {
            None
        } else {
            self.top.worst()
        }
    }

    #[inline]
    fn offer(&mut self, key: u128, idx: u32) {
        if self.k <= TOPK_MAX {
            self.top.push(key, idx);
        } else {
            self.all.push((key, idx));
        }
    }

    /// The selected pairs, best first.
    fn finish(&mut self) -> &[(u128, u32)] {
        if self.k <= TOPK_MAX {
            return self.top.items();
        }
        if self.all.len() > self.k {
            self.all.select_nth_unstable_by_key(self.k - 1, |e| e.0);
            self.all.truncate(self.k);
        }
        self.all.sort_unstable_by_key(|e| e.0);
        &self.all
    }
}

thread_local! {
    static SCRATCH: RefCell<PickScratch> = RefCell::new(PickScratch::default());
}

/// The frozen candidate order for one request, using this thread's [`PickScratch`]
/// (workers are threads, so every worker gets its own).
pub fn order(snapshot: &Arc<Snapshot>, req: &PickRequest<'_>) -> Vec<Arc<AccountEntry>> {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => order_with(snapshot, req, &mut scratch),
        Err(_) => order_with(snapshot, req, &mut PickScratch::default()),
    })
}

/// The frozen candidate order for one request: unique schedulable accounts, best first, at
/// most `req.max_candidates` (0 = all) of them, following `snapshot.settings.strategy`.
pub fn order_with(
    snapshot: &Arc<Snapshot>,
    req: &PickRequest<'_>,
    scratch: &mut PickScratch,
) -> Vec<Arc<AccountEntry>> {
    let n = snapshot.accounts.len();
    if n == 0 {
        return Vec::new();
    }
    if !scratch.index.as_ref().is_some_and(|ix| ix.is_for(snapshot)) {
        scratch.index = Some(SnapshotIndex::build(snapshot));
    }
    let k = if req.max_candidates == 0 {
        n
    } else {
        req.max_candidates.min(n)
    };
    let pick = Pick {
        accounts: &snapshot.accounts,
        settings: &snapshot.settings,
        req,
        k,
    };
    let PickScratch {
        index,
        sel,
        hrw,
        picked,
        spill,
    } = scratch;
    let Some(index) = index.as_ref() else {
        return Vec::new();
    };
    picked.clear();
    spill.clear();
    match (snapshot.settings.strategy, req.affinity_key) {
        (Strategy::Smart, _) | (Strategy::Sticky, None) => {
            pick.smart(index, sel, hrw, picked, snapshot.version)
        }
        (Strategy::RoundRobin, _) => pick.round_robin(index, picked, spill),
        (Strategy::FillFirst, _) => pick.walk(0, picked, spill),
        (Strategy::Sticky, Some(key)) => pick.sticky(index, key, sel, hrw, picked, spill),
        (Strategy::QuotaResetPriority, _) => pick.quota_reset_priority(index, sel, picked),
    }
    picked
        .iter()
        .map(|&i| Arc::clone(&snapshot.accounts[i as usize]))
        .collect()
}

/// True when `entry` may be picked for `model` at `now_ms` (concurrency aside).
pub fn is_eligible(entry: &AccountEntry, settings: &Settings, model: &str, now_ms: u64) -> bool {
    if !entry.is_schedulable(now_ms) {
        return false;
    }
    let live = &*entry.live;
    let s = live.scheduler();
    if let Some(th) = settings.pause_threshold_pct {
        let (p, q) = health::quota_pcts(live, now_ms);
        if p >= th || q >= th {
            return false;
        }
    }
    if s.excluded_models.is_excluded(model, now_ms) {
        return false;
    }
    let interval = settings.min_request_interval_ms;
    if interval > 0 {
        let last = s.last_request_ms.load(std::sync::atomic::Ordering::Acquire);
        if last != 0 && now_ms < last.saturating_add(interval) {
            return false;
        }
    }
    true
}

/// Records that a request starts on `entry` at `now_ms`, after its lease was taken. With a
/// minimum request interval this *claims* the interval atomically: it returns false (drop
/// the lease and move on) when another request started on the account less than
/// `min_request_interval_ms` ago, so two workers never both slip through.
pub fn note_request_start(entry: &AccountEntry, settings: &Settings, now_ms: u64) -> bool {
    use std::sync::atomic::Ordering;
    let last = &entry.live.scheduler().last_request_ms;
    let interval = settings.min_request_interval_ms;
    if interval == 0 {
        last.fetch_max(now_ms, Ordering::AcqRel);
        return true;
    }
    let mut cur = last.load(Ordering::Acquire);
    loop {
        if cur != 0 && now_ms < cur.saturating_add(interval) {
            return false;
        }
        match last.compare_exchange_weak(cur, now_ms, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Excludes `model` on this account until `until_ms` (use `now + MODEL_EXCLUSION_TTL`)
/// after a "model not supported" answer; other models and other accounts are unaffected.
pub fn exclude_model(live: &AccountLive, model: &str, until_ms: u64, now_ms: u64) {
    live.scheduler()
        .excluded_models
        .exclude(model, until_ms, now_ms);
}

/// One pick's inputs.
struct Pick<'a> {
    accounts: &'a [Arc<AccountEntry>],
    settings: &'a Settings,
    req: &'a PickRequest<'a>,
    k: usize,
}

// === impl Pick ===

impl Pick<'_> {
    /// The assessment of account `i` when it is eligible now (it may still be saturated).
    #[inline]
    fn candidate(&self, i: usize) -> Option<Assessment> {
        let e = &self.accounts[i];
        if e.group.as_deref() != self.req.group
            || !is_eligible(e, self.settings, self.req.model, self.req.now_ms)
        {
            return None;
        }
        Some(assess(e, self.settings, self.req.now_ms))
    }

    /// Takes eligible accounts in the order of `indices`: ready ones into `picked`, deferred
    /// ones (saturated, refreshing) into `spill` (at most `k`). Returns true once `picked`
    /// holds `k`.
    fn take_in_order(
        &self,
        indices: impl Iterator<Item = usize>,
        picked: &mut Vec<u32>,
        spill: &mut Vec<u32>,
    ) -> bool {
        for i in indices {
            let Some(a) = self.candidate(i) else {
                continue;
            };
            if !a.deferred() {
                picked.push(i as u32);
                if picked.len() >= self.k {
                    return true;
                }
            } else if spill.len() < self.k {
                spill.push(i as u32);
            }
        }
        false
    }

    /// Appends deferred accounts after the ready ones, up to `k`.
    fn fill_from_spill(&self, picked: &mut Vec<u32>, spill: &[u32]) {
        let room = self.k.saturating_sub(picked.len());
        picked.extend(spill.iter().take(room));
    }

    /// Walks the pool from `start` (wrapping), keeping the first `k` candidates.
    fn walk(&self, start: usize, picked: &mut Vec<u32>, spill: &mut Vec<u32>) {
        let n = self.accounts.len();
        if !self.take_in_order((0..n).map(|j| (start + j) % n), picked, spill) {
            self.fill_from_spill(picked, spill);
        }
    }

    fn round_robin(&self, index: &SnapshotIndex, picked: &mut Vec<u32>, spill: &mut Vec<u32>) {
        let total = index.cum_weight.last().copied().unwrap_or(0).max(1);
        let slot = (self.req.cursor as u64) % total;
        let start = index.cum_weight.partition_point(|&c| c <= slot);
        self.walk(start, picked, spill);
    }

    /// Rendezvous order of the whole pool: fills `hrw` with the `m` best pairs.
    fn hrw_top(&self, index: &SnapshotIndex, kh: u64, m: usize, hrw: &mut Selector) {
        hrw.begin(m);
        match &index.inv_weights {
            None => {
                for (i, &ih) in index.id_hash.iter().enumerate() {
                    let key = u128::from(hrw_key(kh, ih, None));
                    if hrw.admits(key) {
                        hrw.offer(key, i as u32);
                    }
                }
            }
            Some(iw) => {
                for (i, (&ih, &iw)) in index.id_hash.iter().zip(iw).enumerate() {
                    // Skip the logarithm when the lower bound (1 - u) / w already loses.
                    if let Some(b) = hrw.bound() {
                        let u = unit_of(hrw_hash(kh, ih));
                        if (1.0 - u) * iw >= f64::from_bits(b as u64) {
                            continue;
                        }
                    }
                    hrw.offer(u128::from(hrw_key(kh, ih, Some(iw))), i as u32);
                }
            }
        }
    }

    fn sticky(
        &self,
        index: &SnapshotIndex,
        key: &str,
        sel: &mut Selector,
        hrw: &mut Selector,
        picked: &mut Vec<u32>,
        spill: &mut Vec<u32>,
    ) {
        let n = self.accounts.len();
        let kh = key_hash(key);
        let m = (self.k + STICKY_SLACK).min(n);
        self.hrw_top(index, kh, m, hrw);
        let top = hrw.finish().iter().map(|e| e.1 as usize);
        if self.take_in_order(top, picked, spill) {
            return;
        }
        if m >= n {
            self.fill_from_spill(picked, spill);
            return;
        }
        // Too many of the top hashes are unschedulable or busy: rank every candidate, free
        // ones first.
        picked.clear();
        sel.begin(self.k);
        for i in 0..n {
            let key = u128::from(hrw_key(kh, index.id_hash[i], index.inv_weight(i)));
            if !sel.admits(key) {
                continue;
            }
            if let Some(a) = self.candidate(i) {
                sel.offer(key | (u128::from(a.deferred()) << 127), i as u32);
            }
        }
        picked.extend(sel.finish().iter().map(|e| e.1));
    }

    /// The session's home under soft affinity: the first account in rendezvous order that
    /// is a candidate and at most `Warm`.
    fn affinity_home(&self, index: &SnapshotIndex, key: &str, hrw: &mut Selector) -> Option<u32> {
        let m = AFFINITY_PROBE.min(self.accounts.len());
        self.hrw_top(index, key_hash(key), m, hrw);
        hrw.finish().iter().map(|e| e.1).find(|&i| {
            self.candidate(i as usize)
                .is_some_and(|a| !a.deferred() && a.tier <= Tier::Warm)
        })
    }

    fn smart(
        &self,
        index: &SnapshotIndex,
        sel: &mut Selector,
        hrw: &mut Selector,
        picked: &mut Vec<u32>,
        version: u64,
    ) {
        let n = self.accounts.len();
        let mut rng =
            Rng::new(mix64(self.req.cursor as u64) ^ self.req.now_ms.rotate_left(23) ^ version);
        let home = self
            .req
            .affinity_key
            .and_then(|key| self.affinity_home(index, key, hrw));
        if let Some(h) = home {
            picked.push(h);
        }
        let want = self.k.saturating_sub(picked.len());
        if want == 0 {
            return;
        }
        let sample = SMART_SAMPLE.max(SMART_SAMPLE_PER_CANDIDATE * want);
        let stride = coprime_stride(n, rng.next_u64());
        let mut pos = (rng.next_u64() % n as u64) as usize;
        let mut healthy = 0usize;
        sel.begin(want);
        for visited in 0..n {
            if visited >= sample && healthy >= want {
                break;
            }
            let i = pos;
            pos += stride;
            if pos >= n {
                pos -= n;
            }
            if home == Some(i as u32) {
                continue;
            }
            let Some(a) = self.candidate(i) else {
                continue;
            };
            if a.tier == Tier::Healthy && !a.deferred() {
                healthy += 1;
            }
            sel.offer(smart_key(&a, index.inv_weight(i), &mut rng), i as u32);
        }
        picked.extend(sel.finish().iter().map(|e| e.1));
    }

    fn quota_reset_priority(
        &self,
        index: &SnapshotIndex,
        sel: &mut Selector,
        picked: &mut Vec<u32>,
    ) {
        let now_s = self.req.now_ms / 1000;
        let mut rng = Rng::new(mix64(self.req.cursor as u64) ^ self.req.now_ms);
        // Unknown or already passed: after every known reset.
        let reset = |at: u64| -> u128 {
            if at > now_s {
                u128::from(at.min(u64::from(u32::MAX)))
            } else {
                u128::from(u32::MAX)
            }
        };
        sel.begin(self.k);
        for i in 0..self.accounts.len() {
            let live = &self.accounts[i].live;
            let resets =
                (reset(live.primary_reset_at()) << 92) | (reset(live.secondary_reset_at()) << 60);
            // The reset instants alone are a lower bound of the key: skip the rest early.
            if !sel.admits(resets) {
                continue;
            }
            let Some(a) = self.candidate(i) else {
                continue;
            };
            let saturated = u128::from(a.deferred());
            let unhealthy = u128::from(a.tier >= Tier::Risky);
            let exhausted = u128::from(a.quota_exhausted());
            let covered = u128::from(covered_before_reset(&self.accounts[i], self.req.now_ms));
            let rand = u128::from(random_key(index.inv_weight(i), &mut rng) >> 20);
            let key = (saturated << 127)
                | (unhealthy << 126)
                | (exhausted << 125)
                | (covered << 124)
                | resets
                | (u128::from(score_bucket(a.score).min(0xffff)) << 44)
                | rand;
            sel.offer(key, i as u32);
        }
        picked.extend(sel.finish().iter().map(|e| e.1));
    }
}

/// Whether the quota forecast says the account's remaining quota is used up before its
/// primary window resets at its observed burn (`shared_state::forecast`). Such an account
/// needs no priority to avoid losing quota at the reset, so `quota_reset_priority` puts the
/// accounts that would otherwise lose quota first. Order only: it stays eligible.
fn covered_before_reset(entry: &AccountEntry, now_ms: u64) -> bool {
    let f = shared_state::forecast::account_of(entry, now_ms);
    let reset_ms = entry.live.primary_reset_at().saturating_mul(1000);
    match f.exhausts_at_ms {
        Some(at) => at > now_ms && (reset_ms <= now_ms || at < reset_ms),
        None => false,
    }
}

/// Score bucket: lower is better.
fn score_bucket(score: f64) -> u64 {
    ((BASE_SCORE + 200.0 - score).max(0.0) / SCORE_BUCKET) as u64
}

/// Weighted random key, lower is better: an exponential clock `-ln(u)/w` (so the chance to
/// come first among equals is proportional to the weight; `inv_weight` is `1/w`), or a
/// plain random number.
fn random_key(inv_weight: Option<f64>, rng: &mut Rng) -> u64 {
    match inv_weight {
        None => rng.next_u64(),
        Some(iw) => (-rng.unit().ln() * iw).to_bits(),
    }
}

/// `smart`'s sort key, lower is better: free before saturated, then tier, then score
/// bucket, then weighted randomness.
fn smart_key(a: &Assessment, inv_weight: Option<f64>, rng: &mut Rng) -> u128 {
    (u128::from(a.deferred()) << 127)
        | (u128::from(a.tier as u8) << 120)
        | (u128::from(score_bucket(a.score).min(0xff_ffff)) << 64)
        | u128::from(random_key(inv_weight, rng))
}
