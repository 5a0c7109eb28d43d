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
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use axum::{extract::State, routing::get, Json, Router};
use serde::Serialize;
use shared_state::board::BoardEntry;

use super::{accounts::account_view, ApiResult, AppState};
use crate::{
    sidecar::Core,
    storage::{UsageEntry, UsageFilter, UsageTotals},
};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/dashboard", get(dashboard))
        .route("/ops", get(ops))
}

/// One parsed `/metrics` scrape.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    /// Requests answered (every route but healthz/metrics).
    requests: f64,
    /// Requests answered with a status >= 400.
    errors: f64,
    open_streams: f64,
    ws_sessions: f64,
    attempts: f64,
    failovers: f64,
    /// Per worker: driver and `metric -> value` of every `worker="N"` sample.
    workers: BTreeMap<u32, (String, BTreeMap<String, f64>)>,
}

/// Parses the Prometheus text the data plane serves.
pub(crate) fn parse_metrics(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        let label = |k: &str| -> Option<&str> {
            labels.split(',').find_map(|kv| {
                let (lk, lv) = kv.split_once('=')?;
                (lk.trim() == k).then(|| lv.trim().trim_matches('"'))
            })
        };
        let short = name.strip_prefix("codex_gateway_").unwrap_or(name);
        if let Some(w) = label("worker").and_then(|w| w.parse::<u32>().ok()) {
            let e = s.workers.entry(w).or_default();
            if short == "worker_driver" {
                e.0 = label("driver").unwrap_or("unknown").to_owned();
            } else {
                *e.1.entry(short.to_owned()).or_default() += v;
            }
            continue;
        }
        match short {
            "requests_total" => {
                if matches!(label("route"), Some("healthz" | "metrics")) {
                    continue;
                }
                s.requests += v;
                if label("status")
                    .and_then(|st| st.parse::<u16>().ok())
                    .is_some_and(|st| st >= 400)
                {
                    s.errors += v;
                }
            }
            "open_streams" => s.open_streams = v,
            "ws_sessions" => s.ws_sessions = v,
            "upstream_attempts_total" => s.attempts = v,
            "failovers_total" => s.failovers = v,
            _ => {}
        }
    }
    s
}

#[derive(Debug, Clone)]
struct RateSample {
    at_ms: u64,
    requests: f64,
    errors: f64,
    attempts: f64,
    /// Per worker: its counters (`*_total` samples).
    workers: BTreeMap<u32, BTreeMap<String, f64>>,
}

#[derive(Debug, Default)]
struct SamplerState {
    rates: VecDeque<RateSample>,
    quota: VecDeque<(u64, f64)>,
}

/// Scrapes the data plane and keeps short histories for rates and quota burn.
#[derive(Debug)]
pub(crate) struct OpsSampler {
    url: Option<String>,
    http: Option<reqwest::Client>,
    state: Mutex<SamplerState>,
}

/// How far back rates look (the newest sample at least this old is the base).
const RATE_WINDOW_MS: u64 = 5_000;
/// How far back quota burn looks.
const BURN_WINDOW_MS: u64 = 30 * 60_000;

// === impl OpsSampler ===

impl OpsSampler {
    /// A sampler of `metrics_url` (none: no data-plane metrics).
    pub fn new(url: Option<String>) -> Self {
        let http = url.as_ref().and_then(|_| {
            reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(2))
                .build()
                .ok()
        });
        Self {
            url,
            http,
            state: Mutex::new(SamplerState::default()),
        }
    }

    async fn scrape(&self) -> Result<Scrape, String> {
        let (Some(url), Some(http)) = (&self.url, &self.http) else {
            return Err("the data plane's metrics address is not configured".into());
        };
        let resp = http.get(url).send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("/metrics answered {}", resp.status()));
        }
        let text = resp.text().await.map_err(|e| e.to_string())?;
        Ok(parse_metrics(&text))
    }

    /// Records a scrape and returns `(requests/s, errors/s, attempts/s)` over the last few
    /// seconds (zeros until two samples exist). Each worker's counters get their rate too,
    /// added to its metrics as `<name>_per_s` (e.g. `worker_events_per_s`).
    fn rates(&self, s: &mut Scrape, now: u64) -> (f64, f64, f64) {
        let Ok(mut st) = self.state.lock() else {
            return (0.0, 0.0, 0.0);
        };
        let cur = RateSample {
            at_ms: now,
            requests: s.requests,
            errors: s.errors,
            attempts: s.attempts,
            workers: s
                .workers
                .iter()
                .map(|(id, (_, m))| {
                    let counters = m
                        .iter()
                        .filter(|(k, _)| k.ends_with("_total"))
                        .map(|(k, v)| (k.clone(), *v))
                        .collect();
                    (*id, counters)
                })
                .collect(),
        };
        while st.rates.len() > 2 && st.rates[1].at_ms + RATE_WINDOW_MS <= now {
            st.rates.pop_front();
        }
        let out = match st.rates.front() {
            Some(base) if now > base.at_ms && cur.requests >= base.requests => {
                let dt = (now - base.at_ms) as f64 / 1000.0;
                for (id, counters) in &cur.workers {
                    let (Some(then), Some((_, m))) = (base.workers.get(id), s.workers.get_mut(id))
                    else {
                        continue;
                    };
                    for (k, v) in counters {
                        if let Some(b) = then.get(k).filter(|b| v >= b) {
                            let name = format!("{}_per_s", k.trim_end_matches("_total"));
                            m.insert(name, (v - b) / dt);
                        }
                    }
                }
                (
                    (cur.requests - base.requests) / dt,
                    (cur.errors - base.errors).max(0.0) / dt,
                    (cur.attempts - base.attempts).max(0.0) / dt,
                )
            }
            _ => (0.0, 0.0, 0.0),
        };
        st.rates.push_back(cur);
        if st.rates.len() > 256 {
            st.rates.pop_front();
        }
        out
    }

    /// Records the mean quota use and returns its rise per hour over the burn window.
    fn burn(&self, mean_pct: f64, now: u64) -> Option<f64> {
        let mut st = self.state.lock().ok()?;
        while st
            .quota
            .front()
            .is_some_and(|(t, _)| t + BURN_WINDOW_MS < now)
        {
            st.quota.pop_front();
        }
        st.quota.push_back((now, mean_pct));
        if st.quota.len() > 4_096 {
            st.quota.pop_front();
        }
        let (t0, p0) = *st.quota.front()?;
        if now < t0 + 60_000 {
            return None;
        }
        Some((mean_pct - p0) / ((now - t0) as f64 / 3_600_000.0))
    }
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

