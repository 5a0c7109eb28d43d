//! Account-bound blobs in a Responses body: find them, fingerprint them, and strip the ones
//! another account would refuse (docs/protocol.md#account-bound-blobs).
//!
//! The backend binds every opaque blob it returns to the account that minted it: a reasoning
//! item's `encrypted_content` (what the Codex CLI replays every turn, and what our Anthropic
//! thinking `signature`s carry), and remote compaction v2's `compaction` item. Sent to another
//! account, the request is refused `400 invalid_encrypted_content`. Everything else in a
//! history is portable: messages, tool calls and their `call_id`s, reasoning summaries.
//!
//! # Key Components
//! - [`fingerprint`]: a stable 64-bit hash of a blob (never the blob itself): the same on every
//!   instance, so an ownership record can be shared through Redis.
//! - [`input_blobs`]: the fingerprints of the blobs a body's `input` carries.
//! - [`strip`]: the body without the blobs a predicate refuses: `encrypted_content` dropped
//!   from a reasoning item (and its account-bound `id`; the item dropped when nothing portable
//!   is left), a compaction item dropped whole. Only the changed items are rewritten; the rest
//!   of the body is copied byte for byte, and a body without blobs costs one SIMD search.
//!
//! # Error handling
//! The bodies are ours (normalised or translated), so they parse; a body that does not is
//! returned unchanged (`None`): the upstream then answers it as it would have.

use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

/// The key every blob hides behind, with its quotes.
const QUOTED_KEY: &[u8] = b"\"encrypted_content\"";

/// What kind of item a blob came in (the `kind` label of
/// `encrypted_items_stripped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// A reasoning item's `encrypted_content` (Anthropic thinking signatures included).
    Reasoning,
    /// A remote compaction v2 `compaction` item.
    Compaction,
    /// Any other item type carrying `encrypted_content`.
    Other,
}

impl BlobKind {
    /// Every kind, for metric labels.
    pub const ALL: [BlobKind; 3] = [Self::Reasoning, Self::Compaction, Self::Other];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reasoning => "reasoning",
            Self::Compaction => "compaction",
            Self::Other => "other",
        }
    }

    fn of_item_type(t: Option<&str>) -> Self {
        match t {
            Some("reasoning") => Self::Reasoning,
            Some("compaction") => Self::Compaction,
            _ => Self::Other,
        }
    }
}

/// A blob's fingerprint: 64-bit FNV-1a over its bytes, then mixed (stable across processes and
/// versions: stored records and other instances must agree).
pub fn fingerprint(blob: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in blob.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64 finalizer: FNV's low bits are weak.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// How many blobs [`strip`] removed, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stripped {
    /// Reasoning items' `encrypted_content`.
    pub reasoning: u32,
    /// Compaction items.
    pub compaction: u32,
    /// Other items' `encrypted_content`.
    pub other: u32,
}

impl Stripped {
    /// The count of one kind.
    pub fn of(&self, kind: BlobKind) -> u32 {
        match kind {
            BlobKind::Reasoning => self.reasoning,
            BlobKind::Compaction => self.compaction,
            BlobKind::Other => self.other,
        }
    }

    /// All blobs removed.
    pub fn total(&self) -> u32 {
        self.reasoning + self.compaction + self.other
    }

    fn add(&mut self, kind: BlobKind) {
        match kind {
            BlobKind::Reasoning => self.reasoning += 1,
            BlobKind::Compaction => self.compaction += 1,
            BlobKind::Other => self.other += 1,
        }
    }
}

/// Whether `raw` may hold a blob: the key with its quotes (the blob key is letters and `_`, and
/// a letter can be escaped only as `\u00XX`, so any other spelling holds such an escape), or
/// an escape of an ASCII character. A quoted key: `"reasoning.encrypted_content"` (what every
/// Codex CLI request lists in `include`) is not a hit.
fn maybe(raw: &[u8]) -> bool {
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(QUOTED_KEY));
    KEY.find(raw).is_some() || crate::spans::may_escape_ascii(raw)
}

/// Whether `body` may carry a blob at all (SIMD searches; `false` is certain).
pub fn may_carry_blobs(body: &[u8]) -> bool {
    maybe(body)
}

/// The `input` array of a body: where its raw bytes are in `body`. `body` is JSON the gateway
/// wrote (each top-level name once): found by a flat walk from both ends
/// ([`crate::spans::unique_member`]), not a strict parse.
fn input_span(body: &[u8]) -> Option<(usize, usize)> {
    crate::spans::unique_member(body, "input", b'[').map(|r| (r.start, r.end))
}

