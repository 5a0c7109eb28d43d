//! Token rotation: a rotated refresh token survives a restart; a rotation that cannot be
//! stored (database locked or down) is used from memory at once and stored once storage
//! takes writes again (issue 9, defect 11).

use std::time::{Duration, Instant};

use benches::{Behaviour, ErrorKind, MockConfig};
use integration_tests::{wait::wait_for, Stack, StackBuilder};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn rotated_refresh_token_survives_a_restart() {
    let mut s = StackBuilder {
        mock: MockConfig {
            strict_tokens: true,
            ..MockConfig::default()
        },
        ..StackBuilder::default()
    }
    .start();
    let original = s.accounts[0].clone();
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(s.mock.token_calls(), 1);
    let rotated = s.mock.account_tokens("acct-0").unwrap();
    assert_ne!(rotated.refresh_token, original.refresh_token);

    tokio::task::block_in_place(|| s.restart());
    // Wait until the restarted gateway answers on its port.
    let health = format!("{}/healthz", s.url());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        if c.get(&health).send().await.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted gateway never became healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // strict tokens: only the rotated access token is accepted upstream
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 200);
    let last = s.mock.requests().pop().unwrap();
    assert_eq!(
        last.header("authorization").unwrap(),
        format!("Bearer {}", rotated.access_token)
    );
    // and the stored refresh token is the rotated one (the old one would be `refresh_token_reused`)
    cli_refresh_succeeds(&s).await;
    assert_eq!(s.mock.token_calls(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refresh_is_used_while_storage_is_down_and_stored_when_it_is_back() {
    use sqlx::Connection;
    let s = StackBuilder {
        postgres: true,
        mock: MockConfig {
            token_delay: Duration::from_millis(1500),
            strict_tokens: true,
            ..MockConfig::default()
        },
        ..StackBuilder::default()
    }
    .start();
    let pg = s._pg.as_ref().unwrap();
    let stored_refresh = || async {
        let mut c = sqlx::PgConnection::connect(&pg.url).await.unwrap();
        sqlx::query_scalar::<_, String>("SELECT refresh_token_enc FROM accounts")
            .fetch_one(&mut c)
            .await
            .unwrap()
    };
    let before = stored_refresh().await;
    // A 401 asks the sidecar for a refresh; while the token endpoint answers (1.5 s), storage
    // goes down, so the rotated tokens cannot be stored.
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let req = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}));
    let pending = tokio::spawn(async move { req.send().await.unwrap().status().as_u16() });
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.mock.token_calls() == 0 {
        assert!(Instant::now() < deadline, "no refresh happened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pg.go_down();
    // Storage stays down: the waiting request is served on the rotated tokens, from memory
    // (strict tokens: the old access token is refused upstream).
    assert_eq!(
        pending.await.unwrap(),
        200,
        "the waiting request used the refreshed token"
    );
    let fresh = s.mock.account_tokens("acct-0").unwrap();
    assert_eq!(
        s.app.snapshot.load().accounts[0].access_token.expose(),
        fresh.access_token
    );
    let last = s.mock.requests().pop().unwrap();
    assert_eq!(
        last.header("authorization").unwrap(),
        format!("Bearer {}", fresh.access_token)
    );
    // Storage comes back: the rotation is stored, and it is the live one (the old refresh
    // token would be `refresh_token_reused`).
    pg.come_back();
    wait_for(
        "the rotated tokens in storage",
        Duration::from_secs(60),
        || async { stored_refresh().await != before },
    )
    .await;
    cli_refresh_succeeds(&s).await;
    assert_eq!(s.mock.token_calls(), 2);
}

/// The stored refresh tokens are the live ones: the CLI refreshes every account with them
/// (a reused refresh token would be `refresh_token_reused`).
async fn cli_refresh_succeeds(s: &Stack) {
    let db = s.db.clone();
    let token_url = s.mock.token_url();
    let res = tokio::task::spawn_blocking(move || {
        admin::cli::accounts_refresh(&db, None, &token_url).unwrap()
    })
    .await
    .unwrap();
    assert!(res.iter().all(|(_, r)| r.is_ok()), "{res:?}");
}

/// The stored (encrypted) refresh token of the only account, read over its own connection.
async fn stored_refresh_ciphertext(c: &mut sqlx::SqliteConnection) -> String {
    sqlx::query_scalar::<_, String>("SELECT refresh_token_enc FROM accounts")
        .fetch_one(c)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refresh_survives_a_locked_database() {
    use sqlx::Connection;
    let s = StackBuilder {
        mock: MockConfig {
            strict_tokens: true,
            ..MockConfig::default()
        },
        ..StackBuilder::default()
    }
    .start();
    let original = s.accounts[0].clone();
    let db = s.dir.path().join(admin::DEFAULT_DB_FILE);
    let mut lock = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let before = stored_refresh_ciphertext(&mut lock).await;
    // Another writer holds the database's write lock across the whole refresh.
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();

    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let ask = || {
        s.post("/v1/responses")
            .json(&json!({"model":"gpt-5.5","input":"x"}))
    };
    let r = ask().send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(s.mock.token_calls(), 1);
    let rotated = s.mock.account_tokens("acct-0").unwrap();
    assert_ne!(rotated.refresh_token, original.refresh_token);
    // strict tokens: only the rotated access token is accepted upstream
    let last = s.mock.requests().pop().unwrap();
    assert_eq!(
        last.header("authorization").unwrap(),
        format!("Bearer {}", rotated.access_token)
    );
    // Still locked: the account keeps working on the rotated tokens.
    let r = ask().send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.mock.token_calls(), 1, "no second refresh");

    // The lock goes away: the rotated refresh token reaches storage.
    sqlx::raw_sql("ROLLBACK").execute(&mut lock).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while stored_refresh_ciphertext(&mut lock).await == before {
        assert!(
            Instant::now() < deadline,
            "the rotated tokens never reached storage"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(lock);
    // ... and it is the live one (a reused refresh token would be `refresh_token_reused`).
    cli_refresh_succeeds(&s).await;
    assert_eq!(s.mock.token_calls(), 2);
}

/// Redis down (here: from start-up) is not fatal, and a rejected token is still refreshed,
/// under the in-process single-flight alone; `/healthz` says Redis is down.
#[tokio::test(flavor = "multi_thread")]
async fn refreshes_go_on_while_redis_is_down() {
    let s = StackBuilder {
        mock: MockConfig {
            strict_tokens: true,
            ..MockConfig::default()
        },
        tweak: Some(Box::new(|c| {
            c.sidecar.redis_url = Some("redis://127.0.0.1:1".into())
        })),
        ..StackBuilder::default()
    }
    .start();
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(s.mock.token_calls(), 1, "refreshed without the Redis lease");
    let h: serde_json::Value = s.healthz().await;
    assert_eq!(h["redis"], "down", "{h}");
    assert_eq!(h["status"], "degraded", "{h}");
}
