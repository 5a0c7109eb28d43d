//! Usage: totals, time series and recent failures, from the stored usage records.
//!
//! - `GET /api/admin/usage?since_ms=&until_ms=&key_id=&account_id=` -> `totals`, `by_key` and
//!   `by_account` (requests, input/cached/output/reasoning tokens, errors);
//! - `GET /api/admin/usage/series?since_ms=&until_ms=&bucket_ms=&group_by=model|key|account&key_id=&account_id=`
//!   -> [`SeriesView`]: contiguous buckets (default: the last 24 hours in 5-minute buckets; at
//!   most 2,000 buckets) and one series per model, key or account, each with requests, tokens
//!   (input + output) and errors per bucket;
//! - `GET /api/admin/failures?limit=` -> the newest failed requests (status >= 400 or an error
//!   code), newest first, with the key name, account label, failure class and request id;
//! - `GET /api/admin/usage/records?request_id=` -> the stored records of one gateway request
//!   id (the `x-request-id` a client got; a client's own id may repeat), every field, with
//!   the key name and account label: "which request was that?";
//! - `GET /api/admin/usage/export.csv?from=&to=&group_by=&key_id=&account_id=` -> CSV
//!   (`from`/`to`: Unix ms or RFC 3339, `[from, to)`): `group_by` absent or `record`: every
//!   raw record with every field, streamed page by page; `hour`: the hourly rollups (one row
//!   per hour, key, account, model whose hour starts in the window); `key`, `account` or
//!   `model`: the rollups of the window summed per group. Raw records end with their
//!   `request_id`. Text cells that a spreadsheet would
//!   run as a formula (`=`, `+`, `-`, `@` first) get a leading `'`.

use std::collections::{BTreeMap, HashMap};

use axum::{
    extract::{Query, State},
    routing::get,
    Json, Router,
};
use serde::Serialize;

use super::{ApiError, ApiResult, List};
use crate::{
    csv::{cell, rfc3339},
    services::Store,
    storage::{AccountRow, UsageEntry, UsageFilter, UsageTotals},
};

