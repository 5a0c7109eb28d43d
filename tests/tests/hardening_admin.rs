//! The admin side against hostile clients (issue 28), over real sockets against the whole
//! stack: login attempts are reserved before the password is hashed (100 parallel guesses from
//! one source get at most the per-source limit checked), the operator's source keeps logging
//! in while attackers elsewhere fill the overall cap, oversized login bodies and passwords are
//! refused without hashing; admin API tokens have a scope (`read` = GET only) and an expiry
//! (SQLite and PostgreSQL); a non-loopback admin listener checks `Host` (DNS rebinding); the
//! proxy "test" action reaches only the configured upstream origins.
//!
//! Clients pick their source address with `local_address` (any 127/8 address is this host).

// Test helpers fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::{client, client_from, Stack, StackBuilder, ADMIN_TOKEN};
use reqwest::{header, StatusCode};
use serde_json::{json, Value};

const PASSWORD: &str = "correct horse battery staple";

fn stack(postgres: bool) -> Stack {
    StackBuilder {
        postgres,
        admin_password: Some(PASSWORD.into()),
        ..StackBuilder::default()
    }
    .start()
}

/// `POST /api/admin/login` with a raw body: status, `Retry-After` and the JSON answer.
async fn login_raw(
    s: &Stack,
    c: &reqwest::Client,
    body: String,
) -> (StatusCode, Option<u64>, Value) {
    let r = c
        .post(format!("{}/api/admin/login", s.admin_url()))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let st = r.status();
    let wait = r
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (st, wait, r.json().await.unwrap_or(Value::Null))
}

async fn login(s: &Stack, c: &reqwest::Client, password: &str) -> (StatusCode, Option<u64>, Value) {
    login_raw(s, c, json!({ "password": password }).to_string()).await
}

/// The admin API with the stack's static (full-rights) token or another bearer.
async fn call(
    s: &Stack,
    method: &str,
    path: &str,
    bearer: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = client()
        .request(m.clone(), format!("{}{path}", s.admin_url()))
        .bearer_auth(bearer);
    if m != reqwest::Method::GET {
        r = r
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.unwrap_or(json!({})).to_string());
    }
    let resp = r.send().await.unwrap();
    let st = resp.status();
    (st, resp.json().await.unwrap_or(Value::Null))
}

/// Wrong passwords one at a time until the source is refused for the window (a 429 with a
/// `Retry-After` above the 1 s of "every hashing permit busy"); how many were checked.
async fn fail_until_limited(s: &Stack, c: &reqwest::Client) -> u32 {
    let mut failed = 0;
    loop {
        match login(s, c, "wrong").await {
            (StatusCode::UNAUTHORIZED, _, _) => failed += 1,
            (StatusCode::TOO_MANY_REQUESTS, Some(1), _) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            (StatusCode::TOO_MANY_REQUESTS, _, _) => return failed,
            other => panic!("unexpected answer {other:?}"),
        }
        assert!(failed <= 10, "more than the per-source limit checked");
    }
}

