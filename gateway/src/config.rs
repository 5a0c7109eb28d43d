//! Configuration: command line and environment (clap), an optional TOML file, defaults.
//! Precedence: flag > environment > file > default. Parsed in two stages: raw optional fields
//! ([`ServeArgs`], [`FileConfig`]) are merged and validated into [`GatewayConfig`] with real types.
//!
//! # Key Components
//! - [`ServeArgs`]: `codex-gateway serve` flags, each also read from `CODEX_GATEWAY_*`.
//! - [`FileConfig`]: the TOML file (`deploy/config.example.toml` documents every key).
//! - [`GatewayConfig`]: validated runtime configuration; [`UpstreamConfig`] and [`WireProfile`]
//!   are the slices the upstream client needs.
//!
//! # Error handling
//! Every problem becomes one [`ConfigError`] with a message naming the key; the binary prints
//! it and exits with status 2.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    time::Duration,
};

use serde::Deserialize;
use shared_state::Secret;

/// Default upstream base URL.
pub const DEFAULT_UPSTREAM: &str = "https://chatgpt.com/backend-api/codex";
/// Open client WebSocket sessions per key and process unless configured: a safe default, so
/// one key cannot hold every descriptor with idle sockets (0 in the file: no cap).
pub const DEFAULT_MAX_WS_SESSIONS_PER_KEY: u32 = 512;
/// Default OAuth token endpoint.
pub const DEFAULT_TOKEN_URL: &str = "https://auth.openai.com/oauth/token";

/// `serve` flags (every one also from the environment).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "CODEX_GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data-plane listen address [default: 0.0.0.0:8080].
    #[arg(long, env = "CODEX_GATEWAY_LISTEN")]
    pub listen: Option<String>,
    /// Admin listen address [default: 127.0.0.1:8081].
    #[arg(long, env = "CODEX_GATEWAY_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Data directory (SQLite database, secret key) [default: ./data].
    #[arg(long, env = "CODEX_GATEWAY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Number of worker threads [default: one per core].
    #[arg(long, env = "CODEX_GATEWAY_WORKERS")]
    pub workers: Option<usize>,
    /// Database URL (postgres://... or sqlite://...) [default: SQLite in the data dir].
    #[arg(long, env = "CODEX_GATEWAY_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Redis URL (optional).
    #[arg(long, env = "CODEX_GATEWAY_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Upstream Codex base URL [default: https://chatgpt.com/backend-api/codex].
    #[arg(long, env = "CODEX_GATEWAY_UPSTREAM_BASE_URL")]
    pub upstream_base_url: Option<String>,
    /// Extra PEM CA bundle trusted for the upstream.
    #[arg(long, env = "CODEX_GATEWAY_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,
    /// OAuth token endpoint [default: https://auth.openai.com/oauth/token].
    #[arg(long, env = "CODEX_GATEWAY_OAUTH_TOKEN_URL")]
    pub oauth_token_url: Option<String>,
}

/// The TOML file. Every key is optional; see `deploy/config.example.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    listen: Option<String>,
    admin_listen: Option<String>,
    data_dir: Option<PathBuf>,
    auth_dir: Option<PathBuf>,
    workers: Option<usize>,
    database_url: Option<String>,
    redis_url: Option<String>,
    admin_token: Option<String>,
    metrics_token: Option<String>,
    chatgpt_origin: Option<String>,
    shutdown_grace_secs: Option<u64>,
    ws_idle_timeout_secs: Option<u64>,
    transcript_cache_bytes: Option<usize>,
    transcript_ttl_secs: Option<u64>,
    max_attempts: Option<u32>,
    max_body_bytes: Option<usize>,
    force_legacy_driver: Option<bool>,
    client_idle_timeout_secs: Option<u64>,
    client_header_timeout_secs: Option<u64>,
    client_body_timeout_secs: Option<u64>,
    client_body_min_rate: Option<u64>,
    client_write_timeout_secs: Option<u64>,
    max_stream_output_bytes: Option<u64>,
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    max_ws_sessions_per_key: Option<u32>,
    #[serde(default)]
    upstream: FileUpstream,
    #[serde(default)]
    wire: FileWire,
    #[serde(default)]
    models: FileModels,
    #[serde(default)]
    pool: FilePool,
    #[serde(default)]
    front_door: FileFrontDoor,
    /// USD per 1M tokens by model slug (`default` prices every other model).
    #[serde(default)]
    prices: std::collections::HashMap<String, FilePrice>,
    #[serde(default)]
    usage: FileUsage,
    #[serde(default)]
    access_log: FileAccessLog,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePrice {
    input: f64,
    #[serde(default)]
    cached_input: Option<f64>,
    output: f64,
}

