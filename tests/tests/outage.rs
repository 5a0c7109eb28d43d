//! Faults and outages under steady client load (issue 15), over real processes: sidecar
//! tasks made to panic, a private PostgreSQL stopped and started, a private Redis stopped and
//! started. Every client request is answered while it happens, `/healthz` says what is
//! degraded, and nothing is lost: usage rows == requests made, a rotated refresh token still
//! refreshes. (`kill -9` during a refresh and the SIGTERM drain run the real binary:
//! `gateway/tests/outage.rs`.)

use std::time::Duration;

use benches::{Behaviour, ErrorKind, MockConfig};
use integration_tests::{
    outage::{healthz, until, until_usage_rows, Load, PrivatePostgres, PrivateRedis},
    StackBuilder,
};

/// Load clients per test (a few seconds of load each).
const CLIENTS: usize = 6;

/// The gateway's logs in the test output (`RUST_LOG`; errors by default).
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A stack on `pg` whose token endpoint takes a second (a rotation can arrive after storage
/// went away) and whose upstream accepts only the newest access token.
fn pg_stack(pg: &PrivatePostgres) -> integration_tests::Stack {
    StackBuilder {
        database_url: Some(pg.url()),
        mock: MockConfig {
            token_delay: Duration::from_millis(1000),
            strict_tokens: true,
            ..MockConfig::default()
        },
        ..StackBuilder::default()
    }
    .start()
}

/// A 401 makes `acct-0` refresh: the request is answered on the new access token (strict
/// tokens), the token endpoint took one more refresh (the refresh token the gateway holds is
/// live; a dead one is `refresh_token_reused`), and the account stays active.
async fn refreshes_on_a_401(s: &integration_tests::Stack) {
    let calls = s.mock.token_calls();
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let r = s
        .post_json(
            "/v1/responses",
            &serde_json::json!({"model": "gpt-5.5", "input": "after"}),
        )
        .await;
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(s.mock.token_calls(), calls + 1);
    assert_eq!(s.account("acct-0").status, "active");
}

/// Every supervised sidecar task made to panic while clients stream: each is restarted and
/// counted (`codex_gateway_sidecar_task_restarts_total{task}`), the usage loop that keeps
/// failing is named in `/healthz` (200, degraded) meanwhile, the data plane answers every
/// request throughout, and afterwards the usage rows equal the requests made (the crashed
/// usage loop's spool file is adopted by its next run) and the admin API answers again.
#[tokio::test(flavor = "multi_thread")]
async fn panicking_sidecar_tasks_are_restarted_counted_and_lose_nothing() {
    logs();
    let s = StackBuilder {
        accounts: 2,
        ..StackBuilder::default()
    }
    .start();
    let tasks = s.app.health.sidecar_tasks();
    let names: Vec<&str> = tasks.all().iter().map(|t| t.name()).collect();
    for want in [
        "admin_server",
        "events_usage",
        "events_control",
        "key_limits",
        "reload",
        "health",
        "forecast",
        "quota",
        "models",
    ] {
        assert!(names.contains(&want), "{want} is supervised: {names:?}");
    }
    let load = Load::start(&s.url(), &s.key, CLIENTS);
    load.advance(20, Duration::from_secs(20)).await;

    // Every task panics once; the usage loop three times in a row (it keeps failing).
    for t in tasks.all().iter() {
        t.inject_panics(if t.name() == "events_usage" { 3 } else { 1 });
    }
    let h = until(
        "/healthz naming the failing usage loop",
        Duration::from_secs(20),
        || async {
            let (code, h) = healthz(&s.url()).await;
            assert_eq!(code, 200, "{h}");
            (h["sidecar"]["failing"] == serde_json::json!(["events_usage"])).then_some(h)
        },
    )
    .await;
    assert_eq!(h["status"], "degraded", "{h}");
    load.advance(20, Duration::from_secs(20)).await;
    until("every task restarted", Duration::from_secs(20), || async {
        tasks
            .all()
            .iter()
            .all(|t| t.restarts() >= if t.name() == "events_usage" { 3 } else { 1 })
            .then_some(())
    })
    .await;
    assert_eq!(
        s.metric("codex_gateway_sidecar_task_restarts_total{task=\"events_usage\"}")
            .await,
        3
    );
    assert!(s.metric("codex_gateway_sidecar_task_restarts_total").await >= names.len() as i64 + 2);
    assert_eq!(
        s.metric("codex_gateway_sidecar_task_failing{task=\"events_usage\"}")
            .await,
        1
    );
    load.advance(20, Duration::from_secs(20)).await;
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.ok, report.requests);

    // Nothing lost: one usage row per request, once the restarted loop has flushed.
    until_usage_rows(&s.db, report.requests, Duration::from_secs(30)).await;
    // The restarted admin server answers on the same socket.
    let r = s.admin_get("/api/admin/accounts").send().await.unwrap();
    assert_eq!(r.status(), 200);
    eprintln!(
        "{} requests answered while every sidecar task crashed; restarts: {}",
        report.requests,
        tasks.restarts()
    );
}

