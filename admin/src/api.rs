//! The Axum admin API on the admin address.
//!
//! # Key Components
//! - [`router`]: `GET /healthz` (200 `{"status":"ok"}`, 503 when storage is down) and, behind
//!   the bearer-token guard when an admin token is configured, `/api/admin/*`:
//!   - `GET /api/admin/accounts` -> `{"object":"list","data":[AccountView]}` (no tokens);
//!   - `POST /api/admin/accounts/{id}/enable|disable`, `PATCH /api/admin/accounts/{id}`
//!     (`{"weight","max_concurrency"}`), `DELETE /api/admin/accounts/{id}`;
//!   - `POST /api/admin/accounts/{id}/refresh` (start a single-flight token refresh, 202),
//!     `POST /api/admin/accounts/{id}/quota` (poll `/wham/usage` now, answer the account);
//!   - `GET /api/admin/keys`, `POST /api/admin/keys` `{"name"}` -> the plain key once,
//!     `DELETE /api/admin/keys/{id}` (revoke);
//!   - `GET /api/admin/settings` -> the effective settings (flat), `defaults` and the list of
//!     `overridden` keys; `PUT /api/admin/settings` with any subset of the keys (`null`
//!     resets a key to its configured default), validated as a whole;
//!   - `GET /api/admin/usage?since_ms=&until_ms=&key_id=&account_id=` -> `totals`,
//!     `by_key` and `by_account` (requests, input/cached/output/reasoning tokens, errors);
//!   - `GET /api/admin/models` -> the published model catalog: `source` (`embedded` |
//!     `upstream`), sorted `slugs`, `aliases` (`{name: {target, effort}}`), per-`plans`
//!     fetch status (`account_id`, `etag`, `models`, `checked_at`, `fetched_at`, `error`),
//!     `last_attempt_at`, `last_published_at`, `refresh_interval_s`, `url`;
//!     `POST /api/admin/models/refresh` runs a refresh round now and answers the same view
//!     plus `outcome` (`plans`, `fetched`, `not_modified`, `failed`, `published`).
//!
//!   Every mutation republishes the snapshot before answering.
//! - [`ApiError`]: the one place that turns a failure into an OpenAI-shaped
//!   `{"error":{"message","type","code"}}` response.
//!
//! # Error handling
//! 401 `invalid_api_key` for a missing/wrong admin token, 404 `not_found`, 400
//! `invalid_request_error`, 503 `storage_unavailable` when the database is down, 500 otherwise.

use std::{collections::HashMap, sync::Arc};

use axum::{
    body::Bytes,
    extract::{Path, Query, Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shared_state::{AccountEffect, AccountStatus};

use crate::{
    error::StorageError,
    settings::SettingError,
    sidecar::Core,
    storage::{AccountRow, UsageFilter, UsageTotals},
};

type AppState = Arc<Core>;

/// Builds the admin router.
pub(crate) fn router(core: Arc<Core>) -> Router {
    let admin = Router::new()
        .route("/accounts", get(list_accounts))
        .route(
            "/accounts/{id}",
            axum::routing::delete(delete_account).patch(patch_account),
        )
        .route("/accounts/{id}/enable", post(enable_account))
        .route("/accounts/{id}/disable", post(disable_account))
        .route("/accounts/{id}/refresh", post(refresh_account))
        .route("/accounts/{id}/quota", post(poll_account_quota))
        .route("/keys", get(list_keys).post(create_key))
        .route("/keys/{id}", axum::routing::delete(revoke_key))
        .route("/settings", get(get_settings).put(put_settings))
        .route("/usage", get(get_usage))
        .route("/models", get(get_models))
        .route("/models/refresh", post(refresh_models))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&core),
            require_admin,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .nest("/api/admin", admin)
        .with_state(core)
}

/// An admin API failure.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
}

// === impl ApiError ===

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
        }
    }

    fn not_found(what: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            what,
        )
    }

    fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            msg,
        )
    }
}

