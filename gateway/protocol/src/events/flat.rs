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

impl From<Unsure> for Stop {
    fn from(_: Unsure) -> Self {
        Stop::Unsure
    }
}

type Scanned<T> = Result<T, Stop>;

/// The usage of a terminal event's data (`Ok(None)`: none, or the event is refused), or
/// [`Unsure`].
pub(super) fn usage(data: &[u8]) -> Result<Option<Usage>, Unsure> {
    let mut s = Scan::new(data);
    let span = match find(&mut s, b"response", b"usage") {
        Ok(Some(span)) => span,
        Ok(None) | Err(Stop::Deep) => return Ok(None),
        Err(Stop::Unsure) => return Err(Unsure),
    };
    s.check_utf8(span.1)?;
    let usage = match counters(&data[span.0..span.1]) {
        Ok(u) => u,
        Err(Stop::Unsure | Stop::Deep) => return Err(Unsure),
    };
    // The rest is only measured: the value sits inside `response`, two levels down.
    if !depth::within_from(&data[span.1..], s.depth, MAX_DEPTH) {
        return Ok(None);
    }
    Ok(Some(usage))
}

/// The text of `response.id` (`Ok(None)`: none, or not a string), or [`Unsure`]: what
/// sonic-rs's `get` of `["response","id"]` and its `as_str` give.
pub(super) fn response_id(data: &[u8]) -> Result<Option<&str>, Unsure> {
    let mut s = Scan::new(data);
    let (start, end) = match find(&mut s, b"response", b"id") {
        Ok(Some(span)) => span,
        Ok(None) => return Ok(None),
        // That `get` has no depth check of its own: whatever it makes of a deep text is its
        // answer.
        Err(Stop::Deep | Stop::Unsure) => return Err(Unsure),
    };
    s.check_utf8(end)?;
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

/// The span of the value of `outer.inner`, or `None` where sonic-rs's validating `get` finds
/// none (the top is not an object, `outer` is missing or not an object, `inner` is missing).
/// The first key of each name is the one read, as `get` reads it.
fn find(s: &mut Scan<'_>, outer: &[u8], inner: &[u8]) -> Scanned<Option<(usize, usize)>> {
    if s.peek_ws() != Some(b'{') {
        return Ok(None);
    }
    s.open(true)?;
    if s.next_ws()? == b'}' {
        return Ok(None);
    }
    loop {
        if s.key()? == outer {
            if s.next_ws()? != b'{' {
                return Ok(None);
            }
            s.open(true)?;
            if s.next_ws()? == b'}' {
                return Ok(None);
            }
            loop {
                if s.key()? == inner {
                    s.next_ws()?;
                    let start = s.i;
                    s.value()?;
                    return Ok(Some((start, s.i)));
                }
                s.value()?;
                if !s.member_follows()? {
                    return Ok(None);
                }
            }
        }
        s.value()?;
        if !s.member_follows()? {
            return Ok(None);
        }
    }
}

/// Counter slots, in the order of [`Usage`]'s fields.
const INPUT: usize = 0;
const CACHED: usize = 1;
const OUTPUT: usize = 2;
const REASONING: usize = 3;
const TOTAL: usize = 4;

/// The five counters of a usage value (already validated by the scan that found it). A
/// counter that is absent or not a number is 0, as the tree reader's `as_u64` gives it.
fn counters(span: &[u8]) -> Scanned<Usage> {
    let mut s = Scan::new(span);
    let mut n = [0u64; 5];
    let mut seen = 0u8;
    if s.next_ws()? == b'{' {
        s.open(true)?;
        if s.next_ws()? != b'}' {
            loop {
                match s.key()? {
                    b"input_tokens" => s.counter(&mut n, &mut seen, INPUT)?,
                    b"output_tokens" => s.counter(&mut n, &mut seen, OUTPUT)?,
                    b"total_tokens" => s.counter(&mut n, &mut seen, TOTAL)?,
                    b"input_tokens_details" => {
                        s.details(&mut n, &mut seen, 5, b"cached_tokens", CACHED)?
                    }
                    b"output_tokens_details" => {
                        s.details(&mut n, &mut seen, 6, b"reasoning_tokens", REASONING)?
                    }
                    _ => s.value()?,
                }
                if !s.member_follows()? {
                    break;
                }
            }
        }
    } else {
        s.value()?;
    }
    // The tree reader builds its tree from the span: escapes and numbers it might read
    // differently (or refuse) are left to it.
    if s.escaped || s.odd_number {
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

/// A flat, validating JSON scanner: no recursion (open containers are bits of a mask).
struct Scan<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
    /// Bit `d - 1` is set when the container open at depth `d` is an object.
    objects: u128,
    /// The bytes of strings OR-ed together (a set high bit: a byte past ASCII, maybe).
    high: u64,
    /// A string held an escape.
    escaped: bool,
    /// A number other than a plain integer of at most 19 digits.
    odd_number: bool,
}

// === impl Scan ===

impl<'a> Scan<'a> {
    fn new(s: &'a [u8]) -> Self {
        Self {
            s,
            i: 0,
            depth: 0,
            objects: 0,
            high: 0,
            escaped: false,
            odd_number: false,
        }
    }

    /// `get` validates the UTF-8 of the text up to the end of the value it returns: only
    /// strings may hold bytes past ASCII (the grammar refuses them anywhere else), so a text
    /// whose strings held none needs no check.
    fn check_utf8(&self, end: usize) -> Result<(), Unsure> {
        if self.high & HIGH != 0 && simdutf8::basic::from_utf8(&self.s[..end]).is_err() {
            return Err(Unsure);
        }
        Ok(())
    }

    /// The next byte that is not JSON whitespace (not consumed), `None` at the end.
    #[inline]
    fn peek_ws(&mut self) -> Option<u8> {
        loop {
            let b = *self.s.get(self.i)?;
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(b);
            }
            self.i += 1;
        }
    }

    /// [`Scan::peek_ws`], where the end of the text is malformed.
    #[inline]
    fn next_ws(&mut self) -> Scanned<u8> {
        self.peek_ws().ok_or(Stop::Unsure)
    }

    /// Consumes the `{` or `[` at the cursor.
    #[inline]
    fn open(&mut self, object: bool) -> Scanned<()> {
        self.i += 1;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Stop::Deep);
        }
        let bit = 1u128 << (self.depth - 1);
        if object {
            self.objects |= bit;
        } else {
            self.objects &= !bit;
        }
        Ok(())
    }

    #[inline]
    fn in_object(&self) -> bool {
        self.depth > 0 && self.objects & (1u128 << (self.depth - 1)) != 0
    }

    /// An object key and its colon; the key's bytes, as they are written.
    fn any_key(&mut self) -> Scanned<(&'a [u8], bool)> {
        if self.next_ws()? != b'"' {
            return Err(Stop::Unsure);
        }
        let start = self.i + 1;
        let escaped = self.string()?;
        let key = &self.s[start..self.i - 1];
        if self.next_ws()? != b':' {
            return Err(Stop::Unsure);
        }
        self.i += 1;
        Ok((key, escaped))
    }

    /// [`Scan::any_key`] where the key is compared: an escaped one is [`Stop::Unsure`] (the
    /// tree reader compares keys unescaped).
    fn key(&mut self) -> Scanned<&'a [u8]> {
        match self.any_key()? {
            (key, false) => Ok(key),
            (_, true) => Err(Stop::Unsure),
        }
    }

    /// After a member of the object open at the cursor's level: `true` at a comma (consumed),
    /// `false` at the closing brace (consumed, the level closed).
    fn member_follows(&mut self) -> Scanned<bool> {
        match self.next_ws()? {
            b',' => {
                self.i += 1;
                Ok(true)
            }
            b'}' => {
                self.i += 1;
                self.depth -= 1;
                Ok(false)
            }
            _ => Err(Stop::Unsure),
        }
    }

    /// Skips the string whose opening quote is at the cursor; whether it held an escape.
    fn string(&mut self) -> Scanned<bool> {
        let s = self.s;
        let mut i = self.i + 1;
        let mut escaped = false;
        loop {
            i = self.special(i)?;
            match s[i] {
                b'"' => {
                    self.i = i + 1;
                    self.escaped |= escaped;
                    return Ok(escaped);
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

    /// The index of the first quote, backslash or control byte at or after `i` (none before
    /// the end is [`Stop::Unsure`]), noting bytes past ASCII on the way. Eight bytes at a
    /// time in a word (the short strings most of an event is made of); past [`LONG`] bytes,
    /// memchr (SIMD) finds the quote or backslash and a vectorised pass checks the run.
    #[inline]
    fn special(&mut self, mut i: usize) -> Scanned<usize> {
        let s = self.s;
        let start = i;
        while let Some(w) = s.get(i..).and_then(<[u8]>::first_chunk::<8>) {
            let x = u64::from_le_bytes(*w);
            let m = specials(x);
            if m != 0 {
                let k = (m.trailing_zeros() / 8) as usize;
                // Only the bytes before it are the string's.
                self.high |= x & ((1u64 << (8 * k)) - 1);
                return Ok(i + k);
            }
            self.high |= x;
            i += 8;
            if i - start >= LONG {
                return self.special_long(i);
            }
        }
        while let Some(&b) = s.get(i) {
            if b == b'"' || b == b'\\' || b < 0x20 {
                return Ok(i);
            }
            self.high |= u64::from(b);
            i += 1;
        }
        Err(Stop::Unsure)
    }

    /// [`Scan::special`] for the rest of a long string.
    fn special_long(&mut self, i: usize) -> Scanned<usize> {
        let rest = self.s.get(i..).ok_or(Stop::Unsure)?;
        let k = memchr::memchr2(b'"', b'\\', rest).ok_or(Stop::Unsure)?;
        let (min, or) = min_and_or(&rest[..k]);
        if min < 0x20 {
            // A control byte, raw, before the quote or backslash.
            return Err(Stop::Unsure);
        }
        self.high |= u64::from(or);
        Ok(i + k)
    }

    /// Skips the number at the cursor; its value when it is a plain integer of at most 19
    /// digits (below `u64::MAX`), else `None` (and the scan remembers an odd number).
    fn number(&mut self) -> Scanned<Option<u64>> {
        let s = self.s;
        let start = self.i;
        let mut i = start;
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
        let plain = !negative && i - digits <= 19;
        let mut fraction = false;
        if s.get(i) == Some(&b'.') {
            fraction = true;
            i += 1;
            i = Self::digits(s, i)?;
        }
        if matches!(s.get(i), Some(b'e' | b'E')) {
            fraction = true;
            i += 1;
            if matches!(s.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            i = Self::digits(s, i)?;
        }
        self.i = i;
        if plain && !fraction {
            Ok(Some(v))
        } else {
            self.odd_number = true;
            Ok(None)
        }
    }

    /// One or more digits from `i`; the index after them.
    fn digits(s: &[u8], mut i: usize) -> Scanned<usize> {
        if !matches!(s.get(i), Some(b'0'..=b'9')) {
            return Err(Stop::Unsure);
        }
        while matches!(s.get(i), Some(b'0'..=b'9')) {
            i += 1;
        }
        Ok(i)
    }

    fn literal(&mut self, word: &[u8]) -> Scanned<()> {
        if self.s.get(self.i..self.i + word.len()) != Some(word) {
            return Err(Stop::Unsure);
        }
        self.i += word.len();
        Ok(())
    }

    /// Skips one value (after optional whitespace), checking its grammar, without recursion.
    fn value(&mut self) -> Scanned<()> {
        let base = self.depth;
        loop {
            // A value starts here.
            match self.next_ws()? {
                b'{' => {
                    self.open(true)?;
                    if self.next_ws()? == b'}' {
                        self.i += 1;
                        self.depth -= 1;
                    } else {
                        self.any_key()?;
                        continue;
                    }
                }
                b'[' => {
                    self.open(false)?;
                    if self.next_ws()? == b']' {
                        self.i += 1;
                        self.depth -= 1;
                    } else {
                        continue;
                    }
                }
                b'"' => {
                    self.string()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => {
                    self.number()?;
                }
                _ => return Err(Stop::Unsure),
            }
            // After a value: close what ends here, up to the next member or element.
            loop {
                if self.depth == base {
                    return Ok(());
                }
                let object = self.in_object();
                match self.next_ws()? {
                    b',' => {
                        self.i += 1;
                        if object {
                            self.any_key()?;
                        }
                        break;
                    }
                    b'}' if object => {
                        self.i += 1;
                        self.depth -= 1;
                    }
                    b']' if !object => {
                        self.i += 1;
                        self.depth -= 1;
                    }
                    _ => return Err(Stop::Unsure),
                }
            }
        }
    }

    /// The value of a counter into `n[slot]` (a second one of the same name is
    /// [`Stop::Unsure`]: the tree reader's choice between duplicates is its own).
    fn counter(&mut self, n: &mut [u64; 5], seen: &mut u8, slot: usize) -> Scanned<()> {
        if *seen & (1 << slot) != 0 {
            return Err(Stop::Unsure);
        }
        *seen |= 1 << slot;
        if matches!(self.next_ws()?, b'-' | b'0'..=b'9') {
            if let Some(v) = self.number()? {
                n[slot] = v;
            }
            Ok(())
        } else {
            self.value()
        }
    }

    /// A `*_details` object: its counter `name` into `n[slot]`; `mark` is the object's own
    /// bit in `seen`.
    fn details(
        &mut self,
        n: &mut [u64; 5],
        seen: &mut u8,
        mark: usize,
        name: &[u8],
        slot: usize,
    ) -> Scanned<()> {
        if *seen & (1 << mark) != 0 {
            return Err(Stop::Unsure);
        }
        *seen |= 1 << mark;
        if self.next_ws()? != b'{' {
            return self.value();
        }
        self.open(true)?;
        if self.next_ws()? == b'}' {
            self.i += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            if self.key()? == name {
                self.counter(n, seen, slot)?;
            } else {
                self.value()?;
            }
            if !self.member_follows()? {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests;
