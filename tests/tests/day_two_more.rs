//! Day two, continued (issue 27), through the running gateway against mock-codex:
//! - a per-key service tier policy (`pass` / `strip` / `refuse`, unset = the global setting)
//!   decides what happens to a request asking for the priority tier, whatever the global
//!   setting says; a refusal is a 400 in the client's dialect, asserted on what mock-codex
//!   received;
//! - the quota forecast counts the reset credits an account holds (as the quota poller read
//!   them from `/wham/usage`): the admin API's forecast runs out later with them, and says
//!   when it would without;
//! - an admin call acting on many accounts (bulk actions, the batch test, an import) and an
//!   auto-clean pass cleaning several are each one audit entry listing the affected ids;
//!   `audit_retention_days` is a runtime setting (the prune itself: admin/tests/admin/audit.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use benches::{Behaviour, ErrorKind};
use integration_tests::{admin_api::auth_json, client, Stack, StackBuilder};
use serde_json::{json, Value};

/// `accounts` accounts on one worker, tried in id order (`fill_first`).
fn stack(accounts: usize) -> Stack {
    integration_tests::fill_first_stack(accounts)
}

/// An admin API call: (status, JSON answer).
async fn admin(s: &Stack, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let mut r = s.admin_req(method.clone(), path);
    if method != reqwest::Method::GET {
        r = r.body(body.to_string());
    }
    let r = r.send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// Creates a key with `limits` through the admin API: (id, plain key, the key's view).
async fn key_with(s: &Stack, name: &str, limits: Value) -> (i64, String, Value) {
    let mut body = limits;
    body["name"] = json!(name);
    let (st, v) = admin(s, reqwest::Method::POST, "/api/admin/keys", body).await;
    assert_eq!(st, 200, "{v}");
    (
        v["id"].as_i64().unwrap(),
        v["key"].as_str().unwrap().to_owned(),
        v,
    )
}

/// `POST {path}` on the data plane with `key`: (status, JSON answer).
async fn ask(s: &Stack, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .post(format!("{}{path}", s.url()))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The `/responses` requests mock-codex received since the last clear: for each, its
/// `service_tier` (`None`: absent). Clears them.
fn upstream_tiers(s: &Stack) -> Vec<Option<String>> {
    let v = s
        .mock
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .map(|r| {
            r.json
                .as_ref()
                .and_then(|j| j.get("service_tier"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    s.mock.clear_requests();
    v
}

fn fast() -> Value {
    json!({"model": "gpt-5.5", "input": "x", "service_tier": "fast"})
}

fn chat_priority() -> Value {
    json!({
        "model": "gpt-5.5",
        "messages": [{"role": "user", "content": "x"}],
        "service_tier": "priority"
    })
}

/// An OpenAI-shaped refusal of the service tier.
fn assert_tier_refused(st: u16, v: &Value) {
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "service_tier", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keys_service_tier_policy_wins_over_the_global_setting() {
    let s = stack(1);
    let (refuse_id, refuse, view) = key_with(&s, "refuse", json!({"service_tier": "refuse"})).await;
    assert_eq!(view["limits"]["service_tier"], "refuse", "{view}");
    let (_, strip, _) = key_with(&s, "strip", json!({"service_tier": "strip"})).await;
    let (_, pass, _) = key_with(&s, "pass", json!({"service_tier": "pass"})).await;
    let (_, global, view) = key_with(&s, "global", json!({})).await;
    assert!(view["limits"]["service_tier"].is_null(), "{view}");
    s.mock.clear_requests();

    // Global `pass` (the default): the refusing key gets a 400 in the OpenAI shape on both
    // dialects, and nothing reaches the upstream; the key without a policy passes the tier.
    let (st, v) = ask(&s, &refuse, "/v1/responses", &fast()).await;
    assert_tier_refused(st, &v);
    let (st, v) = ask(&s, &refuse, "/v1/chat/completions", &chat_priority()).await;
    assert_tier_refused(st, &v);
    assert!(upstream_tiers(&s).is_empty(), "a refusal reaches nobody");
    let (st, v) = ask(&s, &global, "/v1/responses", &fast()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_tiers(&s), vec![Some("priority".to_owned())]);
    // A request without the priority tier is never refused.
    let (st, v) = ask(
        &s,
        &refuse,
        "/v1/responses",
        &json!({"model": "gpt-5.5", "input": "x"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_tiers(&s), vec![None]);

    // `strip`: served, and mock-codex received no service_tier (both dialects).
    let (st, v) = ask(&s, &strip, "/v1/responses", &fast()).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = ask(&s, &strip, "/v1/chat/completions", &chat_priority()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(upstream_tiers(&s), vec![None, None]);

    // Global `refuse`: the key without a policy follows it; the `pass` key still passes.
    let (st, v) = admin(
        &s,
        reqwest::Method::PUT,
        "/api/admin/settings",
        json!({"service_tier": "refuse"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = ask(&s, &global, "/v1/responses", &fast()).await;
    assert_tier_refused(st, &v);
    assert!(upstream_tiers(&s).is_empty());
    let (st, v) = ask(&s, &pass, "/v1/responses", &fast()).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = ask(&s, &pass, "/v1/chat/completions", &chat_priority()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        upstream_tiers(&s),
        vec![Some("priority".to_owned()), Some("priority".to_owned())]
    );
    let (st, _) = ask(&s, &strip, "/v1/responses", &fast()).await;
    assert_eq!(st, 200);
    assert_eq!(upstream_tiers(&s), vec![None]);

    // Cleared through the API (`null`): the refusing key follows the global `refuse` still;
    // set to `pass` by the CLI, it passes.
    let (st, v) = admin(
        &s,
        reqwest::Method::PATCH,
        &format!("/api/admin/keys/{refuse_id}"),
        json!({"service_tier": null}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["limits"]["service_tier"].is_null(), "{v}");
    let (st, v) = ask(&s, &refuse, "/v1/responses", &fast()).await;
    assert_tier_refused(st, &v);
    let db = s.db.clone();
    let row = std::thread::spawn(move || {
        admin::cli::keys_set(&db, refuse_id, &json!({"service_tier": "pass"})).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(
        row.limits.service_tier,
        Some(shared_state::snapshot::ServiceTierPolicy::Pass)
    );
    // The CLI writes storage; the running gateway picks it up at its next reload.
    let mut served = false;
    for _ in 0..200 {
        let (st, _) = ask(&s, &refuse, "/v1/responses", &fast()).await;
        if st == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the CLI's policy reached the data plane");
    assert_eq!(
        upstream_tiers(&s).last(),
        Some(&Some("priority".to_owned()))
    );

    // An unknown policy is refused by the admin API, naming the field.
    let (st, v) = admin(
        &s,
        reqwest::Method::PATCH,
        &format!("/api/admin/keys/{refuse_id}"),
        json!({"service_tier": "turbo"}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "service_tier", "{v}");
}

/// Over a Responses WebSocket the refusal is the turn's `error` event; the socket stays open.
#[tokio::test(flavor = "multi_thread")]
async fn a_refusing_keys_websocket_turn_gets_an_error_event() {
    use integration_tests::ws_client::{connect_responses, turn};
    let s = stack(1);
    let (_, key, _) = key_with(&s, "ws", json!({"service_tier": "refuse"})).await;
    let (mut ws, _) = connect_responses(&s, &key).await;
    let mut finals = Vec::new();
    for tier in [Some("priority"), None] {
        let mut create = json!({"type": "response.create", "model": "gpt-5.5", "input": "x"});
        if let Some(t) = tier {
            create["service_tier"] = json!(t);
        }
        finals.push(turn(&mut ws, &create).await.pop().expect("a final event"));
    }
    assert_eq!(finals[0]["type"], "error", "{}", finals[0]);
    assert_eq!(finals[0]["status"], 400, "{}", finals[0]);
    assert_eq!(finals[0]["error"]["param"], "service_tier", "{}", finals[0]);
    assert_eq!(finals[1]["type"], "response.completed", "{}", finals[1]);
    let tiers: Vec<_> = s
        .mock
        .requests()
        .iter()
        .filter_map(|r| r.json.as_ref().map(|j| j.get("service_tier").cloned()))
        .collect();
    assert!(
        tiers.iter().all(|t| t.is_none()),
        "the refused turn never went upstream: {tiers:?}"
    );
}

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;

fn ms(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("an instant, not {v}"))
}

/// acct-0 burns 60%/h (10% -> 40% in 30 simulated minutes) and acct-1 idles at 50%: without
/// credits acct-0 is out an hour later and the pool 50 minutes after that (acct-1 takes the
/// demand). With one reset credit on acct-0 (read from `/wham/usage`), acct-0 spends it when
/// it runs out and serves a fresh window (1h40 more at 60%/h): the pool lasts that much
/// longer, and the forecast says when it would run out without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forecast_counts_reset_credits() {
    let t0 = shared_state::now_ms();
    let clock = Arc::new(AtomicU64::new(t0));
    let s = StackBuilder {
        accounts: 2,
        tweak: Some(Box::new({
            let clock = Arc::clone(&clock);
            move |cfg: &mut codex_gateway::config::Config| {
                cfg.sidecar.forecast_clock =
                    shared_state::forecast::Clock::new(move || clock.load(Ordering::SeqCst));
            }
        })),
        ..StackBuilder::default()
    }
    .start();
    let ids: Vec<(String, i64)> = s
        .app
        .snapshot
        .load()
        .accounts
        .iter()
        .map(|a| (a.chatgpt_account_id.clone(), a.id))
        .collect();
    let id_of = |c: &str| ids.iter().find(|(x, _)| x == c).unwrap().1;
    let poll_all = async || {
        for (_, id) in &ids {
            let (st, v) = admin(
                &s,
                reqwest::Method::POST,
                &format!("/api/admin/accounts/{id}/quota"),
                json!({}),
            )
            .await;
            assert_eq!(st, 200, "{v}");
        }
    };
    let forecast = async || {
        let (st, v) = admin(&s, reqwest::Method::GET, "/api/admin/forecast", Value::Null).await;
        assert_eq!(st, 200, "{v}");
        v
    };
    let account = |v: &Value, c: &str| -> Value {
        v["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id_of(c))
            .unwrap()
            .clone()
    };

    s.mock.set_quota("acct-0", 10.0, 5.0);
    s.mock.set_quota("acct-1", 50.0, 20.0);
    poll_all().await;
    let _ = forecast().await;
    let t1 = t0 + 30 * MIN;
    clock.store(t1, Ordering::SeqCst);
    s.mock.set_quota("acct-0", 40.0, 6.0);
    poll_all().await;

    // Without credits.
    let v = forecast().await;
    let a0 = account(&v, "acct-0");
    assert_eq!(a0["reset_credits"], 0, "polled: none held");
    assert_eq!(a0["credits_used"], 0);
    assert_eq!(ms(&a0["exhausts_at_ms"]), t1 + HOUR, "60% left at 60%/h");
    let reset0 = ms(&a0["primary"]["reset_at_ms"]);
    assert_eq!(ms(&a0["capacity_returns_at_ms"]), reset0);
    let pool = &v["pool"];
    assert_eq!(pool["reset_credits"], 0);
    let out = ms(&pool["exhausts_at_ms"]);
    assert!(out.abs_diff(t1 + HOUR + 50 * MIN) <= 5, "{out}");
    assert_eq!(
        pool["exhausts_without_credits_at_ms"],
        pool["exhausts_at_ms"]
    );

    // acct-0 now holds one reset credit; polled at the same simulated instant (the burn is
    // unchanged).
    s.mock.set_reset_credits("acct-0", 1);
    poll_all().await;
    let v = forecast().await;
    let a0 = account(&v, "acct-0");
    assert_eq!(a0["reset_credits"], 1, "{a0}");
    assert_eq!(a0["credits_used"], 1, "{a0}");
    let at = ms(&a0["exhausts_at_ms"]);
    let want = t1 + HOUR + HOUR + 40 * MIN;
    assert!(at.abs_diff(want) <= 5, "{at} vs {want}");
    assert_eq!(
        ms(&a0["capacity_returns_at_ms"]),
        t1 + HOUR + 5 * HOUR,
        "the fresh window's reset"
    );
    let a1 = account(&v, "acct-1");
    assert_eq!(a1["credits_used"], 0);
    assert!(a1["exhausts_at_ms"].is_null());
    let pool = &v["pool"];
    assert_eq!(pool["reset_credits"], 1, "{pool}");
    assert_eq!(pool["credits_used"], 1, "{pool}");
    let out = ms(&pool["exhausts_at_ms"]);
    let want = t1 + HOUR + HOUR + 40 * MIN + 50 * MIN;
    assert!(out.abs_diff(want) <= 5, "{out} vs {want}");
    let without = ms(&pool["exhausts_without_credits_at_ms"]);
    assert!(without.abs_diff(t1 + HOUR + 50 * MIN) <= 5, "{without}");
    assert!(out > without);
}

/// The audit entries of `query` (`?action=...`).
async fn audit(s: &Stack, query: &str) -> Vec<Value> {
    let (st, v) = admin(
        s,
        reqwest::Method::GET,
        &format!("/api/admin/audit{query}"),
        Value::Null,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    v["data"].as_array().unwrap().clone()
}

fn id_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_on_many_accounts_are_one_audit_entry_listing_them() {
    let s = stack(3);
    let mut ids = s.account_ids();
    ids.sort_unstable();
    let missing = 999_999;

    // Bulk disable of two accounts and one that does not exist: one entry, recorded as the
    // single-account action, listing the two disabled and the one that failed.
    let (st, v) = admin(
        &s,
        reqwest::Method::POST,
        "/api/admin/accounts/bulk",
        json!({"ids": [ids[0], ids[1], missing], "action": "disable"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["succeeded"], 2, "{v}");
    let rows = audit(&s, "?action=accounts.disable").await;
    assert_eq!(rows.len(), 1, "one entry, not one per account: {rows:#?}");
    let e = &rows[0];
    assert_eq!(e["actor"], "static_token", "{e}");
    assert_eq!(e["object_type"], "account", "{e}");
    assert_eq!(e["object_id"], id_list(&ids[..2]), "{e}");
    assert_eq!(e["details"]["affected"], json!([ids[0], ids[1]]), "{e}");
    assert_eq!(e["details"]["failed"], json!([missing]), "{e}");
    assert_eq!(
        e["details"]["action"], "disable",
        "the request, as sent: {e}"
    );
    // "Who disabled account N?" finds it by either id, not by an id it did not touch.
    for id in &ids[..2] {
        let rows = audit(&s, &format!("?object_id={id}&action=accounts.disable")).await;
        assert_eq!(rows.len(), 1, "{id}");
    }
    assert!(audit(
        &s,
        &format!("?object_id={}&action=accounts.disable", ids[2])
    )
    .await
    .is_empty());
    // Enabled again in bulk: one more entry.
    let (st, _) = admin(
        &s,
        reqwest::Method::POST,
        "/api/admin/accounts/bulk",
        json!({"ids": [ids[0], ids[1]], "action": "enable"}),
    )
    .await;
    assert_eq!(st, 200);
    let rows = audit(&s, "?action=accounts.enable").await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["object_id"], id_list(&ids[..2]));

    // The batch test of three accounts: one entry listing them.
    let (st, v) = admin(
        &s,
        reqwest::Method::POST,
        "/api/admin/accounts/test",
        json!({"ids": ids, "concurrency": 2}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let rows = audit(&s, "?action=accounts.test").await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["object_id"], id_list(&ids));
    assert_eq!(rows[0]["details"]["affected"], json!(ids));

    // An import of two accounts' files: one entry listing them, no token in it.
    let files: Vec<Value> = s.accounts[..2]
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"name": format!("auth-{i}.json"), "content": auth_json(t)}))
        .collect();
    let (st, v) = admin(
        &s,
        reqwest::Method::POST,
        "/api/admin/accounts/import",
        json!({"files": files}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // (The stack's set-up imported every account through the CLI: one entry too.)
    let cli = audit(&s, "?action=accounts.import&actor=cli").await;
    assert_eq!(cli.len(), 1, "{cli:#?}");
    assert_eq!(cli[0]["object_id"], id_list(&ids), "{}", cli[0]);
    let rows = audit(&s, "?action=accounts.import&actor=static_token").await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["object_id"], id_list(&ids[..2]), "{}", rows[0]);
    let text = rows[0].to_string();
    for t in &s.accounts[..2] {
        for secret in [&t.access_token, &t.refresh_token, &t.id_token] {
            assert!(
                !text.contains(secret.as_str()),
                "a token in the audit entry"
            );
        }
    }
}

/// Stored status of an account, straight from the admin API.
async fn status_of(s: &Stack, id: i64) -> Option<String> {
    let (_, v) = admin(s, reqwest::Method::GET, "/api/admin/accounts", Value::Null).await;
    v["data"]
        .as_array()?
        .iter()
        .find(|a| a["id"] == id)
        .and_then(|a| a["status"].as_str().map(str::to_owned))
}

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Two accounts dead upstream, cleaned in one auto-clean pass: one entry listing both.
#[tokio::test(flavor = "multi_thread")]
async fn an_auto_clean_pass_is_one_audit_entry() {
    let s = stack(3);
    let id = |c: &str| {
        s.app
            .snapshot
            .load()
            .accounts
            .iter()
            .find(|a| a.chatgpt_account_id == c)
            .unwrap()
            .id
    };
    let (id0, id1) = (id("acct-0"), id("acct-1"));
    for a in ["acct-0", "acct-1"] {
        s.mock
            .set_behaviour(a, Behaviour::error(ErrorKind::AccountDeactivated));
    }
    // fill_first: acct-0 then acct-1 are tried (and banned), acct-2 serves.
    let (st, v) = ask(
        &s,
        &s.key,
        "/v1/responses",
        &json!({"model": "gpt-5.5", "input": "x"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    for i in [id0, id1] {
        wait_for("banned in storage", async || {
            status_of(&s, i).await.as_deref() == Some("banned")
        })
        .await;
    }
    // Both dead for longer than the threshold (1.8 s) before auto-clean is turned on, so the
    // first pass that sees the setting takes both.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let (st, v) = admin(
        &s,
        reqwest::Method::PUT,
        "/api/admin/settings",
        json!({"auto_clean_after_hours": 0.0005}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    for i in [id0, id1] {
        wait_for("disabled by auto-clean", async || {
            status_of(&s, i).await.as_deref() == Some("disabled")
        })
        .await;
    }
    let rows = audit(&s, "?actor=auto-clean").await;
    assert_eq!(rows.len(), 1, "one entry for the pass: {rows:#?}");
    let e = &rows[0];
    assert_eq!(e["action"], "accounts.disable", "{e}");
    let mut both = [id0, id1];
    both.sort_unstable();
    let listed: Vec<i64> = e["object_id"]
        .as_str()
        .unwrap()
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let mut sorted = listed.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, both, "{e}");
    assert_eq!(e["details"]["accounts"].as_array().unwrap().len(), 2, "{e}");
    assert_eq!(e["after"], json!({"status": "disabled"}), "{e}");
    assert_eq!(e["before"]["status"][id0.to_string()], "banned", "{e}");
}

/// `audit_retention_days` is a runtime setting like the others: 180 by default, 0 keeps the
/// log forever, out-of-range values are refused naming the setting.
#[tokio::test(flavor = "multi_thread")]
async fn audit_retention_is_a_runtime_setting() {
    let s = stack(1);
    let (st, v) = admin(&s, reqwest::Method::GET, "/api/admin/settings", Value::Null).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["audit_retention_days"], 180, "{v}");
    for (days, want) in [(json!(0), 0), (json!("30"), 30)] {
        let (st, v) = admin(
            &s,
            reqwest::Method::PUT,
            "/api/admin/settings",
            json!({"audit_retention_days": days}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["audit_retention_days"], want, "{v}");
    }
    for bad in [json!(-1), json!(36_501), json!("forever")] {
        let (st, v) = admin(
            &s,
            reqwest::Method::PUT,
            "/api/admin/settings",
            json!({"audit_retention_days": bad}),
        )
        .await;
        assert_eq!(st, 400, "{bad}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("audit_retention_days")),
            "{v}"
        );
    }
    // The change is audited like any setting, with its before and after.
    let rows = audit(&s, "?action=settings").await;
    let last = rows.iter().find(|r| r["status"] == 200).unwrap();
    assert_eq!(last["after"]["audit_retention_days"], 30, "{last}");
    assert_eq!(last["before"]["audit_retention_days"], 0, "{last}");
}
