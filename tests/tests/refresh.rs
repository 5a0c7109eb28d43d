//! Token rotation: a rotated refresh token survives a restart; a refresh whose persistence
//! fails is not published (and is published once storage is back).

use std::time::{Duration, Instant};

use benches::{Behaviour, ErrorKind, MockConfig};
use integration_tests::{pg_admin_url, pg_exec, StackBuilder};
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
    let r = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
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
    let r = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let last = s.mock.requests().pop().unwrap();
    assert_eq!(
        last.header("authorization").unwrap(),
        format!("Bearer {}", rotated.access_token)
    );
    // and the stored refresh token is the rotated one (the old one would be `refresh_token_reused`)
    let db = s.db.clone();
    let token_url = s.mock.token_url();
    let res = tokio::task::spawn_blocking(move || {
        admin::cli::accounts_refresh(&db, None, &token_url).unwrap()
    })
    .await
    .unwrap();
    assert!(res.iter().all(|(_, r)| r.is_ok()), "{res:?}");
    assert_eq!(s.mock.token_calls(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn refresh_is_published_only_after_it_is_persisted() {
    let s = StackBuilder {
        postgres: true,
        mock: MockConfig {
            token_delay: Duration::from_millis(1500),
            ..MockConfig::default()
        },
        ..StackBuilder::default()
    }
    .start();
    let name = s._pg.as_ref().unwrap().name.clone();
    let before = s.app.snapshot.load().accounts[0].access_token.clone();
    // A 401 asks the sidecar for a refresh; while the token endpoint answers (1.5 s), storage
    // goes down, so the rotated tokens cannot be stored at first.
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
    let admin_url = pg_admin_url();
    let a = admin_url.clone();
    let n2 = name.clone();
    std::thread::spawn(move || {
        pg_exec(
            &a,
            &format!("ALTER DATABASE {n2} WITH ALLOW_CONNECTIONS false"),
        );
        pg_exec(
            &a,
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{n2}'"
            ),
        );
    })
    .join()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        s.app.snapshot.load().accounts[0].access_token,
        before,
        "not published before it is stored"
    );
    // Storage comes back within the sidecar's persistence retries: stored, then published.
    let up = format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true");
    std::thread::spawn(move || pg_exec(&admin_url, &up))
        .join()
        .unwrap();
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
}
