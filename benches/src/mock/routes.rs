//! Request routing and the handlers of the Codex routes and the operator (`/__mock/*`) routes.
//!
//! # Key Components
//! - [`handle`]: the hyper service function (collects the body, dispatches by path).
//! - `responses`: `POST {prefix}/responses`: auth, account, body validation (docs/protocol.md#request-bodies), controls,
//!   then an error answer or the SSE stream of [`super::events`].
//! - `models`, `usage`, `accounts_check`: the catalog, `/wham/usage` (docs/protocol.md#quota-signals) and the
//!   workspace routing answer Codex CLI needs in ChatGPT-login mode (docs/protocol.md#chatgpt-mode).
//!
//! # Error handling
//! Every failure becomes an HTTP answer in the upstream's own shapes; the service never
//! returns `Err`.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http::{request::Parts, HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::{
    blobs,
    controls::Behaviour,
    errors::{self, ErrorContext},
    events::{self, Plan, SseStream},
    oauth,
    reply::{self, Body},
    state::{now_unix, rand_hex, Log, Shared, PRIMARY_WINDOW_MIN, SECONDARY_WINDOW_MIN},
    ws, IssuedTokens, MockAccount, RecordedRequest, DEFAULT_TEXT, MODELS_CATALOG,
};

/// Body fields the Codex backend rejects with `Unsupported parameter: X` (docs/protocol.md#request-bodies).
const REJECTED_FIELDS: &[&str] = &[
    "max_output_tokens",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "n",
    "seed",
    "stop",
    "user",
    "logit_bias",
    "response_format",
    "metadata",
    "stream_options",
    "truncation",
    "context_management",
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "disable_response_storage",
    "type",
    "generate",
    "previous_response_id",
];

/// Default arguments of a `x-mock-tool-call` function call.
const DEFAULT_TOOL_ARGUMENTS: &str = r#"{"cmd":"echo mock-codex"}"#;

/// The service function: never fails, every error is an HTTP answer.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if ws::is_upgrade(&shared, &req) {
        return Ok(ws::handshake(shared, req).await);
    }
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return Ok(reply::detail(
                400,
                &format!("could not read the request body: {e}"),
            ))
        }
    };
    Ok(route(shared, parts, body).await)
}

