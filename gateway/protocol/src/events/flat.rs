//! The two fields the pipeline reads from whole response objects, in one flat pass each,
//! without a tree: `response.usage` of the terminal event, `response.id` of
//! `response.created`.
//!
//! The terminal event repeats the whole response (every output item, the answer's text), and
//! its usage comes last. Reading it used to take three passes over all of it: the nesting
//! check ([`crate::depth`]), sonic-rs's validating `get` of `["response","usage"]`, and a tree
//! of the usage object. [`usage`] does it in one: a validating scan that bounds the nesting as
//! it goes, stops at the value of `response.usage` (the first `response` key of the top
//! object, the first `usage` key in it, as `get` finds them), reads the five counters from
//! that small span, and only measures the nesting of the rest. [`response_id`] is the same
//! scan stopping at `response.id`.
//!
//! # Error handling
//! Both answer only where the answer is certainly the tree reader's: the text up to the end
//! of the value is strict JSON (no control byte or bad escape in a string, numbers and
//! literals well formed), the keys on the path are unescaped, and so is what is read from the
//! value (the id; the keys of the usage object, whose numbers are plain integers of at most
//! 19 digits). Anything else is [`Unsure`], and the caller reads the event with the tree
//! reader as before. For the usage, a text nested past [`MAX_DEPTH`] is `None`, as the depth
//! check answers.

use super::Usage;
use crate::depth::{self, MAX_DEPTH};

/// The fast reader cannot vouch for its answer: the caller reads the event the slow way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unsure;

/// Why a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// See [`Unsure`].
    Unsure,
    /// Nested past [`MAX_DEPTH`]: the depth check refuses the text.
    Deep,
}

type Scanned<T> = Result<T, Stop>;

/// The usage of a terminal event's data (`Ok(None)`: none, or the event is refused), or
/// [`Unsure`].
pub(super) fn usage(data: &[u8]) -> Result<Option<Usage>, Unsure> {
    let mut notes = Notes::default();
    let (start, end) = match find(data, b"response", b"usage", &mut notes) {
        Ok(Some(span)) => span,
        Ok(None) | Err(Stop::Deep) => return Ok(None),
        Err(Stop::Unsure) => return Err(Unsure),
    };
    check_utf8(data, end, &notes)?;
    let usage = counters(&data[start..end]).map_err(|_| Unsure)?;
    // The rest is only measured: the value sits inside `response`, two levels down.
    if !depth::within_from(&data[end..], 2, MAX_DEPTH) {
        return Ok(None);
    }
    Ok(Some(usage))
}

/// The text of `response.id` (`Ok(None)`: none, or not a string), or [`Unsure`]: what
/// sonic-rs's `get` of `["response","id"]` and its `as_str` give.
pub(super) fn response_id(data: &[u8]) -> Result<Option<&str>, Unsure> {
    let mut notes = Notes::default();
    let (start, end) = match find(data, b"response", b"id", &mut notes) {
        Ok(Some(span)) => span,
        Ok(None) => return Ok(None),
        // That `get` has no depth check of its own: whatever it makes of a deep text is its
        // answer.
        Err(Stop::Deep | Stop::Unsure) => return Err(Unsure),
    };
    check_utf8(data, end, &notes)?;
    let Some(text) = data[start..end]
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
    else {
        return Ok(None);
    };
    if memchr::memchr(b'\\', text).is_some() {
        return Err(Unsure);
    }
    std::str::from_utf8(text).map(Some).map_err(|_| Unsure)
}

/// `get` validates the UTF-8 of the text up to the end of the value it returns: only strings
/// may hold bytes past ASCII (the grammar refuses them anywhere else), so a text whose strings
/// held none needs no check.
fn check_utf8(data: &[u8], end: usize, notes: &Notes) -> Result<(), Unsure> {
    if notes.high & HIGH != 0 && simdutf8::basic::from_utf8(&data[..end]).is_err() {
        return Err(Unsure);
    }
    Ok(())
}

