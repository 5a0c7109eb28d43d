//! Pool state that must follow the operator and stay bound to its account (issue 9): every
//! runtime setting changed through `PUT /api/admin/settings` changes what the next request
//! does; `x-codex-turn-state` only goes back to the account that issued it; chat requests get
//! a stable per-conversation `prompt_cache_key`; affinity is scoped per client key and counts
//! body-level `session_id` / `conversation_id`.

use benches::{Behaviour, ErrorKind};
use integration_tests::{client, Stack, StackBuilder};
use serde_json::{json, Value};
use shared_state::snapshot::Strategy;

/// `accounts` accounts on one worker, tried in id order (`fill_first`) unless a test changes
/// the strategy through the admin API.
fn stack(accounts: usize) -> Stack {
    integration_tests::fill_first_stack(accounts)
}

async fn ask(s: &Stack, body: Value) -> (u16, Value) {
    let r = s.post_json("/v1/responses", &body).await;
    let st = r.status().as_u16();
    (st, r.json().await.unwrap())
}

async fn ask_x(s: &Stack) -> (u16, Value) {
    ask(s, json!({"model":"gpt-5.5","input":"x"})).await
}

/// The accounts the upstream saw since the last `clear_requests`, in order.
fn take_served(s: &Stack) -> Vec<String> {
    let v = s.served_by();
    s.mock.clear_requests();
    v
}

