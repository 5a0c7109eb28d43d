//! The watched auth directory (issue 27, config `auth_dir`): a team that manages Codex logins
//! as files keeps doing so.
//!
//! # Key Components
//! - [`run`]: polls the directory every [`POLL`] (by modification time and size; no inotify):
//!   `*.json` files in it and `*/auth.json` one level down (hidden files are ignored: the
//!   write-back's temporary files are). A new or changed file is imported
//!   ([`crate::import::import_text`]) unless storage holds newer tokens for its account (the
//!   gateway refreshed them since: a stale file never replaces a rotated refresh token); an
//!   account whose file disappears is disabled, and enabled again when its file comes back.
//! - Write-back (runtime setting `auth_dir_write_back`, default off): when storage holds
//!   newer tokens than an account's file (a refresh), the file is rewritten with them, keeping
//!   its shape (official `auth.json` or the flat CPA file) and its other members: written to a
//!   hidden temporary file (mode 0600) in the same directory, synced, then renamed over it.
//!
//! Every import, disable, enable and write-back is in the audit log (actor `auth-dir`).
//! What the watcher knows lives in memory: a file removed while the gateway was down is not
//! noticed.
//!
//! # Error handling
//! An unreadable directory or file is logged (once per change) and retried next round; an
//! import's skipped entries are logged with their reasons (never tokens).

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde_json::{json, Value};
use shared_state::{AccountEffect, AccountStatus};
use tokio::sync::watch;

use crate::{oauth::OAuthClient, services::Store, storage::AccountRow};

/// How often the directory is read.
pub const POLL: Duration = Duration::from_secs(5);
/// Largest file read.
const MAX_FILE: u64 = 1 << 20;

/// One watched file.
#[derive(Debug, Clone)]
struct Tracked {
    mtime: Option<SystemTime>,
    size: u64,
    /// The accounts it holds (after its last import or match).
    ids: Vec<i64>,
}

/// The watcher's memory.
#[derive(Debug, Default)]
pub(crate) struct Watcher {
    files: HashMap<PathBuf, Tracked>,
    /// Accounts this watcher disabled because their file went away.
    disabled: HashSet<i64>,
}

/// The credential files of `dir`, sorted.
fn list(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let hidden = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'))
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if hidden(&p) {
            continue;
        }
        if p.is_dir() {
            let a = p.join("auth.json");
            if a.is_file() {
                out.push(a);
            }
        } else if p.extension().and_then(|x| x.to_str()) == Some("json") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn stat(p: &Path) -> Option<(Option<SystemTime>, u64)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok(), m.len()))
}

fn read(p: &Path) -> Option<String> {
    if stat(p)?.1 > MAX_FILE {
        return None;
    }
    std::fs::read_to_string(p).ok()
}

fn audit(action: &str, id: Option<i64>, details: Value) -> crate::storage::audit::AuditWrite {
    crate::audit::internal(
        crate::audit::ACTOR_AUTH_DIR,
        action,
        "account",
        id.map(|i| i.to_string()),
        details,
    )
}

async fn set_status(store: &Store, id: i64, status: AccountStatus) -> bool {
    match store.storage.set_status(id, status).await {
        Ok(true) => {
            if let Some(live) = store.publisher.live(id).await {
                let cooldown_until_ms = if status == AccountStatus::Active {
                    0
                } else {
                    live.cooldown_until_ms()
                };
                live.apply(&AccountEffect::OperatorStatus {
                    status,
                    cooldown_until_ms,
                });
            }
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(account = id, error = %e, "auth dir: cannot set the status");
            false
        }
    }
}

/// The file's text with `stored` tokens in place (its shape and other members kept).
fn rewritten(
    text: &str,
    s: &crate::storage::AccountSecrets,
    last_refresh_ms: i64,
) -> Option<String> {
    let mut v: Value = serde_json::from_str(text.trim_start_matches('\u{feff}')).ok()?;
    let when =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(last_refresh_ms) * 1_000_000)
            .ok()?
            .format(&time::format_description::well_known::Rfc3339)
            .ok()?;
    let obj = v.as_object_mut()?;
    let target = if obj.get("tokens").is_some_and(Value::is_object) {
        obj.get_mut("tokens")?.as_object_mut()?
    } else {
        obj
    };
    target.insert("access_token".into(), json!(s.access_token.expose()));
    if !s.refresh_token.is_empty() {
        target.insert("refresh_token".into(), json!(s.refresh_token.expose()));
    }
    if !s.id_token.is_empty() {
        target.insert("id_token".into(), json!(s.id_token.expose()));
    }
    v.as_object_mut()?
        .insert("last_refresh".into(), json!(when));
    serde_json::to_string_pretty(&v).ok()
}

