//! Logging in and out, and admin API tokens.
//!
//! - `POST /api/admin/login` `{"password"}` (the only endpoint open without credentials):
//!   200 [`SessionView`] and `Set-Cookie: cg_admin_session=...; HttpOnly; SameSite=Strict;
//!   Path=/`; 401 for a wrong password; 429 (+ `Retry-After`) over the rate limit or while
//!   [`auth::LOGIN_HASHES_MAX`] checks run; 413 for a body over
//!   [`auth::LOGIN_MAX_BODY_BYTES`]; 400 `password_too_long` over
//!   [`auth::MAX_PASSWORD_BYTES`]. In that order: nothing is hashed before the attempt is
//!   reserved (`auth::LoginLimiter`) and a hashing permit is held.
//! - `POST /api/admin/logout`: ends the session, clears the cookie.
//! - `GET /api/admin/session`: who is asking ([`SessionView`]).
//! - `GET /api/admin/tokens`, `POST /api/admin/tokens` `{"name","scope"?,"expires_at"?}`
//!   (`scope`: `admin` (default) or `read`, GET only; `expires_at`: Unix ms, in the future)
//!   -> [`TokenView`] with the plain `token` (shown once), `DELETE /api/admin/tokens/{id}`.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, ConnectInfo, DefaultBodyLimit, Path, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Extension, Json, Router,
};
use serde::{Deserialize, Serialize};

use super::{parse_body, parse_id, ApiError, ApiResult, Deleted, List};
use crate::{
    auth::{self, Principal, TokenScope, SESSION_COOKIE, SESSION_TTL},
    services::Session,
    storage::AdminTokenRow,
};

pub(super) fn public_routes(session: Arc<Session>) -> Router {
    // A few KiB, not the API's import-sized limit: the login is open to anyone.
    Router::new()
        .route(
            "/login",
            post(login).layer(DefaultBodyLimit::max(auth::LOGIN_MAX_BODY_BYTES)),
        )
        .with_state(session)
}

pub(super) fn routes(session: Arc<Session>) -> Router {
    Router::new()
        .route("/logout", post(logout))
        .route("/session", get(whoami))
        .route("/tokens", get(list_tokens).post(create_token))
        .route("/tokens/{id}", delete(revoke_token))
        .with_state(session)
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
    /// `admin` (everything) or `read` (GET only).
    scope: &'static str,
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

fn too_many(wait: u64, msg: String) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        "rate_limited",
        msg,
    );
    e.extra().retry_after = Some(wait);
    e
}

async fn login(
    State(session): State<Arc<Session>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "payload_too_large",
                format!(
                    "a login body is at most {} bytes",
                    auth::LOGIN_MAX_BODY_BYTES
                ),
            )
        } else {
            ApiError::bad_request(format!("cannot read the body: {e}"))
        }
    })?;
    let req: LoginRequest = parse_body(&body)?;
    if req.password.len() > auth::MAX_PASSWORD_BYTES {
        // Cannot be the password (see auth::bootstrap): refused without hashing.
        return Err(ApiError::bad_request(format!(
            "the password is longer than {} bytes",
            auth::MAX_PASSWORD_BYTES
        ))
        .with_code("password_too_long")
        .with_param("password"));
    }
    let now = shared_state::now_ms();
    let limiter = &session.auth.limiter;
    // Counted in before anything is hashed: parallel attempts cannot all pass the check.
    let attempt = limiter.reserve(peer.ip(), now).map_err(|wait| {
        too_many(
            wait,
            format!("too many failed logins; try again in {wait} s"),
        )
    })?;
    // At most LOGIN_HASHES_MAX Argon2 checks at once; the rest are told to come back, never
    // queued. The permit travels into the blocking task: it is held until the hash is done
    // even when the client goes away.
    let Ok(permit) = Arc::clone(&session.auth.hashes).try_acquire_owned() else {
        limiter.refund(attempt);
        return Err(too_many(1, "too many logins in progress; try again".into()));
    };
    let stored = match session.storage.admin_password_hash().await {
        Ok(s) => s,
        Err(e) => {
            limiter.refund(attempt);
            return Err(e.into());
        }
    };
    let ok = match stored {
        Some(hash) => {
            let pw = req.password;
            // Argon2 takes tens of milliseconds: keep it off the sidecar's only thread.
            tokio::task::spawn_blocking(move || {
                let ok = auth::verify_login_password(&pw, &hash);
                drop(permit);
                ok
            })
            .await
            .unwrap_or(false)
        }
        None => false,
    };
    if !ok {
        // The reserved attempt stays counted.
        tracing::warn!(peer = %peer.ip(), "admin login failed");
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_password",
            "wrong admin password",
        ));
    }
    limiter.success(attempt, now);
    let sid = auth::generate_session_id();
    let ttl_ms = i64::try_from(SESSION_TTL.as_millis()).unwrap_or(i64::MAX);
    let expires_at = crate::storage::now_ms_i64().saturating_add(ttl_ms);
    session
        .storage
        .create_admin_session(&auth::sha256_hex(&sid), expires_at)
        .await?;
    // Expired sessions are purged on each login.
    let _ = session.storage.delete_admin_sessions(Some("")).await;
    tracing::info!(peer = %peer.ip(), "admin logged in");
    let mut resp = Json(SessionView {
        object: "session",
        via: "session",
        token_id: None,
        scope: TokenScope::Admin.as_str(),
        expires_at: Some(expires_at),
    })
    .into_response();
    if let Some(c) = cookie(&sid, SESSION_TTL.as_secs(), &headers) {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    Ok(resp)
}