/// The span of the value of `outer.inner`, or `None` where sonic-rs's validating `get` finds
/// none (the top is not an object, `outer` is missing or not an object, `inner` is missing).
/// The first key of each name is the one read, as `get` reads it; the keys compared (every
/// key of the top object, and of `outer` up to `inner`) must be unescaped, as `get` compares
/// them unescaped.
fn find(
    s: &[u8],
    outer: &[u8],
    inner: &[u8],
    notes: &mut Notes,
) -> Scanned<Option<(usize, usize)>> {
    let mut i = 0;
    if byte(s, &mut i) != Ok(b'{') {
        return Ok(None);
    }
    i += 1;
    // The members of the top object (level 1), then of `outer` (level 2).
    let mut level = 1;
    let mut first = true;
    loop {
        let b = byte(s, &mut i)?;
        if first && b == b'}' {
            // An empty object.
            return Ok(None);
        }
        first = false;
        if b != b'"' {
            return Err(Stop::Unsure);
        }
        let (end, escaped) = string_end(s, i, notes)?;
        if escaped {
            return Err(Stop::Unsure);
        }
        let key = &s[i + 1..end - 1];
        i = end;
        if byte(s, &mut i)? != b':' {
            return Err(Stop::Unsure);
        }
        i += 1;
        let b = byte(s, &mut i)?;
        if level == 1 && key == outer {
            if b != b'{' {
                return Ok(None);
            }
            i += 1;
            level = 2;
            first = true;
            continue;
        }
        let start = i;
        i = skip(s, i, level, notes)?;
        if level == 2 && key == inner {
            return Ok(Some((start, i)));
        }
        match byte(s, &mut i)? {
            b',' => i += 1,
            b'}' => return Ok(None),
            _ => return Err(Stop::Unsure),
        }
    }
}

/// Counter slots, in the order of [`Usage`]'s fields.
const INPUT: usize = 0;
const CACHED: usize = 1;
const OUTPUT: usize = 2;
const REASONING: usize = 3;
const TOTAL: usize = 4;
/// Bits of the two `*_details` objects among the names seen.
const INPUT_DETAILS: usize = 5;
const OUTPUT_DETAILS: usize = 6;

/// The five counters of a usage value (already validated by the scan that found it). A
/// counter that is absent or not a number is 0, as the tree reader's `as_u64` gives it.
fn counters(span: &[u8]) -> Scanned<Usage> {
    let mut notes = Notes::default();
    let mut n = [0u64; 5];
    let mut seen = 0u8;
    let mut i = 0;
    if byte(span, &mut i)? != b'{' {
        // Not an object: every counter is 0 (what the value holds still decides below
        // whether the tree reader reads it).
        skip(span, i, 0, &mut notes)?;
        return finish(n, &notes);
    }
    i += 1;
    members(span, &mut i, &mut notes, |key, i, notes| {
        let (slot, details) = match key {
            b"input_tokens" => (INPUT, None),
            b"output_tokens" => (OUTPUT, None),
            b"total_tokens" => (TOTAL, None),
            b"input_tokens_details" => (INPUT_DETAILS, Some((&b"cached_tokens"[..], CACHED))),
            b"output_tokens_details" => {
                (OUTPUT_DETAILS, Some((&b"reasoning_tokens"[..], REASONING)))
            }
            _ => {
                *i = skip(span, *i, 1, notes)?;
                return Ok(());
            }
        };
        once(&mut seen, slot)?;
        match details {
            None => *i = counter(span, *i, &mut n[slot], notes)?,
            Some((name, slot)) if span[*i] == b'{' => {
                *i += 1;
                members(span, i, notes, |key, i, notes| {
                    if key == name {
                        once(&mut seen, slot)?;
                        *i = counter(span, *i, &mut n[slot], notes)?;
                    } else {
                        *i = skip(span, *i, 2, notes)?;
                    }
                    Ok(())
                })?;
            }
            Some(_) => *i = skip(span, *i, 1, notes)?,
        }
        Ok(())
    })?;
    finish(n, &notes)
}

