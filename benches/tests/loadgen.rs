//! loadgen against an in-process mock-codex: event counts match what the mock sent, errors
//! are classified, and the target process is sampled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use benches::{
    loadgen::{self, LoadConfig},
    MockCodex, MockConfig, MockHandle,
};

fn mock() -> MockHandle {
    MockCodex::start(MockConfig {
        max_recorded: 0,
        ..MockConfig::default()
    })
    .expect("mock starts")
}

fn cfg(mock: &MockHandle, metadata: &[(&str, &str)]) -> LoadConfig {
    let metadata: Vec<(String, String)> = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    LoadConfig {
        url: format!("{}/responses", mock.base_url()),
        body: loadgen::responses_body("gpt-5.1-codex", "hi", true, &metadata),
        headers: vec![
            ("authorization".into(), "Bearer at-test".into()),
            ("chatgpt-account-id".into(), "acct-1".into()),
        ],
        ..LoadConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_every_event_the_mock_sent() {
    let mock = mock();
    // 4 leading events (at once) + 20 deltas + 4 closing events, 5 ms apart.
    let mut c = cfg(
        &mock,
        &[("x-mock-tokens", "20"), ("x-mock-events-per-second", "200")],
    );
    c.concurrency = 20;
    c.ramp_up = Duration::from_millis(200);
    c.duration = None;
    c.requests = Some(60);
    c.target_pids = vec![std::process::id()];
    let r = loadgen::run(c).await.unwrap();
    println!("{}", r.table());
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.requests_ok, 60);
    assert_eq!(r.requests_cut, 0);
    assert_eq!(mock.completed_streams(), 60);
    assert_eq!(r.events, 60 * 28);
    assert_eq!(r.events_window, r.events);
    assert!(r.open_streams_peak >= 10 && r.open_streams_peak <= 20);
    assert!(r.ttfb_ms.count == 60 && r.ttfb_ms.p50 > 0.0);
    // 27 gaps of ~5 ms per stream.
    assert_eq!(r.gap_ms.count, 60 * 27);
    assert!(
        r.gap_ms.p50 >= 3.0 && r.gap_ms.p50 <= 20.0,
        "{:?}",
        r.gap_ms
    );
    assert!(r.latency_ms.p50 >= 27.0 * 5.0 * 0.8, "{:?}", r.latency_ms);
    let t = r.target.as_ref().expect("target sampled");
    assert!(t.cpu_secs_window > 0.0 && t.cpu_us_per_event > 0.0);
    assert!(t.rss_start_kib > 0 && t.rss_peak_kib >= t.rss_start_kib);
    // The JSON report round-trips.
    let json = serde_json::to_string(&r).unwrap();
    let back: loadgen::Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back.events, r.events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_cuts_open_streams_without_errors() {
    let mock = mock();
    let mut c = cfg(
        &mock,
        &[
            ("x-mock-tokens", "100000"),
            ("x-mock-events-per-second", "50"),
        ],
    );
    c.concurrency = 20;
    c.ramp_up = Duration::from_millis(300);
    c.duration = Some(Duration::from_millis(1500));
    let r = loadgen::run(c).await.unwrap();
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.open_streams_peak, 20);
    assert_eq!(r.requests_cut, 20);
    assert_eq!(r.requests_ok, 0);
    // ~20 streams x 50 events/s over the 1.5 s window.
    assert!(
        r.events_per_sec > 600.0 && r.events_per_sec < 1200.0,
        "{}",
        r.events_per_sec
    );
    assert!(mock.wait_active_streams(0, Duration::from_secs(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classifies_failures() {
    let mock = mock();
    let run = |meta: &[(&str, &str)]| {
        let mut c = cfg(&mock, meta);
        c.concurrency = 2;
        c.duration = None;
        c.requests = Some(4);
        loadgen::run(c)
    };
    let r = run(&[("x-mock-error", "usage_limit_reached")])
        .await
        .unwrap();
    assert_eq!(r.errors.status.get(&429), Some(&4));
    let r = run(&[("x-mock-fail-in-stream", "server_is_overloaded")])
        .await
        .unwrap();
    assert_eq!(r.errors.stream_failed, 4);
    let r = run(&[("x-mock-disconnect-after", "3")]).await.unwrap();
    assert_eq!(r.errors.io + r.errors.truncated, 4, "{:?}", r.errors);
    let mut c = cfg(&mock, &[]);
    c.url = "http://127.0.0.1:1/responses".into();
    c.duration = None;
    c.requests = Some(2);
    let r = loadgen::run(c).await.unwrap();
    assert_eq!(r.errors.connect, 2);
}

fn ws_cfg(mock: &MockHandle, metadata: &[(&str, &str)], ws: loadgen::ws::WsConfig) -> LoadConfig {
    let mut c = cfg(mock, metadata);
    c.url = mock.ws_url();
    c.ws = Some(ws);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_turns_chained_by_previous_response_id() {
    // Recording on: the frames the mock received are checked.
    let mock = MockCodex::start(MockConfig::default()).expect("mock starts");
    let mut c = ws_cfg(
        &mock,
        &[("x-mock-tokens", "5")],
        loadgen::ws::WsConfig {
            turns: 3,
            chain: true,
            think_time: Duration::from_millis(5),
            idle: false,
        },
    );
    c.concurrency = 4;
    c.duration = None;
    c.requests = Some(12);
    c.target_pids = vec![std::process::id()];
    let r = loadgen::run(c).await.unwrap();
    println!("{}", r.table());
    assert_eq!(r.mode, "ws");
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.requests_ok, 12);
    assert_eq!(r.requests_cut, 0);
    // codex.rate_limits + 4 leading events + 5 deltas + 4 closing events per turn.
    assert_eq!(r.events, 12 * 14);
    assert_eq!(r.ttfb_ms.count, 12);
    assert_eq!(r.latency_ms.count, 12);
    assert_eq!(r.gap_ms.count, 12 * 13);
    assert!(r.sessions >= 4 && r.sessions <= 12, "{}", r.sessions);
    assert_eq!(r.sessions as usize, mock.ws_handshakes());
    assert_eq!(r.connect_ms.count, r.sessions);
    assert!(r.open_streams_peak >= 1 && r.open_streams_peak <= 4);
    // Every turn but the first of each socket names the previous response; the mock
    // answered them all (an unknown id would be an error event).
    let frames: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|q| q.method == "WS")
        .collect();
    assert_eq!(frames.len(), 12);
    let chained = frames
        .iter()
        .filter(|q| {
            q.json
                .as_ref()
                .and_then(|j| j.get("previous_response_id"))
                .is_some()
        })
        .count();
    assert_eq!(chained as u64, 12 - r.sessions);
    assert!(frames.iter().all(|q| q
        .json
        .as_ref()
        .is_some_and(|j| j["type"] == "response.create")));
    assert!(mock.wait_ws_open(0, Duration::from_secs(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_idle_sessions_are_held_until_the_deadline() {
    let mock = mock();
    let mut c = ws_cfg(
        &mock,
        &[],
        loadgen::ws::WsConfig {
            turns: 1,
            idle: true,
            ..Default::default()
        },
    );
    c.concurrency = 10;
    c.ramp_up = Duration::from_millis(100);
    c.duration = Some(Duration::from_secs(3));
    c.target_pids = vec![std::process::id()];
    let r = loadgen::run(c).await.unwrap();
    println!("{}", r.table());
    assert_eq!(r.mode, "ws-idle");
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.sessions, 10);
    assert_eq!(r.requests_ok, 10);
    assert_eq!(r.open_streams_peak, 10);
    assert_eq!(r.open_at_window_end, 10);
    let t = r.target.as_ref().expect("target sampled");
    assert!(t.rss_window_end_kib > 0);
    assert!(mock.wait_ws_open(0, Duration::from_secs(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_classifies_failures() {
    let mock = mock();
    let run = |meta: &[(&str, &str)]| {
        let mut c = ws_cfg(&mock, meta, loadgen::ws::WsConfig::default());
        c.concurrency = 2;
        c.duration = None;
        c.requests = Some(4);
        loadgen::run(c)
    };
    // An error event keeps the socket: 4 failed turns on 2 sockets.
    let r = run(&[("x-mock-error", "usage_limit_reached")])
        .await
        .unwrap();
    assert_eq!(r.errors.stream_failed, 4, "{:?}", r.errors);
    assert_eq!(r.sessions, 2);
    let r = run(&[("x-mock-fail-in-stream", "server_is_overloaded")])
        .await
        .unwrap();
    assert_eq!(r.errors.stream_failed, 4, "{:?}", r.errors);
    // The socket dropped mid-turn: truncated (or io), and a new socket for the next turn.
    let r = run(&[("x-mock-disconnect-after", "3")]).await.unwrap();
    assert_eq!(r.errors.io + r.errors.truncated, 4, "{:?}", r.errors);
    assert_eq!(r.sessions, 4);
    // A refused upgrade counts by status.
    mock.set_ws_refuse_upgrade(Some(426));
    let r = run(&[]).await.unwrap();
    assert_eq!(r.errors.status.get(&426), Some(&4), "{:?}", r.errors);
    mock.set_ws_refuse_upgrade(None);
    // Nothing listening.
    let mut c = ws_cfg(&mock, &[], loadgen::ws::WsConfig::default());
    c.url = "ws://127.0.0.1:1/responses".into();
    c.duration = None;
    c.requests = Some(2);
    let r = loadgen::run(c).await.unwrap();
    assert_eq!(r.errors.connect, 2);
}
