//! What a failure does: to the account ([`apply`], the one owner of "what a failure does to
//! an account") and to the request ([`decide`], the one owner of "what the attempt loop does
//! next"). Effects apply in memory first (the next pick already avoids the account), then go
//! to the sidecar to be persisted.
//!
//! # Key Components
//! - [`decide`]: a pure function from what an attempt came to ([`Outcome`]) and what the
//!   request already did ([`AttemptState`]) to the one [`Decision`] of the attempt loop:
//!   commit, refresh and retry the same account, retry the same account without blobs, try
//!   the next account, or give up (docs/protocol.md#what-a-class-does).
//! - [`apply`]: the account effects of a [`FailureClass`].
//! - [`moves_session`]: a `cyber_policy` refusal moves the session to another account without
//!   penalising this one.
//! - [`blob_recovery`]: the one retry of a request refused for a blob the account cannot
//!   verify (same account, blobs stripped, no account effect).

use std::time::Duration;

use codex_protocol::classify::{Failure, FailureClass, FailureScope};
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

/// What one attempt came to: the input of [`decide`].
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// It passed the commit barrier.
    Committed,
    /// The upstream refused it: an HTTP error, or a failure event before the commit barrier.
    Refused(&'a Failure),
    /// Nothing reached the upstream (connect failure, the account's egress proxy failed).
    NotSent,
    /// The worker's own upstream capacity is used up (nothing was sent; every account shares
    /// the pool, so no other account would do better).
    Saturated,
    /// The payload may have reached the upstream and the outcome is ambiguous (a transport
    /// failure after sending, a stream that ended or broke before any output): never resent.
    MaybeSent,
}

/// What the request already did on the account it is trying, as [`decide`] needs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptState {
    /// The account's token was refreshed for this request (a second rejection is not
    /// refreshed again).
    pub refreshed: bool,
    /// The request's blobs were already stripped (the stripped retry is made once).
    pub stripped: bool,
}

/// What the attempt loop does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Hand the committed stream to the caller.
    Commit,
    /// Wait for the account's refreshed token, then the same account again (another
    /// attempt); without a fresh token in time, the next account.
    RefreshSameAccount,
    /// The same account again with every blob stripped from the body, for the rest of the
    /// request; not another attempt (see [`blob_recovery`]). Nothing to strip: give up.
    RetryStripped,
    /// The next candidate may succeed.
    NextAccount,
    /// Return the failure to the client.
    GiveUp,
}

/// The retry decision of the attempt loop, from the failure class alone (pure: the account
/// effects are [`apply`]'s, made before). A failure before the commit may move on; nothing
/// after the commit comes here (a committed stream never switches account).
pub fn decide(outcome: Outcome<'_>, state: AttemptState) -> Decision {
    match outcome {
        Outcome::Committed => Decision::Commit,
        Outcome::NotSent => Decision::NextAccount,
        Outcome::Saturated | Outcome::MaybeSent => Decision::GiveUp,
        // The payload's fault, not the account's: once, on the same account, without blobs.
        Outcome::Refused(f) if f.is_unverifiable_blob() => {
            if state.stripped {
                Decision::GiveUp
            } else {
                Decision::RetryStripped
            }
        }
        // The account refused the session's content: another account may serve it.
        Outcome::Refused(f) if moves_session(f) => Decision::NextAccount,
        Outcome::Refused(f) => match &f.class {
            FailureClass::AuthExpired if !state.refreshed => Decision::RefreshSameAccount,
            c if c.scope() == FailureScope::Account => Decision::NextAccount,
            _ => Decision::GiveUp,
        },
    }
}

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

