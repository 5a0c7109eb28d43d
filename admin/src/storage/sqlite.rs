//! The embedded SQLite backend (the default: `<data_dir>/codex-gateway.db`).
//!
//! # Key Components
//! - [`SqliteStorage`]: a small pool over one database file in WAL mode with a busy timeout,
//!   so the running gateway and a `codex-gateway accounts ...` CLI invocation can share it.
//!
//! # Usage
//! Built by [`super::open`]; `sqlite::memory:` works too (one connection, for tests).
//!
//! # Error handling
//! Open/migrate failures are [`StorageError::Connect`] / [`StorageError::Migrate`].

use std::{path::Path, str::FromStr, time::Duration};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Sqlite, SqlitePool,
};

use super::{sql::impl_storage, Backend};
use crate::{crypto::Cipher, error::StorageError};

/// Storage on an SQLite file.
#[derive(Debug)]
pub struct SqliteStorage {
    pool: SqlitePool,
    cipher: Cipher,
}

// === impl SqliteStorage ===

impl SqliteStorage {
    /// Opens (creating the file and its directory if missing) and migrates.
    pub async fn open_file(path: &Path, cipher: Cipher) -> Result<Self, StorageError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::crypto::create_private_dir(dir)?;
        }
        private_db_file(path)?;
        let opts = SqliteConnectOptions::new().filename(path);
        Self::open_with(opts, path.display().to_string(), false, cipher).await
    }

    /// Opens a `sqlite://...` URL (creating the file if missing) and migrates.
    pub async fn open_url(url: &str, cipher: Cipher) -> Result<Self, StorageError> {
        let opts = SqliteConnectOptions::from_str(url).map_err(|source| StorageError::Connect {
            target: url.to_owned(),
            source,
        })?;
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        if !memory {
            let file = opts.get_filename();
            if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                crate::crypto::create_private_dir(dir)?;
            }
            private_db_file(file)?;
        }
        Self::open_with(opts, url.to_owned(), memory, cipher).await
    }

    async fn open_with(
        opts: SqliteConnectOptions,
        target: String,
        memory: bool,
        cipher: Cipher,
    ) -> Result<Self, StorageError> {
        let mut opts = opts
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        if !memory {
            opts = opts
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
        }
        let pool = SqlitePoolOptions::new()
            // An embedded database needs no liveness round trip per acquire.
            .test_before_acquire(false)
            // An in-memory database exists per connection: keep exactly one alive.
            .max_connections(if memory { 1 } else { 4 })
            .min_connections(if memory { 1 } else { 0 })
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(600))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(3600))
            })
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await
            .map_err(|source| StorageError::Connect { target, source })?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self { pool, cipher })
    }

    /// The underlying pool (for tests and diagnostics).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Creates the database file with mode 0600 before SQLite does (SQLite gives its WAL and
/// shared-memory files the database file's mode), or tightens an existing one.
fn private_db_file(path: &Path) -> Result<(), StorageError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.as_os_str().to_owned();
                p.push(suffix);
                crate::crypto::restrict_file(Path::new(&p));
            }
            Ok(())
        }
        Err(source) => Err(StorageError::Io {
            what: "cannot create database file",
            path: path.to_path_buf(),
            source,
        }),
    }
}

impl_storage!(SqliteStorage, Sqlite, Backend::Sqlite);
super::proxies::impl_proxy_store!(SqliteStorage, Sqlite);
super::audit::impl_audit_store!(SqliteStorage, Sqlite);
