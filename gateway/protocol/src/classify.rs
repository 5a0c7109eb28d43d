//! The one failure classifier: what an upstream error means for the account and the request
//! (docs/protocol.md#classification). HTTP error responses and in-stream `response.failed` / `error`
//! events go through the same rules.
//!
//! # Key Components
//! - [`Failure`]: the class plus the upstream's own message/code, kept for the client.
//! - [`FailureClass`]: account-scoped classes (fail over) vs request errors (return as is).
//! - [`classify_http`] / [`classify_stream_error`]: the two entry points.
//!
//! # Rules, in order
//! 1. The upstream's error `code`, then its `type`, when it is one we know.
//! 2. Only when the upstream gave no `code`: its message, matched from the *start* of the text
//!    against the fixed openings of the few messages that carry a meaning
//!    ("Unsupported parameter:", "The '<model>' model is not supported when using Codex",
//!    "Invalid `previous_response_id`", "Your OpenAI account has been deactivated"). The
//!    upstream echoes client-chosen text (parameter names, model names) after those openings,
//!    so no substring of a message is ever matched: a client cannot make a request look like a
//!    ban, an overload or a quota failure.
//! 3. The HTTP status (401 auth, 429 rate limit, 5xx overload, HTML 403 / empty 404 Cloudflare,
//!    any other 403 a short-lived refusal, never a ban).
//!
//! An account is classed [`FailureClass::Deactivated`] (banned) only on the upstream's own
//! deactivation signals: the `account_deactivated` code, or the deactivation message on a
//! 401/403 (or in-stream) answer without a code.
//!
//! The upstream's `Retry-After` (429/503) travels in the class ([`FailureClass::RateLimited`],
//! [`FailureClass::Overloaded`], [`FailureClass::UsageLimit`] without `resets_at`); what it
//! does to the account is `gateway::policy`'s.
//!
//! The retry *decision* is not made here: the lifecycle asks [`FailureClass::scope`].

use sonic_rs::JsonValueTrait;

