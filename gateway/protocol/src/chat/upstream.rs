//! Borrowed views of the upstream Responses events both response-side translators read, and
//! the failure type they report.
//!
//! # Key Components
//! - [`Kind`] / [`kind_of`]: the event types the chat translation acts on (everything else is
//!   dropped per docs/protocol.md#stream).
//! - [`RawEvent`]: one borrowed serde pass over an event's data; strings without escapes are
//!   not copied, deltas stay raw JSON so they can be copied into chunks as they are.
//! - [`ChatUpstreamFailure`]: a `response.failed` / `error` event (its error object read by
//!   [`crate::events::stream_error`]) or an early EOF, classified by
//!   [`crate::classify::classify_stream_error`].
//!
//! # Error handling
//! [`RawEvent::parse`] returns `None` for malformed data; callers skip such events, except
//! terminal ones, which still terminate with defaults.

use std::borrow::Cow;

use serde::Deserialize;
use sonic_rs::{JsonValueTrait, LazyValue};

use crate::{
    classify::{classify_stream_error, FailureClass},
    events::Usage,
    openai_error::ErrorBody,
};

/// The event types the chat translation acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Created,
    TextDelta,
    RefusalDelta,
    ReasoningSummaryDelta,
    ReasoningTextDelta,
    ItemAdded,
    ItemDone,
    ArgsDelta,
    ArgsDone,
    Completed,
    Incomplete,
    Failed,
    Error,
    Other,
}

// === impl Kind ===

impl Kind {
    /// The hot delta events, read by [`super::scan::scan_delta`] instead of serde.
    pub(crate) fn is_delta(self) -> bool {
        matches!(
            self,
            Self::TextDelta
                | Self::RefusalDelta
                | Self::ReasoningSummaryDelta
                | Self::ReasoningTextDelta
                | Self::ArgsDelta
        )
    }
}

/// Maps an event type to its [`Kind`]; an empty type is read from the data (`data:`-only
/// frames).
pub(crate) fn kind_of(event_type: &str, data: &[u8]) -> Kind {
    let ty = if event_type.is_empty() || event_type == "message" {
        crate::events::event_type(data).unwrap_or(event_type)
    } else {
        event_type
    };
    match ty {
        "response.output_text.delta" => Kind::TextDelta,
        "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
            Kind::ArgsDelta
        }
        "response.reasoning_summary_text.delta" => Kind::ReasoningSummaryDelta,
        "response.reasoning_text.delta" => Kind::ReasoningTextDelta,
        "response.output_item.added" => Kind::ItemAdded,
        "response.output_item.done" => Kind::ItemDone,
        "response.function_call_arguments.done" | "response.custom_tool_call_input.done" => {
            Kind::ArgsDone
        }
        "response.refusal.delta" => Kind::RefusalDelta,
        "response.created" | "response.in_progress" | "response.queued" => Kind::Created,
        "response.completed" | "response.done" => Kind::Completed,
        "response.incomplete" => Kind::Incomplete,
        "response.failed" => Kind::Failed,
        "error" => Kind::Error,
        _ => Kind::Other,
    }
}

/// One upstream event, borrowed from its data (delta events go through
/// [`super::scan::scan_delta`] instead).
#[derive(Deserialize, Default)]
pub(crate) struct RawEvent<'a> {
    #[serde(borrow, default)]
    pub item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub output_index: Option<u64>,
    #[serde(borrow, default)]
    pub item: Option<RawItem<'a>>,
    #[serde(borrow, default)]
    pub response: Option<RawResponse<'a>>,
    /// `function_call_arguments.done`
    #[serde(borrow, default)]
    pub arguments: Option<LazyValue<'a>>,
    /// `custom_tool_call_input.done`
    #[serde(borrow, default)]
    pub input: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
}

