//! Blocking helpers behind the `codex-gateway accounts|keys ...` subcommands.
//!
//! # Key Components
//! - [`accounts_import`], [`accounts_list`], [`keys_create`], [`keys_list`], [`keys_revoke`]:
//!   each builds a small current-thread Tokio runtime, opens (and migrates) the store the
//!   [`DbTarget`] names, does one thing and closes it. They are safe to run while a gateway is
//!   serving from the same database: the running sidecar picks the change up on its next
//!   reload (`reload_interval`).
//! - [`create_key`]: the async core of key creation, shared with the admin API.
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

use shared_state::keys::hash_key_hex;

use crate::{
    crypto::{generate_client_key, key_display_prefix},
    error::{AdminError, StorageError},
    import::ImportSummary,
    oauth::{build_http_client, OAuthClient},
    storage::{AccountRow, KeyRow, Storage},
    DbTarget,
};

fn block_on<T>(f: impl Future<Output = Result<T, AdminError>>) -> Result<T, AdminError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AdminError::Runtime)?;
    rt.block_on(f)
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
        Ok(crate::import::import_paths(s, &oauth, paths).await)
    }))
}

/// Lists accounts (no tokens).
pub fn accounts_list(db: &DbTarget) -> Result<Vec<AccountRow>, AdminError> {
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(s.list_accounts().await?)
    }))
}

/// Creates a client key and returns its plain text (shown once; only the hash is stored).
pub fn keys_create(db: &DbTarget, name: &str) -> Result<String, AdminError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(AdminError::Invalid("a key needs a non-empty name".into()));
    }
    block_on(with_storage(db, async |s: &dyn Storage| {
        Ok(create_key(s, name).await?.0)
    }))
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
                return Ok(1);
            }
        }
        let n = s.revoke_keys_by_name(target).await?;
        if n == 0 {
            return Err(AdminError::NotFound(format!(
                "no active key with id or name {target:?}"
            )));
        }
        Ok(n)
    }))
}

/// Generates, stores (by hash) and returns a new client key with its row.
pub async fn create_key(
    storage: &dyn Storage,
    name: &str,
) -> Result<(String, KeyRow), StorageError> {
    let plain = generate_client_key();
    let row = storage
        .create_key(name, &hash_key_hex(&plain), &key_display_prefix(&plain))
        .await?;
    Ok((plain, row))
}
