//! The model catalog the data plane serves and validates against: the Codex `/models` shape
//! (`{"models":[...]}`), rendered once per publish in both client shapes, plus aliases.
//!
//! # Key Components
//! - [`ModelCatalog`]: slugs with their reasoning levels, pre-rendered bodies for
//!   `GET /v1/models` (OpenAI list shape and Codex shape), aliases, and where it came from;
//!   [`ModelCatalog::list_for`] / [`ModelCatalog::model_for`]: what one caller (a key with a
//!   model allow-list) sees.
//! - [`SharedCatalog`]: the `ArcSwap` cell; the sidecar replaces it after a refresh from the
//!   upstream, workers `load()` it per request.
//! - [`ModelCatalog::embedded`]: the fallback shipped in the binary (Codex CLI 0.171 catalog).
//!
//! # Error handling
//! A body that is not a Codex catalog is a [`CatalogError`]; the sidecar keeps the last good
//! catalog.

use std::{collections::HashMap, sync::Arc};

use arc_swap::ArcSwap;
use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait};

/// The catalog bundled with the Codex CLI 0.171.0 (`base_instructions` stripped).
pub const EMBEDDED_CATALOG: &str = include_str!("../catalog/codex-models-catalog.json");

/// The cell through which the sidecar publishes catalogs.
pub type SharedCatalog = Arc<ArcSwap<ModelCatalog>>;

/// Where a catalog came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogSource {
    /// Shipped in the binary.
    Embedded,
    /// Fetched from the upstream `/models`.
    Upstream,
}

/// An alias: a client-facing model name mapped to an upstream slug, optionally with a
/// reasoning effort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAlias {
    /// Upstream slug.
    pub target: String,
    /// Reasoning effort to apply (`low`, `high`, ...).
    pub effort: Option<String>,
}

/// One model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// Reasoning efforts the model accepts.
    pub reasoning_levels: Vec<String>,
}

/// A published catalog.
#[derive(Debug, Clone)]
pub struct ModelCatalog {
    /// Where it came from.
    pub source: CatalogSource,
    /// Models by slug.
    pub models: HashMap<String, ModelInfo>,
    /// Aliases by client-facing name.
    pub aliases: HashMap<String, ModelAlias>,
    /// `{"object":"list","data":[...]}` (models and aliases).
    pub openai_body: Vec<u8>,
    /// `{"models":[...]}` with `base_instructions`/`model_messages` stripped.
    pub codex_body: Vec<u8>,
    /// The entries of `openai_body`, in order: (id, the entry's JSON), for a key's view.
    openai_entries: Vec<(String, Vec<u8>)>,
    /// The entries of `codex_body`, in order: (slug, the entry's JSON), for a key's view.
    codex_entries: Vec<(String, Vec<u8>)>,
}

/// The body is not a Codex catalog.
#[derive(Debug, thiserror::Error)]
#[error("not a Codex model catalog: {0}")]
pub struct CatalogError(pub String);

/// What a requested model resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved<'a> {
    /// The upstream slug.
    pub slug: &'a str,
    /// Reasoning effort forced by an alias.
    pub effort: Option<&'a str>,
    /// Reasoning levels the model accepts (empty when unknown).
    pub levels: &'a [String],
}

// === impl ModelCatalog ===

impl ModelCatalog {
    /// The embedded fallback catalog with `aliases`.
    pub fn embedded(aliases: HashMap<String, ModelAlias>) -> Self {
        Self::from_codex_json(
            EMBEDDED_CATALOG.as_bytes(),
            CatalogSource::Embedded,
            aliases,
        )
        .unwrap_or_else(|_| Self::empty(aliases_default()))
    }

    /// An empty catalog (every model unknown).
    pub fn empty(aliases: HashMap<String, ModelAlias>) -> Self {
        Self::render(CatalogSource::Embedded, Vec::new(), aliases)
    }

    /// Parses one or more Codex `/models` bodies (e.g. one per plan) into a merged catalog.
    pub fn from_codex_json(
        raw: &[u8],
        source: CatalogSource,
        aliases: HashMap<String, ModelAlias>,
    ) -> Result<Self, CatalogError> {
        Self::merge_codex_json(&[raw], source, aliases)
    }