// ---------------------------------------------------------------------------------------
// Defect 3: every hot setting reaches the data plane.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn max_attempts_setting_is_hot() {
    // Configured: 3 attempts. Every account answers 500 (account-scoped: fails over).
    let s = stack(7);
    for i in 0..7 {
        s.mock
            .set_behaviour(&format!("acct-{i}"), Behaviour::error(ErrorKind::Internal));
    }
    let _ = ask_x(&s).await;
    assert_eq!(take_served(&s), vec!["acct-0", "acct-1", "acct-2"]);

    // Fewer than configured.
    s.post_each_account("enable").await;
    let v = s.put_settings(json!({"max_attempts": 2})).await;
    assert_eq!(v["max_attempts"], 2);
    let _ = ask_x(&s).await;
    assert_eq!(take_served(&s), vec!["acct-0", "acct-1"]);

    // More than configured (and more than the configured candidate headroom).
    s.post_each_account("enable").await;
    s.put_settings(json!({"max_attempts": 6})).await;
    let _ = ask_x(&s).await;
    assert_eq!(
        take_served(&s),
        vec!["acct-0", "acct-1", "acct-2", "acct-3", "acct-4", "acct-5"]
    );

    // `null` goes back to the configured value.
    s.post_each_account("enable").await;
    s.put_settings(json!({"max_attempts": null})).await;
    let _ = ask_x(&s).await;
    assert_eq!(take_served(&s), vec!["acct-0", "acct-1", "acct-2"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn strategy_setting_is_hot() {
    let s = stack(2);
    for _ in 0..4 {
        assert_eq!(ask_x(&s).await.0, 200);
    }
    assert_eq!(
        take_served(&s),
        vec!["acct-0"; 4],
        "fill_first as configured"
    );
    s.put_settings(json!({"strategy": "round_robin"})).await;
    for _ in 0..4 {
        assert_eq!(ask_x(&s).await.0, 200);
    }
    let served = take_served(&s);
    assert_eq!(
        served.iter().filter(|a| *a == "acct-0").count(),
        2,
        "round robin over two accounts: {served:?}"
    );
    assert_ne!(served[0], served[1], "{served:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_threshold_setting_is_hot() {
    let s = stack(2);
    // acct-0 reports 95 % of its 5 h window used (response headers).
    s.mock.set_quota("acct-0", 95.0, 10.0);
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(
        take_served(&s),
        vec!["acct-0", "acct-0"],
        "no pause threshold configured"
    );
    s.put_settings(json!({"pause_threshold_pct": 90})).await;
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-1"], "acct-0 is paused at 95 %");
    s.put_settings(json!({"pause_threshold_pct": "off"})).await;
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-0"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn min_request_interval_setting_is_hot() {
    let s = stack(2);
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-0", "acct-0"]);
    // One minute between two starts on one account: acct-0 started a moment ago, so acct-1
    // serves; then neither may start another request.
    s.put_settings(json!({"min_request_interval_ms": 60000}))
        .await;
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-1"]);
    assert_eq!(ask_x(&s).await.0, 503);
    assert_eq!(take_served(&s), Vec::<String>::new());
    s.put_settings(json!({"min_request_interval_ms": 0})).await;
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-0"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn default_max_concurrency_setting_is_hot() {
    let s = stack(2);
    let open_stream = || {
        let req = s.post("/v1/responses").json(&json!({
            "model":"gpt-5.5","input":"x","stream":true,
            "client_metadata":{"x-mock-tokens":"1000000","x-mock-inter-event-delay-ms":"50"}
        }));
        async move { req.send().await.unwrap() }
    };
    // Unlimited (configured): a second request joins the open stream on acct-0.
    let first = open_stream().await;
    assert_eq!(first.status(), 200);
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-0", "acct-0"]);
    // One slot per account: acct-0 is full while its stream is open.
    s.put_settings(json!({"default_max_concurrency": 1})).await;
    assert_eq!(s.account("acct-0").in_flight, 1);
    assert_eq!(ask_x(&s).await.0, 200);
    assert_eq!(take_served(&s), vec!["acct-1"]);
    drop(first);
}

// ---------------------------------------------------------------------------------------
// Defect 4: x-codex-turn-state stays with the account that issued it.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn turn_state_goes_only_to_the_account_that_issued_it() {
    let s = stack(2);
    // The first request of a turn: acct-0 serves and issues a turn state.
    let r = s.post_responses_x(true).await;
    assert_eq!(r.status(), 200);
    let ts = r
        .headers()
        .get("x-codex-turn-state")
        .expect("turn state visible to the client")
        .to_str()
        .unwrap()
        .to_owned();
    r.text().await.unwrap();
    let issued = s.mock.requests().pop().unwrap();
    assert_eq!(issued.account_id(), Some("acct-0"));
    assert_eq!(issued.header("x-codex-turn-state"), None);
    s.mock.clear_requests();

    // The follow-up of the turn, on the same account: the turn state goes back as issued.
    let follow = |ts: &str| {
        s.post("/v1/responses")
            .header("x-codex-turn-state", ts)
            .json(&json!({"model":"gpt-5.5","input":"y","stream":true}))
    };
    let r = follow(&ts).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let reqs = s.mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].account_id(), Some("acct-0"));
    let upstream_ts = reqs[0]
        .header("x-codex-turn-state")
        .expect("echoed to the issuing account")
        .to_owned();
    assert!(upstream_ts.starts_with("ts-"), "{upstream_ts}");
    s.mock.clear_requests();

    // The follow-up fails over: acct-0 still gets it, acct-1 never does.
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::ServerIsOverloaded).times(1),
    );
    let r = follow(&ts).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let ts1 = r
        .headers()
        .get("x-codex-turn-state")
        .map(|v| v.to_str().unwrap().to_owned());
    r.text().await.unwrap();
    let reqs = s.mock.requests();
    let seen: Vec<(Option<&str>, Option<&str>)> = reqs
        .iter()
        .map(|r| (r.account_id(), r.header("x-codex-turn-state")))
        .collect();
    assert_eq!(
        seen,
        vec![
            (Some("acct-0"), Some(upstream_ts.as_str())),
            (Some("acct-1"), None)
        ],
        "the turn state of acct-0 never reaches acct-1"
    );
    // What the client now holds is acct-1's turn state: acct-0 does not get it either.
    let ts1 = ts1.expect("acct-1 issued a turn state");
    assert_ne!(ts1, ts);
    s.post_each_account("enable").await;
    s.mock.clear_requests();
    let r = follow(&ts1).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let reqs = s.mock.requests();
    assert_eq!(reqs[0].account_id(), Some("acct-0"));
    assert_eq!(reqs[0].header("x-codex-turn-state"), None);
}

// ---------------------------------------------------------------------------------------
// Defect 6: chat requests get a stable per-conversation prompt_cache_key.
// ---------------------------------------------------------------------------------------

