//! Quota polling over real sockets: the staggered poller against a mock `/wham/usage`
//! (headers, live and persisted quota, plan, limit-reached cooldown), a 401 that triggers
//! exactly one refresh, and the poll-now paths (admin API, CLI).

use std::time::Duration;

use reqwest::Method as M;
use serde_json::json;
use shared_state::Secret;

use crate::{
    sidecar::{config, seed_account, Running, WAIT},
    support::{usage_body, wait_until, MockOAuth, MockUsage, TestDb},
};

#[tokio::test]
async fn poller_is_staggered_and_updates_live_and_stored_quota() {
    let usage = MockUsage::start();
    let db = TestDb::sqlite();
    let s = db.open().await;
    let a = seed_account(s.as_ref(), "acc-q1", "rt1").await;
    let b = seed_account(s.as_ref(), "acc-q2", "rt2").await;
    let c = seed_account(s.as_ref(), "acc-q3", "rt3").await;
    let off = seed_account(s.as_ref(), "acc-q4", "rt4").await;
    s.set_status(off, shared_state::AccountStatus::Disabled)
        .await
        .unwrap();
    usage.set_body("acc-q1", usage_body("pro", 42.5, 7.0, false));
    usage.set_body("acc-q2", usage_body("plus", 12.0, 3.0, false));
    usage.set_body("acc-q3", usage_body("plus", 100.0, 60.0, true));

    let mut cfg = config(&db);
    cfg.upstream_base_url = usage.codex_base();
    // Three pollable accounts: one poll every 200 ms.
    cfg.quota_poll_interval = Duration::from_millis(600);
    let run = Running::start(cfg);

    assert!(
        wait_until(WAIT, || async {
            let rows = s.list_accounts().await.unwrap();
            [a, b, c].iter().all(|id| {
                rows.iter()
                    .any(|r| r.id == *id && r.quota_updated_at.is_some())
            })
        })
        .await,
        "every active account polled and persisted"
    );
    let hits = usage.hits();
    // Spread evenly, in id order, never the disabled account.
    let order: Vec<&str> = hits
        .iter()
        .take(3)
        .map(|h| h.account_id.as_deref().unwrap())
        .collect();
    assert_eq!(order, ["acc-q1", "acc-q2", "acc-q3"]);
    for w in hits.windows(2).take(2) {
        let gap = w[1].at - w[0].at;
        assert!(gap >= Duration::from_millis(100), "staggered: {gap:?}");
    }
    assert!(hits
        .iter()
        .all(|h| h.account_id.as_deref() != Some("acc-q4")));
    // Codex identity headers.
    let h = &hits[0];
    assert_eq!(h.path, "/backend-api/wham/usage");
    let snap = run.snapshot.load_full();
    assert_eq!(
        h.authorization.as_deref(),
        Some(format!("Bearer {}", snap.account(a).unwrap().access_token.expose()).as_str())
    );
    assert_eq!(h.originator.as_deref(), Some(admin::DEFAULT_ORIGINATOR));
    assert_eq!(h.user_agent.as_deref(), Some(admin::DEFAULT_USER_AGENT));

    // Persisted columns.
    let row = s.get_account(a).await.unwrap().unwrap().0;
    assert_eq!(row.primary_used_pct, Some(42.5));
    assert_eq!(row.secondary_used_pct, Some(7.0));
    assert_eq!(row.primary_reset_at, Some(3_900_000_000));
    assert_eq!(row.secondary_reset_at, Some(3_950_000_000));
    assert_eq!(
        row.plan_type.as_deref(),
        Some("pro"),
        "plan from /wham/usage"
    );
    // Live quota, plan republished.
    assert!(
        wait_until(WAIT, || async {
            let snap = run.snapshot.load();
            let acc = snap.account(a).unwrap();
            acc.live.primary_used_pct() == 42.5 && acc.plan.as_deref() == Some("pro")
        })
        .await
    );
    let snap = run.snapshot.load_full();
    assert_eq!(snap.account(a).unwrap().live.secondary_used_pct(), 7.0);
    assert_eq!(
        snap.account(a).unwrap().live.primary_reset_at(),
        3_900_000_000
    );
    assert_eq!(snap.account(b).unwrap().live.primary_used_pct(), 12.0);
    // Limit reached: cooling until the reset, in memory and in storage.
    let now = shared_state::now_ms();
    let cq = snap.account(c).unwrap();
    assert_eq!(cq.live.primary_used_pct(), 100.0);
    assert_eq!(cq.live.cooldown_until_ms(), 3_900_000_000_000);
    assert!(!cq.is_schedulable(now));
    let row = s.get_account(c).await.unwrap().unwrap().0;
    assert_eq!(row.cooldown_until_ms, 3_900_000_000_000);
    assert_eq!(row.cooldown_reason.as_deref(), Some("usage_limit_reached"));
    assert!(snap.account(a).unwrap().is_schedulable(now));
}

