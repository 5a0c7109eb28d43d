//! Non-stream aggregation (docs/protocol.md#non-stream-and-usage) on the same transcripts as the stream tests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chat_support;

use chat_support::{check, fixture, frames, run_aggregate, run_stream, CREATED};
use codex_protocol::chat::{chat_to_responses, ChatAggregator, ChatRequestOptions, ToolNameMap};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

fn completion(name: &str, names: ToolNameMap) -> Value {
    let body = run_aggregate(&fixture(name), names).finish().unwrap();
    let v: Value = sonic_rs::from_slice(&body).unwrap();
    assert_eq!(v["object"].as_str(), Some("chat.completion"));
    assert_eq!(v["model"].as_str(), Some("gpt-5"));
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(v["choices"][0]["index"].as_u64(), Some(0));
    assert_eq!(
        v["choices"][0]["message"]["role"].as_str(),
        Some("assistant")
    );
    v
}

#[test]
fn plain_text() {
    let v = completion("text.sse", ToolNameMap::new());
    assert_eq!(v["id"].as_str(), Some("chatcmpl-resp_text_01"));
    assert_eq!(v["created"].as_u64(), Some(1_761_000_000));
    let m = &v["choices"][0]["message"];
    assert_eq!(
        m["content"].as_str(),
        Some("Hello, \"world\"!\nÜnïcödé 😀 </tag> \\ done")
    );
    assert!(m.get("tool_calls").is_none());
    assert!(m.get("reasoning_content").is_none());
    assert_eq!(v["choices"][0]["finish_reason"].as_str(), Some("stop"));
    let u = &v["usage"];
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
}

#[test]
fn reasoning_and_text() {
    let v = completion("reasoning_text.sse", ToolNameMap::new());
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"].as_str(), Some("The answer is 42."));
    assert_eq!(
        m["reasoning_content"].as_str(),
        Some("**Planning** the answer\n\n**Checking** edge cases")
    );
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64(),
        Some(96)
    );
}

#[test]
fn parallel_tool_calls_with_restored_names() {
    let long = "mcp__very_long_server_name_for_testing__xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx_lookup_customer_record";
    let body = format!(
        r#"{{"model":"gpt-5","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"{long}"}}}}]}}"#
    );
    let names = chat_to_responses(body.as_bytes(), &ChatRequestOptions::default())
        .unwrap()
        .name_map;
    let v = completion("parallel_tools.sse", names);
    let m = &v["choices"][0]["message"];
    assert!(
        m["content"].is_null(),
        "content is null when only tool calls"
    );
    let calls = m["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"].as_str(), Some("call_A"));
    assert_eq!(calls[0]["type"].as_str(), Some("function"));
    assert_eq!(calls[0]["function"]["name"].as_str(), Some("get_weather"));
    assert_eq!(
        calls[0]["function"]["arguments"].as_str(),
        Some(r#"{"city":"Paris","unit":"c"}"#)
    );
    assert_eq!(calls[1]["id"].as_str(), Some("call_B"));
    assert_eq!(calls[1]["function"]["name"].as_str(), Some(long));
    assert_eq!(
        calls[1]["function"]["arguments"].as_str(),
        Some(r#"{"id":42}"#)
    );
    assert_eq!(
        v["choices"][0]["finish_reason"].as_str(),
        Some("tool_calls")
    );
}

#[test]
fn incomplete_is_length_and_built_from_deltas() {
    // No output_item.done and an empty output: only the deltas carry the text.
    let v = completion("incomplete.sse", ToolNameMap::new());
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some("This answer is cut off because")
    );
    assert_eq!(v["choices"][0]["finish_reason"].as_str(), Some("length"));
}

#[test]
fn content_filter() {
    let v = completion("content_filter.sse", ToolNameMap::new());
    assert_eq!(
        v["choices"][0]["finish_reason"].as_str(),
        Some("content_filter")
    );
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(""));
}

