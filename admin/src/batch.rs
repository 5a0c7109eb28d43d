//! Batch test of accounts (issue 27): one minimal Responses request per selected account,
//! straight from the sidecar to the upstream with the account's published token (through its
//! egress proxy, like the quota poller), never through the data plane: no client key is
//! charged, the pool's scheduling, counters and health are untouched. At most `concurrency`
//! requests run at once.
//!
//! # Key Components
//! - [`test_accounts`]: the batch, results in the order asked.
//! - [`TestResult`]: per account `ok`, the HTTP status, the first-byte and total latency and
//!   an error class: the upstream's `error.code` / `error.type` when it sent one, else
//!   `network`, `timeout`, `no_token`, `unknown_account`, `proxy`, `cloudflare`, `http_<status>`
//!   or `stream_incomplete`.
//!
//! # Error handling
//! Every failure is a result, never an error of the batch; messages are the start of the
//! upstream's error body (never a token).

use std::{sync::Arc, time::Duration};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

use crate::services::Pool;

/// Most accounts one batch tests.
pub const MAX_ACCOUNTS: usize = 1000;
/// Most requests in flight at once.
pub const MAX_CONCURRENCY: usize = 32;
/// One account's request, whole stream included.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of an answer read.
const MAX_READ: usize = 1 << 20;

/// One account's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct TestResult {
    /// Account id.
    pub id: i64,
    /// Email or account id (`null`: unknown account).
    pub label: Option<String>,
    /// The request completed (`response.completed`).
    pub ok: bool,
    /// HTTP status of the upstream's answer (`null`: none).
    pub status: Option<u16>,
    /// Time to the answer's head, ms.
    pub ttfb_ms: Option<u64>,
    /// Whole request, ms.
    pub latency_ms: u64,
    /// What failed (see the module docs).
    pub error_class: Option<String>,
    /// The start of the upstream's error, printable.
    pub message: Option<String>,
}

/// The minimal turn sent upstream.
fn body(model: &str) -> Value {
    json!({
        "model": model,
        "instructions": "",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "ping"}]}],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "store": false,
        "stream": true,
        "include": [],
    })
}

/// The upstream's error class in an error body or a failed event's `error`.
fn class_of(err: &Value) -> Option<String> {
    ["code", "type"]
        .iter()
        .filter_map(|k| err.get(*k).and_then(Value::as_str))
        .find(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The class of an HTTP error answer.
fn http_class(status: u16, body: &[u8]) -> String {
    let v = serde_json::from_slice::<Value>(body).ok();
    if let Some(c) = v.as_ref().and_then(|v| v.get("error")).and_then(class_of) {
        return c;
    }
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    if text.contains("deactivated") {
        return "account_deactivated".into();
    }
    if status == 403 && (text.contains("cloudflare") || text.contains("<html")) {
        return "cloudflare".into();
    }
    format!("http_{status}")
}

/// Reads an SSE answer until its terminal event: `Ok(())` on `response.completed`, the
/// failure class and message otherwise.
async fn read_stream(resp: reqwest::Response) -> Result<(), (String, Option<String>)> {
    let mut buf: Vec<u8> = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            let c = if e.is_timeout() { "timeout" } else { "network" };
            (c.to_owned(), Some(crate::oauth::describe_reqwest(&e)))
        })?;
        buf.extend_from_slice(&chunk);
        // Whole events only: each ends with a blank line.
        while let Some(end) = find_event_end(&buf) {
            let event: Vec<u8> = buf.drain(..end).collect();
            let text = String::from_utf8_lossy(&event);
            let data: String = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect::<Vec<_>>()
                .join("\n");
            let Ok(v) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            match v.get("type").and_then(Value::as_str) {
                Some("response.completed") | Some("response.done") => return Ok(()),
                Some("response.failed") | Some("error") | Some("response.incomplete") => {
                    let err = v
                        .pointer("/response/error")
                        .or_else(|| v.get("error"))
                        .cloned()
                        .unwrap_or(Value::Null);
                    let class = class_of(&err).unwrap_or_else(|| "response_failed".into());
                    let msg = err
                        .get("message")
                        .and_then(Value::as_str)
                        .map(|m| crate::quota::snippet(m.as_bytes()));
                    return Err((class, msg));
                }
                _ => {}
            }
        }
        if buf.len() > MAX_READ {
            break;
        }
    }
    Err(("stream_incomplete".into(), None))
}

