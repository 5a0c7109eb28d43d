//! `chat`: Chat Completions request -> Codex Responses body
//! (`codex_protocol::chat::chat_to_responses`).
//!
//! Input: byte 0 holds option flags (bit 0 an upstream alias, bit 1 a catalog of reasoning
//! levels, bit 2 a default `prompt_cache_key`), the rest is the client's JSON body.
//! Invariants: a translated body passes [`check_upstream_body`]; the echoed model is the
//! client's; `prompt_cache_key` is the client's or the default.

use codex_protocol::chat::{chat_to_responses, ChatRequestOptions};

use super::translate::check_upstream_body;

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [flags, body @ ..] = data else {
        return;
    };
    let levels = ["low".to_owned(), "medium".to_owned(), "high".to_owned()];
    let opts = ChatRequestOptions {
        default_prompt_cache_key: (flags & 4 != 0).then_some("pck-default"),
        upstream_model: (flags & 1 != 0).then_some("gpt-upstream"),
        reasoning_levels: if flags & 2 != 0 { &levels } else { &[] },
    };
    let Ok(req) = chat_to_responses(body, &opts) else {
        return;
    };
    let upstream = opts.upstream_model.unwrap_or(&req.model);
    check_upstream_body(&req.body, upstream, Some(&req.name_map));
    assert!(!req.model.is_empty(), "model echoed");
    if req.prompt_cache_key.is_none() {
        assert!(
            opts.default_prompt_cache_key.is_none(),
            "default key dropped"
        );
    }
}
