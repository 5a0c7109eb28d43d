//! The staggered quota poller: every active account's `/wham/usage` once per
//! `quota_poll_interval`, one account at a time, spread evenly over the interval.
//!
//! # Key Components
//! - [`run`]: with `n` pollable accounts, polls one every `interval / n`, walking accounts in
//!   id order from where it left off, so accounts added or removed meanwhile join or leave
//!   the rotation at once and the spacing adapts to the new `n`.
//! - [`poll_one`]: fetches with the published access token and applies the answer to the
//!   account's [`shared_state::AccountLive`] (quota; a cooldown until the reset when the limit
//!   is reached) and to storage ([`crate::quota::store_usage`]).
//!
//! # Error handling
//! A 401 hands the account to the single-flight refresh with the snapshot version the token
//! came from (so repeated 401s on the same token coalesce into one refresh). Other failures
//! are logged and the account is polled again on the next round.

use std::{sync::Arc, time::Duration};

use shared_state::{AccountEffect, AccountEntry, AccountStatus};
use tokio::{sync::watch, time::Instant};

use super::Quota;
use crate::quota::{QuotaError, UsageClient};

/// How often an idle poller (no pollable account) looks again.
const IDLE_RECHECK: Duration = Duration::from_secs(2);
/// The smallest spacing between two polls.
const MIN_GAP: Duration = Duration::from_millis(10);

/// Whether the poller asks for this account's usage.
fn pollable(a: &AccountEntry) -> bool {
    a.effective_status() == AccountStatus::Active && !a.access_token.is_empty()
}

/// Polls until `stop`; `every` is the per-account interval (non-zero).
pub(crate) async fn run(
    quota: Arc<Quota>,
    client: UsageClient,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    tracing::info!(url = %client.endpoint().url, every = ?every, "quota poller started");
    let mut last: Option<i64> = None;
    let mut next = Instant::now();
    loop {
        let n = quota
            .store
            .publisher
            .current()
            .accounts
            .iter()
            .filter(|a| pollable(a))
            .count();
        if n == 0 {
            tokio::select! {
                _ = tokio::time::sleep(IDLE_RECHECK.min(every)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            next = Instant::now();
            continue;
        }
        let gap = (every / u32::try_from(n).unwrap_or(u32::MAX)).max(MIN_GAP);
        next = (next + gap).max(Instant::now());
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // The next pollable account after `last` in id order, wrapping around.
        let snap = quota.store.publisher.current();
        let mut candidates = snap.accounts.iter().filter(|a| pollable(a));
        let pick = match last {
            Some(l) => candidates
                .clone()
                .find(|a| a.id > l)
                .or_else(|| candidates.next()),
            None => candidates.next(),
        };
        let Some(account) = pick else { continue };
        let id = account.id;
        last = Some(id);
        drop(snap);
        tokio::select! {
            _ = poll_one(&quota, &client, id) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Polls one account now, with its currently published access token.
pub(crate) async fn poll_one(quota: &Arc<Quota>, client: &UsageClient, id: i64) {
    let snap = quota.store.publisher.current();
    let version = snap.version;
    let Some(account) = snap.account(id).cloned() else {
        return;
    };
    drop(snap);
    let client = match quota.egress.usage_for(id, client) {
        Ok(c) => c,
        Err(why) => {
            tracing::warn!(account = id, error = %why, "quota poll skipped: egress proxy unusable");
            return;
        }
    };
    match client
        .fetch(&account.access_token, &account.chatgpt_account_id)
        .await
    {
        Ok(usage) => {
            if let Some(n) = usage.reset_credits {
                quota.credits.set(id, n);
            }
            let live = quota.store.publisher.live(id).await;
            let current_cooldown = live.as_ref().map_or(0, |l| l.cooldown_until_ms());
            let stored = match crate::quota::store_usage(
                quota.store.storage.as_ref(),
                id,
                &usage,
                current_cooldown,
            )
            .await
            {
                Ok(Some(s)) => Some(s),
                Ok(None) => return, // deleted meanwhile
                Err(e) => {
                    tracing::warn!(account = id, error = %e, "cannot persist polled quota");
                    None
                }
            };
            let now_s = shared_state::now_ms() / 1000;
            let q = stored.map_or_else(|| usage.quota_update(now_s), |s| s.quota);
            if let Some(live) = &live {
                live.apply(&AccountEffect::Quota(q));
                if let Some(until) = usage.limit_reset_at(now_s) {
                    live.apply(&AccountEffect::cooldown(
                        until.saturating_mul(1000),
                        crate::quota::LIMIT_REASON,
                    ));
                }
            }
            if usage.limit_reset_at(now_s).is_some() {
                tracing::info!(
                    account = id,
                    "usage limit reached; cooling down until the reset"
                );
            }
            tracing::debug!(
                account = id,
                primary = ?q.primary_pct,
                secondary = ?q.secondary_pct,
                "polled quota"
            );
            if usage.plan_type.is_some() && usage.plan_type != account.plan {
                // The plan is part of the snapshot: publish the change now.
                quota.store.republish().await;
            }
        }
        Err(QuotaError::Unauthorized) => {
            tracing::info!(
                account = id,
                "usage poll: access token rejected; refreshing"
            );
            super::refresh::request(&quota.refresh, id, version);
        }
        Err(e) => {
            tracing::warn!(account = id, error = %e, "usage poll failed");
        }
    }
}
