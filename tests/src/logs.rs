//! The gateway's own logs captured in memory, for the tests that prove no secret is logged.
//!
//! # Key Components
//! - [`capture_trace_logs`]: installs the test binary's subscriber at `trace`, into memory.
//! - [`CapturedLogs`]: what was logged so far, as text.
//! - [`secret_probe`] / [`assert_not_logged`]: a secret's distinctive tail, looked for in a log.

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

/// Log output written to memory (a `tracing_subscriber` writer), shared with the test.
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

impl Write for CapturedLogs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the global subscriber (once per test binary: a second call panics) with
/// everything at `trace`, the mock upstream's logs (it is the token
/// issuer) and the harness's own aside, without colours; answers what it captures.
pub fn capture_trace_logs() -> CapturedLogs {
    let logs = CapturedLogs::default();
    let w = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "trace,benches=off,integration_tests=off",
        ))
        .with_ansi(false)
        .with_writer(move || w.clone())
        .init();
    logs
}

/// The part of `secret` looked for in logs and answers: its last 24 characters (a JWT's
/// signature-free prefix would be a leak too, so the distinctive tail is what counts).
pub fn secret_probe(secret: &str) -> &str {
    &secret[secret.len().saturating_sub(24)..]
}

/// Panics with the log line when `log` holds the [`secret_probe`] of `secret`.
pub fn assert_not_logged(log: &str, secret: &str) {
    let probe = secret_probe(secret);
    if let Some(at) = log.find(probe) {
        let from = log[..at].rfind('\n').map_or(0, |p| p + 1);
        let to = log[at..].find('\n').map_or(log.len(), |p| at + p);
        panic!("a secret reached the logs: {}", &log[from..to]);
    }
}
