//! Per-worker indexes that let a pick over a large pool read only a few accounts' live state
//! (issue 11): `smart`'s ranked index of accounts, and the session cache of rendezvous orders
//! that `sticky` and smart's soft affinity walk.
//!
//! # Key Components
//! - [`TierIndex`]: per account group, the accounts by the [`Rank`] they had when last read:
//!   smart's sort key without its random part (deferred, health tier, score bucket; load and
//!   quota included), or [`OUT_RANK`] (not schedulable, or paused by quota). Built once per
//!   snapshot and worker, then corrected lazily: every account a pick reads is re-ranked from
//!   its live state, one account per pick is re-read in turn ([`REPAIR_PER_PICK`]), and an
//!   account that went out for a known time (cooldown, paused quota window) is re-read once
//!   that time has passed (a wake-up heap). The index only says *where to look first*:
//!   whether an account is a candidate, and its sort key, always come from its live atomics
//!   at pick time, so a stale index can cost order quality for a moment, never eligibility.
//! - [`Sessions`]: per snapshot, a set-associative cache from a session key's hash (and the
//!   request's account group) to the first [`SESSION_PREFIX`] accounts of its rendezvous
//!   order in that group. The order depends on the snapshot's ids and weights only, so the
//!   cache never goes stale within a snapshot; a session's repeated requests skip the hashing.
//!
//! # Usage
//! Owned by `super::SnapshotIndex` (rebuilt with it when the snapshot changes); used by
//! `super::Pick::smart_ranked`, `super::Pick::sticky` and `super::Pick::affinity_home`.

use std::{cmp::Reverse, collections::BinaryHeap, sync::Arc};

use shared_state::{AccountEntry, Settings};

use super::{assess, health::quota_pcts, score_bucket, Assessment};

/// Score buckets per (deferred, tier) pair in a [`Rank`].
const BUCKETS: u16 = 64;
/// The rank of an account that is not a candidate for any request now (not schedulable,
/// or paused by its quota): after every (deferred, tier, bucket) rank.
pub(super) const OUT_RANK: Rank = 8 * BUCKETS;
/// Number of ranks.
const RANKS: usize = OUT_RANK as usize + 1;
/// Words of the non-empty-rank bitmap.
const RANK_WORDS: usize = RANKS.div_ceil(64);
/// Accounts of a group re-read in turn by every pick (on top of the ones it reads for the
/// order), so a rank that changed without a pick looking (a lease ended, a penalty decayed,
/// a status came back) is corrected within `members / REPAIR_PER_PICK` picks.
pub(super) const REPAIR_PER_PICK: usize = 1;
/// Wake-ups (cooldown ends, quota resets) handled per pick at most (the rest next pick).
const WAKE_PER_PICK: usize = 8;
/// Entries of the session cache (2-way set-associative by key hash).
pub(super) const SESSION_SLOTS: usize = 8_192;
/// Accounts of a session's rendezvous order the cache keeps (enough for `sticky`'s
/// `max_candidates + STICKY_SLACK` at the usual attempt budget, and for the soft affinity's
/// probe); a walk that needs more goes on hashing past them.
pub(super) const SESSION_PREFIX: usize = 12;

/// An account's place in the ranked index: `(deferred * 4 + tier) * BUCKETS + score
/// bucket` while it is a candidate, [`OUT_RANK`] when it is not. Lower is better, in the
/// order of `smart`'s key.
pub(super) type Rank = u16;

/// The rank of an assessed candidate.
#[inline]
pub(super) fn rank_of(a: &Assessment) -> Rank {
    let head = u16::from(a.deferred()) * 4 + a.tier as u16;
    head * BUCKETS + score_bucket(a.score).min(u64::from(BUCKETS - 1)) as u16
}

/// The lowest `smart` key an account of rank `r` can have (while the index is current).
#[inline]
pub(super) fn rank_floor(r: Rank) -> u128 {
    let head = u128::from(r / BUCKETS);
    let (deferred, tier) = (head / 4, head % 4);
    (deferred << 127) | (tier << 120) | (u128::from(r % BUCKETS) << 64)
}

