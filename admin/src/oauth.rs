//! The OAuth token endpoint client (docs/protocol.md#oauth-refresh) and identity from JWT claims.
//!
//! # Key Components
//! - [`OAuthClient::refresh`]: `POST <token_url>` with JSON
//!   `{"client_id","grant_type":"refresh_token","refresh_token"}`; the refresh token rotates.
//! - [`RefreshError`]: `Terminal` (the refresh token is dead: `refresh_token_reused` /
//!   `_expired` / `_invalidated`, `invalid_grant`, or the account is deactivated) versus
//!   `Transient` (network, 5xx, a plain 401: retry with backoff).
//! - [`Identity::from_tokens`]: account id, user id, plan, email and expiry from the id token
//!   first, then the access token.
//! - [`build_http_client`]: the sidecar's reqwest client (rustls, optional extra PEM root).
//!
//! # Error handling
//! Error texts carry the endpoint's error code and at most a short snippet of its body, never
//! a token.

use std::{path::Path, time::Duration};

use shared_state::{jwt::decode_claims, AccountStatus, Secret};

/// The Codex CLI's public OAuth client id.
pub const CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
/// The default token endpoint.
pub const DEFAULT_TOKEN_URL: &str = "https://auth.openai.com/oauth/token";

/// Markers in a token-endpoint error that mean the refresh token can never work again.
const TERMINAL_MARKERS: &[&str] = &[
    "refresh_token_reused",
    "refresh_token_expired",
    "refresh_token_invalidated",
    "invalid_grant",
    "deactivated",
];

/// A successful token response.
#[derive(Debug, Clone)]
pub struct TokenResponse {
    /// The new access token.
    pub access_token: Secret,
    /// The rotated refresh token (absent: keep the old one).
    pub refresh_token: Option<Secret>,
    /// A new id token.
    pub id_token: Option<Secret>,
    /// Lifetime of the access token, seconds.
    pub expires_in: Option<i64>,
}

/// Why a refresh failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RefreshError {
    /// The refresh token is dead; an operator must log in again.
    #[error("refresh token rejected ({code})")]
    Terminal {
        /// The marker found (`refresh_token_reused`, `invalid_grant`, `deactivated`, ...).
        code: String,
        /// HTTP status.
        status: u16,
    },
    /// Worth retrying later.
    #[error("token endpoint unavailable: {0}")]
    Transient(String),
}

// === impl RefreshError ===

impl RefreshError {
    /// The status a terminal failure leaves the account in: `banned` for a deactivated
    /// account, `reauth_required` otherwise; `None` for transient failures.
    pub fn terminal_status(&self) -> Option<AccountStatus> {
        match self {
            Self::Terminal { code, .. } if code == "deactivated" => Some(AccountStatus::Banned),
            Self::Terminal { .. } => Some(AccountStatus::ReauthRequired),
            Self::Transient(_) => None,
        }
    }
}

/// The token endpoint client.
#[derive(Debug, Clone)]
pub struct OAuthClient {
    http: reqwest::Client,
    token_url: String,
    /// `originator` and `User-Agent` of token calls: the configured `[wire]` identity (the
    /// Codex CLI's by default), never the gateway's own name (issue 23).
    originator: String,
    user_agent: String,
}

// === impl OAuthClient ===

impl OAuthClient {
    /// A client for `token_url`.
    pub fn new(http: reqwest::Client, token_url: impl Into<String>) -> Self {
        Self {
            http,
            token_url: token_url.into(),
            originator: crate::DEFAULT_ORIGINATOR.to_owned(),
            user_agent: crate::DEFAULT_USER_AGENT.to_owned(),
        }
    }

    /// Token calls present this identity (`originator`, `User-Agent`): the data plane's
    /// configured `[wire]` profile, so one account looks like one client everywhere.
    pub fn with_identity(mut self, originator: &str, user_agent: &str) -> Self {
        self.originator = originator.to_owned();
        self.user_agent = user_agent.to_owned();
        self
    }

    /// The same endpoint and identity over another HTTP client (an account's egress proxy).
    pub fn with_http(&self, http: reqwest::Client) -> Self {
        Self {
            http,
            ..self.clone()
        }
    }

