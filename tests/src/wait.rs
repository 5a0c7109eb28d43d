//! Bounded waits the integration tests share: a condition polled until it holds, the key's
//! `/v1/usage` polled until it shows a state, and a whole RPM window for a burst.
//!
//! # Key Components
//! - [`wait_for`]: polls an async condition until it holds, failing after a limit.
//! - [`usage_at`] / [`usage_until`]: `GET {base}/v1/usage` with a key, once or until it holds.
//! - [`same_minute_for`]: waits out a UTC minute that has too little left.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client;

/// Polls `f` (every 50 ms) until it holds; panics naming `what` after `limit`.
pub async fn wait_for(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET {base}/v1/usage` with `key`, whatever the status.
async fn get_usage(base: &str, key: &str) -> reqwest::Response {
    client()
        .get(format!("{base}/v1/usage"))
        .bearer_auth(key)
        .send()
        .await
        .expect("GET /v1/usage")
}

/// `GET {base}/v1/usage` with `key`; asserts 200.
pub async fn usage_at(base: &str, key: &str) -> Value {
    let r = get_usage(base, key).await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("usage JSON")
}

/// Polls `/v1/usage` until `done` holds (the usage record of a finished request is counted
/// when its handler returns, which may be just after the client read the answer; another
/// instance answers 401 until its snapshot has the key).
pub async fn usage_until(base: &str, key: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let r = get_usage(base, key).await;
        if r.status() == 200 {
            let u: Value = r.json().await.expect("usage JSON");
            if done(&u) {
                return u;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "usage never reached the expected state: {}",
        usage_at(base, key).await
    );
}

/// Waits out the end of the current UTC minute when fewer than `secs` seconds are left, so a
/// test's requests fall in one RPM window.
pub async fn same_minute_for(secs: u64) {
    let now = shared_state::now_ms();
    let left = 60_000 - now % 60_000;
    if left < secs * 1000 {
        tokio::time::sleep(Duration::from_millis(left + 200)).await;
    }
}
