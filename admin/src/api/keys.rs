//! Client API keys (the keys clients send to the data plane) and their limits.
//!
//! - `GET /api/admin/keys` -> list of [`KeyView`] with each key's limits, its usage over the
//!   last 24 hours and overall (storage), and today's / this month's usage against its
//!   budgets (the data plane's live counters; never the key itself);
//! - `POST /api/admin/keys` `{"name", ...limits}` -> [`KeyView`] with the plain `key`, shown
//!   once (only its SHA-256 is stored);
//! - `PATCH /api/admin/keys/{id}` `{...limits}`: each field present replaces that limit
//!   (`null` removes it); absent fields stay;
//! - `DELETE /api/admin/keys/{id}` revokes it (the data plane refuses it from the next
//!   snapshot on, which this call publishes).
//!
//! Limits ([`LimitsPatch`]): `rpm`, `max_concurrency`, `tokens_per_day`, `tokens_per_month`,
//! `cost_per_day_usd`, `cost_per_month_usd`, `allowed_models` (list of model slugs, a trailing
//! `*` matches a prefix; empty: every model), `account_group` (the group of accounts the key
//! uses; `null`: the shared pool), `service_tier` (`pass`, `strip` or `refuse`: what happens
//! to the key's requests asking for the priority tier; `null`: the global `service_tier`
//! setting applies), `expires_at` (Unix seconds), `enabled`.

use axum::{
    body::Bytes,
    extract::{Path, State},
    routing::{delete, get},
    Json, Router,
};
use serde::{Deserialize, Serialize};
use shared_state::{
    keys::{self as sk, KeyLimits},
    snapshot::ServiceTierPolicy,
};

use super::{parse_body, parse_id, ApiError, ApiResult, Deleted, List};
use crate::{
    keys::LimitsView,
    services::Store,
    storage::{KeyRow, UsageFilter, UsageTotals},
};

/// Longest key name accepted (characters).
pub const MAX_KEY_NAME: usize = 128;
/// Longest account group name (characters).
pub const MAX_GROUP: usize = 64;
/// Most entries in a key's model allow-list.
pub const MAX_MODELS: usize = 64;

pub(super) fn routes(store: Store) -> Router {
    Router::new()
        .route("/keys", get(list_keys).post(create_key))
        .route("/keys/{id}", delete(revoke_key).patch(patch_key))
        .with_state(store)
}

/// Usage of one budget period as the data plane counts it (fleet-wide with Redis).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct PeriodView {
    requests: u64,
    tokens: u64,
    cost_usd: f64,
}