    /// A token endpoint POST carrying the identity headers.
    fn post(&self) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(&self.token_url)
            .header(reqwest::header::ACCEPT, "application/json");
        if !self.user_agent.is_empty() {
            r = r.header(reqwest::header::USER_AGENT, &self.user_agent);
        }
        if !self.originator.is_empty() {
            r = r.header("originator", &self.originator);
        }
        r
    }

    /// The endpoint URL.
    pub fn token_url(&self) -> &str {
        &self.token_url
    }

    /// Exchanges a refresh token for new tokens.
    pub async fn refresh(&self, refresh_token: &Secret) -> Result<TokenResponse, RefreshError> {
        if refresh_token.is_empty() {
            return Err(RefreshError::Terminal {
                code: "no_refresh_token".into(),
                status: 0,
            });
        }
        let body = serde_json::json!({
            "client_id": CLIENT_ID,
            "grant_type": "refresh_token",
            "refresh_token": refresh_token.expose(),
        });
        let resp = self
            .post()
            .json(&body)
            .send()
            .await
            .map_err(|e| RefreshError::Transient(describe_reqwest(&e)))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| RefreshError::Transient(describe_reqwest(&e)))?;
        if status.is_success() {
            return parse_token_response(&bytes);
        }
        Err(classify_error(status.as_u16(), &bytes))
    }
}

/// The redirect URI the Codex CLI registers (`localhost:1455`); the operator pastes the URL the
/// browser lands on back into the admin app.
pub const REDIRECT_URI: &str = "http://localhost:1455/auth/callback";

/// The authorize endpoint next to a token endpoint (`.../oauth/token` -> `.../oauth/authorize`).
pub fn authorize_url_base(token_url: &str) -> String {
    match token_url.strip_suffix("/token") {
        Some(base) => format!("{base}/authorize"),
        None => "https://auth.openai.com/oauth/authorize".to_owned(),
    }
}

/// A PKCE pair: `(verifier, S256 challenge)`.
pub fn pkce_pair() -> (String, String) {
    use base64::Engine;
    use rand::RngCore;
    use sha2::Digest;
    let mut raw = [0u8; 48];
    rand::rng().fill_bytes(&mut raw);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let verifier = b64.encode(raw);
    let challenge = b64.encode(sha2::Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// The browser URL that starts a Codex login (docs/protocol.md#oauth-refresh: login).
pub fn authorize_url(token_url: &str, challenge: &str, state: &str) -> String {
    let q = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    format!(
        "{}?response_type=code&client_id={CLIENT_ID}&redirect_uri={}&scope={}\
         &code_challenge={challenge}&code_challenge_method=S256&id_token_add_organizations=true\
         &codex_cli_simplified_flow=true&state={}",
        authorize_url_base(token_url),
        q(REDIRECT_URI),
        q("openid profile email offline_access"),
        q(state),
    )
}

// === impl OAuthClient (authorization code) ===

impl OAuthClient {
    /// Exchanges an authorization code (PKCE) for tokens.
    pub async fn exchange_code(
        &self,
        code: &str,
        verifier: &str,
    ) -> Result<TokenResponse, RefreshError> {
        let form = [
            ("grant_type", "authorization_code"),
            ("client_id", CLIENT_ID),
            ("code", code),
            ("redirect_uri", REDIRECT_URI),
            ("code_verifier", verifier),
        ];
        let body: String = form
            .iter()
            .map(|(k, v)| format!("{k}={}", form_escape(v)))
            .collect::<Vec<_>>()
            .join("&");
        let resp = self
            .post()
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| RefreshError::Transient(describe_reqwest(&e)))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| RefreshError::Transient(describe_reqwest(&e)))?;
        if status.is_success() {
            return parse_token_response(&bytes);
        }
        Err(classify_error(status.as_u16(), &bytes))
    }
}

fn form_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn describe_reqwest(e: &reqwest::Error) -> String {
    // reqwest's Display includes the URL (no credentials in ours) and the cause chain.
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn parse_token_response(bytes: &[u8]) -> Result<TokenResponse, RefreshError> {
    #[derive(serde::Deserialize)]
    struct Raw {
        access_token: Option<String>,
        refresh_token: Option<String>,
        id_token: Option<String>,
        expires_in: Option<i64>,
    }
    let raw: Raw = serde_json::from_slice(bytes)
        .map_err(|_| RefreshError::Transient("token endpoint returned invalid JSON".into()))?;
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty()).map(Secret::from);
    let access_token = nonempty(raw.access_token).ok_or_else(|| {
        RefreshError::Transient("token endpoint response lacks access_token".into())
    })?;
    Ok(TokenResponse {
        access_token,
        refresh_token: nonempty(raw.refresh_token),
        id_token: nonempty(raw.id_token),
        expires_in: raw.expires_in,
    })
}

