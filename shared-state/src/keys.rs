//! Client API keys: generation format and the one hash both planes agree on.
//!
//! # Key Components
//! - [`hash_key`]: SHA-256 of the full `sk-...` key; only this is stored and looked up.
//! - [`KEY_PREFIX`]: the prefix every gateway key carries.

use sha2::{Digest, Sha256};

/// Every client key the gateway issues starts with this.
pub const KEY_PREFIX: &str = "sk-cg-";

/// The stored form of a client key: its SHA-256 digest. Keys are 192-bit random, so a plain
/// digest is not brute-forceable and keeps the per-request lookup to one hash.
pub fn hash_key(key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.finalize().into()
}

/// Hex form of [`hash_key`], as stored in the database.
pub fn hash_key_hex(key: &str) -> String {
    hex::encode(hash_key(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_distinct() {
        assert_eq!(hash_key("sk-cg-a"), hash_key("sk-cg-a"));
        assert_ne!(hash_key("sk-cg-a"), hash_key("sk-cg-b"));
        assert_eq!(hash_key_hex("sk-cg-a").len(), 64);
    }
}
