//! The mock's controls: which error to answer with, how to shape or break the stream.
//!
//! # Key Components
//! - [`Behaviour`]: one set of controls. Layers are merged field by field, later wins:
//!   process ([`super::MockConfig`] fields and `default_behaviour`) → account
//!   ([`super::MockHandle::set_behaviour`]) → request (`x-mock-*` headers, then the same keys in
//!   the body's `client_metadata`).
//! - [`ErrorKind`]: the upstream HTTP errors of docs/protocol.md#error-bodies.
//! - [`RefreshError`]: forced failures of the OAuth refresh grant.
//!
//! # Usage
//! Keys are matched case-insensitively, with or without the `x-mock-` prefix, and `_` equals
//! `-`: `x-mock-fail-in-stream`, `fail_in_stream` and `fail-in-stream` are one key. A spec
//! string is `key=value` pairs separated by commas, e.g.
//! `error=usage_limit_reached,fail_times=2` (values cannot contain commas).
//!
//! # Error handling
//! Unknown keys and unparsable values are errors (`Err(String)` naming the key), so a typo in
//! a test shows up as a 400 instead of a silently ignored control.

use std::{fmt, str::FromStr, time::Duration};

/// An upstream HTTP error the mock can answer `/responses` with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 429 `error.type = usage_limit_reached` with `resets_at` / `resets_in_seconds`.
    UsageLimitReached,
    /// 429 `error.type = usage_not_included` (the plan lacks Codex).
    UsageNotIncluded,
    /// 429 `rate_limit_exceeded` with `retry-after`.
    RateLimitExceeded,
    /// 503 `error.code = server_is_overloaded`.
    ServerIsOverloaded,
    /// 401 `error.code = token_invalidated`.
    TokenInvalidated,
    /// 401 `error.code = token_expired`.
    TokenExpired,
    /// 401 (or 403 via status) "account has been deactivated".
    AccountDeactivated,
    /// 400 `detail`: "The 'X' model is not supported when using Codex with a ChatGPT account."
    ModelNotSupported,
    /// 400 `detail`: "Unsupported parameter: X" (X from the `param` control, else
    /// `temperature`).
    UnsupportedParameter,
    /// 400 `error.code = context_length_exceeded`.
    ContextLengthExceeded,
    /// 400 `error.code = cyber_policy`.
    CyberPolicy,
    /// 400 `error.code = invalid_encrypted_content`.
    InvalidEncryptedContent,
    /// 403 Cloudflare challenge HTML page.
    Cloudflare,
    /// 500 server error.
    Internal,
}

impl ErrorKind {
    /// Every kind, in documentation order.
    pub const ALL: [ErrorKind; 14] = [
        Self::UsageLimitReached,
        Self::UsageNotIncluded,
        Self::RateLimitExceeded,
        Self::ServerIsOverloaded,
        Self::TokenInvalidated,
        Self::TokenExpired,
        Self::AccountDeactivated,
        Self::ModelNotSupported,
        Self::UnsupportedParameter,
        Self::ContextLengthExceeded,
        Self::CyberPolicy,
        Self::InvalidEncryptedContent,
        Self::Cloudflare,
        Self::Internal,
    ];

    /// The control value (`usage_limit_reached`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UsageLimitReached => "usage_limit_reached",
            Self::UsageNotIncluded => "usage_not_included",
            Self::RateLimitExceeded => "rate_limit_exceeded",
            Self::ServerIsOverloaded => "server_is_overloaded",
            Self::TokenInvalidated => "token_invalidated",
            Self::TokenExpired => "token_expired",
            Self::AccountDeactivated => "account_deactivated",
            Self::ModelNotSupported => "model_not_supported",
            Self::UnsupportedParameter => "unsupported_parameter",
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::CyberPolicy => "cyber_policy",
            Self::InvalidEncryptedContent => "invalid_encrypted_content",
            Self::Cloudflare => "cloudflare",
            Self::Internal => "internal",
        }
    }

    /// The status the real upstream uses for this error.
    pub fn natural_status(self) -> u16 {
        match self {
            Self::UsageLimitReached | Self::UsageNotIncluded | Self::RateLimitExceeded => 429,
            Self::ServerIsOverloaded => 503,
            Self::TokenInvalidated | Self::TokenExpired | Self::AccountDeactivated => 401,
            Self::ModelNotSupported
            | Self::UnsupportedParameter
            | Self::ContextLengthExceeded
            | Self::CyberPolicy
            | Self::InvalidEncryptedContent => 400,
            Self::Cloudflare => 403,
            Self::Internal => 500,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown error kind {s:?}"))
    }
}

