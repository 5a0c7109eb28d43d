//! The Tokio sidecar of codex-gateway: storage, Redis, token refresh, and the admin API.
//!
//! One named OS thread (`codex-sidecar`) runs a `current_thread` Tokio runtime that owns
//! everything slow or shared; the monoio workers never wait for it. It publishes immutable
//! account/key snapshots through `ArcSwap` plus a per-worker command channel, and consumes the
//! workers' facts (usage, account effects, quota, refresh requests) from a lock-free queue.
//!
//! # Key Components
//! - [`spawn`] / [`SidecarHandle`]: start the sidecar (blocking until storage is migrated, the
//!   first snapshot is published and the admin listener is bound) and stop it.
//! - [`storage`]: the [`Storage`] trait with SQLite and PostgreSQL implementations, and
//!   [`storage::open`].
//! - [`publish`]: snapshot building with process-lifetime live `Arc`s.
//! - [`import`]: credential file import; [`oauth`]: token endpoint and JWT identity;
//!   [`lease`]: Redis refresh leases (renewed, fenced); `pubsub`: fleet invalidations over
//!   Redis pub/sub; [`crypto`]: secrets at rest and client keys.
//! - [`quota`]: the `/wham/usage` client and parser behind the staggered quota poller.
//! - [`models`]: the upstream `/models` client behind the model catalog refresher, which
//!   publishes the merged per-plan catalog into [`SidecarShared::catalog`].
//! - [`settings`]: runtime settings stored in the database over the configured defaults.
//! - [`auth`]: the admin password (Argon2id; generated and printed once when nothing is
//!   configured), sessions, admin API tokens and login rate limiting: the admin API is closed
//!   by default. The API itself is one file per resource under `api/`; [`web`] serves the
//!   embedded admin web app (`frontend/dist`) under `/` of the admin listener.
//! - [`supervisor`]: every long-running sidecar task runs under it (restarted with backoff
//!   after a panic or an unexpected exit, counted, a task that keeps failing shown in
//!   `/healthz`).
//! - [`cli`]: blocking helpers for the `accounts` / `keys` / `settings` subcommands.
//!
//! # Usage
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use shared_state::{channels, Health, ModelCatalog, Snapshot};
//!
//! let snapshot = Snapshot::shared();
//! let (event_tx, events) = channels::events();
//! let (mailboxes, _worker_boxes) = channels::mailboxes(4);
//! let cfg = admin::SidecarConfig::new(
//!     admin::DbTarget { data_dir: "./data".into(), database_url: None },
//!     "127.0.0.1:8081".parse()?,
//! );
//! let handle = admin::spawn(cfg, admin::SidecarShared {
//!     snapshot: snapshot.clone(),
//!     health: Default::default(),
//!     events,
//!     mailboxes,
//!     catalog: ModelCatalog::embedded(Default::default()).shared(),
//! })?;
//! println!("admin API on {}", handle.admin_addr);
//! # drop(event_tx);
//! handle.shutdown();
//! # Ok(()) }
//! ```
//!
//! # Error handling
//! Startup failures are a [`SidecarError`] with one printable message (bad database URL,
//! unreachable PostgreSQL, admin port in use; an unreachable Redis is not one: the sidecar starts
//! without it and reconnects). After startup nothing is fatal: storage
//! outages flip [`Health::storage_up`], usage is spooled, and everything is retried.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{mpsc, Arc},
    thread::JoinHandle,
    time::Duration,
};

use shared_state::{
    catalog::ModelAlias, Events, Health, Secret, Settings, SharedCatalog, SharedSnapshot,
    WorkerMailboxes,
};
use tokio::sync::watch;

pub mod access_log;
mod api;
pub mod audit;
pub mod auth;
pub(crate) mod auth_dir;
pub(crate) mod batch;
pub(crate) mod clean;
pub mod cli;
pub mod crypto;
mod csv;
pub mod egress;
pub mod error;
pub mod forecast;
pub mod held;
pub mod import;
mod keys;
pub mod lease;
pub mod models;
pub mod oauth;
pub mod publish;
mod pubsub;
pub mod quota;
mod services;
pub mod settings;
mod sidecar;
pub mod spool;
pub mod storage;
pub mod supervisor;
pub use api::web;

