//! Front-door limits (issue 27) through the running gateway against mock-codex, on both
//! drivers: the instance's request rate refuses the excess with 429 and `Retry-After` in the
//! client's dialect (OpenAI's on `/v1/responses`, the ChatGPT-mode route and the WebSocket
//! handshake, Anthropic's on `/v1/messages`); the per-IP rate refuses one source address
//! while another (the client socket bound to 127.0.0.2: all of 127/8 is loopback on Linux)
//! is still served; the allow-list refuses an address not on it (403, on a kept-alive
//! connection and on a new one) and serves one on it; `/healthz` and `/metrics` are never
//! limited; every change goes through `PUT /api/admin/settings` and applies to the next
//! request (no restart); `/metrics` counts each refusal by reason.
//!
//! No assertion depends on speed: a rate of 1 per second with a burst of 1 and requests sent
//! back to back until one is refused (at least one must be, well within the 1 s window of
//! any one admitted request), never an exact count of admitted requests.

// Test helpers fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use integration_tests::{
    client_from,
    raw::{closed, read_response, ws_connect},
    Stack, StackBuilder,
};
use serde_json::{json, Value};

/// Most requests sent back to back while waiting for the first refusal.
const TRIES: usize = 30;

fn stack(legacy: bool) -> Stack {
    StackBuilder {
        legacy,
        ..StackBuilder::default()
    }
    .start()
}

/// One answer: status, headers, body (JSON when it parses).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn send(r: reqwest::RequestBuilder) -> Answer {
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        status,
        headers,
        body,
    }
}

/// A POST of `body` to `path` from `c` with the stack's key (OpenAI's and Anthropic's key
/// headers both).
fn post(c: &reqwest::Client, s: &Stack, path: &str, body: &Value) -> reqwest::RequestBuilder {
    c.post(format!("{}{path}", s.url()))
        .bearer_auth(&s.key)
        .header("x-api-key", &s.key)
        .header("anthropic-version", "2023-06-01")
        .json(body)
}

fn responses_body() -> Value {
    json!({"model": "gpt-5.5", "input": "hi"})
}

