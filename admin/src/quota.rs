//! Quota polling against the Codex usage endpoint (docs/protocol.md#quota-signals): the URL,
//! the request, the tolerant parser of its JSON, and what an answer does to an account.
//!
//! # Key Components
//! - [`usage_url`]: `…/backend-api/codex` → `…/backend-api/wham/usage`; any other base →
//!   `{origin}/api/codex/usage` (as the Codex CLI derives it).
//! - [`UsageEndpoint`] / [`UsageClient`]: `GET <url>` with `Authorization: Bearer`,
//!   `ChatGPT-Account-Id`, the Codex `User-Agent` and `originator`. It costs no quota.
//! - [`WhamUsage`]: `plan_type`, `rate_limit.{allowed, limit_reached}` and the
//!   `primary_window` / `secondary_window` `{used_percent, limit_window_seconds,
//!   reset_after_seconds, reset_at}` (camelCase aliases accepted; numbers may arrive as
//!   strings; `reset_at` may be RFC 3339).
//! - [`store_usage`]: persists an answer (quota columns, plan, and a cooldown until the reset
//!   when the limit is reached).
//!
//! # Usage
//! The sidecar's poller (`services/quota.rs`) calls [`UsageClient::fetch`] for one active
//! account at a time, spread evenly over `quota_poll_interval`; `cli::accounts_quota` polls
//! on demand.
//!
//! # Error handling
//! [`QuotaError::Unauthorized`] (HTTP 401) means the access token was rejected: the poller
//! hands the account to the single-flight refresh. Everything else is logged and retried on
//! the next round. No error text carries a token.

use std::{path::PathBuf, time::Duration};

use serde_json::Value;
use shared_state::Secret;

use crate::{
    error::StorageError,
    storage::{QuotaUpdate, Storage},
};

/// Cooldown reason written when `/wham/usage` says the usage limit is reached (the same
/// reason the data plane's failure classifier uses for a 429 `usage_limit_reached`).
pub const LIMIT_REASON: &str = "usage_limit_reached";
/// Timeout of one usage request.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// The usage URL for a Codex upstream base URL.
///
/// A base ending in `/backend-api/codex` (the ChatGPT backend) maps to
/// `/backend-api/wham/usage` under the same prefix; a base that is some other
/// `…/backend-api` path maps to `…/backend-api/wham/usage`; anything else to
/// `{scheme}://{host}/api/codex/usage`.
pub fn usage_url(upstream_base_url: &str) -> String {
    let base = upstream_base_url.trim().trim_end_matches('/');
    if let Some(prefix) = base.strip_suffix("/backend-api/codex") {
        return format!("{prefix}/backend-api/wham/usage");
    }
    if let Some(i) = base.find("/backend-api") {
        return format!("{}/backend-api/wham/usage", &base[..i]);
    }
    format!("{}/api/codex/usage", origin(base))
}

/// `scheme://authority` of a URL (the whole string when it has no path).
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    match url[after_scheme..].find(['/', '?', '#']) {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// One rate-limit window of a usage answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct UsageWindow {
    /// Percent of the window used (0..=100).
    pub used_percent: Option<f64>,
    /// Length of the window, seconds.
    pub limit_window_seconds: Option<u64>,
    /// Seconds until the window resets.
    pub reset_after_seconds: Option<u64>,
    /// Reset instant, Unix seconds.
    pub reset_at: Option<u64>,
}

// === impl UsageWindow ===

impl UsageWindow {
    /// The reset instant: `reset_at`, else `now_s + reset_after_seconds`.
    pub fn reset_instant(&self, now_s: u64) -> Option<u64> {
        self.reset_at
            .filter(|r| *r > 0)
            .or_else(|| self.reset_after_seconds.map(|a| now_s.saturating_add(a)))
    }

    fn parse(v: &Value) -> Self {
        Self {
            used_percent: num(field(v, &["used_percent", "usedPercent"]))
                .filter(|p| p.is_finite())
                .map(|p| p.clamp(0.0, 100.0)),
            limit_window_seconds: secs(field(v, &["limit_window_seconds", "limitWindowSeconds"])),
            reset_after_seconds: secs(field(v, &["reset_after_seconds", "resetAfterSeconds"])),
            reset_at: instant(field(v, &["reset_at", "resetAt"])),
        }
    }
}

/// What `GET /wham/usage` reported for an account.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct WhamUsage {
    /// `plan_type` (free, plus, pro, team, ...).
    pub plan_type: Option<String>,
    /// `rate_limit.allowed`.
    pub allowed: Option<bool>,
    /// `rate_limit.limit_reached`.
    pub limit_reached: Option<bool>,
    /// `rate_limit.primary_window` (the 5 h window).
    pub primary: Option<UsageWindow>,
    /// `rate_limit.secondary_window` (the weekly window).
    pub secondary: Option<UsageWindow>,
    /// `rate_limit_reset_credits.available_count`: how many times the account may reset its
    /// limits early (shown per account; `None`: not reported).
    pub reset_credits: Option<u64>,
}

