//! Usage: totals, time series and recent failures, from the stored usage records.
//!
//! - `GET /api/admin/usage?since_ms=&until_ms=&key_id=&account_id=` -> `totals`, `by_key` and
//!   `by_account` (requests, input/cached/output/reasoning tokens, errors);
//! - `GET /api/admin/usage/series?since_ms=&until_ms=&bucket_ms=&group_by=model|key|account&key_id=&account_id=`
//!   -> [`SeriesView`]: contiguous buckets (default: the last 24 hours in 5-minute buckets; at
//!   most 2,000 buckets) and one series per model, key or account, each with requests, tokens
//!   (input + output) and errors per bucket;
//! - `GET /api/admin/failures?limit=` -> the newest failed requests (status >= 400 or an error
//!   code), newest first, with the key name and account label.

use std::collections::{BTreeMap, HashMap};

use axum::{
    extract::{Query, State},
    routing::get,
    Json, Router,
};
use serde::Serialize;

use super::{ApiError, ApiResult, AppState, List};
use crate::storage::{AccountRow, UsageEntry, UsageFilter, UsageTotals};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/usage", get(get_usage))
        .route("/usage/series", get(get_series))
        .route("/failures", get(get_failures))
}

type Q = Query<HashMap<String, String>>;

fn int(q: &HashMap<String, String>, k: &str) -> Result<Option<i64>, ApiError> {
    match q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!("{k} must be an integer, got {v:?}")).with_param(k)
        }),
    }
}

fn filter_of(q: &HashMap<String, String>) -> Result<UsageFilter, ApiError> {
    Ok(UsageFilter {
        since_ms: int(q, "since_ms")?,
        until_ms: int(q, "until_ms")?,
        key_id: int(q, "key_id")?,
        account_id: int(q, "account_id")?,
    })
}

#[derive(Debug, Serialize)]
pub(crate) struct KeyTotals {
    key_id: i64,
    name: Option<String>,
    #[serde(flatten)]
    totals: UsageTotals,
}

#[derive(Debug, Serialize)]
pub(crate) struct AccountTotals {
    account_id: Option<i64>,
    label: Option<String>,
    #[serde(flatten)]
    totals: UsageTotals,
}

#[derive(Debug, Serialize)]
pub(crate) struct UsageView {
    object: &'static str,
    filter: UsageFilterView,
    totals: UsageTotals,
    by_key: Vec<KeyTotals>,
    by_account: Vec<AccountTotals>,
}

#[derive(Debug, Serialize)]
struct UsageFilterView {
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    key_id: Option<i64>,
    account_id: Option<i64>,
}

fn label_of(accounts: &[AccountRow], id: i64) -> Option<String> {
    accounts.iter().find(|a| a.id == id).map(AccountRow::label)
}

async fn get_usage(State(core): State<AppState>, Query(q): Q) -> ApiResult<UsageView> {
    let filter = filter_of(&q)?;
    let sum = core.storage.usage_summary(filter).await?;
    let keys = core.storage.list_keys().await?;
    let accounts = core.storage.list_accounts().await?;
    Ok(Json(UsageView {
        object: "usage",
        filter: UsageFilterView {
            since_ms: filter.since_ms,
            until_ms: filter.until_ms,
            key_id: filter.key_id,
            account_id: filter.account_id,
        },
        totals: sum.totals,
        by_key: sum
            .by_key
            .iter()
            .map(|(id, t)| KeyTotals {
                key_id: *id,
                name: keys.iter().find(|k| k.id == *id).map(|k| k.name.clone()),
                totals: *t,
            })
            .collect(),
        by_account: sum
            .by_account
            .iter()
            .map(|(id, t)| AccountTotals {
                account_id: *id,
                label: id.and_then(|id| label_of(&accounts, id)),
                totals: *t,
            })
            .collect(),
    }))
}

/// One series of a [`SeriesView`].
#[derive(Debug, Serialize)]
pub(crate) struct Series {
    /// Model name, key id or account id (as text; `none` for requests no account served).
    id: String,
    label: String,
    requests: Vec<u64>,
    tokens: Vec<u64>,
    errors: Vec<u64>,
    totals: UsageTotals,
}

/// Usage over time.
#[derive(Debug, Serialize)]
pub(crate) struct SeriesView {
    object: &'static str,
    group_by: String,
    bucket_ms: i64,
    since_ms: i64,
    until_ms: i64,
    /// Bucket start times, Unix ms.
    buckets: Vec<i64>,
    series: Vec<Series>,
    totals: UsageTotals,
}

