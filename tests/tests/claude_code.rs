//! The real Claude Code CLI (`@anthropic-ai/claude-code` 2.1.332 from npm) through the
//! gateway's Anthropic `/v1/messages` in front of mock-codex: `claude -p` answered from a
//! stream (on both monoio drivers), a tool round trip (the mock calls the CLI's `Bash` tool
//! with an `echo`, the CLI runs it and its follow-up carries the `tool_result`), and a second
//! turn with `--continue` (the whole conversation re-sent).
//!
//! Needs `CODEX_GATEWAY_TEST_CLAUDE`, the path of the `claude` executable; `tests/run.sh`
//! installs the pinned CLI under `target/claude-code` and sets it. Without the variable every
//! test here prints why it is skipped and returns; with it, nothing is skipped.
//!
//! The CLI is configured the documented way only: `ANTHROPIC_BASE_URL` (the gateway),
//! `ANTHROPIC_API_KEY` (a gateway key), a fresh `HOME`, and its network side calls off
//! (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`, `DISABLE_TELEMETRY`, `DISABLE_AUTOUPDATER`,
//! `DISABLE_ERROR_REPORTING`). Its default model (a `claude-*` name) reaches gpt-5.5 through
//! the `claude-*` prefix alias. Each run is killed (its whole process group) after
//! [`RUN_TIMEOUT`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use benches::{mock::DEFAULT_TEXT, Behaviour, RecordedRequest};
use integration_tests::{Stack, StackBuilder};
use serde_json::Value;

