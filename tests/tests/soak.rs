//! Fault soak (issue 15): clients loop random requests (Responses and Chat, streamed and not)
//! while mock-codex injects a random fault into each one (errors at every status of the failure
//! table, failures in the stream before and after output, cut streams, slow first bytes) and
//! some clients walk away mid-stream. Every answer must be complete or exactly one clean error
//! in its dialect; afterwards no account slot is held, no stream is open and the descriptors
//! are back to their baseline.
//!
//! Short in CI (`CODEX_GATEWAY_SOAK_SECS`, default 12 s per driver, both drivers at once); the
//! long local run is `CODEX_GATEWAY_SOAK_SECS=1800 cargo test -p integration-tests --test soak
//! -- --nocapture` (see docs/hardening.md).

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    rc::Rc,
    time::{Duration, Instant},
};

use integration_tests::{client, parse_sse, Stack, StackBuilder};
use serde_json::{json, Value};

/// Deterministic pseudo-random numbers (xorshift64*), seeded per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The fault a request asks mock-codex for (`client_metadata`), with its weight.
const FAULTS: &[(u64, &[(&str, &str)])] = &[
    (1500, &[]),
    (6, &[("x-mock-fail-in-stream", "server_is_overloaded")]),
    (6, &[("x-mock-fail-after-output", "server_is_overloaded")]),
    (6, &[("x-mock-disconnect-after", "3")]),
    (4, &[("x-mock-disconnect-after", "0")]),
    (5, &[("x-mock-first-byte-delay-ms", "40")]),
    (
        4,
        &[
            ("x-mock-error", "rate_limit_exceeded"),
            ("x-mock-retry-after", "1"),
        ],
    ),
    (
        5,
        &[
            ("x-mock-error", "server_is_overloaded"),
            ("x-mock-retry-after", "1"),
        ],
    ),
    (
        5,
        &[("x-mock-error", "internal"), ("x-mock-retry-after", "1")],
    ),
    (3, &[("x-mock-error", "context_length_exceeded")]),
    (3, &[("x-mock-error", "unsupported_parameter")]),
    (1, &[("x-mock-error", "cloudflare")]),
    (4, &[("x-mock-incomplete", "max_output_tokens")]),
    (4, &[("x-mock-tool-call", "shell")]),
    (
        3,
        &[
            ("x-mock-reasoning", "1"),
            ("x-mock-empty-completed-output", "1"),
        ],
    ),
];

/// What one request was.
#[derive(Debug, Clone, Copy)]
enum Route {
    Responses,
    Chat,
}

#[derive(Default)]
struct Tally {
    ok: Cell<u64>,
    clean_errors: Cell<u64>,
    abandoned: Cell<u64>,
    /// Clean errors by status and code.
    codes: RefCell<BTreeMap<String, u64>>,
}

impl Tally {
    fn error(&self, status: u16, body: &str) {
        let code = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        *self
            .codes
            .borrow_mut()
            .entry(format!("{status} {code}"))
            .or_default() += 1;
        self.clean_errors.set(self.clean_errors.get() + 1);
    }
}

fn metadata(rng: &mut Rng) -> (Value, String) {
    let total: u64 = FAULTS.iter().map(|(w, _)| w).sum();
    let mut at = rng.pick(total);
    let mut chosen: &[(&str, &str)] = &[];
    for (w, f) in FAULTS {
        if at < *w {
            chosen = f;
            break;
        }
        at -= w;
    }
    let mut m = serde_json::Map::new();
    for (k, v) in chosen {
        m.insert((*k).to_owned(), json!(v));
    }
    let label = chosen
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    (Value::Object(m), label)
}

/// An error body in the OpenAI dialect: `{"error":{"message":...}}`.
fn is_clean_error(body: &str) -> bool {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.get("message")?.as_str().map(|_| ()))
        .is_some()
}

