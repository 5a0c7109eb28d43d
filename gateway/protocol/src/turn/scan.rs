//! A single-pass, allocation-free scanner for the hot delta events.
//!
//! `response.output_text.delta`, `*.reasoning_*.delta` and `*.arguments.delta` are most of a
//! stream; serde costs several hundred nanoseconds on each. This scanner walks the top level of
//! the event object once, skips every value it does not need (nested values structurally,
//! string-aware), and returns the few fields the translators read.
//!
//! # Key Components
//! - [`scan_delta`]: `delta` (a *validated* raw JSON string token, safe to copy into output),
//!   `item_id`, `output_index`, `summary_index`, `content_index`.
//!
//! # Error handling
//! Anything unexpected (truncated data, a non-string `delta`, an invalid escape, a raw control
//! character, invalid UTF-8) gives `None`: the caller skips the event, exactly as it would skip
//! a malformed event on the serde path. Never panics (all indexing is checked).

/// The fields of a delta event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeltaFields<'a> {
    /// The `delta` string as a raw JSON token, quotes included, validated.
    pub delta: Option<&'a str>,
    /// The `item_id` text between its quotes (ids carry no escapes).
    pub item_id: Option<&'a str>,
    pub output_index: Option<u64>,
    pub summary_index: Option<u64>,
    pub content_index: Option<u64>,
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

// === impl Cursor ===

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Skips a string starting at `"`; returns its raw token.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        self.eat(b'"')?;
        loop {
            self.i += find_quote_or_backslash(self.b.get(self.i..)?)?;
            if self.peek()? == b'\\' {
                self.i += 2;
            } else {
                self.i += 1;
                return self.b.get(start..self.i);
            }
        }
    }

    /// Skips one value; returns its raw bytes.
    fn value(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                        }
                        b'{' | b'[' => {
                            depth += 1;
                            self.i += 1;
                        }
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            self.i += 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => self.i += 1,
                    }
                }
            }
            _ => {
                while let Some(c) = self.peek() {
                    if matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                        break;
                    }
                    self.i += 1;
                }
                if self.i == start {
                    return None;
                }
            }
        }
        self.b.get(start..self.i)
    }
}

/// Scans a delta event's top level.
pub(crate) fn scan_delta(data: &[u8]) -> Option<DeltaFields<'_>> {
    let mut c = Cursor { b: data, i: 0 };
    let mut f = DeltaFields::default();
    c.ws();
    c.eat(b'{')?;
    c.ws();
    if c.peek()? == b'}' {
        return Some(f);
    }
    loop {
        c.ws();
        let key = c.string()?;
        c.ws();
        c.eat(b':')?;
        c.ws();
        let v = c.value()?;
        match key {
            b"\"delta\"" => f.delta = Some(valid_string(v)?),
            b"\"item_id\"" => f.item_id = Some(plain_inner(v)?),
            b"\"output_index\"" => f.output_index = Some(parse_u64(v)?),
            b"\"summary_index\"" => f.summary_index = Some(parse_u64(v)?),
            b"\"content_index\"" => f.content_index = Some(parse_u64(v)?),
            _ => {}
        }
        c.ws();
        match c.peek()? {
            b',' => c.i += 1,
            b'}' => {
                c.i += 1;
                break;
            }
            _ => return None,
        }
    }
    c.ws();
    (c.i == data.len()).then_some(f)
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The inner text of a string token without escapes (ids).
fn plain_inner(v: &[u8]) -> Option<&str> {
    let inner = v.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.iter().any(|&b| b == b'\\' || b < 0x20) {
        return None;
    }
    std::str::from_utf8(inner).ok()
}

/// Validates a raw string token (quotes, escapes, no control characters, UTF-8).
fn valid_string(v: &[u8]) -> Option<&str> {
    let inner = v.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if has_special(inner) {
        let mut i = 0;
        while let Some(&b) = inner.get(i) {
            match b {
                b'\\' => match inner.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' => {
                        let hex = inner.get(i + 2..i + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        i += 6;
                    }
                    _ => return None,
                },
                b'"' | 0..=0x1f => return None,
                _ => i += 1,
            }
        }
    }
    std::str::from_utf8(v).ok()
}

