//! Admin API calls the integration tests repeat, as methods of [`Stack`] (authenticated with
//! [`crate::ADMIN_TOKEN`]) and a few free helpers.
//!
//! # Key Components
//! - [`Stack::admin_call`]: any admin call with a JSON body, answering (status, JSON).
//! - [`Stack::admin_json`] / [`Stack::admin_list`]: a `GET` and its `data` list.
//! - [`Stack::create_key`], [`Stack::put_settings`], [`Stack::post_each_account`]: the set-up
//!   steps most tests share (each asserts that the gateway accepted it).
//! - [`Stack::assert_each_refused`]: invalid bodies, each refused with 400 and a message.
//! - [`call_as`]: an admin request with a given bearer or session cookie (or neither),
//!   answering status, headers and JSON: the credential tests' call.
//! - [`login`] / [`session_of`]: a password login and the session id it sets.
//! - [`auth_json`]: a Codex CLI `auth.json` for a mock account, to import.
//! - [`usage_csv`]: the usage export parsed into rows.

use std::collections::HashMap;

use benches::IssuedTokens;
use serde_json::{json, Value};

use crate::Stack;

/// A client key the admin API created.
pub struct CreatedKey {
    /// The key's id.
    pub id: i64,
    /// The plain key (shown once).
    pub key: String,
    /// The whole answer of `POST /api/admin/keys`.
    pub body: Value,
}

// === impl Stack ===

impl Stack {
    /// An admin API call; `body` is sent for every method but `GET`. Answers the status and
    /// the JSON body (`Null` when it is not JSON).
    pub async fn admin_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> (u16, Value) {
        let mut r = self.admin_req(method.clone(), path);
        if method != reqwest::Method::GET {
            r = r.body(body.to_string());
        }
        let resp = r.send().await.expect("admin request");
        let st = resp.status().as_u16();
        (st, resp.json().await.unwrap_or(Value::Null))
    }

    /// `GET` on the admin API: the JSON body, whatever the status.
    pub async fn admin_json(&self, path: &str) -> Value {
        self.admin_get(path)
            .send()
            .await
            .expect("admin GET")
            .json()
            .await
            .expect("admin JSON")
    }

    /// `GET` on an admin listing (`/api/admin/keys`, `/api/admin/accounts`, ...): its `data`.
    pub async fn admin_list(&self, path: &str) -> Vec<Value> {
        let v = self.admin_json(path).await;
        v["data"]
            .as_array()
            .unwrap_or_else(|| panic!("{path} lists no data: {v}"))
            .clone()
    }

    /// Creates a client key named `name` with `limits` (an object of the key's fields) through
    /// the admin API; asserts that it was created.
    pub async fn create_key(&self, name: &str, limits: Value) -> CreatedKey {
        let mut body = limits;
        body["name"] = json!(name);
        let (st, v) = self
            .admin_call(reqwest::Method::POST, "/api/admin/keys", body)
            .await;
        assert_eq!(st, 200, "create key {name}: {v}");
        CreatedKey {
            id: v["id"].as_i64().expect("key id"),
            key: v["key"].as_str().expect("plain key").to_owned(),
            body: v,
        }
    }

    /// `PUT /api/admin/settings` with `body`; asserts 200 and returns the effective settings
    /// it answers.
    pub async fn put_settings(&self, body: Value) -> Value {
        let (st, v) = self
            .admin_call(reqwest::Method::PUT, "/api/admin/settings", body)
            .await;
        assert_eq!(st, 200, "{v}");
        v
    }

    /// Sends each of `bad` as the JSON body of `method path`; asserts that each is refused
    /// with 400 and an error that carries a message.
    pub async fn assert_each_refused(&self, method: reqwest::Method, path: &str, bad: &[Value]) {
        for body in bad {
            let r = self
                .admin_req(method.clone(), path)
                .json(body)
                .send()
                .await
                .expect("admin request");
            assert_eq!(r.status(), 400, "{body}");
            let e: Value = r.json().await.expect("error JSON");
            assert!(e["error"]["message"].is_string(), "{e}");
        }
    }