async fn logout(
    State(session): State<Arc<Session>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(sid) = super::session_cookie(&headers) {
        session
            .storage
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
        Principal::Token { id, .. } => ("token", Some(id)),
        Principal::StaticToken => ("static_token", None),
    };
    let scope = match p {
        Principal::Token { scope, .. } => scope,
        Principal::Session | Principal::StaticToken => TokenScope::Admin,
    };
    Ok(Json(SessionView {
        object: "session",
        via,
        token_id,
        scope: scope.as_str(),
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
    /// `admin` or `read`.
    scope: String,
    /// Expiry, Unix ms (`null`: never).
    expires_at: Option<i64>,
    /// True once `expires_at` has passed.
    expired: bool,
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
            scope: r.scope.clone(),
            expires_at: r.expires_at,
            expired: r
                .expires_at
                .is_some_and(|at| crate::storage::now_ms_i64() >= at),
            token: None,
        }
    }
}

async fn list_tokens(State(session): State<Arc<Session>>) -> ApiResult<List<TokenView>> {
    let rows = session.storage.list_admin_tokens().await?;
    Ok(Json(List::of(rows.iter().map(TokenView::from).collect())))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    #[serde(default)]
    name: String,
    /// `admin` (default) or `read`.
    #[serde(default)]
    scope: Option<String>,
    /// Unix ms; absent or `null`: never expires.
    #[serde(default)]
    expires_at: Option<i64>,
}

async fn create_token(State(session): State<Arc<Session>>, body: Bytes) -> ApiResult<TokenView> {
    let req: CreateToken = parse_body(&body)?;
    let name = req.name.trim();
    if name.is_empty() {
        return Err(ApiError::bad_request("\"name\" is required").with_param("name"));
    }
    let scope = match req.scope.as_deref() {
        None => TokenScope::Admin,
        Some(s) => TokenScope::parse(s).ok_or_else(|| {
            ApiError::bad_request("\"scope\" is \"admin\" or \"read\"").with_param("scope")
        })?,
    };
    if req
        .expires_at
        .is_some_and(|at| at <= crate::storage::now_ms_i64())
    {
        return Err(
            ApiError::bad_request("\"expires_at\" (Unix ms) must be in the future")
                .with_param("expires_at"),
        );
    }
    let (plain, row) =
        auth::create_admin_token(session.storage.as_ref(), name, scope, req.expires_at).await?;
    let mut v = TokenView::from(&row);
    v.token = Some(plain.expose().to_owned());
    Ok(Json(v))
}

async fn revoke_token(
    State(session): State<Arc<Session>>,
    Path(id): Path<String>,
) -> ApiResult<Deleted> {
    let id = parse_id(&id)?;
    if !session.storage.revoke_admin_token(id).await? {
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