async fn data_plane(core: &Core, now: u64) -> (DataPlaneView, Scrape) {
    match core.admin.ops.scrape().await {
        Ok(mut s) => {
            let (rps, eps, aps) = core.admin.ops.rates(&mut s, now);
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

async fn dashboard(State(core): State<AppState>) -> ApiResult<DashboardView> {
    let now = shared_state::now_ms();
    let (dp, _) = data_plane(&core, now).await;
    let now_i = crate::storage::now_ms_i64();
    let since = |ms: i64| UsageFilter {
        since_ms: Some(now_i - ms),
        ..UsageFilter::default()
    };
    let usage_5m = core.storage.usage_summary(since(300_000)).await?.totals;
    let usage_1h = core.storage.usage_summary(since(3_600_000)).await?.totals;
    let usage_24h = core.storage.usage_summary(since(86_400_000)).await?.totals;
    let rows = core.storage.list_accounts().await?;
    let snap = core.publisher.current();
    let mut pool = PoolView {
        accounts: rows.len(),
        ..PoolView::default()
    };
    let (mut p_sum, mut s_sum, mut n) = (0.0, 0.0, 0usize);
    let mut next_reset: Option<i64> = None;
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
    let burn = core.admin.ops.burn(mean_p, now);
    let dry_at_ms = burn.filter(|b| *b > 0.01).map(|b| {
        let hours = (100.0 - mean_p).max(0.0) / b;
        now + (hours * 3_600_000.0) as u64
    });
    let recent_failures = core.storage.recent_failures(5).await?;
    Ok(Json(DashboardView {
        object: "dashboard",
        now_ms: now,
        storage_up: core.health.storage_up(),
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

async fn ops(State(core): State<AppState>) -> ApiResult<OpsView> {
    let now = shared_state::now_ms();
    let (dp, scrape) = data_plane(&core, now).await;
    let snap = core.publisher.current();
    let rows = core.storage.list_accounts().await?;
    // The scheduler's order and assessment, by account id.
    let mut sched: HashMap<i64, (usize, BoardEntry)> = core
        .admin
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
        let account = account_view(&core, r, s.as_ref().map(|s| &s.1)).await;
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
        board_by_scheduler: core.admin.board.is_some(),
        board,
        board_truncated: truncated,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_data_plane_metrics() {
        let text = "# HELP x y\n\
            codex_gateway_requests_total{route=\"responses\",status=\"200\"} 7\n\
            codex_gateway_requests_total{route=\"responses\",status=\"502\"} 2\n\
            codex_gateway_requests_total{route=\"healthz\",status=\"200\"} 50\n\
            codex_gateway_open_streams 3\n\
            codex_gateway_upstream_h2_connections{worker=\"0\"} 2\n\
            codex_gateway_upstream_h2_connections{worker=\"1\"} 1\n\
            codex_gateway_worker_driver{worker=\"0\",driver=\"io_uring\"} 1\n\
            codex_gateway_worker_driver{worker=\"1\",driver=\"legacy\"} 1\n";
        let s = parse_metrics(text);
        assert_eq!(s.requests, 9.0);
        assert_eq!(s.errors, 2.0);
        assert_eq!(s.open_streams, 3.0);
        assert_eq!(s.workers.len(), 2);
        assert_eq!(s.workers[&0].0, "io_uring");
        assert_eq!(s.workers[&1].0, "legacy");
        assert_eq!(s.workers[&0].1["upstream_h2_connections"], 2.0);
    }

    #[test]
    fn rates_and_burn() {
        let o = OpsSampler::new(None);
        let mut s = parse_metrics(
            "codex_gateway_worker_events_total{worker=\"0\"} 100\n\
             codex_gateway_worker_open_streams{worker=\"0\"} 4\n",
        );
        assert_eq!(o.rates(&mut s, 1_000), (0.0, 0.0, 0.0));
        let mut s = parse_metrics(
            "codex_gateway_worker_events_total{worker=\"0\"} 700\n\
             codex_gateway_worker_open_streams{worker=\"0\"} 4\n",
        );
        s.requests = 10.0;
        s.errors = 2.0;
        let (r, e, _) = o.rates(&mut s, 3_000);
        assert!((r - 5.0).abs() < 1e-9 && (e - 1.0).abs() < 1e-9);
        // Each worker's counters get a rate; gauges do not.
        assert_eq!(s.workers[&0].1["worker_events_per_s"], 300.0);
        assert!(!s.workers[&0].1.contains_key("worker_open_streams_per_s"));
        assert_eq!(o.burn(10.0, 0), None);
        let b = o.burn(20.0, 600_000).unwrap();
        assert!((b - 60.0).abs() < 1e-9, "{b}");
    }
}
