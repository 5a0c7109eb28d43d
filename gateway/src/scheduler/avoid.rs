//! Session anti-affinity and the earliest comeback of a cooling pool.
//!
//! # Key Components
//! - [`avoid`] / [`apply_avoidance`]: an account that refused a session's content
//!   (`cyber_policy`) is moved behind every other candidate of that session's later requests
//!   for [`AVOID_TTL`], so the session is re-pinned to the next account of its order. The
//!   account itself is not penalised: other sessions keep using it. The table is
//!   process-wide (every worker sees a session's avoidance), bounded ([`AVOID_MAX`]
//!   sessions; expired entries are pruned first, then the oldest), and only touched when it
//!   is not empty or a refusal happened, so the common path reads one atomic.
//! - [`earliest_comeback`]: when the cooling account that would be eligible again soonest
//!   comes back, for the bounded wait of a request that found none
//!   (`Settings::max_wait_for_account_ms`).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::Duration,
};

use shared_state::{AccountEntry, Snapshot};

/// How long a session keeps away from an account that refused its content.
pub const AVOID_TTL: Duration = Duration::from_secs(30 * 60);
/// Most sessions remembered at once.
pub const AVOID_MAX: usize = 10_000;

/// Sessions (hash of the scoped affinity key) → accounts to keep away from, with deadlines.
type Table = HashMap<u64, Vec<(i64, u64)>>;

static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// Entries in [`TABLE`] (the fast path: 0 = nothing to apply).
static LEN: AtomicUsize = AtomicUsize::new(0);

fn key_hash(key: &str) -> u64 {
    super::hash::key_hash(key)
}

/// Records that the session `key` (a [`super::scoped_affinity_key`]) keeps away from
/// `account` until `until_ms`.
pub fn avoid(key: &str, account: i64, until_ms: u64, now_ms: u64) {
    let Ok(mut guard) = TABLE.lock() else {
        return;
    };
    let map = guard.get_or_insert_with(HashMap::new);
    if map.len() >= AVOID_MAX {
        map.retain(|_, v| {
            v.retain(|&(_, t)| t > now_ms);
            !v.is_empty()
        });
        if map.len() >= AVOID_MAX {
            // Still full of live entries: forget the one closest to expiry.
            if let Some(k) = map
                .iter()
                .min_by_key(|(_, v)| v.iter().map(|&(_, t)| t).max().unwrap_or(0))
                .map(|(k, _)| *k)
            {
                map.remove(&k);
            }
        }
    }
    let list = map.entry(key_hash(key)).or_default();
    list.retain(|&(a, t)| a != account && t > now_ms);
    list.push((account, until_ms));
    LEN.store(map.len(), Ordering::Release);
}

/// Moves the accounts the session `key` keeps away from behind every other candidate (kept:
/// a last resort when nothing else can serve), in place.
pub fn apply_avoidance(cands: &mut Vec<std::sync::Arc<AccountEntry>>, key: &str, now_ms: u64) {
    if LEN.load(Ordering::Acquire) == 0 || cands.len() < 2 {
        return;
    }
    let avoided: Vec<i64> = {
        let Ok(guard) = TABLE.lock() else {
            return;
        };
        match guard.as_ref().and_then(|m| m.get(&key_hash(key))) {
            Some(v) => v
                .iter()
                .filter(|&&(_, t)| t > now_ms)
                .map(|&(a, _)| a)
                .collect(),
            None => return,
        }
    };
    if avoided.is_empty() {
        return;
    }
    // Stable: the rest keeps the strategy's order, the avoided keep theirs among themselves.
    let (mut keep, away): (Vec<_>, Vec<_>) =
        cands.drain(..).partition(|a| !avoided.contains(&a.id));
    keep.extend(away);
    *cands = keep;
}

/// When the earliest cooling account of `group` that could then serve `model` comes back (ms
/// since epoch), or `None` when no account is cooling (or none that would be eligible once
/// its cooldown ends: disabled, without a token, paused by quota, model excluded).
pub fn earliest_comeback(
    snapshot: &Snapshot,
    model: &str,
    group: Option<&str>,
    now_ms: u64,
) -> Option<u64> {
    snapshot
        .accounts
        .iter()
        .filter(|a| a.group.as_deref() == group && a.live.is_cooling(now_ms))
        .map(|a| (a, a.live.cooldown_until_ms()))
        .filter(|(a, until)| super::is_eligible(a, &snapshot.settings, model, *until))
        .map(|(_, until)| until)
        .min()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn avoided_accounts_go_last_for_that_session_only() {
        let accounts: Vec<_> = (1..=3)
            .map(|id| std::sync::Arc::new(super::super::tests::raw_entry(id, 1, 0)))
            .collect();
        avoid("k:avoid-test", 1, u64::MAX, 0);
        let mut c = accounts.clone();
        apply_avoidance(&mut c, "k:avoid-test", 10);
        assert_eq!(c.iter().map(|a| a.id).collect::<Vec<_>>(), vec![2, 3, 1]);
        let mut other = accounts.clone();
        apply_avoidance(&mut other, "k:someone-else", 10);
        assert_eq!(
            other.iter().map(|a| a.id).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        // Expired: back in order.
        avoid("k:avoid-expired", 2, 5, 0);
        let mut e = accounts.clone();
        apply_avoidance(&mut e, "k:avoid-expired", 10);
        assert_eq!(e.iter().map(|a| a.id).collect::<Vec<_>>(), vec![1, 2, 3]);
    }
}