/// What an upstream failure means.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureClass {
    /// `usage_limit_reached`: the account is out of quota until `resets_at` (unix seconds).
    UsageLimit {
        /// Reset instant, when the upstream said (`resets_at`, `resets_in_seconds`, else
        /// `Retry-After`).
        resets_at: Option<u64>,
    },
    /// `usage_not_included`: the plan lacks Codex.
    UsageNotIncluded,
    /// `rate_limit_exceeded`: transient; retry after a short backoff.
    RateLimited {
        /// Seconds to wait, when known (`Retry-After`, else `resets_in_seconds`).
        retry_after_s: Option<u64>,
    },
    /// 5xx, `server_is_overloaded`, `slow_down`.
    Overloaded {
        /// Seconds to wait, when the upstream said (`Retry-After`).
        retry_after_s: Option<u64>,
    },
    /// 401 `token_invalidated` / `token_expired` / `token_revoked` or a bare 401.
    AuthExpired,
    /// The account was deactivated/banned (`account_deactivated`, or the deactivation message
    /// without a code).
    Deactivated,
    /// "The 'X' model is not supported when using Codex with a ChatGPT account."
    ModelNotSupported,
    /// Cloudflare HTML 403 or an empty 404: not a credential failure.
    Cloudflare,
    /// Any other 403 that is not a request error: the upstream refused this account for now.
    /// Not a ban and not a credential failure: a short cooldown, then the account is tried
    /// again.
    Forbidden,
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
    /// An overload without a `Retry-After` hint.
    pub const OVERLOADED: Self = Self::Overloaded {
        retry_after_s: None,
    };

    /// The scope of this class.
    pub fn scope(&self) -> FailureScope {
        match self {
            Self::Request | Self::ContinuationNotFound => FailureScope::Request,
            _ => FailureScope::Account,
        }
    }

    /// The HTTP status a client is told when a failure of this class reaches it (no other
    /// account could serve the request), in every dialect: the one table
    /// (docs/protocol.md#what-a-class-does). A request error may keep the upstream's own 4xx
    /// (the gateway's rendering does).
    pub fn client_status(&self) -> u16 {
        match self {
            Self::UsageLimit { .. } | Self::RateLimited { .. } => 429,
            Self::UsageNotIncluded => 403,
            Self::Request | Self::ContinuationNotFound | Self::ModelNotSupported => 400,
            Self::Overloaded { .. } => 503,
            Self::AuthExpired | Self::Deactivated | Self::Cloudflare | Self::Forbidden => 502,
        }
    }

    /// The OpenAI error `type` a client is told for this class when the upstream gave none.
    pub fn openai_type(&self) -> &'static str {
        match self {
            Self::UsageLimit { .. } => "usage_limit_reached",
            Self::RateLimited { .. } => "rate_limit_error",
            Self::UsageNotIncluded => "permission_error",
            Self::Request | Self::ContinuationNotFound | Self::ModelNotSupported => {
                "invalid_request_error"
            }
            Self::Overloaded { .. }
            | Self::AuthExpired
            | Self::Deactivated
            | Self::Cloudflare
            | Self::Forbidden => "server_error",
        }
    }

    /// Stable machine name (metrics, logs, persisted cooldown reasons).
    pub fn name(&self) -> &'static str {
        match self {
            Self::UsageLimit { .. } => "usage_limit_reached",
            Self::UsageNotIncluded => "usage_not_included",
            Self::RateLimited { .. } => "rate_limit_exceeded",
            Self::Overloaded { .. } => "server_is_overloaded",
            Self::AuthExpired => "token_invalidated",
            Self::Deactivated => "account_deactivated",
            Self::ModelNotSupported => "model_not_supported",
            Self::Cloudflare => "upstream_blocked",
            Self::Forbidden => "upstream_forbidden",
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

// === impl Failure ===

impl Failure {
    /// The upstream refused the request's content under its cybersecurity policy (code
    /// `cyber_policy`, docs/protocol.md#error-bodies). The class stays [`FailureClass::Request`]
    /// (the payload, not the account's credentials or quota); the flag is the account's
    /// own, so the gateway's answer is another account for the session, without a penalty
    /// (`gateway::policy::moves_session`).
    pub fn is_cyber_policy(&self) -> bool {
        self.code.as_deref() == Some("cyber_policy")
    }

    /// The upstream could not verify an opaque blob of the request: another account's
    /// reasoning `encrypted_content` or compaction item (docs/protocol.md#account-bound-blobs). Two
    /// shapes occur: code `invalid_encrypted_content`, or no code and a message opening with
    /// "The encrypted content" and saying it "could not be verified" (the blob's ends are
    /// echoed between the two, so only the opening and that fixed phrase are read). The class
    /// stays [`FailureClass::Request`] (another account would refuse the same payload); the
    /// lifecycle's answer is one retry on the same account without the blobs.
    pub fn is_unverifiable_blob(&self) -> bool {
        if self.code.as_deref() == Some("invalid_encrypted_content") {
            return true;
        }
        // `code` falls back to the type when the upstream sent no code.
        let no_code = self.code.is_none() || self.code == self.error_type;
        no_code
            && self.message.as_deref().is_some_and(|m| {
                let m = m.trim_start();
                m.get(..22)
                    .is_some_and(|o| o.eq_ignore_ascii_case("the encrypted content "))
                    && m.to_ascii_lowercase().contains(" could not be verified")
            })
    }
}

fn s(v: Option<&sonic_rs::Value>) -> Option<String> {
    v.and_then(|x| x.as_str()).map(str::to_owned)
}

/// What a known `code` / `type` value means (rule 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    UsageLimit,
    UsageNotIncluded,
    Continuation,
    Deactivated,
    Auth,
    RateLimit,
    Overload,
    Request,
}

fn tag_of(t: &str) -> Option<Tag> {
    Some(match t {
        "usage_limit_reached" => Tag::UsageLimit,
        "usage_not_included" => Tag::UsageNotIncluded,
        "previous_response_not_found" => Tag::Continuation,
        "account_deactivated" => Tag::Deactivated,
        "token_invalidated" | "token_expired" | "token_revoked" => Tag::Auth,
        "rate_limit_exceeded" | "rate_limit_error" => Tag::RateLimit,
        "server_is_overloaded"
        | "slow_down"
        | "server_error"
        | "internal_error"
        | "internal_server_error" => Tag::Overload,
        "context_length_exceeded"
        | "cyber_policy"
        | "invalid_prompt"
        | "invalid_encrypted_content"
        | "unsupported_parameter"
        | "unsupported_value"
        | "invalid_value" => Tag::Request,
        _ => return None,
    })
}