async fn route(shared: Arc<Shared>, parts: Parts, body: Bytes) -> Response<Body> {
    let path = parts.uri.path();
    if path == shared.responses_path {
        return match parts.method {
            Method::POST => responses(shared, parts, body).await,
            // Not a WebSocket upgrade (those are answered by `ws::handshake`).
            Method::GET => reply::detail(
                426,
                "mock-codex: GET /responses needs Upgrade: websocket (HTTP/1.1)",
            ),
            _ => reply::detail(405, "Method Not Allowed"),
        };
    }
    if path == shared.models_path && parts.method == Method::GET {
        return models(&shared, &parts);
    }
    match (&parts.method, path) {
        (&Method::GET, "/backend-api/wham/usage") => usage(&shared, &parts),
        (&Method::GET, "/backend-api/wham/accounts/check") => accounts_check(&shared, &parts),
        (&Method::POST, "/oauth/token") => {
            let rec = recorded(&shared, &parts, body, None);
            oauth::token_endpoint(shared, rec).await
        }
        (&Method::GET, "/__mock/requests") => {
            let all: Vec<Value> = shared
                .lock()
                .requests
                .iter()
                .map(RecordedRequest::to_json)
                .collect();
            reply::json(200, Value::Array(all).to_string())
        }
        (&Method::GET, "/__mock/token-requests") => {
            let all: Vec<Value> = shared
                .lock()
                .token_requests
                .iter()
                .map(RecordedRequest::to_json)
                .collect();
            reply::json(200, Value::Array(all).to_string())
        }
        (&Method::GET, "/__mock/stats") => reply::json(200, stats(&shared).to_string()),
        (&Method::POST, "/__mock/reset") => {
            reset(&shared);
            reply::json(200, r#"{"ok":true}"#)
        }
        (&Method::POST, "/__mock/accounts") => add_account(&shared, &body),
        (&Method::POST, p) if p.starts_with("/__mock/behaviour/") => {
            set_behaviour(&shared, &p["/__mock/behaviour/".len()..], &body)
        }
        (&Method::POST, p) if p.starts_with("/__mock/quota/") => {
            set_quota(&shared, &p["/__mock/quota/".len()..], &body)
        }
        (&Method::POST, "/__mock/ws/refuse-upgrade") => ws_refuse_upgrade(&shared, &body),
        (&Method::POST, "/__mock/ws/kill") => {
            let n = shared.ws_control.send(ws::WsCommand::Kill).unwrap_or(0);
            reply::json(200, json!({ "sockets": n }).to_string())
        }
        (&Method::POST, "/__mock/ws/close") => {
            let n = shared.ws_control.send(ws::WsCommand::Close).unwrap_or(0);
            reply::json(200, json!({ "sockets": n }).to_string())
        }
        (&Method::GET, "/healthz") => reply::json(200, r#"{"ok":true}"#),
        _ => reply::detail(404, "Not Found"),
    }
}

pub(crate) fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The bearer token of `Authorization`, if any.
pub(crate) fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = header(h, "authorization")?.trim();
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A non-empty `ChatGPT-Account-Id`.
pub(crate) fn account_header(h: &HeaderMap) -> Option<&str> {
    header(h, "chatgpt-account-id")
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

fn recorded(shared: &Shared, parts: &Parts, body: Bytes, json: Option<Value>) -> RecordedRequest {
    RecordedRequest {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        version: format!("{:?}", parts.version),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        json,
        received_at_ms: shared.elapsed_ms(),
    }
}

/// Under `strict_tokens`: the bearer must be the account's latest, unexpired access token.
pub(crate) fn check_strict(
    shared: &Shared,
    account_id: &str,
    token: &str,
) -> Option<Response<Body>> {
    if !shared.cfg.strict_tokens {
        return None;
    }
    let inner = shared.lock();
    let st = inner.accounts.get(account_id);
    match st.and_then(|s| s.access_token.as_deref().map(|t| (t, s.access_exp))) {
        Some((current, exp)) if current == token => {
            (exp <= now_unix()).then(|| errors::token_expired(401))
        }
        _ => Some(errors::token_invalidated(401)),
    }
}

/// Reads `x-mock-*` headers, then `client_metadata` `x-mock-*` entries (which win).
pub(crate) fn request_controls(
    h: &HeaderMap,
    body: &Map<String, Value>,
) -> Result<Behaviour, String> {
    let mut b = Behaviour::default();
    for (k, v) in h {
        if k.as_str().starts_with("x-mock-") {
            let v = v
                .to_str()
                .map_err(|_| format!("header {k} is not visible ASCII"))?;
            b.set(k.as_str(), v)?;
        }
    }
    if let Some(Value::Object(meta)) = body.get("client_metadata") {
        for (k, v) in meta {
            if !k.to_ascii_lowercase().starts_with("x-mock-") {
                continue;
            }
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Null => continue,
                other => other.to_string(),
            };
            b.set(k, &v)?;
        }
    }
    Ok(b)
}

/// Validates the body like the Codex backend (docs/protocol.md#request-bodies); `Some` is the rejection.
pub(crate) fn validate(body: &Map<String, Value>) -> Option<Response<Body>> {
    if let Some(f) = REJECTED_FIELDS.iter().find(|f| body.contains_key(**f)) {
        return Some(reply::detail(400, &format!("Unsupported parameter: {f}")));
    }
    if body.get("stream") != Some(&Value::Bool(true)) {
        return Some(reply::detail(400, "Stream must be set to true"));
    }
    if body.get("store") != Some(&Value::Bool(false)) {
        return Some(reply::detail(400, "Store must be set to false"));
    }
    if !matches!(body.get("instructions"), Some(Value::String(_))) {
        return Some(reply::detail(400, "Instructions are required"));
    }
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        _ => return Some(reply::detail(400, "Model is required")),
    }
    let Some(Value::Array(items)) = body.get("input") else {
        return Some(reply::detail(400, "Input must be a list"));
    };
    if items
        .iter()
        .any(|i| i.get("prompt_cache_breakpoint").is_some())
    {
        return Some(reply::detail(
            400,
            "Unsupported parameter: prompt_cache_breakpoint",
        ));
    }
    None
}

/// `POST {prefix}/responses`.
async fn responses(shared: Arc<Shared>, parts: Parts, body: Bytes) -> Response<Body> {
    shared
        .counters
        .responses
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let body_len = body.len();
    if shared.cfg.max_recorded > 0 {
        let rec = recorded(&shared, &parts, body, parsed.clone());
        shared.record(rec, false);
    }
    let h = &parts.headers;

    let Some(token) = bearer(h) else {
        return errors::token_invalidated(401);
    };
    let Some(account_id) = account_header(h) else {
        return reply::detail(400, "Missing ChatGPT-Account-Id header");
    };
    if let Some(r) = check_strict(&shared, account_id, token) {
        return r;
    }
    let Some(Value::Object(req)) = parsed else {
        return reply::detail(400, "Request body must be a JSON object");
    };
    if let Some(r) = validate(&req) {
        return r;
    }

    // Controls: process → account → request.
    let request_layer = match request_controls(h, &req) {
        Ok(b) => b,
        Err(e) => return reply::detail(400, &format!("mock-codex: {e}")),
    };
    let cfg = &shared.cfg;
    let c = layered_controls(&shared, account_id, &request_layer);

    let first_byte_delay = c.first_byte_delay.unwrap_or(cfg.first_byte_delay);
    if !first_byte_delay.is_zero() {
        tokio::time::sleep(first_byte_delay).await;
    }

    let model = req.get("model").and_then(Value::as_str).unwrap_or_default();
    let quota = shared.quota(Some(account_id));
    if let Some(r) = error_answer(&c, model, &quota) {
        return r;
    }

    if let Some(r) = foreign_blob(&c, &req, account_id) {
        return r;
    }

    let plan = plan(cfg, &c, &req, body_len, account_id);
    let rendered = events::build(&plan);
    let inter_event_delay = c.inter_event_delay.unwrap_or(cfg.inter_event_delay);
    let stream = SseStream::new(
        rendered,
        inter_event_delay,
        c.disconnect_after,
        c.stall_after,
        shared.clone(),
    );

    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
    reply::set_header(&mut r, "content-type", "text/event-stream");
    reply::set_header(&mut r, "cache-control", "no-cache");
    reply::set_header(&mut r, "x-request-id", format!("req_{}", rand_hex(16)));
    if let Some(c) = &c.set_cookie {
        reply::set_header(&mut r, "set-cookie", format!("{c}; Path=/; HttpOnly"));
    }
    quota_headers(&mut r, &quota);
    match h.get("x-codex-turn-state") {
        Some(v) => {
            r.headers_mut().insert("x-codex-turn-state", v.clone());
        }
        None => reply::set_header(&mut r, "x-codex-turn-state", format!("ts-{}", rand_hex(12))),
    }
    reply::set_header(
        &mut r,
        "x-models-etag",
        shared.catalog_etag.trim_matches('"'),
    );
    r
}

/// The controls of one `/responses` answer, merged: process → account (consuming one of its
/// `fail_times`) → request.
pub(crate) fn layered_controls(
    shared: &Shared,
    account_id: &str,
    request_layer: &Behaviour,
) -> Behaviour {
    let mut c = shared.cfg.default_behaviour.clone();
    let account_layer = shared
        .lock()
        .take_behaviour(account_id, Behaviour::affects_responses);
    if let Some(a) = &account_layer {
        c.overlay(a);
    }
    c.overlay(request_layer);
    c
}

/// The forced error answer of the controls `c` (`error` / `status`), if any.
pub(crate) fn error_answer(
    c: &Behaviour,
    model: &str,
    quota: &super::state::QuotaView,
) -> Option<Response<Body>> {
    if c.error.is_none() && c.status.is_none() {
        return None;
    }
    let ctx = ErrorContext {
        model,
        param: c.param.as_deref(),
        quota,
    };
    let mut r = errors::http_error(c.error, c.status, &ctx);
    reply::set_header(&mut r, "x-request-id", format!("req_{}", rand_hex(16)));
    if let Some(ra) = &c.retry_after {
        reply::set_header(&mut r, "retry-after", ra);
    }
    Some(r)
}

/// The refusal of a request carrying a blob `account_id` did not mint (docs/protocol.md#account-bound-blobs), in the
/// shape the controls choose (`x-mock-blob-error`).
pub(crate) fn foreign_blob(
    c: &Behaviour,
    req: &Map<String, Value>,
    account_id: &str,
) -> Option<Response<Body>> {
    let blob = blobs::first_unverifiable(req, account_id)?;
    Some(blobs::refusal(
        blob,
        c.blob_error.as_deref() == Some("null"),
    ))
}

/// The `service_tier` reported for a request (`priority`, `flex`, else `default`).
pub(crate) fn service_tier(req: &Map<String, Value>) -> &'static str {
    match req.get("service_tier").and_then(Value::as_str) {
        Some("priority") => "priority",
        Some("flex") => "flex",
        _ => "default",
    }
}

