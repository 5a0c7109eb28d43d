//! The upstream failure as a chat client sees it.
//!
//! # Key Components
//! - [`ChatUpstreamFailure`]: a `response.failed` / `error` event ([`Failure`], its error
//!   object read by [`crate::events::stream_error`]) or an early EOF, classified by
//!   [`crate::classify::classify_stream_error`] and rendered as an OpenAI error body.

use crate::{
    classify::{classify_stream_error, FailureClass},
    openai_error::ErrorBody,
    turn::Failure,
};

/// An upstream failure reported to a chat client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("upstream failure ({status_hint} {error_type}): {message}")]
pub struct ChatUpstreamFailure {
    /// The HTTP status a non-streaming response carries (`FailureClass::client_status`).
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
        // What the client is told is the one table's (`FailureClass::client_status`,
        // `openai_type`), as for every dialect.
        let status_hint = f.class.client_status();
        let error_type = f
            .error_type
            .clone()
            .unwrap_or_else(|| f.class.openai_type().to_owned());
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

    /// The failure of a `response.failed` / `error` event (its error object extracted by
    /// [`crate::events::stream_error`], the one extraction for every shape).
    pub(crate) fn from_event(failure: &Failure<'_>) -> Self {
        Self::from_error_json(failure.error_json().as_deref())
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
        // Nothing to read: a server error, 503 as in every dialect (`client_status`).
        let f = ChatUpstreamFailure::from_error_json(None);
        assert_eq!(
            (f.status_hint, f.error_type.as_str()),
            (503, "server_error")
        );
        assert_eq!(f.status_hint, f.class.client_status());
        // A usage limit without a type is typed by the class.
        let f = ChatUpstreamFailure::from_error_json(Some(
            r#"{"code":"usage_limit_reached","message":"limit"}"#,
        ));
        assert_eq!(
            (f.status_hint, f.error_type.as_str()),
            (429, "usage_limit_reached")
        );
    }
}
