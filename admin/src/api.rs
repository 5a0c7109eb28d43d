//! The Axum admin API and the embedded admin web app, on the admin address.
//!
//! Nothing under `/api/admin/` answers without authentication except `POST /api/admin/login`
//! (which checks the password); `/healthz` (up/down only) and the web app's static files are
//! public. One file per resource:
//!
//! | file | endpoints |
//! | --- | --- |
//! | [`session`] | `POST /login` (`{"password"}` -> session cookie), `POST /logout`, `GET /session`, `GET/POST /tokens`, `DELETE /tokens/{id}` (admin API tokens, shown once) |
//! | [`accounts`] | `GET /accounts`, `GET/PATCH/DELETE /accounts/{id}`, `POST /accounts/{id}/{enable,disable,refresh,quota,reset-health}`, `POST /accounts/bulk`, `POST /accounts/import`, `POST /accounts/export`, `POST /accounts/oauth/{start,finish}` |
//! | [`keys`] | `GET/POST /keys`, `DELETE /keys/{id}` |
//! | [`usage`] | `GET /usage` (totals by key and account), `GET /usage/series` (time series by model, key or account), `GET /failures` |
//! | [`ops`] | `GET /dashboard`, `GET /ops` (per-worker live view, scheduler board) |
//! | [`settings`] | `GET/PUT /settings` (hot-applied; every invalid key reported in `error.errors`) |
//! | [`models`] | `GET /models`, `POST /models/refresh` |
//! | [`forecast`] | `GET /forecast` (quota forecast: accounts, plans, pool) |
//! | [`audit`] | `GET /audit`, `GET /audit/export.csv` (the audit log of admin actions) |
//! | [`pool`] | `POST /auto-clean/run`, `POST /accounts/test` (batch test, straight to the upstream) |
//!
//! Every mutation republishes the snapshot before answering, and is recorded in the audit log
//! by one middleware ([`audit_layer::layer`]; the login by [`audit_layer::login_layer`]).
//!
//! Each route module's `routes(..)` takes only its own service (per-router state, from
//! [`ApiServices`], which the sidecar assembly builds): e.g. `accounts` an
//! [`crate::services::Accounts`], `keys`, `usage` and `settings` a [`crate::services::Store`];
//! no handler sees the others' handles.
//!
//! # Request guard (every `/api/admin/*` request, login included)
//! - `Host` (DNS rebinding, on every listener, loopback or not) must be a loopback name
//!   (`localhost`, `*.localhost`, a loopback IP), the listener's own IP (any IP literal when it
//!   is bound to `0.0.0.0` / `::`: an IP literal cannot come from a rebound name, whose page's
//!   origin would be that IP), or one of `admin_allowed_hosts` (the public name a reverse
//!   proxy forwards); anything else is 403 `forbidden_host`;
//! - a present `Origin` must be the request's own origin, and `Sec-Fetch-Site: cross-site` is
//!   refused (cross-site requests, CSRF);
//! - `POST`/`PUT`/`PATCH`/`DELETE` need `Content-Type: application/json` (no "simple"
//!   cross-site form or `text/plain` request gets through);
//! - answers carry `Cache-Control: no-store`.
//!
//! After authentication a `read`-scoped admin API token may only `GET`/`HEAD`: anything else
//! is 403 `insufficient_scope`.
//!
//! # Error handling
//! [`ApiError`] is the one place that turns a failure into an OpenAI-shaped
//! `{"error":{"message","type","code"}}` response: 401 `unauthorized`, 403 `forbidden_origin`
//! / `forbidden_host` / `insufficient_scope`, 413 `payload_too_large` (login), 415 `unsupported_media_type`, 429 `rate_limited`, 404 `not_found`,
//! 400 `invalid_request`, 503 `storage_unavailable`, 500 otherwise.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    body::Bytes,
    extract::DefaultBodyLimit,
    extract::{Request, State},
    http::{header, HeaderMap, HeaderValue, Method, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use shared_state::Health;

use crate::{
    auth::{AdminAuth, Principal},
    error::StorageError,
    services::{Accounts, Catalog, Forecast, Ops, Pool, Proxies, Session, Store},
    settings::SettingError,
};

mod accounts;
mod audit;
pub(crate) mod audit_layer;
mod forecast;
pub(crate) mod keys;
mod models;
mod ops;
mod pool;
mod proxies;
mod session;
mod settings;
mod usage;
pub mod web;

/// Largest admin API request body (an import of many credential files).
const MAX_BODY_BYTES: usize = 64 << 20;

/// What the admin router hands its route modules and layers, each only its own service(s);
/// built by the sidecar assembly ([`crate::sidecar`]).
#[derive(Clone)]
pub(crate) struct ApiServices {
    /// Keys, usage, settings and the audit log (and the audit layer).
    pub store: Store,
    /// `/healthz`.
    pub health: Arc<Health>,
    /// Login, admin API tokens, the request guard and the web app's host check.
    pub session: Arc<Session>,
    pub accounts: Arc<Accounts>,
    pub ops: Arc<Ops>,
    pub catalog: Arc<Catalog>,
    pub proxies: Arc<Proxies>,
    pub forecast: Arc<Forecast>,
    pub pool: Arc<Pool>,
}

/// Builds the admin router (API, health check, web app).
pub(crate) fn router(services: ApiServices) -> Router {
    let ApiServices {
        store,
        health,
        session,
        accounts,
        ops,
        catalog,
        proxies,
        forecast,
        pool,
    } = services;
    let protected = Router::new()
        .merge(session::routes(Arc::clone(&session)))
        .merge(accounts::routes(accounts))
        .merge(keys::routes(store.clone()))
        .merge(usage::routes(store.clone()))
        .merge(ops::routes(ops))
        .merge(settings::routes(store.clone()))
        .merge(models::routes(catalog))
        .merge(proxies::routes(proxies))
        .merge(forecast::routes(forecast))
        .merge(audit::routes(Arc::clone(&store.storage)))
        .merge(pool::routes(pool))
        .fallback(not_found)
        // Inside `require_admin`: it knows the caller (`Principal`).
        .layer(middleware::from_fn_with_state(
            store.clone(),
            audit_layer::layer,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&session),
            require_admin,
        ));
    let api = protected
        .merge(
            session::public_routes(Arc::clone(&session)).layer(middleware::from_fn_with_state(
                Arc::clone(&store.storage),
                audit_layer::login_layer,
            )),
        )
        .layer(middleware::from_fn_with_state(Arc::clone(&session), guard));
    Router::new()
        .route("/healthz", get(healthz).with_state(health))
        // Imports of thousands of credential files arrive as one JSON body.
        .nest(
            "/api/admin",
            api.layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .fallback(axum::routing::any(web::serve).with_state(session))
}

/// Serves the admin router on `listener` until `stop` flips (client addresses are known to
/// the handlers for login rate limiting).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    services: ApiServices,
    mut stop: watch::Receiver<bool>,
) {
    let app = router(services).into_make_service_with_connect_info::<SocketAddr>();
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = res {
        tracing::error!(error = %e, "admin server failed");
    }
}

