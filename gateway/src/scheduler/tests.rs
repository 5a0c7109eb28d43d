//! Unit tests of the scheduler: every strategy, every eligibility rule, the feedback math,
//! dynamic concurrency, and leasing under contention.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use codex_protocol::classify::FailureClass;
use shared_state::{
    AccountEffect, AccountEntry, AccountLive, AccountStatus, Secret, Settings, Snapshot,
};

use super::*;

const NOW: u64 = 1_700_000_000_000;
const NOW_S: u64 = NOW / 1000;

fn entry_with(id: i64, weight: u32, max_concurrency: u32) -> Arc<AccountEntry> {
    Arc::new(raw_entry(id, weight, max_concurrency))
}

/// An active account of `weight` and `max_concurrency` (also the lifecycle tests' account).
pub(crate) fn raw_entry(id: i64, weight: u32, max_concurrency: u32) -> AccountEntry {
    AccountEntry {
        id,
        label: format!("a{id}"),
        chatgpt_account_id: format!("acc-{id}"),
        user_id: None,
        plan: None,
        access_token: Secret::new("tok"),
        access_expires_at: None,
        status: AccountStatus::Active,
        weight,
        max_concurrency,
        live: Arc::new(AccountLive::default()),
        group: None,
        egress: None,
    }
}

fn pool(n: usize) -> Vec<Arc<AccountEntry>> {
    (1..=n as i64).map(|id| entry_with(id, 1, 0)).collect()
}

fn snap(accounts: Vec<Arc<AccountEntry>>, strategy: Strategy) -> Arc<Snapshot> {
    Arc::new(Snapshot {
        version: 1,
        accounts,
        settings: Settings {
            strategy,
            ..Settings::default()
        },
        ..Default::default()
    })
}

fn snap_with(accounts: Vec<Arc<AccountEntry>>, settings: Settings) -> Arc<Snapshot> {
    Arc::new(Snapshot {
        version: 1,
        accounts,
        settings,
        ..Default::default()
    })
}

fn req<'a>(cursor: usize, k: usize) -> PickRequest<'a> {
    PickRequest {
        model: "gpt-5",
        affinity_key: None,
        now_ms: NOW,
        cursor,
        max_candidates: k,
        group: None,
    }
}

fn ids(v: &[Arc<AccountEntry>]) -> Vec<i64> {
    v.iter().map(|a| a.id).collect()
}

fn pick(s: &Arc<Snapshot>, r: &PickRequest<'_>) -> Vec<i64> {
    ids(&order_with(s, r, &mut PickScratch::default()))
}

fn first(s: &Arc<Snapshot>, r: &PickRequest<'_>, scratch: &mut PickScratch) -> i64 {
    order_with(s, r, scratch)[0].id
}

fn assert_unique(v: &[i64]) {
    let set: HashSet<_> = v.iter().collect();
    assert_eq!(set.len(), v.len(), "duplicates in {v:?}");
}

fn fail_n(a: &AccountEntry, kind: FailureKind, n: usize, at: u64) {
    for _ in 0..n {
        record_failure(&a.live, kind, at);
    }
}

// === eligibility ===

#[test]
fn eligibility_filters() {
    let accs = pool(9);
    let settings = Settings {
        strategy: Strategy::FillFirst,
        pause_threshold_pct: Some(90.0),
        min_request_interval_ms: 1_000,
        default_max_concurrency: 2,
        ..Settings::default()
    };
    // 1: fine. 2: status override. 3: cooling. 4: no token. 5: primary above pause.
    // 6: secondary above pause. 7: model excluded. 8: interval not elapsed. 9: saturated.
    accs[1]
        .live
        .apply(&AccountEffect::Status(AccountStatus::ReauthRequired));
    accs[2]
        .live
        .apply(&AccountEffect::cooldown(NOW + 1, "test"));
    let mut accs = accs;
    accs[3] = Arc::new(AccountEntry {
        access_token: Secret::new(""),
        ..raw_entry(4, 1, 0)
    });
    accs[4].live.apply(&AccountEffect::quota(
        Some(90.0),
        Some(NOW_S + 60),
        None,
        None,
    ));
    accs[5].live.apply(&AccountEffect::quota(
        Some(10.0),
        None,
        Some(95.0),
        Some(NOW_S + 3600),
    ));
    exclude_model(&accs[6].live, "gpt-5", NOW + 60_000, NOW);
    assert!(note_request_start(&accs[7], &settings, NOW - 500));
    let _l1 = accs[8].live.try_acquire(2).unwrap();
    let _l2 = accs[8].live.try_acquire(2).unwrap(); // saturated: last, but eligible
    let s = snap_with(accs.clone(), settings.clone());

    assert_eq!(pick(&s, &req(0, 0)), vec![1, 9]);
    // The model exclusion is per model.
    let other = PickRequest {
        model: "gpt-5-mini",
        ..req(0, 0)
    };
    assert_eq!(pick(&s, &other), vec![1, 7, 9]);
    // Time heals the cooldown, the interval and the exclusion; a past reset un-pauses.
    let later = PickRequest {
        now_ms: NOW + 3_600_000,
        ..req(0, 0)
    };
    let got = pick(&s, &later);
    assert_eq!(got, vec![1, 3, 5, 6, 7, 8, 9], "got {got:?}");
    for a in &accs {
        assert_eq!(
            is_eligible(a, &settings, "gpt-5", NOW),
            a.id == 1 || a.id == 9,
            "account {}",
            a.id
        );
    }
}

#[test]
fn pause_threshold_none_never_pauses() {
    let accs = pool(2);
    accs[0].live.apply(&AccountEffect::quota(
        Some(100.0),
        Some(NOW_S + 60),
        None,
        None,
    ));
    let s = snap(accs, Strategy::FillFirst);
    assert_eq!(pick(&s, &req(0, 0)), vec![1, 2]);
}

#[test]
fn frozen_order_is_unique_bounded_and_eligible_for_every_strategy() {
    let accs: Vec<_> = (1..=40)
        .map(|id| entry_with(id, (id % 3 + 1) as u32, 3))
        .collect();
    for (i, a) in accs.iter().enumerate() {
        a.live.apply(&AccountEffect::quota(
            Some((i * 7 % 100) as f64),
            Some(NOW_S + (i as u64 * 37) % 500),
            Some((i * 3 % 100) as f64),
            Some(NOW_S + 86_400),
        ));
        if i % 5 == 0 {
            a.live.apply(&AccountEffect::cooldown(NOW + 10_000, "test"));
        }
        if i % 7 == 0 {
            record_failure(&a.live, FailureKind::Timeout, NOW);
        }
    }
    for st in Strategy::ALL {
        let s = snap(accs.clone(), st);
        for key in [None, Some("sess-1"), Some("sess-2")] {
            for cursor in 0..20 {
                for k in [0, 1, 3, 8] {
                    let r = PickRequest {
                        affinity_key: key,
                        ..req(cursor, k)
                    };
                    let got = pick(&s, &r);
                    assert_unique(&got);
                    if k == 0 {
                        assert_eq!(got.len(), 32, "{st}: every eligible account");
                    } else {
                        assert_eq!(got.len(), k, "{st}");
                    }
                    for id in &got {
                        assert_ne!((id - 1) % 5, 0, "{st}: cooling account {id} picked");
                    }
                }
            }
        }
    }
}

#[test]
fn empty_pool_and_all_ineligible_give_empty_order() {
    for st in Strategy::ALL {
        assert!(pick(&snap(Vec::new(), st), &req(0, 3)).is_empty());
        let accs = pool(3);
        for a in &accs {
            a.live.apply(&AccountEffect::cooldown(NOW + 1, "test"));
        }
        assert!(pick(&snap(accs, st), &req(0, 3)).is_empty());
    }
}

