//! Client API keys (the keys clients send to the data plane).
//!
//! - `GET /api/admin/keys` -> list of [`KeyView`] with each key's usage over the last 24 hours
//!   and overall (never the key itself);
//! - `POST /api/admin/keys` `{"name"}` -> [`KeyView`] with the plain `key`, shown once (only its
//!   SHA-256 is stored);
//! - `DELETE /api/admin/keys/{id}` revokes it (the data plane refuses it from the next
//!   snapshot on, which this call publishes).
//!
//! Per-key limits are not modelled yet (the keys issue adds them to `api_keys`); the view will
//! carry them when storage does.

use axum::{
    body::Bytes,
    extract::{Path, State},
    routing::{delete, get},
    Json, Router,
};
use serde::{Deserialize, Serialize};

use super::{parse_body, parse_id, ApiError, ApiResult, AppState, Deleted, List};
use crate::storage::{KeyRow, UsageFilter, UsageTotals};

/// Longest key name accepted (characters).
pub const MAX_KEY_NAME: usize = 128;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/keys", get(list_keys).post(create_key))
        .route("/keys/{id}", delete(revoke_key))
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
    /// Usage over the last 24 hours.
    usage_24h: UsageTotals,
    /// Usage since the key was created.
    usage_total: UsageTotals,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl KeyView {
    fn of(k: &KeyRow) -> Self {
        Self {
            id: k.id,
            object: "api_key",
            name: k.name.clone(),
            key_prefix: k.key_prefix.clone(),
            created_at: k.created_at,
            revoked_at: k.revoked_at,
            revoked: k.revoked_at.is_some(),
            usage_24h: UsageTotals::default(),
            usage_total: UsageTotals::default(),
            key: None,
        }
    }
}

async fn list_keys(axum::extract::State(core): State<AppState>) -> ApiResult<List<KeyView>> {
    let keys = core.storage.list_keys().await?;
    let total = core.storage.usage_summary(UsageFilter::default()).await?;
    let day = core
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
            let mut v = KeyView::of(k);
            v.usage_total = find(&total.by_key, k.id);
            v.usage_24h = find(&day.by_key, k.id);
            v
        })
        .collect();
    Ok(Json(List::of(data)))
}

#[derive(Debug, Deserialize)]
struct CreateKey {
    #[serde(default)]
    name: String,
}

async fn create_key(State(core): State<AppState>, body: Bytes) -> ApiResult<KeyView> {
    let req: CreateKey = parse_body(&body)
        .map_err(|_| ApiError::bad_request("the body must be {\"name\": \"...\"}"))?;
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
    let (plain, row) = crate::cli::create_key(core.storage.as_ref(), name).await?;
    core.publisher.reload(core.storage.as_ref(), false).await?;
    let mut out = KeyView::of(&row);
    out.key = Some(plain);
    Ok(Json(out))
}

async fn revoke_key(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult<Deleted> {
    let id = parse_id(&id)?;
    if !core.storage.revoke_key(id).await? {
        return Err(ApiError::not_found(format!("no active key with id {id}")));
    }
    core.publisher.reload(core.storage.as_ref(), false).await?;
    Ok(Json(Deleted {
        id,
        object: "api_key",
        deleted: None,
        revoked: Some(true),
    }))
}
