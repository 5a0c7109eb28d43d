//! Stream translation (docs/protocol.md#stream) from recorded Codex SSE transcripts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chat_support;

use chat_support::{check, fixture, frames, run_stream, Frame, CREATED};
use codex_protocol::chat::{chat_to_responses, ChatRequestOptions, ChatStream, ToolNameMap};
use sonic_rs::JsonValueTrait;

const LONG_TOOL: &str =
    "mcp__very_long_server_name_for_testing__xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx_lookup_customer_record";

fn long_tool_map() -> ToolNameMap {
    let body = format!(
        r#"{{"model":"gpt-5","stream":true,"messages":[{{"role":"user","content":"hi"}}],
            "tools":[{{"type":"function","function":{{"name":"get_weather","parameters":{{"type":"object"}}}}}},
                     {{"type":"function","function":{{"name":"{LONG_TOOL}","parameters":{{"type":"object"}}}}}}]}}"#
    );
    chat_to_responses(body.as_bytes(), &ChatRequestOptions::default())
        .unwrap()
        .name_map
}

#[test]
fn plain_text() {
    let (s, out) = run_stream(&fixture("text.sse"), false, ToolNameMap::new());
    let f = frames(&out);
    let sum = check(&f);
    assert_eq!(sum.content, "Hello, \"world\"!\nÜnïcödé 😀 </tag> \\ done");
    assert_eq!(sum.id, "chatcmpl-resp_text_01");
    assert_eq!(
        sum.created, 1_761_000_000,
        "created comes from response.created"
    );
    assert_eq!(sum.finish_reason.as_deref(), Some("stop"));
    assert!(sum.usage.is_none(), "no usage chunk without include_usage");
    assert!(sum.done);
    // role + 4 deltas + finish; codex.rate_limits / content_part.* / done events dropped
    assert_eq!(sum.chunks, 6);
    assert!(matches!(f.last(), Some(Frame::Done)));
    let u = s.usage().unwrap();
    assert_eq!(
        (
            u.input_tokens,
            u.cached_tokens,
            u.output_tokens,
            u.total_tokens
        ),
        (21, 8, 12, 33)
    );
    assert_eq!(s.service_tier(), Some("auto"));
    assert!(s.failure().is_none());
}

#[test]
fn usage_chunk_only_with_include_usage() {
    let (_, out) = run_stream(&fixture("text.sse"), true, ToolNameMap::new());
    let sum = check(&frames(&out));
    let u = sum.usage.expect("usage chunk");
    assert_eq!(u["prompt_tokens"].as_u64(), Some(21));
    assert_eq!(u["completion_tokens"].as_u64(), Some(12));
    assert_eq!(u["total_tokens"].as_u64(), Some(33));
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(8)
    );
    assert_eq!(
        u["completion_tokens_details"]["reasoning_tokens"].as_u64(),
        Some(0)
    );
    let text = String::from_utf8(out).unwrap();
    assert!(text.ends_with("\"choices\":[],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":12,\"total_tokens\":33,\"prompt_tokens_details\":{\"cached_tokens\":8},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\ndata: [DONE]\n\n"));
}

#[test]
fn reasoning_then_text() {
    let (s, out) = run_stream(&fixture("reasoning_text.sse"), true, ToolNameMap::new());
    let sum = check(&frames(&out));
    assert_eq!(
        sum.reasoning,
        "**Planning** the answer\n\n**Checking** edge cases"
    );
    assert_eq!(sum.content, "The answer is 42.");
    assert_eq!(sum.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        sum.usage.unwrap()["completion_tokens_details"]["reasoning_tokens"].as_u64(),
        Some(96)
    );
    assert_eq!(s.usage().unwrap().reasoning_tokens, 96);
}

