//! The admin crate's error types, one per edge.
//!
//! # Key Components
//! - [`StorageError`]: anything the storage layer (sqlx, migrations, the secret box) reports.
//! - [`SidecarError`]: why [`crate::spawn`] could not start the sidecar (bad database URL,
//!   unreachable PostgreSQL or Redis, admin port in use).
//! - [`AdminError`]: what the blocking CLI helpers in [`crate::cli`] return.
//!
//! # Error handling
//! Every message is safe to print: URLs are shown with their credentials removed
//! ([`redact_url`]) and no token ever reaches an error.

use std::{net::SocketAddr, path::PathBuf};

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database URL is not one we understand.
    #[error("unsupported database URL {0:?}: expected postgres://, postgresql:// or sqlite://")]
    BadUrl(String),
    /// The database could not be reached or opened.
    #[error("cannot open database {target}: {source}")]
    Connect {
        /// The redacted URL or file path.
        target: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying migrations failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// The data directory or key file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The secret key is malformed (wrong length, not base64).
    #[error("secret key: {0}")]
    SecretKey(String),
    /// A stored token could not be decrypted (wrong key or corrupted column).
    #[error("cannot decrypt a stored secret (wrong CODEX_GATEWAY_SECRET_KEY / secret.key?)")]
    Decrypt,
    /// A stored value has an unexpected shape.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Stored tokens do not open with the configured key: refusing to start (a lost or
    /// replaced key would otherwise make every account unusable while health says 200).
    #[error(
        "{failed} of {columns} stored token columns do not open with the secret key ({key}); \
         restore the original secret.key or CODEX_GATEWAY_SECRET_KEY. Refusing to start"
    )]
    KeyMismatch {
        /// Columns that did not open.
        failed: usize,
        /// Non-empty token columns.
        columns: usize,
        /// Which key was tried (never the key itself).
        key: String,
    },
}

// === impl StorageError ===

impl StorageError {
    /// True when the error means "the database is unreachable right now" (worth retrying),
    /// as opposed to a bug or a constraint violation.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Db(e) => matches!(
                e,
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::Tls(_)
            ),
            _ => false,
        }
    }
}

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// Storage could not be opened or migrated.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Redis was configured but is unreachable.
    #[error("cannot connect to Redis at {url}: {reason}")]
    Redis {
        /// The redacted URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The admin listener could not be bound.
    #[error("cannot bind the admin API on {addr}: {source}")]
    Bind {
        /// The requested address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client (OAuth refresh, quota polling) could not be built.
    #[error("cannot build the sidecar HTTP client: {0}")]
    HttpClient(String),
    /// The runtime or the thread could not be created.
    #[error("cannot start the sidecar thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The admin credential could not be set up, or the admin listener would be exposed
    /// without one.
    #[error(transparent)]
    AdminAuth(#[from] crate::auth::AuthError),
    /// The sidecar thread died before it reported readiness.
    #[error("the sidecar thread exited during startup")]
    StartupAborted,
}

/// What the CLI helpers report.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The small runtime for the command could not be built.
    #[error("cannot start a runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Invalid input (empty key name, ...).
    #[error("{0}")]
    Invalid(String),
    /// Nothing matched.
    #[error("{0}")]
    NotFound(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
    /// A service the command needs (Redis) is unreachable.
    #[error("{0}")]
    Unavailable(String),
}

/// Removes `user:password@` from a URL so it can be logged; non-URLs are returned unchanged.
pub fn redact_url(url: &str) -> String {
    // The query first: `?password=...` (libpq and sqlx accept it) and its kin.
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, tail) = match rest.find(['/', '#']) {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://***@{host}{tail}"),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    if let Some(q) = query {
        out.push('?');
        let parts: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                _ => kv.to_owned(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    out
}

/// Query parameters that carry credentials.
fn is_secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "token",
        "auth",
        "sslpassword",
        "key",
    ]
    .iter()
    .any(|s| n == *s || n.ends_with(&format!("_{s}")) || n.ends_with(s))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact_url("postgres://u:p@db:5432/x?sslmode=require"),
            "postgres://***@db:5432/x?sslmode=require"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("sqlite://a.db"), "sqlite://a.db");
        assert_eq!(redact_url("/tmp/x"), "/tmp/x");
        assert_eq!(
            redact_url("postgres://db/x?user=u&password=hunter2&sslmode=require"),
            "postgres://db/x?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("rediss://:pw@cache:6380/0?sslpassword=s3&x=1"),
            "rediss://***@cache:6380/0?sslpassword=***&x=1"
        );
        assert_eq!(
            redact_url("sqlite:a.db?PASSWORD=p"),
            "sqlite:a.db?PASSWORD=***"
        );
        for u in [
            "postgres://u:hunter2@db/x?password=hunter2",
            "redis://default:hunter2@h:1?auth_token=hunter2",
        ] {
            assert!(!redact_url(u).contains("hunter2"), "{u}");
        }
    }
}
