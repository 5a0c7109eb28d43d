//! The admin API, closed by default (issue 13), over real sockets against the whole stack:
//! every endpoint refuses anonymous and wrong credentials; login sets an HttpOnly,
//! SameSite=Strict session cookie; failed logins are rate-limited; cross-site, foreign-Host and
//! non-JSON mutations are refused; admin API tokens are shown once and revocable; and each
//! resource (accounts incl. import/export/bulk/OAuth, keys, usage, failures, dashboard, ops,
//! settings) answers what the data plane did.

use std::time::Duration;

use integration_tests::{
    admin_api::{auth_json, login, session_of},
    client, http_get,
    wait::wait_for,
    Stack, StackBuilder, ADMIN_TOKEN,
};
use reqwest::{header, Method, StatusCode};
use serde_json::{json, Value};

const PASSWORD: &str = "correct horse battery staple";

/// Every admin endpoint with a method and a sample path.
const ENDPOINTS: &[(&str, &str)] = &[
    ("POST", "/api/admin/logout"),
    ("GET", "/api/admin/session"),
    ("GET", "/api/admin/tokens"),
    ("POST", "/api/admin/tokens"),
    ("DELETE", "/api/admin/tokens/1"),
    ("GET", "/api/admin/accounts"),
    ("POST", "/api/admin/accounts/bulk"),
    ("POST", "/api/admin/accounts/import"),
    ("POST", "/api/admin/accounts/export"),
    ("POST", "/api/admin/accounts/oauth/start"),
    ("POST", "/api/admin/accounts/oauth/finish"),
    ("GET", "/api/admin/accounts/1"),
    ("PATCH", "/api/admin/accounts/1"),
    ("DELETE", "/api/admin/accounts/1"),
    ("POST", "/api/admin/accounts/1/enable"),
    ("POST", "/api/admin/accounts/1/disable"),
    ("POST", "/api/admin/accounts/1/refresh"),
    ("POST", "/api/admin/accounts/1/quota"),
    ("POST", "/api/admin/accounts/1/reset-health"),
    ("GET", "/api/admin/keys"),
    ("POST", "/api/admin/keys"),
    ("DELETE", "/api/admin/keys/1"),
    ("GET", "/api/admin/usage"),
    ("GET", "/api/admin/usage/series"),
    ("GET", "/api/admin/failures"),
    ("GET", "/api/admin/dashboard"),
    ("GET", "/api/admin/ops"),
    ("GET", "/api/admin/settings"),
    ("PUT", "/api/admin/settings"),
    ("GET", "/api/admin/models"),
    ("POST", "/api/admin/models/refresh"),
    ("GET", "/api/admin/no-such-endpoint"),
];

fn stack() -> Stack {
    StackBuilder {
        accounts: 2,
        admin_password: Some(PASSWORD.into()),
        ..StackBuilder::default()
    }
    .start()
}

