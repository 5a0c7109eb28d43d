//! The process configuration, owned by the assembly: command line and environment (clap), an
//! optional TOML file, defaults. Precedence: flag > environment > file > default. Parsed in
//! two stages: raw optional fields ([`ServeArgs`], the file) are merged and validated into
//! [`Config`], which holds each component's own slice: the data plane's
//! ([`gateway::config::GatewayConfig`], every worker reads it), the sidecar's
//! ([`admin::SidecarConfig`]) and the process's own (listener, connection caps).
//!
//! # Key Components
//! - [`ServeArgs`]: `codex-gateway serve` flags, each also read from the environment (no
//!   environment variable is read anywhere else).
//! - [`Config`]: the validated slices; [`Config::load`] merges and validates,
//!   [`Config::with_upstream`] gives the defaults (the tests and `demo` start there).
//! - The file's keys: `deploy/config.example.toml` documents every one.
//!
//! # Error handling
//! Every problem becomes one [`ConfigError`] with a message naming the key; the binary prints
//! it and exits with status 2. A URL in a message never shows its password.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    time::Duration,
};

use admin::{DbTarget, SidecarConfig};
use gateway::config::{ConfigError, GatewayConfig, PlainHttp, DEFAULT_UPSTREAM};
use serde::Deserialize;
use shared_state::Secret;

/// `serve` flags (every one also from the environment; a flag wins over the environment,
/// which wins over the file).
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
    /// A static admin API bearer token (prefer the environment: a flag shows in `ps`).
    #[arg(long, env = "CODEX_GATEWAY_ADMIN_TOKEN", hide_env_values = true, value_parser = secret)]
    pub admin_token: Option<Secret>,
    /// The admin password, stored (hashed) at start (prefer the environment).
    #[arg(long, env = "CODEX_GATEWAY_ADMIN_PASSWORD", hide_env_values = true, value_parser = secret)]
    pub admin_password: Option<Secret>,
    /// Extra `Host` names the admin listener answers to (comma-separated), e.g. behind a
    /// reverse proxy.
    #[arg(long, env = "CODEX_GATEWAY_ADMIN_ALLOWED_HOSTS", value_delimiter = ',')]
    pub admin_allowed_hosts: Vec<String>,
    /// Bearer token for the data plane's `/metrics` [default: open] (prefer the environment).
    #[arg(long, env = "CODEX_GATEWAY_METRICS_TOKEN", hide_env_values = true, value_parser = secret)]
    pub metrics_token: Option<Secret>,
    /// The public https origin the Codex CLI in ChatGPT mode reaches the gateway at.
    #[arg(long, env = "CODEX_GATEWAY_CHATGPT_ORIGIN")]
    pub chatgpt_origin: Option<String>,
    /// A plain-HTTP upstream's protocol: h1 or h2c [default: h1].
    #[arg(long, env = "CODEX_GATEWAY_UPSTREAM_PLAIN_HTTP")]
    pub upstream_plain_http: Option<String>,
    /// Use the legacy (epoll) driver even where io_uring works.
    /// From the environment, any value but an empty one, `0`, `false`, `no` or `off` is on.
    #[arg(
        long,
        env = "MONOIO_FORCE_LEGACY_DRIVER",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub force_legacy_driver: bool,
}

/// A secret from a flag or the environment (its `Debug` shows no value).
fn secret(s: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::from(s.to_owned()))
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

