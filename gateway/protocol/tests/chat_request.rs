//! Request translation (docs/protocol.md#request): one table row per mapping, plus the drop
//! list, tool-name shortening, options and errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use codex_protocol::chat::{chat_to_responses, ChatError, ChatRequest, ChatRequestOptions};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, PointerNode, Value};

const ABSENT: &str = "<absent>";

fn translate(body: &str) -> (ChatRequest, Value) {
    translate_with(body, &ChatRequestOptions::default())
}

fn translate_with(body: &str, opts: &ChatRequestOptions<'_>) -> (ChatRequest, Value) {
    let req = chat_to_responses(body.as_bytes(), opts)
        .unwrap_or_else(|e| panic!("{body}: {e} ({:?})", e.param));
    let v: Value = sonic_rs::from_slice(&req.body).unwrap_or_else(|e| {
        panic!(
            "upstream body is not JSON: {e}: {}",
            String::from_utf8_lossy(&req.body)
        )
    });
    (req, v)
}

fn path(p: &str) -> Vec<PointerNode> {
    if p.is_empty() {
        return Vec::new();
    }
    p.split('.')
        .map(|s| match s.parse::<usize>() {
            Ok(i) => PointerNode::from(i),
            Err(_) => PointerNode::from(s),
        })
        .collect()
}

fn err(body: &str) -> ChatError {
    match chat_to_responses(body.as_bytes(), &ChatRequestOptions::default()) {
        Ok(r) => panic!(
            "{body} should fail, got {}",
            String::from_utf8_lossy(&r.body)
        ),
        Err(e) => e,
    }
}

