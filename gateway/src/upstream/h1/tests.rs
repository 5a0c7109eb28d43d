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
        if n.is_multiple_of(2) {
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
        headers: vec![(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        )],
        body: Bytes::from_static(b"{}"),
    }
}

async fn read_all(wire: &[u8], plan: Plan) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let cfg = UpstreamConfig::from_base_url("http://127.0.0.1:9/backend-api/codex").expect("cfg");
    let io = SegmentedIo::new(wire, plan);
    let resp = send(io, &cfg, &request(), None, false)
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
    let crate::upstream::Head::Pairs(headers) = resp.headers else {
        panic!("h1 heads are parsed into pairs")
    };
    (resp.status, headers, out)
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
        let resp = send(
            SegmentedIo::new(&wire, Plan::EveryByte),
            &cfg,
            &request(),
            None,
            false,
        )
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

fn pool() -> std::rc::Rc<super::H1Pool> {
    super::H1Pool::new(
        4,
        std::time::Duration::from_secs(30),
        crate::metrics::Registry::new(1).worker(0),
    )
}

async fn pooled(wire: &[u8], plan: Plan, p: &std::rc::Rc<super::H1Pool>) -> super::Body {
    let cfg = UpstreamConfig::from_base_url("http://127.0.0.1:9/x").expect("cfg");
    let resp = send(
        SegmentedIo::new(wire, plan).hold_open(),
        &cfg,
        &request(),
        Some(p.clone()),
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("{plan:?}: {e:?}"));
    let UpstreamBody::H1(body) = resp.body else {
        panic!("h1 body expected")
    };
    *body
}

/// A keep-alive response read exactly to its end gives its connection back to the pool, in
/// every segmentation, chunked or by length; `finish` reads a finished stream's tail.
#[monoio::test_all(timer_enabled = true)]
async fn a_body_read_to_its_end_pools_its_connection() {
    let body = sse();
    let mut chunked_wire = head("transfer-encoding: chunked\r\n").into_bytes();
    chunked_wire.extend_from_slice(&chunked(&body));
    let mut length_wire = head(&format!("content-length: {}\r\n", body.len())).into_bytes();
    length_wire.extend_from_slice(&body);
    for wire in [&chunked_wire, &length_wire] {
        for plan in Plan::standard(6, false) {
            let p = pool();
            let mut b = pooled(wire, plan, &p).await;
            let mut got = Vec::new();
            while let Some(c) = b.chunk().await.unwrap() {
                got.extend_from_slice(&c);
            }
            assert_eq!(got, body, "{plan:?}");
            drop(b);
            assert_eq!(p.idle_count(), 1, "{plan:?}");
            assert!(p.take().is_some());
        }
    }
    // A stream whose terminal event was read but not the last-chunk marker: `finish` reads
    // the tail, then the connection is pooled.
    let p = pool();
    let mut b = pooled(&chunked_wire, Plan::Random { seed: 3, max: 512 }, &p).await;
    let mut got = Vec::new();
    while got.len() < body.len() {
        got.extend_from_slice(&b.chunk().await.unwrap().unwrap());
    }
    b.finish().await;
    drop(b);
    assert_eq!(p.idle_count(), 1);
}