fn find_event_end(buf: &[u8]) -> Option<usize> {
    let a = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let b = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// Tests one account.
async fn test_one(pool: &Pool, id: i64, model: &str) -> TestResult {
    let started = std::time::Instant::now();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut r = TestResult {
        id,
        label: None,
        ok: false,
        status: None,
        ttfb_ms: None,
        latency_ms: 0,
        error_class: None,
        message: None,
    };
    let account = pool.store.publisher.current().account(id).cloned();
    let Some(account) = account else {
        r.error_class = Some("unknown_account".into());
        return r;
    };
    r.label = Some(account.label.clone());
    if account.access_token.is_empty() {
        r.error_class = Some("no_token".into());
        return r;
    }
    let client = match pool.egress.usage_for(id, &pool.usage) {
        Ok(c) => c,
        Err(why) => {
            r.error_class = Some("proxy".into());
            r.message = Some(why);
            return r;
        }
    };
    let url = format!("{}/responses", pool.upstream_base_url.trim_end_matches('/'));
    let sent = client
        .identity_post(
            &url,
            &account.access_token,
            &account.chatgpt_account_id,
            TEST_TIMEOUT,
        )
        .body(body(model).to_string())
        .send()
        .await;
    let outcome = match sent {
        Err(e) => Err((
            if e.is_timeout() { "timeout" } else { "network" }.to_owned(),
            Some(crate::oauth::describe_reqwest(&e)),
        )),
        Ok(resp) => {
            r.ttfb_ms = Some(ms(started.elapsed()));
            let status = resp.status().as_u16();
            r.status = Some(status);
            if resp.status().is_success() {
                read_stream(resp).await
            } else {
                let body = resp.bytes().await.unwrap_or_default();
                let body = &body[..body.len().min(MAX_READ)];
                Err((http_class(status, body), Some(crate::quota::snippet(body))))
            }
        }
    };
    r.latency_ms = ms(started.elapsed());
    match outcome {
        Ok(()) => r.ok = true,
        Err((class, msg)) => {
            r.error_class = Some(class);
            r.message = msg;
        }
    }
    r
}

/// Tests `ids` with `model`, at most `concurrency` at once; results in the order of `ids`.
pub(crate) async fn test_accounts(
    pool: &Arc<Pool>,
    ids: &[i64],
    model: &str,
    concurrency: usize,
) -> Vec<TestResult> {
    let conc = concurrency.clamp(1, MAX_CONCURRENCY);
    let jobs: Vec<(usize, i64, Arc<Pool>, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (i, *id, Arc::clone(pool), model.to_owned()))
        .collect();
    let mut out: Vec<(usize, TestResult)> = futures_util::stream::iter(jobs)
        .map(|(i, id, pool, model)| async move { (i, test_one(&pool, id, &model).await) })
        .buffer_unordered(conc)
        .collect()
        .await;
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(
            http_class(
                429,
                br#"{"error":{"type":"usage_limit_reached","resets_at":1}}"#
            ),
            "usage_limit_reached"
        );
        assert_eq!(
            http_class(401, br#"{"error":{"code":"token_expired","type":"x"}}"#),
            "token_expired"
        );
        assert_eq!(
            http_class(403, b"<html>Just a moment... cloudflare</html>"),
            "cloudflare"
        );
        assert_eq!(
            http_class(401, br#"{"detail":"Your account has been deactivated"}"#),
            "account_deactivated"
        );
        assert_eq!(http_class(502, b"bad gateway"), "http_502");
        assert_eq!(find_event_end(b"data: x\n\nrest"), Some(9));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }
}