/// Classifies a non-2xx token-endpoint answer.
pub fn classify_error(status: u16, body: &[u8]) -> RefreshError {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    if (400..500).contains(&status) {
        if let Some(m) = TERMINAL_MARKERS.iter().find(|m| text.contains(**m)) {
            return RefreshError::Terminal {
                code: (*m).to_owned(),
                status,
            };
        }
    }
    let snippet: String = String::from_utf8_lossy(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    RefreshError::Transient(format!("HTTP {status}: {snippet}"))
}

/// Identity read from a credential's tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// `chatgpt_account_id`.
    pub account_id: Option<String>,
    /// `chatgpt_user_id`.
    pub user_id: Option<String>,
    /// Plan type.
    pub plan_type: Option<String>,
    /// Email.
    pub email: Option<String>,
    /// Access token `exp` (Unix seconds).
    pub access_expires_at: Option<i64>,
}

// === impl Identity ===

impl Identity {
    /// Reads claims from the id token first, then the access token (either may be empty or
    /// not a JWT). The expiry always comes from the access token.
    pub fn from_tokens(id_token: &str, access_token: &str) -> Self {
        let idc = decode_claims(id_token).unwrap_or_default();
        let atc = decode_claims(access_token).unwrap_or_default();
        let nonempty = |s: Option<String>| s.filter(|v| !v.is_empty());
        Self {
            account_id: nonempty(idc.account_id).or_else(|| nonempty(atc.account_id)),
            user_id: nonempty(idc.user_id).or_else(|| nonempty(atc.user_id)),
            plan_type: nonempty(idc.plan_type).or_else(|| nonempty(atc.plan_type)),
            email: nonempty(idc.email).or_else(|| nonempty(atc.email)),
            access_expires_at: atc.exp,
        }
    }
}

/// Builds the sidecar's HTTP client: rustls with the webpki roots plus `extra_ca` (a PEM file
/// that may hold several certificates).
pub fn build_http_client(extra_ca: Option<&Path>) -> Result<reqwest::Client, String> {
    build_http_client_via(extra_ca, None)
}

/// [`build_http_client`] leaving through an egress proxy (HTTP `CONNECT` / forward proxy, or
/// SOCKS5 with the URL's credentials); `None`: as [`build_http_client`].
pub fn build_http_client_via(
    extra_ca: Option<&Path>,
    proxy: Option<&shared_state::ProxyUrl>,
) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .user_agent(concat!("codex-gateway/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = extra_ca {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{}: not a PEM certificate bundle: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no certificate found", path.display()));
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    if let Some(p) = proxy {
        // The error never carries the URL (it holds the password).
        let proxy = reqwest::Proxy::all(p.expose()).map_err(|_| {
            format!(
                "egress proxy {} is not usable by the HTTP client",
                p.redacted()
            )
        })?;
        b = b.proxy(proxy);
    }
    b.build().map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use shared_state::jwt::encode_unsigned;

    use super::*;

    #[test]
    fn classifies_terminal_and_transient() {
        let e = classify_error(400, br#"{"error":{"code":"refresh_token_reused"}}"#);
        assert_eq!(e.terminal_status(), Some(AccountStatus::ReauthRequired));
        let e = classify_error(401, br#"{"error":"invalid_grant"}"#);
        assert!(matches!(e, RefreshError::Terminal { .. }));
        let e = classify_error(403, b"Your account has been deactivated");
        assert_eq!(e.terminal_status(), Some(AccountStatus::Banned));
        assert_eq!(classify_error(401, b"unauthorized").terminal_status(), None);
        assert_eq!(
            classify_error(503, b"invalid_grant").terminal_status(),
            None
        );
    }

    #[test]
    fn identity_prefers_id_token() {
        let id = encode_unsigned(
            r#"{"email":"a@x","https://api.openai.com/auth":{"chatgpt_account_id":"acc","chatgpt_user_id":"u1","chatgpt_plan_type":"pro"}}"#,
        );
        let at = encode_unsigned(
            r#"{"exp":123,"https://api.openai.com/auth":{"chatgpt_account_id":"other","chatgpt_plan_type":"plus"},"https://api.openai.com/profile":{"email":"b@x"}}"#,
        );
        let i = Identity::from_tokens(&id, &at);
        assert_eq!(i.account_id.as_deref(), Some("acc"));
        assert_eq!(i.plan_type.as_deref(), Some("pro"));
        assert_eq!(i.email.as_deref(), Some("a@x"));
        assert_eq!(i.access_expires_at, Some(123));
        let i = Identity::from_tokens("", &at);
        assert_eq!(i.account_id.as_deref(), Some("other"));
        assert_eq!(i.email.as_deref(), Some("b@x"));
    }

    #[test]
    fn token_response_keeps_optional_fields_optional() {
        let r = parse_token_response(br#"{"access_token":"a","refresh_token":"","expires_in":5}"#)
            .unwrap();
        assert_eq!(r.access_token.expose(), "a");
        assert!(r.refresh_token.is_none());
        assert!(parse_token_response(b"{}").is_err());
    }
}
