//! Accounts: list, edit, status, refresh, quota poll, health reset, bulk actions, import,
//! export and the OAuth (PKCE) login.
//!
//! - `GET /api/admin/accounts` -> list of [`AccountView`] (never tokens); `GET /accounts/{id}`;
//! - `PATCH /accounts/{id}` `{"weight","max_concurrency","account_group"}` (`account_group`:
//!   a name, or `null`/`""` for the shared pool), `DELETE /accounts/{id}`;
//! - `POST /accounts/{id}/enable|disable` (enable clears the cooldown), `/refresh` (202, a
//!   single-flight token refresh), `/quota` (poll `/wham/usage` now), `/reset-health` (clears
//!   cooldown, status override, scheduler penalties, streaks and model exclusions);
//! - `POST /accounts/bulk` `{"ids":[..],"action":"enable|disable|delete|refresh|reset_health"}`
//!   -> per-id results;
//! - `POST /accounts/import` `{"files":[{"name","content"}]}` (auth.json, CPA files, JSON
//!   arrays/lines, refresh-token or access-token lists) -> [`ImportView`];
//! - `POST /accounts/export` `{"ids":[..]}` (all when absent) -> `auth.json` documents that
//!   `import` reads back. This is the one answer that carries account tokens: it exists to move
//!   accounts between installations, is never cached (`no-store`), and is logged (without the
//!   tokens);
//! - `POST /accounts/oauth/start` -> `{"authorize_url","state","redirect_uri","expires_at"}`;
//!   the operator logs in in the browser, which lands on `localhost:1455/auth/callback?code=..`
//!   (nothing listens there) and pastes that URL into
//!   `POST /accounts/oauth/finish` `{"callback_url"}` (or `{"code","state"}`) -> the imported
//!   account.
//!
//! Bulk actions, imports, exports and the OAuth finish answer with the ids they affected
//! ([`crate::audit::Affected`]): each call is one audit entry listing them.

use std::{collections::HashMap, sync::Arc};

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde::{Deserialize, Serialize};
use shared_state::{board::BoardEntry, AccountEffect, AccountStatus, Secret};

use super::{parse_body, parse_id, ApiError, ApiResult, Deleted, List};
use crate::{
    audit::{Affected, Audited},
    import::ImportSummary,
    services::{admin::LOGIN_TTL, Accounts},
    storage::AccountRow,
};

pub(super) fn routes(accounts: Arc<Accounts>) -> Router {
    Router::new()
        .route("/accounts", get(list_accounts))
        .route("/accounts/bulk", post(bulk))
        .route("/accounts/import", post(import))
        .route("/accounts/export", post(export))
        .route("/accounts/oauth/start", post(oauth_start))
        .route("/accounts/oauth/finish", post(oauth_finish))
        .route(
            "/accounts/{id}",
            get(get_account).delete(delete_account).patch(patch_account),
        )
        .route("/accounts/{id}/enable", post(enable_account))
        .route("/accounts/{id}/disable", post(disable_account))
        .route("/accounts/{id}/refresh", post(refresh_account))
        .route("/accounts/{id}/quota", post(poll_account_quota))
        .route("/accounts/{id}/reset-health", post(reset_health))
        .with_state(accounts)
}