/// The blob of an item (`encrypted_content` as a string) and the item's kind.
fn item_blob(item: &Value) -> Option<(BlobKind, &str)> {
    let blob = item.get("encrypted_content")?.as_str()?;
    let kind = BlobKind::of_item_type(item.get("type").and_then(|t| t.as_str()));
    Some((kind, blob))
}

/// Calls `f` with the kind and fingerprint of every blob in `body`'s `input`.
pub fn input_blobs(body: &[u8], mut f: impl FnMut(BlobKind, u64)) {
    if !maybe(body) {
        return;
    }
    let Some((start, end)) = input_span(body) else {
        return;
    };
    let raw = &body[start..end];
    for item in crate::spans::items(raw) {
        let bytes = &raw[item];
        if bytes.first() != Some(&b'{') || !maybe(bytes) {
            continue;
        }
        let Ok(v) = sonic_rs::from_slice::<Value>(bytes) else {
            continue;
        };
        if let Some((kind, blob)) = item_blob(&v) {
            f(kind, fingerprint(blob));
        }
    }
}

/// Whether an item without its blob still says something portable: any field but `type`,
/// `id` and `status`, or a non-empty `summary` / `content`.
fn portable_rest(item: &Value) -> bool {
    let Some(o) = item.as_object() else {
        return false;
    };
    o.iter().any(|(k, v)| match k {
        "type" | "id" | "status" | "encrypted_content" => false,
        "summary" | "content" => v.as_array().is_some_and(|a| !a.is_empty()) || v.is_str(),
        _ => !v.is_null(),
    })
}

/// `body` without the blobs `keep(kind, fingerprint)` refuses, or `None` when nothing changes
/// (the caller sends its own bytes).
///
/// A refused reasoning (or other) item loses `encrypted_content` and its `id` (item ids are
/// account-bound too, and with `store:false` an id points at nothing); it is dropped when
/// nothing portable is left in it. A refused compaction item is dropped whole (its blob is all
/// it carries: it replaces the history it summarised). Messages, tool calls, `call_id`s and
/// summaries are never touched, and the items that do not change are copied byte for byte.
pub fn strip(body: &[u8], keep: &dyn Fn(BlobKind, u64) -> bool) -> Option<(Vec<u8>, Stripped)> {
    if !maybe(body) {
        return None;
    }
    let (start, end) = input_span(body)?;
    let raw = &body[start..end];
    let mut stripped = Stripped::default();
    let mut changed = false;
    let mut wrote = 0usize;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..start]);
    out.push(b'[');
    for item in crate::spans::items(raw) {
        let bytes = &raw[item];
        let mut write = |out: &mut Vec<u8>, b: &[u8]| {
            if wrote > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b);
            wrote += 1;
        };
        if bytes.first() != Some(&b'{') || !maybe(bytes) {
            write(&mut out, bytes);
            continue;
        }
        let mut v: Value = match sonic_rs::from_slice(bytes) {
            Ok(v) => v,
            Err(_) => return None,
        };
        let Some((kind, blob)) = item_blob(&v) else {
            write(&mut out, bytes);
            continue;
        };
        if keep(kind, fingerprint(blob)) {
            write(&mut out, bytes);
            continue;
        }
        changed = true;
        stripped.add(kind);
        if kind == BlobKind::Compaction {
            continue;
        }
        if let Some(o) = v.as_object_mut() {
            o.remove(&"encrypted_content");
            o.remove(&"id");
        }
        if portable_rest(&v) {
            let mut b = Vec::with_capacity(bytes.len());
            sonic_rs::to_writer(&mut b, &v).ok()?;
            write(&mut out, &b);
        }
    }
    if !changed {
        return None;
    }
    out.push(b']');
    out.extend_from_slice(&body[end..]);
    Some((out, stripped))
}