impl From<SettingError> for ApiError {
    fn from(e: SettingError) -> Self {
        Self::bad_request(e.to_string())
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        if e.is_unavailable() {
            Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "storage_unavailable",
                format!("storage is unavailable: {e}"),
            )
        } else {
            tracing::error!(error = %e, "admin API storage error");
            Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                e.to_string(),
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

async fn require_admin(State(core): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &core.admin_token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        // Compare digests: constant time with respect to the token's content.
        let ok = given.is_some_and(|g| {
            Sha256::digest(g.as_bytes()).as_slice()
                == Sha256::digest(token.expose().as_bytes()).as_slice()
        });
        if !ok {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                "missing or invalid admin token (Authorization: Bearer <token>)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn healthz(State(core): State<AppState>) -> Response {
    if core.health.storage_up() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "storage": "down"})),
        )
            .into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("unknown admin endpoint")
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .map_err(|_| ApiError::bad_request(format!("invalid id {raw:?}")))
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// One account as the admin API shows it.
async fn account_view(core: &Core, r: &AccountRow) -> Value {
    let live = core.publisher.live(r.id).await;
    let (in_flight, cooldown_until, override_status, served, failures) = match &live {
        Some(l) => {
            let (s, f) = l.counters();
            (
                l.in_flight(),
                l.cooldown_until_ms()
                    .max(u64::try_from(r.cooldown_until_ms).unwrap_or(0)),
                l.status_override(),
                s,
                f,
            )
        }
        None => (
            0,
            u64::try_from(r.cooldown_until_ms).unwrap_or(0),
            None,
            0,
            0,
        ),
    };
    let now = shared_state::now_ms();
    let pct = |live_pct: Option<f64>, stored: Option<f64>| match (live_pct, stored) {
        (Some(l), _) if l > 0.0 => Some(l),
        (_, s) => s,
    };
    json!({
        "id": r.id,
        "object": "account",
        "chatgpt_account_id": r.chatgpt_account_id,
        "user_id": if r.user_id.is_empty() { None } else { Some(&r.user_id) },
        "email": r.email,
        "label": r.label(),
        "plan": r.plan_type,
        "status": r.status.as_str(),
        "effective_status": override_status.unwrap_or(r.status).as_str(),
        "weight": r.weight,
        "max_concurrency": r.max_concurrency,
        "in_flight": in_flight,
        "served": served,
        "failures": failures,
        "cooldown_until": if cooldown_until > now { Some(cooldown_until) } else { None },
        "cooldown_reason": if cooldown_until > now { r.cooldown_reason.clone() } else { None },
        "primary_used_pct": pct(live.as_ref().map(|l| l.primary_used_pct()), r.primary_used_pct),
        "primary_reset_at": r.primary_reset_at,
        "secondary_used_pct": pct(live.as_ref().map(|l| l.secondary_used_pct()), r.secondary_used_pct),
        "secondary_reset_at": r.secondary_reset_at,
        "quota_updated_at": r.quota_updated_at,
        "access_expires_at": r.access_expires_at,
        "last_refresh_at": r.last_refresh_at,
        "refresh_in_flight": core.refresh.in_flight(r.id),
        "created_at": r.created_at,
        "updated_at": r.updated_at,
    })
}

async fn find_account(core: &Core, id: i64) -> Result<AccountRow, ApiError> {
    core.storage
        .list_accounts()
        .await?
        .into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no account with id {id}")))
}

