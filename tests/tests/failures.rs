//! One test per row of the failure table (docs/protocol.md#what-a-class-does): which account served, what
//! the client saw, and the account's state afterwards. Accounts are tried in the worker's
//! round-robin order, so each test makes acct-0 fail and checks the outcome whichever account
//! was tried first.
//!
//! Every row runs on both monoio drivers (io_uring and the legacy epoll one), each on its own
//! stack, concurrently ([`both`]), so covering the second driver costs little wall time.

use std::{future::Future, time::Duration};

use benches::{Behaviour, ErrorKind, MockConfig};
use gateway::config::PlainHttp;
use integration_tests::{streaming_mock, Stack, StackBuilder};
use serde_json::{json, Value};

/// Runs a row for both drivers at once (`legacy` false: io_uring, true: legacy), interleaved
/// on this task's thread (a [`Stack`] is not `Sync`); a failure names the driver.
async fn both<F, Fut>(row: F)
where
    F: Fn(bool) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let runs: Vec<_> = [false, true]
                .into_iter()
                .map(|legacy| (legacy, tokio::task::spawn_local(row(legacy))))
                .collect();
            for (legacy, run) in runs {
                if let Err(e) = run.await {
                    let driver = if legacy { "legacy" } else { "io_uring" };
                    let msg = integration_tests::panic_message(&*e.into_panic());
                    panic!("[{driver} driver] {msg}");
                }
            }
        })
        .await;
}

fn two(legacy: bool) -> Stack {
    // fill_first makes the order deterministic: acct-0 is tried first.
    StackBuilder {
        accounts: 2,
        workers: 1,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        legacy,
        ..StackBuilder::default()
    }
    .start()
}

async fn ask(s: &Stack) -> (u16, Value) {
    let r = s.post_responses_x(false).await;
    let st = r.status().as_u16();
    (st, r.json().await.unwrap())
}