/// The shape of the successful answer to `req` (a body of `body_len` bytes) under controls
/// `c`.
///
/// Blobs (the reasoning item's `encrypted_content`, a compaction item) are minted for
/// `account`, the serving account: only it can replay them.
pub(crate) fn plan<'a>(
    cfg: &'a super::MockConfig,
    c: &'a Behaviour,
    req: &'a Map<String, Value>,
    body_len: usize,
    account: &str,
) -> Plan<'a> {
    let model = req.get("model").and_then(Value::as_str).unwrap_or_default();
    let service_tier = service_tier(req);
    let input_tokens = (body_len as u64 / 4).max(1);
    let compaction = blobs::is_compaction_trigger(req).then(|| blobs::mint(account));
    let reasoning = c.reasoning.unwrap_or(false) && compaction.is_none();
    Plan {
        model,
        service_tier,
        text: c
            .text
            .as_deref()
            .or(cfg.text.as_deref())
            .unwrap_or(DEFAULT_TEXT),
        deltas: c.deltas.unwrap_or(cfg.deltas),
        tokens: c.tokens,
        reasoning,
        encrypted: (reasoning && blobs::wants_encrypted_reasoning(req))
            .then(|| blobs::mint(account)),
        compaction,
        tool: c.tool_call.as_deref().filter(|n| !n.is_empty()).map(|n| {
            (
                n,
                c.tool_arguments
                    .as_deref()
                    .unwrap_or(DEFAULT_TOOL_ARGUMENTS),
            )
        }),
        incomplete: c.incomplete.as_deref().filter(|r| !r.is_empty()),
        empty_completed_output: c.empty_completed_output.unwrap_or(false),
        fail_in_stream: c.fail_in_stream.as_deref().filter(|r| !r.is_empty()),
        fail_after_output: c.fail_after_output.as_deref().filter(|r| !r.is_empty()),
        input_tokens,
        cached_tokens: c.cached_tokens.unwrap_or(0),
    }
}

