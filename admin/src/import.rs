//! Importing Codex credentials into storage (docs/protocol.md#credential-files).
//!
//! # Key Components
//! - [`import_paths`]: walks files and directories (recursively: `*.json`, `*.txt`) and
//!   upserts every credential it recognizes, returning an [`ImportSummary`].
//! - Formats: the official `auth.json` (`{"auth_mode","tokens":{id_token,access_token,
//!   refresh_token,account_id},"last_refresh"}`), the flat CPA file (`{"type":"codex",
//!   "id_token","access_token","refresh_token","account_id","email","last_refresh","expired"}`),
//!   a JSON array of either, and text files with one credential per line: a refresh token
//!   (exchanged at the token endpoint to learn the identity; the **rotated** refresh token is
//!   stored), an access token JWT (imported without refresh ability) or a JSON object.
//!
//! # Error handling
//! Nothing aborts the import: every unreadable file, unknown shape, missing identity or failed
//! exchange becomes one `skipped` entry with the reason. Reasons never contain tokens.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde_json::Value;
use shared_state::{jwt::decode_claims, Secret};

use crate::{
    oauth::{Identity, OAuthClient},
    storage::{AccountUpsert, Storage},
};

/// Largest credential file read (bigger files are skipped).
const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportSummary {
    /// Labels of newly added accounts.
    pub added: Vec<String>,
    /// Labels of accounts merged into an existing row.
    pub updated: Vec<String>,
    /// `(source, reason)` of everything not imported.
    pub skipped: Vec<(String, String)>,
    /// Storage ids of the accounts added or updated, in file order.
    pub ids: Vec<i64>,
}

// === impl ImportSummary ===

impl fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} added, {} updated, {} skipped",
            self.added.len(),
            self.updated.len(),
            self.skipped.len()
        )?;
        for a in &self.added {
            writeln!(f, "  added    {a}")?;
        }
        for u in &self.updated {
            writeln!(f, "  updated  {u}")?;
        }
        for (src, why) in &self.skipped {
            writeln!(f, "  skipped  {src}: {why}")?;
        }
        Ok(())
    }
}

/// One credential as read from a file, before identity resolution.
#[derive(Default)]
struct RawCredential {
    id_token: String,
    access_token: String,
    refresh_token: String,
    account_id: Option<String>,
    email: Option<String>,
    last_refresh_ms: Option<i64>,
    expires_at: Option<i64>,
}

/// Imports every credential under `paths`.
pub async fn import_paths(
    storage: &dyn Storage,
    oauth: &OAuthClient,
    paths: &[PathBuf],
) -> ImportSummary {
    let mut sum = ImportSummary::default();
    for p in paths {
        let mut files = Vec::new();
        collect_files(p, true, &mut files, &mut sum);
        for f in files {
            import_file(storage, oauth, &f, &mut sum).await;
        }
    }
    sum
}

fn collect_files(p: &Path, explicit: bool, out: &mut Vec<PathBuf>, sum: &mut ImportSummary) {
    let meta = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(e) => {
            sum.skipped
                .push((p.display().to_string(), format!("cannot read: {e}")));
            return;
        }
    };
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = match std::fs::read_dir(p) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(e) => {
                sum.skipped
                    .push((p.display().to_string(), format!("cannot list: {e}")));
                return;
            }
        };
        entries.sort();
        for e in entries {
            collect_files(&e, false, out, sum);
        }
    } else if explicit || has_credential_ext(p) {
        out.push(p.to_path_buf());
    }
}

fn has_credential_ext(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .map(|e| e.eq_ignore_ascii_case("json") || e.eq_ignore_ascii_case("txt"))
        .unwrap_or(false)
}

async fn import_file(
    storage: &dyn Storage,
    oauth: &OAuthClient,
    path: &Path,
    sum: &mut ImportSummary,
) {
    let src = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            sum.skipped
                .push((src, format!("larger than {MAX_FILE_BYTES} bytes")));
            return;
        }
        Err(e) => {
            sum.skipped.push((src, format!("cannot read: {e}")));
            return;
        }
        Ok(_) => {}
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            sum.skipped.push((src, format!("cannot read: {e}")));
            return;
        }
    };
    import_text(storage, oauth, &src, &text, sum).await;
}

/// Imports every credential in `text` (the content of one file named `src`: JSON, a JSON
/// array, JSON lines, or one token per line), as [`import_paths`] does for a file.
pub async fn import_text(
    storage: &dyn Storage,
    oauth: &OAuthClient,
    src: &str,
    text: &str,
    sum: &mut ImportSummary,
) {
    for entry in parse_text(src, text) {
        match entry {
            Parsed::Credential(src, raw) => import_raw(storage, oauth, &src, raw, sum).await,
            Parsed::Skipped(src, why) => sum.skipped.push((src, why)),
        }
    }
}

