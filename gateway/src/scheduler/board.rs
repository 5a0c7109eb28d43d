//! The scheduler board ([`shared_state::board`]): what the scheduler makes of every account
//! now, computed by the scheduler's own rules so the ops page never re-derives them.

use std::{collections::HashMap, sync::Arc};

use shared_state::{
    board::{BoardEntry, SchedulerBoard},
    Snapshot,
};

use super::{assess, order_with, PickRequest, PickScratch};

/// The board of `snapshot` at `now_ms` (a [`shared_state::board::BoardFn`]): every
/// account's [`assess`]ment, and for each account group the full candidate order that a
/// request without a session key, on worker cursor 0, for a model no account excludes,
/// would get now from [`order_with`] (the `smart` draw among near-equal scores is one
/// sample). Runs on the caller's thread (the sidecar's, when the ops page polls); it reads
/// the live atomics and writes nothing.
pub fn board(snapshot: &Arc<Snapshot>, now_ms: u64) -> SchedulerBoard {
    let mut groups: Vec<Option<&str>> = snapshot
        .accounts
        .iter()
        .map(|a| a.group.as_deref())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    let mut position: HashMap<i64, u32> = HashMap::with_capacity(snapshot.accounts.len());
    let mut scratch = PickScratch::default();
    for group in groups {
        let req = PickRequest {
            model: "",
            affinity_key: None,
            now_ms,
            cursor: 0,
            max_candidates: 0,
            group,
        };
        for (i, a) in order_with(snapshot, &req, &mut scratch).iter().enumerate() {
            position.insert(a.id, i as u32 + 1);
        }
    }
    let mut entries: Vec<BoardEntry> = snapshot
        .accounts
        .iter()
        .map(|a| {
            let x = assess(a, &snapshot.settings, now_ms);
            let position = position.get(&a.id).copied();
            BoardEntry {
                account_id: a.id,
                position,
                tier: x.tier.as_str(),
                score: x.score,
                penalty: x.penalty,
                limit: x.limit,
                in_flight: x.in_flight,
                deferred: position.is_some() && x.deferred(),
            }
        })
        .collect();
    entries.sort_by_key(|e| (e.position.is_none(), e.position, e.account_id));
    SchedulerBoard {
        strategy: snapshot.settings.strategy.as_str(),
        snapshot_version: snapshot.version,
        now_ms,
        entries,
    }
}
