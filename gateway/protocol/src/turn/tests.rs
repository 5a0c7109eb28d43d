//! Every upstream event kind -> its neutral event, and the same reading of a transcript split
//! at every byte.

use super::*;
use crate::sse::SseSplitter;

fn item_desc(item: &Item<'_>) -> String {
    match item {
        Item::Message(m) => format!("message id={:?} parts={:?}", m.id.as_deref(), {
            m.parts().collect::<Vec<_>>()
        }),
        Item::ToolCall(c) => call_desc(c),
        Item::Reasoning(r) => format!(
            "reasoning summary={:?} sig={:?}",
            r.summary_text(),
            r.encrypted_content.as_deref()
        ),
    }
}

fn call_desc(c: &ToolCall<'_>) -> String {
    format!(
        "call id={:?} call_id={:?} name={:?} args={:?}",
        c.id.as_deref(),
        c.call_id.as_deref(),
        c.name.as_deref(),
        c.arguments.as_ref().map(|v| v.as_raw_str())
    )
}

fn delta_desc(d: &Delta<'_>) -> String {
    format!(
        "token={:?} item={:?} oi={:?}",
        d.token, d.item_id, d.output_index
    )
}

/// A one-line rendering of an event, for comparisons.
fn describe(ev: &TurnEvent<'_>) -> String {
    match ev {
        TurnEvent::Started(s) => format!("started id={:?} at={:?}", s.id.as_deref(), s.created_at),
        TurnEvent::Text(d) => format!("text {}", delta_desc(d)),
        TurnEvent::Refusal(d) => format!("refusal {}", delta_desc(d)),
        TurnEvent::ToolArgs(d) => format!("args {}", delta_desc(d)),
        TurnEvent::Reasoning(r) => format!(
            "reasoning token={:?} oi={} part={} summary={}",
            r.token, r.output_index, r.part, r.summary
        ),
        TurnEvent::ToolCallStart { call, output_index } => {
            format!("call_start {} oi={output_index:?}", call_desc(call))
        }
        TurnEvent::ToolArgsDone(a) => format!(
            "args_done item={:?} oi={:?} name={:?} args={:?}",
            a.item_id.as_deref(),
            a.output_index,
            a.name.as_deref(),
            a.arguments.as_ref().map(|v| v.as_raw_str())
        ),
        TurnEvent::ItemDone { item, output_index } => {
            format!("item_done {} oi={output_index:?}", item_desc(item))
        }
        TurnEvent::Finished(f) => format!(
            "finished {:?} usage={:?} tier={:?} output=[{}]",
            f.stop,
            f.usage().map(|u| (
                u.input_tokens,
                u.cached_tokens,
                u.output_tokens,
                u.reasoning_tokens,
                u.total_tokens
            )),
            f.service_tier(),
            f.output()
                .map(|(i, it)| format!("{i}:{}", item_desc(&it)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TurnEvent::Failed(f) => format!(
            "failed usage={:?} error={:?}",
            f.usage.map(|u| u.total_tokens),
            f.error_json()
        ),
    }
}

fn read_desc(ty: &str, data: &str) -> Option<String> {
    read(ty, data.as_bytes()).as_ref().map(describe)
}

/// `(SSE type, data, neutral event)` for every kind the translators act on.
const TABLE: &[(&str, &str, &str)] = &[
    (
        "response.created",
        r#"{"type":"response.created","response":{"id":"resp_1","created_at":1700000000}}"#,
        r#"started id=Some("resp_1") at=Some(1700000000)"#,
    ),
    (
        "response.in_progress",
        r#"{"type":"response.in_progress","response":{"id":"","created_at":1700000001.9}}"#,
        "started id=None at=Some(1700000001)",
    ),
    (
        "response.queued",
        r#"{"type":"response.queued","response":7}"#,
        "started id=None at=None",
    ),
    (
        "response.output_text.delta",
        r#"{"type":"response.output_text.delta","item_id":"m1","output_index":1,"content_index":0,"delta":"a \"b\"\n"}"#,
        r#"text token=Some("\"a \\\"b\\\"\\n\"") item=Some("m1") oi=Some(1)"#,
    ),
    (
        "response.output_text.delta",
        r#"{"type":"response.output_text.delta","item_id":"m1","delta":""}"#,
        r#"text token=None item=Some("m1") oi=None"#,
    ),
    (
        "response.refusal.delta",
        r#"{"type":"response.refusal.delta","item_id":"m1","output_index":0,"delta":"no"}"#,
        r#"refusal token=Some("\"no\"") item=Some("m1") oi=Some(0)"#,
    ),
    (
        "response.reasoning_summary_text.delta",
        r#"{"type":"response.reasoning_summary_text.delta","item_id":"rs","output_index":0,"summary_index":2,"content_index":5,"delta":"think"}"#,
        r#"reasoning token=Some("\"think\"") oi=0 part=2 summary=true"#,
    ),
    (
        "response.reasoning_text.delta",
        r#"{"type":"response.reasoning_text.delta","summary_index":2,"content_index":5,"delta":"raw"}"#,
        r#"reasoning token=Some("\"raw\"") oi=0 part=5 summary=false"#,
    ),
    (
        "response.function_call_arguments.delta",
        r#"{"type":"response.function_call_arguments.delta","item_id":"fc1","output_index":2,"delta":"{\"a\":"}"#,
        r#"args token=Some("\"{\\\"a\\\":\"") item=Some("fc1") oi=Some(2)"#,
    ),
    (
        "response.custom_tool_call_input.delta",
        r#"{"type":"response.custom_tool_call_input.delta","output_index":3,"delta":"patch"}"#,
        r#"args token=Some("\"patch\"") item=None oi=Some(3)"#,
    ),
    (
        "response.output_item.added",
        r#"{"type":"response.output_item.added","output_index":2,"item":{"id":"fc1","type":"function_call","call_id":"call_1","name":"get","arguments":""}}"#,
        r#"call_start call id=Some("fc1") call_id=Some("call_1") name=Some("get") args=Some("\"\"") oi=Some(2)"#,
    ),
    (
        "response.output_item.added",
        r#"{"type":"response.output_item.added","output_index":3,"item":{"id":"ct1","type":"custom_tool_call","name":"apply_patch","input":"x"}}"#,
        r#"call_start call id=Some("ct1") call_id=None name=Some("apply_patch") args=Some("\"x\"") oi=Some(3)"#,
    ),
    (
        "response.function_call_arguments.done",
        r#"{"type":"response.function_call_arguments.done","item_id":"fc1","output_index":2,"name":"get","arguments":"{}"}"#,
        r#"args_done item=Some("fc1") oi=Some(2) name=Some("get") args=Some("\"{}\"")"#,
    ),
    (
        "response.custom_tool_call_input.done",
        r#"{"type":"response.custom_tool_call_input.done","item_id":"ct1","input":"x y"}"#,
        r#"args_done item=Some("ct1") oi=None name=None args=Some("\"x y\"")"#,
    ),
    (
        "response.output_item.done",
        r#"{"type":"response.output_item.done","output_index":1,"item":{"id":"m1","type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"},{"type":"refusal","refusal":"no"},{"type":"output_audio"}]}}"#,
        r#"item_done message id=Some("m1") parts=[Text("Hi"), Refusal("no")] oi=Some(1)"#,
    ),
    (
        "response.output_item.done",
        r#"{"type":"response.output_item.done","output_index":2,"item":{"id":"fc1","type":"function_call","call_id":"call_1","name":"get","arguments":"{\"a\":1}"}}"#,
        r#"item_done call id=Some("fc1") call_id=Some("call_1") name=Some("get") args=Some("\"{\\\"a\\\":1}\"") oi=Some(2)"#,
    ),
    (
        "response.output_item.done",
        r#"{"type":"response.output_item.done","output_index":0,"item":{"id":"rs","type":"reasoning","summary":[{"type":"summary_text","text":"one"},{"type":"summary_text","text":""},{"type":"summary_text","text":"two"}],"encrypted_content":"gAAA"}}"#,
        r#"item_done reasoning summary="one\n\ntwo" sig=Some("gAAA") oi=Some(0)"#,
    ),
    (
        "response.completed",
        r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","service_tier":"priority","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":15},"output":[{"id":"m1","type":"message","content":[{"type":"output_text","text":"Hi"}]},{"id":"ws","type":"web_search_call"},{"id":"fc1","type":"function_call","call_id":"c","name":"n","arguments":"{}"}]}}"#,
        r#"finished Completed usage=Some((10, 4, 5, 2, 15)) tier=Some("priority") output=[0:message id=Some("m1") parts=[Text("Hi")], 2:call id=Some("fc1") call_id=Some("c") name=Some("n") args=Some("\"{}\"")]"#,
    ),
    (
        "response.done",
        r#"{"type":"response.done","response":{"usage":{"input_tokens":3,"output_tokens":4},"output":[]}}"#,
        "finished Completed usage=Some((3, 0, 4, 0, 7)) tier=None output=[]",
    ),
    (
        "response.incomplete",
        r#"{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_tokens"}}}"#,
        "finished MaxOutputTokens usage=None tier=None output=[]",
    ),
    (
        "response.incomplete",
        r#"{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}"#,
        "finished ContentFilter usage=None tier=None output=[]",
    ),
    (
        "response.incomplete",
        r#"{"type":"response.incomplete","response":{}}"#,
        "finished MaxOutputTokens usage=None tier=None output=[]",
    ),
    (
        "response.failed",
        r#"{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded","message":"slow"},"usage":{"input_tokens":1,"output_tokens":1}}}"#,
        r#"failed usage=Some(2) error=Some("{\"code\":\"rate_limit_exceeded\",\"message\":\"slow\"}")"#,
    ),
    (
        "error",
        r#"{"type":"error","error":{"type":"usage_limit_reached","message":"lim"}}"#,
        r#"failed usage=None error=Some("{\"type\":\"usage_limit_reached\",\"message\":\"lim\"}")"#,
    ),
];

#[test]
fn every_event_kind_reads_into_its_neutral_event() {
    for (ty, data, want) in TABLE {
        assert_eq!(read_desc(ty, data).as_deref(), Some(*want), "{ty}: {data}");
        // A `data:`-only frame (no `event:` line) and a `message` type read the same.
        assert_eq!(read_desc("", data).as_deref(), Some(*want), "{data}");
        assert_eq!(read_desc("message", data).as_deref(), Some(*want), "{data}");
    }
}

#[test]
fn events_no_translator_acts_on_read_as_none() {
    for (ty, data) in [
        (
            "codex.rate_limits",
            r#"{"type":"codex.rate_limits","rate_limits":{}}"#,
        ),
        (
            "response.output_text.done",
            r#"{"type":"response.output_text.done","text":"x"}"#,
        ),
        (
            "response.content_part.added",
            r#"{"type":"response.content_part.added"}"#,
        ),
        ("", r#"{"type":"response.unknown"}"#),
        ("", "not json"),
        // other items that begin or end are not events
        (
            "response.output_item.added",
            r#"{"type":"response.output_item.added","item":{"id":"m1","type":"message"}}"#,
        ),
        (
            "response.output_item.added",
            r#"{"type":"response.output_item.added","item":{"id":"rs","type":"reasoning"}}"#,
        ),
        (
            "response.output_item.done",
            r#"{"type":"response.output_item.done","item":{"id":"ws","type":"web_search_call"}}"#,
        ),
        (
            "response.output_item.done",
            r#"{"type":"response.output_item.done","item":{}}"#,
        ),
        (
            "response.output_item.done",
            r#"{"type":"response.output_item.done"}"#,
        ),
        // malformed non-terminal events are skipped
        ("response.output_text.delta", r#"{"delta":"x""#),
        ("response.output_text.delta", r#"{"delta":5}"#),
        ("response.reasoning_text.delta", r#"{"delta":"bad \q"}"#),
        ("response.function_call_arguments.delta", "{"),
        ("response.output_item.added", "{not json"),
        ("response.output_item.done", "[1]"),
        ("response.function_call_arguments.done", "nope"),
    ] {
        assert_eq!(read_desc(ty, data), None, "{ty}: {data}");
    }
}

#[test]
fn malformed_terminal_events_still_end_the_turn() {
    assert_eq!(
        read_desc("response.completed", "{not json").as_deref(),
        Some("finished Completed usage=None tier=None output=[]")
    );
    assert_eq!(
        read_desc("response.incomplete", "{not json").as_deref(),
        Some("finished MaxOutputTokens usage=None tier=None output=[]")
    );
    assert_eq!(
        read_desc("response.failed", "{not json").as_deref(),
        Some("failed usage=None error=None")
    );
    assert_eq!(
        read_desc("response.created", "{not json").as_deref(),
        Some("started id=None at=None")
    );
    // A malformed `output` is an empty one.
    assert_eq!(
        read_desc(
            "response.completed",
            r#"{"type":"response.completed","response":{"output":{"not":"an array"}}}"#
        )
        .as_deref(),
        Some("finished Completed usage=None tier=None output=[]")
    );
}

#[test]
fn deltas_and_plain_strings_borrow_the_data() {
    let within = |data: &[u8], s: &str| {
        let range = data.as_ptr_range();
        range.contains(&s.as_ptr()) && s.len() <= data.len()
    };
    let data =
        br#"{"type":"response.output_text.delta","item_id":"m1","output_index":0,"delta":"x\ny"}"#;
    let Some(TurnEvent::Text(d)) = read("", data) else {
        panic!("a text delta");
    };
    assert!(within(data, d.token.unwrap_or_default()));
    assert!(within(data, d.item_id.unwrap_or_default()));
    let data = br#"{"type":"response.output_item.added","item":{"id":"fc1","type":"function_call","call_id":"c1","name":"get","arguments":""}}"#;
    let Some(TurnEvent::ToolCallStart { call, .. }) = read("", data) else {
        panic!("a call start");
    };
    for s in [&call.id, &call.call_id, &call.name] {
        assert!(
            matches!(s, Some(Cow::Borrowed(b)) if within(data, b)),
            "{s:?}"
        );
    }
}

/// A transcript with every kind, as the upstream sends it (some events without `event:`).
fn transcript() -> Vec<u8> {
    let mut t = Vec::new();
    for (i, (ty, data, _)) in TABLE.iter().enumerate() {
        if i % 3 == 0 {
            t.extend_from_slice(format!("data: {data}\n\n").as_bytes());
        } else {
            t.extend_from_slice(format!("event: {ty}\r\ndata: {data}\r\n\r\n").as_bytes());
        }
        if i % 4 == 0 {
            t.extend_from_slice(b": keep-alive\n\nevent: codex.rate_limits\ndata: {\"type\":\"codex.rate_limits\"}\n\n");
        }
    }
    t
}

/// Feeds `chunks` to a splitter and reads every event it yields.
fn read_stream<'c>(chunks: impl IntoIterator<Item = &'c [u8]>) -> Vec<String> {
    let mut s = SseSplitter::default();
    let mut out = Vec::new();
    for chunk in chunks {
        s.push(chunk);
        while let Ok(Some(ev)) = s.next_event() {
            if let Some(e) = read(ev.event_type(), &ev.data) {
                out.push(describe(&e));
            }
        }
    }
    out
}

#[test]
fn a_transcript_split_at_every_byte_reads_the_same() {
    let t = transcript();
    let whole = read_stream([&t[..]]);
    let want: Vec<&str> = TABLE.iter().map(|(_, _, want)| *want).collect();
    assert_eq!(whole, want);
    for cut in 0..=t.len() {
        let (a, b) = t.split_at(cut);
        assert_eq!(read_stream([a, b]), whole, "split at {cut}");
    }
    assert_eq!(read_stream(t.chunks(1)), whole, "byte by byte");
}
