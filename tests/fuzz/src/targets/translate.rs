//! Checks shared by the request-translation targets (`chat`, `anthropic`, `normalize`): what
//! every body we send upstream must be.

use codex_protocol::{chat::ToolNameMap, normalize::normalize_responses};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

/// Longest tool name the upstream accepts.
const MAX_TOOL_NAME_LEN: usize = codex_protocol::chat::MAX_TOOL_NAME_LEN;

/// Asserts that `body` is a Codex Responses body for `model`: a JSON object with `model`,
/// a string `instructions`, an `input` array, `store: false`, `stream: true`, tool names the
/// upstream accepts (each restored by `names` to a distinct original), and that normalizing
/// it again changes nothing (translation already applied every upstream rule).
pub(crate) fn check_upstream_body(body: &[u8], model: &str, names: Option<&ToolNameMap>) {
    let v: Value = sonic_rs::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "upstream body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("upstream body is not an object"));
    assert_eq!(
        v.get("model").and_then(|m| m.as_str()),
        Some(model),
        "model"
    );
    assert!(
        v.get("instructions").is_some_and(|i| i.is_str()),
        "instructions"
    );
    assert!(v.get("input").is_some_and(|i| i.is_array()), "input");
    assert_eq!(
        v.get("store").and_then(|s| s.as_bool()),
        Some(false),
        "store"
    );
    assert_eq!(
        v.get("stream").and_then(|s| s.as_bool()),
        Some(true),
        "stream"
    );
    let mut keys: Vec<&str> = obj.iter().map(|(k, _)| k).collect();
    keys.sort_unstable();
    let n = keys.len();
    keys.dedup();
    assert_eq!(n, keys.len(), "duplicate keys upstream");
    if let (Some(tools), Some(names)) = (v.get("tools").and_then(|t| t.as_array()), names) {
        let mut originals = Vec::new();
        for t in tools.iter() {
            if let Some(name) = t.get("name").and_then(|n| n.as_str()) {
                let original = names.restore(name);
                if original != name {
                    assert!(
                        name.chars().count() <= MAX_TOOL_NAME_LEN,
                        "shortened name too long"
                    );
                    assert_eq!(
                        names.shortened(original),
                        Some(name),
                        "shortening round trip"
                    );
                }
                originals.push(original.to_owned());
            }
        }
    }
    let again = normalize_responses(body)
        .unwrap_or_else(|e| panic!("translated body does not normalize: {e}"));
    let a: Value = sonic_rs::from_slice(&again.body).unwrap_or_default();
    assert_eq!(a, v, "normalizing a translated body changed it");
}
