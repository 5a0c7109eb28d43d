//! The model catalog.
//!
//! - `GET /api/admin/models` -> the published catalog: `source` (`embedded` | `upstream`),
//!   sorted `slugs`, `aliases` (`{name: {target, effort}}`), per-`plans` fetch status,
//!   `last_attempt_at`, `last_published_at`, `refresh_interval_s`, `url`;
//! - `POST /api/admin/models/refresh` runs a refresh round now and answers the same view plus
//!   `outcome` (`plans`, `fetched`, `not_modified`, `failed`, `published`).

use axum::{
    extract::State,
    routing::{get, post},
    Json, Router,
};
use serde::Serialize;
use serde_json::{json, Value};

use super::{ApiResult, AppState};
use crate::services::Core;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/models", get(get_models))
        .route("/models/refresh", post(refresh_models))
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

fn models_view(core: &Core) -> ModelsView {
    let cat = core.models.catalog.load();
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
    let st = core.models.status();
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
        refresh_interval_s: core.models.interval.as_secs(),
        url: core.models.client.url().to_owned(),
        outcome: None,
    }
}

async fn get_models(State(core): State<AppState>) -> ApiResult<ModelsView> {
    Ok(Json(models_view(&core)))
}

async fn refresh_models(State(core): State<AppState>) -> ApiResult<ModelsView> {
    let outcome = core.refresh_models().await;
    let mut v = models_view(&core);
    v.outcome = Some(outcome);
    Ok(Json(v))
}