/// `[usage]`: the durable usage spool and retention.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUsage {
    spool_max_bytes: Option<u64>,
    retention_days: Option<u32>,
    rollup_retention_days: Option<u32>,
}

/// `[access_log]`: one JSON line per request (`path`: a file or `-` for stdout; absent: off).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAccessLog {
    path: Option<PathBuf>,
    max_bytes: Option<u64>,
    keep: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePool {
    strategy: Option<String>,
    pause_threshold_pct: Option<f64>,
    default_max_concurrency: Option<u32>,
    min_request_interval_ms: Option<u64>,
    max_wait_for_account_ms: Option<u64>,
    service_tier: Option<String>,
}

/// `[front_door]`: the defaults of the front-door settings (`crate::front_door`; the admin
/// API overrides them at runtime).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFrontDoor {
    rps: Option<u32>,
    burst: Option<u32>,
    per_ip_rps: Option<u32>,
    per_ip_burst: Option<u32>,
    ip_allow_list: Option<FileIpList>,
}

/// An allow-list in the file: one string (entries separated by commas or spaces) or an
/// array of entries.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum FileIpList {
    Text(String),
    List(Vec<String>),
}

/// Largest front-door rate or burst (the admin API's bound too:
/// `admin::settings::MAX_FRONT_DOOR_RATE`).
const MAX_FRONT_DOOR_RATE: u32 = 10_000_000;
/// Longest wait for a cooling account, ms (the admin API's bound too:
/// `admin::settings::MAX_WAIT_FOR_ACCOUNT_MS`).
const MAX_WAIT_FOR_ACCOUNT_MS: u64 = 60_000;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModels {
    strict: Option<bool>,
    #[serde(default)]
    aliases: std::collections::HashMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUpstream {
    base_url: Option<String>,
    ca_file: Option<PathBuf>,
    oauth_token_url: Option<String>,
    plain_http: Option<String>,
    connect_timeout_ms: Option<u64>,
    first_byte_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    h2_max_streams_per_connection: Option<usize>,
    h2_max_connections: Option<usize>,
    websockets: Option<bool>,
    ws_connect_timeout_ms: Option<u64>,
    ws_ping_interval_secs: Option<u64>,
    ws_pong_timeout_ms: Option<u64>,
    h1_max_idle: Option<usize>,
    h1_idle_timeout_secs: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWire {
    originator: Option<String>,
    user_agent: Option<String>,
    version: Option<String>,
    residency: Option<String>,
    beta_features: Option<String>,
}

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

/// Validated configuration of a gateway process. Its `Debug` redacts the credentials that
/// database and Redis URLs may carry (tokens are [`Secret`]s).
#[derive(Clone)]
pub struct GatewayConfig {
    /// Data-plane listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin_listen: SocketAddr,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Watched auth directory (`auth_dir`): `auth.json` files dropped in are imported, removed
    /// ones disabled (`None`: off; admin's `auth_dir` module).
    pub auth_dir: Option<PathBuf>,
    /// Worker threads.
    pub workers: usize,
    /// Database URL (None = SQLite in the data dir).
    pub database_url: Option<String>,
    /// Redis URL.
    pub redis_url: Option<String>,
    /// Static bearer token for the admin API (besides sessions and stored admin tokens).
    pub admin_token: Option<Secret>,
    /// Admin password (`CODEX_GATEWAY_ADMIN_PASSWORD`; stored as an Argon2id hash at start).
    pub admin_password: Option<Secret>,
    /// Extra `Host` names the admin listener answers to besides loopback names and its own IP,
    /// e.g. behind a reverse proxy (`CODEX_GATEWAY_ADMIN_ALLOWED_HOSTS`, comma-separated).
    pub admin_allowed_hosts: Vec<String>,
    /// Bearer token for the data plane's `/metrics` (None: open).
    pub metrics_token: Option<Secret>,
    /// OAuth token endpoint.
    pub oauth_token_url: String,
    /// Upstream base URL as configured.
    pub upstream_base_url: String,
    /// Upstream endpoint.
    pub upstream: UpstreamConfig,
    /// Wire profile.
    pub wire: WireProfile,
    /// Request body limit.
    pub max_body_bytes: usize,
    /// Most accounts tried for one request.
    pub max_attempts: u32,
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
    /// Most open client connections of the process; past it: 503. 0 (the default): automatic,
    /// below the open-file limit with a reserve for upstream connections, storage and the
    /// admin listener (`codex_gateway::app::auto_max_connections`).
    pub max_connections: usize,
    /// Most open client connections per client IP (0: no cap); past it: 429.
    pub max_connections_per_ip: usize,
    /// Most open client WebSocket sessions per client key in this process (0: no cap; default
    /// [`DEFAULT_MAX_WS_SESSIONS_PER_KEY`]); past it the upgrade is refused with 429
    /// (`gateway::limits::open_ws_session`).
    pub max_ws_sessions_per_key: u32,
    /// A client WebSocket with no turn and no frame (pings included) for this long is closed.
    pub ws_idle_timeout: Duration,
    /// Memory for HTTP response transcripts (`previous_response_id` over HTTP), bytes.
    pub transcript_cache_bytes: usize,
    /// How long an HTTP response can be continued by `previous_response_id`.
    pub transcript_ttl: Duration,
    /// Pin workers to cores.
    pub pin_workers: bool,
    /// Use the legacy (epoll) driver even where io_uring works
    /// (`MONOIO_FORCE_LEGACY_DRIVER=1` or `force_legacy_driver = true`).
    pub force_legacy_driver: bool,
    /// Scheduling settings (defaults; the admin API can override them at runtime).
    pub pool: shared_state::Settings,
    /// Client-facing model aliases (`alias -> slug[@effort]`).
    pub model_aliases: std::collections::HashMap<String, shared_state::catalog::ModelAlias>,
    /// Reject models missing from the catalog even while only the embedded catalog is known
    /// (a catalog fetched from the upstream is always enforced).
    pub strict_models: bool,
    /// The public `https://host[:port]` origin the Codex CLI in ChatGPT mode reaches the
    /// gateway at (answered by `/backend-api/wham/accounts/check`); `None`: `https://` + the
    /// request's `Host` (`chatgpt_origin`, `CODEX_GATEWAY_CHATGPT_ORIGIN`).
    pub chatgpt_origin: Option<String>,
    /// The clock of the quota forecast's sampling in the sidecar (the system clock; tests
    /// inject simulated time).
    pub forecast_clock: shared_state::forecast::Clock,
    /// The sidecar's periodic storage reload (the fallback of fleet invalidations; not a
    /// file key).
    pub reload_interval: Duration,
    /// Time to live of a Redis refresh lease, renewed while the refresh runs (not a file
    /// key).
    pub refresh_lease_ttl: Duration,
    /// Prices per model slug, for the cost of each request (`cost_micros`) and cost budgets.
    pub prices: shared_state::keys::PriceTable,
    /// Usage records: the durable spool's bound and retention (`[usage]`).
    pub usage: shared_state::config::UsageConfig,
    /// The access log (`[access_log]`), written by the sidecar.
    pub access_log: shared_state::config::AccessLogConfig,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |u: &Option<String>| u.as_deref().map(shared_state::secret::redact_url);
        f.debug_struct("GatewayConfig")
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("data_dir", &self.data_dir)
            .field("workers", &self.workers)
            .field("database_url", &redact(&self.database_url))
            .field("redis_url", &redact(&self.redis_url))
            .field("admin_token", &self.admin_token)
            .field("metrics_token", &self.metrics_token)
            .field("upstream_base_url", &self.upstream_base_url)
            .field("upstream", &self.upstream)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("client_header_timeout", &self.client_header_timeout)
            .field("client_body_timeout", &self.client_body_timeout)
            .field("client_write_timeout", &self.client_write_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .field("max_ws_sessions_per_key", &self.max_ws_sessions_per_key)
            .finish_non_exhaustive()
    }
}

/// A `chatgpt_origin`: `https://host[:port]`, nothing after it (the Codex CLI accepts only
/// an https origin without a path).
fn check_origin(o: &str) -> Result<String, ConfigError> {
    let o = o.trim_end_matches('/');
    let ok = o.strip_prefix("https://").is_some_and(|rest| {
        !rest.is_empty()
            && !rest.contains(['/', '?', '#', '@'])
            && !rest.chars().any(|c| c.is_whitespace() || c.is_control())
    });
    if ok {
        Ok(o.to_owned())
    } else {
        Err(ConfigError(format!(
            "`chatgpt_origin` = `{o}` must be an https origin such as https://gateway.example:8443 (no path)"
        )))
    }
}

fn addr(key: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.to_socket_addrs()
        .map_err(|e| ConfigError(format!("`{key}` = `{s}` is not a valid address: {e}")))?
        .next()
        .ok_or_else(|| ConfigError(format!("`{key}` = `{s}` resolved to nothing")))
}

// === impl GatewayConfig ===

impl GatewayConfig {
    /// Defaults for everything, with the given upstream base URL.
    pub fn with_upstream(base_url: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            listen: addr("listen", "0.0.0.0:8080")?,
            admin_listen: addr("admin_listen", "127.0.0.1:8081")?,
            data_dir: PathBuf::from("./data"),
            auth_dir: None,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            database_url: None,
            redis_url: None,
            admin_token: None,
            admin_password: None,
            admin_allowed_hosts: Vec::new(),
            metrics_token: None,
            oauth_token_url: DEFAULT_TOKEN_URL.to_owned(),
            upstream_base_url: base_url.to_owned(),
            upstream: UpstreamConfig::from_base_url(base_url)?,
            wire: WireProfile::default(),
            max_body_bytes: 16 * 1024 * 1024,
            max_attempts: 3,
            shutdown_grace: Duration::from_secs(30),
            client_idle_timeout: Duration::from_secs(75),
            client_header_timeout: Duration::from_secs(20),
            client_body_timeout: Duration::from_secs(60),
            client_body_min_rate: 64 * 1024,
            client_write_timeout: Duration::from_secs(30),
            max_stream_output_bytes: 256 << 20,
            max_connections: 0,
            max_connections_per_ip: 0,
            max_ws_sessions_per_key: DEFAULT_MAX_WS_SESSIONS_PER_KEY,
            ws_idle_timeout: Duration::from_secs(900),
            transcript_cache_bytes: 256 << 20,
            transcript_ttl: Duration::from_secs(3600),
            pin_workers: true,
            pool: shared_state::Settings::default(),
            model_aliases: Default::default(),
            strict_models: false,
            chatgpt_origin: None,
            forecast_clock: shared_state::forecast::Clock::system(),
            reload_interval: shared_state::config::DEFAULT_RELOAD_INTERVAL,
            refresh_lease_ttl: shared_state::config::REFRESH_LEASE_TTL,
            prices: shared_state::keys::PriceTable::default(),
            usage: shared_state::config::UsageConfig::default(),
            access_log: shared_state::config::AccessLogConfig::default(),
            force_legacy_driver: std::env::var_os("MONOIO_FORCE_LEGACY_DRIVER")
                .is_some_and(|v| !v.is_empty() && v != "0"),
        })
    }

    /// Merges flags/env over the file over defaults, and validates.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    ConfigError(format!("cannot read config file {}: {e}", p.display()))
                })?;
                toml::from_str::<FileConfig>(&text)
                    .map_err(|e| ConfigError(format!("{}: {e}", p.display())))?
            }
            None => FileConfig::default(),
        };
        let base = args
            .upstream_base_url
            .clone()
            .or(file.upstream.base_url.clone())
            .unwrap_or_else(|| DEFAULT_UPSTREAM.to_owned());
        let mut c = Self::with_upstream(&base)?;
        if let Some(l) = args.listen.as_ref().or(file.listen.as_ref()) {
            c.listen = addr("listen", l)?;
        }
        if let Some(l) = args.admin_listen.as_ref().or(file.admin_listen.as_ref()) {
            c.admin_listen = addr("admin_listen", l)?;
        }
        if let Some(d) = args.data_dir.clone().or(file.data_dir.clone()) {
            c.data_dir = d;
        }
        c.auth_dir = file.auth_dir.clone();
        if let Some(w) = args.workers.or(file.workers) {
            if w == 0 || w > 1024 {
                return Err(ConfigError(format!(
                    "`workers` = {w} must be between 1 and 1024"
                )));
            }
            c.workers = w;
        }
        c.database_url = args.database_url.clone().or(file.database_url.clone());
        if let Some(u) = &c.database_url {
            if !(u.starts_with("postgres://")
                || u.starts_with("postgresql://")
                || u.starts_with("sqlite:"))
            {
                return Err(ConfigError(format!(
                    "`database_url` must start with postgres://, postgresql:// or sqlite: (got `{}`)",
                    shared_state::secret::redact_url(u)
                )));
            }
        }
        c.redis_url = args.redis_url.clone().or(file.redis_url.clone());
        if let Some(u) = &c.redis_url {
            if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                return Err(ConfigError(format!(
                    "`redis_url` must start with redis:// or rediss:// (got `{}`)",
                    shared_state::secret::redact_url(u)
                )));
            }
        }
        c.admin_token = std::env::var("CODEX_GATEWAY_ADMIN_TOKEN")
            .ok()
            .or(file.admin_token.clone())
            .filter(|t| !t.is_empty())
            .map(Secret::from);
        c.admin_password = std::env::var("CODEX_GATEWAY_ADMIN_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty())
            .map(Secret::from);
        c.admin_allowed_hosts = std::env::var("CODEX_GATEWAY_ADMIN_ALLOWED_HOSTS")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        c.metrics_token = std::env::var("CODEX_GATEWAY_METRICS_TOKEN")
            .ok()
            .or(file.metrics_token.clone())
            .filter(|t| !t.is_empty())
            .map(Secret::from);
        if let Some(o) = std::env::var("CODEX_GATEWAY_CHATGPT_ORIGIN")
            .ok()
            .or(file.chatgpt_origin.clone())
            .filter(|o| !o.is_empty())
        {
            c.chatgpt_origin = Some(check_origin(&o)?);
        }
        c.oauth_token_url = args
            .oauth_token_url
            .clone()
            .or(file.upstream.oauth_token_url.clone())
            .unwrap_or(c.oauth_token_url);
        c.upstream.ca_file = args.upstream_ca.clone().or(file.upstream.ca_file.clone());
        if let Some(ca) = &c.upstream.ca_file {
            if !ca.is_file() {
                return Err(ConfigError(format!(
                    "`upstream_ca` file {} does not exist",
                    ca.display()
                )));
            }
        }
        if let Some(p) = &file.upstream.plain_http {
            c.upstream.plain_http = match p.as_str() {
                "h1" | "http1" => PlainHttp::H1,
                "h2c" | "h2" => PlainHttp::H2c,
                _ => {
                    return Err(ConfigError(format!(
                        "`upstream.plain_http` must be \"h1\" or \"h2c\" (got `{p}`)"
                    )))
                }
            };
        }
        if let Ok(p) = std::env::var("CODEX_GATEWAY_UPSTREAM_PLAIN_HTTP") {
            c.upstream.plain_http = if p == "h2c" {
                PlainHttp::H2c
            } else {
                PlainHttp::H1
            };
        }
        if let Some(v) = file.usage.spool_max_bytes {
            if v < 64 * 1024 {
                return Err(ConfigError(format!(
                    "`usage.spool_max_bytes` = {v} must be at least 65536"
                )));
            }
            c.usage.spool_max_bytes = v;
        }
        if let Some(v) = file.usage.retention_days {
            c.usage.retention_days = v;
        }
        if let Some(v) = file.usage.rollup_retention_days {
            c.usage.rollup_retention_days = v;
        }
        c.access_log.path = file.access_log.path.filter(|p| !p.as_os_str().is_empty());
        if let Some(v) = file.access_log.max_bytes {
            if v < 4096 {
                return Err(ConfigError(format!(
                    "`access_log.max_bytes` = {v} must be at least 4096"
                )));
            }
            c.access_log.max_bytes = v;
        }
        if let Some(v) = file.access_log.keep {
            c.access_log.keep = v;
        }
        let ms = Duration::from_millis;
        if let Some(v) = file.upstream.connect_timeout_ms {
            c.upstream.connect_timeout = ms(v);
        }
        if let Some(v) = file.upstream.first_byte_timeout_ms {
            c.upstream.first_byte_timeout = ms(v);
        }
        if let Some(v) = file.upstream.idle_timeout_ms {
            c.upstream.idle_timeout = ms(v);
        }
        if let Some(v) = file.upstream.h2_max_streams_per_connection {
            if v == 0 {
                return Err(ConfigError(
                    "`upstream.h2_max_streams_per_connection` must be at least 1".into(),
                ));
            }
            c.upstream.h2_max_streams_per_connection = v;
        }
        if let Some(v) = file.upstream.websockets {
            c.upstream.websockets = v;
        }
        if let Some(v) = file.upstream.ws_connect_timeout_ms {
            c.upstream.ws_connect_timeout = ms(v.max(1));
        }
        if let Some(v) = file.upstream.ws_ping_interval_secs {
            c.upstream.ws_ping_interval = Duration::from_secs(v.max(1));
        }
        if let Some(v) = file.upstream.ws_pong_timeout_ms {
            c.upstream.ws_pong_timeout = ms(v.max(1));
        }
        if let Some(v) = file.upstream.h1_max_idle {
            c.upstream.h1_max_idle = v;
        }
        if let Some(v) = file.upstream.h1_idle_timeout_secs {
            c.upstream.h1_idle_timeout = Duration::from_secs(v.max(1));
        }
        if let Some(v) = file.upstream.h2_max_connections {
            if v == 0 {
                return Err(ConfigError(
                    "`upstream.h2_max_connections` must be at least 1".into(),
                ));
            }
            c.upstream.h2_max_connections = v;
        }
        if let Some(v) = file.transcript_cache_bytes {
            c.transcript_cache_bytes = v;
        }
        if let Some(v) = file.transcript_ttl_secs {
            c.transcript_ttl = Duration::from_secs(v);
        }
        if let Some(v) = file.ws_idle_timeout_secs {
            c.ws_idle_timeout = Duration::from_secs(v.max(1));
        }
        if let Some(v) = file.shutdown_grace_secs {
            c.shutdown_grace = Duration::from_secs(v);
        }
        if let Some(v) = file.max_attempts {
            if v == 0 {
                return Err(ConfigError("`max_attempts` must be at least 1".into()));
            }
            c.max_attempts = v;
        }
        if let Some(v) = file.force_legacy_driver {
            c.force_legacy_driver |= v;
        }
        if let Some(v) = file.max_body_bytes {
            c.max_body_bytes = v;
        }
        let secs = |key: &str, v: u64| {
            if v == 0 {
                Err(ConfigError(format!("`{key}` must be at least 1")))
            } else {
                Ok(Duration::from_secs(v))
            }
        };
        if let Some(v) = file.client_idle_timeout_secs {
            c.client_idle_timeout = secs("client_idle_timeout_secs", v)?;
        }
        if let Some(v) = file.client_header_timeout_secs {
            c.client_header_timeout = secs("client_header_timeout_secs", v)?;
        }
        if let Some(v) = file.client_body_timeout_secs {
            c.client_body_timeout = secs("client_body_timeout_secs", v)?;
        }
        if let Some(v) = file.client_body_min_rate {
            c.client_body_min_rate = v;
        }
        if let Some(v) = file.client_write_timeout_secs {
            c.client_write_timeout = secs("client_write_timeout_secs", v)?;
        }
        if let Some(v) = file.max_stream_output_bytes {
            c.max_stream_output_bytes = v;
        }
        if let Some(v) = file.max_connections {
            c.max_connections = v;
        }
        if let Some(v) = file.max_connections_per_ip {
            c.max_connections_per_ip = v;
        }
        if let Some(v) = file.max_ws_sessions_per_key {
            c.max_ws_sessions_per_key = v;
        }
        if let Some(st) = &file.pool.strategy {
            c.pool.strategy = st.parse().map_err(|_| {
                ConfigError(format!(
                    "`pool.strategy` = `{st}` must be one of smart, round_robin, fill_first, sticky, quota_reset_priority"
                ))
            })?;
        }
        if let Some(p) = file.pool.pause_threshold_pct {
            if !(0.0..=100.0).contains(&p) {
                return Err(ConfigError(format!(
                    "`pool.pause_threshold_pct` = {p} must be within 0..=100"
                )));
            }
            c.pool.pause_threshold_pct = Some(p);
        }
        if let Some(v) = file.pool.default_max_concurrency {
            c.pool.default_max_concurrency = v;
        }
        if let Some(v) = file.pool.min_request_interval_ms {
            c.pool.min_request_interval_ms = v;
        }
        if let Some(v) = file.pool.max_wait_for_account_ms {
            if v > MAX_WAIT_FOR_ACCOUNT_MS {
                return Err(ConfigError(format!(
                    "`pool.max_wait_for_account_ms` = {v} must be at most {MAX_WAIT_FOR_ACCOUNT_MS}"
                )));
            }
            c.pool.max_wait_for_account_ms = v;
        }
        if let Some(v) = &file.pool.service_tier {
            c.pool.service_tier = v
                .parse()
                .map_err(|e| ConfigError(format!("`pool.service_tier`: {e}")))?;
        }
        let fd = &file.front_door;
        for (key, v, slot) in [
            ("rps", fd.rps, &mut c.pool.front_door_rps),
            ("burst", fd.burst, &mut c.pool.front_door_burst),
            ("per_ip_rps", fd.per_ip_rps, &mut c.pool.per_ip_rps),
            ("per_ip_burst", fd.per_ip_burst, &mut c.pool.per_ip_burst),
        ] {
            if let Some(v) = v {
                if v > MAX_FRONT_DOOR_RATE {
                    return Err(ConfigError(format!(
                        "`front_door.{key}` = {v} must be at most {MAX_FRONT_DOOR_RATE}"
                    )));
                }
                *slot = v;
            }
        }
        if let Some(l) = &fd.ip_allow_list {
            let text = match l {
                FileIpList::Text(t) => t.clone(),
                FileIpList::List(v) => v.join(","),
            };
            c.pool.ip_allow_list = text
                .parse()
                .map_err(|e| ConfigError(format!("`front_door.ip_allow_list`: {e}")))?;
        }
        if let Some(v) = file.models.strict {
            c.strict_models = v;
        }
        for (alias, target) in &file.models.aliases {
            if target.is_empty() {
                return Err(ConfigError(format!(
                    "model alias `{alias}` has an empty target"
                )));
            }
            c.model_aliases
                .insert(alias.clone(), shared_state::catalog::parse_alias(target));
        }
        for (model, p) in &file.prices {
            let price = shared_state::keys::Price {
                input: p.input,
                cached_input: p.cached_input.unwrap_or(p.input),
                output: p.output,
            };
            if [price.input, price.cached_input, price.output]
                .iter()
                .any(|v| !v.is_finite() || *v < 0.0)
            {
                return Err(ConfigError(format!(
                    "`prices.\"{model}\"`: prices must be finite and >= 0 (USD per 1M tokens)"
                )));
            }
            if model == "default" {
                c.prices.default = price;
            } else {
                c.prices.models.insert(model.clone(), price);
            }
        }
        let w = &file.wire;
        if let Some(v) = &w.originator {
            c.wire.originator = v.clone();
        }
        if let Some(v) = &w.user_agent {
            c.wire.user_agent = v.clone();
        }
        if let Some(v) = &w.version {
            c.wire.version = v.clone();
        }
        if let Some(v) = &w.residency {
            c.wire.residency = v.clone();
        }
        if let Some(v) = &w.beta_features {
            c.wire.beta_features = v.clone();
        }
        for (name, v) in [
            ("originator", &c.wire.originator),
            ("user_agent", &c.wire.user_agent),
            ("version", &c.wire.version),
            ("residency", &c.wire.residency),
            ("beta_features", &c.wire.beta_features),
        ] {
            if http::HeaderValue::from_str(v).is_err() {
                return Err(ConfigError(format!(
                    "wire.{name} is not a valid HTTP header value (printable ASCII only)"
                )));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_override_the_defaults_and_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&p, text).unwrap();
            GatewayConfig::load(&ServeArgs {
                config: Some(p.clone()),
                ..Default::default()
            })
        };
        let c = load(
            "[prices.\"gpt-5.5\"]\ninput = 2.0\noutput = 8.0\n[prices.default]\ninput = 1.0\ncached_input = 0.5\noutput = 3.0\n",
        )
        .unwrap();
        let p55 = c.prices.price("gpt-5.5");
        assert_eq!((p55.input, p55.cached_input, p55.output), (2.0, 2.0, 8.0));
        assert_eq!(c.prices.price("no-such-model").output, 3.0);
        assert_eq!(c.prices.cost_micros("gpt-5.5", 10, 0, 1), 28);
        // untouched defaults stay
        assert_eq!(c.prices.price("gpt-5-mini").output, 2.0);
        assert!(load("[prices.x]\ninput = -1.0\noutput = 1.0\n").is_err());
        assert!(
            load("[prices.x]\ninput = 1.0\n").is_err(),
            "output is required"
        );
    }

    #[test]
    fn access_log_keys_parse_and_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&p, text).unwrap();
            GatewayConfig::load(&ServeArgs {
                config: Some(p.clone()),
                ..Default::default()
            })
        };
        let c = load("").unwrap();
        assert_eq!(c.access_log.path, None, "off by default");
        let c = load("[access_log]\npath = \"-\"\nmax_bytes = 8192\nkeep = 2\n").unwrap();
        assert!(c.access_log.is_stdout());
        assert_eq!((c.access_log.max_bytes, c.access_log.keep), (8192, 2));
        let c = load("[access_log]\npath = \"/var/log/a.log\"\n").unwrap();
        assert_eq!(c.access_log.path, Some(PathBuf::from("/var/log/a.log")));
        assert_eq!(c.access_log.keep, 5);
        assert!(load("[access_log]\npath = \"-\"\nmax_bytes = 10\n").is_err());
        assert!(load("[access_log]\nbogus = 1\n").is_err());
    }

    #[test]
    fn pool_and_front_door_settings_come_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&p, text).unwrap();
            GatewayConfig::load(&ServeArgs {
                config: Some(p.clone()),
                ..Default::default()
            })
        };
        let c = load("").unwrap();
        assert_eq!(c.pool, shared_state::Settings::default());
        let c = load(
            "[pool]\nmax_wait_for_account_ms = 0\nservice_tier = \"refuse\"\n\
             [front_door]\nrps = 200\nburst = 400\nper_ip_rps = 5\nper_ip_burst = 10\n\
             ip_allow_list = \"10.0.0.0/8, ::1\"\n",
        )
        .unwrap();
        assert_eq!(c.pool.max_wait_for_account_ms, 0);
        assert_eq!(
            c.pool.service_tier,
            shared_state::snapshot::ServiceTierPolicy::Refuse
        );
        assert_eq!(
            (
                c.pool.front_door_rps,
                c.pool.front_door_burst,
                c.pool.per_ip_rps,
                c.pool.per_ip_burst
            ),
            (200, 400, 5, 10)
        );
        assert!(c.pool.ip_allow_list.allows("10.1.1.1".parse().unwrap()));
        assert!(c.pool.ip_allow_list.allows("::1".parse().unwrap()));
        assert!(!c.pool.ip_allow_list.allows("11.1.1.1".parse().unwrap()));
        let c =
            load("[front_door]\nip_allow_list = [\"192.0.2.0/24\", \"2001:db8::/32\"]\n").unwrap();
        assert_eq!(
            c.pool.ip_allow_list.to_string(),
            "192.0.2.0/24, 2001:db8::/32"
        );
        for (bad, key) in [
            (
                "[front_door]\nip_allow_list = \"10.0.0.0/8 nope\"\n",
                "nope",
            ),
            ("[front_door]\nrps = 10000001\n", "front_door.rps"),
            ("[front_door]\nper_ip_rps = -1\n", "per_ip_rps"),
            ("[front_door]\nbogus = 1\n", "bogus"),
            ("[pool]\nservice_tier = \"fast\"\n", "service_tier"),
            (
                "[pool]\nmax_wait_for_account_ms = 60001\n",
                "max_wait_for_account_ms",
            ),
        ] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn the_example_config_parses() {
        let p = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/config.example.toml"
        ));
        let c = GatewayConfig::load(&ServeArgs {
            config: Some(p),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.upstream.host, "chatgpt.com");
        assert_eq!(c.max_body_bytes, 16 * 1024 * 1024);
    }

    #[test]
    fn parses_upstream_urls() {
        let u = UpstreamConfig::from_base_url("http://127.0.0.1:9000/backend-api/codex/").unwrap();
        assert!(!u.tls);
        assert_eq!(u.port, 9000);
        assert_eq!(u.path_prefix, "/backend-api/codex");
        assert_eq!(u.authority(), "127.0.0.1:9000");
        assert!(UpstreamConfig::from_base_url("ftp://x").is_err());
    }

    #[test]
    fn file_and_flags_merge_with_flags_winning() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "listen = \"127.0.0.1:1\"\nworkers = 3\n[upstream]\nbase_url = \"http://127.0.0.1:2/x\"\nplain_http = \"h2c\"\n[wire]\noriginator = \"codex-tui\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(p.clone()),
            listen: Some("127.0.0.1:5".into()),
            ..Default::default()
        };
        let c = GatewayConfig::load(&args).unwrap();
        assert_eq!(c.listen.port(), 5);
        assert_eq!(c.workers, 3);
        assert_eq!(c.upstream.plain_http, PlainHttp::H2c);
        assert_eq!(c.wire.originator, "codex-tui");
        // A URL in an error never shows its password.
        std::fs::write(
            &p,
            "database_url = \"mysql://u:hunter2@db/x?password=hunter2\"\n",
        )
        .unwrap();
        let e = GatewayConfig::load(&args).unwrap_err().to_string();
        assert!(e.contains("database_url") && !e.contains("hunter2"), "{e}");
        std::fs::write(&p, "redis_url = \"http://:hunter2@r:1\"\n").unwrap();
        let e = GatewayConfig::load(&args).unwrap_err().to_string();
        assert!(e.contains("redis_url") && !e.contains("hunter2"), "{e}");
        // Nor does the configuration's Debug.
        let mut c = GatewayConfig::with_upstream("http://127.0.0.1:1/x").unwrap();
        c.database_url = Some("postgres://u:hunter2@db/x?password=hunter2".into());
        c.redis_url = Some("redis://:hunter2@r:1".into());
        c.admin_token = Some(Secret::new("hunter2"));
        let d = format!("{c:?}");
        assert!(
            d.contains("postgres://***@db/x") && !d.contains("hunter2"),
            "{d}"
        );
        std::fs::write(&p, "bogus_key = 1\n").unwrap();
        let e = GatewayConfig::load(&args).unwrap_err();
        assert!(e.to_string().contains("bogus_key"), "{e}");
    }

    #[test]
    fn a_wire_value_that_cannot_be_a_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[upstream]\nbase_url = \"http://127.0.0.1:2/x\"\n[wire]\nuser_agent = \"codex\\r\\nx-injected: 1\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(p),
            ..Default::default()
        };
        let e = GatewayConfig::load(&args).unwrap_err().to_string();
        assert!(e.contains("wire.user_agent"), "{e}");
    }
}
