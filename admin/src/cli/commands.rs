//! The `codex-gateway accounts|keys|admin|secrets ...` subcommands: their clap definitions
//! ([`Command`], flattened into the binary's own command enum) and their dispatch and
//! printing ([`run`]), over the blocking helpers of [`crate::cli`].
//!
//! # Error handling
//! A failure prints `codex-gateway: <message>` on stderr and exits 1 (a refresh that failed
//! for some account prints its line on stdout and exits 1 too); clap exits 2 on bad usage.

use std::{path::PathBuf, process::ExitCode};

use clap::Subcommand;

use crate::{oauth::DEFAULT_TOKEN_URL, AdminError, DbTarget};

/// The admin subcommands of `codex-gateway` (flattened into its command list).
#[derive(Subcommand)]
pub enum Command {
    /// Manage pooled accounts.
    Accounts {
        #[command(subcommand)]
        cmd: AccountsCmd,
    },
    /// Manage client API keys.
    Keys {
        #[command(subcommand)]
        cmd: KeysCmd,
    },
    /// Manage the admin web app / admin API credentials.
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
    },
    /// Manage the storage secret key.
    Secrets {
        #[command(subcommand)]
        cmd: SecretsCmd,
    },
}

/// `codex-gateway admin ...`.
#[derive(Subcommand)]
pub enum AdminCmd {
    /// Set a new random admin password, print it once, and end every admin session.
    ResetPassword {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Create an admin API token and print it once (also the way in while logins are
    /// rate-limited).
    CreateToken {
        /// Token name.
        name: String,
        /// `admin` (everything) or `read` (GET only).
        #[arg(long, default_value = "admin")]
        scope: String,
        /// Expire after this many days (default: never).
        #[arg(long)]
        expires_in_days: Option<u32>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List admin API tokens (prefixes, scopes, expiries; never the tokens).
    Tokens {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Show the audit log of admin actions, newest first (secrets are never stored in it).
    Audit {
        /// Only actors containing this text (`session`, `token:<name>`, `cli`, `auto-clean`,
        /// `auth-dir`).
        #[arg(long)]
        actor: Option<String>,
        /// Only actions starting with this text (`accounts`, `keys.update`, ...).
        #[arg(long)]
        action: Option<String>,
        /// Only the last this many hours.
        #[arg(long)]
        since_hours: Option<u32>,
        /// At most this many entries.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Print CSV (the columns of GET /api/admin/audit/export.csv).
        #[arg(long)]
        csv: bool,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// `codex-gateway secrets ...`.
#[derive(Subcommand)]
pub enum SecretsCmd {
    /// Re-encrypt every stored token with a new key in one transaction and install the key
    /// (secret.key is replaced; with CODEX_GATEWAY_SECRET_KEY the new key is printed once).
    /// Stop every gateway using the database first.
    Rotate {
        #[command(flatten)]
        db: DbArgs,
        /// The new key (base64 of 32 bytes); a random one when omitted.
        #[arg(long, env = "CODEX_GATEWAY_NEW_SECRET_KEY", hide_env_values = true)]
        new_key: Option<String>,
    },
}

/// The store a subcommand opens (its [`DbTarget`]).
#[derive(clap::Args, Clone)]
pub struct DbArgs {
    /// Data directory (SQLite database and secret key).
    #[arg(long, env = "CODEX_GATEWAY_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    /// Database URL (postgres://...); default SQLite in the data directory.
    #[arg(long, env = "CODEX_GATEWAY_DATABASE_URL")]
    database_url: Option<String>,
}

// === impl DbArgs ===

impl DbArgs {
    fn target(&self) -> DbTarget {
        DbTarget {
            data_dir: self.data_dir.clone(),
            database_url: self.database_url.clone(),
        }
    }
}

/// `codex-gateway accounts ...`.
#[derive(Subcommand)]
pub enum AccountsCmd {
    /// Import auth.json files, flat {"type":"codex"} files, directories, or refresh-token lists.
    Import {
        #[command(flatten)]
        db: DbArgs,
        /// OAuth token endpoint (used for refresh-token-only inputs).
        #[arg(long, env = "CODEX_GATEWAY_OAUTH_TOKEN_URL", default_value = DEFAULT_TOKEN_URL)]
        oauth_token_url: String,
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// List accounts (status, plan, quota windows, cooldown).
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Enable an account (clears its cooldown).
    Enable {
        /// Account id (see `accounts list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Disable an account.
    Disable {
        /// Account id.
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Delete an account and its tokens.
    Delete {
        /// Account id.
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Refresh tokens now (one account, or every active account).
    Refresh {
        /// Account id; all active accounts when omitted.
        id: Option<i64>,
        #[command(flatten)]
        db: DbArgs,
        /// OAuth token endpoint.
        #[arg(long, env = "CODEX_GATEWAY_OAUTH_TOKEN_URL", default_value = DEFAULT_TOKEN_URL)]
        oauth_token_url: String,
        /// Redis URL: hold the fleet-wide refresh lease while refreshing.
        #[arg(long, env = "CODEX_GATEWAY_REDIS_URL")]
        redis_url: Option<String>,
    },
}

/// `codex-gateway keys ...`.
#[derive(Subcommand)]
pub enum KeysCmd {
    /// Create a key; prints it once on stdout.
    Create {
        /// Key name.
        name: String,
        #[command(flatten)]
        limits: KeyLimitArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Change a key's limits (flags given replace those limits; `--clear NAME` removes one).
    Set {
        /// Key id.
        id: i64,
        #[command(flatten)]
        limits: KeyLimitArgs,
        /// Remove these limits (rpm, max_concurrency, tokens_per_day, tokens_per_month,
        /// cost_per_day_usd, cost_per_month_usd, allowed_models, account_group, service_tier,
        /// expires_at).
        #[arg(long = "clear", value_name = "NAME")]
        clear: Vec<String>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List keys (never the keys themselves).
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a key by id or name.
    Revoke {
        /// Id or name.
        id_or_name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// Per-key limits on the command line (see `PATCH /api/admin/keys/{id}`).
#[derive(clap::Args, Default)]
pub struct KeyLimitArgs {
    /// Requests per minute (fleet-wide with Redis).
    #[arg(long)]
    rpm: Option<u32>,
    /// Requests in flight at once.
    #[arg(long)]
    max_concurrency: Option<u32>,
    /// Tokens (input + output) per UTC day.
    #[arg(long)]
    tokens_per_day: Option<u64>,
    /// Tokens per UTC month.
    #[arg(long)]
    tokens_per_month: Option<u64>,
    /// Spend per UTC day, USD (at the configured prices).
    #[arg(long, value_name = "USD")]
    cost_per_day: Option<f64>,
    /// Spend per UTC month, USD.
    #[arg(long, value_name = "USD")]
    cost_per_month: Option<f64>,
    /// Allowed models, comma-separated (a trailing `*` matches a prefix).
    #[arg(long, value_delimiter = ',')]
    models: Option<Vec<String>>,
    /// Account group the key uses (accounts of that group only).
    #[arg(long)]
    group: Option<String>,
    /// What happens to the key's requests asking for the priority (`fast`) service tier:
    /// pass, strip or refuse (`--clear service_tier`: the global setting applies).
    #[arg(long, value_name = "POLICY")]
    service_tier: Option<String>,
    /// Expiry, Unix seconds.
    #[arg(long, value_name = "UNIX_SECONDS")]
    expires_at: Option<u64>,
    /// Disable the key (refused like an unknown key).
    #[arg(long, conflicts_with = "enable")]
    disable: bool,
    /// Enable the key.
    #[arg(long)]
    enable: bool,
}

// === impl KeyLimitArgs ===

impl KeyLimitArgs {
    /// The limits as the admin API's JSON patch; `clear` names limits set to null.
    fn to_json(&self, clear: &[String]) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: serde_json::Value| {
            m.insert(k.to_owned(), v);
        };
        for c in clear {
            put(c, serde_json::Value::Null);
        }
        if let Some(v) = self.rpm {
            put("rpm", v.into());
        }
        if let Some(v) = self.max_concurrency {
            put("max_concurrency", v.into());
        }
        if let Some(v) = self.tokens_per_day {
            put("tokens_per_day", v.into());
        }
        if let Some(v) = self.tokens_per_month {
            put("tokens_per_month", v.into());
        }
        if let Some(v) = self.cost_per_day {
            put("cost_per_day_usd", v.into());
        }
        if let Some(v) = self.cost_per_month {
            put("cost_per_month_usd", v.into());
        }
        if let Some(v) = &self.models {
            put("allowed_models", v.clone().into());
        }
        if let Some(v) = &self.group {
            put("account_group", v.clone().into());
        }
        if let Some(v) = &self.service_tier {
            put("service_tier", v.clone().into());
        }
        if let Some(v) = self.expires_at {
            put("expires_at", v.into());
        }
        if self.disable {
            put("enabled", false.into());
        } else if self.enable {
            put("enabled", true.into());
        }
        serde_json::Value::Object(m)
    }
}

/// Runs one admin subcommand; its exit code (0 ok, 1 failure).
pub fn run(cmd: Command) -> ExitCode {
    match cmd {
        Command::Accounts { cmd } => run_accounts(cmd),
        Command::Keys { cmd } => run_keys(cmd),
        Command::Admin { cmd } => run_admin(cmd),
        Command::Secrets { cmd } => run_secrets(cmd),
    }
}

/// `codex-gateway: <e>` on stderr, exit 1.
fn fail(e: &AdminError) -> ExitCode {
    eprintln!("codex-gateway: {e}");
    ExitCode::from(1)
}

#[allow(clippy::print_stdout)]
fn toggle(r: Result<bool, AdminError>, id: i64, what: &str) -> ExitCode {
    match r {
        Ok(true) => {
            println!("account {id} {what}");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("codex-gateway: no account with id {id}");
            ExitCode::from(1)
        }
        Err(e) => fail(&e),
    }
}

/// `codex-gateway admin ...`.
#[allow(clippy::print_stdout)]
pub fn run_admin(cmd: AdminCmd) -> ExitCode {
    match cmd {
        AdminCmd::ResetPassword { db } => match super::admin_reset_password(&db.target()) {
            Ok(pw) => {
                println!("{}", pw.expose());
                eprintln!(
                    "codex-gateway: new admin password set (shown once); every admin session ended"
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        AdminCmd::CreateToken {
            name,
            scope,
            expires_in_days,
            db,
        } => {
            let expires_at = expires_in_days.map(|d| {
                i64::try_from(shared_state::now_ms())
                    .unwrap_or(i64::MAX)
                    .saturating_add(i64::from(d) * 86_400_000)
            });
            match super::admin_tokens_create(&db.target(), &name, &scope, expires_at) {
                Ok((token, row)) => {
                    println!("{}", token.expose());
                    eprintln!(
                        "codex-gateway: admin token #{} ({}) created (shown once)",
                        row.id, row.scope
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        AdminCmd::Audit {
            actor,
            action,
            since_hours,
            limit,
            csv,
            db,
        } => {
            let since_ms = since_hours.map(|h| {
                i64::try_from(shared_state::now_ms())
                    .unwrap_or(i64::MAX)
                    .saturating_sub(i64::from(h) * 3_600_000)
            });
            let filter = crate::storage::audit::AuditFilter {
                actor,
                action,
                since_ms,
                ..Default::default()
            };
            match super::audit_list(&db.target(), &filter, limit.clamp(1, 100_000)) {
                Ok(rows) => {
                    let mut out = String::new();
                    if csv {
                        out.push_str(crate::audit::CSV_HEADER);
                        for r in &rows {
                            crate::audit::csv_row(&mut out, r);
                        }
                    } else {
                        for r in &rows {
                            let e = &r.entry;
                            out.push_str(&format!(
                                "{:<6} {:<14} {:<24} {:<24} {:<10} {:<4} {}{}\n",
                                r.id,
                                e.at_ms,
                                e.actor,
                                e.action,
                                format!(
                                    "{}{}",
                                    e.object_type.as_deref().unwrap_or(""),
                                    e.object_id
                                        .as_deref()
                                        .map(|i| format!("#{i}"))
                                        .unwrap_or_default()
                                ),
                                e.status,
                                e.before
                                    .as_deref()
                                    .map(|b| format!("{b} -> "))
                                    .unwrap_or_default(),
                                e.after.as_deref().or(e.details.as_deref()).unwrap_or("")
                            ));
                        }
                    }
                    print!("{out}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        AdminCmd::Tokens { db } => match super::admin_tokens_list(&db.target()) {
            Ok(rows) => {
                println!(
                    "{:<5} {:<24} {:<12} {:<6} {:<14} status",
                    "id", "name", "prefix", "scope", "expires_at"
                );
                let now = i64::try_from(shared_state::now_ms()).unwrap_or(i64::MAX);
                for r in rows {
                    let st = if r.revoked_at.is_some() {
                        "revoked"
                    } else if r.expires_at.is_some_and(|at| now >= at) {
                        "expired"
                    } else {
                        "active"
                    };
                    let exp = r.expires_at.map_or("never".to_owned(), |at| at.to_string());
                    println!(
                        "{:<5} {:<24} {:<12} {:<6} {:<14} {st}",
                        r.id, r.name, r.token_prefix, r.scope, exp
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
    }
}

/// `codex-gateway accounts ...`.
#[allow(clippy::print_stdout)]
pub fn run_accounts(cmd: AccountsCmd) -> ExitCode {
    match cmd {
        AccountsCmd::Enable { id, db } => {
            toggle(super::accounts_enable(&db.target(), id), id, "enabled")
        }
        AccountsCmd::Disable { id, db } => {
            toggle(super::accounts_disable(&db.target(), id), id, "disabled")
        }
        AccountsCmd::Delete { id, db } => {
            toggle(super::accounts_delete(&db.target(), id), id, "deleted")
        }
        AccountsCmd::Refresh {
            id,
            db,
            oauth_token_url,
            redis_url,
        } => match super::accounts_refresh_with(
            &db.target(),
            id,
            &oauth_token_url,
            redis_url.as_deref(),
        ) {
            Ok(results) => {
                let mut failed = false;
                for (id, r) in results {
                    match r {
                        Ok(()) => println!("account {id}: refreshed"),
                        Err(e) => {
                            failed = true;
                            println!("account {id}: refresh failed: {e}");
                        }
                    }
                }
                if failed {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => fail(&e),
        },
        AccountsCmd::Import {
            db,
            oauth_token_url,
            paths,
        } => match super::accounts_import(&db.target(), &paths, &oauth_token_url) {
            Ok(summary) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        AccountsCmd::List { db } => match super::accounts_list(&db.target()) {
            Ok(rows) => {
                println!(
                    "{:<5} {:<38} {:<28} {:<6} {:<16} {:>8} {:>8} cooldown_until",
                    "id", "account", "label", "plan", "status", "5h %", "week %"
                );
                let now = shared_state::now_ms() as i64;
                for r in rows {
                    let pct = |p: Option<f64>| p.map_or("-".to_owned(), |p| format!("{p:.1}"));
                    let cd = if r.cooldown_until_ms > now {
                        format!(
                            "{}s ({})",
                            (r.cooldown_until_ms - now) / 1000,
                            r.cooldown_reason.as_deref().unwrap_or("")
                        )
                    } else {
                        "-".to_owned()
                    };
                    println!(
                        "{:<5} {:<38} {:<28} {:<6} {:<16} {:>8} {:>8} {cd}",
                        r.id,
                        r.chatgpt_account_id,
                        r.label(),
                        r.plan_type.as_deref().unwrap_or("-"),
                        r.status.as_str(),
                        pct(r.primary_used_pct),
                        pct(r.secondary_used_pct),
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
    }
}

/// `codex-gateway secrets ...`.
#[allow(clippy::print_stdout)]
pub fn run_secrets(cmd: SecretsCmd) -> ExitCode {
    match cmd {
        SecretsCmd::Rotate { db, new_key } => {
            match super::secrets_rotate(&db.target(), new_key.as_deref()) {
                Ok(r) => {
                    match &r.key_file {
                        Some(p) => println!(
                            "re-encrypted {} token columns; the new key is in {}",
                            r.columns,
                            p.display()
                        ),
                        None => {
                            eprintln!(
                                "re-encrypted {} token columns; set CODEX_GATEWAY_SECRET_KEY to the new key below on every instance",
                                r.columns
                            );
                            println!("{}", r.new_key_base64.expose());
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
    }
}

/// `codex-gateway keys ...`.
#[allow(clippy::print_stdout)]
pub fn run_keys(cmd: KeysCmd) -> ExitCode {
    match cmd {
        KeysCmd::Create { name, limits, db } => {
            match super::keys_create_with(&db.target(), &name, &limits.to_json(&[])) {
                Ok(k) => {
                    println!("{k}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        KeysCmd::Set {
            id,
            limits,
            clear,
            db,
        } => match super::keys_set(&db.target(), id, &limits.to_json(&clear)) {
            Ok(r) => {
                println!("key {} ({}) updated", r.id, r.name);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        KeysCmd::List { db } => match super::keys_list(&db.target()) {
            Ok(rows) => {
                println!("{:<5} {:<24} {:<14} status", "id", "name", "prefix");
                for r in rows {
                    let st = if r.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "active"
                    };
                    println!("{:<5} {:<24} {:<14} {st}", r.id, r.name, r.key_prefix);
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        KeysCmd::Revoke { id_or_name, db } => match super::keys_revoke(&db.target(), &id_or_name) {
            Ok(0) => {
                eprintln!("codex-gateway: no key matches `{id_or_name}`");
                ExitCode::from(1)
            }
            Ok(n) => {
                println!("revoked {n} key(s)");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
    }
}