/// `(what, messages/extra fields, json path in the upstream body, expected JSON or ABSENT)`.
/// Each body is `{"model":"gpt-5","messages":[<user hi>] , <extra>}` unless `extra` carries
/// its own `messages`.
const ROWS: &[(&str, &str, &str, &str)] = &[
    // --- normalization for Codex
    ("model", "", "model", r#""gpt-5""#),
    ("stream forced", r#""stream":false"#, "stream", "true"),
    ("store forced", r#""store":true"#, "store", "false"),
    (
        "include",
        "",
        "include",
        r#"["reasoning.encrypted_content"]"#,
    ),
    ("instructions empty", "", "instructions", r#""""#),
    (
        "reasoning summary always",
        "",
        "reasoning",
        r#"{"summary":"auto"}"#,
    ),
    // --- messages -> input
    (
        "user string",
        "",
        "input.0",
        r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}"#,
    ),
    (
        "system -> developer",
        r#""messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]"#,
        "input.0",
        r#"{"type":"message","role":"developer","content":[{"type":"input_text","text":"be brief"}]}"#,
    ),
    (
        "developer parts",
        r#""messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"hi"}]"#,
        "input.0",
        r#"{"type":"message","role":"developer","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}"#,
    ),
    (
        "empty system skipped",
        r#""messages":[{"role":"system","content":""},{"role":"user","content":"hi"}]"#,
        "input.1",
        ABSENT,
    ),
    (
        "user parts: text, image (object + detail), image (string), file, audio",
        r#""messages":[{"role":"user","content":[
        {"type":"text","text":"look"},
        {"type":"image_url","image_url":{"url":"https://x/a.png","detail":"high"}},
        {"type":"image_url","image_url":"data:image/png;base64,AAAA"},
        {"type":"file","file":{"file_data":"data:application/pdf;base64,JVBE","filename":"a.pdf"}},
        {"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}]"#,
        "input.0.content",
        r#"[{"type":"input_text","text":"look"},
         {"type":"input_image","image_url":"https://x/a.png","detail":"high"},
         {"type":"input_image","image_url":"data:image/png;base64,AAAA"},
         {"type":"input_file","file_data":"data:application/pdf;base64,JVBE","filename":"a.pdf"},
         {"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]"#,
    ),
    (
        "escapes survive",
        r#""messages":[{"role":"user","content":"q\"uote\\ \n \u00e9 \ud83d\ude00"}]"#,
        "input.0.content.0.text",
        r#""q\"uote\\ \n é 😀""#,
    ),
    (
        "assistant text -> output_text",
        r#""messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]"#,
        "input.1",
        r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]}"#,
    ),
    (
        "assistant tool_calls only: no empty message, top-level function_call",
        r#""messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[
        {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"sunny"}]"#,
        "input",
        r#"[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
         {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
         {"type":"function_call_output","call_id":"call_1","output":"sunny"}]"#,
    ),
    (
        "assistant text + two tool calls, object arguments stringified",
        r#""messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"checking","tool_calls":[
        {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
        {"id":"b","type":"function","function":{"name":"g","arguments":{"x":1}}}]}]"#,
        "input",
        r#"[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
         {"type":"message","role":"assistant","content":[{"type":"output_text","text":"checking"}]},
         {"type":"function_call","call_id":"a","name":"f","arguments":"{}"},
         {"type":"function_call","call_id":"b","name":"g","arguments":"{\"x\":1}"}]"#,
    ),
    (
        "custom tool call history",
        r#""messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[
        {"id":"c","type":"custom","custom":{"name":"apply_patch","input":"*** Begin"}}]}]"#,
        "input.1",
        r#"{"type":"custom_tool_call","call_id":"c","name":"apply_patch","input":"*** Begin"}"#,
    ),
    (
        "tool content array joined",
        r#""messages":[{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]"#,
        "input.0",
        r#"{"type":"function_call_output","call_id":"c1","output":"a\nb"}"#,
    ),
    (
        "tool images -> following synthetic user message",
        r#""messages":[{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"shot"},{"type":"image_url","image_url":{"url":"https://x/s.png"}}]},
        {"role":"tool","tool_call_id":"c2","content":"ok"},{"role":"user","content":"next"}]"#,
        "input",
        r#"[{"type":"function_call_output","call_id":"c1","output":"shot"},
         {"type":"function_call_output","call_id":"c2","output":"ok"},
         {"type":"message","role":"user","content":[{"type":"input_image","image_url":"https://x/s.png"}]},
         {"type":"message","role":"user","content":[{"type":"input_text","text":"next"}]}]"#,
    ),
    // --- tools
    (
        "function tool flattened",
        r#""tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}]"#,
        "tools",
        r#"[{"type":"function","name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}]"#,
    ),
    (
        "function tool without parameters gets an empty object schema",
        r#""tools":[{"type":"function","function":{"name":"ping"}}]"#,
        "tools.0",
        r#"{"type":"function","name":"ping","parameters":{"type":"object","properties":{}}}"#,
    ),
    (
        "web_search variants normalized, options kept",
        r#""tools":[{"type":"web_search_preview","search_context_size":"low"},{"type":"web_search_preview_2025_03_11"}]"#,
        "tools",
        r#"[{"type":"web_search","search_context_size":"low"},{"type":"web_search"}]"#,
    ),
    (
        "other built-in tools pass through",
        r#""tools":[{"type":"local_shell"},{"type":"image_generation","quality":"low"}]"#,
        "tools",
        r#"[{"type":"local_shell"},{"type":"image_generation","quality":"low"}]"#,
    ),
    (
        "custom tool flattened",
        r#""tools":[{"type":"custom","custom":{"name":"apply_patch","description":"p","format":{"type":"grammar"}}}]"#,
        "tools.0",
        r#"{"type":"custom","name":"apply_patch","description":"p","format":{"type":"grammar"}}"#,
    ),
    (
        "web_search_options -> web_search tool",
        r#""web_search_options":{"search_context_size":"high"}"#,
        "tools",
        r#"[{"type":"web_search","search_context_size":"high"}]"#,
    ),
    // --- tool_choice / parallel_tool_calls
    (
        "tool_choice auto",
        r#""tool_choice":"auto""#,
        "tool_choice",
        r#""auto""#,
    ),
    (
        "tool_choice none",
        r#""tool_choice":"none""#,
        "tool_choice",
        r#""none""#,
    ),
    (
        "tool_choice required",
        r#""tool_choice":"required""#,
        "tool_choice",
        r#""required""#,
    ),
    (
        "tool_choice function object flattened",
        r#""tool_choice":{"type":"function","function":{"name":"get_weather"}}"#,
        "tool_choice",
        r#"{"type":"function","name":"get_weather"}"#,
    ),
    (
        "tool_choice allowed_tools passes through",
        r#""tool_choice":{"type":"allowed_tools","mode":"auto","tools":[]}"#,
        "tool_choice",
        r#"{"type":"allowed_tools","mode":"auto","tools":[]}"#,
    ),
    (
        "parallel_tool_calls false",
        r#""parallel_tool_calls":false"#,
        "parallel_tool_calls",
        "false",
    ),
    (
        "parallel_tool_calls true",
        r#""parallel_tool_calls":true"#,
        "parallel_tool_calls",
        "true",
    ),
    (
        "parallel_tool_calls absent",
        "",
        "parallel_tool_calls",
        ABSENT,
    ),
    // --- reasoning / text
    (
        "reasoning_effort",
        r#""reasoning_effort":"high""#,
        "reasoning",
        r#"{"effort":"high","summary":"auto"}"#,
    ),
    (
        "reasoning object",
        r#""reasoning":{"effort":"low","summary":"detailed"}"#,
        "reasoning",
        r#"{"effort":"low","summary":"detailed"}"#,
    ),
    (
        "json_schema -> text.format",
        r#""response_format":{"type":"json_schema","json_schema":{"name":"out","strict":true,"schema":{"type":"object"}}}"#,
        "text",
        r#"{"format":{"type":"json_schema","name":"out","strict":true,"schema":{"type":"object"}}}"#,
    ),
    (
        "json_object -> text.format",
        r#""response_format":{"type":"json_object"}"#,
        "text.format",
        r#"{"type":"json_object"}"#,
    ),
    (
        "json_object adds a developer hint first",
        r#""response_format":{"type":"json_object"}"#,
        "input.0.role",
        r#""developer""#,
    ),
    (
        "response_format text -> nothing",
        r#""response_format":{"type":"text"}"#,
        "text",
        ABSENT,
    ),
    (
        "verbosity",
        r#""verbosity":"low""#,
        "text",
        r#"{"verbosity":"low"}"#,
    ),
    (
        "format + verbosity",
        r#""verbosity":"high","response_format":{"type":"json_object"}"#,
        "text",
        r#"{"format":{"type":"json_object"},"verbosity":"high"}"#,
    ),
    // --- service tier / cache key
    (
        "service_tier fast -> priority",
        r#""service_tier":"fast""#,
        "service_tier",
        r#""priority""#,
    ),
    (
        "service_tier priority",
        r#""service_tier":"priority""#,
        "service_tier",
        r#""priority""#,
    ),
    (
        "service_tier flex dropped",
        r#""service_tier":"flex""#,
        "service_tier",
        ABSENT,
    ),
    (
        "service_tier auto dropped",
        r#""service_tier":"auto""#,
        "service_tier",
        ABSENT,
    ),
    (
        "prompt_cache_key passthrough",
        r#""prompt_cache_key":"k1""#,
        "prompt_cache_key",
        r#""k1""#,
    ),
];

