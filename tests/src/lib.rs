//! Integration test harness: the gateway in-process ([`codex_gateway::app::App`]) on 127.0.0.1:0
//! against mock-codex ([`benches::MockCodex`]) over real sockets, with real SQLite/PostgreSQL.
//!
//! # Key Components
//! - [`Stack`] / [`StackBuilder`]: a mock upstream, a data directory with imported accounts and
//!   a client key, and a running gateway.
//! - [`pg_database`]: a fresh PostgreSQL database per test (dropped on drop).
//! - [`outage`]: private PostgreSQL and Redis servers to stop and start, a counted client load.
//! - [`tls_material`]: a test CA and a server certificate for `localhost`/`127.0.0.1`.
//! - [`raw`]: HTTP/1.1 and WebSocket clients by hand over blocking sockets (hostile clients).
//! - [`admin_api`]: the admin API calls tests repeat (keys, settings, listings, imports).
//! - [`cli`]: real command-line clients (Codex CLI, Claude Code) run bounded, in a process group.
//! - [`fleet`]: another gateway instance on a stack's storage (a fleet on one PostgreSQL + Redis).
//! - [`logs`]: the gateway's logs at `trace`, captured in memory (no secret is logged).
//! - [`requests`]: data-plane requests tests repeat (the smallest Responses request).
//! - [`sdk`]: the official Python SDKs run as clients (scripts under `tests/python/`).
//! - [`wait`]: bounded polls (a condition, `/v1/usage`) and a whole RPM window.
//! - [`ws_client`]: the client side of a WebSocket (the next JSON event, bounded).

pub mod admin_api;
pub mod cli;
pub mod egress_proxy;
pub mod fleet;
pub mod logs;
pub mod outage;
pub mod raw;
pub mod requests;
pub mod sdk;
pub mod wait;
pub mod ws_client;

use std::{path::PathBuf, time::Duration};

use benches::{IssuedTokens, MockAccount, MockCodex, MockConfig, MockHandle};
use codex_gateway::app::{App, AppHandle};
use codex_gateway::config::Config;
use gateway::config::PlainHttp;

/// A running test stack.
pub struct Stack {
    /// The mock upstream.
    pub mock: MockHandle,
    /// The gateway.
    pub app: AppHandle,
    /// A valid client key.
    pub key: String,
    /// Tokens of each account, in creation order.
    pub accounts: Vec<IssuedTokens>,
    /// Data directory (kept alive).
    pub dir: tempfile::TempDir,
    /// Database target used.
    pub db: admin::DbTarget,
    /// PostgreSQL database (dropped with the stack).
    pub _pg: Option<PgDatabase>,
    /// The configuration the gateway was started with.
    pub cfg: Config,
}

// === impl Stack ===

impl Stack {
    /// Stops the gateway and starts it again on the same storage (same port).
    pub fn restart(&mut self) {
        self.restart_after(|| {});
    }

