//! Account effects of classified failures: the one owner of "what a failure does to an
//! account". Effects apply in memory first (the next pick already avoids the account), then
//! go to the sidecar to be persisted.
//!
//! # Key Components
//! - [`apply`]: takes a [`FailureClass`] for an account and returns whether the request may
//!   move on to another candidate.
//! - [`moves_session`]: a `cyber_policy` refusal moves the session to another account without
//!   penalising this one.
//! - [`blob_recovery`]: the one retry of a request refused for a blob the account cannot
//!   verify (same account, blobs stripped, no account effect).

use std::time::Duration;

use codex_protocol::classify::{FailureClass, FailureScope};
use shared_state::{AccountEffect, AccountEntry, AccountStatus, WorkerEvent};

use crate::{ctx::WorkerCtx, scheduler};

/// Short cooldown after an overload / 5xx.
pub const OVERLOAD_COOLDOWN: Duration = Duration::from_secs(5);
/// Cooldown after a transient rate limit without a hint.
pub const RATE_LIMIT_COOLDOWN: Duration = Duration::from_secs(15);
/// How long requests wait on an account whose rejected token is being refreshed.
pub const AUTH_COOLDOWN: Duration = Duration::from_secs(30);
/// Cooldown after a Cloudflare block.
pub const CLOUDFLARE_COOLDOWN: Duration = Duration::from_secs(60);
/// Cooldown after a 403 that is neither a ban nor a Cloudflare block.
pub const FORBIDDEN_COOLDOWN: Duration = Duration::from_secs(30);
/// The longest cooldown an upstream `Retry-After` can set (a transient failure must not take
/// an account out for long, whatever the header says).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Cooldown after `usage_limit_reached` without `resets_at`.
pub const USAGE_LIMIT_FALLBACK: Duration = Duration::from_secs(3600);

/// What the request met before this failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct Prior {
    /// The account's token was refreshed for this very request, so a second rejection means
    /// re-authentication.
    pub after_refresh: bool,
    /// Another account already refused this request as overloaded: a second overload is the
    /// upstream's (or this request's) trouble, not this account's, so it does not cool the
    /// account (its health records the failure, which only orders candidates). One request
    /// that every account refuses (an overloaded upstream, a request the upstream always
    /// fails with a 5xx) thus cools one account, not the pool.
    pub overloaded_elsewhere: bool,
    /// Another account already got a Cloudflare block or a non-account 403 in this request:
    /// a second one is the egress IP's (or the request's), not this account's, so it cools
    /// nothing (its health still records it). An IP-level block thus cools the one account it
    /// happened on, not every account a request tries.
    pub blocked_elsewhere: bool,
    /// The version of the snapshot the attempt's account (and so its token) came from; 0 when
    /// unknown (the current one is reported). A refresh request names the token that failed,
    /// not a newer one published while the request was in flight (the sidecar skips a
    /// request whose token was replaced since: issue 23's stale-refresh race).
    pub snapshot_version: u64,
}

/// The recovery of a request the upstream refused because it could not verify an opaque blob
/// (another account's reasoning `encrypted_content` or compaction item that we had no record
/// of: a client's old history, another gateway's; docs/protocol.md#account-bound-blobs): the body to
/// retry once, on the same account, with every blob stripped. `None`: no retry (not that
/// failure, the retry was already made, or there is nothing to strip), and the error goes to
/// the client. Never an account effect: the account did nothing wrong, so the caller does not
/// [`apply`] the failure (no cooldown, no health penalty), and it is not a failover.
pub fn blob_recovery(
    failure: &codex_protocol::classify::Failure,
    body: &[u8],
    already_stripped: bool,
) -> Option<(Vec<u8>, codex_protocol::bound::Stripped)> {
    if already_stripped || !failure.is_unverifiable_blob() {
        return None;
    }
    codex_protocol::bound::strip_all(body)
}

/// A refusal of the session's *content* by this account (the upstream's `cyber_policy`):
/// the request moves to another account and the session keeps away from this one
/// (`scheduler::avoid`), but the account is not penalised (no cooldown, no health record),
/// so the caller does not [`apply`] the failure. Another account may well serve the session:
/// the upstream's flag is per account.
pub fn moves_session(failure: &codex_protocol::classify::Failure) -> bool {
    failure.is_cyber_policy()
}