/// Whether this build carries the test hooks (`TaskHealth::inject_panics`,
/// `inject_thread_panic`): the `fault-injection` feature (enabled by the integration tests)
/// AND a build with debug assertions, so that no release build contains them even when
/// feature unification turns the feature on (`cargo build --release` of the workspace);
/// `tests/tests/deploy.rs` keeps every use of the feature behind this.
pub(crate) const TEST_HOOKS: bool = cfg!(all(feature = "fault-injection", debug_assertions));

pub use error::{AdminError, SidecarError, StorageError};
pub use import::ImportSummary;
/// Owned by `shared-state` (the gateway's configuration parses it).
pub use shared_state::config::UsageConfig;
pub use storage::{AccountRow, KeyRow, Storage};

/// The SQLite file name inside the data directory.
pub const DEFAULT_DB_FILE: &str = "codex-gateway.db";
/// Default OAuth token endpoint.
pub const DEFAULT_OAUTH_TOKEN_URL: &str = oauth::DEFAULT_TOKEN_URL;
/// Default Codex upstream base URL.
pub const DEFAULT_UPSTREAM_BASE_URL: &str = "https://chatgpt.com/backend-api/codex";
/// Default storage reload interval.
pub const DEFAULT_RELOAD_INTERVAL: Duration = shared_state::config::DEFAULT_RELOAD_INTERVAL;
/// Default interval between two usage polls of the same account.
pub const DEFAULT_QUOTA_POLL_INTERVAL: Duration = Duration::from_secs(15 * 60);
/// Default `originator` header of sidecar requests upstream (the Codex CLI's).
pub const DEFAULT_ORIGINATOR: &str = "codex_cli_rs";
/// Default `User-Agent` of sidecar requests upstream (consistent with [`DEFAULT_ORIGINATOR`]).
pub const DEFAULT_USER_AGENT: &str =
    "codex_cli_rs/0.171.0 (Debian 12.0.0; x86_64) xterm (codex_cli_rs; 0.171.0)";
/// Default interval between two refreshes of the model catalog.
pub const DEFAULT_CATALOG_REFRESH_INTERVAL: Duration = Duration::from_secs(3600);
/// Default Codex CLI version presented to `/models` (`client_version`, `version`).
pub const DEFAULT_CLIENT_VERSION: &str = models::DEFAULT_CLIENT_VERSION;
/// How long [`SidecarHandle::shutdown`] waits for the thread.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(16);

/// Where storage lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbTarget {
    /// Data directory: the default SQLite file and `secret.key` live here.
    pub data_dir: PathBuf,
    /// `None`: SQLite file `<data_dir>/codex-gateway.db` (WAL; directory and file created if
    /// missing). Otherwise a `postgres://` / `postgresql://` or `sqlite://` URL.
    pub database_url: Option<String>,
}