    /// Stops the gateway, runs `between` (e.g. brings storage back), and starts it again on
    /// the same storage (same port).
    pub fn restart_after(&mut self, between: impl FnOnce()) {
        self.app.shutdown();
        between();
        let mut cfg = self.cfg.clone();
        cfg.listen = self.app.data_addr;
        self.app = App::spawn(cfg).expect("gateway restart");
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.app.data_addr)
    }

    /// `http://127.0.0.1:ADMINPORT`
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.app.admin_addr)
    }

    /// An admin API request authenticated with the stack's admin token (a configured static
    /// admin token, [`ADMIN_TOKEN`]); `path` starts with `/api/admin/`. Mutations carry
    /// `Content-Type: application/json` (the admin API refuses anything else).
    pub fn admin_req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mutation = method != reqwest::Method::GET;
        let r = client()
            .request(method, format!("{}{path}", self.admin_url()))
            .bearer_auth(ADMIN_TOKEN);
        if mutation {
            r.header("content-type", "application/json")
        } else {
            r
        }
    }

    /// `GET` on the admin API (see [`Stack::admin_req`]).
    pub fn admin_get(&self, path: &str) -> reqwest::RequestBuilder {
        self.admin_req(reqwest::Method::GET, path)
    }

    /// `POST` on the admin API (see [`Stack::admin_req`]).
    pub fn admin_post(&self, path: &str) -> reqwest::RequestBuilder {
        self.admin_req(reqwest::Method::POST, path)
    }

    /// `PUT` on the admin API (see [`Stack::admin_req`]).
    pub fn admin_put(&self, path: &str) -> reqwest::RequestBuilder {
        self.admin_req(reqwest::Method::PUT, path)
    }

    /// `PATCH` on the admin API (see [`Stack::admin_req`]).
    pub fn admin_patch(&self, path: &str) -> reqwest::RequestBuilder {
        self.admin_req(reqwest::Method::PATCH, path)
    }

    /// POST JSON to a data-plane path with the stack's key.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        client()
            .post(format!("{}{path}", self.url()))
            .bearer_auth(&self.key)
            .header("content-type", "application/json")
    }

    /// [`Stack::post`] of the JSON `body`, sent: the response, body unread.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.post(path)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// A streamed `POST /v1/responses` of `input` to `gpt-5.5`: the status and the whole body.
    pub async fn stream_responses(&self, input: &str) -> (u16, String) {
        let r = self
            .post("/v1/responses")
            .json(&serde_json::json!({"model": "gpt-5.5", "input": input, "stream": true}))
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    }

    /// The data plane's `/metrics` text (see [`metrics_at`]).
    pub async fn metrics_text(&self) -> String {
        metrics_at(&self.url()).await
    }

    /// A metric from the data plane's `/metrics`, summed over its label sets (0 when absent).
    pub async fn metric(&self, name: &str) -> i64 {
        metric_sum(&self.metrics_text().await, name)
    }

    /// The data plane's `/healthz` answer as JSON, whatever its status.
    pub async fn healthz(&self) -> serde_json::Value {
        client()
            .get(format!("{}/healthz", self.url()))
            .send()
            .await
            .expect("GET /healthz")
            .json()
            .await
            .expect("healthz JSON")
    }

    /// The ids of the accounts in the gateway's current snapshot, in its order.
    pub fn account_ids(&self) -> Vec<i64> {
        self.app
            .snapshot
            .load()
            .accounts
            .iter()
            .map(|a| a.id)
            .collect()
    }

    /// The mock answers the next request served by `account` (`acct-N`) with the text
    /// `text`, once; later ones get its default answer.
    pub fn answer_once(&self, account: &str, text: &str) {
        self.mock.set_behaviour(
            account,
            benches::Behaviour {
                text: Some(text.into()),
                ..Default::default()
            }
            .times(1),
        );
    }

    /// In-flight count of the account with this ChatGPT account id.
    pub fn in_flight(&self, chatgpt_account_id: &str) -> u32 {
        self.app
            .snapshot
            .load()
            .accounts
            .iter()
            .find(|a| a.chatgpt_account_id == chatgpt_account_id)
            .map_or(0, |a| a.live.in_flight())
    }
}

/// The text of `GET {base}/metrics` (a data plane's Prometheus exposition; `base` is
/// `http://HOST:PORT`).
pub async fn metrics_at(base: &str) -> String {
    client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

/// The metric `name` in a `/metrics` text, summed over its label sets (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> i64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum()
}

/// A [`StackBuilder::tweak`] that serves Anthropic models (`claude-*`) with `gpt-5.5`, as an
/// operator's alias would (the Messages API and Claude Code tests).
pub fn claude_alias() -> Option<ConfigTweak> {
    Some(Box::new(|c: &mut Config| {
        c.sidecar.model_aliases.insert(
            "claude-*".into(),
            shared_state::catalog::parse_alias("gpt-5.5"),
        );
    }))
}