/// The sidecar thread itself made to die (a panic on its main future, outside every
/// supervised task): `/healthz` says so (`sidecar.thread: dead`, 200 degraded: the data plane
/// still serves), `codex_gateway_sidecar_up` turns 0, the admin API is gone with the thread,
/// and clients keep getting complete answers from the last snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_sidecar_thread_is_reported_while_the_data_plane_serves() {
    logs();
    let s = StackBuilder {
        accounts: 2,
        ..StackBuilder::default()
    }
    .start();
    let (code, h) = healthz(&s.url()).await;
    assert_eq!(code, 200, "{h}");
    assert_eq!(h["sidecar"]["thread"], "alive", "{h}");
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(s.metric("codex_gateway_sidecar_up").await, 1);
    let load = Load::start(&s.url(), &s.key, CLIENTS);
    load.advance(20, Duration::from_secs(20)).await;

    s.app.health.sidecar_tasks().inject_thread_panic();
    let h = until(
        "/healthz naming the dead sidecar thread",
        Duration::from_secs(10),
        || async {
            let (code, h) = healthz(&s.url()).await;
            assert_eq!(code, 200, "{h}");
            (h["sidecar"]["thread"] == "dead").then_some(h)
        },
    )
    .await;
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(s.metric("codex_gateway_sidecar_up").await, 0);
    assert!(
        s.admin_get("/api/admin/accounts").send().await.is_err(),
        "the admin API died with the sidecar thread"
    );
    // Clients are still answered, completely, from the last snapshot.
    load.advance(40, Duration::from_secs(20)).await;
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.ok, report.requests);
    let (_, h) = healthz(&s.url()).await;
    assert_eq!(
        h["sidecar"]["thread"], "dead",
        "a dead thread stays reported: {h}"
    );
}

/// A private PostgreSQL stopped and started under load: every request is answered from the
/// snapshot while it is down, `/healthz` says `storage: down` (200, degraded), the usage rows
/// equal the requests made once it is back, and a refresh token rotated while it was down
/// (the rotation arrived after storage went away) is not lost: the account refreshes again
/// after the recovery and after a restart.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_stopped_and_started_under_load_loses_nothing() {
    logs();
    let pg = PrivatePostgres::start();
    let mut s = pg_stack(&pg);
    let load = Load::start(&s.url(), &s.key, CLIENTS);
    load.advance(20, Duration::from_secs(20)).await;

    // A 401 asks for a refresh; while the token endpoint takes its time, storage goes away.
    let original = s.accounts[0].clone();
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    until("a refresh in flight", Duration::from_secs(10), || async {
        (s.mock.token_calls() > 0).then_some(())
    })
    .await;
    tokio::task::block_in_place(|| pg.stop());
    until("/healthz storage down", Duration::from_secs(15), || async {
        let (code, h) = healthz(&s.url()).await;
        assert_eq!(code, 200, "{h}");
        (h["storage"] == "down").then(|| assert_eq!(h["status"], "degraded", "{h}"))
    })
    .await;
    // The rotation happened while storage was down; the data plane serves on it (strict
    // tokens: the old access token is refused upstream).
    let rotated = until(
        "the rotated token published",
        Duration::from_secs(15),
        || async {
            let t = s.mock.account_tokens("acct-0").unwrap();
            let published = s.app.snapshot.load().accounts[0].access_token.clone();
            eprintln!(
                "token calls {}, rotated {}, published {}",
                s.mock.token_calls(),
                t.refresh_token != original.refresh_token,
                published.expose() == t.access_token
            );
            (t.refresh_token != original.refresh_token && published.expose() == t.access_token)
                .then_some(t)
        },
    )
    .await;
    load.advance(30, Duration::from_secs(20)).await;

    tokio::task::block_in_place(|| pg.start_again());
    until("/healthz storage up", Duration::from_secs(20), || async {
        let (_, h) = healthz(&s.url()).await;
        (h["storage"] == "up").then_some(())
    })
    .await;
    load.advance(20, Duration::from_secs(20)).await;
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);

    until_usage_rows(&s.db, report.requests, Duration::from_secs(60)).await;

    // The rotated refresh token is the live one: another refresh succeeds now...
    let calls = s.mock.token_calls();
    refreshes_on_a_401(&s).await;
    let again = s.mock.account_tokens("acct-0").unwrap();
    assert_ne!(again.refresh_token, rotated.refresh_token);
    // ...and after a restart (the stored one is the newest).
    tokio::task::block_in_place(|| s.restart());
    refreshes_on_a_401(&s).await;
    assert_eq!(s.mock.token_calls(), calls + 2);
    eprintln!(
        "{} requests answered across a PostgreSQL stop/start",
        report.requests
    );
}