/// The first of its name (the tree reader's choice between duplicates is its own).
fn once(seen: &mut u8, bit: usize) -> Scanned<()> {
    if *seen & (1 << bit) != 0 {
        return Err(Stop::Unsure);
    }
    *seen |= 1 << bit;
    Ok(())
}

/// A counter's value at `i`: a plain integer into `n`, anything else leaves it 0. The index
/// after it.
fn counter(s: &[u8], i: usize, n: &mut u64, notes: &mut Notes) -> Scanned<usize> {
    if !matches!(s[i], b'-' | b'0'..=b'9') {
        return skip(s, i, 1, notes);
    }
    let (end, v) = number_end(s, i, notes)?;
    *n = v.unwrap_or(0);
    Ok(end)
}

/// The members of the object whose `{` is just behind `*i`, up to its `}`: `member` reads or
/// skips each value (the cursor at its first byte), given the key (escaped keys are
/// [`Stop::Unsure`]: the tree reader compares them unescaped).
fn members(
    s: &[u8],
    i: &mut usize,
    notes: &mut Notes,
    mut member: impl FnMut(&[u8], &mut usize, &mut Notes) -> Scanned<()>,
) -> Scanned<()> {
    if byte(s, i)? == b'}' {
        *i += 1;
        return Ok(());
    }
    loop {
        if byte(s, i)? != b'"' {
            return Err(Stop::Unsure);
        }
        let (end, escaped) = string_end(s, *i, notes)?;
        if escaped {
            return Err(Stop::Unsure);
        }
        let key = &s[*i + 1..end - 1];
        *i = end;
        if byte(s, i)? != b':' {
            return Err(Stop::Unsure);
        }
        *i += 1;
        byte(s, i)?;
        member(key, i, notes)?;
        match byte(s, i)? {
            b',' => *i += 1,
            b'}' => {
                *i += 1;
                return Ok(());
            }
            _ => return Err(Stop::Unsure),
        }
    }
}

/// The usage from its counters, unless the usage value holds what the tree reader may read
/// differently (or refuse): escapes, numbers other than plain integers.
fn finish(n: [u64; 5], notes: &Notes) -> Scanned<Usage> {
    if notes.escaped || notes.odd_number {
        return Err(Stop::Unsure);
    }
    let total = if n[TOTAL] == 0 {
        n[INPUT].wrapping_add(n[OUTPUT])
    } else {
        n[TOTAL]
    };
    Ok(Usage {
        input_tokens: n[INPUT],
        cached_tokens: n[CACHED],
        output_tokens: n[OUTPUT],
        reasoning_tokens: n[REASONING],
        total_tokens: total,
    })
}

