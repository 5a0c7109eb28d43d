//! The `codex-gateway accounts|keys|admin|secrets ...` subcommands, and the blocking helpers
//! behind them.
//!
//! # Key Components
//! - [`Command`] (in `commands`): the subcommands' clap definitions, which the binary
//!   flattens into its own command list, and [`run`], their dispatch and printing (exit 0 ok,
//!   1 failure);
//! - [`accounts_import`], [`accounts_list`], [`accounts_enable`], [`accounts_disable`],
//!   [`accounts_delete`], [`accounts_refresh`], [`accounts_quota`], [`keys_create`],
//!   [`keys_list`], [`keys_revoke`], [`settings_get`], [`settings_set`], [`settings_unset`],
//!   [`admin_tokens_create`], [`admin_tokens_list`], [`admin_tokens_revoke`]:
//!   each builds a small current-thread Tokio runtime, opens (and migrates) the store the
//!   [`DbTarget`] names, does one thing and closes it. They are safe to run while a gateway is
//!   serving from the same database: the running sidecar picks the change up on its next
//!   reload (`reload_interval`), publishes it, and evicts the pooled sockets of an account
//!   that was disabled or deleted.
//! - Token refresh from the CLI rotates the refresh token. A running gateway refreshes on its
//!   own (ahead of expiry and on a 401); to exclude a concurrent refresh of the same account
//!   by it, pass the fleet's Redis URL to [`accounts_refresh_with`] (the same lease the
//!   sidecars take).
//! - [`create_key`]: the async core of key creation, shared with the admin API (defined in
//!   `crate::keys`).
//!
//! # Usage
//! ```no_run
//! # fn main() -> Result<(), admin::AdminError> {
//! let db = admin::DbTarget { data_dir: "./data".into(), database_url: None };
//! let key = admin::cli::keys_create(&db, "laptop")?;
//! println!("{key}");
//! # Ok(()) }
//! ```
//!
//! # Error handling
//! Every failure is an [`AdminError`] with a printable message.

use std::{future::Future, path::PathBuf};

use shared_state::AccountStatus;

use crate::{
    error::{AdminError, StorageError},
    import::ImportSummary,
    lease::RedisLeases,
    oauth::{build_http_client, OAuthClient, RefreshError},
    quota::{UsageClient, UsageEndpoint, WhamUsage},
    services::refresh::{exchange_and_store, Stored},
    storage::{AccountRow, AdminTokenRow, KeyRow, Storage},
    DbTarget,
};

pub use crate::keys::create_key;
pub use commands::{
    run, run_accounts, run_admin, run_keys, run_secrets, AccountsCmd, AdminCmd, Command, DbArgs,
    KeyLimitArgs, KeysCmd, SecretsCmd,
};

mod commands;

/// What [`secrets_rotate`] did.
#[derive(Debug)]
pub struct Rotated {
    /// Token columns re-encrypted.
    pub columns: usize,
    /// The key file replaced (`None`: the key comes from the environment, which the operator
    /// must now set to [`Rotated::new_key_base64`]).
    pub key_file: Option<PathBuf>,
    /// The new key, base64 (print it only when the key lives in the environment).
    pub new_key_base64: shared_state::Secret,
}

