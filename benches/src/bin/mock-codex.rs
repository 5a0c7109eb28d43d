//! `mock-codex`: the mock ChatGPT Codex upstream as a standalone process (see
//! `benches/README.md`, section "mock-codex").
//!
//! Parses flags (exit 64 on a bad flag), raises the open-file limit, starts
//! [`benches::MockCodex`], prints `mock-codex listening on <origin>` (plus one JSON line per
//! `--account`), and runs until SIGINT or SIGTERM.

use std::{io::Write as _, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use benches::{mock::DEFAULT_PREFIX, Behaviour, MockAccount, MockCodex, MockConfig};
use clap::Parser;

/// Mock ChatGPT Codex upstream (POST /backend-api/codex/responses SSE, the Responses WebSocket,
/// /models, /wham/usage, /oauth/token) for integration and load tests.
#[derive(Parser, Debug)]
#[command(name = "mock-codex", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:18080")]
    listen: SocketAddr,
    /// PEM certificate chain: serve TLS (ALPN h2 and http/1.1).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Path prefix of the Codex routes (/responses, /models).
    #[arg(long, default_value = DEFAULT_PREFIX)]
    prefix: String,
    /// Number of response.output_text.delta events per answer (capped by the text length).
    #[arg(long, default_value_t = 8)]
    deltas: usize,
    /// Assistant text of every answer.
    #[arg(long)]
    text: Option<String>,
    /// Delay before the response head of /responses, in ms.
    #[arg(long, default_value_t = 0)]
    first_byte_delay_ms: u64,
    /// Delay between SSE events, in ms.
    #[arg(long, default_value_t = 0)]
    inter_event_delay_ms: u64,
    /// Pace SSE events at this rate per stream (sets --inter-event-delay-ms to 1000/RATE).
    #[arg(long, value_name = "RATE")]
    events_per_second: Option<f64>,
    /// Answer with exactly N deltas of a fixed token, rendered as the stream goes (long-lived
    /// load-test streams); overrides --text / --deltas.
    #[arg(long, value_name = "N")]
    tokens: Option<u64>,
    /// Delay of the OAuth token endpoint, in ms.
    #[arg(long, default_value_t = 0)]
    token_delay_ms: u64,
    /// Lifetime of issued access tokens, in seconds.
    #[arg(long, default_value_t = 3600)]
    access_token_ttl_secs: u64,
    /// Require the latest issued, unexpired access token of the ChatGPT-Account-Id.
    #[arg(long)]
    strict_tokens: bool,
    /// Refresh answers carry no new refresh_token (the old one stays valid).
    #[arg(long)]
    omit_rotated_refresh_token: bool,
    /// Plan type of accounts not registered with --account.
    #[arg(long, default_value = "plus")]
    plan_type: String,
    /// Primary (5 h) window used percent reported by default.
    #[arg(long, default_value_t = 0.0)]
    primary_used_percent: f64,
    /// Secondary (weekly) window used percent reported by default.
    #[arg(long, default_value_t = 0.0)]
    secondary_used_percent: f64,
    /// Controls applied to every request, e.g. `inter_event_delay_ms=20,deltas=32`.
    #[arg(long, value_name = "SPEC")]
    behaviour: Option<String>,
    /// Per-account controls, e.g. `acct-1=error=usage_limit_reached,fail_times=2` (repeatable).
    #[arg(long = "account-behaviour", value_name = "ID=SPEC")]
    account_behaviour: Vec<String>,
    /// Register an account at start and print its tokens as one JSON line (repeatable).
    #[arg(long = "account", value_name = "ID")]
    accounts: Vec<String>,
    /// Also write each --account's tokens as an official Codex `auth.json` file,
    /// `DIR/<ID>.json` (for `codex-gateway accounts import`).
    #[arg(long, value_name = "DIR")]
    write_auth_json: Option<PathBuf>,
    /// Requests kept for /__mock/requests (0 disables recording).
    #[arg(long, default_value_t = 10_000)]
    max_recorded: usize,
    /// Runtime worker threads (default: available parallelism).
    #[arg(long)]
    workers: Option<usize>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised on HTTP/2 connections.
    #[arg(long, default_value_t = 4096)]
    h2_max_concurrent_streams: u32,
    /// Send GOAWAY on a connection after this many requests (connection rotation).
    #[arg(long)]
    goaway_after_requests: Option<usize>,
    /// Responses WebSocket lifetime in seconds: a response.create on an older socket gets
    /// `websocket_connection_limit_reached` and the socket is closed (the real limit is 3600).
    #[arg(long, value_name = "SECS")]
    ws_max_connection_age_secs: Option<f64>,
    /// Answer WebSocket upgrades of /responses with this HTTP status (e.g. 426) instead of 101.
    #[arg(long, value_name = "STATUS", value_parser = clap::value_parser!(u16).range(200..=599))]
    ws_refuse_upgrade: Option<u16>,
    /// Close WebSocket messages larger than this many bytes with 1009 (message too big).
    #[arg(long, value_name = "BYTES")]
    ws_max_message_bytes: Option<usize>,
}

