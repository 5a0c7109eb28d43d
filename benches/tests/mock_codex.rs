//! mock-codex over real sockets: event order and pacing, validation, error controls,
//! OAuth rotation, catalog, quota, h2c, TLS + ALPN h2, and the binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use benches::{
    mock::DEFAULT_TEXT, Behaviour, ErrorKind, MockAccount, MockCodex, MockConfig, MockHandle,
    RefreshError,
};
use futures_util::StreamExt;
use serde_json::{json, Value};

fn start(cfg: MockConfig) -> MockHandle {
    MockCodex::start(cfg).expect("mock starts")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().build().expect("client")
}

fn valid_body() -> Value {
    json!({
        "model": "gpt-5.1-codex",
        "instructions": "",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "stream": true,
        "store": false,
    })
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

async fn post(
    c: &reqwest::Client,
    mock: &MockHandle,
    headers: &[(&str, &str)],
    body: &Value,
) -> reqwest::Response {
    let mut req = c
        .post(format!("{}/responses", mock.base_url()))
        .header("authorization", "Bearer at-test")
        .header("chatgpt-account-id", "acct-1")
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("send")
}

/// Parsed SSE events with their arrival time, the number of body chunks, and whether the body
/// ended with an error.
struct Sse {
    events: Vec<(Instant, String, Value)>,
    chunks: usize,
    errored: bool,
}

impl Sse {
    fn types(&self) -> Vec<&str> {
        self.events.iter().map(|(_, t, _)| t.as_str()).collect()
    }

    fn last(&self) -> &Value {
        &self.events.last().expect("events").2
    }
}

async fn read_sse(resp: reqwest::Response) -> Sse {
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut out = Sse {
        events: Vec::new(),
        chunks: 0,
        errored: false,
    };
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            out.errored = true;
            break;
        };
        let now = Instant::now();
        out.chunks += 1;
        buf.push_str(std::str::from_utf8(&chunk).expect("utf8"));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let mut ty = String::new();
            let mut data = Value::Null;
            for line in frame.lines() {
                if let Some(t) = line.strip_prefix("event: ") {
                    ty = t.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).expect("event json");
                }
            }
            assert_eq!(data["type"], ty.as_str(), "data repeats the event type");
            out.events.push((now, ty, data));
        }
    }
    out
}