/// Re-encrypts every stored token with a new storage key, in one transaction, and installs the
/// key: `new_key` (base64 of 32 bytes) or a random one. Stop every gateway sharing the
/// database first (a running one still holds the old key).
///
/// With `secret.key`: the new key is first written to `secret.key.new` (0600, synced), then
/// the transaction commits, then the file is renamed over `secret.key`; a crash in between
/// leaves both keys on disk and start-up refuses the wrong one by name, never losing data.
/// With `CODEX_GATEWAY_SECRET_KEY`: nothing is written; set the variable to the new key.
pub fn secrets_rotate(db: &DbTarget, new_key: Option<&str>) -> Result<Rotated, AdminError> {
    use base64::Engine;
    use rand::RngCore;
    let key: [u8; 32] = match new_key {
        Some(text) => crate::crypto::decode_key_text(text)?,
        None => {
            let mut k = [0u8; 32];
            rand::rng().fill_bytes(&mut k);
            k
        }
    };
    let b64 = base64::engine::general_purpose::STANDARD.encode(key);
    let new = crate::crypto::Cipher::new(&key);
    block_on(async {
        let (_, source) = crate::crypto::load_key(&db.data_dir)?;
        let storage = crate::storage::open(db).await?;
        let key_file = db.data_dir.join(crate::crypto::SECRET_KEY_FILE);
        let staged = db
            .data_dir
            .join(format!("{}.new", crate::crypto::SECRET_KEY_FILE));
        let file_based = source != crate::crypto::KeySource::Env;
        if file_based {
            crate::crypto::write_key_file(&staged, &key, true)?;
        }
        let columns = match storage.rotate_secrets(&new).await {
            Ok(n) => n,
            Err(e) => {
                let _ = storage.close().await;
                if file_based {
                    let _ = std::fs::remove_file(&staged);
                }
                return Err(e.into());
            }
        };
        let _ = storage.close().await;
        if file_based {
            std::fs::rename(&staged, &key_file).map_err(|source| StorageError::Io {
                what: "cannot install the new key file (the database already uses it: rename it by hand)",
                path: staged.clone(),
                source,
            })?;
        }
        Ok(Rotated {
            columns,
            key_file: file_based.then_some(key_file),
            new_key_base64: shared_state::Secret::new(b64),
        })
    })
}

/// One outcome per account: `(account id, Ok(value) | Err(printable reason))`.
pub type PerAccount<T> = Vec<(i64, Result<T, String>)>;

fn block_on<T>(f: impl Future<Output = Result<T, AdminError>>) -> Result<T, AdminError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AdminError::Runtime)?;
    rt.block_on(f)
}

/// Records a command line action in the audit log (actor `cli`; secrets redacted there).
async fn audit(
    s: &dyn Storage,
    action: &str,
    object_type: &str,
    id: Option<String>,
    details: serde_json::Value,
) {
    let e = crate::audit::internal(crate::audit::ACTOR_CLI, action, object_type, id, details);
    crate::audit::record(s, &e).await;
}

/// [`audit`] with the changed members of `before` and `after`.
async fn audit_change(
    s: &dyn Storage,
    action: &str,
    object_type: &str,
    id: Option<String>,
    before: &serde_json::Value,
    after: &serde_json::Value,
) {
    let mut e = crate::audit::internal(
        crate::audit::ACTOR_CLI,
        action,
        object_type,
        id,
        serde_json::Value::Null,
    );
    let (b, a) = crate::audit::changed(&crate::audit::redact(before), &crate::audit::redact(after));
    e.before = b.map(|v| v.to_string());
    e.after = a.map(|v| v.to_string());
    crate::audit::record(s, &e).await;
}

async fn with_storage<T, F>(db: &DbTarget, f: F) -> Result<T, AdminError>
where
    F: for<'s> AsyncFnOnce(&'s dyn Storage) -> Result<T, AdminError>,
{
    let storage = crate::storage::open(db).await?;
    let res = f(storage.as_ref()).await;
    let _ = storage.close().await;
    res
}

/// Imports credential files / directories (see [`crate::import`]).
pub fn accounts_import(
    db: &DbTarget,
    paths: &[PathBuf],
    oauth_token_url: &str,
) -> Result<ImportSummary, AdminError> {
    let http = build_http_client(None).map_err(AdminError::HttpClient)?;
    let oauth = OAuthClient::new(http, oauth_token_url);
    block_on(with_storage(db, async |s: &dyn Storage| {
        let sum = crate::import::import_paths(s, &oauth, paths).await;
        let details = serde_json::json!({
            "added": sum.added, "updated": sum.updated, "skipped": sum.skipped.len(),
        });
        // One entry listing the accounts imported (`crate::audit::Affected`).
        let mut e = crate::audit::internal(
            crate::audit::ACTOR_CLI,
            "accounts.import",
            "account",
            None,
            details,
        );
        crate::audit::Affected::of("account", sum.ids.iter().copied()).fold_into(&mut e);
        crate::audit::record(s, &e).await;
        Ok(sum)
    }))
}

