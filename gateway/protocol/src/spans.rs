//! Where values are in JSON text that is already known to be valid (a body the normaliser
//! accepted, or one the gateway wrote): a flat walk that finds the ends of values without
//! validating or decoding them again.
//!
//! A strict parser's skip (sonic-rs's checked iterators) validates every byte it passes over;
//! a body the strict pass accepted needs only its structure: strings end at the first quote
//! not escaped, and a container at its matching bracket, counting only brackets of its own
//! kind outside strings (in valid JSON the other kind is balanced inside it). A string's end
//! is a SIMD search (`memchr2`, or `memrchr` walking back), so long strings (conversation
//! text, instructions) cost almost nothing.
//!
//! # Key Components
//! - [`unique_member`]: the top-level member with a name (and a value of a kind), looked for
//!   from both ends at once, in a body that names each member once.
//! - [`items`]: the items of an array.
//! - [`key_is`]: a raw (quoted) key compared with a name, escapes decoded.
//!
//! # Error handling
//! None to report: on text that is not valid JSON the walks stop early (`None`, or fewer
//! members), never panic, and never recurse (nesting costs a counter, not stack).

use std::ops::Range;

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The first index at or after `i` that is not blank.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| is_ws(*c)) {
        i += 1;
    }
    i
}

/// The index of the last byte before `end` that is not blank.
fn skip_ws_back(b: &[u8], end: usize) -> Option<usize> {
    b.get(..end)?.iter().rposition(|c| !is_ws(*c))
}

/// The index just past the closing quote of the string whose opening quote is at `open`.
fn string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        let rest = b.get(i..)?;
        let k = memchr::memchr2(b'"', b'\\', rest)?;
        match rest[k] {
            // An escape: the byte after the backslash is taken as is (`\"`, `\\`).
            b'\\' => i += k + 2,
            _ => return Some(i + k + 1),
        }
    }
}

/// The index of the opening quote of the string whose closing quote is at `close`. A quote
/// delimits a string when the run of backslashes before it is even (backslashes appear only
/// in strings, and pair from the left).
fn string_start(b: &[u8], close: usize) -> Option<usize> {
    let mut end = close;
    loop {
        let q = memchr::memrchr(b'"', b.get(..end)?)?;
        if b[..q].iter().rev().take_while(|c| **c == b'\\').count() % 2 == 0 {
            return Some(q);
        }
        end = q;
    }
}

/// The closing bracket of a container.
fn closing(open: u8) -> u8 {
    if open == b'{' {
        b'}'
    } else {
        b']'
    }
}

/// The index just past the value that starts at `i`.
pub(crate) fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        open @ (b'{' | b'[') => {
            // Only brackets of the container's own kind count (the other kind is balanced
            // inside it), and none inside strings.
            let close = closing(open);
            let mut depth = 1usize;
            let mut at = i + 1;
            while let Some(&c) = b.get(at) {
                if c == b'"' {
                    at = string_end(b, at)?;
                    continue;
                }
                if c == open {
                    depth += 1;
                } else if c == close {
                    depth -= 1;
                    if depth == 0 {
                        return Some(at + 1);
                    }
                }
                at += 1;
            }
            None
        }
        // A number or literal: up to the next delimiter.
        _ => Some(
            b.get(i..)?
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']') || is_ws(*c))
                .map_or(b.len(), |n| i + n),
        ),
    }
}

/// The index where the value that ends just before `end` starts.
fn value_start(b: &[u8], end: usize) -> Option<usize> {
    let last = end.checked_sub(1)?;
    match *b.get(last)? {
        b'"' => string_start(b, last),
        close @ (b'}' | b']') => {
            let open = if close == b'}' { b'{' } else { b'[' };
            let mut depth = 1usize;
            let mut at = last;
            while at > 0 {
                at -= 1;
                let c = b[at];
                if c == b'"' {
                    // Outside strings, the first quote met from the right closes a string.
                    at = string_start(b, at)?;
                } else if c == close {
                    depth += 1;
                } else if c == open {
                    depth -= 1;
                    if depth == 0 {
                        return Some(at);
                    }
                }
            }
            None
        }
        _ => Some(
            b.get(..end)?
                .iter()
                .rposition(|c| matches!(c, b':' | b',' | b'[' | b'{') || is_ws(*c))
                .map_or(0, |n| n + 1),
        ),
    }
}

/// One member of an object: its key (quotes included, escapes as written) and where its
/// value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The key's span, quotes included.
    pub key: Range<usize>,
    /// The value's span.
    pub value: Range<usize>,
}

