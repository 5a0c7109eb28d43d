//! The PostgreSQL backend (production; several gateway instances share one database).
//!
//! # Key Components
//! - [`PgStorage`]: a pool with a short acquire timeout so an outage surfaces quickly as
//!   [`StorageError::is_unavailable`] instead of stalling the sidecar.
//!
//! # Usage
//! Built by [`super::open`] for `postgres://` / `postgresql://` URLs. Migrations run at every
//! start; sqlx's migration lock makes concurrent starts of several instances safe.
//!
//! # Error handling
//! An unreachable server at start is [`StorageError::Connect`] with the URL's credentials
//! redacted.

use std::time::Duration;

use sqlx::{postgres::PgPoolOptions, PgPool, Postgres};

use super::{sql::impl_storage, Backend};
use crate::{
    crypto::Cipher,
    error::{redact_url, StorageError},
};

/// Storage on a PostgreSQL database.
#[derive(Debug)]
pub struct PgStorage {
    pool: PgPool,
    cipher: Cipher,
}

// === impl PgStorage ===

impl PgStorage {
    /// Connects and migrates.
    pub async fn connect(url: &str, cipher: Cipher) -> Result<Self, StorageError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .idle_timeout(Some(Duration::from_secs(300)))
            .connect(url)
            .await
            .map_err(|source| StorageError::Connect {
                target: redact_url(url),
                source,
            })?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(Self { pool, cipher })
    }

    /// The underlying pool (for tests and diagnostics).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl_storage!(PgStorage, Postgres, Backend::Postgres);
super::proxies::impl_proxy_store!(PgStorage, Postgres);
super::audit::impl_audit_store!(PgStorage, Postgres);
