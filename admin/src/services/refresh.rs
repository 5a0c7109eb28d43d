//! Single-flight OAuth token refresh (docs/protocol.md#oauth-refresh).
//!
//! # Key Components
//! - [`RefreshBook`]: per-process bookkeeping: the accounts with a refresh in flight (one
//!   future per account id), the snapshot version published after each account's last
//!   refresh, and a per-account "not before" after failures.
//! - [`request`]: handles a worker's `RefreshRequest { account_id, seen_version }`: skipped
//!   when `seen_version` predates the account's last refresh or the last change of its token
//!   in the snapshot (the worker used an old token and a new one is already published,
//!   whoever refreshed it) or when a refresh is already running.
//! - [`refresh_expiring`]: starts refreshes for active accounts whose access token expires
//!   within [`super::REFRESH_AHEAD`].
//! - Each attempt holds the Redis lease when Redis is configured ([`crate::lease`]), renewed
//!   every third of its time to live while the attempt runs (a slow token endpoint never
//!   outlives it), re-reads the account (another instance may have refreshed it already),
//!   calls the token endpoint, persists access + refresh (+ id) token in one transaction
//!   conditional on the lease's fencing token, then publishes, and keeps the old refresh token
//!   when the response has none.
//! - **A lost lease changes nothing stored.** A refresh whose lease was lost anyway (a pause
//!   longer than the lease, Redis failing over) stores nothing over a newer holder's tokens
//!   (the fenced write is refused: [`TokenWrite::Fenced`]), and a terminal answer it gets
//!   (its refresh token was rotated by the newer holder) does not mark the account.
//! - **A rotation is never lost.** Once the endpoint answered, the old refresh token is dead.
//!   When the write fails (database locked or down), the new tokens are held in memory
//!   ([`crate::publish::Publisher::hold_tokens`]), published at once (the account keeps
//!   serving, and a later refresh uses the held refresh token), and a writer task retries the
//!   write with capped backoff until it succeeds ([`persist_held`]).
//!
//! # Error handling
//! Terminal endpoint errors set `reauth_required` (`banned` for a deactivated account) in
//! memory at once, then in storage, then publish. Transient errors retry with exponential
//! backoff ([`MAX_ATTEMPTS`]), then give up until the next request.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use shared_state::{AccountEffect, AccountStatus, Secret};
use tokio::time::Instant;

use super::Refresher;
use crate::{
    lease::RedisLeases,
    oauth::{Identity, OAuthClient, RefreshError},
    storage::{Storage, TokenUpdate, TokenWrite},
};

/// Attempts per refresh before giving up (transient failures only).
pub const MAX_ATTEMPTS: u32 = 5;
/// Pause after a refresh chain gave up, before another may start.
const GIVE_UP_PAUSE: Duration = Duration::from_secs(30);

/// Why a refresh runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// A worker saw the access token of snapshot version `seen_version` rejected.
    Rejected {
        /// The snapshot version the worker's request used.
        seen_version: u64,
    },
    /// The access token is about to expire.
    Expiring,
}

#[derive(Debug, Default)]
struct BookInner {
    in_flight: HashSet<i64>,
    refreshed_version: HashMap<i64, u64>,
    not_before: HashMap<i64, Instant>,
}

/// Per-process refresh bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct RefreshBook {
    inner: Mutex<BookInner>,
}

// === impl RefreshBook ===

impl RefreshBook {
    fn lock(&self) -> MutexGuard<'_, BookInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims the account's refresh slot; `false` when one is running or paused.
    fn try_start(&self, id: i64, seen_version: Option<u64>) -> bool {
        let mut b = self.lock();
        if let (Some(seen), Some(done)) = (seen_version, b.refreshed_version.get(&id)) {
            if seen < *done {
                tracing::debug!(
                    account = id,
                    seen,
                    refreshed_at = *done,
                    "stale refresh request skipped"
                );
                return false;
            }
        }
        if b.not_before.get(&id).is_some_and(|t| Instant::now() < *t) {
            return false;
        }
        b.in_flight.insert(id)
    }

    /// Whether a refresh for `id` is running.
    pub fn in_flight(&self, id: i64) -> bool {
        self.lock().in_flight.contains(&id)
    }

