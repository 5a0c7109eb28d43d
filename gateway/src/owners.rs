//! Who minted which account-bound blob (issue 23; codex-protocol.md §4 items 8-9).
//!
//! The upstream binds every opaque blob it returns (a reasoning item's `encrypted_content`,
//! what our Anthropic thinking `signature`s carry, a remote compaction v2 `compaction` item)
//! to the account that minted it. When a response passes through, the lifecycle records each
//! blob's fingerprint ([`codex_protocol::bound::fingerprint`], never the blob) with the serving
//! account; a later request carrying those blobs goes to that account while it is schedulable,
//! and when the account must change the blobs it minted are stripped before sending.
//!
//! # Key Components
//! - [`BlobOwners`]: fingerprint -> (account id, last use), 16 shards of a short critical
//!   section each, bounded by a byte budget (oldest record out first) and a time to live since
//!   last use. An entry costs [`ENTRY_BYTES`] whatever the blob's size.
//! - [`BlobOwners::global`]: the process's map (every worker records and reads the same one).
//!
//! # Limits
//! Process-local: another instance (or this one after a restart) does not know the owners, and
//! the lifecycle's stripped retry after an `invalid_encrypted_content` recovers what a missing
//! record costs (one extra upstream request). Sharing the records through Redis is not done yet.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

const SHARDS: usize = 16;

/// Bytes one record is counted for (map slot, order slot, allocator overhead).
pub const ENTRY_BYTES: usize = 64;

/// The global map's budget: about 260,000 blobs (a Codex CLI turn mints one or two).
pub const DEFAULT_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// The global map's time to live since last use (a session idle this long is routed anew; its
/// first refused request recovers by the stripped retry).
pub const DEFAULT_TTL: Duration = Duration::from_secs(12 * 3600);

#[derive(Default)]
struct Shard {
    map: HashMap<u64, (i64, Instant)>,
    /// Insert order: (fingerprint, when recorded). A record refreshed since is skipped (and
    /// queued again) when it reaches the front.
    order: VecDeque<(u64, Instant)>,
}

/// See the module docs.
pub struct BlobOwners {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    ttl: Duration,
}

impl std::fmt::Debug for BlobOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobOwners")
            .field("per_shard", &self.per_shard)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// === impl BlobOwners ===

impl BlobOwners {
    /// A map holding at most `budget_bytes` of records for `ttl` since their last use.
    pub fn new(budget_bytes: usize, ttl: Duration) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: (budget_bytes / ENTRY_BYTES / SHARDS).max(1),
            ttl,
        }
    }

    /// The process's map.
    pub fn global() -> &'static BlobOwners {
        static OWNERS: OnceLock<BlobOwners> = OnceLock::new();
        OWNERS.get_or_init(|| BlobOwners::new(DEFAULT_BUDGET_BYTES, DEFAULT_TTL))
    }

    fn shard(&self, fp: u64) -> &Mutex<Shard> {
        &self.shards[(fp >> 60) as usize % SHARDS]
    }

    /// Records that `account` minted the blob of fingerprint `fp`.
    pub fn record(&self, fp: u64, account: i64) {
        self.record_at(fp, account, Instant::now());
    }

    fn record_at(&self, fp: u64, account: i64, now: Instant) {
        let mut s = lock(self.shard(fp));
        s.map.insert(fp, (account, now));
        s.order.push_back((fp, now));
        while s.map.len() > self.per_shard {
            let Some((old, at)) = s.order.pop_front() else {
                break;
            };
            match s.map.get(&old).map(|(_, last)| *last) {
                // Used since it was queued: queued again at its last use.
                Some(last) if last > at => s.order.push_back((old, last)),
                Some(_) => {
                    s.map.remove(&old);
                }
                None => {}
            }
        }
        // Records of the same blob again and again leave stale places behind: the order is
        // rebuilt from the map when it holds twice as many places as records (amortised).
        if s.order.len() > 2 * s.map.len() + 16 {
            let mut v: Vec<(u64, Instant)> = s.map.iter().map(|(f, (_, t))| (*f, *t)).collect();
            v.sort_by_key(|(_, t)| *t);
            s.order = v.into();
        }
    }

    /// The account that minted the blob of fingerprint `fp`, if recorded and not expired (its
    /// time to live starts again).
    pub fn owner(&self, fp: u64) -> Option<i64> {
        self.owner_at(fp, Instant::now())
    }

    fn owner_at(&self, fp: u64, now: Instant) -> Option<i64> {
        let mut s = lock(self.shard(fp));
        let (account, at) = s.map.get_mut(&fp)?;
        if now.saturating_duration_since(*at) > self.ttl {
            s.map.remove(&fp);
            return None;
        }
        *at = now;
        Some(*account)
    }

    /// Records held (all shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_expires() {
        let m = BlobOwners::new(1 << 20, Duration::from_secs(10));
        let t0 = Instant::now();
        m.record_at(42, 7, t0);
        assert_eq!(m.owner_at(42, t0 + Duration::from_secs(5)), Some(7));
        // Last use restarts the time to live.
        assert_eq!(m.owner_at(42, t0 + Duration::from_secs(14)), Some(7));
        assert_eq!(m.owner_at(42, t0 + Duration::from_secs(30)), None);
        assert_eq!(m.owner_at(43, t0), None);
        // A newer mint of the same fingerprint wins.
        m.record_at(1, 1, t0);
        m.record_at(1, 2, t0);
        assert_eq!(m.owner_at(1, t0), Some(2));
    }

    #[test]
    fn the_budget_bounds_every_shard() {
        let m = BlobOwners::new(ENTRY_BYTES * SHARDS * 4, Duration::from_secs(60));
        let t0 = Instant::now();
        // Same shard (top bits): the oldest records go first.
        for i in 0..100u64 {
            m.record_at(i, i as i64, t0 + Duration::from_millis(i));
        }
        assert_eq!(m.len(), 4);
        assert_eq!(m.owner_at(99, t0), Some(99));
        assert_eq!(m.owner_at(0, t0), None);
        // Across shards.
        for i in 0..1000u64 {
            m.record_at(i << 60 | i, 1, t0);
        }
        assert!(m.len() <= 4 * SHARDS);
    }
}