async fn list_accounts(State(core): State<AppState>) -> ApiResult {
    let rows = core.storage.list_accounts().await?;
    let mut data = Vec::with_capacity(rows.len());
    for r in &rows {
        data.push(account_view(&core, r).await);
    }
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

async fn set_status(core: &Core, id: i64, status: AccountStatus) -> ApiResult {
    if !core.storage.set_status(id, status).await? {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    if status == AccountStatus::Active {
        core.storage.set_cooldown(id, 0, None).await?;
    }
    if let Some(live) = core.publisher.live(id).await {
        // Re-enabling starts afresh (no cooldown); disabling keeps the cooldown it had.
        let cooldown_until_ms = if status == AccountStatus::Active {
            0
        } else {
            live.cooldown_until_ms()
        };
        live.apply(&AccountEffect::OperatorStatus {
            status,
            cooldown_until_ms,
        });
    }
    // Leaving `active` evicts the account's pooled sockets: the publisher does it.
    core.publisher.reload(core.storage.as_ref(), false).await?;
    let row = find_account(core, id).await?;
    Ok(Json(account_view(core, &row).await).into_response())
}

async fn enable_account(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult {
    set_status(&core, parse_id(&id)?, AccountStatus::Active).await
}

async fn disable_account(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult {
    set_status(&core, parse_id(&id)?, AccountStatus::Disabled).await
}

async fn patch_account(
    State(core): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let id = parse_id(&id)?;
    let v = parse_body(&body)?;
    let num = |k: &str| -> Result<Option<u32>, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad_request(format!("{k} must be a non-negative integer"))
                }),
        }
    };
    let weight = num("weight")?;
    let max_concurrency = num("max_concurrency")?;
    if weight == Some(0) {
        return Err(ApiError::bad_request("weight must be >= 1"));
    }
    if weight.is_none() && max_concurrency.is_none() {
        return Err(ApiError::bad_request(
            "nothing to change: give weight and/or max_concurrency",
        ));
    }
    if !core.storage.set_limits(id, weight, max_concurrency).await? {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    core.publisher.reload(core.storage.as_ref(), false).await?;
    let row = find_account(&core, id).await?;
    Ok(Json(account_view(&core, &row).await).into_response())
}

async fn delete_account(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id = parse_id(&id)?;
    if !core.storage.delete_account(id).await? {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    // The publisher evicts the deleted account's pooled sockets.
    core.publisher.reload(core.storage.as_ref(), false).await?;
    Ok(Json(json!({"id": id, "object": "account", "deleted": true})).into_response())
}

fn key_view(k: &crate::storage::KeyRow) -> Value {
    json!({
        "id": k.id,
        "object": "api_key",
        "name": k.name,
        "key_prefix": k.key_prefix,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
        "revoked": k.revoked_at.is_some(),
    })
}

async fn list_keys(State(core): State<AppState>) -> ApiResult {
    let keys = core.storage.list_keys().await?;
    let data: Vec<Value> = keys.iter().map(key_view).collect();
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

async fn create_key(State(core): State<AppState>, body: Bytes) -> ApiResult {
    let v = parse_body(&body)?;
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .map(str::trim)
        .unwrap_or("");
    if name.is_empty() {
        return Err(ApiError::bad_request("\"name\" is required"));
    }
    let (plain, row) = crate::cli::create_key(core.storage.as_ref(), name).await?;
    core.publisher.reload(core.storage.as_ref(), false).await?;
    let mut out = key_view(&row);
    out["key"] = Value::String(plain);
    Ok(Json(out).into_response())
}

async fn revoke_key(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id = parse_id(&id)?;
    if !core.storage.revoke_key(id).await? {
        return Err(ApiError::not_found(format!("no active key with id {id}")));
    }
    core.publisher.reload(core.storage.as_ref(), false).await?;
    Ok(Json(json!({"id": id, "object": "api_key", "revoked": true})).into_response())
}

async fn refresh_account(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id = parse_id(&id)?;
    let snap = core.publisher.current();
    if snap.account(id).is_none() {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    crate::sidecar::refresh::request(&core, id, snap.version);
    Ok((
        StatusCode::ACCEPTED,
        Json(
            json!({"id": id, "object": "account", "refresh_in_flight": core.refresh.in_flight(id)}),
        ),
    )
        .into_response())
}

async fn poll_account_quota(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id = parse_id(&id)?;
    if core.publisher.current().account(id).is_none() {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    crate::sidecar::quota::poll_one(&core, &core.usage, id).await;
    let row = find_account(&core, id).await?;
    Ok(Json(account_view(&core, &row).await).into_response())
}

/// Keys of the settings view that are not settings (so a GET body can be PUT back).
const SETTINGS_META: &[&str] = &["object", "defaults", "overridden"];

async fn settings_view(core: &Core) -> Result<Value, ApiError> {
    let stored = core.storage.load_settings().await?;
    let defaults = core.publisher.defaults();
    let (effective, _) = crate::settings::effective(defaults, &stored);
    let mut out = crate::settings::to_json(&effective);
    let overridden: Vec<&str> = crate::settings::KEYS
        .iter()
        .copied()
        .filter(|k| stored.iter().any(|(s, _)| s == k))
        .collect();
    out.insert("object".into(), json!("settings"));
    out.insert(
        "defaults".into(),
        Value::Object(crate::settings::to_json(defaults)),
    );
    out.insert("overridden".into(), json!(overridden));
    Ok(Value::Object(out))
}

async fn get_settings(State(core): State<AppState>) -> ApiResult {
    Ok(Json(settings_view(&core).await?).into_response())
}

async fn put_settings(State(core): State<AppState>, body: Bytes) -> ApiResult {
    let v = parse_body(&body)?;
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad_request(
            "the body must be a JSON object of settings",
        ));
    };
    let mut changes = Vec::new();
    for (k, val) in obj {
        if SETTINGS_META.contains(&k.as_str()) {
            continue;
        }
        changes.push((k.clone(), crate::settings::text_from_json(k, val)?));
    }
    if changes.is_empty() {
        return Err(ApiError::bad_request(format!(
            "nothing to change: give any of {}",
            crate::settings::KEYS.join(", ")
        )));
    }
    core.storage.write_settings(&changes).await?;
    core.publisher.reload(core.storage.as_ref(), false).await?;
    Ok(Json(settings_view(&core).await?).into_response())
}

fn totals_json(t: &UsageTotals) -> serde_json::Map<String, Value> {
    match serde_json::to_value(t) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

async fn get_usage(
    State(core): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        match q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("{k} must be an integer, got {v:?}"))),
        }
    };
    let filter = UsageFilter {
        since_ms: int("since_ms")?,
        until_ms: int("until_ms")?,
        key_id: int("key_id")?,
        account_id: int("account_id")?,
    };
    let sum = core.storage.usage_summary(filter).await?;
    let keys = core.storage.list_keys().await?;
    let accounts = core.storage.list_accounts().await?;
    let by_key: Vec<Value> = sum
        .by_key
        .iter()
        .map(|(id, t)| {
            let mut m = totals_json(t);
            m.insert("key_id".into(), json!(id));
            m.insert(
                "name".into(),
                json!(keys.iter().find(|k| k.id == *id).map(|k| k.name.as_str())),
            );
            Value::Object(m)
        })
        .collect();
    let by_account: Vec<Value> = sum
        .by_account
        .iter()
        .map(|(id, t)| {
            let mut m = totals_json(t);
            m.insert("account_id".into(), json!(id));
            m.insert(
                    "label".into(),
                    json!(id.and_then(|id| accounts
                        .iter()
                        .find(|a| a.id == id)
                        .map(AccountRow::label))),
                );
            Value::Object(m)
        })
        .collect();
    Ok(Json(json!({
        "object": "usage",
        "filter": {
            "since_ms": filter.since_ms,
            "until_ms": filter.until_ms,
            "key_id": filter.key_id,
            "account_id": filter.account_id,
        },
        "totals": totals_json(&sum.totals),
        "by_key": by_key,
        "by_account": by_account,
    }))
    .into_response())
}

