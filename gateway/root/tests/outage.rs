//! Process-level faults of the real `codex-gateway` binary (issue 15): `kill -9` while a token
//! refresh is in flight loses no refresh token, and SIGTERM drains open streams to their end.
//! (PostgreSQL, Redis and sidecar task outages under load: `tests/tests/outage.rs`.)

// Harness code (stacks, helpers) may unwrap: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    sync::mpsc,
    time::{Duration, Instant},
};

use benches::{MockCodex, MockConfig};
use support::{admin, http, prepare, serve_with};

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kill -9` while the token endpoint is still answering a refresh (it takes 2 s): after a
/// restart the account refreshes with the refresh token the endpoint still accepts (nothing
/// rotated for a client that vanished), and serves on the new access token (strict tokens).
#[test]
fn kill_9_during_a_token_refresh_loses_no_refresh_token() {
    let delay = Duration::from_secs(2);
    let mock = MockCodex::start(MockConfig {
        token_delay: delay,
        strict_tokens: true,
        ..MockConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_owned();
    let (original, key) = prepare(dir.path(), &mock, "acct-rt");
    let token_url = mock.token_url();
    let args = ["--oauth-token-url", token_url.as_str()];
    let mut gw = serve_with(&d, &mock.base_url(), &args);
    let r = admin(&gw.admin, "POST", "/api/admin/accounts/1/refresh", "{}");
    assert!(r.starts_with("HTTP/1.1 202"), "{r}");
    wait_until(
        "the refresh at the token endpoint",
        Duration::from_secs(10),
        || mock.token_calls() == 1,
    );
    gw.child.kill().unwrap(); // SIGKILL while the endpoint has not answered
    gw.child.wait().unwrap();
    std::thread::sleep(delay + Duration::from_millis(500));
    let after_kill = mock.account_tokens("acct-rt").unwrap();
    eprintln!(
        "after kill -9 the endpoint {} the refresh token",
        if after_kill.refresh_token == original.refresh_token {
            "kept"
        } else {
            "rotated"
        }
    );

    let gw = serve_with(&d, &mock.base_url(), &args);
    let r = admin(&gw.admin, "POST", "/api/admin/accounts/1/refresh", "{}");
    assert!(r.starts_with("HTTP/1.1 202"), "{r}");
    wait_until("the second refresh", Duration::from_secs(20), || {
        mock.account_tokens("acct-rt").unwrap().refresh_token != after_kill.refresh_token
    });
    let fresh = mock.account_tokens("acct-rt").unwrap();
    wait_until(
        "the account active on its new token",
        Duration::from_secs(10),
        || {
            let a = admin(&gw.admin, "GET", "/api/admin/accounts/1", "");
            a.contains("\"status\":\"active\"")
            && http(
                &gw.addr,
                &format!("POST /v1/responses HTTP/1.1\r\nauthorization: Bearer {key}\r\ncontent-type: application/json"),
                r#"{"model":"gpt-5.5","input":"after the crash"}"#,
            )
            .starts_with("HTTP/1.1 200")
        },
    );
    let last = mock.requests().pop().unwrap();
    assert_eq!(
        last.header("authorization").unwrap(),
        format!("Bearer {}", fresh.access_token)
    );
    let mut child = gw.child;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// SIGTERM with long streams open: every stream ends complete (its terminal event and the
/// chunked end) within the grace period, a new connection is refused meanwhile, and the
/// process exits 0.
#[test]
fn sigterm_drains_open_streams_to_their_end() {
    const STREAMS: usize = 4;
    let mock = MockCodex::start(MockConfig {
        deltas: 12,
        inter_event_delay: Duration::from_millis(250),
        ..MockConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_owned();
    let (_, key) = prepare(dir.path(), &mock, "acct-drain");
    let conf = dir.path().join("config.toml");
    std::fs::write(&conf, "shutdown_grace_secs = 15\n").unwrap();
    let gw = serve_with(&d, &mock.base_url(), &["--config", conf.to_str().unwrap()]);

    let (started_tx, started) = mpsc::channel();
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| {
            let (addr, key, started) = (gw.addr.clone(), key.clone(), started_tx.clone());
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let body = format!(r#"{{"model":"gpt-5.5","input":"drain {i}","stream":true}}"#);
                write!(
                    s,
                    "POST /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
                let mut out = Vec::new();
                let mut buf = [0u8; 4096];
                let mut told = false;
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            out.extend_from_slice(&buf[..n]);
                            if !told && out.windows(6).any(|w| w == b"delta\"") {
                                told = true;
                                started.send(()).unwrap();
                            }
                            if out.ends_with(b"0\r\n\r\n") {
                                break;
                            }
                        }
                        Err(e) => panic!("stream {i}: {e} after {} bytes", out.len()),
                    }
                }
                String::from_utf8_lossy(&out).into_owned()
            })
        })
        .collect();
    for _ in 0..STREAMS {
        started
            .recv_timeout(Duration::from_secs(20))
            .expect("every stream started");
    }
    let t0 = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // The listener leaves service at once: a new connection is refused.
    std::thread::sleep(Duration::from_millis(300));
    let refused = TcpStream::connect(&gw.addr);
    assert!(
        refused.is_err(),
        "a new connection was accepted while draining"
    );
    for (i, s) in streams.into_iter().enumerate() {
        let text = s.join().unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "stream {i}: {text}");
        assert!(
            text.contains("event: response.completed"),
            "stream {i} did not end complete: {text}"
        );
        assert!(text.ends_with("0\r\n\r\n"), "stream {i}: {text}");
        assert_eq!(text.matches("event: response.completed").count(), 1);
    }
    let drained = t0.elapsed();
    let mut child = gw.child;
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(drained < Duration::from_secs(15), "{drained:?}");
    eprintln!(
        "{STREAMS} streams drained {drained:?} after SIGTERM; exit after {:?}",
        t0.elapsed()
    );
}