/// Lists accounts (no tokens).
pub fn accounts_list(db: &DbTarget) -> Result<Vec<AccountRow>, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(s.list_accounts().await?)
    }))
}

/// Sets an account `active` and clears its cooldown; `false` when no such account.
pub fn accounts_enable(db: &DbTarget, id: i64) -> Result<bool, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        if !s.set_status(id, AccountStatus::Active).await? {
            return Ok(false);
        }
        s.set_cooldown(id, 0, None).await?;
        audit(
            s,
            "accounts.enable",
            "account",
            Some(id.to_string()),
            serde_json::Value::Null,
        )
        .await;
        Ok(true)
    }))
}

/// Sets an account `disabled`; `false` when no such account.
pub fn accounts_disable(db: &DbTarget, id: i64) -> Result<bool, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        let done = s.set_status(id, AccountStatus::Disabled).await?;
        if done {
            audit(
                s,
                "accounts.disable",
                "account",
                Some(id.to_string()),
                serde_json::Value::Null,
            )
            .await;
        }
        Ok(done)
    }))
}

/// Deletes an account; `false` when no such account.
pub fn accounts_delete(db: &DbTarget, id: i64) -> Result<bool, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        let done = s.delete_account(id).await?;
        if done {
            audit(
                s,
                "accounts.delete",
                "account",
                Some(id.to_string()),
                serde_json::Value::Null,
            )
            .await;
        }
        Ok(done)
    }))
}

/// Refreshes the tokens of one account (`Some(id)`, whatever its status) or of every
/// `active` account (`None`) now, persisting the rotated refresh token. Returns one result
/// per account; a dead refresh token also sets the account `reauth_required` (`banned` when
/// deactivated). [`AdminError::NotFound`] when `Some(id)` does not exist.
pub fn accounts_refresh(
    db: &DbTarget,
    id: Option<i64>,
    oauth_token_url: &str,
) -> Result<PerAccount<()>, AdminError> {
    accounts_refresh_with(db, id, oauth_token_url, None)
}

/// [`accounts_refresh`], holding the fleet's Redis refresh lease for each account when
/// `redis_url` is given (an account whose lease another instance holds is reported, not
/// refreshed).
pub fn accounts_refresh_with(
    db: &DbTarget,
    id: Option<i64>,
    oauth_token_url: &str,
    redis_url: Option<&str>,
) -> Result<PerAccount<()>, AdminError> {
    let http = build_http_client(None).map_err(AdminError::HttpClient)?;
    let oauth = OAuthClient::new(http, oauth_token_url);
    let redis_url = redis_url.map(str::trim).filter(|u| !u.is_empty());
    block_on(with_storage(db, async |s: &dyn Storage| {
        let leases = match redis_url {
            Some(url) => Some(
                RedisLeases::connect(
                    url,
                    crate::lease::new_instance_id(),
                    crate::lease::LEASE_TTL,
                )
                .await
                .map_err(|e| AdminError::Unavailable(e.to_string()))?,
            ),
            None => None,
        };
        let ids = target_ids(s, id).await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let res = match &leases {
                None => refresh_one(s, &oauth, id, None).await,
                Some(l) => {
                    let stored_fence = match s.get_account(id).await? {
                        Some((row, _)) => row.refresh_fence,
                        None => 0,
                    };
                    match l.try_acquire(id, stored_fence).await {
                        Ok(Some(fence)) => {
                            let r = refresh_one(s, &oauth, id, Some(fence)).await;
                            let _ = l.release(id, fence).await;
                            r
                        }
                        Ok(None) => Err("another instance is refreshing this account now".into()),
                        Err(e) => Err(format!("cannot take the refresh lease: {e}")),
                    }
                }
            };
            out.push((id, res));
        }
        Ok(out)
    }))
}

