//! Shared by the binary tests in `gateway/tests/` (where Cargo sets
//! `CARGO_BIN_EXE_codex-gateway`): start the real binary, speak HTTP/1.1 to it, read a metric,
//! prepare a data directory with an account of a mock upstream and a client key.

#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::Duration,
};

use benches::{IssuedTokens, MockAccount, MockHandle};

pub const BIN: &str = env!("CARGO_BIN_EXE_codex-gateway");

/// The binary with a clean `CODEX_GATEWAY_*` environment.
pub fn gw() -> Command {
    let mut c = Command::new(BIN);
    c.env("RUST_LOG", "info");
    for (k, _) in std::env::vars() {
        if k.starts_with("CODEX_GATEWAY_") {
            c.env_remove(k);
        }
    }
    c
}

/// A running `codex-gateway serve`.
pub struct Served {
    pub child: Child,
    /// Data-plane address.
    pub addr: String,
    /// Admin address.
    pub admin: String,
}

/// The admin token every [`serve`]d gateway is started with.
pub const ADMIN_TOKEN: &str = "binary-test-admin";

/// Starts `serve` on `dir` against `upstream` (`extra`: more arguments); returns when it
/// listens.
pub fn serve_with(dir: &str, upstream: &str, extra: &[&str]) -> Served {
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
        .args(extra)
        .env("CODEX_GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let line = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "gateway exited before listening"
        );
        if let Some(rest) = line.strip_prefix("codex-gateway listening on http://") {
            break rest.to_owned();
        }
    };
    let addr = line.split_whitespace().next().unwrap().to_owned();
    let admin = line
        .split("admin http://")
        .nth(1)
        .and_then(|r| r.split([';', ')']).next())
        .unwrap()
        .to_owned();
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = stderr.read_to_string(&mut sink);
    });
    Served { child, addr, admin }
}

/// [`serve_with`] without extra arguments: `(child, data-plane address)`.
pub fn serve(dir: &str, upstream: &str) -> (Child, String) {
    let s = serve_with(dir, upstream, &[]);
    (s.child, s.addr)
}

/// One HTTP/1.1 exchange on a fresh connection (`head`: request line and headers, without
/// `connection` and `content-length`); returns the whole response text.
fn exchange(addr: &str, head: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{head}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// One HTTP/1.1 exchange on a fresh connection; returns the whole response text.
pub fn http(addr: &str, head: &str, body: &str) -> String {
    exchange(addr, &format!("{head}\r\nhost: x"), body)
}

/// A metric of the data plane (0 when absent).
pub fn metric(addr: &str, name: &str) -> u64 {
    let text = http(addr, "GET /metrics HTTP/1.1", "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// Imports one account of `mock` (named `name`) into `dir` with the binary and creates a
/// client key; `(tokens, key)`.
pub fn prepare(dir: &std::path::Path, mock: &MockHandle, name: &str) -> (IssuedTokens, String) {
    let d = dir.to_str().unwrap();
    let t = mock.add_account(MockAccount::new(name));
    let auth = dir.join("auth.json");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auth_mode":"chatgpt","tokens":{{"id_token":"{}","access_token":"{}","refresh_token":"{}","account_id":"{}"}},"last_refresh":"2026-11-29T00:00:00Z"}}"#,
            t.id_token, t.access_token, t.refresh_token, t.account_id
        ),
    )
    .unwrap();
    assert!(gw()
        .args(["accounts", "import", "--data-dir", d])
        .arg(&auth)
        .output()
        .unwrap()
        .status
        .success());
    let key = String::from_utf8(
        gw().args(["keys", "create", "k", "--data-dir", d])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    (t, key)
}

/// An admin API request (static admin token, loopback `Host`, JSON); the response text.
pub fn admin(admin: &str, method: &str, path: &str, body: &str) -> String {
    exchange(
        admin,
        &format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {ADMIN_TOKEN}\r\ncontent-type: application/json"),
        body,
    )
}
