//! HTTP/1.1 wire primitives shared by the server ([`crate::server::h1`]) and the streaming
//! upstream client ([`crate::upstream::h1`]): the one appending read, and strict (RFC 9112)
//! parsing of what arrives in lines (chunk sizes, trailer lines).
//!
//! # Key Components
//! - [`read_more`]: appends one socket read to a buffer. monoio's `read` into a `Vec<u8>`
//!   writes at offset 0 and sets the length to the bytes read (docs/io-traps.md#a-read-replaces-the-buffer),
//!   so every loop that accumulates bytes across reads goes through this function, which reads
//!   into the spare capacity (`slice_mut(len..)`) instead.
//! - [`take_line`]: the next CRLF-terminated line; a bare LF is an error at once (never a wait).
//! - [`parse_chunk_size`]: `1*HEXDIG [ BWS ";" chunk-ext ]`, nothing else (no sign, no
//!   surrounding spaces, no `0x`), at most 16 hex digits, so sizes never overflow.
//!
//! # Error handling
//! Parsing returns `Err(&'static str)` naming what was malformed; callers map it to their
//! dialect (400 and close on the server, a protocol error on the upstream side).

use std::io;

use monoio::{
    buf::{IoBufMut, SliceMut},
    io::AsyncReadRent,
};

/// Appends one read from `io` to `buf`, first making sure at least `min_spare` bytes of spare
/// capacity exist (growing by at least the current capacity, so a large body costs O(log n)
/// reallocations). Returns the number of bytes appended; `Ok(0)` is EOF.
pub async fn read_more<R: AsyncReadRent>(
    io: &mut R,
    buf: &mut Vec<u8>,
    min_spare: usize,
) -> io::Result<usize> {
    let min_spare = min_spare.max(1);
    if buf.capacity() - buf.len() < min_spare {
        buf.reserve(min_spare.max(buf.capacity()));
    }
    let len = buf.len();
    let slice: SliceMut<Vec<u8>> = std::mem::take(buf).slice_mut(len..);
    let (res, slice) = io.read(slice).await;
    *buf = slice.into_inner();
    res
}

/// Write buffers at or below this capacity are always kept for the next write.
pub const KEEP_WRITE_BUF: usize = 1024;

/// Empties a reused write buffer after a write of `used` bytes, keeping its allocation only
/// while it is in proportion to what it carries: a stream whose first write (head and held
/// leading events) or one large event grew the buffer gives it back once its writes are small
/// again, so an idle stream pins little memory; a fast stream whose batches stay large keeps
/// reusing it (no allocation per batch).
pub fn recycle(buf: &mut Vec<u8>, used: usize) {
    buf.clear();
    if buf.capacity() > KEEP_WRITE_BUF.max(2 * used) {
        *buf = Vec::new();
    }
}

/// Outcome of looking for a line at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line: its length without the CRLF, and the bytes to consume (with CRLF).
    Complete {
        /// Length of the line content.
        len: usize,
        /// Length including the terminating CRLF.
        consumed: usize,
    },
    /// No line terminator yet.
    Partial,
}

/// Finds the CRLF-terminated line at the start of `buf`. A LF without the CR before it is
/// malformed (RFC 9112 §7.1 requires CRLF in chunked framing), and so is a lone CR followed
/// by anything else but LF.
pub fn take_line(buf: &[u8]) -> Result<Line, &'static str> {
    match buf.iter().position(|&b| b == b'\n' || b == b'\r') {
        None => Ok(Line::Partial),
        Some(p) if buf[p] == b'\n' => Err("bare LF line terminator"),
        Some(p) => match buf.get(p + 1) {
            None => Ok(Line::Partial),
            Some(b'\n') => Ok(Line::Complete {
                len: p,
                consumed: p + 2,
            }),
            Some(_) => Err("bare CR in a line"),
        },
    }
}

/// Parses a chunk-size line (without its CRLF): `1*HEXDIG [ BWS ";" chunk-ext ]`.
pub fn parse_chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err("malformed chunk size");
    }
    if digits > 16 {
        return Err("chunk size too large");
    }
    let mut size: u64 = 0;
    for &b in &line[..digits] {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        size = (size << 4) | u64::from(d);
    }
    let rest = &line[digits..];
    if rest.is_empty() {
        return Ok(size);
    }
    chunk_ext(rest)?;
    Ok(size)
}

