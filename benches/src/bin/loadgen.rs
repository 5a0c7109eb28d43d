//! `loadgen`: N concurrent SSE streams (or JSON requests, or Responses WebSocket sessions with
//! `--mode ws`) against one URL, with ramp-up; prints TTFB / latency / inter-event gap
//! percentiles, events/s, errors, and the target process's CPU per event and RSS per open
//! stream (see `benches/README.md`, section "loadgen").
//!
//! Exit codes: 0 when the run finished (errors are reported, not fatal), 64 for a bad flag,
//! 1 when the run could not start.

use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use benches::loadgen::{self, procfs::raise_nofile_limit, ws::WsConfig, LoadConfig};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http::Method;

/// What each client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// HTTP/1.1 requests (SSE streams or JSON answers) back to back on one connection.
    Http,
    /// Responses WebSocket sessions: `response.create` turns, one at a time, on one socket.
    Ws,
}

/// Load generator for codex-gateway, mock-codex and reverse proxies.
#[derive(Parser, Debug)]
#[command(name = "loadgen", version)]
struct Args {
    /// Target URL, e.g. http://127.0.0.1:8080/v1/responses (http:// only; ws:// or http://
    /// with --mode ws).
    #[arg(long)]
    url: String,
    /// `http`: requests; `ws`: Responses WebSocket sessions (GET URL with Upgrade), the body
    /// sent as `{"type":"response.create",...}` frames.
    #[arg(long, value_enum, default_value_t = Mode::Http)]
    mode: Mode,
    /// ws: turns per socket before it is closed and a new one opened; 0: until the end of
    /// the run. Default 0, or 1 with --idle.
    #[arg(long)]
    turns: Option<u64>,
    /// ws: each turn names the previous turn's response id as `previous_response_id`.
    #[arg(long)]
    chain: bool,
    /// ws: pause between two turns of a socket, ms.
    #[arg(long, default_value_t = 0.0)]
    think_time_ms: f64,
    /// ws: after its turns each session holds its socket open and silent until the end of
    /// --duration-secs (memory per idle session).
    #[arg(long)]
    idle: bool,
    /// Bearer token sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    key: Option<String>,
    /// Request body: JSON text, or @FILE. Default: a Responses body from --model / --input.
    #[arg(long)]
    body: Option<String>,
    /// Model of the generated body (one the gateway's catalog knows).
    #[arg(long, default_value = "gpt-5.5")]
    model: String,
    /// User input of the generated body.
    #[arg(long, default_value = "Say hello.")]
    input: String,
    /// `stream: true` in the generated body (the default).
    #[arg(long, overrides_with = "no_stream")]
    stream: bool,
    /// `stream: false` in the generated body (one JSON answer per request).
    #[arg(long)]
    no_stream: bool,
    /// `client_metadata` entry of the body, e.g. `x-mock-events-per-second=20` (repeatable;
    /// mock-codex reads its controls there and the gateway forwards it).
    #[arg(long = "client-metadata", value_name = "K=V")]
    client_metadata: Vec<String>,
    /// Extra request header `NAME:VALUE` (repeatable).
    #[arg(long = "header", short = 'H', value_name = "K:V")]
    headers: Vec<String>,
    /// HTTP method (default POST with a body).
    #[arg(long, default_value = "POST")]
    method: String,
    /// Concurrent clients, one connection each.
    #[arg(long, short = 'c', default_value_t = 10)]
    concurrency: usize,
    /// Spread the clients' start over this many seconds.
    #[arg(long, default_value_t = 0.0)]
    ramp_up_secs: f64,
    /// Measure for this many seconds after the ramp-up; open requests are then cut.
    #[arg(long)]
    duration_secs: Option<f64>,
    /// Stop after this many requests in total.
    #[arg(long)]
    requests: Option<u64>,
    /// A request fails when no byte arrives for this long.
    #[arg(long, default_value_t = 60.0)]
    idle_timeout_secs: f64,
    /// Process to sample (CPU from /proc/PID/stat, RSS from /proc/PID/status); repeatable or
    /// comma-separated, summed (nginx master + workers).
    #[arg(long = "target-pid", value_delimiter = ',')]
    target_pids: Vec<u32>,
    /// Sampling period of the target's RSS and the open streams, ms.
    #[arg(long, default_value_t = 100)]
    sample_ms: u64,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A label copied into the report.
    #[arg(long, default_value = "")]
    label: String,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Bind the connections to these local addresses, round robin (repeatable or
    /// comma-separated), e.g. 127.0.0.2,127.0.0.3: one source address gives one destination
    /// about 28,000 ephemeral ports.
    #[arg(long = "source-ip", value_delimiter = ',')]
    source_ips: Vec<std::net::IpAddr>,
}

/// Exit code for a bad command line (EX_USAGE).
const EXIT_USAGE: u8 = 64;

fn secs(v: f64, flag: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v).map_err(|e| format!("--{flag}: {e}"))
}

