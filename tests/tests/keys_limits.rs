//! Per-key limits (issue 12, "keys and limits"), over real sockets: requests per minute,
//! concurrency, token and cost budgets (also after a restart), the model allow-list, account
//! groups (asserted on the `ChatGPT-Account-Id` mock-codex recorded), expiry and the enabled
//! flag, `GET /v1/usage` (own usage only), RPM across two instances on one PostgreSQL + Redis,
//! and local enforcement while Redis is down. Limits are set through the admin API, as an
//! operator would.

#![allow(clippy::unwrap_used)] // helpers of tests: a panic is the failure report

use std::time::Duration;

use integration_tests::{
    admin_api::CreatedKey,
    client,
    fleet::{instance_url, with_redis},
    http_get,
    requests::post_at,
    streaming_mock,
    wait::{same_minute_for, usage_at, usage_until},
    Stack, StackBuilder,
};
use serde_json::{json, Value};

async fn patch_key(s: &Stack, id: i64, limits: Value) -> Value {
    let (st, v) = s
        .admin_call(
            reqwest::Method::PATCH,
            &format!("/api/admin/keys/{id}"),
            limits,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v
}

async fn respond(s: &Stack, key: &str) -> (u16, Option<u64>, Value) {
    post_at(
        &client(),
        &s.url(),
        "/v1/responses",
        key,
        &json!({"model": "gpt-5.5", "input": "hello there", "stream": false}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn rpm_over_the_limit_is_429_rate_limit_exceeded_with_retry_after() {
    let s = StackBuilder::default().start();
    same_minute_for(20).await;
    let key = s.create_key("rpm", json!({"rpm": 2})).await.key;
    for _ in 0..2 {
        let (st, _, v) = respond(&s, &key).await;
        assert_eq!(st, 200, "{v}");
    }
    let (st, retry, v) = respond(&s, &key).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "requests", "{v}");
    let retry = retry.expect("Retry-After");
    assert!((1..=60).contains(&retry), "{retry}");
    // The same limit in Anthropic's dialect on /v1/messages.
    let (st, retry, v) = post_at(
        &client(),
        &s.url(),
        "/v1/messages",
        &key,
        &json!({"model": "gpt-5.5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert!(retry.is_some());
    // Another key is not affected.
    let (st, _, _) = respond(&s, &s.key).await;
    assert_eq!(st, 200);
    assert!(s.metric("codex_gateway_key_limit_rejections_total").await >= 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrency_limit_refuses_while_streams_are_open() {
    let s = StackBuilder {
        // Streams last a while: 20 deltas 200 ms apart.
        mock: streaming_mock(20, Duration::from_millis(200)),
        ..StackBuilder::default()
    }
    .start();
    let key = s
        .create_key("conc", json!({"max_concurrency": 2}))
        .await
        .key;
    let open = |k: String| {
        let url = format!("{}/v1/responses", s.url());
        async move {
            client()
                .post(url)
                .bearer_auth(k)
                .json(&json!({"model": "gpt-5.5", "input": "long", "stream": true}))
                .send()
                .await
                .unwrap()
        }
    };
    // Two streams committed (their heads arrived): both slots are held.
    let a = open(key.clone()).await;
    let b = open(key.clone()).await;
    assert_eq!(a.status(), 200);
    assert_eq!(b.status(), 200);
    let (st, retry, v) = respond(&s, &key).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(retry, Some(1));
    assert_eq!(usage_at(&s.url(), &key).await["current"]["in_flight"], 2);
    // Once one stream ends the key admits again.
    let _ = a.text().await.unwrap();
    let mut ok = false;
    for _ in 0..100 {
        if respond(&s, &key).await.0 == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "a slot came back");
    drop(b);
}

#[tokio::test(flavor = "multi_thread")]
async fn daily_token_budget_is_exhausted_by_usage_and_survives_a_restart() {
    let mut s = StackBuilder::default().start();
    let key = s
        .create_key("budget", json!({"tokens_per_day": 5}))
        .await
        .key;
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 200, "{v}");
    let used = v["usage"]["total_tokens"].as_u64().unwrap();
    assert!(used >= 5, "{v}");
    usage_until(&s.url(), &key, |u| {
        u["today"]["tokens"].as_u64() == Some(used)
    })
    .await;
    let (st, retry, v) = respond(&s, &key).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    assert_eq!(v["error"]["type"], "insufficient_quota", "{v}");
    let retry = retry.unwrap();
    assert!((1..=86_400).contains(&retry), "until 00:00 UTC: {retry}");
    // What was spent before a restart is known after it (stored usage).
    tokio::task::block_in_place(|| s.restart());
    let u = usage_at(&s.url(), &key).await;
    assert_eq!(u["today"]["tokens"].as_u64(), Some(used), "{u}");
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 429, "{v}");
    // Raising the budget lets it through again.
    let k = s
        .admin_list("/api/admin/keys")
        .await
        .into_iter()
        .find(|k| k["name"] == "budget")
        .unwrap();
    assert_eq!(k["today"]["tokens"].as_u64(), Some(used), "{k}");
    assert_eq!(k["limits"]["tokens_per_day"], 5, "{k}");
    patch_key(
        &s,
        k["id"].as_i64().unwrap(),
        json!({"tokens_per_day": null}),
    )
    .await;
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cost_budget_counts_the_priced_usage() {
    let s = StackBuilder::default().start();
    // One request costs far more than a micro-dollar at the default gpt-5.5 prices.
    let key = s
        .create_key("cost", json!({"cost_per_day_usd": 0.000001}))
        .await
        .key;
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 200, "{v}");
    let input = v["usage"]["input_tokens"].as_u64().unwrap();
    let output = v["usage"]["output_tokens"].as_u64().unwrap();
    let cost = (input as f64 * 1.25 + output as f64 * 10.0).round() / 1e6;
    let u = usage_until(&s.url(), &key, |u| u["today"]["requests"] == 1).await;
    let got = u["today"]["cost_usd"].as_f64().unwrap();
    assert!((got - cost).abs() < 1e-9, "cost {got} != {cost}: {u}");
    assert_eq!(u["limits"]["cost_per_day_usd"], 0.000001);
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("spend"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn model_allow_list_refuses_other_models_as_not_found() {
    let s = StackBuilder::default().start();
    let key = s
        .create_key("models", json!({"allowed_models": ["gpt-5.5"]}))
        .await
        .key;
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 200, "{v}");
    let (st, _, v) = post_at(
        &client(),
        &s.url(),
        "/v1/chat/completions",
        &key,
        &json!({"model": "gpt-6-sol", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    let before = s.mock.requests().len();
    let (st, _, v) = post_at(
        &client(),
        &s.url(),
        "/v1/messages",
        &key,
        &json!({"model": "gpt-6-sol", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    assert_eq!(s.mock.requests().len(), before, "nothing went upstream");
    // The unrestricted key may use it.
    let (st, _, v) = post_at(
        &client(),
        &s.url(),
        "/v1/chat/completions",
        &s.key,
        &json!({"model": "gpt-6-sol", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_of_a_group_only_reaches_accounts_of_that_group() {
    let s = StackBuilder {
        accounts: 3,
        ..StackBuilder::default()
    }
    .start();
    let accounts = s.admin_json("/api/admin/accounts").await;
    let id_of = |acct: &str| {
        accounts["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["chatgpt_account_id"] == acct)
            .unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    for acct in ["acct-1", "acct-2"] {
        let r = s
            .admin_patch(&format!("/api/admin/accounts/{}", id_of(acct)))
            .json(&json!({"account_group": "team-a"}))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["account_group"], "team-a", "{v}");
    }
    let team = s
        .create_key("team", json!({"account_group": "team-a"}))
        .await
        .key;
    s.mock.clear_requests();
    for _ in 0..8 {
        let (st, _, v) = respond(&s, &team).await;
        assert_eq!(st, 200, "{v}");
    }
    let served: Vec<String> = s.served_by();
    assert_eq!(served.len(), 8);
    assert!(
        served.iter().all(|a| a == "acct-1" || a == "acct-2"),
        "{served:?}"
    );
    // The shared pool's key never reaches the group's accounts.
    s.mock.clear_requests();
    for _ in 0..6 {
        let (st, _, _) = respond(&s, &s.key).await;
        assert_eq!(st, 200);
    }
    let served: Vec<String> = s.served_by();
    assert_eq!(served.len(), 6);
    assert!(served.iter().all(|a| a == "acct-0"), "{served:?}");
    // A group with no account: no account available, never the shared pool.
    let lonely = s
        .create_key("lonely", json!({"account_group": "nobody"}))
        .await
        .key;
    s.mock.clear_requests();
    let (st, _, v) = respond(&s, &lonely).await;
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["code"], "no_account_available", "{v}");
    assert!(!s
        .mock
        .requests()
        .iter()
        .any(|r| r.path.ends_with("/responses")));
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_and_disabled_keys_are_refused_like_invalid_keys() {
    let s = StackBuilder::default().start();
    let past = shared_state::now_ms() / 1000 - 10;
    let expired = s.create_key("old", json!({"expires_at": past})).await.key;
    let (st, _, v) = respond(&s, &expired).await;
    assert_eq!(st, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    let future = shared_state::now_ms() / 1000 + 3600;
    let CreatedKey { id, key: k, .. } = s.create_key("new", json!({"expires_at": future})).await;
    assert_eq!(respond(&s, &k).await.0, 200);
    let v = patch_key(&s, id, json!({"enabled": false})).await;
    assert_eq!(v["usable"], false, "{v}");
    let (st, _, v) = respond(&s, &k).await;
    assert_eq!(st, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    let r = client()
        .get(format!("{}/v1/usage", s.url()))
        .bearer_auth(&k)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    patch_key(&s, id, json!({"enabled": true})).await;
    assert_eq!(respond(&s, &k).await.0, 200);
}

/// `/v1/usage` is counted under its own route label, and answers refused by the route table
/// (a 426 for a plain `GET /v1/responses`, a 405) under their route's label, in its dialect.
#[tokio::test(flavor = "multi_thread")]
async fn route_labels_count_usage_and_refusals_under_their_route() {
    let s = StackBuilder::default().start();
    let line = |route: &str, status: u16| {
        format!("codex_gateway_requests_total{{route=\"{route}\",status=\"{status}\"}} 1")
    };
    let r = client()
        .get(format!("{}/v1/usage", s.url()))
        .bearer_auth(&s.key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http_get(&format!("{}/v1/responses", s.url())).await;
    assert_eq!(r.status(), 426);
    assert_eq!(r.headers()["upgrade"], "websocket");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let r = client()
        .put(format!("{}/v1/messages", s.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(
        r.headers().contains_key("request-id"),
        "Anthropic's dialect"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let m = s.metrics_text().await;
    for (route, status) in [("usage", 200), ("responses", 426), ("messages", 405)] {
        assert!(m.contains(&line(route, status)), "{route} {status}: {m}");
    }
    assert!(!m.contains("route=\"other\""), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn v1_usage_shows_the_callers_own_usage_and_limits_only() {
    let s = StackBuilder::default().start();
    let CreatedKey { id, key: mine, .. } = s
        .create_key("mine", json!({"rpm": 100, "tokens_per_month": 1000000}))
        .await;
    for _ in 0..2 {
        assert_eq!(respond(&s, &mine).await.0, 200);
    }
    assert_eq!(respond(&s, &s.key).await.0, 200);
    let u = usage_until(&s.url(), &mine, |u| u["today"]["requests"] == 2).await;
    assert_eq!(u["object"], "usage");
    assert_eq!(u["key"]["id"], id);
    assert_eq!(u["key"]["name"], "mine");
    assert_eq!(u["month"]["requests"], 2);
    assert!(u["today"]["tokens"].as_u64().unwrap() > 0);
    assert_eq!(u["limits"]["rpm"], 100);
    assert_eq!(u["limits"]["tokens_per_month"], 1000000);
    assert_eq!(u["enforcement"], "local", "no Redis configured");
    let other = usage_until(&s.url(), &s.key, |u| u["today"]["requests"] == 1).await;
    assert_eq!(other["key"]["name"], "test");
    // No key, no usage.
    let r = http_get(&format!("{}/v1/usage", s.url())).await;
    assert_eq!(r.status(), 401);
    // The admin API shows the same counts, and the key's last use once stored (every 5 s).
    let mut k = Value::Null;
    for _ in 0..200 {
        let keys = s.admin_json("/api/admin/keys").await;
        k = keys["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["id"] == id)
            .unwrap()
            .clone();
        if k["last_used_at"].is_i64() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(k["month"]["requests"], 2, "{k}");
    assert_eq!(k["today"]["requests"], 2, "{k}");
    assert!(k["last_used_at"].as_i64().unwrap() > 0, "{k}");
}

/// RPM is fleet-wide: requests on instance A count on instance B (one PostgreSQL + Redis).
#[tokio::test(flavor = "multi_thread")]
async fn rpm_is_enforced_across_two_instances_through_redis() {
    let s = StackBuilder {
        postgres: true,
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    let b = s.another_instance(|_| {});
    let b_url = instance_url(&b);
    same_minute_for(30).await;
    let key = s.create_key("fleet", json!({"rpm": 3})).await.key;
    // B learns of the key at its next reload.
    usage_until(&b_url, &key, |u| u["enforcement"] == "fleet").await;
    usage_until(&s.url(), &key, |u| u["enforcement"] == "fleet").await;
    for _ in 0..3 {
        let (st, _, v) = respond(&s, &key).await;
        assert_eq!(st, 200, "{v}");
    }
    // B sees the fleet's count of this minute once reconciled.
    usage_until(&b_url, &key, |u| u["current"]["requests_this_minute"] == 3).await;
    let (st, retry, v) = post_at(
        &client(),
        &b_url,
        "/v1/responses",
        &key,
        &json!({"model": "gpt-5.5", "input": "on B", "stream": false}),
    )
    .await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert!(retry.is_some());
    // Control: without the fleet counter, B alone would have admitted it (its own count is 0
    // of 3): a fresh key shows B admits up to the limit.
    let other = s.create_key("fleet-2", json!({"rpm": 3})).await.key;
    usage_until(&b_url, &other, |u| u["limits"]["rpm"] == 3).await;
    let (st, _, v) = post_at(
        &client(),
        &b_url,
        "/v1/responses",
        &other,
        &json!({"model": "gpt-5.5", "input": "on B", "stream": false}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    tokio::task::block_in_place(|| drop(b));
}

/// Redis unreachable: each instance enforces the limits on its own counters and says so.
#[tokio::test(flavor = "multi_thread")]
async fn redis_down_enforces_locally_and_healthz_says_so() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| {
            c.sidecar.redis_url = Some("redis://127.0.0.1:1/0".into());
        })),
        ..StackBuilder::default()
    }
    .start();
    same_minute_for(20).await;
    let h: Value = s.healthz().await;
    assert_eq!(h["key_limits"], "local", "{h}");
    assert_eq!(h["redis"], "down", "{h}");
    assert_eq!(s.metric("codex_gateway_key_limits_local").await, 1);
    let key = s.create_key("local", json!({"rpm": 2})).await.key;
    assert_eq!(respond(&s, &key).await.0, 200);
    assert_eq!(respond(&s, &key).await.0, 200);
    let (st, _, v) = respond(&s, &key).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(usage_at(&s.url(), &key).await["enforcement"], "local");
}

/// With Redis up, `/healthz` reports fleet-wide enforcement and the metric is 0.
#[tokio::test(flavor = "multi_thread")]
async fn redis_up_reports_fleet_enforcement() {
    let s = StackBuilder {
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    let mut fleet = false;
    for _ in 0..100 {
        let h: Value = s.healthz().await;
        if h["key_limits"] == "fleet" {
            fleet = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fleet);
    assert_eq!(s.metric("codex_gateway_key_limits_local").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_api_validates_and_round_trips_limits() {
    let s = StackBuilder::default().start();
    let r = s
        .admin_post("/api/admin/keys")
        .json(&json!({
            "name": "full", "rpm": 10, "max_concurrency": 2, "tokens_per_day": 1000,
            "tokens_per_month": 20000, "cost_per_day_usd": 1.5, "cost_per_month_usd": 20,
            "allowed_models": ["gpt-5.5", "gpt-6*"], "account_group": "team-a",
            "expires_at": 4102444800u64
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let l = &v["limits"];
    assert_eq!(l["rpm"], 10);
    assert_eq!(l["max_concurrency"], 2);
    assert_eq!(l["cost_per_day_usd"], 1.5);
    assert_eq!(l["cost_per_month_usd"], 20.0);
    assert_eq!(l["allowed_models"], json!(["gpt-5.5", "gpt-6*"]));
    assert_eq!(l["account_group"], "team-a");
    assert_eq!(l["expires_at"], 4102444800u64);
    assert_eq!(l["enabled"], true);
    let id = v["id"].as_i64().unwrap();
    let v = patch_key(&s, id, json!({"rpm": null, "allowed_models": []})).await;
    assert_eq!(v["limits"]["rpm"], Value::Null);
    assert_eq!(v["limits"]["allowed_models"], json!([]));
    assert_eq!(v["limits"]["max_concurrency"], 2, "absent fields stay");
    s.assert_each_refused(
        reqwest::Method::PATCH,
        &format!("/api/admin/keys/{id}"),
        &[
            json!({"rpm": 0}),
            json!({"cost_per_day_usd": -1}),
            json!({"account_group": "not ok"}),
            json!({"unknown": 1}),
            json!({"rpm": "ten"}),
        ],
    )
    .await;
    let r = s
        .admin_patch("/api/admin/keys/999999")
        .json(&json!({"rpm": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // The stored limits are what the data plane enforces: a fresh listing shows them.
    let k = s
        .admin_list("/api/admin/keys")
        .await
        .into_iter()
        .find(|k| k["id"] == id)
        .unwrap();
    assert_eq!(k["limits"]["tokens_per_month"], 20000, "{k}");
    // The CLI sets the same limits.
    let db = s.db.clone();
    let row = std::thread::spawn(move || {
        admin::cli::keys_set(&db, id, &json!({"rpm": 7, "account_group": null})).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(row.limits.rpm, Some(7));
    assert_eq!(row.limits.account_group, None);
}

/// Each Responses WebSocket turn is one request against the key's limits: over the RPM the
/// turn gets an `error` event (429 `rate_limit_exceeded`) and the socket stays open.
#[tokio::test(flavor = "multi_thread")]
async fn websocket_turns_count_against_rpm() {
    use integration_tests::ws_client::{connect_responses, turn};
    let s = StackBuilder::default().start();
    same_minute_for(20).await;
    let key = s.create_key("ws", json!({"rpm": 1})).await.key;
    let (mut ws, _) = connect_responses(&s, &key).await;
    let mut last = Vec::new();
    for i in 0..2 {
        let create =
            json!({"type": "response.create", "model": "gpt-5.5", "input": format!("turn {i}")});
        last = turn(&mut ws, &create).await;
        if i == 0 {
            assert_eq!(
                last.last().unwrap()["type"],
                "response.completed",
                "{last:?}"
            );
        }
    }
    let e = last.last().unwrap();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["status"], 429, "{e}");
    assert_eq!(e["error"]["code"], "rate_limit_exceeded", "{e}");
}
