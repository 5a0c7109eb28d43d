//! A string that must never be printed: access tokens, refresh tokens, client keys.
//!
//! # Key Components
//! - [`Secret`]: cheap to clone (`Arc<str>`), `Debug`/`Display` print `"<redacted>"`.

use std::{fmt, sync::Arc};

/// A secret string. Read it only with [`Secret::expose`], at the point where it is put on the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

// === impl Secret ===

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<Arc<str>>) -> Self {
        Self(s.into())
    }

    /// The secret itself: call this only where it is written to the wire or to storage.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when the secret is empty (e.g. an account without a refresh token).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let s = Secret::new("sk-very-secret");
        assert!(!format!("{s:?}").contains("very-secret"));
        assert!(!format!("{s}").contains("very-secret"));
        assert_eq!(s.expose(), "sk-very-secret");
    }
}
