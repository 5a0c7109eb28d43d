//! Keeping the pool clean (issue 27).
//!
//! - `POST /api/admin/auto-clean/run` `{"dry_run"?}` -> what auto-clean did (or would do) now
//!   with the stored settings (`crate::clean`); off (`auto_clean_after_hours` unset) it does
//!   nothing and says so (`enabled: false`).
//! - `POST /api/admin/accounts/test` `{"ids":[..],"model"?,"concurrency"?}` -> one minimal
//!   request per account straight to the upstream (`crate::batch`: never through the data
//!   plane, never charged to a client key); `model` defaults to [`DEFAULT_TEST_MODEL`],
//!   `concurrency` to 4 (1..=32); results in the order of `ids`.
//!
//! Each call is one audit entry listing the accounts it acted on (`crate::audit::Affected`):
//! the ones cleaned (none for a dry run), the ones tested.

use std::sync::Arc;

use axum::{body::Bytes, extract::State, routing::post, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_body, ApiError};
use crate::{
    audit::{Affected, Audited},
    services::Pool,
};

/// The model a batch test asks for when none is given.
pub const DEFAULT_TEST_MODEL: &str = "gpt-5.5";

pub(super) fn routes(pool: Arc<Pool>) -> Router {
    Router::new()
        .route("/auto-clean/run", post(auto_clean))
        .route("/accounts/test", post(test_accounts))
        .with_state(pool)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CleanRequest {
    #[serde(default)]
    dry_run: bool,
}

async fn auto_clean(
    State(pool): State<Arc<Pool>>,
    body: Bytes,
) -> Result<Audited<crate::clean::Pass>, ApiError> {
    let req: CleanRequest = parse_body(&body)?;
    let pass = crate::clean::run_once(&pool.store, req.dry_run).await?;
    let ids = if pass.dry_run {
        Vec::new()
    } else {
        pass.cleaned.iter().map(|c| c.id).collect()
    };
    Ok(Affected::of("account", ids).with(pass))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestRequest {
    #[serde(default)]
    ids: Vec<i64>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    concurrency: Option<usize>,
}

async fn test_accounts(
    State(pool): State<Arc<Pool>>,
    body: Bytes,
) -> Result<Audited<Value>, ApiError> {
    let req: TestRequest = parse_body(&body)?;
    if req.ids.is_empty() {
        return Err(
            ApiError::bad_request("\"ids\": give at least one account id").with_param("ids"),
        );
    }
    if req.ids.len() > crate::batch::MAX_ACCOUNTS {
        return Err(ApiError::bad_request(format!(
            "\"ids\": at most {} accounts per batch",
            crate::batch::MAX_ACCOUNTS
        ))
        .with_param("ids"));
    }
    let concurrency = req.concurrency.unwrap_or(4);
    if !(1..=crate::batch::MAX_CONCURRENCY).contains(&concurrency) {
        return Err(ApiError::bad_request(format!(
            "\"concurrency\" is 1..={}",
            crate::batch::MAX_CONCURRENCY
        ))
        .with_param("concurrency"));
    }
    let model = req
        .model
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or(DEFAULT_TEST_MODEL)
        .to_owned();
    let results = crate::batch::test_accounts(&pool, &req.ids, &model, concurrency).await;
    let ok = results.iter().filter(|r| r.ok).count();
    Ok(
        Affected::of("account", req.ids.iter().copied()).with(json!({
            "object": "account_test",
            "model": model,
            "concurrency": concurrency,
            "succeeded": ok,
            "failed": results.len() - ok,
            "results": results,
        })),
    )
}