    /// True when no refresh is running.
    pub fn is_idle(&self) -> bool {
        self.lock().in_flight.is_empty()
    }
}

/// Releases the in-flight slot when the refresh task ends (or is dropped).
struct InFlight {
    refresher: Arc<Refresher>,
    id: i64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.refresher.book.lock().in_flight.remove(&self.id);
    }
}

/// Handles a worker's refresh request.
pub(crate) fn request(refresher: &Arc<Refresher>, account_id: i64, seen_version: u64) {
    if refresher
        .store
        .publisher
        .token_version(account_id)
        .is_some_and(|v| seen_version < v)
    {
        // The worker used an older token: a newer one is published already (refreshed here,
        // by another instance, or imported).
        tracing::debug!(
            account = account_id,
            seen_version,
            "refresh request for a replaced token skipped"
        );
        return;
    }
    if !refresher.book.try_start(account_id, Some(seen_version)) {
        return;
    }
    let guard = InFlight {
        refresher: Arc::clone(refresher),
        id: account_id,
    };
    tokio::spawn(run(guard, Reason::Rejected { seen_version }));
}

/// Starts refreshes for active accounts whose access token expires soon.
pub(crate) fn refresh_expiring(refresher: &Arc<Refresher>) {
    let snap = refresher.store.publisher.current();
    let horizon = i64::try_from(shared_state::now_ms() / 1000 + super::REFRESH_AHEAD.as_secs())
        .unwrap_or(i64::MAX);
    for a in &snap.accounts {
        let due = a.effective_status() == AccountStatus::Active
            && a.access_expires_at.is_some_and(|exp| exp <= horizon);
        if due && refresher.book.try_start(a.id, None) {
            let guard = InFlight {
                refresher: Arc::clone(refresher),
                id: a.id,
            };
            tokio::spawn(run(guard, Reason::Expiring));
        }
    }
}

enum Step {
    Done,
    Retry(String),
}

async fn run(guard: InFlight, reason: Reason) {
    let refresher = &guard.refresher;
    let id = guard.id;
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1u64 << attempt.min(5))).await;
        }
        let lease = match refresher.leases.get() {
            None => None,
            Some(l) => {
                // The new fence must be above the one stored (Redis may have lost its counter).
                let stored_fence = match refresher.store.storage.get_account(id).await {
                    Ok(Some((row, _))) => row.refresh_fence,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(account = id, attempt = attempt + 1, error = %e, "token refresh cannot read the account; will retry");
                        continue;
                    }
                };
                match l.try_acquire(id, stored_fence).await {
                    Ok(Some(fence)) => Some((l, fence)),
                    Ok(None) => {
                        // Another instance is refreshing; its result reaches us through storage.
                        tracing::debug!(
                            account = id,
                            "refresh lease held elsewhere; waiting for its result"
                        );
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        refresher.store.republish().await;
                        return;
                    }
                    Err(e) => {
                        // Redis is down: refresh under the in-process single-flight alone rather
                        // than not at all (a rotating token left unrefreshed fails every request).
                        tracing::warn!(account = id, error = %e, "cannot take the refresh lease (Redis unreachable); refreshing without it");
                        None
                    }
                }
            }
        };
        let step = match lease {
            None => attempt_once(refresher, id, reason, None).await,
            Some((l, fence)) => {
                let step = tokio::select! {
                    step = attempt_once(refresher, id, reason, Some(fence)) => step,
                    () = keep_lease(l, id, fence) => Step::Retry("lease renewal ended".into()),
                };
                if let Err(e) = l.release(id, fence).await {
                    tracing::warn!(account = id, error = %e, "cannot release the refresh lease (it expires by itself)");
                }
                step
            }
        };
        match step {
            Step::Done => return,
            Step::Retry(why) => {
                tracing::warn!(account = id, attempt = attempt + 1, reason = %why, "token refresh failed; will retry");
            }
        }
    }
    tracing::error!(
        account = id,
        "token refresh gave up after {MAX_ATTEMPTS} attempts"
    );
    refresher
        .book
        .lock()
        .not_before
        .insert(id, Instant::now() + GIVE_UP_PAUSE);
}

