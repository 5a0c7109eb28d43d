//! Secrets at rest: the ChaCha20-Poly1305 box for token columns, and client-key generation.
//!
//! # Key Components
//! - [`Cipher`]: seals a token as `"v2:" + base64(nonce || ciphertext)` with associated data
//!   naming the row and column it belongs to ([`Binding`]): a ciphertext copied to another
//!   account or column does not open. `"v1:"` columns (no associated data, written before)
//!   still open and are re-sealed as v2 at start-up. An empty secret is stored as the empty
//!   string (an account without a refresh token).
//! - [`load_key`]: the 32-byte key from env [`SECRET_KEY_ENV`] (base64) or from
//!   `<data_dir>/secret.key`; when neither exists a new key is generated in memory and
//!   written ([`persist_new_key`], mode 0600) only once storage proved it holds no ciphertext
//!   (a missing key next to encrypted tokens refuses start-up instead of replacing it).
//! - [`generate_client_key`]: a new `sk-cg-...` client key with 214 bits of randomness.
//!
//! # Usage
//! Several gateway instances sharing one PostgreSQL database must share the key: set
//! `CODEX_GATEWAY_SECRET_KEY` on all of them (the file is per host).
//!
//! # Error handling
//! A malformed key is a startup error ([`StorageError::SecretKey`]); a column that does not
//! open is [`StorageError::Decrypt`] (never the value itself).

use std::{
    io::{Read, Write},
    path::Path,
};

use base64::{
    engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD},
    Engine,
};
use chacha20poly1305::{
    aead::{Aead, KeyInit, Payload},
    ChaCha20Poly1305, Key, Nonce,
};
use rand::{distr::Alphanumeric, Rng, RngCore};
use shared_state::{keys::KEY_PREFIX, Secret};

use crate::error::StorageError;

/// Environment variable holding the base64 storage key (32 bytes).
pub const SECRET_KEY_ENV: &str = "CODEX_GATEWAY_SECRET_KEY";
/// Key file name inside the data directory.
pub const SECRET_KEY_FILE: &str = "secret.key";
/// Ciphertexts without associated data (read only; re-sealed at start-up).
const V1_TAG: &str = "v1:";
/// Ciphertexts bound to their row and column.
const VERSION_TAG: &str = "v2:";
const NONCE_LEN: usize = 12;
/// Random characters after [`KEY_PREFIX`] in a generated client key (base62: ~5.95 bits each).
pub const CLIENT_KEY_RANDOM_CHARS: usize = 36;
/// Characters of a client key kept for display.
pub const KEY_DISPLAY_PREFIX: usize = 10;

/// Encrypts and decrypts token columns.
#[derive(Clone)]
pub struct Cipher {
    aead: ChaCha20Poly1305,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(<redacted>)")
    }
}

// === impl Cipher ===

impl Cipher {
    /// A cipher from raw key bytes.
    pub fn new(key: &[u8; 32]) -> Self {
        Self {
            aead: ChaCha20Poly1305::new(Key::from_slice(key)),
        }
    }