fn models_view(core: &Core) -> Value {
    let cat = core.models.catalog.load();
    let mut slugs: Vec<&str> = cat.models.keys().map(String::as_str).collect();
    slugs.sort_unstable();
    let aliases: serde_json::Map<String, Value> = cat
        .aliases
        .iter()
        .map(|(k, a)| (k.clone(), json!({"target": a.target, "effort": a.effort})))
        .collect();
    let st = core.models.status();
    json!({
        "object": "model_catalog",
        "source": match cat.source {
            shared_state::catalog::CatalogSource::Embedded => "embedded",
            shared_state::catalog::CatalogSource::Upstream => "upstream",
        },
        "slugs": slugs,
        "aliases": aliases,
        "plans": st.plans,
        "last_attempt_at": st.last_attempt_at,
        "last_published_at": st.last_published_at,
        "refresh_interval_s": core.models.interval.as_secs(),
        "url": core.models.client.url(),
    })
}

async fn get_models(State(core): State<AppState>) -> ApiResult {
    Ok(Json(models_view(&core)).into_response())
}

async fn refresh_models(State(core): State<AppState>) -> ApiResult {
    let outcome = crate::sidecar::models::refresh(&core).await;
    let mut v = models_view(&core);
    v["outcome"] = json!(outcome);
    Ok(Json(v).into_response())
}