/// A client key as listed; `key` only in the answer that created it.
// No Debug: it carries a secret.
#[derive(Serialize)]
pub(crate) struct KeyView {
    id: i64,
    object: &'static str,
    name: String,
    key_prefix: String,
    created_at: i64,
    revoked_at: Option<i64>,
    revoked: bool,
    /// Last use, Unix ms.
    last_used_at: Option<i64>,
    /// Enabled, not revoked and not expired.
    usable: bool,
    limits: LimitsView,
    /// Today (UTC), against `tokens_per_day` / `cost_per_day_usd`.
    today: PeriodView,
    /// This month (UTC), against the monthly budgets.
    month: PeriodView,
    /// Requests in flight on this instance.
    in_flight: u32,
    /// Usage over the last 24 hours.
    usage_24h: UsageTotals,
    /// Usage since the key was created.
    usage_total: UsageTotals,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl KeyView {
    fn of(store: &Store, k: &KeyRow) -> Self {
        let now = shared_state::now_ms();
        let (mut today, mut month, mut in_flight) = Default::default();
        let snap = store.publisher.current();
        if let Some(live) = snap.keys.values().find(|c| c.id == k.id).map(|c| &c.live) {
            let period = |c: &sk::PeriodCounters, p| PeriodView {
                requests: c.requests.value(p),
                tokens: c.tokens.value(p),
                cost_usd: c.cost_micros.value(p) as f64 / 1e6,
            };
            today = period(&live.day, sk::day_of(now));
            month = period(&live.month, sk::month_of(now));
            in_flight = live.in_flight();
        }
        Self {
            id: k.id,
            object: "api_key",
            name: k.name.clone(),
            key_prefix: k.key_prefix.clone(),
            created_at: k.created_at,
            revoked_at: k.revoked_at,
            revoked: k.revoked_at.is_some(),
            last_used_at: k.last_used_at,
            usable: k.revoked_at.is_none() && k.limits.usable_at(now),
            limits: LimitsView::of(&k.limits),
            today,
            month,
            in_flight,
            usage_24h: UsageTotals::default(),
            usage_total: UsageTotals::default(),
            key: None,
        }
    }
}

async fn list_keys(State(store): State<Store>) -> ApiResult<List<KeyView>> {
    let keys = store.storage.list_keys().await?;
    let total = store.storage.usage_summary(UsageFilter::default()).await?;
    let day = store
        .storage
        .usage_summary(UsageFilter {
            since_ms: Some(crate::storage::now_ms_i64() - 86_400_000),
            ..UsageFilter::default()
        })
        .await?;
    let find = |v: &[(i64, UsageTotals)], id: i64| {
        v.iter()
            .find(|(k, _)| *k == id)
            .map(|(_, t)| *t)
            .unwrap_or_default()
    };
    let data = keys
        .iter()
        .map(|k| {
            let mut v = KeyView::of(&store, k);
            v.usage_total = find(&total.by_key, k.id);
            v.usage_24h = find(&day.by_key, k.id);
            v
        })
        .collect();
    Ok(Json(List::of(data)))
}

/// A present JSON field, `null` included (`Some(None)`); an absent one stays `None`.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Changes to a key's limits: a present field replaces that limit (`null` removes it).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsPatch {
    /// Requests per minute.
    #[serde(default, deserialize_with = "present")]
    pub rpm: Option<Option<u32>>,
    /// Requests in flight at once.
    #[serde(default, deserialize_with = "present")]
    pub max_concurrency: Option<Option<u32>>,
    /// Tokens per UTC day.
    #[serde(default, deserialize_with = "present")]
    pub tokens_per_day: Option<Option<u64>>,
    /// Tokens per UTC month.
    #[serde(default, deserialize_with = "present")]
    pub tokens_per_month: Option<Option<u64>>,
    /// USD per UTC day.
    #[serde(default, deserialize_with = "present")]
    pub cost_per_day_usd: Option<Option<f64>>,
    /// USD per UTC month.
    #[serde(default, deserialize_with = "present")]
    pub cost_per_month_usd: Option<Option<f64>>,
    /// Allowed model slugs (`null` or `[]`: every model).
    #[serde(default, deserialize_with = "present")]
    pub allowed_models: Option<Option<Vec<String>>>,
    /// Account group (`null` or `""`: the shared pool).
    #[serde(default, deserialize_with = "present")]
    pub account_group: Option<Option<String>>,
    /// Service tier policy: `pass`, `strip`, `refuse` (`null` or `""`: the global setting).
    #[serde(default, deserialize_with = "present")]
    pub service_tier: Option<Option<String>>,
    /// Expiry, Unix seconds (`null`: never).
    #[serde(default, deserialize_with = "present")]
    pub expires_at: Option<Option<u64>>,
    /// Whether the key is enabled.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// A group name: `None` for the shared pool, else 1..=64 of `[A-Za-z0-9_.-]`.
pub(crate) fn group_name(g: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(g) = g.map(str::trim).filter(|g| !g.is_empty()) else {
        return Ok(None);
    };
    if g.chars().count() > MAX_GROUP
        || !g
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(ApiError::bad_request(format!(
            "\"account_group\" must be at most {MAX_GROUP} of A-Z a-z 0-9 _ - ."
        ))
        .with_param("account_group"));
    }
    Ok(Some(g.to_owned()))
}

