//! Smoke tests of the `codex-gateway` binary: exit codes, the key and account subcommands, and
//! `serve` draining an open stream on SIGTERM.

// Harness code (stacks, helpers) may unwrap: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use benches::{MockAccount, MockCodex, MockConfig};

mod support;
use support::{gw, serve_with, Served};

#[test]
fn bad_configuration_exits_2_with_one_message() {
    let out = gw()
        .args(["serve", "--listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("configuration error") && err.contains("listen"),
        "{err}"
    );

    let out = gw()
        .args(["serve", "--config", "/nonexistent/codex.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/codex.toml"));

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "wokers = 2\n").unwrap();
    let out = gw().args(["serve", "--config"]).arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("wokers"));

    let out = gw()
        .args(["serve", "--database-url", "mysql://x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn keys_create_list_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = gw()
        .args(["keys", "create", "laptop", "--data-dir", d])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("sk-cg-") && key.len() > 30, "{key}");
    let out = gw()
        .args(["keys", "list", "--data-dir", d])
        .output()
        .unwrap();
    let list = String::from_utf8(out.stdout).unwrap();
    assert!(list.contains("laptop") && list.contains("active"), "{list}");
    assert!(!list.contains(&key), "the key is shown only once");
    let out = gw()
        .args(["keys", "revoke", "laptop", "--data-dir", d])
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = gw()
        .args(["keys", "list", "--data-dir", d])
        .output()
        .unwrap();
    assert!(String::from_utf8(out.stdout).unwrap().contains("revoked"));
    let out = gw()
        .args(["keys", "revoke", "nobody", "--data-dir", d])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn serve_streams_and_drains_on_sigterm() {
    let mock = MockCodex::start(MockConfig {
        deltas: 20,
        inter_event_delay: Duration::from_millis(100),
        ..MockConfig::default()
    })
    .unwrap();
    let t = mock.add_account(MockAccount::new("acct-smoke"));
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
    let out = gw()
        .args(["accounts", "import", "--data-dir", &d])
        .arg(&auth)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("added"), "{summary}");
    let out = gw()
        .args(["accounts", "list", "--data-dir", &d])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        list.contains("acct-smoke") && list.contains("active"),
        "{list}"
    );
    assert!(!list.contains(&t.access_token), "tokens never printed");
    // operations: disable / enable / refresh (token rotation through the OAuth endpoint)
    let out = gw()
        .args(["accounts", "disable", "1", "--data-dir", &d])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = String::from_utf8(
        gw().args(["accounts", "list", "--data-dir", &d])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(list.contains("disabled"), "{list}");
    assert!(gw()
        .args(["accounts", "enable", "1", "--data-dir", &d])
        .status()
        .unwrap()
        .success());
    let out = gw()
        .args([
            "accounts",
            "refresh",
            "1",
            "--data-dir",
            &d,
            "--oauth-token-url",
            &mock.token_url(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(mock.token_calls(), 1);
    assert_eq!(
        gw().args(["accounts", "delete", "99", "--data-dir", &d])
            .status()
            .unwrap()
            .code(),
        Some(1)
    );
    let key = String::from_utf8(
        gw().args(["keys", "create", "k", "--data-dir", &d])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();

    let Served {
        mut child, addr, ..
    } = serve_with(&d, &mock.base_url(), &[]);

    let mut s = TcpStream::connect(&addr).unwrap();
    let body = r#"{"model":"gpt-5.5","input":"hi","stream":true}"#;
    write!(
        s,
        "POST /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("output_text.delta") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    // SIGTERM mid-stream: the open stream must still complete.
    let pid = child.id() as i32;
    assert_eq!(unsafe_kill(pid), 0);
    let start = Instant::now();
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&got).ends_with("0\r\n\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("response.completed"),
        "the open stream finished during the drain"
    );
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(start.elapsed() < Duration::from_secs(30));
    // New connections are refused after the drain.
    assert!(TcpStream::connect(&addr).is_err());
}

/// `codex-gateway demo` (the README's first command) on a fresh data directory: the gateway
/// in front of the in-process mock-codex, `/healthz` up, the printed key streams a response,
/// and SIGTERM ends it cleanly.
#[test]
#[cfg(feature = "demo")] // runs `codex-gateway demo`
fn demo_serves_healthz_and_the_printed_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data-demo");
    let mut child = gw()
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let (mut addr, mut key) = (None, None);
    while addr.is_none() || key.is_none() {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "demo exited before printing its address and key"
        );
        if let Some(rest) = line.strip_prefix("codex-gateway demo is running on http://") {
            addr = rest.split_whitespace().next().map(str::to_owned);
        } else if let Some(k) = line.strip_prefix("demo key: ") {
            key = Some(k.trim().to_owned());
        }
    }
    let (addr, key) = (addr.unwrap(), key.unwrap());
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = stdout.read_to_string(&mut sink);
    });

    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut health = String::new();
    s.read_to_string(&mut health).unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = r#"{"model":"gpt-5.5","input":"say hi","stream":true}"#;
    write!(
        s,
        "POST /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        got.contains("output_text.delta") && got.contains("response.completed"),
        "{got}"
    );

    assert_eq!(unsafe_kill(child.id() as i32), 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

fn unsafe_kill(pid: i32) -> i32 {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .map_or(-1, |s| if s.success() { 0 } else { 1 })
}

/// Log output follows the terminal: stderr piped to a file or a journal gets no ANSI escape
/// codes, and `--log-format json` writes one JSON object per log line (the address banner
/// is a plain line).
#[test]
fn logs_have_no_colours_when_piped_and_json_by_option() {
    let mock = MockCodex::start(MockConfig::default()).unwrap();
    for json in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap().to_owned();
        let mut cmd = gw();
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--data-dir",
            &d,
        ])
        .args(["--upstream-base-url", &mock.base_url()])
        .env("CODEX_GATEWAY_ADMIN_PASSWORD", "smoke-admin-pw")
        .stderr(Stdio::piped());
        if json {
            cmd.args(["--log-format", "json"]);
        }
        let mut child = cmd.spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut logs = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "gateway exited before listening: {logs:?}"
            );
            if line.starts_with("codex-gateway listening on") {
                break;
            }
            logs.push(line);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            !logs.is_empty(),
            "json={json}: no log line before the banner"
        );
        for l in &logs {
            assert!(
                !l.contains('\u{1b}'),
                "json={json}: an escape code in {l:?}"
            );
            if json {
                let v: sonic_rs::Value = sonic_rs::from_str(l.trim_end())
                    .unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"));
                use sonic_rs::JsonValueTrait;
                assert!(
                    v.get("level").is_some() && v.get("message").is_some(),
                    "{l}"
                );
            } else {
                assert!(!l.trim_start().starts_with('{'), "{l}");
            }
        }
    }
}