    /// Merges several Codex `/models` bodies (union by slug, first wins).
    pub fn merge_codex_json(
        raws: &[&[u8]],
        source: CatalogSource,
        aliases: HashMap<String, ModelAlias>,
    ) -> Result<Self, CatalogError> {
        let mut models: Vec<sonic_rs::Value> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for raw in raws {
            let mut v: sonic_rs::Value =
                sonic_rs::from_slice(raw).map_err(|e| CatalogError(e.to_string()))?;
            let list = v
                .get_mut("models")
                .and_then(|m| m.as_array_mut())
                .ok_or_else(|| CatalogError("no `models` array".into()))?;
            for m in list.iter_mut() {
                let Some(slug) = m.get("slug").and_then(|s| s.as_str()).map(str::to_owned) else {
                    continue;
                };
                if !seen.insert(slug) {
                    continue;
                }
                if let Some(o) = m.as_object_mut() {
                    o.remove(&"base_instructions");
                    o.remove(&"model_messages");
                }
                models.push(m.clone());
            }
        }
        Ok(Self::render(source, models, aliases))
    }

    fn render(
        source: CatalogSource,
        models: Vec<sonic_rs::Value>,
        aliases: HashMap<String, ModelAlias>,
    ) -> Self {
        let mut infos = HashMap::with_capacity(models.len());
        let mut data = sonic_rs::Array::new();
        let mut codex = sonic_rs::Array::new();
        let mut openai_entries = Vec::new();
        let mut codex_entries = Vec::new();
        for m in models {
            let Some(slug) = m.get("slug").and_then(|s| s.as_str()).map(str::to_owned) else {
                continue;
            };
            let levels = m
                .get("supported_reasoning_levels")
                .and_then(|l| l.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.get("effort").and_then(|e| e.as_str()).map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let entry = openai_entry(&slug, "openai");
            openai_entries.push((slug.clone(), sonic_rs::to_vec(&entry).unwrap_or_default()));
            data.push(entry);
            codex_entries.push((slug.clone(), sonic_rs::to_vec(&m).unwrap_or_default()));
            infos.insert(
                slug,
                ModelInfo {
                    reasoning_levels: levels,
                },
            );
            codex.push(m);
        }
        // Prefix aliases (`claude-*`) are patterns, not model names: not listed.
        let mut names: Vec<&String> = aliases.keys().filter(|a| !a.ends_with('*')).collect();
        names.sort();
        for a in names {
            let entry = openai_entry(a, "codex-gateway");
            openai_entries.push((a.clone(), sonic_rs::to_vec(&entry).unwrap_or_default()));
            data.push(entry);
        }
        let openai_body = sonic_rs::to_vec(&sonic_rs::json!({"object": "list", "data": data}))
            .unwrap_or_default();
        let codex_body = sonic_rs::to_vec(&sonic_rs::json!({"models": codex})).unwrap_or_default();
        Self {
            source,
            models: infos,
            aliases,
            openai_body,
            codex_body,
            openai_entries,
            codex_entries,
        }
    }

    /// The `/v1/models` body (OpenAI list, or the Codex shape) as a caller sees it: only the
    /// entries `visible` allows (a key's model allow-list). The pre-rendered body when every
    /// entry is visible.
    pub fn list_for(&self, codex_shape: bool, visible: impl Fn(&str) -> bool) -> Vec<u8> {
        let (entries, whole) = if codex_shape {
            (&self.codex_entries, &self.codex_body)
        } else {
            (&self.openai_entries, &self.openai_body)
        };
        if entries.iter().all(|(id, _)| visible(id)) {
            return whole.clone();
        }
        let mut out = Vec::with_capacity(whole.len());
        out.extend_from_slice(if codex_shape {
            b"{\"models\":["
        } else {
            b"{\"object\":\"list\",\"data\":["
        });
        let mut first = true;
        for (_, e) in entries.iter().filter(|(id, _)| visible(id)) {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(e);
        }
        out.extend_from_slice(b"]}");
        out
    }

    /// `GET /v1/models/{id}`: the model's OpenAI object when `id` is a listed model or alias,
    /// or a name a prefix alias maps (`claude-sonnet-4-5` under `claude-*`; the pattern
    /// itself is no model), that `visible` allows; `None` (a 404) otherwise.
    pub fn model_for(&self, id: &str, visible: impl Fn(&str) -> bool) -> Option<Vec<u8>> {
        if !visible(id) {
            return None;
        }
        if let Some((_, e)) = self.openai_entries.iter().find(|(m, _)| m == id) {
            return Some(e.clone());
        }
        if id.ends_with('*') || self.resolve(id).is_none() {
            return None;
        }
        sonic_rs::to_vec(&openai_entry(id, "codex-gateway")).ok()
    }

    /// Resolves a requested model: an alias, else a known slug, else the longest prefix
    /// alias (a name ending in `*`, e.g. `claude-*`, matching every name that starts with
    /// the part before the `*`); `None` when unknown.
    pub fn resolve<'a>(&'a self, requested: &'a str) -> Option<Resolved<'a>> {
        let alias = |a: &'a ModelAlias| {
            let levels = self
                .models
                .get(&a.target)
                .map_or(&[][..], |m| m.reasoning_levels.as_slice());
            Resolved {
                slug: &a.target,
                effort: a.effort.as_deref(),
                levels,
            }
        };
        if let Some(a) = self.aliases.get(requested) {
            return Some(alias(a));
        }
        if let Some(m) = self.models.get(requested) {
            return Some(Resolved {
                slug: requested,
                effort: None,
                levels: &m.reasoning_levels,
            });
        }
        self.aliases
            .iter()
            .filter_map(|(k, a)| Some((k.strip_suffix('*')?, a)))
            .filter(|(prefix, _)| requested.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, a)| alias(a))
    }

    /// Creates the shared cell holding `self`.
    pub fn shared(self) -> SharedCatalog {
        Arc::new(ArcSwap::from_pointee(self))
    }
}