#[tokio::test]
async fn usage_401_triggers_exactly_one_refresh() {
    let oauth = MockOAuth::start();
    oauth.add_rt("rt-u", "acc-u", "user-u", "u@x", "plus");
    let usage = MockUsage::start();
    let db = TestDb::sqlite();
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-u", "rt-u").await;
    let old = s.get_account(id).await.unwrap().unwrap().1.access_token;
    usage.reject_token(old.expose());

    let mut cfg = config(&db);
    cfg.oauth_token_url = oauth.url.clone();
    cfg.upstream_base_url = usage.codex_base();
    cfg.quota_poll_interval = Duration::from_millis(100);
    let run = Running::start(cfg);

    // The new token is published and the next polls succeed with it.
    assert!(
        wait_until(WAIT, || async {
            let snap = run.snapshot.load();
            let at = &snap.account(id).unwrap().access_token;
            at != &old
                && usage
                    .hits()
                    .iter()
                    .any(|h| h.authorization.as_deref() == Some(&format!("Bearer {}", at.expose())))
        })
        .await
    );
    assert!(
        wait_until(WAIT, || async {
            s.get_account(id)
                .await
                .unwrap()
                .unwrap()
                .0
                .quota_updated_at
                .is_some()
        })
        .await
    );
    // Several polls saw the old token rejected, yet one refresh ran.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(oauth.calls(), 1, "exactly one refresh");
    let rejected = usage
        .hits()
        .iter()
        .filter(|h| h.authorization.as_deref() == Some(&format!("Bearer {}", old.expose())))
        .count();
    assert!(rejected >= 1);
    assert_eq!(
        Some(
            s.get_account(id)
                .await
                .unwrap()
                .unwrap()
                .1
                .refresh_token
                .expose()
                .to_owned()
        ),
        oauth.current_rt("acc-u"),
        "rotation persisted"
    );
}

#[tokio::test]
async fn poll_now_via_api_and_cli_with_url_override() {
    let usage = MockUsage::start();
    let db = TestDb::sqlite();
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-n", "rt").await;
    usage.set_body(
        "acc-n",
        json!({"planType": "team", "rateLimit": {"limitReached": false,
            "primaryWindow": {"usedPercent": 33, "resetAfterSeconds": 60}}}),
    );
    let mut cfg = config(&db);
    assert!(cfg.quota_poll_interval.is_zero(), "poller off");
    cfg.quota_usage_url = Some(format!("{}/custom/usage", usage.origin));
    cfg.originator = "codex-tui".into();
    cfg.user_agent = "codex-tui/0.1".into();
    let mut run = Running::start(cfg);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(usage.hits().is_empty(), "interval 0 disables polling");

    let (st, body) = run
        .req(
            M::POST,
            &format!("/api/admin/accounts/{id}/quota"),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["primary_used_pct"], 33.0);
    assert_eq!(body["plan"], "team");
    let hits = usage.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].path, "/custom/usage");
    assert_eq!(hits[0].originator.as_deref(), Some("codex-tui"));
    assert_eq!(hits[0].user_agent.as_deref(), Some("codex-tui/0.1"));
    assert_eq!(hits[0].account_id.as_deref(), Some("acc-n"));
    let (st, _) = run
        .req(M::POST, "/api/admin/accounts/999/quota", None, None)
        .await;
    assert_eq!(st, 404);
    run.stop();

    // The CLI path: derived URL, stored columns.
    usage.set_body("acc-n", usage_body("plus", 55.0, 5.0, false));
    let target = db.target();
    let endpoint = admin::quota::UsageEndpoint::for_upstream(&usage.codex_base());
    let res = tokio::task::spawn_blocking(move || {
        admin::cli::accounts_quota(&target, None, &endpoint).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(res.len(), 1);
    let (rid, r) = &res[0];
    assert_eq!(*rid, id);
    assert_eq!(
        r.as_ref().unwrap().primary.unwrap().used_percent,
        Some(55.0)
    );
    let row = s.get_account(id).await.unwrap().unwrap().0;
    assert_eq!(row.primary_used_pct, Some(55.0));
    assert_eq!(row.plan_type.as_deref(), Some("plus"));
    assert_eq!(usage.hits().last().unwrap().path, "/backend-api/wham/usage");

    // A rejected token is reported, not acted on.
    let at: Secret = s.get_account(id).await.unwrap().unwrap().1.access_token;
    usage.reject_token(at.expose());
    let target = db.target();
    let endpoint = admin::quota::UsageEndpoint::for_upstream(&usage.codex_base());
    let res = tokio::task::spawn_blocking(move || {
        admin::cli::accounts_quota(&target, Some(id), &endpoint).unwrap()
    })
    .await
    .unwrap();
    assert!(res[0].1.as_ref().unwrap_err().contains("401"));
}