fn pair<'a>(s: &'a str, sep: char, flag: &str) -> Result<(&'a str, &'a str), String> {
    s.split_once(sep)
        .map(|(k, v)| (k.trim(), v.trim()))
        .ok_or_else(|| format!("--{flag} expects K{sep}V, got {s:?}"))
}

fn config(a: &Args) -> Result<LoadConfig, String> {
    let mut metadata = Vec::new();
    for m in &a.client_metadata {
        let (k, v) = pair(m, '=', "client-metadata")?;
        metadata.push((k.to_owned(), v.to_owned()));
    }
    let body = match &a.body {
        Some(b) => {
            let text = match b.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(PathBuf::from(path))
                    .map_err(|e| format!("--body {path}: {e}"))?,
                None => b.clone(),
            };
            if metadata.is_empty() {
                Bytes::from(text)
            } else {
                let mut v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| format!("--body: {e}"))?;
                let obj = v
                    .as_object_mut()
                    .ok_or("--body must be a JSON object to take --client-metadata")?;
                let meta = obj
                    .entry("client_metadata")
                    .or_insert_with(|| serde_json::json!({}));
                for (k, val) in &metadata {
                    meta[k.as_str()] = serde_json::Value::String(val.clone());
                }
                Bytes::from(v.to_string())
            }
        }
        None => loadgen::responses_body(&a.model, &a.input, !a.no_stream, &metadata),
    };
    let mut headers = Vec::new();
    if let Some(k) = &a.key {
        headers.push(("authorization".to_owned(), format!("Bearer {k}")));
    }
    for h in &a.headers {
        let (k, v) = pair(h, ':', "header")?;
        headers.push((k.to_ascii_lowercase(), v.to_owned()));
    }
    if a.duration_secs.is_none() && a.requests.is_none() {
        return Err("give --duration-secs or --requests".to_owned());
    }
    let ws = match a.mode {
        Mode::Http => {
            if a.turns.is_some() || a.chain || a.idle || a.think_time_ms != 0.0 {
                return Err("--turns, --chain, --think-time-ms and --idle need --mode ws".into());
            }
            None
        }
        Mode::Ws => {
            if a.idle && a.duration_secs.is_none() {
                return Err("--idle needs --duration-secs (how long to hold)".to_owned());
            }
            Some(WsConfig {
                turns: a.turns.unwrap_or(u64::from(a.idle)),
                chain: a.chain,
                think_time: secs(a.think_time_ms / 1000.0, "think-time-ms")?,
                idle: a.idle,
            })
        }
    };
    Ok(LoadConfig {
        label: a.label.clone(),
        url: a.url.clone(),
        method: Method::from_bytes(a.method.to_ascii_uppercase().as_bytes())
            .map_err(|e| format!("--method: {e}"))?,
        body,
        headers,
        concurrency: a.concurrency,
        ramp_up: secs(a.ramp_up_secs, "ramp-up-secs")?,
        duration: a
            .duration_secs
            .map(|d| secs(d, "duration-secs"))
            .transpose()?,
        requests: a.requests,
        idle_timeout: secs(a.idle_timeout_secs, "idle-timeout-secs")?,
        target_pids: a.target_pids.clone(),
        sample_every: Duration::from_millis(a.sample_ms.max(1)),
        ws,
        source_ips: a.source_ips.clone(),
    })
}

#[allow(clippy::print_stdout)]
fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let cfg = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let limit = raise_nofile_limit();
    if (limit as usize) < cfg.concurrency + 64 {
        eprintln!(
            "loadgen: warning: open-file limit {limit} is below --concurrency {}",
            cfg.concurrency
        );
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match rt.block_on(loadgen::run(cfg)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let res = if args.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write!(out, "{}", report.table())
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}