/// The validated configuration of a gateway process, in the slices its components take. Its
/// `Debug` redacts the credentials that database and Redis URLs may carry (tokens are
/// [`Secret`]s).
#[derive(Clone)]
pub struct Config {
    /// Data-plane listen address.
    pub listen: SocketAddr,
    /// Pin workers to cores.
    pub pin_workers: bool,
    /// Most open client connections of the process; past it: 503. 0 (the default): automatic,
    /// below the open-file limit with a reserve for upstream connections, storage and the
    /// admin listener ([`crate::app::auto_max_connections`]).
    pub max_connections: usize,
    /// Most open client connections per client IP (0: no cap); past it: 429.
    pub max_connections_per_ip: usize,
    /// Memory for HTTP response transcripts (`previous_response_id` over HTTP), bytes; the
    /// workers share one store.
    pub transcript_cache_bytes: usize,
    /// The data plane's slice: every worker reads it.
    pub gateway: GatewayConfig,
    /// The sidecar's slice: storage, Redis, the admin listener and its credentials, the
    /// watched auth directory, OAuth, settings defaults, model aliases, usage and access log.
    /// What it shares with the data plane (the upstream, the client identity presented to
    /// it) is the data plane's, given to it at spawn ([`Config::sidecar_slice`]).
    pub sidecar: SidecarConfig,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |u: &Option<String>| u.as_deref().map(shared_state::secret::redact_url);
        let s = &self.sidecar;
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("admin_listen", &s.admin_listen)
            .field("data_dir", &s.db.data_dir)
            .field("database_url", &redact(&s.db.database_url))
            .field("redis_url", &redact(&s.redis_url))
            .field("admin_token", &s.admin_token)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .field("gateway", &self.gateway)
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

fn plain_http(key: &str, p: &str) -> Result<PlainHttp, ConfigError> {
    match p {
        "h1" | "http1" => Ok(PlainHttp::H1),
        "h2c" | "h2" => Ok(PlainHttp::H2c),
        _ => Err(ConfigError(format!(
            "`{key}` must be \"h1\" or \"h2c\" (got `{p}`)"
        ))),
    }
}

/// A non-empty secret.
fn present(s: Option<Secret>) -> Option<Secret> {
    s.filter(|t| !t.expose().is_empty())
}

// === impl Config ===

impl Config {
    /// Defaults for everything, with the given upstream base URL.
    pub fn with_upstream(base_url: &str) -> Result<Self, ConfigError> {
        let mut sidecar = SidecarConfig::new(
            DbTarget {
                data_dir: PathBuf::from("./data"),
                database_url: None,
            },
            addr("admin_listen", "127.0.0.1:8081")?,
        );
        sidecar.upstream_base_url = base_url.to_owned();
        Ok(Self {
            listen: addr("listen", "0.0.0.0:8080")?,
            pin_workers: true,
            max_connections: 0,
            max_connections_per_ip: 0,
            transcript_cache_bytes: 256 << 20,
            gateway: GatewayConfig::with_upstream(base_url)?,
            sidecar,
        })
    }

    /// The sidecar's slice with what it shares with the data plane taken from the data
    /// plane's (one source for each fact): the upstream it reaches (base URL, extra CA) and
    /// the identity it presents there (originator, user agent, the client version the model
    /// catalog is asked as).
    pub fn sidecar_slice(&self) -> SidecarConfig {
        let mut s = self.sidecar.clone();
        s.upstream_ca = self.gateway.upstream.ca_file.clone();
        s.originator = self.gateway.wire.originator.clone();
        s.user_agent = self.gateway.wire.user_agent.clone();
        if !self.gateway.wire.version.trim().is_empty() {
            s.client_version = self.gateway.wire.version.trim().to_owned();
        }
        s
    }

    /// The data plane's slice with what it reads of the sidecar's: whether the access log is
    /// on (the sidecar writes it).
    pub fn gateway_slice(&self) -> GatewayConfig {
        let mut g = self.gateway.clone();
        g.access_log = self.sidecar.access_log.path.is_some();
        g
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
        c.load_process(args, &file)?;
        c.load_sidecar(args, &file)?;
        c.load_gateway(args, &file)?;
        Ok(c)
    }

    /// The process's own keys.
    fn load_process(&mut self, args: &ServeArgs, file: &FileConfig) -> Result<(), ConfigError> {
        if let Some(l) = args.listen.as_ref().or(file.listen.as_ref()) {
            self.listen = addr("listen", l)?;
        }
        if let Some(v) = file.transcript_cache_bytes {
            self.transcript_cache_bytes = v;
        }
        if let Some(v) = file.max_connections {
            self.max_connections = v;
        }
        if let Some(v) = file.max_connections_per_ip {
            self.max_connections_per_ip = v;
        }
        Ok(())
    }