/// Who a credential file is for, read without I/O (the watched auth directory compares it
/// with storage, `crate::auth_dir`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    /// ChatGPT account id (from the file, else from its tokens' claims).
    pub account_id: Option<String>,
    /// ChatGPT user id from the tokens' claims (one workspace has many users).
    pub user_id: Option<String>,
    /// The file's `last_refresh`, Unix ms.
    pub last_refresh_ms: Option<i64>,
}

/// The identity of the first credential of a file's `text`; `None` when it holds none.
pub(crate) fn file_identity(text: &str) -> Option<FileIdentity> {
    parse_text("", text).into_iter().find_map(|p| match p {
        Parsed::Credential(_, raw) => {
            let claims: Vec<_> = [&raw.id_token, &raw.access_token]
                .iter()
                .filter(|t| !t.is_empty())
                .filter_map(|t| decode_claims(t).ok())
                .collect();
            Some(FileIdentity {
                account_id: raw
                    .account_id
                    .clone()
                    .or_else(|| claims.iter().find_map(|c| c.account_id.clone())),
                user_id: claims.iter().find_map(|c| c.user_id.clone()),
                last_refresh_ms: raw.last_refresh_ms,
            })
        }
        Parsed::Skipped(..) => None,
    })
}

/// One entry of a credential file, in file order: a credential to import, or why a part of
/// the file was skipped (reasons never contain tokens).
enum Parsed {
    Credential(String, RawCredential),
    Skipped(String, String),
}

/// Reads every entry of one file's `text` (no I/O: what to import and what to skip).
fn parse_text(src: &str, text: &str) -> Vec<Parsed> {
    let mut out = Vec::new();
    let src = src.to_owned();
    let trimmed = text.trim_start_matches('\u{feff}').trim();
    if trimmed.is_empty() {
        out.push(Parsed::Skipped(src, "empty file".into()));
        return out;
    }
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        match serde_json::from_str::<Value>(trimmed) {
            Ok(Value::Array(items)) => {
                if items.is_empty() {
                    out.push(Parsed::Skipped(src.clone(), "empty JSON array".into()));
                }
                for (i, v) in items.iter().enumerate() {
                    parse_json(&format!("{src}[{i}]"), v, &mut out);
                }
            }
            Ok(v) => parse_json(&src, &v, &mut out),
            // Not one JSON document: maybe JSON lines.
            Err(_) if trimmed.starts_with('{') && trimmed.lines().count() > 1 => {
                parse_lines(&src, trimmed, &mut out);
            }
            Err(e) => out.push(Parsed::Skipped(src, format!("invalid JSON: {e}"))),
        }
    } else {
        parse_lines(&src, trimmed, &mut out);
    }
    out
}

fn parse_lines(src: &str, text: &str, out: &mut Vec<Parsed>) {
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let lsrc = format!("{src}:{}", n + 1);
        if line.starts_with('{') {
            match serde_json::from_str::<Value>(line) {
                Ok(v) => parse_json(&lsrc, &v, out),
                Err(e) => out.push(Parsed::Skipped(lsrc, format!("invalid JSON: {e}"))),
            }
            continue;
        }
        let token = line.trim_matches('"');
        let is_jwt = decode_claims(token)
            .map(|c| c.account_id.is_some())
            .unwrap_or(false);
        let raw = if is_jwt {
            RawCredential {
                access_token: token.to_owned(),
                ..Default::default()
            }
        } else {
            RawCredential {
                refresh_token: token.to_owned(),
                ..Default::default()
            }
        };
        out.push(Parsed::Credential(lsrc, raw));
    }
}

fn str_field(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .map(str::trim)
        .unwrap_or_default()
        .to_owned()
}

fn opt_field(v: &Value, k: &str) -> Option<String> {
    Some(str_field(v, k)).filter(|s| !s.is_empty())
}

