//! The quota forecast end to end, over simulated time: mock-codex's quota controls set each
//! account's use, the sidecar's poller reads them from `/wham/usage`, and the forecast's
//! clock (injected through `SidecarConfig::forecast_clock`) is advanced by the test, never
//! slept on. `GET /api/admin/forecast` then reports burn, run-out and return instants; the
//! data plane's `/metrics` exports the pool's figures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use integration_tests::{Stack, StackBuilder};
use serde_json::Value;

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;

fn stack(clock: Arc<AtomicU64>) -> Stack {
    StackBuilder {
        accounts: 2,
        tweak: Some(Box::new(move |cfg| {
            cfg.sidecar.forecast_clock =
                shared_state::forecast::Clock::new(move || clock.load(Ordering::SeqCst));
        })),
        ..Default::default()
    }
    .start()
}

async fn forecast(s: &Stack) -> Value {
    let r = s
        .admin_get("/api/admin/forecast")
        .send()
        .await
        .expect("forecast");
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.expect("json")
}

fn account<'a>(v: &'a Value, s: &Stack, chatgpt_id: &str) -> &'a Value {
    let id = s
        .app
        .snapshot
        .load()
        .accounts
        .iter()
        .find(|a| a.chatgpt_account_id == chatgpt_id)
        .expect("account")
        .id;
    v["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .find(|a| a["id"] == id)
        .expect("account in the forecast")
}

fn ms(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("an instant, not {v}"))
}

/// acct-0 burns 60%/h (10% -> 40% in 30 simulated minutes): out an hour later, back at its
/// 5-hour reset. acct-1 stays at 50%: no burn, no run-out. The pool runs out when acct-1,
/// taking the whole demand, is out too (50 minutes later), and returns at acct-0's reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_run_out_and_return_over_simulated_time() {
    let t0 = shared_state::now_ms();
    let clock = Arc::new(AtomicU64::new(t0));
    let s = stack(Arc::clone(&clock));
    s.mock.set_quota("acct-0", 10.0, 5.0);
    s.mock.set_quota("acct-1", 50.0, 20.0);
    s.post_each_account("quota").await;
    let v = forecast(&s).await;
    assert_eq!(v["now_ms"], t0);
    let a0 = account(&v, &s, "acct-0");
    assert_eq!(a0["primary"]["used_pct"], 10.0);
    assert_eq!(
        a0["primary"]["burn_source"], "none",
        "one sample: no burn yet"
    );
    assert!(a0["exhausts_at_ms"].is_null());
    assert!(v["pool"]["exhausts_at_ms"].is_null(), "{}", v["pool"]);

    // Thirty simulated minutes later.
    let t1 = t0 + 30 * MIN;
    clock.store(t1, Ordering::SeqCst);
    s.mock.set_quota("acct-0", 40.0, 6.0);
    s.post_each_account("quota").await;
    let v = forecast(&s).await;
    assert_eq!(v["now_ms"], t1);
    let a0 = account(&v, &s, "acct-0");
    assert_eq!(a0["primary"]["burn_source"], "account");
    let burn = a0["primary"]["burn_pct_per_hour"].as_f64().expect("burn");
    assert!((burn - 60.0).abs() < 1e-6, "{burn}");
    let sburn = a0["secondary"]["burn_pct_per_hour"].as_f64().expect("burn");
    assert!((sburn - 2.0).abs() < 1e-6, "{sburn}");
    let reset0 = ms(&a0["primary"]["reset_at_ms"]);
    assert!(reset0 > t1 + HOUR, "the mock's 5-hour window resets later");
    assert_eq!(ms(&a0["exhausts_at_ms"]), t1 + HOUR, "60% left at 60%/h");
    assert_eq!(a0["binding"], "primary");
    assert_eq!(ms(&a0["capacity_returns_at_ms"]), reset0);
    let a1 = account(&v, &s, "acct-1");
    assert_eq!(a1["primary"]["burn_source"], "account");
    assert_eq!(a1["primary"]["burn_pct_per_hour"], 0.0);
    assert!(a1["exhausts_at_ms"].is_null());
    // The pool: 60%/h of demand; after acct-0 is out it moves to acct-1 (50% left).
    let pool = &v["pool"];
    assert_eq!(pool["accounts"], 2);
    assert_eq!(pool["available_now"], 2);
    assert!((pool["demand_pct_per_hour"].as_f64().expect("demand") - 60.0).abs() < 1e-6);
    let out = ms(&pool["exhausts_at_ms"]);
    let want = t1 + HOUR + 50 * MIN;
    assert!(out.abs_diff(want) <= 5, "{out} vs {want}");
    let reset1 = ms(&account(&v, &s, "acct-1")["primary"]["reset_at_ms"]);
    assert_eq!(ms(&pool["capacity_returns_at_ms"]), reset0.min(reset1));
    // Plans: both accounts observed.
    let plans = v["plans"].as_array().expect("plans");
    assert_eq!(
        plans
            .iter()
            .map(|p| p["accounts"].as_u64().unwrap_or(0))
            .sum::<u64>(),
        2
    );

    // The data plane exports the pool's demand from the burns the sidecar published.
    let text = s.metrics_text().await;
    let metric = |name: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
            .unwrap_or_else(|| panic!("{name} exported"))
    };
    assert_eq!(
        metric("codex_gateway_pool_quota_demand_percent_per_hour"),
        "60"
    );
    assert_eq!(metric("codex_gateway_pool_accounts_available"), "2");
    let secs: f64 = metric("codex_gateway_pool_quota_exhausts_in_seconds")
        .parse()
        .expect("seconds");
    assert!(secs.is_finite() && secs > 0.0, "{secs}");

    // acct-0 runs out: it reports 100%; the pool's demand moves to acct-1 in the forecast.
    let t2 = t1 + HOUR;
    clock.store(t2, Ordering::SeqCst);
    s.mock.set_quota("acct-0", 100.0, 8.0);
    s.post_each_account("quota").await;
    let v = forecast(&s).await;
    let a0 = account(&v, &s, "acct-0");
    assert_eq!(ms(&a0["exhausts_at_ms"]), t2, "out now");
    assert_eq!(ms(&a0["capacity_returns_at_ms"]), reset0);
    assert_eq!(v["pool"]["available_now"], 1);
    let out = ms(&v["pool"]["exhausts_at_ms"]);
    assert!(out.abs_diff(t2 + 50 * MIN) <= 5, "{out}");
}

