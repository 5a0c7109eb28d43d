//! The OAuth token endpoint (`POST /oauth/token`, docs/protocol.md#oauth-refresh) and the account
//! registry's token issuing.
//!
//! # Key Components
//! - [`register_account`]: registers an account and issues a first token set.
//! - [`token_endpoint`]: `grant_type=refresh_token` (rotating: the previous refresh token
//!   becomes `refresh_token_reused` forever) and `grant_type=authorization_code` (a new
//!   account; a code `account:<id>` picks the account id). JSON and form bodies are accepted.
//!
//! # Error handling
//! Forced refresh failures come from the account's (or the process's)
//! [`Behaviour`](super::Behaviour)
//! `refresh_error`; unknown refresh tokens get `invalid_grant`.

use std::sync::{atomic::Ordering, Arc};

use http::Response;
use serde_json::{json, Map, Value};

use super::{
    errors::DEACTIVATED,
    jwt,
    reply::{self, Body},
    state::{now_unix, rand_hex, Inner, RefreshEntry, Shared},
    IssuedTokens, MockAccount, MockConfig, RecordedRequest, RefreshError,
};

/// Registers (or re-registers) an account and issues a fresh token set.
pub(crate) fn register_account(shared: &Shared, account: MockAccount) -> IssuedTokens {
    let mut inner = shared.lock();
    let id = account.chatgpt_account_id.clone();
    let st = inner.account_mut(&id, &shared.cfg);
    st.account = account;
    st.registered = true;
    issue(&mut inner, &shared.cfg, &id, true)
}

/// The current tokens of a registered account.
pub(crate) fn current_tokens(shared: &Shared, account_id: &str) -> Option<IssuedTokens> {
    let inner = shared.lock();
    let st = inner.accounts.get(account_id)?;
    Some(IssuedTokens {
        account_id: account_id.to_owned(),
        access_token: st.access_token.clone()?,
        refresh_token: st.refresh_token.clone()?,
        id_token: st.id_token.clone()?,
        expires_in: st.access_exp.saturating_sub(now_unix()),
    })
}

/// Issues a new access + id token; rotates the refresh token when `rotate` (or when the
/// account has none yet).
fn issue(inner: &mut Inner, cfg: &MockConfig, account_id: &str, rotate: bool) -> IssuedTokens {
    let now = now_unix();
    let ttl = cfg.access_token_ttl.as_secs();
    let exp = now + ttl;
    let st = inner.account_mut(account_id, cfg);
    let access = jwt::access_token(&st.account, now, exp, &rand_hex(8));
    let id_token = jwt::id_token(&st.account, now, exp);
    st.access_token = Some(access.clone());
    st.access_exp = exp;
    st.id_token = Some(id_token.clone());
    let mut rotated_away = None;
    let refresh_token = match (&st.refresh_token, rotate) {
        (Some(rt), false) => rt.clone(),
        _ => {
            let rt = format!("rt_mock_{}", rand_hex(24));
            rotated_away = st.refresh_token.replace(rt.clone());
            rt
        }
    };
    if let Some(old) = rotated_away {
        if let Some(e) = inner.refresh_tokens.get_mut(&old) {
            e.rotated = true;
        }
    }
    inner
        .refresh_tokens
        .entry(refresh_token.clone())
        .or_insert_with(|| RefreshEntry {
            account_id: account_id.to_owned(),
            rotated: false,
        });
    IssuedTokens {
        account_id: account_id.to_owned(),
        access_token: access,
        refresh_token,
        id_token,
        expires_in: ttl,
    }
}

