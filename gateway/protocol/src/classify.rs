//! The one failure classifier: what an upstream error means for the account and the request
//! (codex-protocol.md §2.6). HTTP error responses and in-stream `response.failed` / `error`
//! events go through the same rules.
//!
//! # Key Components
//! - [`Failure`]: the class plus the upstream's own message/code, kept for the client.
//! - [`FailureClass`]: account-scoped classes (fail over) vs request errors (return as is).
//! - [`classify_http`] / [`classify_stream_error`]: the two entry points.
//!
//! The retry *decision* is not made here: the lifecycle asks [`FailureClass::scope`].

use sonic_rs::JsonValueTrait;

/// What an upstream failure means.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureClass {
    /// `usage_limit_reached`: the account is out of quota until `resets_at` (unix seconds).
    UsageLimit {
        /// Reset instant, when the upstream said.
        resets_at: Option<u64>,
    },
    /// `usage_not_included`: the plan lacks Codex.
    UsageNotIncluded,
    /// `rate_limit_exceeded`: transient; retry after a short backoff.
    RateLimited {
        /// Seconds to wait, when known.
        retry_after_s: Option<u64>,
    },
    /// 5xx, `server_is_overloaded`, `slow_down`.
    Overloaded,
    /// 401 `token_invalidated` / `token_expired` / `token_revoked` or a bare 401.
    AuthExpired,
    /// The account was deactivated/banned.
    Deactivated,
    /// "The 'X' model is not supported when using Codex with a ChatGPT account."
    ModelNotSupported,
    /// Cloudflare HTML 403 or an empty 404: not a credential failure.
    Cloudflare,
    /// `previous_response_not_found` / invalid `previous_response_id`.
    ContinuationNotFound,
    /// The request itself is wrong (unsupported parameter, context length, policy): no failover.
    Request,
}

/// Whether a failure concerns the account (try another) or the request (return it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// Another account may succeed.
    Account,
    /// Any account would fail the same way.
    Request,
}

// === impl FailureClass ===

impl FailureClass {
    /// The scope of this class.
    pub fn scope(&self) -> FailureScope {
        match self {
            Self::Request | Self::ContinuationNotFound => FailureScope::Request,
            _ => FailureScope::Account,
        }
    }

    /// Stable machine name (metrics, logs, persisted cooldown reasons).
    pub fn name(&self) -> &'static str {
        match self {
            Self::UsageLimit { .. } => "usage_limit_reached",
            Self::UsageNotIncluded => "usage_not_included",
            Self::RateLimited { .. } => "rate_limit_exceeded",
            Self::Overloaded => "server_is_overloaded",
            Self::AuthExpired => "token_invalidated",
            Self::Deactivated => "account_deactivated",
            Self::ModelNotSupported => "model_not_supported",
            Self::Cloudflare => "upstream_blocked",
            Self::ContinuationNotFound => "previous_response_not_found",
            Self::Request => "invalid_request",
        }
    }
}

/// A classified upstream failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The class.
    pub class: FailureClass,
    /// The upstream HTTP status (200 for in-stream failures).
    pub status: u16,
    /// The upstream's message, when it gave one.
    pub message: Option<String>,
    /// The upstream's `code` (or `type` when there is no code).
    pub code: Option<String>,
    /// The upstream's `type`.
    pub error_type: Option<String>,
    /// The upstream's `param`.
    pub param: Option<String>,
}

fn s(v: Option<&sonic_rs::Value>) -> Option<String> {
    v.and_then(|x| x.as_str()).map(str::to_owned)
}

fn lower_contains(h: &str, needle: &str) -> bool {
    h.to_ascii_lowercase().contains(needle)
}