#[test]
fn saturated_accounts_come_after_free_ones_for_every_strategy() {
    let accs: Vec<_> = (1..=3).map(|id| entry_with(id, 1, 1)).collect();
    let lease = accs[0].live.try_acquire(1).unwrap();
    for st in Strategy::ALL {
        let s = snap(accs.clone(), st);
        for key in [None, Some("k1"), Some("k2")] {
            for c in 0..6 {
                let r = PickRequest {
                    affinity_key: key,
                    ..req(c, 0)
                };
                let got = pick(&s, &r);
                assert_eq!(got.len(), 3, "{st}");
                assert_eq!(got[2], 1, "{st}: busy account last in {got:?}");
                let two = pick(
                    &s,
                    &PickRequest {
                        max_candidates: 2,
                        ..r
                    },
                );
                assert!(!two.contains(&1), "{st}: free accounts fill k first");
            }
        }
    }
    // Everything busy: the order still has candidates (the lifecycle may queue on them).
    let l2 = accs[1].live.try_acquire(1).unwrap();
    let l3 = accs[2].live.try_acquire(1).unwrap();
    for st in Strategy::ALL {
        assert_eq!(pick(&snap(accs.clone(), st), &req(0, 2)).len(), 2, "{st}");
    }
    drop((lease, l2, l3));
    assert_eq!(
        pick(&snap(accs, Strategy::FillFirst), &req(0, 0)),
        vec![1, 2, 3]
    );
}

// === fill_first ===

#[test]
fn fill_first_fills_accounts_in_id_order() {
    let accs: Vec<_> = (1..=4).map(|id| entry_with(id, 1, 2)).collect();
    let s = snap(accs.clone(), Strategy::FillFirst);
    for cursor in 0..5 {
        assert_eq!(pick(&s, &req(cursor, 0)), vec![1, 2, 3, 4]);
    }
    let mut leases = Vec::new();
    // Simulate the lifecycle: take the first candidate's slot each time.
    let mut firsts = Vec::new();
    for _ in 0..6 {
        let order = order_with(&s, &req(0, 3), &mut PickScratch::default());
        let a = &order[0];
        firsts.push(a.id);
        leases.push(
            a.live
                .try_acquire(effective_limit(a, &s.settings, NOW))
                .unwrap(),
        );
    }
    assert_eq!(firsts, vec![1, 1, 2, 2, 3, 3]);
}

// === round_robin ===

#[test]
fn round_robin_rotates_by_cursor() {
    let s = snap(pool(5), Strategy::RoundRobin);
    for c in 0..12 {
        let got = pick(&s, &req(c, 0));
        let start = (c % 5) as i64 + 1;
        let want: Vec<i64> = (0..5).map(|j| (start - 1 + j) % 5 + 1).collect();
        assert_eq!(got, want);
    }
    // An ineligible account is skipped, its turn goes to the next one.
    s.accounts[1]
        .live
        .apply(&AccountEffect::cooldown(NOW + 1, "test"));
    assert_eq!(pick(&s, &req(1, 2)), vec![3, 4]);
}

#[test]
fn round_robin_spreads_by_weight() {
    let weights = [1u32, 2, 3, 4];
    let accs: Vec<_> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| entry_with(i as i64 + 1, w, 0))
        .collect();
    let s = snap(accs, Strategy::RoundRobin);
    let mut scratch = PickScratch::default();
    let mut counts: HashMap<i64, u32> = HashMap::new();
    for c in 0..1_000 {
        *counts
            .entry(first(&s, &req(c, 2), &mut scratch))
            .or_default() += 1;
    }
    for (i, w) in weights.iter().enumerate() {
        assert_eq!(counts[&(i as i64 + 1)], 100 * w, "{counts:?}");
    }
}

// === sticky ===

#[test]
fn sticky_is_stable_for_a_key_and_moves_only_when_ineligible() {
    let s = snap(pool(20), Strategy::Sticky);
    let keys: Vec<String> = (0..200).map(|i| format!("session-{i}")).collect();
    let home = |s: &Arc<Snapshot>, key: &str, cursor: usize, now: u64| -> Vec<i64> {
        let r = PickRequest {
            affinity_key: Some(key),
            now_ms: now,
            ..req(cursor, 3)
        };
        pick(s, &r)
    };
    let before: Vec<Vec<i64>> = keys.iter().map(|k| home(&s, k, 0, NOW)).collect();
    // Stable across cursors, clocks and workers (fresh scratch each time).
    for (k, b) in keys.iter().zip(&before) {
        for c in [1, 7, 99] {
            assert_eq!(&home(&s, k, c, NOW + c as u64 * 1000), b);
        }
    }
    // Spread: 200 keys over 20 accounts use most of them.
    let used: HashSet<i64> = before.iter().map(|b| b[0]).collect();
    assert!(used.len() >= 15, "{used:?}");

    // Account 7 goes away: only its sessions move, each to its own second choice.
    s.accounts[6]
        .live
        .apply(&AccountEffect::cooldown(NOW + 60_000, "test"));
    let mut moved = 0;
    for (k, b) in keys.iter().zip(&before) {
        let now = home(&s, k, 0, NOW);
        if b[0] == 7 {
            moved += 1;
            assert_eq!(now[0], b[1], "moves to its next rendezvous choice");
        } else {
            assert_eq!(now[0], b[0], "unaffected sessions stay");
        }
    }
    assert!(moved > 0);
    // It comes back: its sessions return.
    s.accounts[6].live.apply(&AccountEffect::OperatorStatus {
        status: AccountStatus::Active,
        cooldown_until_ms: 0,
    });
    for (k, b) in keys.iter().zip(&before) {
        assert_eq!(&home(&s, k, 0, NOW), b);
    }
}

#[test]
fn sticky_is_deterministic_across_instances_and_snapshot_rebuilds() {
    // Another instance builds its own snapshot of the same accounts (same ids).
    let a = snap(pool(50), Strategy::Sticky);
    let b = snap(pool(50), Strategy::Sticky);
    let mut scratch = PickScratch::default();
    for i in 0..100 {
        let key = format!("thread-{i}");
        let r = PickRequest {
            affinity_key: Some(&key),
            ..req(i, 4)
        };
        let x = ids(&order_with(&a, &r, &mut scratch));
        let y = ids(&order_with(&b, &r, &mut scratch));
        assert_eq!(x, y);
    }
}

#[test]
fn sticky_falls_back_to_a_full_pass_when_top_hashes_are_ineligible() {
    let s = snap(pool(100), Strategy::Sticky);
    let r = PickRequest {
        affinity_key: Some("k"),
        ..req(0, 2)
    };
    let top = pick(
        &s,
        &PickRequest {
            max_candidates: 30,
            ..r
        },
    );
    // Make the first 20 rendezvous choices unschedulable.
    for id in &top[..20] {
        s.accounts[(*id - 1) as usize]
            .live
            .apply(&AccountEffect::cooldown(NOW + 1, "test"));
    }
    assert_eq!(pick(&s, &r), top[20..22].to_vec());
}

#[test]
fn sticky_respects_weights() {
    let accs = vec![entry_with(1, 1, 0), entry_with(2, 3, 0)];
    let s = snap(accs, Strategy::Sticky);
    let mut scratch = PickScratch::default();
    let mut wins = [0u32; 2];
    for i in 0..4_000 {
        let key = format!("s{i}");
        let r = PickRequest {
            affinity_key: Some(&key),
            ..req(0, 1)
        };
        wins[(first(&s, &r, &mut scratch) - 1) as usize] += 1;
    }
    let ratio = f64::from(wins[1]) / f64::from(wins[0]);
    assert!((2.5..3.5).contains(&ratio), "{wins:?}");
}

#[test]
fn sticky_without_key_is_smart() {
    let accs = pool(30);
    for (i, a) in accs.iter().enumerate() {
        a.live.apply(&AccountEffect::quota(
            Some((i * 3) as f64),
            Some(NOW_S + 100),
            None,
            None,
        ));
    }
    fail_n(&accs[3], FailureKind::Auth, 1, NOW);
    let sticky = snap(accs.clone(), Strategy::Sticky);
    let smart = snap(accs, Strategy::Smart);
    for c in 0..20 {
        assert_eq!(pick(&sticky, &req(c, 5)), pick(&smart, &req(c, 5)));
    }
}