/// Most buckets one series answer may hold.
const MAX_BUCKETS: i64 = 2_000;

async fn get_series(State(core): State<AppState>, Query(q): Q) -> ApiResult<SeriesView> {
    let mut filter = filter_of(&q)?;
    let now = crate::storage::now_ms_i64();
    let until = filter.until_ms.unwrap_or(now);
    let since = filter.since_ms.unwrap_or(until - 86_400_000);
    if since >= until {
        return Err(
            ApiError::bad_request("since_ms must be before until_ms").with_param("since_ms")
        );
    }
    let span = until - since;
    let mut bucket = int(&q, "bucket_ms")?.unwrap_or_else(|| (span / 288).max(60_000));
    if bucket <= 0 {
        return Err(ApiError::bad_request("bucket_ms must be positive").with_param("bucket_ms"));
    }
    if span / bucket > MAX_BUCKETS {
        bucket = span / MAX_BUCKETS + 1;
    }
    let group_by = q.get("group_by").map_or("model", |s| s.as_str()).to_owned();
    if !["model", "key", "account"].contains(&group_by.as_str()) {
        return Err(
            ApiError::bad_request("group_by must be model, key or account").with_param("group_by"),
        );
    }
    filter.since_ms = Some(since);
    filter.until_ms = Some(until);
    let rows = core.storage.usage_buckets(filter, bucket).await?;
    let first = (since / bucket) * bucket;
    let n = usize::try_from((until - 1 - first) / bucket + 1).unwrap_or(1);
    let buckets: Vec<i64> = (0..n).map(|i| first + bucket * i as i64).collect();
    let keys = core.storage.list_keys().await?;
    let accounts = core.storage.list_accounts().await?;
    let mut by: BTreeMap<String, Series> = BTreeMap::new();
    let mut totals = UsageTotals::default();
    for r in &rows {
        let (id, label) = match group_by.as_str() {
            "key" => (
                r.key_id.to_string(),
                keys.iter()
                    .find(|k| k.id == r.key_id)
                    .map_or_else(|| format!("key {}", r.key_id), |k| k.name.clone()),
            ),
            "account" => match r.account_id {
                Some(a) => (
                    a.to_string(),
                    label_of(&accounts, a).unwrap_or_else(|| format!("account {a}")),
                ),
                None => ("none".into(), "(no account)".into()),
            },
            _ => (r.model.clone(), r.model.clone()),
        };
        let s = by.entry(id.clone()).or_insert_with(|| Series {
            id,
            label,
            requests: vec![0; n],
            tokens: vec![0; n],
            errors: vec![0; n],
            totals: UsageTotals::default(),
        });
        let Ok(i) = usize::try_from((r.bucket_ms - first) / bucket) else {
            continue;
        };
        if i >= n {
            continue;
        }
        s.requests[i] += r.totals.requests;
        s.tokens[i] += r.totals.input_tokens + r.totals.output_tokens;
        s.errors[i] += r.totals.errors;
        s.totals.add(&r.totals);
        totals.add(&r.totals);
    }
    let mut series: Vec<Series> = by.into_values().collect();
    series.sort_by_key(|s| std::cmp::Reverse(s.totals.requests));
    Ok(Json(SeriesView {
        object: "usage_series",
        group_by,
        bucket_ms: bucket,
        since_ms: since,
        until_ms: until,
        buckets,
        series,
        totals,
    }))
}

/// A failed request with names resolved.
#[derive(Debug, Serialize)]
pub(crate) struct FailureView {
    #[serde(flatten)]
    entry: UsageEntry,
    key_name: Option<String>,
    account_label: Option<String>,
}

async fn get_failures(State(core): State<AppState>, Query(q): Q) -> ApiResult<List<FailureView>> {
    let limit = int(&q, "limit")?.unwrap_or(50).clamp(1, 500);
    let rows = core
        .storage
        .recent_failures(u32::try_from(limit).unwrap_or(50))
        .await?;
    let keys = core.storage.list_keys().await?;
    let accounts = core.storage.list_accounts().await?;
    Ok(Json(List::of(
        rows.into_iter()
            .map(|e| FailureView {
                key_name: keys
                    .iter()
                    .find(|k| k.id == e.key_id)
                    .map(|k| k.name.clone()),
                account_label: e.account_id.and_then(|a| label_of(&accounts, a)),
                entry: e,
            })
            .collect(),
    )))
}