/// Checks one answer; panics with the request's description when it is neither complete nor
/// exactly one clean error.
fn check(route: Route, stream: bool, status: u16, body: &str, what: &str, tally: &Tally) {
    if status != 200 {
        assert!(
            is_clean_error(body),
            "{what}: status {status} without a clean error body: {body}"
        );
        tally.error(status, body);
        return;
    }
    match (route, stream) {
        (Route::Responses, false) => {
            let v: Value =
                serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
            assert!(v["output"].is_array(), "{what}: no output: {body}");
            tally.ok.set(tally.ok.get() + 1);
        }
        (Route::Chat, false) => {
            let v: Value =
                serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
            assert!(v["choices"].is_array(), "{what}: no choices: {body}");
            tally.ok.set(tally.ok.get() + 1);
        }
        (Route::Responses, true) => {
            let events = parse_sse(body);
            let terminals: Vec<usize> = events
                .iter()
                .enumerate()
                .filter(|(_, (ty, _))| {
                    matches!(
                        ty.as_str(),
                        "response.completed" | "response.failed" | "response.incomplete"
                    )
                })
                .map(|(i, _)| i)
                .collect();
            assert_eq!(
                terminals.len(),
                1,
                "{what}: {} terminal events in a stream: {body}",
                terminals.len()
            );
            assert_eq!(
                terminals[0],
                events.len() - 1,
                "{what}: events after the terminal: {body}"
            );
            if events[terminals[0]].0 == "response.failed" {
                tally.clean_errors.set(tally.clean_errors.get() + 1);
            } else {
                tally.ok.set(tally.ok.get() + 1);
            }
        }
        (Route::Chat, true) => {
            let datas: Vec<&str> = body
                .split("\n\n")
                .filter_map(|f| f.trim().strip_prefix("data:").map(str::trim))
                .collect();
            let errors = datas.iter().filter(|d| d.starts_with("{\"error\"")).count();
            let done = datas.last() == Some(&"[DONE]");
            if errors > 0 {
                assert_eq!(errors, 1, "{what}: {errors} error objects: {body}");
                assert!(!done, "{what}: an error and [DONE]: {body}");
                assert!(
                    datas.last().is_some_and(|d| d.starts_with("{\"error\"")),
                    "{what}: chunks after the error: {body}"
                );
                tally.clean_errors.set(tally.clean_errors.get() + 1);
            } else {
                assert!(done, "{what}: neither [DONE] nor an error: {body}");
                let finished = datas
                    .iter()
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .any(|v| v["choices"][0]["finish_reason"].is_string());
                assert!(finished, "{what}: no finish_reason: {body}");
                tally.ok.set(tally.ok.get() + 1);
            }
        }
    }
}

/// One client: requests back to back until `until`.
async fn client_loop(s: Rc<Stack>, seed: u64, until: Instant, tally: Rc<Tally>) {
    let mut rng = Rng(seed | 1);
    let http = client();
    while Instant::now() < until {
        let route = if rng.pick(3) == 0 {
            Route::Chat
        } else {
            Route::Responses
        };
        let stream = rng.pick(3) != 0;
        // Chat requests carry no mock controls (the translation does not forward
        // client_metadata): they exercise the walk-aways and the load only.
        let (meta, label) = match route {
            Route::Responses => metadata(&mut rng),
            Route::Chat => (json!({}), "chat, no fault".to_owned()),
        };
        let walk_away = stream && rng.pick(25) == 0;
        let (path, body) = match route {
            Route::Responses => (
                "/v1/responses",
                json!({"model": "gpt-5.5", "input": "soak", "stream": stream, "client_metadata": meta}),
            ),
            Route::Chat => (
                "/v1/chat/completions",
                json!({"model": "gpt-5.5", "messages": [{"role": "user", "content": "soak"}],
                       "stream": stream}),
            ),
        };
        let what = format!("{route:?} stream={stream} [{label}]");
        let r = http
            .post(format!("{}{path}", s.url()))
            .bearer_auth(&s.key)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: send: {e}"));
        let status = r.status().as_u16();
        if walk_away && status == 200 {
            let mut r = r;
            let _ = r.chunk().await;
            drop(r);
            tally.abandoned.set(tally.abandoned.get() + 1);
            continue;
        }
        let text = r
            .text()
            .await
            .unwrap_or_else(|e| panic!("{what}: body: {e}"));
        check(route, stream, status, &text, &what, &tally);
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// TCP sockets of this process: "local->remote state" by inode (for the failure message).
fn tcp_sockets() -> Vec<String> {
    let mut inodes = std::collections::BTreeSet::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(p) = std::fs::read_link(e.path()) {
            if let Some(i) = p.display().to_string().strip_prefix("socket:[") {
                inodes.insert(i.trim_end_matches(']').to_owned());
            }
        }
    }
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
            if !inodes.contains(*f.get(9)?) {
                return None;
            }
            Some(format!("{}->{} st{}", port(f[1])?, port(f[2])?, f[3]))
        })
        .collect()
}

