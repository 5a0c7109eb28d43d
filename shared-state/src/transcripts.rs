//! Transcripts of HTTP responses for `previous_response_id` (the upstream keeps nothing with
//! `store:false`, so the gateway replays the history itself).
//!
//! # Key Components
//! - [`TranscriptStore`]: response id -> (client key, parent response, this turn's input and
//!   output items as one JSON array), shared by every worker. A continuation walks the parents
//!   back to the first turn (refreshing each link's time to live). Bounded by a byte budget
//!   (oldest insert first out) and a time to live since last use; a chain with an evicted link
//!   is *not found* (a partial history is never sent).
//!
//! # Concurrency
//! Sharded by response id; each shard is a short critical section (one insert or one lookup).
//! Only requests whose client asked for stored responses (`store` not `false`) touch it; the
//! Codex CLI's `store:false` traffic never does.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

const SHARDS: usize = 16;
/// Longest parent chain followed (a guard against cycles).
const MAX_DEPTH: usize = 10_000;

/// Why a continuation cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotFound;

struct Entry {
    key_id: i64,
    parent: Option<String>,
    items: Arc<[u8]>,
    at: Instant,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry>,
    order: VecDeque<String>,
    bytes: usize,
}

/// See the module docs.
pub struct TranscriptStore {
    shards: Vec<Mutex<Shard>>,
    budget_per_shard: usize,
    ttl: Duration,
}

impl std::fmt::Debug for TranscriptStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TranscriptStore")
            .field("budget_per_shard", &self.budget_per_shard)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn shard_of(id: &str) -> usize {
    // FNV-1a: ids are random, any spread will do.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % SHARDS as u64) as usize
}

// === impl TranscriptStore ===

impl TranscriptStore {
    /// A store holding at most about `budget_bytes` of items, each for `ttl` after its last
    /// use.
    pub fn new(budget_bytes: usize, ttl: Duration) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            budget_per_shard: (budget_bytes / SHARDS).max(1),
            ttl,
        }
    }

    /// Records a finished response: its client key, the response it continued, and this
    /// turn's items (a JSON array: the new input items, then the output items).
    pub fn put(&self, id: String, key_id: i64, parent: Option<String>, items: Vec<u8>) {
        let cost = items.len() + id.len() + 64;
        if cost > self.budget_per_shard {
            return;
        }
        let Ok(mut shard) = self.shards[shard_of(&id)].lock() else {
            return;
        };
        while shard.bytes + cost > self.budget_per_shard {
            let Some(old) = shard.order.pop_front() else {
                break;
            };
            if let Some(e) = shard.map.remove(&old) {
                shard.bytes -= e.items.len() + old.len() + 64;
            }
        }
        shard.bytes += cost;
        shard.order.push_back(id.clone());
        if let Some(prev) = shard.map.insert(
            id.clone(),
            Entry {
                key_id,
                parent,
                items: items.into(),
                at: Instant::now(),
            },
        ) {
            shard.bytes -= prev.items.len() + id.len() + 64;
        }
    }

    /// The item arrays of `id`'s whole chain, oldest first, if every link is present, fresh
    /// and belongs to `key_id` (another key's id is not found, like an unknown one).
    pub fn history(&self, id: &str, key_id: i64) -> Result<Vec<Arc<[u8]>>, NotFound> {
        let mut out = Vec::new();
        let mut next = Some(id.to_owned());
        while let Some(cur) = next.take() {
            if out.len() >= MAX_DEPTH {
                return Err(NotFound);
            }
            let (items, parent) = self.link(&cur, key_id)?.ok_or(NotFound)?;
            out.push(items);
            next = parent;
        }
        out.reverse();
        Ok(out)
    }

    /// One link of a chain: its items and parent; `Ok(None)` when this store does not hold
    /// it (unknown or expired here: another instance's store may), `Err` when it belongs to
    /// another client key. Use refreshes its time to live: a conversation in use keeps its
    /// whole chain.
    #[allow(clippy::type_complexity)]
    pub fn link(
        &self,
        id: &str,
        key_id: i64,
    ) -> Result<Option<(Arc<[u8]>, Option<String>)>, NotFound> {
        let mut shard = self.shards[shard_of(id)].lock().map_err(|_| NotFound)?;
        let Some(e) = shard.map.get_mut(id) else {
            return Ok(None);
        };
        if e.key_id != key_id {
            return Err(NotFound);
        }
        if e.at.elapsed() > self.ttl {
            return Ok(None);
        }
        e.at = Instant::now();
        Ok(Some((Arc::clone(&e.items), e.parent.clone())))
    }

    /// Longest chain followed.
    pub const MAX_DEPTH: usize = MAX_DEPTH;

    /// Bytes held (items and bookkeeping).
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .filter_map(|s| s.lock().ok().map(|s| s.bytes))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_keys_and_budget() {
        let s = TranscriptStore::new(1 << 20, Duration::from_secs(60));
        s.put("r1".into(), 7, None, b"[1]".to_vec());
        s.put("r2".into(), 7, Some("r1".into()), b"[2]".to_vec());
        let h = s.history("r2", 7).unwrap();
        assert_eq!(
            h.iter().map(|a| a.to_vec()).collect::<Vec<_>>(),
            vec![b"[1]".to_vec(), b"[2]".to_vec()]
        );
        assert_eq!(s.history("r2", 8), Err(NotFound), "another key's id");
        assert_eq!(s.history("nope", 7), Err(NotFound));

        // A tiny budget evicts the oldest; a chain missing a link is not found.
        let s = TranscriptStore::new(SHARDS * 200, Duration::from_secs(60));
        s.put("a".into(), 1, None, vec![b'x'; 100]);
        for i in 0..200 {
            s.put(format!("b{i}"), 1, Some("a".into()), vec![b'y'; 100]);
        }
        assert_eq!(s.history("a", 1), Err(NotFound));
        assert!(s.bytes() <= SHARDS * 200);
        let last = (0..200)
            .map(|i| format!("b{i}"))
            .rev()
            .find(|id| s.history(id, 1).is_err());
        assert!(
            last.is_some(),
            "the parent is gone, so its children are not found"
        );

        // Use refreshes the time to live.
        let s = TranscriptStore::new(1 << 20, Duration::from_millis(300));
        s.put("root".into(), 1, None, b"[]".to_vec());
        s.put("leaf".into(), 1, Some("root".into()), b"[]".to_vec());
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(150));
            assert!(
                s.history("leaf", 1).is_ok(),
                "a chain in use does not expire"
            );
        }

        let s = TranscriptStore::new(1 << 20, Duration::ZERO);
        s.put("t".into(), 1, None, b"[]".to_vec());
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(s.history("t", 1), Err(NotFound), "expired");
    }
}
