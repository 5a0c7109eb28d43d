//! Real command-line clients (the Codex CLI, Claude Code) as the tests run them: found through
//! an environment variable that `tests/run.sh` sets, run with stdin closed and their output in
//! files, in their own process group, with no proxy in their environment, and killed (the
//! whole group) past a time limit.
//!
//! # Key Components
//! - [`client_bin`]: the executable an environment variable names, or `None` (skipped).
//! - [`run_bounded`]: runs a prepared [`Command`] to its end or to the limit: a [`Finished`].
//! - [`tail`]: the end of a long output, for a failure message.
//! - [`codex_config`]: a Codex CLI `config.toml` that reaches nothing but the gateway.
//! - [`codex_command`]: a Codex CLI command in a scratch home, without the caller's settings.
//! - [`exec_args`] / [`resume_last_args`]: the `codex exec` arguments the tests run.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// One finished run of a client.
pub struct Finished {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything it wrote on stdout.
    pub stdout: String,
    /// Everything it wrote on stderr.
    pub stderr: String,
    /// How long it ran.
    pub took: Duration,
}

/// The executable `var` names, or `None` (with `SKIPPED: ...` and how to get it, `install`,
/// printed) when the variable is not set; panics when it names no file.
pub fn client_bin(var: &str, install: &str) -> Option<PathBuf> {
    let Some(p) = std::env::var_os(var) else {
        eprintln!("SKIPPED: {var} is not set, so the tests of this client do not run. {install}");
        return None;
    };
    let p = PathBuf::from(p);
    assert!(
        p.is_file(),
        "{var}={} is not a file (run tests/run.sh to install it)",
        p.display()
    );
    Some(p)
}

/// The last `n` bytes of `s` (from a character boundary).
pub fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Proxy variables a client must not inherit: the tests talk to 127.0.0.1 directly.
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// Runs `cmd` (its arguments, directory and own environment already set) to its end: stdin
/// closed, stdout and stderr into `dir/stdout-{n}.txt` and `dir/stderr-{n}.txt`, in its own
/// process group, without proxy variables (`NO_PROXY=*`) and colours. Past `limit` the whole
/// group is killed (a client runs tool commands as children) and the test panics with
/// `what`, `context()` (e.g. what the upstream saw) and the output so far.
pub fn run_bounded(
    cmd: &mut Command,
    dir: &Path,
    n: usize,
    what: &str,
    limit: Duration,
    context: impl FnOnce() -> String,
) -> Finished {
    let out_path = dir.join(format!("stdout-{n}.txt"));
    let err_path = dir.join(format!("stderr-{n}.txt"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .env("NO_COLOR", "1")
        .env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .process_group(0);
    for v in PROXY_VARS {
        cmd.env_remove(v);
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{what}` did not finish within {limit:?} (killed)\n{}\n--- stdout ---\n{}\n--- stderr (tail) ---\n{}",
                context(),
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                tail(&std::fs::read_to_string(&err_path).unwrap_or_default(), 6000),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    eprintln!("`{what}` -> {status} in {took:?}");
    Finished {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        took,
    }
}

/// The longest one client run may take; a happy run takes a few seconds.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// The real Codex CLI (`CODEX_GATEWAY_TEST_CODEX`), or `None`: those tests are skipped.
pub fn codex_bin() -> Option<PathBuf> {
    client_bin(
        "CODEX_GATEWAY_TEST_CODEX",
        "tests/run.sh installs @openai/codex 0.171.0 under target/codex-cli and sets it.",
    )
}

/// The real Claude Code CLI (`CODEX_GATEWAY_TEST_CLAUDE`), or `None`: those tests are skipped.
pub fn claude_bin() -> Option<PathBuf> {
    client_bin(
        "CODEX_GATEWAY_TEST_CLAUDE",
        "tests/run.sh installs @anthropic-ai/claude-code 2.1.332 under target/claude-code and sets it.",
    )
}

/// A Codex CLI `config.toml`: `model`, the top-level keys `top` (whole lines), no update
/// check, no analytics, feedback, plugins or apps (the CLI reaches nothing but the gateway),
/// then the tables `tables` (whole lines, e.g. a `[model_providers.*]` table).
pub fn codex_config(model: &str, top: &str, tables: &str) -> String {
    format!(
        r#"model = "{model}"
{top}check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
{tables}"#
    )
}

/// The caller's variables that would point the Codex CLI at another provider, key or log
/// level than its test configuration says: removed from its environment.
pub const CODEX_ENV_CLEARED: [&str; 4] = [
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_API_KEY",
    "RUST_LOG",
];

/// `codex ARGS` in a scratch `root` laid out as the tests lay it out: run in `root/work`,
/// with `HOME=root/home` and `CODEX_HOME=root/codex-home`, without [`CODEX_ENV_CLEARED`]
/// (callers add their own variables, then [`run_bounded`] it).
pub fn codex_command(bin: &Path, root: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .current_dir(root.join("work"))
        .env("HOME", root.join("home"))
        .env("CODEX_HOME", root.join("codex-home"));
    for v in CODEX_ENV_CLEARED {
        cmd.env_remove(v);
    }
    cmd
}

/// The Codex CLI's arguments for one `codex exec` turn of `prompt` outside a git repository,
/// without colours.
pub fn exec_args(prompt: &str) -> [&str; 5] {
    ["exec", "--skip-git-repo-check", "--color", "never", prompt]
}

/// [`exec_args`] with the sandbox off (`-s danger-full-access`): the CLI runs the tool calls
/// the mock asks for.
pub fn exec_full_access_args(prompt: &str) -> [&str; 7] {
    [
        "exec",
        "--skip-git-repo-check",
        "--color",
        "never",
        "-s",
        "danger-full-access",
        prompt,
    ]
}

/// The Codex CLI's arguments for `codex exec resume --last` with `prompt`: the next turn of
/// the last session (its whole history re-sent).
pub fn resume_last_args(prompt: &str) -> [&str; 5] {
    ["exec", "resume", "--last", "--skip-git-repo-check", prompt]
}
