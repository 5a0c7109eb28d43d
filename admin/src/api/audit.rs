//! The audit log of admin actions (`crate::audit` records it).
//!
//! - `GET /api/admin/audit?actor=&action=&object_type=&object_id=&from=&to=&before_id=&limit=`
//!   -> newest first (`actor`: contains; `action`: prefix, `accounts` matches
//!   `accounts.disable`; `object_type`/`object_id`: exact; `from`/`to`:
//!   Unix ms or RFC 3339; `before_id` pages backwards; `limit` 1..=1000, default 200), with
//!   `details`, `before` and `after` as JSON (already redacted when stored).
//! - `GET /api/admin/audit/export.csv` with the same filters: every matching entry, newest
//!   first, as CSV (cells quoted, formulas defused).

use std::{collections::HashMap, sync::Arc};

use axum::{
    extract::{Query, State},
    http::header,
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde_json::{json, Value};

use super::{ApiError, ApiResult, List};
use crate::storage::{
    audit::{AuditFilter, AuditRow},
    Storage,
};

pub(super) fn routes(storage: Arc<dyn Storage>) -> Router {
    Router::new()
        .route("/audit", get(list))
        .route("/audit/export.csv", get(export_csv))
        .with_state(storage)
}

/// Most entries one page lists.
const PAGE_MAX: u32 = 1000;
/// Entries per storage read of the export.
const EXPORT_PAGE: u32 = 1000;

type Q = Query<HashMap<String, String>>;

fn text(q: &HashMap<String, String>, k: &str) -> Option<String> {
    q.get(k)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn instant(q: &HashMap<String, String>, k: &str) -> Result<Option<i64>, ApiError> {
    let Some(v) = text(q, k) else {
        return Ok(None);
    };
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(Some(ms));
    }
    time::OffsetDateTime::parse(&v, &time::format_description::well_known::Rfc3339)
        .map(|t| Some(i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)))
        .map_err(|_| {
            ApiError::bad_request(format!(
                "{k} must be Unix milliseconds or an RFC 3339 time, got {v:?}"
            ))
            .with_param(k)
        })
}

fn filter_of(q: &HashMap<String, String>) -> Result<AuditFilter, ApiError> {
    let before_id = match text(q, "before_id") {
        None => None,
        Some(v) => Some(v.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!("before_id must be an integer, got {v:?}"))
                .with_param("before_id")
        })?),
    };
    Ok(AuditFilter {
        actor: text(q, "actor"),
        action: text(q, "action"),
        object_type: text(q, "object_type"),
        object_id: text(q, "object_id"),
        since_ms: instant(q, "from")?,
        until_ms: instant(q, "to")?,
        before_id,
    })
}

fn parsed(s: &Option<String>) -> Value {
    s.as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

fn view(r: &AuditRow) -> Value {
    let e = &r.entry;
    json!({
        "id": r.id,
        "object": "audit_entry",
        "at": e.at_ms,
        "actor": e.actor,
        "source": e.source,
        "action": e.action,
        "object_type": e.object_type,
        "object_id": e.object_id,
        "status": e.status,
        "details": parsed(&e.details),
        "before": parsed(&e.before),
        "after": parsed(&e.after),
    })
}

async fn list(State(storage): State<Arc<dyn Storage>>, Query(q): Q) -> ApiResult<List<Value>> {
    let f = filter_of(&q)?;
    let limit = match text(&q, "limit") {
        None => 200,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit is 1..={PAGE_MAX}, got {v:?}"))
                    .with_param("limit")
            })?,
    };
    let rows = storage.audit().list_audit(&f, limit).await?;
    Ok(Json(List::of(rows.iter().map(view).collect())))
}

async fn export_csv(
    State(storage): State<Arc<dyn Storage>>,
    Query(q): Q,
) -> Result<Response, ApiError> {
    let mut f = filter_of(&q)?;
    let mut out = String::from(crate::audit::CSV_HEADER);
    loop {
        let rows = storage.audit().list_audit(&f, EXPORT_PAGE).await?;
        for r in &rows {
            crate::audit::csv_row(&mut out, r);
        }
        match rows.last() {
            Some(last) if rows.len() == EXPORT_PAGE as usize => f.before_id = Some(last.id),
            _ => break,
        }
    }
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"audit.csv\"",
            ),
        ],
        out,
    )
        .into_response())
}
