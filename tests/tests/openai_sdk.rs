//! The official OpenAI Python SDK through the gateway in front of mock-codex.
//! Needs `CODEX_GATEWAY_TEST_PYTHON` (set by `tests/run.sh`) or a `python3` with `openai`.

use integration_tests::{sdk::run_python, StackBuilder};

#[test]
fn openai_python_sdk_responses() {
    let s = StackBuilder::default().start();
    run_python(
        "sdk_responses.py",
        &[&format!("{}/v1", s.url()), &s.key],
        "",
        "OpenAI",
    );
    // The SDK's previous_response_id continuation reached the upstream as the whole history.
    let continued = s
        .mock
        .requests()
        .iter()
        .filter_map(|r| r.json.clone())
        .find(|b| {
            serde_json::to_string(&b["input"])
                .unwrap_or_default()
                .contains("and again")
        })
        .expect("the continuation went upstream");
    let text = serde_json::to_string(&continued["input"]).unwrap();
    assert!(
        text.contains("say hi") && text.contains("Hello from mock-codex"),
        "{text}"
    );
    assert!(continued.get("previous_response_id").is_none());
}

/// Events more than the quiet period apart (the gateway gives back a quiet stream's buffers
/// between them, `lifecycle::QUIET_AFTER`): the SDK still reads every event whole, in order.
#[test]
fn openai_python_sdk_streams_with_pauses_past_the_quiet_period() {
    let s = StackBuilder::default().start();
    s.mock.set_behaviour(
        "acct-0",
        benches::Behaviour {
            tokens: Some(2),
            inter_event_delay: Some(
                gateway::lifecycle::QUIET_AFTER + std::time::Duration::from_millis(200),
            ),
            ..Default::default()
        },
    );
    run_python(
        "sdk_paused.py",
        &[&format!("{}/v1", s.url()), &s.key],
        "",
        "OpenAI",
    );
}

#[test]
fn openai_python_sdk_chat_and_models() {
    let s = StackBuilder::default().start();
    // The script's first request is the tool-call round trip.
    s.answer_with_tool_call("acct-0", "get_weather", r#"{"city":"Paris"}"#, 1);
    run_python(
        "sdk_chat.py",
        &[&format!("{}/v1", s.url()), &s.key],
        "",
        "OpenAI",
    );
    // What the SDK's structured-output and tool requests became upstream.
    let bodies = s.upstream_bodies();
    assert!(
        bodies
            .iter()
            .any(|b| b["text"]["format"]["type"] == "json_schema"
                && b["text"]["format"]["name"] == "answer"
                && b["text"]["format"]["schema"]["properties"]["city"].is_object()),
        "response_format json_schema -> text.format"
    );
    assert!(bodies
        .iter()
        .any(|b| b["tools"][0]["name"] == "get_weather" && b["tools"][0]["type"] == "function"));
    assert!(bodies
        .iter()
        .any(|b| b["input"].as_array().is_some_and(|i| i
            .iter()
            .any(|it| it["type"] == "function_call_output" && it["output"] == "sunny"))));
}

/// The `/responses` bodies mock-codex received whose text contains `END-{tag}` (exactly one).
fn upstream_tagged(s: &integration_tests::Stack, tag: &str) -> (usize, serde_json::Value) {
    let marker = format!("END-{tag}");
    let hits: Vec<_> = s
        .mock
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/responses") && r.body_text().contains(&marker))
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "{tag}: one upstream request carries {marker}"
    );
    let body = serde_json::from_slice(&hits[0].body)
        .unwrap_or_else(|e| panic!("{tag}: upstream body is not JSON: {e}"));
    (hits[0].body.len(), body)
}

/// The text of an input item: a string `content`, or its parts' `text` joined.
fn item_text(item: &serde_json::Value) -> String {
    match &item["content"] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<String>(),
        _ => String::new(),
    }
}