/// The static admin API token every [`Stack`] is started with.
pub const ADMIN_TOKEN: &str = "cg-test-admin-token";

/// The message of a panic caught from a task (`JoinError::into_panic`), for re-raising it with
/// context.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// A client whose connections leave from `ip` (a loopback address such as `127.0.0.2`: the
/// per-IP limits see another client), with a 120 s timeout.
pub fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(ip.parse::<std::net::IpAddr>().expect("an IP address"))
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// A `GET` of `url` without credentials (health, metrics, static files, unknown paths),
/// sent through [`client`]: the response, body unread.
pub async fn http_get(url: &str) -> reqwest::Response {
    client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// A reqwest client without proxies.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// Builds a [`Stack`].
pub struct StackBuilder {
    /// Mock settings.
    pub mock: MockConfig,
    /// Number of accounts.
    pub accounts: usize,
    /// Gateway workers.
    pub workers: usize,
    /// Use PostgreSQL instead of SQLite.
    pub postgres: bool,
    /// Use this database URL (e.g. a [`outage::PrivatePostgres`]) instead of SQLite.
    pub database_url: Option<String>,
    /// Force the legacy driver.
    pub legacy: bool,
    /// Plain-HTTP upstream protocol.
    pub plain_http: PlainHttp,
    /// Upstream base URL override (TLS tests use `https://localhost:PORT/...`).
    pub upstream_host: Option<String>,
    /// Extra CA for the upstream.
    pub upstream_ca: Option<PathBuf>,
    /// The scheduling strategy (`None`: the default, smart). Tests that must know which
    /// account serves a request use `FillFirst`.
    pub strategy: Option<shared_state::snapshot::Strategy>,
    /// Tweak the config before start.
    pub tweak: Option<ConfigTweak>,
    /// Admin password to configure (as `CODEX_GATEWAY_ADMIN_PASSWORD` would); the admin API
    /// token [`ADMIN_TOKEN`] is always configured.
    pub admin_password: Option<String>,
}

/// A change to the gateway's configuration before start ([`StackBuilder::tweak`]).
pub type ConfigTweak = Box<dyn FnOnce(&mut Config)>;

impl Default for StackBuilder {
    fn default() -> Self {
        Self {
            mock: MockConfig::default(),
            accounts: 1,
            workers: 2,
            postgres: false,
            database_url: None,
            legacy: false,
            plain_http: PlainHttp::H1,
            upstream_host: None,
            upstream_ca: None,
            strategy: None,
            tweak: None,
            admin_password: None,
        }
    }
}

// === impl StackBuilder ===

impl StackBuilder {
    /// Starts the mock, prepares storage (accounts `acct-0..`, one key) and the gateway.
    pub fn start(self) -> Stack {
        let mock = MockCodex::start(self.mock).expect("mock-codex");
        let dir = tempfile::tempdir().expect("tempdir");
        let pg = self.postgres.then(pg_database);
        let db = admin::DbTarget {
            data_dir: dir.path().to_path_buf(),
            database_url: pg.as_ref().map(|p| p.url.clone()).or(self.database_url),
        };
        let mut accounts = Vec::new();
        let mut files = Vec::new();
        for i in 0..self.accounts {
            let t = mock.add_account(MockAccount::new(format!("acct-{i}")));
            let p = dir.path().join(format!("auth-{i}.json"));
            std::fs::write(
                &p,
                format!(
                    r#"{{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{{"id_token":"{}","access_token":"{}","refresh_token":"{}","account_id":"{}"}},"last_refresh":"2026-11-29T00:00:00Z"}}"#,
                    t.id_token, t.access_token, t.refresh_token, t.account_id
                ),
            )
            .expect("write auth.json");
            files.push(p);
            accounts.push(t);
        }
        // The admin CLI helpers build their own runtime: run them off any async test runtime.
        let key = std::thread::scope(|sc| {
            sc.spawn(|| {
                if !files.is_empty() {
                    let s = admin::cli::accounts_import(&db, &files, &mock.token_url())
                        .expect("import");
                    assert_eq!(s.added.len(), files.len(), "import summary: {s}");
                }
                admin::cli::keys_create(&db, "test").expect("key")
            })
            .join()
            .expect("setup thread")
        });
        let base = match &self.upstream_host {
            Some(h) => h.clone(),
            None => mock.base_url(),
        };
        let mut cfg = Config::with_upstream(&base).expect("config");
        cfg.listen = "127.0.0.1:0".parse().expect("addr");
        cfg.pin_workers = false;
        let g = &mut cfg.gateway;
        g.workers = self.workers;
        g.force_legacy_driver = self.legacy;
        g.upstream.plain_http = self.plain_http;
        g.upstream.ca_file = self.upstream_ca;
        g.shutdown_grace = Duration::from_secs(5);
        let s = &mut cfg.sidecar;
        s.admin_listen = "127.0.0.1:0".parse().expect("addr");
        s.db = db.clone();
        s.oauth_token_url = mock.token_url();
        s.admin_token = Some(shared_state::Secret::new(ADMIN_TOKEN));
        s.admin_password = self.admin_password.map(shared_state::Secret::from);
        if let Some(st) = self.strategy {
            s.settings.strategy = st;
        }
        if let Some(t) = self.tweak {
            t(&mut cfg);
        }
        let app = App::spawn(cfg.clone()).expect("gateway start");
        Stack {
            cfg,
            mock,
            app,
            key,
            accounts,
            dir,
            db,
            _pg: pg,
        }
    }
}

/// `accounts` accounts, one worker, fill-first scheduling (the account that serves each
/// request is known: the first one eligible).
pub fn fill_first_stack(accounts: usize) -> Stack {
    StackBuilder {
        accounts,
        workers: 1,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        ..StackBuilder::default()
    }
    .start()
}

/// A mock whose every answer streams `deltas` text deltas `gap` apart (a stream that lasts a
/// while: open streams, client disconnects, concurrency).
pub fn streaming_mock(deltas: usize, gap: Duration) -> MockConfig {
    MockConfig {
        deltas,
        inter_event_delay: gap,
        ..MockConfig::default()
    }
}

/// A throw-away PostgreSQL database.
pub struct PgDatabase {
    /// Its URL.
    pub url: String,
    /// Its name.
    pub name: String,
    admin_url: String,
}

// === impl PgDatabase ===

impl PgDatabase {
    /// Storage goes down: the database refuses new connections and its open ones are ended.
    /// (Runs on a thread of its own: callable from an async test.)
    pub fn go_down(&self) {
        self.admin_sql(format!(
            "ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            name = self.name
        ));
    }

    /// Storage comes back: the database accepts connections again.
    pub fn come_back(&self) {
        self.admin_sql(format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS true",
            self.name
        ));
    }

    fn admin_sql(&self, sql: String) {
        let url = self.admin_url.clone();
        std::thread::spawn(move || pg_exec(&url, &sql))
            .join()
            .expect("admin SQL");
    }
}

