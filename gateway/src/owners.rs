//! Who minted which account-bound blob (issue 23; docs/protocol.md#account-bound-blobs).
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
//!   One per `App` (its workers share it; two instances in one process never do).
//! - [`Owners`]: a worker's view: the app's map, and Redis when configured. A record is
//!   written to Redis (`codex-gateway:owner:<fingerprint hex>` -> account id, same time to
//!   live) through the worker's ordered write queue, never awaited on the hot path; a request
//!   whose blobs the map does not know looks them up in Redis within [`LOOKUP_TIMEOUT`], so
//!   another instance, or this one after a restart, routes them to their minter.
//!
//! # Limits
//! What neither the map nor Redis knows in time (Redis down or slow, a client's old history,
//! another gateway's blobs) is unknown: the lifecycle's stripped retry after an
//! `invalid_encrypted_content` recovers it (one extra upstream request). A record's time to
//! live in Redis runs from its mint (or its last read from Redis), not from local uses.

use std::{
    collections::{HashMap, VecDeque},
    rc::Rc,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::redis::{encode, Reply, WorkerRedis};

const SHARDS: usize = 16;

/// Bytes one record is counted for (map slot, order slot, allocator overhead).
pub const ENTRY_BYTES: usize = 64;

/// How long a request waits for Redis to name the minters of blobs its instance does not
/// know; past it they are unknown (the stripped retry covers them).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(50);

/// Namespace of the records in Redis (like `codex-gateway:transcript:`).
const KEY_PREFIX: &str = "codex-gateway:owner:";

/// The Redis key of fingerprint `fp`'s record (the fingerprint, never the blob).
pub fn redis_key(fp: u64) -> Vec<u8> {
    format!("{KEY_PREFIX}{fp:016x}").into_bytes()
}

/// The default map's budget: about 260,000 blobs (a Codex CLI turn mints one or two).
pub const DEFAULT_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// The default map's time to live since last use (a session idle this long is routed anew; its
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

    /// A map of the default budget and time to live (one per app).
    pub fn with_defaults() -> Self {
        Self::new(DEFAULT_BUDGET_BYTES, DEFAULT_TTL)
    }

    /// A record's time to live since its last use.
    pub fn ttl(&self) -> Duration {
        self.ttl
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

/// A worker's view of the owners: the app's map, and Redis when configured (see the module
/// docs).
pub struct Owners {
    map: Arc<BlobOwners>,
    redis: Option<Rc<WorkerRedis>>,
}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owners")
            .field("map", &self.map)
            .field("redis", &self.redis.is_some())
            .finish()
    }
}

// === impl Owners ===

impl Owners {
    /// The app's `map`, shared through `redis` when configured.
    pub fn new(map: Arc<BlobOwners>, redis: Option<Rc<WorkerRedis>>) -> Self {
        Self { map, redis }
    }

    /// The app's map.
    pub fn map(&self) -> &BlobOwners {
        &self.map
    }

    /// Records that `account` minted the blob of fingerprint `fp`: in the map at once, and
    /// queued for Redis (never awaited; a failed write only costs another instance a stripped
    /// retry). Call on the worker (the queue's writer is a task of its runtime).
    pub fn record(&self, fp: u64, account: i64) {
        self.map.record(fp, account);
        if let Some(redis) = &self.redis {
            redis.start_writer();
            let ms = self.map.ttl.as_millis().max(1).to_string();
            let cmd = encode(&[
                b"SET",
                &redis_key(fp),
                account.to_string().as_bytes(),
                b"PX",
                ms.as_bytes(),
            ]);
            redis.submit(cmd, Box::new(|_| {}));
        }
    }

    /// The minting account of each fingerprint (`None`: unknown). The map answers first; the
    /// fingerprints it does not know are asked of Redis in one pipeline within
    /// [`LOOKUP_TIMEOUT`] (their time to live there starts again), and what Redis knows is
    /// kept in the map.
    pub async fn owners(&self, fps: &[u64]) -> Vec<Option<i64>> {
        let mut found: Vec<Option<i64>> = fps.iter().map(|fp| self.map.owner(*fp)).collect();
        let Some(redis) = &self.redis else {
            return found;
        };
        let missing: Vec<usize> = (0..fps.len()).filter(|i| found[*i].is_none()).collect();
        if missing.is_empty() || redis.breaker_open() {
            return found;
        }
        let ms = self.map.ttl.as_millis().max(1).to_string();
        let cmds: Vec<Vec<u8>> = missing
            .iter()
            .map(|i| encode(&[b"GETEX", &redis_key(fps[*i]), b"PX", ms.as_bytes()]))
            .collect();
        let replies = match redis.pipeline_within(&cmds, LOOKUP_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "blob owners not read from Redis; unknown");
                return found;
            }
        };
        for (i, reply) in missing.into_iter().zip(replies) {
            let account = match reply {
                Reply::Bulk(Some(v)) => std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok()),
                _ => None,
            };
            if let Some(a) = account {
                self.map.record(fps[i], a);
                found[i] = Some(a);
            }
        }
        found
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