/// The 201 tagged messages of `sdk_large.py` arrived upstream whole, in order, with their roles.
fn assert_conversation_intact(s: &integration_tests::Stack, tag: &str) {
    let (len, body) = upstream_tagged(s, tag);
    assert!(len >= 200_000, "{tag}: upstream body {len} bytes");
    let prefix = format!("[{tag}:");
    let msgs: Vec<(String, String)> = body["input"]
        .as_array()
        .unwrap_or_else(|| panic!("{tag}: input is a list"))
        .iter()
        .map(|i| {
            (
                i["role"].as_str().unwrap_or_default().to_owned(),
                item_text(i),
            )
        })
        .filter(|(_, t)| t.starts_with(&prefix))
        .collect();
    assert_eq!(msgs.len(), 201, "{tag}: every message arrived");
    for (i, (role, text)) in msgs.iter().enumerate() {
        let head = format!("[{tag}:{i:04}] ");
        let mut tail = format!(" <{tag}:{i:04}>");
        if i == 200 {
            tail.push_str(&format!(" END-{tag}"));
        }
        assert_eq!(
            role,
            if i % 2 == 0 { "user" } else { "assistant" },
            "{tag} #{i}"
        );
        assert!(
            text.starts_with(&head) && text.ends_with(&tail) && text.contains("é漢字🙂\n"),
            "{tag} #{i} corrupted: {text:?}"
        );
        assert_eq!(
            text.chars().count(),
            head.chars().count() + 600 + tail.chars().count(),
            "{tag} #{i}: characters lost or added: {text:?}"
        );
    }
}

/// The ~100 KB `function_call_output` of `sdk_large.py` arrived upstream whole.
fn assert_tool_output_intact(s: &integration_tests::Stack, tag: &str) {
    let (len, body) = upstream_tagged(s, tag);
    assert!(len >= 100_000, "{tag}: upstream body {len} bytes");
    let input = body["input"].as_array().expect("input list");
    let call = input
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("{tag}: function_call kept"));
    assert_eq!(call["call_id"], "call_big_1");
    assert_eq!(call["name"], "read_file");
    let out = input
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap_or_else(|| panic!("{tag}: function_call_output kept"));
    assert_eq!(out["call_id"], "call_big_1");
    let text = out["output"].as_str().expect("output is a string");
    let end = format!("\nEND-{tag}");
    let lines = text.strip_suffix(&end).unwrap_or_else(|| {
        let from = text.char_indices().rev().nth(200).map_or(0, |(i, _)| i);
        panic!("{tag}: output truncated: ...{:?}", &text[from..])
    });
    let mut n = 0;
    for (i, line) in lines.split('\n').enumerate() {
        assert!(
            line.starts_with(&format!("{i:05}: ")) && line.chars().count() == 87,
            "{tag} line {i} corrupted: {line:?}"
        );
        n += 1;
    }
    assert!(n * 88 >= 100_000, "{tag}: {n} lines");
}

fn large_requests(legacy: bool) {
    let s = StackBuilder {
        legacy,
        ..Default::default()
    }
    .start();
    run_python(
        "sdk_large.py",
        &[&format!("{}/v1", s.url()), &s.key],
        "",
        "OpenAI",
    );
    for tag in ["RESP-JSON", "RESP-SSE", "CHAT-JSON", "CHAT-SSE"] {
        assert_conversation_intact(&s, tag);
    }
    for tag in ["TOOL-JSON", "TOOL-SSE"] {
        assert_tool_output_intact(&s, tag);
    }
}

#[test]
fn openai_python_sdk_large_requests_io_uring() {
    large_requests(false);
}

#[test]
fn openai_python_sdk_large_requests_legacy() {
    large_requests(true);
}

/// `client.responses.connect()`: two turns on one WebSocket (the second by
/// `previous_response_id`), an unknown id, on both drivers. Upstream, each client socket has
/// its pooled upstream WebSocket, where the second turn is the exact continuation.
#[test]
fn openai_python_sdk_responses_websocket() {
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        run_python(
            "sdk_ws.py",
            &[&format!("{}/v1", s.url()), &s.key],
            "",
            "OpenAI",
        );
        let bodies = s.upstream_bodies();
        assert_eq!(bodies.len(), 6, "three real turns upstream per session");
        assert_eq!(
            s.mock.ws_handshakes(),
            2,
            "one upstream socket per client socket"
        );
        let first_id = bodies[1]["previous_response_id"].as_str();
        assert!(
            first_id.is_some(),
            "the second turn continues the first exactly"
        );
        let second = serde_json::to_string(&bodies[1]["input"]).unwrap();
        assert!(
            second.contains("second") && !second.contains("first long input"),
            "only the new item: {second}"
        );
    }
}