/// Applies the effect of `class` on `account` and reports it (what the request does next is
/// [`decide`]'s).
pub fn apply(
    ctx: &WorkerCtx,
    account: &AccountEntry,
    class: &FailureClass,
    model: &str,
    prior: Prior,
) {
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

#[cfg(test)]
mod tests {
    use codex_protocol::classify::{classify_http, classify_stream_error, Failure, FailureClass};

    use super::{decide, AttemptState, Decision, Outcome};

    fn http(status: u16, ct: &str, body: &str) -> Failure {
        classify_http(status, Some(ct), None, body.as_bytes())
    }

    fn json(status: u16, body: &str) -> Failure {
        http(status, "application/json", body)
    }

    /// A row of the failure table: its name, an upstream failure, the class it must read as,
    /// the decision on a first attempt and after a refresh and a stripped retry.
    type Row = (
        &'static str,
        Failure,
        fn(&FailureClass) -> bool,
        Decision,
        Decision,
    );

    const FIRST: AttemptState = AttemptState {
        refreshed: false,
        stripped: false,
    };

    /// Every row of the failure table (docs/protocol.md#what-a-class-does), from the bodies
    /// the upstream sends (docs/protocol.md#error-bodies): the class it reads as, and what the
    /// request does next, on a first attempt and after a refresh and a stripped retry.
    #[test]
    fn every_row_of_the_failure_table() {
        let after = AttemptState {
            refreshed: true,
            stripped: true,
        };
        let rows: Vec<Row> = vec![
            (
                "usage limit",
                json(
                    429,
                    r#"{"error":{"type":"usage_limit_reached","resets_at":1700000000}}"#,
                ),
                |c| matches!(c, FailureClass::UsageLimit { .. }),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "plan without codex",
                json(429, r#"{"error":{"type":"usage_not_included"}}"#),
                |c| matches!(c, FailureClass::UsageNotIncluded),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "transient rate limit",
                json(429, r#"{"error":{"type":"rate_limit_exceeded"}}"#),
                |c| matches!(c, FailureClass::RateLimited { .. }),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "overloaded",
                json(503, r#"{"error":{"code":"server_is_overloaded"}}"#),
                |c| matches!(c, FailureClass::Overloaded { .. }),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "overloaded in the stream",
                classify_stream_error(br#"{"code":"server_is_overloaded","message":"busy"}"#),
                |c| matches!(c, FailureClass::Overloaded { .. }),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "token rejected: refresh, then the same account; rejected again: the next",
                json(401, r#"{"error":{"code":"token_expired"}}"#),
                |c| matches!(c, FailureClass::AuthExpired),
                Decision::RefreshSameAccount,
                Decision::NextAccount,
            ),
            (
                "bare 401",
                json(401, ""),
                |c| matches!(c, FailureClass::AuthExpired),
                Decision::RefreshSameAccount,
                Decision::NextAccount,
            ),
            (
                "deactivated",
                json(401, r#"{"error":{"code":"account_deactivated"}}"#),
                |c| matches!(c, FailureClass::Deactivated),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "model not allowed for the account",
                json(
                    400,
                    r#"{"detail":"The 'gpt-x' model is not supported when using Codex with a ChatGPT account."}"#,
                ),
                |c| matches!(c, FailureClass::ModelNotSupported),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "cloudflare",
                http(403, "text/html", "<html>cf</html>"),
                |c| matches!(c, FailureClass::Cloudflare),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "other 403",
                json(403, r#"{"error":{"message":"no"}}"#),
                |c| matches!(c, FailureClass::Forbidden),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "continuation missing",
                json(
                    400,
                    r#"{"error":{"type":"invalid_request_error","code":"previous_response_not_found"}}"#,
                ),
                |c| matches!(c, FailureClass::ContinuationNotFound),
                Decision::GiveUp,
                Decision::GiveUp,
            ),
            (
                "bad parameter",
                json(400, r#"{"detail":"Unsupported parameter: temperature"}"#),
                |c| matches!(c, FailureClass::Request),
                Decision::GiveUp,
                Decision::GiveUp,
            ),
            (
                "context too long",
                json(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
                |c| matches!(c, FailureClass::Request),
                Decision::GiveUp,
                Decision::GiveUp,
            ),
            (
                "cyber_policy: the session moves to another account",
                json(400, r#"{"error":{"code":"cyber_policy","message":"flagged"}}"#),
                |c| matches!(c, FailureClass::Request),
                Decision::NextAccount,
                Decision::NextAccount,
            ),
            (
                "foreign blob: once on the same account without blobs, then given up",
                json(
                    400,
                    r#"{"error":{"type":"invalid_request_error","code":"invalid_encrypted_content","message":"x"}}"#,
                ),
                |c| matches!(c, FailureClass::Request),
                Decision::RetryStripped,
                Decision::GiveUp,
            ),
            (
                "foreign blob in the stream",
                classify_stream_error(
                    br#"{"type":"invalid_request_error","code":"invalid_encrypted_content","message":"x"}"#,
                ),
                |c| matches!(c, FailureClass::Request),
                Decision::RetryStripped,
                Decision::GiveUp,
            ),
        ];
        for (name, f, is_class, first, later) in rows {
            assert!(is_class(&f.class), "{name}: classified as {:?}", f.class);
            assert_eq!(decide(Outcome::Refused(&f), FIRST), first, "{name}");
            assert_eq!(decide(Outcome::Refused(&f), after), later, "{name} (later)");
        }
    }

    /// A refresh alone does not stop the stripped retry, nor a stripped retry the refresh.
    #[test]
    fn refresh_and_strip_are_tracked_apart() {
        let auth = json(401, r#"{"error":{"code":"token_invalidated"}}"#);
        let blob = json(400, r#"{"error":{"code":"invalid_encrypted_content"}}"#);
        let refreshed = AttemptState {
            refreshed: true,
            stripped: false,
        };
        let stripped = AttemptState {
            refreshed: false,
            stripped: true,
        };
        assert_eq!(
            decide(Outcome::Refused(&blob), refreshed),
            Decision::RetryStripped
        );
        assert_eq!(
            decide(Outcome::Refused(&auth), stripped),
            Decision::RefreshSameAccount
        );
    }

    /// Failures without an answer: resent elsewhere only when nothing reached the upstream;
    /// the worker's own saturation is no account's fault and gives up at once.
    #[test]
    fn transport_outcomes() {
        for state in [
            FIRST,
            AttemptState {
                refreshed: true,
                stripped: true,
            },
        ] {
            assert_eq!(decide(Outcome::Committed, state), Decision::Commit);
            assert_eq!(decide(Outcome::NotSent, state), Decision::NextAccount);
            assert_eq!(decide(Outcome::MaybeSent, state), Decision::GiveUp);
            assert_eq!(decide(Outcome::Saturated, state), Decision::GiveUp);
        }
    }
}

/// The account effect of every class (the table's middle column), applied on a worker
/// context; and the two "within one request" exemptions.
#[cfg(test)]
mod effects {
    use codex_protocol::classify::FailureClass;
    use shared_state::{AccountStatus, WorkerEvent};

    use super::{apply, Prior};
    use crate::testing::Harness;

    /// `class` applied to account 1 of a fresh pool; the harness and the cooldown left (ms).
    fn applied(class: FailureClass, prior: Prior) -> (Harness, u64) {
        let h = Harness::new(2);
        let a = h.account(1);
        let now = shared_state::now_ms();
        apply(&h.ctx, &a, &class, "gpt-5", prior);
        let left = a.live.cooldown_until_ms().saturating_sub(now);
        (h, left)
    }

    fn near(left: u64, secs: u64) -> bool {
        // The cooldown is set from the clock read inside `apply`, a moment after ours.
        (secs * 1000..=secs * 1000 + 5_000).contains(&left)
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn every_class_has_its_account_effect() {
        // Exactly the reset time (a window measured from our clock would depend on how long
        // the harness took to build: over a second on a loaded CI machine).
        let resets_at = shared_state::now_ms() / 1000 + 600;
        let (h, _) = applied(
            FailureClass::UsageLimit {
                resets_at: Some(resets_at),
            },
            Prior::default(),
        );
        assert_eq!(
            h.account(1).live.cooldown_until_ms(),
            resets_at * 1000,
            "until resets_at"
        );
        assert!(h.account(1).live.primary_used_pct() >= 100.0);
        let (_, left) = applied(
            FailureClass::UsageLimit { resets_at: None },
            Prior::default(),
        );
        assert!(near(left, 3600), "1 h without a reset: {left}");

        let (h, _) = applied(FailureClass::UsageNotIncluded, Prior::default());
        assert_eq!(h.account(1).effective_status(), AccountStatus::Disabled);

        let (_, left) = applied(
            FailureClass::RateLimited {
                retry_after_s: None,
            },
            Prior::default(),
        );
        assert!(near(left, 15), "{left}");
        let (_, left) = applied(
            FailureClass::RateLimited {
                retry_after_s: Some(7),
            },
            Prior::default(),
        );
        assert!(near(left, 7), "the hint: {left}");
        let (_, left) = applied(
            FailureClass::RateLimited {
                retry_after_s: Some(86_400),
            },
            Prior::default(),
        );
        assert!(near(left, 300), "capped at 5 min: {left}");

        let (_, left) = applied(FailureClass::OVERLOADED, Prior::default());
        assert!(near(left, 5), "{left}");

        let (h, left) = applied(FailureClass::AuthExpired, Prior::default());
        assert_eq!(left, 0, "a rejected token is not a cooldown");
        assert!(h.account(1).live.is_refreshing(shared_state::now_ms()));
        let control = h.control();
        assert!(control.iter().any(|e| matches!(
            e,
            WorkerEvent::RefreshRequest {
                account_id: 1,
                seen_version: 1
            }
        )));
        let (h, _) = applied(
            FailureClass::AuthExpired,
            Prior {
                after_refresh: true,
                ..Prior::default()
            },
        );
        assert_eq!(
            h.account(1).effective_status(),
            AccountStatus::ReauthRequired
        );

        let (h, _) = applied(FailureClass::Deactivated, Prior::default());
        assert_eq!(h.account(1).effective_status(), AccountStatus::Banned);

        let (h, left) = applied(FailureClass::ModelNotSupported, Prior::default());
        assert_eq!(left, 0);
        let snap = h.ctx.snapshot.load();
        let now = shared_state::now_ms();
        assert!(!crate::scheduler::is_eligible(
            &h.account(1),
            &snap.settings,
            "gpt-5",
            now
        ));
        assert!(crate::scheduler::is_eligible(
            &h.account(1),
            &snap.settings,
            "gpt-4",
            now
        ));

        let (_, left) = applied(FailureClass::Cloudflare, Prior::default());
        assert!(near(left, 60), "{left}");
        let (_, left) = applied(FailureClass::Forbidden, Prior::default());
        assert!(near(left, 30), "{left}");

        for class in [FailureClass::ContinuationNotFound, FailureClass::Request] {
            let (h, left) = applied(class, Prior::default());
            assert_eq!(left, 0);
            assert_eq!(h.account(1).effective_status(), AccountStatus::Active);
            assert!(h.control().is_empty(), "no effect reported");
        }
    }

    /// A second overload, Cloudflare block or 403 within one request cools nothing.
    #[monoio::test_all(timer_enabled = true)]
    async fn a_second_block_or_overload_in_one_request_cools_nothing() {
        let (_, left) = applied(
            FailureClass::OVERLOADED,
            Prior {
                overloaded_elsewhere: true,
                ..Prior::default()
            },
        );
        assert_eq!(left, 0);
        for class in [FailureClass::Cloudflare, FailureClass::Forbidden] {
            let (_, left) = applied(
                class,
                Prior {
                    blocked_elsewhere: true,
                    ..Prior::default()
                },
            );
            assert_eq!(left, 0);
        }
    }
}