/// A forced failure of `grant_type=refresh_token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefreshError {
    /// 401 `code = refresh_token_expired`.
    Expired,
    /// 401 `code = refresh_token_invalidated`.
    Invalidated,
    /// 401 `code = refresh_token_reused`.
    Reused,
    /// 401 `{"error":"invalid_grant"}`.
    InvalidGrant,
    /// 401 "account has been deactivated".
    Deactivated,
    /// 500 server error.
    Internal,
}

impl RefreshError {
    /// The control value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "refresh_token_expired",
            Self::Invalidated => "refresh_token_invalidated",
            Self::Reused => "refresh_token_reused",
            Self::InvalidGrant => "invalid_grant",
            Self::Deactivated => "account_deactivated",
            Self::Internal => "internal",
        }
    }
}

impl FromStr for RefreshError {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(
            match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
                "refresh_token_expired" | "expired" => Self::Expired,
                "refresh_token_invalidated" | "invalidated" => Self::Invalidated,
                "refresh_token_reused" | "reused" => Self::Reused,
                "invalid_grant" => Self::InvalidGrant,
                "account_deactivated" | "deactivated" => Self::Deactivated,
                "internal" | "500" => Self::Internal,
                other => return Err(format!("unknown refresh error {other:?}")),
            },
        )
    }
}

/// One layer of controls. `None` fields defer to the layer below.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Behaviour {
    /// Answer with this upstream error instead of a stream (`x-mock-error`).
    pub error: Option<ErrorKind>,
    /// Status of the error answer (`x-mock-status`); alone, it sends a generic error body.
    pub status: Option<u16>,
    /// Send `response.failed` with this code right after `response.in_progress`
    /// (`x-mock-fail-in-stream`).
    pub fail_in_stream: Option<String>,
    /// Send some text deltas, then `response.failed` with this code
    /// (`x-mock-fail-after-output`).
    pub fail_after_output: Option<String>,
    /// Abort the stream after this many events, without a terminal event
    /// (`x-mock-disconnect-after`).
    pub disconnect_after: Option<usize>,
    /// After this many events, send nothing more and keep the stream open (an upstream that
    /// hangs mid-answer) (`x-mock-stall-after`).
    pub stall_after: Option<usize>,
    /// Delay before the response head (`x-mock-first-byte-delay-ms`).
    pub first_byte_delay: Option<Duration>,
    /// Delay between events (`x-mock-inter-event-delay-ms`).
    pub inter_event_delay: Option<Duration>,
    /// Number of text deltas (`x-mock-deltas`).
    pub deltas: Option<usize>,
    /// Stream exactly this many `response.output_text.delta` events of a fixed token instead
    /// of splitting the text (`x-mock-tokens`). They are rendered one at a time as the stream
    /// goes, so a stream can last for hours without holding its events in memory (load tests).
    pub tokens: Option<u64>,
    /// Assistant text (`x-mock-text`).
    pub text: Option<String>,
    /// Answer with a `function_call` item calling this tool (`x-mock-tool-call`).
    pub tool_call: Option<String>,
    /// Arguments JSON of the tool call (`x-mock-tool-arguments`).
    pub tool_arguments: Option<String>,
    /// Emit a reasoning item with summary deltas first (`x-mock-reasoning: 1`).
    pub reasoning: Option<bool>,
    /// `response.completed` carries `output: []` (`x-mock-empty-completed-output: 1`).
    pub empty_completed_output: Option<bool>,
    /// End with `response.incomplete` and this reason (`x-mock-incomplete`).
    pub incomplete: Option<String>,
    /// `usage.input_tokens_details.cached_tokens` (`x-mock-cached-tokens`).
    pub cached_tokens: Option<u64>,
    /// The parameter named by `unsupported_parameter` (`x-mock-param`).
    pub param: Option<String>,
    /// `Retry-After` header value of an error answer (`x-mock-retry-after`); replaces the one
    /// an error kind sends by default.
    pub retry_after: Option<String>,
    /// Shape of the refusal of a blob minted by another account (`x-mock-blob-error`):
    /// `code` (`code: "invalid_encrypted_content"`, the default) or `null` (`code: null`, the
    /// message says the content "could not be verified"). Both occur upstream.
    pub blob_error: Option<String>,
    /// A `Set-Cookie` of a successful answer (`x-mock-set-cookie`, `name=value`), sent with
    /// `Path=/; HttpOnly` as Cloudflare sets `__cf_bm`.
    pub set_cookie: Option<String>,
    /// Fail the refresh grant of the account (account / process layers only).
    pub refresh_error: Option<RefreshError>,
    /// Apply this behaviour only to the first N matching requests (account layer only).
    pub fail_times: Option<u32>,
}