/// The members of the top-level object of `body`, first to last (a repeated name each time).
/// Stops at the end of the object, or where the text is not what valid JSON would hold.
pub(crate) fn members(body: &[u8]) -> impl Iterator<Item = Member> + '_ {
    let open = skip_ws(body, 0);
    // Before the first member: past the `{`; `None`: done.
    let mut at = (body.get(open) == Some(&b'{')).then_some(open + 1);
    let mut first = true;
    std::iter::from_fn(move || {
        let mut i = skip_ws(body, at.take()?);
        if !std::mem::take(&mut first) {
            if body.get(i) != Some(&b',') {
                return None;
            }
            i = skip_ws(body, i + 1);
        }
        if body.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(body, i)?;
        let colon = skip_ws(body, key_end);
        if body.get(colon) != Some(&b':') {
            return None;
        }
        let v = skip_ws(body, colon + 1);
        let v_end = value_end(body, v).filter(|e| *e > v)?;
        at = Some(v_end);
        Some(Member {
            key: i..key_end,
            value: v..v_end,
        })
    })
}

/// The members of the top-level object of `body`, last to first.
fn members_back(body: &[u8]) -> impl Iterator<Item = Member> + '_ {
    // Where the next member from the right ends: just after its value. `None`: done.
    let mut at = skip_ws_back(body, body.len()).filter(|i| body[*i] == b'}');
    let mut last = true;
    std::iter::from_fn(move || {
        let mut i = skip_ws_back(body, at.take()?)?;
        if !std::mem::take(&mut last) {
            if body[i] != b',' {
                return None;
            }
            i = skip_ws_back(body, i)?;
        }
        let v_end = i + 1;
        let v = value_start(body, v_end).filter(|v| *v < v_end)?;
        let colon = skip_ws_back(body, v)?;
        if body[colon] != b':' {
            return None;
        }
        let key_last = skip_ws_back(body, colon)?;
        if body[key_last] != b'"' {
            return None;
        }
        let key = string_start(body, key_last)?;
        at = Some(key);
        Some(Member {
            key: key..key_last + 1,
            value: v..v_end,
        })
    })
}

/// The value of the top-level member of `body` named `name`, when it starts with `kind`
/// (`b'{'` an object, `b'['` an array).
///
/// `body` names each member once (every body the gateway writes: the normaliser keeps a
/// repeated name once, the translators and trees write each once), so the first member found
/// with the name is the one: it is looked for from both ends at once, a member from the
/// front, then one from the back, and so on. The Codex CLI sends `input` third and
/// `client_metadata` last (before the `instructions` the normaliser adds); a body written from
/// a map with sorted keys has `client_metadata` first. Either way, little of the body is read.
pub(crate) fn unique_member(body: &[u8], name: &str, kind: u8) -> Option<Range<usize>> {
    let mut front = members(body);
    let mut back = members_back(body);
    // Where the members looked at from the back begin: when the two walks meet, every
    // member was looked at.
    let mut seen_back = body.len();
    let found = |m: Member| {
        key_is(&body[m.key.clone()], name)
            .then(|| (body.get(m.value.start) == Some(&kind)).then_some(m.value))
    };
    loop {
        let m = front.next().filter(|m| m.value.end <= seen_back)?;
        let seen_front = m.value.end;
        if let Some(v) = found(m) {
            return v;
        }
        let m = back.next().filter(|m| m.key.start >= seen_front)?;
        seen_back = m.key.start;
        if let Some(v) = found(m) {
            return v;
        }
    }
}

/// The items of the array `raw` (a whole array, brackets included), as spans of `raw`.
pub(crate) fn items(raw: &[u8]) -> Items<'_> {
    let open = skip_ws(raw, 0);
    Items {
        raw,
        at: (raw.get(open) == Some(&b'[')).then_some(open + 1),
        first: true,
        complete: false,
    }
}

/// The iterator of [`items`].
pub(crate) struct Items<'a> {
    raw: &'a [u8],
    /// Where the next item (or its comma) is looked for; `None`: done.
    at: Option<usize>,
    first: bool,
    complete: bool,
}

impl Items<'_> {
    /// Whether the walk reached the array's closing bracket (every item was seen).
    pub(crate) fn complete(&self) -> bool {
        self.complete
    }
}

impl Iterator for Items<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        let raw = self.raw;
        let mut i = skip_ws(raw, self.at.take()?);
        if raw.get(i) == Some(&b']') {
            self.complete = true;
            return None;
        }
        if !std::mem::take(&mut self.first) {
            if raw.get(i) != Some(&b',') {
                return None;
            }
            i = skip_ws(raw, i + 1);
        }
        let end = value_end(raw, i)?;
        if end == i {
            return None;
        }
        self.at = Some(end);
        Some(i..end)
    }
}