/// The meaning of a message from the upstream that gave no `code` (rule 2). Only the fixed
/// opening of a message is matched (see the module docs).
fn message_tag(message: &str, status: u16) -> Option<MessageTag> {
    let m = message.trim_start().to_ascii_lowercase();
    if m.starts_with("unsupported parameter") {
        Some(MessageTag::Request)
    } else if m.starts_with("invalid `previous_response_id`")
        || m.starts_with("invalid 'previous_response_id'")
    {
        Some(MessageTag::Continuation)
    } else if m.starts_with("the '") && m.contains("' model is not supported when using codex") {
        Some(MessageTag::ModelNotSupported)
    } else if matches!(status, 200 | 401 | 403)
        && DEACTIVATED_OPENINGS.iter().any(|o| m.starts_with(o))
    {
        Some(MessageTag::Deactivated)
    } else {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageTag {
    Request,
    Continuation,
    ModelNotSupported,
    Deactivated,
}

/// How the upstream's deactivation message begins (lowercase).
const DEACTIVATED_OPENINGS: &[&str] = &[
    "your openai account has been deactivated",
    "your account has been deactivated",
];

/// Parses a `Retry-After` value: delta-seconds or an HTTP date (IMF-fixdate), in seconds
/// from now.
pub fn parse_retry_after(value: &str, now_s: u64) -> Option<u64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(secs);
    }
    http_date(v).map(|at| at.saturating_sub(now_s))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` -> unix seconds.
fn http_date(v: &str) -> Option<u64> {
    let rest = v.split_once(", ")?.1;
    let mut it = rest.split(' ');
    let day: u64 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':');
    let (h, mi, sec): (u64, u64, u64) = (
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
    );
    if it.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400)
        .ok()
        .map(|d| d + h * 3600 + mi * 60 + sec)
}

/// Classifies an HTTP error response (status >= 400) from the Codex backend. `retry_after`
/// is the response's `Retry-After` header, when it sent one.
pub fn classify_http(
    status: u16,
    content_type: Option<&str>,
    retry_after: Option<&str>,
    body: &[u8],
) -> Failure {
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
    let now = now_s();
    let retry_after_s = retry_after.and_then(|v| parse_retry_after(v, now));
    let is_html = content_type.is_some_and(|c| c.contains("text/html"))
        || body.trim_ascii_start().starts_with(b"<");

    // Rule 1: the code, then the type.
    let tag = code
        .as_deref()
        .and_then(tag_of)
        .or_else(|| error_type.as_deref().and_then(tag_of));
    let class = match tag {
        Some(Tag::UsageLimit) => FailureClass::UsageLimit {
            resets_at: resets_at
                .or_else(|| resets_in.map(|r| now + r))
                .or_else(|| retry_after_s.map(|r| now + r)),
        },
        Some(Tag::UsageNotIncluded) => FailureClass::UsageNotIncluded,
        Some(Tag::Continuation) => FailureClass::ContinuationNotFound,
        Some(Tag::Deactivated) => FailureClass::Deactivated,
        Some(Tag::Auth) => FailureClass::AuthExpired,
        Some(Tag::RateLimit) => FailureClass::RateLimited {
            retry_after_s: retry_after_s.or(resets_in),
        },
        Some(Tag::Overload) => FailureClass::Overloaded { retry_after_s },
        Some(Tag::Request) => FailureClass::Request,
        None => {
            // Rule 2: the message, only when there is no code at all.
            let by_message = match (&code, &message) {
                (None, Some(m)) if !is_html => message_tag(m, status),
                _ => None,
            };
            match by_message {
                Some(MessageTag::Request) => FailureClass::Request,
                Some(MessageTag::Continuation) => FailureClass::ContinuationNotFound,
                Some(MessageTag::ModelNotSupported) => FailureClass::ModelNotSupported,
                Some(MessageTag::Deactivated) => FailureClass::Deactivated,
                // Rule 3: the status.
                None => by_status(
                    status,
                    is_html,
                    body,
                    code.is_none() && error_type.is_none(),
                    error_type.as_deref(),
                    retry_after_s.or(resets_in),
                    retry_after_s,
                ),
            }
        }
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

fn by_status(
    status: u16,
    is_html: bool,
    body: &[u8],
    untagged: bool,
    error_type: Option<&str>,
    rate_limit_wait: Option<u64>,
    retry_after_s: Option<u64>,
) -> FailureClass {
    match status {
        401 if !is_html => FailureClass::AuthExpired,
        429 => FailureClass::RateLimited {
            retry_after_s: rate_limit_wait,
        },
        s if s >= 500 => FailureClass::Overloaded { retry_after_s },
        403 if is_html => FailureClass::Cloudflare,
        404 if body.trim_ascii().is_empty() => FailureClass::Cloudflare,
        // A 403 the upstream files as a request error (e.g. an unsupported region: every
        // account would get it) goes back to the client; any other 403 refuses this account
        // for a while. Neither is a ban.
        403 if error_type == Some("invalid_request_error") => FailureClass::Request,
        403 => FailureClass::Forbidden,
        // In-stream (no status): a failure without any code is the server's fault.
        200 if untagged => FailureClass::OVERLOADED,
        _ => FailureClass::Request,
    }
}

/// Classifies the `error` object of an in-stream `response.failed` / `error` event (as
/// extracted by [`crate::events::stream_error`]).
pub fn classify_stream_error(error_json: &[u8]) -> Failure {
    let v: Option<sonic_rs::Value> = sonic_rs::from_slice(error_json).ok();
    let message = s(v.as_ref().and_then(|e| e.get("message")));
    // The HTTP rules with a synthetic body; status 200 means "no status information".
    let mut f = classify_http(
        200,
        Some("application/json"),
        None,
        format!(
            "{{\"error\":{}}}",
            std::str::from_utf8(error_json).unwrap_or("{}")
        )
        .as_bytes(),
    );
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
        classify_http(status, Some("application/json"), None, body.as_bytes()).class
    }

    /// The deactivation message the upstream sends (docs/protocol.md#error-bodies).
    const DEACTIVATED_MSG: &str = "Your OpenAI account has been deactivated, please check your \
        email for more information. If you feel this is an error, contact us through our help \
        center at help.openai.com.";

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
            FailureClass::OVERLOADED
        );
        assert_eq!(c(500, "oops"), FailureClass::OVERLOADED);
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
            classify_http(403, Some("text/html"), None, b"<html>cf</html>").class,
            FailureClass::Cloudflare
        );
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","code":"previous_response_not_found"}}"#
            ),
            FailureClass::ContinuationNotFound
        );
        assert_eq!(
            c(400, r#"{"detail":"Invalid `previous_response_id`."}"#),
            FailureClass::ContinuationNotFound
        );
    }

    // One test per 403 shape (docs/protocol.md#error-bodies: "Account deactivated 401/403 containing
    // 'account has been deactivated' / account_deactivated"; "Cloudflare: HTML 403"), plus the
    // 403s the table does not list, which must never ban.

    #[test]
    fn forbidden_account_deactivated_code_is_a_ban() {
        let body = format!(
            r#"{{"error":{{"message":"{DEACTIVATED_MSG}","type":"invalid_request_error","code":"account_deactivated"}},"status":403}}"#
        );
        assert_eq!(c(403, &body), FailureClass::Deactivated);
        // the code alone is enough
        assert_eq!(
            c(403, r#"{"error":{"code":"account_deactivated"}}"#),
            FailureClass::Deactivated
        );
    }

    #[test]
    fn forbidden_deactivation_message_without_code_is_a_ban() {
        assert_eq!(
            c(
                403,
                &format!(r#"{{"error":{{"message":"{DEACTIVATED_MSG}"}}}}"#)
            ),
            FailureClass::Deactivated
        );
        assert_eq!(
            c(403, &format!(r#"{{"detail":"{DEACTIVATED_MSG}"}}"#)),
            FailureClass::Deactivated
        );
    }

    #[test]
    fn forbidden_cloudflare_html_is_a_block_not_a_ban() {
        assert_eq!(
            classify_http(
                403,
                Some("text/html; charset=UTF-8"),
                None,
                b"<!DOCTYPE html><html><head><title>Just a moment...</title></head></html>"
            )
            .class,
            FailureClass::Cloudflare
        );
        // HTML without a content type, and even one that mentions deactivation
        assert_eq!(
            classify_http(
                403,
                None,
                None,
                b"<html>Your account has been deactivated</html>"
            )
            .class,
            FailureClass::Cloudflare
        );
    }

    #[test]
    fn other_json_403s_never_ban() {
        for body in [
            r#"{"error":{"message":"Forbidden"}}"#,
            r#"{"detail":"Forbidden"}"#,
            r#"{"error":{"code":"some_new_code","message":"You do not have access."}}"#,
            r#"{"error":{"type":"permission_error","message":"Not allowed."}}"#,
            "",
            "{}",
        ] {
            assert_eq!(c(403, body), FailureClass::Forbidden, "{body}");
        }
        // an unsupported-region refusal is a request error (any account gets it)
        assert_eq!(
            c(
                403,
                r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","param":null,"type":"request_forbidden"}}"#
            ),
            FailureClass::Forbidden
        );
        assert_eq!(
            c(
                403,
                r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","type":"invalid_request_error"}}"#
            ),
            FailureClass::Request
        );
        // a code wins over a message that reads like a ban
        assert_eq!(
            c(
                403,
                &format!(r#"{{"error":{{"code":"some_new_code","message":"{DEACTIVATED_MSG}"}}}}"#)
            ),
            FailureClass::Forbidden
        );
        assert_eq!(FailureClass::Forbidden.scope(), FailureScope::Account);
    }

    #[test]
    fn client_text_echoed_by_the_upstream_never_classifies() {
        // "Unsupported parameter: X" with X chosen by the client, on every status the
        // upstream might use
        for status in [400, 401, 403, 404, 429] {
            for param in [
                "account has been deactivated",
                "Your OpenAI account has been deactivated",
                "usage_limit_reached",
                "The 'x' model is not supported when using Codex",
                "Invalid `previous_response_id`",
            ] {
                let body = format!(r#"{{"detail":"Unsupported parameter: {param}"}}"#);
                let class = c(status, &body);
                assert_eq!(class, FailureClass::Request, "{status} {body}");
            }
        }
        // in the middle of any other message: not a ban
        assert_eq!(
            c(
                400,
                r#"{"detail":"Invalid value for 'input': your account has been deactivated"}"#
            ),
            FailureClass::Request
        );
        assert_eq!(
            c(
                403,
                r#"{"detail":"Invalid value: your account has been deactivated"}"#
            ),
            FailureClass::Forbidden
        );
        // a 400 never bans, even with the deactivation message
        assert_eq!(
            c(400, &format!(r#"{{"detail":"{DEACTIVATED_MSG}"}}"#)),
            FailureClass::Request
        );
    }

    #[test]
    fn retry_after_travels_in_the_class() {
        let ra = |status: u16, h: &str, body: &str| {
            classify_http(status, Some("application/json"), Some(h), body.as_bytes()).class
        };
        assert_eq!(
            ra(
                429,
                "42",
                r#"{"error":{"type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}"#
            ),
            FailureClass::RateLimited {
                retry_after_s: Some(42)
            }
        );
        assert_eq!(
            ra(429, "7", r#"{"detail":"Too many requests"}"#),
            FailureClass::RateLimited {
                retry_after_s: Some(7)
            }
        );
        assert_eq!(
            ra(503, "120", r#"{"error":{"code":"server_is_overloaded"}}"#),
            FailureClass::Overloaded {
                retry_after_s: Some(120)
            }
        );
        assert_eq!(
            ra(503, "30", "upstream connect error"),
            FailureClass::Overloaded {
                retry_after_s: Some(30)
            }
        );
        // resets_at stays authoritative; Retry-After fills in when it is missing
        assert_eq!(
            ra(
                429,
                "60",
                r#"{"error":{"type":"usage_limit_reached","resets_at":1700000000}}"#
            ),
            FailureClass::UsageLimit {
                resets_at: Some(1_700_000_000)
            }
        );
        match ra(429, "600", r#"{"error":{"type":"usage_limit_reached"}}"#) {
            FailureClass::UsageLimit { resets_at: Some(r) } => {
                let now = now_s();
                assert!(r >= now + 599 && r <= now + 601, "{r} vs {now}");
            }
            other => panic!("{other:?}"),
        }
        // garbage is ignored
        assert_eq!(
            ra(503, "soon", r#"{"error":{"code":"server_is_overloaded"}}"#),
            FailureClass::OVERLOADED
        );
    }

    #[test]
    fn retry_after_http_dates() {
        // 784111777 = Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example)
        assert_eq!(
            http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date("Tue, 29 Feb 2028 12:00:00 GMT"),
            Some(1_835_438_400)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", 784_111_777),
            Some(60)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_800),
            Some(0)
        );
        assert_eq!(parse_retry_after(" 15 ", 0), Some(15));
        assert_eq!(parse_retry_after("-1", 0), None);
        assert_eq!(parse_retry_after("Sun, 06 Foo 1994 08:49:37 GMT", 0), None);
    }

    #[test]
    fn stream_errors() {
        assert_eq!(
            classify_stream_error(br#"{"code":"server_is_overloaded","message":"busy"}"#).class,
            FailureClass::OVERLOADED
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
            FailureClass::OVERLOADED
        );
        assert_eq!(
            classify_stream_error(br#"{"type":"server_error","message":"?"}"#).class,
            FailureClass::OVERLOADED
        );
        assert_eq!(
            classify_stream_error(br#"{"code":"context_length_exceeded","message":"too long"}"#)
                .message
                .as_deref(),
            Some("too long")
        );
        assert!(matches!(
            classify_stream_error(br#"{"code":"rate_limit_exceeded","message":"slow down"}"#).class,
            FailureClass::RateLimited { .. }
        ));
        // in-stream: the deactivation message without a code bans; echoed text does not
        assert_eq!(
            classify_stream_error(format!(r#"{{"message":"{DEACTIVATED_MSG}"}}"#).as_bytes()).class,
            FailureClass::Deactivated
        );
        assert_eq!(
            classify_stream_error(
                br#"{"type":"invalid_request_error","message":"Unsupported parameter: account has been deactivated"}"#
            )
            .class,
            FailureClass::Request
        );
    }

    #[test]
    fn unverifiable_blobs_in_both_shapes() {
        let msg = "The encrypted content gAAA...xyz= could not be verified. Reason: Encrypted \
                   content could not be decrypted or parsed.";
        let coded = format!(
            r#"{{"error":{{"type":"invalid_request_error","code":"invalid_encrypted_content","message":"{msg}","param":null}}}}"#
        );
        let f = classify_http(400, Some("application/json"), None, coded.as_bytes());
        assert_eq!(f.class, FailureClass::Request);
        assert!(f.is_unverifiable_blob());
        let null = format!(
            r#"{{"error":{{"type":"invalid_request_error","code":null,"message":"{msg}","param":null}}}}"#
        );
        let f = classify_http(400, Some("application/json"), None, null.as_bytes());
        assert_eq!(f.class, FailureClass::Request);
        assert!(f.is_unverifiable_blob());
        // In-stream (the upstream WebSocket's error event), both shapes.
        let ev = format!(r#"{{"type":"invalid_request_error","code":null,"message":"{msg}"}}"#);
        assert!(classify_stream_error(ev.as_bytes()).is_unverifiable_blob());
        let ev =
            r#"{"type":"invalid_request_error","code":"invalid_encrypted_content","message":"x"}"#;
        assert!(classify_stream_error(ev.as_bytes()).is_unverifiable_blob());
        // A plain invalid_request_error is not one, nor is the phrase under another code or
        // in a message that does not open with it.
        for body in [
            r#"{"error":{"type":"invalid_request_error","code":null,"message":"Invalid input"}}"#,
            r#"{"error":{"type":"invalid_request_error","code":"context_length_exceeded","message":"The encrypted content x could not be verified"}}"#,
            r#"{"error":{"type":"invalid_request_error","code":null,"message":"Tool said: The encrypted content x could not be verified"}}"#,
            r#"{"detail":"Unsupported parameter: temperature"}"#,
        ] {
            let f = classify_http(400, Some("application/json"), None, body.as_bytes());
            assert!(!f.is_unverifiable_blob(), "{body}");
        }
    }

    #[test]
    fn cyber_policy_is_told_apart_from_other_request_errors() {
        let body = r#"{"error":{"message":"This request has been flagged for possible cybersecurity risk.","type":"invalid_request_error","code":"cyber_policy"}}"#;
        let f = classify_http(400, Some("application/json"), None, body.as_bytes());
        assert_eq!(f.class, FailureClass::Request);
        assert!(f.is_cyber_policy());
        let s = classify_stream_error(br#"{"code":"cyber_policy","message":"flagged"}"#);
        assert!(s.is_cyber_policy());
        // A client-chosen message naming the code is not the code.
        for other in [
            r#"{"error":{"code":"context_length_exceeded"}}"#,
            r#"{"error":{"message":"cyber_policy"}}"#,
            r#"{"detail":"cyber_policy"}"#,
        ] {
            let f = classify_http(400, Some("application/json"), None, other.as_bytes());
            assert!(!f.is_cyber_policy(), "{other}");
        }
    }
}