pub(crate) fn quota_headers(r: &mut Response<Body>, q: &super::state::QuotaView) {
    reply::set_header(r, "x-codex-primary-used-percent", q.primary_pct.to_string());
    reply::set_header(
        r,
        "x-codex-primary-window-minutes",
        PRIMARY_WINDOW_MIN.to_string(),
    );
    reply::set_header(
        r,
        "x-codex-primary-reset-at",
        q.primary_reset_at.to_string(),
    );
    reply::set_header(
        r,
        "x-codex-secondary-used-percent",
        q.secondary_pct.to_string(),
    );
    reply::set_header(
        r,
        "x-codex-secondary-window-minutes",
        SECONDARY_WINDOW_MIN.to_string(),
    );
    reply::set_header(
        r,
        "x-codex-secondary-reset-at",
        q.secondary_reset_at.to_string(),
    );
    reply::set_header(r, "x-codex-plan-type", &q.plan_type);
}

/// `GET {prefix}/models`: the catalog with an ETag (and 304 on `If-None-Match`).
fn models(shared: &Shared, parts: &Parts) -> Response<Body> {
    shared.record_in(recorded(shared, parts, Bytes::new(), None), Log::Models);
    if let Some(r) = auth_only(shared, parts) {
        return r;
    }
    let etag = &shared.catalog_etag;
    let mut r = match header(&parts.headers, "if-none-match") {
        Some(inm)
            if inm
                .split(',')
                .any(|t| t.trim().trim_start_matches("W/") == etag) =>
        {
            let mut r = reply::with_body(304, "application/json", Bytes::new());
            r.headers_mut().remove("content-type");
            r
        }
        _ => reply::json(200, Bytes::from_static(MODELS_CATALOG.as_bytes())),
    };
    reply::set_header(&mut r, "etag", etag);
    reply::set_header(&mut r, "x-models-etag", etag.trim_matches('"'));
    r
}

