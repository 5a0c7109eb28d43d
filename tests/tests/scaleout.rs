//! Scale-out (issue 12): two gateway instances on one PostgreSQL database and one Redis, in
//! process, against one mock-codex. One refresh fleet-wide for 401s on both instances while
//! the token endpoint is slower than the lease (renewal); a refresh that lost its lease does
//! not overwrite the newer holder's tokens (fencing); a cooldown, a new key and a disabled
//! account reach the other instance within 1 s (pub/sub invalidations: the periodic reload is
//! set to 30 s, so only an invalidation can be that fast); usage from both instances in one
//! report; a session stays on its account across instances; who minted a reasoning blob is
//! known on the other instance and after a restart (issue 23).
//!
//! Each test uses its own Redis database number (lease and fence keys are per account id, and
//! every test's first account is id 1); pub/sub channels are server-wide, so another test's
//! invalidation at most causes an extra reload here.

#![allow(clippy::unwrap_used)] // helpers of tests: a panic is the failure report

use std::time::{Duration, Instant};

use benches::{Behaviour, ErrorKind, MockConfig};
use codex_gateway::app::AppHandle;
use codex_gateway::config::Config;
use integration_tests::{
    client,
    fleet::instance_url,
    metric_sum, metrics_at,
    requests::{blob_turn, post_at},
    Stack, StackBuilder, ADMIN_TOKEN,
};
use serde_json::{json, Value};

/// Long enough that nothing in these tests can come from the periodic reload.
const SLOW_RELOAD: Duration = Duration::from_secs(30);
/// The bound the brief sets for a change to reach the other instance.
const FLEET_BOUND: Duration = Duration::from_secs(1);

fn redis_url(db: u32) -> String {
    format!("redis://127.0.0.1:6379/{db}")
}

/// Instance A (the [`Stack`]: mock, storage, key) and instance B on the same PostgreSQL
/// database and Redis (`db`).
struct Fleet {
    a: Stack,
    b: Option<AppHandle>,
}

impl Fleet {
    fn start(mut builder: StackBuilder, db: u32, tweak: fn(&mut Config)) -> Self {
        builder.postgres = true;
        let url = redis_url(db);
        let outer = builder.tweak.take();
        builder.tweak = Some(Box::new(move |c: &mut Config| {
            if let Some(t) = outer {
                t(c);
            }
            c.sidecar.redis_url = Some(url);
            c.sidecar.reload_interval = SLOW_RELOAD;
            tweak(c);
        }));
        let a = builder.start();
        let b = a.another_instance(|_| {});
        Self { a, b: Some(b) }
    }

