//! Micro-benchmark of the account scheduler: one frozen candidate order (`order_with`, k = 5)
//! per iteration, for every strategy with and without a session key, at 100, 1 000 and
//! 10 000 accounts (issue 11: a pick at 10 000 accounts within 1 µs).
//!
//! The pool looks like a busy production pool: random quota usage and reset instants, 20 %
//! of accounts with recent penalties (timeouts, 429s, a few 401s), 5 % cooling down, a few
//! leases held, mixed weights. Each iteration advances the worker cursor like a worker does;
//! the `+key` cases cycle through 1 024 session keys (`sticky` and `smart` use them; the
//! other strategies ignore them). The per-snapshot index is built by the first iteration
//! (once per worker per snapshot in production), outside the measured steady state.
//!
//! Times are the bench thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time, so a
//! busy shared machine (other builds descheduling the bench) does not inflate them.
//!
//! Run: `cargo bench -p gateway --bench pick -- --warm-up-time 1 --measurement-time 2`

use std::{hint::black_box, sync::Arc};

use criterion::{
    criterion_group, criterion_main,
    measurement::{Measurement, ValueFormatter, WallTime},
    BenchmarkId, Criterion,
};
use gateway::scheduler::{
    order_with, record_failure, FailureKind, PickRequest, PickScratch, Strategy,
};
use shared_state::{
    AccountEffect, AccountEntry, AccountLive, AccountStatus, Lease, Secret, Settings, Snapshot,
};

const NOW: u64 = 1_700_000_000_000;
const SIZES: [usize; 3] = [100, 1_000, 10_000];
const K: usize = 5;

/// The calling thread's CPU time as a criterion measurement (formatted like wall time).
struct ThreadCpu;

#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static WALL: WallTime = WallTime;

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }

    fn end(&self, started: u64) -> u64 {
        thread_cpu_ns().saturating_sub(started)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}

/// A tiny deterministic generator (no `rand` dependency in the data plane).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn build(n: usize, strategy: Strategy) -> (Arc<Snapshot>, Vec<Lease>) {
    let mut rng = Lcg(n as u64 * 7 + 1);
    let now_s = NOW / 1000;
    let mut leases = Vec::new();
    let accounts: Vec<Arc<AccountEntry>> = (1..=n as i64)
        .map(|id| {
            let live = Arc::new(AccountLive::default());
            live.apply(&AccountEffect::quota(
                Some(rng.below(100) as f64),
                Some(now_s + rng.below(18_000)),
                Some(rng.below(100) as f64),
                Some(now_s + rng.below(604_800)),
            ));
            let roll = rng.below(100);
            if roll < 5 {
                live.apply(&AccountEffect::cooldown(NOW + 60_000, "test"));
            } else if roll < 15 {
                record_failure(&live, FailureKind::Timeout, NOW - rng.below(600_000));
            } else if roll < 22 {
                record_failure(&live, FailureKind::RateLimit, NOW - rng.below(600_000));
            } else if roll < 25 {
                record_failure(&live, FailureKind::Auth, NOW - rng.below(3_600_000));
            }
            if rng.below(10) == 0 {
                if let Some(l) = live.try_acquire(0) {
                    leases.push(l);
                }
            }
            Arc::new(AccountEntry {
                id,
                label: format!("acct-{id}@example.com"),
                chatgpt_account_id: format!("acc-{id}"),
                user_id: None,
                plan: Some("plus".into()),
                access_token: Secret::new("tok"),
                access_expires_at: None,
                status: AccountStatus::Active,
                weight: 1 + (rng.below(4) == 0) as u32,
                max_concurrency: 4,
                live,
                group: None,
                egress: None,
            })
        })
        .collect();
    let snap = Arc::new(Snapshot {
        version: 1,
        accounts,
        settings: Settings {
            strategy,
            pause_threshold_pct: Some(98.0),
            ..Settings::default()
        },
        ..Default::default()
    });
    (snap, leases)
}

fn bench_pick(c: &mut Criterion<ThreadCpu>) {
    let keys: Vec<String> = (0..1_024).map(|i| format!("session-{i:08x}")).collect();
    let cases = Strategy::ALL
        .into_iter()
        .flat_map(|s| [(s, false), (s, true)]);
    for (strategy, keyed) in cases {
        let name = format!("{}{}", strategy.as_str(), if keyed { "+key" } else { "" });
        let mut group = c.benchmark_group(format!("order/{name}"));
        for n in SIZES {
            let (snap, _leases) = build(n, strategy);
            let mut scratch = PickScratch::default();
            let mut cursor = 0usize;
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| {
                    cursor = cursor.wrapping_add(1);
                    let req = PickRequest {
                        model: "gpt-5-codex",
                        affinity_key: keyed.then(|| keys[cursor % keys.len()].as_str()),
                        now_ms: NOW,
                        cursor,
                        max_candidates: K,
                        group: None,
                    };
                    black_box(order_with(&snap, &req, &mut scratch))
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench_pick
}
criterion_main!(benches);
