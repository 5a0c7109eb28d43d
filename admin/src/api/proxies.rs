//! Egress proxies (issue 14).
//!
//! - `GET /api/admin/proxies` -> list of [`ProxyView`]: the URL without its password, the pool,
//!   the accounts assigned, the live health every worker shares (breaker, failures, last error)
//!   and the last test;
//! - `POST /api/admin/proxies` `{"name","url","pool"?,"enabled"?}` (`url`:
//!   `http://user:pass@host:port`, `socks5://...`, `socks5h://...`; the password is stored
//!   sealed and never shown again);
//! - `PATCH /api/admin/proxies/{id}` `{"name"?,"url"?,"password"?,"pool"?,"enabled"?}` (a new
//!   `url` without a password keeps the stored one when the user name is unchanged;
//!   `"pool": null` leaves the pool);
//! - `DELETE /api/admin/proxies/{id}` (409 `proxy_in_use` while an account is assigned to it);
//! - `POST /api/admin/proxies/{id}/test` `{"target"?}`: connects through the proxy to one of
//!   the configured upstream origins and answers `{"ok","latency_ms","error","origin"}` (and
//!   stores it). `target` is `"upstream"` (the default: the Codex backend's origin),
//!   `"oauth"` (the OAuth token endpoint's origin) or a URL on one of those two origins;
//!   anything else is 400: the action never probes a host:port the caller picks;
//! - `PUT /api/admin/accounts/{id}/proxy` `{"proxy_id": N}` | `{"pool": "name"}` | `{}`
//!   (direct), and `POST /api/admin/proxies/{id}/assign` `{"account_ids": [...]}`.
//!
//! Every mutation republishes the snapshot: the workers' next connection of those accounts
//! uses the new egress (pools are keyed by egress, so nothing is shared across proxies).

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    routing::{get, patch, post, put},
    Json, Router,
};
use serde::{Deserialize, Serialize};
use shared_state::{egress::ProxyHealth, ProxyUrl, Secret};

use super::{parse_body, parse_id, ApiError, ApiResult, Deleted, List};
use crate::{
    services::Proxies,
    storage::proxies::{ProxyAssignment, ProxyRow, ProxyWrite},
};

/// Longest proxy or pool name (characters).
const MAX_NAME: usize = 128;

pub(super) fn routes(proxies: Arc<Proxies>) -> Router {
    Router::new()
        .route("/proxies", get(list).post(create))
        .route("/proxies/{id}", patch(update).delete(remove))
        .route("/proxies/{id}/test", post(test))
        .route("/proxies/{id}/assign", post(assign_many))
        .route("/accounts/{id}/proxy", put(assign_one))
        .with_state(proxies)
}

/// The last admin test of a proxy.
#[derive(Debug, Serialize)]
struct CheckView {
    at: i64,
    ok: bool,
    latency_ms: Option<i64>,
    error: Option<String>,
}

/// A proxy as listed (never its password).
#[derive(Debug, Serialize)]
pub(crate) struct ProxyView {
    id: i64,
    object: &'static str,
    name: String,
    /// The URL without the password.
    url: String,
    scheme: &'static str,
    has_password: bool,
    pool: Option<String>,
    enabled: bool,
    /// The stored password does not open with the current key (the proxy is unusable).
    decrypt_failed: bool,
    /// Accounts assigned to this proxy directly.
    account_ids: Vec<i64>,
    /// Accounts whose published egress is this proxy (directly or through its pool).
    serving_account_ids: Vec<i64>,
    health: ProxyHealth,
    last_check: Option<CheckView>,
    created_at: i64,
    updated_at: i64,
}

