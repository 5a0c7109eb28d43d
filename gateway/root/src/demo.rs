//! `codex-gateway demo`: the gateway on its embedded defaults in front of a built-in mock
//! Codex upstream, with a demo account and a demo key, so a fresh machine can try it at once.
//!
//! # Key Components
//! - [`run`]: starts mock-codex in-process, imports a demo `auth.json` it issued, creates a
//!   key, starts the gateway, prints a `curl` to try, and serves until SIGINT/SIGTERM.

use std::path::PathBuf;

use benches::{MockAccount, MockCodex, MockConfig};

use gateway::config::ConfigError;

use crate::config::Config;

use crate::app::App;

/// Demo options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Data-plane listen address.
    #[arg(long, default_value = "127.0.0.1:8080", env = "CODEX_GATEWAY_LISTEN")]
    pub listen: String,
    /// Admin listen address.
    #[arg(
        long,
        default_value = "127.0.0.1:8081",
        env = "CODEX_GATEWAY_ADMIN_LISTEN"
    )]
    pub admin_listen: String,
    /// Data directory (SQLite) for the demo.
    #[arg(long, default_value = "./data-demo", env = "CODEX_GATEWAY_DATA_DIR")]
    pub data_dir: PathBuf,
}

/// Runs the demo until a signal arrives. Returns the process exit code.
pub fn run(args: DemoArgs, wait: impl FnOnce()) -> Result<(), String> {
    let mock = MockCodex::start(MockConfig {
        deltas: 12,
        inter_event_delay: std::time::Duration::from_millis(60),
        ..MockConfig::default()
    })
    .map_err(|e| format!("cannot start the demo upstream: {e}"))?;
    let tokens = mock.add_account(MockAccount::new("acct-demo-1"));
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| format!("cannot create {}: {e}", args.data_dir.display()))?;
    let auth = args.data_dir.join("demo-auth.json");
    let body = format!(
        "{{\"auth_mode\":\"chatgpt\",\"OPENAI_API_KEY\":null,\"tokens\":{{\"id_token\":\"{}\",\"access_token\":\"{}\",\"refresh_token\":\"{}\",\"account_id\":\"{}\"}},\"last_refresh\":\"2026-11-29T00:00:00Z\"}}",
        tokens.id_token, tokens.access_token, tokens.refresh_token, tokens.account_id
    );
    std::fs::write(&auth, body).map_err(|e| format!("cannot write {}: {e}", auth.display()))?;
    let db = admin::DbTarget {
        data_dir: args.data_dir.clone(),
        database_url: None,
    };
    admin::cli::accounts_import(&db, std::slice::from_ref(&auth), &mock.token_url())
        .map_err(|e| format!("cannot import the demo account: {e}"))?;
    let _ = std::fs::remove_file(&auth);
    let key =
        admin::cli::keys_create(&db, "demo").map_err(|e| format!("cannot create a key: {e}"))?;

    let mut cfg =
        Config::with_upstream(&mock.base_url()).map_err(|e: ConfigError| e.to_string())?;
    cfg.listen = args
        .listen
        .parse()
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    cfg.sidecar.admin_listen = args
        .admin_listen
        .parse()
        .map_err(|e| format!("--admin-listen {}: {e}", args.admin_listen))?;
    cfg.sidecar.db.data_dir = args.data_dir.clone();
    cfg.sidecar.oauth_token_url = mock.token_url();
    let mut app = App::spawn(cfg).map_err(|e| e.to_string())?;
    let addr = app.data_addr;
    #[allow(clippy::print_stdout)]
    {
        println!("codex-gateway demo is running on http://{addr} (admin http://{}), upstream: built-in mock-codex at {}", app.admin_addr, mock.base_url());
        println!("demo key: {key}");
        println!("try:\n  curl -N http://{addr}/v1/responses -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' -d '{{\"model\":\"gpt-5.5\",\"input\":\"say hi\",\"stream\":true}}'");
    }
    wait();
    app.shutdown();
    mock.shutdown();
    Ok(())
}