    /// Seals a secret for storage (`""` stays `""`), bound to `at`.
    pub fn seal(&self, plain: &Secret, at: &Binding<'_>) -> Result<String, StorageError> {
        if plain.is_empty() {
            return Ok(String::new());
        }
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let aad = at.aad();
        let ct = self
            .aead
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain.expose().as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| StorageError::Corrupt("encryption failed".into()))?;
        let mut buf = Vec::with_capacity(NONCE_LEN + ct.len());
        buf.extend_from_slice(&nonce);
        buf.extend_from_slice(&ct);
        Ok(format!("{VERSION_TAG}{}", STANDARD.encode(buf)))
    }

    /// Opens a stored column sealed for `at` (`""` gives an empty secret). A legacy `v1:`
    /// column opens without associated data ([`Cipher::is_legacy`] tells it apart).
    pub fn open(&self, stored: &str, at: &Binding<'_>) -> Result<Secret, StorageError> {
        if stored.is_empty() {
            return Ok(Secret::new(""));
        }
        let (b64, aad) = if let Some(b64) = stored.strip_prefix(VERSION_TAG) {
            (b64, at.aad())
        } else if let Some(b64) = stored.strip_prefix(V1_TAG) {
            (b64, Vec::new())
        } else {
            return Err(StorageError::Decrypt);
        };
        let raw = STANDARD.decode(b64).map_err(|_| StorageError::Decrypt)?;
        if raw.len() < NONCE_LEN {
            return Err(StorageError::Decrypt);
        }
        let (nonce, ct) = raw.split_at(NONCE_LEN);
        let pt = self
            .aead
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: &aad })
            .map_err(|_| StorageError::Decrypt)?;
        String::from_utf8(pt)
            .map(Secret::from)
            .map_err(|_| StorageError::Decrypt)
    }

    /// True for a column written without associated data (before v2): re-seal it.
    pub fn is_legacy(stored: &str) -> bool {
        stored.starts_with(V1_TAG)
    }
}

/// Where a ciphertext lives: the associated data of its AEAD seal. An account's token column
/// is bound to the account's natural key (`chatgpt_account_id`, `user_id`: unique, known
/// before the row id exists and never changed) and to the column name.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// Table name.
    pub table: &'static str,
    /// Column name.
    pub column: &'static str,
    /// The row's natural key parts.
    pub row: [&'a str; 2],
}

// === impl Binding ===

impl<'a> Binding<'a> {
    /// A token column of the account `(chatgpt_account_id, user_id)`.
    pub fn account(column: &'static str, chatgpt_account_id: &'a str, user_id: &'a str) -> Self {
        Self {
            table: "accounts",
            column,
            row: [chatgpt_account_id, user_id],
        }
    }

    /// Length-prefixed parts, so no two bindings share bytes.
    fn aad(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(b"codex-gateway/v2");
        for part in [self.table, self.column, self.row[0], self.row[1]] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out
    }
}

/// Decodes a base64 (standard or URL-safe, padded or not) 32-byte key.
fn decode_key(text: &str) -> Result<[u8; 32], StorageError> {
    let t = text.trim();
    let raw = STANDARD
        .decode(t)
        .or_else(|_| URL_SAFE.decode(t))
        .or_else(|_| URL_SAFE_NO_PAD.decode(t.trim_end_matches('=')))
        .map_err(|_| StorageError::SecretKey("not valid base64".into()))?;
    raw.try_into().map_err(|v: Vec<u8>| {
        StorageError::SecretKey(format!("expected 32 bytes, got {}", v.len()))
    })
}

/// Where the storage key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// [`SECRET_KEY_ENV`].
    Env,
    /// `<data_dir>/secret.key`.
    File,
    /// Neither existed: generated now, not written yet ([`persist_new_key`]).
    New,
}

/// Loads the storage key: env [`SECRET_KEY_ENV`] wins; else `<data_dir>/secret.key` (32 raw
/// bytes or base64 text). When neither exists a random key is returned as [`KeySource::New`];
/// the caller writes it with [`persist_new_key`] only after checking that storage holds no
/// ciphertext (so a lost key never silently becomes a new one). Creates the data directory
/// (mode 0700) when missing.
pub fn load_key(data_dir: &Path) -> Result<([u8; 32], KeySource), StorageError> {
    if let Ok(v) = std::env::var(SECRET_KEY_ENV) {
        if !v.trim().is_empty() {
            return Ok((decode_key(&v)?, KeySource::Env));
        }
    }
    create_private_dir(data_dir)?;
    let path = data_dir.join(SECRET_KEY_FILE);
    match std::fs::File::open(&path) {
        Ok(mut f) => {
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).map_err(|source| StorageError::Io {
                what: "cannot read key file",
                path: path.clone(),
                source,
            })?;
            restrict_file(&path);
            if let Ok(raw) = <[u8; 32]>::try_from(buf.as_slice()) {
                // 32 raw bytes (unless it is actually 32 chars of base64 text, which never
                // decodes to 32 bytes, so raw wins unambiguously).
                return Ok((raw, KeySource::File));
            }
            let text = String::from_utf8(buf).map_err(|_| {
                StorageError::SecretKey(format!("{} is not base64", path.display()))
            })?;
            Ok((decode_key(&text)?, KeySource::File))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            rand::rng().fill_bytes(&mut key);
            Ok((key, KeySource::New))
        }
        Err(source) => Err(StorageError::Io {
            what: "cannot read key file",
            path,
            source,
        }),
    }
}

