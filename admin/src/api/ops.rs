//! The dashboard and the live per-worker view.
//!
//! - `GET /api/admin/dashboard` -> [`DashboardView`]: requests/s and errors/s (from the data
//!   plane's metrics, diffed between polls), open streams and WebSocket sessions, tokens over
//!   5 minutes / 1 hour / 24 hours (usage records), pool health by status, quota burn (the mean
//!   5-hour window use of the schedulable accounts, its rise per hour over the last 30 minutes
//!   of polls) and when the pool runs dry at that rate, and the newest failures.
//! - `GET /api/admin/ops` -> [`OpsView`]: one entry per worker with its I/O driver and every
//!   per-worker gauge the data plane exports (`worker="N"` samples of `/metrics`: upstream h2
//!   connections and streams, idle upstream WebSockets, ...), the totals, and the scheduler
//!   board: every account in the data plane's own candidate order for the current strategy
//!   (`gateway::scheduler::board`, handed over as `SidecarConfig::scheduler_board` and called
//!   here over the current snapshot), with the scheduler's tier, score, dynamic limit and
//!   position, then the accounts that are not candidates now. Without a data plane in the
//!   process the board lists the accounts by id without those columns.
//!
//! The data plane's metrics come from its own `/metrics` (`SidecarConfig::metrics_url`, set
//! by the gateway to its data address); without it the worker list is empty and
//! `data_plane.reachable` is false. The sampler is driven by the polls themselves: no
//! background task.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use axum::{extract::State, routing::get, Json, Router};
use serde::Serialize;
use shared_state::board::BoardEntry;

use super::{accounts::account_view, ApiResult};
use crate::{
    services::{admin::Scrape, Ops},
    storage::{UsageEntry, UsageFilter, UsageTotals},
};

pub(super) fn routes(svc: Arc<Ops>) -> Router {
    Router::new()
        .route("/dashboard", get(dashboard))
        .route("/ops", get(ops))
        .with_state(svc)
}

/// The data plane as its metrics show it.
#[derive(Debug, Serialize)]
pub(crate) struct DataPlaneView {
    reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    requests_per_s: f64,
    errors_per_s: f64,
    attempts_per_s: f64,
    requests_total: f64,
    errors_total: f64,
    open_streams: f64,
    ws_sessions: f64,
    failovers_total: f64,
}

async fn data_plane(svc: &Ops, now: u64) -> (DataPlaneView, Scrape) {
    match svc.sampler.scrape().await {
        Ok(mut s) => {
            let (rps, eps, aps) = svc.sampler.rates(&mut s, now);
            (
                DataPlaneView {
                    reachable: true,
                    error: None,
                    requests_per_s: rps,
                    errors_per_s: eps,
                    attempts_per_s: aps,
                    requests_total: s.requests,
                    errors_total: s.errors,
                    open_streams: s.open_streams,
                    ws_sessions: s.ws_sessions,
                    failovers_total: s.failovers,
                },
                s,
            )
        }
        Err(e) => (
            DataPlaneView {
                reachable: false,
                error: Some(e),
                requests_per_s: 0.0,
                errors_per_s: 0.0,
                attempts_per_s: 0.0,
                requests_total: 0.0,
                errors_total: 0.0,
                open_streams: 0.0,
                ws_sessions: 0.0,
                failovers_total: 0.0,
            },
            Scrape::default(),
        ),
    }
}

/// Accounts by what the scheduler can do with them.
#[derive(Debug, Default, Serialize)]
pub(crate) struct PoolView {
    accounts: usize,
    schedulable: usize,
    active: usize,
    cooling: usize,
    disabled: usize,
    reauth_required: usize,
    banned: usize,
    in_flight: u64,
}

/// Quota burn of the schedulable accounts.
#[derive(Debug, Default, Serialize)]
pub(crate) struct QuotaView {
    /// Mean 5-hour window use of the schedulable accounts, percent.
    mean_primary_used_pct: f64,
    /// Mean weekly window use, percent.
    mean_secondary_used_pct: f64,
    /// Rise of the mean 5-hour use per hour over the last 30 minutes (`null` until a minute
    /// of polls is known).
    burn_pct_per_hour: Option<f64>,
    /// When the mean reaches 100 % at that rate, Unix ms (`null`: not rising, or unknown).
    dry_at_ms: Option<u64>,
    /// Earliest 5-hour window reset among the schedulable accounts, Unix seconds.
    next_reset_at: Option<i64>,
}

