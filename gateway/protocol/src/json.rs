//! Tiny infallible JSON helpers for hand-assembled output, shared by every dialect's encoder.
//!
//! # Key Components
//! - [`write_str`]: a Rust string as a quoted, escaped JSON string.
//! - [`write_u64`]: a decimal number without going through `fmt`.
//! - [`write_string_value`]: a parsed value that must end up as a JSON string: string values
//!   are copied raw (already valid JSON), anything else is stringified.
//! - [`push_unescaped`]: decodes a validated raw string token into a `String`.
//!
//! # Error handling
//! None: writing into a `Vec<u8>` cannot fail, and every input is valid UTF-8.

use sonic_rs::{JsonValueTrait, LazyValue};

/// Bytes that must be escaped inside a JSON string: 0 = none, otherwise the escape letter
/// (`u` = `\u00XX`).
const ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[b'\n' as usize] = b'n';
    t[b'\r' as usize] = b'r';
    t[b'\t' as usize] = b't';
    t[0x08] = b'b';
    t[0x0c] = b'f';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a quoted, escaped JSON string.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc = ESCAPE[b as usize];
        if esc == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if esc == b'u' {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.push(b'\\');
            out.push(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends the decimal digits of `n`.
pub(crate) fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends a value that must be a JSON string: a string is copied raw, `null` becomes `""`,
/// anything else (an object given as tool arguments, a number, ...) is stringified.
pub(crate) fn write_string_value(out: &mut Vec<u8>, v: &LazyValue<'_>) {
    if v.is_str() {
        out.extend_from_slice(v.as_raw_str().as_bytes());
    } else if v.is_null() {
        out.extend_from_slice(b"\"\"");
    } else {
        write_str(out, v.as_raw_str());
    }
}

/// Appends the decoded text of a validated JSON string token (`"..."`, quotes included), as
/// the delta scanner (`turn::scan`) returns them.
pub(crate) fn push_unescaped(dst: &mut String, token: &str) {
    let inner = token
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(token);
    if !inner.contains('\\') {
        dst.push_str(inner);
        return;
    }
    let mut rest = inner;
    while let Some(pos) = rest.find('\\') {
        dst.push_str(&rest[..pos]);
        let esc = &rest[pos + 1..];
        let mut consumed = 1;
        match esc.as_bytes().first() {
            Some(b'n') => dst.push('\n'),
            Some(b't') => dst.push('\t'),
            Some(b'r') => dst.push('\r'),
            Some(b'b') => dst.push('\u{8}'),
            Some(b'f') => dst.push('\u{c}'),
            Some(b'u') => {
                let hi = esc.get(1..5).and_then(|h| u32::from_str_radix(h, 16).ok());
                consumed = 5;
                match hi {
                    Some(h @ 0xD800..=0xDBFF) => {
                        let lo = esc
                            .get(5..7)
                            .filter(|p| *p == "\\u")
                            .and_then(|_| esc.get(7..11))
                            .and_then(|l| u32::from_str_radix(l, 16).ok())
                            .filter(|l| (0xDC00..=0xDFFF).contains(l));
                        match lo {
                            Some(l) => {
                                consumed = 11;
                                let c = 0x10000 + ((h - 0xD800) << 10) + (l - 0xDC00);
                                dst.push(char::from_u32(c).unwrap_or('\u{FFFD}'));
                            }
                            None => dst.push('\u{FFFD}'),
                        }
                    }
                    Some(c) => dst.push(char::from_u32(c).unwrap_or('\u{FFFD}')),
                    None => dst.push('\u{FFFD}'),
                }
            }
            Some(&c) => dst.push(char::from(c)),
            None => {}
        }
        rest = esc.get(consumed..).unwrap_or("");
    }
    dst.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(s: &str) -> String {
        let mut out = Vec::new();
        write_str(&mut out, s);
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn escapes_like_json() {
        for s in [
            "",
            "plain",
            "q\"b\\s",
            "nl\n\r\t\u{8}\u{c}",
            "\u{1}\u{1f}",
            "ünï😀",
            "</script>",
        ] {
            let e = esc(s);
            let back: String = sonic_rs::from_str(&e).unwrap_or_default();
            assert_eq!(back, s, "{e}");
        }
        assert_eq!(esc("\u{1}"), "\"\\u0001\"");
    }

    #[test]
    fn numbers() {
        for n in [0u64, 7, 10, 1_700_000_000, u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap_or_default(), n.to_string());
        }
    }

    #[test]
    fn unescapes_like_json() {
        for s in ["plain", "a\"b\\c\n\t\r\u{8}\u{c}/", "é😀\u{1}", ""] {
            let mut token = Vec::new();
            write_str(&mut token, s);
            let token = String::from_utf8(token).unwrap_or_default();
            let mut out = String::new();
            push_unescaped(&mut out, &token);
            assert_eq!(out, s);
        }
        let mut out = String::new();
        push_unescaped(&mut out, r#""\ud83d\ude00 \u00e9 \/ \ud800x""#);
        assert_eq!(out, "😀 é / \u{FFFD}x");
    }
}
