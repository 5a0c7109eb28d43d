//! Client keys as both the admin API ([`crate::api`]) and the CLI ([`crate::cli`]) handle them:
//! key creation and the view of a key's limits. Below both, so neither names the other for
//! them.
//!
//! - [`create_key`]: generates a client key, stores its hash and returns the plain key once
//!   (also `admin::cli::create_key`);
//! - [`LimitsView`]: a key's limits as the API, the CLI and the audit log show them.
//!
//! # Error handling
//! Storage failures are returned as [`StorageError`].

use serde::Serialize;
use shared_state::{
    keys::{hash_key_hex, KeyLimits},
    snapshot::ServiceTierPolicy,
};

use crate::{
    crypto::{generate_client_key, key_display_prefix},
    error::StorageError,
    storage::{KeyRow, Storage},
};

/// A key's limits as the API shows them (`null`: no limit).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LimitsView {
    rpm: Option<u32>,
    max_concurrency: Option<u32>,
    tokens_per_day: Option<u64>,
    tokens_per_month: Option<u64>,
    cost_per_day_usd: Option<f64>,
    cost_per_month_usd: Option<f64>,
    allowed_models: Vec<String>,
    account_group: Option<String>,
    /// `pass`, `strip`, `refuse`; `null`: the global setting.
    service_tier: Option<&'static str>,
    /// Unix seconds.
    expires_at: Option<u64>,
    enabled: bool,
}

impl LimitsView {
    /// The view of `l`.
    pub(crate) fn of(l: &KeyLimits) -> Self {
        let usd = |m: Option<u64>| m.map(|m| m as f64 / 1e6);
        Self {
            rpm: l.rpm,
            max_concurrency: l.max_concurrency,
            tokens_per_day: l.tokens_per_day,
            tokens_per_month: l.tokens_per_month,
            cost_per_day_usd: usd(l.cost_per_day_micros),
            cost_per_month_usd: usd(l.cost_per_month_micros),
            allowed_models: l.allowed_models.clone(),
            account_group: l.account_group.clone(),
            service_tier: l.service_tier.map(ServiceTierPolicy::as_str),
            expires_at: l.expires_at_ms.map(|e| e / 1000),
            enabled: l.enabled,
        }
    }
}

/// Generates, stores (by hash) and returns a new client key with its row.
pub async fn create_key(
    storage: &dyn Storage,
    name: &str,
) -> Result<(String, KeyRow), StorageError> {
    let plain = generate_client_key();
    let row = storage
        .create_key(name, &hash_key_hex(&plain), &key_display_prefix(&plain))
        .await?;
    Ok((plain, row))
}
