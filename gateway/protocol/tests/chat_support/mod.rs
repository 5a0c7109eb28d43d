//! Shared helpers for the chat translation tests: fixture loading (through the crate's own
//! SSE splitter), frame parsing, and the stream invariants every translated stream must hold.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use codex_protocol::{
    chat::{ChatAggregator, ChatStream, ToolNameMap},
    sse::SseSplitter,
};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

/// Creation time passed as the fallback `created`.
pub const CREATED: u64 = 1_600_000_000;

/// One upstream event: (type, data).
pub type Event = (String, Vec<u8>);

/// Reads `tests/fixtures/chat/<name>` and splits it into events.
pub fn fixture(name: &str) -> Vec<Event> {
    let path = format!("{}/tests/fixtures/chat/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    split_sse(&bytes)
}

/// Splits an SSE transcript with the crate's splitter.
pub fn split_sse(bytes: &[u8]) -> Vec<Event> {
    let mut s = SseSplitter::default();
    s.push(bytes);
    let mut out = Vec::new();
    while let Some(ev) = s.next_event().unwrap() {
        out.push((ev.event_type().to_owned(), ev.data.to_vec()));
    }
    out
}

/// One client frame.
#[derive(Debug, Clone)]
pub enum Frame {
    /// A `chat.completion.chunk`.
    Chunk(Value),
    /// `{"error":{...}}`.
    Error(Value),
    /// `[DONE]`.
    Done,
}

/// Parses the client-side output into frames; panics on anything that is not
/// `data: <json>\n\n` or `data: [DONE]\n\n`.
pub fn frames(out: &[u8]) -> Vec<Frame> {
    let text = std::str::from_utf8(out).expect("output is UTF-8");
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "output must end with a complete frame: {text:?}"
    );
    let mut frames = Vec::new();
    for raw in text.split_terminator("\n\n") {
        let payload = raw
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("frame without `data: `: {raw:?}"));
        assert!(!payload.contains('\n'), "frame spans lines: {raw:?}");
        if payload == "[DONE]" {
            frames.push(Frame::Done);
            continue;
        }
        let v: Value = sonic_rs::from_str(payload)
            .unwrap_or_else(|e| panic!("invalid JSON frame {payload:?}: {e}"));
        if v.get("error").is_some() {
            frames.push(Frame::Error(v));
        } else {
            frames.push(Frame::Chunk(v));
        }
    }
    frames
}

/// Feeds events one at a time (checking each call appends only complete frames), then EOF.
pub fn run_stream(
    events: &[Event],
    include_usage: bool,
    names: ToolNameMap,
) -> (ChatStream, Vec<u8>) {
    let mut s = ChatStream::new("gpt-5", CREATED, include_usage, names);
    let mut out = Vec::new();
    for (ty, data) in events {
        let before = out.len();
        s.on_event(ty, data, &mut out);
        let added = &out[before..];
        assert!(
            added.is_empty() || (added.starts_with(b"data: ") && added.ends_with(b"\n\n")),
            "partial frame for {ty}"
        );
    }
    s.finish(&mut out);
    assert!(s.is_finished());
    (s, out)
}

/// Feeds events into an aggregator.
pub fn run_aggregate(events: &[Event], names: ToolNameMap) -> ChatAggregator {
    let mut a = ChatAggregator::new("gpt-5", CREATED, names);
    for (ty, data) in events {
        a.on_event(ty, data);
    }
    a
}

/// A tool call as the client reassembles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What a client reconstructs from a stream.
#[derive(Debug, Default)]
pub struct Summary {
    pub id: String,
    pub created: u64,
    pub content: String,
    pub reasoning: String,
    pub refusal: String,
    pub tools: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Value>,
    pub error: Option<Value>,
    pub done: bool,
    pub chunks: usize,
}