/// Writes `text` to `path` atomically: a hidden temporary file (0600) beside it, synced,
/// renamed over it.
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("auth.json");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let res = (|| {
        let mut f = opts.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

// === impl Watcher ===

impl Watcher {
    /// One pass over `dir` (see the module docs).
    pub(crate) async fn scan(&mut self, store: &Store, oauth: &OAuthClient, dir: &Path) {
        let files = match list(dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "auth dir unreadable");
                return;
            }
        };
        let accounts = match store.storage.list_accounts().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "auth dir: storage unavailable; next round");
                return;
            }
        };
        // One workspace (account id) has many users: match the user too when the file says.
        let stored_of = |id: &crate::import::FileIdentity| -> Option<&AccountRow> {
            let cid = id.account_id.as_deref()?;
            accounts.iter().find(|a| {
                a.chatgpt_account_id == cid && id.user_id.as_deref().is_none_or(|u| a.user_id == u)
            })
        };
        let write_back = match store.storage.load_settings().await {
            Ok(s) => crate::settings::sidecar(&s).auth_dir_write_back,
            Err(_) => false,
        };
        let mut changed = false;
        let present: HashSet<PathBuf> = files.iter().cloned().collect();

        // Files gone: their accounts are disabled (unless another file still holds them).
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains(*p))
            .cloned()
            .collect();
        for p in gone {
            let Some(t) = self.files.remove(&p) else {
                continue;
            };
            for id in t.ids {
                if self.files.values().any(|o| o.ids.contains(&id)) {
                    continue;
                }
                let active = accounts
                    .iter()
                    .find(|a| a.id == id)
                    .is_some_and(|a| a.status != AccountStatus::Disabled);
                if active && set_status(store, id, AccountStatus::Disabled).await {
                    self.disabled.insert(id);
                    changed = true;
                    tracing::info!(account = id, file = %p.display(), "auth dir: file removed; account disabled");
                    let e = audit(
                        "accounts.disable",
                        Some(id),
                        json!({"file": p.display().to_string(), "reason": "file removed"}),
                    );
                    crate::audit::record(store.storage.as_ref(), &e).await;
                }
            }
        }

        for p in files {
            let Some((mtime, size)) = stat(&p) else {
                continue;
            };
            let seen = self
                .files
                .get(&p)
                .is_some_and(|t| t.mtime == mtime && t.size == size);
            let Some(text) = read(&p) else {
                continue;
            };
            let identity = crate::import::file_identity(&text);
            let stored = identity.as_ref().and_then(stored_of);
            let file_refresh = identity
                .as_ref()
                .and_then(|i| i.last_refresh_ms)
                .unwrap_or(0);
            let stored_newer =
                stored.is_some_and(|a| a.last_refresh_at.unwrap_or(0) > file_refresh);
            if !seen {
                let ids = if stored_newer {
                    // The gateway refreshed since the file was written: keep storage.
                    stored.map(|a| vec![a.id]).unwrap_or_default()
                } else {
                    let mut sum = crate::import::ImportSummary::default();
                    let src = p.display().to_string();
                    crate::import::import_text(
                        store.storage.as_ref(),
                        oauth,
                        &src,
                        &text,
                        &mut sum,
                    )
                    .await;
                    for (s, why) in &sum.skipped {
                        tracing::warn!(file = %s, reason = %why, "auth dir: not imported");
                    }
                    if !sum.ids.is_empty() {
                        changed = true;
                        let e = audit(
                            "accounts.import",
                            sum.ids.first().copied(),
                            json!({"file": src, "added": sum.added, "updated": sum.updated}),
                        );
                        crate::audit::record(store.storage.as_ref(), &e).await;
                    }
                    sum.ids
                };
                for id in &ids {
                    if self.disabled.remove(id)
                        && set_status(store, *id, AccountStatus::Active).await
                    {
                        changed = true;
                        let e = audit(
                            "accounts.enable",
                            Some(*id),
                            json!({"file": p.display().to_string(), "reason": "file back"}),
                        );
                        crate::audit::record(store.storage.as_ref(), &e).await;
                    }
                }
                self.files.insert(p.clone(), Tracked { mtime, size, ids });
            }
            // Write-back: storage holds newer tokens than the file.
            if write_back && stored_newer {
                if let Some(a) = stored {
                    self.write_back(store, &p, &text, a).await;
                }
            }
        }
        if changed {
            store.republish().await;
        }
    }

    async fn write_back(&mut self, store: &Store, p: &Path, text: &str, a: &AccountRow) {
        let Ok(Some((_, secrets))) = store.storage.get_account(a.id).await else {
            return;
        };
        if secrets.decrypt_failed || secrets.access_token.is_empty() {
            return;
        }
        let Some(new) = rewritten(text, &secrets, a.last_refresh_at.unwrap_or(0)) else {
            return;
        };
        match write_atomic(p, &new) {
            Ok(()) => {
                if let Some((mtime, size)) = stat(p) {
                    self.files.insert(
                        p.to_path_buf(),
                        Tracked {
                            mtime,
                            size,
                            ids: vec![a.id],
                        },
                    );
                }
                tracing::info!(account = a.id, file = %p.display(), "auth dir: refreshed tokens written back");
                let e = audit(
                    "accounts.write_back",
                    Some(a.id),
                    json!({"file": p.display().to_string()}),
                );
                crate::audit::record(store.storage.as_ref(), &e).await;
            }
            Err(e) => {
                tracing::warn!(file = %p.display(), error = %e, "auth dir: cannot write back");
            }
        }
    }
}