async fn chat_cache_key(s: &Stack, key: &str, messages: Value) -> Option<String> {
    s.mock.clear_requests();
    let r = client()
        .post(format!("{}/v1/chat/completions", s.url()))
        .bearer_auth(key)
        .json(&json!({"model":"gpt-5.5","messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let req = s.mock.requests().pop().unwrap();
    let body = req.json.clone().expect("json body");
    body["prompt_cache_key"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_requests_get_a_stable_conversation_cache_key() {
    let s = stack(1);
    let other_key = s.create_key("other", json!({})).await.key;
    let sys = json!({"role":"system","content":"You are terse."});
    let u1 = json!({"role":"user","content":"What is 2+2?"});
    let a1 = json!({"role":"assistant","content":"4"});
    let u2 = json!({"role":"user","content":"And 3+3?"});

    let first = chat_cache_key(&s, &s.key, json!([sys, u1])).await;
    let first = first.expect("a default prompt_cache_key");
    // The same conversation, one turn later: the same key.
    let later = chat_cache_key(&s, &s.key, json!([sys, u1, a1, u2])).await;
    assert_eq!(later.as_deref(), Some(first.as_str()));
    // Another conversation: another key.
    let other = chat_cache_key(
        &s,
        &s.key,
        json!([sys, {"role":"user","content":"What is the capital of France?"}]),
    )
    .await;
    assert!(other.is_some() && other.as_deref() != Some(first.as_str()));
    let other_sys = chat_cache_key(
        &s,
        &s.key,
        json!([{"role":"system","content":"You are verbose."}, u1]),
    )
    .await;
    assert!(other_sys.is_some() && other_sys.as_deref() != Some(first.as_str()));
    // The same conversation from another client key: another key.
    let other_client = chat_cache_key(&s, &other_key, json!([sys, u1])).await;
    assert!(other_client.is_some() && other_client.as_deref() != Some(first.as_str()));
    // A client's own prompt_cache_key wins.
    s.mock.clear_requests();
    let r = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model":"gpt-5.5","prompt_cache_key":"mine","messages":[sys, u1]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let body = s.mock.requests().pop().unwrap().json.unwrap();
    assert_eq!(body["prompt_cache_key"], "mine");
}

// ---------------------------------------------------------------------------------------
// Affinity: scoped per client key; body-level session ids count.
// ---------------------------------------------------------------------------------------

fn sticky_stack() -> Stack {
    StackBuilder {
        accounts: 8,
        workers: 1,
        strategy: Some(Strategy::Sticky),
        ..StackBuilder::default()
    }
    .start()
}

async fn served_for(s: &Stack, key: &str, headers: &[(&str, &str)], body: Value) -> String {
    s.mock.clear_requests();
    let mut req = client()
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(key)
        .json(&body);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let served = s.served_by();
    assert_eq!(served.len(), 1, "{served:?}");
    served[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn affinity_is_scoped_per_client_key() {
    let s = sticky_stack();
    let other_key = s.create_key("other", json!({})).await.key;
    let mut differ = 0;
    for i in 0..8 {
        let body = json!({"model":"gpt-5.5","input":"x","prompt_cache_key": format!("pck-{i}")});
        let a = served_for(&s, &s.key, &[], body.clone()).await;
        let a2 = served_for(&s, &s.key, &[], body.clone()).await;
        let b = served_for(&s, &other_key, &[], body.clone()).await;
        let b2 = served_for(&s, &other_key, &[], body).await;
        assert_eq!(a, a2, "a session stays home");
        assert_eq!(b, b2, "a session stays home");
        differ += usize::from(a != b);
    }
    // Eight accounts, eight cache keys: without the scoping every pair shares its home.
    assert!(
        differ > 0,
        "two client keys with the same prompt_cache_key share a home account"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn body_session_ids_are_session_keys() {
    let s = sticky_stack();
    for i in 0..8 {
        let sid = format!("sess-{i}");
        let by_header = served_for(
            &s,
            &s.key,
            &[("session-id", &sid)],
            json!({"model":"gpt-5.5","input":"x"}),
        )
        .await;
        for field in ["session_id", "conversation_id"] {
            // Several requests without any other session signal: each lands on the
            // session's home, the same as the header's.
            for _ in 0..2 {
                let by_body = served_for(
                    &s,
                    &s.key,
                    &[],
                    json!({"model":"gpt-5.5","input":"x", field: sid}),
                )
                .await;
                assert_eq!(by_body, by_header, "{field} = {sid}");
            }
        }
    }
}