#[test]
fn parallel_tool_calls_keep_stable_indexes_and_restore_names() {
    let names = long_tool_map();
    assert_eq!(names.len(), 1);
    let (_, out) = run_stream(&fixture("parallel_tools.sse"), false, names);
    let f = frames(&out);
    let sum = check(&f);
    assert_eq!(sum.tools.len(), 2);
    assert_eq!(sum.tools[0].id, "call_A");
    assert_eq!(sum.tools[0].name, "get_weather");
    assert_eq!(sum.tools[0].arguments, r#"{"city":"Paris","unit":"c"}"#);
    assert_eq!(sum.tools[1].id, "call_B");
    assert_eq!(sum.tools[1].name, LONG_TOOL, "shortened name restored");
    assert_eq!(sum.tools[1].arguments, r#"{"id":42}"#);
    assert_eq!(sum.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(sum.content, "");
    // arguments were streamed as deltas, never repeated from .done: 2 announces + 5 deltas
    assert_eq!(sum.chunks, 1 + 2 + 5 + 1);
}

#[test]
fn incomplete_maps_to_length() {
    let (s, out) = run_stream(&fixture("incomplete.sse"), true, ToolNameMap::new());
    let sum = check(&frames(&out));
    assert_eq!(sum.content, "This answer is cut off because");
    assert_eq!(sum.finish_reason.as_deref(), Some("length"));
    assert!(sum.done);
    assert_eq!(s.usage().unwrap().output_tokens, 16);
}

#[test]
fn content_filter_without_output() {
    let (_, out) = run_stream(&fixture("content_filter.sse"), false, ToolNameMap::new());
    let sum = check(&frames(&out));
    assert_eq!(sum.finish_reason.as_deref(), Some("content_filter"));
    assert_eq!(sum.chunks, 2, "role chunk + finish chunk");
}

#[test]
fn failed_sends_one_error_and_no_done() {
    let (s, out) = run_stream(&fixture("failed.sse"), true, ToolNameMap::new());
    let f = frames(&out);
    let sum = check(&f);
    assert!(!sum.done);
    assert_eq!(sum.content, "Partial ");
    let e = &sum.error.unwrap()["error"];
    assert_eq!(e["code"].as_str(), Some("server_error"));
    assert_eq!(e["type"].as_str(), Some("server_error"));
    assert!(e["message"].as_str().unwrap().contains("Please retry"));
    assert_eq!(f.iter().filter(|f| matches!(f, Frame::Error(_))).count(), 1);
    let failure = s.failure().unwrap();
    assert_eq!(failure.status_hint, 503);
}

#[test]
fn error_event_before_output_sends_only_the_error() {
    let (s, out) = run_stream(&fixture("error_event.sse"), false, ToolNameMap::new());
    let f = frames(&out);
    assert_eq!(f.len(), 1, "no role chunk before an early error");
    let sum = check(&f);
    let e = &sum.error.unwrap()["error"];
    assert_eq!(e["code"].as_str(), Some("rate_limit_exceeded"));
    assert_eq!(
        e["message"].as_str(),
        Some("Rate limit reached for requests")
    );
    assert_eq!(s.failure().unwrap().status_hint, 429);
    assert!(!s.has_started() || s.is_finished());
}

#[test]
fn eof_without_terminal_is_an_error() {
    let (_, out) = run_stream(&fixture("eof.sse"), true, ToolNameMap::new());
    let sum = check(&frames(&out));
    assert_eq!(sum.content, "Never finished");
    let e = &sum.error.unwrap()["error"];
    assert_eq!(e["code"].as_str(), Some("stream_disconnected"));
}

#[test]
fn completed_with_empty_output_and_args_only_in_done() {
    let (s, out) = run_stream(&fixture("empty_output.sse"), true, ToolNameMap::new());
    let sum = check(&frames(&out));
    assert_eq!(sum.content, "Let me check.");
    assert_eq!(sum.tools.len(), 1);
    assert_eq!(sum.tools[0].name, "search_docs");
    assert_eq!(
        sum.tools[0].arguments, r#"{"q":"sse"}"#,
        "full arguments from .done, once"
    );
    assert_eq!(sum.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(s.usage().unwrap().cached_tokens, 32);
}

#[test]
fn events_after_terminal_are_ignored() {
    let mut events = fixture("text.sse");
    events.extend(fixture("failed.sse"));
    events.extend(fixture("text.sse"));
    let (_, out) = run_stream(&events, false, ToolNameMap::new());
    let sum = check(&frames(&out));
    assert!(sum.done);
    assert_eq!(sum.content, "Hello, \"world\"!\nÜnïcödé 😀 </tag> \\ done");
}

#[test]
fn data_only_frames_and_fallback_id() {
    // No `event:` lines and no response.created: type from the data, id from the fallback.
    let mut s =
        ChatStream::new("my-model", CREATED, false, ToolNameMap::new()).with_fallback_id("abc");
    let mut out = Vec::new();
    s.on_event(
        "",
        br#"{"type":"response.output_text.delta","item_id":"m","output_index":0,"delta":"x"}"#,
        &mut out,
    );
    s.on_event(
        "",
        br#"{"type":"response.completed","response":{"id":"resp_late","output":[]}}"#,
        &mut out,
    );
    let sum = check(&frames(&out));
    assert_eq!(sum.id, "chatcmpl-abc");
    assert_eq!(sum.created, CREATED);
    assert_eq!(sum.content, "x");
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("\"model\":\"my-model\""));
}

#[test]
fn nothing_streamed_falls_back_to_final_output() {
    let mut s = ChatStream::new("m", CREATED, false, ToolNameMap::new());
    let mut out = Vec::new();
    s.on_event(
        "response.completed",
        br#"{"type":"response.completed","response":{"id":"r","output":[{"type":"message","id":"m1","content":[{"type":"output_text","text":"from output"}]},{"type":"function_call","id":"fc","call_id":"c1","name":"f","arguments":"{}"}]}}"#,
        &mut out,
    );
    let sum = check(&frames(&out));
    assert_eq!(sum.content, "from output");
    assert_eq!(sum.tools.len(), 1);
    assert_eq!(sum.tools[0].arguments, "{}");
    assert_eq!(sum.finish_reason.as_deref(), Some("tool_calls"));
}

#[test]
fn output_item_done_without_added_announces_the_whole_call() {
    let mut s = ChatStream::new("m", CREATED, false, ToolNameMap::new());
    let mut out = Vec::new();
    s.on_event(
        "response.function_call_arguments.delta",
        br#"{"item_id":"fc","output_index":0,"delta":"{\"a\""}"#,
        &mut out,
    );
    s.on_event("response.output_item.done", br#"{"output_index":0,"item":{"type":"function_call","id":"fc","call_id":"c9","name":"g","arguments":"{\"a\":1}"}}"#, &mut out);
    s.on_event(
        "response.completed",
        br#"{"response":{"id":"r"}}"#,
        &mut out,
    );
    let sum = check(&frames(&out));
    assert_eq!(sum.tools.len(), 1);
    assert_eq!(
        (sum.tools[0].id.as_str(), sum.tools[0].name.as_str()),
        ("c9", "g")
    );
    assert_eq!(sum.tools[0].arguments, r#"{"a":1}"#);
}

#[test]
fn custom_tool_call_streams_as_function() {
    let mut s = ChatStream::new("m", CREATED, false, ToolNameMap::new());
    let mut out = Vec::new();
    s.on_event("response.output_item.added", br#"{"output_index":0,"item":{"type":"custom_tool_call","id":"ct","call_id":"c1","name":"apply_patch","input":""}}"#, &mut out);
    s.on_event(
        "response.custom_tool_call_input.delta",
        br#"{"item_id":"ct","output_index":0,"delta":"*** Begin Patch\n"}"#,
        &mut out,
    );
    s.on_event(
        "response.custom_tool_call_input.done",
        br#"{"item_id":"ct","output_index":0,"input":"*** Begin Patch\n"}"#,
        &mut out,
    );
    s.on_event(
        "response.completed",
        br#"{"response":{"id":"r"}}"#,
        &mut out,
    );
    let sum = check(&frames(&out));
    assert_eq!(sum.tools[0].name, "apply_patch");
    assert_eq!(sum.tools[0].arguments, "*** Begin Patch\n");
}

#[test]
fn malformed_terminal_still_terminates() {
    let mut s = ChatStream::new("m", CREATED, true, ToolNameMap::new());
    let mut out = Vec::new();
    s.on_event("response.output_text.delta", b"{not json", &mut out);
    s.on_event("response.completed", b"garbage", &mut out);
    let sum = check(&frames(&out));
    assert!(sum.done);
    assert_eq!(sum.usage.unwrap()["total_tokens"].as_u64(), Some(0));
}
