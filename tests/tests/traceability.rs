//! Traceability (issue 27), through the running gateway against mock-codex: the gateway
//! request id on every data-plane answer (`x-request-id` on 200 JSON, SSE, 401, 404, 429,
//! 400 in both dialects, a read error, the WebSocket upgrade; Anthropic's body carries it as
//! `request_id`; a WebSocket `error` event carries its turn's), a client's well-formed id
//! kept and a malformed one replaced; the id in the usage record (admin usage API, CSV,
//! search by id, failures list); the access log (one JSON line per request with the promised
//! fields and no secret; rotation at the size bound).

#![allow(clippy::unwrap_used)] // helpers of tests: a panic is the failure report

use std::time::Duration;

use benches::{Behaviour, ErrorKind};
use futures_util::SinkExt;
use integration_tests::{
    admin_api::usage_csv,
    client, http_get,
    wait::wait_for,
    ws_client::{connect_responses, next_json_event},
    Stack, StackBuilder,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// The `x-request-id` of a response; fails when absent or not one of ours or the client's.
fn rid(r: &reqwest::Response) -> String {
    let id = r
        .headers()
        .get("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id on a {} answer", r.status()))
        .to_str()
        .unwrap()
        .to_owned();
    assert!(!id.is_empty() && id.len() <= 128, "{id}");
    id
}