/// The rank of `entry` at `now_ms`, with its assessment when it is a candidate. Only
/// request-independent rules put an account out (schedulable, quota pause); the model
/// exclusion, the minimum request interval and the group are the request's to check.
#[inline]
pub(super) fn classify(
    entry: &AccountEntry,
    settings: &Settings,
    now_ms: u64,
) -> (Rank, Option<Assessment>) {
    if !super::is_available(entry, settings, now_ms) {
        return (OUT_RANK, None);
    }
    let a = assess(entry, settings, now_ms);
    (rank_of(&a), Some(a))
}

/// When an out account may come back by itself (its cooldown ends, or its paused windows
/// reset), ms since epoch; `None` when no instant is known (the repair walk re-reads it).
fn wake_at(entry: &AccountEntry, settings: &Settings, now_ms: u64) -> Option<u64> {
    let live = &*entry.live;
    // The latest of the known reasons' ends: the account is out while any of them holds.
    let mut at = None::<u64>;
    let mut later = |t: u64| at = Some(at.unwrap_or(0).max(t));
    let cd = live.cooldown_until_ms();
    if cd > now_ms {
        later(cd);
    }
    if let Some(p) = &entry.egress {
        if !p.usable {
            return None;
        }
        // A proxy's breaker (a few seconds after a failed connect through it).
        let open = p.live.open_until_ms();
        if open > now_ms {
            later(open);
        }
    }
    if let Some(th) = settings.pause_threshold_pct {
        let (p, s) = quota_pcts(live, now_ms);
        for (pct, reset_s) in [(p, live.primary_reset_at()), (s, live.secondary_reset_at())] {
            if pct >= th {
                if reset_s == 0 {
                    return None;
                }
                later(reset_s.saturating_mul(1000));
            }
        }
    }
    at
}

/// How long a wake-up that found its account still out waits before the next look when the
/// account's known comeback instant has already passed (stale quota figures, say).
const REWAKE_MS: u64 = 1_000;

/// One account group's accounts by rank.
#[derive(Debug)]
pub(super) struct Ranked {
    /// The group (`None`: the shared pool).
    group: Option<Arc<str>>,
    /// Account indices per rank, in no particular order.
    lists: Vec<Vec<u32>>,
    /// Bit `r` set: `lists[r]` is not empty.
    nonempty: [u64; RANK_WORDS],
    /// Every member, for the repair walk.
    members: Vec<u32>,
    /// Next member the repair walk re-reads.
    repair: usize,
    /// Out accounts with a known comeback instant: `(instant ms, account index)`.
    wake: BinaryHeap<Reverse<(u64, u32)>>,
}

// === impl Ranked ===

impl Ranked {
    /// The first non-empty rank at or after `from`.
    #[inline]
    pub(super) fn next_rank(&self, from: usize) -> Option<Rank> {
        let mut w = from / 64;
        if w >= RANK_WORDS {
            return None;
        }
        let mut bits = self.nonempty[w] & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some((w * 64 + bits.trailing_zeros() as usize) as Rank);
            }
            w += 1;
            if w >= RANK_WORDS {
                return None;
            }
            bits = self.nonempty[w];
        }
    }

    /// The accounts of rank `r`.
    #[inline]
    pub(super) fn list(&self, r: Rank) -> &[u32] {
        &self.lists[usize::from(r)]
    }
}

/// `smart`'s ranked index over one snapshot (see the module docs).
#[derive(Debug, Default)]
pub(super) struct TierIndex {
    groups: Vec<Ranked>,
    /// Rank per account index.
    rank: Vec<Rank>,
    /// Position in its rank's list per account index.
    pos: Vec<u32>,
    /// Ranks read during a pick, applied after it: `(account index, live rank)`.
    seen: Vec<(u32, Rank)>,
    /// The accounts a pick's first, weight-thinned pass over a rank skipped (a reusable
    /// buffer of `super::Pick::smart_ranked`: its second pass reads exactly these).
    pub(super) skipped: Vec<u32>,
    /// Group (index into `groups`) per account index.
    group: Vec<u32>,
}