// === quota_reset_priority ===

#[test]
fn quota_reset_priority_prefers_soonest_reset_with_quota_left() {
    let accs = pool(6);
    let q = |i: usize, p: f64, pr: u64, s: f64, sr: u64| {
        accs[i]
            .live
            .apply(&AccountEffect::quota(Some(p), Some(pr), Some(s), Some(sr)));
    };
    q(0, 50.0, NOW_S + 3_000, 10.0, NOW_S + 90_000); // 1
    q(1, 20.0, NOW_S + 600, 10.0, NOW_S + 80_000); // 2: soonest primary, later secondary
    q(2, 20.0, NOW_S + 600, 10.0, NOW_S + 70_000); // 3: same primary, sooner secondary
    q(3, 100.0, NOW_S + 60, 10.0, NOW_S + 70_000); // 4: exhausted: last
    q(4, 5.0, 0, 0.0, 0); // 5: unknown reset: after known ones
    q(5, 30.0, NOW_S + 300, 10.0, NOW_S + 70_000); // 6: soonest but risky: near the end
    fail_n(&accs[5], FailureKind::Auth, 1, NOW);
    let s = snap(accs, Strategy::QuotaResetPriority);
    assert_eq!(pick(&s, &req(0, 0)), vec![3, 2, 1, 5, 6, 4]);
    assert_eq!(pick(&s, &req(5, 2)), vec![3, 2]);
}

#[test]
fn quota_reset_priority_puts_accounts_that_would_lose_quota_first() {
    let accs = pool(3);
    let q = |i: usize, p: f64, pr: u64| {
        accs[i].live.apply(&AccountEffect::quota(
            Some(p),
            Some(pr),
            Some(10.0),
            Some(NOW_S + 500_000),
        ));
    };
    q(0, 70.0, NOW_S + 1_800); // resets in 30 min
    q(1, 10.0, NOW_S + 3_600); // resets in 60 min
    q(2, 10.0, NOW_S + 7_200); // resets in 2 h
    let s = snap(accs.clone(), Strategy::QuotaResetPriority);
    // No burn observed: soonest reset first.
    assert_eq!(pick(&s, &req(0, 0)), vec![1, 2, 3]);
    // At 120%/h account 1's 30% are used up in 15 min, before its reset in 30: the forecast
    // covers it, so the account that would lose quota at its reset (2) goes first.
    accs[0].live.scheduler().burn_primary_pct_h.store(120.0);
    assert_eq!(pick(&s, &req(0, 0)), vec![2, 3, 1]);
    // At 30%/h it lasts to its reset (would lose 15%): first again.
    accs[0].live.scheduler().burn_primary_pct_h.store(30.0);
    assert_eq!(pick(&s, &req(0, 0)), vec![1, 2, 3]);
    // The forecast never makes an account ineligible: a covered account is still offered.
    accs[0].live.scheduler().burn_primary_pct_h.store(1_000.0);
    accs[1].live.scheduler().burn_primary_pct_h.store(1_000.0);
    accs[2].live.scheduler().burn_primary_pct_h.store(1_000.0);
    assert_eq!(pick(&s, &req(0, 0)), vec![1, 2, 3]);
}

// === smart ===

#[test]
fn smart_orders_by_tier_then_score() {
    let accs = pool(5);
    // 1: healthy idle. 2: warm (a timeout). 3: risky (a 401). 4: quarantine (two 401s).
    // 5: healthy but high quota usage.
    fail_n(&accs[1], FailureKind::Timeout, 1, NOW);
    fail_n(&accs[2], FailureKind::Auth, 1, NOW);
    fail_n(&accs[3], FailureKind::Auth, 2, NOW);
    accs[4].live.apply(&AccountEffect::quota(
        Some(95.0),
        Some(NOW_S + 600),
        None,
        None,
    ));
    let st = Settings::default();
    let tiers: Vec<Tier> = accs.iter().map(|a| assess(a, &st, NOW).tier).collect();
    assert_eq!(
        tiers,
        vec![
            Tier::Healthy,
            Tier::Warm,
            Tier::Risky,
            Tier::Quarantine,
            Tier::Healthy
        ]
    );
    let s = snap(accs, Strategy::Smart);
    for c in 0..20 {
        assert_eq!(pick(&s, &req(c, 0)), vec![1, 5, 2, 3, 4]);
    }
}

#[test]
fn smart_spreads_load_among_equals_by_weight() {
    let accs = vec![
        entry_with(1, 1, 0),
        entry_with(2, 1, 0),
        entry_with(3, 2, 0),
        entry_with(4, 4, 0),
    ];
    let s = snap(accs, Strategy::Smart);
    let mut scratch = PickScratch::default();
    let mut counts = [0u32; 4];
    for c in 0..8_000 {
        counts[(first(&s, &req(c, 3), &mut scratch) - 1) as usize] += 1;
    }
    // Expected 1:1:2:4 of 8000 = 1000, 1000, 2000, 4000.
    for (i, want) in [1_000.0, 1_000.0, 2_000.0, 4_000.0].iter().enumerate() {
        let got = f64::from(counts[i]);
        assert!((got - want).abs() < want * 0.12, "{counts:?}");
    }
}

#[test]
fn smart_soft_affinity_keeps_a_healthy_home_and_leaves_a_sick_one() {
    let s = snap(pool(10), Strategy::Smart);
    let r = |c: usize| PickRequest {
        affinity_key: Some("conv-42"),
        ..req(c, 3)
    };
    let home = pick(&s, &r(0))[0];
    for c in 1..50 {
        assert_eq!(pick(&s, &r(c))[0], home, "stays home while healthy");
    }
    // Home becomes risky: the session moves (to its next healthy rendezvous choice), and
    // the risky account is not first for anyone.
    let h = &s.accounts[(home - 1) as usize];
    fail_n(h, FailureKind::Auth, 1, NOW);
    let moved = pick(&s, &r(0))[0];
    assert_ne!(moved, home);
    for c in 1..50 {
        assert_eq!(pick(&s, &r(c))[0], moved, "a stable second home");
    }
    // Without a key, load spreads: several different firsts.
    let firsts: HashSet<i64> = (0..50).map(|c| pick(&s, &req(c, 3))[0]).collect();
    assert!(firsts.len() >= 5, "{firsts:?}");
}

#[test]
fn smart_samples_large_pools_but_still_finds_rare_healthy_accounts() {
    let accs = pool(3_000);
    let healthy = [17usize, 1_500, 2_999];
    for (i, a) in accs.iter().enumerate() {
        if !healthy.contains(&i) {
            fail_n(a, FailureKind::Auth, 2, NOW);
        }
    }
    let s = snap(accs, Strategy::Smart);
    for c in 0..10 {
        let mut got = pick(&s, &req(c, 3));
        got.sort_unstable();
        assert_eq!(got, vec![18, 1_501, 3_000]);
    }
    // With a mostly healthy pool, a pick reads only a sample and still returns k.
    let s = snap(pool(3_000), Strategy::Smart);
    let got = pick(&s, &req(0, 5));
    assert_eq!(got.len(), 5);
    assert_unique(&got);
}

// === feedback math ===