/// A generated id: `req_` and 24 hex digits.
fn is_generated(id: &str) -> bool {
    id.strip_prefix("req_")
        .is_some_and(|h| h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn respond_body() -> Value {
    json!({"model": "gpt-5.5", "input": "hi"})
}

/// Every data-plane answer carries `x-request-id`: 200 JSON, SSE, 401, 404, 429, 400 (bad
/// JSON, OpenAI's shape: the header only), Anthropic's 400 (`request_id` in the body too,
/// the same as the header), a malformed request head, the WebSocket upgrade; every one
/// distinct.
#[tokio::test(flavor = "multi_thread")]
async fn every_answer_carries_a_request_id() {
    let s = StackBuilder::default().start();
    let mut seen = std::collections::HashSet::new();
    let mut check = |id: String| {
        assert!(is_generated(&id), "{id}");
        assert!(seen.insert(id.clone()), "ids are distinct: {id}");
        id
    };
    // 200 JSON.
    let r = s.post_json("/v1/responses", &respond_body()).await;
    assert_eq!(r.status(), 200);
    check(rid(&r));
    r.text().await.unwrap();
    // 200 SSE.
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model": "gpt-5.5", "input": "hi", "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    check(rid(&r));
    assert!(r.text().await.unwrap().contains("response.completed"));
    // 401.
    let r = client()
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth("sk-wrong")
        .json(&respond_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    check(rid(&r));
    // 404.
    let r = http_get(&format!("{}/v1/nothing-here", s.url())).await;
    assert_eq!(r.status(), 404);
    check(rid(&r));
    // 400, bad JSON: OpenAI's body is unchanged (OpenAI sends the id as a header only).
    let r = s
        .post("/v1/responses")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    check(rid(&r));
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v.get("request_id").is_none(), "{v}");
    // 400 on /v1/messages: Anthropic's shape, `request_id` at the top level, as the header.
    let r = s
        .post("/v1/messages")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let id = check(rid(&r));
    // Anthropic's own header name too (its SDKs read `request-id`).
    assert_eq!(r.headers()["request-id"].to_str().unwrap(), id);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["request_id"], id.as_str(), "{v}");
    // 200 on /v1/messages: both headers, the same id.
    let r = s
        .post_json(
            "/v1/messages",
            &json!({"model": "gpt-5.5", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let id = check(rid(&r));
    assert_eq!(r.headers()["request-id"].to_str().unwrap(), id);
    r.text().await.unwrap();
    // 429: a key allowed one request per minute (a third request covers a minute's turn).
    let key = s.create_key("rpm-1", json!({"rpm": 1})).await.key;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = client()
            .post(format!("{}/v1/responses", s.url()))
            .bearer_auth(&key)
            .json(&respond_body())
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        check(rid(&r));
        if r.status() == 429 {
            assert!(r.headers().get("retry-after").is_some());
            break;
        }
        r.text().await.unwrap();
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // A malformed request head (a read error): 400 with an id, then the connection closes.
    let mut sock = tokio::net::TcpStream::connect(s.app.data_addr)
        .await
        .unwrap();
    sock.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut raw)).await;
    let raw = String::from_utf8_lossy(&raw).to_string();
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    let id = raw
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap_or_else(|| panic!("no x-request-id: {raw}"));
    check(id.to_owned());
    // The WebSocket upgrade (101).
    let (_ws, resp) = connect_responses(&s, &s.key).await;
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    check(id);
}

/// A client's well-formed `x-request-id` is kept (header, Anthropic body, usage record); a
/// malformed one (a space, too long) is replaced by a generated one, never echoed.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_id_is_kept_when_well_formed() {
    let s = StackBuilder::default().start();
    let mine = "client-0199a213-81c0:7800.8aa1_x";
    let r = s
        .post("/v1/responses")
        .header("x-request-id", mine)
        .json(&respond_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(rid(&r), mine);
    r.text().await.unwrap();
    let r = s
        .post("/v1/messages")
        .header("x-request-id", mine)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(rid(&r), mine);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["request_id"], mine, "{v}");
    for bad in ["has space".to_owned(), "x".repeat(129), "a/b".to_owned()] {
        let r = s
            .post("/v1/responses")
            .header("x-request-id", bad.as_str())
            .json(&respond_body())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = rid(&r);
        assert!(is_generated(&id), "{bad:?} replaced: {id}");
        r.text().await.unwrap();
    }
}

async fn ws_connect(s: &Stack) -> integration_tests::ws_client::Ws {
    connect_responses(s, &s.key).await.0
}

/// A WebSocket `error` event carries its turn's `request_id`; each turn has its own.
#[tokio::test(flavor = "multi_thread")]
async fn websocket_error_events_carry_the_turns_id() {
    let s = StackBuilder::default().start();
    let mut ws = ws_connect(&s).await;
    let mut ids = Vec::new();
    for model in ["gpt-5.5", "gpt-5.4"] {
        // A turn refused before it goes upstream: `input` must be a string or items.
        ws.send(Message::text(
            json!({"type": "response.create", "model": model, "input": 5}).to_string(),
        ))
        .await
        .unwrap();
        let v = next_json_event(&mut ws).await;
        assert_eq!(v["type"], "error", "{v}");
        let id = v["request_id"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(is_generated(id), "{v}");
        ids.push(id.to_owned());
    }
    assert_ne!(ids[0], ids[1], "each turn its own id");
}

/// The id a client got is in its usage record: the CSV export's `request_id`, the admin
/// API's search by id (every field, the key's name), the failures list; a WebSocket turn's
/// record carries the turn's id; an unknown id finds nothing, a malformed one is a 400.
#[tokio::test(flavor = "multi_thread")]
async fn the_usage_record_carries_the_id_and_the_admin_api_finds_it() {
    let s = StackBuilder::default().start();
    let r = s.post_json("/v1/responses", &respond_body()).await;
    assert_eq!(r.status(), 200);
    let ok_id = rid(&r);
    r.text().await.unwrap();
    // A failed request: the upstream refuses it (400 context_length_exceeded), under a
    // client-chosen id.
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::ContextLengthExceeded).times(1),
    );
    let r = s
        .post("/v1/chat/completions")
        .header("x-request-id", "client-failure-1")
        .json(&json!({"model": "gpt-5.5", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    s.mock.clear_behaviour("acct-0");
    assert_eq!(rid(&r), "client-failure-1");
    // A WebSocket turn.
    let mut ws = ws_connect(&s).await;
    ws.send(Message::text(
        json!({"type": "response.create", "model": "gpt-5.5", "input": "w"}).to_string(),
    ))
    .await
    .unwrap();
    let mut ws_done = false;
    while !ws_done {
        let v = next_json_event(&mut ws).await;
        ws_done = v["type"] == "response.completed";
    }
    drop(ws);
    wait_for("3 usage records", Duration::from_secs(20), || async {
        usage_csv(&s, "").await.len() >= 3
    })
    .await;
    let rows = usage_csv(&s, "").await;
    let ids: Vec<&str> = rows.iter().map(|r| r["request_id"].as_str()).collect();
    assert!(ids.contains(&ok_id.as_str()), "{rows:?}");
    assert!(ids.contains(&"client-failure-1"), "{rows:?}");
    let ws_row = rows
        .iter()
        .find(|r| r["transport"] == "ws")
        .unwrap_or_else(|| panic!("{rows:?}"));
    let ws_id = ws_row["request_id"].clone();
    assert!(is_generated(&ws_id) && ws_id != ok_id, "{ws_id}");
    // Found by id, with every field and the key's name.
    for (id, status) in [
        (ok_id.as_str(), 200),
        ("client-failure-1", 400),
        (ws_id.as_str(), 200),
    ] {
        let v = s
            .admin_json(&format!("/api/admin/usage/records?request_id={id}"))
            .await;
        let data = v["data"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(data.len(), 1, "{v}");
        assert_eq!(data[0]["request_id"], id, "{v}");
        assert_eq!(data[0]["status"], status, "{v}");
        assert_eq!(data[0]["key_name"], "test", "{v}");
    }
    let v = s
        .admin_json("/api/admin/usage/records?request_id=req_unknown")
        .await;
    assert_eq!(v["data"].as_array().map(Vec::len), Some(0), "{v}");
    let r = s
        .admin_get("/api/admin/usage/records?request_id=a%20b")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // The failures list names the failed request's id and class.
    let v = s.admin_json("/api/admin/failures").await;
    let f = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["request_id"] == "client-failure-1")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(f["status"], 400, "{f}");
    assert!(
        f["error_class"].as_str().is_some_and(|c| !c.is_empty()),
        "{f}"
    );
}

/// The non-empty lines of the access log at `path`, parsed.
fn access_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Asserts no secret of the stack (the client key, any account token) is in `text`.
fn no_secret(s: &Stack, text: &str) {
    assert!(!text.contains(&s.key), "the client key leaked");
    for t in &s.accounts {
        for secret in [&t.access_token, &t.refresh_token, &t.id_token] {
            assert!(!text.contains(secret.as_str()), "an account token leaked");
        }
    }
}

/// `[access_log]` on: one JSON line per request (HTTP stream, JSON, a failure, a WebSocket
/// turn) with the request id the client got, the key's name (never the key), route, model,
/// account, status, transport, bytes out, TTFB, duration, failovers, error class; no secret
/// anywhere in the file.
#[tokio::test(flavor = "multi_thread")]
async fn the_access_log_has_one_line_per_request_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("logs/access.log");
    let p = path.clone();
    let s = StackBuilder {
        tweak: Some(Box::new(move |c| c.sidecar.access_log.path = Some(p))),
        ..StackBuilder::default()
    }
    .start();
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model": "gpt-5.5", "input": "hi", "stream": true}),
        )
        .await;
    let sse_id = rid(&r);
    let sse_len = r.bytes().await.unwrap().len() as u64;
    let r = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model": "gpt-5.5", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    let json_id = rid(&r);
    let json_len = r.bytes().await.unwrap().len() as u64;
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::ContextLengthExceeded).times(1),
    );
    let r = s.post_json("/v1/responses", &respond_body()).await;
    assert_eq!(r.status(), 400);
    let failed_id = rid(&r);
    s.mock.clear_behaviour("acct-0");
    let mut ws = ws_connect(&s).await;
    ws.send(Message::text(
        json!({"type": "response.create", "model": "gpt-5.5", "input": "w"}).to_string(),
    ))
    .await
    .unwrap();
    while next_json_event(&mut ws).await["type"] != "response.completed" {}
    drop(ws);
    // Refused before any lifecycle (no usage record): a line each too.
    let r = client()
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth("sk-not-a-key-but-secret-looking")
        .json(&respond_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let unauthorized_id = rid(&r);
    let r = http_get(&format!("{}/nowhere", s.url())).await;
    assert_eq!(r.status(), 404);
    let not_found_id = rid(&r);
    let r = s
        .post("/v1/messages")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let bad_json_id = rid(&r);
    wait_for("7 access-log lines", Duration::from_secs(20), || async {
        access_lines(&path).len() >= 7
    })
    .await;
    let lines = access_lines(&path);
    assert_eq!(lines.len(), 7, "one line per request: {lines:?}");
    let by_id = |id: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id)
            .unwrap_or_else(|| panic!("no line for {id}: {lines:?}"))
            .clone()
    };
    let sse = by_id(&sse_id);
    for field in [
        "ts",
        "request_id",
        "key_name",
        "route",
        "model",
        "account",
        "account_id",
        "status",
        "transport",
        "bytes_out",
        "ttfb_ms",
        "duration_ms",
        "failovers",
        "error_class",
    ] {
        assert!(sse.get(field).is_some(), "{field} missing: {sse}");
    }
    assert_eq!(sse["key_name"], "test", "{sse}");
    assert_eq!(sse["route"], "responses", "{sse}");
    assert_eq!(sse["model"], "gpt-5.5", "{sse}");
    assert_eq!(sse["status"], 200, "{sse}");
    assert_eq!(sse["transport"], "h1", "{sse}");
    assert_eq!(sse["failovers"], 0, "{sse}");
    assert!(sse["error_class"].is_null(), "{sse}");
    assert!(sse["account_id"].as_i64().is_some(), "{sse}");
    assert!(sse["ttfb_ms"].as_u64().is_some(), "{sse}");
    // The body bytes the client read: the SSE chunks' payload, the JSON body.
    assert_eq!(sse["bytes_out"].as_u64(), Some(sse_len), "{sse}");
    let chat = by_id(&json_id);
    assert_eq!(chat["route"], "chat_completions", "{chat}");
    assert_eq!(chat["bytes_out"].as_u64(), Some(json_len), "{chat}");
    let failed = by_id(&failed_id);
    assert_eq!(failed["status"], 400, "{failed}");
    assert!(
        failed["error_class"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{failed}"
    );
    let ws_line = lines
        .iter()
        .find(|l| l["transport"] == "ws")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(
        is_generated(ws_line["request_id"].as_str().unwrap()),
        "{ws_line}"
    );
    let l = by_id(&unauthorized_id);
    assert_eq!(l["status"], 401, "{l}");
    assert_eq!(l["error_class"], "unauthorized", "{l}");
    assert!(l["key_name"].is_null() && l["key_id"].is_null(), "{l}");
    assert_eq!(by_id(&not_found_id)["status"], 404);
    let l = by_id(&bad_json_id);
    assert_eq!(
        (l["status"].as_u64(), l["route"].as_str()),
        (Some(400), Some("messages")),
        "{l}"
    );
    assert_eq!(l["error_class"], "bad_request", "{l}");
    let text = std::fs::read_to_string(&path).unwrap();
    no_secret(&s, &text);
    assert!(
        !text.contains("sk-not-a-key"),
        "a presented key is never logged"
    );
}

