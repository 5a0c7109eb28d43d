//! Pool behaviour on day two (issue 27), through the running gateway against mock-codex:
//! a request that finds every account cooling waits (bounded by `max_wait_for_account_ms`)
//! for the earliest one instead of an immediate 503; a `cyber_policy` refusal moves the
//! session to another account without penalising the refusing one; the `service_tier`
//! setting passes, strips or refuses the priority ("fast") tier; Cloudflare cookies are kept
//! per account and sent back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use benches::{Behaviour, ErrorKind};
use integration_tests::Stack;
use serde_json::{json, Value};

/// `accounts` accounts on one worker, tried in id order (`fill_first`).
fn stack(accounts: usize) -> Stack {
    integration_tests::fill_first_stack(accounts)
}

/// `PUT /api/admin/settings` with `body`: (status, answer).
async fn put_settings(s: &Stack, body: Value) -> (u16, Value) {
    let r = s
        .admin_put("/api/admin/settings")
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap())
}

async fn ask_on(s: &Stack, path: &str, session: Option<&str>, body: Value) -> (u16, Value) {
    let mut r = s.post(path).json(&body);
    if let Some(id) = session {
        r = r.header("session_id", id);
    }
    let r = r.send().await.unwrap();
    let st = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn ask(s: &Stack, session: Option<&str>) -> (u16, Value) {
    ask_on(
        s,
        "/v1/responses",
        session,
        json!({"model":"gpt-5.5","input":"x"}),
    )
    .await
}

/// The accounts the upstream saw since the last call, in order.
fn take_served(s: &Stack) -> Vec<String> {
    let v = s.served_by();
    s.mock.clear_requests();
    v
}

/// Makes `acct` answer one 429 with `Retry-After: secs` (so it cools that long), then serve.
async fn cool(s: &Stack, acct: &str, secs: u64) {
    let mut b = Behaviour::error(ErrorKind::RateLimitExceeded);
    b.retry_after = Some(secs.to_string());
    s.mock.set_behaviour(acct, b);
    let (st, _) = ask(s, None).await;
    assert_eq!(st, 429);
    s.mock.clear_behaviour(acct);
    assert!(s.account(acct).cooling_ms > 0, "{acct} cools");
    s.mock.clear_requests();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_waits_for_the_earliest_cooling_account_within_the_bound() {
    let s = stack(1);

    // 0 = never wait: the 503 at once, as before the setting existed.
    let (st, v) = put_settings(&s, json!({"max_wait_for_account_ms": 0})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["max_wait_for_account_ms"], 0);
    cool(&s, "acct-0", 1).await;
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 503, "{v}");
    assert!(take_served(&s).is_empty());

    // Back to the default (3 s): the request waits for the account's comeback and is served.
    let (st, v) = put_settings(&s, json!({"max_wait_for_account_ms": null})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["max_wait_for_account_ms"], 3000);
    // Let the previous cooldown pass first.
    while s.account("acct-0").cooling_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    cool(&s, "acct-0", 1).await;
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(take_served(&s), vec!["acct-0"]);

    // A comeback past the bound is not waited for: the 503 as before.
    cool(&s, "acct-0", 30).await;
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 503, "{v}");
    assert!(take_served(&s).is_empty());

    // Out of range: refused by the admin API.
    let (st, v) = put_settings(&s, json!({"max_wait_for_account_ms": 600000})).await;
    assert_eq!(st, 400, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cyber_policy_moves_the_session_and_spares_the_account() {
    let s = stack(2);
    s.mock
        .set_behaviour("acct-0", Behaviour::error(ErrorKind::CyberPolicy));

    // acct-0 refuses the session's content: the request moves on to acct-1.
    let (st, v) = ask(&s, Some("cyber-session")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(take_served(&s), vec!["acct-0", "acct-1"]);

    // acct-0 is not penalised: no cooldown, no failure in its health.
    let acct0 = s.account("acct-0");
    assert_eq!(acct0.cooling_ms, 0);
    assert_eq!(acct0.status, "active");
    {
        let snap = s.app.snapshot.load();
        let a = snap
            .accounts
            .iter()
            .find(|a| a.chatgpt_account_id == "acct-0")
            .unwrap();
        let h = a.live.scheduler();
        assert_eq!(
            h.consecutive_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        assert_eq!(h.error_rate.load(), 0.0);
    }

    // The session stays away from acct-0 (fill_first would put it first) ...
    s.mock.clear_behaviour("acct-0");
    let (st, v) = ask(&s, Some("cyber-session")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(take_served(&s), vec!["acct-1"]);

    // ... while other sessions (and requests without one) still get it.
    let (st, v) = ask(&s, Some("another-session")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(take_served(&s), vec!["acct-0"]);
    let (st, _) = ask(&s, None).await;
    assert_eq!(st, 200);
    assert_eq!(take_served(&s), vec!["acct-0"]);

    // Every account refusing: the client gets the upstream's refusal (a 400), no account cools.
    for a in ["acct-0", "acct-1"] {
        s.mock
            .set_behaviour(a, Behaviour::error(ErrorKind::CyberPolicy));
    }
    let (st, v) = ask(&s, Some("third-session")).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "cyber_policy", "{v}");
    assert_eq!(take_served(&s), vec!["acct-0", "acct-1"]);
    assert_eq!(s.account("acct-0").cooling_ms, 0);
    assert_eq!(s.account("acct-1").cooling_ms, 0);
}

/// The `service_tier` of the last request the upstream saw (`None`: absent).
fn upstream_tier(s: &Stack) -> Option<String> {
    let reqs = s.mock.requests();
    let r = reqs
        .iter()
        .rev()
        .find(|r| r.path.ends_with("/responses"))
        .expect("an upstream request");
    r.json
        .as_ref()
        .and_then(|j| j.get("service_tier"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn service_tier_setting_passes_strips_or_refuses_the_priority_tier() {
    let s = stack(1);
    let fast = json!({"model":"gpt-5.5","input":"x","service_tier":"fast"});
    let chat_fast = json!({
        "model":"gpt-5.5",
        "messages":[{"role":"user","content":"x"}],
        "service_tier":"priority"
    });

    // Default: passed through (normalised to `priority`).
    let (st, v) = ask_on(&s, "/v1/responses", None, fast.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_tier(&s).as_deref(), Some("priority"));
    s.mock.clear_requests();

    // strip: served at the default tier.
    let (st, v) = put_settings(&s, json!({"service_tier": "strip"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["service_tier"], "strip");
    let (st, v) = ask_on(&s, "/v1/responses", None, fast.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_tier(&s), None);
    let (st, v) = ask_on(&s, "/v1/chat/completions", None, chat_fast.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_tier(&s), None);
    s.mock.clear_requests();

    // refuse: a 400 in the client's dialect, nothing sent upstream.
    let (st, v) = put_settings(&s, json!({"service_tier": "refuse"})).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = ask_on(&s, "/v1/responses", None, fast.clone()).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "service_tier", "{v}");
    let (st, v) = ask_on(&s, "/v1/chat/completions", None, chat_fast).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "service_tier", "{v}");
    assert!(take_served(&s).is_empty());
    // A request without the priority tier is untouched.
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 200, "{v}");

    // Unknown value: refused by the admin API.
    let (st, v) = put_settings(&s, json!({"service_tier": "turbo"})).await;
    assert_eq!(st, 400, "{v}");
}

/// The `cookie` header of each upstream `/responses` request since the last clear, with the
/// account it went to.
fn upstream_cookies(s: &Stack) -> Vec<(String, Option<String>)> {
    let v = s
        .mock
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .map(|r| {
            (
                r.account_id().unwrap_or_default().to_owned(),
                r.header("cookie").map(str::to_owned),
            )
        })
        .collect();
    s.mock.clear_requests();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn cloudflare_cookies_are_kept_per_account_and_sent_back() {
    let s = stack(2);
    let cookie = |c: &str| Behaviour {
        set_cookie: Some(c.into()),
        ..Behaviour::default()
    };
    s.mock
        .set_behaviour("acct-0", cookie("__cf_bm=bm-of-acct-0"));
    s.mock
        .set_behaviour("acct-1", cookie("tracking=not-cloudflare"));

    // The first request has no cookie; the upstream sets one.
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_cookies(&s), vec![("acct-0".to_owned(), None)]);

    // acct-0's later requests send it back; acct-1 (reached after a 500 on acct-0) never
    // gets acct-0's cookie, and a non-Cloudflare cookie is not kept.
    s.mock
        .set_behaviour("acct-0", Behaviour::error(ErrorKind::Internal));
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        upstream_cookies(&s),
        vec![
            ("acct-0".to_owned(), Some("__cf_bm=bm-of-acct-0".to_owned())),
            ("acct-1".to_owned(), None),
        ]
    );
    let (st, v) = ask(&s, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_cookies(&s), vec![("acct-1".to_owned(), None)]);
}