// === impl TierIndex ===

impl TierIndex {
    /// Ranks every account of `accounts` at `now_ms` (once per snapshot and worker).
    pub(super) fn build(accounts: &[Arc<AccountEntry>], settings: &Settings, now_ms: u64) -> Self {
        let mut ix = Self {
            groups: Vec::new(),
            rank: vec![OUT_RANK; accounts.len()],
            pos: vec![0; accounts.len()],
            seen: Vec::new(),
            skipped: Vec::new(),
            group: vec![0; accounts.len()],
        };
        for (i, e) in accounts.iter().enumerate() {
            let g = match ix
                .groups
                .iter()
                .position(|r| r.group.as_deref() == e.group.as_deref())
            {
                Some(g) => g,
                None => {
                    ix.groups.push(Ranked {
                        group: e.group.clone(),
                        lists: vec![Vec::new(); RANKS],
                        nonempty: [0; RANK_WORDS],
                        members: Vec::new(),
                        repair: 0,
                        wake: BinaryHeap::new(),
                    });
                    ix.groups.len() - 1
                }
            };
            let (r, _) = classify(e, settings, now_ms);
            ix.group[i] = g as u32;
            ix.groups[g].members.push(i as u32);
            ix.insert(g, i, r, accounts, settings, now_ms);
        }
        ix
    }

    /// The index of `group`'s ranked accounts, if it has any.
    pub(super) fn group_of(&self, group: Option<&str>) -> Option<usize> {
        self.groups.iter().position(|r| r.group.as_deref() == group)
    }

    /// Group `g`'s ranked accounts.
    #[inline]
    pub(super) fn group(&self, g: usize) -> &Ranked {
        &self.groups[g]
    }

    /// The rank account `i` had when last read.
    #[cfg(test)]
    pub(super) fn rank_of_account(&self, i: usize) -> Rank {
        self.rank[i]
    }

    /// Notes that account `i` was read at pick time and found at rank `r`.
    #[inline]
    pub(super) fn saw(&mut self, i: usize, r: Rank) {
        if self.rank[i] != r {
            self.seen.push((i as u32, r));
        }
    }

    /// Before a pick of group `g`: re-ranks the accounts whose comeback instant passed, and
    /// the next [`REPAIR_PER_PICK`] members of the repair walk.
    pub(super) fn refresh(
        &mut self,
        g: usize,
        accounts: &[Arc<AccountEntry>],
        settings: &Settings,
        now_ms: u64,
    ) {
        for _ in 0..WAKE_PER_PICK {
            let r = &mut self.groups[g];
            match r.wake.peek() {
                Some(Reverse((at, _))) if *at <= now_ms => {}
                _ => break,
            }
            let Some(Reverse((_, i))) = r.wake.pop() else {
                break;
            };
            let i = i as usize;
            let (rank, _) = classify(&accounts[i], settings, now_ms);
            if rank == OUT_RANK && self.rank[i] == OUT_RANK {
                // Still out (cooling and paused at once, say): wait for the next known
                // comeback, not only for the repair walk.
                if let Some(at) = wake_at(&accounts[i], settings, now_ms) {
                    let at = at.max(now_ms + REWAKE_MS);
                    self.groups[g].wake.push(Reverse((at, i as u32)));
                }
            } else {
                self.move_to(g, i, rank, accounts, settings, now_ms);
            }
        }
        for _ in 0..REPAIR_PER_PICK.min(self.groups[g].members.len()) {
            let r = &mut self.groups[g];
            let i = r.members[r.repair] as usize;
            r.repair = (r.repair + 1) % r.members.len();
            let (rank, _) = classify(&accounts[i], settings, now_ms);
            self.move_to(g, i, rank, accounts, settings, now_ms);
        }
    }

    /// Re-ranks account `i` from its live state now: a publish changed what its rank
    /// depends on outside the live atomics (its status, token or egress).
    pub(super) fn revisit(
        &mut self,
        i: usize,
        accounts: &[Arc<AccountEntry>],
        settings: &Settings,
        now_ms: u64,
    ) {
        let g = self.group[i] as usize;
        let (rank, _) = classify(&accounts[i], settings, now_ms);
        self.move_to(g, i, rank, accounts, settings, now_ms);
    }

