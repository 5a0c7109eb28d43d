//! Lazy reads of the few fields the gateway needs from Responses events, plus the event
//! taxonomy the commit barrier uses.
//!
//! # Key Components
//! - [`event_type`]: the JSON `type` without building a DOM.
//! - [`EventClass`] / [`classify_event`]: leading (held back before commit), output (commits),
//!   terminal (completed / incomplete / failed / error).
//! - [`Usage`] / [`usage_of_terminal`]: token usage from a terminal event.
//! - [`RateLimits`] / [`rate_limits_event`]: quota from a `codex.rate_limits` event.
//! - [`stream_error`]: the error object of a `response.failed` / `error` event (every shape),
//!   the one extraction every reader of in-stream failures uses.

use sonic_rs::JsonValueTrait;

/// The JSON `type` of an event payload.
///
/// Upstream events put `type` first, so nothing is skipped to find it; any other shape is
/// measured first, since skipping fields recurses through their nesting
/// ([`crate::depth`]).
pub fn event_type(data: &[u8]) -> Option<&str> {
    if !data.starts_with(br#"{"type":"#) && !crate::depth::check(data) {
        return None;
    }
    let v = sonic_rs::get(data, &["type"]).ok()?;
    let raw = v.as_raw_str();
    // fast path: plain string without escapes
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        return None;
    }
    // `raw` points into `data` when the value is a plain string: re-slice the same bytes so the
    // result borrows `data`, and verify that instead of assuming it.
    let base = data.as_ptr() as usize;
    let start = (inner.as_ptr() as usize).checked_sub(base)?;
    let bytes = data.get(start..start + inner.len())?;
    (bytes == inner.as_bytes()).then(|| std::str::from_utf8(bytes).ok())?
}

/// Where an event stands relative to the commit barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventClass {
    /// Held back until commit (created, in_progress, queued, rate limits, metadata).
    Leading,
    /// Real output: the first one commits the attempt.
    Output,
    /// `response.completed` / `response.done`.
    Completed,
    /// `response.incomplete`.
    Incomplete,
    /// `response.failed` or `error`.
    Failed,
}

/// Classifies an event by type.
pub fn classify_event(ty: &str) -> EventClass {
    match ty {
        "response.created"
        | "response.in_progress"
        | "response.queued"
        | "codex.rate_limits"
        | "response.metadata"
        | "codex.response.metadata" => EventClass::Leading,
        "response.completed" | "response.done" => EventClass::Completed,
        "response.incomplete" => EventClass::Incomplete,
        "response.failed" | "error" => EventClass::Failed,
        _ => EventClass::Output,
    }
}

/// Token usage of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// input_tokens
    pub input_tokens: u64,
    /// input_tokens_details.cached_tokens
    pub cached_tokens: u64,
    /// output_tokens
    pub output_tokens: u64,
    /// output_tokens_details.reasoning_tokens
    pub reasoning_tokens: u64,
    /// total_tokens (or the sum)
    pub total_tokens: u64,
}

/// Reads `response.usage` from a terminal event's data.
pub fn usage_of_terminal(data: &[u8]) -> Option<Usage> {
    // Every reader below recurses through nesting ([`crate::depth`]).
    if !crate::depth::check(data) {
        return None;
    }
    let u = sonic_rs::get(data, &["response", "usage"]).ok()?;
    let v: sonic_rs::Value = sonic_rs::from_str(u.as_raw_str()).ok()?;
    let n = |p: &[&str]| {
        let mut cur = Some(&v);
        for k in p {
            cur = cur.and_then(|c| c.get(k));
        }
        cur.and_then(|c| c.as_u64()).unwrap_or(0)
    };
    let input_tokens = n(&["input_tokens"]);
    let output_tokens = n(&["output_tokens"]);
    let total = n(&["total_tokens"]);
    Some(Usage {
        input_tokens,
        cached_tokens: n(&["input_tokens_details", "cached_tokens"]),
        output_tokens,
        reasoning_tokens: n(&["output_tokens_details", "reasoning_tokens"]),
        total_tokens: if total == 0 {
            input_tokens + output_tokens
        } else {
            total
        },
    })
}

/// One quota window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    /// Used percent (0..=100).
    pub used_percent: Option<f64>,
    /// Window length in minutes.
    pub window_minutes: Option<u64>,
    /// Reset instant (unix seconds).
    pub reset_at: Option<u64>,
}

/// Quota read from headers or a `codex.rate_limits` event.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateLimits {
    /// The 5 h window.
    pub primary: Window,
    /// The weekly window.
    pub secondary: Window,
}