/// Writes a key generated by [`load_key`] to `<data_dir>/secret.key` (mode 0600, never over
/// an existing file).
pub fn persist_new_key(data_dir: &Path, key: &[u8; 32]) -> Result<(), StorageError> {
    write_key_file(&data_dir.join(SECRET_KEY_FILE), key, false)?;
    tracing::info!(path = %data_dir.join(SECRET_KEY_FILE).display(), "created a new storage secret key");
    Ok(())
}

/// A base64 key given by an operator (`secrets rotate --new-key`).
pub fn decode_key_text(text: &str) -> Result<[u8; 32], StorageError> {
    decode_key(text)
}

/// Writes `key` (base64 text) to `path` with mode 0600 and syncs it; `replace` truncates an
/// existing file, else an existing file is an error.
pub fn write_key_file(path: &Path, key: &[u8; 32], replace: bool) -> Result<(), StorageError> {
    let path = path.to_path_buf();
    let mut opts = std::fs::OpenOptions::new();
    if replace {
        opts.write(true).create(true).truncate(true);
    } else {
        opts.write(true).create_new(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let io = |what: &'static str| {
        let path = path.clone();
        move |source| StorageError::Io { what, path, source }
    };
    let mut f = opts.open(&path).map_err(io("cannot create key file"))?;
    restrict_file(&path);
    let text = format!("{}\n", STANDARD.encode(key));
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io("cannot write key file"))?;
    Ok(())
}

/// Loads the key, creating `<data_dir>/secret.key` at once when missing (tests and tools that
/// hold no storage; [`crate::storage::open`] uses [`load_key`] and checks first).
pub fn load_or_create_key(data_dir: &Path) -> Result<[u8; 32], StorageError> {
    let (key, source) = load_key(data_dir)?;
    if source == KeySource::New {
        persist_new_key(data_dir, &key)?;
    }
    Ok(key)
}

/// Creates a directory holding secrets with mode 0700 (an existing one is tightened to 0700
/// when it is ours and looser).
pub fn create_private_dir(dir: &Path) -> Result<(), StorageError> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir).map_err(|source| StorageError::Io {
        what: "cannot create data directory",
        path: dir.to_path_buf(),
        source,
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(dir) {
            if meta.permissions().mode() & 0o077 != 0 {
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            }
        }
    }
    Ok(())
}