/// `body` without any blob (the recovery retry after an `invalid_encrypted_content`: blobs we
/// have no record of).
pub fn strip_all(body: &[u8]) -> Option<(Vec<u8>, Stripped)> {
    strip(body, &|_, _| false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(b: &[u8]) -> sonic_rs::Value {
        sonic_rs::from_slice(b).expect("valid JSON")
    }

    const BODY: &str = r#"{"model":"gpt-5.1-codex","input":[
        {"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
        {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thought"}],"encrypted_content":"gAAA-A1"},
        {"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"gAAA-B1"},
        {"type":"function_call","id":"fc_1","call_id":"call_1","name":"exec","arguments":"{}"},
        {"type":"function_call_output","call_id":"call_1","output":"ok"},
        {"type":"compaction","id":"cmp_1","encrypted_content":"gAAA-C1"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}
    ],"include":["reasoning.encrypted_content"],"store":false}"#;

    #[test]
    fn fingerprints_are_stable() {
        // Shared through Redis: must never change between versions.
        assert_eq!(fingerprint(""), fingerprint(""));
        assert_ne!(fingerprint("gAAA-A1"), fingerprint("gAAA-A2"));
        assert_eq!(
            format!("{:016x}", fingerprint("gAAA-A1")),
            "5242731426a34cf3"
        );
    }

    #[test]
    fn lists_every_blob_of_the_input() {
        let mut seen = Vec::new();
        input_blobs(BODY.as_bytes(), |k, f| seen.push((k, f)));
        assert_eq!(
            seen,
            vec![
                (BlobKind::Reasoning, fingerprint("gAAA-A1")),
                (BlobKind::Reasoning, fingerprint("gAAA-B1")),
                (BlobKind::Compaction, fingerprint("gAAA-C1")),
            ]
        );
    }

    #[test]
    fn no_blob_no_change() {
        let body = br#"{"model":"m","input":[{"type":"message","role":"user","content":"hi"}]}"#;
        assert!(!may_carry_blobs(body));
        assert_eq!(strip_all(body), None);
        // Blobs all kept: unchanged too.
        assert_eq!(strip(BODY.as_bytes(), &|_, _| true), None);
        // A body without input, or not JSON.
        assert_eq!(strip_all(br#"{"encrypted_content":"x"}"#), None);
        assert_eq!(strip_all(b"encrypted_content"), None);
    }

    #[test]
    fn strips_every_item_shape() {
        let (out, n) = strip_all(BODY.as_bytes()).expect("changed");
        assert_eq!(
            n,
            Stripped {
                reasoning: 2,
                compaction: 1,
                other: 0
            }
        );
        let v = json(&out);
        let items = v["input"].as_array().expect("array");
        let types: Vec<&str> = items
            .iter()
            .map(|i| i["type"].as_str().unwrap_or(""))
            .collect();
        // The summary-carrying reasoning item stays (without blob and id); the bare one and
        // the compaction item are gone; messages and the tool round trip are untouched.
        assert_eq!(
            types,
            [
                "message",
                "reasoning",
                "function_call",
                "function_call_output",
                "message"
            ]
        );
        assert!(items[1].get("encrypted_content").is_none());
        assert!(items[1].get("id").is_none());
        assert_eq!(items[1]["summary"][0]["text"].as_str(), Some("thought"));
        assert_eq!(items[2]["call_id"].as_str(), Some("call_1"));
        assert_eq!(items[2]["id"].as_str(), Some("fc_1"));
        assert_eq!(items[3]["call_id"].as_str(), Some("call_1"));
        // The rest of the body is byte for byte the client's.
        assert!(out.starts_with(br#"{"model":"gpt-5.1-codex","input":["#));
        assert!(out.ends_with(br#"],"include":["reasoning.encrypted_content"],"store":false}"#));
        // Unchanged items keep their bytes.
        let s = std::str::from_utf8(&out).expect("utf8");
        assert!(s.contains(
            r#"{"type":"function_call","id":"fc_1","call_id":"call_1","name":"exec","arguments":"{}"}"#
        ));
        // Stripping again changes nothing.
        assert_eq!(strip_all(&out), None);
    }

    #[test]
    fn keeps_the_blobs_the_predicate_owns() {
        let mine = fingerprint("gAAA-A1");
        let (out, n) = strip(BODY.as_bytes(), &|_, f| f == mine).expect("changed");
        assert_eq!(n.total(), 2);
        let v = json(&out);
        let items = v["input"].as_array().expect("array");
        assert_eq!(items[1]["encrypted_content"].as_str(), Some("gAAA-A1"));
        assert_eq!(items[1]["id"].as_str(), Some("rs_1"));
        assert_eq!(items.len(), 5);
    }

    #[test]
    fn escaped_keys_and_other_items_are_found() {
        // A client may escape a key; the search still finds the item.
        let body = br#"{"input":[{"type":"reasoning","summary":[],"\u0065ncrypted_content":"gAAA-X"},{"type":"web_search_call","id":"ws_1","action":{"type":"search"},"encrypted_content":"gAAA-Y"}]}"#;
        let (out, n) = strip_all(body).expect("changed");
        assert_eq!(n.reasoning, 1);
        assert_eq!(n.other, 1);
        let v = json(&out);
        let items = v["input"].as_array().expect("array");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["type"].as_str(), Some("web_search_call"));
        assert!(items[0].get("encrypted_content").is_none());
    }

    #[test]
    fn a_websocket_envelope_and_an_only_blob_input() {
        let body = br#"{"type":"response.create","input":[{"type":"compaction","encrypted_content":"gAAA"}],"model":"m"}"#;
        let (out, n) = strip_all(body).expect("changed");
        assert_eq!(n.compaction, 1);
        assert_eq!(
            out,
            br#"{"type":"response.create","input":[],"model":"m"}"#.to_vec()
        );
    }
}