/// An output item (`output_item.added/.done`, `response.output[]`).
#[derive(Deserialize, Default)]
pub(crate) struct RawItem<'a> {
    #[serde(borrow, rename = "type", default)]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    pub input: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    pub content: Option<Vec<RawPart<'a>>>,
    #[serde(borrow, default)]
    pub summary: Option<Vec<RawPart<'a>>>,
    /// A reasoning item's `encrypted_content` (Anthropic thinking signatures).
    #[serde(borrow, default)]
    pub encrypted_content: Option<Cow<'a, str>>,
}

/// A content / summary part of an item.
#[derive(Deserialize, Default)]
pub(crate) struct RawPart<'a> {
    #[serde(borrow, rename = "type", default)]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub refusal: Option<Cow<'a, str>>,
}

/// `response` of lifecycle / terminal events.
#[derive(Deserialize, Default)]
pub(crate) struct RawResponse<'a> {
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub created_at: Option<LazyValue<'a>>,
    #[serde(default)]
    pub usage: Option<RawUsage>,
    #[serde(borrow, default)]
    pub incomplete_details: Option<RawIncomplete<'a>>,
    /// Parsed only when needed (it can be large, and may be empty).
    #[serde(borrow, default)]
    pub output: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    pub service_tier: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct RawIncomplete<'a> {
    #[serde(borrow, default)]
    pub reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct RawUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<RawInputDetails>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    output_tokens_details: Option<RawOutputDetails>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct RawInputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct RawOutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

// === impl RawEvent ===

impl<'a> RawEvent<'a> {
    /// Parses an event's data; `None` when it is not a JSON object of the expected shape, or
    /// nests deeper than a recursive reader may go ([`crate::depth`]).
    pub(crate) fn parse(data: &'a [u8]) -> Option<Self> {
        if !crate::depth::check(data) {
            return None;
        }
        sonic_rs::from_slice(data).ok()
    }
}

// === impl RawResponse ===