    /// Waits until each instance hears the other's invalidations (the subscriptions are made
    /// after start-up returns): a key created on A shows on B, its revocation on B leaves A.
    async fn connected(self) -> Self {
        let id = self.a.create_key("warm-up", json!({})).await.id;
        let has = |h: &AppHandle| h.snapshot.load().keys.values().any(|k| k.id == id);
        within("B hears A", Duration::from_secs(20), || has(self.b())).await;
        let r = self
            .b_admin(reqwest::Method::DELETE, &format!("/api/admin/keys/{id}"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        within("A hears B", Duration::from_secs(20), || !has(&self.a.app)).await;
        self
    }

    fn b(&self) -> &AppHandle {
        self.b.as_ref().unwrap()
    }

    fn b_url(&self) -> String {
        format!("http://{}", self.b().data_addr)
    }

    fn b_admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        client()
            .request(method, format!("http://{}{path}", self.b().admin_addr))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(mut b) = self.b.take() {
            tokio::task::block_in_place(|| b.shutdown());
        }
    }
}

/// `POST {base}/v1/responses` with `key`: (status, body).
async fn respond_at(base: &str, key: &str, body: Value) -> (u16, Value) {
    let (st, _, v) = post_at(&client(), base, "/v1/responses", key, &body).await;
    (st, v)
}

async fn ask(base: &str, key: &str) -> (u16, Value) {
    respond_at(
        base,
        key,
        json!({"model": "gpt-5.5", "input": "hi", "stream": false}),
    )
    .await
}

/// Polls `cond` until it holds; panics with `what` after `within`.
async fn within<F: FnMut() -> bool>(what: &str, within: Duration, mut cond: F) -> Duration {
    let t0 = Instant::now();
    loop {
        if cond() {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn token_of(h: &AppHandle, chatgpt_account_id: &str) -> String {
    h.snapshot
        .load()
        .accounts
        .iter()
        .find(|a| a.chatgpt_account_id == chatgpt_account_id)
        .map(|a| a.access_token.expose().to_owned())
        .unwrap()
}

fn account_id_of(h: &AppHandle, chatgpt_account_id: &str) -> i64 {
    h.snapshot
        .load()
        .accounts
        .iter()
        .find(|a| a.chatgpt_account_id == chatgpt_account_id)
        .map(|a| a.id)
        .unwrap()
}

async fn pg_i64(url: &str, sql: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(&mut c)
        .await
        .unwrap()
}

async fn redis_conn(db: u32) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url(db))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis at 127.0.0.1:6379 is required for this test")
}

/// 401s on both instances while the token endpoint takes five lease lifetimes: the lease is
/// renewed, so the second instance never takes it over, and the fleet makes one token call.
#[tokio::test(flavor = "multi_thread")]
async fn one_refresh_fleet_wide_for_401s_on_both_instances() {
    const TTL: Duration = Duration::from_millis(300);
    let f = Fleet::start(
        StackBuilder {
            mock: MockConfig {
                token_delay: TTL * 5,
                strict_tokens: true,
                ..MockConfig::default()
            },
            ..StackBuilder::default()
        },
        8,
        |c| c.sidecar.refresh_lease_ttl = TTL,
    )
    .connected()
    .await;
    let s = &f.a;
    let before = token_of(&s.app, "acct-0");
    // Every request with the old token is refused until the refresh (a scripted count of
    // 401s would depend on how many requests sent one: a request that reaches an account
    // already refreshing waits instead of sending a doomed request).
    s.mock.revoke_access_token("acct-0");
    let send = |base: String, key: String| tokio::spawn(async move { ask(&base, &key).await });
    let mut calls = vec![send(s.url(), s.key.clone()), send(s.url(), s.key.clone())];
    within(
        "A's refresh reached the token endpoint",
        Duration::from_secs(10),
        || s.mock.token_calls() == 1,
    )
    .await;
    // Without renewal A's lease would have expired twice over by now.
    tokio::time::sleep(TTL * 2).await;
    calls.push(send(f.b_url(), s.key.clone()));
    calls.push(send(f.b_url(), s.key.clone()));
    for c in calls {
        let (st, v) = c.await.unwrap();
        assert_eq!(st, 200, "{v}");
    }
    assert_eq!(s.mock.token_calls(), 1, "one refresh for the whole fleet");
    let new = s.mock.account_tokens("acct-0").unwrap().access_token;
    assert_ne!(new, before);
    assert_eq!(token_of(&s.app, "acct-0"), new);
    assert_eq!(token_of(f.b(), "acct-0"), new);
    let pg = &s._pg.as_ref().unwrap().url;
    assert!(pg_i64(pg, "SELECT refresh_fence FROM accounts").await >= 1);
}

/// A's refresh loses its lease while the token endpoint is slow (the lease is deleted, as an
/// expiry during a pause would); B refreshes under a newer lease and stores first. A's answer
/// comes later: its fenced write is refused, so both instances keep B's tokens.
#[tokio::test(flavor = "multi_thread")]
async fn a_refresh_that_lost_its_lease_does_not_overwrite_the_newer_holders_tokens() {
    let f = Fleet::start(
        StackBuilder {
            mock: MockConfig {
                // The old refresh token stays valid, so A's slow exchange succeeds too.
                omit_rotated_refresh_token: true,
                ..MockConfig::default()
            },
            ..StackBuilder::default()
        },
        9,
        |_| {},
    )
    .connected()
    .await;
    let s = &f.a;
    let id = account_id_of(&s.app, "acct-0");
    let original = token_of(&s.app, "acct-0");
    let mut redis = redis_conn(9).await;
    s.mock.set_token_delay(Some(Duration::from_secs(2)));
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let (url, key) = (s.url(), s.key.clone());
    let on_a = tokio::spawn(async move { ask(&url, &key).await });
    within(
        "A's refresh reached the token endpoint",
        Duration::from_secs(10),
        || s.mock.token_calls() == 1,
    )
    .await;
    let lease_key = admin::lease::RedisLeases::key(id);
    let a_fence: i64 = redis::cmd("GET")
        .arg(admin::lease::RedisLeases::fence_key(id))
        .query_async(&mut redis)
        .await
        .unwrap();
    let deleted: i64 = redis::cmd("DEL")
        .arg(&lease_key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "A holds the lease while its refresh runs");
    // B: a 401, a refresh under a new lease, answered at once.
    s.mock.set_token_delay(Some(Duration::ZERO));
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let (st, v) = ask(&f.b_url(), &s.key).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(s.mock.token_calls(), 2);
    let b_token = token_of(f.b(), "acct-0");
    assert_ne!(b_token, original);
    let pg = s._pg.as_ref().unwrap().url.clone();
    let b_fence = pg_i64(&pg, "SELECT refresh_fence FROM accounts").await;
    assert!(b_fence > a_fence, "B's fence {b_fence} above A's {a_fence}");
    // A's request continues on B's tokens; then A's slow exchange answers (the mock issues
    // its tokens) and A tries to store them.
    let (st, v) = on_a.await.unwrap();
    assert_eq!(st, 200, "{v}");
    within("A's exchange answered", Duration::from_secs(10), || {
        s.mock.account_tokens("acct-0").unwrap().access_token != b_token
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(token_of(&s.app, "acct-0"), b_token, "A kept B's tokens");
    assert_eq!(token_of(f.b(), "acct-0"), b_token, "B kept its tokens");
    assert_eq!(
        pg_i64(&pg, "SELECT refresh_fence FROM accounts").await,
        b_fence
    );
    assert_eq!(s.account("acct-0").status, "active");
}

/// A cooldown A's data plane sets (a 429 from the upstream) is honoured by B within 1 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_cooldown_set_by_one_instance_is_honoured_by_the_other_within_1s() {
    let f = Fleet::start(
        StackBuilder {
            accounts: 2,
            strategy: Some(shared_state::snapshot::Strategy::FillFirst),
            ..StackBuilder::default()
        },
        10,
        |_| {},
    )
    .connected()
    .await;
    let s = &f.a;
    s.mock.set_behaviour(
        "acct-0",
        Behaviour {
            retry_after: Some("120".into()),
            ..Behaviour::error(ErrorKind::RateLimitExceeded).times(1)
        },
    );
    let (st, v) = ask(&s.url(), &s.key).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(s.served_by(), vec!["acct-0", "acct-1"]);
    let cooling = |h: &AppHandle| {
        let snap = h.snapshot.load();
        let a = snap
            .accounts
            .iter()
            .find(|a| a.chatgpt_account_id == "acct-0")
            .unwrap();
        a.live.cooldown_until_ms() > shared_state::now_ms() + 30_000
    };
    assert!(cooling(&s.app));
    within("B applied A's cooldown", FLEET_BOUND, || cooling(f.b())).await;
    // B's next request skips the cooling account (fill_first would try acct-0 first).
    s.mock.clear_requests();
    let (st, v) = ask(&f.b_url(), &s.key).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(s.served_by(), vec!["acct-1"]);
}

/// A key created through A's admin API works on B within 1 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_created_on_one_instance_works_on_the_other_within_1s() {
    let f = Fleet::start(StackBuilder::default(), 11, |_| {})
        .connected()
        .await;
    let s = &f.a;
    let created = s.create_key("fleet", json!({})).await;
    let (key, id) = (created.key, created.id);
    let (st, _) = ask(&f.b_url(), "sk-not-a-key").await;
    assert_eq!(st, 401, "control: an unknown key is refused");
    // Measured on B's published snapshot (a request's own time is not the propagation's).
    let has_key = |h: &AppHandle| h.snapshot.load().keys.values().any(|k| k.id == id);
    within("B took the new key", FLEET_BOUND, || has_key(f.b())).await;
    let (st, v) = ask(&f.b_url(), &key).await;
    assert_eq!(st, 200, "{v}");
    // Revoked on B: gone from A within 1 s too, and refused there.
    let r = f
        .b_admin(reqwest::Method::DELETE, &format!("/api/admin/keys/{id}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    within("A dropped the revoked key", FLEET_BOUND, || {
        !has_key(&s.app)
    })
    .await;
    assert_eq!(ask(&s.url(), &key).await.0, 401);
}

/// An account disabled through A's admin API stops being used by B within 1 s.
#[tokio::test(flavor = "multi_thread")]
async fn an_account_disabled_on_one_stops_being_used_by_the_other_within_1s() {
    let f = Fleet::start(
        StackBuilder {
            accounts: 2,
            strategy: Some(shared_state::snapshot::Strategy::FillFirst),
            ..StackBuilder::default()
        },
        12,
        |_| {},
    )
    .connected()
    .await;
    let s = &f.a;
    let (st, _) = ask(&f.b_url(), &s.key).await;
    assert_eq!(st, 200);
    assert_eq!(s.served_by(), vec!["acct-0"], "fill_first: acct-0 first");
    let id = account_id_of(&s.app, "acct-0");
    let r = s
        .admin_post(&format!("/api/admin/accounts/{id}/disable"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let disabled = |h: &AppHandle| {
        h.snapshot.load().accounts.iter().any(|a| {
            a.chatgpt_account_id == "acct-0" && a.effective_status().as_str() == "disabled"
        })
    };
    within("B saw the account disabled", FLEET_BOUND, || {
        disabled(f.b())
    })
    .await;
    s.mock.clear_requests();
    for _ in 0..3 {
        let (st, v) = ask(&f.b_url(), &s.key).await;
        assert_eq!(st, 200, "{v}");
    }
    assert_eq!(s.served_by(), vec!["acct-1"; 3]);
}

/// Requests served by both instances appear in one admin usage report (either instance's)
/// and in the hourly rollups, cost included.
#[tokio::test(flavor = "multi_thread")]
async fn usage_from_both_instances_appears_in_one_report() {
    let f = Fleet::start(StackBuilder::default(), 13, |_| {})
        .connected()
        .await;
    let s = &f.a;
    for i in 0..5 {
        let base = if i < 2 { s.url() } else { f.b_url() };
        let (st, v) = ask(&base, &s.key).await;
        assert_eq!(st, 200, "{v}");
    }
    let report = |r: reqwest::RequestBuilder| async move {
        let v: Value = r.send().await.unwrap().json().await.unwrap();
        v
    };
    let t0 = Instant::now();
    loop {
        let a = report(s.admin_get("/api/admin/usage")).await;
        let b = report(f.b_admin(reqwest::Method::GET, "/api/admin/usage")).await;
        if a["totals"]["requests"] == 5 && b["totals"]["requests"] == 5 {
            assert_eq!(a["by_key"][0]["requests"], 5, "{a}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{a} {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let csv = s
        .admin_get("/api/admin/usage/export.csv?group_by=key")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| row[head.iter().position(|h| *h == name).unwrap()];
    assert_eq!(col("requests"), "5", "{csv}");
    assert!(col("cost_micros").parse::<u64>().unwrap() > 0, "{csv}");
}

/// A session (its `prompt_cache_key`) stays on one account whichever instance serves it: the
/// smart strategy's soft affinity is a rendezvous hash over the shared pool, so both
/// instances pick the same home without shared state.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_stays_on_its_account_across_instances() {
    let f = Fleet::start(
        StackBuilder {
            accounts: 4,
            ..StackBuilder::default()
        },
        14,
        |_| {},
    )
    .connected()
    .await;
    let s = &f.a;
    for session in ["s-1", "s-2", "s-3"] {
        s.mock.clear_requests();
        for i in 0..6 {
            let base = if i % 2 == 0 { s.url() } else { f.b_url() };
            let (st, v) = respond_at(
                &base,
                &s.key,
                json!({"model": "gpt-5.5", "input": "hi", "stream": false,
                       "prompt_cache_key": session}),
            )
            .await;
            assert_eq!(st, 200, "{v}");
        }
        let served = s.served_by();
        assert_eq!(served.len(), 6);
        assert!(
            served.iter().all(|a| *a == served[0]),
            "{session}: {served:?}"
        );
    }
}

/// Issue 23: who minted a reasoning blob is shared through Redis. A turn on instance A mints
/// a blob on one account; the continuations carrying it (no session id, round robin: only the
/// ownership record can route them) go straight to the minter on instance B, and on A after a
/// restart (its in-memory records gone): no refusal, no stripped retry, no foreign blob.
#[tokio::test(flavor = "multi_thread")]
async fn blob_owners_are_shared_across_instances_and_restarts() {
    let mut f = Fleet::start(
        StackBuilder {
            accounts: 2,
            workers: 1,
            ..StackBuilder::default()
        },
        15,
        |c| c.sidecar.settings.strategy = shared_state::snapshot::Strategy::RoundRobin,
    )
    .connected()
    .await;
    let mut r = redis_conn(15).await;
    let owner_keys = |r: &mut redis::aio::MultiplexedConnection| {
        let mut r = r.clone();
        async move {
            redis::cmd("KEYS")
                .arg("codex-gateway:owner:*")
                .query_async::<Vec<String>>(&mut r)
                .await
                .unwrap()
        }
    };
    for k in owner_keys(&mut r).await {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut r).await.unwrap();
    }
    for a in ["acct-0", "acct-1"] {
        f.a.mock.set_behaviour(a, "reasoning=1".parse().unwrap());
    }
    let key = f.a.key.clone();
    let first = vec![json!({"type": "message", "role": "user", "content": "first"})];
    f.a.mock.clear_requests();
    let (st, resp) = blob_turn(&f.a.url(), &key, &first).await;
    assert_eq!(st, 200, "{resp}");
    let minter = f.a.served_by();
    assert_eq!(minter.len(), 1);
    let minter = minter[0].clone();
    assert_eq!(resp["output"][0]["type"], "reasoning");
    assert!(resp["output"][0]["encrypted_content"].is_string());
    // The record is written behind the response (never awaited): wait for it to land.
    let t0 = Instant::now();
    let keys = loop {
        let keys = owner_keys(&mut r).await;
        if !keys.is_empty() {
            break keys;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no owner record in Redis"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // The fingerprint and the account id, never the blob.
    assert_eq!(keys.len(), 1, "{keys:?}");
    let stored: String = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(stored, account_id_of(&f.a.app, &minter).to_string());
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(ttl > 0, "the record expires: {ttl}");

    let mut input = first.clone();
    input.extend(resp["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "message", "role": "user", "content": "second"}));
    let continue_at = |f: &Fleet, base: String| {
        let (key, input, minter) = (key.clone(), input.clone(), minter.clone());
        let mock = f.a.mock.clone();
        async move {
            mock.clear_requests();
            // Round robin would alternate: every one goes to the minter.
            for _ in 0..4 {
                let (st, v) = blob_turn(&base, &key, &input).await;
                assert_eq!(st, 200, "{v}");
            }
            let reqs: Vec<_> = mock
                .requests()
                .into_iter()
                .filter(|r| r.path.ends_with("/responses"))
                .collect();
            let served: Vec<_> = reqs.iter().filter_map(|r| r.account_id()).collect();
            assert_eq!(
                served,
                [minter.as_str(); 4],
                "no refusal, no stripped retry"
            );
            assert!(reqs.iter().all(|r| r.foreign_blobs().is_empty()));
            assert!(
                reqs.iter().all(|r| r.blobs().len() == 1),
                "the blob went along"
            );
        }
    };
    continue_at(&f, f.b_url()).await;
    assert_eq!(
        metric_at(f.b(), "codex_gateway_encrypted_items_stripped_total").await,
        0
    );

    // Instance A restarted: its records are gone from memory, Redis still has them.
    tokio::task::block_in_place(|| f.a.restart());
    continue_at(&f, f.a.url()).await;
    assert_eq!(
        f.a.metric("codex_gateway_encrypted_items_stripped_total")
            .await,
        0
    );
}

/// A counter summed over its label sets in an instance's `/metrics` (0 when absent).
async fn metric_at(h: &AppHandle, name: &str) -> i64 {
    metric_sum(&metrics_at(&instance_url(h)).await, name)
}