/// One test owns every login of this binary: it reads the process-wide count of Argon2 checks
/// (`admin::auth::password_checks`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn login_guesses_are_reserved_bounded_and_never_lock_the_operator_out() {
    let s = stack(false);
    let checks = admin::auth::password_checks;

    // An oversized body: 413 before anything is hashed (the API's other routes take 64 MiB).
    let before = checks();
    let big = json!({ "password": "x".repeat(100 << 10) }).to_string();
    let (st, _, v) = login_raw(&s, &client_from("127.0.0.20"), big).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"]["code"], "payload_too_large", "{v}");
    // A 10 KiB password fits the body but cannot be the password: 400 without hashing.
    let (st, _, v) = login(&s, &client_from("127.0.0.20"), &"y".repeat(10 << 10)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "password_too_long", "{v}");
    assert_eq!(checks(), before, "nothing hashed for either");

    // The operator logs in from 127.0.0.1: that source is now known.
    let op = client_from("127.0.0.1");
    let (st, _, v) = login(&s, &op, PASSWORD).await;
    assert_eq!(st, StatusCode::OK, "{v}");

    // 100 parallel wrong passwords from one source: at most the per-source limit (10) are
    // checked, the rest get 429 with Retry-After at once.
    let before = checks();
    let attacker = client_from("127.0.0.2");
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (c, url) = (attacker.clone(), s.admin_url());
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(format!("{url}/api/admin/login"))
                .json(&json!({ "password": format!("guess-{i}") }))
                .send()
                .await
                .unwrap();
            (r.status(), r.headers().contains_key(header::RETRY_AFTER))
        }));
    }
    let (mut wrong, mut limited) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (StatusCode::UNAUTHORIZED, _) => wrong += 1,
            (StatusCode::TOO_MANY_REQUESTS, true) => limited += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let hashed = checks() - before;
    assert!(wrong <= 10, "{wrong} of 100 parallel guesses were checked");
    assert!(hashed <= 10, "{hashed} Argon2 checks for one source");
    assert_eq!(wrong + limited, 100);
    // Guesses one at a time fill that source's limit exactly (the parallel ones that found
    // every hashing permit busy were given back); then even the right password waits.
    let topped = fail_until_limited(&s, &attacker).await;
    assert_eq!(wrong + topped, 10, "the per-source limit");
    let (st, wait, _) = login(&s, &attacker, PASSWORD).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert!(wait.is_some_and(|w| w > 1 && w <= 300), "{wait:?}");

    // Attackers from more sources fill the overall cap (100 failures in the window)...
    for n in 3..=12 {
        fail_until_limited(&s, &client_from(&format!("127.0.0.{n}"))).await;
    }
    // ... so a source never seen before waits ...
    let (st, _, v) = login(&s, &client_from("127.0.0.13"), PASSWORD).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    // ... but the operator's source, which logged in before, still gets in.
    let (st, _, v) = login(&s, &op, PASSWORD).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(checks() - before <= 101, "every source held to its limit");
}