/// Everything the sidecar needs from configuration.
#[derive(Debug, Clone)]
pub struct SidecarConfig {
    /// Storage location.
    pub db: DbTarget,
    /// Redis URL (refresh leases); `None` uses in-process single-flight only.
    pub redis_url: Option<String>,
    /// Admin API bind address (port 0 allowed; see [`SidecarHandle::admin_addr`]).
    pub admin_listen: SocketAddr,
    /// A static admin API token (`Authorization: Bearer <token>`), accepted besides sessions
    /// and the admin tokens stored in the database.
    pub admin_token: Option<Secret>,
    /// The admin password (`CODEX_GATEWAY_ADMIN_PASSWORD`): stored (by Argon2id hash) at start,
    /// replacing a different one. With no password stored, none configured and no
    /// `admin_token`, one is generated and printed once on stderr.
    pub admin_password: Option<Secret>,
    /// Host names (with or without a port) the admin listener also answers to besides
    /// loopback names and its own IP, e.g. the public name a reverse proxy forwards in `Host`
    /// (`CODEX_GATEWAY_ADMIN_ALLOWED_HOSTS`). Consulted on every listener.
    pub admin_allowed_hosts: Vec<String>,
    /// The data plane's Prometheus `/metrics` URL, scraped by the dashboard and the ops page
    /// (`None`: those pages show no data-plane numbers).
    pub metrics_url: Option<String>,
    /// The data plane's scheduler board (`gateway::scheduler::board`), called by the ops
    /// endpoint over the current snapshot (`None`: no data plane in this process; the ops
    /// board then lists accounts by id without the scheduler's columns).
    pub scheduler_board: Option<shared_state::board::BoardFn>,
    /// OAuth token endpoint.
    pub oauth_token_url: String,
    /// Codex upstream base URL (the usage URL derives from it, see [`quota::usage_url`]).
    pub upstream_base_url: String,
    /// Explicit usage URL, overriding the one derived from `upstream_base_url`.
    pub quota_usage_url: Option<String>,
    /// Poll each active account's usage this often, staggered across accounts; zero
    /// disables polling.
    pub quota_poll_interval: Duration,
    /// The watched auth directory (`auth_dir`, `crate::auth_dir`): `auth.json` files dropped
    /// into it are imported, removed ones disabled (`None`: off).
    pub auth_dir: Option<PathBuf>,
    /// `originator` header of sidecar requests upstream.
    pub originator: String,
    /// `User-Agent` of sidecar requests upstream.
    pub user_agent: String,
    /// Extra PEM root(s) for the sidecar's HTTP client.
    pub upstream_ca: Option<PathBuf>,
    /// Settings published in every snapshot, unless overridden in storage (`settings` table,
    /// edited through the admin API or `cli::settings_set`).
    pub settings: Settings,
    /// Re-read storage this often and republish when anything changed (with Redis, other
    /// instances' changes arrive at once over pub/sub; this is the fallback).
    pub reload_interval: Duration,
    /// Time to live of a Redis refresh lease (renewed every third of it while the refresh
    /// runs).
    pub refresh_lease_ttl: Duration,
    /// Refresh the model catalog from the upstream `/models` this often (the first time
    /// shortly after start); zero disables the background refresh (the admin API's
    /// `POST /api/admin/models/refresh` still works).
    pub catalog_refresh_interval: Duration,
    /// Codex CLI version sent to `/models` (`?client_version=` and the `version` header).
    pub client_version: String,
    /// Model aliases, applied to every catalog the sidecar publishes.
    pub model_aliases: HashMap<String, ModelAlias>,
    /// The clock of the quota forecast's sampling (the system clock; tests inject simulated
    /// time).
    pub forecast_clock: shared_state::forecast::Clock,
    /// Usage records: the durable spool's bound and retention.
    pub usage: UsageConfig,
    /// The access log (`[access_log]`): path, rotation.
    pub access_log: shared_state::config::AccessLogConfig,
}

// === impl SidecarConfig ===

impl SidecarConfig {
    /// A configuration with every optional field at its default.
    pub fn new(db: DbTarget, admin_listen: SocketAddr) -> Self {
        Self {
            db,
            redis_url: None,
            admin_listen,
            admin_token: None,
            admin_password: None,
            admin_allowed_hosts: Vec::new(),
            metrics_url: None,
            scheduler_board: None,
            oauth_token_url: DEFAULT_OAUTH_TOKEN_URL.to_owned(),
            upstream_base_url: DEFAULT_UPSTREAM_BASE_URL.to_owned(),
            quota_usage_url: None,
            quota_poll_interval: DEFAULT_QUOTA_POLL_INTERVAL,
            auth_dir: None,
            originator: DEFAULT_ORIGINATOR.to_owned(),
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            upstream_ca: None,
            settings: Settings::default(),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            refresh_lease_ttl: lease::LEASE_TTL,
            catalog_refresh_interval: DEFAULT_CATALOG_REFRESH_INTERVAL,
            client_version: DEFAULT_CLIENT_VERSION.to_owned(),
            model_aliases: HashMap::new(),
            forecast_clock: shared_state::forecast::Clock::system(),
            usage: UsageConfig::default(),
            access_log: shared_state::config::AccessLogConfig::default(),
        }
    }

