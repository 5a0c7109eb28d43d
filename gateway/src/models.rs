//! Model resolution and `/v1/models`, over the published catalog
//! ([`shared_state::catalog::ModelCatalog`]): the OpenAI list shape by default and the Codex
//! `{"models":[...]}` shape when the client sends `client_version` (Codex CLI does).
//!
//! # Key Components
//! - [`choose`]: alias -> slug (+ effort), known slug -> keep, unknown -> reject when the
//!   catalog came from the upstream (or `strict_models`), else pass through.

use codex_protocol::normalize::ModelChoice;
use shared_state::catalog::{CatalogSource, ModelCatalog};

/// The model list body.
pub fn list(catalog: &ModelCatalog, codex_shape: bool) -> Vec<u8> {
    if codex_shape {
        catalog.codex_body.clone()
    } else {
        catalog.openai_body.clone()
    }
}

/// What to do with a requested model.
pub fn choose(catalog: &ModelCatalog, strict: bool, requested: &str) -> ModelChoice {
    match catalog.resolve(requested) {
        Some(r) if r.slug == requested && r.effort.is_none() => ModelChoice::Keep,
        Some(r) => ModelChoice::Rewrite {
            slug: r.slug.to_owned(),
            effort: r.effort.map(str::to_owned),
        },
        None if strict || catalog.source == CatalogSource::Upstream => ModelChoice::Reject,
        None => ModelChoice::Keep,
    }
}