/// The members of the object `raw` (valid JSON) when it is written as sonic-rs writes a tree
/// (so that a tree read from it and written again gives the same bytes, the order of members
/// aside): no blanks, each name once, and flat: every value a string, `true`, `false`, `null`
/// or an unsigned integer of up to 18 digits; every string (names too) without escapes but
/// `\"` and `\\`. `None`: it is not (the caller goes through the tree).
pub(crate) fn plain_object(raw: &[u8]) -> Option<Vec<Member>> {
    if raw.first() != Some(&b'{') {
        return None;
    }
    // Room for the Codex CLI's turn metadata (22 members) without regrowth.
    let mut out: Vec<Member> = Vec::with_capacity(32);
    let mut i = 1;
    if raw.get(i) == Some(&b'}') {
        return (raw.len() == 2).then_some(out);
    }
    loop {
        if raw.get(i) != Some(&b'"') || out.len() >= 64 {
            return None;
        }
        let key_end = plain_string_end(raw, i)?;
        let key = i..key_end;
        let v = key_end + 1;
        if raw.get(key_end) != Some(&b':')
            || out.iter().any(|o| raw[o.key.clone()] == raw[key.clone()])
        {
            return None;
        }
        let v_end = match *raw.get(v)? {
            b'"' => plain_string_end(raw, v)?,
            b'0'..=b'9' => {
                let digits = raw[v..].iter().take_while(|c| c.is_ascii_digit()).count();
                if digits > 18 || (raw[v] == b'0' && digits > 1) {
                    return None;
                }
                v + digits
            }
            _ => {
                let lit = [&b"true"[..], b"false", b"null"]
                    .into_iter()
                    .find(|l| raw[v..].starts_with(l))?;
                v + lit.len()
            }
        };
        out.push(Member {
            key,
            value: v..v_end,
        });
        match raw.get(v_end) {
            Some(b',') => i = v_end + 1,
            Some(b'}') if v_end + 1 == raw.len() => return Some(out),
            _ => return None,
        }
    }
}

/// The index just past the closing quote of the string that opens at `open`, when it is
/// written as sonic-rs writes it (in valid JSON: no escapes but `\"` and `\\`).
fn plain_string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        let rest = b.get(i..)?;
        let k = memchr::memchr2(b'"', b'\\', rest)?;
        if rest[k] == b'"' {
            return Some(i + k + 1);
        }
        if !matches!(rest.get(k + 1), Some(b'"' | b'\\')) {
            return None;
        }
        i += k + 2;
    }
}

/// Whether `raw` may hold a `\u` escape of an ASCII character (`\u0000` to `\u007F`): the
/// only way JSON text can spell a letter, digit or ASCII sign other than literally (the short
/// escapes stand for quotes, backslashes, slashes and control characters). A search for
/// what must be spelled literally plus this is a sound prefilter for a name or value made of
/// ASCII (an escaped backslash before `u00` is a false hit, never a miss).
pub(crate) fn may_escape_ascii(raw: &[u8]) -> bool {
    static ESCAPE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\u00"));
    ESCAPE
        .find_iter(raw)
        .any(|at| raw.get(at + 4).is_some_and(|d| (b'0'..=b'7').contains(d)))
}