/// One account as the admin API shows it (no tokens).
#[derive(Debug, Serialize)]
pub(crate) struct AccountView {
    id: i64,
    object: &'static str,
    chatgpt_account_id: String,
    user_id: Option<String>,
    email: Option<String>,
    label: String,
    plan: Option<String>,
    /// Stored status.
    status: &'static str,
    /// What the scheduler sees (a worker's override wins, e.g. `reauth_required`).
    effective_status: &'static str,
    /// Active, not cooling down and not excluded: a candidate for new requests.
    schedulable: bool,
    weight: u32,
    max_concurrency: u32,
    /// Account group (`null`: the shared pool); only client keys of this group use it.
    account_group: Option<String>,
    in_flight: u32,
    served: u64,
    failures: u64,
    cooldown_until: Option<u64>,
    cooldown_reason: Option<String>,
    primary_used_pct: Option<f64>,
    primary_reset_at: Option<i64>,
    secondary_used_pct: Option<f64>,
    secondary_reset_at: Option<i64>,
    quota_updated_at: Option<i64>,
    /// Reset credits as last polled (`null`: not reported yet).
    reset_credits: Option<u64>,
    access_expires_at: Option<i64>,
    last_refresh_at: Option<i64>,
    refresh_in_flight: bool,
    health: HealthView,
    created_at: i64,
    updated_at: i64,
}

/// The scheduler's live feedback for one account (owned by `gateway::scheduler`: the admin
/// API shows the inputs, and the tier as the scheduler computes it, through the board
/// function the data plane hands over, `SidecarConfig::scheduler_board`).
#[derive(Debug, Default, Serialize)]
pub(crate) struct HealthView {
    /// EWMA of the attempt error rate, 0..1.
    error_rate: f64,
    /// EWMA of the time to first token, ms (0 = no sample).
    first_token_ms: f64,
    consecutive_failures: u32,
    consecutive_successes: u32,
    /// Last request start, Unix ms (0 = never).
    last_request_ms: u64,
    /// Models this account must not serve for now.
    excluded_models: Vec<String>,
    /// The scheduler's health tier (`healthy` / `warm` / `risky` / `quarantine`, from
    /// `gateway::scheduler::assess`), or `unknown` when no data plane runs in this process
    /// or the account is not in the published snapshot yet.
    tier: &'static str,
}

/// The tier shown for an account the scheduler board does not cover.
const TIER_UNKNOWN: &str = "unknown";

/// The scheduler board of the published snapshot now, by account id (empty without a data
/// plane in this process). One call covers every account: list views compute it once.
pub(super) fn scheduler_entries(accounts: &Accounts) -> HashMap<i64, BoardEntry> {
    let Some(board) = accounts.board else {
        return HashMap::new();
    };
    board(&accounts.store.publisher.current(), shared_state::now_ms())
        .entries
        .into_iter()
        .map(|e| (e.account_id, e))
        .collect()
}

