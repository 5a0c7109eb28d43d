//! Client `/v1/responses` body -> the body the Codex backend accepts (codex-protocol.md §2.3).
//!
//! # Key Components
//! - [`normalize_responses`]: one DOM pass over the client body; returns the upstream body and
//!   the fields routing needs ([`Normalized`]).
//! - [`DROPPED_FIELDS`]: parameters the backend rejects with "Unsupported parameter".
//!
//! # Error handling
//! Malformed bodies give a [`NormalizeError`] that the gateway maps to a 400
//! `invalid_request_error` naming the offending `param`.

use sonic_rs::{json, JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

/// Parameters the Codex backend rejects; dropped before sending.
pub const DROPPED_FIELDS: &[&str] = &[
    "max_output_tokens",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "n",
    "seed",
    "stop",
    "user",
    "logit_bias",
    "metadata",
    "stream_options",
    "truncation",
    "context_management",
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "disable_response_storage",
    "background",
];

/// A normalized request.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    /// The body to send upstream.
    pub body: Vec<u8>,
    /// The requested model.
    pub model: String,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// A `previous_response_id` the client sent (not forwarded over HTTP).
    pub previous_response_id: Option<String>,
    /// The client's `prompt_cache_key`, an affinity signal.
    pub prompt_cache_key: Option<String>,
    /// The client's `store` (`None`: absent or not a boolean); the body sent says `false`.
    pub store: Option<bool>,
    /// The client body's top-level `session_id`, else its `conversation_id` (non-empty
    /// strings): the body's session signal for affinity.
    pub session: Option<String>,
    /// What the body sent upstream asks for (usage records it).
    pub asked: Asked,
}

/// What a normalised upstream body asks for, as usage records it: `reasoning.effort` and
/// `service_tier` (non-empty strings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// `reasoning.effort`.
    pub reasoning_effort: Option<String>,
    /// `service_tier`.
    pub service_tier: Option<String>,
}

// === impl Asked ===

impl Asked {
    /// Reads both fields from a normalised body (one scan, with a tree of paths built once per
    /// thread). For bodies built by a translator; [`normalize_responses_with`] reads them from
    /// the tree it already holds.
    pub fn of_body(body: &[u8]) -> Self {
        thread_local! {
            static PATHS: sonic_rs::PointerTree = {
                let mut t = sonic_rs::PointerTree::new();
                t.add_path(["reasoning", "effort"]);
                t.add_path(["service_tier"]);
                t
            };
        }
        let found = PATHS
            .with(|t| sonic_rs::get_many(body, t))
            .unwrap_or_default();
        let mut text = found
            .into_iter()
            .map(|v| v.and_then(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned)));
        Self {
            reasoning_effort: text.next().flatten(),
            service_tier: text.next().flatten(),
        }
    }
}

