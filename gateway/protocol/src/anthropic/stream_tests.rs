//! Tests of the response side: [`MessagesStream`] and [`MessagesAggregator`] over upstream
//! event sequences shaped like the Codex backend's.

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use super::{MessagesAggregator, MessagesStream};
use crate::tools::ToolNameMap;

/// `(event type, data)` of one upstream event.
type Ev = (&'static str, String);

fn ev(ty: &'static str, rest: &str) -> Ev {
    let data = if rest.is_empty() {
        format!(r#"{{"type":"{ty}"}}"#)
    } else {
        format!(r#"{{"type":"{ty}",{rest}}}"#)
    };
    (ty, data)
}

fn created() -> Ev {
    ev(
        "response.created",
        r#""response":{"id":"resp_abc","created_at":1700000000,"status":"in_progress","output":[]}"#,
    )
}

fn completed(output: &str) -> Ev {
    ev(
        "response.completed",
        &format!(
            r#""response":{{"id":"resp_abc","status":"completed","output":[{output}],"usage":{{"input_tokens":100,"input_tokens_details":{{"cached_tokens":60}},"output_tokens":7,"output_tokens_details":{{"reasoning_tokens":2}},"total_tokens":107}}}}"#
        ),
    )
}

fn text_events(pieces: &[&str]) -> Vec<Ev> {
    let mut v = vec![
        created(),
        ev(
            "response.in_progress",
            r#""response":{"id":"resp_abc","status":"in_progress"}"#,
        ),
        ev(
            "response.output_item.added",
            r#""output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}"#,
        ),
        ev(
            "response.content_part.added",
            r#""item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":""}"#,
        ),
    ];
    for p in pieces {
        let d = sonic_rs::to_string(p).unwrap();
        v.push(ev(
            "response.output_text.delta",
            &format!(r#""item_id":"msg_1","output_index":0,"content_index":0,"delta":{d}"#),
        ));
    }
    let full = sonic_rs::to_string(&pieces.concat()).unwrap();
    let item = format!(
        r#"{{"id":"msg_1","type":"message","status":"completed","content":[{{"type":"output_text","text":{full}}}],"role":"assistant"}}"#
    );
    v.push(ev(
        "response.output_item.done",
        &format!(r#""output_index":0,"item":{item}"#),
    ));
    v.push(completed(&item));
    v
}

fn reasoning_tool_events() -> Vec<Ev> {
    vec![
        created(),
        ev(
            "response.output_item.added",
            r#""output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}"#,
        ),
        ev(
            "response.reasoning_summary_text.delta",
            r#""item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Think""#,
        ),
        ev(
            "response.reasoning_summary_text.delta",
            r#""item_id":"rs_1","output_index":0,"summary_index":1,"delta":"More""#,
        ),
        ev(
            "response.output_item.done",
            r#""output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Think"},{"type":"summary_text","text":"More"}],"encrypted_content":"gAAAsig"}"#,
        ),
        ev(
            "response.output_item.added",
            r#""output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_1","name":"get_weather"}"#,
        ),
        ev(
            "response.function_call_arguments.delta",
            r#""item_id":"fc_1","output_index":1,"delta":"{\"city\":""#,
        ),
        ev(
            "response.function_call_arguments.delta",
            r#""item_id":"fc_1","output_index":1,"delta":"\"Paris\"}""#,
        ),
        ev(
            "response.function_call_arguments.done",
            r#""item_id":"fc_1","output_index":1,"name":"get_weather","arguments":"{\"city\":\"Paris\"}""#,
        ),
        ev(
            "response.output_item.done",
            r#""output_index":1,"item":{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"city\":\"Paris\"}","call_id":"call_1","name":"get_weather"}"#,
        ),
        completed(
            r#"{"id":"rs_1","type":"reasoning","summary":[]},{"id":"fc_1","type":"function_call","arguments":"{\"city\":\"Paris\"}","call_id":"call_1","name":"get_weather"}"#,
        ),
    ]
}

/// Runs the events through a stream; returns `(event line, data)` of every frame.
fn run(s: &mut MessagesStream, events: &[Ev]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (ty, data) in events {
        s.on_event(ty, data.as_bytes(), &mut out);
    }
    frames(&out)
}

fn frames(out: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(out).unwrap();
    assert!(text.is_empty() || text.ends_with("\n\n"), "{text}");
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (e, d) = f.split_once('\n').unwrap();
            let e = e.strip_prefix("event: ").unwrap().to_owned();
            let d: Value = sonic_rs::from_str(d.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(
                d["type"].as_str(),
                Some(e.as_str()),
                "event line matches type"
            );
            (e, d)
        })
        .collect()
}

fn types(f: &[(String, Value)]) -> Vec<String> {
    f.iter()
        .map(|(e, d)| match d["delta"]["type"].as_str() {
            Some(t) if e == "content_block_delta" => format!("delta:{t}"),
            _ => match d["content_block"]["type"].as_str() {
                Some(t) => format!("start:{t}"),
                None => e.clone(),
            },
        })
        .collect()
}

fn text_of(f: &[(String, Value)]) -> String {
    f.iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

fn stream(thinking: bool, stops: &[&str]) -> MessagesStream {
    let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
    MessagesStream::new("claude-sonnet-4-5", 1, thinking, &stops, ToolNameMap::new())
}

#[test]
fn text_stream_has_anthropics_event_sequence() {
    let f = run(
        &mut stream(false, &[]),
        &text_events(&["Hel", "lo \"x\"\n", "é"]),
    );
    assert_eq!(
        types(&f),
        [
            "message_start",
            "ping",
            "start:text",
            "delta:text_delta",
            "delta:text_delta",
            "delta:text_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start = &f[0].1["message"];
    assert_eq!(start["id"].as_str(), Some("msg_abc"));
    assert_eq!(start["model"].as_str(), Some("claude-sonnet-4-5"));
    assert_eq!(start["role"].as_str(), Some("assistant"));
    assert_eq!(start["content"].as_array().map(|a| a.len()), Some(0));
    assert_eq!(text_of(&f), "Hello \"x\"\né");
    assert!(f[2..7].iter().all(|(_, d)| d["index"].as_u64() == Some(0)));
    let md = &f[7].1;
    assert_eq!(md["delta"]["stop_reason"].as_str(), Some("end_turn"));
    assert!(md["delta"]["stop_sequence"].is_null());
    assert_eq!(md["usage"]["input_tokens"].as_u64(), Some(40));
    assert_eq!(md["usage"]["cache_read_input_tokens"].as_u64(), Some(60));
    assert_eq!(md["usage"]["output_tokens"].as_u64(), Some(7));
}

#[test]
fn thinking_and_tool_use_blocks() {
    let mut s = stream(true, &[]);
    let f = run(&mut s, &reasoning_tool_events());
    assert_eq!(
        types(&f),
        [
            "message_start",
            "ping",
            "start:thinking",
            "delta:thinking_delta",
            "delta:thinking_delta",
            "delta:signature_delta",
            "content_block_stop",
            "start:tool_use",
            "delta:input_json_delta",
            "delta:input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let thinking: String = f
        .iter()
        .filter_map(|(_, d)| d["delta"]["thinking"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(thinking, "Think\n\nMore");
    assert_eq!(f[5].1["delta"]["signature"].as_str(), Some("gAAAsig"));
    let tool = &f[7].1;
    assert_eq!(tool["index"].as_u64(), Some(1));
    assert_eq!(tool["content_block"]["id"].as_str(), Some("call_1"));
    assert_eq!(tool["content_block"]["name"].as_str(), Some("get_weather"));
    let json: String = f
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(json, r#"{"city":"Paris"}"#);
    assert_eq!(f[11].1["delta"]["stop_reason"].as_str(), Some("tool_use"));

    // Without thinking the reasoning is not shown; the tool is block 0.
    let f = run(&mut stream(false, &[]), &reasoning_tool_events());
    assert_eq!(
        types(&f)[2..],
        [
            "start:tool_use",
            "delta:input_json_delta",
            "delta:input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(f[2].1["index"].as_u64(), Some(0));
}

#[test]
fn long_tool_names_are_restored() {
    let long = "x".repeat(80);
    let mut names = ToolNameMap::new();
    let short = names.upstream_name(&long, &[]).to_owned();
    let mut s = MessagesStream::new("m", 1, false, &[], names);
    let events = vec![
        created(),
        ev(
            "response.output_item.done",
            &format!(
                r#""output_index":0,"item":{{"id":"fc_9","type":"function_call","arguments":"{{}}","call_id":"call_9","name":"{short}"}}"#
            ),
        ),
        completed(""),
    ];
    let f = run(&mut s, &events);
    assert_eq!(
        f[2].1["content_block"]["name"].as_str(),
        Some(long.as_str())
    );
}

#[test]
fn stop_sequences_cut_the_text() {
    let f = run(
        &mut stream(false, &["STOP"]),
        &text_events(&["one tw", "o ST", "OP three"]),
    );
    assert_eq!(text_of(&f), "one two ");
    let md = &f.iter().find(|(e, _)| e == "message_delta").unwrap().1;
    assert_eq!(md["delta"]["stop_reason"].as_str(), Some("stop_sequence"));
    assert_eq!(md["delta"]["stop_sequence"].as_str(), Some("STOP"));
    // A prefix that never completes is released at the end of the block.
    let f = run(&mut stream(false, &["STOP"]), &text_events(&["a S", "T"]));
    assert_eq!(text_of(&f), "a ST");
    assert_eq!(
        types(&f)[types(&f).len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
}

#[test]
fn incomplete_is_max_tokens() {
    let mut events = text_events(&["partial"]);
    events.pop();
    events.push(ev(
        "response.incomplete",
        r#""response":{"id":"resp_abc","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[],"usage":{"input_tokens":3,"output_tokens":9}}"#,
    ));
    let f = run(&mut stream(false, &[]), &events);
    let md = &f.iter().find(|(e, _)| e == "message_delta").unwrap().1;
    assert_eq!(md["delta"]["stop_reason"].as_str(), Some("max_tokens"));
    assert_eq!(md["usage"]["output_tokens"].as_u64(), Some(9));
}

#[test]
fn failure_after_output_ends_with_one_error_event() {
    let mut s = stream(false, &[]);
    let mut events = text_events(&["Hel"]);
    events.truncate(5);
    events.push(ev(
        "response.failed",
        r#""response":{"id":"resp_abc","status":"failed","error":{"code":"server_is_overloaded","message":"busy"}}"#,
    ));
    events.push(completed(""));
    let mut out = Vec::new();
    for (ty, data) in &events {
        s.on_event(ty, data.as_bytes(), &mut out);
    }
    assert!(s.is_finished());
    s.fail(&mut out, "overloaded_error", "busy");
    s.fail(&mut out, "overloaded_error", "again");
    let f = frames(&out);
    assert_eq!(
        types(&f),
        [
            "message_start",
            "ping",
            "start:text",
            "delta:text_delta",
            "error"
        ]
    );
    let e = &f[4].1;
    assert_eq!(e["error"]["type"].as_str(), Some("overloaded_error"));
    assert_eq!(e["error"]["message"].as_str(), Some("busy"));

    // Upstream EOF (no terminal): the gateway calls fail; after a success it never writes.
    let mut s = stream(false, &[]);
    let mut out = Vec::new();
    for (ty, data) in &text_events(&["x"])[..5] {
        s.on_event(ty, data.as_bytes(), &mut out);
    }
    s.fail(&mut out, "api_error", "stream disconnected");
    assert_eq!(frames(&out).last().unwrap().0, "error");
    let mut s = stream(false, &[]);
    let mut out = Vec::new();
    for (ty, data) in &text_events(&["x"]) {
        s.on_event(ty, data.as_bytes(), &mut out);
    }
    let n = out.len();
    s.fail(&mut out, "api_error", "late");
    assert_eq!(out.len(), n);
}

#[test]
fn nothing_streamed_falls_back_to_the_final_output() {
    let events = vec![
        created(),
        completed(
            r#"{"id":"msg_1","type":"message","content":[{"type":"output_text","text":"whole"}],"role":"assistant"},{"id":"fc_2","type":"function_call","arguments":"{\"a\":1}","call_id":"call_2","name":"t"}"#,
        ),
    ];
    let f = run(&mut stream(false, &[]), &events);
    assert_eq!(
        types(&f),
        [
            "message_start",
            "ping",
            "start:text",
            "delta:text_delta",
            "content_block_stop",
            "start:tool_use",
            "delta:input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(text_of(&f), "whole");
    assert_eq!(f[6].1["delta"]["partial_json"].as_str(), Some(r#"{"a":1}"#));
}

fn aggregate(mut a: MessagesAggregator, events: &[Ev]) -> Option<Value> {
    for (ty, data) in events {
        a.on_event(ty, data.as_bytes());
    }
    a.finish().map(|b| sonic_rs::from_slice(&b).unwrap())
}

#[test]
fn aggregator_builds_one_message() {
    let m = aggregate(
        MessagesAggregator::new(stream(true, &[])),
        &reasoning_tool_events(),
    )
    .unwrap();
    assert_eq!(m["type"].as_str(), Some("message"));
    assert_eq!(m["id"].as_str(), Some("msg_abc"));
    assert_eq!(m["role"].as_str(), Some("assistant"));
    assert_eq!(m["model"].as_str(), Some("claude-sonnet-4-5"));
    assert_eq!(m["stop_reason"].as_str(), Some("tool_use"));
    let c = m["content"].as_array().unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c[0]["type"].as_str(), Some("thinking"));
    assert_eq!(c[0]["thinking"].as_str(), Some("Think\n\nMore"));
    assert_eq!(c[0]["signature"].as_str(), Some("gAAAsig"));
    assert_eq!(c[1]["type"].as_str(), Some("tool_use"));
    assert_eq!(c[1]["id"].as_str(), Some("call_1"));
    assert_eq!(c[1]["input"]["city"].as_str(), Some("Paris"));
    assert_eq!(m["usage"]["input_tokens"].as_u64(), Some(40));
    assert_eq!(m["usage"]["output_tokens"].as_u64(), Some(7));

    let m = aggregate(
        MessagesAggregator::new(stream(false, &["wor"])),
        &text_events(&["hello ", "world"]),
    )
    .unwrap();
    assert_eq!(m["content"][0]["type"].as_str(), Some("text"));
    assert_eq!(m["content"][0]["text"].as_str(), Some("hello "));
    assert_eq!(m["stop_reason"].as_str(), Some("stop_sequence"));
    assert_eq!(m["stop_sequence"].as_str(), Some("wor"));

    // A failed or unfinished upstream gives no message (the gateway answers the error).
    let mut failed = text_events(&["x"]);
    failed.truncate(5);
    let unfinished = failed.clone();
    failed.push(ev(
        "response.failed",
        r#""response":{"id":"resp_abc","status":"failed","error":{"code":"server_error","message":"x"}}"#,
    ));
    assert!(aggregate(MessagesAggregator::new(stream(false, &[])), &failed).is_none());
    assert!(aggregate(MessagesAggregator::new(stream(false, &[])), &unfinished).is_none());
}

proptest::proptest! {
    /// Any text, cut into any deltas, with any stop sequence: the streamed text and the
    /// aggregated text are both the full text cut before the sequence's first occurrence.
    #[test]
    fn streamed_and_aggregated_text_agree_with_the_cut(
        text in "[a-cé\"\\\\\n ]{0,40}",
        cuts in proptest::collection::vec(0usize..40, 0..6),
        stop in "[a-c]{1,3}",
    ) {
        let chars: Vec<char> = text.chars().collect();
        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(chars.len())).collect();
        bounds.push(0);
        bounds.push(chars.len());
        bounds.sort_unstable();
        bounds.dedup();
        let pieces: Vec<String> = bounds
            .windows(2)
            .map(|w| chars[w[0]..w[1]].iter().collect())
            .collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let events = text_events(&refs);
        let want = match text.find(&stop) {
            Some(at) => text[..at].to_owned(),
            None => text.clone(),
        };
        let f = run(&mut stream(false, std::slice::from_ref(&stop.as_str())), &events);
        proptest::prop_assert_eq!(text_of(&f), want.clone());
        let m = aggregate(
            MessagesAggregator::new(stream(false, &[stop.as_str()])),
            &events,
        )
        .unwrap();
        let got = m["content"][0]["text"].as_str().unwrap_or("").to_owned();
        proptest::prop_assert_eq!(got, want);
        let reason = m["stop_reason"].as_str().unwrap_or("").to_owned();
        proptest::prop_assert_eq!(
            reason,
            if text.contains(&stop) { "stop_sequence" } else { "end_turn" }
        );
    }
}
