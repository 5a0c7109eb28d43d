//! A string that must never be printed: access tokens, refresh tokens, client keys.
//!
//! # Key Components
//! - [`Secret`]: cheap to clone (`Arc<str>`), `Debug`/`Display` print `"<redacted>"`.
//! - [`redact_url`]: a URL with its credentials removed, safe to log (database and Redis
//!   URLs in errors and in the configuration's `Debug`).

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

/// Removes `user:password@` from a URL so it can be logged; non-URLs are returned unchanged.
pub fn redact_url(url: &str) -> String {
    // The query first: `?password=...` (libpq and sqlx accept it) and its kin.
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, tail) = match rest.find(['/', '#']) {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://***@{host}{tail}"),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    if let Some(q) = query {
        out.push('?');
        let parts: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                _ => kv.to_owned(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    out
}

/// Query parameters that carry credentials.
fn is_secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "token",
        "auth",
        "sslpassword",
        "key",
    ]
    .iter()
    .any(|s| n == *s || n.ends_with(&format!("_{s}")) || n.ends_with(s))
}

/// The credentials of an `Authorization` header value with the `Bearer` scheme, the scheme
/// matched without regard to case (RFC 7235 §2.1: `BEARER x` is `Bearer x`). The one rule for
/// the data plane's keys and the admin API's tokens.
pub fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case("bearer ").then_some(rest)
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

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact_url("postgres://u:p@db:5432/x?sslmode=require"),
            "postgres://***@db:5432/x?sslmode=require"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("sqlite://a.db"), "sqlite://a.db");
        assert_eq!(redact_url("/tmp/x"), "/tmp/x");
        assert_eq!(
            redact_url("postgres://db/x?user=u&password=hunter2&sslmode=require"),
            "postgres://db/x?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("rediss://:pw@cache:6380/0?sslpassword=s3&x=1"),
            "rediss://***@cache:6380/0?sslpassword=***&x=1"
        );
        assert_eq!(
            redact_url("sqlite:a.db?PASSWORD=p"),
            "sqlite:a.db?PASSWORD=***"
        );
        for u in [
            "postgres://u:hunter2@db/x?password=hunter2",
            "redis://default:hunter2@h:1?auth_token=hunter2",
        ] {
            assert!(!redact_url(u).contains("hunter2"), "{u}");
        }
    }
}