/// Classifies an HTTP error response (status >= 400) from the Codex backend.
pub fn classify_http(status: u16, content_type: Option<&str>, body: &[u8]) -> Failure {
    let parsed: Option<sonic_rs::Value> = sonic_rs::from_slice(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    // `error` may be an object or a bare string (OAuth style).
    let (mut message, code, error_type, param) = match err {
        Some(e) if e.is_object() => (
            s(e.get("message")),
            s(e.get("code")),
            s(e.get("type")),
            s(e.get("param")),
        ),
        Some(e) => (s(Some(e)), None, None, None),
        None => (None, None, None, None),
    };
    if message.is_none() {
        message = s(parsed.as_ref().and_then(|v| v.get("detail")))
            .or_else(|| parsed.as_ref().and_then(|v| s(v.get("message"))));
    }
    let resets_at = err
        .and_then(|e| e.get("resets_at"))
        .and_then(|x| x.as_u64());
    let resets_in = err
        .and_then(|e| e.get("resets_in_seconds"))
        .and_then(|x| x.as_u64());
    let is_html = content_type.is_some_and(|c| c.contains("text/html"))
        || body.trim_ascii_start().starts_with(b"<");
    let tag = |t: &str| code.as_deref() == Some(t) || error_type.as_deref() == Some(t);
    let msg = message.clone().unwrap_or_default();

    let class = if tag("usage_limit_reached") {
        FailureClass::UsageLimit {
            resets_at: resets_at.or_else(|| resets_in.map(|r| now_s() + r)),
        }
    } else if tag("usage_not_included") {
        FailureClass::UsageNotIncluded
    } else if tag("previous_response_not_found")
        || lower_contains(&msg, "invalid `previous_response_id`")
    {
        FailureClass::ContinuationNotFound
    } else if tag("account_deactivated") || lower_contains(&msg, "account has been deactivated") {
        FailureClass::Deactivated
    } else if tag("token_invalidated")
        || tag("token_expired")
        || tag("token_revoked")
        || (status == 401 && !is_html)
    {
        FailureClass::AuthExpired
    } else if lower_contains(&msg, "model is not supported when using codex") {
        FailureClass::ModelNotSupported
    } else if tag("rate_limit_exceeded") || tag("rate_limit_error") || status == 429 {
        FailureClass::RateLimited {
            retry_after_s: resets_in,
        }
    } else if tag("server_is_overloaded")
        || tag("slow_down")
        || tag("server_error")
        || tag("internal_error")
        || tag("internal_server_error")
        || status >= 500
    {
        FailureClass::Overloaded
    } else if (status == 403 && is_html) || (status == 404 && body.trim_ascii().is_empty()) {
        FailureClass::Cloudflare
    } else if status == 403 {
        FailureClass::Deactivated
    } else {
        FailureClass::Request
    };
    Failure {
        class,
        status,
        message: if is_html { None } else { message },
        code: code.or_else(|| error_type.clone()),
        error_type,
        param,
    }
}

/// Classifies the `error` object of an in-stream `response.failed` / `error` event.
pub fn classify_stream_error(error_json: &[u8]) -> Failure {
    let v: Option<sonic_rs::Value> = sonic_rs::from_slice(error_json).ok();
    let code = s(v.as_ref().and_then(|e| e.get("code")));
    let ty = s(v.as_ref().and_then(|e| e.get("type")));
    let message = s(v.as_ref().and_then(|e| e.get("message")));
    // Reuse the HTTP rules with a synthetic body; status 200 means "no status information".
    let mut f = classify_http(
        200,
        Some("application/json"),
        format!(
            "{{\"error\":{}}}",
            std::str::from_utf8(error_json).unwrap_or("{}")
        )
        .as_bytes(),
    );
    if f.class == FailureClass::Request && code.is_none() && ty.is_none() {
        // An in-stream failure without any code is the server's fault.
        f.class = FailureClass::Overloaded;
    }
    if matches!(ty.as_deref(), Some("server_error")) && f.class == FailureClass::Request {
        f.class = FailureClass::Overloaded;
    }
    f.message = message.or(f.message);
    f
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(status: u16, body: &str) -> FailureClass {
        classify_http(status, Some("application/json"), body.as_bytes()).class
    }

    #[test]
    fn table() {
        assert_eq!(
            c(
                429,
                r#"{"error":{"type":"usage_limit_reached","resets_at":1700000000,"resets_in_seconds":5}}"#
            ),
            FailureClass::UsageLimit {
                resets_at: Some(1_700_000_000)
            }
        );
        assert_eq!(
            c(429, r#"{"error":{"type":"usage_not_included"}}"#),
            FailureClass::UsageNotIncluded
        );
        assert!(matches!(
            c(429, r#"{"error":{"type":"rate_limit_exceeded"}}"#),
            FailureClass::RateLimited { .. }
        ));
        assert_eq!(
            c(503, r#"{"error":{"code":"server_is_overloaded"}}"#),
            FailureClass::Overloaded
        );
        assert_eq!(c(500, "oops"), FailureClass::Overloaded);
        assert_eq!(
            c(
                401,
                r#"{"error":{"code":"token_invalidated","type":"invalid_request_error"},"status":401}"#
            ),
            FailureClass::AuthExpired
        );
        assert_eq!(
            c(
                401,
                r#"{"error":{"message":"Your account has been deactivated"}}"#
            ),
            FailureClass::Deactivated
        );
        assert_eq!(
            c(
                400,
                r#"{"detail":"The 'gpt-x' model is not supported when using Codex with a ChatGPT account."}"#
            ),
            FailureClass::ModelNotSupported
        );
        assert_eq!(
            c(400, r#"{"detail":"Unsupported parameter: temperature"}"#),
            FailureClass::Request
        );
        assert_eq!(
            c(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
            FailureClass::Request
        );
        assert_eq!(
            c(400, r#"{"error":{"code":"cyber_policy"}}"#),
            FailureClass::Request
        );
        assert_eq!(
            classify_http(403, Some("text/html"), b"<html>cf</html>").class,
            FailureClass::Cloudflare
        );
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","code":"previous_response_not_found"}}"#
            ),
            FailureClass::ContinuationNotFound
        );
    }

    #[test]
    fn stream_errors() {
        assert_eq!(
            classify_stream_error(br#"{"code":"server_is_overloaded","message":"busy"}"#).class,
            FailureClass::Overloaded
        );
        assert!(matches!(
            classify_stream_error(
                br#"{"type":"usage_limit_reached","code":"usage_limit_reached"}"#
            )
            .class,
            FailureClass::UsageLimit { .. }
        ));
        assert_eq!(
            classify_stream_error(br#"{"code":"context_length_exceeded","message":"too long"}"#)
                .class,
            FailureClass::Request
        );
        assert_eq!(
            classify_stream_error(br#"{"message":"?"}"#).class,
            FailureClass::Overloaded
        );
        assert_eq!(
            classify_stream_error(br#"{"code":"context_length_exceeded","message":"too long"}"#)
                .message
                .as_deref(),
            Some("too long")
        );
    }
}