/// Renews the lease taken with `fence` every third of its time to live for as long as it is
/// polled (the refresh attempt runs beside it); stops renewing, and waits forever, once the
/// lease is found lost.
async fn keep_lease(leases: &RedisLeases, id: i64, fence: i64) {
    let every = (leases.ttl() / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        match leases.renew(id, fence).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    account = id,
                    fence,
                    "refresh lease lost while refreshing; its result will not overwrite a newer one"
                );
                return std::future::pending().await;
            }
            Err(e) => {
                tracing::warn!(account = id, error = %e, "cannot renew the refresh lease; retrying")
            }
        }
    }
}

/// Whether the lease taken with `fence` is known to be lost (`false` when Redis cannot say).
async fn lease_lost(refresher: &Refresher, id: i64, fence: Option<i64>) -> bool {
    match (fence, refresher.leases.get()) {
        (Some(f), Some(l)) => matches!(l.renew(id, f).await, Ok(false)),
        _ => false,
    }
}

async fn attempt_once(
    refresher: &Arc<Refresher>,
    id: i64,
    reason: Reason,
    fence: Option<i64>,
) -> Step {
    let (row, mut secrets) = match refresher.store.storage.get_account(id).await {
        Ok(Some(v)) => v,
        Ok(None) => return Step::Done,
        Err(e) => return Step::Retry(format!("storage: {e}")),
    };
    if let Some(held) = refresher.store.publisher.held_tokens(id) {
        // A rotation not stored yet: those are the live tokens, not the stored ones.
        secrets.access_token = held.access_token;
        if let Some(r) = held.refresh_token.filter(|r| !r.is_empty()) {
            secrets.refresh_token = r;
        }
    }
    if row.status != AccountStatus::Active {
        return Step::Done;
    }
    // Refresh only while the token that failed is the current one. A token published since
    // the worker's snapshot (by this process, or another instance's refresh arriving over
    // pub/sub while this task waited for the lease) is the one to use: refreshing again would
    // spend the rotated refresh token a second time.
    if let Reason::Rejected { seen_version } = reason {
        if refresher
            .store
            .publisher
            .token_version(id)
            .is_some_and(|v| seen_version < v)
        {
            tracing::debug!(
                account = id,
                "the rejected token was replaced meanwhile; not refreshing"
            );
            return Step::Done;
        }
    }
    // Another instance (or an import) may already have stored newer tokens.
    let published = refresher
        .store
        .publisher
        .current()
        .account(id)
        .map(|a| a.access_token.clone());
    if !secrets.access_token.is_empty() && published.as_ref() != Some(&secrets.access_token) {
        tracing::debug!(account = id, "newer tokens already stored; republishing");
        publish_refreshed(refresher, id).await;
        return Step::Done;
    }
    if secrets.refresh_token.is_empty() {
        if reason == Reason::Expiring {
            // Access-token-only account: nothing to do before it expires.
            refresher
                .book
                .lock()
                .not_before
                .insert(id, Instant::now() + Duration::from_secs(24 * 3600));
            return Step::Done;
        }
        mark_terminal(
            refresher,
            id,
            &RefreshError::Terminal {
                code: "no_refresh_token".into(),
                status: 0,
            },
        )
        .await;
        return Step::Done;
    }
    let oauth = match refresher.egress.oauth_for(id) {
        Ok(o) => o,
        Err(why) => return Step::Retry(why),
    };
    let upd = match exchange(&oauth, &secrets.refresh_token).await {
        Ok(upd) => TokenUpdate { fence, ..upd },
        Err(e @ RefreshError::Terminal { .. }) => {
            if lease_lost(refresher, id, fence).await {
                // A newer holder refreshed meanwhile (rotating the token this attempt used):
                // its tokens stand, the account is fine.
                tracing::warn!(account = id, error = %e, "refresh failed after its lease was lost; keeping the newer holder's tokens");
                refresher.store.republish().await;
                return Step::Done;
            }
            mark_terminal(refresher, id, &e).await;
            return Step::Done;
        }
        Err(RefreshError::Transient(why)) => return Step::Retry(why),
    };
    // From here on the old refresh token is dead: the new tokens must not be lost.
    let stored = if refresher.store.publisher.replace_held(id, &upd) {
        // An earlier rotation is still waiting for storage: its writer stores these instead
        // (one writer per account, so an older rotation never lands after a newer one).
        false
    } else if !refresher.health.storage_up() {
        // Storage is known down: hold them at once rather than wait for the pool's connect
        // timeout while requests wait for this token (the writer stores them later).
        tracing::error!(
            account = id,
            "storage is down; using the refreshed tokens from memory until they can be stored"
        );
        if refresher.store.publisher.hold_tokens(id, upd) {
            tokio::spawn(persist_held(Arc::clone(refresher), id));
        }
        false
    } else {
        match refresher.store.storage.update_tokens(id, &upd).await {
            Ok(TokenWrite::Stored) => true,
            Ok(TokenWrite::NoAccount) => return Step::Done, // deleted meanwhile
            Ok(TokenWrite::Fenced) => {
                tracing::warn!(
                    account = id,
                    fence,
                    "a refresh under a newer lease stored its tokens first; dropping this rotation"
                );
                refresher.store.republish().await;
                return Step::Done;
            }
            Err(e) => {
                tracing::error!(account = id, error = %e, "cannot store refreshed tokens; using them from memory and retrying the write");
                if refresher.store.publisher.hold_tokens(id, upd) {
                    tokio::spawn(persist_held(Arc::clone(refresher), id));
                }
                false
            }
        }
    };
    let auth_cooldown = row
        .cooldown_reason
        .as_deref()
        .is_some_and(|r| r.contains("token") || r.contains("401") || r.contains("auth"));
    if let Some(live) = refresher.store.publisher.live(id).await {
        live.apply(&AccountEffect::TokenRefreshed {
            clear_cooldown: auth_cooldown,
        });
    }
    if auth_cooldown && stored {
        let _ = refresher.store.storage.set_cooldown(id, 0, None).await;
    }
    if stored {
        publish_refreshed(refresher, id).await;
    } else {
        // Held in memory: publish them now, without first trying a reload from the storage
        // that just failed (each try waits for the pool's timeout while requests wait).
        publish_held(refresher, id).await;
    }
    tracing::info!(account = id, stored, "refreshed account tokens");
    Step::Done
}