/// `Some(id)` (which must exist) or every `active` account.
async fn target_ids(s: &dyn Storage, id: Option<i64>) -> Result<Vec<i64>, AdminError> {
    let rows = s.list_accounts().await?;
    match id {
        Some(id) if rows.iter().any(|r| r.id == id) => Ok(vec![id]),
        Some(id) => Err(AdminError::NotFound(format!("no account with id {id}"))),
        None => Ok(rows
            .iter()
            .filter(|r| r.status == AccountStatus::Active)
            .map(|r| r.id)
            .collect()),
    }
}

async fn refresh_one(
    s: &dyn Storage,
    oauth: &OAuthClient,
    id: i64,
    fence: Option<i64>,
) -> Result<(), String> {
    let Some((_, secrets)) = s.get_account(id).await.map_err(|e| e.to_string())? else {
        return Err("the account was deleted".into());
    };
    if secrets.refresh_token.is_empty() {
        return Err(
            "no refresh token stored (access-token-only import): log in again and re-import".into(),
        );
    }
    match exchange_and_store(s, oauth, id, &secrets.refresh_token, fence).await {
        Ok(Stored::Yes) => Ok(()),
        Ok(Stored::Deleted) => Err("the account was deleted".into()),
        Ok(Stored::Lost) => Err(
            "refreshed, but the new tokens could not be stored; the account needs a new login"
                .into(),
        ),
        Err(e @ RefreshError::Terminal { .. }) => {
            let status = e.terminal_status().unwrap_or(AccountStatus::ReauthRequired);
            let _ = s.set_status(id, status).await;
            Err(format!("{e}; account marked {}", status.as_str()))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Polls `/wham/usage` now for one account (`Some(id)`) or every `active` account (`None`)
/// and persists the answers (quota columns, plan, a cooldown when the limit is reached).
/// A running gateway applies them on its next reload. A 401 is reported (run
/// [`accounts_refresh`]), not acted on.
pub fn accounts_quota(
    db: &DbTarget,
    id: Option<i64>,
    endpoint: &UsageEndpoint,
) -> Result<PerAccount<WhamUsage>, AdminError> {
    let http = build_http_client(endpoint.ca_file.as_deref()).map_err(AdminError::HttpClient)?;
    let client = UsageClient::new(http, endpoint.clone());
    block_on(with_storage(db, async |s: &dyn Storage| {
        let ids = target_ids(s, id).await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let Some((row, secrets)) = s.get_account(id).await? else {
                continue;
            };
            if secrets.access_token.is_empty() {
                out.push((id, Err("no usable access token stored".into())));
                continue;
            }
            let res = match client
                .fetch(&secrets.access_token, &row.chatgpt_account_id)
                .await
            {
                Ok(u) => {
                    let current = u64::try_from(row.cooldown_until_ms).unwrap_or(0);
                    crate::quota::store_usage(s, id, &u, current).await?;
                    Ok(u)
                }
                Err(e) => Err(e.to_string()),
            };
            out.push((id, res));
        }
        Ok(out)
    }))
}

/// The stored setting overrides as `(key, value)`, ordered by key. Keys without a row take
/// the running gateway's configured value ([`crate::settings::KEYS`] lists every key).
pub fn settings_get(db: &DbTarget) -> Result<Vec<(String, String)>, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(s.load_settings().await?)
    }))
}

/// Validates and stores one setting override (see [`crate::settings`]).
pub fn settings_set(db: &DbTarget, key: &str, value: &str) -> Result<(), AdminError> {
    let key = key.trim();
    let value = value.trim();
    crate::settings::apply(&mut shared_state::Settings::default(), key, value)
        .map_err(|e| AdminError::Invalid(e.to_string()))?;
    block_on(with_storage(db, async |s: &dyn Storage| {
        let before = s.load_settings().await?;
        s.write_settings(&[(key.to_owned(), Some(value.to_owned()))])
            .await?;
        let old = before
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone());
        audit_change(
            s,
            "settings.update",
            "settings",
            None,
            &serde_json::json!({ key: old }),
            &serde_json::json!({ key: value }),
        )
        .await;
        Ok(())
    }))
}