    /// The sidecar's keys.
    fn load_sidecar(&mut self, args: &ServeArgs, file: &FileConfig) -> Result<(), ConfigError> {
        let s = &mut self.sidecar;
        if let Some(l) = args.admin_listen.as_ref().or(file.admin_listen.as_ref()) {
            s.admin_listen = addr("admin_listen", l)?;
        }
        if let Some(d) = args.data_dir.clone().or(file.data_dir.clone()) {
            s.db.data_dir = d;
        }
        s.auth_dir = file.auth_dir.clone();
        s.db.database_url = args.database_url.clone().or(file.database_url.clone());
        if let Some(u) = &s.db.database_url {
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
        s.redis_url = args.redis_url.clone().or(file.redis_url.clone());
        if let Some(u) = &s.redis_url {
            if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                return Err(ConfigError(format!(
                    "`redis_url` must start with redis:// or rediss:// (got `{}`)",
                    shared_state::secret::redact_url(u)
                )));
            }
        }
        s.admin_token = present(
            args.admin_token
                .clone()
                .or(file.admin_token.clone().map(Secret::from)),
        );
        s.admin_password = present(args.admin_password.clone());
        s.admin_allowed_hosts = args
            .admin_allowed_hosts
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(u) = args
            .oauth_token_url
            .clone()
            .or(file.upstream.oauth_token_url.clone())
        {
            s.oauth_token_url = u;
        }
        if let Some(v) = file.usage.spool_max_bytes {
            if v < 64 * 1024 {
                return Err(ConfigError(format!(
                    "`usage.spool_max_bytes` = {v} must be at least 65536"
                )));
            }
            s.usage.spool_max_bytes = v;
        }
        if let Some(v) = file.usage.retention_days {
            s.usage.retention_days = v;
        }
        if let Some(v) = file.usage.rollup_retention_days {
            s.usage.rollup_retention_days = v;
        }
        s.access_log.path = file
            .access_log
            .path
            .clone()
            .filter(|p| !p.as_os_str().is_empty());
        if let Some(v) = file.access_log.max_bytes {
            if v < 4096 {
                return Err(ConfigError(format!(
                    "`access_log.max_bytes` = {v} must be at least 4096"
                )));
            }
            s.access_log.max_bytes = v;
        }
        if let Some(v) = file.access_log.keep {
            s.access_log.keep = v;
        }
        for (alias, target) in &file.models.aliases {
            if target.is_empty() {
                return Err(ConfigError(format!(
                    "model alias `{alias}` has an empty target"
                )));
            }
            s.model_aliases
                .insert(alias.clone(), shared_state::catalog::parse_alias(target));
        }
        load_settings(&mut s.settings, file)
    }

