//! The per-worker upstream h2 pool at real-world limits (issue 11): an origin that allows 100
//! streams per connection, GOAWAY rotation mid-stream, and a pool at its size limit.

use std::time::Duration;

use benches::MockConfig;
use futures_util::future::join_all;
use gateway::config::PlainHttp;
use integration_tests::{client, parse_sse, Stack, StackBuilder};
use serde_json::json;

fn stack(
    mock: MockConfig,
    tweak: impl FnOnce(&mut codex_gateway::config::Config) + 'static,
) -> Stack {
    StackBuilder {
        mock,
        accounts: 4,
        workers: 1,
        plain_http: PlainHttp::H2c,
        tweak: Some(Box::new(tweak)),
        ..Default::default()
    }
    .start()
}

/// A stream lasting about `delay_ms * 10` (10 events).
fn slow_stream(delay_ms: u64) -> serde_json::Value {
    json!({
        "model": "gpt-5.5", "input": "hi", "stream": true,
        "client_metadata": {"x-mock-inter-event-delay-ms": delay_ms.to_string()}
    })
}

/// Status and whether the stream ended with `response.completed`.
async fn run(s: &Stack, http: &reqwest::Client, body: &serde_json::Value) -> (u16, bool, String) {
    let r = http
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(&s.key)
        .json(body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    let completed = parse_sse(&text)
        .last()
        .is_some_and(|(e, _)| e == "response.completed");
    (status, completed, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_streams_through_one_worker_at_100_streams_per_connection() {
    let s = stack(
        MockConfig {
            h2_max_concurrent_streams: 100,
            ..Default::default()
        },
        |_| {},
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let body = slow_stream(400);
    let all = join_all((0..1000).map(|_| run(&s, &http, &body)));
    let watcher = async {
        // All 1,000 are open upstream at once: the pool opened connections instead of
        // queueing behind the origin's limit.
        let mock = &s.mock;
        let mut peak = 0;
        for _ in 0..600 {
            peak = peak.max(mock.active_streams());
            if peak >= 1000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let conns = s.metric("codex_gateway_upstream_h2_connections").await;
        (peak, conns)
    };
    let (results, (peak, conns)) = tokio::join!(all, watcher);
    let ok = results
        .iter()
        .filter(|(st, done, _)| *st == 200 && *done)
        .count();
    let bad: Vec<_> = results
        .iter()
        .filter(|(st, done, _)| *st != 200 || !*done)
        .take(3)
        .map(|(st, _, t)| format!("{st}: {}", &t[..t.len().min(300)]))
        .collect();
    assert_eq!(ok, 1000, "{bad:?}");
    assert_eq!(
        peak, 1000,
        "every stream was open upstream at the same time"
    );
    assert!(
        conns >= 10,
        "1,000 streams at 100 per connection need 10 connections: {conns}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn goaway_mid_stream_loses_no_stream() {
    let s = stack(
        MockConfig {
            goaway_after_requests: Some(5),
            ..Default::default()
        },
        |_| {},
    );
    let http = client();
    let body = slow_stream(100);
    // Waves of concurrent streams: each connection is told GOAWAY after its 5th request while
    // the others are mid-stream; later requests must go to fresh connections.
    for wave in 0..3 {
        let results = join_all((0..12).map(|_| run(&s, &http, &body))).await;
        for (st, done, text) in &results {
            assert!(
                *st == 200 && *done,
                "wave {wave}: {st}: {}",
                &text[..text.len().min(400)]
            );
        }
    }
    // Every wave's connection got GOAWAY while its other streams were in flight; each next
    // request found it retired and opened a fresh connection.
    let (st, done, _) = run(&s, &http, &slow_stream(0)).await;
    assert!(st == 200 && done);
    let retired = s.metric("codex_gateway_upstream_h2_retired_total").await;
    assert!(retired >= 3, "connections retired after GOAWAY: {retired}");
    assert_eq!(
        s.metric("codex_gateway_upstream_h2_streams").await,
        0,
        "slots released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_pool_fails_fast_with_503() {
    let s = stack(
        MockConfig {
            h2_max_concurrent_streams: 100,
            ..Default::default()
        },
        |c| {
            c.gateway.upstream.h2_max_connections = 2;
            c.gateway.upstream.h2_max_streams_per_connection = 10;
        },
    );
    let http = client();
    let body = slow_stream(300);
    let started = std::time::Instant::now();
    let results = join_all((0..30).map(|_| run(&s, &http, &body))).await;
    let ok = results
        .iter()
        .filter(|(st, done, _)| *st == 200 && *done)
        .count();
    let refused: Vec<_> = results.iter().filter(|(st, _, _)| *st == 503).collect();
    assert_eq!(ok, 20, "two connections of 10 streams serve 20");
    assert_eq!(refused.len(), 10);
    for (_, _, text) in refused {
        let v: serde_json::Value = serde_json::from_str(text).expect("OpenAI error body");
        assert_eq!(v["error"]["code"], "upstream_saturated", "{v}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "no silent wait"
    );
    assert_eq!(
        s.metric("codex_gateway_upstream_h2_saturated_total").await,
        10
    );
    // The accounts were not blamed: all still serve.
    let (st, done, _) = run(&s, &http, &slow_stream(0)).await;
    assert!(st == 200 && done);
}

/// A plain HTTP/1.1 origin: streamed, non-streamed and error answers in sequence reuse one
/// keep-alive connection (read to its end after the terminal event, then pooled), concurrent
/// ones open more, and every answer is complete. A stream the client abandons closes its
/// connection (that is what stops the generation upstream) and is not reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http1_origin_is_reached_over_pooled_keep_alive_connections() {
    let s = StackBuilder {
        workers: 1,
        plain_http: PlainHttp::H1,
        ..Default::default()
    }
    .start();
    let http = client();
    for i in 0..12 {
        let body = json!({"model":"gpt-5.5","input":"hi","stream": i % 2 == 0});
        let r = http
            .post(format!("{}/v1/responses", s.url()))
            .bearer_auth(&s.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        assert!(text.contains("Hello from mock-codex"), "{i}: {text}");
    }
    let connects = s.metric("codex_gateway_upstream_h1_connects_total").await;
    let reused = s.metric("codex_gateway_upstream_h1_reused_total").await;
    // A finished stream's tail is read in a task of its own, so a request sent the moment
    // the previous answer ended may find that connection not back yet and open another one.
    assert_eq!(connects + reused, 12);
    assert!(
        connects <= 3,
        "sequential requests share connections: {connects} opened, {reused} reused"
    );

    // Concurrent streams need one connection each; afterwards they are all idle, reusable.
    let slow = slow_stream(20);
    let out = join_all((0..5).map(|_| run(&s, &http, &slow))).await;
    assert!(out.iter().all(|(st, done, _)| *st == 200 && *done));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.metric("codex_gateway_upstream_h1_idle").await < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the five connections were not pooled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let idle = s.metric("codex_gateway_upstream_h1_idle").await;

    // A stream the client leaves midway: its upstream connection is closed, not pooled.
    let r = http
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(&s.key)
        .json(&slow_stream(300))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(r);
    // It took one idle connection; after the time the whole stream would have taken, that
    // connection is still not back.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(s.metric("codex_gateway_upstream_h1_idle").await, idle - 1);
}
