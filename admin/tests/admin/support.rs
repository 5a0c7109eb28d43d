//! Test support: real databases (SQLite in a tempdir, PostgreSQL in a fresh database per
//! test), a mock OAuth token endpoint on 127.0.0.1:0, JWT fixtures and polling helpers.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use admin::{storage::Storage, DbTarget};
use axum::{extract::State, http::StatusCode, routing::post, Json, Router};
use serde_json::{json, Value};
use shared_state::jwt::encode_unsigned;
use sqlx::Connection;

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| v == "1" || v.eq_ignore_ascii_case("true"))
        .unwrap_or(false)
}

pub fn pg_base_url() -> String {
    std::env::var("CODEX_GATEWAY_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_owned())
}

pub fn redis_url() -> Option<String> {
    if env_flag("CODEX_GATEWAY_SKIP_REDIS") {
        return None;
    }
    Some(
        std::env::var("CODEX_GATEWAY_TEST_REDIS_URL")
            .unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned()),
    )
}

/// Replaces the database name (path) of a postgres URL.
fn with_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_part = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{host_part}/{db}?{q}"),
        None => format!("{host_part}/{db}"),
    }
}

/// One test database.
pub struct TestDb {
    pub dir: tempfile::TempDir,
    pub pg: Option<PgDb>,
}

pub struct PgDb {
    pub base_url: String,
    pub name: String,
    pub url: String,
}

impl TestDb {
    pub fn sqlite() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            pg: None,
        }
    }

    /// A fresh PostgreSQL database, or `None` when `CODEX_GATEWAY_SKIP_PG=1`. Panics (fails
    /// the test) when PostgreSQL is unreachable otherwise.
    pub async fn pg() -> Option<Self> {
        if env_flag("CODEX_GATEWAY_SKIP_PG") {
            eprintln!("CODEX_GATEWAY_SKIP_PG=1: skipping a PostgreSQL test");
            return None;
        }
        let base_url = pg_base_url();
        let mut conn = sqlx::PgConnection::connect(&base_url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL unreachable at {base_url}: {e} \
                 (set CODEX_GATEWAY_TEST_PG_URL, or CODEX_GATEWAY_SKIP_PG=1 to skip)"
                )
            });
        let name = format!("cg_test_{}", hex::encode(rand::random::<[u8; 8]>()));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE");
        let _ = conn.close().await;
        let url = with_db(&base_url, &name);
        Some(Self {
            dir: tempfile::tempdir().expect("tempdir"),
            pg: Some(PgDb {
                base_url,
                name,
                url,
            }),
        })
    }

    pub fn target(&self) -> DbTarget {
        DbTarget {
            data_dir: self.dir.path().join("data"),
            database_url: self.pg.as_ref().map(|p| p.url.clone()),
        }
    }

    pub async fn open(&self) -> Arc<dyn Storage> {
        admin::storage::open(&self.target())
            .await
            .expect("open storage")
    }

    pub fn is_pg(&self) -> bool {
        self.pg.is_some()
    }

    /// Runs one statement with text binds, bypassing the storage layer.
    pub async fn raw_exec(&self, sql: &str, binds: &[&str]) {
        match &self.pg {
            Some(pg) => {
                let mut c = sqlx::PgConnection::connect(&pg.url)
                    .await
                    .expect("pg connect");
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind(*b);
                }
                q.execute(&mut c).await.expect("raw exec");
                let _ = c.close().await;
            }
            None => {
                let path = self.target().data_dir.join(admin::DEFAULT_DB_FILE);
                let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut c = sqlx::SqliteConnection::connect_with(&opts)
                    .await
                    .expect("sqlite connect");
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind(*b);
                }
                q.execute(&mut c).await.expect("raw exec");
                let _ = c.close().await;
            }
        }
    }

    /// The three raw token columns of an account, bypassing the storage layer.
    pub async fn raw_token_columns(&self, id: i64) -> (String, String, String) {
        let sql =
            "SELECT access_token_enc, refresh_token_enc, id_token_enc FROM accounts WHERE id = $1";
        match &self.pg {
            Some(pg) => {
                let mut c = sqlx::PgConnection::connect(&pg.url)
                    .await
                    .expect("pg connect");
                let r: (String, String, String) = sqlx::query_as(sql)
                    .bind(id)
                    .fetch_one(&mut c)
                    .await
                    .expect("raw select");
                let _ = c.close().await;
                r
            }
            None => {
                let path = self.target().data_dir.join(admin::DEFAULT_DB_FILE);
                let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut c = sqlx::SqliteConnection::connect_with(&opts)
                    .await
                    .expect("sqlite connect");
                let r: (String, String, String) = sqlx::query_as(sql)
                    .bind(id)
                    .fetch_one(&mut c)
                    .await
                    .expect("raw select");
                let _ = c.close().await;
                r
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(pg) = self.pg.take() else { return };
        // Drop may run inside a runtime: use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async {
                if let Ok(mut c) = sqlx::PgConnection::connect(&pg.base_url).await {
                    let _ =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", pg.name))
                            .execute(&mut c)
                            .await;
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}

/// Generates a `sqlite_*` and a `pg_*` test for each `async fn name(db: &TestDb)`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let db = $crate::support::TestDb::sqlite();
                    super::$name(&db).await;
                }
            )*
        }
        mod pg {
            $(
                #[tokio::test]
                async fn $name() {
                    let Some(db) = $crate::support::TestDb::pg().await else { return };
                    super::$name(&db).await;
                }
            )*
        }
    };
}
pub(crate) use both_backends;