/// Every parameter the backend rejects must be absent upstream.
const DROPPED: &[&str] = &[
    r#""temperature":0.2"#,
    r#""top_p":0.9"#,
    r#""max_tokens":100"#,
    r#""max_completion_tokens":100"#,
    r#""stop":["x"]"#,
    r#""seed":7"#,
    r#""frequency_penalty":0.1"#,
    r#""presence_penalty":0.1"#,
    r#""n":1"#,
    r#""logprobs":true"#,
    r#""top_logprobs":2"#,
    r#""user":"u1""#,
    r#""logit_bias":{"50256":-100}"#,
    r#""stream_options":{"include_usage":true}"#,
    r#""metadata":{"a":"b"}"#,
    r#""store":true"#,
    r#""modalities":["text"]"#,
    r#""audio":{"voice":"alloy"}"#,
    r#""prediction":{"type":"content","content":"x"}"#,
    r#""safety_identifier":"s""#,
    r#""prompt_cache_retention":"24h""#,
    r#""truncation":"auto""#,
    r#""previous_response_id":"resp_1""#,
];

fn body_with(extra: &str) -> String {
    if extra.contains("\"messages\"") {
        format!(r#"{{"model":"gpt-5",{extra}}}"#)
    } else if extra.is_empty() {
        r#"{"model":"gpt-5","messages":[{"role":"user","content":"hi"}]}"#.to_owned()
    } else {
        format!(r#"{{"model":"gpt-5","messages":[{{"role":"user","content":"hi"}}],{extra}}}"#)
    }
}

#[test]
fn mapping_table() {
    let mut failures = Vec::new();
    for (what, extra, p, expected) in ROWS {
        let body = body_with(extra);
        let (_, v) = translate(&body);
        let got = v.pointer(path(p));
        let ok = if *expected == ABSENT {
            got.is_none()
        } else {
            let want: Value = sonic_rs::from_str(expected)
                .unwrap_or_else(|e| panic!("{what}: bad expectation: {e}"));
            got == Some(&want)
        };
        if !ok {
            failures.push(format!(
                "{what}: at `{p}` expected {expected}, got {}",
                got.map_or(ABSENT.to_owned(), |g| sonic_rs::to_string(g)
                    .unwrap_or_default())
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn drop_list() {
    for extra in DROPPED {
        let (_, v) = translate(&body_with(extra));
        let key = extra.split('"').nth(1).unwrap();
        if matches!(key, "store") {
            assert_eq!(v["store"].as_bool(), Some(false));
            continue;
        }
        assert!(v.get(key).is_none(), "{key} must be dropped");
    }
    // Only whitelisted keys ever reach the upstream body.
    let all = DROPPED.join(",");
    let (_, v) = translate(&body_with(&all));
    let keys: Vec<&str> = v.as_object().unwrap().iter().map(|(k, _)| k).collect();
    for k in &keys {
        assert!(
            matches!(
                *k,
                "model" | "instructions" | "input" | "reasoning" | "store" | "stream" | "include"
            ),
            "unexpected upstream key {k}"
        );
    }
}

#[test]
fn client_facing_fields() {
    let (req, _) = translate(
        r#"{"model":"gpt-5.1-codex","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(req.model, "gpt-5.1-codex");
    assert!(req.stream && req.include_usage);
    assert!(req.name_map.is_empty());
    assert_eq!(req.prompt_cache_key, None);
    let (req, _) = translate(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":false}}"#,
    );
    assert!(!req.stream && !req.include_usage);
}

#[test]
fn options() {
    let levels = ["low".to_owned(), "medium".to_owned(), "high".to_owned()];
    let opts = ChatRequestOptions {
        default_prompt_cache_key: Some("derived-key"),
        upstream_model: Some("gpt-5-codex"),
        reasoning_levels: &levels,
    };
    let (req, v) = translate_with(
        r#"{"model":"my-alias","reasoning_effort":"xhigh","messages":[{"role":"user","content":"hi"}]}"#,
        &opts,
    );
    assert_eq!(req.model, "my-alias", "client-facing model unchanged");
    assert_eq!(v["model"].as_str(), Some("gpt-5-codex"));
    assert_eq!(v["reasoning"]["effort"].as_str(), Some("high"), "clamped");
    assert_eq!(v["prompt_cache_key"].as_str(), Some("derived-key"));
    assert_eq!(req.prompt_cache_key.as_deref(), Some("derived-key"));
    let (req, v) = translate_with(
        r#"{"model":"m","prompt_cache_key":"mine","messages":[{"role":"user","content":"hi"}]}"#,
        &opts,
    );
    assert_eq!(
        v["prompt_cache_key"].as_str(),
        Some("mine"),
        "client key wins"
    );
    assert_eq!(req.prompt_cache_key.as_deref(), Some("mine"));
}

#[test]
fn long_tool_names_are_shortened_consistently_and_restorable() {
    let long = format!("mcp__server__{}", "very_long_segment_".repeat(5));
    assert!(long.len() > 64);
    let body = format!(
        r#"{{"model":"gpt-5","messages":[
            {{"role":"user","content":"hi"}},
            {{"role":"assistant","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"{long}","arguments":"{{}}"}}}}]}},
            {{"role":"tool","tool_call_id":"c1","content":"ok"}}],
          "tools":[{{"type":"function","function":{{"name":"{long}","parameters":{{"type":"object"}}}}}},
                   {{"type":"function","function":{{"name":"short_one"}}}}],
          "tool_choice":{{"type":"function","function":{{"name":"{long}"}}}}}}"#
    );
    let (req, v) = translate(&body);
    let short = v["tools"][0]["name"].as_str().unwrap().to_owned();
    assert!(short.len() <= 64, "{short}");
    assert_ne!(short, long);
    assert!(long.starts_with(&short[..55]));
    assert_eq!(v["tools"][1]["name"].as_str(), Some("short_one"));
    assert_eq!(v["tool_choice"]["name"].as_str(), Some(short.as_str()));
    assert_eq!(
        v["input"][1]["name"].as_str(),
        Some(short.as_str()),
        "history uses the same name"
    );
    assert_eq!(req.name_map.len(), 1);
    assert_eq!(req.name_map.restore(&short), long);
    assert_eq!(req.name_map.restore("short_one"), "short_one");
    // Deterministic across requests.
    let (_, v2) = translate(&body);
    assert_eq!(v2["tools"][0]["name"].as_str(), Some(short.as_str()));
    // Two long names sharing a 55-char prefix stay distinct.
    let a = format!("{}a", "p".repeat(70));
    let b = format!("{}b", "p".repeat(70));
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"{a}"}}}},{{"type":"function","function":{{"name":"{b}"}}}}]}}"#
    );
    let (req, v) = translate(&body);
    let (sa, sb) = (
        v["tools"][0]["name"].as_str().unwrap(),
        v["tools"][1]["name"].as_str().unwrap(),
    );
    assert_ne!(sa, sb);
    assert_eq!(req.name_map.restore(sa), a);
    assert_eq!(req.name_map.restore(sb), b);
}

