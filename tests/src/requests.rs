//! Data-plane requests the integration tests repeat.
//!
//! # Key Components
//! - [`Stack::post_responses_x`]: the smallest Responses request (`gpt-5.5`, input `x`).
//! - [`blob_turn`]: one stateless streamed turn with encrypted reasoning, its final response.
//! - [`post_at`]: a JSON `POST` with a key, answering (status, `Retry-After`, JSON body).

use serde_json::{json, Value};

use crate::{client, parse_sse, Stack};

/// `POST {base}{path}` of `body` with `key` through `http`: the status, the `Retry-After`
/// seconds (when the answer names them) and the JSON body (`Null` when it is not JSON).
pub async fn post_at(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    body: &Value,
) -> (u16, Option<u64>, Value) {
    let r = http
        .post(format!("{base}{path}"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("POST");
    let st = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (st, retry, r.json().await.unwrap_or(Value::Null))
}

/// One streamed turn of `input` at `base` with `key`, stateless (`store: false`, encrypted
/// reasoning included, no session id: only the blob ownership can route a continuation):
/// the status and the `response` of its `response.completed` event (`Null` without one).
pub async fn blob_turn(base: &str, key: &str, input: &[Value]) -> (u16, Value) {
    let r = client()
        .post(format!("{base}/v1/responses"))
        .bearer_auth(key)
        .json(&json!({
            "model": "gpt-5.5", "stream": true, "store": false,
            "include": ["reasoning.encrypted_content"], "input": input,
        }))
        .send()
        .await
        .expect("POST /v1/responses");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let done = parse_sse(&text)
        .into_iter()
        .rev()
        .find(|(t, _)| t == "response.completed")
        .map(|(_, d)| serde_json::from_str::<Value>(&d).expect("completed JSON"))
        .unwrap_or(Value::Null);
    (status, done["response"].clone())
}

// === impl Stack ===

impl Stack {
    /// `POST /v1/responses` of the smallest request (`{"model":"gpt-5.5","input":"x"}`, with
    /// `"stream":true` when `stream`) with the stack's key: the response, body unread.
    pub async fn post_responses_x(&self, stream: bool) -> reqwest::Response {
        let body = if stream {
            json!({"model": "gpt-5.5", "input": "x", "stream": true})
        } else {
            json!({"model": "gpt-5.5", "input": "x"})
        };
        self.post("/v1/responses")
            .json(&body)
            .send()
            .await
            .expect("POST /v1/responses")
    }
}