/// Applies the effect of `class` on `account` and reports it. Returns true when another
/// account may succeed (the failure is account-scoped).
pub fn apply(
    ctx: &WorkerCtx,
    account: &AccountEntry,
    class: &FailureClass,
    model: &str,
    prior: Prior,
) -> bool {
    let after_refresh = prior.after_refresh;
    let now = shared_state::now_ms();
    // Applied here at once (the next pick already avoids the account), persisted by the
    // sidecar: the one vocabulary and apply function of `shared_state::account`.
    let effect = |e: AccountEffect| ctx.account_effect(account, e);
    let cool = |d: Duration, reason: &str| {
        effect(AccountEffect::cooldown(now + d.as_millis() as u64, reason));
    };
    account.live.note_failure();
    // The scheduler's health feedback (order only; eligibility effects are below). A rejected
    // token is not ill health: it is refreshed (and a second rejection needs re-auth).
    if let Some(kind) = scheduler::FailureKind::from_class(class)
        .filter(|_| !matches!(class, FailureClass::AuthExpired))
    {
        scheduler::record_failure(&account.live, kind, now);
    }
    match class {
        FailureClass::UsageLimit { resets_at } => {
            // The window is used up: quota state says so until the upstream reports otherwise
            // (this is what tells "out of quota" from "briefly cooling" when all are down).
            effect(AccountEffect::quota(Some(100.0), *resets_at, None, None));
            let until = resets_at
                .map(|r| r * 1000)
                .filter(|&r| r > now)
                .unwrap_or(now + USAGE_LIMIT_FALLBACK.as_millis() as u64);
            effect(AccountEffect::cooldown(until, class.name()));
        }
        FailureClass::UsageNotIncluded => effect(AccountEffect::Status(AccountStatus::Disabled)),
        // The upstream's `Retry-After` (or its reset hint) sets the cooldown when present.
        FailureClass::RateLimited { retry_after_s } => {
            cool(hinted(*retry_after_s, RATE_LIMIT_COOLDOWN), class.name())
        }
        // A second overload within one request is not this account's: no cooldown (its
        // health still records the failure, which only orders candidates).
        FailureClass::Overloaded { .. } if prior.overloaded_elsewhere => {}
        FailureClass::Overloaded { retry_after_s } => {
            cool(hinted(*retry_after_s, OVERLOAD_COOLDOWN), class.name())
        }
        FailureClass::AuthExpired if after_refresh => {
            effect(AccountEffect::Status(AccountStatus::ReauthRequired))
        }
        FailureClass::AuthExpired => {
            // Not a cooldown: requests that reach the account wait for the refreshed token
            // (single-flight in the sidecar) instead of each sending a doomed request.
            // In memory only: the refresh request below is what the sidecar acts on.
            account.live.apply(&AccountEffect::Refreshing {
                until_ms: now + AUTH_COOLDOWN.as_millis() as u64,
            });
            ctx.report(WorkerEvent::RefreshRequest {
                account_id: account.id,
                seen_version: match prior.snapshot_version {
                    0 => ctx.snapshot.load().version,
                    v => v,
                },
            });
        }
        FailureClass::Deactivated => effect(AccountEffect::Status(AccountStatus::Banned)),
        FailureClass::Cloudflare | FailureClass::Forbidden if prior.blocked_elsewhere => {}
        FailureClass::Cloudflare => cool(CLOUDFLARE_COOLDOWN, class.name()),
        FailureClass::Forbidden => cool(FORBIDDEN_COOLDOWN, class.name()),
        FailureClass::ModelNotSupported => scheduler::exclude_model(
            &account.live,
            model,
            now + scheduler::MODEL_EXCLUSION_TTL.as_millis() as u64,
            now,
        ),
        FailureClass::ContinuationNotFound | FailureClass::Request => {}
    }
    class.scope() == FailureScope::Account
}

/// The cooldown of a transient failure: the upstream's hint when it gave one (capped at
/// [`MAX_RETRY_AFTER`]), else `default`.
pub fn hinted(retry_after_s: Option<u64>, default: Duration) -> Duration {
    retry_after_s
        .map(Duration::from_secs)
        .unwrap_or(default)
        .min(MAX_RETRY_AFTER)
}

/// A refreshed token was published for the account.
pub fn token_refreshed(account: &AccountEntry) {
    account.live.apply(&AccountEffect::TokenRefreshed {
        clear_cooldown: false,
    });
}