#[test]
fn penalties_decay_with_time() {
    let accs = pool(1);
    let a = &accs[0];
    let st = Settings::default();
    record_failure(&a.live, FailureKind::RateLimit, NOW);
    let p0 = decayed_penalty(&a.live, NOW);
    assert!((p0 - FailureKind::RateLimit.weight()).abs() < 1e-3);
    let hl = FailureKind::RateLimit.half_life().as_millis() as u64;
    assert!((decayed_penalty(&a.live, NOW + hl) - p0 / 2.0).abs() < 1e-3);
    assert!((decayed_penalty(&a.live, NOW + 2 * hl) - p0 / 4.0).abs() < 1e-3);
    // The streak term stays until a success; the decayed part fades.
    let fresh = assess(a, &st, NOW);
    let old = assess(a, &st, NOW + 10 * hl);
    assert!(old.score > fresh.score);
    assert!(old.penalty < fresh.penalty);
    // Auth decays slower than a timeout.
    assert!(FailureKind::Auth.half_life() > FailureKind::Timeout.half_life());
}

#[test]
fn success_relieves_penalties_and_resets_the_streak() {
    let accs = pool(1);
    let a = &accs[0];
    let st = Settings::default();
    fail_n(a, FailureKind::Auth, 1, NOW);
    assert_eq!(assess(a, &st, NOW).tier, Tier::Risky);
    for _ in 0..3 {
        record_success_at(&a.live, Duration::from_millis(800), NOW);
    }
    let after = assess(a, &st, NOW);
    assert!(after.penalty < 50.0 * 0.35, "{after:?}");
    assert!(after.tier <= Tier::Warm, "{after:?}");
    reset_feedback(&a.live);
    assert_eq!(assess(a, &st, NOW).score, BASE_SCORE);
}

#[test]
fn ewma_math() {
    let accs = pool(1);
    let live = &accs[0].live;
    let s = live.scheduler();
    record_failure(live, FailureKind::Server, NOW);
    assert!((s.error_rate.load() - ERROR_RATE_ALPHA).abs() < 1e-12);
    record_failure(live, FailureKind::Server, NOW);
    let two = ERROR_RATE_ALPHA + ERROR_RATE_ALPHA * (1.0 - ERROR_RATE_ALPHA);
    assert!((s.error_rate.load() - two).abs() < 1e-12);
    record_success_at(live, Duration::from_millis(1_000), NOW);
    assert!((s.error_rate.load() - two * (1.0 - ERROR_RATE_ALPHA)).abs() < 1e-12);
    // Latency: the first sample seeds the average, the next ones blend.
    assert!((s.first_token_ms.load() - 1_000.0).abs() < 1e-9);
    record_success_at(live, Duration::from_millis(3_000), NOW);
    let want = 1_000.0 + LATENCY_ALPHA * 2_000.0;
    assert!((s.first_token_ms.load() - want).abs() < 1e-9);
    // Many failures converge toward 1 and put the account in quarantine.
    for _ in 0..40 {
        record_failure(live, FailureKind::Server, NOW);
    }
    assert!(s.error_rate.load() > 0.99);
    assert_eq!(
        assess(&accs[0], &Settings::default(), NOW).tier,
        Tier::Quarantine
    );
}

#[test]
fn ewma_is_lock_free_under_contention() {
    let live = Arc::new(AccountLive::default());
    std::thread::scope(|sc| {
        for _ in 0..8 {
            let live = Arc::clone(&live);
            sc.spawn(move || {
                for _ in 0..1_000 {
                    live.scheduler().first_token_ms.update(|v| v + 1.0);
                }
            });
        }
    });
    assert_eq!(live.scheduler().first_token_ms.load(), 8_000.0);
}

#[test]
fn slow_first_tokens_and_quota_lower_the_score() {
    let accs = pool(3);
    let st = Settings::default();
    record_success_at(&accs[1].live, Duration::from_secs(25), NOW);
    accs[2].live.apply(&AccountEffect::quota(
        Some(90.0),
        Some(NOW_S + 60),
        Some(80.0),
        Some(NOW_S + 600),
    ));
    let base = assess(&accs[0], &st, NOW).score;
    assert!(assess(&accs[1], &st, NOW).score < base - 10.0);
    assert!(assess(&accs[2], &st, NOW).score < base - 20.0);
    // A window whose reset already passed reads as unused.
    let later = assess(&accs[2], &st, (NOW_S + 601) * 1000);
    assert_eq!(later.primary_pct, 0.0);
    assert_eq!(later.secondary_pct, 0.0);
}

#[test]
fn failure_kinds_map_from_classes() {
    use FailureClass as C;
    let cases = [
        (
            C::UsageLimit { resets_at: None },
            Some(FailureKind::RateLimit),
        ),
        (
            C::RateLimited {
                retry_after_s: Some(3),
            },
            Some(FailureKind::RateLimit),
        ),
        (C::UsageNotIncluded, Some(FailureKind::Auth)),
        (C::AuthExpired, Some(FailureKind::Auth)),
        (C::Deactivated, Some(FailureKind::Auth)),
        (C::OVERLOADED, Some(FailureKind::Server)),
        (
            C::Overloaded {
                retry_after_s: Some(30),
            },
            Some(FailureKind::Server),
        ),
        (C::Cloudflare, Some(FailureKind::Blocked)),
        (C::Forbidden, Some(FailureKind::Blocked)),
        (C::ModelNotSupported, None),
        (C::ContinuationNotFound, None),
        (C::Request, None),
    ];
    for (class, want) in cases {
        assert_eq!(FailureKind::from_class(&class), want, "{class:?}");
    }
    let names: HashSet<_> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names.len(), FailureKind::COUNT);
}

// === dynamic concurrency ===

#[test]
fn dynamic_concurrency_shrinks_for_unhealthy_tiers() {
    assert_eq!(Tier::Healthy.limit(8), 8);
    assert_eq!(Tier::Warm.limit(8), 4);
    assert_eq!(Tier::Warm.limit(1), 1);
    assert_eq!(Tier::Risky.limit(8), 2);
    assert_eq!(Tier::Risky.limit(2), 1);
    assert_eq!(Tier::Risky.limit(100), 4);
    assert_eq!(Tier::Quarantine.limit(8), 1);
    assert_eq!(Tier::Healthy.limit(0), 0, "unlimited stays unlimited");
    assert_eq!(Tier::Warm.limit(0), 0);
    assert_eq!(Tier::Risky.limit(0), 4);
    assert_eq!(Tier::Quarantine.limit(0), 1);

    let accs = vec![entry_with(1, 1, 8), entry_with(2, 1, 0)];
    let st = Settings {
        default_max_concurrency: 6,
        ..Settings::default()
    };
    assert_eq!(effective_limit(&accs[0], &st, NOW), 8);
    assert_eq!(effective_limit(&accs[1], &st, NOW), 6, "settings default");
    fail_n(&accs[0], FailureKind::Auth, 1, NOW);
    assert_eq!(effective_limit(&accs[0], &st, NOW), 2);
    fail_n(&accs[0], FailureKind::Auth, 1, NOW);
    assert_eq!(effective_limit(&accs[0], &st, NOW), 1);
    // A risky account at its reduced limit is saturated and goes after free ones.
    let _lease = accs[0].live.try_acquire(1).unwrap();
    let s = snap_with(accs, st);
    assert_eq!(pick(&s, &req(0, 0)), vec![2, 1]);
}

#[test]
fn note_request_start_claims_the_interval() {
    let accs = pool(1);
    let a = &accs[0];
    let st = Settings {
        min_request_interval_ms: 1_000,
        ..Settings::default()
    };
    assert!(note_request_start(a, &st, NOW));
    assert!(!note_request_start(a, &st, NOW + 999));
    assert!(!is_eligible(a, &st, "m", NOW + 999));
    assert!(is_eligible(a, &st, "m", NOW + 1_000));
    assert!(note_request_start(a, &st, NOW + 1_000));
    // Without an interval it only records.
    let free = Settings::default();
    assert!(note_request_start(a, &free, NOW + 1_001));
    assert!(note_request_start(a, &free, NOW + 1_001));
    assert_eq!(
        a.live.scheduler().last_request_ms.load(Ordering::Relaxed),
        NOW + 1_001
    );
}

