//! Budgets under a burst (issue 28, item 7), over real sockets against mock-codex: a token
//! budget holds when 200 requests arrive at once (one instance, with and without Redis), RPM
//! holds across two instances on one PostgreSQL + Redis, and a request that fails or is
//! cancelled gives its reservation back. Limits are set through the admin API.
//!
//! The bound asserted for a token budget `B` is `B + T`, `T` one request's tokens: a request
//! alone is admitted while anything is left (what it will use is unknown until it ends, so it
//! may pass the budget by its own usage), and requests in flight together are admitted only
//! while `used + reserved + estimate <= B`. mock-codex answers identical requests with
//! identical usage, so after one request the key's estimate is exact and nothing else can add
//! up. Before the fix every one of the 200 was admitted (about 46 x 200 tokens for `B = 500`).

#![allow(clippy::unwrap_used)] // helpers of tests: a panic is the failure report

use std::time::Duration;

use benches::MockConfig;
use futures_util::future::join_all;
use integration_tests::{
    fleet::{instance_url, with_redis, REDIS_URL},
    requests::post_at,
    wait::{same_minute_for, usage_until},
    Stack, StackBuilder,
};
use serde_json::{json, Value};

/// `POST {base}/v1/responses` (non-streamed, identical every time) with `key`; (status,
/// Retry-After, JSON body).
async fn respond_at(http: &reqwest::Client, base: &str, key: &str) -> (u16, Option<u64>, Value) {
    let body = json!({"model": "gpt-5.5", "input": "hello there", "stream": false});
    post_at(http, base, "/v1/responses", key, &body).await
}

fn tokens_of(v: &Value) -> u64 {
    let u = &v["usage"];
    u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
}