/// Exit code for a bad command line (EX_USAGE).
const EXIT_USAGE: u8 = 64;

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
            eprintln!("mock-codex: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    raise_nofile_limit();
    match run(&args, cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-codex: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config(a: &Args) -> Result<MockConfig, String> {
    let mut account_behaviours = Vec::new();
    for spec in &a.account_behaviour {
        let (id, s) = spec
            .split_once('=')
            .ok_or_else(|| format!("--account-behaviour expects ID=SPEC, got {spec:?}"))?;
        let b: Behaviour = s
            .parse()
            .map_err(|e| format!("--account-behaviour {id}: {e}"))?;
        account_behaviours.push((id.to_owned(), b));
    }
    let mut default_behaviour = match &a.behaviour {
        Some(s) => s.parse().map_err(|e| format!("--behaviour: {e}"))?,
        None => Behaviour::default(),
    };
    if let Some(n) = a.tokens {
        default_behaviour.tokens.get_or_insert(n);
    }
    let ws_max_connection_age = match a.ws_max_connection_age_secs {
        Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => return Err(format!("--ws-max-connection-age-secs: bad value {s}")),
        None => None,
    };
    let inter_event_delay = match a.events_per_second {
        Some(r) => benches::mock::per_second(&r.to_string())
            .map_err(|e| format!("--events-per-second: {e}"))?,
        None => Duration::from_millis(a.inter_event_delay_ms),
    };
    Ok(MockConfig {
        listen: a.listen,
        tls: a.tls_cert.clone().zip(a.tls_key.clone()),
        prefix: a.prefix.clone(),
        deltas: a.deltas,
        text: a.text.clone(),
        first_byte_delay: Duration::from_millis(a.first_byte_delay_ms),
        inter_event_delay,
        token_delay: Duration::from_millis(a.token_delay_ms),
        strict_tokens: a.strict_tokens,
        omit_rotated_refresh_token: a.omit_rotated_refresh_token,
        access_token_ttl: Duration::from_secs(a.access_token_ttl_secs),
        default_plan_type: a.plan_type.clone(),
        default_quota: (a.primary_used_percent, a.secondary_used_percent),
        default_behaviour,
        account_behaviours,
        max_recorded: a.max_recorded,
        worker_threads: a.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        }),
        h2_max_concurrent_streams: a.h2_max_concurrent_streams,
        goaway_after_requests: a.goaway_after_requests,
        ws_max_connection_age,
        ws_refuse_upgrade: a.ws_refuse_upgrade,
        ws_max_message_bytes: a.ws_max_message_bytes,
    })
}

fn run(args: &Args, cfg: MockConfig) -> anyhow::Result<()> {
    let handle = MockCodex::start(cfg)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "mock-codex listening on {}", handle.origin())?;
    for id in &args.accounts {
        let t = handle.add_account(MockAccount::new(id.as_str()).with_plan(args.plan_type.clone()));
        writeln!(out, "{}", serde_json::to_string(&t)?)?;
        if let Some(dir) = &args.write_auth_json {
            std::fs::create_dir_all(dir)?;
            let auth = serde_json::json!({
                "auth_mode": "chatgpt",
                "OPENAI_API_KEY": null,
                "tokens": {
                    "id_token": t.id_token,
                    "access_token": t.access_token,
                    "refresh_token": t.refresh_token,
                    "account_id": t.account_id,
                },
                "last_refresh": rfc3339_now(),
            });
            std::fs::write(dir.join(format!("{id}.json")), auth.to_string())?;
        }
    }
    out.flush()?;
    drop(out);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(wait_for_signal())?;
    handle.shutdown();
    Ok(())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

async fn wait_for_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (load tests open many sockets).
#[cfg(unix)]
#[allow(unsafe_code)]
fn raise_nofile_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the `rlimit` struct passed by pointer,
    // which lives on this stack frame for the duration of the calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 || rl.rlim_cur >= rl.rlim_max {
            return;
        }
        rl.rlim_cur = rl.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
            tracing::warn!("could not raise RLIMIT_NOFILE to {}", rl.rlim_max);
        }
    }
}

#[cfg(not(unix))]
fn raise_nofile_limit() {}