#[test]
fn empty_output_is_rebuilt_from_output_item_done() {
    let agg = run_aggregate(&fixture("empty_output.sse"), ToolNameMap::new());
    assert!(agg.is_finished());
    assert_eq!(agg.usage().unwrap().cached_tokens, 32);
    let v: Value = sonic_rs::from_slice(&agg.finish().unwrap()).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"].as_str(), Some("Let me check."));
    let calls = m["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"].as_str(), Some("call_E"));
    assert_eq!(
        calls[0]["function"]["arguments"].as_str(),
        Some(r#"{"q":"sse"}"#)
    );
    assert_eq!(
        v["choices"][0]["finish_reason"].as_str(),
        Some("tool_calls")
    );
}

#[test]
fn failed_gives_failure() {
    let f = run_aggregate(&fixture("failed.sse"), ToolNameMap::new())
        .finish()
        .unwrap_err();
    assert_eq!(f.status_hint, 503);
    assert_eq!(f.code.as_deref(), Some("server_error"));
    assert_eq!(f.error_type, "server_error");
    assert!(f.message.contains("Please retry"));
    let body: Value = sonic_rs::from_slice(&f.to_json()).unwrap();
    assert_eq!(body["error"]["code"].as_str(), Some("server_error"));
}

#[test]
fn error_event_gives_rate_limit_failure() {
    let f = run_aggregate(&fixture("error_event.sse"), ToolNameMap::new())
        .finish()
        .unwrap_err();
    assert_eq!(f.status_hint, 429);
    assert_eq!(f.code.as_deref(), Some("rate_limit_exceeded"));
}

#[test]
fn eof_gives_disconnected() {
    let f = run_aggregate(&fixture("eof.sse"), ToolNameMap::new())
        .finish()
        .unwrap_err();
    assert_eq!(f.code.as_deref(), Some("stream_disconnected"));
}

#[test]
fn deltas_alone_are_enough() {
    let mut a = ChatAggregator::new("m", CREATED, ToolNameMap::new()).with_fallback_id("x1");
    a.on_event(
        "response.reasoning_text.delta",
        br#"{"item_id":"r","output_index":0,"content_index":0,"delta":"think"}"#,
    );
    a.on_event(
        "response.output_text.delta",
        br#"{"item_id":"m","output_index":1,"delta":"a\"b"}"#,
    );
    a.on_event(
        "response.function_call_arguments.delta",
        br#"{"item_id":"fc","output_index":2,"delta":"{\"k\":"}"#,
    );
    a.on_event(
        "response.function_call_arguments.delta",
        br#"{"item_id":"fc","output_index":2,"delta":"1}"}"#,
    );
    a.on_event(
        "response.completed",
        br#"{"response":{"usage":{"input_tokens":3,"output_tokens":4}}}"#,
    );
    let v: Value = sonic_rs::from_slice(&a.finish().unwrap()).unwrap();
    assert_eq!(v["id"].as_str(), Some("chatcmpl-x1"));
    assert_eq!(v["created"].as_u64(), Some(CREATED));
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"].as_str(), Some("a\"b"));
    assert_eq!(m["reasoning_content"].as_str(), Some("think"));
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"].as_str(),
        Some(r#"{"k":1}"#)
    );
    assert_eq!(
        v["usage"]["total_tokens"].as_u64(),
        Some(7),
        "total is the sum when absent"
    );
}

#[test]
fn aggregate_matches_stream_on_every_fixture() {
    for name in [
        "text.sse",
        "reasoning_text.sse",
        "parallel_tools.sse",
        "incomplete.sse",
        "empty_output.sse",
        "content_filter.sse",
    ] {
        let events = fixture(name);
        let (_, out) = run_stream(&events, false, ToolNameMap::new());
        let s = check(&frames(&out));
        let v: Value =
            sonic_rs::from_slice(&run_aggregate(&events, ToolNameMap::new()).finish().unwrap())
                .unwrap();
        let m = &v["choices"][0]["message"];
        assert_eq!(m["content"].as_str().unwrap_or(""), s.content, "{name}");
        assert_eq!(
            m["reasoning_content"].as_str().unwrap_or(""),
            s.reasoning,
            "{name}"
        );
        let n = m["tool_calls"].as_array().map_or(0, |a| a.len());
        assert_eq!(n, s.tools.len(), "{name}");
        assert_eq!(
            v["choices"][0]["finish_reason"].as_str(),
            s.finish_reason.as_deref(),
            "{name}"
        );
        assert_eq!(v["id"].as_str(), Some(s.id.as_str()), "{name}");
    }
}