/// A client with room for a burst (every request on its own connection at once).
fn burst_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// One warm-up request (the key learns one request's size, `T`), then 200 at once; asserts
/// the tokens admitted stay within `budget + T` and every refusal is a 429 with Retry-After.
async fn burst_within_budget(s: &Stack, name: &str, redis: bool) {
    const BUDGET: u64 = 500;
    let key = s
        .create_key(name, json!({"tokens_per_day": BUDGET}))
        .await
        .key;
    let http = burst_client();
    let (st, _, v) = respond_at(&http, &s.url(), &key).await;
    assert_eq!(st, 200, "{v}");
    let one = tokens_of(&v);
    assert!(one > 0 && one < BUDGET / 4, "one request's tokens: {one}");
    // The warm-up is counted before the burst starts.
    usage_until(&s.url(), &key, |u| {
        u["today"]["tokens"].as_u64() == Some(one) && u["current"]["in_flight"] == 0
    })
    .await;
    let base = s.url();
    let answers = join_all((0..200).map(|_| respond_at(&http, &base, &key))).await;
    let mut admitted = 0u64;
    let mut tokens = one;
    let mut max_one = one;
    for (st, retry, v) in &answers {
        match st {
            200 => {
                admitted += 1;
                let t = tokens_of(v);
                max_one = max_one.max(t);
                tokens += t;
            }
            429 => {
                let code = v["error"]["code"].as_str().unwrap_or_default();
                assert!(
                    code == "rate_limit_exceeded" || code == "insufficient_quota",
                    "{v}"
                );
                assert!(retry.is_some(), "a 429 without Retry-After: {v}");
            }
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    eprintln!("{name}: {admitted} of 200 admitted, {tokens} tokens for a budget of {BUDGET} (one request: {max_one})");
    assert!(admitted >= 1, "the burst admitted nothing");
    assert!(
        tokens <= BUDGET + max_one,
        "{admitted} of 200 admitted: {tokens} tokens for a budget of {BUDGET} (one request: {max_one})"
    );
    // The key's own usage says the same once every record is in.
    let u = usage_until(&s.url(), &key, |u| {
        u["today"]["requests"].as_u64() == Some(admitted + 1)
    })
    .await;
    assert_eq!(u["today"]["tokens"].as_u64(), Some(tokens), "{u}");
    assert_eq!(u["current"]["in_flight"], 0, "{u}");
    if redis {
        fleet_counters_settled(&key, tokens).await;
    }
    // Spent (or all but spent): the next request is refused, or admitted alone and the budget
    // is then spent.
    let (st, _, v) = respond_at(&http, &s.url(), &key).await;
    if st == 200 {
        let (st, _, v) = respond_at(&http, &s.url(), &key).await;
        assert_eq!(st, 429, "{v}");
        assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    } else {
        assert_eq!(st, 429, "{v}");
    }
}

/// Answers that take about a second (10 events 100 ms apart): the whole burst is in flight
/// together, as with real upstream latencies.
fn slow_mock() -> MockConfig {
    MockConfig {
        inter_event_delay: Duration::from_millis(100),
        ..MockConfig::default()
    }
}

/// The fleet's counters in Redis after a burst: today's tokens are exactly what was used (the
/// workers' settlements and the sidecar's pushes never count a request twice), and the
/// reservations were taken there and every one given back.
async fn fleet_counters_settled(key: &str, tokens: u64) {
    let tag = &shared_state::keys::hash_key_hex(key)[..16];
    let day = shared_state::keys::day_of(shared_state::now_ms());
    let mut c = redis::Client::open(REDIS_URL)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis at 127.0.0.1:6379 is required for this test");
    let mut last = (None, Vec::new());
    for _ in 0..100 {
        let used: Option<u64> = redis::cmd("GET")
            .arg(format!("codex-gateway:limits:{tag}:day_tokens:{day}"))
            .query_async(&mut c)
            .await
            .unwrap();
        let held_keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("codex-gateway:limits:{tag}:held_tokens:*"))
            .query_async(&mut c)
            .await
            .unwrap();
        let mut held = Vec::new();
        for k in &held_keys {
            let v: i64 = redis::cmd("GET").arg(k).query_async(&mut c).await.unwrap();
            held.push(v);
        }
        if used == Some(tokens) && !held.is_empty() && held.iter().all(|&v| v == 0) {
            return;
        }
        last = (used, held);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "fleet counters: day_tokens {:?} (want {tokens}), held buckets {:?}",
        last.0, last.1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_holds_under_a_burst_of_200() {
    let s = StackBuilder {
        mock: slow_mock(),
        ..StackBuilder::default()
    }
    .start();
    burst_within_budget(&s, "burst", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_holds_under_a_burst_of_200_with_redis() {
    let s = StackBuilder {
        mock: slow_mock(),
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    burst_within_budget(&s, "burst-redis", true).await;
}

/// The worker-side Redis client on the legacy (epoll) driver.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_holds_under_a_burst_of_200_with_redis_on_the_legacy_driver() {
    let s = StackBuilder {
        mock: slow_mock(),
        legacy: true,
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    burst_within_budget(&s, "burst-redis-legacy", true).await;
}

/// Two instances on one PostgreSQL and one Redis, `rpm = 20`, 40 requests at once (20 on
/// each): at most 20 are admitted, the rest are 429 `rate_limit_exceeded`.
#[tokio::test(flavor = "multi_thread")]
async fn rpm_holds_across_two_instances_under_a_burst() {
    let s = StackBuilder {
        mock: slow_mock(),
        postgres: true,
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    let b = s.another_instance(|_| {});
    let b_url = instance_url(&b);
    let key = s.create_key("fleet-burst", json!({"rpm": 20})).await.key;
    // B learns of the key at its next reload.
    usage_until(&b_url, &key, |u| u["limits"]["rpm"] == 20).await;
    same_minute_for(30).await;
    let http = burst_client();
    let a_url = s.url();
    let answers = join_all((0..40).map(|i| {
        let (http, key) = (&http, &key);
        let base = if i % 2 == 0 {
            a_url.clone()
        } else {
            b_url.clone()
        };
        async move { respond_at(http, &base, key).await }
    }))
    .await;
    let admitted = answers.iter().filter(|(st, _, _)| *st == 200).count();
    for (st, retry, v) in &answers {
        if *st != 200 {
            assert_eq!(*st, 429, "{v}");
            assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
            assert!(retry.is_some(), "{v}");
        }
    }
    eprintln!("two instances: {admitted} of 40 admitted for rpm = 20");
    assert!(admitted <= 20, "{admitted} of 40 admitted for rpm = 20");
    assert!(admitted >= 1, "nothing admitted");
    tokio::task::block_in_place(|| drop(b));
}

/// While a stream holds the key's reservation a second request is refused (the budget's rest
/// is held); once the stream is cancelled (the client leaves) or a request fails, what it
/// held comes back and the next request is admitted.
async fn reservations_come_back(s: &Stack, name: &str) {
    let http = burst_client();
    // Learn one request's size first: the budget leaves room for one more in flight, not two.
    let probe = s.create_key(&format!("{name}-probe"), json!({})).await.key;
    let (st, _, v) = respond_at(&http, &s.url(), &probe).await;
    assert_eq!(st, 200, "{v}");
    let one = tokens_of(&v);
    let budget = 2 * one + one / 2;
    let key = s
        .create_key(name, json!({"tokens_per_day": budget}))
        .await
        .key;
    let (st, _, v) = respond_at(&http, &s.url(), &key).await;
    assert_eq!(st, 200, "{v}");
    usage_until(&s.url(), &key, |u| {
        u["today"]["tokens"].as_u64() == Some(one)
    })
    .await;
    // A slow stream: 50 deltas 200 ms apart. Its head arrived, so it was admitted.
    let open = http
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(&key)
        .json(&json!({"model": "gpt-5.5", "input": "long", "stream": true,
            "client_metadata": {"x-mock-deltas": "50", "x-mock-inter-event-delay-ms": "200"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
    // used (T) + held (T) + this one (T) > 2.5 T: refused while the stream is open.
    let (st, retry, v) = respond_at(&http, &s.url(), &key).await;
    assert_eq!(st, 429, "admitted while the budget's rest was held: {v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(retry, Some(1), "{v}");
    // Cancelled: the client leaves mid-stream.
    drop(open);
    usage_until(&s.url(), &key, |u| u["current"]["in_flight"] == 0).await;
    // A request that fails upstream (a request error: no usage) gives its reservation back too.
    let r = http
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(&key)
        .json(&json!({"model": "gpt-5.5", "input": "x", "stream": false,
            "client_metadata": {"x-mock-error": "unsupported_parameter", "x-mock-param": "bogus_param"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    usage_until(&s.url(), &key, |u| {
        u["today"]["requests"] == 3 && u["current"]["in_flight"] == 0
    })
    .await;
    // Nothing held now (a leaked reservation would refuse this one: T + T + T > 2.5 T).
    let (st, _, v) = respond_at(&http, &s.url(), &key).await;
    assert_eq!(st, 200, "a reservation was not given back: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_or_failed_request_gives_its_reservation_back() {
    let s = StackBuilder {
        mock: MockConfig::default(),
        ..StackBuilder::default()
    }
    .start();
    reservations_come_back(&s, "release").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_or_failed_request_gives_its_reservation_back_with_redis() {
    let s = StackBuilder {
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    reservations_come_back(&s, "release-redis").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_or_failed_request_gives_its_reservation_back_with_redis_on_the_legacy_driver()
{
    let s = StackBuilder {
        legacy: true,
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    reservations_come_back(&s, "release-redis-legacy").await;
}
