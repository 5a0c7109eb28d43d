//! Egress proxies (issue 14) over real sockets: an account assigned to a proxy reaches
//! mock-codex through it (the test proxy counts tunnels and keeps what went through), on every
//! transport (HTTP/1.1 keep-alive, h2c, h2 over TLS); an account without one goes direct; a
//! proxy that refuses our credentials marks itself, never the account, and the request fails
//! over; the sidecar's refresh and quota calls of a proxied account go through the proxy; the
//! admin API's CRUD and "test" action.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use benches::MockConfig;
use gateway::config::PlainHttp;
use integration_tests::{
    egress_proxy::TestProxy, tls_material, ws_client::next_json_event, Stack, StackBuilder,
};
use reqwest::Method;
use serde_json::{json, Value};

fn stack(plain_http: PlainHttp, accounts: usize) -> Stack {
    stack_on(plain_http, accounts, false)
}

fn stack_on(plain_http: PlainHttp, accounts: usize, postgres: bool) -> Stack {
    // fill_first: acct-0 is always tried first.
    StackBuilder {
        accounts,
        postgres,
        workers: 1,
        plain_http,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        ..StackBuilder::default()
    }
    .start()
}

async fn account_id(s: &Stack, chatgpt_account_id: &str) -> i64 {
    let v = s.admin_json("/api/admin/accounts").await;
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["chatgpt_account_id"] == chatgpt_account_id)
        .and_then(|a| a["id"].as_i64())
        .unwrap_or_else(|| panic!("no account {chatgpt_account_id}: {v}"))
}