#[test]
fn concurrent_leases_never_exceed_the_limit() {
    const ACCOUNTS: usize = 5;
    const LIMIT: u32 = 2;
    let accs: Vec<_> = (1..=ACCOUNTS as i64)
        .map(|id| entry_with(id, 1, LIMIT))
        .collect();
    let holding: Vec<AtomicU32> = (0..ACCOUNTS).map(|_| AtomicU32::new(0)).collect();
    let peak: Vec<AtomicU32> = (0..ACCOUNTS).map(|_| AtomicU32::new(0)).collect();
    let st = Settings::default();
    std::thread::scope(|sc| {
        for t in 0..100 {
            let (accs, holding, peak, st) = (&accs, &holding, &peak, &st);
            sc.spawn(move || {
                for j in 0..300 {
                    let i = (t + j) % ACCOUNTS;
                    let limit = effective_limit(&accs[i], st, NOW);
                    if let Some(lease) = accs[i].live.try_acquire(limit) {
                        let now = holding[i].fetch_add(1, Ordering::SeqCst) + 1;
                        peak[i].fetch_max(now, Ordering::SeqCst);
                        assert!(now <= LIMIT, "{now} in flight on account {i}");
                        std::thread::yield_now();
                        holding[i].fetch_sub(1, Ordering::SeqCst);
                        drop(lease);
                    }
                }
            });
        }
    });
    for (i, a) in accs.iter().enumerate() {
        assert_eq!(a.live.in_flight(), 0);
        assert!(peak[i].load(Ordering::SeqCst) <= LIMIT);
    }
}

// === snapshots and scratch ===

#[test]
fn scratch_follows_snapshot_changes() {
    let mut scratch = PickScratch::default();
    let a = snap(pool(4), Strategy::RoundRobin);
    assert_eq!(first(&a, &req(2, 1), &mut scratch), 3);
    // A new snapshot with other weights: the cached prefix sums are rebuilt.
    let b = snap(
        vec![entry_with(1, 10, 0), entry_with(2, 1, 0)],
        Strategy::RoundRobin,
    );
    assert_eq!(first(&b, &req(2, 1), &mut scratch), 1);
    assert_eq!(first(&b, &req(10, 1), &mut scratch), 2);
    // The thread-local wrapper gives the same answers.
    assert_eq!(ids(&order(&b, &req(10, 1))), vec![2]);
}

#[test]
fn exclude_model_affects_only_that_model_and_account() {
    let accs = pool(3);
    exclude_model(
        &accs[1].live,
        "gpt-5-codex",
        NOW + MODEL_EXCLUSION_TTL.as_millis() as u64,
        NOW,
    );
    let s = snap(accs, Strategy::FillFirst);
    let r = PickRequest {
        model: "gpt-5-codex",
        ..req(0, 0)
    };
    assert_eq!(pick(&s, &r), vec![1, 3]);
    assert_eq!(pick(&s, &req(0, 0)), vec![1, 2, 3]);
    let later = PickRequest {
        now_ms: NOW + MODEL_EXCLUSION_TTL.as_millis() as u64,
        ..r
    };
    assert_eq!(pick(&s, &later), vec![1, 2, 3]);
}

#[test]
fn accounts_waiting_for_a_token_refresh_come_after_ready_ones() {
    let accs = pool(3);
    accs[0].live.apply(&AccountEffect::Refreshing {
        until_ms: NOW + 30_000,
    });
    for st in Strategy::ALL {
        let s = snap(accs.clone(), st);
        let got = pick(&s, &req(0, 0));
        assert_eq!(got.len(), 3, "{st}: still a candidate");
        assert_eq!(got[2], 1, "{st}: {got:?}");
    }
    assert!(assess(&accs[0], &Settings::default(), NOW).deferred());
    assert!(!assess(&accs[0], &Settings::default(), NOW + 30_000).deferred());
}

// === large pools: two-level rendezvous and the reset order ===

/// A pool above [`HRW_FLAT_MAX`], so `sticky` and the soft affinity use buckets.
const LARGE: usize = 2_000;

#[test]
fn large_pools_hash_through_buckets_that_cover_every_account_once() {
    let s = snap(pool(LARGE), Strategy::Sticky);
    let ix = SnapshotIndex::build(&s);
    let b = ix.buckets.as_ref().expect("buckets above HRW_FLAT_MAX");
    let mut seen: Vec<u32> = b.members.clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..LARGE as u32).collect::<Vec<_>>());
    assert!(
        b.hash.len() > 64,
        "ids spread over the buckets: {}",
        b.hash.len()
    );
    assert!(
        SnapshotIndex::build(&snap(pool(HRW_FLAT_MAX), Strategy::Sticky))
            .buckets
            .is_none()
    );
    // The full rendezvous order visits every account exactly once.
    let mut ix = ix;
    let (mut hrw, mut outer) = (Selector::default(), Selector::default());
    let mut r = Rendezvous {
        index: &mut ix,
        hrw: &mut hrw,
        outer: &mut outer,
    };
    let mut visited = Vec::new();
    r.walk(key_hash("k"), 3, |i| {
        visited.push(i);
        false
    });
    assert_eq!(visited.len(), LARGE);
    assert_unique(&visited.iter().map(|&i| i as i64).collect::<Vec<_>>());
}

#[test]
fn large_pool_sticky_is_stable_deterministic_and_moves_only_when_ineligible() {
    let s = snap(pool(LARGE), Strategy::Sticky);
    let other = snap(pool(LARGE), Strategy::Sticky);
    let keys: Vec<String> = (0..300).map(|i| format!("session-{i}")).collect();
    let home = |s: &Arc<Snapshot>, key: &str, cursor: usize| -> Vec<i64> {
        let r = PickRequest {
            affinity_key: Some(key),
            ..req(cursor, 3)
        };
        pick(s, &r)
    };
    let before: Vec<Vec<i64>> = keys.iter().map(|k| home(&s, k, 0)).collect();
    let mut scratch = PickScratch::default();
    for (k, b) in keys.iter().zip(&before) {
        assert_eq!(&home(&s, k, 9), b, "stable across cursors");
        assert_eq!(&home(&other, k, 0), b, "same on another instance");
        let r = PickRequest {
            affinity_key: Some(k),
            ..req(1, 3)
        };
        assert_eq!(&ids(&order_with(&s, &r, &mut scratch)), b, "reused scratch");
    }
    let used: HashSet<i64> = before.iter().map(|b| b[0]).collect();
    assert!(used.len() >= 250, "300 sessions spread: {}", used.len());
    // The home of session 0 goes away: exactly the sessions living there move, each to its
    // own next choice; the others stay.
    let gone = before[0][0];
    s.accounts[(gone - 1) as usize]
        .live
        .apply(&AccountEffect::cooldown(NOW + 60_000, "test"));
    for (k, b) in keys.iter().zip(&before) {
        let now = home(&s, k, 0);
        if b[0] == gone {
            assert_eq!(now[0], b[1], "moves to its next rendezvous choice");
        } else {
            assert_eq!(now[0], b[0], "unaffected sessions stay");
        }
        assert!(!now.contains(&gone));
    }
    // Its next 40 choices (beyond the first ranked slice of its bucket) go away too: the
    // walk ranks the rest and still finds the next ones in order.
    let r = PickRequest {
        affinity_key: Some(keys[0].as_str()),
        ..req(0, 45)
    };
    let order = pick(&s, &r);
    for id in &order[..40] {
        s.accounts[(*id - 1) as usize]
            .live
            .apply(&AccountEffect::cooldown(NOW + 60_000, "test"));
    }
    assert_eq!(home(&s, &keys[0], 0), order[40..43].to_vec());
}

