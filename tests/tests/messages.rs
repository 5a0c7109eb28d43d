//! Anthropic `/v1/messages` (+ `/v1/messages/count_tokens`) end to end: translation over the
//! same lifecycle and pipeline as chat, against mock-codex.

use benches::{Behaviour, ErrorKind};
use integration_tests::{claude_alias, client, parse_sse, sdk::run_python, Stack, StackBuilder};
use serde_json::{json, Value};

/// A stack where every `claude-*` name maps to gpt-5.5 (a prefix alias).
fn stack(accounts: usize) -> Stack {
    StackBuilder {
        accounts,
        tweak: claude_alias(),
        ..StackBuilder::default()
    }
    .start()
}

/// POST an Anthropic request the way the SDK does (`x-api-key`, `anthropic-version`).
fn post(s: &Stack, path: &str, body: &Value) -> reqwest::RequestBuilder {
    client()
        .post(format!("{}{path}", s.url()))
        .header("x-api-key", &s.key)
        .header("anthropic-version", "2023-06-01")
        .json(body)
}

/// The smallest Messages request (`hi` to a `claude-*` model, 9 tokens at most), streamed
/// when `stream`.
fn hi(stream: bool) -> Value {
    let mut v = json!({"model": "claude-sonnet-4-5", "max_tokens": 9,
                       "messages": [{"role": "user", "content": "hi"}]});
    if stream {
        v["stream"] = json!(true);
    }
    v
}

/// [`post`], sent: the response, body unread.
async fn send(s: &Stack, path: &str, body: &Value) -> reqwest::Response {
    post(s, path, body).send().await.unwrap()
}

/// `ask` sent to `/v1/messages` with `"stream": true`: the whole stream.
async fn stream_text(s: &Stack, ask: &Value) -> String {
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    send(s, "/v1/messages", &streamed)
        .await
        .text()
        .await
        .unwrap()
}

/// `(event line, data)` of an Anthropic stream; every data's `type` matches its event line.
fn events(body: &str) -> Vec<(String, Value)> {
    parse_sse(body)
        .into_iter()
        .map(|(e, d)| {
            let v: Value =
                serde_json::from_str(&d).unwrap_or_else(|_| panic!("data: {d} in {body:?}"));
            assert_eq!(v["type"], e.as_str(), "event line and type agree: {body}");
            (e, v)
        })
        .collect()
}

fn kinds(evs: &[(String, Value)]) -> Vec<String> {
    evs.iter()
        .map(|(e, v)| {
            if let Some(t) = v["delta"]["type"]
                .as_str()
                .filter(|_| e == "content_block_delta")
            {
                format!("delta:{t}")
            } else if let Some(t) = v["content_block"]["type"].as_str() {
                format!("start:{t}")
            } else {
                e.clone()
            }
        })
        .collect()
}