/// Checks the stream invariants and reassembles the stream:
/// - the role chunk comes first (once) whenever any chunk is sent;
/// - every chunk shares id / created / model / object;
/// - tool indexes are announced in order 0, 1, 2, ... with id, type and name, and later
///   deltas for an index carry only arguments;
/// - exactly one terminal: either one error frame, last, and no `[DONE]`; or exactly one
///   finish chunk (`delta:{}`), optionally one usage chunk (`choices:[]`), then `[DONE]` last.
pub fn check(frames: &[Frame]) -> Summary {
    let mut s = Summary::default();
    let mut first_chunk = true;
    let mut model = String::new();
    let mut finish_seen = false;
    let mut usage_seen = false;
    for (n, f) in frames.iter().enumerate() {
        let last = n + 1 == frames.len();
        match f {
            Frame::Done => {
                assert!(last, "[DONE] must be the last frame");
                assert!(finish_seen, "[DONE] without a finish chunk");
                assert!(s.error.is_none());
                s.done = true;
            }
            Frame::Error(v) => {
                assert!(last, "the error frame must be the last frame");
                assert!(!finish_seen, "error after a finish chunk");
                let e = &v["error"];
                assert!(e["message"].is_str(), "error.message: {v:?}");
                assert!(e["type"].is_str(), "error.type: {v:?}");
                assert!(e.get("code").is_some(), "error.code: {v:?}");
                s.error = Some(v.clone());
            }
            Frame::Chunk(v) => {
                s.chunks += 1;
                assert_eq!(v["object"].as_str(), Some("chat.completion.chunk"));
                let id = v["id"].as_str().expect("id").to_owned();
                assert!(id.starts_with("chatcmpl-"), "{id}");
                let created = v["created"].as_u64().expect("created");
                let m = v["model"].as_str().expect("model").to_owned();
                if first_chunk {
                    s.id = id;
                    s.created = created;
                    model = m;
                } else {
                    assert_eq!(
                        (s.id.as_str(), s.created, model.as_str()),
                        (id.as_str(), created, m.as_str())
                    );
                }
                let choices = v["choices"].as_array().expect("choices");
                if choices.is_empty() {
                    assert!(
                        finish_seen && !usage_seen,
                        "usage chunk must follow the finish chunk once"
                    );
                    usage_seen = true;
                    let u = &v["usage"];
                    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
                        assert!(u[k].is_u64(), "usage.{k}");
                    }
                    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());
                    assert!(u["completion_tokens_details"]["reasoning_tokens"].is_u64());
                    s.usage = Some(u.clone());
                    first_chunk = false;
                    continue;
                }
                assert!(!finish_seen, "chunk after the finish chunk");
                assert_eq!(choices.len(), 1);
                let c = &choices[0];
                assert_eq!(c["index"].as_u64(), Some(0));
                let delta = c["delta"].as_object().expect("delta");
                if first_chunk {
                    assert_eq!(delta.len(), 2, "role chunk first: {v:?}");
                    assert_eq!(c["delta"]["role"].as_str(), Some("assistant"));
                    assert_eq!(c["delta"]["content"].as_str(), Some(""));
                    assert!(c["finish_reason"].is_null());
                    first_chunk = false;
                    continue;
                }
                assert!(c["delta"].get("role").is_none(), "role sent twice");
                if let Some(reason) = c["finish_reason"].as_str() {
                    assert!(delta.is_empty(), "finish chunk has delta {{}}");
                    assert!(matches!(
                        reason,
                        "stop" | "length" | "tool_calls" | "content_filter"
                    ));
                    finish_seen = true;
                    s.finish_reason = Some(reason.to_owned());
                    continue;
                }
                assert!(c["finish_reason"].is_null());
                assert!(!delta.is_empty(), "empty delta chunk");
                if let Some(t) = c["delta"]["content"].as_str() {
                    s.content.push_str(t);
                }
                if let Some(t) = c["delta"]["reasoning_content"].as_str() {
                    s.reasoning.push_str(t);
                }
                if let Some(t) = c["delta"]["refusal"].as_str() {
                    s.refusal.push_str(t);
                }
                if let Some(calls) = c["delta"]["tool_calls"].as_array() {
                    assert_eq!(calls.len(), 1);
                    let call = &calls[0];
                    let index = call["index"].as_u64().expect("tool index") as usize;
                    let args = call["function"]["arguments"].as_str().expect("arguments");
                    if index == s.tools.len() {
                        assert_eq!(call["type"].as_str(), Some("function"));
                        let id = call["id"].as_str().expect("announce id");
                        let name = call["function"]["name"].as_str().expect("announce name");
                        s.tools.push(ToolCall {
                            id: id.to_owned(),
                            name: name.to_owned(),
                            arguments: args.to_owned(),
                        });
                    } else {
                        assert!(index < s.tools.len(), "tool index {index} skipped ahead");
                        assert!(call.get("id").is_none() && call["function"].get("name").is_none());
                        s.tools[index].arguments.push_str(args);
                    }
                }
            }
        }
    }
    assert!(
        s.done ^ s.error.is_some(),
        "exactly one terminal: done={} error={:?}",
        s.done,
        s.error
    );
    s
}