#[test]
fn large_pool_sticky_respects_weights() {
    // Odd ids weigh 3, even ids 1: odd accounts should win about 3/4 of the sessions.
    let accs: Vec<_> = (1..=LARGE as i64)
        .map(|id| entry_with(id, if id % 2 == 1 { 3 } else { 1 }, 0))
        .collect();
    let s = snap(accs, Strategy::Sticky);
    let mut scratch = PickScratch::default();
    let mut heavy = 0u32;
    for i in 0..4_000 {
        let key = format!("s{i}");
        let r = PickRequest {
            affinity_key: Some(&key),
            ..req(0, 1)
        };
        heavy += u32::from(first(&s, &r, &mut scratch) % 2 == 1);
    }
    let share = f64::from(heavy) / 4_000.0;
    assert!((0.72..0.78).contains(&share), "{share}");
}

#[test]
fn large_pool_smart_affinity_keeps_its_home() {
    let s = snap(pool(LARGE), Strategy::Smart);
    let r = |c: usize| PickRequest {
        affinity_key: Some("conv-7"),
        ..req(c, 3)
    };
    let home = pick(&s, &r(0))[0];
    for c in 1..30 {
        assert_eq!(pick(&s, &r(c))[0], home);
    }
    fail_n(&s.accounts[(home - 1) as usize], FailureKind::Auth, 1, NOW);
    let moved = pick(&s, &r(0))[0];
    assert_ne!(moved, home);
    for c in 1..30 {
        assert_eq!(pick(&s, &r(c))[0], moved);
    }
}

// === the ranked index (smart over a large pool) and the session cache ===

/// A smart pick of `k` on a shared scratch (the ranked index persists between picks).
fn smart_pick(
    s: &Arc<Snapshot>,
    scratch: &mut PickScratch,
    c: usize,
    k: usize,
    now: u64,
) -> Vec<i64> {
    let r = PickRequest {
        now_ms: now,
        ..req(c, k)
    };
    ids(&order_with(s, &r, scratch))
}

#[test]
fn ranked_index_never_offers_an_account_that_went_out_since_it_was_built() {
    let accs = pool(LARGE);
    let s = snap_with(
        accs.clone(),
        Settings {
            strategy: Strategy::Smart,
            pause_threshold_pct: Some(95.0),
            ..Settings::default()
        },
    );
    let mut scratch = PickScratch::default();
    // Build the index: every account is healthy and idle, all in the best rank.
    let first = smart_pick(&s, &mut scratch, 0, 5, NOW);
    assert_eq!(first.len(), 5);
    assert!(scratch.index.as_ref().is_some_and(|ix| ix.tiers.is_some()));
    // Live changes the index does not know of: the accounts just picked and a third of the
    // pool go out in three ways (cooldown, a worker's status override, quota past the pause
    // threshold), without a new snapshot.
    let mut gone: HashSet<i64> = first.iter().copied().collect();
    gone.extend((1..=LARGE as i64).filter(|id| id % 3 == 0));
    for (n, id) in gone.iter().enumerate() {
        let live = &accs[(*id - 1) as usize].live;
        match n % 3 {
            0 => live.apply(&AccountEffect::cooldown(NOW + 3_600_000, "test")),
            1 => live.apply(&AccountEffect::Status(AccountStatus::Disabled)),
            _ => live.apply(&AccountEffect::quota(
                Some(100.0),
                Some(NOW_S + 3_600),
                None,
                None,
            )),
        }
    }
    for c in 1..400 {
        let k = [1, 5, 40][c % 3];
        let got = smart_pick(&s, &mut scratch, c, k, NOW + c as u64);
        assert_eq!(got.len(), k, "enough healthy accounts remain");
        assert_unique(&got);
        for id in &got {
            assert!(
                !gone.contains(id),
                "pick {c}: account {id} is out but was picked"
            );
        }
    }
    // The index learned it: the accounts it read are ranked out now.
    let ix = scratch
        .index
        .as_ref()
        .and_then(|ix| ix.tiers.as_ref())
        .unwrap();
    for id in &first {
        assert_eq!(ix.rank_of_account((*id - 1) as usize), rank::OUT_RANK);
    }
}

#[test]
fn ranked_index_prefers_healthy_accounts_after_live_failures() {
    let accs = pool(LARGE);
    let s = snap(accs.clone(), Strategy::Smart);
    let mut scratch = PickScratch::default();
    let mut sick = HashSet::new();
    // Every first candidate fails with a 401 right after it was picked (risky tier): the
    // next picks must lead with a healthy account every time.
    for c in 0..300 {
        let got = smart_pick(&s, &mut scratch, c, 3, NOW);
        assert!(
            !sick.contains(&got[0]),
            "pick {c} leads with sick {}",
            got[0]
        );
        for id in &got {
            assert!(!sick.contains(id), "pick {c}: a sick account among {got:?}");
        }
        fail_n(&accs[(got[0] - 1) as usize], FailureKind::Auth, 1, NOW);
        sick.insert(got[0]);
    }
    // With no healthy account left in reach, sick ones are still candidates (tier first).
    let few = pool(40);
    for a in &few[..38] {
        fail_n(a, FailureKind::Auth, 1, NOW);
    }
    let s = snap(few, Strategy::Smart);
    let mut scratch = PickScratch::default();
    for c in 0..20 {
        let got = smart_pick(&s, &mut scratch, c, 5, NOW);
        assert_eq!(got.len(), 5);
        let mut head = got[..2].to_vec();
        head.sort_unstable();
        assert_eq!(
            head,
            vec![39, 40],
            "the two healthy accounts first: {got:?}"
        );
    }
}

#[test]
fn ranked_smart_spreads_load_over_a_large_pool_by_weight() {
    // Odd ids weigh 3, even ids 1: about 3/4 of the first candidates should be odd, and
    // the load should reach most of the pool, not a few accounts the index ranks first.
    let accs: Vec<_> = (1..=LARGE as i64)
        .map(|id| entry_with(id, if id % 2 == 1 { 3 } else { 1 }, 0))
        .collect();
    let s = snap(accs, Strategy::Smart);
    let mut scratch = PickScratch::default();
    let (mut heavy, mut firsts) = (0u32, HashSet::new());
    for c in 0..6_000 {
        let got = smart_pick(&s, &mut scratch, c, 3, NOW);
        heavy += u32::from(got[0] % 2 == 1);
        firsts.insert(got[0]);
    }
    let share = f64::from(heavy) / 6_000.0;
    assert!((0.71..0.79).contains(&share), "{share}");
    assert!(firsts.len() >= 1_500, "{} distinct firsts", firsts.len());
}

#[test]
fn ranked_index_brings_back_accounts_whose_cooldown_ended() {
    let accs = pool(LARGE);
    let s = snap(accs.clone(), Strategy::Smart);
    // All but ten accounts cool down for a second before the index is built.
    for a in &accs[10..] {
        a.live.apply(&AccountEffect::cooldown(NOW + 1_000, "test"));
    }
    let mut scratch = PickScratch::default();
    let got = smart_pick(&s, &mut scratch, 0, 5, NOW);
    assert!(got.iter().all(|id| *id <= 10), "{got:?}");
    // The ten get busy (a lease each lowers their score), so the accounts that come back
    // lead the order as soon as the pick knows of them.
    let leases: Vec<_> = accs[..10].iter().map(|a| a.live.try_acquire(0)).collect();
    // After the cooldown, the accounts that came back are found by the next picks.
    let mut back = HashSet::new();
    for c in 1..50 {
        for id in smart_pick(&s, &mut scratch, c, 5, NOW + 2_000) {
            if id > 10 {
                back.insert(id);
            }
        }
    }
    assert!(
        back.len() >= 20,
        "accounts back from cooldown: {}",
        back.len()
    );
    drop(leases);
}

