//! `anthropic`: Anthropic Messages request -> Codex Responses body
//! (`codex_protocol::anthropic::messages_to_responses`) and the token estimate
//! (`count_tokens`).
//!
//! Input: byte 0 holds option flags (bit 0 an upstream alias, bit 1 a catalog of reasoning
//! levels, bit 2 an alias effort, bit 3 a `prompt_cache_key`), the rest is the client's JSON
//! body. Invariants: a translated body passes [`check_upstream_body`]; a body that
//! translates can also be counted.

use codex_protocol::anthropic::{count_tokens, messages_to_responses, MessagesRequestOptions};

use super::translate::check_upstream_body;

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [flags, body @ ..] = data else {
        return;
    };
    let levels = ["low".to_owned(), "medium".to_owned(), "high".to_owned()];
    let opts = MessagesRequestOptions {
        upstream_model: (flags & 1 != 0).then_some("gpt-upstream"),
        reasoning_levels: if flags & 2 != 0 { &levels } else { &[] },
        default_effort: (flags & 4 != 0).then_some("high"),
        prompt_cache_key: (flags & 8 != 0).then_some("pck"),
    };
    let counted = count_tokens(body);
    let Ok(req) = messages_to_responses(body, &opts) else {
        return;
    };
    let upstream = opts.upstream_model.unwrap_or(&req.model);
    check_upstream_body(&req.body, upstream, Some(&req.name_map));
    assert!(
        counted.is_ok(),
        "translates but cannot be counted: {counted:?}"
    );
}