// === impl WhamUsage ===

impl WhamUsage {
    /// Parses the JSON body (snake_case or camelCase).
    pub fn parse(body: &[u8]) -> Result<Self, QuotaError> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| QuotaError::Parse(format!("not JSON: {e}")))?;
        if !v.is_object() {
            return Err(QuotaError::Parse("not a JSON object".into()));
        }
        let rl = field(&v, &["rate_limit", "rateLimit"]);
        let window = |names: &[&str]| rl.and_then(|r| field(r, names)).map(UsageWindow::parse);
        Ok(Self {
            plan_type: field(&v, &["plan_type", "planType"])
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
            allowed: rl.and_then(|r| boolean(field(r, &["allowed"]))),
            limit_reached: rl.and_then(|r| boolean(field(r, &["limit_reached", "limitReached"]))),
            primary: window(&["primary_window", "primaryWindow", "primary"]),
            secondary: window(&["secondary_window", "secondaryWindow", "secondary"]),
            reset_credits: field(&v, &["rate_limit_reset_credits", "rateLimitResetCredits"])
                .and_then(|c| field(c, &["available_count", "availableCount"]))
                .and_then(|n| secs(Some(n))),
        })
    }

    /// The quota observation to record (reset instants resolved against `now_s`).
    pub fn quota_update(&self, now_s: u64) -> QuotaUpdate {
        let p = self.primary.unwrap_or_default();
        let s = self.secondary.unwrap_or_default();
        QuotaUpdate {
            primary_pct: p.used_percent,
            primary_reset_at: p.reset_instant(now_s),
            secondary_pct: s.used_percent,
            secondary_reset_at: s.reset_instant(now_s),
        }
    }

    /// When the usage limit is reached: the instant (Unix seconds) the account is usable
    /// again. That is the latest reset among exhausted windows (every one must reset), or,
    /// when no window is at 100 %, the earliest known reset. `None` when the limit is not
    /// reached or no reset is known.
    pub fn limit_reset_at(&self, now_s: u64) -> Option<u64> {
        let reached = self.limit_reached == Some(true) || self.allowed == Some(false);
        if !reached {
            return None;
        }
        let windows = [self.primary, self.secondary];
        let known = windows.iter().flatten();
        let exhausted = known
            .clone()
            .filter(|w| w.used_percent.is_some_and(|p| p >= 100.0))
            .filter_map(|w| w.reset_instant(now_s))
            .max();
        exhausted.or_else(|| known.filter_map(|w| w.reset_instant(now_s)).min())
    }
}

/// Why a usage poll failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// HTTP 401: the access token was rejected.
    #[error("access token rejected (HTTP 401)")]
    Unauthorized,
    /// Another non-2xx answer.
    #[error("HTTP {status}: {snippet}")]
    Http {
        /// The status.
        status: u16,
        /// The start of the body.
        snippet: String,
    },
    /// The request did not complete.
    #[error("request failed: {0}")]
    Transport(String),
    /// The body is not the expected JSON.
    #[error("unexpected usage body: {0}")]
    Parse(String),
}

/// Where and as whom to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEndpoint {
    /// The usage URL (see [`usage_url`]).
    pub url: String,
    /// `originator` header.
    pub originator: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Extra PEM root(s) for the HTTP client (the CLI builds its own client from this).
    pub ca_file: Option<PathBuf>,
}

// === impl UsageEndpoint ===

impl UsageEndpoint {
    /// The endpoint for an upstream base URL with the Codex CLI identity defaults.
    pub fn for_upstream(upstream_base_url: &str) -> Self {
        Self {
            url: usage_url(upstream_base_url),
            originator: crate::DEFAULT_ORIGINATOR.to_owned(),
            user_agent: crate::DEFAULT_USER_AGENT.to_owned(),
            ca_file: None,
        }
    }
}

/// Polls the usage endpoint.
#[derive(Debug, Clone)]
pub struct UsageClient {
    http: reqwest::Client,
    endpoint: UsageEndpoint,
}

// === impl UsageClient ===

