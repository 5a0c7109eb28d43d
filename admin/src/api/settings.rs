//! Runtime settings, hot-applied.
//!
//! - `GET /api/admin/settings` -> the effective settings (flat), `defaults` (the configured
//!   values) and the `overridden` keys;
//! - `PUT /api/admin/settings` with any subset of the keys (`null` resets a key to its
//!   configured default). The change is validated as a whole: one bad value refuses all of it,
//!   with a 400 whose `error.param` names the first bad key and `error.errors` maps **every**
//!   bad key to its reason (the web app shows them inline). A valid change is stored and
//!   published before the answer: the next request on any worker uses it.

use std::collections::BTreeMap;

use axum::{body::Bytes, extract::State, routing::get, Json, Router};
use serde_json::{json, Map, Value};

use super::{parse_body, ApiError, ApiResult};
use crate::{services::Store, settings::SettingError};

pub(super) fn routes(store: Store) -> Router {
    Router::new()
        .route("/settings", get(get_settings).put(put_settings))
        .with_state(store)
}

/// Keys of the settings view that are not settings (so a GET body can be PUT back).
const SETTINGS_META: &[&str] = &["object", "defaults", "overridden"];

async fn settings_view(store: &Store) -> Result<Map<String, Value>, ApiError> {
    let stored = store.storage.load_settings().await?;
    let defaults = store.publisher.defaults();
    let (effective, _) = crate::settings::effective(defaults, &stored);
    let mut out = crate::settings::to_json(&effective);
    out.extend(crate::settings::sidecar_json(&crate::settings::sidecar(
        &stored,
    )));
    let overridden: Vec<&str> = crate::settings::KEYS
        .iter()
        .copied()
        .filter(|k| stored.iter().any(|(s, _)| s == k))
        .collect();
    out.insert("object".into(), json!("settings"));
    let mut defaults = crate::settings::to_json(defaults);
    defaults.extend(crate::settings::sidecar_json(
        &crate::settings::SidecarSettings::default(),
    ));
    out.insert("defaults".into(), Value::Object(defaults));
    out.insert("overridden".into(), json!(overridden));
    Ok(out)
}

async fn get_settings(State(store): State<Store>) -> ApiResult<Map<String, Value>> {
    Ok(Json(settings_view(&store).await?))
}

async fn put_settings(State(store): State<Store>, body: Bytes) -> ApiResult<Map<String, Value>> {
    let v: Value = parse_body(&body)?;
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad_request(
            "the body must be a JSON object of settings",
        ));
    };
    let mut changes = Vec::new();
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    let mut first: Option<SettingError> = None;
    for (k, val) in obj {
        if SETTINGS_META.contains(&k.as_str()) {
            continue;
        }
        match crate::settings::text_from_json(k, val) {
            Ok(text) => changes.push((k.clone(), text)),
            Err(e) => {
                errors.insert(k.clone(), e.to_string());
                first.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first {
        let mut err = ApiError::from(e);
        if errors.len() > 1 {
            err.message = format!("{} invalid settings: {}", errors.len(), err.message);
        }
        err.extra().details = Some(json!(errors));
        return Err(err);
    }
    if changes.is_empty() {
        return Err(ApiError::bad_request(format!(
            "nothing to change: give any of {}",
            crate::settings::KEYS.join(", ")
        )));
    }
    store.storage.write_settings(&changes).await?;
    store.reload().await?;
    tracing::info!(keys = ?changes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), "settings changed through the admin API");
    Ok(Json(settings_view(&store).await?))
}