fn parse_rfc3339_ms(s: Option<String>) -> Option<i64> {
    let s = s?;
    let t = time::OffsetDateTime::parse(&s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

fn parse_json(src: &str, v: &Value, out: &mut Vec<Parsed>) {
    let Some(obj) = v.as_object() else {
        out.push(Parsed::Skipped(src.to_owned(), "not a JSON object".into()));
        return;
    };
    let raw = if let Some(tokens) = obj.get("tokens").filter(|t| t.is_object()) {
        // Official $CODEX_HOME/auth.json.
        RawCredential {
            id_token: str_field(tokens, "id_token"),
            access_token: str_field(tokens, "access_token"),
            refresh_token: str_field(tokens, "refresh_token"),
            account_id: opt_field(tokens, "account_id"),
            email: None,
            last_refresh_ms: parse_rfc3339_ms(opt_field(v, "last_refresh")),
            expires_at: None,
        }
    } else if ["access_token", "refresh_token", "id_token"]
        .iter()
        .any(|k| obj.contains_key(*k))
    {
        // CPA flat file.
        if let Some(t) = opt_field(v, "type") {
            if !t.eq_ignore_ascii_case("codex") {
                out.push(Parsed::Skipped(
                    src.to_owned(),
                    format!("credential type {t:?} is not codex"),
                ));
                return;
            }
        }
        RawCredential {
            id_token: str_field(v, "id_token"),
            access_token: str_field(v, "access_token"),
            refresh_token: str_field(v, "refresh_token"),
            account_id: opt_field(v, "account_id"),
            email: opt_field(v, "email"),
            last_refresh_ms: parse_rfc3339_ms(opt_field(v, "last_refresh")),
            expires_at: parse_rfc3339_ms(opt_field(v, "expired")).map(|ms| ms / 1000),
        }
    } else {
        out.push(Parsed::Skipped(
            src.to_owned(),
            "not a Codex credential (no tokens / access_token / refresh_token)".into(),
        ));
        return;
    };
    out.push(Parsed::Credential(src.to_owned(), raw));
}

async fn import_raw(
    storage: &dyn Storage,
    oauth: &OAuthClient,
    src: &str,
    mut raw: RawCredential,
    sum: &mut ImportSummary,
) {
    if raw.access_token.is_empty() && raw.refresh_token.is_empty() {
        sum.skipped
            .push((src.to_owned(), "no access_token or refresh_token".into()));
        return;
    }
    if raw.access_token.is_empty() {
        // Refresh-token only: exchange it to learn who it belongs to. The endpoint rotates
        // the refresh token, so the old one is dead from here on: store the new one.
        match oauth
            .refresh(&Secret::new(raw.refresh_token.as_str()))
            .await
        {
            Ok(t) => {
                raw.access_token = t.access_token.expose().to_owned();
                if let Some(rt) = t.refresh_token {
                    raw.refresh_token = rt.expose().to_owned();
                }
                if let Some(it) = t.id_token {
                    raw.id_token = it.expose().to_owned();
                }
                raw.last_refresh_ms = Some(crate::storage::now_ms_i64());
                if let Some(exp) = t.expires_in {
                    raw.expires_at = Some(crate::storage::now_ms_i64() / 1000 + exp);
                }
            }
            Err(e) => {
                sum.skipped
                    .push((src.to_owned(), format!("token exchange failed: {e}")));
                return;
            }
        }
    }
    let id = Identity::from_tokens(&raw.id_token, &raw.access_token);
    let Some(account_id) = id.account_id.or(raw.account_id) else {
        sum.skipped.push((
            src.to_owned(),
            "no chatgpt_account_id in the tokens or the file".into(),
        ));
        return;
    };
    let email = id.email.or(raw.email);
    let up = AccountUpsert {
        chatgpt_account_id: account_id.clone(),
        user_id: id.user_id.unwrap_or_default(),
        email: email.clone(),
        plan_type: id.plan_type,
        access_token: Secret::from(raw.access_token),
        refresh_token: Secret::from(raw.refresh_token),
        id_token: Secret::from(raw.id_token),
        access_expires_at: id.access_expires_at.or(raw.expires_at),
        last_refresh_at: raw.last_refresh_ms,
    };
    match storage.upsert_account(&up).await {
        Ok(o) => {
            let label = format!(
                "{} (#{}, {})",
                email.as_deref().unwrap_or(&account_id),
                o.id,
                account_id
            );
            tracing::info!(
                source = src,
                account = o.id,
                created = o.created,
                "imported account"
            );
            sum.ids.push(o.id);
            if o.created {
                sum.added.push(label);
            } else {
                sum.updated.push(label);
            }
        }
        Err(e) => sum
            .skipped
            .push((src.to_owned(), format!("storage error: {e}"))),
    }
}

/// The credential-file parser without storage or network, for the fuzz targets
/// (`tests/fuzz`); compiled only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use crate::oauth::Identity;

    /// One entry of a parsed file (no `Debug`: it holds tokens).
    pub enum Entry {
        /// A credential to import.
        Credential {
            /// Where it came from (`file`, `file[2]`, `file:3`).
            src: String,
            /// `[id_token, access_token, refresh_token]` as read.
            tokens: [String; 3],
            /// The account id the import would use (the tokens' claims, else the file's).
            account_id: Option<String>,
        },
        /// A part of the file that is skipped, and why.
        Skipped {
            /// Where it came from.
            src: String,
            /// Why (never contains a token).
            reason: String,
        },
    }

    /// Parses one credential file's `text`, named `src`, as the import does.
    pub fn parse(src: &str, text: &str) -> Vec<Entry> {
        super::parse_text(src, text)
            .into_iter()
            .map(|p| match p {
                super::Parsed::Credential(src, raw) => {
                    let id = Identity::from_tokens(&raw.id_token, &raw.access_token);
                    Entry::Credential {
                        src,
                        account_id: id.account_id.or(raw.account_id),
                        tokens: [raw.id_token, raw.access_token, raw.refresh_token],
                    }
                }
                super::Parsed::Skipped(src, reason) => Entry::Skipped { src, reason },
            })
            .collect()
    }
}