/// A ChatGPT-like JWT.
pub fn jwt(account: &str, user: &str, email: &str, plan: &str, exp: i64) -> String {
    encode_unsigned(
        &json!({
            "email": email,
            "exp": exp,
            "https://api.openai.com/auth": {
                "chatgpt_account_id": account,
                "chatgpt_user_id": user,
                "chatgpt_plan_type": plan,
            },
            "https://api.openai.com/profile": {"email": email},
        })
        .to_string(),
    )
}

/// Far in the future (no proactive refresh).
pub const FAR_EXP: i64 = 4_000_000_000;

/// Polls `cond` every 25 ms until it holds or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ===== mock OAuth token endpoint =====

#[derive(Clone)]
pub struct MockIdent {
    pub account: String,
    pub user: String,
    pub email: String,
    pub plan: String,
}

#[derive(Default)]
struct MockState {
    valid: HashMap<String, MockIdent>,
    used: HashSet<String>,
    calls: u32,
    counter: u32,
    forced: Option<(u16, String)>,
    omit_refresh_token: bool,
}

/// A token endpoint with rotating refresh tokens, in its own thread and runtime (so blocking
/// CLI helpers can call it from a test thread).
pub struct MockOAuth {
    pub url: String,
    state: Arc<Mutex<MockState>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn token_handler(
    State(st): State<Arc<Mutex<MockState>>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut s = st.lock().unwrap();
    s.calls += 1;
    if let Some((code, body)) = s.forced.clone() {
        let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
        return (StatusCode::from_u16(code).unwrap(), Json(v));
    }
    if body["client_id"] != admin::oauth::CLIENT_ID || body["grant_type"] != "refresh_token" {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_request"})),
        );
    }
    let rt = body["refresh_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if s.used.contains(&rt) {
        return (
            StatusCode::BAD_REQUEST,
            Json(
                json!({"error": {"code": "refresh_token_reused", "message": "Your refresh token has already been used"}}),
            ),
        );
    }
    let Some(ident) = s.valid.remove(&rt) else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "invalid_grant"})),
        );
    };
    s.used.insert(rt);
    s.counter += 1;
    let n = s.counter;
    let new_rt = format!("rt-rotated-{n}");
    s.valid.insert(new_rt.clone(), ident.clone());
    // Every issued token is distinct (a `jti` counter), like real ones.
    let fresh = |kind: &str| {
        encode_unsigned(
            &json!({
                "email": ident.email,
                "exp": FAR_EXP,
                "jti": format!("{kind}-{n}"),
                "https://api.openai.com/auth": {
                    "chatgpt_account_id": ident.account,
                    "chatgpt_user_id": ident.user,
                    "chatgpt_plan_type": ident.plan,
                },
            })
            .to_string(),
        )
    };
    let at = fresh("at");
    let id = fresh("id");
    let mut out =
        json!({"access_token": at, "id_token": id, "expires_in": 864000, "token_type": "Bearer"});
    if !s.omit_refresh_token {
        out["refresh_token"] = Value::String(new_rt);
    }
    (StatusCode::OK, Json(out))
}

