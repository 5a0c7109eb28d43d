//! The account scheduler: the one owner of "which accounts, in which order" for a request
//! (docs/conventions.md#lifecycle, *freeze the candidate order*).
//!
//! # Key Components
//! - [`order`] / [`order_with`]: the frozen candidate order of one request: unique accounts,
//!   schedulable ones only, at most [`PickRequest::max_candidates`] of them, best first.
//! - [`Strategy`] (in [`shared_state::Settings::strategy`]):
//!   - `smart` (default): health [`Tier`] first, then a score ([`assess`]) from decaying
//!     penalties (401, 429, timeouts, 5xx, Cloudflare), the EWMA error rate and first-token
//!     latency, quota usage and load; near-equal scores are broken by weighted randomness
//!     so load spreads. With an affinity key the session's rendezvous-hash home account goes
//!     first while it is `Healthy` or `Warm` (soft affinity). Small pools (fewer than two
//!     accounts per wanted candidate, at least [`SMART_SAMPLE`]) are scored whole; larger
//!     ones through a per-worker ranked index (`rank::TierIndex`: accounts by the sort key
//!     they had when last read, without the random part), best rank first, each rank in a
//!     pseudo-random order, every account read live; the walk stops once the selection
//!     holds `max_candidates` accounts that nothing in the next rank can beat.
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
//! - Session anti-affinity ([`avoid`], [`apply_avoidance`]): an account that refused a
//!   session's content (`cyber_policy`) goes behind every other candidate of that session for
//!   [`AVOID_TTL`]; [`earliest_comeback`]: when a cooling pool can serve again (the bounded
//!   wait of `Settings::max_wait_for_account_ms`).
//! - Feedback the lifecycle records: [`record_success`], [`record_failure`] (with
//!   [`FailureKind::from_class`]), [`note_request_start`], [`exclude_model`].
//! - [`board`]: every account's assessment and the candidate order the current strategy
//!   gives now, for the admin API's ops page (`shared_state::board`).
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
//! No pick scans the pool (issue 11). Nothing here locks or allocates per account beyond the
//! returned vector: every account read is a handful of atomic loads. Per worker, a
//! [`PickScratch`] (thread-local behind [`order`]) caches what it derives from the snapshot
//! (rendezvous hashes, inverse weights, weight prefix sums, rendezvous buckets, smart's
//! ranked index, the session cache, the order by reset instants), built once per snapshot
//! and then corrected lazily, never rebuilt from the whole pool per pick; selection keeps only
//! the best `max_candidates` (bounded top-k, or `select_nth_unstable` then a sort of k).
//! `round_robin` and `fill_first` stop after `k` ready accounts. `smart` reads about
//! `max_candidates` accounts from its ranked index plus one repair read (the index is only
//! where to look: eligibility and keys come from the live atomics, so a stale rank never
//! makes an ineligible account a candidate; see `rank`). `sticky` and the soft affinity walk
//! the session's rendezvous order (flat up to 256 accounts, two-level above: 128 id buckets
//! weighted by their accounts' weights, then the bucket's accounts, about 200 hashes at
//! 10,000 accounts), and a session's first `rank::SESSION_PREFIX` accounts of it come from a
//! per-worker cache after its first request, so a known session hashes its key once.
//! `quota_reset_priority` walks its order by reset instants and stops once the next reset
//! cannot beat the worst selected key; accounts whose instants moved earlier since are named
//! by `shared_state::account::reset_moves` (a bounded log) and offered beside the order, then
//! merged into it (a pass over the worker's array, no live read of the pool); it re-reads the
//! whole pool only when the log overflowed between two of its picks, and once a minute.
//! `benches/pick.rs` figures (old and new code in one run, CPU time and instructions per
//! pick) are in `benches/README.md`, "Account pick".
//!
//! # Error handling
//! None: an empty result means no account is schedulable now; the lifecycle turns that into
//! its own "no account" / "quota exhausted" error.

mod avoid;
mod board;
mod hash;
mod health;
mod rank;
#[cfg(test)]
pub(crate) mod tests;

use std::{
    cell::RefCell,
    collections::HashMap,
    sync::{Arc, Weak},
    time::Duration,
};

pub use avoid::{apply_avoidance, avoid, earliest_comeback, AVOID_TTL};
pub use board::board;
pub(crate) use health::quota_pcts;
pub use health::{
    assess, base_limit, decayed_penalty, effective_limit, record_failure, record_success,
    record_success_at, reset_feedback, Assessment, FailureKind, Tier, BASE_SCORE, ERROR_RATE_ALPHA,
    LATENCY_ALPHA, PENALTY_CAP,
};
pub use shared_state::snapshot::{Strategy, UnknownStrategy};
use shared_state::{AccountEntry, AccountLive, Settings, Snapshot};

