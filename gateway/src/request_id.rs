//! The gateway's request id: one per HTTP request and one per WebSocket turn, answered in
//! `x-request-id` on every data-plane response, in Anthropic error bodies (`request_id`, as
//! Anthropic's API does), in WebSocket `error` events, and carried into the usage record, the
//! access log and the logs of the attempt phase, so "which request was that?" has one answer
//! everywhere.
//!
//! # Key Components
//! - [`for_request`]: the client's `x-request-id` when it is well-formed ([`is_valid`]: 1 to
//!   128 characters of `[A-Za-z0-9._:-]`, safe in a header, a log line and a CSV cell), else
//!   a fresh one.
//! - [`generate`]: `req_` + 24 hex digits: a random 64-bit prefix drawn once per thread and a
//!   per-thread counter. No syscall, no lock and no shared atomic per request; unique across
//!   workers, processes and instances with overwhelming probability.

use std::cell::Cell;

/// The response (and request) header.
pub const HEADER: &str = "x-request-id";

/// Longest client id kept.
pub const MAX_LEN: usize = 128;

/// Whether a client-sent id is kept: 1 to [`MAX_LEN`] characters of `[A-Za-z0-9._:-]`.
pub fn is_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The id of a request whose `x-request-id` header is `client`: kept when well-formed, else a
/// fresh one (a malformed id is replaced, never echoed).
pub fn for_request(client: Option<&str>) -> String {
    match client {
        Some(id) if is_valid(id) => id.to_owned(),
        _ => generate(),
    }
}

thread_local! {
    /// This thread's random prefix (0: not drawn yet) and counter.
    static STATE: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

/// A random 64-bit value from the standard library's per-thread hash keys (seeded once per
/// thread; no syscall afterwards).
fn draw_prefix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

/// A fresh id: `req_<16 hex prefix><8 hex counter>`; the prefix is redrawn when the counter
/// wraps.
pub fn generate() -> String {
    let (prefix, n) = STATE.with(|s| {
        let (mut prefix, mut n) = s.get();
        if prefix == 0 || n == u32::MAX {
            prefix = draw_prefix();
            n = 0;
        }
        n += 1;
        s.set((prefix, n));
        (prefix, n)
    });
    format!("req_{prefix:016x}{n:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_well_formed() {
        for ok in ["a", "req_123", "0199a213-81c0-7800:x.y", &"x".repeat(128)] {
            assert!(is_valid(ok), "{ok}");
            assert_eq!(for_request(Some(ok)), ok);
        }
        for bad in [
            "",
            "a b",
            "a\r\nset-cookie: x",
            "é",
            "a/b",
            &"x".repeat(129),
        ] {
            assert!(!is_valid(bad), "{bad}");
            let id = for_request(Some(bad));
            assert!(id.starts_with("req_") && is_valid(&id), "{id}");
        }
    }

    #[test]
    fn generated_ids_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 24);
        assert!(is_valid(&a));
        let other = std::thread::spawn(generate).join().expect("thread");
        assert_ne!(a[..20], other[..20], "threads draw their own prefixes");
    }
}
