//! The scheduling strategies end to end (issue 9): each one is switched on at run time with
//! `PUT /api/admin/settings {"strategy": ...}` on a stack started with the default (`smart`),
//! and the accounts mock-codex saw show the order the gateway tried them in.

use benches::{Behaviour, ErrorKind};
use integration_tests::{Stack, StackBuilder};
use serde_json::{json, Value};
use shared_state::{AccountEffect, AccountStatus};

/// `accounts` accounts on one worker (one round-robin cursor), default strategy.
fn stack(accounts: usize) -> Stack {
    StackBuilder {
        accounts,
        workers: 1,
        ..StackBuilder::default()
    }
    .start()
}

/// `PUT /api/admin/settings {"strategy": name}`, then waits until the data plane has it.
async fn set_strategy(s: &Stack, name: &str) {
    let v = s.put_settings(json!({ "strategy": name })).await;
    assert_eq!(v["strategy"], name, "{v}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while s.app.snapshot.load().settings.strategy.as_str() != name {
        assert!(
            std::time::Instant::now() < deadline,
            "strategy never published"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// One non-streaming request with `body`; returns the accounts the upstream saw for it.
async fn served(s: &Stack, body: Value) -> Vec<String> {
    s.mock.clear_requests();
    let r = s.post_json("/v1/responses", &body).await;
    let st = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_eq!(st, 200, "{v}");
    s.served_by()
}

async fn served_plain(s: &Stack) -> Vec<String> {
    served(s, json!({"model":"gpt-5.5","input":"x"})).await
}

async fn served_session(s: &Stack, session: &str) -> Vec<String> {
    served(
        s,
        json!({"model":"gpt-5.5","input":"x","prompt_cache_key": session}),
    )
    .await
}

fn live(s: &Stack, chatgpt_account_id: &str) -> std::sync::Arc<shared_state::AccountEntry> {
    s.app
        .snapshot
        .load()
        .accounts
        .iter()
        .find(|a| a.chatgpt_account_id == chatgpt_account_id)
        .cloned()
        .expect("account in snapshot")
}

#[tokio::test(flavor = "multi_thread")]
async fn round_robin_serves_the_accounts_in_turn() {
    let s = stack(3);
    set_strategy(&s, "round_robin").await;
    let mut order = Vec::new();
    for _ in 0..9 {
        let v = served_plain(&s).await;
        assert_eq!(v.len(), 1, "{v:?}");
        order.push(v[0].clone());
    }
    // Every account once per cycle of three, in the same rotation each cycle.
    let mut first: Vec<_> = order[..3].to_vec();
    first.sort();
    assert_eq!(first, vec!["acct-0", "acct-1", "acct-2"], "{order:?}");
    assert_eq!(order[..3], order[3..6], "{order:?}");
    assert_eq!(order[..3], order[6..], "{order:?}");

    // An account that cannot serve (cooling after a failure) is skipped.
    s.mock
        .set_behaviour("acct-1", Behaviour::error(ErrorKind::ServerIsOverloaded));
    let mut rest = Vec::new();
    for _ in 0..6 {
        let v = served_plain(&s).await;
        rest.push(v.last().unwrap().clone());
    }
    assert!(s.account("acct-1").cooling_ms > 0);
    assert!(!rest.contains(&"acct-1".to_owned()), "{rest:?}");
    // The cursor keeps turning: the skipped account's turn falls to the next one in the
    // rotation, so both remaining accounts keep getting traffic.
    for a in ["acct-0", "acct-2"] {
        assert!(
            rest.iter().filter(|x| *x == a).count() >= 2,
            "{a}: {rest:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sticky_keeps_a_session_home_and_moves_it_only_when_home_fails() {
    let s = stack(4);
    set_strategy(&s, "sticky").await;
    let sessions: Vec<String> = (0..6).map(|i| format!("sticky-{i}")).collect();
    let mut homes = Vec::new();
    for k in &sessions {
        let first = served_session(&s, k).await;
        assert_eq!(first.len(), 1, "{first:?}");
        for _ in 0..2 {
            assert_eq!(served_session(&s, k).await, first, "{k} stays home");
        }
        homes.push(first[0].clone());
    }
    let mut distinct = homes.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 1,
        "six sessions over four accounts share one home: {homes:?}"
    );

    // Session 0's home fails: the request fails over, and the session then stays on the
    // account it moved to while its home cannot serve.
    let home = homes[0].clone();
    s.mock
        .set_behaviour(&home, Behaviour::error(ErrorKind::ServerIsOverloaded));
    let v = served_session(&s, &sessions[0]).await;
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!(v[0], home, "{v:?}");
    let moved = v[1].clone();
    assert_ne!(moved, home);
    assert!(s.account(&home).cooling_ms > 0);
    for _ in 0..2 {
        assert_eq!(
            served_session(&s, &sessions[0]).await,
            vec![moved.clone()],
            "the session moved once and stays"
        );
    }
    // Sessions at home elsewhere are not disturbed.
    for (k, h) in sessions.iter().zip(&homes).skip(1) {
        if *h != home {
            assert_eq!(served_session(&s, k).await, vec![h.clone()], "{k}");
        }
    }

    // Home serves again: the session goes back (rendezvous hashing over schedulable
    // accounts).
    s.mock.clear_behaviour(&home);
    live(&s, &home).live.apply(&AccountEffect::OperatorStatus {
        status: AccountStatus::Active,
        cooldown_until_ms: 0,
    });
    assert_eq!(served_session(&s, &sessions[0]).await, vec![home]);
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_reset_priority_prefers_the_soonest_reset() {
    let s = stack(3);
    set_strategy(&s, "quota_reset_priority").await;
    // The windows the gateway knows of (as if learnt from earlier responses): acct-1's primary
    // window resets first, then acct-2's, then acct-0's. mock-codex answers with its own
    // window (about five hours away) for every account, so an account that has served moves
    // behind the ones that reset sooner.
    let now = shared_state::now_ms() / 1000;
    for (a, in_s) in [("acct-0", 3 * 3600), ("acct-1", 3600), ("acct-2", 2 * 3600)] {
        live(&s, a).live.apply(&AccountEffect::quota(
            Some(10.0),
            Some(now + in_s),
            Some(10.0),
            Some(now + 86_400),
        ));
    }
    let mut order = Vec::new();
    for _ in 0..3 {
        let v = served_plain(&s).await;
        assert_eq!(v.len(), 1, "{v:?}");
        order.push(v[0].clone());
    }
    assert_eq!(order, vec!["acct-1", "acct-2", "acct-0"]);
    // The response headers were learnt: each account now resets when mock-codex says.
    let mock_reset = live(&s, "acct-1").live.primary_reset_at();
    assert!(mock_reset > now + 3 * 3600, "{mock_reset} vs {now}");

    // An exhausted account goes last even when it resets soonest (mock-codex reports 100 %).
    for (a, in_s) in [("acct-0", 600), ("acct-1", 1200), ("acct-2", 1800)] {
        live(&s, a).live.apply(&AccountEffect::quota(
            Some(10.0),
            Some(now + in_s),
            Some(10.0),
            Some(now + 86_400),
        ));
    }
    s.mock.set_quota("acct-0", 100.0, 10.0);
    assert_eq!(
        served_plain(&s).await,
        vec!["acct-0"],
        "learns it is exhausted"
    );
    // acct-0 still resets soonest (its reset instant is mock-codex's now, ~5 h), but is out
    // of quota; acct-1 (20 min) goes first.
    live(&s, "acct-0")
        .live
        .apply(&AccountEffect::quota(None, Some(now + 600), None, None));
    assert_eq!(served_plain(&s).await, vec!["acct-1"]);
}