#[test]
fn session_cache_gives_the_walks_order_within_the_group() {
    // Two groups over a large pool; the cached prefix must equal the walk's order of the
    // request's group, beyond the prefix too, with ineligible accounts in between.
    let accs: Vec<_> = (1..=LARGE as i64)
        .map(|id| {
            let mut e = raw_entry(id, 1 + (id % 3) as u32, 0);
            if id % 4 == 0 {
                e.group = Some("team".into());
            }
            Arc::new(e)
        })
        .collect();
    for a in accs.iter().filter(|a| a.id % 7 == 0) {
        a.live.apply(&AccountEffect::cooldown(NOW + 60_000, "test"));
    }
    let s = snap(accs, Strategy::Sticky);
    let mut warm = PickScratch::default();
    for round in 0..2 {
        for i in 0..200 {
            let key = format!("sess-{i}");
            for group in [None, Some("team")] {
                for k in [1, 5, SESSION_PREFIX + 8] {
                    let r = PickRequest {
                        affinity_key: Some(&key),
                        group,
                        ..req(i, k)
                    };
                    let cold = pick(&s, &r);
                    let hot = ids(&order_with(&s, &r, &mut warm));
                    assert_eq!(cold, hot, "round {round} key {key} group {group:?} k {k}");
                    assert_eq!(hot.len(), k);
                    for id in &hot {
                        assert_eq!(id % 4 == 0, group.is_some(), "group respected");
                        assert_ne!(id % 7, 0, "cooling account {id}");
                    }
                }
            }
        }
    }
}

#[test]
fn quota_reset_priority_follows_many_moves_without_a_rescan() {
    let accs = reset_pool();
    let s = snap(accs.clone(), Strategy::QuotaResetPriority);
    let mut scratch = PickScratch::default();
    let check = |scratch: &mut PickScratch, now: u64| -> Vec<i64> {
        let r = PickRequest {
            now_ms: now,
            ..req(3, 0)
        };
        let full = pick(&s, &r);
        let got = ids(&order_with(
            &s,
            &PickRequest {
                max_candidates: 5,
                ..r
            },
            scratch,
        ));
        assert_eq!(got, full[..5].to_vec());
        got
    };
    check(&mut scratch, NOW);
    let built = scratch
        .index
        .as_ref()
        .unwrap()
        .resets
        .as_ref()
        .unwrap()
        .built_ms;
    // Many accounts learn earlier resets, one after another (more than the moved set
    // holds, so some are merged into the order): each pick stays exact.
    for (n, a) in accs.iter().rev().take(3 * RESET_MOVED_MAX).enumerate() {
        let at = a.live.primary_reset_at();
        a.live.apply(&AccountEffect::quota(
            None,
            Some((NOW_S + 30 + (n as u64 * 13) % 3_000).min(at)),
            None,
            None,
        ));
        check(&mut scratch, NOW + 1 + n as u64);
    }
    let r = scratch.index.as_ref().unwrap().resets.as_ref().unwrap();
    assert_eq!(r.built_ms, built, "no rebuild from live state");
    assert!(r.moved.len() <= RESET_MOVED_MAX);
    // Past the log's reach (more moves than it holds between two picks): rebuilt, exact.
    let a = &accs[0].live;
    for n in 0..shared_state::account::RESET_LOG_LEN as u64 + 1 {
        a.apply(&AccountEffect::quota(
            None,
            Some(NOW_S + 100_000 + n * 700),
            None,
            None,
        ));
        a.apply(&AccountEffect::quota(
            None,
            Some(NOW_S + 40 + n % 2),
            None,
            None,
        ));
    }
    check(&mut scratch, NOW + 5_000);
    let r = scratch.index.as_ref().unwrap().resets.as_ref().unwrap();
    assert_eq!(r.built_ms, NOW + 5_000, "rebuilt after the log overflowed");
}

#[test]
fn indexes_survive_a_publish_that_changes_no_account() {
    let accs = pool(LARGE);
    let a = snap(accs.clone(), Strategy::Sticky);
    let mut scratch = PickScratch::default();
    let r = PickRequest {
        affinity_key: Some("sess"),
        ..req(0, 3)
    };
    let home = ids(&order_with(&a, &r, &mut scratch));
    let cached = |scratch: &PickScratch| {
        let ix = scratch.index.as_ref().unwrap();
        let tag = key_hash("sess") | 1;
        ix.sessions.get(tag).map(<[u32]>::to_vec)
    };
    let prefix = cached(&scratch).expect("cached after the first pick");
    // A new snapshot of the same accounts (a token refresh, a settings change): the
    // session cache carries over (a round_robin pick touches neither index).
    let b = snap_with(
        accs.clone(),
        Settings {
            strategy: Strategy::RoundRobin,
            default_max_concurrency: 7,
            ..Settings::default()
        },
    );
    order_with(&b, &req(0, 3), &mut scratch);
    assert!(scratch.index.as_ref().unwrap().is_for(&b));
    assert_eq!(cached(&scratch), Some(prefix));
    let c = snap(accs.clone(), Strategy::Sticky);
    assert_eq!(ids(&order_with(&c, &r, &mut scratch)), home);
    // One account fewer: everything is rebuilt.
    let d = snap(accs[1..].to_vec(), Strategy::RoundRobin);
    order_with(&d, &req(0, 3), &mut scratch);
    assert_eq!(cached(&scratch), None);
}

/// Quota with random-ish reset instants over a large pool.
fn reset_pool() -> Vec<Arc<AccountEntry>> {
    let accs = pool(LARGE);
    for (i, a) in accs.iter().enumerate() {
        let i = i as u64;
        a.live.apply(&AccountEffect::quota(
            Some((i * 7 % 90) as f64),
            Some(NOW_S + 60 + (i * 7_919) % 18_000),
            Some(10.0),
            Some(NOW_S + 86_400 + (i * 104_729) % 500_000),
        ));
    }
    accs
}

#[test]
fn quota_reset_priority_order_is_exact_while_live_state_moves() {
    let accs = reset_pool();
    let s = snap(accs.clone(), Strategy::QuotaResetPriority);
    let mut scratch = PickScratch::default();
    // `k = 0` ranks every account; a bounded pick must be its prefix, whatever the index.
    let check = |scratch: &mut PickScratch, now: u64| -> Vec<i64> {
        let r = PickRequest {
            now_ms: now,
            ..req(3, 0)
        };
        let full = pick(&s, &r);
        let got = ids(&order_with(
            &s,
            &PickRequest {
                max_candidates: 5,
                ..r
            },
            scratch,
        ));
        assert_eq!(got, full[..5].to_vec());
        got
    };
    let top = check(&mut scratch, NOW);
    assert!(scratch.index.as_ref().is_some_and(|ix| ix.resets.is_some()));
    // The best become ineligible (live, no new snapshot): never offered.
    for id in &top[..3] {
        accs[(*id - 1) as usize]
            .live
            .apply(&AccountEffect::cooldown(NOW + 3_600_000, "test"));
    }
    let got = check(&mut scratch, NOW);
    assert_eq!(got[..2], top[3..5]);
    for id in &top[..3] {
        assert!(!got.contains(id));
    }
    // A late account learns a reset far earlier than anyone's: first at once (the move log
    // names it: offered beside the order), and later too.
    let late = accs
        .iter()
        .max_by_key(|a| a.live.primary_reset_at())
        .map(|a| a.id)
        .unwrap();
    accs[(late - 1) as usize]
        .live
        .apply(&AccountEffect::quota(None, Some(NOW_S + 5), None, None));
    assert_eq!(check(&mut scratch, NOW)[0], late);
    assert_eq!(check(&mut scratch, NOW + 250)[0], late);
    // Jitter (a few seconds earlier, no epoch move) keeps the order exact too.
    let second = check(&mut scratch, NOW + 250)[1];
    let a = &accs[(second - 1) as usize].live;
    let at = a.primary_reset_at();
    a.apply(&AccountEffect::quota(
        None,
        Some(at - shared_state::account::RESET_JITTER_S),
        None,
        None,
    ));
    check(&mut scratch, NOW + 250);
    // A window that passed and renewed (its instant jumps later) moves back.
    a.apply(&AccountEffect::quota(None, Some(at + 18_000), None, None));
    assert_ne!(check(&mut scratch, NOW + 250)[1], second);
}

// === the board ===