    /// `POST /api/admin/accounts/{id}/{action}` (e.g. `quota`, `enable`) for every account of
    /// the current snapshot (there must be one); asserts each succeeded.
    pub async fn post_each_account(&self, action: &str) {
        let ids = self.account_ids();
        assert!(!ids.is_empty(), "no accounts to {action}");
        for id in ids {
            let r = self
                .admin_post(&format!("/api/admin/accounts/{id}/{action}"))
                .body("{}")
                .send()
                .await
                .expect("account action");
            assert!(r.status().is_success(), "{action} {id}: {}", r.status());
        }
    }
}

/// An admin request with `bearer` (or the session cookie `cookie`, or neither); a JSON body
/// (`{}` when `None`) on every method but `GET`. Answers status, headers and the JSON body
/// (`Null` when it is not JSON).
pub async fn call_as(
    s: &Stack,
    method: reqwest::Method,
    path: &str,
    bearer: Option<&str>,
    cookie: Option<&str>,
    body: Option<Value>,
) -> (reqwest::StatusCode, reqwest::header::HeaderMap, Value) {
    use reqwest::header;
    let mut r = crate::client().request(method.clone(), format!("{}{path}", s.admin_url()));
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    if let Some(c) = cookie {
        r = r.header(header::COOKIE, format!("cg_admin_session={c}"));
    }
    if method != reqwest::Method::GET {
        r = r
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.unwrap_or(json!({})).to_string());
    }
    let resp = r.send().await.expect("admin request");
    let st = resp.status();
    let h = resp.headers().clone();
    let v = resp.json::<Value>().await.unwrap_or(Value::Null);
    (st, h, v)
}

/// `POST /api/admin/login` with `password` and no credential (see [`call_as`]): status,
/// headers (the session's `Set-Cookie`) and JSON body.
pub async fn login(
    s: &Stack,
    password: &str,
) -> (reqwest::StatusCode, reqwest::header::HeaderMap, Value) {
    call_as(
        s,
        reqwest::Method::POST,
        "/api/admin/login",
        None,
        None,
        Some(json!({ "password": password })),
    )
    .await
}

/// The session id a login answer sets (its `Set-Cookie: cg_admin_session=ID; ...`), the
/// `cookie` [`call_as`] takes.
pub fn session_of(h: &reqwest::header::HeaderMap) -> String {
    h.get(reqwest::header::SET_COOKIE)
        .expect("Set-Cookie")
        .to_str()
        .expect("Set-Cookie text")
        .split(';')
        .next()
        .expect("cookie")
        .strip_prefix("cg_admin_session=")
        .expect("the session cookie")
        .to_owned()
}

/// A Codex CLI `auth.json` (ChatGPT login) holding `t`, as an operator would import it.
pub fn auth_json(t: &IssuedTokens) -> String {
    json!({
        "auth_mode": "chatgpt", "OPENAI_API_KEY": null,
        "tokens": {"id_token": t.id_token, "access_token": t.access_token,
                   "refresh_token": t.refresh_token, "account_id": t.account_id},
        "last_refresh": "2026-11-29T00:00:00Z"
    })
    .to_string()
}

/// The usage CSV export (`/api/admin/usage/export.csv{query}`) parsed into rows of
/// `header -> cell` (the tests' cells never hold commas); asserts 200 and `text/csv`.
pub async fn usage_csv(s: &Stack, query: &str) -> Vec<HashMap<String, String>> {
    let r = s
        .admin_get(&format!("/api/admin/usage/export.csv{query}"))
        .send()
        .await
        .expect("export");
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .expect("content-type")
        .starts_with("text/csv"));
    let text = r.text().await.expect("CSV");
    let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
    let head: Vec<String> = lines
        .next()
        .expect("CSV header")
        .split(',')
        .map(str::to_owned)
        .collect();
    lines
        .map(|l| {
            head.iter()
                .cloned()
                .zip(l.split(',').map(str::to_owned))
                .collect()
        })
        .collect()
}