    /// The data plane's keys.
    fn load_gateway(&mut self, args: &ServeArgs, file: &FileConfig) -> Result<(), ConfigError> {
        let g = &mut self.gateway;
        if let Some(w) = args.workers.or(file.workers) {
            if w == 0 || w > 1024 {
                return Err(ConfigError(format!(
                    "`workers` = {w} must be between 1 and 1024"
                )));
            }
            g.workers = w;
        }
        g.metrics_token = present(
            args.metrics_token
                .clone()
                .or(file.metrics_token.clone().map(Secret::from)),
        );
        if let Some(o) = args
            .chatgpt_origin
            .clone()
            .or(file.chatgpt_origin.clone())
            .filter(|o| !o.is_empty())
        {
            g.chatgpt_origin = Some(check_origin(&o)?);
        }
        let up = &mut g.upstream;
        up.ca_file = args.upstream_ca.clone().or(file.upstream.ca_file.clone());
        if let Some(ca) = &up.ca_file {
            if !ca.is_file() {
                return Err(ConfigError(format!(
                    "`upstream_ca` file {} does not exist",
                    ca.display()
                )));
            }
        }
        if let Some(p) = &args.upstream_plain_http {
            up.plain_http = plain_http("CODEX_GATEWAY_UPSTREAM_PLAIN_HTTP", p)?;
        } else if let Some(p) = &file.upstream.plain_http {
            up.plain_http = plain_http("upstream.plain_http", p)?;
        }
        let fu = &file.upstream;
        let ms = Duration::from_millis;
        if let Some(v) = fu.connect_timeout_ms {
            up.connect_timeout = ms(v);
        }
        if let Some(v) = fu.first_byte_timeout_ms {
            up.first_byte_timeout = ms(v);
        }
        if let Some(v) = fu.idle_timeout_ms {
            up.idle_timeout = ms(v);
        }
        if let Some(v) = fu.h2_max_streams_per_connection {
            if v == 0 {
                return Err(ConfigError(
                    "`upstream.h2_max_streams_per_connection` must be at least 1".into(),
                ));
            }
            up.h2_max_streams_per_connection = v;
        }
        if let Some(v) = fu.websockets {
            up.websockets = v;
        }
        if let Some(v) = fu.ws_connect_timeout_ms {
            up.ws_connect_timeout = ms(v.max(1));
        }
        if let Some(v) = fu.ws_ping_interval_secs {
            up.ws_ping_interval = Duration::from_secs(v.max(1));
        }
        if let Some(v) = fu.ws_pong_timeout_ms {
            up.ws_pong_timeout = ms(v.max(1));
        }
        if let Some(v) = fu.h1_max_idle {
            up.h1_max_idle = v;
        }
        if let Some(v) = fu.h1_idle_timeout_secs {
            up.h1_idle_timeout = Duration::from_secs(v.max(1));
        }
        if let Some(v) = fu.h2_max_connections {
            if v == 0 {
                return Err(ConfigError(
                    "`upstream.h2_max_connections` must be at least 1".into(),
                ));
            }
            up.h2_max_connections = v;
        }
        if let Some(v) = file.transcript_ttl_secs {
            g.transcript_ttl = Duration::from_secs(v);
        }
        if let Some(v) = file.ws_idle_timeout_secs {
            g.ws_idle_timeout = Duration::from_secs(v.max(1));
        }
        if let Some(v) = file.shutdown_grace_secs {
            g.shutdown_grace = Duration::from_secs(v);
        }
        g.force_legacy_driver = args.force_legacy_driver || file.force_legacy_driver == Some(true);
        if let Some(v) = file.max_body_bytes {
            g.max_body_bytes = v;
        }
        let secs = |key: &str, v: u64| {
            if v == 0 {
                Err(ConfigError(format!("`{key}` must be at least 1")))
            } else {
                Ok(Duration::from_secs(v))
            }
        };
        if let Some(v) = file.client_idle_timeout_secs {
            g.client_idle_timeout = secs("client_idle_timeout_secs", v)?;
        }
        if let Some(v) = file.client_header_timeout_secs {
            g.client_header_timeout = secs("client_header_timeout_secs", v)?;
        }
        if let Some(v) = file.client_body_timeout_secs {
            g.client_body_timeout = secs("client_body_timeout_secs", v)?;
        }
        if let Some(v) = file.client_body_min_rate {
            g.client_body_min_rate = v;
        }
        if let Some(v) = file.client_write_timeout_secs {
            g.client_write_timeout = secs("client_write_timeout_secs", v)?;
        }
        if let Some(v) = file.max_stream_output_bytes {
            g.max_stream_output_bytes = v;
        }
        if let Some(v) = file.max_ws_sessions_per_key {
            g.max_ws_sessions_per_key = v;
        }
        if let Some(v) = file.models.strict {
            g.strict_models = v;
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
                g.prices.default = price;
            } else {
                g.prices.models.insert(model.clone(), price);
            }
        }
        let w = &file.wire;
        for (v, slot) in [
            (&w.originator, &mut g.wire.originator),
            (&w.user_agent, &mut g.wire.user_agent),
            (&w.version, &mut g.wire.version),
            (&w.residency, &mut g.wire.residency),
            (&w.beta_features, &mut g.wire.beta_features),
        ] {
            if let Some(v) = v {
                slot.clone_from(v);
            }
        }
        for (name, v) in [
            ("originator", &g.wire.originator),
            ("user_agent", &g.wire.user_agent),
            ("version", &g.wire.version),
            ("residency", &g.wire.residency),
            ("beta_features", &g.wire.beta_features),
        ] {
            if http::HeaderValue::from_str(v).is_err() {
                return Err(ConfigError(format!(
                    "wire.{name} is not a valid HTTP header value (printable ASCII only)"
                )));
            }
        }
        Ok(())
    }
}