/// The dashboard.
#[derive(Debug, Serialize)]
pub(crate) struct DashboardView {
    object: &'static str,
    now_ms: u64,
    storage_up: bool,
    snapshot_version: u64,
    strategy: &'static str,
    data_plane: DataPlaneView,
    usage_5m: UsageTotals,
    usage_1h: UsageTotals,
    usage_24h: UsageTotals,
    pool: PoolView,
    quota: QuotaView,
    recent_failures: Vec<UsageEntry>,
}

async fn dashboard(State(svc): State<Arc<Ops>>) -> ApiResult<DashboardView> {
    let store = &svc.accounts.store;
    let now = shared_state::now_ms();
    let (dp, _) = data_plane(&svc, now).await;
    let now_i = crate::storage::now_ms_i64();
    let since = |ms: i64| UsageFilter {
        since_ms: Some(now_i - ms),
        ..UsageFilter::default()
    };
    let usage_5m = store.storage.usage_summary(since(300_000)).await?.totals;
    let usage_1h = store.storage.usage_summary(since(3_600_000)).await?.totals;
    let usage_24h = store.storage.usage_summary(since(86_400_000)).await?.totals;
    let rows = store.storage.list_accounts().await?;
    let snap = store.publisher.current();
    let mut pool = PoolView {
        accounts: rows.len(),
        ..PoolView::default()
    };
    let (mut p_sum, mut s_sum, mut n) = (0.0, 0.0, 0usize);
    let mut next_reset: Option<i64> = None;
    let mut schedulable = Vec::new();
    for r in &rows {
        let live = snap.account(r.id).map(|a| a.live.clone());
        let eff = live
            .as_ref()
            .and_then(|l| l.status_override())
            .unwrap_or(r.status);
        let cooling = live
            .as_ref()
            .map_or(0, |l| l.cooldown_until_ms())
            .max(u64::try_from(r.cooldown_until_ms).unwrap_or(0))
            > now;
        pool.in_flight += u64::from(live.as_ref().map_or(0, |l| l.in_flight()));
        match eff {
            shared_state::AccountStatus::Active => {
                pool.active += 1;
                if cooling {
                    pool.cooling += 1;
                } else {
                    pool.schedulable += 1;
                    let lp = live.as_ref().map_or(0.0, |l| l.primary_used_pct());
                    let ls = live.as_ref().map_or(0.0, |l| l.secondary_used_pct());
                    p_sum += if lp > 0.0 {
                        lp
                    } else {
                        r.primary_used_pct.unwrap_or(0.0)
                    };
                    s_sum += if ls > 0.0 {
                        ls
                    } else {
                        r.secondary_used_pct.unwrap_or(0.0)
                    };
                    n += 1;
                    schedulable.push(r.id);
                    if let Some(t) = r.primary_reset_at {
                        next_reset = Some(next_reset.map_or(t, |c| c.min(t)));
                    }
                }
            }
            shared_state::AccountStatus::Disabled => pool.disabled += 1,
            shared_state::AccountStatus::ReauthRequired => pool.reauth_required += 1,
            shared_state::AccountStatus::Banned => pool.banned += 1,
        }
    }
    let mean_p = if n > 0 { p_sum / n as f64 } else { 0.0 };
    let burn = svc.sampler.burn(mean_p, now);
    let credits = held_credits(&svc, &schedulable);
    let dry_at_ms = burn.and_then(|b| dry_at_ms(now, mean_p, b, credits, n));
    let recent_failures = store.storage.recent_failures(5).await?;
    Ok(Json(DashboardView {
        object: "dashboard",
        now_ms: now,
        storage_up: svc.health.storage_up(),
        snapshot_version: snap.version,
        strategy: snap.settings.strategy.as_str(),
        data_plane: dp,
        usage_5m,
        usage_1h,
        usage_24h,
        pool,
        quota: QuotaView {
            mean_primary_used_pct: mean_p,
            mean_secondary_used_pct: if n > 0 { s_sum / n as f64 } else { 0.0 },
            burn_pct_per_hour: burn,
            dry_at_ms,
            next_reset_at: next_reset,
        },
        recent_failures,
    }))
}

/// The reset credits the `accounts` hold, as the quota poller last read them.
fn held_credits(svc: &Ops, accounts: &[i64]) -> u64 {
    let credits = svc.accounts.credits.all();
    accounts.iter().filter_map(|id| credits.get(id)).sum()
}