/// Removes a setting override (back to the configured value); `false` when none was stored.
pub fn settings_unset(db: &DbTarget, key: &str) -> Result<bool, AdminError> {
    let key = key.trim();
    crate::settings::get(&shared_state::Settings::default(), key)
        .map_err(|e| AdminError::Invalid(e.to_string()))?;
    block_on(with_storage(db, async |s: &dyn Storage| {
        let old = s
            .load_settings()
            .await?
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v);
        s.write_settings(&[(key.to_owned(), None)]).await?;
        if old.is_some() {
            audit_change(
                s,
                "settings.update",
                "settings",
                None,
                &serde_json::json!({ key: old }),
                &serde_json::json!({ key: null }),
            )
            .await;
        }
        Ok(old.is_some())
    }))
}

/// Sets a new random admin password (stored as an Argon2id hash), ends every admin session,
/// and returns the password to print once (`codex-gateway admin reset-password`).
pub fn admin_reset_password(db: &DbTarget) -> Result<shared_state::Secret, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        let pw = crate::auth::reset_password(s).await.map_err(|e| match e {
            crate::auth::AuthError::Storage(e) => AdminError::Storage(e),
            other => AdminError::Invalid(other.to_string()),
        })?;
        audit(
            s,
            "admin.reset_password",
            "session",
            None,
            serde_json::Value::Null,
        )
        .await;
        Ok(pw)
    }))
}

/// Creates an admin API token (`codex-gateway admin token create`): `scope` `admin` or
/// `read` (GET only), optional expiry (Unix ms, in the future). Returns the plain token
/// (shown once; only its hash is stored) and its row. This is also the way back in when
/// logins are rate-limited: a token is not subject to the login limits.
pub fn admin_tokens_create(
    db: &DbTarget,
    name: &str,
    scope: &str,
    expires_at: Option<i64>,
) -> Result<(shared_state::Secret, AdminTokenRow), AdminError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(AdminError::Invalid(
            "an admin token needs a non-empty name".into(),
        ));
    }
    let scope = crate::auth::TokenScope::parse(scope)
        .ok_or_else(|| AdminError::Invalid(format!("scope {scope:?}: use admin or read")))?;
    if expires_at.is_some_and(|at| at <= crate::storage::now_ms_i64()) {
        return Err(AdminError::Invalid(
            "the expiry must be in the future".into(),
        ));
    }
    block_on(with_storage(db, async |s: &dyn Storage| {
        let (plain, row) = crate::auth::create_admin_token(s, name, scope, expires_at).await?;
        let details =
            serde_json::json!({"name": name, "scope": scope.as_str(), "expires_at": expires_at});
        audit(
            s,
            "tokens.create",
            "admin_token",
            Some(row.id.to_string()),
            details,
        )
        .await;
        Ok((plain, row))
    }))
}

/// The audit log (`codex-gateway admin audit`): entries matching `filter`, newest first, at
/// most `limit` (secrets were redacted before they were stored).
pub fn audit_list(
    db: &DbTarget,
    filter: &crate::storage::audit::AuditFilter,
    limit: u32,
) -> Result<Vec<crate::storage::audit::AuditRow>, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(s.audit().list_audit(filter, limit).await?)
    }))
}

/// Lists admin API tokens (prefixes, scopes and expiries; never the tokens).
pub fn admin_tokens_list(db: &DbTarget) -> Result<Vec<AdminTokenRow>, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(s.list_admin_tokens().await?)
    }))
}

/// Revokes the admin API token with this id.
pub fn admin_tokens_revoke(db: &DbTarget, id: i64) -> Result<(), AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        if s.revoke_admin_token(id).await? {
            audit(
                s,
                "tokens.delete",
                "admin_token",
                Some(id.to_string()),
                serde_json::Value::Null,
            )
            .await;
            Ok(())
        } else {
            Err(AdminError::NotFound(format!(
                "no active admin token with id {id}"
            )))
        }
    }))
}