use self::{
    hash::{
        bucket_hash, coprime_stride, hrw_hash, hrw_key, id_hash, key_hash, mix64, random_of,
        unit_of, Rng, TopK,
    },
    rank::{rank_floor, Rank, Sessions, TierIndex, OUT_RANK, SESSION_PREFIX},
};

/// Pools up to this size are scored whole by `smart`; larger ones are sampled.
pub const SMART_SAMPLE: usize = 8;
/// `smart` scores at least this many accounts per wanted candidate (power of two choices).
const SMART_SAMPLE_PER_CANDIDATE: usize = 2;
/// Rendezvous candidates `sticky` ranks beyond `max_candidates` before ranking the rest.
const STICKY_SLACK: usize = 8;
/// Pools up to this size use flat rendezvous hashing; larger ones hash a session to a
/// bucket of accounts first, then to an account of the bucket (two-level rendezvous), so a
/// pick hashes about `HRW_BUCKETS + n / HRW_BUCKETS` accounts instead of `n`.
const HRW_FLAT_MAX: usize = 256;
/// log2 of the number of rendezvous buckets of a large pool. Fixed (not derived from the
/// pool size), so an account's bucket depends on its id only and every instance agrees.
const HRW_BUCKET_BITS: u32 = 7;
/// Buckets ranked by the first selection of a two-level walk (the rest only when needed).
const BUCKET_PROBE: usize = 4;
/// `quota_reset_priority` re-sorts its reset order at least this often, so instants that
/// passed since leave the front of the order.
const RESET_ORDER_MAX_AGE_MS: u64 = 60_000;
/// Accounts whose reset instants moved earlier ([`shared_state::account::reset_moves`])
/// that `quota_reset_priority` offers beside its order before merging them into it.
const RESET_MOVED_MAX: usize = 64;
/// Once it holds `max_candidates` candidates, `smart` stops widening its walk past this many
/// accounts (a pool where nearly every account is busy or unhealthy): the order then comes
/// from the best of a bounded sample instead of the whole pool.
const SMART_WIDEN_MAX: usize = 256;
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
    /// Bucket selection of the two-level rendezvous.
    outer: Selector,
    picked: Vec<u32>,
    spill: Vec<u32>,
}

/// Arrays derived from one snapshot's account list.
#[derive(Debug)]
struct SnapshotIndex {
    /// Identity of the snapshot (the `Weak` keeps its allocation, so the address is not reused).
    snap: Weak<Snapshot>,
    /// [`accounts_sig`] of the snapshot's accounts.
    accounts_sig: u64,
    /// Rendezvous input per account.
    id_hash: Vec<u64>,
    /// Inverse weights, `None` when all weights are equal (then unweighted hashing gives the
    /// same order, cheaper).
    inv_weights: Option<Vec<f64>>,
    /// The largest weight (at least 1).
    max_weight: f64,
    /// Inclusive prefix sums of the weights.
    cum_weight: Vec<u64>,
    /// Rendezvous buckets of a pool larger than [`HRW_FLAT_MAX`].
    buckets: Option<Buckets>,
    /// `quota_reset_priority`'s order by reset instants (built on first use).
    resets: Option<ResetOrder>,
    /// `smart`'s ranked index by health class (built on first use).
    tiers: Option<TierIndex>,
    /// Session prefixes of the rendezvous order (`sticky`, soft affinity).
    sessions: Sessions,
    /// [`eligibility_sig`] per account: what a publish can change of an account's
    /// eligibility outside its live atomics (status, token, egress).
    eligibility: Vec<u64>,
    /// The snapshot's settings (ranks depend on them).
    settings: Settings,
}

/// A large pool's accounts grouped into rendezvous buckets by id.
#[derive(Debug)]
struct Buckets {
    /// Rendezvous input per non-empty bucket.
    hash: Vec<u64>,
    /// `1 / (sum of the weights)` per non-empty bucket.
    inv_weight: Vec<f64>,
    /// Account indices grouped by bucket.
    members: Vec<u32>,
    /// Bucket `b` holds `members[start[b]..start[b + 1]]`.
    start: Vec<u32>,
}

// === impl Buckets ===

impl Buckets {
    fn build(accounts: &[Arc<AccountEntry>], id_hash: &[u64]) -> Option<Self> {
        if accounts.len() <= HRW_FLAT_MAX {
            return None;
        }
        let mut by: Vec<Vec<u32>> = vec![Vec::new(); 1 << HRW_BUCKET_BITS];
        for (i, &ih) in id_hash.iter().enumerate() {
            by[(ih >> (64 - HRW_BUCKET_BITS)) as usize].push(i as u32);
        }
        let mut b = Self {
            hash: Vec::new(),
            inv_weight: Vec::new(),
            members: Vec::with_capacity(accounts.len()),
            start: vec![0],
        };
        for (bucket, members) in by.iter().enumerate() {
            if members.is_empty() {
                continue;
            }
            let total: u64 = members
                .iter()
                .map(|&i| u64::from(accounts[i as usize].weight.max(1)))
                .sum();
            b.hash.push(bucket_hash(bucket as u64));
            b.inv_weight.push(1.0 / total as f64);
            b.members.extend_from_slice(members);
            b.start.push(b.members.len() as u32);
        }
        Some(b)
    }