impl RawResponse<'_> {
    /// `created_at` as unix seconds (integers, or floats truncated).
    pub(crate) fn created_at(&self) -> Option<u64> {
        let v = self.created_at.as_ref()?;
        v.as_u64().or_else(|| v.as_f64().map(|f| f as u64))
    }

    /// The usage, when present.
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().map(RawUsage::to_usage)
    }

    /// The parsed `output` items; empty when absent, empty or malformed.
    pub(crate) fn output_items(&self) -> Vec<RawItem<'_>> {
        match &self.output {
            Some(o) if o.is_array() => sonic_rs::from_str(o.as_raw_str()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

// === impl RawUsage ===

impl RawUsage {
    fn to_usage(&self) -> Usage {
        let input_tokens = self.input_tokens.unwrap_or(0);
        let output_tokens = self.output_tokens.unwrap_or(0);
        Usage {
            input_tokens,
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            output_tokens,
            reasoning_tokens: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            total_tokens: self
                .total_tokens
                .filter(|t| *t > 0)
                .unwrap_or(input_tokens + output_tokens),
        }
    }
}

/// Maps `incomplete_details.reason` to a chat `finish_reason`.
pub(crate) fn incomplete_finish_reason(reason: Option<&str>) -> &'static str {
    match reason {
        Some("content_filter") => "content_filter",
        _ => "length",
    }
}

/// Appends the chat `usage` object for `u`.
pub(crate) fn write_usage(out: &mut Vec<u8>, u: &Usage) {
    use super::json::write_u64;
    out.extend_from_slice(b"{\"prompt_tokens\":");
    write_u64(out, u.input_tokens);
    out.extend_from_slice(b",\"completion_tokens\":");
    write_u64(out, u.output_tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    write_u64(out, u.total_tokens);
    out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
    write_u64(out, u.cached_tokens);
    out.extend_from_slice(b"},\"completion_tokens_details\":{\"reasoning_tokens\":");
    write_u64(out, u.reasoning_tokens);
    out.extend_from_slice(b"}}");
}

/// An upstream failure reported to a chat client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("upstream failure ({status_hint} {error_type}): {message}")]
pub struct ChatUpstreamFailure {
    /// The HTTP status a non-streaming response should carry (400, 429, 502, ...).
    pub status_hint: u16,
    /// Human message (the upstream's when it gave one).
    pub message: String,
    /// OpenAI error `type` (the upstream's when it gave one).
    pub error_type: String,
    /// OpenAI error `code` (the upstream's `code`, else its `type`, else the class name).
    pub code: Option<String>,
    /// The shared classification (account-scoped vs request-scoped, cooldowns).
    pub class: FailureClass,
}

// === impl ChatUpstreamFailure ===

impl ChatUpstreamFailure {
    /// The failure for an upstream EOF before any terminal event.
    pub fn disconnected() -> Self {
        Self {
            status_hint: 502,
            message:
                "stream disconnected before completion: stream closed before response.completed"
                    .to_owned(),
            error_type: "server_error".to_owned(),
            code: Some("stream_disconnected".to_owned()),
            class: FailureClass::OVERLOADED,
        }
    }

    /// Builds the failure from the raw JSON of an upstream error object (`response.error` or
    /// the `error` event's `error`); `None` / garbage gives a generic server error.
    pub fn from_error_json(error_json: Option<&str>) -> Self {
        let raw = error_json.unwrap_or("{}");
        // The one classifier decides (it files `server_error` in-stream failures as overload).
        let f = classify_stream_error(raw.as_bytes());
        let status_hint = match &f.class {
            FailureClass::UsageLimit { .. } | FailureClass::RateLimited { .. } => 429,
            FailureClass::UsageNotIncluded => 403,
            FailureClass::Request
            | FailureClass::ContinuationNotFound
            | FailureClass::ModelNotSupported => 400,
            FailureClass::Overloaded { .. }
            | FailureClass::AuthExpired
            | FailureClass::Deactivated
            | FailureClass::Cloudflare
            | FailureClass::Forbidden => 502,
        };
        let error_type = f.error_type.clone().unwrap_or_else(|| {
            match status_hint {
                400 => "invalid_request_error",
                403 => "permission_error",
                429 => "rate_limit_error",
                _ => "server_error",
            }
            .to_owned()
        });
        let code = f
            .code
            .clone()
            .or_else(|| f.error_type.clone())
            .or_else(|| Some(f.class.name().to_owned()));
        Self {
            status_hint,
            message: f
                .message
                .clone()
                .unwrap_or_else(|| "The upstream response failed.".to_owned()),
            error_type,
            code,
            class: f.class,
        }
    }

    /// The failure of a `response.failed` / `error` event, from its data (the error object is
    /// extracted by [`crate::events::stream_error`], the one extraction for every shape).
    pub(crate) fn from_event(data: &[u8]) -> Self {
        Self::from_error_json(crate::events::stream_error(data).as_deref())
    }

    /// The OpenAI error body (`{"error":{message,type,code,param}}`).
    pub fn to_error_body(&self) -> ErrorBody {
        ErrorBody::new(self.message.clone(), &self.error_type, self.code.as_deref())
    }

    /// `{"error":{...}}` as JSON bytes, for a non-streaming response.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_error_body().to_json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(
            kind_of("response.output_text.delta", b"{}"),
            Kind::TextDelta
        );
        assert_eq!(
            kind_of("", br#"{"type":"response.completed"}"#),
            Kind::Completed
        );
        assert_eq!(kind_of("codex.rate_limits", b"{}"), Kind::Other);
    }

    #[test]
    fn failures_are_classified() {
        let f = ChatUpstreamFailure::from_error_json(Some(
            r#"{"code":"context_length_exceeded","message":"too long"}"#,
        ));
        assert_eq!((f.status_hint, f.message.as_str()), (400, "too long"));
        assert_eq!(f.code.as_deref(), Some("context_length_exceeded"));
        let f = ChatUpstreamFailure::from_error_json(Some(
            r#"{"type":"usage_limit_reached","message":"limit"}"#,
        ));
        assert_eq!(f.status_hint, 429);
        let f = ChatUpstreamFailure::from_error_json(None);
        assert_eq!(
            (f.status_hint, f.error_type.as_str()),
            (502, "server_error")
        );
    }
}
