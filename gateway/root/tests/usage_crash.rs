//! Usage records survive `kill -9` of the real `codex-gateway` binary: records the sidecar
//! took off its queue are in the durable spool file (or already in the database), and the
//! next start replays the spool, each record exactly once.
//!
//! (A binary test lives here, where Cargo sets `CARGO_BIN_EXE_codex-gateway`; the in-process
//! usage tests are in `tests/tests/usage.rs`.)

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use benches::{MockAccount, MockCodex, MockConfig};

const BIN: &str = env!("CARGO_BIN_EXE_codex-gateway");

fn gw() -> Command {
    let mut c = Command::new(BIN);
    c.env("RUST_LOG", "info");
    for (k, _) in std::env::vars() {
        if k.starts_with("CODEX_GATEWAY_") {
            c.env_remove(k);
        }
    }
    c
}

/// Starts `serve` on `dir`; returns the child and the data-plane address.
fn serve(dir: &str, upstream: &str) -> (Child, String) {
    let mut child = gw()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--data-dir",
            dir,
            "--upstream-base-url",
            upstream,
        ])
        .env("CODEX_GATEWAY_ADMIN_TOKEN", "usage-crash-admin")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "gateway exited before listening"
        );
        if let Some(rest) = line.strip_prefix("codex-gateway listening on http://") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = stderr.read_to_string(&mut sink);
    });
    (child, addr)
}

/// One HTTP/1.1 exchange on a fresh connection; returns the whole response text.
fn http(addr: &str, head: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{head}\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A metric of the data plane (0 when absent).
fn metric(addr: &str, name: &str) -> u64 {
    let text = http(addr, "GET /metrics HTTP/1.1", "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

fn stored_rows(dir: &std::path::Path) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = admin::storage::open(&admin::DbTarget {
            data_dir: dir.to_path_buf(),
            database_url: None,
        })
        .await
        .unwrap();
        let n = s.usage_count().await.unwrap();
        s.close().await.unwrap();
        n
    })
}

#[test]
fn kill_9_right_after_requests_loses_no_usage_record() {
    const N: u64 = 30;
    let mock = MockCodex::start(MockConfig::default()).unwrap();
    let t = mock.add_account(MockAccount::new("acct-crash"));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_owned();
    let auth = dir.path().join("auth.json");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auth_mode":"chatgpt","tokens":{{"id_token":"{}","access_token":"{}","refresh_token":"{}","account_id":"{}"}},"last_refresh":"2026-11-29T00:00:00Z"}}"#,
            t.id_token, t.access_token, t.refresh_token, t.account_id
        ),
    )
    .unwrap();
    assert!(gw()
        .args(["accounts", "import", "--data-dir", &d])
        .arg(&auth)
        .output()
        .unwrap()
        .status
        .success());
    let key = String::from_utf8(
        gw().args(["keys", "create", "k", "--data-dir", &d])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();

    let (mut child, addr) = serve(&d, &mock.base_url());
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nauthorization: Bearer {key}\r\ncontent-type: application/json"
    );
    for i in 0..N {
        let r = http(
            &addr,
            &head,
            &format!(
                r#"{{"model":"gpt-5.5","input":"hi {i}","stream":{}}}"#,
                i % 2 == 0
            ),
        );
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    // Every record is either in the spool file or in the database (the sidecar took it off
    // its queue); the database write waits for its batch window, so most are only spooled.
    let deadline = Instant::now() + Duration::from_secs(20);
    let spooled = loop {
        let spooled = metric(&addr, "codex_gateway_usage_spool_records");
        let persisted = metric(&addr, "codex_gateway_usage_persisted_total");
        if spooled + persisted >= N {
            break spooled;
        }
        assert!(Instant::now() < deadline, "records never reached the spool");
        std::thread::sleep(Duration::from_millis(1));
    };
    child.kill().unwrap(); // SIGKILL: no drain, no flush
    child.wait().unwrap();
    let before = stored_rows(dir.path());
    assert!(before <= N);
    eprintln!("at kill -9: {spooled} spooled, {before} in the database");

    // The next start replays the spool; every record lands exactly once.
    let (mut child, addr) = serve(&d, &mock.base_url());
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&addr, "codex_gateway_usage_spool_records") > 0 || stored_rows(dir.path()) < N {
        assert!(
            Instant::now() < deadline,
            "replay incomplete: {} rows",
            stored_rows(dir.path())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(stored_rows(dir.path()), N, "every request exactly once");
    assert!(
        metric(&addr, "codex_gateway_usage_replayed_total") >= N - before,
        "the records not in the database came back from the spool"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