/// Makes a data file private (0600) when it is looser (the SQLite database and its WAL, the
/// key file). Best effort: a file we cannot change is left as it is.
pub fn restrict_file(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Generates a new client key: [`KEY_PREFIX`] + 36 base62 characters.
pub fn generate_client_key() -> String {
    let mut s = String::with_capacity(KEY_PREFIX.len() + CLIENT_KEY_RANDOM_CHARS);
    s.push_str(KEY_PREFIX);
    s.extend(
        rand::rng()
            .sample_iter(&Alphanumeric)
            .take(CLIENT_KEY_RANDOM_CHARS)
            .map(char::from),
    );
    s
}

/// The displayable prefix of a client key.
pub fn key_display_prefix(key: &str) -> String {
    key.chars().take(KEY_DISPLAY_PREFIX).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const AT: Binding<'static> = Binding {
        table: "accounts",
        column: "refresh_token_enc",
        row: ["acct-1", "user-1"],
    };

    #[test]
    fn seal_open_roundtrip_and_tamper() {
        let c = Cipher::new(&[7u8; 32]);
        let s = c.seal(&Secret::new("rt-abc"), &AT).unwrap();
        assert!(s.starts_with("v2:"));
        assert!(!s.contains("rt-abc"));
        assert_eq!(c.open(&s, &AT).unwrap().expose(), "rt-abc");
        assert_ne!(
            s,
            c.seal(&Secret::new("rt-abc"), &AT).unwrap(),
            "random nonce"
        );
        assert_eq!(c.seal(&Secret::new(""), &AT).unwrap(), "");
        assert!(c.open("", &AT).unwrap().is_empty());
        let other = Cipher::new(&[8u8; 32]);
        assert!(matches!(other.open(&s, &AT), Err(StorageError::Decrypt)));
        assert!(c.open("plaintext", &AT).is_err());
    }

    /// A ciphertext moved to another account or another column does not open.
    #[test]
    fn ciphertexts_are_bound_to_their_row_and_column() {
        let c = Cipher::new(&[7u8; 32]);
        let s = c.seal(&Secret::new("rt-abc"), &AT).unwrap();
        let other_row = Binding::account("refresh_token_enc", "acct-2", "user-1");
        let other_col = Binding::account("access_token_enc", "acct-1", "user-1");
        // Concatenation ambiguity: ("acct-1u", "ser-1") must differ from ("acct-1", "user-1").
        let shifted = Binding::account("refresh_token_enc", "acct-1u", "ser-1");
        for at in [other_row, other_col, shifted] {
            assert!(
                matches!(c.open(&s, &at), Err(StorageError::Decrypt)),
                "{at:?}"
            );
        }
    }

    /// Columns written before associated data (v1) still open, and say they are legacy.
    #[test]
    fn legacy_v1_columns_open() {
        let c = Cipher::new(&[7u8; 32]);
        let aead = ChaCha20Poly1305::new(Key::from_slice(&[7u8; 32]));
        let nonce = [3u8; NONCE_LEN];
        let ct = aead
            .encrypt(Nonce::from_slice(&nonce), &b"rt-old"[..])
            .unwrap();
        let v1 = format!("v1:{}", STANDARD.encode([&nonce[..], &ct[..]].concat()));
        assert!(Cipher::is_legacy(&v1));
        assert_eq!(c.open(&v1, &AT).unwrap().expose(), "rt-old");
        assert!(!Cipher::is_legacy(&c.seal(&Secret::new("x"), &AT).unwrap()));
    }

    #[test]
    fn key_file_is_created_once_with_0600() {
        let dir = tempfile::tempdir().unwrap();
        if std::env::var(SECRET_KEY_ENV).is_ok() {
            return;
        }
        let sub = dir.path().join("data");
        let (k0, src) = load_key(&sub).unwrap();
        assert_eq!(src, KeySource::New);
        assert!(
            !sub.join(SECRET_KEY_FILE).exists(),
            "not written before the check"
        );
        let k1 = load_or_create_key(&sub).unwrap();
        assert_ne!(k0, k1, "each new key is random");
        let (k2, src) = load_key(&sub).unwrap();
        assert_eq!((k1, src), (k2, KeySource::File));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&sub).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "data directory");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(sub.join(SECRET_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn client_keys_are_prefixed_and_distinct() {
        let a = generate_client_key();
        let b = generate_client_key();
        assert!(a.starts_with(KEY_PREFIX));
        assert_eq!(a.len(), KEY_PREFIX.len() + CLIENT_KEY_RANDOM_CHARS);
        assert_ne!(a, b);
        assert_eq!(key_display_prefix(&a).len(), 10);
        assert!(decode_key(&STANDARD.encode([1u8; 32])).is_ok());
        assert!(decode_key(&STANDARD.encode([1u8; 16])).is_err());
    }
}