/// The file is rotated before it would pass `max_bytes`, `keep` rotated files kept, the
/// oldest deleted; every file holds whole JSON lines.
#[tokio::test(flavor = "multi_thread")]
async fn the_access_log_rotates_at_its_size_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let p = path.clone();
    let s = StackBuilder {
        tweak: Some(Box::new(move |c| {
            c.sidecar.access_log.path = Some(p);
            c.sidecar.access_log.max_bytes = 2_000;
            c.sidecar.access_log.keep = 2;
        })),
        ..StackBuilder::default()
    }
    .start();
    let rotated = |n: u32| dir.path().join(format!("access.log.{n}"));
    let mut sent = 0;
    // Lines are about 450 bytes: four files' worth of requests rotates at least three times.
    while sent < 20 {
        let r = s.post_json("/v1/responses", &respond_body()).await;
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
        sent += 1;
    }
    wait_for("two rotations", Duration::from_secs(20), || async {
        rotated(2).exists() && !access_lines(&path).is_empty()
    })
    .await;
    for p in [path.clone(), rotated(1), rotated(2)] {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len > 0 && len <= 2_000, "{}: {len}", p.display());
        assert!(!access_lines(&p).is_empty());
    }
    assert!(!rotated(3).exists(), "only `keep` rotated files");
    let kept: usize = [path.clone(), rotated(1), rotated(2)]
        .iter()
        .map(|p| access_lines(p).len())
        .sum();
    assert!(kept < 20, "the oldest file was deleted: {kept}");
}