/// Delay before the first retry of a held rotation's write; doubles up to [`PERSIST_MAX`].
const PERSIST_FIRST: Duration = Duration::from_millis(250);
/// Longest delay between two retries of a held rotation's write.
const PERSIST_MAX: Duration = Duration::from_secs(10);

/// Writes the tokens held for `id` until the write succeeds (or the account is gone), then
/// stops holding them and republishes from storage. Newer tokens held meanwhile are written
/// in turn. One writer per account ([`crate::publish::Publisher::hold_tokens`] says when to
/// start one).
pub(crate) async fn persist_held(refresher: Arc<Refresher>, id: i64) {
    let mut delay = PERSIST_FIRST;
    let mut failures = 0u64;
    loop {
        tokio::time::sleep(delay).await;
        let Some(upd) = refresher.store.publisher.held_tokens(id) else {
            return;
        };
        match refresher.store.storage.update_tokens(id, &upd).await {
            Ok(written) => {
                if refresher.store.publisher.release_tokens(id, &upd) {
                    match written {
                        TokenWrite::Stored => {
                            tracing::info!(account = id, failures, "held refreshed tokens stored")
                        }
                        TokenWrite::Fenced => tracing::warn!(
                            account = id,
                            "held refreshed tokens superseded by a newer lease's refresh"
                        ),
                        TokenWrite::NoAccount => {}
                    }
                    refresher.store.republish().await;
                    return;
                }
                delay = PERSIST_FIRST; // newer tokens arrived: write those
            }
            Err(e) => {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::error!(account = id, failures, error = %e, "still cannot store refreshed tokens (kept in memory); retrying");
                }
                delay = (delay * 2).min(PERSIST_MAX);
            }
        }
    }
}

/// What [`exchange_and_store`] did with the new tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Persisted (access + rotated refresh + id token, one transaction).
    Yes,
    /// The account was deleted meanwhile.
    Deleted,
    /// Storage kept failing: the rotated refresh token is lost (logged).
    Lost,
}

