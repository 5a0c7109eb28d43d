//! `codex-gateway`: thin binary. Parses the command line, then calls the composition root
//! ([`codex_gateway::app`], [`codex_gateway::demo`]) or the admin subcommands, which live
//! beside the admin code they drive (`admin::cli::Command`, run by `admin::cli::run`).
//! Exit codes: 0 ok, 1 start-up/runtime failure, 2 bad configuration or usage.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use codex_gateway::app::App;
use codex_gateway::config::{Config, ServeArgs};
#[cfg(feature = "demo")]
use codex_gateway::demo::{self, DemoArgs};

/// mimalloc instead of glibc's malloc: per-thread free lists without arena locks or
/// consolidation passes. Every request and event allocates a little (buffers, header
/// strings, parsed JSON), and glibc's allocator was about 14 % of a worker's CPU on short
/// requests (benches/README.md, "The allocator").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "codex-gateway",
    version,
    about = "Pools ChatGPT Codex accounts behind OpenAI-compatible APIs"
)]
struct Cli {
    /// Log format on stderr: text (colours only on a terminal) or json (one object per line).
    #[arg(
        long,
        global = true,
        env = "CODEX_GATEWAY_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: gateway::logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Run the gateway in front of a built-in mock upstream with a demo account and key.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    // accounts, keys, admin, secrets: defined and run beside the admin code they drive.
    #[command(flatten)]
    Admin(admin::cli::Command),
}

fn wait_for_signal() {
    use signal_hook::{consts::*, iterator::Signals};
    match Signals::new([SIGINT, SIGTERM]) {
        Ok(mut s) => {
            let _ = s.forever().next();
        }
        Err(e) => tracing::error!(error = %e, "cannot install signal handlers"),
    }
    tracing::info!("signal received; draining");
}

#[allow(clippy::print_stdout)]
fn main() -> ExitCode {
    let cli = Cli::parse();
    gateway::logging::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let cfg = match Config::load(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("codex-gateway: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut app = match App::spawn(cfg) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("codex-gateway: {e}");
                    return ExitCode::from(1);
                }
            };
            eprintln!(
                "codex-gateway listening on http://{} (admin http://{}; workers: {:?})",
                app.data_addr, app.admin_addr, app.drivers
            );
            wait_for_signal();
            app.shutdown();
            ExitCode::SUCCESS
        }
        #[cfg(feature = "demo")]
        Command::Demo(args) => match demo::run(args, wait_for_signal) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("codex-gateway demo: {e}");
                ExitCode::from(1)
            }
        },
        Command::Admin(cmd) => admin::cli::run(cmd),
    }
}