    /// After a pick of group `g`: moves the accounts it read to the ranks it found.
    pub(super) fn settle(
        &mut self,
        g: usize,
        accounts: &[Arc<AccountEntry>],
        settings: &Settings,
        now_ms: u64,
    ) {
        let mut seen = std::mem::take(&mut self.seen);
        for &(i, r) in &seen {
            self.move_to(g, i as usize, r, accounts, settings, now_ms);
        }
        seen.clear();
        self.seen = seen;
    }

    /// Moves account `i` of group `g` to rank `r`.
    fn move_to(
        &mut self,
        g: usize,
        i: usize,
        r: Rank,
        accounts: &[Arc<AccountEntry>],
        settings: &Settings,
        now_ms: u64,
    ) {
        let old = self.rank[i];
        if old == r {
            return;
        }
        let grp = &mut self.groups[g];
        let list = &mut grp.lists[usize::from(old)];
        let p = self.pos[i] as usize;
        list.swap_remove(p);
        if let Some(&moved) = list.get(p) {
            self.pos[moved as usize] = p as u32;
        }
        if list.is_empty() {
            grp.nonempty[usize::from(old) / 64] &= !(1u64 << (old % 64));
        }
        self.insert(g, i, r, accounts, settings, now_ms);
    }

    /// Puts account `i` (in no list) at rank `r` of group `g` (scheduling a wake-up when it
    /// goes out with a known comeback instant).
    fn insert(
        &mut self,
        g: usize,
        i: usize,
        r: Rank,
        accounts: &[Arc<AccountEntry>],
        settings: &Settings,
        now_ms: u64,
    ) {
        let grp = &mut self.groups[g];
        let list = &mut grp.lists[usize::from(r)];
        self.rank[i] = r;
        self.pos[i] = list.len() as u32;
        list.push(i as u32);
        grp.nonempty[usize::from(r) / 64] |= 1u64 << (r % 64);
        if r == OUT_RANK {
            if let Some(at) = wake_at(&accounts[i], settings, now_ms) {
                grp.wake.push(Reverse((at, i as u32)));
            }
        }
    }
}

/// One cached session: the first accounts of its rendezvous order within a group.
#[derive(Debug, Clone, Copy, Default)]
struct SessionSlot {
    /// The session key's hash mixed with the group's (0: empty slot).
    tag: u64,
    /// How many of `order` are set (fewer than [`SESSION_PREFIX`]: the whole group).
    len: u8,
    order: [u32; SESSION_PREFIX],
}

/// The session cache of one snapshot (see the module docs); allocated on first use.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    slots: Vec<SessionSlot>,
}

// === impl Sessions ===

impl Sessions {
    /// The cached prefix for `tag`, if any.
    #[inline]
    pub(super) fn get(&self, tag: u64) -> Option<&[u32]> {
        let set = Self::set_of(tag);
        let ways = self.slots.get(set..set + 2)?;
        ways.iter()
            .find(|s| s.tag == tag && tag != 0)
            .map(|s| &s.order[..usize::from(s.len)])
    }

    /// Caches `order` (at most [`SESSION_PREFIX`] accounts) for `tag`: the newest session of
    /// its set goes first, the older one moves to the second way (dropping the oldest).
    pub(super) fn put(&mut self, tag: u64, order: &[u32]) {
        if tag == 0 {
            return;
        }
        if self.slots.is_empty() {
            self.slots = vec![SessionSlot::default(); SESSION_SLOTS];
        }
        let set = Self::set_of(tag);
        self.slots[set + 1] = self.slots[set];
        let s = &mut self.slots[set];
        let n = order.len().min(SESSION_PREFIX);
        s.tag = tag;
        s.len = n as u8;
        s.order[..n].copy_from_slice(&order[..n]);
    }

    /// First slot of `tag`'s set.
    #[inline]
    fn set_of(tag: u64) -> usize {
        ((tag >> 32) as usize % (SESSION_SLOTS / 2)) * 2
    }
}