/// Decodes a JSON object or a form-encoded body into string parameters.
pub(crate) fn parse_params(content_type: Option<&str>, body: &[u8]) -> Option<Map<String, Value>> {
    let looks_json = content_type.is_some_and(|c| c.contains("json"))
        || body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if looks_json {
        return match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        };
    }
    let s = std::str::from_utf8(body).ok()?;
    let mut m = Map::new();
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(percent_decode(k), Value::String(percent_decode(v)));
    }
    Some(m)
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `POST /oauth/token`.
pub(crate) async fn token_endpoint(
    shared: Arc<Shared>,
    mut rec: RecordedRequest,
) -> Response<Body> {
    shared.counters.token_calls.fetch_add(1, Ordering::SeqCst);
    let params = parse_params(rec.header("content-type"), &rec.body);
    rec.json = params.clone().map(Value::Object);
    shared.record(rec, true);
    // The delay in force when the request arrived.
    let delay = match shared
        .counters
        .token_delay_ms_plus_one
        .load(Ordering::SeqCst)
    {
        0 => shared.cfg.token_delay,
        ms => std::time::Duration::from_millis(ms - 1),
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let Some(params) = params else {
        return invalid_request("The request body could not be parsed.");
    };
    let param = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or("");
    match param("grant_type") {
        "refresh_token" => refresh(&shared, param("refresh_token")),
        "authorization_code" => exchange_code(&shared, param("code")),
        "" => invalid_request("Missing required parameter: grant_type."),
        other => reply::json(
            400,
            json!({"error": "unsupported_grant_type",
                   "error_description": format!("Unsupported grant type: {other}")})
            .to_string(),
        ),
    }
}

fn invalid_request(msg: &str) -> Response<Body> {
    reply::json(
        400,
        json!({"error": "invalid_request", "error_description": msg}).to_string(),
    )
}

fn tokens_json(t: &IssuedTokens, include_refresh: bool) -> Response<Body> {
    let mut v = json!({
        "access_token": t.access_token,
        "id_token": t.id_token,
        "expires_in": t.expires_in,
        "token_type": "Bearer",
        "scope": "openid profile email offline_access",
    });
    if include_refresh {
        v["refresh_token"] = Value::String(t.refresh_token.clone());
    }
    reply::json(200, v.to_string())
}

fn refresh(shared: &Shared, rt: &str) -> Response<Body> {
    let mut inner = shared.lock();
    let Some(entry) = inner.refresh_tokens.get(rt) else {
        return refresh_error(RefreshError::InvalidGrant);
    };
    let account_id = entry.account_id.clone();
    let rotated = entry.rotated;
    let forced = inner
        .take_behaviour(&account_id, |b| b.refresh_error.is_some())
        .and_then(|b| b.refresh_error)
        .or(shared.cfg.default_behaviour.refresh_error);
    if let Some(e) = forced {
        return refresh_error(e);
    }
    if rotated {
        return refresh_error(RefreshError::Reused);
    }
    let rotate = !shared.cfg.omit_rotated_refresh_token;
    let t = issue(&mut inner, &shared.cfg, &account_id, rotate);
    tokens_json(&t, rotate)
}

fn exchange_code(shared: &Shared, code: &str) -> Response<Body> {
    if code.is_empty() {
        return invalid_request("Missing required parameter: code.");
    }
    let mut inner = shared.lock();
    if !inner.used_codes.insert(code.to_owned()) {
        return reply::json(
            400,
            json!({"error": "invalid_grant",
                   "error_description": "The authorization code has already been used."})
            .to_string(),
        );
    }
    let account = match code.strip_prefix("account:") {
        Some(id) if !id.is_empty() => MockAccount::new(id),
        _ => MockAccount::default(),
    }
    .with_plan(shared.cfg.default_plan_type.clone());
    let id = account.chatgpt_account_id.clone();
    let st = inner.account_mut(&id, &shared.cfg);
    st.account = account;
    st.registered = true;
    let t = issue(&mut inner, &shared.cfg, &id, true);
    tokens_json(&t, true)
}

/// The refresh failure bodies (docs/protocol.md#oauth-refresh).
fn refresh_error(e: RefreshError) -> Response<Body> {
    let oauth = |code: &str, message: &str| {
        reply::json(
            401,
            json!({"error": {"message": message, "type": "invalid_request_error", "code": code}})
                .to_string(),
        )
    };
    match e {
        RefreshError::Reused => oauth(
            "refresh_token_reused",
            "Your refresh token has already been used to generate a new access token. Please try signing in again.",
        ),
        RefreshError::Expired => oauth(
            "refresh_token_expired",
            "Your refresh token has expired. Please try signing in again.",
        ),
        RefreshError::Invalidated => oauth(
            "refresh_token_invalidated",
            "Your refresh token has been invalidated. Please try signing in again.",
        ),
        RefreshError::Deactivated => oauth("account_deactivated", DEACTIVATED),
        RefreshError::InvalidGrant => reply::json(
            401,
            json!({"error": "invalid_grant", "error_description": "Invalid refresh token."})
                .to_string(),
        ),
        RefreshError::Internal => reply::openai_error(
            500,
            "An error occurred while processing your request.",
            "server_error",
            Some("internal_error"),
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn form_and_json_params() {
        let m = parse_params(
            Some("application/x-www-form-urlencoded"),
            b"grant_type=refresh_token&refresh_token=rt%2Fa%2Bb&scope=openid+profile",
        )
        .unwrap();
        assert_eq!(m["refresh_token"], "rt/a+b");
        assert_eq!(m["scope"], "openid profile");
        let m = parse_params(None, br#" {"grant_type":"refresh_token"}"#).unwrap();
        assert_eq!(m["grant_type"], "refresh_token");
        assert_eq!(percent_decode("a%zz%4"), "a%zz%4");
    }
}
