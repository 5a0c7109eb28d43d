//! Fleet-wide refresh leases in Redis: one token refresh per account across every gateway
//! instance sharing the database (codex-protocol.md §2.7: the refresh token rotates, so two
//! concurrent refreshes kill the account).
//!
//! # Key Components
//! - [`RedisLeases`]: a `ConnectionManager` plus this instance's id.
//!   [`RedisLeases::try_acquire`] is `SET codex-gateway:refresh:<account> <instance> NX PX 30000`;
//!   [`RedisLeases::release`] is a compare-and-delete Lua script, so an expired lease that
//!   another instance took over is never deleted by its former owner.
//!
//! # Error handling
//! Connect failures at start are reported to [`crate::spawn`]'s caller; a Redis error during a
//! refresh is treated as "lease not held" (the refresh is skipped and the reload loop picks up
//! whatever another instance wrote).

use std::time::Duration;

use redis::{aio::ConnectionManager, aio::ConnectionManagerConfig, Script};

use crate::error::{redact_url, SidecarError};

/// Key prefix of refresh leases.
pub const LEASE_PREFIX: &str = "codex-gateway:refresh:";
/// Lease time-to-live.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

const RELEASE_LUA: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

/// Redis-backed refresh leases.
#[derive(Clone)]
pub struct RedisLeases {
    conn: ConnectionManager,
    instance: String,
    release: Script,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

// === impl RedisLeases ===

impl RedisLeases {
    /// Connects (bounded: about 5 s) and checks the server answers `PING`.
    pub async fn connect(url: &str, instance: String) -> Result<Self, SidecarError> {
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
            release: Script::new(RELEASE_LUA),
        })
    }

    /// A handle on the connection (cheap clone), for other fleet-wide state (per-key
    /// counters, `crate::key_limits`).
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

    fn key(account_id: i64) -> String {
        format!("{LEASE_PREFIX}{account_id}")
    }

    /// Takes the refresh lease for an account; `false` when another owner holds it.
    pub async fn try_acquire(&self, account_id: i64) -> Result<bool, redis::RedisError> {
        let mut c = self.conn.clone();
        let ttl_ms = u64::try_from(LEASE_TTL.as_millis()).unwrap_or(30_000);
        let r: Option<String> = redis::cmd("SET")
            .arg(Self::key(account_id))
            .arg(&self.instance)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut c)
            .await?;
        Ok(r.is_some())
    }

    /// Releases the lease if this instance still owns it; returns whether it was deleted.
    pub async fn release(&self, account_id: i64) -> Result<bool, redis::RedisError> {
        let mut c = self.conn.clone();
        let n: i64 = self
            .release
            .key(Self::key(account_id))
            .arg(&self.instance)
            .invoke_async(&mut c)
            .await?;
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