/// A non-empty string field of `obj`.
fn text_of(obj: &sonic_rs::Object, key: &str) -> Option<String> {
    obj.get(&key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Why a body cannot be normalized.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct NormalizeError {
    /// Human message.
    pub message: String,
    /// The offending parameter.
    pub param: Option<&'static str>,
    /// The requested model is unknown (the caller answers 404 `model_not_found`).
    pub unknown_model: Option<String>,
}

fn err(message: impl Into<String>, param: Option<&'static str>) -> NormalizeError {
    NormalizeError {
        message: message.into(),
        param,
        unknown_model: None,
    }
}

/// What to do with the requested model (the caller owns the catalog and aliases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// Send it as is.
    Keep,
    /// Send this slug instead, optionally forcing a reasoning effort (an alias).
    Rewrite {
        /// Upstream slug.
        slug: String,
        /// Reasoning effort to set.
        effort: Option<String>,
    },
    /// Unknown model.
    Reject,
}

/// Normalizes a client `/v1/responses` body for the Codex backend, keeping the model.
pub fn normalize_responses(body: &[u8]) -> Result<Normalized, NormalizeError> {
    normalize_responses_with(body, &|_| ModelChoice::Keep)
}

/// Normalizes a client `/v1/responses` body, resolving the model with `choose`.
/// [`Normalized::model`] stays the client's name (accounting); the body carries the slug.
pub fn normalize_responses_with(
    body: &[u8],
    choose: &dyn Fn(&str) -> ModelChoice,
) -> Result<Normalized, NormalizeError> {
    let mut v: Value = sonic_rs::from_slice(body).map_err(|e| {
        err(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| err("The request body must be a JSON object.", None))?;

    let model = match obj.get(&"model") {
        Some(m) if m.as_str().is_some_and(|s| !s.is_empty()) => {
            m.as_str().unwrap_or_default().to_owned()
        }
        Some(_) => return Err(err("`model` must be a non-empty string.", Some("model"))),
        None => return Err(err("Missing required parameter: 'model'.", Some("model"))),
    };
    match choose(&model) {
        ModelChoice::Keep => {}
        ModelChoice::Reject => {
            return Err(NormalizeError {
                message: format!(
                    "The model `{model}` does not exist or you do not have access to it."
                ),
                param: Some("model"),
                unknown_model: Some(model),
            })
        }
        ModelChoice::Rewrite { slug, effort } => {
            obj.insert(&"model", slug.as_str());
            if let Some(effort) = effort {
                match obj.get_mut(&"reasoning").and_then(|r| r.as_object_mut()) {
                    Some(r) => {
                        r.insert(&"effort", effort.as_str());
                    }
                    None => {
                        obj.insert(&"reasoning", json!({"effort": effort.as_str()}));
                    }
                }
            }
        }
    }
    let stream = match obj.get(&"stream") {
        None => false,
        Some(s) if s.is_null() => false,
        Some(s) => s
            .as_bool()
            .ok_or_else(|| err("`stream` must be a boolean.", Some("stream")))?,
    };
    let previous_response_id = obj
        .remove(&"previous_response_id")
        .and_then(|p| p.as_str().map(str::to_owned));
    let prompt_cache_key = obj
        .get(&"prompt_cache_key")
        .and_then(|p| p.as_str().map(str::to_owned));
    let store = obj.get(&"store").and_then(|s| s.as_bool());
    let session = text_of(obj, "session_id").or_else(|| text_of(obj, "conversation_id"));

    for f in DROPPED_FIELDS {
        obj.remove(f);
    }
    // WebSocket envelope fields never go over HTTP.
    obj.remove(&"type");
    obj.remove(&"generate");

    // instructions: required upstream, may be empty.
    match obj.get(&"instructions") {
        Some(i) if i.is_str() => {}
        Some(i) if i.is_null() => {
            obj.insert(&"instructions", "");
        }
        Some(_) => {
            return Err(err(
                "`instructions` must be a string.",
                Some("instructions"),
            ))
        }
        None => {
            obj.insert(&"instructions", "");
        }
    }

    // input: string -> one user message; array: system role -> developer.
    match obj.get_mut(&"input") {
        None => {
            obj.insert(&"input", Value::new_array());
        }
        Some(input) if input.is_str() => {
            let text = input.as_str().unwrap_or_default().to_owned();
            *input = json!([{
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}]
            }]);
        }
        Some(input) if input.is_array() => {
            if let Some(items) = input.as_array_mut() {
                for item in items.iter_mut() {
                    if let Some(o) = item.as_object_mut() {
                        if o.get(&"role").and_then(|r| r.as_str()) == Some("system") {
                            o.insert(&"role", "developer");
                        }
                    }
                }
            }
        }
        Some(_) => {
            return Err(err(
                "`input` must be a string or an array of input items.",
                Some("input"),
            ))
        }
    }

    // tools: legacy web search variants -> web_search.
    if let Some(tools) = obj.get_mut(&"tools").and_then(|t| t.as_array_mut()) {
        for t in tools.iter_mut() {
            if let Some(o) = t.as_object_mut() {
                let is_ws = o
                    .get(&"type")
                    .and_then(|x| x.as_str())
                    .is_some_and(|ty| ty.starts_with("web_search"));
                if is_ws {
                    o.insert(&"type", "web_search");
                }
            }
        }
    }

    // service_tier: only `priority` is accepted (`fast` means priority).
    let tier = obj
        .get(&"service_tier")
        .map(|t| t.as_str().map(str::to_owned));
    match tier {
        Some(Some(t)) if t == "priority" || t == "fast" => {
            obj.insert(&"service_tier", "priority");
        }
        Some(_) => {
            obj.remove(&"service_tier");
        }
        None => {}
    }

    obj.insert(&"store", false);
    obj.insert(&"stream", true);
    let asked = Asked {
        reasoning_effort: obj
            .get(&"reasoning")
            .and_then(|r| r.as_object())
            .and_then(|r| text_of(r, "effort")),
        service_tier: text_of(obj, "service_tier"),
    };

    let body = sonic_rs::to_vec(&v).map_err(|e| err(format!("cannot encode body: {e}"), None))?;
    Ok(Normalized {
        body,
        model,
        stream,
        previous_response_id,
        prompt_cache_key,
        store,
        session,
        asked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> (Normalized, Value) {
        let n = normalize_responses(s.as_bytes()).unwrap();
        let v: Value = sonic_rs::from_slice(&n.body).unwrap();
        (n, v)
    }

    #[test]
    fn wraps_string_input_and_forces_codex_rules() {
        let (n, v) = norm(
            r#"{"model":"gpt-5","input":"say hi","temperature":0.2,"max_output_tokens":5,"store":true}"#,
        );
        assert_eq!(n.model, "gpt-5");
        assert!(!n.stream);
        assert_eq!(v["stream"].as_bool(), Some(true));
        assert_eq!(v["store"].as_bool(), Some(false));
        assert_eq!(v["instructions"].as_str(), Some(""));
        assert!(v.get("temperature").is_none());
        assert!(v.get("max_output_tokens").is_none());
        assert_eq!(v["input"][0]["role"].as_str(), Some("user"));
        assert_eq!(v["input"][0]["content"][0]["text"].as_str(), Some("say hi"));
    }

    #[test]
    fn maps_system_role_and_keeps_instructions() {
        let (n, v) = norm(
            r#"{"model":"m","stream":true,"instructions":"be brief","input":[{"type":"message","role":"system","content":"x"}],"previous_response_id":"resp_1","service_tier":"fast","tools":[{"type":"web_search_preview"}]}"#,
        );
        assert!(n.stream);
        assert_eq!(n.previous_response_id.as_deref(), Some("resp_1"));
        assert!(v.get("previous_response_id").is_none());
        assert_eq!(v["instructions"].as_str(), Some("be brief"));
        assert_eq!(v["input"][0]["role"].as_str(), Some("developer"));
        assert_eq!(v["service_tier"].as_str(), Some("priority"));
        assert_eq!(v["tools"][0]["type"].as_str(), Some("web_search"));
    }

    #[test]
    fn resolves_models_through_the_caller() {
        let choose = |m: &str| match m {
            "fast" => ModelChoice::Rewrite {
                slug: "gpt-5.5".into(),
                effort: Some("low".into()),
            },
            "gpt-5.5" => ModelChoice::Keep,
            _ => ModelChoice::Reject,
        };
        let n = normalize_responses_with(
            br#"{"model":"fast","input":"x","reasoning":{"summary":"auto"}}"#,
            &choose,
        )
        .unwrap();
        let v: Value = sonic_rs::from_slice(&n.body).unwrap();
        assert_eq!(n.model, "fast");
        assert_eq!(v["model"].as_str(), Some("gpt-5.5"));
        assert_eq!(v["reasoning"]["effort"].as_str(), Some("low"));
        assert_eq!(v["reasoning"]["summary"].as_str(), Some("auto"));
        let e = normalize_responses_with(br#"{"model":"nope"}"#, &choose).unwrap_err();
        assert_eq!(e.unknown_model.as_deref(), Some("nope"));
    }

    #[test]
    fn reports_store_session_and_what_the_body_asks_for() {
        let (n, _) = norm(
            r#"{"model":"m","store":true,"session_id":"","conversation_id":"c-1","reasoning":{"effort":"high"},"service_tier":"fast"}"#,
        );
        assert_eq!(n.store, Some(true));
        assert_eq!(
            n.session.as_deref(),
            Some("c-1"),
            "an empty session_id is no signal"
        );
        assert_eq!(n.asked.reasoning_effort.as_deref(), Some("high"));
        assert_eq!(n.asked.service_tier.as_deref(), Some("priority"));
        let (n, _) = norm(
            r#"{"model":"m","store":false,"session_id":"s-1","conversation_id":"c-1","service_tier":"flex"}"#,
        );
        assert_eq!(n.store, Some(false));
        assert_eq!(n.session.as_deref(), Some("s-1"));
        assert_eq!(
            n.asked,
            Asked::default(),
            "a tier the backend refuses is dropped"
        );
        let (n, _) = norm(r#"{"model":"m","store":"yes","session_id":5}"#);
        assert_eq!((n.store, n.session), (None, None));
        // An alias's forced effort is what the body sent asks for.
        let choose = |_: &str| ModelChoice::Rewrite {
            slug: "gpt-5.5".into(),
            effort: Some("low".into()),
        };
        let n = normalize_responses_with(
            br#"{"model":"fast","reasoning":{"effort":"high"}}"#,
            &choose,
        )
        .unwrap();
        assert_eq!(n.asked.reasoning_effort.as_deref(), Some("low"));
    }

    #[test]
    fn the_scan_of_a_translated_body_reads_what_the_tree_reads() {
        for body in [
            r#"{"model":"m"}"#,
            r#"{"model":"m","reasoning":{"effort":"medium","summary":"auto"},"service_tier":"priority"}"#,
            r#"{"model":"m","reasoning":{"effort":""},"service_tier":"fast","input":[{"reasoning":{"effort":"x"}}]}"#,
            r#"{"model":"m","reasoning":null,"service_tier":null}"#,
        ] {
            let n = normalize_responses(body.as_bytes()).unwrap();
            assert_eq!(Asked::of_body(&n.body), n.asked, "{body}");
        }
    }

    #[test]
    fn rejects_bad_bodies() {
        assert!(normalize_responses(b"{nope").is_err());
        assert_eq!(normalize_responses(b"[]").unwrap_err().param, None);
        assert_eq!(normalize_responses(b"{}").unwrap_err().param, Some("model"));
        assert_eq!(
            normalize_responses(br#"{"model":"m","input":5}"#)
                .unwrap_err()
                .param,
            Some("input")
        );
        assert_eq!(
            normalize_responses(br#"{"model":"m","stream":"yes"}"#)
                .unwrap_err()
                .param,
            Some("stream")
        );
    }
}