/// One model in OpenAI's list shape.
fn openai_entry(id: &str, owned_by: &str) -> sonic_rs::Value {
    sonic_rs::json!({"id": id, "object": "model", "created": 1_700_000_000u64, "owned_by": owned_by})
}

fn aliases_default() -> HashMap<String, ModelAlias> {
    HashMap::new()
}

/// Parses `"slug"` or `"slug@effort"` alias targets.
pub fn parse_alias(target: &str) -> ModelAlias {
    match target.split_once('@') {
        Some((slug, effort)) if !effort.is_empty() => ModelAlias {
            target: slug.to_owned(),
            effort: Some(effort.to_owned()),
        },
        _ => ModelAlias {
            target: target.trim_end_matches('@').to_owned(),
            effort: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalog_renders_both_shapes_and_resolves_aliases() {
        let mut aliases = HashMap::new();
        aliases.insert("fast".to_owned(), parse_alias("gpt-5.5@low"));
        let c = ModelCatalog::embedded(aliases);
        assert!(c.models.contains_key("gpt-5.5"));
        let r = c.resolve("fast").unwrap();
        assert_eq!((r.slug, r.effort), ("gpt-5.5", Some("low")));
        assert!(r.levels.iter().any(|l| l == "high"));
        assert!(c.resolve("nope").is_none());
        let openai: sonic_rs::Value = sonic_rs::from_slice(&c.openai_body).unwrap();
        assert_eq!(openai["object"].as_str(), Some("list"));
        assert!(String::from_utf8_lossy(&c.openai_body).contains("\"fast\""));
        let codex = String::from_utf8_lossy(&c.codex_body);
        assert!(codex.starts_with("{\"models\":[") && !codex.contains("base_instructions"));
    }

    #[test]
    fn prefix_aliases_match_by_the_longest_prefix() {
        let mut aliases = HashMap::new();
        aliases.insert("claude-*".to_owned(), parse_alias("gpt-5.5"));
        aliases.insert("claude-haiku-*".to_owned(), parse_alias("gpt-5.5@low"));
        aliases.insert("claude-exact".to_owned(), parse_alias("gpt-5.5@high"));
        let c = ModelCatalog::embedded(aliases);
        let r = c.resolve("claude-sonnet-4-5-20250929").unwrap();
        assert_eq!((r.slug, r.effort), ("gpt-5.5", None));
        assert!(!r.levels.is_empty());
        let r = c.resolve("claude-haiku-4-5").unwrap();
        assert_eq!((r.slug, r.effort), ("gpt-5.5", Some("low")));
        assert_eq!(c.resolve("claude-exact").unwrap().effort, Some("high"));
        assert_eq!(c.resolve("gpt-5.5").unwrap().slug, "gpt-5.5");
        assert!(c.resolve("claud").is_none());
        let listed = String::from_utf8_lossy(&c.openai_body);
        assert!(listed.contains("\"claude-exact\"") && !listed.contains('*'));
    }

    /// A key's view: only the allowed entries, in both shapes, and one model by id.
    #[test]
    fn a_restricted_view_lists_only_what_it_allows() {
        let mut aliases = HashMap::new();
        aliases.insert("fast".to_owned(), parse_alias("gpt-5.5@low"));
        aliases.insert("claude-*".to_owned(), parse_alias("gpt-5.5"));
        let c = ModelCatalog::embedded(aliases);
        assert_eq!(c.list_for(false, |_| true), c.openai_body);
        assert_eq!(c.list_for(true, |_| true), c.codex_body);
        let only = |m: &str| m == "gpt-5.5" || m == "fast";
        let v: sonic_rs::Value = sonic_rs::from_slice(&c.list_for(false, only)).unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["gpt-5.5", "fast"]);
        assert_eq!(v["object"].as_str(), Some("list"));
        let v: sonic_rs::Value = sonic_rs::from_slice(&c.list_for(true, only)).unwrap();
        let slugs: Vec<&str> = v["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["slug"].as_str().unwrap())
            .collect();
        assert_eq!(slugs, ["gpt-5.5"]);
        assert!(v["models"][0]["supported_reasoning_levels"].is_array());
        let none: sonic_rs::Value = sonic_rs::from_slice(&c.list_for(true, |_| false)).unwrap();
        assert_eq!(none["models"].as_array().unwrap().len(), 0);

        let m: sonic_rs::Value =
            sonic_rs::from_slice(&c.model_for("gpt-5.5", |_| true).unwrap()).unwrap();
        assert_eq!(m["id"].as_str(), Some("gpt-5.5"));
        assert_eq!(m["object"].as_str(), Some("model"));
        let m: sonic_rs::Value =
            sonic_rs::from_slice(&c.model_for("fast", |_| true).unwrap()).unwrap();
        assert_eq!(m["owned_by"].as_str(), Some("codex-gateway"));
        assert!(c.model_for("nope", |_| true).is_none());
        assert!(c.model_for("claude-*", |_| true).is_none());
        let m: sonic_rs::Value =
            sonic_rs::from_slice(&c.model_for("claude-sonnet-4-5", |_| true).unwrap()).unwrap();
        assert_eq!(m["id"].as_str(), Some("claude-sonnet-4-5"));
        assert_eq!(m["owned_by"].as_str(), Some("codex-gateway"));
        assert!(c.model_for("gpt-5.5", |m| m == "fast").is_none());
    }

    #[test]
    fn merge_is_a_union_by_slug() {
        let a = br#"{"models":[{"slug":"a"},{"slug":"b"}]}"#;
        let b = br#"{"models":[{"slug":"b"},{"slug":"c"}]}"#;
        let c = ModelCatalog::merge_codex_json(&[a, b], CatalogSource::Upstream, HashMap::new())
            .unwrap();
        assert_eq!(c.models.len(), 3);
        assert!(
            ModelCatalog::from_codex_json(b"[]", CatalogSource::Upstream, HashMap::new()).is_err()
        );
    }
}