/// Bearer required; under `strict_tokens`, checked against the account when one is named.
fn auth_only(shared: &Shared, parts: &Parts) -> Option<Response<Body>> {
    let Some(token) = bearer(&parts.headers) else {
        return Some(errors::token_invalidated(401));
    };
    account_header(&parts.headers).and_then(|id| check_strict(shared, id, token))
}

/// `GET /backend-api/wham/usage` (docs/protocol.md#quota-signals).
fn usage(shared: &Shared, parts: &Parts) -> Response<Body> {
    if let Some(r) = auth_only(shared, parts) {
        return r;
    }
    let id = account_header(&parts.headers);
    let q = shared.quota(id);
    let (user_id, email, credits) = {
        let inner = shared.lock();
        match id.and_then(|i| inner.accounts.get(i)) {
            Some(st) => (
                st.account.chatgpt_user_id.clone(),
                st.account.email.clone(),
                st.reset_credits,
            ),
            None => {
                let a = MockAccount::new(id.unwrap_or("acct-mock"));
                (a.chatgpt_user_id, a.email, 0)
            }
        }
    };
    let window = |pct: f64, minutes: u64, reset_at: u64| {
        json!({
            "used_percent": pct,
            "limit_window_seconds": minutes * 60,
            "reset_after_seconds": reset_at.saturating_sub(q.now),
            "reset_at": reset_at,
        })
    };
    let reached = q.primary_pct >= 100.0 || q.secondary_pct >= 100.0;
    let body = json!({
        "user_id": user_id,
        "account_id": id.unwrap_or("acct-mock"),
        "email": email,
        "plan_type": q.plan_type,
        "rate_limit": {
            "allowed": !reached,
            "limit_reached": reached,
            "primary_window": window(q.primary_pct, PRIMARY_WINDOW_MIN, q.primary_reset_at),
            "secondary_window": window(q.secondary_pct, SECONDARY_WINDOW_MIN, q.secondary_reset_at),
        },
        "additional_rate_limits": [],
        "credits": {
            "has_credits": false,
            "unlimited": false,
            "balance": "0",
            "overage_limit_reached": false,
        },
        "spend_control": {"reached": false},
        "rate_limit_reset_credits": {"available_count": credits, "applicable_available_count": credits},
    });
    reply::json(200, body.to_string())
}

/// `GET /backend-api/wham/accounts/check`: Codex CLI's workspace routing discovery (docs/protocol.md#chatgpt-mode).
fn accounts_check(shared: &Shared, parts: &Parts) -> Response<Body> {
    let id = account_header(&parts.headers).unwrap_or("acct-mock");
    let body = json!({"accounts": [{
        "id": id,
        "workspace_backend_origin": shared.origin,
        "account_routing_override": "NO_CONSTRAINT",
    }]});
    reply::json(200, body.to_string())
}