fn view(proxies: &Proxies, row: &ProxyRow, assigned: &[(i64, ProxyAssignment)]) -> ProxyView {
    let snap = proxies.store.publisher.current();
    let serving = snap
        .accounts
        .iter()
        .filter(|a| a.egress.as_ref().is_some_and(|e| e.id == row.id))
        .map(|a| a.id)
        .collect();
    ProxyView {
        id: row.id,
        object: "proxy",
        name: row.name.clone(),
        url: row.url.clone(),
        scheme: row.parsed().map_or("unknown", |u| u.scheme.as_str()),
        has_password: row.password.is_some() || row.decrypt_failed,
        pool: row.pool.clone(),
        enabled: row.enabled,
        decrypt_failed: row.decrypt_failed,
        account_ids: assigned
            .iter()
            .filter(|(_, a)| *a == ProxyAssignment::Proxy(row.id))
            .map(|(id, _)| *id)
            .collect(),
        serving_account_ids: serving,
        health: proxies
            .store
            .publisher
            .egress()
            .live(row.id)
            .health(shared_state::now_ms()),
        last_check: row.last_check_at.map(|at| CheckView {
            at,
            ok: row.last_check_ok.unwrap_or(false),
            latency_ms: row.last_check_ms,
            error: row.last_check_error.clone(),
        }),
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

async fn list(State(proxies): State<Arc<Proxies>>) -> ApiResult<List<ProxyView>> {
    let store = proxies.store.storage.proxies();
    let rows = store.list_proxies().await?;
    let assigned = store.list_proxy_assignments().await?;
    Ok(Json(List::of(
        rows.iter().map(|r| view(&proxies, r, &assigned)).collect(),
    )))
}

async fn one(proxies: &Proxies, id: i64) -> Result<ProxyView, ApiError> {
    let store = proxies.store.storage.proxies();
    let rows = store.list_proxies().await?;
    let row = rows
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no proxy with id {id}")))?;
    let assigned = store.list_proxy_assignments().await?;
    Ok(view(proxies, row, &assigned))
}

fn check_name(what: &'static str, name: &str) -> Result<String, ApiError> {
    let n = name.trim();
    if n.is_empty() || n.chars().count() > MAX_NAME || n.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "\"{what}\" must be 1 to {MAX_NAME} characters, without control characters"
        ))
        .with_param(what));
    }
    Ok(n.to_owned())
}

fn parse_url(url: &str) -> Result<ProxyUrl, ApiError> {
    ProxyUrl::parse(url).map_err(|e| ApiError::bad_request(e.to_string()).with_param("url"))
}

fn conflict(code: &'static str, msg: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "invalid_request_error", code, msg)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateProxy {
    name: String,
    url: String,
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
}