/// A request to the admin listener with optional bearer / cookie (`admin_api::call_as`).
async fn call(
    s: &Stack,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    cookie: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, header::HeaderMap, Value) {
    let m = Method::from_bytes(method.as_bytes()).unwrap();
    integration_tests::admin_api::call_as(s, m, path, bearer, cookie, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refuses_anonymous_and_wrong_credentials() {
    let s = stack();
    let (st, h, _) = login(&s, PASSWORD).await;
    assert_eq!(st, 200);
    let good_cookie = session_of(&h);
    let upper = ADMIN_TOKEN.to_uppercase();
    for (m, p) in ENDPOINTS {
        for (bearer, cookie) in [
            (None, None),
            (Some("wrong"), None),
            (
                Some("cgadm-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
                None,
            ),
            (Some(upper.as_str()), None),
            (None, Some("forged-session")),
            // A wrong bearer fails even when a valid session cookie rides along.
            (Some("wrong"), Some(good_cookie.as_str())),
        ] {
            let (st, h, v) = call(&s, m, p, bearer, cookie, None).await;
            assert_eq!(st, 401, "{m} {p} bearer={bearer:?} cookie={cookie:?}: {v}");
            assert_eq!(v["error"]["type"], "authentication_error", "{m} {p}");
            assert_eq!(v["error"]["code"], "unauthorized");
            assert_eq!(h[header::CACHE_CONTROL], "no-store", "{m} {p}");
        }
    }
    // The same endpoints answer (not 401) with each credential.
    for (m, p) in ENDPOINTS.iter().filter(|(m, _)| *m == "GET") {
        let (st, h, _) = call(&s, m, p, Some(ADMIN_TOKEN), None, None).await;
        assert_ne!(st, 401, "{m} {p}");
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        let (st, _, _) = call(&s, m, p, None, Some(&good_cookie), None).await;
        assert_ne!(st, 401, "{m} {p} with the session");
    }
    // healthz stays open (it says up or down, nothing else).
    let r = http_get(&format!("{}/healthz", s.admin_url())).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_session_logout_tokens_and_rate_limit() {
    let s = stack();
    // Wrong password.
    let (st, h, v) = login(&s, "nope").await;
    assert_eq!(st, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_password");
    assert!(h.get(header::SET_COOKIE).is_none());
    // Right password: an HttpOnly, SameSite=Strict session cookie.
    let (st, h, v) = login(&s, PASSWORD).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["via"], "session");
    let raw = h[header::SET_COOKIE].to_str().unwrap().to_owned();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(raw.contains(attr), "{raw}");
    }
    assert!(!raw.contains(PASSWORD));
    let sid = session_of(&h);
    assert!(sid.len() >= 40, "a long random session id");
    let (st, _, v) = call(&s, "GET", "/api/admin/session", None, Some(&sid), None).await;
    assert_eq!((st, v["via"].as_str()), (StatusCode::OK, Some("session")));

    // Admin API tokens: created with the session, shown once, usable, revocable.
    let (st, _, v) = call(
        &s,
        "POST",
        "/api/admin/tokens",
        None,
        Some(&sid),
        Some(json!({"name": "ci"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let token = v["token"].as_str().unwrap().to_owned();
    let token_id = v["id"].as_i64().unwrap();
    assert!(token.starts_with("cgadm-"));
    let (st, _, v) = call(&s, "GET", "/api/admin/session", Some(&token), None, None).await;
    assert_eq!((st, v["via"].as_str()), (StatusCode::OK, Some("token")));
    let (_, _, list) = call(&s, "GET", "/api/admin/tokens", Some(&token), None, None).await;
    assert!(!list.to_string().contains(&token), "shown once");
    assert_eq!(list["data"][0]["name"], "ci");
    let (st, _, _) = call(
        &s,
        "POST",
        "/api/admin/tokens",
        Some(&token),
        None,
        Some(json!({"name": " "})),
    )
    .await;
    assert_eq!(st, 400);
    let (st, _, _) = call(
        &s,
        "DELETE",
        &format!("/api/admin/tokens/{token_id}"),
        None,
        Some(&sid),
        None,
    )
    .await;
    assert_eq!(st, 200);
    let (st, _, _) = call(&s, "GET", "/api/admin/session", Some(&token), None, None).await;
    assert_eq!(st, 401, "a revoked token is refused at once");

    // Logout ends the session.
    let (st, h, _) = call(&s, "POST", "/api/admin/logout", None, Some(&sid), None).await;
    assert_eq!(st, 200);
    assert!(h[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    let (st, _, _) = call(&s, "GET", "/api/admin/session", None, Some(&sid), None).await;
    assert_eq!(st, 401);

    // `admin reset-password` ends every session and the old password stops working.
    let (_, h, _) = login(&s, PASSWORD).await;
    let sid2 = session_of(&h);
    let db = s.db.clone();
    let new_pw = std::thread::spawn(move || admin::cli::admin_reset_password(&db).unwrap())
        .join()
        .unwrap();
    assert_eq!(new_pw.expose().len(), 24);
    let (st, _, _) = call(&s, "GET", "/api/admin/session", None, Some(&sid2), None).await;
    assert_eq!(st, 401, "sessions end with a password reset");
    let (st, _, _) = login(&s, new_pw.expose()).await;
    assert_eq!(st, 200);
    let (st, _, _) = login(&s, PASSWORD).await;
    assert_eq!(st, 401);

    // Rate limit: after 10 failures in the window even the right password gets 429.
    for _ in 0..9 {
        let (st, _, _) = login(&s, "guess").await;
        assert_eq!(st, 401);
    }
    let (st, h, v) = login(&s, new_pw.expose()).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited");
    let wait: u64 = h[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!(wait > 0 && wait <= 300);
    // Bearer tokens are not affected by the login limit.
    let (st, _, _) = call(
        &s,
        "GET",
        "/api/admin/session",
        Some(ADMIN_TOKEN),
        None,
        None,
    )
    .await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_foreign_host_and_non_json_mutations_are_refused() {
    let s = StackBuilder {
        admin_password: Some(PASSWORD.into()),
        tweak: Some(Box::new(|c| {
            c.sidecar.admin_allowed_hosts = vec!["admin.example.com".into()];
        })),
        ..StackBuilder::default()
    }
    .start();
    let (_, h, _) = login(&s, PASSWORD).await;
    let sid = session_of(&h);
    let url = format!("{}/api/admin/keys", s.admin_url());
    let cookie = format!("cg_admin_session={sid}");
    // The probe from the issue: a text/plain POST from a foreign origin.
    let r = client()
        .post(&url)
        .header(header::COOKIE, &cookie)
        .header(header::ORIGIN, "http://evil.example")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(r#"{"name":"pwned"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "forbidden_origin");
    // Same origin but text/plain: 415.
    let r = client()
        .post(&url)
        .header(header::COOKIE, &cookie)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(r#"{"name":"pwned"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    // No content type at all (a form-less fetch): 415; JSON from a foreign origin: 403.
    let r = client()
        .post(&url)
        .header(header::COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = client()
        .post(&url)
        .bearer_auth(ADMIN_TOKEN)
        .header(header::ORIGIN, "http://evil.example")
        .json(&json!({"name": "pwned"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // A browser's cross-site GET.
    let r = client()
        .get(format!("{}/api/admin/accounts", s.admin_url()))
        .header(header::COOKIE, &cookie)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // DNS rebinding: a loopback listener only answers loopback Host names.
    let r = client()
        .get(format!("{}/api/admin/accounts", s.admin_url()))
        .bearer_auth(ADMIN_TOKEN)
        .header(header::HOST, "rebind.evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "forbidden_host");
    // The same request from the same origin works, and nothing was created before it.
    let (_, _, keys) = call(&s, "GET", "/api/admin/keys", Some(ADMIN_TOKEN), None, None).await;
    assert!(!keys.to_string().contains("pwned"));
    let r = client()
        .post(&url)
        .header(header::COOKIE, &cookie)
        .header(header::ORIGIN, s.admin_url())
        .json(&json!({"name": "ok"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Behind a reverse proxy: the configured public name is accepted in Host, with its own
    // https Origin, and a login through TLS gets a Secure cookie.
    let r = client()
        .post(format!("{}/api/admin/login", s.admin_url()))
        .header(header::HOST, "admin.example.com")
        .header(header::ORIGIN, "https://admin.example.com")
        .header("x-forwarded-proto", "https")
        .json(&json!({"password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let set = r.headers()[header::SET_COOKIE].to_str().unwrap().to_owned();
    assert!(set.contains("; Secure"), "{set}");
    let r = client()
        .get(format!("{}/api/admin/session", s.admin_url()))
        .header(header::HOST, "admin.example.com:443")
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .get(format!("{}/api/admin/session", s.admin_url()))
        .header(header::HOST, "admin.example.com.evil.example")
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // The web app is served (public, no secrets) with a strict CSP; unknown paths route to
    // the app, unknown files are 404.
    for path in ["/", "/accounts", "/ops"] {
        let r = http_get(&format!("{}{path}", s.admin_url())).await;
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
        assert_eq!(r.headers()[header::X_FRAME_OPTIONS], "DENY");
        let body = r.text().await.unwrap();
        assert!(
            body.contains("<div id=\"app\">") || body.contains("not built"),
            "{body}"
        );
    }
    let r = http_get(&format!("{}/assets/nope.js", s.admin_url())).await;
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_answer_what_the_data_plane_did() {
    let s = stack();
    let t = Some(ADMIN_TOKEN);

    // Import through the API: an auth.json for a new mock account, and junk.
    let issued = s
        .mock
        .add_account(benches::MockAccount::new("acct-imported"));
    let (st, _, v) = call(
        &s,
        "POST",
        "/api/admin/accounts/import",
        t,
        None,
        Some(json!({"files": [
            {"name": "auth.json", "content": auth_json(&issued)},
            {"name": "junk.txt", "content": "{\"hello\": 1}"},
        ]})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["added"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["skipped"][0]["source"], "junk.txt");
    let (_, _, list) = call(&s, "GET", "/api/admin/accounts", t, None, None).await;
    let accounts = list["data"].as_array().unwrap().clone();
    assert_eq!(accounts.len(), 3);
    assert!(
        !list.to_string().contains(&issued.access_token),
        "no tokens in the list"
    );
    let imported = accounts
        .iter()
        .find(|a| a["chatgpt_account_id"] == "acct-imported")
        .unwrap();
    let imported_id = imported["id"].as_i64().unwrap();
    assert_eq!(imported["schedulable"], true);
    assert_eq!(imported["health"]["tier"], "healthy");
    assert!(
        s.app.snapshot.load().account(imported_id).is_some(),
        "published at once"
    );

    // Key names are bounded and printable.
    for bad in [json!({"name": "x".repeat(129)}), json!({"name": "a\u{0}b"})] {
        let (st, _, e) = call(&s, "POST", "/api/admin/keys", t, None, Some(bad)).await;
        assert_eq!(st, 400, "{e}");
        assert_eq!(e["error"]["param"], "name", "{e}");
    }
    // A key created through the API serves data-plane requests.
    let (_, _, key) = call(
        &s,
        "POST",
        "/api/admin/keys",
        t,
        None,
        Some(json!({"name": "team"})),
    )
    .await;
    let plain = key["key"].as_str().unwrap().to_owned();
    for i in 0..3 {
        let r = client()
            .post(format!("{}/v1/responses", s.url()))
            .bearer_auth(&plain)
            .json(&json!({"model": "gpt-5.5", "input": format!("hi {i}"), "stream": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_for("usage of the new key", Duration::from_secs(15), || async {
        let (_, _, k) = call(&s, "GET", "/api/admin/keys", t, None, None).await;
        k["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["name"] == "team" && k["usage_24h"]["requests"] == 3)
    })
    .await;
    let (st, _, series) = call(
        &s,
        "GET",
        "/api/admin/usage/series?group_by=key&bucket_ms=60000",
        t,
        None,
        None,
    )
    .await;
    assert_eq!(st, 200, "{series}");
    let team = series["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["label"] == "team")
        .unwrap();
    assert_eq!(team["totals"]["requests"], 3);
    assert_eq!(
        team["requests"].as_array().unwrap().len(),
        series["buckets"].as_array().unwrap().len()
    );
    let (st, _, by_model) = call(
        &s,
        "GET",
        "/api/admin/usage/series?group_by=model",
        t,
        None,
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(by_model["series"][0]["id"], "gpt-5.5");
    let (st, _, bad) = call(
        &s,
        "GET",
        "/api/admin/usage/series?group_by=colour",
        t,
        None,
        None,
    )
    .await;
    assert_eq!(
        (st.as_u16(), bad["error"]["param"].as_str()),
        (400, Some("group_by"))
    );

    // Dashboard and ops read the data plane's metrics.
    let (st, _, d) = call(&s, "GET", "/api/admin/dashboard", t, None, None).await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["data_plane"]["reachable"], true, "{d}");
    assert!(d["data_plane"]["requests_total"].as_f64().unwrap() >= 3.0);
    assert_eq!(d["pool"]["accounts"], 3);
    assert_eq!(d["pool"]["schedulable"], 3);
    assert!(d["usage_1h"]["requests"].as_u64().unwrap() >= 3);
    let (st, _, o) = call(&s, "GET", "/api/admin/ops", t, None, None).await;
    assert_eq!(st, 200, "{o}");
    let workers = o["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "one entry per worker: {o}");
    for w in workers {
        assert!(
            ["io_uring", "legacy"].contains(&w["driver"].as_str().unwrap()),
            "{w}"
        );
        assert!(w["metrics"]
            .as_object()
            .unwrap()
            .contains_key("upstream_h2_connections"));
    }
    assert_eq!(o["board"].as_array().unwrap().len(), 3);
    assert_eq!(o["board"][0]["rank"], 1);
    assert_eq!(o["board"][0]["schedulable"], true);
    // The board is the data plane scheduler's own: its order, tier and score per account.
    assert_eq!(o["board_by_scheduler"], true, "{o}");
    for (i, row) in o["board"].as_array().unwrap().iter().enumerate() {
        let sched = &row["scheduler"];
        assert_eq!(sched["account_id"], row["id"], "{row}");
        assert_eq!(sched["position"], i + 1, "every account a candidate: {o}");
        assert!(
            ["healthy", "warm", "risky", "quarantine"].contains(&sched["tier"].as_str().unwrap()),
            "{row}"
        );
        assert!(sched["score"].as_f64().is_some(), "{row}");
        // One owner for the tier: the accounts API shows the scheduler's.
        assert_eq!(row["health"]["tier"], sched["tier"], "{row}");
    }
    // Two 401s on the data plane: the scheduler quarantines the account, and the accounts
    // API, the single account view and the ops board all say so (no rule of their own).
    let live = s
        .app
        .snapshot
        .load()
        .account(imported_id)
        .map(|a| std::sync::Arc::clone(&a.live))
        .unwrap();
    let now = shared_state::now_ms();
    for _ in 0..2 {
        gateway::scheduler::record_failure(&live, gateway::scheduler::FailureKind::Auth, now);
    }
    let path = format!("/api/admin/accounts/{imported_id}");
    let (_, _, one) = call(&s, "GET", &path, t, None, None).await;
    assert_eq!(one["health"]["tier"], "quarantine", "{one}");
    let (_, _, list) = call(&s, "GET", "/api/admin/accounts", t, None, None).await;
    let listed = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == imported_id)
        .cloned()
        .unwrap();
    assert_eq!(listed["health"]["tier"], "quarantine", "{listed}");
    let (_, _, o) = call(&s, "GET", "/api/admin/ops", t, None, None).await;
    let row = o["board"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == imported_id)
        .cloned()
        .unwrap();
    assert_eq!(row["scheduler"]["tier"], "quarantine", "{row}");
    assert_eq!(row["health"]["tier"], "quarantine", "{row}");
    // Reset health: healthy again, for every view.
    let (st, _, v) = call(&s, "POST", &format!("{path}/reset-health"), t, None, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["health"]["tier"], "healthy", "{v}");

    // Bulk disable: the data plane stops using those accounts.
    let others: Vec<i64> = accounts
        .iter()
        .map(|a| a["id"].as_i64().unwrap())
        .filter(|id| *id != imported_id)
        .collect();
    let (st, _, v) = call(
        &s,
        "POST",
        "/api/admin/accounts/bulk",
        t,
        None,
        Some(json!({"ids": others, "action": "disable"})),
    )
    .await;
    assert_eq!(
        (st.as_u16(), v["succeeded"].as_u64()),
        (200, Some(2)),
        "{v}"
    );
    let before = s.served_by().len();
    for i in 0..4 {
        let r = client()
            .post(format!("{}/v1/responses", s.url()))
            .bearer_auth(&plain)
            .json(&json!({"model": "gpt-5.5", "input": format!("only {i}"), "stream": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let served = s.served_by();
    assert!(
        served[before..].iter().all(|a| a == "acct-imported"),
        "{served:?}"
    );
    let (_, _, v) = call(
        &s,
        "POST",
        "/api/admin/accounts/bulk",
        t,
        None,
        Some(json!({"ids": [others[0], 999_999], "action": "enable"})),
    )
    .await;
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(1), Some(1))
    );
    let (st, _, _) = call(
        &s,
        "POST",
        "/api/admin/accounts/bulk",
        t,
        None,
        Some(json!({"ids": [1], "action": "explode"})),
    )
    .await;
    assert_eq!(st, 400);
    let (st, _, v) = call(
        &s,
        "POST",
        &format!("/api/admin/accounts/{imported_id}/reset-health"),
        t,
        None,
        None,
    )
    .await;
    assert_eq!(
        (st.as_u16(), v["health"]["consecutive_failures"].as_u64()),
        (200, Some(0))
    );

    // Export gives auth.json documents that import reads back (an update, not a new account).
    let (st, _, exp) = call(
        &s,
        "POST",
        "/api/admin/accounts/export",
        t,
        None,
        Some(json!({"ids": [imported_id]})),
    )
    .await;
    assert_eq!(st, 200);
    let docs = exp["data"].as_array().unwrap();
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["tokens"]["account_id"], "acct-imported");
    assert!(!docs[0]["tokens"]["refresh_token"]
        .as_str()
        .unwrap()
        .is_empty());
    let (_, _, v) = call(
        &s,
        "POST",
        "/api/admin/accounts/import",
        t,
        None,
        Some(json!({"files": [
            {"name": "export.json", "content": exp["data"].to_string()}
        ]})),
    )
    .await;
    assert_eq!(
        (
            v["added"].as_array().unwrap().len(),
            v["updated"].as_array().unwrap().len()
        ),
        (0, 1),
        "{v}"
    );

    // OAuth (PKCE): start gives the authorize URL; the pasted callback URL adds the account.
    let (st, _, start) = call(&s, "POST", "/api/admin/accounts/oauth/start", t, None, None).await;
    assert_eq!(st, 200);
    let au = start["authorize_url"].as_str().unwrap();
    assert!(
        au.contains("/oauth/authorize?response_type=code&client_id=app_EMoamEEZ73f0CkXaXp7hrann"),
        "{au}"
    );
    assert!(
        au.contains("code_challenge_method=S256")
            && au.contains("redirect_uri=http%3A%2F%2Flocalhost%3A1455%2Fauth%2Fcallback")
    );
    let state = start["state"].as_str().unwrap();
    let cb = format!(
        "http://localhost:1455/auth/callback?code=account%3Aacct-oauth&scope=openid&state={state}"
    );
    let (st, _, v) = call(
        &s,
        "POST",
        "/api/admin/accounts/oauth/finish",
        t,
        None,
        Some(json!({"callback_url": cb})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["added"].as_array().unwrap().len(), 1, "{v}");
    let (st, _, v) = call(
        &s,
        "POST",
        "/api/admin/accounts/oauth/finish",
        t,
        None,
        Some(json!({"callback_url": cb})),
    )
    .await;
    assert_eq!(
        (st.as_u16(), v["error"]["param"].as_str()),
        (400, Some("callback_url")),
        "a state is single-use"
    );
    assert!(s
        .app
        .snapshot
        .load()
        .accounts
        .iter()
        .any(|a| a.chatgpt_account_id == "acct-oauth"));

    // Settings: every invalid key is reported; nothing is applied.
    let (st, _, v) = call(
        &s,
        "PUT",
        "/api/admin/settings",
        t,
        None,
        Some(json!({"max_attempts": 0, "strategy": "weighted", "min_request_interval_ms": 5})),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    let errs = v["error"]["errors"].as_object().unwrap();
    assert!(
        errs.contains_key("max_attempts") && errs.contains_key("strategy") && errs.len() == 2,
        "{v}"
    );
    assert_eq!(s.app.snapshot.load().settings.min_request_interval_ms, 0);
    let (st, _, v) = call(
        &s,
        "PUT",
        "/api/admin/settings",
        t,
        None,
        Some(json!({"strategy": "round_robin"})),
    )
    .await;
    assert_eq!(
        (st.as_u16(), v["strategy"].as_str()),
        (200, Some("round_robin"))
    );
    assert_eq!(
        s.app.snapshot.load().settings.strategy.as_str(),
        "round_robin"
    );

    // Failures: a request for a model the upstream refuses shows up, newest first.
    let r = client()
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(&plain)
        .json(&json!({"model": "gpt-5.5", "input": "x", "stream": false, "client_metadata": {"x-mock-error": "unsupported_parameter", "x-mock-param": "bogus_param"}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
    wait_for(
        "the failure to be recorded",
        Duration::from_secs(15),
        || async {
            let (_, _, f) = call(&s, "GET", "/api/admin/failures?limit=5", t, None, None).await;
            f["data"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x["key_name"] == "team"))
        },
    )
    .await;

    // Delete.
    let (st, _, v) = call(
        &s,
        "DELETE",
        &format!("/api/admin/accounts/{imported_id}"),
        t,
        None,
        None,
    )
    .await;
    assert_eq!((st.as_u16(), v["deleted"].as_bool()), (200, Some(true)));
    let (st, _, _) = call(
        &s,
        "GET",
        &format!("/api/admin/accounts/{imported_id}"),
        t,
        None,
        None,
    )
    .await;
    assert_eq!(st, 404);
}
