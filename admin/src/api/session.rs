//! Logging in and out, and admin API tokens.
//!
//! - `POST /api/admin/login` `{"password"}` (the only endpoint open without credentials):
//!   200 [`SessionView`] and `Set-Cookie: cg_admin_session=...; HttpOnly; SameSite=Strict;
//!   Path=/`; 401 for a wrong password; 429 (+ `Retry-After`) over the rate limit.
//! - `POST /api/admin/logout`: ends the session, clears the cookie.
//! - `GET /api/admin/session`: who is asking ([`SessionView`]).
//! - `GET /api/admin/tokens`, `POST /api/admin/tokens` `{"name"}` -> [`TokenView`] with the
//!   plain `token` (shown once), `DELETE /api/admin/tokens/{id}`.

use std::net::SocketAddr;

use axum::{
    body::Bytes,
    extract::{ConnectInfo, Path, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Extension, Json, Router,
};
use serde::{Deserialize, Serialize};

use super::{parse_body, parse_id, ApiError, ApiResult, AppState, Deleted, List};
use crate::{
    auth::{self, Principal, SESSION_COOKIE, SESSION_TTL},
    storage::AdminTokenRow,
};

pub(super) fn public_routes() -> Router<AppState> {
    Router::new().route("/login", post(login))
}

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/logout", post(logout))
        .route("/session", get(whoami))
        .route("/tokens", get(list_tokens).post(create_token))
        .route("/tokens/{id}", delete(revoke_token))
}

// No Debug: it carries a secret.
#[derive(Deserialize)]
struct LoginRequest {
    password: String,
}

/// Who is logged in.
#[derive(Debug, Serialize)]
pub(crate) struct SessionView {
    object: &'static str,
    /// `session`, `token` or `static_token`.
    via: &'static str,
    /// The admin token's id when `via` is `token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_id: Option<i64>,
    /// Session expiry (Unix ms), on login.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
}

/// The session cookie; `Secure` when a TLS-terminating proxy says the browser used https.
fn cookie(value: &str, max_age_s: u64, headers: &HeaderMap) -> Option<HeaderValue> {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age_s}{}",
        if https { "; Secure" } else { "" }
    ))
    .ok()
}

async fn login(
    State(core): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let now = shared_state::now_ms();
    let limiter = &core.admin.auth.limiter;
    if let Err(wait) = limiter.check(peer.ip(), now) {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "rate_limited",
            format!("too many failed logins; try again in {wait} s"),
        );
        e.extra().retry_after = Some(wait);
        return Err(e);
    }
    let req: LoginRequest = parse_body(&body)?;
    let stored = core.storage.admin_password_hash().await?;
    let ok = match stored {
        Some(hash) => {
            let pw = req.password;
            // Argon2 takes tens of milliseconds: keep it off the sidecar's only thread.
            tokio::task::spawn_blocking(move || auth::verify_password(&pw, &hash))
                .await
                .unwrap_or(false)
        }
        None => false,
    };
    if !ok {
        limiter.failure(peer.ip(), now);
        tracing::warn!(peer = %peer.ip(), "admin login failed");
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_password",
            "wrong admin password",
        ));
    }
    limiter.success(peer.ip());
    let sid = auth::generate_session_id();
    let ttl_ms = i64::try_from(SESSION_TTL.as_millis()).unwrap_or(i64::MAX);
    let expires_at = crate::storage::now_ms_i64().saturating_add(ttl_ms);
    core.storage
        .create_admin_session(&auth::sha256_hex(&sid), expires_at)
        .await?;
    // Expired sessions are purged on each login.
    let _ = core.storage.delete_admin_sessions(Some("")).await;
    tracing::info!(peer = %peer.ip(), "admin logged in");
    let mut resp = Json(SessionView {
        object: "session",
        via: "session",
        token_id: None,
        expires_at: Some(expires_at),
    })
    .into_response();
    if let Some(c) = cookie(&sid, SESSION_TTL.as_secs(), &headers) {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    Ok(resp)
}

async fn logout(State(core): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    if let Some(sid) = super::session_cookie(&headers) {
        core.storage
            .delete_admin_sessions(Some(&auth::sha256_hex(sid)))
            .await?;
    }
    let mut resp =
        Json(serde_json::json!({"object": "session", "logged_out": true})).into_response();
    if let Some(c) = cookie("", 0, &headers) {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    Ok(resp)
}

async fn whoami(Extension(p): Extension<Principal>) -> ApiResult<SessionView> {
    let (via, token_id) = match p {
        Principal::Session => ("session", None),
        Principal::Token { id } => ("token", Some(id)),
        Principal::StaticToken => ("static_token", None),
    };
    Ok(Json(SessionView {
        object: "session",
        via,
        token_id,
        expires_at: None,
    }))
}

/// An admin API token as listed; `token` only in the answer that created it.
// No Debug: it carries a secret.
#[derive(Serialize)]
pub(crate) struct TokenView {
    id: i64,
    object: &'static str,
    name: String,
    token_prefix: String,
    created_at: i64,
    last_used_at: Option<i64>,
    revoked_at: Option<i64>,
    revoked: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

impl From<&AdminTokenRow> for TokenView {
    fn from(r: &AdminTokenRow) -> Self {
        Self {
            id: r.id,
            object: "admin_token",
            name: r.name.clone(),
            token_prefix: r.token_prefix.clone(),
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            revoked_at: r.revoked_at,
            revoked: r.revoked_at.is_some(),
            token: None,
        }
    }
}

async fn list_tokens(State(core): State<AppState>) -> ApiResult<List<TokenView>> {
    let rows = core.storage.list_admin_tokens().await?;
    Ok(Json(List::of(rows.iter().map(TokenView::from).collect())))
}

#[derive(Debug, Deserialize)]
struct CreateToken {
    #[serde(default)]
    name: String,
}

async fn create_token(State(core): State<AppState>, body: Bytes) -> ApiResult<TokenView> {
    let req: CreateToken = parse_body(&body)?;
    let name = req.name.trim();
    if name.is_empty() {
        return Err(ApiError::bad_request("\"name\" is required").with_param("name"));
    }
    let plain = auth::generate_admin_token();
    let prefix: String = plain
        .chars()
        .take(auth::ADMIN_TOKEN_PREFIX.len() + 4)
        .collect();
    let row = core
        .storage
        .create_admin_token(name, &auth::sha256_hex(&plain), &prefix)
        .await?;
    let mut v = TokenView::from(&row);
    v.token = Some(plain);
    Ok(Json(v))
}

async fn revoke_token(State(core): State<AppState>, Path(id): Path<String>) -> ApiResult<Deleted> {
    let id = parse_id(&id)?;
    if !core.storage.revoke_admin_token(id).await? {
        return Err(ApiError::not_found(format!(
            "no active admin token with id {id}"
        )));
    }
    Ok(Json(Deleted {
        id,
        object: "admin_token",
        deleted: None,
        revoked: Some(true),
    }))
}