async fn create(State(proxies): State<Arc<Proxies>>, body: Bytes) -> ApiResult<ProxyView> {
    let req: CreateProxy = parse_body(&body)?;
    let name = check_name("name", &req.name)?;
    let url = parse_url(&req.url)?;
    let pool = req.pool.map(|p| check_name("pool", &p)).transpose()?;
    let store = proxies.store.storage.proxies();
    if store.list_proxies().await?.iter().any(|r| r.name == name) {
        return Err(conflict(
            "proxy_exists",
            format!("a proxy named {name:?} exists"),
        ));
    }
    let id = store
        .create_proxy(&ProxyWrite {
            name,
            url,
            pool,
            enabled: req.enabled.unwrap_or(true),
        })
        .await?;
    proxies.store.reload().await?;
    Ok(Json(one(&proxies, id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateProxy {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    password: Option<String>,
    /// Absent: unchanged; `null`: no pool.
    #[serde(default, with = "double_option")]
    pool: Option<Option<String>>,
    #[serde(default)]
    enabled: Option<bool>,
}

mod double_option {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<String>>, D::Error> {
        Ok(Some(Option::deserialize(d)?))
    }
}

async fn update(
    State(proxies): State<Arc<Proxies>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<ProxyView> {
    let id = parse_id(&id)?;
    let req: UpdateProxy = parse_body(&body)?;
    let store = proxies.store.storage.proxies();
    let rows = store.list_proxies().await?;
    let row = rows
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no proxy with id {id}")))?;
    let name = match &req.name {
        Some(n) => check_name("name", n)?,
        None => row.name.clone(),
    };
    if rows.iter().any(|r| r.id != id && r.name == name) {
        return Err(conflict(
            "proxy_exists",
            format!("a proxy named {name:?} exists"),
        ));
    }
    let old = row
        .parsed()
        .map_err(|e| ApiError::bad_request(format!("stored {e}; send a new \"url\"")))?;
    let mut url = match &req.url {
        Some(u) => {
            let mut new = parse_url(u)?;
            if new.password.is_none() && new.username == old.username {
                new.password = old.password.clone();
            }
            new
        }
        None => old,
    };
    if let Some(p) = &req.password {
        if url.username.is_none() {
            return Err(
                ApiError::bad_request("a password needs a user name in \"url\"")
                    .with_param("password"),
            );
        }
        url.password = (!p.is_empty()).then(|| Secret::new(p.as_str()));
    }
    let pool = match req.pool {
        None => row.pool.clone(),
        Some(None) => None,
        Some(Some(p)) => Some(check_name("pool", &p)?),
    };
    store
        .update_proxy(
            id,
            &ProxyWrite {
                name,
                url,
                pool,
                enabled: req.enabled.unwrap_or(row.enabled),
            },
        )
        .await?;
    proxies.store.reload().await?;
    Ok(Json(one(&proxies, id).await?))
}

async fn remove(State(proxies): State<Arc<Proxies>>, Path(id): Path<String>) -> ApiResult<Deleted> {
    let id = parse_id(&id)?;
    let store = proxies.store.storage.proxies();
    let users: Vec<i64> = store
        .list_proxy_assignments()
        .await?
        .into_iter()
        .filter(|(_, a)| *a == ProxyAssignment::Proxy(id))
        .map(|(acc, _)| acc)
        .collect();
    if !users.is_empty() {
        return Err(conflict(
            "proxy_in_use",
            format!("accounts {users:?} use this proxy; assign them elsewhere first"),
        ));
    }
    if !store.delete_proxy(id).await? {
        return Err(ApiError::not_found(format!("no proxy with id {id}")));
    }
    proxies.store.reload().await?;
    Ok(Json(Deleted {
        id,
        object: "proxy",
        deleted: Some(true),
        revoked: None,
    }))
}

/// The outcome of a test.
#[derive(Debug, Serialize)]
struct TestView {
    id: i64,
    object: &'static str,
    ok: bool,
    latency_ms: i64,
    error: Option<String>,
    /// What was reached through the proxy.
    origin: String,
}

/// The body of a test: which configured origin to reach.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestRequest {
    #[serde(default)]
    target: Option<String>,
}

/// The origin a test reaches: `target` resolved against the configured origins (`None`: the
/// upstream's); anything that is not one of them is refused.
fn test_origin(
    upstream_base: &str,
    oauth_token_url: &str,
    target: Option<&str>,
) -> Result<String, ApiError> {
    let upstream = origin_of(upstream_base);
    let oauth = origin_of(oauth_token_url);
    let refused = || {
        ApiError::bad_request(format!(
            "\"target\" must be \"upstream\" ({upstream}), \"oauth\" ({oauth}) or a URL on \
             one of those origins"
        ))
        .with_param("target")
    };
    let t = match target.map(str::trim) {
        None | Some("" | "upstream") => return Ok(upstream),
        Some("oauth") => return Ok(oauth),
        Some(t) => t,
    };
    let origin = |u: &str| reqwest::Url::parse(u).ok().map(|u| u.origin());
    let wanted = origin(t).filter(|o| o.is_tuple()).ok_or_else(refused)?;
    let found = [&upstream, &oauth]
        .into_iter()
        .find(|o| origin(o).as_ref() == Some(&wanted))
        .cloned();
    found.ok_or_else(refused)
}

async fn test(
    State(proxies): State<Arc<Proxies>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<TestView> {
    let id = parse_id(&id)?;
    let req: TestRequest = parse_body(&body)?;
    let origin = test_origin(
        &proxies.upstream_base_url,
        proxies.oauth.token_url(),
        req.target.as_deref(),
    )?;
    let store = proxies.store.storage.proxies();
    let rows = store.list_proxies().await?;
    let row = rows
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no proxy with id {id}")))?;
    let url = row
        .parsed()
        .map_err(|e| ApiError::bad_request(format!("stored {e}")))?;
    let check = crate::egress::test_proxy(&url, proxies.upstream_ca.as_deref(), &origin).await;
    store.record_proxy_check(id, &check).await?;
    Ok(Json(TestView {
        id,
        object: "proxy.test",
        ok: check.ok,
        latency_ms: check.latency_ms,
        error: check.error,
        origin,
    }))
}

/// `scheme://host[:port]/` of a URL.
fn origin_of(base: &str) -> String {
    match base.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.split('/').next().unwrap_or(rest);
            format!("{scheme}://{host}/")
        }
        None => base.to_owned(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignOne {
    #[serde(default)]
    proxy_id: Option<i64>,
    #[serde(default)]
    pool: Option<String>,
}

/// An account's egress after an assignment.
#[derive(Debug, Serialize)]
struct AssignmentView {
    account_id: i64,
    object: &'static str,
    proxy_id: Option<i64>,
    pool: Option<String>,
}

async fn validate(proxies: &Proxies, a: &ProxyAssignment) -> Result<(), ApiError> {
    let rows = proxies.store.storage.proxies().list_proxies().await?;
    match a {
        ProxyAssignment::Proxy(id) if !rows.iter().any(|r| r.id == *id) => {
            Err(ApiError::bad_request(format!("no proxy with id {id}")).with_param("proxy_id"))
        }
        ProxyAssignment::Pool(p) if !rows.iter().any(|r| r.pool.as_deref() == Some(p)) => {
            Err(ApiError::bad_request(format!("no proxy is in pool {p:?}")).with_param("pool"))
        }
        _ => Ok(()),
    }
}

async fn account_exists(proxies: &Proxies, id: i64) -> Result<(), ApiError> {
    if proxies.store.storage.get_account(id).await?.is_none() {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    Ok(())
}

async fn assign_one(
    State(proxies): State<Arc<Proxies>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<AssignmentView> {
    let id = parse_id(&id)?;
    let req: AssignOne = parse_body(&body)?;
    let a = match (req.proxy_id, req.pool) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give \"proxy_id\" or \"pool\", not both ({} is direct)",
            ))
        }
        (Some(p), None) => ProxyAssignment::Proxy(p),
        (None, Some(p)) => ProxyAssignment::Pool(check_name("pool", &p)?),
        (None, None) => ProxyAssignment::Direct,
    };
    account_exists(&proxies, id).await?;
    validate(&proxies, &a).await?;
    proxies
        .store
        .storage
        .proxies()
        .set_account_proxy(id, &a)
        .await?;
    proxies.store.reload().await?;
    let (proxy_id, pool) = match a {
        ProxyAssignment::Direct => (None, None),
        ProxyAssignment::Proxy(p) => (Some(p), None),
        ProxyAssignment::Pool(p) => (None, Some(p)),
    };
    Ok(Json(AssignmentView {
        account_id: id,
        object: "account.proxy",
        proxy_id,
        pool,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignMany {
    account_ids: Vec<i64>,
}

async fn assign_many(
    State(proxies): State<Arc<Proxies>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<crate::audit::Audited<ProxyView>, ApiError> {
    let id = parse_id(&id)?;
    let req: AssignMany = parse_body(&body)?;
    let a = ProxyAssignment::Proxy(id);
    validate(&proxies, &a).await?;
    for acc in &req.account_ids {
        account_exists(&proxies, *acc).await?;
    }
    for acc in &req.account_ids {
        proxies
            .store
            .storage
            .proxies()
            .set_account_proxy(*acc, &a)
            .await?;
    }
    proxies.store.reload().await?;
    // One audit entry (the proxy's) listing the accounts assigned.
    let affected = crate::audit::Affected::of("account", req.account_ids.iter().copied());
    Ok(affected.with(one(&proxies, id).await?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn tests_reach_only_the_configured_origins() {
        let up = "https://chatgpt.com/backend-api/codex";
        let oauth = "https://auth.openai.com/oauth/token";
        let o = |t| test_origin(up, oauth, t);
        assert_eq!(o(None).unwrap(), "https://chatgpt.com/");
        assert_eq!(o(Some("upstream")).unwrap(), "https://chatgpt.com/");
        assert_eq!(o(Some("oauth")).unwrap(), "https://auth.openai.com/");
        assert_eq!(
            o(Some("https://auth.openai.com:443/anything")).unwrap(),
            "https://auth.openai.com/"
        );
        assert_eq!(
            o(Some("HTTPS://ChatGPT.com")).unwrap(),
            "https://chatgpt.com/"
        );
        for bad in [
            "http://chatgpt.com/",
            "https://chatgpt.com:8443/",
            "https://169.254.169.254/",
            "127.0.0.1:6379",
            "redis://127.0.0.1:6379",
            "https://chatgpt.com.evil.example/",
            "file:///etc/passwd",
            "other",
        ] {
            let e = o(Some(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