/// An account whose own estimate starts over (its use dropped: a new window) takes its
/// plan's mean burn meanwhile (`burn_source: "plan"`), which the pool forecast then uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_its_own_burn_takes_its_plans_mean() {
    let t0 = shared_state::now_ms();
    let clock = Arc::new(AtomicU64::new(t0));
    let s = stack(Arc::clone(&clock));
    s.mock.set_quota("acct-0", 10.0, 5.0);
    s.mock.set_quota("acct-1", 20.0, 5.0);
    s.post_each_account("quota").await;
    let _ = forecast(&s).await;
    clock.store(t0 + 30 * MIN, Ordering::SeqCst);
    s.mock.set_quota("acct-0", 20.0, 5.0);
    s.mock.set_quota("acct-1", 40.0, 5.0);
    s.post_each_account("quota").await;
    let v = forecast(&s).await;
    assert_eq!(
        account(&v, &s, "acct-0")["primary"]["burn_pct_per_hour"],
        20.0
    );
    assert_eq!(
        account(&v, &s, "acct-1")["primary"]["burn_pct_per_hour"],
        40.0
    );
    assert!((v["pool"]["demand_pct_per_hour"].as_f64().expect("demand") - 60.0).abs() < 1e-6);
    clock.store(t0 + 40 * MIN, Ordering::SeqCst);
    s.mock.set_quota("acct-1", 5.0, 5.0);
    s.post_each_account("quota").await;
    let v = forecast(&s).await;
    let a0 = account(&v, &s, "acct-0");
    let a1 = account(&v, &s, "acct-1");
    assert_eq!(a0["primary"]["burn_source"], "account");
    // acct-0: 10% -> 20% over 40 minutes.
    let own = a0["primary"]["burn_pct_per_hour"].as_f64().expect("burn");
    assert!((own - 15.0).abs() < 1e-6, "{own}");
    assert_eq!(a1["primary"]["burn_source"], "plan", "{a1}");
    let mean = a1["primary"]["burn_pct_per_hour"].as_f64().expect("burn");
    assert!(
        (mean - own).abs() < 1e-6,
        "the plan's one observed account: {mean}"
    );
    assert!((v["pool"]["demand_pct_per_hour"].as_f64().expect("demand") - 2.0 * own).abs() < 1e-6);
}
