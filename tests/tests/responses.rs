//! `/v1/responses` end to end: the gateway in-process in front of mock-codex over real sockets.

use std::time::{Duration, Instant};

use benches::{Behaviour, ErrorKind};
use futures_util::StreamExt;
use gateway::config::PlainHttp;
use integration_tests::{client, http_get, parse_sse, streaming_mock, Stack, StackBuilder};
use serde_json::{json, Value};

fn stack() -> Stack {
    StackBuilder::default().start()
}

#[tokio::test(flavor = "multi_thread")]
async fn json_response_is_the_completed_object() {
    let s = stack();
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model":"gpt-5.5","input":"say hi"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().get("x-codex-primary-used-percent").is_none(),
        "quota headers are stripped"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-5.5");
    let text = v["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Hello from mock-codex"), "{text}");
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn json_response_rebuilds_empty_completed_output() {
    let s = stack();
    let r = s.post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"x","client_metadata":{"x-mock-empty-completed-output":"1"}})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["output"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["output"][0]["type"], "message");
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_stream_forwards_the_full_event_sequence() {
    let s = stack();
    let r = s
        .post("/v1/responses")
        .header("accept", "application/json") // the OpenAI SDK never asks for text/event-stream
        .json(&json!({"model":"gpt-5.5","input":"say hi","stream":true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert!(
        r.headers().get("x-codex-turn-state").is_some(),
        "turn state stays visible"
    );
    assert!(r.headers().get("x-codex-primary-used-percent").is_none());
    let body = r.text().await.unwrap();
    let evs: Vec<String> = parse_sse(&body).into_iter().map(|(e, _)| e).collect();
    assert_eq!(evs.first().map(String::as_str), Some("response.created"));
    assert_eq!(evs.last().map(String::as_str), Some("response.completed"));
    for needed in [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.done",
    ] {
        assert!(
            evs.iter().any(|e| e == needed),
            "missing {needed} in {evs:?}"
        );
    }
    let added = evs
        .iter()
        .position(|e| e == "response.output_item.added")
        .unwrap();
    let delta = evs
        .iter()
        .position(|e| e == "response.output_text.delta")
        .unwrap();
    assert!(added < delta);
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_arrives_incrementally() {
    let s = StackBuilder {
        mock: streaming_mock(5, Duration::from_millis(200)),
        ..StackBuilder::default()
    }
    .start();
    let start = Instant::now();
    let r = s.post_responses_x(true).await;
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    let mut first_delta = None;
    while let Some(chunk) = stream.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if first_delta.is_none() && seen.contains("response.output_text.delta") {
            first_delta = Some(start.elapsed());
        }
    }
    let total = start.elapsed();
    let first = first_delta.expect("a delta");
    // 13 events 200 ms apart: the stream takes > 2 s; the first delta is due after ~1 s.
    assert!(total >= Duration::from_millis(2000), "total {total:?}");
    assert!(
        total - first >= Duration::from_millis(1000),
        "first delta at {first:?}, end at {total:?}: events were batched"
    );
    assert!(seen.contains("response.completed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_is_required_and_the_key_never_goes_upstream() {
    let s = stack();
    let c = client();
    let url = format!("{}/v1/responses", s.url());
    let r = c
        .post(&url)
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "missing_api_key");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = c
        .post(&url)
        .bearer_auth("sk-cg-wrong")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(
        s.mock.responses_requests(),
        0,
        "rejected requests never reach the upstream"
    );
    let r = c
        .post(&url)
        .header("x-api-key", &s.key)
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let req = s.mock.requests().pop().unwrap();
    let auth = req.header("authorization").unwrap().to_owned();
    assert!(!auth.contains(&s.key));
    assert_eq!(auth, format!("Bearer {}", s.accounts[0].access_token));
    assert!(req.header("x-api-key").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn body_is_normalized_and_identity_rewritten() {
    let s = stack();
    let r = s.post("/v1/responses")
        .header("session-id", "sess-1")
        .header("thread-id", "thr-1")
        .header("x-codex-turn-metadata", "{\"turn_id\":\"t\"}")
        .header("originator", "evil-client")
        .header("chatgpt-account-id", "spoofed")
        .json(&json!({
            "model":"gpt-5.5","input":[{"type":"message","role":"system","content":"sys"},{"type":"message","role":"user","content":"hi"}],
            "temperature":0.5,"max_output_tokens":10,"store":true,"metadata":{"a":"b"},"service_tier":"fast"
        }))
        .send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let req = s.mock.requests().pop().unwrap();
    let b: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(b["stream"], true);
    assert_eq!(b["store"], false);
    assert_eq!(b["instructions"], "");
    assert_eq!(b["service_tier"], "priority");
    assert_eq!(b["input"][0]["role"], "developer");
    for dropped in ["temperature", "max_output_tokens", "metadata"] {
        assert!(b.get(dropped).is_none(), "{dropped} must be dropped");
    }
    assert_eq!(req.header("chatgpt-account-id"), Some("acct-0"));
    assert_eq!(req.header("originator"), Some("codex_cli_rs"));
    assert_eq!(req.header("session-id"), Some("sess-1"));
    assert_eq!(req.header("thread-id"), Some("thr-1"));
    assert_eq!(
        req.header("x-codex-turn-metadata"),
        Some("{\"turn_id\":\"t\"}")
    );
    assert!(req.header("x-codex-installation-id").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_malformed_bodies_are_rejected() {
    let s = stack();
    let big = vec![b'a'; 17 * 1024 * 1024];
    let r = s.post("/v1/responses").body(big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large");
    let r = s
        .post("/v1/responses")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = s.post_json("/v1/responses", &json!({"input":"x"})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "model");
    assert_eq!(s.mock.responses_requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_request_errors_are_returned_as_openai_errors() {
    let s = stack();
    let r = s.post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"x","client_metadata":{"x-mock-error":"unsupported_parameter","x-mock-param":"foo"}})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "Unsupported parameter: foo");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = s.post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"x","client_metadata":{"x-mock-error":"context_length_exceeded"}})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(
        s.mock.responses_requests(),
        2,
        "request errors are not retried on another account"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_exhausted_everywhere_gives_429_with_reset() {
    let s = stack();
    s.mock
        .set_behaviour("acct-0", Behaviour::error(ErrorKind::UsageLimitReached));
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 0);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "usage_limit_reached");
    assert!(v["error"]["resets_at"].as_u64().unwrap() > 0);
    // The account is cooling: the next request does not even reach the upstream.
    let before = s.mock.responses_requests();
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 429);
    assert_eq!(s.mock.responses_requests(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_before_commit_uses_the_next_account() {
    let s = StackBuilder {
        accounts: 2,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        ..StackBuilder::default()
    }
    .start();
    s.mock
        .set_behaviour("acct-0", Behaviour::error(ErrorKind::ServerIsOverloaded));
    for _ in 0..4 {
        let r = s.post_responses_x(true).await;
        assert_eq!(r.status(), 200);
        let body = r.text().await.unwrap();
        assert!(body.contains("response.completed"));
        assert!(
            !body.contains("server_is_overloaded"),
            "the failed attempt is invisible"
        );
    }
    let by: Vec<String> = s.served_by();
    // fill_first puts acct-0 first; it fails once, the request moves on to acct-1, and the
    // cooldown keeps acct-0 out afterwards.
    assert_eq!(by.iter().filter(|a| *a == "acct-0").count(), 1, "{by:?}");
    assert_eq!(by.iter().filter(|a| *a == "acct-1").count(), 4, "{by:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_cut_after_commit_ends_with_one_terminal_error() {
    let s = StackBuilder {
        accounts: 2,
        ..StackBuilder::default()
    }
    .start();
    let r = s.post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"x","stream":true,"client_metadata":{"x-mock-disconnect-after":"6"}})).await;
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let evs = parse_sse(&body);
    let last = evs.last().unwrap();
    assert_eq!(last.0, "response.failed", "{evs:?}");
    assert_eq!(
        evs.iter()
            .filter(|(e, _)| e == "response.failed" || e == "response.completed")
            .count(),
        1
    );
    assert_eq!(
        evs.iter().filter(|(e, _)| e == "response.created").count(),
        1,
        "no second account's output"
    );
    assert_eq!(
        s.mock.responses_requests(),
        1,
        "a committed stream is never retried"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_releases_upstream_stream_and_slot() {
    client_disconnect_releases(PlainHttp::H1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_resets_the_h2_stream() {
    client_disconnect_releases(PlainHttp::H2c).await;
}

async fn client_disconnect_releases(plain_http: PlainHttp) {
    let s = StackBuilder {
        plain_http,
        mock: streaming_mock(200, Duration::from_millis(50)),
        ..StackBuilder::default()
    }
    .start();
    let r = s.post_responses_x(true).await;
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("response.output_text.delta") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    assert_eq!(s.mock.active_streams(), 1);
    assert_eq!(s.in_flight("acct-0"), 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while (s.mock.active_streams() > 0 || s.in_flight("acct-0") > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.mock.active_streams(), 0, "upstream stream released");
    assert_eq!(s.in_flight("acct-0"), 0, "account slot released");
    assert_eq!(s.mock.completed_streams(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn previous_response_id_over_http_is_a_clear_error() {
    let s = stack();
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model":"gpt-5.5","input":"x","previous_response_id":"resp_1"}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "previous_response_not_found");
    assert_eq!(v["error"]["param"], "previous_response_id");
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_upstream_and_legacy_driver() {
    let s = StackBuilder {
        plain_http: PlainHttp::H2c,
        legacy: true,
        ..StackBuilder::default()
    }
    .start();
    assert!(s.app.drivers.iter().all(|d| *d == "legacy"));
    for _ in 0..3 {
        let r = s.post_responses_x(true).await;
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("response.completed"));
    }
    let reqs = s.mock.requests();
    assert!(
        reqs.iter().all(|r| r.version == "HTTP/2.0"),
        "{:?}",
        reqs.iter().map(|r| &r.version).collect::<Vec<_>>()
    );
}

/// Request bodies of every size reach an h2c upstream byte for byte: below and above the
/// 256-byte size where the h2 codec used to send a DATA payload apart from its frame head,
/// around one 16 KiB frame, and over several frames (the vendored codec copies payloads of
/// up to 16 KiB into its write buffer: `vendor/README.md`). The bearer token (a raw HPACK
/// literal, over 256 bytes) reaches the mock intact on every request.
#[tokio::test(flavor = "multi_thread")]
async fn h2c_request_bodies_of_every_size_arrive_whole() {
    let s = StackBuilder {
        plain_http: PlainHttp::H2c,
        ..StackBuilder::default()
    }
    .start();
    for (i, len) in [10usize, 200, 300, 5_000, 16_300, 16_400, 40_000, 100_000]
        .into_iter()
        .enumerate()
    {
        // Numbered words: a lost, doubled or reordered byte range changes the text.
        let mut input = format!("BODY-{i} ");
        let mut w = 0u32;
        while input.len() < len {
            input.push_str(&format!("w{w:06} "));
            w += 1;
        }
        let stream = i % 2 == 0;
        let r = s
            .post_json(
                "/v1/responses",
                &json!({"model":"gpt-5.5","input": input,"stream": stream}),
            )
            .await;
        assert_eq!(r.status(), 200, "{len} bytes");
        assert!(r.text().await.unwrap().contains("resp"), "{len} bytes");
        let reqs = s.mock.requests();
        let hits: Vec<_> = reqs
            .iter()
            .filter(|r| r.path.ends_with("/responses") && r.body_text().contains(&input))
            .collect();
        assert_eq!(hits.len(), 1, "{len} bytes: the whole input upstream once");
        assert_eq!(hits[0].version, "HTTP/2.0");
        // Byte for byte: over 256 bytes, the token goes as a raw HPACK literal (not
        // Huffman-coded, `vendor/README.md` change 3).
        let auth = hits[0].header("authorization").unwrap_or_default();
        let token = s.mock.account_tokens("acct-0").unwrap().access_token;
        assert!(
            token.len() > 256,
            "the mock's token is {} bytes",
            token.len()
        );
        assert_eq!(auth, format!("Bearer {token}"), "{len} bytes");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn http1_upstream_on_io_uring() {
    let s = stack();
    let r = s.post_responses_x(true).await;
    assert!(r.text().await.unwrap().contains("response.completed"));
    assert!(s.mock.requests().iter().all(|r| r.version == "HTTP/1.1"));
    let m = s.metrics_text().await;
    assert!(
        m.contains("codex_gateway_worker_driver{worker=\"0\""),
        "{m}"
    );
    assert!(
        m.contains("codex_gateway_requests_total{route=\"responses\",status=\"200\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("codex_gateway_upstream_ttfb_seconds_count 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_on_both_planes() {
    let s = stack();
    let r = http_get(&format!("{}/healthz", s.url())).await;
    assert_eq!(r.status(), 200);
    let r = http_get(&format!("{}/healthz", s.admin_url())).await;
    assert_eq!(r.status(), 200);
    let r = http_get(&format!("{}/nope", s.url())).await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string());
}
