//! One request: **Request -> Attempt -> Stream** (docs/conventions.md#lifecycle).
//!
//! # Key Components
//! - [`RequestPlan`]: what the API layer hands over: the normalized upstream body, the model,
//!   client session headers to pass through, the client key.
//! - [`open`]: walks the frozen candidate order. Each **Attempt** leases a slot, sends through
//!   the [`Connector`] (the Codex backend: [`crate::connector::Codex`]; tests use a scripted
//!   one, [`open_with`]), and reads until the **commit barrier** (the first real output event
//!   or a terminal), holding leading events back. Failures are classified once
//!   ([`codex_protocol::classify`]) and their account effects applied once
//!   ([`crate::policy::apply`]); what follows is one explicit decision
//!   ([`crate::policy::decide`]): commit, refresh and retry the same account, retry the same
//!   account without blobs, the next account, or give up. A payload that may have reached the
//!   upstream with an ambiguous outcome is never resent.
//! - [`Committed`]: the typestate after the barrier: one account, one upstream body. It can
//!   only be streamed forward ([`Committed::next_events`]); it never switches account.
//!
//! # Error handling
//! Everything ends as a [`crate::error::Error`]; the route layer renders it (HTTP before the
//! commit, one terminal SSE event after).

use std::{
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use codex_protocol::{
    classify::{classify_http, classify_stream_error, Failure, FailureClass},
    events::{self, EventClass},
    sse::{SseEvent, SseSplitter},
};
use shared_state::{AccountEffect, AccountEntry, Lease};

use crate::{
    connector::{Codex, Connector, Outgoing},
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    policy::{self, Decision},
    scheduler,
    upstream::{UpstreamBody, UpstreamError},
};

/// Client headers forwarded upstream (session and turn signals); unchanged, except
/// `x-codex-turn-state`, which only goes to the account that issued it
/// ([`crate::connector::turn_state`]).
pub const PASSTHROUGH_HEADERS: &[&str] = &[
    "session-id",
    "session_id",
    "thread-id",
    "conversation_id",
    "x-client-request-id",
    "x-codex-turn-state",
    "x-codex-turn-metadata",
    "x-codex-window-id",
    "x-codex-parent-thread-id",
    "x-codex-turn-id",
    "x-codex-beta-features",
    "x-openai-subagent",
    "x-openai-memgen-request",
    "x-responsesapi-include-timing-metrics",
    "x-openai-internal-codex-responses-lite",
];

/// What the API layer hands to the lifecycle.
#[derive(Debug)]
pub struct RequestPlan {
    /// Route name for metrics and usage.
    pub route: &'static str,
    /// Model requested by the client.
    pub model: String,
    /// Normalized upstream body.
    pub body: Bytes,
    /// What the body asks for (reasoning effort, service tier), as usage records it.
    pub asked: codex_protocol::normalize::Asked,
    /// Client session headers to forward.
    pub passthrough: Vec<(&'static str, String)>,
    /// Client key id.
    pub key_id: i64,
    /// The client key's limits: its model allow-list and account group apply here.
    pub key_limits: Arc<shared_state::keys::KeyLimits>,
    /// The client's session signal (session/thread id or prompt cache key), for affinity.
    pub affinity_key: Option<String>,
    /// A client WebSocket turn: go upstream over the pooled Responses WebSocket of its
    /// conversation (HTTP when that is unavailable).
    pub upstream_ws: Option<crate::upstream::ws::WsRoute>,
}

/// An attempt that passed the commit barrier.
pub struct Committed {
    /// The account serving the stream.
    pub account: Arc<AccountEntry>,
    /// Where the blobs this stream mints are recorded (`crate::owners`).
    owners: Rc<crate::owners::Owners>,
    _lease: Lease,
    /// Client-visible upstream headers.
    pub headers: Vec<(&'static str, String)>,
    /// Held-back leading events plus the committing event(s).
    pub held: Vec<SseEvent>,
    body: UpstreamBody,
    splitter: SseSplitter,
    /// A terminal event was already seen (in `held`).
    pub finished: bool,
    /// Upstream time to first byte.
    pub ttfb: Duration,
    /// The upstream idle timeout between two chunks (the worker's deadline wheel), with its
    /// quiet stage: [`QUIET_AFTER`] since the last chunk, the stream gives back its idle
    /// buffers (once per pause).
    idle: crate::deadline::Idle,
    /// The end (`Ok`) or break (`Err`) of the body, seen while draining chunks that were
    /// already received: reported after the events before it.
    ahead: Option<Result<(), UpstreamError>>,
}

/// Most bytes of already-received upstream chunks taken into one batch (one client write).
const COALESCE_MAX: usize = 64 * 1024;

/// A committed stream silent this long gives back the buffers it holds for its next events
/// ([`Next::Quiet`]): a slow stream (minutes of reasoning, a client's long tool call) then
/// holds little more than its connection, while a stream whose events keep coming keeps
/// reusing them.
pub const QUIET_AFTER: Duration = Duration::from_secs(1);

/// What the committed stream produced next.
pub enum Next {
    /// More events, in the caller's batch (possibly none when a chunk held no complete
    /// event).
    Events,
    /// Nothing for [`QUIET_AFTER`]: the caller may give back its write buffers, then waits
    /// again (the stream's own split buffer is already given back).
    Quiet,
    /// The upstream body ended without a terminal event, or broke.
    Broken(Error),
    /// The upstream body ended cleanly.
    End,
}

// === impl Committed ===

impl Committed {
    /// The HTTP/1.1 body of a stream that reached its terminal event, taken out so the rest
    /// of it (the last-chunk marker) can be read after the account's slot is freed and the
    /// client has its answer, and the keep-alive connection pooled (see `h1::Body::finish`).
    /// Boxed as it is held: the body is over 1 KiB, and the streaming loop that holds the
    /// tail would otherwise reserve it inline for the whole life of every stream.
    pub fn take_h1_tail(&mut self) -> Option<Box<crate::upstream::h1::Body>> {
        if !matches!(self.body, UpstreamBody::H1(_)) {
            return None;
        }
        match std::mem::replace(&mut self.body, UpstreamBody::Full(None)) {
            UpstreamBody::H1(b) => Some(b),
            _ => None,
        }
    }

    /// Reads the next chunk of events from the same account's stream, together with every
    /// further chunk that is already received (several h2 DATA frames, or several HTTP/1.1
    /// chunks of one read), so that what arrived together leaves in one client write;
    /// `batch` is cleared and refilled (its allocation is reused).
    pub async fn next_events(&mut self, batch: &mut Vec<SseEvent>) -> Next {
        batch.clear();
        match self.ahead.take() {
            Some(Ok(())) => return Next::End,
            Some(Err(e)) => return Next::Broken(transport_error(&e)),
            None => {}
        }
        let waited = match self.body.chunk_within(&mut self.idle).await {
            crate::upstream::Waited::Chunk(r) => r,
            crate::upstream::Waited::Quiet => {
                self.splitter.trim();
                batch.shrink_to(0);
                return Next::Quiet;
            }
        };
        match waited {
            Ok(Some(b)) => {
                self.splitter.push(&b);
                let mut taken = b.len();
                while taken < COALESCE_MAX {
                    match self.body.try_chunk() {
                        None => break,
                        Some(Ok(Some(b))) => {
                            taken += b.len();
                            self.splitter.push(&b);
                        }
                        Some(Ok(None)) => {
                            self.ahead = Some(Ok(()));
                            break;
                        }
                        Some(Err(e)) => {
                            self.ahead = Some(Err(e));
                            break;
                        }
                    }
                }
                loop {
                    match self.splitter.next_event() {
                        Ok(Some(ev)) => {
                            // Blobs this account mints (`crate::owners`); the events before
                            // the commit were observed by the attempt.
                            if ev.event_type() == "response.output_item.done" {
                                bound::record_minted(&self.owners, &ev.data, self.account.id);
                            }
                            batch.push(ev)
                        }
                        Ok(None) => break,
                        Err(e) => {
                            return Next::Broken(
                                Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                                    .with_cause(e),
                            )
                        }
                    }
                }
                Next::Events
            }
            Ok(None) => Next::End,
            Err(e) => Next::Broken(transport_error(&e)),
        }
    }
}

fn transport_error(e: &UpstreamError) -> Error {
    let kind = match e {
        UpstreamError::Connect(_) | UpstreamError::Proxy { .. } => ErrorKind::UpstreamConnect,
        UpstreamError::Timeout { .. } => ErrorKind::UpstreamTimeout,
        UpstreamError::Protocol { .. } => ErrorKind::UpstreamProtocol,
        UpstreamError::WsUnavailable => ErrorKind::UpstreamConnect,
        UpstreamError::Saturated => ErrorKind::UpstreamSaturated,
    };
    Error::new(kind, Side::Upstream).with_cause(e)
}

/// Puts `home` (the account that minted the request's blobs) first while it is schedulable:
/// in the key's group, eligible for the model now. The rest of the order stays the
/// scheduler's.
fn prefer_home(
    cands: &mut Vec<Arc<AccountEntry>>,
    home: Option<i64>,
    snap: &shared_state::Snapshot,
    plan: &RequestPlan,
    group: Option<&str>,
) {
    let Some(home) = home else {
        return;
    };
    if cands.first().is_some_and(|a| a.id == home) {
        return;
    }
    let Some(a) = snap.account(home) else {
        return;
    };
    if a.group.as_deref() != group
        || !scheduler::is_eligible(a, &snap.settings, &plan.model, shared_state::now_ms())
    {
        return;
    }
    cands.retain(|c| c.id != home);
    cands.insert(0, Arc::clone(a));
}

/// The frozen candidate order for this request (the scheduler owns the ordering rules).
fn candidates(
    ctx: &WorkerCtx,
    plan: &RequestPlan,
    snap: &Arc<shared_state::Snapshot>,
) -> Vec<Arc<AccountEntry>> {
    let affinity = plan
        .affinity_key
        .as_deref()
        .map(|k| scheduler::scoped_affinity_key(plan.key_id, k));
    let now_ms = shared_state::now_ms();
    let mut cands = scheduler::order(
        snap,
        &scheduler::PickRequest {
            model: &plan.model,
            affinity_key: affinity.as_deref(),
            now_ms,
            cursor: ctx.next_cursor(),
            max_candidates: snap.settings.max_attempts.max(1) as usize + 2,
            group: plan.key_limits.account_group.as_deref(),
        },
    );
    // Accounts that refused this session's content go last (session anti-affinity).
    if let Some(key) = affinity.as_deref() {
        scheduler::apply_avoidance(&mut cands, key, now_ms);
    }
    cands
}

/// Why no attempt could be accepted: 429 with the earliest reset when every active account is
/// out of quota, 503 otherwise.
fn exhausted(
    snap: &shared_state::Snapshot,
    group: Option<&str>,
    saw_usage_limit: bool,
    saw_other: bool,
) -> Error {
    let now = shared_state::now_ms();
    let active: Vec<_> = snap
        .accounts
        .iter()
        .filter(|a| {
            a.effective_status() == shared_state::AccountStatus::Active
                && a.group.as_deref() == group
        })
        .collect();
    let out_of_quota = |a: &Arc<AccountEntry>| {
        a.live.is_cooling(now)
            && (a.live.primary_used_pct() >= 100.0 || a.live.secondary_used_pct() >= 100.0)
    };
    let all_out = !active.is_empty() && active.iter().all(|a| out_of_quota(a));
    if all_out || (saw_usage_limit && !saw_other) {
        let earliest = active
            .iter()
            .filter(|a| out_of_quota(a))
            .map(|a| a.live.cooldown_until_ms())
            .filter(|&t| t > now)
            .min()
            .map(|ms| ms.div_ceil(1000));
        return Error::new(
            ErrorKind::QuotaExhausted {
                earliest_reset: earliest,
            },
            Side::Upstream,
        );
    }
    Error::new(ErrorKind::NoAccountAvailable, Side::Upstream)
}

fn record_quota(ctx: &WorkerCtx, account: &AccountEntry, rl: &events::RateLimits) {
    if rl.is_empty() {
        return;
    }
    ctx.account_effect(
        account,
        AccountEffect::quota(
            rl.primary.used_percent,
            rl.primary.reset_at,
            rl.secondary.used_percent,
            rl.secondary.reset_at,
        ),
    );
}

/// Observes quota events inside a stream (`codex.rate_limits`).
pub fn observe_event(ctx: &WorkerCtx, account: &AccountEntry, ev: &SseEvent) {
    match ev.event_type() {
        "codex.rate_limits" => {
            if let Some(rl) = events::rate_limits_event(&ev.data) {
                record_quota(ctx, account, &rl);
            }
        }
        // A finished output item carrying a blob (reasoning, compaction): this account
        // minted it (`crate::owners`).
        "response.output_item.done" => bound::record_minted(&ctx.owners, &ev.data, account.id),
        _ => {}
    }
}

/// Account-bound blobs of a request: who minted them, and the body each account may receive
/// (issue 23; docs/protocol.md#account-bound-blobs).
mod bound {
    use bytes::Bytes;
    use codex_protocol::bound::{self as blobs, BlobKind, Stripped};
    use sonic_rs::JsonValueTrait;

    use crate::owners::Owners;

    /// Records the blob of an `output_item.done` event's item as minted by `account`. One
    /// SIMD search when the item carries none.
    pub fn record_minted(owners: &Owners, data: &[u8], account: i64) {
        if !blobs::may_carry_blobs(data) {
            return;
        }
        let Ok(blob) = sonic_rs::get(data, &["item", "encrypted_content"]) else {
            return;
        };
        if let Some(b) = blob.as_str() {
            owners.record(blobs::fingerprint(b), account);
        }
    }

    /// The blobs of a request body with their known minting accounts.
    #[derive(Debug, Default)]
    pub struct Owned {
        /// (fingerprint, minting account when recorded), in input order.
        blobs: Vec<(u64, Option<i64>)>,
    }

    impl Owned {
        /// Reads `body`'s blobs and looks their owners up (nothing when it has none: one
        /// search): this app's map first, then Redis within a short bound for the blobs it
        /// does not know (`Owners::owners`).
        pub async fn of(owners: &Owners, body: &[u8]) -> Self {
            let mut fps = Vec::new();
            blobs::input_blobs(body, |_, fp| fps.push(fp));
            if fps.is_empty() {
                return Self::default();
            }
            let found = owners.owners(&fps).await;
            Self {
                blobs: fps.into_iter().zip(found).collect(),
            }
        }

        /// The account to try first: the minter of the latest recorded blob.
        pub fn home(&self) -> Option<i64> {
            self.blobs.iter().rev().find_map(|(_, o)| *o)
        }

        /// `body` for `account`: without the blobs another account is recorded to have minted
        /// (blobs we have no record of stay: the stripped retry covers them). `None`: send
        /// `body` as it is.
        pub fn clean_for(&self, body: &Bytes, account: i64) -> Option<(Bytes, Stripped)> {
            let foreign = |fp: u64| {
                self.blobs
                    .iter()
                    .any(|(f, o)| *f == fp && o.is_some_and(|o| o != account))
            };
            if !self.blobs.iter().any(|(f, _)| foreign(*f)) {
                return None;
            }
            blobs::strip(body, &|_: BlobKind, fp| !foreign(fp)).map(|(b, n)| (Bytes::from(b), n))
        }
    }
}

/// What the attempts of one request did, for its usage record: the lifecycle is the one
/// owner of these facts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trace {
    /// Attempts after the first (another account, or the same one after a token refresh).
    pub failovers: u32,
    /// How the last attempt that got an answer reached the upstream.
    pub transport: shared_state::Transport,
}

/// Runs attempts until one commits, or returns the error to show the client.
pub async fn open(ctx: &WorkerCtx, plan: &RequestPlan) -> Result<Committed, Error> {
    open_traced(ctx, plan, &mut Trace::default()).await
}

/// [`open`], recording what the attempts did in `trace`.
pub async fn open_traced(
    ctx: &WorkerCtx,
    plan: &RequestPlan,
    trace: &mut Trace,
) -> Result<Committed, Error> {
    open_with(ctx, &Codex::new(&ctx.upstream, &ctx.wire), plan, trace).await
}

/// [`open_traced`] over any upstream `conn`.
pub async fn open_with<C: Connector>(
    ctx: &WorkerCtx,
    conn: &C,
    plan: &RequestPlan,
    trace: &mut Trace,
) -> Result<Committed, Error> {
    // The key's model allow-list (one rule for every dialect): refused like an unknown model,
    // as OpenAI answers a key without access to a model.
    if !plan.key_limits.allows_model(&plan.model) {
        crate::limits::rejected(crate::limits::Rejection::Model);
        return Err(Error::new(
            ErrorKind::ModelNotFound(plan.model.clone()),
            Side::Downstream,
        ));
    }
    let group = plan.key_limits.account_group.as_deref();
    let mut snap = ctx.snapshot.load_full();
    // The operator's service tier policy: the key's own, else the published setting (hot).
    let tier_body = service_tier(
        &plan.body,
        plan.key_limits
            .service_tier_policy(snap.settings.service_tier),
    )?;
    // Blobs the body carries and who minted them: their minter goes first while it is
    // schedulable (stronger than session affinity; it holds without a session id too).
    let owned = bound::Owned::of(&ctx.owners, &plan.body).await;
    let home = owned.home();
    let mut cands = candidates(ctx, plan, &snap);
    prefer_home(&mut cands, home, &snap, plan, group);
    // The published setting (admin API), never the start-up config: runtime settings are hot.
    let max = snap.settings.max_attempts.max(1) as usize;
    let mut attempts = 0u32;
    let mut saw_usage_limit = false;
    let mut saw_other = false;
    // An earlier attempt of this request was refused as overloaded (see `policy::Prior`).
    let mut overloaded_elsewhere = false;
    // An earlier attempt was refused by Cloudflare or a non-account 403 (`policy::Prior`).
    let mut blocked_elsewhere = false;
    let mut last_err: Option<Error> = None;
    // What goes upstream: the plan's body, or (after an `invalid_encrypted_content`) the same
    // without its blobs, for the rest of the request.
    let mut body = tier_body.unwrap_or_else(|| plan.body.clone());
    let mut stripped_all = false;

    let queue_deadline = Instant::now() + QUEUE_WAIT;
    // How long this request may wait for a cooling account to come back (hot setting).
    let cooling_deadline = shared_state::now_ms() + snap.settings.max_wait_for_account_ms;
    'queue: loop {
        let mut all_full = !cands.is_empty();
        for account in cands.iter() {
            if attempts as usize >= max {
                break;
            }
            let mut account = Arc::clone(account);
            let mut refreshed = false;
            // The stripped retry on the same account is not another attempt (nor a failover).
            let mut same_again = false;
            loop {
                let now = shared_state::now_ms();
                if !refreshed && !scheduler::is_eligible(&account, &snap.settings, &plan.model, now)
                {
                    break;
                }
                if !refreshed && account.live.is_refreshing(now) {
                    // Another request got a 401 here: wait for the refreshed token instead
                    // of sending a doomed request.
                    refreshed = true;
                    match wait_for_fresh_token(ctx, &account).await {
                        Some(fresh) => account = fresh,
                        None => break,
                    }
                }
                let limit = scheduler::effective_limit(&account, &snap.settings, now);
                let Some(lease) = account.live.try_acquire(limit) else {
                    break;
                };
                if !scheduler::note_request_start(&account, &snap.settings, now) {
                    // Its minimum request interval has not elapsed: try the next account.
                    drop(lease);
                    break;
                }
                all_full = false;
                if !std::mem::take(&mut same_again) {
                    ctx.metrics.attempt(attempts);
                    trace.failovers = attempts;
                    attempts += 1;
                }
                let prior = policy::Prior {
                    after_refresh: refreshed,
                    overloaded_elsewhere,
                    blocked_elsewhere,
                    // A refreshed account comes from a later snapshot.
                    snapshot_version: if refreshed { 0 } else { snap.version },
                };
                // Another account's recorded blobs never reach this one.
                let cleaned = if stripped_all {
                    None
                } else {
                    owned.clean_for(&body, account.id)
                };
                if let Some((_, n)) = &cleaned {
                    ctx.metrics.encrypted_items_stripped(n);
                    ctx.metrics.session_account_switch();
                    tracing::info!(
                        account = account.id,
                        minted_by = home.unwrap_or_default(),
                        session = plan.affinity_key.as_deref().unwrap_or(""),
                        reasoning = n.reasoning,
                        compaction = n.compaction,
                        "session moved to another account; its encrypted content stripped"
                    );
                }
                let cleaned = cleaned.map(|(b, _)| b);
                // The account's own identity inside the payload (the connector's business).
                let own_id = |b: &Bytes| conn.body_for(&account, b);
                let sent_body = match &cleaned {
                    Some(b) => own_id(b).or_else(|| Some(b.clone())),
                    None => own_id(&body),
                };
                // A changed body no longer continues the pooled socket's response.
                let ws_route = plan
                    .upstream_ws
                    .as_ref()
                    .map(|r| crate::upstream::ws::WsRoute {
                        conversation: r.conversation.clone(),
                        continuation: if stripped_all || cleaned.is_some() {
                            None
                        } else {
                            r.continuation.clone().map(|mut c| {
                                if let Some(b) = own_id(&c.body) {
                                    c.body = b;
                                }
                                c
                            })
                        },
                    });
                let sent = Sent {
                    body: sent_body.as_ref().unwrap_or(&body),
                    ws: ws_route.as_ref(),
                };
                let result = attempt(ctx, conn, plan, sent, &account, lease, prior, trace).await;
                let outcome = match &result {
                    Ok(_) => policy::Outcome::Committed,
                    Err(failed) => failed.outcome(),
                };
                let decision = policy::decide(
                    outcome,
                    policy::AttemptState {
                        refreshed,
                        stripped: stripped_all,
                    },
                );
                let failed = match result {
                    Ok(c) => {
                        account.live.note_served();
                        return Ok(c);
                    }
                    Err(failed) => failed,
                };
                match decision {
                    Decision::RefreshSameAccount => {
                        // One refresh, then the same account again (docs/protocol.md#what-a-class-does).
                        refreshed = true;
                        match wait_for_fresh_token(ctx, &account).await {
                            Some(fresh) => {
                                account = fresh;
                                continue;
                            }
                            None => {
                                saw_other = true;
                                last_err = Some(failed.into_error());
                            }
                        }
                    }
                    Decision::NextAccount => {
                        let class = failed.class();
                        if matches!(class, Some(FailureClass::Overloaded { .. })) {
                            overloaded_elsewhere = true;
                        }
                        if matches!(
                            class,
                            Some(FailureClass::Cloudflare | FailureClass::Forbidden)
                        ) {
                            blocked_elsewhere = true;
                        }
                        if matches!(class, Some(FailureClass::UsageLimit { .. })) {
                            saw_usage_limit = true;
                        } else {
                            saw_other = true;
                        }
                        let error = failed.into_error();
                        tracing::info!(account = account.id, error = %error, "attempt failed; trying the next account");
                        last_err = Some(error);
                    }
                    Decision::RetryStripped => {
                        let Failed::Refused(failure) = failed else {
                            return Err(failed.into_error());
                        };
                        match policy::blob_recovery(&failure, &body, stripped_all) {
                            Some((clean, n)) => {
                                stripped_all = true;
                                body = Bytes::from(clean);
                                ctx.metrics.encrypted_items_stripped(&n);
                                tracing::info!(
                                    account = account.id,
                                    session = plan.affinity_key.as_deref().unwrap_or(""),
                                    reasoning = n.reasoning,
                                    compaction = n.compaction,
                                    "upstream could not verify the request's encrypted content; \
                                     retrying once on the same account without it"
                                );
                                same_again = true;
                                continue;
                            }
                            None => return Err(Error::upstream(failure)),
                        }
                    }
                    // `Commit` only follows a committed attempt (returned above).
                    Decision::GiveUp | Decision::Commit => return Err(failed.into_error()),
                }
                break;
            }
        }
        // Every candidate was at its concurrency limit: wait for a slot (bounded) instead of
        // failing at once. Only before any attempt: a request never waits after a failure.
        if attempts == 0 && all_full && Instant::now() < queue_deadline && !ctx.is_draining() {
            monoio::time::sleep(Duration::from_millis(5)).await;
            // A slot may have freed anywhere in the pool: order again (no attempt was made,
            // so nothing was leased twice).
            cands = candidates(ctx, plan, &snap);
            prefer_home(&mut cands, home, &snap, plan, group);
            continue 'queue;
        }
        // Nothing could even be tried and accounts are only cooling: wait (bounded by
        // `max_wait_for_account_ms`) for the earliest to come back, then order again. The
        // sleep is this request's only: the worker serves others meanwhile.
        if attempts == 0 && cands.is_empty() && !ctx.is_draining() {
            let now = shared_state::now_ms();
            if let Some(at) = scheduler::earliest_comeback(&snap, &plan.model, group, now)
                .filter(|&at| at <= cooling_deadline)
            {
                tracing::debug!(
                    wait_ms = at.saturating_sub(now),
                    "every account cooling; waiting for the earliest"
                );
                monoio::time::sleep(Duration::from_millis(at.saturating_sub(now) + 1)).await;
                // A newer snapshot may have been published meanwhile (nothing was leased).
                snap = ctx.snapshot.load_full();
                cands = candidates(ctx, plan, &snap);
                prefer_home(&mut cands, home, &snap, plan, group);
                continue 'queue;
            }
        }
        break;
    }
    if attempts == 0 {
        return Err(exhausted(&snap, group, false, false));
    }
    if saw_usage_limit && !saw_other {
        return Err(exhausted(&snap, group, true, false));
    }
    Err(last_err.unwrap_or_else(|| exhausted(&snap, group, saw_usage_limit, saw_other)))
}

/// Why an attempt did not commit, its account effects already applied; what follows is
/// [`policy::decide`]'s, from [`Failed::outcome`].
enum Failed {
    /// A classified refusal: an HTTP error, or a failure event before the commit barrier.
    Refused(Failure),
    /// A transport failure before any answer.
    Transport(UpstreamError),
    /// The upstream answered and then ended or broke before any output: the payload reached
    /// it and the outcome is ambiguous.
    Ambiguous(Error),
}

// === impl Failed ===

impl Failed {
    /// What the attempt came to, for [`policy::decide`].
    fn outcome(&self) -> policy::Outcome<'_> {
        match self {
            Self::Refused(f) => policy::Outcome::Refused(f),
            Self::Transport(UpstreamError::Saturated) => policy::Outcome::Saturated,
            Self::Transport(e) if e.maybe_sent() => policy::Outcome::MaybeSent,
            Self::Transport(_) => policy::Outcome::NotSent,
            Self::Ambiguous(_) => policy::Outcome::MaybeSent,
        }
    }

    /// The failure class of a refusal.
    fn class(&self) -> Option<&FailureClass> {
        match self {
            Self::Refused(f) => Some(&f.class),
            Self::Transport(_) | Self::Ambiguous(_) => None,
        }
    }

    /// The error to show the client.
    fn into_error(self) -> Error {
        match self {
            Self::Refused(f) => Error::upstream(f),
            Self::Transport(e) => transport_error(&e),
            Self::Ambiguous(e) => e,
        }
    }
}