impl UsageClient {
    /// A client for `endpoint` over `http` (`endpoint.ca_file` is not consulted: `http` is
    /// already built).
    pub fn new(http: reqwest::Client, endpoint: UsageEndpoint) -> Self {
        Self { http, endpoint }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &UsageEndpoint {
        &self.endpoint
    }

    /// `GET` the usage of one account.
    pub async fn fetch(
        &self,
        access_token: &Secret,
        chatgpt_account_id: &str,
    ) -> Result<WhamUsage, QuotaError> {
        let resp = self
            .identity_get(&self.endpoint.url, access_token, chatgpt_account_id)
            .send()
            .await
            .map_err(|e| QuotaError::Transport(crate::oauth::describe_reqwest(&e)))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| QuotaError::Transport(crate::oauth::describe_reqwest(&e)))?;
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(QuotaError::Unauthorized);
        }
        if !status.is_success() {
            return Err(QuotaError::Http {
                status: status.as_u16(),
                snippet: snippet(&body),
            });
        }
        WhamUsage::parse(&body)
    }

    /// `GET url` as the Codex CLI would send it for one account: `Authorization: Bearer`,
    /// `ChatGPT-Account-Id` (when known), `User-Agent`, `originator`, `Accept: application/json`
    /// and a [`FETCH_TIMEOUT`]. Shared with the `/models` client ([`crate::models`]).
    pub(crate) fn identity_get(
        &self,
        url: &str,
        access_token: &Secret,
        chatgpt_account_id: &str,
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .get(url)
            .timeout(FETCH_TIMEOUT)
            .bearer_auth(access_token.expose())
            .header(reqwest::header::USER_AGENT, &self.endpoint.user_agent)
            .header("originator", &self.endpoint.originator)
            .header(reqwest::header::ACCEPT, "application/json");
        if !chatgpt_account_id.is_empty() {
            req = req.header("ChatGPT-Account-Id", chatgpt_account_id);
        }
        req
    }
}

impl UsageClient {
    /// `POST url` with a JSON body as the Codex CLI sends a turn for one account (the batch
    /// test, [`crate::batch`]): the identity headers of [`UsageClient::identity_get`], a
    /// streamed answer, and `timeout`.
    pub(crate) fn identity_post(
        &self,
        url: &str,
        access_token: &Secret,
        chatgpt_account_id: &str,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(url)
            .timeout(timeout)
            .bearer_auth(access_token.expose())
            .header(reqwest::header::USER_AGENT, &self.endpoint.user_agent)
            .header("originator", &self.endpoint.originator)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if !chatgpt_account_id.is_empty() {
            req = req.header("ChatGPT-Account-Id", chatgpt_account_id);
        }
        req
    }
}

/// The start of an error body, printable (at most 200 characters, no control characters).
pub(crate) fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

/// What [`store_usage`] wrote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredUsage {
    /// The quota observation.
    pub quota: QuotaUpdate,
    /// The cooldown deadline set because the limit is reached (Unix ms).
    pub cooldown_until_ms: Option<u64>,
}

/// Persists a usage answer for account `id`: the quota columns, the plan when reported, and,
/// when the limit is reached, a cooldown until the reset (never shorter than
/// `current_cooldown_ms`). Returns `None` when the account does not exist.
pub async fn store_usage(
    storage: &dyn Storage,
    id: i64,
    usage: &WhamUsage,
    current_cooldown_ms: u64,
) -> Result<Option<StoredUsage>, StorageError> {
    let now_ms = shared_state::now_ms();
    let quota = usage.quota_update(now_ms / 1000);
    if !storage.record_quota(id, quota).await? {
        return Ok(None);
    }
    if let Some(plan) = &usage.plan_type {
        storage.set_plan_type(id, plan).await?;
    }
    let mut cooldown_until_ms = None;
    if let Some(reset_s) = usage.limit_reset_at(now_ms / 1000) {
        let until = reset_s.saturating_mul(1000);
        if until > now_ms && until > current_cooldown_ms {
            storage.set_cooldown(id, until, Some(LIMIT_REASON)).await?;
            cooldown_until_ms = Some(until);
        }
    }
    Ok(Some(StoredUsage {
        quota,
        cooldown_until_ms,
    }))
}

// --- tolerant JSON readers ---

fn field<'a>(v: &'a Value, names: &[&str]) -> Option<&'a Value> {
    names
        .iter()
        .find_map(|n| v.get(*n))
        .filter(|x| !x.is_null())
}

