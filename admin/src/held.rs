//! The held-token journal: rotated tokens that storage has not taken yet survive a restart.
//!
//! # Key Components
//! - [`HeldJournal`]: `data_dir/held-tokens.json`, rewritten (temporary file, `fsync`,
//!   rename; mode 0600) whenever the publisher's held tokens change
//!   ([`crate::publish::Publisher::hold_tokens`] and friends), removed when none are held. Each
//!   token is sealed with the storage key, bound to the journal, the account's row id and its
//!   ChatGPT account id.
//! - [`HeldJournal::load`]: what an earlier process held; the sidecar stores it at start
//!   (before the first snapshot), so the refresh token a refresh rotated while storage was
//!   down is not lost to a shutdown or a crash before storage came back.
//!
//! # Error handling
//! A journal that cannot be written is logged (the tokens stay held in memory and their
//! writer keeps trying storage); an entry that does not open or names another account at
//! start is logged and skipped.

use std::{
    collections::HashMap,
    io::{self, Write},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use shared_state::Secret;

use crate::{
    crypto::{Binding, Cipher},
    error::StorageError,
    storage::TokenUpdate,
};

/// The journal's file name in the data directory.
pub const FILE: &str = "held-tokens.json";

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    id: i64,
    chatgpt_account_id: String,
    access_token: String,
    refresh_token: Option<String>,
    id_token: Option<String>,
    access_expires_at: Option<i64>,
    email: Option<String>,
    plan_type: Option<String>,
    /// The refresh lease's fencing token the rotation was made under (the replayed write is
    /// fenced like the original one).
    #[serde(default)]
    fence: Option<i64>,
}

/// One held rotation read back from the journal.
#[derive(Debug)]
pub struct HeldEntry {
    /// The account's row id.
    pub id: i64,
    /// Its ChatGPT account id when the tokens were held (checked against the row).
    pub chatgpt_account_id: String,
    /// The tokens.
    pub tokens: TokenUpdate,
}

/// The journal (see the module docs).
#[derive(Debug)]
pub struct HeldJournal {
    path: PathBuf,
    cipher: Cipher,
}

// === impl HeldJournal ===

impl HeldJournal {
    /// The journal of `data_dir`, sealed with the storage key (call after `storage::open`,
    /// which creates the key when there was none).
    pub fn open(data_dir: &Path) -> Result<Self, StorageError> {
        let (key, _) = crate::crypto::load_key(data_dir)?;
        Ok(Self {
            path: data_dir.join(FILE),
            cipher: Cipher::new(&key),
        })
    }

    fn binding<'a>(column: &'static str, id: &'a str, acct: &'a str) -> Binding<'a> {
        Binding {
            table: "held_tokens",
            column,
            row: [id, acct],
        }
    }

    /// Rewrites the journal with `held` (`account` gives each id's ChatGPT account id);
    /// removes it when `held` is empty.
    pub fn save(
        &self,
        held: &HashMap<i64, TokenUpdate>,
        account: impl Fn(i64) -> Option<String>,
    ) -> io::Result<()> {
        if held.is_empty() {
            return match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let seal_err = |e: StorageError| io::Error::other(e.to_string());
        let mut entries = Vec::with_capacity(held.len());
        for (&id, t) in held {
            let acct = account(id).unwrap_or_default();
            let ids = id.to_string();
            let seal = |col, s: &Secret| {
                self.cipher
                    .seal(s, &Self::binding(col, &ids, &acct))
                    .map_err(seal_err)
            };
            entries.push(Entry {
                id,
                access_token: seal("access_token", &t.access_token)?,
                refresh_token: t
                    .refresh_token
                    .as_ref()
                    .map(|s| seal("refresh_token", s))
                    .transpose()?,
                id_token: t
                    .id_token
                    .as_ref()
                    .map(|s| seal("id_token", s))
                    .transpose()?,
                access_expires_at: t.access_expires_at,
                email: t.email.clone(),
                plan_type: t.plan_type.clone(),
                fence: t.fence,
                chatgpt_account_id: acct,
            });
        }
        let body = serde_json::to_vec(&entries).map_err(io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        {
            let mut opts = std::fs::OpenOptions::new();
            opts.create(true).write(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }

    /// What the journal holds (empty when there is none); entries that do not open are
    /// logged and skipped.
    pub fn load(&self) -> Vec<HeldEntry> {
        let raw = match std::fs::read(&self.path) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::error!(file = %self.path.display(), error = %e, "cannot read the held-token journal");
                return Vec::new();
            }
        };
        let entries: Vec<Entry> = match serde_json::from_slice(&raw) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(file = %self.path.display(), error = %e, "the held-token journal does not parse");
                return Vec::new();
            }
        };
        entries
            .into_iter()
            .filter_map(|e| {
                let ids = e.id.to_string();
                let open = |col, s: &str| {
                    self.cipher
                        .open(s, &Self::binding(col, &ids, &e.chatgpt_account_id))
                };
                let tokens = (|| {
                    Ok::<_, StorageError>(TokenUpdate {
                        access_token: open("access_token", &e.access_token)?,
                        refresh_token: e
                            .refresh_token
                            .as_deref()
                            .map(|s| open("refresh_token", s))
                            .transpose()?,
                        id_token: e
                            .id_token
                            .as_deref()
                            .map(|s| open("id_token", s))
                            .transpose()?,
                        access_expires_at: e.access_expires_at,
                        email: e.email.clone(),
                        plan_type: e.plan_type.clone(),
                        fence: e.fence,
                    })
                })();
                match tokens {
                    Ok(tokens) => Some(HeldEntry {
                        id: e.id,
                        chatgpt_account_id: e.chatgpt_account_id.clone(),
                        tokens,
                    }),
                    Err(err) => {
                        tracing::error!(account = e.id, error = %err, "a held-token journal entry does not open; skipped");
                        None
                    }
                }
            })
            .collect()
    }
}