// SWAR helpers: 8 bytes at a time. For each, the lowest flagged byte is exact (higher ones may
// be false positives after a borrow), which is all a "first match" search needs.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

#[inline]
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & HIGHS
}

#[inline]
fn quote_or_backslash_mask(x: u64) -> u64 {
    zero_bytes(x ^ (ONES * u64::from(b'"'))) | zero_bytes(x ^ (ONES * u64::from(b'\\')))
}

/// Offset of the first `"` or `\\` in `s`.
fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    let mut chunks = s.chunks_exact(8);
    let mut base = 0;
    for c in &mut chunks {
        let Ok(arr) = <[u8; 8]>::try_from(c) else {
            break;
        };
        let m = quote_or_backslash_mask(u64::from_le_bytes(arr));
        if m != 0 {
            return Some(base + (m.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|p| base + p)
}

/// True when `s` has a `"`, a `\\` or a control character.
fn has_special(s: &[u8]) -> bool {
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let Ok(arr) = <[u8; 8]>::try_from(c) else {
            return true;
        };
        let x = u64::from_le_bytes(arr);
        // bytes < 0x20: (x - 0x20..) & !x & 0x80.. flags them (and nothing at or above 0x80)
        let ctl = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        if quote_or_backslash_mask(x) | ctl != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b == b'"' || b == b'\\' || b < 0x20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::push_unescaped;

    #[test]
    fn scans_a_real_delta() {
        let d = br#"{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":2,"content_index":0,"delta":"He said \"hi\"\n","logprobs":[{"a":"]}"}],"obfuscation":"Xy"}"#;
        let f = scan_delta(d).unwrap_or_default();
        assert_eq!(f.delta, Some(r#""He said \"hi\"\n""#));
        assert_eq!(f.item_id, Some("msg_1"));
        assert_eq!(
            (f.output_index, f.content_index, f.summary_index),
            (Some(2), Some(0), None)
        );
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            &br#"{"delta":"x""#[..],
            br#"{"delta":5}"#,
            br#"{"delta":"bad \q escape"}"#,
            b"{\"delta\":\"ctl \x01\"}",
            br#"{"delta":"x"} trailing"#,
            br#"{"output_index":-1}"#,
            br#"{"a":[}"#,
            b"",
            b"[]",
        ] {
            assert_eq!(scan_delta(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(scan_delta(b" { } ").map(|f| f.delta), Some(None));
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_sonic(text in "\\PC*|[\\x00-\\x1f\"\\\\/]*", n in 0u64..1_000_000, id in "[a-z_0-9]{0,12}") {
            let v = sonic_rs::json!({
                "type": "response.output_text.delta",
                "logprobs": [{"token": text.clone(), "nested": {"a": [1, 2, {"b": "]}"}]}}],
                "item_id": id.clone(),
                "output_index": n,
                "delta": text.clone(),
                "obfuscation": null,
            });
            let data = sonic_rs::to_vec(&v).unwrap_or_default();
            let f = scan_delta(&data);
            proptest::prop_assert!(f.is_some(), "{}", String::from_utf8_lossy(&data));
            let f = f.unwrap_or_default();
            proptest::prop_assert_eq!(f.item_id, Some(id.as_str()));
            proptest::prop_assert_eq!(f.output_index, Some(n));
            let token = f.delta.unwrap_or_default();
            let back: String = sonic_rs::from_str(token).unwrap_or_default();
            proptest::prop_assert_eq!(&back, &text);
            let mut out = String::new();
            push_unescaped(&mut out, token);
            proptest::prop_assert_eq!(&out, &text);
        }

        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Some(f) = scan_delta(&data) {
                if let Some(d) = f.delta {
                    // whatever it accepts is a valid JSON string
                    proptest::prop_assert!(sonic_rs::from_str::<String>(d).is_ok(), "{d:?}");
                }
            }
        }
    }
}