impl MockOAuth {
    pub fn start() -> Self {
        let state = Arc::new(Mutex::new(MockState::default()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                let app = Router::new()
                    .route("/oauth/token", post(token_handler))
                    .with_state(st);
                axum::serve(l, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let addr = addr_rx.recv().unwrap();
        Self {
            url: format!("http://{addr}/oauth/token"),
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Registers a valid refresh token.
    pub fn add_rt(&self, rt: &str, account: &str, user: &str, email: &str, plan: &str) {
        self.state.lock().unwrap().valid.insert(
            rt.to_owned(),
            MockIdent {
                account: account.into(),
                user: user.into(),
                email: email.into(),
                plan: plan.into(),
            },
        );
    }

    pub fn calls(&self) -> u32 {
        self.state.lock().unwrap().calls
    }

    /// The refresh token currently valid for an account.
    pub fn current_rt(&self, account: &str) -> Option<String> {
        let s = self.state.lock().unwrap();
        s.valid
            .iter()
            .find(|(_, i)| i.account == account)
            .map(|(k, _)| k.clone())
    }

    pub fn is_used(&self, rt: &str) -> bool {
        self.state.lock().unwrap().used.contains(rt)
    }

    /// Every call answers this status and body until cleared.
    pub fn force(&self, v: Option<(u16, &str)>) {
        self.state.lock().unwrap().forced = v.map(|(c, b)| (c, b.to_owned()));
    }

    pub fn omit_refresh_token(&self, on: bool) {
        self.state.lock().unwrap().omit_refresh_token = on;
    }
}

impl Drop for MockOAuth {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn write(dir: &std::path::Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&p, content).unwrap();
    p
}

// ===== mock Codex usage endpoint (`GET /backend-api/wham/usage`) =====

/// One request the usage mock received.
#[derive(Debug, Clone)]
pub struct UsageHit {
    pub at: std::time::Instant,
    pub path: String,
    pub authorization: Option<String>,
    pub account_id: Option<String>,
    pub user_agent: Option<String>,
    pub originator: Option<String>,
}

#[derive(Default)]
struct UsageState {
    hits: Vec<UsageHit>,
    /// Bearer tokens answered with 401.
    rejected: HashSet<String>,
    /// Body per `ChatGPT-Account-Id`.
    bodies: HashMap<String, Value>,
}

/// The `/wham/usage` JSON (docs/protocol.md#quota-signals).
pub fn usage_body(plan: &str, primary: f64, secondary: f64, limit_reached: bool) -> Value {
    json!({
        "user_id": "user-x", "account_id": "acc-x", "email": "x@x", "plan_type": plan,
        "rate_limit": {
            "allowed": !limit_reached, "limit_reached": limit_reached,
            "primary_window": {"used_percent": primary, "limit_window_seconds": 18000,
                               "reset_after_seconds": 1200, "reset_at": 3_900_000_000u64},
            "secondary_window": {"used_percent": secondary, "limit_window_seconds": 604800,
                                 "reset_after_seconds": 86400, "reset_at": 3_950_000_000u64}
        },
        "credits": {"has_credits": false, "unlimited": false, "balance": "0"}
    })
}

/// A usage endpoint on 127.0.0.1:0, in its own thread (blocking CLI helpers can call it).
pub struct MockUsage {
    /// `http://127.0.0.1:<port>`.
    pub origin: String,
    state: Arc<Mutex<UsageState>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn usage_handler(
    State(st): State<Arc<Mutex<UsageState>>>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> (StatusCode, Json<Value>) {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let hit = UsageHit {
        at: std::time::Instant::now(),
        path: uri.path().to_owned(),
        authorization: h("authorization"),
        account_id: h("chatgpt-account-id"),
        user_agent: h("user-agent"),
        originator: h("originator"),
    };
    let mut s = st.lock().unwrap();
    s.hits.push(hit.clone());
    let token = hit
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .unwrap_or_default();
    if s.rejected.contains(token) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"code": "token_expired", "message": "expired"}})),
        );
    }
    let body = hit
        .account_id
        .as_deref()
        .and_then(|a| s.bodies.get(a).cloned())
        .unwrap_or_else(|| usage_body("plus", 10.0, 1.0, false));
    (StatusCode::OK, Json(body))
}

impl MockUsage {
    pub fn start() -> Self {
        let state = Arc::new(Mutex::new(UsageState::default()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                let app = Router::new().fallback(usage_handler).with_state(st);
                axum::serve(l, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let addr = addr_rx.recv().unwrap();
        Self {
            origin: format!("http://{addr}"),
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The upstream base URL whose derived usage URL is this mock's `/backend-api/wham/usage`.
    pub fn codex_base(&self) -> String {
        format!("{}/backend-api/codex", self.origin)
    }

    pub fn set_body(&self, chatgpt_account_id: &str, body: Value) {
        self.state
            .lock()
            .unwrap()
            .bodies
            .insert(chatgpt_account_id.to_owned(), body);
    }

    pub fn reject_token(&self, token: &str) {
        self.state.lock().unwrap().rejected.insert(token.to_owned());
    }

    pub fn hits(&self) -> Vec<UsageHit> {
        self.state.lock().unwrap().hits.clone()
    }
}

impl Drop for MockUsage {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
