//! The audit middleware of the admin API (the log itself, its writer and redaction:
//! [`crate::audit`]): [`layer`] around every authenticated route, [`login_layer`] around the
//! login. Each mutation is recorded with its actor, action, object, HTTP status, the redacted
//! request body and, for settings, client keys, accounts and proxies, the fields that changed
//! ([`state_of`] before and after the handler). See [`crate::audit`] for what is recorded.
//!
//! # Key Components
//! - [`layer`]: the middleware of the authenticated admin API;
//! - [`login_layer`]: the middleware of `POST /login` (the body is never read).
//!
//! # Error handling
//! Nothing here fails the request it audits; an unreadable body is the handler's to refuse
//! (a body over the limit is answered 413 by [`super::too_large_response`]).

use std::net::SocketAddr;

use axum::{
    body::{Body, Bytes},
    extract::{ConnectInfo, MatchedPath, Request, State},
    http::{Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::{json, Value};

use crate::{
    audit::{action_of, actor_of, changed, json_text, record, redact, Affected},
    auth::Principal,
    services::Store,
    storage::audit::AuditWrite,
    storage::Storage,
};

/// Largest response body read back for the created object's id.
const MAX_RESPONSE_PEEK: u64 = 256 << 10;
/// Largest request body parsed into the details (larger ones are recorded by size).
const MAX_DETAILS_BODY: usize = 256 << 10;
/// Largest request body the audit reads (the API's own limit).
const MAX_REQUEST: usize = 64 << 20;

/// The state of an object worth a before/after: settings, a client key, an account, a proxy.
async fn state_of(store: &Store, object: &str, id: Option<&str>) -> Option<Value> {
    let id = id.and_then(|i| i.parse::<i64>().ok());
    match (object, id) {
        ("settings", _) => {
            let stored = store.storage.load_settings().await.ok()?;
            let (eff, _) = crate::settings::effective(store.publisher.defaults(), &stored);
            let mut m = crate::settings::to_json(&eff);
            m.extend(crate::settings::sidecar_json(&crate::settings::sidecar(
                &stored,
            )));
            Some(Value::Object(m))
        }
        ("key", Some(id)) => {
            let k = store
                .storage
                .list_keys()
                .await
                .ok()?
                .into_iter()
                .find(|k| k.id == id)?;
            let mut v = serde_json::to_value(crate::keys::LimitsView::of(&k.limits)).ok()?;
            v["name"] = json!(k.name);
            v["revoked"] = json!(k.revoked_at.is_some());
            Some(v)
        }
        ("account", Some(id)) => {
            let (r, _) = store.storage.get_account(id).await.ok()??;
            let proxy = store
                .storage
                .proxies()
                .list_proxy_assignments()
                .await
                .ok()
                .and_then(|a| a.into_iter().find(|(i, _)| *i == id).map(|(_, a)| a));
            Some(json!({
                "status": r.status.as_str(),
                "weight": r.weight,
                "max_concurrency": r.max_concurrency,
                "account_group": r.account_group,
                "proxy": proxy,
            }))
        }
        ("proxy", Some(id)) => {
            let p = store
                .storage
                .proxies()
                .list_proxies()
                .await
                .ok()?
                .into_iter()
                .find(|p| p.id == id)?;
            Some(json!({
                "name": p.name,
                "url": shared_state::secret::redact_url(&p.url),
                "has_password": p.password.is_some(),
                "pool": p.pool,
                "enabled": p.enabled,
            }))
        }
        _ => None,
    }
}

fn is_mutation(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

fn source_of(req: &Request) -> Option<String> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
}

/// Reads back a small JSON answer (the created object's id) and rebuilds the response.
async fn peek_id(resp: Response) -> (Response, Option<String>) {
    use axum::body::HttpBody as _;
    let small = resp
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n <= MAX_RESPONSE_PEEK);
    if !small {
        return (resp, None);
    }
    let (parts, body) = resp.into_parts();
    match axum::body::to_bytes(
        body,
        usize::try_from(MAX_RESPONSE_PEEK).unwrap_or(usize::MAX),
    )
    .await
    {
        Ok(b) => {
            let id = serde_json::from_slice::<Value>(&b)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .and_then(|v| match v {
                    Value::Number(n) => Some(n.to_string()),
                    Value::String(s) => Some(s),
                    _ => None,
                });
            (Response::from_parts(parts, Body::from(b)), id)
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR.into_response(), None),
    }
}

/// The audit middleware of the authenticated admin API (see the module docs).
pub(crate) async fn layer(State(store): State<Store>, req: Request, next: Next) -> Response {
    if !is_mutation(req.method()) {
        return next.run(req).await;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| path.clone(), |m| m.as_str().to_owned());
    let source = source_of(&req);
    let principal = req.extensions().get::<Principal>().cloned();
    let (action, object, id) = action_of(&method, &matched, &path);
    let (parts, body) = req.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, MAX_REQUEST).await {
        Ok(b) => b,
        Err(_) => {
            return super::too_large_response();
        }
    };
    let details = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else if bytes.len() > MAX_DETAILS_BODY {
        // An import of many files: its size is enough (and it is not parsed twice).
        json!({"body": format!("[{} bytes]", bytes.len())})
    } else {
        serde_json::from_slice::<Value>(&bytes)
            .map(|v| redact(&v))
            .unwrap_or_else(|_| json!({"body": format!("[{} bytes, not JSON]", bytes.len())}))
    };
    let before = state_of(&store, &object, id.as_deref()).await;
    let req = Request::from_parts(parts, Body::from(bytes));
    let resp = next.run(req).await;
    let status = resp.status();
    if status == StatusCode::TOO_MANY_REQUESTS {
        return resp;
    }
    let affected = resp.extensions().get::<Affected>().cloned();
    let (resp, created) = if id.is_none() && affected.is_none() && status.is_success() {
        peek_id(resp).await
    } else {
        (resp, None)
    };
    let id = id.or(created);
    let after = if status.is_success() {
        state_of(&store, &object, id.as_deref()).await
    } else {
        None
    };
    let (b, a) = match (&before, &after) {
        (Some(b), Some(a)) => changed(&redact(b), &redact(a)),
        (Some(b), None) if status.is_success() => (Some(redact(b)), None),
        _ => (None, None),
    };
    let actor = match &principal {
        Some(p) => actor_of(store.storage.as_ref(), p).await,
        None => "anonymous".into(),
    };
    let mut e = AuditWrite {
        at_ms: crate::storage::now_ms_i64(),
        actor,
        source,
        action,
        object_type: Some(object),
        object_id: id,
        status: i64::from(status.as_u16()),
        details: json_text(&details),
        before: b.as_ref().and_then(json_text),
        after: a.as_ref().and_then(json_text),
    };
    if let Some(a) = &affected {
        a.fold_into(&mut e);
    }
    record(store.storage.as_ref(), &e).await;
    resp
}

/// The audit middleware of `POST /login` (public): the body (a password) is never read.
pub(crate) async fn login_layer(
    State(storage): State<std::sync::Arc<dyn Storage>>,
    req: Request,
    next: Next,
) -> Response {
    let source = source_of(&req);
    let resp = next.run(req).await;
    let status = resp.status();
    // Refused before any check (rate limit, size, type): nothing was attempted.
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE
    ) {
        return resp;
    }
    let e = AuditWrite {
        at_ms: crate::storage::now_ms_i64(),
        actor: if status.is_success() {
            "session".into()
        } else {
            "anonymous".into()
        },
        source,
        action: "login".into(),
        object_type: Some("session".into()),
        status: i64::from(status.as_u16()),
        ..AuditWrite::default()
    };
    record(storage.as_ref(), &e).await;
    resp
}