/// An admin API failure.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
    extra: Option<Box<ErrorExtra>>,
}

/// The rarely set parts of an [`ApiError`] (boxed: errors stay small).
#[derive(Debug, Default)]
struct ErrorExtra {
    param: Option<String>,
    details: Option<Value>,
    retry_after: Option<u64>,
}

// === impl ApiError ===

impl ApiError {
    /// The human message.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

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
            extra: None,
        }
    }

    fn extra(&mut self) -> &mut ErrorExtra {
        self.extra.get_or_insert_with(Box::default)
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

    fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "unauthorized",
            "log in (POST /api/admin/login) or send Authorization: Bearer <admin API token>",
        )
    }

    fn forbidden(code: &'static str, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", code, msg)
    }

    fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }

    fn with_param(mut self, param: impl Into<String>) -> Self {
        self.extra().param = Some(param.into());
        self
    }
}

impl From<SettingError> for ApiError {
    fn from(e: SettingError) -> Self {
        let key = match &e {
            SettingError::UnknownKey(k) | SettingError::Invalid { key: k, .. } => k.clone(),
        };
        Self::bad_request(e.to_string()).with_param(key)
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

impl From<crate::auth::AuthError> for ApiError {
    fn from(e: crate::auth::AuthError) -> Self {
        match e {
            crate::auth::AuthError::Storage(s) => s.into(),
            other => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                other.to_string(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut err = json!({"message": self.message, "type": self.kind, "code": self.code});
        let extra = self.extra.map(|b| *b).unwrap_or_default();
        if let Some(p) = extra.param {
            err["param"] = Value::String(p);
        }
        if let Some(d) = extra.details {
            err["errors"] = d;
        }
        let mut resp = (self.status, Json(json!({ "error": err }))).into_response();
        if let Some(s) = extra.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// `{"object":"list","data":[...]}`.
#[derive(Debug, Serialize)]
pub(crate) struct List<T> {
    object: &'static str,
    data: Vec<T>,
}

impl<T> List<T> {
    fn of(data: Vec<T>) -> Self {
        Self {
            object: "list",
            data,
        }
    }
}

/// `{"id", "object", "deleted"|"revoked": true}`.
#[derive(Debug, Serialize)]
pub(crate) struct Deleted {
    id: i64,
    object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked: Option<bool>,
}

/// The hostname part of a `Host` header value (`[::1]:8081` -> `::1`, `a:80` -> `a`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn is_loopback_host(host: &str) -> bool {
    let h = host_name(host).trim_end_matches('.');
    h.eq_ignore_ascii_case("localhost")
        || h.to_ascii_lowercase().ends_with(".localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `host` (a `Host` header value) may reach the admin listener (see the module docs).
fn host_allowed(auth: &crate::auth::AdminAuth, host: &str) -> bool {
    let name = host_name(host).trim_end_matches('.');
    if name.is_empty() {
        return false;
    }
    if is_loopback_host(host)
        || auth
            .allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
    {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => auth.listen.ip().is_unspecified() || ip == auth.listen.ip(),
        Err(_) => false,
    }
}

/// Host and cross-site checks shared by the API guard and the web app.
pub(crate) fn check_host_and_site(auth: &AdminAuth, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !host_allowed(auth, host) {
        return Err(ApiError::forbidden(
            "forbidden_host",
            "the Host header must name this admin listener (loopback, its address or \
             admin_allowed_hosts)",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let o = origin.to_str().unwrap_or("null");
        let same = o
            .split_once("://")
            .is_some_and(|(_, rest)| !host.is_empty() && rest.eq_ignore_ascii_case(host));
        if !same {
            return Err(ApiError::forbidden(
                "forbidden_origin",
                "cross-origin requests to the admin API are refused",
            ));
        }
    }
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"))
    {
        return Err(ApiError::forbidden(
            "forbidden_origin",
            "cross-site requests to the admin API are refused",
        ));
    }
    Ok(())
}

fn no_store(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Host / Origin / content-type checks and `Cache-Control: no-store` (see the module docs).
async fn guard(State(session): State<Arc<Session>>, req: Request, next: Next) -> Response {
    if let Err(e) = check_host_and_site(&session.auth, req.headers()) {
        return no_store(e.into_response());
    }
    let mutation = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if mutation {
        let json_body = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json_body {
            return no_store(
                ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "invalid_request_error",
                    "unsupported_media_type",
                    "admin API mutations need Content-Type: application/json",
                )
                .into_response(),
            );
        }
    }
    no_store(next.run(req).await)
}

/// The bearer token of a request, if any, the scheme in any case
/// ([`shared_state::secret::bearer_credentials`], the data plane's rule too).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(shared_state::secret::bearer_credentials)
        .map(str::trim)
}

/// The session cookie of a request, if any.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == crate::auth::SESSION_COOKIE)
        .map(|(_, v)| v.trim())
}

async fn require_admin(
    State(session): State<Arc<Session>>,
    mut req: Request,
    next: Next,
) -> Response {
    let who = session
        .auth
        .authenticate(
            session.storage.as_ref(),
            bearer(req.headers()),
            session_cookie(req.headers()),
        )
        .await;
    match who {
        Ok(Some(p)) => {
            if let Principal::Token { scope, .. } = &p {
                if !scope.allows(req.method()) {
                    return ApiError::forbidden(
                        "insufficient_scope",
                        "this admin API token is read-only (GET)",
                    )
                    .into_response();
                }
            }
            req.extensions_mut().insert::<Principal>(p);
            next.run(req).await
        }
        Ok(None) => ApiError::unauthorized().into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn healthz(State(health): State<Arc<Health>>) -> Response {
    if health.storage_up() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "storage": "down"})),
        )
            .into_response()
    }
}

/// 413 for a body over the admin API's limit (read by a middleware before the handler).
pub(crate) fn too_large_response() -> Response {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "payload_too_large",
        format!("an admin API body is at most {MAX_BODY_BYTES} bytes"),
    )
    .into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("unknown admin endpoint")
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .map_err(|_| ApiError::bad_request(format!("invalid id {raw:?}")))
}

/// Parses a JSON body into `T`; an empty body reads as `{}`.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let bytes: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1:8081",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8081",
            "app.localhost:3",
            "127.3.4.5",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "example.com",
            "10.0.0.1:8081",
            "",
            "127.0.0.1.evil.com",
            "[::2]:1",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn hosts_allowed_on_every_listener() {
        let any = crate::auth::AdminAuth::new(
            None,
            "0.0.0.0:8081".parse().unwrap(),
            &["admin.example.com:443".to_owned()],
        );
        for h in [
            "127.0.0.1:8081",
            "localhost",
            "10.1.2.3:8081",
            "admin.example.com",
            "ADMIN.example.com:8081",
        ] {
            assert!(host_allowed(&any, h), "{h}");
        }
        for h in [
            "evil.example",
            "",
            "admin.example.com.evil.example",
            "10.1.2.3.nip.io",
        ] {
            assert!(!host_allowed(&any, h), "{h}");
        }
        let one = crate::auth::AdminAuth::new(None, "10.0.0.5:8081".parse().unwrap(), &[]);
        assert!(host_allowed(&one, "10.0.0.5:8081"));
        assert!(host_allowed(&one, "[::1]:8081"));
        assert!(!host_allowed(&one, "10.0.0.6:8081"));
        assert!(!host_allowed(&one, "evil.example:8081"));
        let lo = crate::auth::AdminAuth::new(None, "127.0.0.1:8081".parse().unwrap(), &[]);
        assert!(!host_allowed(&lo, "rebind.evil.example"));
        assert!(!host_allowed(&lo, "10.0.0.5"));
    }

    #[test]
    fn cookies_and_bearer() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; cg_admin_session=abc ; b=2"),
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer  x "),
        );
        assert_eq!(session_cookie(&h), Some("abc"));
        assert_eq!(bearer(&h), Some("x"));
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("{scheme} y")).unwrap(),
            );
            assert_eq!(bearer(&h), Some("y"), "{scheme}");
        }
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic eA=="),
        );
        assert_eq!(bearer(&h), None);
    }
}