/// acct-0 fails with `kind`; the request is served by acct-1.
async fn fails_over(kind: ErrorKind, legacy: bool) -> Stack {
    let s = two(legacy);
    s.mock.set_behaviour("acct-0", Behaviour::error(kind));
    let (st, v) = ask(&s).await;
    assert_eq!(st, 200, "{kind:?}: {v}");
    assert_eq!(s.served_by(), vec!["acct-0", "acct-1"], "{kind:?}");
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_limit_cools_until_reset() {
    both(|legacy| async move {
        let s = fails_over(ErrorKind::UsageLimitReached, legacy).await;
        let a = s.account("acct-0");
        assert_eq!(a.status, "active");
        // the mock's resets_at is one hour ahead
        assert!(
            a.cooling_ms > 3_500_000 && a.cooling_ms <= 3_600_000,
            "{a:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_not_included_disables() {
    both(|legacy| async move {
        let s = fails_over(ErrorKind::UsageNotIncluded, legacy).await;
        assert_eq!(s.account("acct-0").status, "disabled");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limit_is_a_short_backoff() {
    both(|legacy| async move {
        let before = shared_state::now_ms();
        let s = fails_over(ErrorKind::RateLimitExceeded, legacy).await;
        let a = s.account("acct-0");
        // the mock's `retry-after: 2` sets the cooldown
        assert!(cooldown_until(&s, "acct-0") > before, "{a:?}");
        assert!(a.cooling_ms <= 2_000, "{a:?}");
        assert_eq!(a.status, "active");
    })
    .await;
}

/// The cooldown deadline of an account (ms since epoch, 0 when none).
fn cooldown_until(s: &Stack, chatgpt_account_id: &str) -> u64 {
    let snap = s.app.snapshot.load();
    snap.accounts
        .iter()
        .find(|a| a.chatgpt_account_id == chatgpt_account_id)
        .map_or(0, |a| a.live.cooldown_until_ms())
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_sets_the_cooldown() {
    both(|legacy| async move {
        // (error, Retry-After, the range the remaining cooldown must be in). Without the header
        // these cool for 5 s and 15 s.
        for (kind, retry_after, lo, hi) in [
            (ErrorKind::ServerIsOverloaded, "120", 60_000, 120_000),
            (ErrorKind::Internal, "90", 45_000, 90_000),
            (ErrorKind::RateLimitExceeded, "200", 100_000, 200_000),
        ] {
            let s = two(legacy);
            s.mock.set_behaviour(
                "acct-0",
                Behaviour {
                    retry_after: Some(retry_after.to_owned()),
                    ..Behaviour::error(kind)
                },
            );
            let (st, v) = ask(&s).await;
            assert_eq!(st, 200, "{kind:?}: {v}");
            assert_eq!(s.served_by(), vec!["acct-0", "acct-1"], "{kind:?}");
            let a = s.account("acct-0");
            assert_eq!(a.status, "active", "{kind:?}");
            assert!(
                a.cooling_ms > lo && a.cooling_ms <= hi,
                "{kind:?} Retry-After {retry_after}: {a:?}"
            );
        }
        // An absurd Retry-After is capped: a transient failure never takes an account out long.
        let s = two(legacy);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                retry_after: Some("86400".to_owned()),
                ..Behaviour::error(ErrorKind::ServerIsOverloaded)
            },
        );
        let (st, _) = ask(&s).await;
        assert_eq!(st, 200);
        let a = s.account("acct-0");
        assert!(a.cooling_ms > 0 && a.cooling_ms <= 300_000, "{a:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn overload_and_5xx_are_short_cooldowns() {
    both(|legacy| async move {
        for kind in [ErrorKind::ServerIsOverloaded, ErrorKind::Internal] {
            let s = fails_over(kind, legacy).await;
            let a = s.account("acct-0");
            assert!(a.cooling_ms > 0 && a.cooling_ms <= 5_000, "{kind:?} {a:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_stream_failure_before_commit_fails_over() {
    both(|legacy| async move {
        let s = two(legacy);
        s.mock
            .set_behaviour("acct-0", Behaviour::fail_in_stream("server_is_overloaded"));
        let r = s.post_responses_x(true).await;
        assert_eq!(r.status(), 200);
        let body = r.text().await.unwrap();
        assert!(
            body.contains("response.completed") && !body.contains("response.failed"),
            "{body}"
        );
        assert_eq!(
            body.matches("event: response.created").count(),
            1,
            "held-back events of the failed attempt never reach the client"
        );
        assert_eq!(s.served_by(), vec!["acct-0", "acct-1"]);
        assert!(s.account("acct-0").cooling_ms > 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn token_invalidated_refreshes_once_and_retries_the_same_account() {
    both(|legacy| async move {
        let s = two(legacy);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour::error(ErrorKind::TokenInvalidated).times(1),
        );
        let (st, v) = ask(&s).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            s.served_by(),
            vec!["acct-0", "acct-0"],
            "same account after the refresh"
        );
        assert_eq!(s.mock.token_calls(), 1);
        let last = s.mock.requests().pop().unwrap();
        let fresh = s.mock.account_tokens("acct-0").unwrap();
        assert_eq!(
            last.header("authorization").unwrap(),
            format!("Bearer {}", fresh.access_token)
        );
        let a = s.account("acct-0");
        assert_eq!((a.status, a.cooling_ms), ("active", 0));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn second_401_after_refresh_needs_reauth() {
    both(|legacy| async move {
        let s = two(legacy);
        s.mock
            .set_behaviour("acct-0", Behaviour::error(ErrorKind::TokenInvalidated));
        let (st, v) = ask(&s).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(s.served_by(), vec!["acct-0", "acct-0", "acct-1"]);
        assert_eq!(s.account("acct-0").status, "reauth_required");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deactivated_is_banned() {
    both(|legacy| async move {
        let s = fails_over(ErrorKind::AccountDeactivated, legacy).await;
        assert_eq!(s.account("acct-0").status, "banned");
        // the same answer as a 403
        let s = two(legacy);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                status: Some(403),
                ..Behaviour::error(ErrorKind::AccountDeactivated)
            },
        );
        let (st, v) = ask(&s).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(s.account("acct-0").status, "banned");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_json_403_is_a_short_cooldown_not_a_ban() {
    both(|legacy| async move {
        // `x-mock-status: 403` alone: `{"error":{"code":"mock_status",...}}`, no deactivation
        // signal.
        let s = two(legacy);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                status: Some(403),
                ..Behaviour::default()
            },
        );
        let (st, v) = ask(&s).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(s.served_by(), vec!["acct-0", "acct-1"]);
        let a = s.account("acct-0");
        assert_eq!(a.status, "active", "{a:?}");
        assert!(a.cooling_ms > 0 && a.cooling_ms <= 30_000, "{a:?}");
        assert_eq!(s.mock.token_calls(), 0, "not a credential failure");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_cannot_get_an_account_banned() {
    both(|legacy| async move {
        // The upstream echoes the client's parameter name: "Unsupported parameter: account has
        // been deactivated". It is the client's error, whatever the status.
        for status in ["400", "403"] {
            let s = two(legacy);
            let r = s
                .post_json(
                    "/v1/responses",
                    &json!({"model":"gpt-5.5","input":"x","client_metadata":{
                        "x-mock-error":"unsupported_parameter",
                        "x-mock-param":"account has been deactivated",
                        "x-mock-status":status,
                    }}),
                )
                .await;
            let st = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            assert_eq!(st.to_string(), status, "{v}");
            assert_eq!(
                v["error"]["message"], "Unsupported parameter: account has been deactivated",
                "{v}"
            );
            assert_eq!(s.served_by(), vec!["acct-0"], "{status}: no failover");
            let a = s.account("acct-0");
            assert_eq!((a.status, a.cooling_ms), ("active", 0), "{status}: {a:?}");
            // and it keeps serving
            let (st, v) = ask(&s).await;
            assert_eq!(st, 200, "{v}");
            assert_eq!(s.served_by(), vec!["acct-0", "acct-0"], "{status}");
            assert_eq!(s.account("acct-0").status, "active");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cloudflare_block_is_a_short_cooldown_not_a_credential_failure() {
    both(|legacy| async move {
        let s = fails_over(ErrorKind::Cloudflare, legacy).await;
        let a = s.account("acct-0");
        assert_eq!(a.status, "active");
        assert!(a.cooling_ms > 0 && a.cooling_ms <= 60_000);
        assert_eq!(s.mock.token_calls(), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn model_not_supported_tries_other_accounts() {
    both(|legacy| async move {
        let s = fails_over(ErrorKind::ModelNotSupported, legacy).await;
        assert_eq!(s.account("acct-0").status, "active");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn request_errors_are_returned_without_failover() {
    both(|legacy| async move {
        for (kind, status, code) in [
            (
                ErrorKind::UnsupportedParameter,
                400,
                "unsupported_parameter",
            ),
            (
                ErrorKind::ContextLengthExceeded,
                400,
                "context_length_exceeded",
            ),
            // `cyber_policy` moves the session to another account (issue 27):
            // tests/tests/day_two_pool.rs.
        ] {
            let s = two(legacy);
            s.mock.set_behaviour("acct-0", Behaviour::error(kind));
            let (st, v) = ask(&s).await;
            assert_eq!(st, status, "{kind:?}: {v}");
            assert_eq!(v["error"]["code"], code, "{v}");
            assert_eq!(s.served_by(), vec!["acct-0"], "{kind:?}: no failover");
            let a = s.account("acct-0");
            assert_eq!(
                (a.status, a.cooling_ms),
                ("active", 0),
                "the account is not penalized"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn all_accounts_failing_gives_a_deterministic_503() {
    both(|legacy| async move {
        let s = two(legacy);
        s.mock
            .set_behaviour("acct-0", Behaviour::error(ErrorKind::ServerIsOverloaded));
        s.mock
            .set_behaviour("acct-1", Behaviour::error(ErrorKind::ServerIsOverloaded));
        let (st, v) = ask(&s).await;
        assert_eq!(st, 503, "{v}");
        assert!(
            !v.to_string().contains("acct-"),
            "no account names leak: {v}"
        );
        let (st, v) = ask(&s).await;
        assert_eq!(st, 503, "{v}");
    })
    .await;
}

/// A request every account refuses as overloaded (an overloaded upstream, or a request the
/// upstream always fails with a 5xx) cools the first account only: found by the fault soak,
/// where a few such requests each cooled three of four accounts and kept the pool out.
#[tokio::test(flavor = "multi_thread")]
async fn one_overloaded_request_cools_one_account_not_the_pool() {
    both(|legacy| async move {
        let s = StackBuilder {
            accounts: 3,
            workers: 1,
            strategy: Some(shared_state::snapshot::Strategy::FillFirst),
            legacy,
            ..StackBuilder::default()
        }
        .start();
        for kind in ["server_is_overloaded", "internal"] {
            let r = s
                .post_json(
                    "/v1/responses",
                    &json!({"model":"gpt-5.5","input":"x","client_metadata":{"x-mock-error":kind}}),
                )
                .await;
            assert_eq!(r.status(), 503, "{kind}");
            let cooling: Vec<bool> = (0..3)
                .map(|i| s.account(&format!("acct-{i}")).cooling_ms > 0)
                .collect();
            assert_eq!(
                cooling.iter().filter(|c| **c).count(),
                1,
                "{kind}: one account cools, not every one tried: {cooling:?}"
            );
            // The pool still serves at once.
            let (st, v) = ask(&s).await;
            assert_eq!(st, 200, "{kind}: {v}");
            s.mock.clear_behaviour("acct-0");
            for i in 0..3 {
                s.mock.clear_behaviour(&format!("acct-{i}"));
            }
            // Let the one cooldown (5 s without a hint) pass before the next kind.
            tokio::time::sleep(std::time::Duration::from_millis(5200)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_concurrent_401s_cause_one_token_call() {
    both(|legacy| async move {
        let s = StackBuilder {
            accounts: 1,
            mock: MockConfig {
                token_delay: Duration::from_millis(300),
                ..MockConfig::default()
            },
            legacy,
            ..StackBuilder::default()
        }
        .start();
        // The token is rejected while all 50 requests are in flight upstream (the 401s arrive
        // after 200 ms), so each of them sees its own 401.
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                first_byte_delay: Some(Duration::from_millis(200)),
                ..Behaviour::error(ErrorKind::TokenInvalidated)
            }
            .times(50),
        );
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let req = s
                .post("/v1/responses")
                .json(&json!({"model":"gpt-5.5","input":"x"}));
            tasks.push(tokio::spawn(async move {
                let r = req.send().await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap_or_default())
            }));
        }
        let mut ok = 0;
        let mut failed = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (200, _) => ok += 1,
                other => failed.push(other),
            }
        }
        assert_eq!(s.mock.token_calls(), 1, "single-flight refresh");
        assert_eq!(
            ok, 50,
            "every request retried with the refreshed token: {failed:?}"
        );
        assert_eq!(s.mock.responses_requests(), 100, "50 rejected + 50 retried");
        assert_eq!(s.account("acct-0").status, "active");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrency_limit_is_never_exceeded() {
    both(|legacy| async move {
        let s = StackBuilder {
            accounts: 5,
            mock: streaming_mock(4, Duration::from_millis(20)),
            legacy,
            ..StackBuilder::default()
        }
        .start();
        let accounts = s.admin_json("/api/admin/accounts").await;
        for a in accounts["data"].as_array().unwrap() {
            let r = s
                .admin_patch(&format!("/api/admin/accounts/{}", a["id"]))
                .json(&json!({"max_concurrency": 2}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
        // wait for the republished snapshot
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while s
            .app
            .snapshot
            .load()
            .accounts
            .iter()
            .any(|a| a.max_concurrency != 2)
        {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let snap = s.app.snapshot.clone();
        let stop2 = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut max = 0;
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                for a in snap.load().accounts.iter() {
                    max = max.max(a.live.in_flight());
                }
            }
            max
        });
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let req = s
                .post("/v1/responses")
                .json(&json!({"model":"gpt-5.5","input":"x","stream":true}));
            tasks.push(tokio::spawn(async move {
                let r = req.send().await.unwrap();
                let st = r.status().as_u16();
                let body = r.text().await.unwrap();
                (st, body.contains("response.completed"))
            }));
        }
        for t in tasks {
            let (st, done) = t.await.unwrap();
            assert_eq!(st, 200);
            assert!(done);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let max = sampler.join().unwrap();
        assert!(max <= 2, "an account had {max} requests in flight");
        assert!(max >= 1);
    })
    .await;
}

/// Waits until the account's cooldown is over.
async fn until_not_cooling(s: &Stack, chatgpt_account_id: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.account(chatgpt_account_id).cooling_ms > 0 {
        assert!(std::time::Instant::now() < deadline, "cooldown never ended");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The concurrency limit the scheduler gives the account now (0 = unlimited).
fn concurrency_limit(s: &Stack, chatgpt_account_id: &str) -> u32 {
    let snap = s.app.snapshot.load();
    let a = snap
        .accounts
        .iter()
        .find(|a| a.chatgpt_account_id == chatgpt_account_id)
        .expect("account");
    gateway::scheduler::effective_limit(a, &snap.settings, shared_state::now_ms())
}

#[tokio::test(flavor = "multi_thread")]
async fn health_recovers_after_failures() {
    both(|legacy| async move {
        let s = StackBuilder {
            accounts: 1,
            tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
                c.sidecar.settings.default_max_concurrency = 8;
            })),
            legacy,
            ..StackBuilder::default()
        }
        .start();
        assert_eq!(concurrency_limit(&s, "acct-0"), 8);

        // Ten upstream 500s (each cools the account for the second its Retry-After asks).
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                retry_after: Some("1".to_owned()),
                ..Behaviour::error(ErrorKind::Internal)
            }
            .times(10),
        );
        for i in 0..10 {
            until_not_cooling(&s, "acct-0").await;
            let (st, v) = ask(&s).await;
            assert_eq!(st, 503, "failure {i}: {v}");
        }
        assert_eq!(s.mock.responses_requests(), 10);
        assert_eq!(
            concurrency_limit(&s, "acct-0"),
            1,
            "ten failures in a row quarantine the account"
        );

        // Fifty good requests.
        until_not_cooling(&s, "acct-0").await;
        for i in 0..50 {
            let (st, v) = ask(&s).await;
            assert_eq!(st, 200, "success {i}: {v}");
        }
        assert_eq!(s.mock.responses_requests(), 60);
        assert_eq!(
            concurrency_limit(&s, "acct-0"),
            8,
            "fifty successes restore full concurrency"
        );

        // Eight streams that do not end on their own are served at once: each gets its head
        // (the gateway answers after the commit barrier) while the others are still open. At
        // a reduced limit the extra ones would queue, then fail.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let req = s.post("/v1/responses").json(&json!({
                "model":"gpt-5.5","input":"x","stream":true,
                "client_metadata":{"x-mock-tokens":"1000000","x-mock-inter-event-delay-ms":"50"}
            }));
            tasks.push(tokio::spawn(async move { req.send().await.unwrap() }));
        }
        let mut open = Vec::new();
        for t in tasks {
            open.push(t.await.unwrap());
        }
        let statuses: Vec<u16> = open.iter().map(|r| r.status().as_u16()).collect();
        assert_eq!(statuses, vec![200; 8]);
        assert_eq!(s.account("acct-0").in_flight, 8);
        drop(open);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_cut_before_any_output_is_not_resent() {
    both(|legacy| async move {
        // acct-0's stream breaks after `response.created` and `response.in_progress`, before
        // any output: the upstream may have run the request, so it is not sent again.
        let s = two(legacy);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                disconnect_after: Some(2),
                ..Behaviour::default()
            },
        );
        for stream in [false, true] {
            s.mock.clear_requests();
            let r = s
                .post_json(
                    "/v1/responses",
                    &json!({"model":"gpt-5.5","input":"x","stream":stream}),
                )
                .await;
            let st = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            assert_eq!(st, 502, "stream {stream}: {v}");
            assert_eq!(v["error"]["code"], "stream_disconnected", "{v}");
            assert_eq!(s.served_by(), vec!["acct-0"], "stream {stream}: not resent");
        }
        assert_eq!(s.account("acct-0").status, "active");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn first_byte_timeout_is_a_504_and_not_resent() {
    both(|legacy| async move {
        let s = StackBuilder {
            accounts: 2,
            workers: 1,
            legacy,
            strategy: Some(shared_state::snapshot::Strategy::FillFirst),
            tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
                c.gateway.upstream.first_byte_timeout = Duration::from_millis(300);
            })),
            ..StackBuilder::default()
        }
        .start();
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                first_byte_delay: Some(Duration::from_secs(10)),
                ..Behaviour::default()
            },
        );
        let t = std::time::Instant::now();
        let (st, v) = ask(&s).await;
        assert_eq!(st, 504, "{v}");
        assert_eq!(v["error"]["code"], "upstream_timeout", "{v}");
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "answered before the upstream did: {:?}",
            t.elapsed()
        );
        assert_eq!(
            s.served_by(),
            vec!["acct-0"],
            "the request was sent: not resent"
        );
        // The account is not taken out: the next request (acct-0 answers normally now) is
        // served.
        s.mock.clear_behaviour("acct-0");
        let (st, v) = ask(&s).await;
        assert_eq!(st, 200, "{v}");
    })
    .await;
}

/// The upstream idle timeout holds between any two chunks of a committed stream (the
/// worker's deadline wheel): an answer whose events keep coming, each gap shorter than the
/// timeout, streams to its end however long it lasts; one that hangs after its first output
/// is ended at the timeout in the stream's dialect, not resent.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_hangs_after_the_commit_ends_at_the_idle_timeout() {
    both(|legacy| async move {
        for plain_http in [PlainHttp::H2c, PlainHttp::H1] {
            const IDLE: Duration = Duration::from_millis(400);
            let s = StackBuilder {
                accounts: 2,
                workers: 1,
                legacy,
                plain_http,
                strategy: Some(shared_state::snapshot::Strategy::FillFirst),
                tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
                    c.gateway.upstream.idle_timeout = IDLE;
                })),
                ..StackBuilder::default()
            }
            .start();
            // Eight deltas 150 ms apart: 1.2 s in all, three times the idle timeout.
            s.mock.set_behaviour(
                "acct-0",
                Behaviour {
                    inter_event_delay: Some(Duration::from_millis(150)),
                    deltas: Some(8),
                    ..Behaviour::default()
                },
            );
            let t = std::time::Instant::now();
            let (_, body) = s.stream_responses("x").await;
            assert!(t.elapsed() > IDLE * 2, "{:?}", t.elapsed());
            assert!(body.contains("event: response.completed"), "{body}");

            // Hangs after its first output delta.
            s.mock.clear_requests();
            s.mock.set_behaviour(
                "acct-0",
                Behaviour {
                    stall_after: Some(5),
                    ..Behaviour::default()
                },
            );
            let t = std::time::Instant::now();
            let (status, body) = s.stream_responses("x").await;
            assert_eq!(status, 200, "{body}");
            let took = t.elapsed();
            assert!(took >= IDLE, "ended before the idle timeout: {took:?}");
            assert!(took < IDLE * 10, "not ended at the idle timeout: {took:?}");
            assert!(body.contains("response.output_text.delta"), "{body}");
            assert!(!body.contains("event: response.completed"), "{body}");
            assert!(body.contains("upstream_timeout"), "{plain_http:?}: {body}");
            assert_eq!(s.served_by(), vec!["acct-0"], "committed: not resent");
        }
    })
    .await;
}

/// A stream silent for longer than the quiet period gives back its idle buffers (split
/// buffer, encoder output, write buffer) and goes on byte-faithfully when its events resume.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_pauses_past_the_quiet_period_goes_on_intact() {
    both(|legacy| async move {
        let s = StackBuilder {
            workers: 1,
            legacy,
            plain_http: PlainHttp::H2c,
            ..StackBuilder::default()
        }
        .start();
        let gap = gateway::lifecycle::QUIET_AFTER + Duration::from_millis(300);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                inter_event_delay: Some(gap),
                text: Some("one two".into()),
                deltas: Some(2),
                ..Behaviour::default()
            },
        );
        let (status, body) = s.stream_responses("x").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("event: response.completed"), "{body}");
        let text: String = integration_tests::parse_sse(&body)
            .iter()
            .filter(|(ev, _)| ev == "response.output_text.delta")
            .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
            .map(|v| v["delta"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(text, "one two", "{body}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_refused_is_a_quick_502_without_penalizing_accounts() {
    both(|legacy| async move {
        // The upstream is one address for the whole process: nothing listens there, so every
        // candidate fails to connect (nothing was sent: each failure moves on to the next).
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let s = StackBuilder {
            accounts: 2,
            workers: 1,
            legacy,
            upstream_host: Some(format!("http://127.0.0.1:{port}/backend-api/codex")),
            ..StackBuilder::default()
        }
        .start();
        let t = std::time::Instant::now();
        let (st, v) = ask(&s).await;
        assert_eq!(st, 502, "{v}");
        assert_eq!(v["error"]["code"], "upstream_unreachable", "{v}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_eq!(s.mock.responses_requests(), 0);
        for a in ["acct-0", "acct-1"] {
            let a = s.account(a);
            assert_eq!((a.status, a.cooling_ms), ("active", 0), "{a:?}");
        }
    })
    .await;
}

/// A plain-HTTP upstream answering every request with an empty `404` (what Cloudflare sends
/// for a blocked route); returns its base URL and a counter of model turns (`POST .../responses`).
fn empty_404_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::{
        io::{Read, Write},
        sync::atomic::Ordering,
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/backend-api/codex", l.local_addr().unwrap());
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let n = n2.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request: the head, then `content-length` bytes of body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    buf.drain(..head_end + len);
                    // Model turns only (the sidecar's catalog and quota calls go here too).
                    if head.starts_with("post ") && head.contains("/responses ") {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = c.write_all(
                        b"HTTP/1.1 404 Not Found\r\nserver: cloudflare\r\ncontent-length: 0\r\n\r\n",
                    );
                }
            });
        }
    });
    (base, n)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_404_is_a_cloudflare_block_not_a_request_error() {
    both(|legacy| async move {
        // Classified like Cloudflare's HTML 403: the account is blocked for a short while
        // (not a credential failure, no ban) and the request fails over. The upstream is one
        // address for the process, so every account gets it.
        let (base, hits) = empty_404_upstream();
        let s = StackBuilder {
            accounts: 2,
            workers: 1,
            legacy,
            upstream_host: Some(base),
            ..StackBuilder::default()
        }
        .start();
        let (st, v) = ask(&s).await;
        assert_eq!(st, 502, "{v}");
        assert_eq!(v["error"]["code"], "upstream_account_unavailable", "{v}");
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "failed over to the second account"
        );
        // The block is the address's, not the accounts': it cools the account it happened
        // on, and the second block of the same request cools nothing (issue 23).
        let cooling: Vec<_> = ["acct-0", "acct-1"]
            .into_iter()
            .map(|a| s.account(a))
            .inspect(|a| assert_eq!(a.status, "active", "{a:?}"))
            .filter(|a| a.cooling_ms > 0)
            .collect();
        assert_eq!(cooling.len(), 1, "{cooling:?}");
        assert!(cooling[0].cooling_ms <= 60_000, "{cooling:?}");
        assert_eq!(s.mock.token_calls(), 0, "not a credential failure");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_failure_after_the_commit_is_not_resent_and_cools_the_account() {
    both(|legacy| async move {
        let s = two(legacy);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                fail_after_output: Some("usage_limit_reached".into()),
                ..Behaviour::default()
            },
        );
        let r = s.post_responses_x(true).await;
        assert_eq!(r.status(), 200);
        let evs = integration_tests::parse_sse(&r.text().await.unwrap());
        assert!(evs.iter().any(|(e, _)| e == "response.output_text.delta"));
        let (last, data) = evs.last().unwrap();
        assert_eq!(last, "response.failed", "{data}");
        assert!(data.contains("usage_limit_reached"), "{data}");
        assert_eq!(
            s.served_by(),
            vec!["acct-0"],
            "no failover after the commit"
        );
        let a = s.account("acct-0");
        assert_eq!(a.status, "active", "{a:?}");
        assert!(a.cooling_ms > 0, "{a:?}");
        // The next request goes to acct-1.
        s.mock.clear_requests();
        let (st, v) = ask(&s).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(s.served_by(), vec!["acct-1"]);
    })
    .await;
}