/// Creates a client key and returns its plain text (shown once; only the hash is stored).
pub fn keys_create(db: &DbTarget, name: &str) -> Result<String, AdminError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(AdminError::Invalid("a key needs a non-empty name".into()));
    }
    block_on(with_storage(db, async |s: &dyn Storage| {
        let (plain, row) = create_key(s, name).await?;
        audit(
            s,
            "keys.create",
            "key",
            Some(row.id.to_string()),
            serde_json::json!({"name": name}),
        )
        .await;
        Ok(plain)
    }))
}

/// Creates a key with limits (`limits`: the JSON object of `PATCH /api/admin/keys/{id}`).
pub fn keys_create_with(
    db: &DbTarget,
    name: &str,
    limits: &serde_json::Value,
) -> Result<String, AdminError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(AdminError::Invalid("a key needs a non-empty name".into()));
    }
    let mut l = shared_state::keys::KeyLimits::unlimited();
    parse_limits(limits)?
        .apply(&mut l)
        .map_err(|e| AdminError::Invalid(e.message().to_owned()))?;
    block_on(with_storage(db, async |s: &dyn Storage| {
        let (plain, row) = create_key(s, name).await?;
        s.update_key_limits(row.id, &l).await?;
        audit(
            s,
            "keys.create",
            "key",
            Some(row.id.to_string()),
            serde_json::json!({"name": name, "limits": limits}),
        )
        .await;
        Ok(plain)
    }))
}

/// Changes the limits of key `id` (`limits`: the JSON object of `PATCH
/// /api/admin/keys/{id}`; present fields replace, `null` removes). Running gateways pick the
/// change up at their next reload.
pub fn keys_set(db: &DbTarget, id: i64, limits: &serde_json::Value) -> Result<KeyRow, AdminError> {
    let patch = parse_limits(limits)?;
    block_on(with_storage(db, async |s: &dyn Storage| {
        let Some(mut row) = s
            .list_keys()
            .await?
            .into_iter()
            .find(|k| k.id == id && k.revoked_at.is_none())
        else {
            return Err(AdminError::NotFound(format!("no active key with id {id}")));
        };
        let before = crate::keys::LimitsView::of(&row.limits);
        patch
            .apply(&mut row.limits)
            .map_err(|e| AdminError::Invalid(e.message().to_owned()))?;
        s.update_key_limits(id, &row.limits).await?;
        let after = crate::keys::LimitsView::of(&row.limits);
        let json = |v| serde_json::to_value(v).unwrap_or_default();
        audit_change(
            s,
            "keys.update",
            "key",
            Some(id.to_string()),
            &json(before),
            &json(after),
        )
        .await;
        Ok(row)
    }))
}

fn parse_limits(v: &serde_json::Value) -> Result<crate::api::keys::LimitsPatch, AdminError> {
    serde_json::from_value(v.clone()).map_err(|e| AdminError::Invalid(format!("limits: {e}")))
}

/// Lists client keys (prefixes only).
pub fn keys_list(db: &DbTarget) -> Result<Vec<KeyRow>, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(s.list_keys().await?)
    }))
}

/// Revokes the key with this id, or else every active key with this name. Returns how many
/// were revoked; [`AdminError::NotFound`] when none matched.
pub fn keys_revoke(db: &DbTarget, id_or_name: &str) -> Result<usize, AdminError> {
    let target = id_or_name.trim();
    block_on(with_storage(db, async |s: &dyn Storage| {
        if let Ok(id) = target.parse::<i64>() {
            if s.revoke_key(id).await? {
                audit(
                    s,
                    "keys.delete",
                    "key",
                    Some(id.to_string()),
                    serde_json::Value::Null,
                )
                .await;
                return Ok(1);
            }
        }
        let n = s.revoke_keys_by_name(target).await?;
        if n > 0 {
            audit(
                s,
                "keys.delete",
                "key",
                None,
                serde_json::json!({"name": target, "revoked": n}),
            )
            .await;
        }
        if n == 0 {
            return Err(AdminError::NotFound(format!(
                "no active key with id or name {target:?}"
            )));
        }
        Ok(n)
    }))
}