fn stats(shared: &Shared) -> Value {
    use std::sync::atomic::Ordering::SeqCst;
    let c = &shared.counters;
    json!({
        "responses": c.responses.load(SeqCst),
        "token_calls": c.token_calls.load(SeqCst),
        "active_streams": c.active_streams.load(SeqCst),
        "completed_streams": c.completed_streams.load(SeqCst),
        "ws_handshakes": c.ws_handshakes.load(SeqCst),
        "ws_rejected_handshakes": c.ws_rejected.load(SeqCst),
        "ws_open": c.ws_open.load(SeqCst),
        "ws_requests": c.ws_requests.load(SeqCst),
        "ws_responses": c.ws_responses.load(SeqCst),
    })
}

/// Clears recordings, counters (except the live `active_streams` and `ws_open`) and
/// `fail_times` uses.
fn reset(shared: &Shared) {
    use std::sync::atomic::Ordering::SeqCst;
    let mut inner = shared.lock();
    inner.requests.clear();
    inner.token_requests.clear();
    inner.models_requests.clear();
    for st in inner.accounts.values_mut() {
        st.behaviour_uses = 0;
    }
    drop(inner);
    shared.counters.responses.store(0, SeqCst);
    shared.counters.token_calls.store(0, SeqCst);
    shared.counters.completed_streams.store(0, SeqCst);
    shared.counters.ws_handshakes.store(0, SeqCst);
    shared.counters.ws_rejected.store(0, SeqCst);
    shared.counters.ws_requests.store(0, SeqCst);
    shared.counters.ws_responses.store(0, SeqCst);
}

fn add_account(shared: &Shared, body: &[u8]) -> Response<Body> {
    let account: MockAccount = if body.iter().all(u8::is_ascii_whitespace) {
        MockAccount::default()
    } else {
        match serde_json::from_slice(body) {
            Ok(a) => a,
            Err(e) => return reply::detail(400, &format!("mock-codex: bad account JSON: {e}")),
        }
    };
    let t: IssuedTokens = oauth::register_account(shared, account);
    match serde_json::to_string(&t) {
        Ok(s) => reply::json(200, s),
        Err(e) => reply::detail(500, &e.to_string()),
    }
}

fn set_behaviour(shared: &Shared, account_id: &str, body: &[u8]) -> Response<Body> {
    let spec = String::from_utf8_lossy(body);
    if spec.trim().is_empty() {
        shared.set_behaviour(account_id, None);
        return reply::json(200, r#"{"ok":true}"#);
    }
    match spec.parse::<Behaviour>() {
        Ok(b) => {
            shared.set_behaviour(account_id, Some(b));
            reply::json(200, r#"{"ok":true}"#)
        }
        Err(e) => reply::detail(400, &format!("mock-codex: {e}")),
    }
}

/// `POST /__mock/ws/refuse-upgrade`: body a status (refuse upgrades with it) or empty (accept).
fn ws_refuse_upgrade(shared: &Shared, body: &[u8]) -> Response<Body> {
    let spec = String::from_utf8_lossy(body);
    let spec = spec.trim();
    let status = if spec.is_empty() {
        0
    } else {
        match spec.parse::<u16>() {
            Ok(s) if (200..=599).contains(&s) => s,
            _ => {
                return reply::detail(
                    400,
                    "mock-codex: expected an HTTP status (200-599) or nothing",
                )
            }
        }
    };
    shared
        .ws_refuse_upgrade
        .store(status, std::sync::atomic::Ordering::SeqCst);
    reply::json(200, r#"{"ok":true}"#)
}

fn set_quota(shared: &Shared, account_id: &str, body: &[u8]) -> Response<Body> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (Some(p), Some(s)) = (
        v.get("primary").and_then(Value::as_f64),
        v.get("secondary").and_then(Value::as_f64),
    ) else {
        return reply::detail(
            400,
            r#"mock-codex: expected {"primary":<pct>,"secondary":<pct>}"#,
        );
    };
    shared.lock().account_mut(account_id, &shared.cfg).quota = Some((p, s));
    reply::json(200, r#"{"ok":true}"#)
}