    fn members(&self, b: usize) -> &[u32] {
        &self.members[self.start[b] as usize..self.start[b + 1] as usize]
    }
}

/// Accounts sorted by their reset key ([`reset_key`]) when it was built, plus the accounts
/// whose reset instants moved earlier since; see [`Pick::quota_reset_priority`].
#[derive(Debug)]
struct ResetOrder {
    /// [`shared_state::account::reset_epoch`] up to which the moves are known.
    epoch: u64,
    /// The pick clock at build time.
    built_ms: u64,
    /// `(reset key at build time, account index)`, ascending.
    order: Vec<(u128, u32)>,
    /// Accounts whose instants moved earlier since their place in `order` was computed.
    moved: Vec<u32>,
    /// Per account index: in `moved`.
    is_moved: Vec<bool>,
    /// Account index by the address of its live state (what the move log records).
    by_live: HashMap<usize, u32>,
    /// Reusable buffer of the move log's addresses.
    addrs: Vec<usize>,
}

// === impl ResetOrder ===

impl ResetOrder {
    /// Reads every account's reset instants and sorts them (once per snapshot and worker,
    /// then only when the move log overflowed or the order is a minute old).
    fn build(accounts: &[Arc<AccountEntry>], now_ms: u64) -> Self {
        let epoch = shared_state::account::reset_epoch();
        let mut order: Vec<(u128, u32)> = accounts
            .iter()
            .enumerate()
            .map(|(i, a)| (reset_key(&a.live, now_ms / 1000), i as u32))
            .collect();
        order.sort_unstable();
        Self {
            epoch,
            built_ms: now_ms,
            order,
            moved: Vec::new(),
            is_moved: vec![false; accounts.len()],
            by_live: accounts
                .iter()
                .enumerate()
                .map(|(i, a)| (Arc::as_ptr(&a.live) as usize, i as u32))
                .collect(),
            addrs: Vec::new(),
        }
    }

    /// Brings the order up to date with the move log: the accounts it names join `moved`;
    /// false when the log no longer holds every move since `epoch` (rebuild).
    fn catch_up(&mut self) -> bool {
        let now = shared_state::account::reset_epoch();
        if now == self.epoch {
            return true;
        }
        self.addrs.clear();
        let Some(upto) = shared_state::account::reset_moves(self.epoch, now, &mut self.addrs)
        else {
            return false;
        };
        self.epoch = upto;
        for a in &self.addrs {
            if let Some(&i) = self.by_live.get(a) {
                if !self.is_moved[i as usize] {
                    self.is_moved[i as usize] = true;
                    self.moved.push(i);
                }
            }
        }
        true
    }

    /// Merges the moved accounts back into the order at their current keys: a pass over
    /// the worker's own array plus a read of the moved accounts only.
    fn merge_moved(&mut self, accounts: &[Arc<AccountEntry>], now_ms: u64) {
        let is_moved = &self.is_moved;
        self.order.retain(|e| !is_moved[e.1 as usize]);
        let mut fresh: Vec<(u128, u32)> = self
            .moved
            .iter()
            .map(|&i| (reset_key(&accounts[i as usize].live, now_ms / 1000), i))
            .collect();
        fresh.sort_unstable();
        let old = std::mem::take(&mut self.order);
        let mut merged = Vec::with_capacity(old.len() + fresh.len());
        let (mut a, mut b) = (old.into_iter().peekable(), fresh.into_iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x <= y => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            merged.extend(next);
        }
        self.order = merged;
        for &i in &self.moved {
            self.is_moved[i as usize] = false;
        }
        self.moved.clear();
    }

    /// True when the order is recent enough to walk.
    fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms >= self.built_ms && now_ms - self.built_ms < RESET_ORDER_MAX_AGE_MS
    }
}

/// What a publish can change of an account's eligibility without changing its live state:
/// its stored status, whether it has a token and which one (a refresh moves the expiry), its
/// egress proxy and whether that is usable.
fn eligibility_sig(a: &AccountEntry) -> u64 {
    let mut x = mix64(a.status as u64 ^ (u64::from(a.access_token.is_empty()) << 8));
    x = mix64(x ^ a.access_expires_at.map_or(0, |t| t as u64));
    a.egress.as_ref().map_or(x, |p| {
        mix64(x ^ (p.id as u64) ^ (u64::from(p.usable) << 63))
    })
}

