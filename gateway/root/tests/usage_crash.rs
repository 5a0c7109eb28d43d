//! Usage records survive `kill -9` of the real `codex-gateway` binary: records the sidecar
//! took off its queue are in the durable spool file (or already in the database), and the
//! next start replays the spool, each record exactly once.
//!
//! (A binary test lives here, where Cargo sets `CARGO_BIN_EXE_codex-gateway`; the in-process
//! usage tests are in `tests/tests/usage.rs`.)

// Harness code (stacks, helpers) may unwrap: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use benches::{MockCodex, MockConfig};
use support::{http, metric, prepare, serve};

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
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_owned();
    let (_, key) = prepare(dir.path(), &mock, "acct-crash");

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
