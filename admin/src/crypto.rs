//! Secrets at rest: the ChaCha20-Poly1305 box for token columns, and client-key generation.
//!
//! # Key Components
//! - [`Cipher`]: seals a token as `"v1:" + base64(nonce || ciphertext)`; an empty secret is
//!   stored as the empty string (an account without a refresh token).
//! - [`load_or_create_key`]: the 32-byte key from env [`SECRET_KEY_ENV`] (base64) or from
//!   `<data_dir>/secret.key` (created with mode 0600 and random bytes when absent).
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
    aead::{Aead, KeyInit},
    ChaCha20Poly1305, Key, Nonce,
};
use rand::{distr::Alphanumeric, Rng, RngCore};
use shared_state::{keys::KEY_PREFIX, Secret};

use crate::error::StorageError;

/// Environment variable holding the base64 storage key (32 bytes).
pub const SECRET_KEY_ENV: &str = "CODEX_GATEWAY_SECRET_KEY";
/// Key file name inside the data directory.
pub const SECRET_KEY_FILE: &str = "secret.key";
const VERSION_TAG: &str = "v1:";
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

    /// Seals a secret for storage (`""` stays `""`).
    pub fn seal(&self, plain: &Secret) -> Result<String, StorageError> {
        if plain.is_empty() {
            return Ok(String::new());
        }
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let ct = self
            .aead
            .encrypt(Nonce::from_slice(&nonce), plain.expose().as_bytes())
            .map_err(|_| StorageError::Corrupt("encryption failed".into()))?;
        let mut buf = Vec::with_capacity(NONCE_LEN + ct.len());
        buf.extend_from_slice(&nonce);
        buf.extend_from_slice(&ct);
        Ok(format!("{VERSION_TAG}{}", STANDARD.encode(buf)))
    }

    /// Opens a stored column (`""` gives an empty secret).
    pub fn open(&self, stored: &str) -> Result<Secret, StorageError> {
        if stored.is_empty() {
            return Ok(Secret::new(""));
        }
        let b64 = stored
            .strip_prefix(VERSION_TAG)
            .ok_or(StorageError::Decrypt)?;
        let raw = STANDARD.decode(b64).map_err(|_| StorageError::Decrypt)?;
        if raw.len() < NONCE_LEN {
            return Err(StorageError::Decrypt);
        }
        let (nonce, ct) = raw.split_at(NONCE_LEN);
        let pt = self
            .aead
            .decrypt(Nonce::from_slice(nonce), ct)
            .map_err(|_| StorageError::Decrypt)?;
        String::from_utf8(pt)
            .map(Secret::from)
            .map_err(|_| StorageError::Decrypt)
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

/// Loads the storage key: env [`SECRET_KEY_ENV`] wins; else `<data_dir>/secret.key` (32 raw
/// bytes or base64 text), created with mode 0600 and random bytes when missing.
pub fn load_or_create_key(data_dir: &Path) -> Result<[u8; 32], StorageError> {
    if let Ok(v) = std::env::var(SECRET_KEY_ENV) {
        if !v.trim().is_empty() {
            return decode_key(&v);
        }
    }
    let path = data_dir.join(SECRET_KEY_FILE);
    let io = |what: &'static str| {
        let path = path.clone();
        move |source| StorageError::Io { what, path, source }
    };
    std::fs::create_dir_all(data_dir).map_err(|source| StorageError::Io {
        what: "cannot create data directory",
        path: data_dir.to_path_buf(),
        source,
    })?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(&path) {
        Ok(mut f) => {
            let mut key = [0u8; 32];
            rand::rng().fill_bytes(&mut key);
            let text = format!("{}\n", STANDARD.encode(key));
            f.write_all(text.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(io("cannot write key file"))?;
            tracing::info!(path = %path.display(), "created a new storage secret key");
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mut buf = Vec::new();
            std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut buf))
                .map_err(io("cannot read key file"))?;
            if let Ok(raw) = <[u8; 32]>::try_from(buf.as_slice()) {
                // 32 raw bytes (unless it is actually 32 chars of base64 text, which never
                // decodes to 32 bytes, so raw wins unambiguously).
                return Ok(raw);
            }
            let text = String::from_utf8(buf).map_err(|_| {
                StorageError::SecretKey(format!("{} is not base64", path.display()))
            })?;
            decode_key(&text)
        }
        Err(e) => Err(io("cannot create key file")(e)),
    }
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

    #[test]
    fn seal_open_roundtrip_and_tamper() {
        let c = Cipher::new(&[7u8; 32]);
        let s = c.seal(&Secret::new("rt-abc")).unwrap();
        assert!(s.starts_with("v1:"));
        assert!(!s.contains("rt-abc"));
        assert_eq!(c.open(&s).unwrap().expose(), "rt-abc");
        assert_ne!(s, c.seal(&Secret::new("rt-abc")).unwrap(), "random nonce");
        assert_eq!(c.seal(&Secret::new("")).unwrap(), "");
        assert!(c.open("").unwrap().is_empty());
        let other = Cipher::new(&[8u8; 32]);
        assert!(matches!(other.open(&s), Err(StorageError::Decrypt)));
        assert!(c.open("plaintext").is_err());
    }

    #[test]
    fn key_file_is_created_once_with_0600() {
        let dir = tempfile::tempdir().unwrap();
        if std::env::var(SECRET_KEY_ENV).is_ok() {
            return;
        }
        let k1 = load_or_create_key(dir.path()).unwrap();
        let k2 = load_or_create_key(dir.path()).unwrap();
        assert_eq!(k1, k2);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(SECRET_KEY_FILE))
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
