//! The upstream's HTTP error answers (docs/protocol.md#error-bodies) and in-stream failure payloads.
//!
//! # Key Components
//! - [`http_error`]: the response for an [`ErrorKind`] and/or a forced status.
//! - [`stream_error`]: `(message, type)` of a `response.failed` error code.

use http::Response;

use super::{
    reply::{self, Body},
    state::{now_unix, QuotaView},
    ErrorKind,
};

/// What an error body may mention.
pub(crate) struct ErrorContext<'a> {
    pub(crate) model: &'a str,
    pub(crate) param: Option<&'a str>,
    pub(crate) quota: &'a QuotaView,
}

/// The message of a deactivated account (401/403 and refresh).
pub(crate) const DEACTIVATED: &str =
    "Your OpenAI account has been deactivated, please check your email for more \
information. If you feel this is an error, contact us through our help center at help.openai.com.";

const CLOUDFLARE_HTML: &str = "<!DOCTYPE html><html lang=\"en-US\"><head><title>Just a moment...</title>\
<meta http-equiv=\"Content-Type\" content=\"text/html; charset=UTF-8\"></head><body>\
<div class=\"main-wrapper\" role=\"main\"><div class=\"main-content\"><noscript>\
<div class=\"h2\"><span id=\"challenge-error-text\">Enable JavaScript and cookies to continue</span></div>\
</noscript></div></div></body></html>";

/// The error answer of `/responses`. `kind: None` with a status gives a generic body.
pub(crate) fn http_error(
    kind: Option<ErrorKind>,
    status: Option<u16>,
    ctx: &ErrorContext<'_>,
) -> Response<Body> {
    let Some(kind) = kind else {
        let s = status.unwrap_or(500);
        return reply::openai_error(
            s,
            &format!("mock-codex forced status {s}"),
            "mock_error",
            Some("mock_status"),
        );
    };
    let s = status.unwrap_or_else(|| kind.natural_status());
    match kind {
        ErrorKind::UsageLimitReached => {
            let resets_in = 3600;
            let body = serde_json::json!({"error": {
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
                "plan_type": ctx.quota.plan_type,
                "resets_at": now_unix() + resets_in,
                "eligible_promo": null,
                "resets_in_seconds": resets_in,
            }});
            let mut r = reply::json(s, body.to_string());
            reply::set_header(&mut r, "x-codex-primary-used-percent", "100");
            reply::set_header(&mut r, "x-codex-primary-window-minutes", "300");
            reply::set_header(&mut r, "x-codex-primary-reset-at", (now_unix() + resets_in).to_string());
            reply::set_header(&mut r, "x-codex-plan-type", &ctx.quota.plan_type);
            reply::set_header(&mut r, "x-codex-rate-limit-reached-type", "primary");
            r
        }
        ErrorKind::UsageNotIncluded => {
            let body = serde_json::json!({"error": {
                "type": "usage_not_included",
                "message": "Your current plan does not include Codex. Upgrade your plan to use Codex.",
                "plan_type": ctx.quota.plan_type,
            }});
            reply::json(s, body.to_string())
        }
        ErrorKind::RateLimitExceeded => {
            let mut r = reply::openai_error(
                s,
                "Rate limit reached. Please try again in 2s.",
                "rate_limit_exceeded",
                Some("rate_limit_exceeded"),
            );
            reply::set_header(&mut r, "retry-after", "2");
            r
        }
        ErrorKind::ServerIsOverloaded => reply::openai_error(
            s,
            "Our servers are currently overloaded. Please try again later.",
            "service_unavailable_error",
            Some("server_is_overloaded"),
        ),
        ErrorKind::TokenInvalidated => token_invalidated(s),
        ErrorKind::TokenExpired => token_expired(s),
        ErrorKind::AccountDeactivated => reply::auth_error(s, DEACTIVATED, "account_deactivated"),
        ErrorKind::ModelNotSupported => reply::detail(
            s,
            &format!(
                "The '{}' model is not supported when using Codex with a ChatGPT account.",
                ctx.model
            ),
        ),
        ErrorKind::UnsupportedParameter => reply::detail(
            s,
            &format!("Unsupported parameter: {}", ctx.param.unwrap_or("temperature")),
        ),
        ErrorKind::ContextLengthExceeded => reply::openai_error(
            s,
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "invalid_request_error",
            Some("context_length_exceeded"),
        ),
        ErrorKind::CyberPolicy => reply::openai_error(
            s,
            "This request has been flagged for possible cybersecurity risk.",
            "invalid_request_error",
            Some("cyber_policy"),
        ),
        ErrorKind::InvalidEncryptedContent => reply::openai_error(
            s,
            "The encrypted content could not be verified.",
            "invalid_request_error",
            Some("invalid_encrypted_content"),
        ),
        ErrorKind::Cloudflare => {
            let mut r = reply::with_body(s, "text/html; charset=UTF-8", CLOUDFLARE_HTML);
            reply::set_header(&mut r, "server", "cloudflare");
            reply::set_header(&mut r, "cf-mitigated", "challenge");
            reply::set_header(&mut r, "cf-ray", format!("{}-MOCK", super::state::rand_hex(8)));
            r
        }
        ErrorKind::Internal => reply::openai_error(
            s,
            "An error occurred while processing your request. Please try again.",
            "server_error",
            Some("internal_error"),
        ),
    }
}

/// 401 `token_invalidated` (also the answer to a stale bearer under `strict_tokens`).
pub(crate) fn token_invalidated(status: u16) -> Response<Body> {
    reply::auth_error(
        status,
        "Your authentication token has been invalidated. Please try signing in again.",
        "token_invalidated",
    )
}

/// 401 `token_expired`.
pub(crate) fn token_expired(status: u16) -> Response<Body> {
    reply::auth_error(
        status,
        "Provided authentication token is expired. Please try signing in again.",
        "token_expired",
    )
}

/// `(message, type)` carried by `response.failed` for an error code.
pub(crate) fn stream_error(code: &str) -> (&'static str, &'static str) {
    match code {
        "server_is_overloaded" | "slow_down" => (
            "Our servers are currently overloaded. Please try again later.",
            "server_error",
        ),
        "usage_limit_reached" => ("The usage limit has been reached", "usage_limit_reached"),
        "rate_limit_exceeded" => ("Rate limit reached. Please try again in 2s.", "rate_limit_exceeded"),
        "context_length_exceeded" => (
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "invalid_request_error",
        ),
        "cyber_policy" => (
            "This request has been flagged for possible cybersecurity risk.",
            "invalid_request_error",
        ),
        "invalid_prompt" => ("Invalid prompt: your prompt was flagged.", "invalid_request_error"),
        _ => (
            "An error occurred while processing your request. Please try again.",
            "server_error",
        ),
    }
}