/// A signature of what the per-snapshot indexes depend on, per account in order: id,
/// weight, group and the identity of its live state.
fn accounts_sig(accounts: &[Arc<AccountEntry>]) -> u64 {
    accounts.iter().fold(accounts.len() as u64, |h, a| {
        let mut x = mix64(h ^ a.id as u64);
        x = mix64(x ^ u64::from(a.weight));
        x = mix64(x ^ Arc::as_ptr(&a.live) as usize as u64);
        a.group.as_deref().map_or(x, |g| mix64(x ^ key_hash(g)))
    })
}

// === impl SnapshotIndex ===

impl SnapshotIndex {
    fn build(snap: &Arc<Snapshot>) -> Self {
        let accounts = &snap.accounts;
        let id_hash: Vec<u64> = accounts.iter().map(|a| id_hash(a.id)).collect();
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
        let buckets = Buckets::build(accounts, &id_hash);
        let max_weight = f64::from(accounts.iter().map(|a| a.weight.max(1)).max().unwrap_or(1));
        Self {
            snap: Arc::downgrade(snap),
            max_weight,
            accounts_sig: accounts_sig(accounts),
            id_hash,
            inv_weights,
            cum_weight,
            buckets,
            resets: None,
            tiers: None,
            sessions: Sessions::default(),
            eligibility: accounts.iter().map(|a| eligibility_sig(a)).collect(),
            settings: snap.settings.clone(),
        }
    }

    fn is_for(&self, snap: &Arc<Snapshot>) -> bool {
        std::ptr::eq(self.snap.as_ptr(), Arc::as_ptr(snap))
    }

    /// Takes over the lazily corrected parts of the previous snapshot's index (smart's
    /// ranked index, the session cache, the reset order) when the new snapshot holds the
    /// same accounts in the same places (ids, weights, groups and live state: a token
    /// refresh or a settings change), so such a publish costs no rebuild from the pool.
    /// The ranked index is corrected at once for the accounts whose status, token or egress
    /// the publish changed (a re-enabled or re-logged account is back in this pick, not
    /// after the repair walk reaches it), and rebuilt when the settings changed (the ranks
    /// depend on them).
    fn inherit(&mut self, old: SnapshotIndex, snap: &Snapshot, now_ms: u64) {
        if old.accounts_sig != self.accounts_sig {
            return;
        }
        self.sessions = old.sessions;
        self.resets = old.resets;
        if old.settings != self.settings {
            return;
        }
        self.tiers = old.tiers;
        if let Some(tiers) = &mut self.tiers {
            for (i, (new, was)) in self.eligibility.iter().zip(&old.eligibility).enumerate() {
                if new != was {
                    tiers.revisit(i, &snap.accounts, &snap.settings, now_ms);
                }
            }
        }
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
        let mut fresh = SnapshotIndex::build(snapshot);
        if let Some(old) = scratch.index.take() {
            fresh.inherit(old, snapshot, req.now_ms);
        }
        scratch.index = Some(fresh);
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
        outer,
        picked,
        spill,
    } = scratch;
    let Some(index) = index.as_mut() else {
        return Vec::new();
    };
    picked.clear();
    spill.clear();
    let mut hrw = Rendezvous { index, hrw, outer };
    match (snapshot.settings.strategy, req.affinity_key) {
        (Strategy::Smart, _) | (Strategy::Sticky, None) => {
            pick.smart(&mut hrw, sel, picked, snapshot.version)
        }
        (Strategy::RoundRobin, _) => pick.round_robin(hrw.index, picked, spill),
        (Strategy::FillFirst, _) => pick.walk(0, picked, spill),
        (Strategy::Sticky, Some(key)) => pick.sticky(&mut hrw, key, picked, spill),
        (Strategy::QuotaResetPriority, _) => pick.quota_reset_priority(hrw.index, sel, picked),
    }
    picked
        .iter()
        .map(|&i| Arc::clone(&snapshot.accounts[i as usize]))
        .collect()
}

/// True when `entry` may be picked for `model` at `now_ms` (concurrency aside).
pub fn is_eligible(entry: &AccountEntry, settings: &Settings, model: &str, now_ms: u64) -> bool {
    is_available(entry, settings, now_ms) && request_allows(entry, settings, model, now_ms)
}

/// The request-independent half of [`is_eligible`]: schedulable, and not paused by quota.
#[inline]
fn is_available(entry: &AccountEntry, settings: &Settings, now_ms: u64) -> bool {
    if !entry.is_schedulable(now_ms) {
        return false;
    }
    if let Some(th) = settings.pause_threshold_pct {
        let (p, q) = health::quota_pcts(&entry.live, now_ms);
        if p >= th || q >= th {
            return false;
        }
    }
    true
}

