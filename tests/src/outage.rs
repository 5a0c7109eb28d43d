//! Outage harness: private PostgreSQL and Redis servers a test may stop and start without
//! disturbing the shared ones, and a steady client load that counts every answer.
//!
//! # Key Components
//! - [`PrivatePostgres`]: `initdb` + `pg_ctl` in a temp directory on a free port (run as the
//!   `postgres` user when the tests run as root, as `initdb` refuses root).
//! - [`PrivateRedis`]: `redis-server` on a free port, killed and started again on that port.
//! - [`Load`]: clients looping Responses requests (streamed and JSON) against a gateway; every
//!   answer is checked complete, and [`Load::stop`] reports the counts.
//! - [`usage_rows`] / [`until_usage_rows`]: the usage records a stack's storage holds.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it again at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn wait_port(port: u16, up: bool, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() != up {
        assert!(
            Instant::now() < deadline,
            "port {port} did not go {}",
            if up { "up" } else { "down" }
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A PostgreSQL server of its own (see the module docs). Stopped on drop.
pub struct PrivatePostgres {
    /// Its port on 127.0.0.1.
    pub port: u16,
    data: PathBuf,
    dir: tempfile::TempDir,
    as_postgres: bool,
}

// === impl PrivatePostgres ===

impl PrivatePostgres {
    /// `initdb` (trust authentication, user `postgres`) and start.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let as_postgres = is_root();
        if as_postgres {
            let st = Command::new("chown")
                .args(["postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(st.success(), "chown postgres {}", dir.path().display());
        }
        let pg = Self {
            port: free_port(),
            data: dir.path().join("data"),
            dir,
            as_postgres,
        };
        let out = pg
            .cmd("initdb")
            .arg("-D")
            .arg(&pg.data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("initdb (PostgreSQL binaries on PATH are required)");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.start_again();
        pg
    }

    fn cmd(&self, program: &str) -> Command {
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program]);
            c
        } else {
            Command::new(program)
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn start_again(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-o", &opts, "-l"])
            .arg(self.dir.path().join("log"))
            .args(["-w", "start"])
            .stdin(Stdio::null())
            .output()
            .expect("pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_port(self.port, true, Duration::from_secs(20));
    }

    /// Stops the server (`-m fast`: sessions are terminated) and waits until its port is
    /// closed.
    pub fn stop(&self) {
        let out = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"])
            .stdin(Stdio::null())
            .output()
            .expect("pg_ctl stop");
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_port(self.port, false, Duration::from_secs(20));
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A Redis server of its own (see the module docs). Killed on drop.
pub struct PrivateRedis {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Mutex<Option<Child>>,
}

// === impl PrivateRedis ===

impl PrivateRedis {
    /// Starts `redis-server` (no persistence) on a free port.
    pub fn start() -> Self {
        let r = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: Mutex::new(None),
        };
        r.start_again();
        r
    }

    /// `redis://127.0.0.1:PORT/0`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server (again, on the same port) and waits until it accepts connections.
    pub fn start_again(&self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (on PATH) is required");
        *self.child.lock().expect("lock") = Some(child);
        wait_port(self.port, true, Duration::from_secs(20));
    }

    /// Kills the server and waits until its port is closed.
    pub fn stop(&self) {
        if let Some(mut c) = self.child.lock().expect("lock").take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        wait_port(self.port, false, Duration::from_secs(20));
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Ok(mut c) = self.child.lock() {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// What a [`Load`] saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Requests sent (each answered or failed).
    pub requests: u64,
    /// Complete answers (200 with a complete body).
    pub ok: u64,
    /// Everything else, one line each (status, body or error).
    pub failures: Vec<String>,
}

/// Clients looping `POST /v1/responses` (every other one streamed) against a gateway.
pub struct Load {
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

// === impl Load ===

impl Load {
    /// Starts `clients` loops against `base` (`http://...`) with client key `key`.
    pub fn start(base: &str, key: &str, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|c| {
                let (stop, requests, ok, failures) = (
                    Arc::clone(&stop),
                    Arc::clone(&requests),
                    Arc::clone(&ok),
                    Arc::clone(&failures),
                );
                let (url, key) = (format!("{base}/v1/responses"), key.to_owned());
                tokio::spawn(async move {
                    let client = crate::client();
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let stream = (i + c as u64).is_multiple_of(2);
                        i += 1;
                        requests.fetch_add(1, Ordering::Relaxed);
                        match one(&client, &url, &key, stream).await {
                            Ok(()) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => failures.lock().expect("lock").push(e),
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            requests,
            ok,
            failures,
            tasks,
        }
    }

    /// Complete answers so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Waits until `n` more complete answers arrived (at most `limit`).
    pub async fn advance(&self, n: u64, limit: Duration) {
        let target = self.ok() + n;
        let deadline = Instant::now() + limit;
        while self.ok() < target {
            assert!(
                Instant::now() < deadline,
                "the load stalled at {} answers; failures: {:?}",
                self.ok(),
                self.failures.lock().expect("lock")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the clients after their current request; the counts.
    pub async fn stop(self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load client");
        }
        let failures = std::mem::take(&mut *self.failures.lock().expect("lock"));
        LoadReport {
            requests: self.requests.load(Ordering::Relaxed),
            ok: self.ok.load(Ordering::Relaxed),
            failures,
        }
    }
}

async fn one(client: &reqwest::Client, url: &str, key: &str, stream: bool) -> Result<(), String> {
    let r = client
        .post(url)
        .bearer_auth(key)
        .json(&serde_json::json!({"model": "gpt-5.5", "input": "outage", "stream": stream}))
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = r.status().as_u16();
    let body = r.text().await.map_err(|e| format!("body: {e}"))?;
    let complete = if stream {
        body.contains("event: response.completed")
    } else {
        body.contains("\"output\"") && body.contains("\"completed\"")
    };
    if status == 200 && complete {
        Ok(())
    } else {
        Err(format!(
            "{status} (stream {stream}): {}",
            body.chars().take(300).collect::<String>()
        ))
    }
}

/// The usage records in `db` (read with its own runtime, off any async test runtime).
pub fn usage_rows(db: &admin::DbTarget) -> u64 {
    let db = db.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async {
            let s = admin::storage::open(&db).await.expect("open storage");
            let n = s.usage_count().await.expect("usage count");
            let _ = s.close().await;
            n
        })
    })
    .join()
    .expect("usage rows thread")
}

/// Waits until `db` holds exactly `want` usage records (never more; at most `limit`).
pub async fn until_usage_rows(db: &admin::DbTarget, want: u64, limit: Duration) {
    until("usage rows == requests", limit, || {
        let db = db.clone();
        async move {
            let n = tokio::task::spawn_blocking(move || usage_rows(&db))
                .await
                .expect("usage rows");
            assert!(n <= want, "{n} rows for {want} requests");
            (n == want).then_some(())
        }
    })
    .await;
}

/// Polls `f` every 100 ms until it returns `Some` (at most `limit`; `what` names it in the
/// failure).
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /healthz` of a data plane: (status code, JSON body).
pub async fn healthz(base: &str) -> (u16, serde_json::Value) {
    let r = crate::client()
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("GET /healthz");
    let code = r.status().as_u16();
    (code, r.json().await.expect("healthz JSON"))
}