impl RateLimits {
    /// True when nothing was found.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Reads the `x-codex-{primary,secondary}-*` headers through a lookup function.
pub fn rate_limits_from_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> RateLimits {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // The names as constants: every upstream response is read through here (no `format!`
    // per name and response).
    let window = |names: &[&str; 4]| {
        let f = |i: usize| get(names[i]).map(str::trim);
        Window {
            used_percent: f(0).and_then(|s| s.parse().ok()),
            window_minutes: f(1).and_then(|s| s.parse().ok()),
            reset_at: f(2)
                .and_then(|s| s.parse().ok())
                .or_else(|| f(3).and_then(|s| s.parse::<u64>().ok()).map(|s| now + s)),
        }
    };
    RateLimits {
        primary: window(&[
            "x-codex-primary-used-percent",
            "x-codex-primary-window-minutes",
            "x-codex-primary-reset-at",
            "x-codex-primary-reset-after-seconds",
        ]),
        secondary: window(&[
            "x-codex-secondary-used-percent",
            "x-codex-secondary-window-minutes",
            "x-codex-secondary-reset-at",
            "x-codex-secondary-reset-after-seconds",
        ]),
    }
}

/// Reads a `codex.rate_limits` event.
pub fn rate_limits_event(data: &[u8]) -> Option<RateLimits> {
    if !crate::depth::check(data) {
        return None;
    }
    let v: sonic_rs::Value = sonic_rs::from_slice(data).ok()?;
    let rl = v.get("rate_limits")?;
    let w = |name: &str| {
        let x = rl.get(name);
        Window {
            used_percent: x
                .and_then(|x| x.get("used_percent"))
                .and_then(|p| p.as_f64()),
            window_minutes: x
                .and_then(|x| x.get("window_minutes"))
                .and_then(|p| p.as_u64()),
            reset_at: x.and_then(|x| x.get("reset_at")).and_then(|p| p.as_u64()),
        }
    };
    Some(RateLimits {
        primary: w("primary"),
        secondary: w("secondary"),
    })
}

/// The error object of a failure event, as raw JSON: the one extraction every reader of
/// in-stream failures uses (the lifecycle's commit barrier, the JSON collector, the chat
/// translators), for [`crate::classify::classify_stream_error`].
///
/// - `response.failed`: `response.error{code,message,type}`;
/// - an `error` event with a nested object: `error{type,code,message,param}` (the WebSocket
///   shape, also seen over SSE);
/// - an `error` event with the fields at top level (`{"type":"error","code":..,"message":..,
///   "param":..}`, the Responses API's own shape): those fields, rebuilt into an object
///   (`type` there is the event's, not the error's, so it is left out).
///
/// `None` when the data is not JSON or carries no error at all.
pub fn stream_error(data: &[u8]) -> Option<String> {
    if !crate::depth::check(data) {
        return None;
    }
    for path in [&["response", "error"][..], &["error"][..]] {
        if let Ok(v) = sonic_rs::get(data, path) {
            if v.is_object() {
                return Some(v.as_raw_str().to_owned());
            }
        }
    }
    let v: sonic_rs::Value = sonic_rs::from_slice(data).ok()?;
    if !v.is_object() {
        return None;
    }
    let mut out = sonic_rs::Object::new();
    for k in ["code", "message", "param"] {
        if let Some(x) = v.get(k).filter(|x| x.is_str()) {
            out.insert(&k, x.clone());
        }
    }
    if out.is_empty() {
        return None;
    }
    sonic_rs::to_string(&out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_type_lazily() {
        assert_eq!(
            event_type(br#"{"type":"response.output_text.delta","delta":"x"}"#),
            Some("response.output_text.delta")
        );
        assert_eq!(event_type(b"not json"), None);
        assert_eq!(classify_event("response.created"), EventClass::Leading);
        assert_eq!(
            classify_event("response.output_item.added"),
            EventClass::Output
        );
        assert_eq!(classify_event("response.failed"), EventClass::Failed);
    }

    #[test]
    fn usage_and_limits() {
        let u = usage_of_terminal(br#"{"type":"response.completed","response":{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":15}}}"#).unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.cached_tokens,
                u.output_tokens,
                u.reasoning_tokens,
                u.total_tokens
            ),
            (10, 4, 5, 2, 15)
        );
        let h = [
            ("x-codex-primary-used-percent", "42.5"),
            ("x-codex-primary-reset-at", "1700000000"),
            ("x-codex-secondary-used-percent", "7"),
        ];
        let rl = rate_limits_from_headers(|k| h.iter().find(|(n, _)| *n == k).map(|(_, v)| *v));
        assert_eq!(rl.primary.used_percent, Some(42.5));
        assert_eq!(rl.primary.reset_at, Some(1_700_000_000));
        assert_eq!(rl.secondary.used_percent, Some(7.0));
        let ev = rate_limits_event(br#"{"type":"codex.rate_limits","rate_limits":{"primary":{"used_percent":12.0,"window_minutes":300,"reset_at":5},"secondary":{"used_percent":1.5}}}"#).unwrap();
        assert_eq!(ev.primary.window_minutes, Some(300));
        assert_eq!(ev.secondary.used_percent, Some(1.5));
    }

    #[test]
    fn stream_error_reads_every_failure_shape() {
        use crate::classify::{classify_stream_error, FailureClass};
        let class = |data: &[u8]| {
            let raw = stream_error(data).expect("an error object");
            classify_stream_error(raw.as_bytes()).class
        };
        // response.failed
        assert!(matches!(
            class(br#"{"type":"response.failed","response":{"id":"r","error":{"code":"rate_limit_exceeded","message":"slow down"}}}"#),
            FailureClass::RateLimited { .. }
        ));
        // error event, nested (WebSocket shape)
        assert!(matches!(
            class(br#"{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"The usage limit has been reached"}}"#),
            FailureClass::UsageLimit { .. }
        ));
        // error event, top-level fields (Responses API shape)
        let data = br#"{"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached. Please try again in 2s.","param":null,"sequence_number":3}"#;
        assert!(matches!(class(data), FailureClass::RateLimited { .. }));
        let f = classify_stream_error(stream_error(data).unwrap().as_bytes());
        assert_eq!(f.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(
            f.message.as_deref(),
            Some("Rate limit reached. Please try again in 2s.")
        );
        assert_eq!(
            class(br#"{"type":"error","code":"context_length_exceeded","message":"too long"}"#),
            FailureClass::Request
        );
        // nothing to extract
        assert_eq!(stream_error(br#"{"type":"error"}"#), None);
        assert_eq!(stream_error(b"not json"), None);
        assert_eq!(
            stream_error(br#"{"type":"response.failed","response":{}}"#),
            None
        );
    }
}
