//! Account-bound opaque blobs, as strict as the real backend (docs/protocol.md#account-bound-blobs).
//!
//! The backend binds every opaque blob it returns (reasoning items' `encrypted_content`,
//! remote compaction v2's `compaction` items) to the account that minted it, and refuses a
//! request on another account that carries one with `400 invalid_encrypted_content` (or the
//! same error with `"code": null`: both shapes occur). The mock does the same so that a
//! gateway that replays one account's blobs to another fails a test the way it fails users.
//!
//! # Key Components
//! - [`mint`]: a blob bound to an account: [`PREFIX`], a random nonce, and a keyed hash
//!   (SipHash with a per-process random key) of (account, nonce). Verification needs no table,
//!   so load tests keep no state per blob.
//! - [`verify`] / [`first_unverifiable`]: the check of a request's `input`.
//! - [`refusal`]: the 400 in either observed shape.
//! - [`is_compaction_trigger`]: a request whose last input item is `compaction_trigger`.

use std::{
    hash::{BuildHasher, RandomState},
    sync::OnceLock,
};

use http::Response;
use serde_json::{Map, Value};

use super::{
    reply::{self, Body},
    state::rand_hex,
};

/// Opening of every blob the mock mints (the real ones start `gAAAAAB`).
pub const PREFIX: &str = "gAAAAABmock";

/// Hex characters of the nonce and of the tag.
const NONCE_HEX: usize = 24;
const TAG_HEX: usize = 16;

/// The `include` value that asks for reasoning items' `encrypted_content`.
pub(crate) const INCLUDE_REASONING: &str = "reasoning.encrypted_content";

/// The process's key: blobs are verifiable by every mock of the process (one test may run a
/// mock per instance), never by another process.
fn key() -> &'static RandomState {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    KEY.get_or_init(RandomState::new)
}

fn tag(account: &str, nonce: &str) -> String {
    format!("{:016x}", key().hash_one((account, nonce)))
}

/// A new blob bound to `account`.
pub(crate) fn mint(account: &str) -> String {
    let nonce = rand_hex(NONCE_HEX / 2);
    let tag = tag(account, &nonce);
    format!("{PREFIX}{nonce}{tag}")
}

/// Whether `blob` was minted (by a mock of this process) for `account`.
pub fn verify(blob: &str, account: &str) -> bool {
    let Some(rest) = blob.strip_prefix(PREFIX) else {
        return false;
    };
    if rest.len() != NONCE_HEX + TAG_HEX || !rest.is_ascii() {
        return false;
    }
    let (nonce, t) = rest.split_at(NONCE_HEX);
    tag(account, nonce) == t
}

/// Every blob an input item carries: its `encrypted_content` (reasoning, compaction, any
/// other item type the backend may add).
pub fn item_blobs(item: &Value) -> impl Iterator<Item = &str> {
    item.get("encrypted_content")
        .and_then(Value::as_str)
        .into_iter()
}

/// The first blob of the request's `input` that `account` did not mint, if any.
pub(crate) fn first_unverifiable<'a>(
    req: &'a Map<String, Value>,
    account: &str,
) -> Option<&'a str> {
    let Some(Value::Array(items)) = req.get("input") else {
        return None;
    };
    items
        .iter()
        .flat_map(item_blobs)
        .find(|b| !verify(b, account))
}

/// Whether the request asked for reasoning items' `encrypted_content`.
pub(crate) fn wants_encrypted_reasoning(req: &Map<String, Value>) -> bool {
    matches!(req.get("include"), Some(Value::Array(a))
        if a.iter().any(|v| v.as_str() == Some(INCLUDE_REASONING)))
}

/// Remote compaction v2: the request's last input item is `{"type":"compaction_trigger"}`.
pub(crate) fn is_compaction_trigger(req: &Map<String, Value>) -> bool {
    matches!(req.get("input"), Some(Value::Array(a))
        if a.last().and_then(|i| i.get("type")).and_then(Value::as_str) == Some("compaction_trigger"))
}

/// The backend's refusal of a blob it cannot verify on this account. `null_code`: the shape
/// with `"code": null` (clients must then match the message's "could not be verified").
pub(crate) fn refusal(blob: &str, null_code: bool) -> Response<Body> {
    let head: String = blob.chars().take(4).collect();
    let tail: String = {
        let n = blob.chars().count();
        blob.chars().skip(n.saturating_sub(4).max(4)).collect()
    };
    let message = format!(
        "The encrypted content {head}...{tail} could not be verified. Reason: Encrypted content \
         could not be decrypted or parsed."
    );
    let code = if null_code {
        Value::Null
    } else {
        Value::from("invalid_encrypted_content")
    };
    let body = serde_json::json!({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": null,
        "code": code,
    }});
    let mut r = reply::json(400, body.to_string());
    reply::set_header(&mut r, "x-request-id", format!("req_{}", rand_hex(16)));
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn blobs_verify_only_on_their_account() {
        let a = mint("acct-a");
        assert!(a.starts_with(PREFIX));
        assert!(verify(&a, "acct-a"));
        assert!(!verify(&a, "acct-b"));
        assert!(!verify("gAAAAABmockdeadbeef", "acct-a"));
        assert!(!verify("not a blob", "acct-a"));
        let mut forged = a.clone();
        forged.pop();
        forged.push(if a.ends_with('0') { '1' } else { '0' });
        assert!(!verify(&forged, "acct-a"));
    }

    #[test]
    fn input_checks_every_blob_carrying_item() {
        let a = mint("acct-a");
        let req: Value = serde_json::json!({"input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "encrypted_content": a},
            {"type": "compaction", "id": "cmp_1", "encrypted_content": mint("acct-b")},
            {"type": "compaction_trigger"},
        ]});
        let req = req.as_object().unwrap();
        assert!(is_compaction_trigger(req));
        assert!(first_unverifiable(req, "acct-a").is_some());
        assert!(first_unverifiable(req, "acct-b").is_some());
        let only_a: Value = serde_json::json!({"input": [
            {"type": "reasoning", "summary": [], "encrypted_content": a},
        ]});
        assert!(first_unverifiable(only_a.as_object().unwrap(), "acct-a").is_none());
    }
}
