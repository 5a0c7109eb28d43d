//! Fleet-wide refresh leases in Redis: one token refresh per account across every gateway
//! instance sharing the database (docs/protocol.md#oauth-refresh: the refresh token rotates, so two
//! concurrent refreshes kill the account).
//!
//! # Key Components
//! - [`RedisLeases`]: a `ConnectionManager`, this instance's id and the lease time to live.
//!   - [`RedisLeases::try_acquire`] takes `codex-gateway:refresh:{<account>}` when free and
//!     returns a **fencing token**: the next value of the per-account counter
//!     `codex-gateway:refresh-fence:{<account>}` (one Lua script, so the lease and its fence
//!     are taken together; the counter is first raised to the fence stored in the database, so
//!     a flushed Redis never hands out a fence below one already used). The lease's value is
//!     `<instance>:<fence>`.
//!   - [`RedisLeases::renew`] extends the lease while its holder still owns it (a refresh
//!     renews every third of the time to live, so a slow token endpoint never outlives it);
//!     [`RedisLeases::release`] deletes it only when still owned (compare-and-delete), so an
//!     expired lease another holder took over is never deleted by its former owner.
//! - The fence travels with the new tokens ([`crate::storage::TokenUpdate::fence`]); storage
//!   refuses a write whose fence is below the stored one, so a refresh that lost its lease
//!   (a pause longer than the lease, a partition) cannot overwrite a newer holder's tokens.
//!   Both keys carry the account id as a hash tag (one cluster slot).
//!
//! # Error handling
//! Connect failures at start are reported to [`crate::spawn`]'s caller; a Redis error during a
//! refresh is treated as "lease not held" (the refresh goes on under the in-process
//! single-flight, without a fence).

use std::time::Duration;

use redis::{aio::ConnectionManager, aio::ConnectionManagerConfig, Script};

use crate::error::{redact_url, SidecarError};

/// Key prefix of refresh leases (`<prefix>{<account id>}`).
pub const LEASE_PREFIX: &str = "codex-gateway:refresh:";
/// Key prefix of the per-account fencing counters (`<prefix>{<account id>}`).
pub const FENCE_PREFIX: &str = "codex-gateway:refresh-fence:";
/// Default lease time to live.
pub const LEASE_TTL: Duration = shared_state::config::REFRESH_LEASE_TTL;

/// KEYS: lease, fence counter. ARGV: instance, ttl ms, stored fence. 0 when held elsewhere.
const ACQUIRE_LUA: &str = r#"if redis.call("EXISTS", KEYS[1]) == 1 then return 0 end
local floor = tonumber(ARGV[3])
local cur = tonumber(redis.call("GET", KEYS[2]) or "0")
if cur < floor then redis.call("SET", KEYS[2], floor) end
local f = redis.call("INCR", KEYS[2])
redis.call("SET", KEYS[1], ARGV[1] .. ":" .. f, "PX", ARGV[2])
return f"#;
const RENEW_LUA: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) else return 0 end"#;
const RELEASE_LUA: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

/// Redis-backed refresh leases.
#[derive(Clone)]
pub struct RedisLeases {
    conn: ConnectionManager,
    instance: String,
    ttl: Duration,
    acquire: Script,
    renew: Script,
    release: Script,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases")
            .field("instance", &self.instance)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

// === impl RedisLeases ===

impl RedisLeases {
    /// Connects (bounded: about 5 s) and checks the server answers `PING`. Leases live
    /// `ttl` unless renewed.
    pub async fn connect(url: &str, instance: String, ttl: Duration) -> Result<Self, SidecarError> {
        let err = |reason: String| SidecarError::Redis {
            url: redact_url(url),
            reason,
        };
        let client = redis::Client::open(url).map_err(|e| err(e.to_string()))?;
        let cfg = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Duration::from_secs(3))
            .set_response_timeout(Duration::from_secs(3));
        let mut conn = tokio::time::timeout(
            Duration::from_secs(5),
            client.get_connection_manager_with_config(cfg),
        )
        .await
        .map_err(|_| err("timed out".into()))?
        .map_err(|e| err(e.to_string()))?;
        let pong: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| err(e.to_string()))?;
        if pong != "PONG" {
            return Err(err(format!("unexpected PING reply {pong:?}")));
        }
        Ok(Self {
            conn,
            instance,
            ttl: if ttl.is_zero() { LEASE_TTL } else { ttl },
            acquire: Script::new(ACQUIRE_LUA),
            renew: Script::new(RENEW_LUA),
            release: Script::new(RELEASE_LUA),
        })
    }

    /// A handle on the connection (cheap clone), for other fleet-wide state (per-key
    /// counters, `crate::key_limits`; invalidations, `crate::pubsub`).
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Whether Redis answers `PING` (for `/healthz`).
    pub async fn ping(&self) -> bool {
        let mut conn = self.conn.clone();
        matches!(
            redis::cmd("PING").query_async::<String>(&mut conn).await,
            Ok(p) if p == "PONG"
        )
    }

    /// This instance's lease owner id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The lease time to live (a holder renews every third of it).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(30_000).max(1)
    }

    /// The lease key of an account.
    pub fn key(account_id: i64) -> String {
        format!("{LEASE_PREFIX}{{{account_id}}}")
    }

    /// The fencing counter key of an account.
    pub fn fence_key(account_id: i64) -> String {
        format!("{FENCE_PREFIX}{{{account_id}}}")
    }

    fn value(&self, fence: i64) -> String {
        format!("{}:{fence}", self.instance)
    }

    /// Takes the refresh lease for an account: its fencing token, or `None` when another
    /// owner holds it. `stored_fence` is the fence the database holds for the account (the
    /// new one is always above it).
    pub async fn try_acquire(
        &self,
        account_id: i64,
        stored_fence: i64,
    ) -> Result<Option<i64>, redis::RedisError> {
        let mut c = self.conn.clone();
        let f: i64 = self
            .acquire
            .key(Self::key(account_id))
            .key(Self::fence_key(account_id))
            .arg(&self.instance)
            .arg(self.ttl_ms())
            .arg(stored_fence.max(0))
            .invoke_async(&mut c)
            .await?;
        Ok((f > 0).then_some(f))
    }

    /// Extends the lease taken with `fence` by a full time to live; `false` when it is not
    /// ours any more (expired, or taken by another holder).
    pub async fn renew(&self, account_id: i64, fence: i64) -> Result<bool, redis::RedisError> {
        self.if_owned(&self.renew, account_id, fence, Some(self.ttl_ms()))
            .await
    }

    /// Releases the lease taken with `fence` if this holder still owns it; returns whether it
    /// was deleted.
    pub async fn release(&self, account_id: i64, fence: i64) -> Result<bool, redis::RedisError> {
        self.if_owned(&self.release, account_id, fence, None).await
    }

    /// Runs a compare-and-act `script` on the lease (`ARGV[1]`: our value, `ARGV[2]`: the
    /// time to live, when given); whether it acted.
    async fn if_owned(
        &self,
        script: &Script,
        account_id: i64,
        fence: i64,
        ttl_ms: Option<u64>,
    ) -> Result<bool, redis::RedisError> {
        let mut c = self.conn.clone();
        let mut call = script.key(Self::key(account_id));
        call.arg(self.value(fence));
        if let Some(t) = ttl_ms {
            call.arg(t);
        }
        let n: i64 = call.invoke_async(&mut c).await?;
        Ok(n == 1)
    }
}

/// A random RFC 4122 v4 UUID string, used as this process's lease owner id.
pub fn new_instance_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_look_like_uuids() {
        let a = new_instance_id();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, new_instance_id());
    }
}