/// Polls `dir` until `stop` (see the module docs).
pub(crate) async fn run(
    store: Store,
    oauth: OAuthClient,
    dir: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    tracing::info!(dir = %dir.display(), "watching the auth directory");
    let mut w = Watcher::default();
    loop {
        w.scan(&store, &oauth, &dir).await;
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_keeps_the_shape() {
        let s = crate::storage::AccountSecrets {
            access_token: "new-at".into(),
            refresh_token: "new-rt".into(),
            id_token: "".into(),
            decrypt_failed: false,
        };
        let official = r#"{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{"id_token":"old-id","access_token":"old-at","refresh_token":"old-rt","account_id":"a"},"last_refresh":"2026-01-01T00:00:00Z"}"#;
        let v: Value =
            serde_json::from_str(&rewritten(official, &s, 1_800_000_000_000).unwrap()).unwrap();
        assert_eq!(v["tokens"]["access_token"], "new-at");
        assert_eq!(v["tokens"]["refresh_token"], "new-rt");
        assert_eq!(v["tokens"]["id_token"], "old-id");
        assert_eq!(v["tokens"]["account_id"], "a");
        assert_eq!(v["auth_mode"], "chatgpt");
        assert_eq!(v["last_refresh"], "2027-01-15T08:00:00Z");
        let flat =
            r#"{"type":"codex","access_token":"old-at","refresh_token":"old-rt","email":"x@y"}"#;
        let v: Value = serde_json::from_str(&rewritten(flat, &s, 0).unwrap()).unwrap();
        assert_eq!(v["access_token"], "new-at");
        assert_eq!(v["email"], "x@y");
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("auth.json");
        std::fs::write(&p, "old").unwrap();
        write_atomic(&p, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        std::fs::create_dir(d.path().join("alice")).unwrap();
        std::fs::write(d.path().join("alice/auth.json"), "{}").unwrap();
        std::fs::write(d.path().join(".hidden.json"), "{}").unwrap();
        std::fs::write(d.path().join("notes.txt"), "x").unwrap();
        let l = list(d.path()).unwrap();
        assert_eq!(
            l,
            vec![d.path().join("alice/auth.json"), d.path().join("auth.json")]
        );
    }
}