/// Strings at least this long leave the word-at-a-time search for memchr.
const LONG: usize = 64;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` that is a quote, a backslash or a control byte, as far
/// as the first of them (the bits above it may be wrong; the lowest one is exact).
#[inline]
fn specials(x: u64) -> u64 {
    let zero = |v: u64| v.wrapping_sub(ONES) & !v;
    let quote = zero(x ^ (ONES * u64::from(b'"')));
    let backslash = zero(x ^ (ONES * u64::from(b'\\')));
    let control = x.wrapping_sub(ONES * 0x20) & !x;
    (quote | backslash | control) & HIGH
}

/// The smallest byte of `run` and all its bytes OR-ed (in 16-byte lanes the compiler turns
/// into vector instructions).
fn min_and_or(run: &[u8]) -> (u8, u8) {
    let mut min = [u8::MAX; 16];
    let mut or = [0u8; 16];
    let mut chunks = run.chunks_exact(16);
    for c in &mut chunks {
        for j in 0..16 {
            min[j] = min[j].min(c[j]);
            or[j] |= c[j];
        }
    }
    let tail = chunks.remainder();
    let lo = min.iter().chain(tail).fold(u8::MAX, |a, &b| a.min(b));
    let hi = or.iter().chain(tail).fold(0, |a, &b| a | b);
    (lo, hi)
}

/// What a skip saw that matters to its caller.
#[derive(Debug, Default, Clone, Copy)]
struct Notes {
    /// The words read in strings OR-ed together: a set high bit is a byte past ASCII, maybe
    /// (a word may run a few bytes past its string).
    high: u64,
    escaped: bool,
    odd_number: bool,
}

/// The next byte at or after `*i` that is not JSON whitespace (not consumed); the end of the
/// text is malformed.
#[inline(always)]
fn byte(s: &[u8], i: &mut usize) -> Scanned<u8> {
    loop {
        let b = *s.get(*i).ok_or(Stop::Unsure)?;
        if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            return Ok(b);
        }
        *i += 1;
    }
}

/// An object key at `i` (whitespace first) with its colon; the index after the colon.
#[inline(always)]
fn skip_key(s: &[u8], mut i: usize, notes: &mut Notes) -> Scanned<usize> {
    if byte(s, &mut i)? != b'"' {
        return Err(Stop::Unsure);
    }
    i = string_end(s, i, notes)?.0;
    if byte(s, &mut i)? != b':' {
        return Err(Stop::Unsure);
    }
    Ok(i + 1)
}

/// Skips the value at `i` (whitespace first), checking its grammar, without recursion; the
/// index after it. `depth` is the nesting around it (containers past [`MAX_DEPTH`] are
/// [`Stop::Deep`]).
fn skip(s: &[u8], mut i: usize, depth: usize, notes: &mut Notes) -> Scanned<usize> {
    // Levels opened inside the value: bit `d - 1` set when level `d` is an object.
    let room = MAX_DEPTH.saturating_sub(depth);
    let mut open = 0usize;
    let mut objects = 0u128;
    loop {
        // A value starts here.
        match byte(s, &mut i)? {
            b'"' => i = string_end(s, i, notes)?.0,
            b @ (b'{' | b'[') => {
                if open == room {
                    return Err(Stop::Deep);
                }
                i += 1;
                let close = b + 2; // `}` or `]`
                if byte(s, &mut i)? == close {
                    i += 1;
                } else {
                    let bit = 1u128 << open;
                    open += 1;
                    if b == b'{' {
                        objects |= bit;
                        i = skip_key(s, i, notes)?;
                    } else {
                        objects &= !bit;
                    }
                    continue;
                }
            }
            b'-' | b'0'..=b'9' => i = number_end(s, i, notes)?.0,
            b't' => i = literal_end(s, i, b"true")?,
            b'f' => i = literal_end(s, i, b"false")?,
            b'n' => i = literal_end(s, i, b"null")?,
            _ => return Err(Stop::Unsure),
        }
        // After a value: close what ends here, up to the next member or element.
        loop {
            if open == 0 {
                return Ok(i);
            }
            let object = objects & (1u128 << (open - 1)) != 0;
            match byte(s, &mut i)? {
                b',' => {
                    i += 1;
                    if object {
                        i = skip_key(s, i, notes)?;
                    }
                    break;
                }
                b'}' if object => {
                    i += 1;
                    open -= 1;
                }
                b']' if !object => {
                    i += 1;
                    open -= 1;
                }
                _ => return Err(Stop::Unsure),
            }
        }
    }
}

/// The string whose opening quote is at `i`: the index after its closing quote, and whether
/// it held an escape (noted too). A control byte or a bad escape is [`Stop::Unsure`].
#[inline(always)]
fn string_end(s: &[u8], mut i: usize, notes: &mut Notes) -> Scanned<(usize, bool)> {
    let mut escaped = false;
    i += 1;
    loop {
        i = special(s, i, notes)?;
        match s[i] {
            b'"' => {
                notes.escaped |= escaped;
                return Ok((i + 1, escaped));
            }
            b'\\' => {
                escaped = true;
                match s.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                    Some(b'u')
                        if s.get(i + 2..i + 6)
                            .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                    {
                        i += 6
                    }
                    _ => return Err(Stop::Unsure),
                }
            }
            // A control byte, raw.
            _ => return Err(Stop::Unsure),
        }
    }
}

/// The index of the first quote, backslash or control byte at or after `i` (none before the
/// end is [`Stop::Unsure`]), noting bytes past ASCII on the way (of the words read: a few
/// bytes after the string may count, which only costs a UTF-8 check). Eight bytes at a time
/// in a word (the short strings most of an event is made of); past [`LONG`] bytes, memchr
/// (SIMD) finds the quote or backslash and a vectorised pass checks the run.
#[inline(always)]
fn special(s: &[u8], mut i: usize, notes: &mut Notes) -> Scanned<usize> {
    let start = i;
    while let Some(w) = s.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*w);
        notes.high |= x;
        let m = specials(x);
        if m != 0 {
            return Ok(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
        if i - start >= LONG {
            return special_long(s, i, notes);
        }
    }
    special_short(s, i, notes)
}

/// [`special`] for the last bytes of the text, fewer than a word.
#[cold]
fn special_short(s: &[u8], mut i: usize, notes: &mut Notes) -> Scanned<usize> {
    while let Some(&b) = s.get(i) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return Ok(i);
        }
        notes.high |= u64::from(b);
        i += 1;
    }
    Err(Stop::Unsure)
}

/// [`special`] for the rest of a long string.
#[cold]
fn special_long(s: &[u8], i: usize, notes: &mut Notes) -> Scanned<usize> {
    let rest = s.get(i..).ok_or(Stop::Unsure)?;
    let k = memchr::memchr2(b'"', b'\\', rest).ok_or(Stop::Unsure)?;
    let (min, or) = min_and_or(&rest[..k]);
    if min < 0x20 {
        // A control byte, raw, before the quote or backslash.
        return Err(Stop::Unsure);
    }
    notes.high |= u64::from(or);
    Ok(i + k)
}

/// The number at `i`: the index after it, and its value when it is a plain integer of at most
/// 19 digits (below `u64::MAX`; any other is noted as odd).
#[inline(always)]
fn number_end(s: &[u8], mut i: usize, notes: &mut Notes) -> Scanned<(usize, Option<u64>)> {
    let negative = s.get(i) == Some(&b'-');
    if negative {
        i += 1;
    }
    let digits = i;
    let mut v = 0u64;
    match s.get(i) {
        // No leading zeros.
        Some(b'0') if matches!(s.get(i + 1), Some(b'0'..=b'9')) => return Err(Stop::Unsure),
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            while let Some(&d @ b'0'..=b'9') = s.get(i) {
                v = v.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
                i += 1;
            }
        }
        _ => return Err(Stop::Unsure),
    }
    let mut plain = !negative && i - digits <= 19;
    if s.get(i) == Some(&b'.') {
        plain = false;
        i = digits_end(s, i + 1)?;
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        plain = false;
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits_end(s, i)?;
    }
    if plain {
        Ok((i, Some(v)))
    } else {
        notes.odd_number = true;
        Ok((i, None))
    }
}

/// One or more digits from `i`; the index after them.
fn digits_end(s: &[u8], mut i: usize) -> Scanned<usize> {
    if !matches!(s.get(i), Some(b'0'..=b'9')) {
        return Err(Stop::Unsure);
    }
    while matches!(s.get(i), Some(b'0'..=b'9')) {
        i += 1;
    }
    Ok(i)
}

/// The literal `word` at `i`: the index after it.
#[inline(always)]
fn literal_end(s: &[u8], i: usize, word: &[u8]) -> Scanned<usize> {
    if s.get(i..i + word.len()) != Some(word) {
        return Err(Stop::Unsure);
    }
    Ok(i + word.len())
}

#[cfg(test)]
mod tests;