/// The request's half of [`is_eligible`]: the model is not excluded on the account, and its
/// minimum request interval has elapsed.
#[inline]
fn request_allows(entry: &AccountEntry, settings: &Settings, model: &str, now_ms: u64) -> bool {
    let s = entry.live.scheduler();
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

/// A session's rendezvous order over one snapshot, produced lazily: flat over a small pool,
/// two-level (bucket, then account within the bucket) over a large one.
struct Rendezvous<'s> {
    index: &'s mut SnapshotIndex,
    /// Account selection.
    hrw: &'s mut Selector,
    /// Bucket selection.
    outer: &'s mut Selector,
}

// === impl Rendezvous ===

impl Rendezvous<'_> {
    /// Visits the accounts of `group` in session `key`'s rendezvous order, best first, until
    /// `visit` returns true (or every account of the group was visited). The first
    /// [`SESSION_PREFIX`] come from the session cache (hashed once per snapshot and worker);
    /// the walk goes on with [`Self::walk`] only past them.
    fn walk_session(
        &mut self,
        accounts: &[Arc<AccountEntry>],
        key: &str,
        group: Option<&str>,
        want: usize,
        mut visit: impl FnMut(usize) -> bool,
    ) {
        let kh = key_hash(key);
        let tag = (kh ^ group.map_or(0, |g| key_hash(g).rotate_left(17))) | 1;
        let in_group = |i: usize| accounts[i].group.as_deref() == group;
        let mut prefix = [0u32; SESSION_PREFIX];
        let len = match self.index.sessions.get(tag) {
            Some(p) => {
                prefix[..p.len()].copy_from_slice(p);
                p.len()
            }
            None => {
                let mut n = 0;
                self.walk(kh, SESSION_PREFIX, |i| {
                    if in_group(i) {
                        prefix[n] = i as u32;
                        n += 1;
                    }
                    n >= SESSION_PREFIX
                });
                self.index.sessions.put(tag, &prefix[..n]);
                n
            }
        };
        for &i in &prefix[..len] {
            if visit(i as usize) {
                return;
            }
        }
        if len < SESSION_PREFIX {
            return;
        }
        let mut skip = len;
        self.walk(kh, want + SESSION_PREFIX, |i| {
            if !in_group(i) {
                return false;
            }
            if skip > 0 {
                skip -= 1;
                return false;
            }
            visit(i)
        });
    }

    /// Visits accounts in session `kh`'s rendezvous order, best first, until `visit`
    /// returns true (or every account was visited). The first `want` of a flat pool (of a
    /// bucket) are ranked first; the rest only when the walk gets there.
    fn walk(&mut self, kh: u64, want: usize, mut visit: impl FnMut(usize) -> bool) {
        let index = &*self.index;
        let Some(b) = &index.buckets else {
            walk_members(index, kh, None, want, self.hrw, &mut visit);
            return;
        };
        let probe = BUCKET_PROBE.min(b.hash.len());
        rank_buckets(b, kh, probe, self.outer);
        let mut top = [0u32; BUCKET_PROBE];
        for (slot, e) in top.iter_mut().zip(self.outer.finish()) {
            *slot = e.1;
        }
        for &bk in &top[..probe] {
            let members = b.members(bk as usize);
            if walk_members(index, kh, Some(members), want, self.hrw, &mut visit) {
                return;
            }
        }
        if probe >= b.hash.len() {
            return;
        }
        rank_buckets(b, kh, b.hash.len(), self.outer);
        for e in &self.outer.finish()[probe..] {
            let members = b.members(e.1 as usize);
            if walk_members(index, kh, Some(members), want, self.hrw, &mut visit) {
                return;
            }
        }
    }
}

/// Fills `outer` with the `m` best buckets for session `kh` (weighted by their accounts'
/// total weight, so an account's chance is its weight's share of the pool).
fn rank_buckets(b: &Buckets, kh: u64, m: usize, outer: &mut Selector) {
    outer.begin(m);
    for (j, (&bh, &iw)) in b.hash.iter().zip(&b.inv_weight).enumerate() {
        // Skip the logarithm when the lower bound (1 - u) / w already loses.
        if let Some(bound) = outer.bound() {
            let u = unit_of(hrw_hash(kh, bh));
            if (1.0 - u) * iw >= f64::from_bits(bound as u64) {
                continue;
            }
        }
        outer.offer(u128::from(hrw_key(kh, bh, Some(iw))), j as u32);
    }
}

/// Visits `members` (`None`: the whole pool) in rendezvous order; true when `visit`
/// stopped the walk.
fn walk_members(
    index: &SnapshotIndex,
    kh: u64,
    members: Option<&[u32]>,
    want: usize,
    hrw: &mut Selector,
    visit: &mut impl FnMut(usize) -> bool,
) -> bool {
    let len = members.map_or(index.id_hash.len(), <[u32]>::len);
    let m = want.clamp(1, len.max(1));
    rank_members(index, kh, members, m, hrw);
    for e in hrw.finish() {
        if visit(e.1 as usize) {
            return true;
        }
    }
    if m >= len {
        return false;
    }
    rank_members(index, kh, members, len, hrw);
    for e in &hrw.finish()[m..] {
        if visit(e.1 as usize) {
            return true;
        }
    }
    false
}