/// Creates a proxy and assigns `account` to it; returns the proxy's id.
async fn proxy_for(s: &Stack, name: &str, url: &str, account: &str) -> i64 {
    let (st, v) = s
        .admin_call(
            Method::POST,
            "/api/admin/proxies",
            json!({"name": name, "url": url}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let id = v["id"].as_i64().unwrap();
    let acc = account_id(s, account).await;
    let r = s
        .admin_put(&format!("/api/admin/accounts/{acc}/proxy"))
        .json(&json!({"proxy_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    id
}

/// Waits (bounded) until a finished HTTP/1.1 exchange gave its connection back to the pool, so
/// the next request reuses it (the tail is read in a task of its own).
async fn settle(s: &Stack, plain_http: PlainHttp) {
    if plain_http != PlainHttp::H1 {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.metric("codex_gateway_upstream_h1_idle").await < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn ask(s: &Stack, stream: bool) -> (u16, String) {
    ask_with(s, stream, "x").await
}

async fn ask_with(s: &Stack, stream: bool, input: &str) -> (u16, String) {
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model":"gpt-5.5","input":input,"stream":stream}),
        )
        .await;
    let st = r.status().as_u16();
    (st, r.text().await.unwrap())
}

/// `POST /api/admin/proxies/{id}/test`: its JSON answer.
async fn proxy_test(s: &Stack, id: i64) -> Value {
    s.admin_post(&format!("/api/admin/proxies/{id}/test"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn proxies(s: &Stack) -> Value {
    s.admin_get("/api/admin/proxies")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// acct-0 on the proxy: its requests go through it (one tunnel, reused by the keep-alive or
/// h2 pool); acct-1 (direct) never goes through it, even while a proxied connection idles.
async fn proxied_and_direct(plain_http: PlainHttp, scheme: &str) {
    proxied_and_direct_on(plain_http, scheme, false).await;
}

async fn proxied_and_direct_on(plain_http: PlainHttp, scheme: &str, postgres: bool) {
    let p = TestProxy::start(Some(("alice", "s3cret")));
    let s = stack_on(plain_http, 2, postgres);
    proxy_for(
        &s,
        "p1",
        &p.url(scheme, Some(("alice", "s3cret"))),
        "acct-0",
    )
    .await;
    for stream in [true, false, true] {
        let (st, body) = ask_with(&s, stream, "proxied-marker").await;
        assert_eq!(st, 200, "{body}");
        assert!(body.contains("Hello from mock-codex"), "{body}");
        settle(&s, plain_http).await;
    }
    assert_eq!(s.served_by(), vec!["acct-0"; 3]);
    assert_eq!(p.tunnels(), 1, "one tunnel, pooled");
    // (request bodies are plain in h1 and h2c DATA frames alike)
    assert!(
        p.saw("proxied-marker"),
        "acct-0's requests went through the proxy"
    );
    assert_eq!(p.auth_failures(), 0);
    assert!(s.metric("codex_gateway_upstream_proxy_tunnels_total").await >= 1);

    // acct-0 disabled: acct-1 (direct) serves, and nothing more goes through the proxy, although
    // a proxied connection idles in the pool.
    let acc0 = account_id(&s, "acct-0").await;
    let r = s
        .admin_post(&format!("/api/admin/accounts/{acc0}/disable"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for stream in [true, false] {
        let (st, body) = ask_with(&s, stream, "direct-marker").await;
        assert_eq!(st, 200, "{body}");
    }
    assert_eq!(s.served_by()[3..], ["acct-1", "acct-1"]);
    assert!(
        !p.saw("direct-marker"),
        "a direct account never goes through the proxy"
    );
    assert_eq!(p.tunnels(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn h1_through_http_connect() {
    proxied_and_direct(PlainHttp::H1, "http").await;
}

/// The same on PostgreSQL (migration 0007, the sealed password, the assignment).
#[tokio::test(flavor = "multi_thread")]
async fn h1_through_http_connect_on_postgres() {
    proxied_and_direct_on(PlainHttp::H1, "http", true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_through_socks5() {
    proxied_and_direct(PlainHttp::H2c, "socks5").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn h1_through_socks5h() {
    proxied_and_direct(PlainHttp::H1, "socks5h").await;
}

/// The production path: HTTP/2 over TLS (ALPN h2, private CA) through a CONNECT tunnel.
#[tokio::test(flavor = "multi_thread")]
async fn tls_h2_through_http_connect() {
    let dir = tempfile::tempdir().unwrap();
    let tls = tls_material(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = StackBuilder {
        mock: MockConfig {
            tls: Some((tls.cert.clone(), tls.key.clone())),
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            ..MockConfig::default()
        },
        upstream_host: Some(format!("https://localhost:{port}/backend-api/codex")),
        upstream_ca: Some(tls.ca),
        workers: 1,
        ..StackBuilder::default()
    }
    .start();
    let p = TestProxy::start(Some(("u", "p")));
    proxy_for(&s, "tls", &p.url("http", Some(("u", "p"))), "acct-0").await;
    for stream in [true, false] {
        let (st, body) = ask(&s, stream).await;
        assert_eq!(st, 200, "{body}");
    }
    assert_eq!(p.tunnels(), 1);
    let targets = p.stats.targets.lock().unwrap().clone();
    assert_eq!(targets, vec![format!("localhost:{port}")]);
    assert!(
        !p.saw("acct-0"),
        "TLS inside the tunnel: the proxy sees no plaintext"
    );
    let reqs = s.mock.requests();
    assert!(
        reqs.iter().all(|r| r.version == "HTTP/2.0"),
        "h2 through the tunnel"
    );
}

/// Wrong credentials: the proxy marks itself (health failing, metric, breaker), the account
/// stays active and uncooled, and the request is served by the next account.
async fn wrong_credentials(scheme: &str) {
    let p = TestProxy::start(Some(("alice", "right")));
    let s = stack(PlainHttp::H1, 2);
    let id = proxy_for(
        &s,
        "bad",
        &p.url(scheme, Some(("alice", "wrong"))),
        "acct-0",
    )
    .await;
    let (st, body) = ask(&s, true).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        s.served_by(),
        vec!["acct-1"],
        "acct-0 never reached the upstream"
    );
    assert!(p.auth_failures() >= 1);
    assert_eq!(p.tunnels(), 0);
    let a = s.account("acct-0");
    assert_eq!(a.status, "active");
    assert_eq!(
        a.cooling_ms, 0,
        "the account is not cooled for its proxy's fault"
    );
    let a0 = s
        .admin_list("/api/admin/accounts")
        .await
        .into_iter()
        .find(|a| a["chatgpt_account_id"] == "acct-0")
        .unwrap();
    assert_eq!(
        a0["failures"], 0,
        "no failure recorded on the account: {a0}"
    );
    assert_eq!(a0["health"]["consecutive_failures"], 0, "{a0}");
    assert_eq!(a0["health"]["tier"], "healthy", "{a0}");
    let v = proxies(&s).await;
    let pv = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == id)
        .unwrap()
        .clone();
    assert_eq!(pv["health"]["state"], "failing", "{pv}");
    assert!(pv["health"]["failures"].as_u64().unwrap() >= 1, "{pv}");
    assert!(
        pv["health"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("credentials")),
        "{pv}"
    );
    assert!(
        !v.to_string().contains("wrong"),
        "no password in the API: {v}"
    );
    assert!(
        s.metric("codex_gateway_upstream_proxy_failures_total")
            .await
            >= 1
    );
    // While its breaker is open the proxy is not even tried: acct-1 serves at once.
    let before = p.auth_failures();
    let (st, _) = ask(&s, false).await;
    assert_eq!(st, 200);
    assert_eq!(p.auth_failures(), before);
    assert_eq!(s.account("acct-0").cooling_ms, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_credentials_http_mark_the_proxy_not_the_account() {
    wrong_credentials("http").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_credentials_socks5_mark_the_proxy_not_the_account() {
    wrong_credentials("socks5").await;
}

/// A proxy that refuses connections (nothing listens) with a single account: the client gets
/// a 502 in OpenAI's shape, and the account is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn unreachable_proxy_fails_cleanly() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let s = stack(PlainHttp::H1, 1);
    proxy_for(&s, "dead", &format!("http://{addr}"), "acct-0").await;
    let (st, body) = ask(&s, false).await;
    assert_eq!(st, 502, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(s.served_by().is_empty());
    let a = s.account("acct-0");
    assert_eq!((a.status, a.cooling_ms), ("active", 0));
}

/// The sidecar's own upstream calls of a proxied account (token refresh, quota poll) leave
/// through its proxy; the data plane's stay on their own tunnels.
#[tokio::test(flavor = "multi_thread")]
async fn refresh_and_quota_go_through_the_proxy() {
    for scheme in ["http", "socks5h"] {
        let p = TestProxy::start(Some(("u", "p")));
        let s = stack(PlainHttp::H1, 1);
        proxy_for(&s, "side", &p.url(scheme, Some(("u", "p"))), "acct-0").await;
        let acc = account_id(&s, "acct-0").await;
        let calls = s.mock.token_calls();
        let r = s
            .admin_post(&format!("/api/admin/accounts/{acc}/refresh"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.mock.token_calls() == calls && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            s.mock.token_calls(),
            calls + 1,
            "{scheme}: the refresh happened"
        );
        assert!(
            p.forwarded() + p.tunnels() >= 1 && p.saw("refresh_token"),
            "{scheme}: the refresh went through the proxy"
        );
        let r = s
            .admin_post(&format!("/api/admin/accounts/{acc}/quota"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            p.saw("/wham/usage") || p.saw("usage"),
            "{scheme}: quota via the proxy"
        );
        let r = s
            .admin_post("/api/admin/models/refresh")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            p.saw("/models"),
            "{scheme}: the catalog fetch as acct-0 via the proxy"
        );
        let targets = p.stats.targets.lock().unwrap().clone();
        assert!(
            targets
                .iter()
                .all(|t| t.ends_with(&s.mock.addr().port().to_string())),
            "{targets:?}"
        );
    }
}

/// CRUD, assignment rules and the "test" action.
#[tokio::test(flavor = "multi_thread")]
async fn admin_crud_and_test_action() {
    let p = TestProxy::start(Some(("u", "pw-123")));
    let s = stack(PlainHttp::H1, 1);
    // bad input: the client's dialect, a clear message
    s.assert_each_refused(
        Method::POST,
        "/api/admin/proxies",
        &[
            json!({"name":"x","url":"ftp://h:1"}),
            json!({"name":"","url":"http://h:1"}),
            json!({"name":"x","url":"http://h:1","bogus":1}),
        ],
    )
    .await;
    let r = s
        .admin_post("/api/admin/proxies")
        .json(&json!({"name":"good","url": p.url("http", Some(("u","pw-123"))), "pool":"eu"}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let id = v["id"].as_i64().unwrap();
    assert_eq!(v["url"], format!("http://u@{}", p.addr));
    assert_eq!(
        (v["has_password"].as_bool(), v["pool"].as_str()),
        (Some(true), Some("eu"))
    );
    assert!(!v.to_string().contains("pw-123"), "{v}");
    // duplicate name
    let (st, answer) = s
        .admin_call(
            Method::POST,
            "/api/admin/proxies",
            json!({"name":"good","url":"http://h:1"}),
        )
        .await;
    assert_eq!(st, 409, "{answer}");

    // test: reaches the origin through the proxy
    let t = proxy_test(&s, id).await;
    assert_eq!(t["ok"], true, "{t}");
    assert!(t["latency_ms"].as_i64().is_some(), "{t}");
    assert!(p.forwarded() + p.tunnels() >= 1);
    let listed = proxies(&s).await;
    assert_eq!(listed["data"][0]["last_check"]["ok"], true, "{listed}");

    // a wrong password (PATCH keeps the user, replaces the password): test fails, says why
    let (st, answer) = s
        .admin_call(
            Method::PATCH,
            &format!("/api/admin/proxies/{id}"),
            json!({"password":"nope"}),
        )
        .await;
    assert_eq!(st, 200, "{answer}");
    let t = proxy_test(&s, id).await;
    assert_eq!(t["ok"], false, "{t}");
    assert!(t["error"].is_string(), "{t}");
    assert!(!t.to_string().contains("nope"), "{t}");

    // assignment by pool; a proxy in use cannot be deleted
    let acc = account_id(&s, "acct-0").await;
    let (st, answer) = s
        .admin_call(
            Method::PUT,
            &format!("/api/admin/accounts/{acc}/proxy"),
            json!({"pool":"nowhere"}),
        )
        .await;
    assert_eq!(st, 400, "{answer}");
    let r = s
        .admin_post(&format!("/api/admin/proxies/{id}/assign"))
        .json(&json!({"account_ids":[acc]}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["account_ids"], json!([acc]), "{v}");
    assert_eq!(v["serving_account_ids"], json!([acc]), "{v}");
    let r = s
        .admin_req(Method::DELETE, &format!("/api/admin/proxies/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let (st, answer) = s
        .admin_call(
            Method::PUT,
            &format!("/api/admin/accounts/{acc}/proxy"),
            json!({"pool":"eu"}),
        )
        .await;
    assert_eq!(st, 200, "{answer}");
    assert_eq!(
        proxies(&s).await["data"][0]["serving_account_ids"],
        json!([acc])
    );
    // a disabled proxy: its accounts do not go direct, they fail
    let (st, answer) = s
        .admin_call(
            Method::PATCH,
            &format!("/api/admin/proxies/{id}"),
            json!({"enabled": false, "password": "pw-123"}),
        )
        .await;
    assert_eq!(st, 200, "{answer}");
    let (st, body) = ask(&s, false).await;
    assert_eq!(st, 503, "no account can egress: {body}");
    assert!(body.contains("\"error\""), "{body}");
    assert!(s.served_by().is_empty(), "never direct");
    // back to direct, then delete
    let (st, answer) = s
        .admin_call(
            Method::PUT,
            &format!("/api/admin/accounts/{acc}/proxy"),
            json!({}),
        )
        .await;
    assert_eq!(st, 200, "{answer}");
    let (st, _) = ask(&s, false).await;
    assert_eq!(st, 200);
    let r = s
        .admin_req(Method::DELETE, &format!("/api/admin/proxies/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(proxies(&s).await["data"], json!([]));
}

/// The proxy's password is sealed at rest: not in the database file in clear.
#[tokio::test(flavor = "multi_thread")]
async fn password_is_encrypted_at_rest() {
    let s = stack(PlainHttp::H1, 0);
    let (st, answer) = s
        .admin_call(
            Method::POST,
            "/api/admin/proxies",
            json!({"name":"enc","url":"socks5://bob:Very-Secret-77@127.0.0.1:1080"}),
        )
        .await;
    assert_eq!(st, 200, "{answer}");
    let mut found = false;
    for e in std::fs::read_dir(s.dir.path()).unwrap() {
        let path = e.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            found |= bytes.windows(14).any(|w| w == b"Very-Secret-77");
        }
    }
    assert!(!found, "the password is stored in clear");
    let v = proxies(&s).await;
    assert_eq!(v["data"][0]["url"], "socks5://bob@127.0.0.1:1080");
}

/// Client WebSocket turns of a proxied account ride a pooled upstream WebSocket opened through
/// the proxy (one tunnel, one upgrade, both turns on it).
#[tokio::test(flavor = "multi_thread")]
async fn upstream_websocket_through_socks5() {
    use futures_util::SinkExt;
    use integration_tests::ws_client::connect_responses;
    use tokio_tungstenite::tungstenite::Message;

    let p = TestProxy::start(Some(("w", "s")));
    let s = stack(PlainHttp::H1, 1);
    proxy_for(&s, "ws", &p.url("socks5", Some(("w", "s"))), "acct-0").await;
    let (mut ws, _) = connect_responses(&s, &s.key).await;
    for q in ["first", "second"] {
        let create = json!({"type":"response.create","model":"gpt-5.5","input":q,"stream":true});
        ws.send(Message::text(create.to_string())).await.unwrap();
        loop {
            let v = next_json_event(&mut ws).await;
            let ty = v["type"].as_str().unwrap_or_default().to_owned();
            assert!(ty != "error" && ty != "response.failed", "{v}");
            if ty == "response.completed" {
                break;
            }
        }
    }
    assert_eq!(s.mock.ws_handshakes(), 1, "one upstream WebSocket");
    assert_eq!(p.tunnels(), 1, "opened through the proxy");
    assert!(p.saw("Upgrade: websocket") || p.saw("upgrade: websocket"));
}