/// Exchanges `refresh_token` at the token endpoint and persists the rotation. The old refresh
/// token is dead once the endpoint answered, so storing retries hard (bounded, so a Redis
/// lease held by the caller does not expire under it). Shared by the sidecar and the CLI.
pub(crate) async fn exchange_and_store(
    storage: &dyn Storage,
    oauth: &OAuthClient,
    id: i64,
    refresh_token: &Secret,
    fence: Option<i64>,
) -> Result<Stored, RefreshError> {
    let upd = TokenUpdate {
        fence,
        ..exchange(oauth, refresh_token).await?
    };
    for i in 0..6u32 {
        match storage.update_tokens(id, &upd).await {
            Ok(TokenWrite::Stored) => return Ok(Stored::Yes),
            Ok(TokenWrite::NoAccount) => return Ok(Stored::Deleted),
            // A refresh under a newer lease stored first (this one's lease was lost).
            Ok(TokenWrite::Fenced) => return Ok(Stored::Lost),
            Err(e) => {
                tracing::error!(account = id, error = %e, "cannot store refreshed tokens; retrying");
                tokio::time::sleep(Duration::from_millis(500 * u64::from(i + 1))).await;
            }
        }
    }
    tracing::error!(
        account = id,
        "refreshed tokens could not be stored; the account will need a new login"
    );
    Ok(Stored::Lost)
}

/// Exchanges `refresh_token` at the token endpoint: the new tokens as a storage update.
pub(crate) async fn exchange(
    oauth: &OAuthClient,
    refresh_token: &Secret,
) -> Result<TokenUpdate, RefreshError> {
    let t = oauth.refresh(refresh_token).await?;
    let ident = Identity::from_tokens(
        t.id_token.as_ref().map(Secret::expose).unwrap_or(""),
        t.access_token.expose(),
    );
    let now_s = i64::try_from(shared_state::now_ms() / 1000).unwrap_or(0);
    let upd = TokenUpdate {
        access_token: t.access_token,
        refresh_token: t.refresh_token,
        id_token: t.id_token,
        access_expires_at: ident
            .access_expires_at
            .or_else(|| t.expires_in.map(|e| now_s + e)),
        email: ident.email,
        plan_type: ident.plan_type,
        fence: None,
    };
    Ok(upd)
}

/// Publishes the account's new tokens (from storage, or held ones laid over it; from memory
/// alone when storage cannot be read) and remembers the version.
/// Publishes the tokens held in memory for `id` over the current snapshot.
async fn publish_held(refresher: &Arc<Refresher>, id: i64) {
    match refresher.store.publisher.publish_held(id).await {
        Some(v) => {
            refresher.book.lock().refreshed_version.insert(id, v);
        }
        None => publish_refreshed(refresher, id).await,
    }
}

async fn publish_refreshed(refresher: &Arc<Refresher>, id: i64) {
    let v = match refresher
        .store
        .publisher
        .reload(refresher.store.storage.as_ref(), true)
        .await
    {
        Ok(v) => v,
        Err(e) => {
            let v = refresher.store.publisher.publish_held(id).await;
            if v.is_none() {
                tracing::warn!(account = id, error = %e, "cannot publish after refresh");
            }
            v
        }
    };
    if let Some(v) = v {
        refresher.book.lock().refreshed_version.insert(id, v);
    }
}

async fn mark_terminal(refresher: &Arc<Refresher>, id: i64, e: &RefreshError) {
    let status = e.terminal_status().unwrap_or(AccountStatus::ReauthRequired);
    tracing::warn!(account = id, error = %e, status = status.as_str(), "refresh token is dead; account needs a new login");
    if let Some(live) = refresher.store.publisher.live(id).await {
        live.apply(&AccountEffect::Status(status));
    }
    for i in 0..3u64 {
        match refresher.store.storage.set_status(id, status).await {
            Ok(_) => break,
            Err(err) => {
                tracing::error!(account = id, error = %err, "cannot persist the account status; retrying");
                tokio::time::sleep(Duration::from_millis(500 * (i + 1))).await;
            }
        }
    }
    refresher.store.republish().await;
}
