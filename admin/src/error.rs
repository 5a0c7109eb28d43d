//! The admin crate's error types, one per edge.
//!
//! # Key Components
//! - [`StorageError`]: anything the storage layer (sqlx, migrations, the secret box) reports.
//! - [`SidecarError`]: why [`crate::spawn`] could not start the sidecar (bad database URL,
//!   unreachable PostgreSQL or Redis, admin port in use).
//! - [`AdminError`]: what the blocking CLI helpers in [`crate::cli`] return.
//! - [`AuthError`]: setting up the admin credential ([`crate::auth`]).
//!
//! # Error handling
//! Every message is safe to print: URLs are shown with their credentials removed
//! ([`redact_url`]) and no token ever reaches an error.

use std::{net::SocketAddr, path::PathBuf};

/// Owned by `shared-state` (the gateway's configuration redacts with it too).
pub use shared_state::secret::redact_url;

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
    AdminAuth(#[from] AuthError),
    /// The sidecar thread died before it reported readiness.
    #[error("the sidecar thread exited during startup")]
    StartupAborted,
}

/// Setting up the admin credential failed (`crate::auth`): hashing the password, storage,
/// or no credential for a listener off loopback.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Argon2 refused the input.
    #[error("cannot hash the admin password: {0}")]
    Hash(String),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The admin listener is not on loopback and the operator set no credential.
    #[error(
        "refusing to serve the admin API on {0} without an admin credential: set \
         CODEX_GATEWAY_ADMIN_PASSWORD (or admin_token), or run `codex-gateway admin \
         reset-password`, or keep admin_listen on 127.0.0.1"
    )]
    NoCredential(SocketAddr),
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