// === impl Behaviour ===

impl Behaviour {
    /// A behaviour answering with an upstream error.
    pub fn error(kind: ErrorKind) -> Self {
        Self {
            error: Some(kind),
            ..Self::default()
        }
    }

    /// A behaviour failing the stream with `response.failed` and this code.
    pub fn fail_in_stream(code: impl Into<String>) -> Self {
        Self {
            fail_in_stream: Some(code.into()),
            ..Self::default()
        }
    }

    /// A behaviour failing the refresh grant.
    pub fn refresh_error(e: RefreshError) -> Self {
        Self {
            refresh_error: Some(e),
            ..Self::default()
        }
    }

    /// Limits the behaviour to the first `n` requests it applies to.
    pub fn times(mut self, n: u32) -> Self {
        self.fail_times = Some(n);
        self
    }

    /// Sets one control. `key` may carry the `x-mock-` prefix and use `_` or `-`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let k = normalize_key(key);
        let v = value.trim();
        let bad = |e: &dyn fmt::Display| format!("bad value {v:?} for x-mock-{k}: {e}");
        match k.as_str() {
            "status" => {
                let s: u16 = v.parse().map_err(|e| bad(&e))?;
                if !(100..=999).contains(&s) {
                    return Err(bad(&"not an HTTP status"));
                }
                self.status = Some(s);
            }
            "error" => self.error = Some(v.parse().map_err(|e: String| bad(&e))?),
            "fail-in-stream" => self.fail_in_stream = Some(v.to_owned()),
            "fail-after-output" => self.fail_after_output = Some(v.to_owned()),
            "disconnect-after" => self.disconnect_after = Some(v.parse().map_err(|e| bad(&e))?),
            "stall-after" => self.stall_after = Some(v.parse().map_err(|e| bad(&e))?),
            "first-byte-delay-ms" => self.first_byte_delay = Some(ms(v).map_err(|e| bad(&e))?),
            "inter-event-delay-ms" => self.inter_event_delay = Some(ms(v).map_err(|e| bad(&e))?),
            // Pacing by rate: the same field as `inter-event-delay-ms`.
            "events-per-second" => {
                self.inter_event_delay = Some(per_second(v).map_err(|e| bad(&e))?)
            }
            "tokens" => self.tokens = Some(v.parse().map_err(|e| bad(&e))?),
            "deltas" => self.deltas = Some(v.parse().map_err(|e| bad(&e))?),
            // The text keeps its spaces.
            "text" => self.text = Some(value.to_owned()),
            "tool-call" => self.tool_call = Some(v.to_owned()),
            "tool-arguments" => self.tool_arguments = Some(value.to_owned()),
            "reasoning" => self.reasoning = Some(flag(v).map_err(|e| bad(&e))?),
            "empty-completed-output" => {
                self.empty_completed_output = Some(flag(v).map_err(|e| bad(&e))?)
            }
            "incomplete" => self.incomplete = Some(v.to_owned()),
            "cached-tokens" => self.cached_tokens = Some(v.parse().map_err(|e| bad(&e))?),
            "param" => self.param = Some(v.to_owned()),
            "retry-after" => self.retry_after = Some(v.to_owned()),
            "set-cookie" => self.set_cookie = Some(v.to_owned()),
            "blob-error" => match v.to_ascii_lowercase().as_str() {
                "code" | "null" => self.blob_error = Some(v.to_ascii_lowercase()),
                _ => return Err(bad(&"expected code or null")),
            },
            "refresh-error" => self.refresh_error = Some(v.parse().map_err(|e: String| bad(&e))?),
            "fail-times" => self.fail_times = Some(v.parse().map_err(|e| bad(&e))?),
            _ => return Err(format!("unknown control x-mock-{k}")),
        }
        Ok(())
    }

    /// Overlays `top` on `self`: every `Some` field of `top` wins.
    pub fn overlay(&mut self, top: &Behaviour) {
        macro_rules! take {
            ($($f:ident),*) => {$(
                if top.$f.is_some() {
                    self.$f = top.$f.clone();
                }
            )*};
        }
        take!(
            error,
            status,
            fail_in_stream,
            fail_after_output,
            disconnect_after,
            stall_after,
            first_byte_delay,
            inter_event_delay,
            deltas,
            tokens,
            text,
            tool_call,
            tool_arguments,
            reasoning,
            empty_completed_output,
            incomplete,
            cached_tokens,
            param,
            retry_after,
            blob_error,
            set_cookie,
            refresh_error,
            fail_times
        );
    }

    /// Whether any field shapes a `/responses` answer.
    pub(crate) fn affects_responses(&self) -> bool {
        let no_refresh = Behaviour {
            refresh_error: None,
            fail_times: None,
            ..self.clone()
        };
        no_refresh != Behaviour::default()
    }
}