/// Fills `hrw` with the `m` best of `members` (`None`: the whole pool) for session `kh`.
fn rank_members(
    index: &SnapshotIndex,
    kh: u64,
    members: Option<&[u32]>,
    m: usize,
    hrw: &mut Selector,
) {
    hrw.begin(m);
    match members {
        None => rank_iter(index, kh, 0..index.id_hash.len() as u32, hrw),
        Some(ms) => rank_iter(index, kh, ms.iter().copied(), hrw),
    }
}

#[inline]
fn rank_iter(index: &SnapshotIndex, kh: u64, it: impl Iterator<Item = u32>, hrw: &mut Selector) {
    match &index.inv_weights {
        None => {
            for i in it {
                let key = u128::from(hrw_key(kh, index.id_hash[i as usize], None));
                if hrw.admits(key) {
                    hrw.offer(key, i);
                }
            }
        }
        Some(iw) => {
            for i in it {
                let (ih, iw) = (index.id_hash[i as usize], iw[i as usize]);
                // Skip the logarithm when the lower bound (1 - u) / w already loses.
                if let Some(b) = hrw.bound() {
                    let u = unit_of(hrw_hash(kh, ih));
                    if (1.0 - u) * iw >= f64::from_bits(b as u64) {
                        continue;
                    }
                }
                hrw.offer(u128::from(hrw_key(kh, ih, Some(iw))), i);
            }
        }
    }
}

/// `quota_reset_priority`'s reset part of the key: the primary window's reset instant, then
/// the secondary's (unknown or already passed: after every known one).
fn reset_key(live: &AccountLive, now_s: u64) -> u128 {
    let reset = |at: u64| -> u128 {
        if at > now_s {
            u128::from(at.min(u64::from(u32::MAX)))
        } else {
            u128::from(u32::MAX)
        }
    };
    (reset(live.primary_reset_at()) << 92) | (reset(live.secondary_reset_at()) << 60)
}

/// The lowest reset key an account ranked at `built` in a current [`ResetOrder`] can have
/// now: its instants moved earlier by at most the jitter the reset epoch tolerates.
fn reset_key_floor(built: u128) -> u128 {
    let jitter = shared_state::account::RESET_JITTER_S;
    let p = ((built >> 92) as u64 & 0xffff_ffff).saturating_sub(jitter);
    let s = ((built >> 60) as u64 & 0xffff_ffff).saturating_sub(jitter);
    (u128::from(p) << 92) | (u128::from(s) << 60)
}

