//! The sidecar's services: the shared handles every task and admin handler receives, and
//! the services built on them. The sidecar ([`crate::sidecar`]) builds [`Core`] and starts
//! the tasks and the admin server; the tasks and the admin API name only this module for
//! it, never the sidecar (so no module loop runs through the assembly).
//!
//! # Key Components
//! - [`Core`]: storage, publisher, health, OAuth client, optional Redis leases, the refresh
//!   book, the admin API's state ([`AdminState`]), the quota, catalog and forecast clients;
//! - [`events`]: the usage and account-effect loops, and [`events::Settle`];
//! - [`refresh`]: single-flight token refresh ([`refresh::RefreshBook`]);
//! - [`quota`]: the quota poller; [`models`]: the model catalog refresher;
//! - [`key_limits`]: the per-key counter reconciliation;
//! - [`admin`]: the admin API's state (credentials, OAuth logins, ops sampler).
//!
//! # Error handling
//! As in [`crate::sidecar`]: nothing here is fatal after startup; storage errors are logged.

use std::{sync::Arc, time::Duration};

use shared_state::Health;

use crate::{
    lease::RedisLeases, oauth::OAuthClient, publish::Publisher, quota::UsageClient,
    storage::Storage,
};

pub(crate) mod admin;
pub(crate) mod events;
pub(crate) mod key_limits;
pub(crate) mod models;
pub(crate) mod quota;
pub(crate) mod refresh;

pub(crate) use admin::AdminState;

/// Refresh an access token this long before it expires.
pub const REFRESH_AHEAD: Duration = Duration::from_secs(15 * 60);
/// Longest an operator's account action waits for the queued data-plane effects.
pub const SETTLE_MAX: Duration = Duration::from_secs(2);
/// How long shutdown waits for the final usage flush.
pub const FLUSH_ON_SHUTDOWN: Duration = Duration::from_secs(5);

/// Shared by the sidecar's tasks and the admin API handlers.
pub(crate) struct Core {
    pub storage: Arc<dyn Storage>,
    pub publisher: Publisher,
    pub health: Arc<Health>,
    pub oauth: OAuthClient,
    /// Redis refresh leases: set at start, or later by a background retry when Redis was
    /// down at start-up (never fatal; refreshes run under the in-process single-flight until
    /// then).
    pub leases: std::sync::OnceLock<RedisLeases>,
    pub refresh: refresh::RefreshBook,
    /// The admin API's state (credentials, OAuth logins, ops sampler).
    pub admin: AdminState,
    /// The usage endpoint client (quota polling).
    pub usage: UsageClient,
    /// The model catalog refresher.
    pub models: models::CatalogRefresher,
    /// HTTP clients per egress proxy (an account's refresh and quota calls use its proxy).
    pub egress: crate::egress::EgressClients,
    /// Extra CA for the upstream (the proxy test action's client).
    pub upstream_ca: Option<std::path::PathBuf>,
    /// The upstream base URL (the origin the proxy test action reaches).
    pub upstream_base_url: String,
    /// The quota burn estimator (`crate::forecast`).
    pub forecast: crate::forecast::Forecaster,
    /// Operator account actions wait here for the data-plane effects queued before them.
    pub settle: events::Settle,
    /// Reset credits per account as last polled (`/wham/usage`'s
    /// `rate_limit_reset_credits.available_count`; in memory, refreshed by every poll).
    pub reset_credits: std::sync::Mutex<std::collections::HashMap<i64, u64>>,
}

// === impl Core ===

impl Core {
    /// Before an operator's account action (enable, disable, reset health): waits until the
    /// account effects the data plane queued before now are persisted, so none of them lands
    /// after the operator's write and undoes it ([`events::Settle`]).
    pub async fn settle_account_events(&self) {
        if !self.settle.wait(SETTLE_MAX).await {
            tracing::debug!("account events not settled in time; applying the operator action");
        }
    }

    /// Republishes if storage changed; logs (does not return) storage errors.
    pub async fn republish(&self) -> Option<u64> {
        match self.publisher.reload(self.storage.as_ref(), false).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "snapshot reload failed");
                None
            }
        }
    }

    /// Starts a single-flight token refresh of `id`; false when no such account is published.
    pub fn request_refresh(self: &Arc<Self>, id: i64) -> bool {
        let snap = self.publisher.current();
        if snap.account(id).is_none() {
            return false;
        }
        refresh::request(self, id, snap.version);
        true
    }

    /// The token endpoint client for account `id`: through its egress proxy when it has one.
    /// An unusable proxy is an error (never direct instead).
    pub fn oauth_for(&self, id: i64) -> Result<OAuthClient, String> {
        match self.egress_of(id) {
            None => Ok(self.oauth.clone()),
            Some(p) => Ok(self.oauth.with_http(self.egress.client(&p)?)),
        }
    }

    /// The usage endpoint client for account `id` (see [`Core::oauth_for`]).
    pub fn usage_for(&self, id: i64, direct: &UsageClient) -> Result<UsageClient, String> {
        match self.egress_of(id) {
            None => Ok(direct.clone()),
            Some(p) => Ok(UsageClient::new(
                self.egress.client(&p)?,
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

    /// Polls `id`'s usage now; false when no such account is published.
    pub async fn poll_quota(self: &Arc<Self>, id: i64) -> bool {
        if self.publisher.current().account(id).is_none() {
            return false;
        }
        quota::poll_one(self, &self.usage, id).await;
        true
    }

    /// Runs a model catalog refresh round now; its outcome as JSON.
    pub async fn refresh_models(self: &Arc<Self>) -> serde_json::Value {
        serde_json::json!(models::refresh(self).await)
    }
}