/// RFC 9112 §7.1.1: `chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`,
/// a name is a `token`, a value a `token` or a `quoted-string`. Anything else (a bare `;`, a
/// space inside a token, a control character, an unterminated quote) is malformed: a parser
/// that skipped to the end of the line instead would agree with no other.
fn chunk_ext(mut rest: &[u8]) -> Result<(), &'static str> {
    const BAD: &str = "malformed chunk extension";
    let bws = |r: &mut &[u8]| {
        while let [b' ' | b'\t', tail @ ..] = *r {
            *r = tail;
        }
    };
    let token = |r: &mut &[u8]| -> Result<(), &'static str> {
        let n = r.iter().take_while(|&&b| is_tchar(b)).count();
        if n == 0 {
            return Err(BAD);
        }
        *r = &r[n..];
        Ok(())
    };
    let mut first = true;
    while !rest.is_empty() {
        bws(&mut rest);
        let [b';', tail @ ..] = rest else {
            // `5 ` or `5x`: not a size followed by an extension.
            return Err(if first { "malformed chunk size" } else { BAD });
        };
        first = false;
        rest = tail;
        bws(&mut rest);
        token(&mut rest)?;
        let mut probe = rest;
        bws(&mut probe);
        if let [b'=', tail @ ..] = probe {
            rest = tail;
            bws(&mut rest);
            if let [b'"', tail @ ..] = rest {
                rest = quoted_string(tail)?;
            } else {
                token(&mut rest)?;
            }
        }
    }
    Ok(())
}

/// After the opening quote: `*( qdtext / quoted-pair ) DQUOTE`; returns what follows.
fn quoted_string(mut rest: &[u8]) -> Result<&[u8], &'static str> {
    const BAD: &str = "malformed chunk extension";
    loop {
        match rest {
            [b'"', tail @ ..] => return Ok(tail),
            [b'\\', c, tail @ ..] if *c == b'\t' || (*c >= 0x20 && *c != 0x7f) => rest = tail,
            [c, tail @ ..] if *c == b'\t' || (*c >= 0x20 && *c != 0x7f && *c != b'\\') => {
                rest = tail
            }
            _ => return Err(BAD),
        }
    }
}

/// `tchar` of RFC 9110 §5.6.2.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_buffers_are_kept_in_proportion_to_their_use() {
        // A large first write, then small ones: the buffer is given back.
        let mut b = Vec::with_capacity(8 * 1024);
        b.extend_from_slice(&[0u8; 6000]);
        recycle(&mut b, 6000);
        assert!(
            b.is_empty() && b.capacity() >= 6000,
            "kept while writes are large"
        );
        b.extend_from_slice(&[0u8; 300]);
        recycle(&mut b, 300);
        assert_eq!(b.capacity(), 0, "released once writes are small");
        // Small buffers are always kept.
        let mut s = Vec::with_capacity(KEEP_WRITE_BUF);
        s.push(1);
        recycle(&mut s, 1);
        assert!(s.is_empty() && s.capacity() == KEEP_WRITE_BUF);
        // Steady large batches keep theirs (no allocation per batch).
        let mut f = Vec::with_capacity(64 * 1024);
        for _ in 0..3 {
            f.extend_from_slice(&[0u8; 40 * 1024]);
            recycle(&mut f, 40 * 1024);
            assert!(f.capacity() >= 64 * 1024);
        }
    }

    #[test]
    fn chunk_sizes_strict() {
        assert_eq!(parse_chunk_size(b"0"), Ok(0));
        assert_eq!(parse_chunk_size(b"1a"), Ok(26));
        assert_eq!(parse_chunk_size(b"FF"), Ok(255));
        assert_eq!(parse_chunk_size(b"5;name=value"), Ok(5));
        assert_eq!(parse_chunk_size(b"5 ;name"), Ok(5));
        assert_eq!(parse_chunk_size(b"5;a=b;c;d = \"x y\\\"z\""), Ok(5));
        assert_eq!(parse_chunk_size(b"5 ; a ; b=c"), Ok(5));
        assert_eq!(parse_chunk_size(b"ffffffffffffffff"), Ok(u64::MAX));
        for bad in [
            &b""[..],
            b"+5",
            b" 5",
            b"5 ",
            b" 5 ",
            b"0x5",
            b"-1",
            b"5x",
            b"1ffffffffffffffff",
            b"5;\x01",
            b"5;",
            b"5;;a",
            b"5;a=",
            b"5;a=b c",
            b"5;a=\"unterminated",
            b"5;\"q\"",
            b"5;a=b\x7f",
            b"5;a;",
            b"5g",
            b"g",
            b"-5",
        ] {
            assert!(
                parse_chunk_size(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lines_need_crlf() {
        assert_eq!(
            take_line(b"5\r\nhello"),
            Ok(Line::Complete {
                len: 1,
                consumed: 3
            })
        );
        assert_eq!(take_line(b"5"), Ok(Line::Partial));
        assert_eq!(take_line(b"5\r"), Ok(Line::Partial));
        assert!(take_line(b"5\nhello").is_err());
        assert!(take_line(b"5\rx").is_err());
        assert_eq!(
            take_line(b"\r\n"),
            Ok(Line::Complete {
                len: 0,
                consumed: 2
            })
        );
    }
}
