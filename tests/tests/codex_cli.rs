//! The real Codex CLI (`@openai/codex` 0.171.0 from npm) through the gateway in front of
//! mock-codex, on both monoio drivers: one `codex exec` turn (a ~40 KB request), a resumed
//! session (the full history re-sent), and a tool round trip (`exec_command` run by the CLI,
//! its output sent back).
//!
//! Needs `CODEX_GATEWAY_TEST_CODEX`, the path of the `codex` executable; `tests/run.sh`
//! installs the pinned CLI under `target/codex-cli` and sets it. Without the variable every
//! test here prints why it is skipped and returns; with it, nothing is skipped.
//!
//! The CLI talks to the gateway as a custom provider over HTTP+SSE (docs/protocol.md#what-real-clients-send;
//! `OPENAI_BASE_URL` does nothing for 0.171). Everything that would reach the
//! internet (plugin marketplace sync from github.com, apps, analytics, update checks) is
//! switched off in its `config.toml`, and each CLI run is killed (its whole process group)
//! after [`RUN_TIMEOUT`].

use std::{
    path::PathBuf,
    process::ExitStatus,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use benches::{mock::DEFAULT_TEXT, Behaviour, RecordedRequest};
use integration_tests::{
    cli::{
        codex_bin, codex_command, codex_config, exec_args, exec_full_access_args, resume_last_args,
        run_bounded, tail, RUN_TIMEOUT,
    },
    Stack, StackBuilder,
};
use serde_json::Value;

/// The environment variable (set on the CLI only) that carries the gateway key (`env_key`).
const KEY_ENV: &str = "CODEX_GATEWAY_TEST_KEY";
/// The model the CLI asks for (in the gateway's catalog).
const MODEL: &str = "gpt-5.5";

/// One finished CLI run.
struct Run {
    websockets: bool,
    what: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    /// Panics with the CLI's output and what the upstream saw unless the run exited 0.
    fn assert_ok(&self, s: &Stack) {
        assert!(
            self.status.success(),
            "`{}` failed ({}) after {:?}\n{}\n--- stdout ---\n{}\n--- stderr (tail) ---\n{}",
            self.what,
            self.status,
            self.took,
            upstream_summary(s),
            self.stdout,
            tail(&self.stderr, 6000),
        );
        if self.websockets {
            assert!(
                !self.stderr.contains("Falling back from WebSockets")
                    && !self
                        .stderr
                        .contains("failed to connect to Responses WebSocket"),
                "`{}` fell back to HTTP:\n{}",
                self.what,
                tail(&self.stderr, 6000)
            );
            assert!(
                ws_upgrades(s) > 0,
                "the gateway served the Responses WebSocket"
            );
        }
    }
}

/// Responses WebSocket upgrades the gateway answered (101).
fn ws_upgrades(s: &Stack) -> u64 {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(s.app.data_addr).expect("connect");
    c.write_all(b"GET /metrics HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        .expect("write");
    let mut body = String::new();
    let _ = c.read_to_string(&mut body);
    body.lines()
        .find_map(|l| {
            l.strip_prefix("codex_gateway_requests_total{route=\"responses\",status=\"101\"} ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A Codex CLI with its own `CODEX_HOME` (and `HOME`) and working directory, configured to
/// use the stack's gateway as its only provider.
struct Cli {
    bin: PathBuf,
    websockets: bool,
    root: tempfile::TempDir,
    key: String,
    runs: AtomicUsize,
}

impl Cli {
    /// `websockets`: the provider declares `supports_websockets`, so the CLI talks to the
    /// gateway's Responses WebSocket (warm-up, then chained turns) instead of HTTP+SSE.
    fn new(bin: PathBuf, s: &Stack, websockets: bool) -> Self {
        // Not under /tmp: the CLI refuses to install its PATH helpers below a temporary dir.
        let root = tempfile::Builder::new()
            .prefix("codex-cli-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("tempdir");
        for d in ["home", "codex-home", "work"] {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        let provider = format!(
            r#"
[model_providers.codex-gateway]
name = "codex-gateway under test"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "{KEY_ENV}"
supports_websockets = {websockets}
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 30000
"#,
            url = s.url(),
        );
        let config = codex_config(MODEL, "model_provider = \"codex-gateway\"\n", &provider);
        std::fs::write(root.path().join("codex-home/config.toml"), config).expect("config");
        Self {
            bin,
            websockets,
            root,
            key: s.key.clone(),
            runs: AtomicUsize::new(0),
        }
    }

    /// Runs `codex ARGS` in the working directory; kills the process group on timeout (the
    /// panic then lists what the upstream of `s` saw).
    fn run(&self, s: &Stack, args: &[&str]) -> Run {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let what = format!("codex {}", args.join(" "));
        let mut cmd = codex_command(&self.bin, self.root.path(), args);
        cmd.env(KEY_ENV, &self.key);
        // The npm wrapper (node) runs the native binary as a child, and the binary runs tool
        // commands: past the limit the whole group ends.
        let f = run_bounded(&mut cmd, self.root.path(), n, &what, RUN_TIMEOUT, || {
            upstream_summary(s)
        });
        Run {
            websockets: self.websockets,
            what,
            status: f.status,
            stdout: f.stdout,
            stderr: f.stderr,
            took: f.took,
        }
    }
}

fn upstream_summary(s: &Stack) -> String {
    let reqs = s.upstream_turns();
    let sizes: Vec<usize> = reqs.iter().map(|r| r.body.len()).collect();
    format!(
        "upstream saw {} /responses request(s), body sizes {sizes:?}",
        reqs.len()
    )
}

fn json_of(r: &RecordedRequest) -> &Value {
    r.json.as_ref().unwrap_or_else(|| {
        panic!(
            "upstream body is not JSON ({} bytes): {}",
            r.body.len(),
            tail(&r.body_text(), 400)
        )
    })
}

fn input(r: &RecordedRequest) -> &Vec<Value> {
    json_of(r)["input"]
        .as_array()
        .unwrap_or_else(|| panic!("input is not a list: {}", tail(&r.body_text(), 400)))
}

/// The concatenated texts of a message item.
fn message_text(item: &Value) -> String {
    item["content"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

/// `(role, text)` of every message item.
fn messages(r: &RecordedRequest) -> Vec<(String, String)> {
    input(r)
        .iter()
        .filter(|i| i["type"] == "message" || i.get("role").is_some())
        .map(|i| {
            (
                i["role"].as_str().unwrap_or_default().to_owned(),
                message_text(i),
            )
        })
        .collect()
}

fn stack(legacy: bool) -> Stack {
    StackBuilder {
        legacy,
        ..Default::default()
    }
    .start()
}

/// One `codex exec` turn: the CLI's ~40 KB request reaches the upstream whole and the mock's
/// answer is printed.
fn exec_one_turn(legacy: bool, websockets: bool) {
    let Some(bin) = codex_bin() else { return };
    let s = stack(legacy);
    let cli = Cli::new(bin, &s, websockets);
    let r = cli.run(&s, &exec_args("say hi"));
    r.assert_ok(&s);
    assert!(
        r.stdout.contains(DEFAULT_TEXT),
        "the answer is printed\n--- stdout ---\n{}",
        r.stdout
    );
    let reqs = s.upstream_turns();
    assert_eq!(reqs.len(), 1, "{}", upstream_summary(&s));
    let req = &reqs[0];
    eprintln!("codex exec: upstream request body {} bytes", req.body.len());
    assert!(
        req.body.len() >= 30_000,
        "the CLI's request is production-sized: {} bytes",
        req.body.len()
    );
    let body = json_of(req);
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["stream"], true);
    let msgs = messages(req);
    assert_eq!(
        msgs.first().map(|m| m.0.as_str()),
        Some("developer"),
        "the base prompt is the first developer message"
    );
    assert!(
        msgs[0].1.len() > 10_000,
        "base prompt intact: {} bytes",
        msgs[0].1.len()
    );
    assert_eq!(
        msgs.last().map(|m| (m.0.as_str(), m.1.as_str())),
        Some(("user", "say hi")),
        "the prompt is the last input item"
    );
    // Session headers reach the upstream (the sticky-routing signals, docs/protocol.md#identity-headers).
    let session = req.header("session-id").expect("session-id forwarded");
    assert_eq!(body["prompt_cache_key"], session);
}

/// `codex exec` then `codex exec resume --last`: the second turn re-sends the whole history,
/// the first answer included, and is answered.
fn exec_resume_last(legacy: bool, websockets: bool) {
    let Some(bin) = codex_bin() else { return };
    let s = stack(legacy);
    const FIRST: &str = "First turn answer from mock-codex: remember the word pelican.";
    s.answer_once("acct-0", FIRST);
    let cli = Cli::new(bin, &s, websockets);
    let r1 = cli.run(&s, &exec_args("say hi"));
    r1.assert_ok(&s);
    assert!(r1.stdout.contains(FIRST), "first answer\n{}", r1.stdout);
    let r2 = cli.run(&s, &resume_last_args("and again"));
    r2.assert_ok(&s);
    assert!(
        r2.stdout.contains(DEFAULT_TEXT),
        "second answer\n--- stdout ---\n{}",
        r2.stdout
    );
    let reqs = s.upstream_turns();
    assert_eq!(reqs.len(), 2, "{}", upstream_summary(&s));
    eprintln!(
        "codex exec resume: upstream request bodies {} and {} bytes",
        reqs[0].body.len(),
        reqs[1].body.len()
    );
    let m2 = messages(&reqs[1]);
    let pos = |role: &str, text: &str| m2.iter().position(|m| m.0 == role && m.1 == text);
    let hi = pos("user", "say hi").expect("first prompt re-sent");
    let answer = pos("assistant", FIRST)
        .unwrap_or_else(|| panic!("the first answer is in the second request's input: {m2:?}"));
    let again = pos("user", "and again").expect("second prompt");
    assert!(hi < answer && answer < again, "history order: {m2:?}");
    assert_eq!(again, m2.len() - 1, "the new prompt comes last");
    assert!(reqs[1].body.len() > reqs[0].body.len());
    assert_eq!(
        json_of(&reqs[0])["prompt_cache_key"],
        json_of(&reqs[1])["prompt_cache_key"],
        "same session"
    );
    assert!(
        json_of(&reqs[1]).get("previous_response_id").is_none(),
        "no previous_response_id over HTTP"
    );
}

/// The mock answers with an `exec_command` call; the CLI runs it and sends the output back in
/// the follow-up request of the same turn (with the turn state echoed), which is answered.
fn exec_tool_round_trip(legacy: bool, websockets: bool) {
    let Some(bin) = codex_bin() else { return };
    let s = stack(legacy);
    s.answer_with_tool_call("acct-0", "exec_command", r#"{"cmd":"echo tool-ran-ok"}"#, 1);
    let cli = Cli::new(bin, &s, websockets);
    let r = cli.run(&s, &exec_full_access_args("run echo tool-ran-ok"));
    r.assert_ok(&s);
    assert!(
        r.stdout.contains(DEFAULT_TEXT),
        "the follow-up answer is printed\n--- stdout ---\n{}",
        r.stdout
    );
    let reqs = s.upstream_turns();
    assert_eq!(reqs.len(), 2, "{}", upstream_summary(&s));
    eprintln!(
        "codex exec tool round trip: upstream request bodies {} and {} bytes",
        reqs[0].body.len(),
        reqs[1].body.len()
    );
    let items = input(&reqs[1]);
    if websockets {
        // Over the gateway's pooled upstream WebSocket the follow-up is the exact
        // continuation: the call lives in the upstream socket's state, only its output is sent.
        let prev = json_of(&reqs[0]).get("previous_response_id");
        assert!(prev.is_none(), "the first turn is whole");
        assert!(
            json_of(&reqs[1])["previous_response_id"].is_string(),
            "the follow-up continues the first response on the same socket"
        );
        assert_eq!(
            s.mock.ws_handshakes(),
            1,
            "one upstream socket for the session"
        );
        let output = items
            .iter()
            .find(|i| i["type"] == "function_call_output")
            .expect("the tool output");
        let text = output["output"].to_string();
        assert!(text.contains("tool-ran-ok"), "{text}");
        return;
    }
    let call = items
        .iter()
        .find(|i| i["type"] == "function_call" && i["name"] == "exec_command")
        .unwrap_or_else(|| {
            panic!(
                "the function_call is re-sent: {}",
                tail(&reqs[1].body_text(), 3000)
            )
        });
    let output = items
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap_or_else(|| {
            panic!(
                "a function_call_output: {}",
                tail(&reqs[1].body_text(), 3000)
            )
        });
    assert_eq!(
        output["call_id"], call["call_id"],
        "output answers the call"
    );
    let out_text = match &output["output"] {
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    assert!(
        out_text.lines().any(|l| l.trim() == "tool-ran-ok"),
        "the command ran and its output came back: {out_text:?}"
    );
    assert!(
        out_text.contains("exited with code 0"),
        "exit code reported: {out_text:?}"
    );
    // The turn state the upstream issued on the first response comes back on the follow-up.
    assert_eq!(reqs[0].header("x-codex-turn-state"), None);
    let ts = reqs[1].header("x-codex-turn-state").unwrap_or_default();
    assert!(
        ts.starts_with("ts-"),
        "x-codex-turn-state echoed on the follow-up: {ts:?}"
    );
}

#[test]
fn codex_exec_one_turn_io_uring() {
    exec_one_turn(false, false);
}

#[test]
fn codex_exec_one_turn_websocket_io_uring() {
    exec_one_turn(false, true);
}

#[test]
fn codex_exec_one_turn_legacy() {
    exec_one_turn(true, false);
}

#[test]
fn codex_exec_one_turn_websocket_legacy() {
    exec_one_turn(true, true);
}

#[test]
fn codex_exec_resume_last_io_uring() {
    exec_resume_last(false, false);
}

#[test]
fn codex_exec_resume_last_websocket_io_uring() {
    exec_resume_last(false, true);
}

#[test]
fn codex_exec_resume_last_legacy() {
    exec_resume_last(true, false);
}

#[test]
fn codex_exec_resume_last_websocket_legacy() {
    exec_resume_last(true, true);
}

#[test]
fn codex_exec_tool_round_trip_io_uring() {
    exec_tool_round_trip(false, false);
}

#[test]
fn codex_exec_tool_round_trip_websocket_io_uring() {
    exec_tool_round_trip(false, true);
}

#[test]
fn codex_exec_tool_round_trip_legacy() {
    exec_tool_round_trip(true, false);
}

#[test]
fn codex_exec_tool_round_trip_websocket_legacy() {
    exec_tool_round_trip(true, true);
}

/// Two accounts, fill_first (acct-0 serves first), both answering with reasoning (whose
/// `encrypted_content` mock-codex binds to the minting account, as the real backend does).
fn two_account_stack(legacy: bool, upstream_ws: bool) -> Stack {
    let s = StackBuilder {
        legacy,
        accounts: 2,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        tweak: Some(Box::new(move |c: &mut codex_gateway::config::Config| {
            c.gateway.upstream.websockets = upstream_ws;
        })),
        ..Default::default()
    }
    .start();
    for a in ["acct-0", "acct-1"] {
        s.mock.set_behaviour(
            a,
            Behaviour {
                reasoning: Some(true),
                ..Default::default()
            },
        );
    }
    s
}

/// Issue 23: a session whose account runs dry between two turns continues on the other
/// account. The CLI replays the first turn's reasoning (its `encrypted_content`, minted by
/// acct-0) in the second turn; acct-1 must never receive it (the real backend refuses it with
/// `invalid_encrypted_content`, and so does mock-codex).
fn exec_survives_account_switch(legacy: bool, websockets: bool) {
    let Some(bin) = codex_bin() else { return };
    let s = two_account_stack(legacy, websockets);
    let cli = Cli::new(bin, &s, websockets);
    let r1 = cli.run(&s, &exec_args("say hi"));
    r1.assert_ok(&s);
    let first = s.upstream_turns();
    assert!(
        first.iter().all(|r| r.account_id() == Some("acct-0")),
        "the first turn is acct-0's: {}",
        upstream_summary(&s)
    );
    // acct-0 runs dry between the turns.
    s.mock.set_behaviour(
        "acct-0",
        Behaviour {
            error: Some(benches::ErrorKind::UsageLimitReached),
            reasoning: Some(true),
            ..Default::default()
        },
    );
    s.mock.clear_requests();
    let r2 = cli.run(&s, &resume_last_args("and again"));
    r2.assert_ok(&s);
    assert!(
        r2.stdout.contains(DEFAULT_TEXT),
        "second answer\n--- stdout ---\n{}\n--- stderr ---\n{}",
        r2.stdout,
        tail(&r2.stderr, 4000)
    );
    let reqs = s.upstream_turns();
    let on_1: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-1"))
        .collect();
    assert!(!on_1.is_empty(), "acct-1 served: {}", upstream_summary(&s));
    for r in &on_1 {
        assert!(
            r.foreign_blobs().is_empty(),
            "acct-1 never receives acct-0's blobs"
        );
        let m = messages(r);
        assert!(
            m.iter().any(|(role, t)| role == "user" && t == "say hi"),
            "the history went along: {m:?}"
        );
    }
    // The CLI did replay the blob: acct-0 was offered it (and answered 429).
    let blobs_to_0: usize = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-0"))
        .map(|r| r.blobs().len())
        .sum();
    assert!(
        blobs_to_0 > 0,
        "the CLI replayed acct-0's reasoning, offered to its minter first: {}",
        upstream_summary(&s)
    );
    if websockets {
        assert!(
            on_1.iter().all(|r| r.method == "WS"),
            "over the upstream WebSocket too"
        );
    }
}

#[test]
fn codex_exec_survives_account_switch_io_uring() {
    exec_survives_account_switch(false, false);
}

#[test]
fn codex_exec_survives_account_switch_websocket_io_uring() {
    exec_survives_account_switch(false, true);
}