impl LimitsPatch {
    /// Applies the patch to `l`, validating every field.
    pub fn apply(&self, l: &mut KeyLimits) -> Result<(), ApiError> {
        let positive = |v: Option<u32>, name: &str| match v {
            Some(0) => Err(ApiError::bad_request(format!(
                "\"{name}\" must be >= 1 (null removes the limit)"
            ))
            .with_param(name)),
            v => Ok(v),
        };
        if let Some(v) = self.rpm {
            l.rpm = positive(v, "rpm")?;
        }
        if let Some(v) = self.max_concurrency {
            l.max_concurrency = positive(v, "max_concurrency")?;
        }
        if let Some(v) = self.tokens_per_day {
            l.tokens_per_day = v;
        }
        if let Some(v) = self.tokens_per_month {
            l.tokens_per_month = v;
        }
        let micros = |v: Option<f64>, name: &str| -> Result<Option<u64>, ApiError> {
            match v {
                None => Ok(None),
                Some(u) if u.is_finite() && (0.0..=1e9).contains(&u) => {
                    Ok(Some((u * 1e6).round() as u64))
                }
                Some(_) => Err(ApiError::bad_request(format!(
                    "\"{name}\" must be a number of USD between 0 and 1e9"
                ))
                .with_param(name)),
            }
        };
        if let Some(v) = self.cost_per_day_usd {
            l.cost_per_day_micros = micros(v, "cost_per_day_usd")?;
        }
        if let Some(v) = self.cost_per_month_usd {
            l.cost_per_month_micros = micros(v, "cost_per_month_usd")?;
        }
        if let Some(v) = &self.allowed_models {
            let models: Vec<String> = v
                .iter()
                .flatten()
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect();
            if models.len() > MAX_MODELS
                || models
                    .iter()
                    .any(|m| m.chars().count() > 128 || m.chars().any(char::is_control))
            {
                return Err(ApiError::bad_request(format!(
                    "\"allowed_models\" takes at most {MAX_MODELS} model names of at most 128 characters"
                ))
                .with_param("allowed_models"));
            }
            l.allowed_models = models;
        }
        if let Some(g) = &self.account_group {
            l.account_group = group_name(g.as_deref())?;
        }
        if let Some(t) = &self.service_tier {
            l.service_tier = match t.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
                None => None,
                Some(t) => Some(t.parse::<ServiceTierPolicy>().map_err(|e| {
                    ApiError::bad_request(format!("\"service_tier\": {e}"))
                        .with_param("service_tier")
                })?),
            };
        }
        if let Some(e) = self.expires_at {
            l.expires_at_ms = e.map(|s| s.saturating_mul(1000));
        }
        if let Some(e) = self.enabled {
            l.enabled = e;
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
struct CreateKey {
    #[serde(default)]
    name: String,
    #[serde(flatten)]
    limits: serde_json::Map<String, serde_json::Value>,
}

fn parse_limits(v: serde_json::Value) -> Result<LimitsPatch, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("invalid limits: {e}")))
}

async fn create_key(State(store): State<Store>, body: Bytes) -> ApiResult<KeyView> {
    let req: CreateKey = parse_body(&body)
        .map_err(|_| ApiError::bad_request("the body must be {\"name\": \"...\", ...limits}"))?;
    let name = req.name.trim();
    if name.is_empty() {
        return Err(ApiError::bad_request("\"name\" is required").with_param("name"));
    }
    if name.chars().count() > MAX_KEY_NAME || name.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "\"name\" must be at most {MAX_KEY_NAME} characters, without control characters"
        ))
        .with_param("name"));
    }
    let mut limits = KeyLimits::unlimited();
    parse_limits(serde_json::Value::Object(req.limits))?.apply(&mut limits)?;
    let (plain, mut row) = crate::keys::create_key(store.storage.as_ref(), name).await?;
    if limits != KeyLimits::unlimited() {
        store.storage.update_key_limits(row.id, &limits).await?;
        row.limits = limits;
    }
    store.reload().await?;
    let mut out = KeyView::of(&store, &row);
    out.key = Some(plain);
    Ok(Json(out))
}