pub(super) fn routes(store: Store) -> Router {
    Router::new()
        .route("/usage", get(get_usage))
        .route("/usage/series", get(get_series))
        .route("/failures", get(get_failures))
        .route("/usage/records", get(get_records))
        .route("/usage/export.csv", get(export_csv))
        .with_state(store)
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

async fn get_usage(State(store): State<Store>, Query(q): Q) -> ApiResult<UsageView> {
    let filter = filter_of(&q)?;
    let sum = store.storage.usage_summary(filter).await?;
    let keys = store.storage.list_keys().await?;
    let accounts = store.storage.list_accounts().await?;
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

async fn get_series(State(store): State<Store>, Query(q): Q) -> ApiResult<SeriesView> {
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
    let rows = store.storage.usage_buckets(filter, bucket).await?;
    let first = (since / bucket) * bucket;
    let n = usize::try_from((until - 1 - first) / bucket + 1).unwrap_or(1);
    let buckets: Vec<i64> = (0..n).map(|i| first + bucket * i as i64).collect();
    let keys = store.storage.list_keys().await?;
    let accounts = store.storage.list_accounts().await?;
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

async fn get_failures(State(store): State<Store>, Query(q): Q) -> ApiResult<List<FailureView>> {
    let limit = int(&q, "limit")?.unwrap_or(50).clamp(1, 500);
    let rows = store
        .storage
        .recent_failures(u32::try_from(limit).unwrap_or(50))
        .await?;
    let keys = store.storage.list_keys().await?;
    let accounts = store.storage.list_accounts().await?;
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

/// A stored record with names resolved ([`get_records`]).
#[derive(Debug, Serialize)]
pub(crate) struct RecordView {
    #[serde(flatten)]
    row: crate::storage::UsageRow,
    key_name: Option<String>,
    account_label: Option<String>,
}

/// Most records answered for one request id.
const RECORDS_PER_ID: u32 = 100;

async fn get_records(State(store): State<Store>, Query(q): Q) -> ApiResult<List<RecordView>> {
    let id = q.get("request_id").map(|v| v.trim()).unwrap_or("");
    // The gateway keeps only ids of this shape (`gateway::request_id::is_valid`): anything
    // else cannot match and is a typo.
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if !valid {
        return Err(ApiError::bad_request(
            "request_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -",
        )
        .with_param("request_id"));
    }
    let rows = store
        .storage
        .usage_by_request_id(id, RECORDS_PER_ID)
        .await?;
    let names = Names::load(&store).await?;
    Ok(Json(List::of(
        rows.into_iter()
            .map(|row| RecordView {
                key_name: names.keys.get(&row.key_id).cloned(),
                account_label: row.account_id.and_then(|a| names.accounts.get(&a).cloned()),
                row,
            })
            .collect(),
    )))
}

// === CSV export ===

/// Raw records per page of the streamed export.
const CSV_PAGE: u32 = 2_000;

/// `from` / `to`: Unix ms, or an RFC 3339 time.
fn instant(q: &HashMap<String, String>, k: &str) -> Result<Option<i64>, ApiError> {
    let Some(v) = q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(Some(ms));
    }
    time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
        .map(|t| Some(i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)))
        .map_err(|_| {
            ApiError::bad_request(format!(
                "{k} must be Unix milliseconds or an RFC 3339 time, got {v:?}"
            ))
            .with_param(k)
        })
}

/// USD micros as a decimal dollar amount with all six places (`1.250000`), exact.
fn usd(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// One CSV line of cells (`None`: a text cell, escaped).
fn line(out: &mut String, cells: &[Result<String, &str>]) {
    for (i, c) in cells.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match c {
            Ok(n) => out.push_str(n),
            Err(t) => cell(out, t),
        }
    }
    out.push_str("\r\n");
}

const RECORD_HEADER: &str = "id,record_id,started_at,started_at_ms,key_id,key_name,account_id,\
account_label,route,model,reasoning_effort,service_tier,transport,status,stream,input_tokens,\
cached_tokens,output_tokens,reasoning_tokens,ttfb_ms,ttft_ms,latency_ms,failovers,error_code,\
error_class,cost_usd,cost_micros,request_id\r\n";

const ROLLUP_HEADER: &str = "hour,hour_ms,key_id,key_name,account_id,account_label,model,\
requests,errors,input_tokens,cached_tokens,output_tokens,reasoning_tokens,failovers,\
latency_ms_sum,cost_usd,cost_micros\r\n";

/// Names for ids: key names and account labels, read once per export.
struct Names {
    keys: HashMap<i64, String>,
    accounts: HashMap<i64, String>,
}

// === impl Names ===

impl Names {
    async fn load(store: &Store) -> Result<Self, ApiError> {
        let keys = store.storage.list_keys().await?;
        let accounts = store.storage.list_accounts().await?;
        Ok(Self {
            keys: keys.into_iter().map(|k| (k.id, k.name)).collect(),
            accounts: accounts.iter().map(|a| (a.id, a.label())).collect(),
        })
    }

    fn key(&self, id: i64) -> &str {
        self.keys.get(&id).map_or("", String::as_str)
    }

    fn account(&self, id: Option<i64>) -> &str {
        id.and_then(|id| self.accounts.get(&id))
            .map_or("", String::as_str)
    }
}

fn record_line(out: &mut String, r: &crate::storage::UsageRow, names: &Names) {
    let n = |v: i64| Ok(v.to_string());
    line(
        out,
        &[
            n(r.id),
            Err(r.record_id.as_deref().unwrap_or("")),
            Ok(rfc3339(r.started_at_ms)),
            n(r.started_at_ms),
            n(r.key_id),
            Err(names.key(r.key_id)),
            Ok(opt(r.account_id)),
            Err(names.account(r.account_id)),
            Err(&r.route),
            Err(&r.model),
            Err(r.reasoning_effort.as_deref().unwrap_or("")),
            Err(r.service_tier.as_deref().unwrap_or("")),
            Err(r.transport.as_deref().unwrap_or("")),
            n(r.status),
            Ok(r.stream.to_string()),
            n(r.input_tokens),
            n(r.cached_tokens),
            n(r.output_tokens),
            n(r.reasoning_tokens),
            Ok(opt(r.ttfb_ms)),
            Ok(opt(r.ttft_ms)),
            n(r.latency_ms),
            n(r.failovers),
            Err(r.error_code.as_deref().unwrap_or("")),
            Err(r.error_class.as_deref().unwrap_or("")),
            Ok(usd(u64::try_from(r.cost_micros).unwrap_or(0))),
            n(r.cost_micros),
            Err(r.request_id.as_deref().unwrap_or("")),
        ],
    );
}

fn rollup_line(
    out: &mut String,
    hour: Option<i64>,
    r: &crate::storage::UsageRollup,
    names: &Names,
    group: &str,
) {
    let n = |v: u64| Ok(v.to_string());
    let all = group == "hour";
    line(
        out,
        &[
            Ok(hour.map(rfc3339).unwrap_or_default()),
            Ok(opt(hour)),
            Ok(if all || group == "key" {
                r.key_id.to_string()
            } else {
                String::new()
            }),
            Err(if all || group == "key" {
                names.key(r.key_id)
            } else {
                ""
            }),
            Ok(if all || group == "account" {
                opt(r.account_id)
            } else {
                String::new()
            }),
            Err(if all || group == "account" {
                names.account(r.account_id)
            } else {
                ""
            }),
            Err(if all || group == "model" {
                &r.model
            } else {
                ""
            }),
            n(r.totals.requests),
            n(r.totals.errors),
            n(r.totals.input_tokens),
            n(r.totals.cached_tokens),
            n(r.totals.output_tokens),
            n(r.totals.reasoning_tokens),
            n(r.failovers),
            n(r.latency_ms_sum),
            Ok(usd(r.cost_micros)),
            n(r.cost_micros),
        ],
    );
}

async fn export_csv(
    State(store): State<Store>,
    Query(q): Q,
) -> Result<axum::response::Response, ApiError> {
    use axum::{body::Body, http::header, response::IntoResponse};
    let filter = UsageFilter {
        since_ms: instant(&q, "from")?,
        until_ms: instant(&q, "to")?,
        key_id: int(&q, "key_id")?,
        account_id: int(&q, "account_id")?,
    };
    if let (Some(a), Some(b)) = (filter.since_ms, filter.until_ms) {
        if a >= b {
            return Err(ApiError::bad_request("from must be before to").with_param("from"));
        }
    }
    let group = q
        .get("group_by")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or("record")
        .to_owned();
    let names = Names::load(&store).await?;
    let headers = [
        (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
        (
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"usage-{group}.csv\""),
        ),
    ];
    match group.as_str() {
        "record" => {
            // Streamed page by page: an export of millions of rows never sits in memory.
            struct Page {
                store: Store,
                names: Names,
                filter: UsageFilter,
                after: i64,
                header: bool,
                done: bool,
            }
            let first = Page {
                store,
                names,
                filter,
                after: 0,
                header: true,
                done: false,
            };
            let stream = futures_util::stream::unfold(first, |mut p| async move {
                if p.done {
                    return None;
                }
                let mut out = String::new();
                if p.header {
                    p.header = false;
                    out.push_str(RECORD_HEADER);
                }
                match p
                    .store
                    .storage
                    .usage_rows(p.filter, p.after, CSV_PAGE)
                    .await
                {
                    Ok(rows) => {
                        if rows.len() < CSV_PAGE as usize {
                            p.done = true;
                        }
                        for r in &rows {
                            record_line(&mut out, r, &p.names);
                        }
                        if let Some(last) = rows.last() {
                            p.after = last.id;
                        }
                        Some((Ok::<_, std::io::Error>(out), p))
                    }
                    Err(e) => {
                        // The status is already sent: cut the body so the client sees an
                        // incomplete download rather than a silently short file.
                        tracing::warn!(error = %e, "usage export failed mid-way");
                        Some((
                            Err(std::io::Error::other("usage export failed")),
                            Page { done: true, ..p },
                        ))
                    }
                }
            });
            Ok((headers, Body::from_stream(stream)).into_response())
        }
        "hour" | "key" | "account" | "model" => {
            let rows = store.storage.usage_rollups(filter).await?;
            let mut out = String::from(ROLLUP_HEADER);
            if group == "hour" {
                for r in &rows {
                    rollup_line(&mut out, Some(r.hour_ms), r, &names, "hour");
                }
            } else {
                let mut by: BTreeMap<(i64, Option<i64>, String), crate::storage::UsageRollup> =
                    BTreeMap::new();
                for r in rows {
                    let k = match group.as_str() {
                        "key" => (r.key_id, None, String::new()),
                        "account" => (0, r.account_id, String::new()),
                        _ => (0, None, r.model.clone()),
                    };
                    let e = by.entry(k).or_insert_with(|| crate::storage::UsageRollup {
                        totals: UsageTotals::default(),
                        failovers: 0,
                        latency_ms_sum: 0,
                        cost_micros: 0,
                        ..r.clone()
                    });
                    e.totals.add(&r.totals);
                    e.failovers += r.failovers;
                    e.latency_ms_sum += r.latency_ms_sum;
                    e.cost_micros += r.cost_micros;
                }
                for r in by.values() {
                    rollup_line(&mut out, None, r, &names, &group);
                }
            }
            Ok((headers, out).into_response())
        }
        _ => Err(
            ApiError::bad_request("group_by must be record, hour, key, account or model")
                .with_param("group_by"),
        ),
    }
}
