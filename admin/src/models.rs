//! The Codex model catalog endpoint (docs/protocol.md#model-catalog): the URL and the
//! conditional request the sidecar's catalog refresher sends for one account.
//!
//! # Key Components
//! - [`models_url`] builds `{upstream_base_url}/models?client_version=<ver>`.
//! - [`ModelsClient`]: `GET <url>` with the same identity headers as the usage poller
//!   (`Authorization: Bearer`, `ChatGPT-Account-Id`, `User-Agent`, `originator`, built by
//!   [`UsageClient`]'s request builder over the same HTTP client) plus `version: <ver>` and,
//!   when a previous answer is cached, `If-None-Match: <etag>`.
//! - [`ModelsAnswer`]: a new body (checked to be a Codex `{"models":[...]}` catalog) with its
//!   `ETag`, or `NotModified` for a 304.
//!
//! # Usage
//! The sidecar's refresher (`services/models.rs`) fetches once per distinct plan and merges the
//! bodies into a [`shared_state::ModelCatalog`].
//!
//! # Error handling
//! [`ModelsError::Unauthorized`] (HTTP 401) means the access token was rejected; the refresher
//! hands the account to the single-flight token refresh. No error text carries a token.

use shared_state::{catalog::CatalogSource, ModelCatalog, Secret};

use crate::quota::UsageClient;

/// The Codex CLI version the gateway presents by default (`client_version`, `version`).
pub const DEFAULT_CLIENT_VERSION: &str = "0.171.0";

/// `{upstream_base_url}/models?client_version=<client_version>`.
pub fn models_url(upstream_base_url: &str, client_version: &str) -> String {
    let base = upstream_base_url.trim().trim_end_matches('/');
    let ver: String = client_version
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'))
        .collect();
    format!("{base}/models?client_version={ver}")
}

/// What one `/models` request answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelsAnswer {
    /// 200 with a Codex catalog body.
    Fresh {
        /// The raw body (`{"models":[...]}`).
        body: Vec<u8>,
        /// The `ETag` header, when sent.
        etag: Option<String>,
    },
    /// 304: the body for the sent `If-None-Match` is still current.
    NotModified,
}

/// Why a `/models` request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelsError {
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
    /// The body is not a Codex catalog.
    #[error("unexpected /models body: {0}")]
    Parse(String),
}

/// Fetches the model catalog as one account.
#[derive(Debug, Clone)]
pub struct ModelsClient {
    usage: UsageClient,
    url: String,
    client_version: String,
}

// === impl ModelsClient ===

impl ModelsClient {
    /// A client sending to `url` with `usage`'s HTTP client and identity headers.
    pub fn new(usage: UsageClient, url: String, client_version: String) -> Self {
        Self {
            usage,
            url,
            client_version,
        }
    }

    /// The usage client whose HTTP client and identity headers it uses.
    pub fn usage(&self) -> &UsageClient {
        &self.usage
    }

    /// The same client over another usage client (an account's egress proxy).
    pub fn with_usage(&self, usage: UsageClient) -> Self {
        Self {
            usage,
            url: self.url.clone(),
            client_version: self.client_version.clone(),
        }
    }

    /// The catalog URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `GET` the catalog as `chatgpt_account_id`; `if_none_match` is the `ETag` of the body
    /// the caller still holds.
    pub async fn fetch(
        &self,
        access_token: &Secret,
        chatgpt_account_id: &str,
        if_none_match: Option<&str>,
    ) -> Result<ModelsAnswer, ModelsError> {
        let mut req = self
            .usage
            .identity_get(&self.url, access_token, chatgpt_account_id)
            .header("version", &self.client_version);
        if let Some(etag) = if_none_match.filter(|e| !e.is_empty()) {
            req = req.header(reqwest::header::IF_NONE_MATCH, etag);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ModelsError::Transport(crate::oauth::describe_reqwest(&e)))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(ModelsAnswer::NotModified);
        }
        let etag = resp
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        let body = resp
            .bytes()
            .await
            .map_err(|e| ModelsError::Transport(crate::oauth::describe_reqwest(&e)))?;
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(ModelsError::Unauthorized);
        }
        if !status.is_success() {
            return Err(ModelsError::Http {
                status: status.as_u16(),
                snippet: crate::quota::snippet(&body),
            });
        }
        // Validate now, so one bad plan body never poisons the merged catalog.
        ModelCatalog::from_codex_json(&body, CatalogSource::Upstream, Default::default())
            .map_err(|e| ModelsError::Parse(e.0))?;
        Ok(ModelsAnswer::Fresh {
            body: body.to_vec(),
            etag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_the_models_url() {
        assert_eq!(
            models_url("https://chatgpt.com/backend-api/codex", "0.171.0"),
            "https://chatgpt.com/backend-api/codex/models?client_version=0.171.0"
        );
        assert_eq!(
            models_url(" http://127.0.0.1:9/backend-api/codex/ ", " 1.2.3-beta&x=1"),
            "http://127.0.0.1:9/backend-api/codex/models?client_version=1.2.3-betax1"
        );
    }
}
