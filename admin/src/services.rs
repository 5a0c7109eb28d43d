//! The sidecar's services: each holds only the shared handles its work needs. The sidecar
//! ([`crate::sidecar`]) builds them and hands each task and each admin API router only its
//! own; the tasks and the admin API name only this module for them, never the sidecar (so no
//! module loop runs through the assembly).
//!
//! # Key Components
//! - [`Store`]: storage and the snapshot publisher (with [`Store::republish`]), the pair most
//!   services hold; the keys, usage and settings routers, the audit layer and most tasks take
//!   it alone;
//! - [`Egress`]: the token and usage endpoint clients of an account, through its egress proxy;
//! - [`Refresher`]: single-flight token refresh (storage, publisher, health, Redis leases,
//!   the refresh book, egress);
//! - [`Quota`]: the usage endpoint poll of one account, and the reset credits it reads
//!   ([`ResetCredits`]);
//! - [`Catalog`]: the model catalog refresher;
//! - [`Accounts`]: the account handlers (settle, refresh, quota poll, imports, OAuth logins,
//!   the scheduler board);
//! - [`Ops`]: the dashboard and the live view (the metrics sampler, health, account views);
//! - [`Forecast`]: the quota burn estimator and its view;
//! - [`Proxies`]: the egress proxy handlers (their test action reaches the upstream);
//! - [`Pool`]: `POST /auto-clean/run` and the batch test;
//! - [`Session`]: the admin credentials (login, tokens, the request guard);
//! - [`events`]: the usage and account-effect loops, and [`events::Settle`];
//! - [`refresh`]: single-flight token refresh ([`refresh::RefreshBook`]);
//! - [`quota`]: the quota poller; [`models`]: the model catalog refresher;
//! - [`key_limits`]: the per-key counter reconciliation;
//! - [`admin`]: the admin API's own state (OAuth logins in progress, the ops sampler).
//!
//! # Error handling
//! As in [`crate::sidecar`]: nothing here is fatal after startup; storage errors are logged.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use shared_state::Health;

use crate::{
    auth::AdminAuth, egress::EgressClients, forecast::Forecaster, lease::RedisLeases,
    oauth::OAuthClient, publish::Publisher, quota::UsageClient, storage::Storage,
};

pub(crate) mod admin;
pub(crate) mod events;
pub(crate) mod key_limits;
pub(crate) mod models;
pub(crate) mod quota;
pub(crate) mod refresh;

/// Refresh an access token this long before it expires.
pub const REFRESH_AHEAD: Duration = Duration::from_secs(15 * 60);
/// Longest an operator's account action waits for the queued data-plane effects.
pub const SETTLE_MAX: Duration = Duration::from_secs(2);
/// How long shutdown waits for the final usage flush.
pub const FLUSH_ON_SHUTDOWN: Duration = Duration::from_secs(5);

/// Redis refresh leases: set at start, or later by the health loop's retry when Redis was
/// down at start-up (never fatal; refreshes run under the in-process single-flight until
/// then). Shared by the refresher, the key-limit reconciliation, pub/sub and the health loop.
pub(crate) type Leases = Arc<OnceLock<RedisLeases>>;

/// Storage and the snapshot publisher.
#[derive(Clone)]
pub(crate) struct Store {
    pub storage: Arc<dyn Storage>,
    pub publisher: Arc<Publisher>,
}

// === impl Store ===

impl Store {
    /// Republishes if storage changed and announces the change to the fleet (the reload
    /// after an operator's write): [`Publisher::reload`] over this storage.
    pub async fn reload(&self) -> Result<Option<u64>, crate::error::StorageError> {
        self.publisher.reload(self.storage.as_ref(), false).await
    }

    /// [`Store::reload`] that logs (does not return) storage errors.
    pub async fn republish(&self) -> Option<u64> {
        match self.reload().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "snapshot reload failed");
                None
            }
        }
    }
}

/// Reset credits per account as last polled (`/wham/usage`'s
/// `rate_limit_reset_credits.available_count`; in memory, refreshed by every poll). Written
/// by [`Quota`], read by the account, dashboard and forecast views.
#[derive(Debug, Default)]
pub(crate) struct ResetCredits(Mutex<HashMap<i64, u64>>);

// === impl ResetCredits ===

impl ResetCredits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, u64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set(&self, id: i64, n: u64) {
        self.lock().insert(id, n);
    }

    /// `id`'s credits (`None`: not reported yet).
    pub fn get(&self, id: i64) -> Option<u64> {
        self.lock().get(&id).copied()
    }

    /// Every account's credits.
    pub fn all(&self) -> HashMap<i64, u64> {
        self.lock().clone()
    }
}

/// The token and usage endpoint clients of an account: through its egress proxy when it has
/// one. An unusable proxy is an error (never direct instead).
pub(crate) struct Egress {
    pub publisher: Arc<Publisher>,
    /// HTTP clients per egress proxy.
    pub clients: EgressClients,
    /// The direct token endpoint client.
    pub oauth: OAuthClient,
}

// === impl Egress ===

impl Egress {
    /// The token endpoint client for account `id`.
    pub fn oauth_for(&self, id: i64) -> Result<OAuthClient, String> {
        match self.egress_of(id) {
            None => Ok(self.oauth.clone()),
            Some(p) => Ok(self.oauth.with_http(self.clients.client(&p)?)),
        }
    }