/// When the mean 5-hour use of `n` schedulable accounts, `mean_pct` now and rising `burn`
/// points per hour, reaches 100 %, Unix ms; `None` when it is not rising. A reset credit gives
/// one account a fresh window, i.e. `100 / n` points of the mean more (`crate::forecast` spends
/// them the same way, account by account).
fn dry_at_ms(now: u64, mean_pct: f64, burn: f64, credits: u64, n: usize) -> Option<u64> {
    if burn <= 0.01 || n == 0 {
        return None;
    }
    let headroom = (100.0 - mean_pct).max(0.0) + 100.0 * credits as f64 / n as f64;
    Some(now + (headroom / burn * 3_600_000.0) as u64)
}

/// One worker of the data plane.
#[derive(Debug, Serialize)]
pub(crate) struct WorkerView {
    id: u32,
    driver: String,
    /// Every per-worker gauge/counter the data plane exports, by metric name (without the
    /// `codex_gateway_` prefix).
    metrics: BTreeMap<String, f64>,
}

/// One row of the scheduler board.
#[derive(Debug, Serialize)]
pub(crate) struct BoardRow {
    /// 1-based position in the board's order.
    rank: usize,
    /// The scheduler's assessment and candidate position (`null`: no data plane in this
    /// process, or the account is not in the published snapshot yet).
    scheduler: Option<BoardEntry>,
    #[serde(flatten)]
    account: super::accounts::AccountView,
}

/// The live per-worker view.
#[derive(Debug, Serialize)]
pub(crate) struct OpsView {
    object: &'static str,
    now_ms: u64,
    snapshot_version: u64,
    strategy: &'static str,
    data_plane: DataPlaneView,
    workers: Vec<WorkerView>,
    /// Whether the board's order and columns come from the data plane's scheduler.
    board_by_scheduler: bool,
    /// Accounts in board order (see the module docs).
    board: Vec<BoardRow>,
    /// Rows the board left out (it shows the first 200).
    board_truncated: usize,
}

/// Rows of the scheduler board.
const BOARD_ROWS: usize = 200;

async fn ops(State(svc): State<Arc<Ops>>) -> ApiResult<OpsView> {
    let store = &svc.accounts.store;
    let now = shared_state::now_ms();
    let (dp, scrape) = data_plane(&svc, now).await;
    let snap = store.publisher.current();
    let rows = store.storage.list_accounts().await?;
    // The scheduler's order and assessment, by account id.
    let mut sched: HashMap<i64, (usize, BoardEntry)> = svc
        .accounts
        .board
        .map(|f| f(&snap, now).entries)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, e)| (e.account_id, (i, e)))
        .collect();
    let mut rows: Vec<_> = rows.iter().map(|r| (sched.remove(&r.id), r)).collect();
    rows.sort_by_key(|(s, r)| (s.as_ref().map_or(usize::MAX, |s| s.0), r.id));
    let truncated = rows.len().saturating_sub(BOARD_ROWS);
    let mut board = Vec::with_capacity(rows.len().min(BOARD_ROWS));
    for (i, (s, r)) in rows.into_iter().take(BOARD_ROWS).enumerate() {
        let account = account_view(&svc.accounts, r, s.as_ref().map(|s| &s.1)).await;
        board.push(BoardRow {
            rank: i + 1,
            scheduler: s.map(|s| s.1),
            account,
        });
    }
    Ok(Json(OpsView {
        object: "ops",
        now_ms: now,
        snapshot_version: snap.version,
        strategy: snap.settings.strategy.as_str(),
        data_plane: dp,
        workers: scrape
            .workers
            .into_iter()
            .map(|(id, (driver, metrics))| WorkerView {
                id,
                driver: if driver.is_empty() {
                    "unknown".into()
                } else {
                    driver
                },
                metrics,
            })
            .collect(),
        board_by_scheduler: svc.accounts.board.is_some(),
        board,
        board_truncated: truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::dry_at_ms;

    #[test]
    fn the_dashboard_run_out_counts_reset_credits() {
        // Half used, 10 points an hour: 5 hours; not rising or no accounts: never.
        assert_eq!(dry_at_ms(0, 50.0, 10.0, 0, 4), Some(5 * 3_600_000));
        assert_eq!(dry_at_ms(0, 50.0, 0.0, 3, 4), None);
        assert_eq!(dry_at_ms(0, 50.0, 10.0, 3, 0), None);
        // Two credits among four accounts: two fresh windows = 50 more points of the mean.
        assert_eq!(dry_at_ms(7, 50.0, 10.0, 2, 4), Some(7 + 10 * 3_600_000));
        // Past 100 % the credits are what is left.
        assert_eq!(dry_at_ms(0, 120.0, 25.0, 1, 4), Some(3_600_000));
    }
}