fn num(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn secs(v: Option<&Value>) -> Option<u64> {
    num(v)
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(|x| x.round() as u64)
}

/// A Unix instant in seconds: a number (milliseconds are recognized and scaled), a numeric
/// string, or an RFC 3339 string.
fn instant(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    let n = match v {
        Value::String(s) if s.trim().parse::<f64>().is_err() => {
            let t = time::OffsetDateTime::parse(
                s.trim(),
                &time::format_description::well_known::Rfc3339,
            )
            .ok()?;
            return u64::try_from(t.unix_timestamp()).ok();
        }
        _ => secs(Some(v))?,
    };
    // Anything past year 5138 in seconds is a millisecond timestamp.
    Some(if n > 100_000_000_000 { n / 1000 } else { n })
}

fn boolean(v: Option<&Value>) -> Option<bool> {
    match v? {
        Value::Bool(b) => Some(*b),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn derives_the_usage_url() {
        assert_eq!(
            usage_url("https://chatgpt.com/backend-api/codex"),
            "https://chatgpt.com/backend-api/wham/usage"
        );
        assert_eq!(
            usage_url("http://127.0.0.1:9/backend-api/codex/"),
            "http://127.0.0.1:9/backend-api/wham/usage"
        );
        assert_eq!(
            usage_url("http://relay:8080/team/backend-api/codex"),
            "http://relay:8080/team/backend-api/wham/usage"
        );
        assert_eq!(
            usage_url("https://chatgpt.com/backend-api"),
            "https://chatgpt.com/backend-api/wham/usage"
        );
        assert_eq!(
            usage_url("http://127.0.0.1:8080/v1/codex"),
            "http://127.0.0.1:8080/api/codex/usage"
        );
        assert_eq!(
            usage_url("http://127.0.0.1:8080"),
            "http://127.0.0.1:8080/api/codex/usage"
        );
    }

    #[test]
    fn parses_snake_case_usage() {
        let body = br#"{"user_id":"u","account_id":"a","email":"e","plan_type":"plus",
            "rate_limit":{"allowed":true,"limit_reached":false,
              "primary_window":{"used_percent":42.5,"limit_window_seconds":18000,"reset_after_seconds":600,"reset_at":1900000000},
              "secondary_window":{"used_percent":7,"limit_window_seconds":604800,"reset_after_seconds":3600}},
            "credits":{"has_credits":false,"unlimited":false,"balance":"0"},
            "rate_limit_reset_credits":{"available_count":3,"applicable_available_count":2}}"#;
        let u = WhamUsage::parse(body).unwrap();
        assert_eq!(u.reset_credits, Some(3));
        assert_eq!(
            WhamUsage::parse(br#"{"plan_type":"plus"}"#)
                .unwrap()
                .reset_credits,
            None
        );
        assert_eq!(u.plan_type.as_deref(), Some("plus"));
        assert_eq!(u.limit_reached, Some(false));
        let p = u.primary.unwrap();
        assert_eq!(p.used_percent, Some(42.5));
        assert_eq!(p.limit_window_seconds, Some(18000));
        let q = u.quota_update(1_000);
        assert_eq!(q.primary_pct, Some(42.5));
        assert_eq!(q.primary_reset_at, Some(1_900_000_000));
        assert_eq!(q.secondary_pct, Some(7.0));
        assert_eq!(
            q.secondary_reset_at,
            Some(4_600),
            "reset_after_seconds + now"
        );
        assert_eq!(u.limit_reset_at(1_000), None);
    }

    #[test]
    fn parses_camel_case_strings_and_limit_reached() {
        let body = br#"{"planType":"pro","rateLimit":{"allowed":false,"limitReached":"true",
            "primaryWindow":{"usedPercent":"100","limitWindowSeconds":18000,"resetAt":"2030-01-01T00:00:00Z"},
            "secondaryWindow":{"usedPercent":130.0,"resetAt":1900000000000}}}"#;
        let u = WhamUsage::parse(body).unwrap();
        assert_eq!(u.plan_type.as_deref(), Some("pro"));
        assert_eq!(u.allowed, Some(false));
        let q = u.quota_update(0);
        assert_eq!(q.primary_pct, Some(100.0));
        assert_eq!(q.primary_reset_at, Some(1_893_456_000));
        assert_eq!(q.secondary_pct, Some(100.0), "clamped");
        assert_eq!(q.secondary_reset_at, Some(1_900_000_000), "ms scaled");
        // Both windows exhausted: usable again when the later one resets.
        assert_eq!(u.limit_reset_at(0), Some(1_900_000_000));
    }

    #[test]
    fn limit_reached_without_an_exhausted_window_uses_the_earliest_reset() {
        let body = br#"{"rate_limit":{"limit_reached":true,
            "primary_window":{"used_percent":80,"reset_after_seconds":60},
            "secondary_window":{"used_percent":90,"reset_after_seconds":600}}}"#;
        let u = WhamUsage::parse(body).unwrap();
        assert_eq!(u.limit_reset_at(100), Some(160));
        let none = WhamUsage::parse(br#"{"plan_type":""}"#).unwrap();
        assert_eq!(none, WhamUsage::default());
        assert_eq!(none.quota_update(5), QuotaUpdate::default());
        assert!(WhamUsage::parse(b"[]").is_err());
        assert!(WhamUsage::parse(b"<html>").is_err());
    }
}