/// The per-account inputs of `quota_reset_priority`'s weighted randomness.
struct RandomInputs<'a> {
    id_hash: &'a [u64],
    inv_weights: Option<&'a [f64]>,
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

    /// Takes account `i` when eligible: a ready one into `picked`, a deferred one
    /// (saturated, refreshing) into `spill` (at most `k`). Returns true once `picked` holds
    /// `k`.
    #[inline]
    fn take(&self, i: usize, picked: &mut Vec<u32>, spill: &mut Vec<u32>) -> bool {
        let Some(a) = self.candidate(i) else {
            return false;
        };
        if !a.deferred() {
            picked.push(i as u32);
            return picked.len() >= self.k;
        }
        if spill.len() < self.k {
            spill.push(i as u32);
        }
        false
    }

    /// [`Self::take`] in the order of `indices`; true once `picked` holds `k`.
    fn take_in_order(
        &self,
        indices: impl Iterator<Item = usize>,
        picked: &mut Vec<u32>,
        spill: &mut Vec<u32>,
    ) -> bool {
        for i in indices {
            if self.take(i, picked, spill) {
                return true;
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

    /// Ready accounts in the session's rendezvous order, then deferred ones in that order.
    fn sticky(
        &self,
        hrw: &mut Rendezvous<'_>,
        key: &str,
        picked: &mut Vec<u32>,
        spill: &mut Vec<u32>,
    ) {
        hrw.walk_session(
            self.accounts,
            key,
            self.req.group,
            self.k + STICKY_SLACK,
            |i| self.take(i, picked, spill),
        );
        if picked.len() < self.k {
            self.fill_from_spill(picked, spill);
        }
    }

    /// The session's home under soft affinity: the first of its [`AFFINITY_PROBE`]
    /// rendezvous choices (in its group) that is a candidate and at most `Warm`.
    fn affinity_home(&self, hrw: &mut Rendezvous<'_>, key: &str) -> Option<u32> {
        let (mut seen, mut home) = (0usize, None);
        hrw.walk_session(self.accounts, key, self.req.group, AFFINITY_PROBE, |i| {
            seen += 1;
            if self
                .candidate(i)
                .is_some_and(|a| !a.deferred() && a.tier <= Tier::Warm)
            {
                home = Some(i as u32);
                return true;
            }
            seen >= AFFINITY_PROBE
        });
        home
    }

    /// Class and assessment of account `i` of the request's group, read live: the
    /// assessment only when it is a candidate for this request.
    #[inline]
    fn observe(&self, i: usize) -> (Rank, Option<Assessment>) {
        let e = &self.accounts[i];
        let (c, a) = rank::classify(e, self.settings, self.req.now_ms);
        let a = a.filter(|_| request_allows(e, self.settings, self.req.model, self.req.now_ms));
        (c, a)
    }

    fn smart(
        &self,
        hrw: &mut Rendezvous<'_>,
        sel: &mut Selector,
        picked: &mut Vec<u32>,
        version: u64,
    ) {
        let n = self.accounts.len();
        let mut rng =
            Rng::new(mix64(self.req.cursor as u64) ^ self.req.now_ms.rotate_left(23) ^ version);
        let home = self
            .req
            .affinity_key
            .and_then(|key| self.affinity_home(hrw, key));
        if let Some(h) = home {
            picked.push(h);
        }
        let want = self.k.saturating_sub(picked.len());
        if want == 0 {
            return;
        }
        let sample = SMART_SAMPLE.max(SMART_SAMPLE_PER_CANDIDATE * want);
        sel.begin(want);
        if sample >= n {
            // A small pool, or (nearly) every account wanted: score them all.
            let index = &*hrw.index;
            for i in 0..n {
                if home == Some(i as u32) {
                    continue;
                }
                if let Some(a) = self.candidate(i) {
                    sel.offer(smart_key(&a, index.inv_weight(i), &mut rng), i as u32);
                }
            }
        } else {
            self.smart_ranked(hrw.index, sel, home, want, &mut rng);
        }
        picked.extend(sel.finish().iter().map(|e| e.1));
    }

    /// `smart` over a large pool through the ranked index ([`TierIndex`]): ranks best
    /// first, each rank's accounts in a pseudo-random order, every account read live and
    /// offered with its live key. The walk leaves a rank once `want` accounts at least as
    /// good as anything the next rank promises are selected (the rest of the rank could
    /// only win the random tie-break among equals, which the random visiting order already
    /// drew), and stops at a rank whose best possible key cannot beat the worst selected
    /// one. Weights thin the first pass over a rank (an account is read with probability
    /// `weight / max_weight`, ties broken uniformly), so the accounts read and the first of
    /// them come weight-proportionally. Out accounts are read only while candidates are too
    /// few. Due wake-ups and one
    /// repair read run first, so an account that came back is found by this pick already;
    /// every account read is re-ranked after the pick. A pick over an idle, healthy pool
    /// reads about `want` accounts plus the repair read.
    fn smart_ranked(
        &self,
        index: &mut SnapshotIndex,
        sel: &mut Selector,
        home: Option<u32>,
        want: usize,
        rng: &mut Rng,
    ) {
        let now = self.req.now_ms;
        let mut tiers = match index.tiers.take() {
            Some(t) => t,
            None => TierIndex::build(self.accounts, self.settings, now),
        };
        if let Some(g) = tiers.group_of(self.req.group) {
            tiers.refresh(g, self.accounts, self.settings, now);
            let (mut visited, mut offered) = (0usize, 0usize);
            let mut skipped = std::mem::take(&mut tiers.skipped);
            let mut next = tiers.group(g).next_rank(0);
            'ranks: while let Some(r) = next {
                let full = offered >= want;
                if full && (r == OUT_RANK || sel.bound().is_some_and(|w| rank_floor(r) >= w)) {
                    break;
                }
                let next_floor = if r + 1 < OUT_RANK {
                    rank_floor(r + 1)
                } else {
                    u128::MAX
                };
                let len = tiers.group(g).list(r).len();
                let stride = coprime_stride(len, rng.next_u64());
                let start = (rng.next_u64() % len as u64) as usize;
                // Weights: the first pass over the rank reads an account with probability
                // `w / max_weight` (a skipped one costs no live read), so the accounts read,
                // and the first of them (ties are broken uniformly then), come weight-
                // proportionally; a second pass reads what it skipped when the rank runs
                // out first.
                skipped.clear();
                for pass in 0..2 {
                    let thin = pass == 0 && index.inv_weights.is_some();
                    let steps = if pass == 0 { len } else { skipped.len() };
                    let mut pos = start;
                    for step in 0..steps {
                        if offered >= want {
                            if sel.bound().is_some_and(|w| w < next_floor) {
                                break;
                            }
                            if visited >= SMART_WIDEN_MAX {
                                break 'ranks;
                            }
                        }
                        let i = if pass == 0 {
                            let i = tiers.group(g).list(r)[pos] as usize;
                            pos += stride;
                            if pos >= len {
                                pos -= len;
                            }
                            i
                        } else {
                            // The second pass reads what the first one skipped, in its order.
                            skipped[step] as usize
                        };
                        if home == Some(i as u32) {
                            continue;
                        }
                        if thin {
                            let iw = index.inv_weight(i).unwrap_or(1.0);
                            if unit_of(rng.next_u64()) * iw * index.max_weight > 1.0 {
                                skipped.push(i as u32);
                                continue;
                            }
                        }
                        visited += 1;
                        let (live, a) = self.observe(i);
                        tiers.saw(i, live);
                        let Some(a) = a else {
                            continue;
                        };
                        offered += 1;
                        sel.offer(smart_key(&a, None, rng), i as u32);
                    }
                    if skipped.is_empty() || offered >= want {
                        break;
                    }
                }
                next = tiers.group(g).next_rank(usize::from(r) + 1);
            }
            tiers.skipped = skipped;
            tiers.settle(g, self.accounts, self.settings, now);
        }
        index.tiers = Some(tiers);
    }

    /// Accounts by (deferred, unhealthy, exhausted, covered by the forecast, primary then
    /// secondary reset instant, score bucket, weighted randomness). The reset instants are
    /// the only unbounded-range part of the key, so a per-snapshot [`ResetOrder`] lets the
    /// walk stop once the next account's reset cannot beat the worst selected key; every
    /// key itself is computed from live state. Accounts whose instants moved earlier since
    /// the order was sorted are named by the move log
    /// ([`shared_state::account::reset_moves`]): they are offered beside the order, and
    /// merged into it once there are [`RESET_MOVED_MAX`] of them. No pick reads the whole
    /// pool: the order is re-sorted from live state only when the log overflowed (more than
    /// its length of moves since this worker's last pick) or once a minute.
    fn quota_reset_priority(
        &self,
        index: &mut SnapshotIndex,
        sel: &mut Selector,
        picked: &mut Vec<u32>,
    ) {
        let now = self.req.now_ms;
        let seed = mix64(self.req.cursor as u64) ^ now;
        let current = index
            .resets
            .as_mut()
            .is_some_and(|r| r.is_fresh(now) && r.catch_up());
        if !current {
            index.resets = Some(ResetOrder::build(self.accounts, now));
        }
        let SnapshotIndex {
            resets,
            id_hash,
            inv_weights,
            ..
        } = index;
        let Some(r) = resets.as_mut() else {
            return;
        };
        if r.moved.len() > RESET_MOVED_MAX {
            r.merge_moved(self.accounts, now);
        }
        r.addrs.clear();
        let rand = RandomInputs {
            id_hash,
            inv_weights: inv_weights.as_deref(),
        };
        sel.begin(self.k);
        for &i in &r.moved {
            self.offer_by_reset(&rand, i as usize, seed, sel);
        }
        let moved = !r.moved.is_empty();
        for &(built, i) in &r.order {
            if sel.bound().is_some_and(|w| reset_key_floor(built) >= w) {
                break;
            }
            if moved && r.is_moved[i as usize] {
                continue;
            }
            self.offer_by_reset(&rand, i as usize, seed, sel);
        }
        picked.extend(sel.finish().iter().map(|e| e.1));
    }

    /// Offers account `i` to `quota_reset_priority`'s selection.
    #[inline]
    fn offer_by_reset(&self, rand: &RandomInputs<'_>, i: usize, seed: u64, sel: &mut Selector) {
        let resets = reset_key(&self.accounts[i].live, self.req.now_ms / 1000);
        // The reset instants alone are a lower bound of the key: skip the rest early.
        if !sel.admits(resets) {
            return;
        }
        let Some(a) = self.candidate(i) else {
            return;
        };
        let saturated = u128::from(a.deferred());
        let unhealthy = u128::from(a.tier >= Tier::Risky);
        let exhausted = u128::from(a.quota_exhausted());
        let covered = u128::from(covered_before_reset(&self.accounts[i], self.req.now_ms));
        // Randomness from (pick, account), so the visiting order does not matter.
        let rand = random_of(
            rand.inv_weights.map(|w| w[i]),
            mix64(seed ^ rand.id_hash[i]),
        );
        let key = (saturated << 127)
            | (unhealthy << 126)
            | (exhausted << 125)
            | (covered << 124)
            | resets
            | (u128::from(score_bucket(a.score).min(0xffff)) << 44)
            | u128::from(rand >> 20);
        sel.offer(key, i as u32);
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
    random_of(inv_weight, rng.next_u64())
}

/// `smart`'s sort key, lower is better: free before saturated, then tier, then score
/// bucket, then weighted randomness.
fn smart_key(a: &Assessment, inv_weight: Option<f64>, rng: &mut Rng) -> u128 {
    (u128::from(a.deferred()) << 127)
        | (u128::from(a.tier as u8) << 120)
        | (u128::from(score_bucket(a.score).min(0xff_ffff)) << 64)
        | u128::from(random_key(inv_weight, rng))
}