impl FromStr for Behaviour {
    type Err = String;

    /// Parses `key=value,key=value` (see the module docs).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut b = Behaviour::default();
        for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("expected key=value, got {pair:?}"))?;
            b.set(k, v)?;
        }
        Ok(b)
    }
}

/// Lowercase, without `x-mock-`, `_` → `-`.
pub(crate) fn normalize_key(key: &str) -> String {
    let k = key.trim().to_ascii_lowercase().replace('_', "-");
    match k.strip_prefix("x-mock-") {
        Some(rest) => rest.to_owned(),
        None => k,
    }
}

fn ms(v: &str) -> Result<Duration, std::num::ParseIntError> {
    v.parse::<u64>().map(Duration::from_millis)
}

/// The pause between events for a rate of `v` events per second (`0`: no pacing).
///
/// # Errors
/// `v` is not a number, negative or not finite.
pub fn per_second(v: &str) -> Result<Duration, String> {
    let r: f64 = v.parse().map_err(|e| format!("{e}"))?;
    if !r.is_finite() || r < 0.0 {
        return Err("expected a rate >= 0".to_owned());
    }
    Ok(if r == 0.0 {
        Duration::ZERO
    } else {
        Duration::from_secs_f64(1.0 / r)
    })
}

fn flag(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        other => Err(format!("expected a flag (1/0/true/false), got {other:?}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn spec_parses_every_spelling() {
        let b: Behaviour =
            "x-mock-error=usage_limit_reached,fail_times=2,inter-event-delay-ms=5,Reasoning=1"
                .parse()
                .unwrap();
        assert_eq!(b.error, Some(ErrorKind::UsageLimitReached));
        assert_eq!(b.fail_times, Some(2));
        assert_eq!(b.inter_event_delay, Some(Duration::from_millis(5)));
        assert_eq!(b.reasoning, Some(true));
        assert!(b.affects_responses());
        let b: Behaviour = "events_per_second=20,x-mock-tokens=500".parse().unwrap();
        assert_eq!(b.inter_event_delay, Some(Duration::from_millis(50)));
        assert_eq!(b.tokens, Some(500));
        assert!("events-per-second=-1".parse::<Behaviour>().is_err());
        let b: Behaviour = "error=internal,x-mock-retry-after=120".parse().unwrap();
        assert_eq!(b.retry_after.as_deref(), Some("120"));
    }

    #[test]
    fn spec_rejects_unknown_keys_and_values() {
        assert!("nope=1".parse::<Behaviour>().is_err());
        assert!("error=teapot".parse::<Behaviour>().is_err());
        assert!("deltas=x".parse::<Behaviour>().is_err());
        assert!("status=42".parse::<Behaviour>().is_err());
    }

    #[test]
    fn refresh_only_behaviour_does_not_affect_responses() {
        let b = Behaviour::refresh_error(RefreshError::Expired).times(1);
        assert!(!b.affects_responses());
    }

    #[test]
    fn overlay_prefers_top() {
        let mut base: Behaviour = "deltas=3,text=a".parse().unwrap();
        base.overlay(&"text=b,status=500".parse().unwrap());
        assert_eq!(base.deltas, Some(3));
        assert_eq!(base.text.as_deref(), Some("b"));
        assert_eq!(base.status, Some(500));
    }

    #[test]
    fn every_error_kind_round_trips() {
        for k in ErrorKind::ALL {
            assert_eq!(k.as_str().parse::<ErrorKind>().unwrap(), k);
        }
    }
}