/// At start, before the first snapshot: stores what an earlier process held. An entry is
/// applied only to the account it was sealed for and only when it is not older than the
/// stored tokens (by access-token expiry); what cannot be stored now is handed to `hold` (the
/// publisher's `hold_tokens`; a callback, so this module does not name the publisher, which
/// names it) and returned: the ids that need a writer.
pub(crate) async fn replay(
    journal: &HeldJournal,
    storage: &dyn crate::storage::Storage,
    hold: &dyn Fn(i64, TokenUpdate),
) -> Vec<i64> {
    let mut still_held = Vec::new();
    for e in journal.load() {
        let (row, secrets) = match storage.get_account(e.id).await {
            Ok(Some(v)) => v,
            Ok(None) => {
                tracing::warn!(account = e.id, "held tokens of a deleted account dropped");
                continue;
            }
            Err(err) => {
                tracing::error!(account = e.id, error = %err, "cannot read the account of held tokens; holding them");
                hold(e.id, e.tokens);
                still_held.push(e.id);
                continue;
            }
        };
        if row.chatgpt_account_id != e.chatgpt_account_id {
            tracing::warn!(account = e.id, "held tokens name another account; dropped");
            continue;
        }
        let older = matches!(
            (e.tokens.access_expires_at, row.access_expires_at),
            (Some(held), Some(stored)) if held < stored
        );
        if older || secrets.access_token == e.tokens.access_token {
            continue;
        }
        match storage.update_tokens(e.id, &e.tokens).await {
            Ok(_) => tracing::info!(
                account = e.id,
                "stored the refreshed tokens an earlier process held (storage was down)"
            ),
            Err(err) => {
                tracing::error!(account = e.id, error = %err, "cannot store held tokens yet; holding them");
                hold(e.id, e.tokens);
                still_held.push(e.id);
            }
        }
    }
    still_held
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upd(at: &str, rt: Option<&str>) -> TokenUpdate {
        TokenUpdate {
            access_token: Secret::new(at),
            refresh_token: rt.map(Secret::new),
            id_token: None,
            access_expires_at: Some(42),
            email: None,
            plan_type: Some("plus".into()),
            fence: None,
        }
    }

    #[test]
    fn round_trips_sealed_and_is_removed_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let j = HeldJournal::open(dir.path()).unwrap();
        assert!(j.load().is_empty());
        let mut held = HashMap::new();
        held.insert(7, upd("at-secret", Some("rt-secret")));
        j.save(&held, |id| (id == 7).then(|| "acct-7".to_owned()))
            .unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(!text.contains("rt-secret") && !text.contains("at-secret"));
        let back = j.load();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].id, 7);
        assert_eq!(back[0].chatgpt_account_id, "acct-7");
        assert_eq!(back[0].tokens.access_token.expose(), "at-secret");
        assert_eq!(
            back[0].tokens.refresh_token.as_ref().unwrap().expose(),
            "rt-secret"
        );
        assert_eq!(back[0].tokens.access_expires_at, Some(42));
        // An entry moved to another account does not open.
        let moved = text.replace("\"id\":7", "\"id\":8");
        std::fs::write(dir.path().join(FILE), moved).unwrap();
        assert!(j.load().is_empty());
        j.save(&HashMap::new(), |_| None).unwrap();
        assert!(!dir.path().join(FILE).exists());
    }
}