/// Connections that cannot carry another request are closed, never pooled: a body dropped
/// before its end (a cancelled stream), `connection: close`, HTTP/1.0, extra bytes after the
/// body, a tail that never ends.
#[monoio::test_all(timer_enabled = true)]
async fn connections_that_cannot_be_reused_are_not_pooled() {
    let body = sse();
    let mut wire = head("transfer-encoding: chunked\r\n").into_bytes();
    wire.extend_from_slice(&chunked(&body));
    let p = pool();
    let mut b = pooled(&wire, Plan::EveryByte, &p).await;
    let _ = b.chunk().await.unwrap();
    drop(b);
    assert_eq!(p.idle_count(), 0, "dropped mid-body");

    let mut close = head("connection: close\r\ncontent-length: 2\r\n").into_bytes();
    close.extend_from_slice(b"ok");
    let http10 = String::from_utf8(close.clone())
        .unwrap()
        .replace("HTTP/1.1", "HTTP/1.0")
        .replace("connection: close\r\n", "");
    let mut extra = head("content-length: 2\r\n").into_bytes();
    extra.extend_from_slice(b"okGARBAGE");
    for w in [close, http10.into_bytes(), extra] {
        let mut b = pooled(&w, Plan::Whole, &p).await;
        while let Ok(Some(_)) = b.chunk().await {}
        drop(b);
        assert_eq!(p.idle_count(), 0, "{:?}", String::from_utf8_lossy(&w));
    }

    // The tail never comes: `finish` gives up within its budget and the connection closes.
    let mut open_ended = head("transfer-encoding: chunked\r\n").into_bytes();
    open_ended.extend_from_slice(b"5\r\nhello\r\n");
    let mut b = pooled(&open_ended, Plan::Whole, &p).await;
    let _ = b.chunk().await.unwrap();
    b.finish().await;
    drop(b);
    assert_eq!(p.idle_count(), 0, "unfinished tail");
}

/// A reused connection that ends before any response byte is stale (the origin closed it
/// while it idled): the caller sends again on a fresh one. A fresh connection that does the
/// same is a real failure.
#[monoio::test_all(timer_enabled = true)]
async fn a_pooled_connection_closed_while_idle_is_stale() {
    let cfg = UpstreamConfig::from_base_url("http://127.0.0.1:9/x").expect("cfg");
    let r = send(
        SegmentedIo::new(b"", Plan::Whole),
        &cfg,
        &request(),
        Some(pool()),
        true,
    )
    .await;
    assert!(matches!(r, Err(super::SendError::Stale)), "{:?}", r.err());
    let r = send(
        SegmentedIo::new(b"", Plan::Whole),
        &cfg,
        &request(),
        Some(pool()),
        false,
    )
    .await;
    assert!(
        matches!(r, Err(super::SendError::Failed(_))),
        "{:?}",
        r.err()
    );
    // A partial head on a reused connection is not stale: the origin answered something.
    let r = send(
        SegmentedIo::new(b"HTTP/1.1 2", Plan::Whole),
        &cfg,
        &request(),
        Some(pool()),
        true,
    )
    .await;
    assert!(
        matches!(r, Err(super::SendError::Failed(_))),
        "{:?}",
        r.err()
    );
}

/// `try_chunk` hands out what is already buffered without a read, and asks for a read (None)
/// exactly where the buffer runs dry: mixed with `chunk`, the body arrives whole at every
/// split, with no more waits than reads.
#[monoio::test_all(timer_enabled = true)]
async fn buffered_chunks_are_taken_without_waiting() {
    let body = sse();
    let mut wire = head("transfer-encoding: chunked\r\n").into_bytes();
    wire.extend_from_slice(&chunked(&body));
    let cfg = UpstreamConfig::from_base_url("http://127.0.0.1:9/backend-api/codex").expect("cfg");
    for plan in Plan::standard(12, true) {
        let resp = send(SegmentedIo::new(&wire, plan), &cfg, &request(), None, false)
            .await
            .unwrap_or_else(|e| panic!("{plan:?}: {e:?}"));
        let UpstreamBody::H1(mut b) = resp.body else {
            panic!("h1 body expected")
        };
        let (mut got, mut waits) = (Vec::new(), 0);
        loop {
            match b.try_chunk() {
                Some(Ok(Some(c))) => got.extend_from_slice(&c),
                Some(Ok(None)) => break,
                Some(Err(e)) => panic!("{plan:?}: {e:?}"),
                None => {
                    waits += 1;
                    match b
                        .chunk()
                        .await
                        .unwrap_or_else(|e| panic!("{plan:?}: {e:?}"))
                    {
                        Some(c) => got.extend_from_slice(&c),
                        None => break,
                    }
                }
            }
        }
        assert!(got == body, "{plan:?}: body differs");
        // No wait without a read to wait for: at most one per segment delivered or per
        // buffer's worth of bytes.
        let reads = plan.cut(&wire).len() + wire.len().div_ceil(super::READ_CHUNK);
        assert!(
            waits <= reads,
            "{plan:?}: {waits} waits for at most {reads} reads"
        );
    }
}