async fn patch_key(
    State(store): State<Store>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<KeyView> {
    let id = parse_id(&id)?;
    let patch = parse_limits(parse_body::<serde_json::Value>(&body)?)?;
    let Some(mut row) = store
        .storage
        .list_keys()
        .await?
        .into_iter()
        .find(|k| k.id == id && k.revoked_at.is_none())
    else {
        return Err(ApiError::not_found(format!("no active key with id {id}")));
    };
    patch.apply(&mut row.limits)?;
    if !store.storage.update_key_limits(id, &row.limits).await? {
        return Err(ApiError::not_found(format!("no active key with id {id}")));
    }
    store.reload().await?;
    Ok(Json(KeyView::of(&store, &row)))
}

async fn revoke_key(State(store): State<Store>, Path(id): Path<String>) -> ApiResult<Deleted> {
    let id = parse_id(&id)?;
    if !store.storage.revoke_key(id).await? {
        return Err(ApiError::not_found(format!("no active key with id {id}")));
    }
    store.reload().await?;
    Ok(Json(Deleted {
        id,
        object: "api_key",
        deleted: None,
        revoked: Some(true),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn patch_sets_clears_and_validates() {
        let mut l = KeyLimits::unlimited();
        let p: LimitsPatch = serde_json::from_str(
            r#"{"rpm":5,"cost_per_day_usd":1.5,"allowed_models":["gpt-5"],"account_group":"team-a","expires_at":100}"#,
        )
        .unwrap();
        p.apply(&mut l).unwrap();
        assert_eq!(l.rpm, Some(5));
        assert_eq!(l.cost_per_day_micros, Some(1_500_000));
        assert_eq!(l.allowed_models, vec!["gpt-5".to_owned()]);
        assert_eq!(l.account_group.as_deref(), Some("team-a"));
        assert_eq!(l.expires_at_ms, Some(100_000));
        let p: LimitsPatch = serde_json::from_str(r#"{"rpm":null,"account_group":""}"#).unwrap();
        p.apply(&mut l).unwrap();
        assert_eq!(l.rpm, None);
        assert_eq!(l.account_group, None);
        assert_eq!(l.cost_per_day_micros, Some(1_500_000), "absent fields stay");
        let p: LimitsPatch = serde_json::from_str(r#"{"service_tier":" Refuse "}"#).unwrap();
        p.apply(&mut l).unwrap();
        assert_eq!(l.service_tier, Some(ServiceTierPolicy::Refuse));
        assert_eq!(
            serde_json::to_value(LimitsView::of(&l)).unwrap()["service_tier"],
            "refuse"
        );
        let p: LimitsPatch = serde_json::from_str(r#"{"rpm":3}"#).unwrap();
        p.apply(&mut l).unwrap();
        assert_eq!(
            l.service_tier,
            Some(ServiceTierPolicy::Refuse),
            "absent stays"
        );
        let p: LimitsPatch = serde_json::from_str(r#"{"service_tier":null}"#).unwrap();
        p.apply(&mut l).unwrap();
        assert_eq!(l.service_tier, None, "null: the global setting again");
        assert!(serde_json::to_value(LimitsView::of(&l)).unwrap()["service_tier"].is_null());
        for bad in [
            r#"{"rpm":0}"#,
            r#"{"cost_per_day_usd":-1}"#,
            r#"{"account_group":"a b"}"#,
            r#"{"service_tier":"fast"}"#,
        ] {
            let p: LimitsPatch = serde_json::from_str(bad).unwrap();
            assert!(p.apply(&mut l).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<LimitsPatch>(r#"{"rpx":1}"#).is_err());
    }
}
