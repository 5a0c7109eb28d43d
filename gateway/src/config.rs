//! The data plane's configuration: what each worker reads. The process configuration (flags,
//! environment, the TOML file, defaults) is the assembly's (`codex_gateway::config`), which
//! hands this slice to the workers and the sidecar's slice to the sidecar.
//!
//! # Key Components
//! - [`GatewayConfig`]: the workers' slice (client limits and timeouts, the upstream, the wire
//!   profile, prices, the `/metrics` token).
//! - [`UpstreamConfig`], [`WireProfile`]: the slices the upstream client needs.
//!
//! # Error handling
//! A bad upstream URL is a [`ConfigError`] naming it; the assembly reports every other
//! configuration problem the same way.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    time::Duration,
};

use shared_state::Secret;

/// Default upstream base URL.
pub const DEFAULT_UPSTREAM: &str = "https://chatgpt.com/backend-api/codex";
/// Open client WebSocket sessions per key and process unless configured: a safe default, so
/// one key cannot hold every descriptor with idle sockets (0 in the file: no cap).
pub const DEFAULT_MAX_WS_SESSIONS_PER_KEY: u32 = 512;

/// A configuration problem.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {0}")]
pub struct ConfigError(pub String);

/// How to speak to a plain-HTTP upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainHttp {
    /// HTTP/1.1 (a new or pooled connection per request).
    H1,
    /// HTTP/2 with prior knowledge (h2c), one multiplexed connection per worker.
    H2c,
}

/// Where and how to reach the Codex backend.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `https` or `http`.
    pub tls: bool,
    /// Host name (for SNI and `:authority`).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Path prefix, e.g. `/backend-api/codex` (no trailing slash).
    pub path_prefix: String,
    /// Resolved addresses, refreshed off the workers by the resolver thread.
    pub addrs: ResolvedAddrs,
    /// Extra trusted CA (PEM).
    pub ca_file: Option<PathBuf>,
    /// Protocol for plain-HTTP upstreams.
    pub plain_http: PlainHttp,
    /// TCP+TLS connect budget.
    pub connect_timeout: Duration,
    /// Budget until response headers.
    pub first_byte_timeout: Duration,
    /// Longest silence between two body chunks of a stream.
    pub idle_timeout: Duration,
    /// Streams a worker opens on one upstream h2 connection before it opens another (keep it
    /// at or below the origin's `SETTINGS_MAX_CONCURRENT_STREAMS`; real origins allow 100-256).
    pub h2_max_streams_per_connection: usize,
    /// Upstream h2 connections per worker per origin (64: 6,400 streams per worker at 100 per
    /// connection); when all are full a request fails fast with 503 instead of waiting.
    pub h2_max_connections: usize,
    /// Client WebSocket turns go upstream over a pooled Responses WebSocket (else HTTP).
    pub websockets: bool,
    /// Connect + upgrade budget of an upstream WebSocket; past it the turn goes over HTTP.
    pub ws_connect_timeout: Duration,
    /// An idle pooled upstream WebSocket is pinged this often (and its pending frames read,
    /// the upstream's pings answered).
    pub ws_ping_interval: Duration,
    /// An idle socket whose pong does not come within this is closed (a silently dead
    /// connection would otherwise hold the next turn until the first-byte timeout).
    pub ws_pong_timeout: Duration,
    /// Idle HTTP/1.1 keep-alive connections kept per worker (0: a connection per request).
    pub h1_max_idle: usize,
    /// An idle HTTP/1.1 connection older than this is not reused (keep it under the origin's
    /// keep-alive timeout).
    pub h1_idle_timeout: Duration,
}

// === impl UpstreamConfig ===