/// The view of `r`, with the live state of the published snapshot and the scheduler's
/// entry for it (`sched`, from [`scheduler_entries`] or the ops board).
pub(super) async fn account_view(
    accounts: &Accounts,
    r: &AccountRow,
    sched: Option<&BoardEntry>,
) -> AccountView {
    use std::sync::atomic::Ordering;
    let live = accounts.store.publisher.live(r.id).await;
    let now = shared_state::now_ms();
    let stored_cd = u64::try_from(r.cooldown_until_ms).unwrap_or(0);
    let (in_flight, cooldown_until, override_status, served, failures) = match &live {
        Some(l) => {
            let (s, f) = l.counters();
            (
                l.in_flight(),
                l.cooldown_until_ms().max(stored_cd),
                l.status_override(),
                s,
                f,
            )
        }
        None => (0, stored_cd, None, 0, 0),
    };
    let health = live
        .as_ref()
        .map(|l| {
            let s = l.scheduler();
            let error_rate = s.error_rate.load();
            let streak = s.consecutive_failures.load(Ordering::Relaxed);
            HealthView {
                error_rate,
                first_token_ms: s.first_token_ms.load(),
                consecutive_failures: streak,
                consecutive_successes: s.consecutive_successes.load(Ordering::Relaxed),
                last_request_ms: s.last_request_ms.load(Ordering::Relaxed),
                excluded_models: s
                    .excluded_models
                    .active(now)
                    .into_iter()
                    .map(|e| e.model.to_string())
                    .collect(),
                tier: sched.map_or(TIER_UNKNOWN, |e| e.tier),
            }
        })
        .unwrap_or_else(|| HealthView {
            tier: sched.map_or(TIER_UNKNOWN, |e| e.tier),
            ..HealthView::default()
        });
    let pct = |live_pct: Option<f64>, stored: Option<f64>| match (live_pct, stored) {
        (Some(l), _) if l > 0.0 => Some(l),
        (_, s) => s,
    };
    let effective = override_status.unwrap_or(r.status);
    let cooling = cooldown_until > now;
    AccountView {
        id: r.id,
        object: "account",
        chatgpt_account_id: r.chatgpt_account_id.clone(),
        user_id: Some(r.user_id.clone()).filter(|u| !u.is_empty()),
        email: r.email.clone(),
        label: r.label(),
        plan: r.plan_type.clone(),
        status: r.status.as_str(),
        effective_status: effective.as_str(),
        schedulable: effective == AccountStatus::Active && !cooling,
        weight: r.weight,
        max_concurrency: r.max_concurrency,
        account_group: r.account_group.clone(),
        in_flight,
        served,
        failures,
        cooldown_until: cooling.then_some(cooldown_until),
        cooldown_reason: if cooling {
            r.cooldown_reason.clone()
        } else {
            None
        },
        primary_used_pct: pct(
            live.as_ref().map(|l| l.primary_used_pct()),
            r.primary_used_pct,
        ),
        primary_reset_at: r.primary_reset_at,
        secondary_used_pct: pct(
            live.as_ref().map(|l| l.secondary_used_pct()),
            r.secondary_used_pct,
        ),
        secondary_reset_at: r.secondary_reset_at,
        quota_updated_at: r.quota_updated_at,
        reset_credits: accounts.credits.get(r.id),
        access_expires_at: r.access_expires_at,
        last_refresh_at: r.last_refresh_at,
        refresh_in_flight: accounts.refresh.book.in_flight(r.id),
        health,
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

async fn find_account(accounts: &Accounts, id: i64) -> Result<AccountRow, ApiError> {
    accounts
        .store
        .storage
        .list_accounts()
        .await?
        .into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::not_found(format!("no account with id {id}")))
}

async fn view_of(accounts: &Accounts, id: i64) -> ApiResult<AccountView> {
    let row = find_account(accounts, id).await?;
    let sched = scheduler_entries(accounts);
    Ok(Json(account_view(accounts, &row, sched.get(&id)).await))
}

async fn list_accounts(State(accounts): State<Arc<Accounts>>) -> ApiResult<List<AccountView>> {
    let rows = accounts.store.storage.list_accounts().await?;
    let sched = scheduler_entries(&accounts);
    let mut data = Vec::with_capacity(rows.len());
    for r in &rows {
        data.push(account_view(&accounts, r, sched.get(&r.id)).await);
    }
    Ok(Json(List::of(data)))
}

async fn get_account(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> ApiResult<AccountView> {
    view_of(&accounts, parse_id(&id)?).await
}

/// Sets the stored status; `Ok(false)` when no such account. Does not republish.
async fn set_status_only(
    accounts: &Accounts,
    id: i64,
    status: AccountStatus,
) -> Result<bool, ApiError> {
    if !accounts.store.storage.set_status(id, status).await? {
        return Ok(false);
    }
    if status == AccountStatus::Active {
        accounts.store.storage.set_cooldown(id, 0, None).await?;
    }
    if let Some(live) = accounts.store.publisher.live(id).await {
        // Re-enabling starts afresh (no cooldown); disabling keeps the cooldown it had.
        let cooldown_until_ms = if status == AccountStatus::Active {
            0
        } else {
            live.cooldown_until_ms()
        };
        live.apply(&AccountEffect::OperatorStatus {
            status,
            cooldown_until_ms,
        });
    }
    Ok(true)
}

async fn set_status(accounts: &Accounts, id: i64, status: AccountStatus) -> ApiResult<AccountView> {
    accounts.settle_account_events().await;
    if !set_status_only(accounts, id, status).await? {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    // Leaving `active` evicts the account's pooled sockets: the publisher does it.
    accounts.store.reload().await?;
    view_of(accounts, id).await
}

async fn enable_account(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> ApiResult<AccountView> {
    set_status(&accounts, parse_id(&id)?, AccountStatus::Active).await
}

async fn disable_account(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> ApiResult<AccountView> {
    set_status(&accounts, parse_id(&id)?, AccountStatus::Disabled).await
}

#[derive(Debug, Deserialize)]
struct PatchAccount {
    weight: Option<u32>,
    max_concurrency: Option<u32>,
    /// Absent: unchanged; `null` or `""`: the shared pool; a name: that group.
    #[serde(default, deserialize_with = "present")]
    account_group: Option<Option<String>>,
}

/// A present field, `null` included (`Some(None)`); an absent one stays `None` by default.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

async fn patch_account(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<AccountView> {
    let id = parse_id(&id)?;
    let p: PatchAccount = parse_body(&body).map_err(|_| {
        ApiError::bad_request(
            "weight and max_concurrency must be non-negative integers, account_group a string or null",
        )
    })?;
    if p.weight == Some(0) {
        return Err(ApiError::bad_request("weight must be >= 1").with_param("weight"));
    }
    if p.weight.is_none() && p.max_concurrency.is_none() && p.account_group.is_none() {
        return Err(ApiError::bad_request(
            "nothing to change: give weight, max_concurrency and/or account_group",
        ));
    }
    let group = match &p.account_group {
        Some(g) => Some(super::keys::group_name(g.as_deref())?),
        None => None,
    };
    if (p.weight.is_some() || p.max_concurrency.is_some())
        && !accounts
            .store
            .storage
            .set_limits(id, p.weight, p.max_concurrency)
            .await?
    {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    if let Some(g) = group {
        if !accounts
            .store
            .storage
            .set_account_group(id, g.as_deref())
            .await?
        {
            return Err(ApiError::not_found(format!("no account with id {id}")));
        }
    }
    accounts.store.reload().await?;
    view_of(&accounts, id).await
}

async fn delete_account(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> ApiResult<Deleted> {
    let id = parse_id(&id)?;
    if !accounts.store.storage.delete_account(id).await? {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    // The publisher evicts the deleted account's pooled sockets.
    accounts.store.reload().await?;
    Ok(Json(Deleted {
        id,
        object: "account",
        deleted: Some(true),
        revoked: None,
    }))
}

#[derive(Debug, Serialize)]
struct RefreshStarted {
    id: i64,
    object: &'static str,
    refresh_in_flight: bool,
}

async fn refresh_account(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    if !accounts.refresh.request_refresh(id) {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(RefreshStarted {
            id,
            object: "account",
            refresh_in_flight: accounts.refresh.book.in_flight(id),
        }),
    )
        .into_response())
}

async fn poll_account_quota(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> ApiResult<AccountView> {
    let id = parse_id(&id)?;
    if !accounts.quota.poll(id).await {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    view_of(&accounts, id).await
}

/// Clears what the data plane learned against an account: cooldown (live and stored) and the
/// status override (as an operator status change, [`AccountEffect::OperatorStatus`]), and the
/// scheduler's feedback (`SchedulerLive::reset`: penalties, streaks, error rate, latency,
/// model exclusions).
async fn reset_health_of(accounts: &Accounts, id: i64) -> Result<bool, ApiError> {
    if !accounts.store.storage.set_cooldown(id, 0, None).await? {
        return Ok(false);
    }
    let Some((row, _)) = accounts.store.storage.get_account(id).await? else {
        return Ok(false);
    };
    if let Some(live) = accounts.store.publisher.live(id).await {
        // The stored status stands; a data-plane override and the cooldown go.
        live.apply(&AccountEffect::OperatorStatus {
            status: row.status,
            cooldown_until_ms: 0,
        });
        // The scheduler's feedback starts afresh (the one reset the scheduler uses too).
        live.scheduler().reset();
    }
    Ok(true)
}

async fn reset_health(
    State(accounts): State<Arc<Accounts>>,
    Path(id): Path<String>,
) -> ApiResult<AccountView> {
    let id = parse_id(&id)?;
    accounts.settle_account_events().await;
    if !reset_health_of(&accounts, id).await? {
        return Err(ApiError::not_found(format!("no account with id {id}")));
    }
    accounts.store.reload().await?;
    view_of(&accounts, id).await
}

#[derive(Debug, Deserialize)]
struct BulkRequest {
    ids: Vec<i64>,
    action: String,
}

#[derive(Debug, Serialize)]
struct BulkItem {
    id: i64,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct BulkResult {
    object: &'static str,
    action: String,
    succeeded: usize,
    failed: usize,
    results: Vec<BulkItem>,
}

const BULK_ACTIONS: &[&str] = &["enable", "disable", "delete", "refresh", "reset_health"];
/// Most ids one bulk request may name.
const BULK_MAX: usize = 10_000;

/// The action a bulk call is audited as (the one its single-account route is audited as).
fn bulk_audit_action(action: &str) -> String {
    format!("accounts.{}", action.replace('_', "-"))
}

async fn bulk(
    State(accounts): State<Arc<Accounts>>,
    body: Bytes,
) -> Result<Audited<BulkResult>, ApiError> {
    let req: BulkRequest = parse_body(&body)?;
    if !BULK_ACTIONS.contains(&req.action.as_str()) {
        return Err(ApiError::bad_request(format!(
            "unknown action {:?} (one of {})",
            req.action,
            BULK_ACTIONS.join(", ")
        ))
        .with_param("action"));
    }
    if req.ids.is_empty() || req.ids.len() > BULK_MAX {
        return Err(ApiError::bad_request(format!("give 1 to {BULK_MAX} ids")).with_param("ids"));
    }
    accounts.settle_account_events().await;
    let mut results = Vec::with_capacity(req.ids.len());
    for &id in &req.ids {
        let r: Result<bool, ApiError> = match req.action.as_str() {
            "enable" => set_status_only(&accounts, id, AccountStatus::Active).await,
            "disable" => set_status_only(&accounts, id, AccountStatus::Disabled).await,
            "delete" => accounts
                .store
                .storage
                .delete_account(id)
                .await
                .map_err(Into::into),
            "refresh" => Ok(accounts.refresh.request_refresh(id)),
            _ => reset_health_of(&accounts, id).await,
        };
        results.push(match r {
            Ok(true) => BulkItem {
                id,
                ok: true,
                error: None,
            },
            Ok(false) => BulkItem {
                id,
                ok: false,
                error: Some("no such account".into()),
            },
            Err(e) => BulkItem {
                id,
                ok: false,
                error: Some(e.message),
            },
        });
    }
    // The changes are stored: a failed publish is logged (the periodic reload publishes them)
    // rather than answered as an error that would hide what was done from the client and
    // from the call's audit entry.
    accounts.store.republish().await;
    let succeeded = results.iter().filter(|r| r.ok).count();
    // One audit entry for the call, listing what it affected.
    let affected = Affected::of("account", results.iter().filter(|r| r.ok).map(|r| r.id))
        .failed(results.iter().filter(|r| !r.ok).map(|r| r.id))
        .action(bulk_audit_action(&req.action));
    Ok(affected.with(BulkResult {
        object: "bulk_result",
        action: req.action,
        succeeded,
        failed: results.len() - succeeded,
        results,
    }))
}

#[derive(Debug, Deserialize)]
struct ImportFile {
    #[serde(default)]
    name: String,
    content: String,
}

#[derive(Debug, Deserialize)]
struct ImportRequest {
    files: Vec<ImportFile>,
}

#[derive(Debug, Serialize)]
struct Skipped {
    source: String,
    reason: String,
}

/// What an import did.
#[derive(Debug, Serialize)]
pub(crate) struct ImportView {
    object: &'static str,
    added: Vec<String>,
    updated: Vec<String>,
    skipped: Vec<Skipped>,
}

impl From<ImportSummary> for ImportView {
    fn from(s: ImportSummary) -> Self {
        Self {
            object: "import_summary",
            added: s.added,
            updated: s.updated,
            skipped: s
                .skipped
                .into_iter()
                .map(|(source, reason)| Skipped { source, reason })
                .collect(),
        }
    }
}

/// Most files one import may carry.
const IMPORT_MAX_FILES: usize = 5_000;

async fn import(
    State(accounts): State<Arc<Accounts>>,
    body: Bytes,
) -> Result<Audited<ImportView>, ApiError> {
    let req: ImportRequest = parse_body(&body)?;
    if req.files.is_empty() || req.files.len() > IMPORT_MAX_FILES {
        return Err(
            ApiError::bad_request(format!("give 1 to {IMPORT_MAX_FILES} files"))
                .with_param("files"),
        );
    }
    let mut sum = ImportSummary::default();
    for (i, f) in req.files.iter().enumerate() {
        let name = if f.name.trim().is_empty() {
            format!("file {}", i + 1)
        } else {
            f.name.trim().to_owned()
        };
        crate::import::import_text(
            accounts.store.storage.as_ref(),
            &accounts.oauth,
            &name,
            &f.content,
            &mut sum,
        )
        .await;
    }
    // Stored: a failed publish is logged, not answered (see `bulk`).
    accounts.store.republish().await;
    tracing::info!(
        added = sum.added.len(),
        updated = sum.updated.len(),
        skipped = sum.skipped.len(),
        "accounts imported through the admin API"
    );
    let affected = Affected::of("account", sum.ids.iter().copied());
    Ok(affected.with(sum.into()))
}

#[derive(Debug, Default, Deserialize)]
struct ExportRequest {
    ids: Option<Vec<i64>>,
}

// No Debug: it carries a secret.
#[derive(Serialize)]
struct ExportTokens {
    id_token: String,
    access_token: String,
    refresh_token: String,
    account_id: String,
}

/// One account as an `auth.json` document (what `import` reads back).
// No Debug: it carries a secret.
#[derive(Serialize)]
struct ExportDoc {
    auth_mode: &'static str,
    #[serde(rename = "OPENAI_API_KEY")]
    openai_api_key: Option<String>,
    tokens: ExportTokens,
    last_refresh: Option<String>,
    email: Option<String>,
}

async fn export(
    State(accounts): State<Arc<Accounts>>,
    body: Bytes,
) -> Result<Audited<List<ExportDoc>>, ApiError> {
    let req: ExportRequest = parse_body(&body)?;
    let rows = accounts.store.storage.load_accounts().await?;
    let mut data = Vec::new();
    let mut exported = Vec::new();
    for (row, sec) in rows {
        if req.ids.as_ref().is_some_and(|ids| !ids.contains(&row.id)) {
            continue;
        }
        exported.push(row.id);
        let last_refresh = row.last_refresh_at.and_then(|ms| {
            time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
        });
        data.push(ExportDoc {
            auth_mode: "chatgpt",
            openai_api_key: None,
            tokens: ExportTokens {
                id_token: sec.id_token.expose().to_owned(),
                access_token: sec.access_token.expose().to_owned(),
                refresh_token: sec.refresh_token.expose().to_owned(),
                account_id: row.chatgpt_account_id.clone(),
            },
            last_refresh,
            email: row.email.clone(),
        });
    }
    tracing::warn!(
        accounts = data.len(),
        "accounts exported through the admin API (tokens included)"
    );
    Ok(Affected::of("account", exported).with(List::of(data)))
}

#[derive(Debug, Serialize)]
struct OAuthStart {
    object: &'static str,
    authorize_url: String,
    state: String,
    redirect_uri: &'static str,
    expires_at: u64,
}

async fn oauth_start(State(accounts): State<Arc<Accounts>>) -> ApiResult<OAuthStart> {
    let (verifier, challenge) = crate::oauth::pkce_pair();
    let state = crate::auth::generate_session_id();
    let now = shared_state::now_ms();
    accounts
        .logins
        .insert(state.clone(), Secret::from(verifier), now);
    Ok(Json(OAuthStart {
        object: "oauth_login",
        authorize_url: crate::oauth::authorize_url(accounts.oauth.token_url(), &challenge, &state),
        state,
        redirect_uri: crate::oauth::REDIRECT_URI,
        expires_at: now + u64::try_from(LOGIN_TTL.as_millis()).unwrap_or(0),
    }))
}

// No Debug: it carries a secret.
#[derive(Default, Deserialize)]
struct OAuthFinish {
    callback_url: Option<String>,
    code: Option<String>,
    state: Option<String>,
}

fn query_param(url: &str, key: &str) -> Option<String> {
    let q = url.split_once('?').map_or(url, |(_, q)| q);
    let q = q.split('#').next().unwrap_or(q);
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn oauth_finish(
    State(accounts): State<Arc<Accounts>>,
    body: Bytes,
) -> Result<Audited<ImportView>, ApiError> {
    let req: OAuthFinish = parse_body(&body)?;
    let url = req.callback_url.as_deref().unwrap_or("").trim();
    let code = req
        .code
        .clone()
        .or_else(|| query_param(url, "code"))
        .filter(|c| !c.is_empty());
    let state = req
        .state
        .clone()
        .or_else(|| query_param(url, "state"))
        .filter(|s| !s.is_empty());
    if let Some(err) = query_param(url, "error") {
        return Err(
            ApiError::bad_request(format!("the login failed: {err}")).with_param("callback_url")
        );
    }
    let (Some(code), Some(state)) = (code, state) else {
        return Err(ApiError::bad_request(
            "paste the whole URL the browser landed on (it has ?code=...&state=...)",
        )
        .with_param("callback_url"));
    };
    let Some(verifier) = accounts.logins.take(&state, shared_state::now_ms()) else {
        return Err(ApiError::bad_request(
            "unknown or expired login (state does not match): start the login again",
        )
        .with_param("callback_url"));
    };
    let t = accounts
        .oauth
        .exchange_code(&code, verifier.expose())
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "token_exchange_failed",
                format!("the token endpoint refused the code: {e}"),
            )
        })?;
    // Hand the tokens to the importer as an auth.json document: one code path for identity,
    // merge and storage.
    let doc = serde_json::json!({
        "tokens": {
            "id_token": t.id_token.as_ref().map(|s| s.expose()).unwrap_or(""),
            "access_token": t.access_token.expose(),
            "refresh_token": t.refresh_token.as_ref().map(|s| s.expose()).unwrap_or(""),
        },
        "last_refresh": time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    });
    let mut sum = ImportSummary::default();
    crate::import::import_text(
        accounts.store.storage.as_ref(),
        &accounts.oauth,
        "oauth login",
        &doc.to_string(),
        &mut sum,
    )
    .await;
    accounts.store.reload().await?;
    let affected = Affected::of("account", sum.ids.iter().copied());
    Ok(affected.with(sum.into()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn callback_url_params() {
        let u = "http://localhost:1455/auth/callback?code=ac_1%2B2&scope=x&state=s-1#frag";
        assert_eq!(query_param(u, "code").as_deref(), Some("ac_1+2"));
        assert_eq!(query_param(u, "state").as_deref(), Some("s-1"));
        assert_eq!(query_param(u, "nope"), None);
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%41%4a"), "AJ");
    }
}