#[test]
fn board_shows_the_schedulers_order_and_assessment() {
    let accs = pool(6);
    fail_n(&accs[1], FailureKind::Auth, 2, NOW); // quarantine: last candidate
    accs[3]
        .live
        .apply(&AccountEffect::cooldown(NOW + 60_000, "test")); // not a candidate
    let grouped = Arc::new(AccountEntry {
        group: Some("team".into()),
        ..raw_entry(7, 1, 0)
    });
    let mut all = accs.clone();
    all.push(Arc::clone(&grouped));
    let s = snap(all, Strategy::FillFirst);
    let b = board(&s, NOW);
    assert_eq!(b.strategy, "fill_first");
    assert_eq!(b.entries.len(), 7, "every account");
    let order: Vec<(i64, Option<u32>)> = b
        .entries
        .iter()
        .map(|e| (e.account_id, e.position))
        .collect();
    // fill_first: id order per group (the group's own order numbered apart); the cooling
    // account after every candidate, without a position.
    assert_eq!(
        order,
        vec![
            (1, Some(1)),
            (7, Some(1)),
            (2, Some(2)),
            (3, Some(3)),
            (5, Some(4)),
            (6, Some(5)),
            (4, None)
        ]
    );
    for e in &b.entries {
        let a = assess(&s.accounts[(e.account_id - 1) as usize], &s.settings, NOW);
        assert_eq!(
            (e.tier, e.score, e.limit),
            (a.tier.as_str(), a.score, a.limit)
        );
    }
    assert_eq!(b.entries[2].tier, "quarantine");
    // The same order a request of the shared pool gets.
    assert_eq!(pick(&s, &req(0, 0)), vec![1, 2, 3, 5, 6]);
    // Live changes show at the next call: account 4 cools down no more, 1 is disabled.
    accs[3].live.apply(&AccountEffect::OperatorStatus {
        status: AccountStatus::Active,
        cooldown_until_ms: 0,
    });
    accs[0]
        .live
        .apply(&AccountEffect::Status(AccountStatus::Disabled));
    let b = board(&s, NOW);
    let order: Vec<(i64, Option<u32>)> = b
        .entries
        .iter()
        .map(|e| (e.account_id, e.position))
        .collect();
    assert_eq!(order[0], (2, Some(1)));
    assert_eq!(order[6], (1, None));
    assert!(order.contains(&(4, Some(3))));
}

// === the ranked index across publishes and comebacks (large pools) ===

/// An account the ranked index saw disabled, then re-enabled by a publish that keeps every
/// account's live state (the index is carried over): the next pick has it, not a pick after
/// the repair walk reaches it.
#[test]
fn a_publish_that_re_enables_an_account_brings_it_back_at_the_next_pick() {
    let accs = pool(2_000);
    let x = 777usize;
    for (i, a) in accs.iter().enumerate() {
        if i != x {
            fail_n(a, FailureKind::Auth, 2, NOW);
        }
    }
    let mut before = accs.clone();
    before[x] = Arc::new(AccountEntry {
        status: AccountStatus::Disabled,
        live: Arc::clone(&accs[x].live),
        ..raw_entry(x as i64 + 1, 1, 0)
    });
    let mut scratch = PickScratch::default();
    let s1 = snap(before, Strategy::Smart);
    for c in 0..5 {
        assert_ne!(first(&s1, &req(c, 3), &mut scratch), x as i64 + 1);
    }
    let s2 = snap(accs, Strategy::Smart);
    assert_eq!(first(&s2, &req(5, 3), &mut scratch), x as i64 + 1);
}

/// An account skipped while its egress proxy's breaker was open comes back once the breaker
/// closes: the index schedules a wake-up at the breaker's end, not only the repair walk.
#[test]
fn an_account_behind_a_tripped_proxy_comes_back_when_the_breaker_closes() {
    use shared_state::egress::{ProxyEntry, ProxyLive, ProxyUrl};
    let x = 1_234usize;
    let live = Arc::new(ProxyLive::default());
    let proxy = Arc::new(ProxyEntry::new(
        9,
        "p".into(),
        ProxyUrl::parse("http://127.0.0.1:3128").unwrap(),
        vec!["127.0.0.1:3128".parse().unwrap()],
        Arc::clone(&live),
    ));
    let mut accs = pool(2_000);
    for (i, a) in accs.iter().enumerate() {
        if i != x {
            fail_n(a, FailureKind::Auth, 2, NOW);
        }
    }
    accs[x] = Arc::new(AccountEntry {
        egress: Some(proxy),
        ..raw_entry(x as i64 + 1, 1, 0)
    });
    live.failed(NOW, "connect refused".into());
    let open_until = live.open_until_ms();
    assert!(open_until > NOW);
    let s = snap(accs, Strategy::Smart);
    let mut scratch = PickScratch::default();
    for c in 0..5 {
        assert_ne!(first(&s, &req(c, 3), &mut scratch), x as i64 + 1);
    }
    let later = PickRequest {
        now_ms: open_until + 1,
        ..req(5, 3)
    };
    assert_eq!(first(&s, &later, &mut scratch), x as i64 + 1);
}

/// A wake-up that finds its account still out (cooling, and paused by its quota until a later
/// reset) looks again at the next known comeback instead of leaving it to the repair walk.
#[test]
fn an_account_out_for_two_reasons_comes_back_after_the_later_one() {
    let x = 1_500usize;
    let accs = pool(2_000);
    for (i, a) in accs.iter().enumerate() {
        if i != x {
            fail_n(a, FailureKind::Auth, 2, NOW);
        }
    }
    let cool_until = NOW + 10_000;
    let reset_s = NOW_S + 60;
    accs[x]
        .live
        .apply(&AccountEffect::cooldown(cool_until, "rate_limited"));
    let s = snap_with(
        accs.clone(),
        Settings {
            strategy: Strategy::Smart,
            pause_threshold_pct: Some(95.0),
            ..Settings::default()
        },
    );
    let mut scratch = PickScratch::default();
    let at = |now_ms: u64, c: usize| PickRequest {
        now_ms,
        ..req(c, 3)
    };
    // Indexed while cooling (a wake-up at the cooldown's end); the quota window is seen used
    // up afterwards, while it is out.
    assert_ne!(first(&s, &at(NOW, 0), &mut scratch), x as i64 + 1);
    accs[x]
        .live
        .apply(&AccountEffect::quota(Some(99.0), Some(reset_s), None, None));
    // The cooldown ends; the quota window is still used up.
    assert_ne!(
        first(&s, &at(cool_until + 1, 1), &mut scratch),
        x as i64 + 1
    );
    // The window resets (the upstream reports it so).
    accs[x].live.apply(&AccountEffect::quota(
        Some(0.0),
        Some(reset_s + 18_000),
        None,
        None,
    ));
    assert_eq!(
        first(&s, &at(reset_s * 1000 + 1, 2), &mut scratch),
        x as i64 + 1
    );
}

/// Weighted pool, the model excluded on all but two accounts: the weight-thinned first pass
/// skips most of a rank and the second pass reads what it skipped (once each), so both
/// allowed accounts are found.
#[test]
fn a_weighted_pool_with_a_rare_allowed_model_finds_every_allowed_account() {
    let accs: Vec<_> = (1..=5_000i64)
        .map(|id| entry_with(id, if id % 2 == 0 { 3 } else { 1 }, 0))
        .collect();
    let allowed = [41usize, 4_100];
    for (i, a) in accs.iter().enumerate() {
        if !allowed.contains(&i) {
            exclude_model(&a.live, "m", NOW + 60_000, NOW);
        }
    }
    let s = snap(accs, Strategy::Smart);
    let mut scratch = PickScratch::default();
    for c in 0..20 {
        let r = PickRequest {
            model: "m",
            ..req(c, 3)
        };
        let mut got = ids(&order_with(&s, &r, &mut scratch));
        got.sort_unstable();
        assert_eq!(got, vec![42, 4_101], "pick {c}");
    }
}