const MESSAGE_SEQUENCE: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_full_event_sequence() {
    let mock = start(MockConfig {
        deltas: 3,
        ..MockConfig::default()
    });
    let c = client();
    let resp = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "text/event-stream");
    for name in [
        "x-codex-primary-used-percent",
        "x-codex-primary-reset-at",
        "x-codex-secondary-used-percent",
        "x-codex-secondary-reset-at",
        "x-request-id",
    ] {
        assert!(h.contains_key(name), "missing {name}");
    }
    assert_eq!(h["x-codex-primary-window-minutes"], "300");
    assert_eq!(h["x-codex-secondary-window-minutes"], "10080");
    assert_eq!(h["x-codex-plan-type"], "plus");
    assert!(h["x-codex-turn-state"].to_str().unwrap().starts_with("ts-"));

    let sse = read_sse(resp).await;
    assert!(!sse.errored);
    assert_eq!(sse.types(), MESSAGE_SEQUENCE);
    for (i, (_, _, v)) in sse.events.iter().enumerate() {
        assert_eq!(v["sequence_number"], i);
    }
    let deltas: String = sse
        .events
        .iter()
        .filter(|(_, t, _)| t == "response.output_text.delta")
        .map(|(_, _, v)| v["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, DEFAULT_TEXT);
    let item_id = &sse.events[2].2["item"]["id"];
    for (_, t, v) in &sse.events[3..9] {
        assert_eq!(&v["item_id"], item_id, "{t}");
        assert_eq!(v["output_index"], 0);
    }
    let done = &sse.events[9].2["item"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["content"][0]["text"], DEFAULT_TEXT);
    let r = &sse.last()["response"];
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "gpt-5.1-codex");
    assert_eq!(r["output"][0], *done);
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    assert!(u["output_tokens_details"]["reasoning_tokens"].is_u64());

    assert!(mock.wait_active_streams(0, Duration::from_secs(2)));
    assert_eq!(mock.completed_streams(), 1);
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].version, "HTTP/1.1");
    assert_eq!(reqs[0].path, "/backend-api/codex/responses");
    assert_eq!(reqs[0].account_id(), Some("acct-1"));
    assert_eq!(reqs[0].header("Authorization"), Some("Bearer at-test"));
    assert_eq!(reqs[0].json.as_ref().unwrap()["model"], "gpt-5.1-codex");
    mock.clear_requests();
    assert!(mock.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_state_is_echoed_and_text_is_controllable() {
    let mock = start(MockConfig::default());
    let c = client();
    let body = with(
        valid_body(),
        json!({"client_metadata": {"x-mock-text": "from metadata", "x-mock-deltas": "2"}}),
    );
    let resp = post(
        &c,
        &mock,
        &[
            ("x-codex-turn-state", "ts-abc-123"),
            ("x-mock-text", "from header"),
        ],
        &body,
    )
    .await;
    assert_eq!(resp.headers()["x-codex-turn-state"], "ts-abc-123");
    let sse = read_sse(resp).await;
    // client_metadata wins over headers.
    assert_eq!(
        sse.types()
            .iter()
            .filter(|t| **t == "response.output_text.delta")
            .count(),
        2
    );
    assert_eq!(
        sse.last()["response"]["output"][0]["content"][0]["text"],
        "from metadata"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_paced_by_inter_event_delay() {
    let delay = Duration::from_millis(40);
    let mock = start(MockConfig {
        deltas: 3,
        inter_event_delay: delay,
        ..MockConfig::default()
    });
    let c = client();
    let sent = Instant::now();
    let resp = post(
        &c,
        &mock,
        &[("x-mock-first-byte-delay-ms", "150")],
        &valid_body(),
    )
    .await;
    assert!(
        sent.elapsed() >= Duration::from_millis(140),
        "head waits for the first-byte delay"
    );
    let sse = read_sse(resp).await;
    assert_eq!(sse.types(), MESSAGE_SEQUENCE);
    // Each event is its own chunk, flushed as produced: not all at once.
    assert_eq!(sse.chunks, sse.events.len());
    let span = sse.events.last().unwrap().0 - sse.events[0].0;
    let expected = delay * (sse.events.len() as u32 - 1);
    assert!(
        span >= expected.mul_f64(0.8),
        "span {span:?} < {expected:?}"
    );
    let spaced = sse
        .events
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 >= delay / 2)
        .count();
    assert!(
        spaced >= sse.events.len() - 2,
        "only {spaced} gaps were paced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_runs_are_generated_and_paced_by_rate() {
    let mock = start(MockConfig::default());
    let c = client();
    let sent = Instant::now();
    let body = with(
        valid_body(),
        json!({"client_metadata": {"x-mock-tokens": "40"}}),
    );
    let resp = post(&c, &mock, &[("x-mock-events-per-second", "200")], &body).await;
    let sse = read_sse(resp).await;
    // 4 leading events (sent at once), 40 deltas, 3 done events, the terminal: 44 gaps of
    // 5 ms.
    assert_eq!(sse.events.len(), 48);
    assert!(sent.elapsed() >= Duration::from_millis(44 * 5 * 9 / 10));
    assert!(sse.events[3].0 - sse.events[0].0 < Duration::from_millis(4));
    let deltas: String = sse
        .events
        .iter()
        .filter(|(_, t, _)| t == "response.output_text.delta")
        .map(|(_, _, v)| v["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, "tok ".repeat(40));
    for (i, (_, _, v)) in sse.events.iter().enumerate() {
        assert_eq!(v["sequence_number"], i as u64);
    }
    let last = sse.last();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(
        last["response"]["output"][0]["content"][0]["text"],
        "tok ".repeat(40)
    );
    assert_eq!(last["response"]["usage"]["output_tokens"], 40);
    assert_eq!(mock.completed_streams(), 1);

    // fail-after-output cuts the run in half.
    let resp = post(
        &c,
        &mock,
        &[
            ("x-mock-tokens", "10"),
            ("x-mock-fail-after-output", "server_is_overloaded"),
        ],
        &valid_body(),
    )
    .await;
    let sse = read_sse(resp).await;
    assert_eq!(sse.events.len(), 4 + 5 + 1);
    assert_eq!(sse.last()["type"], "response.failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_requests_like_the_backend() {
    let mock = start(MockConfig::default());
    let c = client();
    let url = format!("{}/responses", mock.base_url());

    let r = c
        .post(&url)
        .header("chatgpt-account-id", "a")
        .json(&valid_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "token_invalidated");
    assert_eq!(v["status"], 401);

    let r = c
        .post(&url)
        .bearer_auth("x")
        .json(&valid_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let r = c
        .post(&url)
        .bearer_auth("x")
        .header("chatgpt-account-id", "a")
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let cases = [
        (json!({"stream": false}), "Stream must be set to true"),
        (json!({"store": true}), "Store must be set to false"),
        (json!({"input": "hi"}), "Input must be a list"),
        (
            json!({"temperature": 0.2}),
            "Unsupported parameter: temperature",
        ),
        (
            json!({"max_output_tokens": 5}),
            "Unsupported parameter: max_output_tokens",
        ),
        (
            json!({"previous_response_id": "resp_1"}),
            "Unsupported parameter: previous_response_id",
        ),
        (json!({"metadata": {}}), "Unsupported parameter: metadata"),
        (
            json!({"prompt_cache_retention": "24h"}),
            "Unsupported parameter: prompt_cache_retention",
        ),
    ];
    for (extra, detail) in cases {
        let r = post(&c, &mock, &[], &with(valid_body(), extra.clone())).await;
        assert_eq!(r.status(), 400, "{extra}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["detail"], detail);
    }
    let mut no_instructions = valid_body();
    no_instructions
        .as_object_mut()
        .unwrap()
        .remove("instructions");
    let r = post(&c, &mock, &[], &no_instructions).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["detail"], "Instructions are required");

    let r = post(&c, &mock, &[("x-mock-nope", "1")], &valid_body()).await;
    assert_eq!(r.status(), 400);
    assert_eq!(mock.requests().len(), 13);
    assert_eq!(mock.completed_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_controls_from_headers_and_client_metadata() {
    let mock = start(MockConfig::default());
    let c = client();

    let r = post(
        &c,
        &mock,
        &[("x-mock-error", "usage_limit_reached")],
        &valid_body(),
    )
    .await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "usage_limit_reached");
    assert_eq!(v["error"]["plan_type"], "plus");
    assert_eq!(v["error"]["resets_in_seconds"], 3600);
    assert!(v["error"]["resets_at"].as_u64().unwrap() > 1_700_000_000);

    let body = with(
        valid_body(),
        json!({"client_metadata": {"x-mock-error": "server_is_overloaded"}}),
    );
    let r = post(&c, &mock, &[], &body).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "server_is_overloaded");

    let r = post(
        &c,
        &mock,
        &[("x-mock-error", "model_not_supported")],
        &valid_body(),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["detail"],
        "The 'gpt-5.1-codex' model is not supported when using Codex with a ChatGPT account."
    );

    let r = post(&c, &mock, &[("x-mock-error", "cloudflare")], &valid_body()).await;
    assert_eq!(r.status(), 403);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));

    let r = post(
        &c,
        &mock,
        &[
            ("x-mock-error", "account_deactivated"),
            ("x-mock-status", "403"),
        ],
        &valid_body(),
    )
    .await;
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("deactivated"));

    for kind in ErrorKind::ALL {
        let r = post(&c, &mock, &[("x-mock-error", kind.as_str())], &valid_body()).await;
        assert_eq!(r.status().as_u16(), kind.natural_status(), "{kind}");
    }
    let r = post(&c, &mock, &[("x-mock-status", "418")], &valid_body()).await;
    assert_eq!(r.status(), 418);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_stream_failures() {
    let mock = start(MockConfig {
        deltas: 4,
        ..MockConfig::default()
    });
    let c = client();
    let r = post(
        &c,
        &mock,
        &[("x-mock-fail-in-stream", "server_is_overloaded")],
        &valid_body(),
    )
    .await;
    assert_eq!(r.status(), 200);
    let sse = read_sse(r).await;
    assert_eq!(
        sse.types(),
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    let err = &sse.last()["response"]["error"];
    assert_eq!(err["code"], "server_is_overloaded");
    assert!(err["message"].is_string() && err["type"].is_string());
    assert_eq!(sse.last()["response"]["status"], "failed");

    let r = post(
        &c,
        &mock,
        &[("x-mock-fail-after-output", "context_length_exceeded")],
        &valid_body(),
    )
    .await;
    let sse = read_sse(r).await;
    let t = sse.types();
    assert_eq!(
        t.iter()
            .filter(|t| **t == "response.output_text.delta")
            .count(),
        2
    );
    assert_eq!(*t.last().unwrap(), "response.failed");
    assert_eq!(
        sse.last()["response"]["error"]["code"],
        "context_length_exceeded"
    );
    assert_eq!(mock.completed_streams(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_after_aborts_without_terminal_event() {
    let mock = start(MockConfig::default());
    let c = client();
    let r = post(
        &c,
        &mock,
        &[("x-mock-disconnect-after", "3")],
        &valid_body(),
    )
    .await;
    assert_eq!(r.status(), 200);
    let sse = read_sse(r).await;
    assert!(
        sse.errored,
        "the body must end with an error, not a clean EOF"
    );
    assert_eq!(sse.events.len(), 3);
    assert!(mock.wait_active_streams(0, Duration::from_secs(2)));
    assert_eq!(mock.completed_streams(), 0);

    // A client that drops a slow stream is observed as a closed stream.
    let r = post(
        &c,
        &mock,
        &[("x-mock-inter-event-delay-ms", "50")],
        &valid_body(),
    )
    .await;
    let mut s = r.bytes_stream();
    let _ = s.next().await;
    assert_eq!(mock.active_streams(), 1);
    drop(s);
    assert!(mock.wait_active_streams(0, Duration::from_secs(3)));
    assert_eq!(mock.completed_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_behaviour_applies_fail_times_then_succeeds() {
    let mock = start(MockConfig::default());
    let c = client();
    mock.set_behaviour(
        "acct-1",
        Behaviour::error(ErrorKind::UsageLimitReached).times(2),
    );
    for _ in 0..2 {
        assert_eq!(post(&c, &mock, &[], &valid_body()).await.status(), 429);
    }
    let r = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        *read_sse(r).await.types().last().unwrap(),
        "response.completed"
    );

    // Other accounts are unaffected; spec strings work too.
    mock.set_behaviour(
        "acct-2",
        "fail_in_stream=usage_limit_reached".parse().unwrap(),
    );
    let r = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(
        *read_sse(r).await.types().last().unwrap(),
        "response.completed"
    );
    let r = c
        .post(format!("{}/responses", mock.base_url()))
        .bearer_auth("x")
        .header("chatgpt-account-id", "acct-2")
        .json(&valid_body())
        .send()
        .await
        .unwrap();
    assert_eq!(
        *read_sse(r).await.types().last().unwrap(),
        "response.failed"
    );
    mock.clear_behaviour("acct-2");

    mock.set_quota("acct-1", 42.5, 7.0);
    let r = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(r.headers()["x-codex-primary-used-percent"], "42.5");
    assert_eq!(r.headers()["x-codex-secondary-used-percent"], "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_reasoning_incomplete_and_empty_output() {
    let mock = start(MockConfig::default());
    let c = client();
    let r = post(
        &c,
        &mock,
        &[
            ("x-mock-tool-call", "exec_command"),
            ("x-mock-tool-arguments", r#"{"cmd":"echo tool-ran-ok"}"#),
            ("x-mock-reasoning", "1"),
        ],
        &valid_body(),
    )
    .await;
    let sse = read_sse(r).await;
    let t = sse.types();
    assert_eq!(t[2], "response.output_item.added");
    assert_eq!(sse.events[2].2["item"]["type"], "reasoning");
    assert!(t.contains(&"response.reasoning_summary_text.delta"));
    assert!(t.contains(&"response.function_call_arguments.delta"));
    assert!(t.contains(&"response.function_call_arguments.done"));
    let out = &sse.last()["response"]["output"];
    assert_eq!(out[0]["type"], "reasoning");
    assert_eq!(out[1]["type"], "function_call");
    assert_eq!(out[1]["name"], "exec_command");
    assert_eq!(out[1]["arguments"], r#"{"cmd":"echo tool-ran-ok"}"#);
    assert!(out[1]["call_id"].as_str().unwrap().starts_with("call_"));

    let r = post(
        &c,
        &mock,
        &[("x-mock-empty-completed-output", "1")],
        &valid_body(),
    )
    .await;
    let sse = read_sse(r).await;
    assert!(sse.types().contains(&"response.output_item.done"));
    assert_eq!(sse.last()["response"]["output"], json!([]));

    let r = post(
        &c,
        &mock,
        &[("x-mock-incomplete", "max_output_tokens")],
        &valid_body(),
    )
    .await;
    let sse = read_sse(r).await;
    assert_eq!(*sse.types().last().unwrap(), "response.incomplete");
    assert_eq!(
        sse.last()["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(mock.completed_streams(), 3);
}

async fn refresh(c: &reqwest::Client, mock: &MockHandle, rt: &str) -> (u16, Value) {
    let r = c
        .post(mock.token_url())
        .json(&json!({"client_id": "app_EMoamEEZ73f0CkXaXp7hrann", "grant_type": "refresh_token", "refresh_token": rt}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_rotates_and_detects_reuse() {
    let mock = start(MockConfig {
        strict_tokens: true,
        token_delay: Duration::from_millis(100),
        ..MockConfig::default()
    });
    let c = client();
    let t0 = mock.add_account(MockAccount::new("acct-1"));
    assert_eq!(mock.account_tokens("acct-1").unwrap(), t0);

    let ok = |tok: &str| {
        let c = c.clone();
        let url = format!("{}/responses", mock.base_url());
        let tok = tok.to_owned();
        async move {
            c.post(url)
                .bearer_auth(tok)
                .header("chatgpt-account-id", "acct-1")
                .json(&valid_body())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(ok(&t0.access_token).await, 200);

    let started = Instant::now();
    let (s, v) = refresh(&c, &mock, &t0.refresh_token).await;
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "token_delay applies"
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["token_type"], "Bearer");
    assert_eq!(v["expires_in"], 3600);
    let rt1 = v["refresh_token"].as_str().unwrap().to_owned();
    let at1 = v["access_token"].as_str().unwrap().to_owned();
    assert_ne!(rt1, t0.refresh_token);
    assert!(v["id_token"].is_string());

    // Strict tokens: the old access token is now invalidated.
    assert_eq!(ok(&t0.access_token).await, 401);
    assert_eq!(ok(&at1).await, 200);

    let (s, v) = refresh(&c, &mock, &t0.refresh_token).await;
    assert_eq!(s, 401);
    assert_eq!(v["error"]["code"], "refresh_token_reused");
    let (s, v) = refresh(&c, &mock, "rt_unknown").await;
    assert_eq!(s, 401);
    assert_eq!(v["error"], "invalid_grant");

    // Concurrent refreshes with one token: exactly one wins.
    let (a, b) = tokio::join!(refresh(&c, &mock, &rt1), refresh(&c, &mock, &rt1));
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 401]);

    // Form-encoded refresh (the Go peers).
    let rt2 = mock.account_tokens("acct-1").unwrap().refresh_token;
    let r = c
        .post(mock.token_url())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("grant_type=refresh_token&client_id=app_EMoamEEZ73f0CkXaXp7hrann&refresh_token={rt2}&scope=openid+profile+email"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(mock.token_calls(), 6);
    let reqs = mock.token_requests();
    assert_eq!(reqs.len(), 6);
    assert_eq!(
        reqs[5].json.as_ref().unwrap()["scope"],
        "openid profile email"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_refresh_errors_code_exchange_and_expiry() {
    let mock = start(MockConfig {
        strict_tokens: true,
        omit_rotated_refresh_token: true,
        access_token_ttl: Duration::from_secs(0),
        ..MockConfig::default()
    });
    let c = client();
    let t = mock.add_account(MockAccount::new("acct-9").with_plan("pro"));
    let r = c
        .post(format!("{}/responses", mock.base_url()))
        .bearer_auth(&t.access_token)
        .header("chatgpt-account-id", "acct-9")
        .json(&valid_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "token_expired");

    mock.set_behaviour(
        "acct-9",
        Behaviour::refresh_error(RefreshError::Expired).times(1),
    );
    let (s, v) = refresh(&c, &mock, &t.refresh_token).await;
    assert_eq!(s, 401);
    assert_eq!(v["error"]["code"], "refresh_token_expired");
    // fail_times spent: succeeds, and without a rotated refresh token the old one stays valid.
    let (s, v) = refresh(&c, &mock, &t.refresh_token).await;
    assert_eq!(s, 200);
    assert!(v.get("refresh_token").is_none());
    let (s, _) = refresh(&c, &mock, &t.refresh_token).await;
    assert_eq!(s, 200);

    mock.set_behaviour("acct-9", "refresh_error=internal".parse().unwrap());
    assert_eq!(refresh(&c, &mock, &t.refresh_token).await.0, 500);
    mock.set_behaviour(
        "acct-9",
        Behaviour::refresh_error(RefreshError::Invalidated),
    );
    let (_, v) = refresh(&c, &mock, &t.refresh_token).await;
    assert_eq!(v["error"]["code"], "refresh_token_invalidated");

    let r = c
        .post(mock.token_url())
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", "account:acct-new"),
            ("code_verifier", "v"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["refresh_token"].as_str().unwrap().starts_with("rt_mock_"));
    assert!(mock.account_tokens("acct-new").is_some());
    let r = c
        .post(mock.token_url())
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", "account:acct-new"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a code is single-use");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_catalog_has_etag() {
    let mock = start(MockConfig::default());
    let c = client();
    let url = format!("{}/models?client_version=0.171.0", mock.base_url());
    let r = c.get(&url).bearer_auth("x").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    let v: Value = r.json().await.unwrap();
    let models = v["models"].as_array().unwrap();
    assert!(!models.is_empty());
    assert!(models.iter().all(|m| m["slug"].is_string()));
    let r = c
        .get(&url)
        .bearer_auth("x")
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    assert_eq!(c.get(&url).send().await.unwrap().status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wham_usage_reports_quota() {
    let mock = start(MockConfig::default());
    mock.add_account(MockAccount::new("acct-q").with_plan("pro"));
    mock.set_quota("acct-q", 100.0, 35.0);
    let c = client();
    let v: Value = c
        .get(mock.usage_url())
        .bearer_auth("x")
        .header("chatgpt-account-id", "acct-q")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["plan_type"], "pro");
    assert_eq!(v["account_id"], "acct-q");
    let rl = &v["rate_limit"];
    assert_eq!(rl["limit_reached"], true);
    assert_eq!(rl["primary_window"]["used_percent"], 100.0);
    assert_eq!(rl["primary_window"]["limit_window_seconds"], 18000);
    assert_eq!(rl["secondary_window"]["used_percent"], 35.0);
    assert_eq!(rl["secondary_window"]["limit_window_seconds"], 604_800);
    assert!(
        rl["secondary_window"]["reset_after_seconds"]
            .as_u64()
            .unwrap()
            <= 604_800
    );
    assert!(rl["primary_window"]["reset_at"].as_u64().unwrap() > 1_700_000_000);
    assert!(v["credits"]["has_credits"].is_boolean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge_on_plain_tcp() {
    let mock = start(MockConfig::default());
    let c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(
        *read_sse(r).await.types().last().unwrap(),
        "response.completed"
    );
    assert_eq!(mock.requests()[0].version, "HTTP/2.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_negotiates_h2_via_alpn() {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let mock = start(MockConfig {
        tls: Some((cert, key)),
        inter_event_delay: Duration::from_millis(5),
        ..MockConfig::default()
    });
    assert!(mock.base_url().starts_with("https://127.0.0.1:"));
    let root = reqwest::Certificate::from_pem(ck.cert.pem().as_bytes()).unwrap();

    let c = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(root.clone())
        .build()
        .unwrap();
    let r = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    let sse = read_sse(r).await;
    assert_eq!(*sse.types().last().unwrap(), "response.completed");
    // h2 may add an empty END_STREAM DATA frame.
    assert!(sse.chunks >= sse.events.len());
    assert_eq!(mock.requests()[0].version, "HTTP/2.0");

    let c1 = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(root)
        .http1_only()
        .build()
        .unwrap();
    let r = post(&c1, &mock, &[], &valid_body()).await;
    assert_eq!(r.version(), reqwest::Version::HTTP_11);
    assert_eq!(
        *read_sse(r).await.types().last().unwrap(),
        "response.completed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_endpoints() {
    let mock = start(MockConfig::default());
    let c = client();
    let origin = mock.origin();
    let t: Value = c
        .post(format!("{origin}/__mock/accounts"))
        .json(&json!({"chatgpt_account_id": "acct-op", "plan_type": "team"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["account_id"], "acct-op");
    let r = c
        .post(format!("{origin}/__mock/behaviour/acct-1"))
        .body("error=rate_limit_exceeded,fail_times=1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = post(&c, &mock, &[], &valid_body()).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let reqs: Value = c
        .get(format!("{origin}/__mock/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reqs[0]["headers"]["chatgpt-account-id"], "acct-1");
    assert_eq!(reqs[0]["json"]["model"], "gpt-5.1-codex");
    let stats: Value = c
        .get(format!("{origin}/__mock/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["responses"], 1);
    c.post(format!("{origin}/__mock/reset"))
        .send()
        .await
        .unwrap();
    assert!(mock.requests().is_empty());
    let check: Value = c
        .get(format!("{origin}/backend-api/wham/accounts/check"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(check["accounts"][0]["workspace_backend_origin"], origin);
}

#[test]
fn binary_prints_address_and_serves() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-codex"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--deltas",
            "2",
            "--account",
            "acct-bin",
            "--account-behaviour",
            "acct-x=error=usage_limit_reached,fail_times=1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn mock-codex");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let origin = first
        .strip_prefix("mock-codex listening on ")
        .expect("listening line")
        .to_owned();
    let tokens: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(tokens["account_id"], "acct-bin");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = client();
        let r = c
            .get(format!("{origin}/backend-api/codex/models"))
            .bearer_auth(tokens["access_token"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = c
            .post(format!("{origin}/backend-api/codex/responses"))
            .bearer_auth("x")
            .header("chatgpt-account-id", "acct-x")
            .json(&valid_body())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
    });
    let _ = child.kill();
    let _ = child.wait();

    let bad = Command::new(env!("CARGO_BIN_EXE_mock-codex"))
        .args(["--account-behaviour", "acct-x=nope=1"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(bad.code(), Some(64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_listening() {
    let mock = start(MockConfig::default());
    let addr = mock.addr();
    let clone = mock.clone();
    drop(mock);
    // A clone keeps it alive.
    assert!(std::net::TcpStream::connect(addr).is_ok());
    clone.shutdown();
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// Rough throughput of the mock (run with `--ignored --nocapture`, ideally `--release`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "manual throughput check"]
async fn throughput_smoke() {
    let mock = start(MockConfig {
        deltas: 32,
        text: Some("x".repeat(256)),
        max_recorded: 0,
        ..MockConfig::default()
    });
    let c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let n = 2000;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let c = c.clone();
        let mock = mock.clone();
        tasks.push(tokio::spawn(async move {
            let mut events = 0;
            for _ in 0..n / 32 {
                let r = post(&c, &mock, &[], &valid_body()).await;
                events += read_sse(r).await.events.len();
            }
            events
        }));
    }
    let mut events = 0;
    for t in tasks {
        events += t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} responses, {events} events in {secs:.2}s: {:.0} resp/s, {:.0} events/s",
        mock.completed_streams(),
        mock.completed_streams() as f64 / secs,
        events as f64 / secs
    );
}

// === The Responses WebSocket ===

type WsClient =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type WsResult<T> = Result<T, tokio_tungstenite::tungstenite::Error>;
type WsHandshake = tokio_tungstenite::tungstenite::handshake::client::Response;
use futures_util::SinkExt as _;
use tokio_tungstenite::tungstenite::{
    client::IntoClientRequest as _, http::HeaderValue, protocol::frame::coding::CloseCode, Message,
};

/// The upgrade request of `mock.ws_url()`: bearer, account and the official `openai-beta`
/// header, then `headers` (which replace those; an empty value removes the header).
fn ws_request(
    url: &str,
    headers: &[(&'static str, &str)],
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req = url.into_client_request().expect("ws request");
    let h = req.headers_mut();
    h.insert("authorization", HeaderValue::from_static("Bearer at-test"));
    h.insert("chatgpt-account-id", HeaderValue::from_static("acct-1"));
    h.insert(
        "openai-beta",
        HeaderValue::from_static("responses_websockets=2026-02-06"),
    );
    for (k, v) in headers {
        if v.is_empty() {
            h.remove(*k);
        } else {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
    }
    req
}

async fn ws_connect(
    mock: &MockHandle,
    headers: &[(&'static str, &str)],
) -> WsResult<(WsClient, WsHandshake)> {
    tokio_tungstenite::connect_async(ws_request(&mock.ws_url(), headers)).await
}

async fn ws_open(mock: &MockHandle) -> WsClient {
    ws_connect(mock, &[]).await.expect("ws handshake").0
}

/// The HTTP answer of a rejected handshake: status and JSON body.
fn ws_rejection(r: WsResult<(WsClient, WsHandshake)>) -> (u16, Value) {
    match r {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            (
                resp.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            )
        }
        Err(e) => panic!("expected an HTTP rejection, got {e}"),
        Ok(_) => panic!("expected an HTTP rejection, got 101"),
    }
}

/// A `response.create` frame: the valid POST body plus `extra`.
fn create(extra: Value) -> Message {
    let body = with(
        with(valid_body(), json!({"type": "response.create"})),
        extra,
    );
    Message::text(body.to_string())
}

/// Any client socket (plain or TLS).
trait WsIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> WsIo for T {}
type Ws<S> = tokio_tungstenite::WebSocketStream<S>;

async fn ws_next<S: WsIo>(ws: &mut Ws<S>) -> Option<WsResult<Message>> {
    tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("a frame within 5 s")
}

/// The next event (text frame) as JSON.
async fn ws_event<S: WsIo>(ws: &mut Ws<S>) -> Value {
    match ws_next(ws).await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).expect("event JSON"),
        other => panic!("expected an event, got {other:?}"),
    }
}

const TERMINAL: &[&str] = &[
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

/// Events up to and including a terminal one (or an `error` event).
async fn ws_turn<S: WsIo>(ws: &mut Ws<S>) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let ev = ws_event(ws).await;
        let done = TERMINAL.contains(&ev["type"].as_str().unwrap_or_default());
        out.push(ev);
        if done {
            return out;
        }
    }
}

fn ev_types(evs: &[Value]) -> Vec<&str> {
    evs.iter().map(|v| v["type"].as_str().unwrap()).collect()
}

/// Reads until the server ends the connection; returns whether a close frame came first (and
/// its code).
async fn ws_end<S: WsIo>(ws: &mut Ws<S>) -> Option<CloseCode> {
    let mut close = None;
    loop {
        match ws_next(ws).await {
            Some(Ok(Message::Close(f))) => close = Some(f.map_or(CloseCode::Status, |f| f.code)),
            Some(Ok(Message::Text(t))) => panic!("unexpected event {t}"),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return close,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_warmup_then_turns_on_one_socket() {
    let mock = start(MockConfig {
        deltas: 3,
        ..MockConfig::default()
    });
    mock.set_quota("acct-1", 42.5, 7.0);
    // The official client offers permessage-deflate; the mock declines it.
    let (mut ws, resp) = ws_connect(
        &mock,
        &[
            (
                "sec-websocket-extensions",
                "permessage-deflate; client_max_window_bits",
            ),
            ("x-codex-turn-state", "ts-ws-1"),
        ],
    )
    .await
    .expect("handshake");
    assert_eq!(resp.status(), 101);
    assert!(resp.headers().get("sec-websocket-extensions").is_none());
    assert_eq!(resp.headers()["x-codex-turn-state"], "ts-ws-1");
    assert!(resp.headers().contains_key("x-models-etag"));
    assert_eq!(mock.ws_handshakes(), 1);
    assert_eq!(mock.ws_open(), 1);

    // Warm-up: rate limits, created, completed with an empty output; no model turn.
    ws.send(create(json!({"generate": false, "input": []})))
        .await
        .unwrap();
    let warm = ws_turn(&mut ws).await;
    assert_eq!(
        ev_types(&warm),
        [
            "codex.rate_limits",
            "response.created",
            "response.completed"
        ]
    );
    let rl = &warm[0]["rate_limits"];
    assert_eq!(rl["primary"]["used_percent"], 42.5);
    assert_eq!(rl["primary"]["window_minutes"], 300);
    assert_eq!(rl["secondary"]["used_percent"], 7.0);
    assert!(rl["secondary"]["reset_at"].as_u64().unwrap() > 0);
    assert_eq!(warm[0]["plan_type"], "plus");
    let done = &warm[2]["response"];
    assert_eq!(done["output"], json!([]));
    assert_eq!(done["usage"]["output_tokens"], 0);
    let warm_id = done["id"].as_str().unwrap().to_owned();
    assert!(warm_id.starts_with("resp_"));
    assert_eq!(warm[1]["response"]["id"], warm_id.as_str());
    assert_eq!(mock.completed_streams(), 0, "a warm-up is not a model turn");

    // Ping → pong, between turns.
    ws.send(Message::Ping(bytes::Bytes::from_static(b"hi")))
        .await
        .unwrap();
    match ws_next(&mut ws).await {
        Some(Ok(Message::Pong(p))) => assert_eq!(&p[..], b"hi"),
        other => panic!("expected a pong, got {other:?}"),
    }

    // Turn 1 continues the warm-up, turn 2 continues turn 1: one socket, one handshake.
    let mut prev = warm_id.clone();
    let mut ids = vec![warm_id.clone()];
    for turn in 0..2 {
        ws.send(create(json!({"previous_response_id": prev})))
            .await
            .unwrap();
        let evs = ws_turn(&mut ws).await;
        assert_eq!(evs[0]["type"], "codex.rate_limits");
        assert_eq!(ev_types(&evs[1..]), MESSAGE_SEQUENCE, "turn {turn}");
        for (i, v) in evs[1..].iter().enumerate() {
            assert_eq!(v["sequence_number"], i);
        }
        let text: String = evs
            .iter()
            .filter(|v| v["type"] == "response.output_text.delta")
            .map(|v| v["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, DEFAULT_TEXT);
        let id = evs.last().unwrap()["response"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(!ids.contains(&id), "every response has a fresh id");
        ids.push(id.clone());
        prev = id;
    }
    assert_eq!(mock.ws_handshakes(), 1);
    assert_eq!(mock.ws_requests(), 3);
    assert_eq!(mock.ws_responses(), 3);
    assert_eq!(mock.completed_streams(), 2);
    assert_eq!(mock.responses_requests(), 0, "no HTTP /responses");

    // Every response.create is recorded with the handshake's headers.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.method, "WS");
        assert_eq!(r.path, "/backend-api/codex/responses");
        assert_eq!(r.version, "HTTP/1.1");
        assert_eq!(r.account_id(), Some("acct-1"));
        assert_eq!(r.header("authorization"), Some("Bearer at-test"));
        assert_eq!(
            r.header("openai-beta"),
            Some("responses_websockets=2026-02-06")
        );
        assert_eq!(r.json.as_ref().unwrap()["type"], "response.create");
    }
    assert_eq!(reqs[0].json.as_ref().unwrap()["generate"], false);
    assert_eq!(
        reqs[1].json.as_ref().unwrap()["previous_response_id"],
        warm_id.as_str()
    );
    assert_eq!(
        serde_json::from_str::<Value>(&reqs[2].body_text()).unwrap()["previous_response_id"],
        ids[1].as_str()
    );

    // The client closes: the mock answers the close frame and drops the socket.
    ws.close(None).await.unwrap();
    assert!(ws_end(&mut ws).await.is_some(), "the close is answered");
    assert!(mock.wait_ws_open(0, Duration::from_secs(2)));
    assert_eq!(mock.ws_handshakes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_previous_response_id_is_connection_local() {
    let mock = start(MockConfig::default());
    let mut a = ws_open(&mock).await;
    let mut b = ws_open(&mock).await;
    assert_eq!(mock.ws_open(), 2);
    a.send(create(json!({}))).await.unwrap();
    let id_a = ws_turn(&mut a).await.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Produced on socket A: unknown on socket B, and an invented id is unknown everywhere.
    for (ws, id) in [(&mut b, id_a.as_str()), (&mut a, "resp_never_issued")] {
        ws.send(create(json!({"previous_response_id": id})))
            .await
            .unwrap();
        let ev = ws_event(ws).await;
        assert_eq!(
            ev,
            json!({"type": "error", "status": 400, "error": {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "message": format!("Previous response with id '{id}' not found."),
                "param": "previous_response_id",
            }})
        );
    }
    // Both sockets stay usable, and A still resolves its own id.
    b.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut b).await.last().unwrap()["type"],
        "response.completed"
    );
    a.send(create(json!({"previous_response_id": id_a})))
        .await
        .unwrap();
    assert_eq!(
        ws_turn(&mut a).await.last().unwrap()["type"],
        "response.completed"
    );
    assert_eq!(mock.ws_requests(), 5);
    assert_eq!(mock.ws_responses(), 3);
    assert_eq!(mock.ws_handshakes(), 2);

    // A failed response is not a valid continuation.
    a.send(create(
        json!({"client_metadata": {"x-mock-fail-in-stream": "server_is_overloaded"}}),
    ))
    .await
    .unwrap();
    let evs = ws_turn(&mut a).await;
    assert_eq!(
        ev_types(&evs),
        [
            "codex.rate_limits",
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    assert_eq!(evs[3]["response"]["error"]["code"], "server_is_overloaded");
    let failed_id = evs[3]["response"]["id"].as_str().unwrap();
    a.send(create(json!({"previous_response_id": failed_id})))
        .await
        .unwrap();
    assert_eq!(
        ws_event(&mut a).await["error"]["code"],
        "previous_response_not_found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_second_create_during_a_stream_is_rejected() {
    let mock = start(MockConfig {
        deltas: 3,
        ..MockConfig::default()
    });
    let mut ws = ws_open(&mock).await;
    ws.send(create(
        json!({"client_metadata": {"x-mock-inter-event-delay-ms": "40"}}),
    ))
    .await
    .unwrap();
    let mut evs = vec![ws_event(&mut ws).await, ws_event(&mut ws).await];
    assert_eq!(ev_types(&evs), ["codex.rate_limits", "response.created"]);
    assert_eq!(mock.active_streams(), 1);
    ws.send(create(json!({}))).await.unwrap();
    let mut errors = Vec::new();
    loop {
        let ev = ws_event(&mut ws).await;
        if ev["type"] == "error" {
            errors.push(ev);
            continue;
        }
        let done = ev["type"] == "response.completed";
        evs.push(ev);
        if done {
            break;
        }
    }
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["status"], 400);
    assert_eq!(errors[0]["error"]["type"], "invalid_request_error");
    assert_eq!(
        errors[0]["error"]["code"],
        "conversation_already_has_active_response"
    );
    assert!(errors[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already in progress"));
    // The first stream went on, complete and in order.
    assert_eq!(ev_types(&evs[1..]), MESSAGE_SEQUENCE);
    assert_eq!(mock.ws_requests(), 2);
    assert_eq!(mock.ws_responses(), 1);
    assert_eq!(
        mock.requests().len(),
        2,
        "the rejected frame is recorded too"
    );
    // Idle again: the next create is served.
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_connection_age_limit_answers_error_and_closes() {
    let mock = start(MockConfig {
        ws_max_connection_age: Some(Duration::from_secs(1)),
        ..MockConfig::default()
    });
    let opened = Instant::now();
    let mut ws = ws_open(&mock).await;
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    tokio::time::sleep_until((opened + Duration::from_millis(1100)).into()).await;
    ws.send(create(json!({}))).await.unwrap();
    let ev = ws_event(&mut ws).await;
    assert_eq!(ev["type"], "error");
    assert_eq!(ev["error"]["code"], "websocket_connection_limit_reached");
    assert_eq!(ws_end(&mut ws).await, Some(CloseCode::Normal));
    assert!(mock.wait_ws_open(0, Duration::from_secs(3)));
    // A fresh socket works.
    let mut ws = ws_open(&mock).await;
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    assert_eq!(mock.ws_handshakes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_refused_upgrade_and_runtime_switch() {
    let mock = start(MockConfig {
        ws_refuse_upgrade: Some(426),
        ..MockConfig::default()
    });
    let (status, _) = ws_rejection(ws_connect(&mock, &[]).await);
    assert_eq!(status, 426);
    assert_eq!(mock.ws_rejected_handshakes(), 1);
    assert_eq!(mock.ws_handshakes(), 0);
    // HTTP+SSE still works (the fallback path).
    let r = post(&client(), &mock, &[], &valid_body()).await;
    assert_eq!(r.status(), 200);

    mock.set_ws_refuse_upgrade(None);
    let mut ws = ws_open(&mock).await;
    mock.set_ws_refuse_upgrade(Some(404));
    let (status, _) = ws_rejection(ws_connect(&mock, &[]).await);
    assert_eq!(status, 404);
    // A socket opened before the switch keeps working.
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    assert_eq!(mock.ws_handshakes(), 1);
    assert_eq!(mock.ws_rejected_handshakes(), 2);

    // A plain GET (no upgrade) is not a WebSocket.
    let r = client()
        .get(format!("{}/responses", mock.base_url()))
        .bearer_auth("at-test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 426);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_handshake_is_authenticated_like_post() {
    let mock = start(MockConfig {
        strict_tokens: true,
        ..MockConfig::default()
    });
    let (status, body) = ws_rejection(ws_connect(&mock, &[("authorization", "")]).await);
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "token_invalidated");
    assert_eq!(body["status"], 401);
    let (status, body) = ws_rejection(ws_connect(&mock, &[("chatgpt-account-id", "")]).await);
    assert_eq!(status, 400);
    assert_eq!(body["detail"], "Missing ChatGPT-Account-Id header");
    // strict_tokens: only the account's current access token.
    let t = mock.add_account(MockAccount::new("acct-ws"));
    let (status, body) =
        ws_rejection(ws_connect(&mock, &[("chatgpt-account-id", "acct-ws")]).await);
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "token_invalidated");
    let (status, body) = ws_rejection(
        ws_connect(
            &mock,
            &[
                ("chatgpt-account-id", "acct-ws"),
                ("authorization", &format!("Bearer {}", t.access_token)),
                ("x-mock-deltas", "many"),
            ],
        )
        .await,
    );
    assert_eq!(status, 400, "a bad x-mock header is rejected like on POST");
    assert!(body["detail"].as_str().unwrap().contains("x-mock-deltas"));
    assert_eq!(mock.ws_rejected_handshakes(), 4);
    assert_eq!(mock.ws_handshakes(), 0);
    assert_eq!(mock.ws_open(), 0);

    let bearer = format!("Bearer {}", t.access_token);
    let (mut ws, _) = ws_connect(
        &mock,
        &[
            ("chatgpt-account-id", "acct-ws"),
            ("authorization", &bearer),
        ],
    )
    .await
    .expect("the current token is accepted");
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    assert_eq!(mock.ws_handshakes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_disconnect_after_drops_the_socket_without_close_frame() {
    let mock = start(MockConfig::default());
    let mut ws = ws_open(&mock).await;
    ws.send(create(
        json!({"client_metadata": {"x-mock-disconnect-after": "3"}}),
    ))
    .await
    .unwrap();
    // codex.rate_limits, then the same 3 events the HTTP path sends before aborting.
    let evs = [
        ws_event(&mut ws).await,
        ws_event(&mut ws).await,
        ws_event(&mut ws).await,
        ws_event(&mut ws).await,
    ];
    assert_eq!(
        ev_types(&evs),
        [
            "codex.rate_limits",
            "response.created",
            "response.in_progress",
            "response.output_item.added"
        ]
    );
    assert_eq!(ws_end(&mut ws).await, None, "no close frame");
    assert!(mock.wait_ws_open(0, Duration::from_secs(2)));
    assert!(mock.wait_active_streams(0, Duration::from_secs(2)));
    assert_eq!(mock.completed_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_error_controls_become_error_events() {
    let mock = start(MockConfig {
        deltas: 4,
        ..MockConfig::default()
    });
    mock.set_behaviour(
        "acct-1",
        Behaviour::error(ErrorKind::UsageLimitReached).times(1),
    );
    let mut ws = ws_open(&mock).await;
    // The warm-up uses no controls (and none of the account's fail_times).
    ws.send(create(json!({"generate": false}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    ws.send(create(json!({}))).await.unwrap();
    let ev = ws_event(&mut ws).await;
    assert_eq!(ev["type"], "error");
    assert_eq!(ev["status"], 429);
    assert_eq!(ev["error"]["type"], "usage_limit_reached");
    assert!(ev["error"]["resets_at"].as_u64().is_some());
    assert_eq!(ev["headers"]["x-codex-primary-used-percent"], "100");
    // fail_times=1 is used up: the socket is still open and the next turn succeeds.
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );

    // client_metadata: a `detail` error becomes an invalid_request_error with its message,
    // after the first-byte delay.
    let started = Instant::now();
    ws.send(create(json!({"model": "gpt-4o", "client_metadata": {
        "x-mock-error": "model_not_supported",
        "x-mock-first-byte-delay-ms": "150",
    }})))
    .await
    .unwrap();
    let ev = ws_event(&mut ws).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(ev["status"], 400);
    assert_eq!(ev["error"]["type"], "invalid_request_error");
    assert_eq!(
        ev["error"]["message"],
        "The 'gpt-4o' model is not supported when using Codex with a ChatGPT account."
    );
    // Validation errors too.
    ws.send(create(json!({"store": true}))).await.unwrap();
    let ev = ws_event(&mut ws).await;
    assert_eq!(ev["error"]["message"], "Store must be set to false");
    ws.send(Message::text(r#"{"type":"response.append","input":[]}"#))
        .await
        .unwrap();
    assert_eq!(
        ws_event(&mut ws).await["error"]["code"],
        "unsupported_event_type"
    );

    // Handshake x-mock-* headers apply to every frame; client_metadata wins over them.
    let (mut ws2, _) = ws_connect(
        &mock,
        &[("x-mock-fail-after-output", "server_is_overloaded")],
    )
    .await
    .unwrap();
    ws2.send(create(json!({}))).await.unwrap();
    let evs = ws_turn(&mut ws2).await;
    assert_eq!(evs.last().unwrap()["type"], "response.failed");
    assert_eq!(
        evs.iter()
            .filter(|v| v["type"] == "response.output_text.delta")
            .count(),
        2
    );
    ws2.send(create(json!({"client_metadata": {
        "x-mock-fail-after-output": "",
        "x-mock-reasoning": "1",
        "x-mock-tool-call": "exec_command",
    }})))
    .await
    .unwrap();
    let evs = ws_turn(&mut ws2).await;
    let done = &evs.last().unwrap()["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert_eq!(done["output"][1]["type"], "function_call");
    assert_eq!(done["output"][1]["name"], "exec_command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_kill_all_and_close_all() {
    let mock = start(MockConfig::default());
    let mut a = ws_open(&mock).await;
    let mut b = ws_open(&mock).await;
    // A is mid-stream when the sockets die.
    a.send(create(
        json!({"client_metadata": {"x-mock-inter-event-delay-ms": "100"}}),
    ))
    .await
    .unwrap();
    assert_eq!(ws_event(&mut a).await["type"], "codex.rate_limits");
    assert_eq!(ws_event(&mut a).await["type"], "response.created");
    assert_eq!(mock.active_streams(), 1);
    assert_eq!(mock.ws_kill_all(), 2);
    for ws in [&mut a, &mut b] {
        let mut close = None;
        loop {
            match ws_next(ws).await {
                Some(Ok(Message::Close(f))) => close = Some(f),
                // Events already in flight may still arrive.
                Some(Ok(_)) => {}
                None | Some(Err(_)) => break,
            }
        }
        assert!(close.is_none(), "killed sockets send no close frame");
    }
    assert!(mock.wait_ws_open(0, Duration::from_secs(2)));
    assert!(mock.wait_active_streams(0, Duration::from_secs(2)));
    assert_eq!(mock.completed_streams(), 0);

    let mut c = ws_open(&mock).await;
    assert_eq!(mock.ws_close_all(), 1);
    assert_eq!(ws_end(&mut c).await, Some(CloseCode::Away));
    assert!(mock.wait_ws_open(0, Duration::from_secs(3)));
    assert_eq!(mock.ws_handshakes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_over_tls() {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let mock = start(MockConfig {
        tls: Some((cert, key)),
        ..MockConfig::default()
    });
    assert!(mock.ws_url().starts_with("wss://127.0.0.1:"));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(mock.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(ws_request(&mock.ws_url(), &[]), stream)
        .await
        .expect("wss handshake");
    assert_eq!(resp.status(), 101);
    ws.send(create(json!({"generate": false}))).await.unwrap();
    let warm = ws_turn(&mut ws).await;
    let id = warm.last().unwrap()["response"]["id"].clone();
    ws.send(create(json!({"previous_response_id": id})))
        .await
        .unwrap();
    let evs = ws_turn(&mut ws).await;
    assert_eq!(evs.last().unwrap()["type"], "response.completed");
    assert_eq!(mock.ws_handshakes(), 1);
    assert_eq!(mock.ws_responses(), 2);
}

#[test]
fn binary_ws_flags_and_operator_endpoints() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-codex"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--ws-refuse-upgrade",
            "404",
            "--ws-max-connection-age-secs",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn mock-codex");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let origin = first
        .strip_prefix("mock-codex listening on ")
        .expect("listening line")
        .to_owned();
    let url = format!(
        "{}/backend-api/codex/responses",
        origin.replacen("http://", "ws://", 1)
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (status, _) =
            ws_rejection(tokio_tungstenite::connect_async(ws_request(&url, &[])).await);
        assert_eq!(status, 404);
        let c = client();
        let r = c
            .post(format!("{origin}/__mock/ws/refuse-upgrade"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let (mut ws, _) = tokio_tungstenite::connect_async(ws_request(&url, &[]))
            .await
            .expect("upgrades accepted again");
        // Age limit 0: the first create already hits it.
        ws.send(create(json!({}))).await.unwrap();
        assert_eq!(
            ws_event(&mut ws).await["error"]["code"],
            "websocket_connection_limit_reached"
        );
        assert_eq!(ws_end(&mut ws).await, Some(CloseCode::Normal));
        let stats: Value = c
            .get(format!("{origin}/__mock/stats"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(stats["ws_handshakes"], 1);
        assert_eq!(stats["ws_rejected_handshakes"], 1);
        assert_eq!(stats["ws_requests"], 1);
        assert_eq!(stats["ws_responses"], 0);
    });
    let _ = child.kill();
    let _ = child.wait();
}

// --- Account-bound blobs (docs/protocol.md#account-bound-blobs) --------------------------

/// POST as `account`.
async fn post_as(
    c: &reqwest::Client,
    mock: &MockHandle,
    account: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> reqwest::Response {
    let mut req = c
        .post(format!("{}/responses", mock.base_url()))
        .header("authorization", "Bearer at-test")
        .header("chatgpt-account-id", account)
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("send")
}

/// A body replaying `items` after the user message, asking for encrypted reasoning.
fn replaying(items: &[Value]) -> Value {
    let mut input = valid_body()["input"].as_array().unwrap().clone();
    input.extend(items.iter().cloned());
    input.push(json!({"type": "message", "role": "user", "content": "again"}));
    with(
        valid_body(),
        json!({"input": input, "include": ["reasoning.encrypted_content"]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_bound_to_the_account_that_minted_them() {
    let mock = start(MockConfig::default());
    let c = client();
    // Without `include`, a reasoning item carries no encrypted_content.
    let sse = read_sse(
        post_as(
            &c,
            &mock,
            "acct-a",
            &[("x-mock-reasoning", "1")],
            &valid_body(),
        )
        .await,
    )
    .await;
    assert!(sse.last()["response"]["output"][0]
        .get("encrypted_content")
        .is_none());
    // With it, the blob is bound to acct-a.
    let body = with(
        valid_body(),
        json!({"include": ["reasoning.encrypted_content"]}),
    );
    let sse =
        read_sse(post_as(&c, &mock, "acct-a", &[("x-mock-reasoning", "1")], &body).await).await;
    let reasoning = sse.last()["response"]["output"][0].clone();
    let blob = reasoning["encrypted_content"].as_str().unwrap().to_owned();
    assert!(blob.starts_with(benches::mock::BLOB_PREFIX), "{blob}");
    assert!(benches::mock::blob_minted_for(&blob, "acct-a"));
    assert!(!benches::mock::blob_minted_for(&blob, "acct-b"));

    // Replayed on acct-a: served.
    let r = post_as(
        &c,
        &mock,
        "acct-a",
        &[],
        &replaying(std::slice::from_ref(&reasoning)),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        *read_sse(r).await.types().last().unwrap(),
        "response.completed"
    );
    // On acct-b: refused, with the code ...
    let r = post_as(
        &c,
        &mock,
        "acct-b",
        &[],
        &replaying(std::slice::from_ref(&reasoning)),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_encrypted_content");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("could not be verified"));
    assert!(
        !v["error"]["message"].as_str().unwrap().contains(&blob),
        "never the blob"
    );
    // ... or with code null (the other observed shape).
    let r = post_as(
        &c,
        &mock,
        "acct-b",
        &[("x-mock-blob-error", "null")],
        &replaying(std::slice::from_ref(&reasoning)),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], Value::Null);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("could not be verified"));
    // A made-up blob is refused everywhere.
    let fake = json!({"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABmade-up"});
    let r = post_as(&c, &mock, "acct-a", &[], &replaying(&[fake])).await;
    assert_eq!(r.status(), 400);
    // The log names what each account received.
    let reqs = mock.requests();
    assert_eq!(reqs[2].foreign_blobs(), Vec::<String>::new());
    assert_eq!(reqs[3].foreign_blobs(), vec![blob.clone()]);

    // Remote compaction v2: a request ending in compaction_trigger gets exactly one
    // compaction item, bound like reasoning (and the reasoning control does not add one).
    let body = with(
        replaying(std::slice::from_ref(&reasoning)),
        json!({"input": [reasoning.clone(), {"type": "compaction_trigger"}]}),
    );
    let sse =
        read_sse(post_as(&c, &mock, "acct-a", &[("x-mock-reasoning", "1")], &body).await).await;
    let out = sse.last()["response"]["output"].as_array().unwrap().clone();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["type"], "compaction");
    assert!(out[0]["id"].as_str().unwrap().starts_with("cmp_"));
    let cmp = out[0]["encrypted_content"].as_str().unwrap();
    assert!(benches::mock::blob_minted_for(cmp, "acct-a"));
    let done: Vec<&Value> = sse
        .events
        .iter()
        .filter(|(_, t, _)| t == "response.output_item.done")
        .map(|(_, _, v)| v)
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["item"]["type"], "compaction");
    let r = post_as(&c, &mock, "acct-a", &[], &replaying(&[out[0].clone()])).await;
    assert_eq!(r.status(), 200);
    let r = post_as(&c, &mock, "acct-b", &[], &replaying(&[out[0].clone()])).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_refuses_foreign_blobs_with_error_events() {
    let mock = start(MockConfig::default());
    let c = client();
    let body = with(
        valid_body(),
        json!({"include": ["reasoning.encrypted_content"]}),
    );
    let sse =
        read_sse(post_as(&c, &mock, "acct-1", &[("x-mock-reasoning", "1")], &body).await).await;
    let reasoning = sse.last()["response"]["output"][0].clone();

    let mut ws = ws_connect(&mock, &[("chatgpt-account-id", "acct-2")])
        .await
        .unwrap()
        .0;
    let input = replaying(std::slice::from_ref(&reasoning))["input"].clone();
    ws.send(create(json!({"input": input}))).await.unwrap();
    let ev = ws_event(&mut ws).await;
    assert_eq!(ev["type"], "error");
    assert_eq!(ev["status"], 400);
    assert_eq!(ev["error"]["code"], "invalid_encrypted_content");
    ws.send(create(
        json!({"input": input, "client_metadata": {"x-mock-blob-error": "null"}}),
    ))
    .await
    .unwrap();
    let ev = ws_event(&mut ws).await;
    assert_eq!(ev["status"], 400);
    assert_eq!(ev["error"]["code"], Value::Null);
    assert!(ev["error"]["message"]
        .as_str()
        .unwrap()
        .contains("could not be verified"));
    // The socket lives on; the owner's socket serves the same input.
    let mut own = ws_open(&mock).await;
    own.send(create(json!({"input": input}))).await.unwrap();
    assert_eq!(
        ws_turn(&mut own).await.last().unwrap()["type"],
        "response.completed"
    );
}
