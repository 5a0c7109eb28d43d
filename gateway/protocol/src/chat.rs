//! `/v1/chat/completions` <-> Codex Responses translation (codex-protocol.md §3).