#[test]
fn errors() {
    let cases: &[(&str, Option<&str>)] = &[
        ("not json", None),
        ("[1,2]", None),
        (r#""str""#, None),
        (
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            Some("model"),
        ),
        (
            r#"{"model":"","messages":[{"role":"user","content":"hi"}]}"#,
            Some("model"),
        ),
        (
            r#"{"model":5,"messages":[{"role":"user","content":"hi"}]}"#,
            Some("model"),
        ),
        (r#"{"model":"m"}"#, Some("messages")),
        (r#"{"model":"m","messages":[]}"#, Some("messages")),
        (r#"{"model":"m","messages":"hi"}"#, Some("messages")),
        (r#"{"model":"m","messages":["hi"]}"#, Some("messages[0]")),
        (
            r#"{"model":"m","messages":[{"content":"hi"}]}"#,
            Some("messages[0].role"),
        ),
        (
            r#"{"model":"m","messages":[{"role":7,"content":"hi"}]}"#,
            Some("messages[0].role"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"robot","content":"hi"}]}"#,
            Some("messages[0].role"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"function","name":"f","content":"hi"}]}"#,
            Some("messages[0].role"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}]}"#,
            Some("messages[0].content"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
            Some("messages[0].content"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"video","video":{}}]}]}"#,
            Some("messages[0].content[0].type"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}"#,
            Some("messages[0].content[0].type"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
            Some("messages[0].content[0].image_url"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
            Some("messages[0].tool_call_id"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f"}}]}]}"#,
            Some("messages[0].tool_calls[0].id"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"yes"}"#,
            Some("stream"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":{}}"#,
            Some("tools"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"function":{"name":"f"}}]}"#,
            Some("tools[0].type"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{}}]}"#,
            Some("tools[0].function.name"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"sometimes"}"#,
            Some("tool_choice"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"function"}}"#,
            Some("tool_choice.function.name"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"xml"}}"#,
            Some("response_format.type"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema"}}"#,
            Some("response_format.json_schema"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":3}"#,
            Some("reasoning_effort"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"parallel_tool_calls":"no"}"#,
            Some("parallel_tool_calls"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":"y"}}"#,
            Some("stream_options.include_usage"),
        ),
    ];
    for (body, param) in cases {
        let e = err(body);
        assert!(!e.message.is_empty());
        assert_eq!(e.param.as_deref(), *param, "{body}: {}", e.message);
    }
    assert!(err("not json").message.contains("parse the JSON body"));
    assert!(err(r#"{"model":"m"}"#).message.contains("messages"));
}

#[test]
fn large_history_is_linear_and_valid() {
    let mut msgs = Vec::new();
    for i in 0..500 {
        msgs.push(format!(
            r#"{{"role":"user","content":"question {i} with \"quotes\""}}"#
        ));
        msgs.push(format!(
            r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"c{i}","type":"function","function":{{"name":"f","arguments":"{{\"i\":{i}}}"}}}}]}}"#
        ));
        msgs.push(format!(
            r#"{{"role":"tool","tool_call_id":"c{i}","content":"r{i}"}}"#
        ));
    }
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, msgs.join(","));
    let (_, v) = translate(&body);
    assert_eq!(v["input"].as_array().unwrap().len(), 1500);
    assert_eq!(v["input"][1499]["output"].as_str(), Some("r499"));
}