fn messages_body() -> Value {
    json!({"model": "gpt-5.5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

/// Sends requests back to back until one is refused with `status`; returns it.
async fn until_refused(
    c: &reqwest::Client,
    s: &Stack,
    path: &str,
    body: &Value,
    status: u16,
) -> Answer {
    for _ in 0..TRIES {
        let a = send(post(c, s, path, body)).await;
        if a.status == status {
            return a;
        }
    }
    panic!("{path}: no {status} in {TRIES} back-to-back requests");
}

/// `Retry-After` in whole seconds, at least 1.
fn retry_after(h: &reqwest::header::HeaderMap) -> u64 {
    let v: u64 = h
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .unwrap()
        .parse()
        .expect("whole seconds");
    assert!(v >= 1, "{v}");
    v
}

/// OpenAI's error shape with this code and type.
fn assert_openai(a: &Answer, code: &str, ty: &str) {
    assert_eq!(a.body["error"]["code"], code, "{}", a.body);
    assert_eq!(a.body["error"]["type"], ty, "{}", a.body);
    assert!(a.body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(
        a.body.get("type").is_none(),
        "not Anthropic's shape: {}",
        a.body
    );
    assert!(a.headers.contains_key("x-request-id"));
}

/// Anthropic's error shape with this type, and its request id header.
fn assert_anthropic(a: &Answer, ty: &str) {
    assert_eq!(a.body["type"], "error", "{}", a.body);
    assert_eq!(a.body["error"]["type"], ty, "{}", a.body);
    assert!(a.body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(a.headers.contains_key("x-request-id"));
    assert!(a.headers.contains_key("request-id"));
}

/// `codex_gateway_front_door_refused_total{reason="..."}` from the data plane's `/metrics`.
async fn refused(s: &Stack, reason: &str) -> u64 {
    let text = s.metrics_text().await;
    let prefix = format!("codex_gateway_front_door_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{prefix} missing from /metrics"))
        .trim()
        .parse()
        .unwrap()
}

async fn healthz_ok(c: &reqwest::Client, s: &Stack) {
    for _ in 0..5 {
        let r = c.get(format!("{}/healthz", s.url())).send().await.unwrap();
        assert_eq!(r.status(), 200, "/healthz is never limited");
    }
}

/// The instance's rate, set hot: the excess is refused in each dialect (OpenAI's on
/// `/v1/responses`, the ChatGPT-mode route and the WebSocket handshake; Anthropic's on
/// `/v1/messages`), `/healthz` is served throughout, `/metrics` counts every refusal, and
/// turning it off serves the next request.
#[tokio::test(flavor = "multi_thread")]
async fn global_rate_refuses_the_excess_in_the_clients_dialect() {
    for legacy in [false, true] {
        let s = stack(legacy);
        let c = integration_tests::client();
        // Off by default: back-to-back requests are all served.
        for _ in 0..5 {
            let a = send(post(&c, &s, "/v1/responses", &responses_body())).await;
            assert_eq!(a.status, 200, "{}", a.body);
        }
        assert_eq!(refused(&s, "global").await, 0);
        let v = s
            .put_settings(json!({"front_door_rps": 1, "front_door_burst": 1}))
            .await;
        assert_eq!(
            (v["front_door_rps"].as_u64(), v["front_door_burst"].as_u64()),
            (Some(1), Some(1))
        );

        let a = until_refused(&c, &s, "/v1/responses", &responses_body(), 429).await;
        assert_openai(&a, "rate_limit_exceeded", "requests");
        retry_after(&a.headers);
        healthz_ok(&c, &s).await;

        let a = until_refused(&c, &s, "/v1/messages", &messages_body(), 429).await;
        assert_anthropic(&a, "rate_limit_error");
        retry_after(&a.headers);

        let a = until_refused(
            &c,
            &s,
            "/backend-api/codex/responses",
            &json!({"model": "gpt-5.5", "input": "hi", "stream": true, "store": false}),
            429,
        )
        .await;
        assert_openai(&a, "rate_limit_exceeded", "requests");

        // The WebSocket handshake: refused with 429 before the upgrade.
        let mut ws_refusal = None;
        for _ in 0..TRIES {
            if let Err(r) = ws_connect(&s, None) {
                ws_refusal = Some(r);
                break;
            }
        }
        let (status, head, body) = ws_refusal.expect("a refused handshake");
        assert_eq!(status, 429, "{head}");
        assert!(head.contains("retry-after: "), "{head}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");

        // Four refusals seen, at least; every one counted.
        let n = refused(&s, "global").await;
        assert!(n >= 4, "{n}");
        assert_eq!(refused(&s, "per_ip").await, 0);

        // Off again: the next request is served (after the refused one's second at most).
        s.put_settings(json!({"front_door_rps": 0})).await;
        let a = send(post(&c, &s, "/v1/responses", &responses_body())).await;
        assert_eq!(a.status, 200, "legacy={legacy}: {}", a.body);
    }
}

/// The per-IP rate refuses the address over it while another address is served.
#[tokio::test(flavor = "multi_thread")]
async fn per_ip_rate_refuses_one_address_and_serves_another() {
    for legacy in [false, true] {
        let s = stack(legacy);
        s.put_settings(json!({"per_ip_rps": 1, "per_ip_burst": 1}))
            .await;
        let a1 = client_from("127.0.0.1");
        let a = until_refused(
            &a1,
            &s,
            "/v1/chat/completions",
            &json!({"model": "gpt-5.5", "messages": [{"role": "user", "content": "hi"}]}),
            429,
        )
        .await;
        assert_openai(&a, "rate_limit_exceeded", "requests");
        retry_after(&a.headers);
        let a = until_refused(&a1, &s, "/v1/messages", &messages_body(), 429).await;
        assert_anthropic(&a, "rate_limit_error");
        // Other addresses have their own cells. (Two addresses may share one of the
        // fixed table's cells, keyed at random per instance: then both are limited
        // together. Three fresh addresses all sharing 127.0.0.1's cell cannot happen in
        // practice.)
        let mut served = 0;
        for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
            let a = send(post(
                &client_from(ip),
                &s,
                "/v1/responses",
                &responses_body(),
            ))
            .await;
            assert!(
                a.status == 200 || a.status == 429,
                "{ip}: {} {}",
                a.status,
                a.body
            );
            served += usize::from(a.status == 200);
        }
        assert!(served >= 1, "another address is served");
        assert!(refused(&s, "per_ip").await >= 2);
        assert_eq!(refused(&s, "global").await, 0);
        s.put_settings(json!({"per_ip_rps": 0})).await;
        let a = send(post(&a1, &s, "/v1/responses", &responses_body())).await;
        assert_eq!(a.status, 200, "legacy={legacy}: {}", a.body);
    }
}

/// A raw request from `from` on a new connection: (status, head, body), and whether the
/// server then closed the connection.
fn raw_post(s: &Stack, from: &str, path: &str, body: &Value) -> (u16, String, Vec<u8>, bool) {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    sock.bind(&local.into()).unwrap();
    sock.connect(&s.app.data_addr.into()).unwrap();
    let mut c: TcpStream = sock.into();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        s.key,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    let (status, head, body) = read_response(&mut c);
    let closed = closed(&mut c);
    (status, head, body, closed)
}

/// The allow-list, set and cleared hot: an address not on it is refused with 403 in its
/// route's dialect (on a connection kept alive from before the change, and on a new one,
/// which is closed), one on it is served, `/healthz` and `/metrics` stay open, an invalid
/// list is refused at apply time naming the entry, and clearing it serves everyone again.
#[tokio::test(flavor = "multi_thread")]
async fn allow_list_refuses_unlisted_addresses_and_serves_listed_ones() {
    for legacy in [false, true] {
        let s = stack(legacy);
        let outside = client_from("127.0.0.1");
        let inside = client_from("127.0.0.2");
        // A kept-alive connection from before the change.
        let a = send(post(&outside, &s, "/v1/responses", &responses_body())).await;
        assert_eq!(a.status, 200);

        // An invalid list is refused whole, naming the entry; nothing changes.
        let (status, v) = s
            .admin_call(
                reqwest::Method::PUT,
                "/api/admin/settings",
                json!({"ip_allow_list": "127.0.0.2, 10.0.0.300"}),
            )
            .await;
        assert_eq!(status, 400, "{v}");
        assert!(v.to_string().contains("10.0.0.300"), "{v}");
        let a = send(post(&outside, &s, "/v1/responses", &responses_body())).await;
        assert_eq!(a.status, 200);

        let v = s
            .put_settings(json!({"ip_allow_list": ["127.0.0.2", "10.0.0.0/8", "::1"]}))
            .await;
        assert_eq!(v["ip_allow_list"], "127.0.0.2, 10.0.0.0/8, ::1");

        let a = send(post(&outside, &s, "/v1/responses", &responses_body())).await;
        assert_eq!(a.status, 403, "{}", a.body);
        assert_openai(&a, "ip_not_allowed", "request_forbidden");
        assert!(a.headers.get("retry-after").is_none());
        let a = send(post(&outside, &s, "/v1/messages", &messages_body())).await;
        assert_eq!(a.status, 403, "{}", a.body);
        assert_anthropic(&a, "permission_error");
        // A new connection from outside: answered, then closed.
        let (status, head, body, was_closed) =
            raw_post(&s, "127.0.0.1", "/v1/chat/completions", &responses_body());
        assert_eq!(status, 403, "{head}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "ip_not_allowed");
        assert!(head.contains("x-request-id: "), "{head}");
        assert!(was_closed, "the unlisted connection is closed");
        // Probes and scrapers are not limited.
        healthz_ok(&outside, &s).await;
        assert!(refused(&s, "not_allowed").await >= 3);

        // A listed address is served (a new connection, then the kept one).
        for _ in 0..2 {
            let a = send(post(&inside, &s, "/v1/responses", &responses_body())).await;
            assert_eq!(a.status, 200, "{}", a.body);
        }

        // Cleared: everyone again, from the next request.
        let v = s.put_settings(json!({"ip_allow_list": ""})).await;
        assert_eq!(v["ip_allow_list"], "");
        let a = send(post(&outside, &s, "/v1/responses", &responses_body())).await;
        assert_eq!(a.status, 200, "legacy={legacy}: {}", a.body);
        assert_eq!(refused(&s, "global").await, 0);
    }
}

/// Defaults from the configuration (the file's `[front_door]` lands in the sidecar's settings) are in
/// force from the start, and the admin API shows them as the defaults.
#[tokio::test(flavor = "multi_thread")]
async fn configured_defaults_apply_from_the_start() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
            c.sidecar.settings.ip_allow_list = "127.0.0.2".parse().unwrap();
        })),
        ..StackBuilder::default()
    }
    .start();
    let a = send(post(
        &client_from("127.0.0.1"),
        &s,
        "/v1/responses",
        &responses_body(),
    ))
    .await;
    assert_eq!(a.status, 403, "{}", a.body);
    let a = send(post(
        &client_from("127.0.0.2"),
        &s,
        "/v1/responses",
        &responses_body(),
    ))
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let v: Value = s
        .admin_get("/api/admin/settings")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["defaults"]["ip_allow_list"], "127.0.0.2", "{v}");
    assert_eq!(v["ip_allow_list"], "127.0.0.2", "{v}");
}
