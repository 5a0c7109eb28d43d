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
//! `+newkey` uses a fresh session key per pick (the session cache never hits).
//!
//! The scheduler before the ranked index and the session cache (`3a58ad1`) is a recorded
//! baseline, not code: its last run beside this one (2026-12-02, CPU time and instructions per
//! pick, old and new) is in `gateway/benches/README.md`. At 10,000 accounts `smart` took
//! 5,542 -> 4,342 instructions per pick, `smart+key` 22,374 -> 5,036, `sticky+key`
//! 22,267 -> 3,082; compare a new run with that table's `new` column.
//!
//! Run: `cargo bench -p gateway --bench pick -- --warm-up-time 1 --measurement-time 2`
//!
//! Instructions per pick (immune to a noisy machine): `PICK_COUNT=N PICK_CASE=<case>
//! PICK_SIZE=<n> valgrind --tool=callgrind <bench binary>` runs N picks of one case without
//! criterion (the pool and the index are built before the first pick; subtract a run with
//! `PICK_COUNT=0` and divide by N). `gateway/benches/pick-instructions.sh` does that for the
//! 10,000-account cases.

use std::{hint::black_box, sync::Arc};

use criterion::{
    criterion_group,
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
/// Picks before the counted ones in `PICK_COUNT` mode.
const WARM_PICKS: usize = 2_048;

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

/// Session keys: the first 1,024 cycle (`+key`); `fresh` makes one per pick (`+newkey`).
struct Keys {
    cycle: Vec<String>,
    fresh: String,
}

impl Keys {
    fn new() -> Self {
        Self {
            cycle: (0..1_024).map(|i| format!("session-{i:08x}")).collect(),
            fresh: String::new(),
        }
    }

    fn key(&mut self, mode: KeyMode, cursor: usize) -> Option<&str> {
        match mode {
            KeyMode::None => None,
            KeyMode::Cycle => Some(self.cycle[cursor % self.cycle.len()].as_str()),
            KeyMode::Fresh => {
                use std::fmt::Write;
                self.fresh.clear();
                let _ = write!(self.fresh, "fresh-{cursor:016x}");
                Some(self.fresh.as_str())
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyMode {
    None,
    Cycle,
    Fresh,
}

/// One pick's state: the scheduler's scratch.
#[derive(Default)]
struct Picker {
    scratch: PickScratch,
}

impl Picker {
    #[inline]
    fn pick(&mut self, snap: &Arc<Snapshot>, cursor: usize, key: Option<&str>) -> usize {
        let req = PickRequest {
            model: "gpt-5-codex",
            affinity_key: key,
            now_ms: NOW,
            cursor,
            max_candidates: K,
            group: None,
        };
        black_box(order_with(snap, &req, &mut self.scratch)).len()
    }
}

fn cases() -> Vec<(Strategy, KeyMode, String)> {
    let mut v = Vec::new();
    for s in Strategy::ALL {
        for (mode, suffix) in [
            (KeyMode::None, ""),
            (KeyMode::Cycle, "+key"),
            (KeyMode::Fresh, "+newkey"),
        ] {
            // Only the strategies that use the key get the fresh-key case.
            if mode == KeyMode::Fresh && !matches!(s, Strategy::Smart | Strategy::Sticky) {
                continue;
            }
            v.push((s, mode, format!("{}{suffix}", s.as_str())));
        }
    }
    v
}

fn bench_pick(c: &mut Criterion<ThreadCpu>) {
    let mut keys = Keys::new();
    for (strategy, mode, name) in cases() {
        let mut group = c.benchmark_group(format!("order/{name}"));
        for n in SIZES {
            let (snap, _leases) = build(n, strategy);
            let mut picker = Picker::default();
            let mut cursor = 0usize;
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| {
                    cursor = cursor.wrapping_add(1);
                    picker.pick(&snap, cursor, keys.key(mode, cursor))
                })
            });
        }
        group.finish();
    }
}

/// `PICK_COUNT` mode: a fixed number of picks of one case, for an instruction counter.
fn fixed_count() -> Option<()> {
    let count: usize = std::env::var("PICK_COUNT").ok()?.parse().ok()?;
    let case = std::env::var("PICK_CASE").unwrap_or_else(|_| "smart".into());
    let n: usize = std::env::var("PICK_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (strategy, mode, _) = cases().into_iter().find(|c| c.2 == case)?;
    let (snap, _leases) = build(n, strategy);
    let mut keys = Keys::new();
    let mut picker = Picker::default();
    // Warm-up picks build the per-snapshot index and see every cycled key once (in both
    // the counted run and the `PICK_COUNT=0` run, so they cancel out).
    let mut total = 0;
    for cursor in 0..WARM_PICKS {
        total += picker.pick(&snap, cursor, keys.key(mode, cursor));
    }
    for cursor in WARM_PICKS..WARM_PICKS + count {
        total += picker.pick(&snap, cursor, keys.key(mode, cursor));
    }
    black_box(total);
    Some(())
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench_pick
}
fn main() {
    if fixed_count().is_some() {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