#[cfg(test)]
mod redis_tests {
    //! The records' round trip through the real Redis of the test machine (skipped when none
    //! answers), on both monoio drivers.
    use std::{rc::Rc, sync::Arc, time::Duration};

    use super::{redis_key, BlobOwners, Owners};
    use crate::redis::{encode, RedisTarget, Reply, WorkerRedis};

    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn redis_up() -> bool {
        std::net::TcpStream::connect_timeout(
            &"127.0.0.1:6379".parse().unwrap(),
            Duration::from_millis(200),
        )
        .is_ok()
    }

    fn client() -> Rc<WorkerRedis> {
        Rc::new(WorkerRedis::new(
            RedisTarget::resolve("redis://127.0.0.1:6379/0").unwrap(),
        ))
    }

    /// A record made on one instance (its map and its queued Redis write) is found by another
    /// instance whose map is empty (another process, or this one restarted), kept in that
    /// map, with the record's time to live in Redis; an unknown fingerprint stays unknown.
    #[monoio::test_all(timer_enabled = true)]
    async fn a_record_reaches_another_instance_through_redis() {
        if !redis_up() {
            eprintln!("no Redis on 127.0.0.1:6379; skipped");
            return;
        }
        // Fingerprints of this run only (both drivers run at once; the counter is outside the
        // test body, which each driver's copy would otherwise hold its own of).
        let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seed = u64::from(std::process::id()) << 20 | n << 8;
        let (fp, unknown) = (
            codex_protocol::bound::fingerprint(&format!("blob-{seed}")),
            codex_protocol::bound::fingerprint(&format!("never-{seed}")),
        );
        let ttl = Duration::from_secs(600);
        let a = Owners::new(Arc::new(BlobOwners::new(1 << 20, ttl)), Some(client()));
        a.record(fp, 4242);
        assert_eq!(a.map().owner(fp), Some(4242), "recorded locally at once");
        // The write is queued, not awaited: wait for it to land (bounded).
        let probe = client();
        let mut landed = None;
        for _ in 0..200 {
            let r = probe
                .pipeline(&[encode(&[b"GET", &redis_key(fp)])])
                .await
                .unwrap();
            if let [Reply::Bulk(Some(v))] = r.as_slice() {
                landed = Some(v.clone());
                break;
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            landed.as_deref(),
            Some(&b"4242"[..]),
            "the account id, nothing else"
        );
        let pttl = probe
            .pipeline(&[encode(&[b"PTTL", &redis_key(fp)])])
            .await
            .unwrap();
        assert!(
            matches!(pttl.as_slice(), [Reply::Integer(t)] if *t > 0 && *t <= 600_000),
            "the record's time to live: {pttl:?}"
        );

        let b = Owners::new(Arc::new(BlobOwners::new(1 << 20, ttl)), Some(client()));
        assert_eq!(b.map().owner(fp), None);
        assert_eq!(b.owners(&[unknown, fp]).await, vec![None, Some(4242)]);
        assert_eq!(b.map().owner(fp), Some(4242), "kept in the map");

        // Without Redis, or with an unreachable one, a miss is unknown (never an error).
        let alone = Owners::new(Arc::new(BlobOwners::new(1 << 20, ttl)), None);
        assert_eq!(alone.owners(&[fp]).await, vec![None]);
        let dead = Owners::new(
            Arc::new(BlobOwners::new(1 << 20, ttl)),
            Some(Rc::new(WorkerRedis::new(
                RedisTarget::resolve("redis://127.0.0.1:1").unwrap(),
            ))),
        );
        dead.record(fp, 1);
        let other = codex_protocol::bound::fingerprint(&format!("other-{seed}"));
        assert_eq!(dead.owners(&[other, fp]).await, vec![None, Some(1)]);
        let _ = probe.pipeline(&[encode(&[b"DEL", &redis_key(fp)])]).await;
    }
}