/// The PostgreSQL server used by tests.
pub fn pg_admin_url() -> String {
    std::env::var("CODEX_GATEWAY_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Runs SQL against the PostgreSQL admin database with psql-free sqlx (own runtime).
pub fn pg_exec(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(url).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {url} is required for this test (start it or run tests/run.sh): {e}"
            )
        });
        sqlx::raw_sql(sql).execute(&mut c).await.expect("sql");
    });
}

/// Creates a fresh database.
pub fn pg_database() -> PgDatabase {
    let admin_url = pg_admin_url();
    let name = format!("cg_it_{}_{}", std::process::id(), rand_suffix());
    let sql = format!("CREATE DATABASE {name}");
    let u = admin_url.clone();
    std::thread::spawn(move || pg_exec(&u, &sql))
        .join()
        .expect("create database");
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url.as_str(), |(b, _)| b);
    PgDatabase {
        url: format!("{base}/{name}"),
        name,
        admin_url,
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{t}_{}", N.fetch_add(1, Ordering::Relaxed))
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let url = self.admin_url.clone();
        // DROP DATABASE cannot share an (implicit) transaction with other statements.
        let _ = std::thread::spawn(move || {
            pg_exec(&url, &format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true"));
            pg_exec(&url, &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"));
            pg_exec(&url, &format!("DROP DATABASE IF EXISTS {name}"));
        })
        .join();
    }
}

/// A CA certificate (PEM file) and a server certificate + key for `localhost`/`127.0.0.1`.
pub struct TlsMaterial {
    /// CA certificate PEM path.
    pub ca: PathBuf,
    /// Server certificate chain PEM path.
    pub cert: PathBuf,
    /// Server key PEM path.
    pub key: PathBuf,
}

/// Generates [`TlsMaterial`] in `dir`.
pub fn tls_material(dir: &std::path::Path) -> TlsMaterial {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "codex-gateway test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("params");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).expect("cert");
    let m = TlsMaterial {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server-key.pem"),
    };
    std::fs::write(&m.ca, ca.pem()).expect("write");
    std::fs::write(&m.cert, cert.pem()).expect("write");
    std::fs::write(&m.key, key.serialize_pem()).expect("write");
    m
}

/// Reads an SSE body into `(event, data)` pairs.
pub fn parse_sse(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let mut ev = String::new();
            let mut data = String::new();
            for line in f.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    ev = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = v.to_owned();
                }
            }
            (ev, data)
        })
        .collect()
}

