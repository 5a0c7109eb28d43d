//! The official Python SDKs (OpenAI, Anthropic) as clients: the scripts under
//! `tests/python/`, run with the venv `tests/run.sh` prepares (their shared failure report,
//! `check`, is `tests/python/sdk_common.py`).
//!
//! # Key Components
//! - [`python`]: the interpreter (`CODEX_GATEWAY_TEST_PYTHON`, else the venv, else `python3`).
//! - [`run_python`]: runs one script to its end and asserts that it succeeded.

use std::{
    io::Write,
    process::{Command, Stdio},
};

/// The Python interpreter: `CODEX_GATEWAY_TEST_PYTHON`, else `target/py-venv` when it exists,
/// else `python3`.
pub fn python() -> String {
    if let Ok(p) = std::env::var("CODEX_GATEWAY_TEST_PYTHON") {
        return p;
    }
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/py-venv/bin/python");
    if std::path::Path::new(venv).exists() {
        return venv.to_owned();
    }
    "python3".to_owned()
}

/// Runs `tests/python/{script} ARGS` (without proxies, `stdin` piped in) to its end; panics
/// with its output unless it exited 0 (`sdk` names the SDK it needs, for the hint). Returns its
/// stdout.
pub fn run_python(script: &str, args: &[&str], stdin: &str, sdk: &str) -> String {
    let py = python();
    let path = format!("{}/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(&py)
        .arg(&path)
        .args(args)
        .env("NO_PROXY", "*")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {py} (run tests/run.sh to prepare the venv): {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} {args:?} failed (python: {py}; tests/run.sh installs the {sdk} SDK)\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
