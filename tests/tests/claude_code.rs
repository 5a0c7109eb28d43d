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
    path::PathBuf,
    process::{Command, ExitStatus},
    sync::atomic::{AtomicUsize, Ordering},
};

use benches::{mock::DEFAULT_TEXT, RecordedRequest};
use integration_tests::{
    claude_alias,
    cli::{claude_bin, run_bounded, tail, RUN_TIMEOUT},
    Stack, StackBuilder,
};
use serde_json::Value;

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
        let what = format!("claude {}", args.join(" "));
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .current_dir(self.root.path().join("work"))
            .env("HOME", self.root.path().join("home"))
            .env("ANTHROPIC_BASE_URL", &self.base_url)
            .env("ANTHROPIC_API_KEY", &self.key)
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1");
        for v in [
            "ANTHROPIC_AUTH_TOKEN",
            "ANTHROPIC_MODEL",
            "ANTHROPIC_SMALL_FAST_MODEL",
            "CLAUDE_CONFIG_DIR",
        ] {
            cmd.env_remove(v);
        }
        let f = run_bounded(&mut cmd, self.root.path(), n, &what, RUN_TIMEOUT, || {
            upstream_summary(s)
        });
        Run {
            what,
            status: f.status,
            stdout: f.stdout,
            stderr: f.stderr,
        }
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
        tweak: claude_alias(),
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
    s.answer_with_tool_call(
        "acct-0",
        "Bash",
        r#"{"command":"echo tool-ran-ok","description":"Print a word"}"#,
        1,
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