/// Live view of one account in the gateway's current snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountView {
    /// Effective status (`active`, `disabled`, `reauth_required`, `banned`).
    pub status: &'static str,
    /// Cooldown remaining, ms (0 when none).
    pub cooling_ms: u64,
    /// Leases held.
    pub in_flight: u32,
}

impl Stack {
    /// The live state of an account by ChatGPT account id.
    pub fn account(&self, chatgpt_account_id: &str) -> AccountView {
        let snap = self.app.snapshot.load();
        let a = snap
            .accounts
            .iter()
            .find(|a| a.chatgpt_account_id == chatgpt_account_id)
            .expect("account in snapshot");
        let now = shared_state::now_ms();
        AccountView {
            status: a.effective_status().as_str(),
            cooling_ms: a.live.cooldown_until_ms().saturating_sub(now),
            in_flight: a.live.in_flight(),
        }
    }

    /// The JSON bodies of the `/responses` requests the upstream saw, in order (those that
    /// are JSON).
    pub fn upstream_bodies(&self) -> Vec<serde_json::Value> {
        self.mock
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/responses"))
            .filter_map(|r| serde_json::from_slice(&r.body).ok())
            .collect()
    }

    /// The Responses requests the upstream saw, oldest first: HTTP `POST`s and the turns the
    /// gateway sent over its upstream WebSocket (recorded as method `WS`).
    pub fn upstream_turns(&self) -> Vec<benches::RecordedRequest> {
        self.mock
            .requests()
            .into_iter()
            .filter(|r| {
                matches!(r.method.as_str(), "POST" | "WS") && r.path.ends_with("/responses")
            })
            .collect()
    }

    /// The mock answers the next `times` requests served by `account` with a call of the
    /// function `name` with `arguments` (a JSON text); later ones get its default answer.
    pub fn answer_with_tool_call(&self, account: &str, name: &str, arguments: &str, times: u32) {
        self.mock.set_behaviour(
            account,
            benches::Behaviour {
                tool_call: Some(name.into()),
                tool_arguments: Some(arguments.into()),
                ..Default::default()
            }
            .times(times),
        );
    }

    /// Which accounts the upstream saw, in order.
    pub fn served_by(&self) -> Vec<String> {
        self.mock
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/responses"))
            .filter_map(|r| r.account_id().map(str::to_owned))
            .collect()
    }
}
