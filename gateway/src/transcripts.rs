//! HTTP response transcripts for `previous_response_id`, across workers and instances: the
//! process-wide [`TranscriptStore`] (memory, shared by the workers) in front of Redis when
//! one is configured, so a chain started on one instance continues on another.
//!
//! # Key Components
//! - [`Transcripts`]: one per worker. [`Transcripts::put`] keeps a finished turn in memory at
//!   once and writes it to Redis in a task of its own (the stream never waits for Redis);
//!   [`Transcripts::history`] walks a chain link by link, from memory first, from Redis for a
//!   link this instance does not hold (which is then kept in memory too), and refreshes the
//!   Redis time to live of links served from memory, so a conversation in use on one instance
//!   stays continuable on the others.
//!
//! # Error handling
//! Redis is never required: when it is down or slow (see [`crate::redis`]), a link only
//! another instance holds is *not found*, exactly as without Redis.

use std::{rc::Rc, sync::Arc, time::Duration};

use shared_state::{transcripts::NotFound, TranscriptStore};

use crate::redis::WorkerRedis;

const KEY_PREFIX: &[u8] = b"codex-gateway:transcript:";

/// See the module docs.
#[derive(Debug)]
pub struct Transcripts {
    store: Arc<TranscriptStore>,
    redis: Option<Rc<WorkerRedis>>,
    ttl: Duration,
}

fn redis_key(id: &str) -> Vec<u8> {
    [KEY_PREFIX, id.as_bytes()].concat()
}

/// A link as stored in Redis: `key_id \n parent \n items`.
fn encode_link(key_id: i64, parent: Option<&str>, items: &[u8]) -> Vec<u8> {
    let mut v = format!("{key_id}\n{}\n", parent.unwrap_or("")).into_bytes();
    v.extend_from_slice(items);
    v
}

fn decode_link(raw: &[u8]) -> Option<(i64, Option<String>, &[u8])> {
    let nl = raw.iter().position(|&b| b == b'\n')?;
    let key_id = std::str::from_utf8(&raw[..nl]).ok()?.parse().ok()?;
    let rest = &raw[nl + 1..];
    let nl2 = rest.iter().position(|&b| b == b'\n')?;
    let parent = std::str::from_utf8(&rest[..nl2]).ok()?;
    let parent = (!parent.is_empty()).then(|| parent.to_owned());
    Some((key_id, parent, &rest[nl2 + 1..]))
}

// === impl Transcripts ===

impl Transcripts {
    /// A worker's view: the shared `store`, and Redis when configured.
    pub fn new(store: Arc<TranscriptStore>, redis: Option<Rc<WorkerRedis>>, ttl: Duration) -> Self {
        Self { store, redis, ttl }
    }

    /// This worker's Redis client, when configured (also the per-key fleet counters',
    /// `crate::limits`).
    pub fn redis(&self) -> Option<&Rc<WorkerRedis>> {
        self.redis.as_ref()
    }

    /// Keeps a finished turn (its new input items, then its outputs, as one JSON array).
    pub fn put(&self, id: String, key_id: i64, parent: Option<String>, items: Vec<u8>) {
        if let Some(redis) = &self.redis {
            let ids_ok = !id.contains('\n') && parent.as_deref().is_none_or(|p| !p.contains('\n'));
            if ids_ok {
                let redis = Rc::clone(redis);
                let key = redis_key(&id);
                let value = encode_link(key_id, parent.as_deref(), &items);
                let ttl = self.ttl;
                monoio::spawn(async move {
                    if let Err(e) = redis.set_px(&key, &value, ttl).await {
                        tracing::debug!(error = %e, "transcript not written to Redis");
                    }
                });
            }
        }
        self.store.put(id, key_id, parent, items);
    }

    /// The item arrays of `id`'s whole chain, oldest first, if every link is found (here or
    /// in Redis), fresh and belongs to `key_id`.
    pub async fn history(&self, id: &str, key_id: i64) -> Result<Vec<Arc<[u8]>>, NotFound> {
        let mut out = Vec::new();
        let mut from_memory = Vec::new();
        let mut next = Some(id.to_owned());
        while let Some(cur) = next.take() {
            if out.len() >= TranscriptStore::MAX_DEPTH {
                return Err(NotFound);
            }
            if let Some((items, parent)) = self.store.link(&cur, key_id)? {
                out.push(items);
                next = parent;
                from_memory.push(redis_key(&cur));
                continue;
            }
            let redis = self.redis.as_ref().ok_or(NotFound)?;
            let raw = redis
                .get_ex(&redis_key(&cur), self.ttl)
                .await
                .ok()
                .flatten()
                .ok_or(NotFound)?;
            let (owner, parent, items) = decode_link(&raw).ok_or(NotFound)?;
            if owner != key_id {
                return Err(NotFound);
            }
            let items: Arc<[u8]> = Arc::from(items);
            self.store.put(cur, owner, parent.clone(), items.to_vec());
            out.push(items);
            next = parent;
        }
        if let Some(redis) = self.redis.as_ref().filter(|_| !from_memory.is_empty()) {
            // Links served from memory: their Redis copies live as long as the memory ones.
            let redis = Rc::clone(redis);
            let ttl = self.ttl;
            monoio::spawn(async move {
                let _ = redis.pexpire_many(&from_memory, ttl).await;
            });
        }
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_round_trip() {
        let raw = encode_link(-7, Some("resp_1"), b"[{\"a\":\"\\n\"}]\n");
        assert_eq!(
            decode_link(&raw),
            Some((-7, Some("resp_1".to_owned()), &b"[{\"a\":\"\\n\"}]\n"[..]))
        );
        let raw = encode_link(3, None, b"[]");
        assert_eq!(decode_link(&raw), Some((3, None, &b"[]"[..])));
        assert_eq!(decode_link(b"x\n\n[]"), None);
        assert_eq!(decode_link(b"3\n"), None);
    }
}