async fn scopes_and_expiry(s: &Stack) {
    // Bad input: an unknown scope, an expiry in the past.
    let (st, v) = call(
        s,
        "POST",
        "/api/admin/tokens",
        ADMIN_TOKEN,
        Some(json!({"name": "x", "scope": "root"})),
    )
    .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("scope")),
        "{v}"
    );
    let (st, v) = call(
        s,
        "POST",
        "/api/admin/tokens",
        ADMIN_TOKEN,
        Some(json!({"name": "x", "expires_at": 1})),
    )
    .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("expires_at")),
        "{v}"
    );

    // A read token: GETs work, every mutation is 403.
    let (st, v) = call(
        s,
        "POST",
        "/api/admin/tokens",
        ADMIN_TOKEN,
        Some(json!({"name": "dashboard", "scope": "read"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["scope"], "read");
    let read = v["token"].as_str().unwrap().to_owned();
    let read_id = v["id"].as_i64().unwrap();
    for path in [
        "/api/admin/accounts",
        "/api/admin/keys",
        "/api/admin/tokens",
        "/api/admin/dashboard",
    ] {
        let (st, v) = call(s, "GET", path, &read, None).await;
        assert_eq!(st, StatusCode::OK, "{path}: {v}");
    }
    let (_, v) = call(s, "GET", "/api/admin/session", &read, None).await;
    assert_eq!(
        (v["via"].as_str(), v["scope"].as_str()),
        (Some("token"), Some("read")),
        "{v}"
    );
    for (m, path) in [
        ("POST", "/api/admin/keys"),
        ("POST", "/api/admin/tokens"),
        ("PUT", "/api/admin/settings"),
        ("PATCH", "/api/admin/accounts/1"),
        ("DELETE", &format!("/api/admin/tokens/{read_id}") as &str),
    ] {
        let (st, v) = call(s, m, path, &read, Some(json!({"name": "escalate"}))).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{m} {path}: {v}");
        assert_eq!(v["error"]["code"], "insufficient_scope", "{v}");
    }
    let (_, keys) = call(s, "GET", "/api/admin/keys", ADMIN_TOKEN, None).await;
    assert!(
        !keys.to_string().contains("escalate"),
        "nothing was created"
    );

    // The admin CLI creates scoped tokens too.
    let db = s.db.clone();
    let (cli_token, row) = std::thread::spawn(move || {
        admin::cli::admin_tokens_create(&db, "cli-read", "read", None).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(row.scope, "read");
    let (st, _) = call(s, "GET", "/api/admin/accounts", cli_token.expose(), None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = call(
        s,
        "POST",
        "/api/admin/keys",
        cli_token.expose(),
        Some(json!({"name": "y"})),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    // A token that expires: works until then, 401 like an unknown token after.
    let expires = i64::try_from(shared_state::now_ms()).unwrap() + 1_500;
    let (st, v) = call(
        s,
        "POST",
        "/api/admin/tokens",
        ADMIN_TOKEN,
        Some(json!({"name": "short", "expires_at": expires})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["scope"].as_str(), v["expires_at"].as_i64()),
        (Some("admin"), Some(expires))
    );
    let short = v["token"].as_str().unwrap().to_owned();
    let (st, _) = call(s, "GET", "/api/admin/session", &short, None).await;
    assert_eq!(st, StatusCode::OK);
    while i64::try_from(shared_state::now_ms()).unwrap() <= expires + 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (st, v) = call(s, "GET", "/api/admin/session", &short, None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["error"]["code"], "unauthorized");

    // Listings show scope and expiry, never a token.
    let (_, list) = call(s, "GET", "/api/admin/tokens", ADMIN_TOKEN, None).await;
    let text = list.to_string();
    for t in [read.as_str(), cli_token.expose(), short.as_str()] {
        assert!(!text.contains(t), "a token in a listing");
    }
    let by_name = |n: &str| {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name("dashboard")["scope"], "read");
    assert_eq!(by_name("short")["expired"], true);
    assert_eq!(by_name("short")["expires_at"], expires);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_tokens_only_read_and_expired_tokens_are_refused_sqlite() {
    scopes_and_expiry(&stack(false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_tokens_only_read_and_expired_tokens_are_refused_postgres() {
    scopes_and_expiry(&stack(true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_admin_listener_checks_host() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| {
            c.sidecar.admin_listen = "0.0.0.0:0".parse().unwrap();
            c.sidecar.admin_allowed_hosts = vec!["admin.example.com".into()];
        })),
        ..StackBuilder::default()
    }
    .start();
    assert!(s.app.admin_addr.ip().is_unspecified());
    let port = s.app.admin_addr.port();
    let get = |path: &str, host: &str| {
        client()
            .get(format!("http://127.0.0.1:{port}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .header(header::HOST, host)
            .send()
    };
    // A rebound name is refused on the API and on the web app.
    for path in ["/api/admin/accounts", "/"] {
        let r = get(path, "evil.example").await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "forbidden_host");
        let r = get(path, &format!("evil.example:{port}")).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
    }
    // The listener's own address, loopback names and the configured name work.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "admin.example.com".to_owned(),
    ] {
        let r = get("/api/admin/accounts", &host).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_test_reaches_only_the_configured_origins() {
    let s = StackBuilder::default().start();
    let (st, v) = call(
        &s,
        "POST",
        "/api/admin/proxies",
        ADMIN_TOKEN,
        Some(json!({"name": "p", "url": "http://127.0.0.1:9"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let id = v["id"].as_i64().unwrap();
    let path = format!("/api/admin/proxies/{id}/test");
    for body in [
        json!({"target": "http://127.0.0.1:6379/"}),
        json!({"target": "http://169.254.169.254/latest/meta-data/"}),
        json!({"target": "10.0.0.1:22"}),
        json!({"host": "10.0.0.1", "port": 22}),
    ] {
        let (st, v) = call(&s, "POST", &path, ADMIN_TOKEN, Some(body.clone())).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
    }
    // The configured origins are tested (the proxy at port 9 is down: ok false, said why).
    let upstream = format!(
        "{}/",
        s.mock
            .base_url()
            .split('/')
            .take(3)
            .collect::<Vec<_>>()
            .join("/")
    );
    for body in [
        json!({}),
        json!({"target": "upstream"}),
        json!({"target": "oauth"}),
        json!({"target": upstream.clone()}),
    ] {
        let (st, v) = call(&s, "POST", &path, ADMIN_TOKEN, Some(body.clone())).await;
        assert_eq!(st, StatusCode::OK, "{body}: {v}");
        assert_eq!(v["ok"], false, "{v}");
        assert!(
            v["origin"]
                .as_str()
                .unwrap()
                .starts_with("http://127.0.0.1:"),
            "{v}"
        );
    }
}