/// What each open descriptor is (for the failure message).
fn fd_targets() -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        let t = std::fs::read_link(e.path()).map_or_else(
            |_| "?".into(),
            |p| {
                let s = p.display().to_string();
                // socket:[123] / anon_inode:[eventfd] -> the kind only
                s.split(":[").next().unwrap_or(&s).to_owned()
            },
        );
        *out.entry(t).or_default() += 1;
    }
    out
}

const ACCOUNTS: usize = 8;

fn stack(legacy: bool) -> Rc<Stack> {
    Rc::new(
        StackBuilder {
            accounts: ACCOUNTS,
            workers: 2,
            legacy,
            ..StackBuilder::default()
        }
        .start(),
    )
}

async fn soak(s: Rc<Stack>, legacy: bool, secs: u64) -> Rc<Tally> {
    let tally = Rc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(secs);
    let clients: Vec<_> = (0..12u64)
        .map(|i| {
            tokio::task::spawn_local(client_loop(
                Rc::clone(&s),
                0x5eed_0000 + i * 7919 + u64::from(legacy),
                until,
                Rc::clone(&tally),
            ))
        })
        .collect();
    for c in clients {
        if let Err(e) = c.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    tally
}

/// Upstream HTTP/1.1 connections pooled idle (each is two descriptors here: the gateway's and
/// the in-process mock's).
async fn pooled(s: &Stack) -> usize {
    usize::try_from(s.metric("codex_gateway_upstream_h1_idle").await).unwrap_or(0)
}

/// Waits until no account holds a slot and no stream is open.
async fn quiesce(s: &Stack) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let held: u32 = (0..ACCOUNTS)
            .map(|i| s.in_flight(&format!("acct-{i}")))
            .sum();
        let open = s.metric("codex_gateway_open_streams").await;
        if held == 0 && open == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after the soak: {held} account slots held, {open} streams open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn fault_soak_every_answer_is_whole_or_one_clean_error_and_nothing_leaks() {
    let secs = std::env::var("CODEX_GATEWAY_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12u64);
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let stacks = [("io_uring", stack(false)), ("legacy", stack(true))];
            // The baseline: both stacks up, a few requests served (pools and caches warm).
            for (_, s) in &stacks {
                for _ in 0..4 {
                    let r = s
                        .post("/v1/responses")
                        .json(&json!({"model": "gpt-5.5", "input": "warm"}))
                        .send()
                        .await
                        .expect("warm-up");
                    assert_eq!(r.status(), 200);
                }
            }
            let mut pooled_before = 0;
            for (_, s) in &stacks {
                pooled_before += pooled(s).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let fds_before = open_fds();
            let runs: Vec<_> = stacks
                .iter()
                .map(|(driver, s)| {
                    let legacy = *driver == "legacy";
                    (*driver, tokio::task::spawn_local(soak(Rc::clone(s), legacy, secs)))
                })
                .collect();
            for (driver, run) in runs {
                match run.await {
                    Ok(t) => {
                        eprintln!(
                            "[{driver}] {secs} s: {} complete, {} clean errors, {} abandoned; errors before a stream: {:?}",
                            t.ok.get(),
                            t.clean_errors.get(),
                            t.abandoned.get(),
                            t.codes.borrow()
                        );
                        assert!(t.ok.get() > 50, "[{driver}] too few complete answers");
                        assert!(
                            t.clean_errors.get() > 10,
                            "[{driver}] the faults did not bite"
                        );
                    }
                    Err(e) => {
                        let msg = integration_tests::panic_message(&*e.into_panic());
                        panic!("[{driver} driver] {msg}");
                    }
                }
            }
            for (driver, s) in &stacks {
                quiesce(s).await;
                let requests = s.metric("codex_gateway_requests_total").await;
                eprintln!("[{driver}] requests counted by the gateway: {requests}");
            }
            // Descriptors, the stacks still running: what the soak opened is closed (abandoned
            // streams, client connections, cut upstream streams) except the upstream
            // connections now pooled idle (two descriptors each, the mock being in-process).
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let mut pooled_after = 0;
                for (_, s) in &stacks {
                    pooled_after += pooled(s).await;
                }
                let allowed = fds_before + 2 * pooled_after.saturating_sub(pooled_before) + 16;
                let now = open_fds();
                if now <= allowed {
                    eprintln!(
                        "descriptors: {fds_before} before, {now} after ({pooled_before} -> {pooled_after} pooled)"
                    );
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "descriptors leaked: {fds_before} before the soak, {now} after (at most {allowed} with {pooled_before} -> {pooled_after} pooled): {:?}; tcp: {:?}",
                    fd_targets(),
                    tcp_sockets()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
}