fn streamed_text(evs: &[(String, Value)]) -> String {
    evs.iter()
        .filter_map(|(_, v)| v["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_text_json_and_stream_event_order() {
    let s = stack(1);
    let r = send(&s, "/v1/messages", &json!({
        "model": "claude-sonnet-4-5-20250929", "max_tokens": 1024,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "temperature": 0.3, "top_p": 0.9, "top_k": 4, "metadata": {"user_id": "user_1_session_a"},
        "messages": [{"role": "user", "content": "hi"}]
    })).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-sonnet-4-5-20250929");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["content"][0]["type"], "text");
    assert!(v["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("Hello from mock-codex"));
    assert_eq!(v["content"].as_array().unwrap().len(), 1);
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() > 0);
    // Upstream: a Codex Responses body for the aliased model; sampling knobs dropped.
    let up = s.upstream_bodies().pop().unwrap();
    assert_eq!(up["model"], "gpt-5.5");
    assert_eq!(
        (up["stream"].clone(), up["store"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(up["input"][0]["role"], "developer");
    assert_eq!(up["input"][0]["content"][0]["text"], "be brief");
    assert_eq!(up["input"][1]["content"][0]["text"], "hi");
    for f in [
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_output_tokens",
        "metadata",
    ] {
        assert!(up.get(f).is_none(), "{f} reached the upstream: {up}");
    }
    let pck = up["prompt_cache_key"].as_str().unwrap().to_owned();

    // Streaming, with Bearer auth this time.
    let r = s
        .post_json(
            "/v1/messages",
            &json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
                      "metadata": {"user_id": "user_1_session_a"},
                      "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let body = r.text().await.unwrap();
    let evs = events(&body);
    let k = kinds(&evs);
    assert_eq!(&k[..3], ["message_start", "ping", "start:text"], "{body}");
    let n = k.len();
    assert_eq!(
        &k[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{body}"
    );
    assert!(
        k[3..n - 3].iter().all(|x| x == "delta:text_delta"),
        "{body}"
    );
    assert!(n - 6 >= 2, "several text deltas: {body}");
    assert!(streamed_text(&evs).starts_with("Hello from mock-codex"));
    let start = &evs[0].1["message"];
    assert_eq!(start["model"], "claude-sonnet-4-5");
    assert_eq!(start["content"], json!([]));
    let md = &evs[n - 2].1;
    assert_eq!(md["delta"]["stop_reason"], "end_turn");
    assert!(md["usage"]["output_tokens"].as_u64().unwrap() > 0);
    // The same session signal gives the same prompt_cache_key.
    let up = s.upstream_bodies().pop().unwrap();
    assert_eq!(up["prompt_cache_key"].as_str(), Some(pck.as_str()));

    // Stop sequences are applied by the gateway (the backend takes none).
    let r = send(
        &s,
        "/v1/messages",
        &json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
        "stop_sequences": ["mock"], "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["content"][0]["text"], "Hello from ");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "mock");
    assert!(s.upstream_bodies().pop().unwrap().get("stop").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_tool_use_round_trip() {
    let s = stack(1);
    s.answer_with_tool_call("acct-0", "get_weather", r#"{"city":"Paris"}"#, 2);
    let tools = json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let ask = json!({"model": "claude-opus-4-1", "max_tokens": 256, "tools": tools,
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let r = send(&s, "/v1/messages", &ask).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let tu = &v["content"][0];
    assert_eq!(tu["type"], "tool_use");
    assert_eq!(tu["name"], "get_weather");
    assert_eq!(tu["input"], json!({"city": "Paris"}));
    let id = tu["id"].as_str().unwrap().to_owned();
    let up = s.upstream_bodies().pop().unwrap();
    assert_eq!(up["tools"][0]["type"], "function");
    assert_eq!(up["tools"][0]["name"], "get_weather");
    assert_eq!(up["tools"][0]["parameters"]["required"], json!(["city"]));
    assert_eq!(up["tool_choice"], "required");

    // The same call streamed: input_json_delta pieces add up to the arguments.
    let body = stream_text(&s, &ask).await;
    let evs = events(&body);
    let k = kinds(&evs);
    assert_eq!(
        &k[..3],
        ["message_start", "ping", "start:tool_use"],
        "{body}"
    );
    let args: String = evs
        .iter()
        .filter_map(|(_, v)| v["delta"]["partial_json"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(args, r#"{"city":"Paris"}"#);
    let md = evs.iter().find(|(e, _)| e == "message_delta").unwrap();
    assert_eq!(md.1["delta"]["stop_reason"], "tool_use");

    // The tool result goes back; the call id travels both ways.
    let follow = json!({"model": "claude-opus-4-1", "max_tokens": 256, "tools": tools,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": v["content"].clone()},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "thanks"}]}]});
    let r = send(&s, "/v1/messages", &follow).await;
    assert_eq!(r.status(), 200);
    let v2: Value = r.json().await.unwrap();
    assert!(v2["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("Hello from mock-codex"));
    assert_eq!(v2["stop_reason"], "end_turn");
    let up = s.upstream_bodies().pop().unwrap();
    let input = up["input"].as_array().unwrap();
    let call = input.iter().find(|i| i["type"] == "function_call").unwrap();
    assert_eq!(call["call_id"], id.as_str());
    assert_eq!(call["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    let out = input
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap();
    assert_eq!(out["call_id"], id.as_str());
    assert_eq!(out["output"], "sunny");
    assert_eq!(input.last().unwrap()["content"][0]["text"], "thanks");
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_thinking_blocks_and_signature_round_trip() {
    let s = stack(1);
    s.mock.set_behaviour(
        "acct-0",
        Behaviour {
            reasoning: Some(true),
            ..Default::default()
        },
    );
    let ask = json!({"model": "claude-sonnet-4-5", "max_tokens": 16000,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "messages": [{"role": "user", "content": "think"}]});
    let v: Value = send(&s, "/v1/messages", &ask).await.json().await.unwrap();
    let up = s.upstream_bodies().pop().unwrap();
    assert_eq!(up["reasoning"]["effort"], "medium");
    assert_eq!(up["reasoning"]["summary"], "auto");
    assert_eq!(up["include"], json!(["reasoning.encrypted_content"]));
    let c = v["content"].as_array().unwrap();
    assert_eq!(c[0]["type"], "thinking", "{v}");
    assert!(!c[0]["thinking"].as_str().unwrap().is_empty());
    let sig = c[0]["signature"].as_str().unwrap().to_owned();
    assert!(sig.starts_with("gAAAAABmock"), "{sig}");
    assert_eq!(c[1]["type"], "text");

    // Streamed: thinking deltas, then the signature, then the text block.
    let body = stream_text(&s, &ask).await;
    let k = kinds(&events(&body));
    let first_sig = k.iter().position(|x| x == "delta:signature_delta").unwrap();
    assert_eq!(
        &k[..4],
        [
            "message_start",
            "ping",
            "start:thinking",
            "delta:thinking_delta"
        ]
    );
    assert_eq!(k[first_sig + 1], "content_block_stop");
    assert_eq!(k[first_sig + 2], "start:text");

    // The signed thinking block goes back as the encrypted reasoning item.
    let follow = json!({"model": "claude-sonnet-4-5", "max_tokens": 16000,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "messages": [{"role": "user", "content": "think"},
                     {"role": "assistant", "content": v["content"].clone()},
                     {"role": "user", "content": "again"}]});
    let r = send(&s, "/v1/messages", &follow).await;
    assert_eq!(r.status(), 200);
    let up = s.upstream_bodies().pop().unwrap();
    let rs = up["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "reasoning")
        .unwrap()
        .clone();
    assert_eq!(rs["encrypted_content"], sig.as_str());

    // Without thinking the reasoning is not shown.
    let v: Value = send(
        &s,
        "/v1/messages",
        &json!({"model": "claude-sonnet-4-5", "max_tokens": 99,
        "messages": [{"role": "user", "content": "x"}]}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v["content"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["content"][0]["type"], "text");
}

async fn error_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    (status, v)
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_errors_are_in_anthropics_shape() {
    let s = stack(1);
    let hi = hi(false);
    // Before the body: authentication.
    let r = client()
        .post(format!("{}/v1/messages", s.url()))
        .json(&hi)
        .send()
        .await
        .unwrap();
    let (st, v) = error_of(r).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    let r = client()
        .post(format!("{}/v1/messages", s.url()))
        .header("x-api-key", "sk-wrong")
        .json(&hi)
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, 401);
    // Malformed requests.
    let r = send(
        &s,
        "/v1/messages",
        &json!({"model": "claude-sonnet-4-5", "messages": []}),
    )
    .await;
    let (st, v) = error_of(r).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("max_tokens"));
    // A Claude name no alias maps; a wrong method.
    let s2 = StackBuilder::default().start();
    let r = post(&s2, "/v1/messages", &hi).send().await.unwrap();
    let (st, v) = error_of(r).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (404, Some("not_found_error"))
    );
    assert_eq!(s2.mock.responses_requests(), 0);
    let r = client()
        .get(format!("{}/v1/messages", s.url()))
        .header("x-api-key", &s.key)
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, 405);

    // Upstream errors, mapped once (status, message) and shown in Anthropic's shape. A fresh
    // stack each time: an account-scoped failure cools the only account.
    for (kind, status, ty) in [
        (
            ErrorKind::ContextLengthExceeded,
            400,
            "invalid_request_error",
        ),
        (ErrorKind::RateLimitExceeded, 429, "rate_limit_error"),
        (ErrorKind::ServerIsOverloaded, 503, "overloaded_error"),
    ] {
        for stream in [false, true] {
            let s = stack(1);
            s.mock.set_behaviour("acct-0", Behaviour::error(kind));
            let mut body = hi.clone();
            body["stream"] = json!(stream);
            let r = send(&s, "/v1/messages", &body).await;
            if status == 429 {
                assert!(r.headers().contains_key("retry-after"), "{kind:?}");
            }
            let (st, v) = error_of(r).await;
            assert_eq!(
                (st, v["error"]["type"].as_str()),
                (status, Some(ty)),
                "{kind:?}: {v}"
            );
            // The upstream's own failure, not a pool error.
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(!msg.starts_with("No upstream account"), "{kind:?}: {msg}");
            assert_eq!(s.mock.responses_requests(), 1, "{kind:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_failure_after_output_is_an_error_event() {
    // A fresh stack per case: the failure cools the only account.
    let failing = || {
        let s = stack(1);
        s.mock.set_behaviour(
            "acct-0",
            Behaviour {
                fail_after_output: Some("server_is_overloaded".into()),
                ..Default::default()
            },
        );
        s
    };
    let s = failing();
    let r = send(&s, "/v1/messages", &hi(true)).await;
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let evs = events(&body);
    let k = kinds(&evs);
    assert_eq!(
        &k[..4],
        ["message_start", "ping", "start:text", "delta:text_delta"],
        "{body}"
    );
    assert_eq!(k.last().map(String::as_str), Some("error"), "{body}");
    assert_eq!(k.iter().filter(|x| *x == "error").count(), 1);
    assert!(!k
        .iter()
        .any(|x| x == "message_stop" || x == "message_delta"));
    let e = &evs.last().unwrap().1;
    assert_eq!(e["error"]["type"], "overloaded_error", "{e}");
    assert!(
        !e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("No upstream account"),
        "{e}"
    );
    assert!(!streamed_text(&evs).is_empty());

    // Non-streaming: the classified failure is the answer.
    let s = failing();
    let r = send(&s, "/v1/messages", &hi(false)).await;
    let (st, v) = error_of(r).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (503, Some("overloaded_error"))
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(!msg.starts_with("No upstream account"), "{msg}");

    // An upstream that breaks off mid-stream: an api_error event.
    let s = stack(1);
    s.mock.set_behaviour(
        "acct-0",
        Behaviour {
            disconnect_after: Some(6),
            ..Default::default()
        },
    );
    let body = send(&s, "/v1/messages", &hi(true))
        .await
        .text()
        .await
        .unwrap();
    let evs = events(&body);
    let (e, v) = evs.last().unwrap();
    assert_eq!(e, "error", "{body}");
    assert_eq!(v["error"]["type"], "api_error", "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_count_tokens_estimates_locally() {
    let s = stack(1);
    let count = |body: Value| {
        let req = post(&s, "/v1/messages/count_tokens", &body);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            v["input_tokens"].as_u64().unwrap()
        }
    };
    let small = count(json!({"model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Hello, world!"}]}))
    .await;
    assert_eq!(small, 7);
    let big = count(json!({"model": "claude-sonnet-4-5", "system": "You are a careful assistant.",
        "messages": [{"role": "user", "content": "Hello, world! ".repeat(100)}],
        "tools": [{"name": "get_weather", "description": "Weather",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]}))
    .await;
    assert!(big > 400 && big < 700, "{big}");
    assert_eq!(s.mock.responses_requests(), 0, "nothing goes upstream");
    let r = send(
        &s,
        "/v1/messages/count_tokens",
        &json!({"model": "claude-x"}),
    )
    .await;
    let (st, v) = error_of(r).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
}

/// The official Anthropic Python SDK (`anthropic`, installed by tests/run.sh): create, the
/// tool round trip, `stream=True`, the `messages.stream()` helper, stop sequences,
/// count_tokens and typed errors.
#[test]
fn anthropic_python_sdk() {
    let s = stack(1);
    // The script's first two requests (create, then the stream helper) get a tool call.
    s.answer_with_tool_call("acct-0", "get_weather", r#"{"city":"Paris"}"#, 2);
    run_python("sdk_messages.py", &[&s.url(), &s.key], "", "Anthropic");
    // The tool result reached the upstream under the tool_use id the SDK was given.
    let bodies = s.upstream_bodies();
    assert!(bodies.iter().any(|b| b["input"].as_array().is_some_and(|i| {
        let call = i.iter().find(|x| x["type"] == "function_call");
        let out = i.iter().find(|x| x["type"] == "function_call_output");
        matches!((call, out), (Some(c), Some(o)) if c["call_id"] == o["call_id"] && o["output"] == "sunny")
    })));
}

/// One recorded request: `(path?query, headers, body)`.
type Recorded = (String, Vec<(String, String)>, Value);

/// The requests Claude Code 2.1.332 sent (recorded by `tests/fixtures/claude-code/record.py`),
/// the key left out.
#[allow(clippy::unwrap_used, clippy::expect_used)] // a malformed fixture is the failure report
fn claude_code_fixture() -> Vec<Recorded> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/claude-code/claude-code-2.1.332.jsonl"
    );
    std::fs::read_to_string(path)
        .expect("fixture")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("fixture line");
            let target = match v["query"].as_str() {
                Some(q) => format!("{}?{q}", v["path"].as_str().unwrap()),
                None => v["path"].as_str().unwrap().to_owned(),
            };
            let headers = v["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    (
                        h[0].as_str().unwrap().to_owned(),
                        h[1].as_str().unwrap().to_owned(),
                    )
                })
                .filter(|(n, _)| {
                    !matches!(
                        n.as_str(),
                        "x-api-key" | "host" | "content-length" | "connection" | "accept-encoding"
                    )
                })
                .collect();
            (target, headers, v["json"].clone())
        })
        .collect()
}

/// Claude Code 2.1's recorded requests, replayed with their headers (`?beta=true`, the
/// `anthropic-beta` list, `x-app`...): each is answered as a stream, and what reaches
/// mock-codex (which refuses what the Codex backend refuses) is the translation: the CLI's
/// system message in place, the effort, the tools, the tool round trip.
#[tokio::test(flavor = "multi_thread")]
async fn claude_code_recorded_requests_are_served() {
    let s = stack(1);
    let fixture = claude_code_fixture();
    assert_eq!(
        fixture.len(),
        4,
        "say hi, a tool turn and its follow-up, --continue"
    );
    for (i, (target, headers, body)) in fixture.iter().enumerate() {
        assert!(target.ends_with("?beta=true"), "{target}");
        let mut req = client()
            .post(format!("{}{target}", s.url()))
            .header("x-api-key", &s.key);
        for (n, v) in headers {
            req = req.header(n, v);
        }
        let r = req
            .body(serde_json::to_vec(body).unwrap())
            .send()
            .await
            .unwrap();
        let st = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(st, 200, "request {i}: {text}");
        let k = kinds(&events(&text));
        assert_eq!(k.last().map(String::as_str), Some("message_stop"), "{text}");
    }
    let ups = s.upstream_bodies();
    assert_eq!(ups.len(), 4);
    for (up, (_, _, body)) in ups.iter().zip(&fixture) {
        assert_eq!(up["model"], "gpt-5.5");
        // Thinking adaptive + output_config.effort -> the effort, encrypted reasoning.
        assert_eq!(
            up["reasoning"]["effort"], body["output_config"]["effort"],
            "{}",
            up["reasoning"]
        );
        assert_eq!(up["include"], json!(["reasoning.encrypted_content"]));
        // Every tool, as a function with its schema.
        let tools = up["tools"].as_array().unwrap();
        assert_eq!(tools.len(), body["tools"].as_array().unwrap().len());
        assert!(tools
            .iter()
            .all(|t| t["type"] == "function" && t["parameters"].is_object()));
        for f in [
            "context_management",
            "output_config",
            "metadata",
            "thinking",
            "max_tokens",
        ] {
            assert!(up.get(f).is_none(), "{f} reached the upstream");
        }
        // One input item per message (and the top-level system prompt), in order.
        let roles: Vec<&str> = up["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["role"].as_str().unwrap_or(i["type"].as_str().unwrap()))
            .collect();
        // Per message: its blocks' items, runs of text blocks being one message item.
        let mut want: Vec<&str> = vec!["developer"];
        for m in body["messages"].as_array().unwrap() {
            let role = match m["role"].as_str().unwrap() {
                "system" => "developer",
                r => r,
            };
            let mut last = "";
            let blocks = m["content"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![json!({"type": "text"})]);
            for b in &blocks {
                let item = match b["type"].as_str().unwrap() {
                    "tool_use" => "function_call",
                    "tool_result" => "function_call_output",
                    _ => role,
                };
                if item != last || item != role {
                    want.push(item);
                }
                last = item;
            }
        }
        assert_eq!(roles, want);
    }
    // The second message is the CLI's system message (its agent types), kept in place.
    let sys = &ups[0]["input"][2];
    assert_eq!(sys["role"], "developer");
    assert!(sys["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("Available agent types"));
    // The tool round trip: the Bash call and its output.
    let items = ups[2]["input"].as_array().unwrap();
    let call = items.iter().find(|i| i["type"] == "function_call").unwrap();
    assert_eq!(call["name"], "Bash");
    let out = items
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap();
    assert_eq!(out["call_id"], call["call_id"]);
    assert_eq!(out["output"], "fixture-tool");
}

/// Today's fields one by one over HTTP, each with an `anthropic-beta` value nobody knows:
/// accepted, answered, applied where they can be.
#[tokio::test(flavor = "multi_thread")]
async fn messages_accept_todays_fields_and_unknown_betas() {
    let s = stack(1);
    let base = json!({"model": "claude-opus-5-5", "max_tokens": 64000,
        "messages": [{"role": "user", "content": "hi"}]});
    let cases: Vec<(&str, Value)> = vec![
        (
            "system message",
            json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "agents", "cache_control": {"type": "ephemeral"}}]}]}),
        ),
        (
            "adaptive thinking",
            json!({"thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"}}),
        ),
        (
            "context management",
            json!({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}),
        ),
        (
            "cache control",
            json!({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "cache_control": {"type": "ephemeral"}}),
        ),
        (
            "metadata",
            json!({"metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"}}),
        ),
        (
            "structured output",
            json!({"output_config": {"format": {"type": "json_schema",
            "schema": {"type": "object", "properties": {}, "additionalProperties": false}}}}),
        ),
        (
            "the rest",
            json!({"service_tier": "auto", "inference_geo": "us", "speed": "fast", "container": "c",
            "mcp_servers": [], "top_k": 1, "temperature": 1.0}),
        ),
    ];
    for (what, extra) in cases {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(&s, "/v1/messages?beta=true", &body)
            .header(
                "anthropic-beta",
                "claude-code-20250219,no-such-beta-2099-01-01",
            )
            .send()
            .await
            .unwrap();
        let st = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(st, 200, "{what}: {v}");
        assert_eq!(v["type"], "message", "{what}: {v}");
    }
    let ups = s.upstream_bodies();
    assert_eq!(ups[0]["input"][1]["role"], "developer");
    assert_eq!(ups[0]["input"][1]["content"][0]["text"], "agents");
    assert_eq!(ups[1]["reasoning"], json!({"effort": "high"}));
    assert_eq!(ups[5]["text"]["format"]["type"], "json_schema");
    // Really invalid input is still refused, in Anthropic's shape.
    let mut body = base.clone();
    body["messages"] = json!([{"role": "tool", "content": "x"}]);
    let (st, v) = error_of(send(&s, "/v1/messages", &body).await).await;
    assert_eq!(st, 400);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages.0.role"),
        "{v}"
    );
}

/// `HEAD /`, Claude Code's connectivity probe: 200 without a body (and without a key).
#[tokio::test(flavor = "multi_thread")]
async fn head_root_answers_the_connectivity_probe() {
    let s = stack(1);
    let r = client().head(format!("{}/", s.url())).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap().is_empty());
}
