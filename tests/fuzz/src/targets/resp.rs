//! `resp`: the RESP2 reply parser of the workers' Redis client (`gateway::redis::parse_reply`).
//!
//! Input: bytes from a Redis server. Invariants:
//! - a complete reply uses at most the bytes given, and parses the same from exactly those;
//! - every proper prefix of a complete reply asks for more bytes (`Ok(None)`), never fails:
//!   the connection reads until the reply is whole, so a split reply must never be refused;
//! - a reply encoded back to RESP parses to itself (text replies when they can be encoded);
//! - replies parsed one after another consume the buffer exactly.

use gateway::redis::{parse_reply, Reply};

/// `reply` as RESP2, or `None` when it has no exact encoding (simple strings and errors that
/// are not lossless text on one line).
fn encode(reply: &Reply, out: &mut Vec<u8>) -> Option<()> {
    match reply {
        Reply::Simple(s) | Reply::Error(s) => {
            if s.contains(['\r', '\n', '\u{fffd}']) {
                return None;
            }
            out.push(if matches!(reply, Reply::Simple(_)) {
                b'+'
            } else {
                b'-'
            });
            out.extend_from_slice(s.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Reply::Integer(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Reply::Bulk(Some(b)) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Reply::Array(Some(items)) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode(i, out)?;
            }
        }
    }
    Some(())
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let mut rest = data;
    for _ in 0..16 {
        let Ok(Some((reply, used))) = parse_reply(rest) else {
            // An error or an incomplete reply: nothing more to check on this input.
            return;
        };
        assert!(
            used > 0 && used <= rest.len(),
            "used {used} of {}",
            rest.len()
        );
        assert_eq!(parse_reply(&rest[..used]), Ok(Some((reply.clone(), used))));
        // Every prefix (all of them for short replies, a spread for long ones).
        let step = (used / 256).max(1);
        for k in (0..used).step_by(step) {
            assert_eq!(
                parse_reply(&rest[..k]),
                Ok(None),
                "prefix of {k} bytes of {used}"
            );
        }
        let mut wire = Vec::new();
        if encode(&reply, &mut wire).is_some() {
            assert_eq!(
                parse_reply(&wire),
                Ok(Some((reply.clone(), wire.len()))),
                "re-encoded"
            );
        }
        rest = &rest[used..];
    }
}