/// A refresh token rotated while storage is down, then the gateway stops before storage is
/// back (a deploy, a crash): the rotation is in the held-token journal (sealed, in the data
/// directory), the next start stores it, and the account refreshes again (the old refresh
/// token would be `refresh_token_reused` and the account would need a new login).
#[tokio::test(flavor = "multi_thread")]
async fn a_rotation_held_while_storage_is_down_survives_a_restart() {
    logs();
    let pg = PrivatePostgres::start();
    let mut s = pg_stack(&pg);
    let original = s.accounts[0].clone();
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let req = s
        .post("/v1/responses")
        .json(&serde_json::json!({"model": "gpt-5.5", "input": "x"}));
    let pending = tokio::spawn(async move { req.send().await.unwrap().status().as_u16() });
    until("a refresh in flight", Duration::from_secs(10), || async {
        (s.mock.token_calls() > 0).then_some(())
    })
    .await;
    tokio::task::block_in_place(|| pg.stop());
    assert_eq!(pending.await.unwrap(), 200, "served on the held rotation");
    let rotated = s.mock.account_tokens("acct-0").unwrap();
    assert_ne!(rotated.refresh_token, original.refresh_token);
    assert!(s.dir.path().join(admin::held::FILE).exists());

    // Stopped while storage is still down; storage comes back; started again.
    tokio::task::block_in_place(|| s.restart_after(|| pg.start_again()));
    assert!(!s.dir.path().join(admin::held::FILE).exists(), "replayed");
    refreshes_on_a_401(&s).await;
}

/// A private Redis stopped and started under load: serving goes on, `/healthz` names Redis
/// and per-key limits fall back to local enforcement, and both return when Redis is back.
#[tokio::test(flavor = "multi_thread")]
async fn redis_stopped_and_started_under_load() {
    logs();
    let redis = PrivateRedis::start();
    let url = redis.url();
    let s = StackBuilder {
        tweak: Some(Box::new(move |c| c.sidecar.redis_url = Some(url))),
        ..StackBuilder::default()
    }
    .start();
    let fleet = |want_redis: &'static str, want_limits: &'static str| {
        let base = s.url();
        async move {
            until(
                &format!("/healthz redis {want_redis}, key limits {want_limits}"),
                Duration::from_secs(20),
                || {
                    let base = base.clone();
                    async move {
                        let (code, h) = healthz(&base).await;
                        assert_eq!(code, 200, "{h}");
                        (h["redis"] == want_redis && h["key_limits"] == want_limits).then_some(h)
                    }
                },
            )
            .await
        }
    };
    let h = fleet("up", "fleet").await;
    assert_eq!(h["status"], "ok", "{h}");
    let load = Load::start(&s.url(), &s.key, CLIENTS);
    load.advance(20, Duration::from_secs(20)).await;

    tokio::task::block_in_place(|| redis.stop());
    let h = fleet("down", "local").await;
    assert_eq!(h["status"], "degraded", "{h}");
    load.advance(30, Duration::from_secs(20)).await;

    tokio::task::block_in_place(|| redis.start_again());
    let h = fleet("up", "fleet").await;
    assert_eq!(h["status"], "ok", "{h}");
    load.advance(20, Duration::from_secs(20)).await;
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    eprintln!(
        "{} requests answered across a Redis stop/start",
        report.requests
    );
}
