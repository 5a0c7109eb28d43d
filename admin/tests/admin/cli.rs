//! The blocking CLI helpers the gateway binary calls: account status/delete, token refresh,
//! settings, and how their changes reach a running sidecar in another "process" (the same
//! database, no shared memory) through its reload loop.

use std::time::Duration;

use admin::{storage::AccountUpsert, DbTarget};
use shared_state::{AccountEffect, AccountStatus, Secret, WorkerCommand};

use crate::{
    sidecar::{config, seed_account, Running, WAIT},
    support::{both_backends, jwt, wait_until, MockOAuth, TestDb, FAR_EXP},
};

/// Runs a blocking CLI helper off the async test thread.
async fn cli<T: Send + 'static>(db: &TestDb, f: impl FnOnce(&DbTarget) -> T + Send + 'static) -> T {
    let target = db.target();
    tokio::task::spawn_blocking(move || f(&target))
        .await
        .unwrap()
}

async fn cli_changes_reach_a_running_sidecar(db: &TestDb) {
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-cli", "rt").await;
    let mut cfg = config(db); // reload every 200 ms
    cfg.settings.max_attempts = 4;
    let run = Running::start(cfg);
    let live = std::sync::Arc::clone(&run.snapshot.load().account(id).unwrap().live);

    // Disable from "another process": published within the reload interval, sockets evicted.
    assert!(cli(db, move |t| admin::cli::accounts_disable(t, id).unwrap()).await);
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().account(id).map(|a| a.status) == Some(AccountStatus::Disabled)
        })
        .await,
        "disable published by the reload loop"
    );
    let mut saw_evict = false;
    while let Ok(Some(cmd)) =
        tokio::time::timeout(Duration::from_millis(100), run.boxes[0].recv()).await
    {
        saw_evict |= cmd == WorkerCommand::EvictAccount { account_id: id };
    }
    assert!(saw_evict, "a disabled account's sockets are evicted");

    // Enable clears the cooldown (stored and live).
    live.apply(&AccountEffect::cooldown(u64::MAX / 2, "test"));
    s.set_cooldown(id, u64::MAX / 4, Some("overloaded"))
        .await
        .unwrap();
    assert!(cli(db, move |t| admin::cli::accounts_enable(t, id).unwrap()).await);
    assert!(
        wait_until(WAIT, || async {
            run.snapshot
                .load()
                .account(id)
                .is_some_and(|a| a.is_schedulable(shared_state::now_ms()))
        })
        .await,
        "re-enabled and no longer cooling"
    );
    assert_eq!(
        s.get_account(id)
            .await
            .unwrap()
            .unwrap()
            .0
            .cooldown_until_ms,
        0
    );

    // Settings.
    cli(db, |t| {
        admin::cli::settings_set(t, "max_attempts", "9").unwrap()
    })
    .await;
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().settings.max_attempts == 9
        })
        .await
    );
    assert_eq!(
        cli(db, |t| admin::cli::settings_get(t).unwrap()).await,
        vec![("max_attempts".to_owned(), "9".to_owned())]
    );
    let e = cli(db, |t| admin::cli::settings_set(t, "max_attempts", "0")).await;
    assert!(matches!(e, Err(admin::AdminError::Invalid(_))), "{e:?}");
    let e = cli(db, |t| admin::cli::settings_set(t, "nope", "1")).await;
    assert!(matches!(e, Err(admin::AdminError::Invalid(_))), "{e:?}");
    assert!(
        cli(db, |t| admin::cli::settings_unset(t, "max_attempts")
            .unwrap())
        .await
    );
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().settings.max_attempts == 4
        })
        .await,
        "back to the configured value"
    );

    // Delete.
    assert!(cli(db, move |t| admin::cli::accounts_delete(t, id).unwrap()).await);
    assert!(wait_until(WAIT, || async { run.snapshot.load().account(id).is_none() }).await);
    assert!(!cli(db, move |t| admin::cli::accounts_delete(t, id).unwrap()).await);
    assert!(!cli(db, move |t| admin::cli::accounts_enable(t, id).unwrap()).await);
    assert!(!cli(db, move |t| admin::cli::accounts_disable(t, id).unwrap()).await);
}

both_backends!(cli_changes_reach_a_running_sidecar);

/// Plain #[test]: the helpers build their own runtime.
#[test]
fn cli_refresh_rotates_and_reports_per_account() {
    let mock = MockOAuth::start();
    mock.add_rt("rt-ok", "acc-ok", "user-ok", "ok@x", "pro");
    let db = TestDb::sqlite();
    let target = db.target();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ok, at_only, dead, off) = rt.block_on(async {
        let s = db.open().await;
        let ok = seed_account(s.as_ref(), "acc-ok", "rt-ok").await;
        let at_only = s
            .upsert_account(&AccountUpsert {
                chatgpt_account_id: "acc-at".into(),
                user_id: String::new(),
                email: None,
                plan_type: None,
                access_token: Secret::new(jwt("acc-at", "u", "e", "plus", FAR_EXP)),
                refresh_token: Secret::new(""),
                id_token: Secret::new(""),
                access_expires_at: Some(FAR_EXP),
                last_refresh_at: None,
            })
            .await
            .unwrap()
            .id;
        let dead = seed_account(s.as_ref(), "acc-dead", "rt-unknown").await;
        let off = seed_account(s.as_ref(), "acc-off", "rt-off").await;
        s.set_status(off, AccountStatus::Disabled).await.unwrap();
        s.close().await.unwrap();
        (ok, at_only, dead, off)
    });

    // Every active account; the disabled one is left alone.
    let res = admin::cli::accounts_refresh(&target, None, &mock.url).unwrap();
    let ids: Vec<i64> = res.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [ok, at_only, dead]);
    assert!(res[0].1.is_ok(), "{:?}", res[0]);
    assert!(res[1].1.as_ref().unwrap_err().contains("no refresh token"));
    assert!(res[2].1.as_ref().unwrap_err().contains("reauth_required"));
    assert_eq!(mock.calls(), 2);

    let rows = admin::cli::accounts_list(&target).unwrap();
    let row = |id: i64| rows.iter().find(|r| r.id == id).unwrap().clone();
    assert_eq!(row(dead).status, AccountStatus::ReauthRequired);
    assert_eq!(row(ok).plan_type.as_deref(), Some("pro"));
    assert!(row(ok).last_refresh_at.is_some());
    assert!(mock.is_used("rt-ok"));

    // One account by id (the rotated token is the stored one, so it refreshes again).
    let res = admin::cli::accounts_refresh(&target, Some(ok), &mock.url).unwrap();
    assert_eq!(res.len(), 1);
    assert!(res[0].1.is_ok(), "{:?}", res[0]);
    assert_eq!(mock.calls(), 3);
    assert!(matches!(
        admin::cli::accounts_refresh(&target, Some(9999), &mock.url),
        Err(admin::AdminError::NotFound(_))
    ));
    let _ = off;

    // With the fleet's Redis lease.
    if let Some(url) = crate::support::redis_url() {
        let res =
            admin::cli::accounts_refresh_with(&target, Some(ok), &mock.url, Some(&url)).unwrap();
        assert!(res[0].1.is_ok(), "{:?}", res[0]);
        assert_eq!(mock.calls(), 4);
    }
}
