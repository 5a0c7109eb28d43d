//! The model catalog.
//!
//! - `GET /api/admin/models` -> the published catalog: `source` (`embedded` | `upstream`),
//!   sorted `slugs`, `aliases` (`{name: {target, effort}}`), per-`plans` fetch status,
//!   `last_attempt_at`, `last_published_at`, `refresh_interval_s`, `url`;
//! - `POST /api/admin/models/refresh` runs a refresh round now and answers the same view plus
//!   `outcome` (`plans`, `fetched`, `not_modified`, `failed`, `published`).

use std::sync::Arc;

use axum::{
    extract::State,
    routing::{get, post},
    Json, Router,
};
use serde::Serialize;
use serde_json::{json, Value};

use super::ApiResult;
use crate::services::Catalog;

pub(super) fn routes(catalog: Arc<Catalog>) -> Router {
    Router::new()
        .route("/models", get(get_models))
        .route("/models/refresh", post(refresh_models))
        .with_state(catalog)
}

#[derive(Debug, Serialize)]
struct AliasView {
    target: String,
    effort: Option<String>,
}

/// The model catalog as the admin API shows it.
#[derive(Debug, Serialize)]
pub(crate) struct ModelsView {
    object: &'static str,
    source: &'static str,
    slugs: Vec<String>,
    aliases: std::collections::BTreeMap<String, AliasView>,
    plans: Value,
    last_attempt_at: Value,
    last_published_at: Value,
    refresh_interval_s: u64,
    url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<Value>,
}

fn models_view(catalog: &Catalog) -> ModelsView {
    let cat = catalog.refresher.catalog.load();
    let mut slugs: Vec<String> = cat.models.keys().cloned().collect();
    slugs.sort_unstable();
    let aliases = cat
        .aliases
        .iter()
        .map(|(k, a)| {
            (
                k.clone(),
                AliasView {
                    target: a.target.to_string(),
                    effort: a.effort.as_ref().map(|e| e.to_string()),
                },
            )
        })
        .collect();
    let st = catalog.refresher.status();
    ModelsView {
        object: "model_catalog",
        source: match cat.source {
            shared_state::catalog::CatalogSource::Embedded => "embedded",
            shared_state::catalog::CatalogSource::Upstream => "upstream",
        },
        slugs,
        aliases,
        plans: json!(st.plans),
        last_attempt_at: json!(st.last_attempt_at),
        last_published_at: json!(st.last_published_at),
        refresh_interval_s: catalog.refresher.interval.as_secs(),
        url: catalog.refresher.client.url().to_owned(),
        outcome: None,
    }
}

async fn get_models(State(catalog): State<Arc<Catalog>>) -> ApiResult<ModelsView> {
    Ok(Json(models_view(&catalog)))
}

async fn refresh_models(State(catalog): State<Arc<Catalog>>) -> ApiResult<ModelsView> {
    let outcome = catalog.refresh_now().await;
    let mut v = models_view(&catalog);
    v.outcome = Some(outcome);
    Ok(Json(v))
}