    /// The usage endpoint client for account `id` (`direct` without a proxy).
    pub fn usage_for(&self, id: i64, direct: &UsageClient) -> Result<UsageClient, String> {
        match self.egress_of(id) {
            None => Ok(direct.clone()),
            Some(p) => Ok(UsageClient::new(
                self.clients.client(&p)?,
                direct.endpoint().clone(),
            )),
        }
    }

    fn egress_of(&self, id: i64) -> Option<Arc<shared_state::ProxyEntry>> {
        self.publisher
            .current()
            .account(id)
            .and_then(|a| a.egress.clone())
    }
}

/// Single-flight token refresh ([`refresh`]).
pub(crate) struct Refresher {
    pub store: Store,
    pub health: Arc<Health>,
    pub leases: Leases,
    pub book: refresh::RefreshBook,
    pub egress: Arc<Egress>,
}

// === impl Refresher ===

impl Refresher {
    /// Starts a single-flight token refresh of `id`; false when no such account is published.
    pub fn request_refresh(self: &Arc<Self>, id: i64) -> bool {
        let snap = self.store.publisher.current();
        if snap.account(id).is_none() {
            return false;
        }
        refresh::request(self, id, snap.version);
        true
    }
}

/// The usage endpoint poll of one account ([`quota`]).
pub(crate) struct Quota {
    pub store: Store,
    pub egress: Arc<Egress>,
    /// A poll that finds the token rejected asks for a refresh.
    pub refresh: Arc<Refresher>,
    /// The direct usage endpoint client.
    pub usage: UsageClient,
    pub credits: Arc<ResetCredits>,
}

// === impl Quota ===

impl Quota {
    /// Polls `id`'s usage now; false when no such account is published.
    pub async fn poll(self: &Arc<Self>, id: i64) -> bool {
        if self.store.publisher.current().account(id).is_none() {
            return false;
        }
        quota::poll_one(self, &self.usage, id).await;
        true
    }
}

/// The model catalog refresher ([`models`]).
pub(crate) struct Catalog {
    pub publisher: Arc<Publisher>,
    pub egress: Arc<Egress>,
    /// A fetch that finds the token rejected asks for a refresh.
    pub refresh: Arc<Refresher>,
    pub refresher: models::CatalogRefresher,
}

// === impl Catalog ===

impl Catalog {
    /// Runs a model catalog refresh round now; its outcome as JSON.
    pub async fn refresh_now(self: &Arc<Self>) -> serde_json::Value {
        serde_json::json!(models::refresh(self).await)
    }
}

/// The account handlers of the admin API.
pub(crate) struct Accounts {
    pub store: Store,
    /// Operator account actions wait here for the data-plane effects queued before them.
    pub settle: Arc<events::Settle>,
    pub refresh: Arc<Refresher>,
    pub quota: Arc<Quota>,
    pub credits: Arc<ResetCredits>,
    /// The direct token endpoint client (imports of refresh tokens, the OAuth login).
    pub oauth: OAuthClient,
    /// OAuth logins started and not finished yet.
    pub logins: admin::PendingLogins,
    /// The data plane's scheduler board, when one runs in this process.
    pub board: Option<shared_state::board::BoardFn>,
}

// === impl Accounts ===

impl Accounts {
    /// Before an operator's account action (enable, disable, reset health): waits until the
    /// account effects the data plane queued before now are persisted, so none of them lands
    /// after the operator's write and undoes it ([`events::Settle`]).
    pub async fn settle_account_events(&self) {
        if !self.settle.wait(SETTLE_MAX).await {
            tracing::debug!("account events not settled in time; applying the operator action");
        }
    }
}

/// The dashboard and the live per-worker view.
pub(crate) struct Ops {
    /// The account views of the board.
    pub accounts: Arc<Accounts>,
    pub health: Arc<Health>,
    /// Samples of the data plane's metrics (rates) and of the pool (quota burn).
    pub sampler: admin::OpsSampler,
}

/// The quota burn estimator: sampled by its task, shown by the forecast handler.
pub(crate) struct Forecast {
    pub publisher: Arc<Publisher>,
    pub forecaster: Forecaster,
    pub credits: Arc<ResetCredits>,
}

/// The egress proxy handlers.
pub(crate) struct Proxies {
    pub store: Store,
    /// The token endpoint (an origin the test action reaches).
    pub oauth: OAuthClient,
    /// Extra CA for the upstream (the test action's client).
    pub upstream_ca: Option<PathBuf>,
    /// The upstream base URL (the origin the test action reaches).
    pub upstream_base_url: String,
}

/// `POST /auto-clean/run` (the auto-clean task takes the [`Store`] alone) and the batch test.
pub(crate) struct Pool {
    pub store: Store,
    pub egress: Arc<Egress>,
    /// The direct usage endpoint client (the batch test's HTTP client).
    pub usage: UsageClient,
    /// The upstream base URL (the batch test sends there).
    pub upstream_base_url: String,
}

/// The admin credentials: login, admin API tokens and the request guard.
pub(crate) struct Session {
    pub storage: Arc<dyn Storage>,
    /// Credentials and login rate limiting.
    pub auth: AdminAuth,
}
