//! `normalize`: `/v1/responses` request normalization
//! (`codex_protocol::normalize::normalize_responses_with`).
//!
//! Input: byte 0 picks the model resolution (0 keep, 1 rewrite to an alias slug with an
//! effort, 2 reject), the rest is the client's JSON body. Invariants: a normalized body passes
//! [`check_upstream_body`] (which also proves normalization idempotent) unless it holds a
//! number beyond f64's range that the client sent (numbers are copied verbatim), and carries no field
//! the upstream refuses; `previous_response_id` never goes upstream; a rejected model is
//! reported as unknown.

use codex_protocol::normalize::{normalize_responses_with, ModelChoice, DROPPED_FIELDS};
use sonic_rs::{JsonValueTrait, Value};

use super::translate::check_upstream_body;

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [mode, body @ ..] = data else {
        return;
    };
    let choose = |_: &str| match mode % 3 {
        0 => ModelChoice::Keep,
        1 => ModelChoice::Rewrite {
            slug: "gpt-slug".into(),
            effort: Some("low".into()),
        },
        _ => ModelChoice::Reject,
    };
    match normalize_responses_with(body, &choose) {
        Ok(n) => {
            assert_ne!(mode % 3, 2, "a rejected model was accepted");
            // Numbers go upstream as the client wrote them: one beyond f64's range (which a
            // decoding parser refuses) is the upstream's to judge, and only the client's.
            let beyond = |b: &[u8]| {
                sonic_rs::from_slice::<Value>(b)
                    .err()
                    .is_some_and(|e| e.to_string().contains("must be finite"))
            };
            if beyond(&n.body) {
                assert!(
                    beyond(body),
                    "a number out of range that the client did not send"
                );
                return;
            }
            let slug = if mode % 3 == 1 {
                "gpt-slug"
            } else {
                n.model.as_str()
            };
            check_upstream_body(&n.body, slug, None);
            let v: Value = sonic_rs::from_slice(&n.body).unwrap_or_default();
            let never = ["previous_response_id", "type", "generate"];
            for f in DROPPED_FIELDS.iter().chain(never.iter()) {
                assert!(v.get(*f).is_none(), "{f} sent upstream");
            }
            if mode % 3 == 1 {
                assert_eq!(
                    v.get("reasoning")
                        .and_then(|r| r.get("effort"))
                        .and_then(|e| e.as_str()),
                    Some("low"),
                    "alias effort"
                );
            }
        }
        Err(e) => {
            if e.unknown_model.is_some() {
                assert_eq!(mode % 3, 2, "unknown model without a reject");
            }
        }
    }
}