/// What one attempt sends: the body (the plan's, or cleaned of blobs) and the upstream
/// WebSocket route of a client WebSocket turn.
#[derive(Clone, Copy)]
struct Sent<'a> {
    body: &'a Bytes,
    ws: Option<&'a crate::upstream::ws::WsRoute>,
}

/// How long a request waits for a concurrency slot when every candidate is at its limit.
const QUEUE_WAIT: Duration = Duration::from_secs(30);

/// How long a request waits for the sidecar to publish a refreshed token after a 401.
const REFRESH_WAIT: Duration = Duration::from_secs(15);

/// After a 401 the policy asked the sidecar for a refresh; wait until the snapshot carries a
/// new access token for the account (or says it needs re-authentication).
async fn wait_for_fresh_token(
    ctx: &WorkerCtx,
    account: &AccountEntry,
) -> Option<Arc<AccountEntry>> {
    let deadline = Instant::now() + REFRESH_WAIT;
    loop {
        let snap = ctx.snapshot.load();
        if let Some(now) = snap.account(account.id) {
            if now.effective_status() != shared_state::AccountStatus::Active {
                return None;
            }
            if now.access_token != account.access_token {
                // The refresh-wait cooldown set by the policy no longer applies.
                policy::token_refreshed(now);
                return Some(Arc::clone(now));
            }
        } else {
            return None;
        }
        if Instant::now() >= deadline || ctx.is_draining() {
            return None;
        }
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The body as the service tier policy wants it: `Ok(None)` when unchanged, `Ok(Some(_))`
/// without its priority tier (`strip`), `Err` (400 in the client's dialect) when the operator
/// refuses it. `body` is the normalised one, where `fast` already reads `priority`.
fn service_tier(
    body: &Bytes,
    policy: shared_state::snapshot::ServiceTierPolicy,
) -> Result<Option<Bytes>, Error> {
    use shared_state::snapshot::ServiceTierPolicy;
    use sonic_rs::{JsonValueMutTrait as _, JsonValueTrait as _};
    if policy == ServiceTierPolicy::Pass {
        return Ok(None);
    }
    let asks_priority = sonic_rs::get(&body[..], ["service_tier"])
        .ok()
        .and_then(|v| v.as_str().map(|t| t == "priority" || t == "fast"))
        .unwrap_or(false);
    if !asks_priority {
        return Ok(None);
    }
    match policy {
        ServiceTierPolicy::Pass => Ok(None),
        ServiceTierPolicy::Refuse => Err(Error::new(
            ErrorKind::BadRequest {
                message: "the priority (fast) service tier is not allowed on this gateway; \
                          send the request without service_tier"
                    .into(),
                param: Some("service_tier".into()),
            },
            Side::Downstream,
        )),
        ServiceTierPolicy::Strip => {
            let mut v: sonic_rs::Value = match sonic_rs::from_slice(body) {
                Ok(v) => v,
                Err(_) => return Ok(None),
            };
            if let Some(o) = v.as_object_mut() {
                o.remove(&"service_tier");
            }
            Ok(sonic_rs::to_vec(&v).ok().map(Bytes::from))
        }
    }
}

/// A definitive upstream rejection (HTTP error, or a failure before the commit barrier): applies
/// its account effects, once ([`policy::decide`] says what the request does next).
fn refused(
    ctx: &WorkerCtx,
    plan: &RequestPlan,
    account: &AccountEntry,
    failure: Failure,
    prior: policy::Prior,
) -> Failed {
    if failure.is_unverifiable_blob() {
        // The payload's fault, not the account's: no effect here (see `policy::blob_recovery`).
        return Failed::Refused(failure);
    }
    if policy::moves_session(&failure) {
        // This account refused the session's content: no account effect; the session keeps
        // away from it and the request tries the next candidate.
        let now = shared_state::now_ms();
        if let Some(k) = plan.affinity_key.as_deref() {
            let key = scheduler::scoped_affinity_key(plan.key_id, k);
            scheduler::avoid(
                &key,
                account.id,
                now + scheduler::AVOID_TTL.as_millis() as u64,
                now,
            );
        }
        ctx.metrics.session_account_switch();
        tracing::info!(
            account = account.id,
            session = plan.affinity_key.as_deref().unwrap_or(""),
            code = failure.code.as_deref().unwrap_or(""),
            "account refused the session's content; moving the session to another account"
        );
        return Failed::Refused(failure);
    }
    policy::apply(ctx, account, &failure.class, &plan.model, prior);
    Failed::Refused(failure)
}

#[allow(clippy::too_many_arguments)]
async fn attempt<C: Connector>(
    ctx: &WorkerCtx,
    conn: &C,
    plan: &RequestPlan,
    sent: Sent<'_>,
    account: &Arc<AccountEntry>,
    lease: Lease,
    prior: policy::Prior,
    trace: &mut Trace,
) -> Result<Committed, Failed> {
    let out = Outgoing {
        account,
        body: sent.body,
        ws: sent.ws,
        passthrough: &plan.passthrough,
    };
    let started = Instant::now();
    let mut resp = match conn.send(out).await {
        Ok(r) => {
            ctx.health.upstream_ok();
            r
        }
        // This worker's upstream capacity, not the account's fault: no penalty (and no
        // failover: every account shares the pool).
        Err(e @ UpstreamError::Saturated) => return Err(Failed::Transport(e)),
        // The account's egress proxy failed (the proxy marked itself: breaker, health,
        // metric): not the account's fault, so no penalty; nothing was sent.
        Err(e @ UpstreamError::Proxy { .. }) => return Err(Failed::Transport(e)),
        Err(e) => {
            if matches!(e, UpstreamError::Connect(_)) {
                ctx.health.upstream_failed(shared_state::now_ms());
            }
            let kind = match &e {
                UpstreamError::Connect(_)
                | UpstreamError::Proxy { .. }
                | UpstreamError::Saturated
                | UpstreamError::WsUnavailable => scheduler::FailureKind::Connect,
                UpstreamError::Timeout { .. } => scheduler::FailureKind::Timeout,
                UpstreamError::Protocol { .. } => scheduler::FailureKind::Server,
            };
            scheduler::record_failure(&account.live, kind, shared_state::now_ms());
            // Resent elsewhere only when nothing reached the upstream (`policy::decide`).
            return Err(Failed::Transport(e));
        }
    };
    let ttfb = started.elapsed();
    ctx.metrics.ttfb(ttfb);
    trace.transport = conn.transport(&resp, sent.ws.is_some());
    let rl = events::rate_limits_from_headers(|n| resp.header(n));
    record_quota(ctx, account, &rl);
    let idle = conn.idle_timeout();

    if resp.status != 200 {
        let ct = resp.header("content-type").map(str::to_owned);
        let retry_after = resp.header("retry-after").map(str::to_owned);
        let body = resp.body.collect(idle, 64 * 1024).await;
        let failure = classify_http(resp.status, ct.as_deref(), retry_after.as_deref(), &body);
        return Err(refused(ctx, plan, account, failure, prior));
    }

    let headers = conn.client_headers(account, &resp);
    // Read: not held while waiting for the commit barrier (a quiet upstream can take seconds
    // to send the first output). An h2 head's values are slices of the connection's read
    // buffer, so holding it would also hold those buffers.
    resp.headers = crate::upstream::Head::Pairs(Vec::new());
    let mut splitter = SseSplitter::default();
    let mut held: Vec<SseEvent> = Vec::new();
    // Read until the commit barrier.
    loop {
        let chunk = match resp.body.chunk(idle).await {
            Ok(Some(c)) => c,
            // Ended or broke before any output: the request reached the upstream and the
            // outcome is ambiguous: never resend it.
            Ok(None) => {
                return Err(Failed::Ambiguous(
                    Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                        .with_cause("upstream stream ended before any output"),
                ))
            }
            Err(e) => return Err(Failed::Ambiguous(transport_error(&e))),
        };
        splitter.push(&chunk);
        loop {
            let ev = match splitter.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    return Err(Failed::Ambiguous(
                        Error::new(ErrorKind::UpstreamProtocol, Side::Upstream).with_cause(e),
                    ))
                }
            };
            if ev.is_done_sentinel() {
                continue;
            }
            let class = events::classify_event(ev.event_type());
            observe_event(ctx, account, &ev);
            match class {
                EventClass::Leading => held.push(ev),
                EventClass::Failed => {
                    let err_json = events::stream_error(&ev.data).unwrap_or_default();
                    let failure = classify_stream_error(err_json.as_bytes());
                    return Err(refused(ctx, plan, account, failure, prior));
                }
                EventClass::Output | EventClass::Completed | EventClass::Incomplete => {
                    let finished = class != EventClass::Output;
                    held.push(ev);
                    // Everything already buffered belongs to this account too.
                    let mut finished = finished;
                    while !finished {
                        match splitter.next_event() {
                            Ok(Some(more)) => {
                                observe_event(ctx, account, &more);
                                finished = matches!(
                                    events::classify_event(more.event_type()),
                                    EventClass::Completed
                                        | EventClass::Incomplete
                                        | EventClass::Failed
                                );
                                held.push(more);
                            }
                            _ => break,
                        }
                    }
                    // The account served: its health recovers (error rate, failure streak,
                    // penalties) and the first-token latency feeds the smart order.
                    scheduler::record_success(&account.live, started.elapsed());
                    return Ok(Committed {
                        account: Arc::clone(account),
                        owners: Rc::clone(&ctx.owners),
                        _lease: lease,
                        headers,
                        held,
                        body: resp.body,
                        splitter,
                        finished,
                        ttfb,
                        idle: crate::deadline::Idle::with_quiet(idle, QUIET_AFTER),
                        ahead: None,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
