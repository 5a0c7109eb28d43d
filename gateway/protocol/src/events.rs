//! Lazy reads of the few fields the gateway needs from Responses events, plus the event
//! taxonomy the commit barrier uses.
//!
//! # Key Components
//! - [`event_type`]: the JSON `type` without building a DOM; [`known_type`]: a name as one
//!   of the gateway's own `&'static str`s (what `SseEvent` keeps, once per event).
//! - [`EventClass`] / [`classify_event`]: leading (held back before commit), output (commits),
//!   terminal (completed / incomplete / failed / error).
//! - [`Usage`] / [`usage_of_terminal`]: token usage from a terminal event; [`response_id`]:
//!   the response's id (both in one flat pass over the event where it can vouch for its
//!   answer, `flat`).
//! - [`RateLimits`] / [`rate_limits_event`]: quota from a `codex.rate_limits` event.
//! - [`stream_error`]: the error object of a `response.failed` / `error` event (every shape),
//!   the one extraction every reader of in-stream failures uses.

use sonic_rs::JsonValueTrait;

mod flat;

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

/// `name` as one of the event names the gateway knows (every Responses stream event it reads
/// or forwards), if it is one: an event keeps its name as this `&'static str`, so reading it
/// again is free. By length first (at most five names share one), the most frequent first.
pub fn known_type(name: &[u8]) -> Option<&'static str> {
    let candidates: &[&'static str] = match name.len() {
        5 => &["error"],
        13 => &["response.done"],
        15 => &["response.queued", "response.failed"],
        16 => &["response.created"],
        17 => &["codex.rate_limits", "response.metadata"],
        18 => &["response.completed"],
        19 => &["response.incomplete"],
        20 => &["response.in_progress"],
        21 => &["response.refusal.done"],
        22 => &["response.refusal.delta"],
        23 => &["codex.response.metadata"],
        25 => &["response.output_item.done", "response.output_text.done"],
        26 => &[
            "response.output_text.delta",
            "response.output_item.added",
            "response.content_part.done",
        ],
        27 => &["response.content_part.added"],
        28 => &["response.reasoning_text.done"],
        29 => &["response.reasoning_text.delta"],
        36 => &[
            "response.reasoning_summary_part.done",
            "response.reasoning_summary_text.done",
            "response.custom_tool_call_input.done",
        ],
        37 => &[
            "response.reasoning_summary_text.delta",
            "response.custom_tool_call_input.delta",
            "response.reasoning_summary_part.added",
            "response.function_call_arguments.done",
            "response.output_text.annotation.added",
        ],
        38 => &["response.function_call_arguments.delta"],
        _ => return None,
    };
    candidates.iter().copied().find(|k| k.as_bytes() == name)
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

/// Reads `response.usage` from a terminal event's data: `None` when the event has none (no
/// `response` object, no `usage` in it), is not JSON, or nests past [`crate::depth::MAX_DEPTH`].
/// A counter that is absent or not a non-negative integer reads 0; `total_tokens` 0 (or absent)
/// reads as input plus output.
///
/// One flat pass over the event (`flat`); an event that pass cannot vouch for (malformed
/// JSON, escaped keys, numbers other than plain integers in the usage object) is read by the
/// tree reader it replaced, whose answers it gives everywhere else.
pub fn usage_of_terminal(data: &[u8]) -> Option<Usage> {
    flat::usage(data).unwrap_or_else(|flat::Unsure| usage_by_tree(data))
}

/// The text of `response.id` (`response.created` carries it first), when it is a string:
/// by the flat pass where it can vouch for its answer (`flat`), else by sonic-rs's lazy
/// `get`, whose answers it gives.
pub fn response_id(data: &[u8]) -> Option<String> {
    match flat::response_id(data) {
        Ok(id) => id.map(str::to_owned),
        Err(flat::Unsure) => sonic_rs::get(data, &["response", "id"])
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned)),
    }
}

/// `response.usage` through sonic-rs: the depth check, a validating `get` of the usage value,
/// then a tree of it. The reference [`usage_of_terminal`] answers like, and its fallback.
fn usage_by_tree(data: &[u8]) -> Option<Usage> {
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
        // Wrapping, as release builds always added (a fuzz build checks overflow).
        total_tokens: if total == 0 {
            input_tokens.wrapping_add(output_tokens)
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
    fn known_types_are_found_and_nothing_else() {
        let known = [
            "response.output_text.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_text.delta",
            "response.function_call_arguments.delta",
            "response.custom_tool_call_input.delta",
            "response.refusal.delta",
            "response.output_item.added",
            "response.output_item.done",
            "response.content_part.added",
            "response.content_part.done",
            "response.output_text.done",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_part.done",
            "response.reasoning_summary_text.done",
            "response.reasoning_text.done",
            "response.function_call_arguments.done",
            "response.custom_tool_call_input.done",
            "response.refusal.done",
            "response.output_text.annotation.added",
            "response.created",
            "response.in_progress",
            "response.queued",
            "response.completed",
            "response.done",
            "response.incomplete",
            "response.failed",
            "error",
            "codex.rate_limits",
            "response.metadata",
            "codex.response.metadata",
        ];
        for name in known {
            assert_eq!(known_type(name.as_bytes()), Some(name));
            let mut other = name.as_bytes().to_vec();
            *other.last_mut().unwrap() ^= 0x20;
            assert_eq!(known_type(&other), None, "{name}");
            assert_eq!(known_type(&name.as_bytes()[1..]), None);
        }
        for name in [
            "",
            "message",
            "response.mystery",
            "response.output_text.deltaX",
        ] {
            assert_eq!(known_type(name.as_bytes()), None);
        }
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
