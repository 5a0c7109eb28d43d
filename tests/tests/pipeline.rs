//! The one post-commit pipeline: usage finalised exactly once on every exit, and a failure
//! after the commit still has its account effect (issue 10's seam, issue 9 defect 5).

use std::time::{Duration, Instant};

use benches::Behaviour;
use futures_util::StreamExt;
use integration_tests::{parse_sse, Stack, StackBuilder};
use serde_json::{json, Value};

async fn usage_totals(s: &Stack) -> Value {
    s.admin_get("/api/admin/usage")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["totals"]
        .clone()
}

async fn wait_requests(s: &Stack, n: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t = usage_totals(s).await;
        if t["requests"].as_u64() == Some(n) || Instant::now() > deadline {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_exit_records_usage_exactly_once() {
    let s = StackBuilder {
        accounts: 2,
        ..Default::default()
    }
    .start();
    let meta = |k: &str, v: &str| json!({ k: v });
    let bodies = [
        // Responses SSE and JSON, chat SSE and JSON: answered.
        (
            "/v1/responses",
            json!({"model":"gpt-5.5","input":"a","stream":true}),
        ),
        ("/v1/responses", json!({"model":"gpt-5.5","input":"b"})),
        (
            "/v1/chat/completions",
            json!({"model":"gpt-5.5","stream":true,"messages":[{"role":"user","content":"c"}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model":"gpt-5.5","messages":[{"role":"user","content":"d"}]}),
        ),
        // Failures after the commit, streamed and buffered.
        (
            "/v1/responses",
            json!({"model":"gpt-5.5","input":"e","stream":true,"client_metadata": meta("x-mock-fail-after-output","server_is_overloaded")}),
        ),
        (
            "/v1/responses",
            json!({"model":"gpt-5.5","input":"f","client_metadata": meta("x-mock-fail-after-output","server_is_overloaded")}),
        ),
        // A request error before the commit (no failover).
        (
            "/v1/responses",
            json!({"model":"gpt-5.5","input":"g","client_metadata": meta("x-mock-param","bogus_param")}),
        ),
    ];
    for (path, body) in &bodies {
        let r = s.post_json(path, body).await;
        let _ = r.bytes().await;
    }
    // The client leaves in the middle of a long stream.
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model":"gpt-5.5","input":"h","stream":true,
            "client_metadata":{"x-mock-inter-event-delay-ms":"200","x-mock-deltas":"50"}}),
        )
        .await;
    let mut body = r.bytes_stream();
    let first = body.next().await.expect("a first chunk").unwrap();
    assert!(!first.is_empty());
    drop(body);

    let n = bodies.len() as u64 + 1;
    let t = wait_requests(&s, n).await;
    assert_eq!(
        t["requests"].as_u64(),
        Some(n),
        "one record per request: {t}"
    );
    // Nothing arrives twice later (the guard finalises once).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = usage_totals(&s).await;
    assert_eq!(t["requests"].as_u64(), Some(n), "no duplicate records: {t}");
    assert!(t["errors"].as_u64().unwrap_or(0) >= 3, "{t}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quota_failure_after_the_commit_cools_the_account() {
    let s = StackBuilder {
        accounts: 2,
        ..Default::default()
    }
    .start();
    let a0 = s.accounts[0].account_id.clone();
    let a1 = s.accounts[1].account_id.clone();
    s.mock.set_behaviour(
        &a0,
        Behaviour {
            fail_after_output: Some("usage_limit_reached".into()),
            ..Default::default()
        },
    );
    s.mock.set_behaviour(
        &a1,
        Behaviour {
            fail_after_output: Some("usage_limit_reached".into()),
            ..Default::default()
        },
    );
    // Both accounts end their first stream with a quota failure after output started: the
    // client sees it as the stream's terminal event (no failover after the commit)...
    for _ in 0..2 {
        let r = s.post_responses_x(true).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let evs = parse_sse(&text);
        assert!(evs.iter().any(|(e, _)| e == "response.output_text.delta"));
        assert_eq!(evs.last().map(|(e, _)| e.as_str()), Some("response.failed"));
    }
    // ...and each account bears the effect: both cool, so the next request is refused with
    // the pool's quota error instead of being sent to an exhausted account.
    for id in [&a0, &a1] {
        assert!(
            s.account(id).cooling_ms > 0,
            "{id} cools after its quota failure"
        );
    }
    s.mock.clear_behaviour(&a0);
    s.mock.clear_behaviour(&a1);
    let before = s.mock.requests().len();
    let r = s
        .post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"y"}))
        .await;
    assert_eq!(r.status(), 429, "{}", r.text().await.unwrap());
    assert_eq!(
        s.mock.requests().len(),
        before,
        "no request to a cooling account"
    );
}

/// The per-worker load the admin app's ops page shows: every event the pipeline forwards is
/// counted on its worker (exactly what the client received), requests per worker add up, and
/// the open-stream and connection gauges per worker return to zero.
#[tokio::test(flavor = "multi_thread")]
async fn per_worker_load_is_exported() {
    let s = StackBuilder::default().start();
    let mut received = 0;
    for _ in 0..3 {
        let text = s
            .post_json(
                "/v1/responses",
                &json!({"model":"gpt-5.5","input":"hi","stream":true}),
            )
            .await
            .text()
            .await
            .unwrap();
        received += parse_sse(&text).len() as i64;
    }
    assert!(received > 3);
    assert_eq!(
        s.metric("codex_gateway_worker_events_total").await,
        received
    );
    assert!(s.metric("codex_gateway_worker_requests_total").await >= 3);
    assert_eq!(s.metric("codex_gateway_worker_open_streams").await, 0);
    let text = s.metrics_text().await;
    for w in 0..2 {
        assert!(
            text.contains(&format!(
                "codex_gateway_worker_events_total{{worker=\"{w}\"}}"
            )),
            "worker {w} exported"
        );
    }
}