/// The environment variable naming the `claude` executable.
const CLAUDE_ENV: &str = "CODEX_GATEWAY_TEST_CLAUDE";
/// The longest one CLI run may take; a happy run takes a few seconds.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// The `claude` executable, or `None` (with the reason printed) when the variable is absent.
fn claude_bin() -> Option<PathBuf> {
    let Some(p) = std::env::var_os(CLAUDE_ENV) else {
        eprintln!(
            "SKIPPED: {CLAUDE_ENV} is not set, so the real Claude Code tests do not run. \
             tests/run.sh installs @anthropic-ai/claude-code 2.1.332 under target/claude-code and sets it."
        );
        return None;
    };
    let p = PathBuf::from(p);
    assert!(
        p.is_file(),
        "{CLAUDE_ENV}={} is not a file (run tests/run.sh to install Claude Code)",
        p.display()
    );
    Some(p)
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// One finished CLI run.
struct Run {
    what: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Panics with the CLI's output and what the upstream saw unless the run exited 0.
    fn assert_ok(&self, s: &Stack) {
        assert!(
            self.status.success(),
            "`{}` failed ({})\n{}\n--- stdout ---\n{}\n--- stderr (tail) ---\n{}",
            self.what,
            self.status,
            upstream_summary(s),
            tail(&self.stdout, 6000),
            tail(&self.stderr, 6000),
        );
    }
}

/// A Claude Code CLI with its own `HOME` and working directory, pointed at the stack.
struct Cli {
    bin: PathBuf,
    root: tempfile::TempDir,
    base_url: String,
    key: String,
    runs: AtomicUsize,
}

impl Cli {
    fn new(bin: PathBuf, s: &Stack) -> Self {
        let root = tempfile::Builder::new()
            .prefix("claude-code-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("tempdir");
        for d in ["home", "work"] {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        Self {
            bin,
            root,
            base_url: s.url(),
            key: s.key.clone(),
            runs: AtomicUsize::new(0),
        }
    }

    /// Runs `claude ARGS` in the working directory; kills the process group on timeout.
    fn run(&self, s: &Stack, args: &[&str]) -> Run {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let out_path = self.root.path().join(format!("stdout-{n}.txt"));
        let err_path = self.root.path().join(format!("stderr-{n}.txt"));
        let what = format!("claude {}", args.join(" "));
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .current_dir(self.root.path().join("work"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).expect("stdout file"))
            .stderr(std::fs::File::create(&err_path).expect("stderr file"))
            .env("HOME", self.root.path().join("home"))
            .env("ANTHROPIC_BASE_URL", &self.base_url)
            .env("ANTHROPIC_API_KEY", &self.key)
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("NO_COLOR", "1")
            .env("NO_PROXY", "*")
            .env("no_proxy", "*")
            .process_group(0);
        for v in [
            "ANTHROPIC_AUTH_TOKEN",
            "ANTHROPIC_MODEL",
            "ANTHROPIC_SMALL_FAST_MODEL",
            "CLAUDE_CONFIG_DIR",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env_remove(v);
        }
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if start.elapsed() > RUN_TIMEOUT {
                // The CLI runs tool commands as children: end the whole group.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "`{what}` did not finish within {RUN_TIMEOUT:?} (killed)\n{}\n--- stdout ---\n{}\n--- stderr (tail) ---\n{}",
                    upstream_summary(s),
                    std::fs::read_to_string(&out_path).unwrap_or_default(),
                    tail(&std::fs::read_to_string(&err_path).unwrap_or_default(), 6000),
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let r = Run {
            what,
            status,
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        };
        eprintln!("`{}` -> {} in {:?}", r.what, r.status, start.elapsed());
        r
    }
}

/// The `POST /responses` requests mock-codex received, oldest first.
fn upstream(s: &Stack) -> Vec<RecordedRequest> {
    s.mock
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/responses"))
        .collect()
}

fn upstream_summary(s: &Stack) -> String {
    let sizes: Vec<usize> = upstream(s).iter().map(|r| r.body.len()).collect();
    format!("upstream saw /responses bodies of {sizes:?} bytes")
}

fn json_of(r: &RecordedRequest) -> &Value {
    r.json.as_ref().expect("the upstream body is JSON")
}

fn input(r: &RecordedRequest) -> &Vec<Value> {
    json_of(r)["input"].as_array().expect("input is a list")
}

/// `role: text` of every message item (texts of its parts joined).
fn messages(r: &RecordedRequest) -> Vec<(String, String)> {
    input(r)
        .iter()
        .filter(|i| i["type"] == "message")
        .map(|i| {
            let text = i["content"]
                .as_array()
                .map(|p| {
                    p.iter()
                        .filter_map(|x| x["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("")
                })
                .unwrap_or_default();
            (i["role"].as_str().unwrap_or_default().to_owned(), text)
        })
        .collect()
}

/// A stack where every `claude-*` name maps to gpt-5.5.
fn stack(legacy: bool) -> Stack {
    StackBuilder {
        legacy,
        tweak: Some(Box::new(|c: &mut gateway::config::GatewayConfig| {
            c.model_aliases.insert(
                "claude-*".into(),
                shared_state::catalog::parse_alias("gpt-5.5"),
            );
        })),
        ..StackBuilder::default()
    }
    .start()
}

/// `claude -p "say hi"`: the CLI's first request (a system message inside `messages`,
/// adaptive thinking, `output_config`, `context_management`, a dozen tools) reaches the
/// upstream translated, and the answer is streamed to the CLI (its partial-message events
/// show the text deltas) and printed.
fn says_hi(legacy: bool) {
    let Some(bin) = claude_bin() else { return };
    let s = stack(legacy);
    let cli = Cli::new(bin, &s);
    let r = cli.run(
        &s,
        &[
            "-p",
            "say hi",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
        ],
    );
    r.assert_ok(&s);
    let events: Vec<Value> = r
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "stream_event" && e["event"]["type"] == "content_block_delta")
        .filter_map(|e| e["event"]["delta"]["text"].as_str())
        .collect();
    assert_eq!(
        deltas,
        DEFAULT_TEXT,
        "the answer arrived as stream deltas\n{}",
        tail(&r.stdout, 4000)
    );
    let result = events
        .iter()
        .find(|e| e["type"] == "result")
        .expect("a result event");
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["result"], DEFAULT_TEXT, "{result}");

    let reqs = upstream(&s);
    assert_eq!(reqs.len(), 1, "{}", upstream_summary(&s));
    let body = json_of(&reqs[0]);
    assert_eq!(body["model"], "gpt-5.5");
    assert!(
        body["reasoning"]["effort"].is_string(),
        "{}",
        body["reasoning"]
    );
    let roles: Vec<String> = messages(&reqs[0]).into_iter().map(|(r, _)| r).collect();
    assert_eq!(
        roles,
        ["developer", "user", "developer"],
        "system prompt, the prompt, then the CLI's system message in place"
    );
    assert!(messages(&reqs[0])[1].1.contains("say hi"));
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(tools.contains(&"Bash") && tools.len() >= 8, "{tools:?}");
}

#[test]
fn claude_code_says_hi_io_uring() {
    says_hi(false);
}

#[test]
fn claude_code_says_hi_legacy() {
    says_hi(true);
}

/// The mock calls the CLI's `Bash` tool with an `echo`; the CLI runs it and its follow-up
/// carries the call and its `tool_result` (a `function_call_output` upstream), answered.
#[test]
fn claude_code_tool_round_trip() {
    let Some(bin) = claude_bin() else { return };
    let s = stack(false);
    s.mock.set_behaviour(
        "acct-0",
        Behaviour {
            tool_call: Some("Bash".into()),
            tool_arguments: Some(
                r#"{"command":"echo tool-ran-ok","description":"Print a word"}"#.into(),
            ),
            ..Default::default()
        }
        .times(1),
    );
    let cli = Cli::new(bin, &s);
    let r = cli.run(
        &s,
        &[
            "-p",
            "run echo tool-ran-ok",
            "--allowedTools",
            "Bash(echo:*)",
        ],
    );
    r.assert_ok(&s);
    assert!(
        r.stdout.contains(DEFAULT_TEXT),
        "the follow-up answer is printed\n{}",
        r.stdout
    );
    let reqs = upstream(&s);
    assert_eq!(reqs.len(), 2, "{}", upstream_summary(&s));
    let items = input(&reqs[1]);
    let call = items
        .iter()
        .find(|i| i["type"] == "function_call" && i["name"] == "Bash")
        .unwrap_or_else(|| panic!("the call is re-sent: {}", tail(&reqs[1].body_text(), 3000)));
    let args: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments"))
        .expect("arguments are JSON");
    assert_eq!(args["command"], "echo tool-ran-ok");
    let output = items
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap_or_else(|| panic!("a tool result: {}", tail(&reqs[1].body_text(), 3000)));
    assert_eq!(
        output["call_id"], call["call_id"],
        "the result answers the call"
    );
    let out = output["output"].as_str().expect("text output");
    assert!(
        out.lines().any(|l| l.trim() == "tool-ran-ok"),
        "the command ran and its output came back: {out:?}"
    );
}

/// A second turn with `--continue`: the first turn (prompt and answer) is re-sent before the
/// new prompt, and answered.
#[test]
fn claude_code_continue_sends_the_conversation() {
    let Some(bin) = claude_bin() else { return };
    let s = stack(false);
    let cli = Cli::new(bin, &s);
    cli.run(&s, &["-p", "say hi"]).assert_ok(&s);
    let r = cli.run(&s, &["-p", "--continue", "say it again"]);
    r.assert_ok(&s);
    assert!(r.stdout.contains(DEFAULT_TEXT), "{}", r.stdout);
    let reqs = upstream(&s);
    assert_eq!(reqs.len(), 2, "{}", upstream_summary(&s));
    let turns: Vec<(String, String)> = messages(&reqs[1])
        .into_iter()
        .filter(|(r, _)| r != "developer")
        .collect();
    let first = turns
        .iter()
        .position(|(r, t)| r == "user" && t.contains("say hi"))
        .unwrap_or_else(|| panic!("the first prompt is re-sent: {turns:?}"));
    let answer = turns
        .iter()
        .position(|(r, t)| r == "assistant" && t.contains(DEFAULT_TEXT))
        .unwrap_or_else(|| panic!("the first answer is re-sent: {turns:?}"));
    let second = turns
        .iter()
        .position(|(r, t)| r == "user" && t.contains("say it again"))
        .unwrap_or_else(|| panic!("the new prompt: {turns:?}"));
    assert!(first < answer && answer < second, "{turns:?}");
}
