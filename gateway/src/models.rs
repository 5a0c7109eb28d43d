//! `/v1/models`: the embedded Codex catalog (`gateway/protocol/catalog`), in the OpenAI list
//! shape by default and in the Codex `{"models":[...]}` shape when the client sends
//! `client_version` (Codex CLI does).

use std::sync::OnceLock;

use sonic_rs::{JsonValueMutTrait, JsonValueTrait};

const CATALOG: &str = include_str!("../protocol/catalog/codex-models-catalog.json");

struct Rendered {
    openai: Vec<u8>,
    codex: Vec<u8>,
    slugs: Vec<String>,
}

fn rendered() -> &'static Rendered {
    static R: OnceLock<Rendered> = OnceLock::new();
    R.get_or_init(|| {
        let mut v: sonic_rs::Value = sonic_rs::from_str(CATALOG).unwrap_or_default();
        let mut data = sonic_rs::Array::new();
        let mut slugs = Vec::new();
        if let Some(models) = v.get_mut("models").and_then(|m| m.as_array_mut()) {
            for m in models.iter_mut() {
                if let Some(o) = m.as_object_mut() {
                    o.remove(&"base_instructions");
                    o.remove(&"model_messages");
                }
                if let Some(slug) = m.get("slug").and_then(|s| s.as_str()) {
                    slugs.push(slug.to_owned());
                    data.push(sonic_rs::json!({
                        "id": slug,
                        "object": "model",
                        "created": 1_700_000_000u64,
                        "owned_by": "openai",
                    }));
                }
            }
        }
        let openai = sonic_rs::to_vec(&sonic_rs::json!({"object": "list", "data": data}))
            .unwrap_or_default();
        let codex = sonic_rs::to_vec(&v).unwrap_or_default();
        Rendered {
            openai,
            codex,
            slugs,
        }
    })
}

/// The model list body.
pub fn list(codex_shape: bool) -> Vec<u8> {
    let r = rendered();
    if codex_shape {
        r.codex.clone()
    } else {
        r.openai.clone()
    }
}

/// Known model slugs.
pub fn slugs() -> &'static [String] {
    &rendered().slugs
}