    /// The model catalog URL (see [`models::models_url`]).
    pub fn models_url(&self) -> String {
        models::models_url(&self.upstream_base_url, &self.client_version)
    }

    /// Where and as whom the sidecar polls usage.
    pub fn usage_endpoint(&self) -> quota::UsageEndpoint {
        quota::UsageEndpoint {
            url: self
                .quota_usage_url
                .as_deref()
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map_or_else(|| quota::usage_url(&self.upstream_base_url), str::to_owned),
            originator: self.originator.clone(),
            user_agent: self.user_agent.clone(),
            ca_file: self.upstream_ca.clone(),
        }
    }
}

/// The state shared with the workers.
#[derive(Debug)]
pub struct SidecarShared {
    /// The snapshot cell the sidecar publishes into.
    pub snapshot: SharedSnapshot,
    /// Health flags the sidecar maintains.
    pub health: Arc<Health>,
    /// The sidecar end of the worker -> sidecar fact channel.
    pub events: Events,
    /// The sidecar end of the per-worker command channels.
    pub mailboxes: WorkerMailboxes,
    /// The model catalog cell the sidecar publishes into (create it with
    /// `ModelCatalog::embedded(aliases).shared()`; it stays embedded until the first
    /// successful upstream fetch).
    pub catalog: SharedCatalog,
}

/// A running sidecar. Dropping it stops the sidecar without waiting; prefer
/// [`SidecarHandle::shutdown`].
#[derive(Debug)]
pub struct SidecarHandle {
    /// The bound admin API address.
    pub admin_addr: SocketAddr,
    stop: watch::Sender<bool>,
    done: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

// === impl SidecarHandle ===

impl SidecarHandle {
    /// Flushes pending events to storage, stops the admin server and joins the thread
    /// (waiting at most [`SHUTDOWN_WAIT`]).
    pub fn shutdown(mut self) {
        let _ = self.stop.send(true);
        match self.done.recv_timeout(SHUTDOWN_WAIT) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!("sidecar did not stop within {SHUTDOWN_WAIT:?}; leaving it behind");
                self.thread.take();
            }
        }
    }
}

impl Drop for SidecarHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Marks the sidecar thread dead (`/healthz` `sidecar.thread`, `codex_gateway_sidecar_up`)
/// when it ends without having been asked to stop: a panic outside the supervised tasks, or
/// its main future returning early. The data plane keeps serving from the last snapshot.
struct ExitGuard {
    health: Arc<Health>,
    stop: watch::Receiver<bool>,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let tasks = self.health.sidecar_tasks();
        // Before its first beat the sidecar was starting: `spawn` reports that failure.
        let started = tasks.thread(shared_state::now_ms()) != shared_state::SidecarThread::Absent;
        if started && (std::thread::panicking() || !*self.stop.borrow()) {
            tasks.thread_ended();
            tracing::error!(
                panicked = std::thread::panicking(),
                "the sidecar thread ended: token refresh, usage persistence and the admin API have stopped; the data plane serves from its last snapshot until the process is restarted"
            );
        }
    }
}

/// Starts the sidecar thread and blocks until it is ready or failed.
///
/// Ready means: storage open and migrated, Redis reachable (when configured), the first
/// snapshot stored in `shared.snapshot`, and the admin listener bound.
pub fn spawn(cfg: SidecarConfig, shared: SidecarShared) -> Result<SidecarHandle, SidecarError> {
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let exit = ExitGuard {
        health: Arc::clone(&shared.health),
        stop: stop_rx.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("codex-sidecar".into())
        .spawn(move || {
            let _exit = exit;
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(SidecarError::Thread(e)));
                    return;
                }
            };
            rt.block_on(sidecar::run(cfg, shared, ready_tx, stop_rx));
            drop(rt);
            let _ = done_tx.send(());
        })
        .map_err(SidecarError::Thread)?;
    match ready_rx.recv() {
        Ok(Ok(admin_addr)) => Ok(SidecarHandle {
            admin_addr,
            stop: stop_tx,
            done: done_rx,
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(SidecarError::StartupAborted)
        }
    }
}
