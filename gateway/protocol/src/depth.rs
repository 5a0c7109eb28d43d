//! Nesting depth of JSON text, measured without recursion.
//!
//! Every JSON reader of the data plane (sonic-rs's DOM, its checked skipping, its lazy
//! `get`, and our own walks over trees) recurses once per level of nesting. About 8,500
//! levels of `[` (17 KB, or 87 bytes gzip-compressed) overflow a worker thread's 2 MiB stack,
//! and a stack overflow aborts the whole process: every stream of every user ends, and no
//! `catch_unwind` can stop it. So JSON from outside is measured first, by this flat scan, and
//! refused past [`MAX_DEPTH`] before any recursive reader sees it.
//!
//! # Key Components
//! - [`MAX_DEPTH`]: the limit (serde_json's default recursion limit; real requests nest about
//!   ten levels, deep JSON-schema tool parameters a few dozen).
//! - [`within`]: whether a text nests no deeper than a limit.
//! - [`check`]: [`within`] at [`MAX_DEPTH`].
//! - [`within_from`]: [`within`] for the rest of a text (a reader that measured its start
//!   while reading it: [`crate::events::usage_of_terminal`]).
//!
//! # Usage
//! The gateway's one body reader (`api::read_authenticated`) and its WebSocket reader refuse a
//! body or message that fails [`check`]; readers of upstream JSON that build a tree check
//! first too. The scan never fails on invalid JSON: it only bounds the nesting a parser would
//! have to recurse through, and leaves the parser to refuse what is malformed.
//!
//! # Cost
//! Brackets are counted outside strings only; a string is skipped with a SIMD search for
//! its closing quote or next backslash (`memchr2`), so the scan runs at memory speed over
//! the long strings that make up most of a request (instructions, tool descriptions,
//! conversation text).

/// Deepest nesting of arrays and objects the data plane reads. Past it a request is refused
/// (`400`, or WebSocket close `1009`).
pub const MAX_DEPTH: usize = 128;

/// Whether `json` nests arrays and objects no deeper than `max` levels (a scalar is depth 0,
/// `[]` depth 1). Brackets inside strings do not count; escaped quotes do not end a string.
/// Malformed text is measured as far as it goes (an unterminated string ends the scan).
pub fn within(json: &[u8], max: usize) -> bool {
    within_from(json, 0, max)
}

/// [`within`] for the rest of a text whose start was already measured: the scan goes on at
/// `open` levels (outside any string), as if it had measured the start itself.
pub fn within_from(json: &[u8], open: usize, max: usize) -> bool {
    let mut depth = open;
    let mut i = 0usize;
    while let Some(&b) = json.get(i) {
        match b {
            b'"' => match string_end(json, i + 1) {
                Some(end) => {
                    i = end;
                    continue;
                }
                // An unterminated string: nothing after it opens anything a parser would
                // descend into.
                None => return true,
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    true
}

/// [`within`] at [`MAX_DEPTH`].
pub fn check(json: &[u8]) -> bool {
    within(json, MAX_DEPTH)
}

/// The index just past the closing quote of the string whose contents start at `from`.
fn string_end(json: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let rest = json.get(from..)?;
        let k = memchr::memchr2(b'"', b'\\', rest)?;
        match rest[k] {
            // An escape: the next byte is taken as is (`\"`, `\\`, `\u...`).
            b'\\' => from += k + 2,
            _ => return Some(from + k + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(2 * n);
        v.extend(std::iter::repeat_n(b'[', n));
        v.extend(std::iter::repeat_n(b']', n));
        v
    }

    #[test]
    fn measures_arrays_and_objects() {
        assert!(within(b"1", 0));
        assert!(within(b"\"x\"", 0));
        assert!(!within(b"[]", 0));
        assert!(within(b"[]", 1));
        assert!(within(br#"{"a":[1,{"b":2}],"c":{}}"#, 3));
        assert!(!within(br#"{"a":[1,{"b":2}],"c":{}}"#, 2));
        assert!(within(&nested(MAX_DEPTH), MAX_DEPTH));
        assert!(!within(&nested(MAX_DEPTH + 1), MAX_DEPTH));
        assert!(!check(&nested(10_000)));
        // Siblings do not add up.
        let wide = "[[]]".repeat(10_000);
        assert!(within(
            format!("[{}]", wide.replace("][", "],[")).as_bytes(),
            3
        ));
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let s = format!(
            r#"{{"t":"{}","u":"{}"}}"#,
            "[".repeat(1000),
            "{".repeat(1000)
        );
        assert!(within(s.as_bytes(), 1));
        // Escaped quotes and backslashes keep the scan inside the string.
        assert!(within(br#"{"t":"a\"[[[[\"b","u":1}"#, 1));
        assert!(within(br#"{"t":"a\\","u":[1]}"#, 2));
        assert!(!within(br#"{"t":"a\\","u":[1]}"#, 1));
        assert!(within(br#"["\\\"[[[", "]"]"#, 1));
    }

    #[test]
    fn closing_brackets_inside_strings_cannot_hide_depth() {
        // A string full of `]` between openers must not lower the count.
        let mut s = String::new();
        for _ in 0..200 {
            s.push_str(r#"["]]]]]]]]]]","#);
        }
        assert!(!within(s.as_bytes(), MAX_DEPTH));
    }

    #[test]
    fn malformed_text_is_measured_as_far_as_it_goes() {
        assert!(within(b"\"unterminated [[[[[", 0));
        assert!(within(b"]]]]]][", 1));
        assert!(!within(&nested(200)[..150], MAX_DEPTH));
        assert!(within(b"\"\\", 0));
        assert!(within(b"", 0));
    }

    #[test]
    fn the_rest_of_a_text_measures_as_the_whole() {
        // Cut outside strings at depth `open`: the start measured, and the rest counted from
        // `open`, measure as the whole text does, at every limit.
        let text = br#"{"a":[1,{"b":"]]}}[["}],"c":[[[["x"]]]],"d":{}}"#;
        for (cut, open) in [
            (0, 0),
            (1, 1),
            (6, 2),
            (8, 2),
            (22, 2),
            (23, 1),
            (43, 1),
            (44, 1),
        ] {
            for max in 0..8 {
                assert_eq!(
                    within(&text[..cut], max) && within_from(&text[cut..], open, max),
                    within(text, max),
                    "cut {cut}, max {max}"
                );
            }
        }
        assert!(!within_from(&nested(1), MAX_DEPTH, MAX_DEPTH));
        assert!(within_from(b"]]]", MAX_DEPTH, MAX_DEPTH));
    }

    #[test]
    fn agrees_with_a_recursive_parser_below_the_limit() {
        // serde_json's own recursion limit is 128: whatever we let through, it parses.
        for n in [1, 10, 100, MAX_DEPTH - 1] {
            let body = nested(n);
            assert!(check(&body));
            assert!(
                sonic_rs::from_slice::<sonic_rs::Value>(&body).is_ok(),
                "{n}"
            );
        }
    }
}
