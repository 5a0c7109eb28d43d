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