impl UpstreamConfig {
    /// Parses a base URL like `https://chatgpt.com/backend-api/codex` and resolves its host.
    pub fn from_base_url(url: &str) -> Result<Self, ConfigError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| ConfigError(format!("upstream base URL `{url}` is invalid: {e}")))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(ConfigError(format!(
                    "upstream base URL `{url}` must start with http:// or https://"
                )))
            }
        };
        let host = uri
            .host()
            .ok_or_else(|| ConfigError(format!("upstream base URL `{url}` has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let addrs = ResolvedAddrs::default();
        // IP literals need no resolver; names are resolved by `resolve_now` / the resolver thread.
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            addrs.set(vec![SocketAddr::new(ip, port)]);
        }
        Ok(Self {
            tls,
            host,
            port,
            path_prefix: uri.path().trim_end_matches('/').to_owned(),
            addrs,
            ca_file: None,
            plain_http: PlainHttp::H1,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(300),
            h2_max_streams_per_connection: 100,
            h2_max_connections: 64,
            websockets: true,
            ws_connect_timeout: Duration::from_millis(800),
            ws_ping_interval: Duration::from_secs(20),
            ws_pong_timeout: Duration::from_secs(5),
            h1_max_idle: 64,
            h1_idle_timeout: Duration::from_secs(30),
        })
    }

    /// Resolves the host now (blocking getaddrinfo: call it off the workers).
    pub fn resolve_now(&self) -> std::io::Result<usize> {
        let found: Vec<SocketAddr> = (self.host.as_str(), self.port).to_socket_addrs()?.collect();
        let n = found.len();
        if n > 0 {
            self.addrs.set(found);
        }
        Ok(n)
    }

    /// `host` or `host:port` when the port is not the scheme's default.
    pub fn authority(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// The upstream's resolved addresses, shared by all workers and refreshed by the resolver
/// thread (workers never call getaddrinfo).
#[derive(Debug, Clone, Default)]
pub struct ResolvedAddrs(std::sync::Arc<arc_swap::ArcSwap<Vec<SocketAddr>>>);

// === impl ResolvedAddrs ===

impl ResolvedAddrs {
    /// The current addresses (empty until the first successful resolution).
    pub fn get(&self) -> std::sync::Arc<Vec<SocketAddr>> {
        self.0.load_full()
    }

    /// Replaces the addresses.
    pub fn set(&self, addrs: Vec<SocketAddr>) {
        self.0.store(std::sync::Arc::new(addrs));
    }
}

/// The client identity we present upstream (docs/protocol.md#identity-headers).
#[derive(Debug, Clone)]
pub struct WireProfile {
    /// `originator` header.
    pub originator: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// `version` header (empty = not sent).
    pub version: String,
    /// `x-openai-internal-codex-residency` (empty = not sent).
    pub residency: String,
    /// `x-codex-beta-features` default when the client sends none (empty = not sent).
    pub beta_features: String,
}

impl Default for WireProfile {
    fn default() -> Self {
        Self {
            originator: "codex_cli_rs".to_owned(),
            user_agent:
                "codex_cli_rs/0.171.0 (Debian 12.0.0; x86_64) xterm (codex_cli_rs; 0.171.0)"
                    .to_owned(),
            version: "0.171.0".to_owned(),
            residency: String::new(),
            beta_features: String::new(),
        }
    }
}

/// The data plane's configuration (every worker reads the same one). Built by the assembly
/// (`codex_gateway::config::Config`); [`GatewayConfig::with_upstream`] gives the defaults.
#[derive(Clone)]
pub struct GatewayConfig {
    /// Worker threads.
    pub workers: usize,
    /// Bearer token for the data plane's `/metrics` (None: open).
    pub metrics_token: Option<Secret>,
    /// Upstream endpoint.
    pub upstream: UpstreamConfig,
    /// Wire profile.
    pub wire: WireProfile,
    /// Request body limit.
    pub max_body_bytes: usize,
    /// Drain budget on shutdown.
    pub shutdown_grace: Duration,
    /// Idle keep-alive budget for client connections (wait for a request's first byte).
    pub client_idle_timeout: Duration,
    /// A request head must be complete this long after its first byte (total, not per read).
    pub client_header_timeout: Duration,
    /// A request body must be complete this long after it was asked for...
    pub client_body_timeout: Duration,
    /// ...plus one second per this many bytes received (0: no extension).
    pub client_body_min_rate: u64,
    /// A response write making no progress for this long ends the response (slow reader).
    pub client_write_timeout: Duration,
    /// Most bytes of upstream events one response forwards; past it the response ends with
    /// an error and the account's slot is released (0: no cap).
    pub max_stream_output_bytes: u64,
    /// Most open client WebSocket sessions per client key in this process (0: no cap; default
    /// [`DEFAULT_MAX_WS_SESSIONS_PER_KEY`]); past it the upgrade is refused with 429
    /// (`gateway::limits::open_ws_session`).
    pub max_ws_sessions_per_key: u32,
    /// A client WebSocket with no turn and no frame (pings included) for this long is closed.
    pub ws_idle_timeout: Duration,
    /// How long an HTTP response can be continued by `previous_response_id`.
    pub transcript_ttl: Duration,
    /// Use the legacy (epoll) driver even where io_uring works
    /// (`MONOIO_FORCE_LEGACY_DRIVER=1` or `force_legacy_driver = true`).
    pub force_legacy_driver: bool,
    /// Reject models missing from the catalog even while only the embedded catalog is known
    /// (a catalog fetched from the upstream is always enforced).
    pub strict_models: bool,
    /// The public `https://host[:port]` origin the Codex CLI in ChatGPT mode reaches the
    /// gateway at (answered by `/backend-api/wham/accounts/check`); `None`: `https://` + the
    /// request's `Host` (`chatgpt_origin`, `CODEX_GATEWAY_CHATGPT_ORIGIN`).
    pub chatgpt_origin: Option<String>,
    /// Prices per model slug, for the cost of each request (`cost_micros`) and cost budgets.
    pub prices: shared_state::keys::PriceTable,
    /// Whether the access log is on (the sidecar writes it; a worker hands it the records of
    /// requests answered without a usage record only while it is).
    pub access_log: bool,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("workers", &self.workers)
            .field("metrics_token", &self.metrics_token)
            .field("upstream", &self.upstream)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("client_header_timeout", &self.client_header_timeout)
            .field("client_body_timeout", &self.client_body_timeout)
            .field("client_write_timeout", &self.client_write_timeout)
            .field("max_ws_sessions_per_key", &self.max_ws_sessions_per_key)
            .finish_non_exhaustive()
    }
}

// === impl GatewayConfig ===

impl GatewayConfig {
    /// Defaults for everything, with the given upstream base URL.
    pub fn with_upstream(base_url: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            metrics_token: None,
            upstream: UpstreamConfig::from_base_url(base_url)?,
            wire: WireProfile::default(),
            max_body_bytes: 16 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(30),
            client_idle_timeout: Duration::from_secs(75),
            client_header_timeout: Duration::from_secs(20),
            client_body_timeout: Duration::from_secs(60),
            client_body_min_rate: 64 * 1024,
            client_write_timeout: Duration::from_secs(30),
            max_stream_output_bytes: 256 << 20,
            max_ws_sessions_per_key: DEFAULT_MAX_WS_SESSIONS_PER_KEY,
            ws_idle_timeout: Duration::from_secs(900),
            transcript_ttl: Duration::from_secs(3600),
            force_legacy_driver: false,
            strict_models: false,
            chatgpt_origin: None,
            prices: shared_state::keys::PriceTable::default(),
            access_log: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_urls() {
        let u = UpstreamConfig::from_base_url("http://127.0.0.1:9000/backend-api/codex/").unwrap();
        assert!(!u.tls);
        assert_eq!(u.port, 9000);
        assert_eq!(u.path_prefix, "/backend-api/codex");
        assert_eq!(u.authority(), "127.0.0.1:9000");
        assert!(UpstreamConfig::from_base_url("ftp://x").is_err());
    }
}
