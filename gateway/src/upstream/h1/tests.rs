//! The streaming h1 client under segmentation: response heads and bodies (chunked SSE,
//! `Content-Length`, close-delimited) split anywhere, on both drivers.

use bytes::Bytes;

use super::send;
use crate::{
    config::UpstreamConfig,
    testing::{Plan, SegmentedIo},
    upstream::{UpstreamBody, UpstreamRequest},
};

/// A response head like the Codex backend's: quota headers included (~1.5 KB).
fn head(framing: &str) -> String {
    let mut h = String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n");
    for (n, v) in [
        ("x-codex-primary-used-percent", "12.5"),
        ("x-codex-primary-window-minutes", "300"),
        ("x-codex-primary-reset-after-seconds", "16020"),
        ("x-codex-secondary-used-percent", "40"),
        ("x-codex-secondary-window-minutes", "10080"),
        ("x-codex-secondary-reset-after-seconds", "518400"),
        ("x-codex-turn-state", "ts-abc-123"),
        ("openai-model", "gpt-5.1-codex"),
        ("cf-ray", "8f1c2d3e4a5b6c7d-IAD"),
        ("x-request-id", "req_0123456789abcdef0123456789abcdef"),
    ] {
        h.push_str(&format!("{n}: {v}\r\n"));
    }
    for i in 0..20 {
        h.push_str(&format!("x-envoy-padding-{i}: {}\r\n", "p".repeat(40)));
    }
    h.push_str(framing);
    h.push_str("\r\n");
    h
}

/// A realistic SSE transcript (~60 KB): created, many deltas of varying size, completed.
fn sse() -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n");
    for i in 0..400 {
        let text = "word ".repeat(i % 37 + 1);
        out.extend_from_slice(
            format!("event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"{text}\",\"sequence_number\":{i}}}\n\n")
                .as_bytes(),
        );
    }
    out.extend_from_slice(b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n");
    out
}

/// `body` as chunks whose boundaries do not line up with SSE events, with an extension and
/// a trailer.
fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut n = 3usize;
    while !rest.is_empty() {
        let take = n.min(rest.len());
        out.extend_from_slice(format!("{take:X}").as_bytes());
        if n % 2 == 0 {
            out.extend_from_slice(b";x=y");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&rest[..take]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[take..];
        n = n * 13 % 9001 + 1;
    }
    out.extend_from_slice(b"0\r\nx-done: 1\r\n\r\n");
    out
}

fn request() -> UpstreamRequest {
    UpstreamRequest {
        method: "POST",
        path: "/backend-api/codex/responses".into(),
        headers: vec![("content-type", "application/json".into())],
        body: Bytes::from_static(b"{}"),
    }
}

async fn read_all(wire: &[u8], plan: Plan) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let cfg = UpstreamConfig::from_base_url("http://127.0.0.1:9/backend-api/codex").expect("cfg");
    let io = SegmentedIo::new(wire, plan);
    let resp = send(io, &cfg, request())
        .await
        .unwrap_or_else(|e| panic!("{plan:?}: {e:?}"));
    let UpstreamBody::H1(mut body) = resp.body else {
        panic!("h1 body expected")
    };
    let mut out = Vec::new();
    while let Some(chunk) = body
        .chunk()
        .await
        .unwrap_or_else(|e| panic!("{plan:?}: {e:?}"))
    {
        out.extend_from_slice(&chunk);
    }
    (resp.status, resp.headers, out)
}

#[monoio::test_all(timer_enabled = true)]
async fn chunked_sse_split_anywhere() {
    let body = sse();
    let mut wire = head("transfer-encoding: chunked\r\n").into_bytes();
    wire.extend_from_slice(&chunked(&body));
    for plan in Plan::standard(12, true) {
        let (status, headers, got) = read_all(&wire, plan).await;
        assert_eq!(status, 200, "{plan:?}");
        assert!(
            headers
                .iter()
                .any(|(n, v)| n == "x-codex-turn-state" && v == "ts-abc-123"),
            "{plan:?}"
        );
        assert!(
            got == body,
            "{plan:?}: body differs ({} of {} bytes)",
            got.len(),
            body.len()
        );
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn length_and_close_delimited_bodies_split_anywhere() {
    let body = sse();
    let mut with_len = head(&format!("content-length: {}\r\n", body.len())).into_bytes();
    with_len.extend_from_slice(&body);
    let mut close = head("").into_bytes();
    close.extend_from_slice(&body);
    for wire in [with_len, close] {
        for plan in Plan::standard(6, true) {
            let (_, _, got) = read_all(&wire, plan).await;
            assert!(got == body, "{plan:?}: body differs");
        }
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn malformed_chunking_is_a_protocol_error() {
    for bad in [
        &b"+5\r\nhello\r\n0\r\n\r\n"[..],
        b"5\nhello\r\n0\r\n\r\n",
        b"1ffffffffffffffff\r\n",
    ] {
        let mut wire = head("transfer-encoding: chunked\r\n").into_bytes();
        wire.extend_from_slice(bad);
        let cfg = UpstreamConfig::from_base_url("http://127.0.0.1:9/x").expect("cfg");
        let resp = send(SegmentedIo::new(&wire, Plan::EveryByte), &cfg, request())
            .await
            .expect("head");
        let UpstreamBody::H1(mut body) = resp.body else {
            panic!("h1 body expected")
        };
        let mut result = Ok(Some(Bytes::new()));
        while let Ok(Some(_)) = result {
            result = body.chunk().await;
        }
        assert!(result.is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
}