/// Issue 28: with the default configuration, idle connections past the open-file limit used
/// to take every descriptor (the data plane and the admin `/healthz` both hung, the log
/// filled with "accept failed"). The default connection cap now stays below the limit with a
/// reserve: the binary, started under `ulimit -n 1024`, refuses the excess with 503 and its
/// admin `/healthz` still answers.
#[test]
#[cfg(feature = "demo")] // runs `codex-gateway demo`
fn an_idle_connection_flood_leaves_descriptors_for_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data-flood");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 1024 && exec '{}' demo --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir '{}'",
            support::BIN,
            data.display()
        ))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let (addr, admin) = loop {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "demo exited");
        if let Some(rest) = line.strip_prefix("codex-gateway demo is running on http://") {
            let addr = rest.split_whitespace().next().unwrap().to_owned();
            let admin = rest
                .split("(admin http://")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .unwrap()
                .to_owned();
            break (addr, admin);
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = stdout.read_to_string(&mut sink);
    });
    // More idle connections than the process has descriptors.
    let mut idle = Vec::new();
    for _ in 0..1100 {
        if let Ok(c) = TcpStream::connect(&addr) {
            idle.push(c);
        }
    }
    // An answer, or a close: never a hang (a timed-out read is an error here).
    let get = |addr: &str, path: &str| -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        );
        let mut got = Vec::new();
        match s.read_to_end(&mut got) {
            Ok(_) => String::from_utf8_lossy(&got).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => String::new(),
            Err(e) => panic!("{addr}{path} hangs: {e}"),
        }
    };
    let health = get(&admin, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "admin: {health:?}");
    // The data plane refuses past its cap: at once while the flood's own refusals linger
    // (past their bound a refused connection is closed without an answer), then with a 503.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let refused = get(&addr, "/healthz");
        if refused.starts_with("HTTP/1.1 503") {
            break;
        }
        assert!(refused.is_empty(), "data plane: {refused:?}");
        assert!(Instant::now() < deadline, "never a 503");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(idle);
    // Once the flood is gone, the data plane serves again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = get(&addr, "/healthz");
        if h.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "data plane after the flood: {h:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(unsafe_kill(child.id() as i32), 0);
    let _ = child.wait();
}