/// Whether the raw key `quoted` (quotes included) names `name`, escapes decoded.
pub(crate) fn key_is(quoted: &[u8], name: &str) -> bool {
    let Some(inner) = quoted
        .strip_prefix(b"\"")
        .and_then(|q| q.strip_suffix(b"\""))
    else {
        return false;
    };
    if memchr::memchr(b'\\', inner).is_none() {
        return inner == name.as_bytes();
    }
    sonic_rs::from_slice::<String>(quoted).is_ok_and(|k| k == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(b: &[u8], spans: impl Iterator<Item = Range<usize>>) -> Vec<&str> {
        spans
            .map(|r| std::str::from_utf8(&b[r]).unwrap_or("?"))
            .collect()
    }

    const BODY: &str = r#" { "a" : 1 , "b\"":"x\\\"y\\" ,"c":{"d":[1,{"e":"}]"}],"f":"{"},"g":[[],[[]],"[\\"],"h":true,"i":-1.5e3,"j":null,"a":{}}  "#;

    #[test]
    fn finds_every_member_both_ways() {
        let b = BODY.as_bytes();
        let fwd: Vec<Member> = members(b).collect();
        assert_eq!(
            texts(b, fwd.iter().map(|m| m.key.clone())),
            [r#""a""#, r#""b\"""#, r#""c""#, r#""g""#, r#""h""#, r#""i""#, r#""j""#, r#""a""#]
        );
        assert_eq!(
            texts(b, fwd.iter().map(|m| m.value.clone())),
            [
                "1",
                r#""x\\\"y\\""#,
                r#"{"d":[1,{"e":"}]"}],"f":"{"}"#,
                r#"[[],[[]],"[\\"]"#,
                "true",
                "-1.5e3",
                "null",
                "{}"
            ]
        );
        let mut back: Vec<Member> = members_back(b).collect();
        back.reverse();
        assert_eq!(back, fwd);
        // Each name once but `a`: found from either end.
        assert_eq!(
            unique_member(b, "c", b'{').map(|r| &BODY[r]),
            Some(r#"{"d":[1,{"e":"}]"}],"f":"{"}"#)
        );
        assert_eq!(unique_member(b, "c", b'['), None);
        assert_eq!(unique_member(b, "nope", b'['), None);
        assert_eq!(
            unique_member(b, "b\"", b'"').map(|r| &BODY[r]),
            Some(r#""x\\\"y\\""#)
        );
        for (name, value) in [("h", "true"), ("i", "-1.5e3"), ("j", "null")] {
            let kind = value.as_bytes()[0];
            assert_eq!(unique_member(b, name, kind).map(|r| &BODY[r]), Some(value));
        }
        let g = unique_member(b, "g", b'[').unwrap_or_default();
        assert_eq!(
            texts(&b[g.clone()], items(&b[g])),
            ["[]", "[[]]", r#""[\\""#]
        );
    }

    #[test]
    fn finds_a_member_anywhere_from_both_ends() {
        for n in 1..7 {
            let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let body = format!(
                "{{{}}}",
                names
                    .iter()
                    .map(|k| format!(r#""{k}":{{"v":"{k}"}}"#))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            for k in &names {
                let found = unique_member(body.as_bytes(), k, b'{').map(|r| &body[r]);
                assert_eq!(found, Some(format!(r#"{{"v":"{k}"}}"#).as_str()), "{body}");
            }
            assert_eq!(unique_member(body.as_bytes(), "none", b'{'), None);
        }
    }

    #[test]
    fn escaped_keys_and_empty_containers() {
        assert!(key_is(br#""client\u005fmetadata""#, "client_metadata"));
        assert!(!key_is(br#""client\u005fmetadatA""#, "client_metadata"));
        assert!(key_is(br#""x""#, "x"));
        assert_eq!(members(b"{}").count(), 0);
        assert_eq!(members_back(b"{ }").count(), 0);
        assert_eq!(items(b"[]").count(), 0);
        let mut it = items(b"[1,2]");
        assert_eq!(it.by_ref().count(), 2);
        assert!(it.complete());
        let mut it = items(b"[1,\"2]");
        assert_eq!(it.by_ref().count(), 1);
        assert!(!it.complete());
        assert_eq!(items(b" [ 1 , \"a\" ] ").count(), 2);
    }

    #[test]
    fn plain_objects_are_what_sonic_writes() {
        let text = |raw: &str| {
            plain_object(raw.as_bytes()).map(|ms| {
                ms.iter()
                    .map(|m| format!("{}={}", &raw[m.key.clone()], &raw[m.value.clone()]))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        assert_eq!(text("{}").as_deref(), Some(""));
        assert_eq!(
            text(r#"{"a":"x\"y\\","b":true,"c":null,"d":0,"e":1796060399216,"f":"é"}"#).as_deref(),
            Some(r#""a"="x\"y\\" "b"=true "c"=null "d"=0 "e"=1796060399216 "f"="é""#)
        );
        for not in [
            r#"{ "a":1}"#,
            r#"{"a" :1}"#,
            r#"{"a": 1}"#,
            r#"{"a":1 }"#,
            r#"{"a":1, "b":2}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":-1}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e3}"#,
            r#"{"a":1234567890123456789}"#,
            r#"{"a":{}}"#,
            r#"{"a":[]}"#,
            r#"{"a":"\n"}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":"\/"}"#,
            r#"{"\u0061":1}"#,
            r#"{"a":1}x"#,
            r#"["a"]"#,
        ] {
            assert_eq!(text(not), None, "{not}");
        }
    }

    #[test]
    fn ascii_escapes() {
        assert!(may_escape_ascii(br#""\u0073ystem""#));
        assert!(may_escape_ascii(br#"x \u007F"#));
        assert!(!may_escape_ascii(br#""caf\u00e9 \ud83d\ude00""#));
        assert!(!may_escape_ascii(br#"\u00"#));
        assert!(!may_escape_ascii(b"plain"));
    }

    #[test]
    fn never_panics_on_text_that_is_not_json() {
        for t in [
            "",
            "{",
            "}",
            "\"",
            "{\"a\"",
            "{\"a\":",
            "{\"a\":[",
            "{\"a\":\"\\",
            "[",
            "[1,",
            "{,}",
            "{\"a\":1,}",
            "x",
            "{\"a\"1}",
            "\\\"}",
            "{:1}",
            "{\"a\":}",
            "]",
            "[\"",
        ] {
            let b = t.as_bytes();
            let _ = members(b).count();
            let _ = members_back(b).count();
            let _ = items(b).count();
            let _ = unique_member(b, "a", b'[');
            for i in 0..=b.len() {
                let _ = value_end(b, i);
                let _ = value_start(b, i);
            }
        }
    }
}
