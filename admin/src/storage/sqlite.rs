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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sql;

    /// What SQLite does for each usage query (EXPLAIN QUERY PLAN, one line per step).
    async fn plan(s: &SqliteStorage, q: &str) -> Vec<String> {
        use sqlx::Row;
        sqlx::query(&format!("EXPLAIN QUERY PLAN {q}"))
            .fetch_all(s.pool())
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<String, _>("detail"))
            .collect()
    }

    /// Every usage query searches an index or scans the table once; none walks a whole index
    /// for its order with a table lookup per row. usage_records has exactly the indexes
    /// these plans use (each one is a b-tree insert per request: migration 0023).
    #[tokio::test]
    async fn usage_query_plans() {
        let s = SqliteStorage::open_url("sqlite::memory:", Cipher::new(&[7; 32]))
            .await
            .unwrap();
        let search =
            |index: &str, cond: &str| format!("SEARCH usage_records USING {index} ({cond})");
        let cases: [(&str, &str, Option<String>); 8] = [
            (
                "key spend",
                sql::KEY_SPEND,
                Some(search("INDEX usage_records_started", "started_at_ms>?")),
            ),
            (
                "prune",
                "DELETE FROM usage_records WHERE started_at_ms < $1",
                Some(search("INDEX usage_records_started", "started_at_ms<?")),
            ),
            (
                "by request id",
                sql::USAGE_BY_REQUEST_ID,
                Some(search("INDEX usage_records_request_id", "request_id=?")),
            ),
            (
                "rows page",
                sql::USAGE_ROWS,
                Some(search("INTEGER PRIMARY KEY", "rowid>?")),
            ),
            (
                "recent failures",
                sql::RECENT_FAILURES,
                Some("SCAN usage_records USING INDEX usage_records_failed".into()),
            ),
            (
                "duplicate check",
                "SELECT 1 FROM usage_records WHERE record_id = $1",
                Some(search(
                    "COVERING INDEX usage_records_record_id",
                    "record_id=?",
                )),
            ),
            ("summary", sql::USAGE_GROUPS, None),
            ("buckets", sql::USAGE_BUCKETS, None),
        ];
        for (name, q, want) in cases {
            let got = plan(&s, q).await;
            match want {
                Some(w) => assert!(got.contains(&w), "{name}: {got:?}"),
                // Filters of the form `$3 IS NULL OR ...`: one pass over the table.
                None => assert!(
                    got.contains(&"SCAN usage_records".to_owned()),
                    "{name}: {got:?}"
                ),
            }
            assert!(
                !got.iter()
                    .any(|l| l.starts_with("SCAN usage_records USING INDEX")
                        && !l.ends_with("usage_records_failed")),
                "{name}: a whole index walked for its order: {got:?}"
            );
        }
        let mut indexes: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'usage_records' \
             AND name NOT LIKE 'sqlite_autoindex%'",
        )
        .fetch_all(s.pool())
        .await
        .unwrap();
        indexes.sort();
        assert_eq!(
            indexes,
            [
                "usage_records_failed",
                "usage_records_record_id",
                "usage_records_request_id",
                "usage_records_started",
            ],
            "each index of usage_records is a b-tree insert per request"
        );
    }
}