/// The defaults of the runtime settings (`[pool]`, `[front_door]`, `max_attempts`); the admin
/// API overrides them at runtime.
fn load_settings(st: &mut shared_state::Settings, file: &FileConfig) -> Result<(), ConfigError> {
    if let Some(v) = file.max_attempts {
        if v == 0 {
            return Err(ConfigError("`max_attempts` must be at least 1".into()));
        }
        st.max_attempts = v;
    }
    if let Some(s) = &file.pool.strategy {
        st.strategy = s.parse().map_err(|_| {
            ConfigError(format!(
                "`pool.strategy` = `{s}` must be one of smart, round_robin, fill_first, sticky, quota_reset_priority"
            ))
        })?;
    }
    if let Some(p) = file.pool.pause_threshold_pct {
        if !(0.0..=100.0).contains(&p) {
            return Err(ConfigError(format!(
                "`pool.pause_threshold_pct` = {p} must be within 0..=100"
            )));
        }
        st.pause_threshold_pct = Some(p);
    }
    if let Some(v) = file.pool.default_max_concurrency {
        st.default_max_concurrency = v;
    }
    if let Some(v) = file.pool.min_request_interval_ms {
        st.min_request_interval_ms = v;
    }
    if let Some(v) = file.pool.max_wait_for_account_ms {
        if v > MAX_WAIT_FOR_ACCOUNT_MS {
            return Err(ConfigError(format!(
                "`pool.max_wait_for_account_ms` = {v} must be at most {MAX_WAIT_FOR_ACCOUNT_MS}"
            )));
        }
        st.max_wait_for_account_ms = v;
    }
    if let Some(v) = &file.pool.service_tier {
        st.service_tier = v
            .parse()
            .map_err(|e| ConfigError(format!("`pool.service_tier`: {e}")))?;
    }
    let fd = &file.front_door;
    for (key, v, slot) in [
        ("rps", fd.rps, &mut st.front_door_rps),
        ("burst", fd.burst, &mut st.front_door_burst),
        ("per_ip_rps", fd.per_ip_rps, &mut st.per_ip_rps),
        ("per_ip_burst", fd.per_ip_burst, &mut st.per_ip_burst),
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
        st.ip_allow_list = text
            .parse()
            .map_err(|e| ConfigError(format!("`front_door.ip_allow_list`: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve` with the given flags, as the binary parses them (no environment involved
    /// unless the test sets it).
    fn parse(flags: &[&str]) -> Result<ServeArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("serve").chain(flags.iter().copied())).map(|c| c.serve)
    }

    fn with_file(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        Config::load(&ServeArgs {
            config: Some(p),
            ..Default::default()
        })
    }

    #[test]
    fn prices_override_the_defaults_and_are_validated() {
        let c = with_file(
            "[prices.\"gpt-5.5\"]\ninput = 2.0\noutput = 8.0\n[prices.default]\ninput = 1.0\ncached_input = 0.5\noutput = 3.0\n",
        )
        .unwrap();
        let prices = &c.gateway.prices;
        let p55 = prices.price("gpt-5.5");
        assert_eq!((p55.input, p55.cached_input, p55.output), (2.0, 2.0, 8.0));
        assert_eq!(prices.price("no-such-model").output, 3.0);
        assert_eq!(prices.cost_micros("gpt-5.5", 10, 0, 1), 28);
        // untouched defaults stay
        assert_eq!(prices.price("gpt-5-mini").output, 2.0);
        assert!(with_file("[prices.x]\ninput = -1.0\noutput = 1.0\n").is_err());
        assert!(
            with_file("[prices.x]\ninput = 1.0\n").is_err(),
            "output is required"
        );
    }

    #[test]
    fn access_log_keys_parse_and_are_validated() {
        let c = with_file("").unwrap();
        assert_eq!(c.sidecar.access_log.path, None, "off by default");
        assert!(!c.gateway_slice().access_log);
        let c = with_file("[access_log]\npath = \"-\"\nmax_bytes = 8192\nkeep = 2\n").unwrap();
        assert!(c.sidecar.access_log.is_stdout());
        assert!(
            c.gateway_slice().access_log,
            "the workers hand records over"
        );
        let log = &c.sidecar.access_log;
        assert_eq!((log.max_bytes, log.keep), (8192, 2));
        let c = with_file("[access_log]\npath = \"/var/log/a.log\"\n").unwrap();
        assert_eq!(
            c.sidecar.access_log.path,
            Some(PathBuf::from("/var/log/a.log"))
        );
        assert_eq!(c.sidecar.access_log.keep, 5);
        assert!(with_file("[access_log]\npath = \"-\"\nmax_bytes = 10\n").is_err());
        assert!(with_file("[access_log]\nbogus = 1\n").is_err());
    }

    #[test]
    fn pool_and_front_door_settings_come_from_the_file() {
        let c = with_file("").unwrap();
        assert_eq!(c.sidecar.settings, shared_state::Settings::default());
        let c = with_file(
            "max_attempts = 5\n[pool]\nmax_wait_for_account_ms = 0\nservice_tier = \"refuse\"\n\
             [front_door]\nrps = 200\nburst = 400\nper_ip_rps = 5\nper_ip_burst = 10\n\
             ip_allow_list = \"10.0.0.0/8, ::1\"\n",
        )
        .unwrap();
        let st = &c.sidecar.settings;
        assert_eq!(st.max_attempts, 5);
        assert_eq!(st.max_wait_for_account_ms, 0);
        assert_eq!(
            st.service_tier,
            shared_state::snapshot::ServiceTierPolicy::Refuse
        );
        assert_eq!(
            (
                st.front_door_rps,
                st.front_door_burst,
                st.per_ip_rps,
                st.per_ip_burst
            ),
            (200, 400, 5, 10)
        );
        assert!(st.ip_allow_list.allows("10.1.1.1".parse().unwrap()));
        assert!(st.ip_allow_list.allows("::1".parse().unwrap()));
        assert!(!st.ip_allow_list.allows("11.1.1.1".parse().unwrap()));
        let c = with_file("[front_door]\nip_allow_list = [\"192.0.2.0/24\", \"2001:db8::/32\"]\n")
            .unwrap();
        assert_eq!(
            c.sidecar.settings.ip_allow_list.to_string(),
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
            ("max_attempts = 0\n", "max_attempts"),
        ] {
            let e = with_file(bad).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn the_example_config_parses() {
        let p = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/config.example.toml"
        ));
        let c = Config::load(&ServeArgs {
            config: Some(p),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.gateway.upstream.host, "chatgpt.com");
        assert_eq!(c.gateway.max_body_bytes, 16 * 1024 * 1024);
    }

    #[test]
    fn file_and_flags_merge_with_flags_winning() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "listen = \"127.0.0.1:1\"\nworkers = 3\nadmin_token = \"from-file\"\n[upstream]\nbase_url = \"http://127.0.0.1:2/x\"\nplain_http = \"h2c\"\n[wire]\noriginator = \"codex-tui\"\nversion = \"0.200.0\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(p.clone()),
            listen: Some("127.0.0.1:5".into()),
            ..Default::default()
        };
        let c = Config::load(&args).unwrap();
        assert_eq!(c.listen.port(), 5);
        assert_eq!(c.gateway.workers, 3);
        assert_eq!(c.gateway.upstream.plain_http, PlainHttp::H2c);
        assert_eq!(c.gateway.wire.originator, "codex-tui");
        assert_eq!(
            c.sidecar.admin_token.as_ref().map(|t| t.expose()),
            Some("from-file")
        );
        // What the sidecar shares with the data plane is the data plane's.
        let s = c.sidecar_slice();
        assert_eq!(s.originator, "codex-tui");
        assert_eq!(s.client_version, "0.200.0");
        assert_eq!(s.upstream_base_url, "http://127.0.0.1:2/x");
        // A flag wins over the file (and the upstream's plain protocol is validated).
        let flagged = ServeArgs {
            admin_token: Some(Secret::from("from-flag".to_owned())),
            upstream_plain_http: Some("h1".into()),
            ..args.clone()
        };
        let c = Config::load(&flagged).unwrap();
        assert_eq!(
            c.sidecar.admin_token.as_ref().map(|t| t.expose()),
            Some("from-flag")
        );
        assert_eq!(c.gateway.upstream.plain_http, PlainHttp::H1);
        let bad = ServeArgs {
            upstream_plain_http: Some("h3".into()),
            ..args.clone()
        };
        let e = Config::load(&bad).unwrap_err().to_string();
        assert!(e.contains("CODEX_GATEWAY_UPSTREAM_PLAIN_HTTP"), "{e}");
        // A URL in an error never shows its password.
        std::fs::write(
            &p,
            "database_url = \"mysql://u:hunter2@db/x?password=hunter2\"\n",
        )
        .unwrap();
        let e = Config::load(&args).unwrap_err().to_string();
        assert!(e.contains("database_url") && !e.contains("hunter2"), "{e}");
        std::fs::write(&p, "redis_url = \"http://:hunter2@r:1\"\n").unwrap();
        let e = Config::load(&args).unwrap_err().to_string();
        assert!(e.contains("redis_url") && !e.contains("hunter2"), "{e}");
        // Nor does the configuration's Debug.
        let mut c = Config::with_upstream("http://127.0.0.1:1/x").unwrap();
        c.sidecar.db.database_url = Some("postgres://u:hunter2@db/x?password=hunter2".into());
        c.sidecar.redis_url = Some("redis://:hunter2@r:1".into());
        c.sidecar.admin_token = Some(Secret::new("hunter2"));
        c.gateway.metrics_token = Some(Secret::new("hunter2"));
        let d = format!("{c:?}");
        assert!(
            d.contains("postgres://***@db/x") && !d.contains("hunter2"),
            "{d}"
        );
        std::fs::write(&p, "bogus_key = 1\n").unwrap();
        let e = Config::load(&args).unwrap_err();
        assert!(e.to_string().contains("bogus_key"), "{e}");
    }

    #[test]
    fn every_setting_that_used_to_be_read_from_the_environment_is_a_flag() {
        let args = parse(&[
            "--admin-token",
            "t0k",
            "--admin-password",
            "pw",
            "--admin-allowed-hosts",
            "gw.example, admin.example",
            "--metrics-token",
            "m",
            "--chatgpt-origin",
            "https://gw.example:8443/",
            "--upstream-plain-http",
            "h2c",
            "--force-legacy-driver",
        ])
        .unwrap();
        // No secret in the arguments' Debug.
        let d = format!("{args:?}");
        assert!(!d.contains("t0k") && !d.contains("\"pw\""), "{d}");
        let c = Config::load(&args).unwrap();
        let s = &c.sidecar;
        assert_eq!(s.admin_token.as_ref().map(|t| t.expose()), Some("t0k"));
        assert_eq!(s.admin_password.as_ref().map(|t| t.expose()), Some("pw"));
        assert_eq!(s.admin_allowed_hosts, ["gw.example", "admin.example"]);
        let g = &c.gateway;
        assert_eq!(g.metrics_token.as_ref().map(|t| t.expose()), Some("m"));
        assert_eq!(g.chatgpt_origin.as_deref(), Some("https://gw.example:8443"));
        assert_eq!(g.upstream.plain_http, PlainHttp::H2c);
        assert!(g.force_legacy_driver);
        // Empty secrets are none.
        let c = Config::load(&parse(&["--admin-token", ""]).unwrap()).unwrap();
        assert!(c.sidecar.admin_token.is_none());
        // A bad origin is refused, naming the key.
        let e = Config::load(&parse(&["--chatgpt-origin", "http://x/y"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("chatgpt_origin"), "{e}");
        // Defaults: nothing forced.
        let c = Config::load(&parse(&[]).unwrap()).unwrap();
        assert!(!c.gateway.force_legacy_driver && c.gateway.metrics_token.is_none());
    }

    #[test]
    fn a_wire_value_that_cannot_be_a_header_is_refused() {
        let e = with_file(
            "[upstream]\nbase_url = \"http://127.0.0.1:2/x\"\n[wire]\nuser_agent = \"codex\\r\\nx-injected: 1\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("wire.user_agent"), "{e}");
    }
}
