//! Client `/v1/responses` body -> the body the Codex backend accepts
//! (docs/protocol.md#request-bodies).
//!
//! # Key Components
//! - [`normalize_responses`]: one strict pass over the client body's top-level fields, then the
//!   upstream body written from the client's own bytes with only the fields that change
//!   rewritten (no tree of the whole body); returns it and the fields routing and usage need
//!   ([`Normalized`]).
//! - [`DROPPED_FIELDS`]: parameters the backend rejects with "Unsupported parameter".
//!
//! # Error handling
//! Malformed bodies give a [`NormalizeError`] that the gateway maps to a 400
//! `invalid_request_error` naming the offending `param`.

use sonic_rs::{JsonValueMutTrait, JsonValueTrait, Value};

/// Parameters the Codex backend rejects; dropped before sending.
pub const DROPPED_FIELDS: &[&str] = &[
    "max_output_tokens",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "n",
    "seed",
    "stop",
    "user",
    "logit_bias",
    "metadata",
    "stream_options",
    "truncation",
    "context_management",
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "disable_response_storage",
    "background",
];

/// The body fields that carry a client's session, in the order they count (the first
/// non-empty string): the one list for every reader of a body's session signal.
pub const SESSION_FIELDS: [&str; 2] = ["session_id", "conversation_id"];

/// A normalized request.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    /// The body to send upstream.
    pub body: Vec<u8>,
    /// The requested model.
    pub model: String,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// A `previous_response_id` the client sent (not forwarded over HTTP).
    pub previous_response_id: Option<String>,
    /// The client's `prompt_cache_key`, an affinity signal.
    pub prompt_cache_key: Option<String>,
    /// The client's `store` (`None`: absent or not a boolean); the body sent says `false`.
    pub store: Option<bool>,
    /// The client body's session signal for affinity: the first of [`SESSION_FIELDS`] that is
    /// a non-empty string.
    pub session: Option<String>,
    /// What the body sent upstream asks for (usage records it).
    pub asked: Asked,
}

/// What a normalised upstream body asks for, as usage records it: `reasoning.effort` and
/// `service_tier` (non-empty strings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// `reasoning.effort`.
    pub reasoning_effort: Option<String>,
    /// `service_tier`.
    pub service_tier: Option<String>,
}

// === impl Asked ===

impl Asked {
    /// Reads both fields from a normalised body (one scan, with a tree of paths built once per
    /// thread). For bodies built by a translator; [`normalize_responses_with`] reads them in
    /// its own pass.
    pub fn of_body(body: &[u8]) -> Self {
        thread_local! {
            static PATHS: sonic_rs::PointerTree = {
                let mut t = sonic_rs::PointerTree::new();
                t.add_path(["reasoning", "effort"]);
                t.add_path(["service_tier"]);
                t
            };
        }
        let text = |v: Option<sonic_rs::LazyValue<'_>>| {
            v.and_then(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
        };
        match PATHS.with(|t| sonic_rs::get_many(body, t)) {
            Ok(found) => {
                let mut found = found.into_iter();
                Self {
                    reasoning_effort: text(found.next().flatten()),
                    service_tier: text(found.next().flatten()),
                }
            }
            // `get_many` fails as a whole when a path runs through a non-object (say
            // `"reasoning": true`): read each field on its own then.
            Err(_) => Self {
                reasoning_effort: text(sonic_rs::get(body, ["reasoning", "effort"]).ok()),
                service_tier: text(sonic_rs::get(body, ["service_tier"]).ok()),
            },
        }
    }
}

/// Why a body cannot be normalized.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct NormalizeError {
    /// Human message.
    pub message: String,
    /// The offending parameter.
    pub param: Option<&'static str>,
    /// The requested model is unknown (the caller answers 404 `model_not_found`).
    pub unknown_model: Option<String>,
}

fn err(message: impl Into<String>, param: Option<&'static str>) -> NormalizeError {
    NormalizeError {
        message: message.into(),
        param,
        unknown_model: None,
    }
}

/// What to do with the requested model (the caller owns the catalog and aliases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// Send it as is.
    Keep,
    /// Send this slug instead, optionally forcing a reasoning effort (an alias).
    Rewrite {
        /// Upstream slug.
        slug: String,
        /// Reasoning effort to set.
        effort: Option<String>,
    },
    /// Unknown model.
    Reject,
}

/// The refusal of an `input` that is neither a string nor a list of items, worded once for
/// every surface that checks it (the normaliser, the Responses WebSocket, which rebuilds
/// `input` from its transcript before normalising).
pub const INPUT_TYPE_ERROR: &str = "`input` must be a string or an array of input items.";

/// Normalizes a client `/v1/responses` body for the Codex backend, keeping the model.
pub fn normalize_responses(body: &[u8]) -> Result<Normalized, NormalizeError> {
    normalize_responses_with(body, &|_| ModelChoice::Keep)
}

/// Normalizes a client `/v1/responses` body, resolving the model with `choose`.
/// [`Normalized::model`] stays the client's name (accounting); the body carries the slug.
///
/// The body is not parsed into a tree: one strict pass over its top-level fields (every value
/// validated, UTF-8 and `\u` escapes included) finds what changes, and the upstream body is
/// written from the client's own bytes (numbers as the client wrote them), rewriting only
/// those fields (`model` for an alias, `reasoning` for an alias's effort, a string `input`,
/// `system` roles of input items, legacy web search tool types, `service_tier`, a null
/// `instructions`) and dropping the refused ones. A Codex CLI request (40-60 KB, mostly input
/// items) is copied, not rebuilt. A field sent twice counts once, with its last value (as
/// `JSON.parse` reads it).
pub fn normalize_responses_with(
    body: &[u8],
    choose: &dyn Fn(&str) -> ModelChoice,
) -> Result<Normalized, NormalizeError> {
    let (written, n) = normalize_parts(body, choose)?;
    let mut out = Vec::with_capacity(written.len());
    out.extend_from_slice(&body[..written.kept]);
    out.extend_from_slice(&written.tail);
    Ok(Normalized { body: out, ..n })
}

/// [`normalize_responses_with`] on a body the caller gives up: the upstream body is written
/// into the client's own buffer where it is the client's body up to a point (a compact body:
/// the Codex CLI's, which differs only in the `instructions` added at its end), so the body
/// is not copied at all (unless the buffer has far more room than the body needs). The same
/// bytes as [`normalize_responses_with`].
pub fn normalize_responses_owned(
    mut body: Vec<u8>,
    choose: &dyn Fn(&str) -> ModelChoice,
) -> Result<Normalized, NormalizeError> {
    // The upstream body lives as long as the stream (retries resend it): a buffer with much
    // more room than it needs (a read buffer that doubled) is not kept for it.
    const SLACK: usize = 16 * 1024;
    let (written, n) = normalize_parts(&body, choose)?;
    let (kept, tail) = (written.kept, written.tail);
    let size = kept + tail.len();
    // In place: the rest is copied twice (into the tail, then after the kept bytes), which
    // beats copying the kept bytes once only while the rest is the smaller part.
    if tail.len() >= kept || body.capacity() > size + size / 4 + SLACK {
        let mut out = Vec::with_capacity(kept + tail.len());
        out.extend_from_slice(&body[..kept]);
        out.extend_from_slice(&tail);
        return Ok(Normalized { body: out, ..n });
    }
    body.truncate(kept);
    // Exact: a doubling would copy the body into a new block; the allocator usually has
    // room for a few bytes more in place.
    body.reserve_exact(tail.len());
    body.extend_from_slice(&tail);
    Ok(Normalized { body, ..n })
}

/// The upstream body as it is written. While it is the client's body byte for byte (a compact
/// body that needs no change up to there), nothing is copied: the output so far is
/// `body[..kept]`. From the first byte that differs, the rest goes to `tail`.
struct Written<'a> {
    body: &'a [u8],
    kept: usize,
    tail: Vec<u8>,
    /// `tail` holds the rest of the output (the body diverged).
    diverged: bool,
    /// Scratch for a key.
    key: Vec<u8>,
}

impl<'a> Written<'a> {
    fn new(body: &'a [u8]) -> Self {
        Self {
            body,
            kept: 0,
            tail: Vec::new(),
            diverged: false,
            key: Vec::with_capacity(32),
        }
    }

    /// Bytes written so far.
    fn len(&self) -> usize {
        self.kept + self.tail.len()
    }

    fn put(&mut self, bytes: &[u8]) {
        if !self.diverged {
            let here = self.body.get(self.kept..self.kept + bytes.len());
            // The client's own bytes at the same place (a slice of the body), or a few
            // written bytes the body holds there too.
            let same = here.is_some_and(|h| {
                std::ptr::eq(h.as_ptr(), bytes.as_ptr()) || (bytes.len() <= 64 && h == bytes)
            });
            if same {
                self.kept += bytes.len();
                return;
            }
            self.diverge();
        }
        self.tail.extend_from_slice(bytes);
    }

    /// From here on, the output is written out.
    fn diverge(&mut self) {
        self.diverged = true;
        // Sized for the rest of the body and what the normaliser may add.
        self.tail = Vec::with_capacity(self.body.len() - self.kept + 128);
    }

    /// Writes `s` as a JSON string.
    fn put_str(&mut self, s: &str) {
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        write_str(&mut key, s);
        self.put(&key);
        self.key = key;
    }

    /// Writes a member's key (and the comma before it, but for the first).
    fn put_key(&mut self, k: &str) {
        let first = self.len() <= 1;
        if k.bytes().any(|c| c < 0x20 || c == b'"' || c == b'\\') {
            // Written with its escapes.
            let mut key = std::mem::take(&mut self.key);
            key.clear();
            if !first {
                key.push(b',');
            }
            write_str(&mut key, k);
            key.push(b':');
            self.put(&key);
            self.key = key;
            return;
        }
        let open: &[u8] = if first { b"\"" } else { b",\"" };
        let parts = [open, k.as_bytes(), b"\":"];
        if !self.diverged {
            let (o, n) = (open.len(), open.len() + k.len() + 2);
            let same = self.body.get(self.kept..self.kept + n).is_some_and(|h| {
                h[..o] == *open && h[n - 2..] == *b"\":" && h[o..n - 2] == *k.as_bytes()
            });
            if same {
                self.kept += n;
                return;
            }
            self.diverge();
        }
        for p in parts {
            self.tail.extend_from_slice(p);
        }
    }

    /// Writes `v` as JSON.
    fn put_json(&mut self, v: &Value) -> Result<(), sonic_rs::Error> {
        let mut b = Vec::new();
        sonic_rs::to_writer(&mut b, v)?;
        self.put(&b);
        Ok(())
    }
}

/// The normaliser's one pass: the upstream body as written ([`Written`]) and the fields
/// (`body` left empty).
fn normalize_parts<'a>(
    body: &'a [u8],
    choose: &dyn Fn(&str) -> ModelChoice,
) -> Result<(Written<'a>, Normalized), NormalizeError> {
    let parse_err = |e: &dyn std::fmt::Display| {
        err(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    };
    let (fields, escapes) = top_level_fields(body, &parse_err)?;
    // About twenty names are looked up, each once or twice: a scan each.
    let field = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v);

    let model = match field("model") {
        Some(m) => match m.as_str() {
            Some(s) if !s.is_empty() => s.to_owned(),
            _ => return Err(err("`model` must be a non-empty string.", Some("model"))),
        },
        None => return Err(err("Missing required parameter: 'model'.", Some("model"))),
    };
    let (slug, effort) = match choose(&model) {
        ModelChoice::Keep => (None, None),
        ModelChoice::Reject => {
            return Err(NormalizeError {
                message: format!(
                    "The model `{model}` does not exist or you do not have access to it."
                ),
                param: Some("model"),
                unknown_model: Some(model),
            })
        }
        ModelChoice::Rewrite { slug, effort } => (Some(slug), effort),
    };
    let stream = match field("stream") {
        None => false,
        Some(s) if s.is_null() => false,
        Some(s) => s
            .as_bool()
            .ok_or_else(|| err("`stream` must be a boolean.", Some("stream")))?,
    };
    if let Some(i) = field("instructions") {
        if !i.is_str() && !i.is_null() {
            return Err(err(
                "`instructions` must be a string.",
                Some("instructions"),
            ));
        }
    }
    if let Some(i) = field("input") {
        if !i.is_str() && !i.is_array() {
            return Err(err(INPUT_TYPE_ERROR, Some("input")));
        }
    }
    let text = |k: &str| {
        field(k)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let previous_response_id = field("previous_response_id")
        .and_then(|p| p.as_str())
        .map(str::to_owned);
    let prompt_cache_key = field("prompt_cache_key")
        .and_then(|p| p.as_str())
        .map(str::to_owned);
    let store = field("store").and_then(|s| s.as_bool());
    let session = SESSION_FIELDS.iter().find_map(|k| text(k));
    // The alias's effort, else the client's.
    let reasoning_effort = match &effort {
        Some(e) => Some(e.clone()).filter(|e| !e.is_empty()),
        None => field("reasoning")
            .filter(|r| r.is_object())
            .and_then(|r| sonic_rs::get(r.as_raw_str(), &["effort"]).ok())
            .and_then(|e| e.as_str().filter(|s| !s.is_empty()).map(str::to_owned)),
    };
    let priority = field("service_tier")
        .and_then(|t| t.as_str())
        .is_some_and(|t| t == "priority" || t == "fast");

    let mut out = Written::new(body);
    out.put(b"{");
    for (k, v) in &fields {
        let k = k.as_ref();
        let raw = v.as_raw_str().as_bytes();
        match k {
            "previous_response_id" | "type" | "generate" => {}
            k if DROPPED_FIELDS.contains(&k) => {}
            "model" => {
                out.put_key(k);
                match &slug {
                    Some(slug) => out.put_str(slug),
                    None => out.put(raw),
                }
            }
            "stream" => {
                out.put_key(k);
                out.put(b"true");
            }
            "store" => {
                out.put_key(k);
                out.put(b"false");
            }
            "instructions" => {
                out.put_key(k);
                if v.is_null() {
                    out.put(b"\"\"");
                } else {
                    out.put(raw);
                }
            }
            "input" => {
                out.put_key(k);
                if v.is_str() {
                    out.put(
                        br#"[{"type":"message","role":"user","content":[{"type":"input_text","text":"#,
                    );
                    out.put(raw);
                    out.put(b"}]}]");
                } else {
                    rewrite_items(&mut out, raw, &SYSTEM_ROLE, escapes)
                        .map_err(|e| parse_err(&e))?;
                }
            }
            "tools" if v.is_array() => {
                out.put_key(k);
                rewrite_items(&mut out, raw, &LEGACY_WEB_SEARCH, escapes)
                    .map_err(|e| parse_err(&e))?;
            }
            "service_tier" => {
                if priority {
                    out.put_key(k);
                    out.put(b"\"priority\"");
                }
            }
            "reasoning" => {
                out.put_key(k);
                match &effort {
                    Some(effort) => {
                        let mut r: Value = if v.is_object() {
                            sonic_rs::from_slice(raw).map_err(|e| parse_err(&e))?
                        } else {
                            Value::new_object()
                        };
                        if let Some(o) = r.as_object_mut() {
                            o.insert(&"effort", effort.as_str());
                        }
                        out.put_json(&r).map_err(|e| parse_err(&e))?;
                    }
                    None => out.put(raw),
                }
            }
            _ => {
                out.put_key(k);
                out.put(raw);
            }
        }
    }
    // What the backend needs and the client did not send.
    if let (Some(e), None) = (&effort, field("reasoning")) {
        out.put_key("reasoning");
        out.put(br#"{"effort":"#);
        out.put_str(e);
        out.put(b"}");
    }
    let defaults: [(&str, &[u8]); 4] = [
        ("instructions", b"\"\""),
        ("input", b"[]"),
        ("store", b"false"),
        ("stream", b"true"),
    ];
    for (k, v) in defaults {
        if field(k).is_none() {
            out.put_key(k);
            out.put(v);
        }
    }
    out.put(b"}");
    let n = Normalized {
        body: Vec::new(),
        model,
        stream,
        previous_response_id,
        prompt_cache_key,
        store,
        session,
        asked: Asked {
            reasoning_effort,
            service_tier: priority.then(|| "priority".to_owned()),
        },
    };
    Ok((out, n))
}

/// The fields of a body's top level, in order, each with its value.
type Fields<'a> = Vec<(std::borrow::Cow<'a, str>, sonic_rs::LazyValue<'a>)>;

/// The top-level fields of a JSON object body, in order, a repeated name once (at its first
/// place, with its last value), and whether the body holds a `\u` anywhere (escaped or
/// not). Every value is validated (strict pass, UTF-8 included), and nothing may follow the
/// object.
fn top_level_fields<'a>(
    body: &'a [u8],
    parse_err: &dyn Fn(&dyn std::fmt::Display) -> NormalizeError,
) -> Result<(Fields<'a>, bool), NormalizeError> {
    let is_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    if body.iter().find(|b| !is_ws(b)) != Some(&b'{') {
        // Not an object: say whether it is JSON at all (the rare path).
        return Err(match sonic_rs::from_slice::<Value>(body) {
            Ok(_) => err("The request body must be a JSON object.", None),
            Err(e) => parse_err(&e),
        });
    }
    let mut fields: Fields<'a> = Vec::new();
    // Where each name is, once there are more than a few (a body of a million names must not
    // cost a million scans).
    let mut index: std::collections::HashMap<std::borrow::Cow<'a, str>, usize> =
        std::collections::HashMap::new();
    let mut end = None;
    for entry in sonic_rs::to_object_iter(body) {
        let (k, v) = entry.map_err(|e| parse_err(&e))?;
        let raw = v.as_raw_str().as_bytes();
        // The value is a slice of the body (a borrowed input): where it ends.
        let (at, base) = (raw.as_ptr() as usize, body.as_ptr() as usize);
        if at < base || at + raw.len() > base + body.len() {
            return Err(parse_err(&"value outside the body"));
        }
        end = Some(at + raw.len() - base);
        // A name seen before keeps its place and takes the new value.
        const SCAN: usize = 16;
        let seen = if fields.len() <= SCAN {
            fields.iter().position(|(n, _)| *n == k)
        } else {
            if index.is_empty() {
                index.extend(fields.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)));
            }
            index.get(&k).copied()
        };
        match seen {
            Some(i) => fields[i].1 = v,
            None => {
                if !index.is_empty() {
                    index.insert(k.clone(), fields.len());
                }
                fields.push((k, v));
            }
        }
    }
    // The iterator stops at the closing brace: what follows it must be blank.
    let rest = match end {
        Some(e) => &body[e..],
        None => {
            let open = body.iter().position(|b| *b == b'{').unwrap_or(0);
            &body[open + 1..]
        }
    };
    let mut rest = rest.iter().skip_while(|b| is_ws(b));
    if rest.next() != Some(&b'}') || rest.any(|b| !is_ws(b)) {
        return Err(parse_err(&"trailing characters after the JSON object"));
    }
    // The strict pass checks an escape's form, not what a `\u` escape spells.
    match unicode_escapes_valid(body) {
        Some(escapes) => Ok((fields, escapes)),
        None => Err(parse_err(&"invalid unicode code point in a \\u escape")),
    }
}

/// Every `\uXXXX` escape of `body` (a document the strict pass accepted: backslashes only in
/// strings, each starting a well-formed escape) is four hex digits naming a code point, a
/// high surrogate followed by a low one, as a parser that decodes the strings requires.
/// `None`: one is not; else whether `body` holds a `\u` at all (an escape, or a backslash
/// escaped before a `u`).
fn unicode_escapes_valid(body: &[u8]) -> Option<bool> {
    let hex = |at: usize| -> Option<u32> {
        let digits = body.get(at..at + 4)?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    // Candidates by a SIMD search for `\u`; one is an escape when the run of backslashes it
    // ends is odd (escapes pair backslashes from the left: `\\u` is a backslash, then `u`).
    let mut from = 0;
    let mut any = false;
    for at in ESCAPE.find_iter(body) {
        any = true;
        if at < from {
            continue; // the low half of a pair already checked
        }
        let run = body[..=at]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        if run % 2 == 0 {
            continue;
        }
        let cp = hex(at + 2)?;
        from = at + 6;
        match cp {
            0xD800..=0xDBFF => {
                let low = (body.get(at + 6..at + 8) == Some(b"\\u"))
                    .then(|| hex(at + 8))
                    .flatten();
                if !low.is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)) {
                    return None;
                }
                from = at + 12;
            }
            0xDC00..=0xDFFF => return None,
            _ => {}
        }
    }
    Some(any)
}

/// A rewrite of one key in the object items of an array ([`rewrite_items`]).
struct ItemRule {
    /// Raw text every value that changes holds when written without `\u` escapes: its
    /// opening quote and first letters.
    hint: &'static [u8],
    /// Its searcher (built once).
    finder: &'static Finder,
    /// The hint closed by a quote is a whole value that never changes (`"web_search"`).
    closed_keeps: bool,
    /// The key.
    key: &'static str,
    /// Whether a string value changes.
    needs: fn(&str) -> bool,
    /// What it changes to.
    to: &'static str,
}

/// A substring searcher built once (a build per search costs more than a short search).
type Finder = std::sync::LazyLock<memchr::memmem::Finder<'static>>;

static SYSTEM: Finder = Finder::new(|| memchr::memmem::Finder::new(br#""system""#));
static WEB_SEARCH: Finder = Finder::new(|| memchr::memmem::Finder::new(br#""web_search"#));
static ESCAPE: Finder = Finder::new(|| memchr::memmem::Finder::new(b"\\u"));
static INSTALLATION: Finder = Finder::new(|| memchr::memmem::Finder::new(b"installation"));

/// Input items: the `system` role is `developer` upstream.
static SYSTEM_ROLE: ItemRule = ItemRule {
    hint: br#""system""#,
    finder: &SYSTEM,
    closed_keeps: false,
    key: "role",
    needs: |r| r == "system",
    to: "developer",
};

/// Tools: the legacy web search types are `web_search` upstream.
static LEGACY_WEB_SEARCH: ItemRule = ItemRule {
    hint: br#""web_search"#,
    finder: &WEB_SEARCH,
    closed_keeps: true,
    key: "type",
    needs: |t| t.starts_with("web_search") && t != "web_search",
    to: "web_search",
};

/// Writes the array `raw` (validated) to `out` with `rule.key` set to `rule.to` in every
/// object item whose `rule.key` is a string that `rule.needs`; every other item is copied as
/// it is. `escapes`: whether the body holds a `\u` anywhere.
///
/// An array whose text holds neither the hint nor a `\u` is copied whole (one SIMD search);
/// any other is written item by item (items found by a flat walk, [`crate::spans`]: the strict
/// pass validated them), which drops the blanks between items. Only an item whose text may
/// spell a value that changes (the hint, not closed when `closed_keeps`, or an escape of an
/// ASCII character: a letter can be escaped only so) has its key read, and only an item
/// that changes is parsed and written again.
fn rewrite_items(
    out: &mut Written<'_>,
    raw: &[u8],
    rule: &ItemRule,
    escapes: bool,
) -> Result<(), String> {
    let finder: &memchr::memmem::Finder<'_> = rule.finder;
    let rebuilt = finder.find(raw).is_some() || (escapes && ESCAPE.find(raw).is_some());
    if !rebuilt {
        out.put(raw);
        return Ok(());
    }
    let may_change = |b: &[u8]| {
        finder
            .find_iter(b)
            .any(|at| !(rule.closed_keeps && b.get(at + rule.hint.len()) == Some(&b'"')))
            || (escapes && crate::spans::may_escape_ascii(b))
    };
    out.put(b"[");
    let mut items = crate::spans::items(raw);
    for (i, item) in items.by_ref().enumerate() {
        if i > 0 {
            out.put(b",");
        }
        let bytes = &raw[item];
        let change = bytes.first() == Some(&b'{')
            && may_change(bytes)
            && sonic_rs::get(bytes, &[rule.key])
                .ok()
                .is_some_and(|v| v.as_str().is_some_and(rule.needs));
        if change {
            let mut v: Value = sonic_rs::from_slice(bytes).map_err(|e| e.to_string())?;
            if let Some(o) = v.as_object_mut() {
                o.insert(&rule.key, rule.to);
            }
            out.put_json(&v).map_err(|e| e.to_string())?;
        } else {
            out.put(bytes);
        }
    }
    if !items.complete() {
        return Err("an array the strict pass accepted could not be walked".into());
    }
    out.put(b"]");
    Ok(())
}

/// The installation id the Codex CLI repeats inside its payload (docs/protocol.md#one-installation-per-account):
/// `body` with the body's `client_metadata` carrying `id` in place of the client's, in
/// `x-codex-installation-id` and in the `installation_id` of the `x-codex-turn-metadata` JSON
/// string it mirrors. `None`: nothing to change (SIMD searches when the body names no
/// installation). Only the `client_metadata` object is rewritten; the rest of the body is
/// copied byte for byte.
///
/// `body` is JSON the gateway wrote (a normalised or translated body, each top-level name
/// once): `client_metadata` is found by a flat walk from both ends
/// ([`crate::spans::unique_member`]), which reads only the members between it and the nearer
/// end (the Codex CLI sends it last), and the ids are spliced in where the object is written
/// as a tree would write it ([`metadata_spliced`]), else the object is written again from a
/// tree.
pub fn with_installation_id(body: &[u8], id: &str) -> Option<Vec<u8>> {
    // Where the Codex CLI puts it first (its `client_metadata` ends its body), then anywhere.
    const TAIL: usize = 4096;
    let tail = &body[body.len().saturating_sub(TAIL)..];
    INSTALLATION
        .find(tail)
        .or_else(|| INSTALLATION.find(body))?;
    let span = crate::spans::unique_member(body, "client_metadata", b'{')?;
    let (start, end) = (span.start, span.end);
    let raw = &body[start..end];
    let meta = match metadata_spliced(raw, id) {
        Some(spliced) => spliced?,
        None => metadata_rewritten(raw, id)?,
    };
    let mut out = Vec::with_capacity(body.len() - raw.len() + meta.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(&meta);
    out.extend_from_slice(&body[end..]);
    Some(out)
}

/// `client_metadata` (`raw`) with `id` in place of the client's installation id, the object
/// read into a tree and written again; `None`: nothing to change.
fn metadata_rewritten(raw: &[u8], id: &str) -> Option<Vec<u8>> {
    let mut meta: Value = sonic_rs::from_slice(raw).ok()?;
    let o = meta.as_object_mut()?;
    let mut changed = false;
    if o.get(&"x-codex-installation-id")
        .and_then(|v| v.as_str())
        .is_some_and(|v| v != id)
    {
        o.insert(&"x-codex-installation-id", id);
        changed = true;
    }
    let turn = o
        .get(&"x-codex-turn-metadata")
        .and_then(|v| v.as_str())
        .and_then(|t| turn_metadata_with_installation_id(t, id));
    if let Some(t) = turn {
        o.insert(&"x-codex-turn-metadata", t.as_str());
        changed = true;
    }
    if !changed {
        return None;
    }
    sonic_rs::to_vec(&meta).ok()
}

/// [`metadata_rewritten`] without the tree, when `raw` and the turn metadata inside it are
/// written as sonic-rs writes a tree ([`crate::spans::plain_object`]; the Codex CLI's are):
/// the new ids are spliced in place of the old ones, and everything else is the client's
/// bytes, in the client's order. The tree would give the same bytes but for the order of the
/// members (a changed sonic-rs object is a hash map: its order is random). `None`: not so
/// written (the tree writes it); `Some(None)`: nothing to change.
fn metadata_spliced(raw: &[u8], id: &str) -> Option<Option<Vec<u8>>> {
    let members = crate::spans::plain_object(raw)?;
    let value_of = |name: &str| {
        members
            .iter()
            .find(|m| raw.get(m.key.start + 1..m.key.end - 1) == Some(name.as_bytes()))
            .map(|m| m.value.clone())
            .filter(|v| raw[v.start] == b'"')
    };
    let mut edits: Vec<(std::ops::Range<usize>, Vec<u8>)> = Vec::new();
    if let Some(v) = value_of("x-codex-installation-id") {
        if plain_decoded(&raw[v.clone()])? != id {
            edits.push((v, quoted(id)));
        }
    }
    if let Some(v) = value_of("x-codex-turn-metadata") {
        let turn = plain_decoded(&raw[v.clone()])?;
        if let Some(t) = turn_spliced(&turn, id)? {
            edits.push((v, quoted(&t)));
        }
    }
    if edits.is_empty() {
        return Some(None);
    }
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(raw.len() + 2 * id.len());
    let mut at = 0;
    for (r, new) in edits {
        out.extend_from_slice(&raw[at..r.start]);
        out.extend_from_slice(&new);
        at = r.end;
    }
    out.extend_from_slice(&raw[at..]);
    Some(Some(out))
}

/// [`turn_metadata_with_installation_id`] by splicing, when the turn metadata is written as
/// sonic-rs writes it; `None`: it is not; `Some(None)`: nothing to change.
fn turn_spliced(json: &str, id: &str) -> Option<Option<String>> {
    if !json.contains("installation_id") {
        return Some(None);
    }
    let members = crate::spans::plain_object(json.as_bytes())?;
    let Some(v) = members
        .iter()
        .find(|m| json.get(m.key.start + 1..m.key.end - 1) == Some("installation_id"))
        .map(|m| m.value.clone())
        .filter(|v| json.as_bytes()[v.start] == b'"')
    else {
        return Some(None);
    };
    if plain_decoded(json[v.clone()].as_bytes())? == id {
        return Some(None);
    }
    let mut out = String::with_capacity(json.len() + id.len());
    out.push_str(&json[..v.start]);
    out.push_str(std::str::from_utf8(&quoted(id)).ok()?);
    out.push_str(&json[v.end..]);
    Some(Some(out))
}

/// The text of a plain string ([`crate::spans::plain_object`]: its only escapes are `\"` and
/// `\\`), quotes included in `quoted`.
fn plain_decoded(quoted: &[u8]) -> Option<String> {
    let inner = quoted.get(1..quoted.len().checked_sub(1)?)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut at = 0;
    while let Some(k) = inner.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        out.extend_from_slice(&inner[at..at + k]);
        // The escaped character itself.
        out.extend(inner.get(at + k + 1));
        at += k + 2;
    }
    out.extend_from_slice(inner.get(at..).unwrap_or_default());
    String::from_utf8(out).ok()
}

/// `s` as sonic-rs writes a JSON string.
fn quoted(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    write_str(&mut out, s);
    out
}

/// The `x-codex-turn-metadata` JSON (header or `client_metadata` entry) with `installation_id`
/// set to `id`; `None` when it names none (or already `id`) or is not a JSON object.
pub fn turn_metadata_with_installation_id(json: &str, id: &str) -> Option<String> {
    if !json.contains("installation_id") {
        return None;
    }
    let mut v: Value = sonic_rs::from_str(json).ok()?;
    let o = v.as_object_mut()?;
    match o.get(&"installation_id").and_then(|v| v.as_str()) {
        Some(cur) if cur != id => {}
        _ => return None,
    }
    o.insert(&"installation_id", id);
    sonic_rs::to_string(&v).ok()
}

/// Writes `s` as a JSON string, byte for byte as sonic-rs writes one (the same escapes; a
/// test holds them together), without its serializer's reserve of six bytes per character.
fn write_str(out: &mut Vec<u8>, s: &str) {
    crate::json::write_str(out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree-based normaliser this module had before (a reference for the differential
    /// test below).
    mod oracle {
        use sonic_rs::{json, JsonContainerTrait};

        use super::super::*;

        /// A non-empty string field of `obj`.
        fn text_of(obj: &sonic_rs::Object, key: &str) -> Option<String> {
            obj.get(&key)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        }

        /// Normalizes a client `/v1/responses` body, resolving the model with `choose`.
        /// [`Normalized::model`] stays the client's name (accounting); the body carries the slug.
        pub fn normalize_dom(
            body: &[u8],
            choose: &dyn Fn(&str) -> ModelChoice,
        ) -> Result<Normalized, NormalizeError> {
            let mut v: Value = sonic_rs::from_slice(body).map_err(|e| {
                err(
                    format!("We could not parse the JSON body of your request: {e}"),
                    None,
                )
            })?;
            let obj = v
                .as_object_mut()
                .ok_or_else(|| err("The request body must be a JSON object.", None))?;

            let model = match obj.get(&"model") {
                Some(m) if m.as_str().is_some_and(|s| !s.is_empty()) => {
                    m.as_str().unwrap_or_default().to_owned()
                }
                Some(_) => return Err(err("`model` must be a non-empty string.", Some("model"))),
                None => return Err(err("Missing required parameter: 'model'.", Some("model"))),
            };
            match choose(&model) {
                ModelChoice::Keep => {}
                ModelChoice::Reject => {
                    return Err(NormalizeError {
                        message: format!(
                            "The model `{model}` does not exist or you do not have access to it."
                        ),
                        param: Some("model"),
                        unknown_model: Some(model),
                    })
                }
                ModelChoice::Rewrite { slug, effort } => {
                    obj.insert(&"model", slug.as_str());
                    if let Some(effort) = effort {
                        match obj.get_mut(&"reasoning").and_then(|r| r.as_object_mut()) {
                            Some(r) => {
                                r.insert(&"effort", effort.as_str());
                            }
                            None => {
                                obj.insert(&"reasoning", json!({"effort": effort.as_str()}));
                            }
                        }
                    }
                }
            }
            let stream = match obj.get(&"stream") {
                None => false,
                Some(s) if s.is_null() => false,
                Some(s) => s
                    .as_bool()
                    .ok_or_else(|| err("`stream` must be a boolean.", Some("stream")))?,
            };
            let previous_response_id = obj
                .remove(&"previous_response_id")
                .and_then(|p| p.as_str().map(str::to_owned));
            let prompt_cache_key = obj
                .get(&"prompt_cache_key")
                .and_then(|p| p.as_str().map(str::to_owned));
            let store = obj.get(&"store").and_then(|s| s.as_bool());
            let session = text_of(obj, "session_id").or_else(|| text_of(obj, "conversation_id"));

            for f in DROPPED_FIELDS {
                obj.remove(f);
            }
            // WebSocket envelope fields never go over HTTP.
            obj.remove(&"type");
            obj.remove(&"generate");

            // instructions: required upstream, may be empty.
            match obj.get(&"instructions") {
                Some(i) if i.is_str() => {}
                Some(i) if i.is_null() => {
                    obj.insert(&"instructions", "");
                }
                Some(_) => {
                    return Err(err(
                        "`instructions` must be a string.",
                        Some("instructions"),
                    ))
                }
                None => {
                    obj.insert(&"instructions", "");
                }
            }

            // input: string -> one user message; array: system role -> developer.
            match obj.get_mut(&"input") {
                None => {
                    obj.insert(&"input", Value::new_array());
                }
                Some(input) if input.is_str() => {
                    let text = input.as_str().unwrap_or_default().to_owned();
                    *input = json!([{
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": text}]
                    }]);
                }
                Some(input) if input.is_array() => {
                    if let Some(items) = input.as_array_mut() {
                        for item in items.iter_mut() {
                            if let Some(o) = item.as_object_mut() {
                                if o.get(&"role").and_then(|r| r.as_str()) == Some("system") {
                                    o.insert(&"role", "developer");
                                }
                            }
                        }
                    }
                }
                Some(_) => {
                    return Err(err(
                        "`input` must be a string or an array of input items.",
                        Some("input"),
                    ))
                }
            }

            // tools: legacy web search variants -> web_search.
            if let Some(tools) = obj.get_mut(&"tools").and_then(|t| t.as_array_mut()) {
                for t in tools.iter_mut() {
                    if let Some(o) = t.as_object_mut() {
                        let is_ws = o
                            .get(&"type")
                            .and_then(|x| x.as_str())
                            .is_some_and(|ty| ty.starts_with("web_search"));
                        if is_ws {
                            o.insert(&"type", "web_search");
                        }
                    }
                }
            }

            // service_tier: only `priority` is accepted (`fast` means priority).
            let tier = obj
                .get(&"service_tier")
                .map(|t| t.as_str().map(str::to_owned));
            match tier {
                Some(Some(t)) if t == "priority" || t == "fast" => {
                    obj.insert(&"service_tier", "priority");
                }
                Some(_) => {
                    obj.remove(&"service_tier");
                }
                None => {}
            }

            obj.insert(&"store", false);
            obj.insert(&"stream", true);
            let asked = Asked {
                reasoning_effort: obj
                    .get(&"reasoning")
                    .and_then(|r| r.as_object())
                    .and_then(|r| text_of(r, "effort")),
                service_tier: text_of(obj, "service_tier"),
            };

            let body =
                sonic_rs::to_vec(&v).map_err(|e| err(format!("cannot encode body: {e}"), None))?;
            Ok(Normalized {
                body,
                model,
                stream,
                previous_response_id,
                prompt_cache_key,
                store,
                session,
                asked,
            })
        }
    }

    fn norm(s: &str) -> (Normalized, Value) {
        let n = normalize_responses(s.as_bytes()).unwrap();
        let v: Value = sonic_rs::from_slice(&n.body).unwrap();
        (n, v)
    }

    #[test]
    fn wraps_string_input_and_forces_codex_rules() {
        let (n, v) = norm(
            r#"{"model":"gpt-5","input":"say hi","temperature":0.2,"max_output_tokens":5,"store":true}"#,
        );
        assert_eq!(n.model, "gpt-5");
        assert!(!n.stream);
        assert_eq!(v["stream"].as_bool(), Some(true));
        assert_eq!(v["store"].as_bool(), Some(false));
        assert_eq!(v["instructions"].as_str(), Some(""));
        assert!(v.get("temperature").is_none());
        assert!(v.get("max_output_tokens").is_none());
        assert_eq!(v["input"][0]["role"].as_str(), Some("user"));
        assert_eq!(v["input"][0]["content"][0]["text"].as_str(), Some("say hi"));
    }

    #[test]
    fn maps_system_role_and_keeps_instructions() {
        let (n, v) = norm(
            r#"{"model":"m","stream":true,"instructions":"be brief","input":[{"type":"message","role":"system","content":"x"}],"previous_response_id":"resp_1","service_tier":"fast","tools":[{"type":"web_search_preview"}]}"#,
        );
        assert!(n.stream);
        assert_eq!(n.previous_response_id.as_deref(), Some("resp_1"));
        assert!(v.get("previous_response_id").is_none());
        assert_eq!(v["instructions"].as_str(), Some("be brief"));
        assert_eq!(v["input"][0]["role"].as_str(), Some("developer"));
        assert_eq!(v["service_tier"].as_str(), Some("priority"));
        assert_eq!(v["tools"][0]["type"].as_str(), Some("web_search"));
    }

    #[test]
    fn resolves_models_through_the_caller() {
        let choose = |m: &str| match m {
            "fast" => ModelChoice::Rewrite {
                slug: "gpt-5.5".into(),
                effort: Some("low".into()),
            },
            "gpt-5.5" => ModelChoice::Keep,
            _ => ModelChoice::Reject,
        };
        let n = normalize_responses_with(
            br#"{"model":"fast","input":"x","reasoning":{"summary":"auto"}}"#,
            &choose,
        )
        .unwrap();
        let v: Value = sonic_rs::from_slice(&n.body).unwrap();
        assert_eq!(n.model, "fast");
        assert_eq!(v["model"].as_str(), Some("gpt-5.5"));
        assert_eq!(v["reasoning"]["effort"].as_str(), Some("low"));
        assert_eq!(v["reasoning"]["summary"].as_str(), Some("auto"));
        let e = normalize_responses_with(br#"{"model":"nope"}"#, &choose).unwrap_err();
        assert_eq!(e.unknown_model.as_deref(), Some("nope"));
    }

    #[test]
    fn reports_store_session_and_what_the_body_asks_for() {
        let (n, _) = norm(
            r#"{"model":"m","store":true,"session_id":"","conversation_id":"c-1","reasoning":{"effort":"high"},"service_tier":"fast"}"#,
        );
        assert_eq!(n.store, Some(true));
        assert_eq!(
            n.session.as_deref(),
            Some("c-1"),
            "an empty session_id is no signal"
        );
        assert_eq!(n.asked.reasoning_effort.as_deref(), Some("high"));
        assert_eq!(n.asked.service_tier.as_deref(), Some("priority"));
        let (n, _) = norm(
            r#"{"model":"m","store":false,"session_id":"s-1","conversation_id":"c-1","service_tier":"flex"}"#,
        );
        assert_eq!(n.store, Some(false));
        assert_eq!(n.session.as_deref(), Some("s-1"));
        assert_eq!(
            n.asked,
            Asked::default(),
            "a tier the backend refuses is dropped"
        );
        let (n, _) = norm(r#"{"model":"m","store":"yes","session_id":5}"#);
        assert_eq!((n.store, n.session), (None, None));
        // An alias's forced effort is what the body sent asks for.
        let choose = |_: &str| ModelChoice::Rewrite {
            slug: "gpt-5.5".into(),
            effort: Some("low".into()),
        };
        let n = normalize_responses_with(
            br#"{"model":"fast","reasoning":{"effort":"high"}}"#,
            &choose,
        )
        .unwrap();
        assert_eq!(n.asked.reasoning_effort.as_deref(), Some("low"));
    }

    #[test]
    fn the_scan_of_a_translated_body_reads_what_the_normaliser_reads() {
        for body in [
            r#"{"model":"m"}"#,
            r#"{"model":"m","reasoning":{"effort":"medium","summary":"auto"},"service_tier":"priority"}"#,
            r#"{"model":"m","reasoning":{"effort":""},"service_tier":"fast","input":[{"reasoning":{"effort":"x"}}]}"#,
            r#"{"model":"m","reasoning":null,"service_tier":null}"#,
        ] {
            let n = normalize_responses(body.as_bytes()).unwrap();
            assert_eq!(Asked::of_body(&n.body), n.asked, "{body}");
        }
    }

    /// A value with its object keys sorted (key order is not part of the contract).
    fn canon(v: &Value) -> String {
        use sonic_rs::JsonContainerTrait;
        if let Some(o) = v.as_object() {
            let mut kv: Vec<(String, String)> =
                o.iter().map(|(k, v)| (k.to_owned(), canon(v))).collect();
            kv.sort();
            let inner: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
            format!("{{{}}}", inner.join(","))
        } else if let Some(a) = v.as_array() {
            let inner: Vec<String> = a.iter().map(canon).collect();
            format!("[{}]", inner.join(","))
        } else {
            sonic_rs::to_string(v).unwrap()
        }
    }

    fn choose_for(mode: u8) -> impl Fn(&str) -> ModelChoice {
        move |m: &str| match mode % 3 {
            0 => ModelChoice::Keep,
            1 => ModelChoice::Rewrite {
                slug: format!("slug-of-{m}"),
                effort: Some("low".into()),
            },
            _ => ModelChoice::Rewrite {
                slug: "plain-slug".into(),
                effort: None,
            },
        }
    }

    /// The splicing normaliser and the tree-based one it replaced agree on `body`: the same
    /// upstream body (as a value) and the same fields, or the same refusal.
    fn agree(body: &[u8]) {
        for mode in 0..3u8 {
            let choose = choose_for(mode);
            let new = normalize_responses_with(body, &choose);
            let old = oracle::normalize_dom(body, &choose);
            let show = String::from_utf8_lossy(body);
            match (new, old) {
                (Ok(n), Ok(o)) => {
                    let nv: Value = sonic_rs::from_slice(&n.body).unwrap_or_else(|e| {
                        panic!("not JSON ({e}): {}", String::from_utf8_lossy(&n.body))
                    });
                    let ov: Value = sonic_rs::from_slice(&o.body).unwrap();
                    assert_eq!(canon(&nv), canon(&ov), "mode {mode}: {show}");
                    assert_eq!(
                        (
                            &n.model,
                            n.stream,
                            &n.previous_response_id,
                            &n.prompt_cache_key
                        ),
                        (
                            &o.model,
                            o.stream,
                            &o.previous_response_id,
                            &o.prompt_cache_key
                        ),
                        "mode {mode}: {show}"
                    );
                    assert_eq!(
                        (n.store, &n.session, &n.asked),
                        (o.store, &o.session, &o.asked),
                        "{show}"
                    );
                    assert_eq!(Asked::of_body(&n.body), n.asked, "{show}");
                }
                (Err(n), Err(o)) => {
                    assert_eq!(
                        (n.param, &n.unknown_model),
                        (o.param, &o.unknown_model),
                        "{show}"
                    );
                }
                // Numbers are copied as the client wrote them: one beyond f64's range, which
                // the tree refused, is the upstream's to judge (and stays in the body as sent).
                (Ok(n), Err(o)) if o.message.contains("must be finite") => {
                    let again = sonic_rs::from_slice::<Value>(&n.body).unwrap_err();
                    assert!(again.to_string().contains("must be finite"), "{show}");
                }
                (n, o) => panic!("mode {mode}: new {n:?}, old {o:?}: {show}"),
            }
        }
    }

    #[test]
    fn splicing_agrees_with_the_tree_on_every_rule() {
        for body in [
            r#"{"model":"gpt-5","input":"say hi","temperature":0.2,"max_output_tokens":5,"store":true}"#,
            r#" {"model" : "m" , "stream" : null , "instructions" : null }  "#,
            r#"{"model":"m","stream":false,"instructions":"be \"brief\"\n","input":"caf\u00e9 \ud83d\ude00"}"#,
            r#"{"model":"m","input":[{"type":"message","role":"system","content":"x"},{"role":"\u0073ystem","content":[]},{"role":"user","content":"system"},"loose",5,{"type":"function_call_output","output":"a system prompt"}]}"#,
            r#"{"model":"m","tools":[{"type":"web_search_preview"},{"type":"web_search_preview_2025_03_11","x":1},{"type":"function","name":"web_search"},{"type":"\u0077eb_search"},"x"],"tool_choice":"auto"}"#,
            r#"{"model":"m","tools":{"type":"web_search_preview"}}"#,
            r#"{"model":"m","service_tier":"priority"}"#,
            r#"{"model":"m","service_tier":"fast","reasoning":{"effort":"high","summary":"auto"}}"#,
            r#"{"model":"m","service_tier":"flex","reasoning":null}"#,
            r#"{"model":"m","service_tier":null,"reasoning":"high"}"#,
            r#"{"model":"m","service_tier":5,"reasoning":{"summary":"auto"}}"#,
            r#"{"model":"m","reasoning":true,"service_tier":"priority"}"#,
            r#"{"model":"m","reasoning":{"effort":""},"prompt_cache_key":"k","session_id":"s","conversation_id":"c"}"#,
            r#"{"model":"m","previous_response_id":"resp_1","type":"response.create","generate":false,"metadata":{"a":"b"},"user":"u","n":1,"seed":7,"stop":["x"],"stream_options":{"include_usage":true},"truncation":"auto","background":false}"#,
            r#"{"model":"m","numbers":[1e5,1.0,-0,123456789012345678901234567890,0.1],"nested":{"deep":[{"role":"system"}]},"text":{"format":{"type":"text"}}}"#,
            r#"{"model":"m","include":["reasoning.encrypted_content"],"parallel_tool_calls":true,"store":false,"stream":true}"#,
            r#"{"model":"gpt-5.5","input":[],"instructions":""}"#,
            "{\n\t\"model\":\"m\",\r\n\"input\":[ ]\n}\n",
            r#"{}"#,
            r#"{"model":""}"#,
            r#"{"model":5}"#,
            r#"{"model":"m","stream":"yes"}"#,
            r#"{"model":"m","instructions":5}"#,
            r#"{"model":"m","input":5}"#,
            r#"{"model":"m","input":{"role":"user"}}"#,
            r#"{"model":"m","stream":1,"input":5}"#,
            r#"[]"#,
            r#""model""#,
            r#"{nope"#,
            r#"{"model":"m","x":tru}"#,
            r#"{"model":"m","x":"\q"}"#,
            r#"{"model":"m","x":"\ud800"}"#,
            r#"{"model":"m","input":[{"role":"user","content":"\ud800 lone"}],"x":1e999}"#,
            r#"{"model":"m","x":"\udc00"}"#,
            r#"{"model":"m","x":"\ud800\u0041"}"#,
            r#"{"model":"m","x":"\ud83d\ude00 ok"}"#,
            r#"{"model":"m","x":"\u12G4"}"#,
            r#"{"model":"m","x":"\\ud800"}"#,
            r#"{"model":"m","x":["\\\ud800"]}"#,
            r#"{"model":"m","x":{"k\udfff":1}}"#,
            r#"{"model":"m","x":1e999}"#,
            r#"{"model":"m","x":-1e999}"#,
            r#"{"model":"m","x":1e-999}"#,
            r#"{"model":"m","x":01}"#,
            r#"{"model":"m","x":1.}"#,
            r#"{"model":"m","x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
            "{\"model\":\"m\",\"x\":\"a\u{1}b\"}",
            "{\"model\":\"m\",\"x\":\"tab\tinside\"}",
            r#"{"model":"m",}"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m"}}"#,
            r#"{"model":"m"}{}"#,
            "",
            "   ",
        ] {
            agree(body.as_bytes());
        }
        // Invalid UTF-8, inside a string and outside.
        agree(b"{\"model\":\"m\",\"x\":\"\xff\"}");
        agree(b"{\"model\":\"m\"}\xff");
    }

    #[test]
    fn splicing_agrees_with_the_tree_on_the_fuzz_corpus() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fuzz/corpus/normalize");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            if let [_, body @ ..] = data.as_slice() {
                agree(body);
                n += 1;
            }
        }
        assert!(n >= 4, "{n} corpus files in {}", dir.display());
    }

    proptest::proptest! {
        /// Bodies built from the fields the normaliser looks at, with values of every kind
        /// and blanks anywhere.
        #[test]
        fn splicing_agrees_with_the_tree_on_generated_bodies(
            fields in proptest::collection::btree_map(
                proptest::sample::select(vec![
                    "model", "stream", "store", "instructions", "input", "tools", "service_tier",
                    "reasoning", "previous_response_id", "prompt_cache_key", "session_id",
                    "conversation_id", "type", "generate", "temperature", "metadata", "text",
                    "include", "x-extra",
                ]),
                proptest::sample::select(vec![
                    r#""m""#, r#""""#, "null", "true", "false", "0", "-1.5e3", r#""priority""#,
                    r#""fast""#, r#""hi "there"""#, "[]", "{}",
                    r#"[{"role":"system","content":"x"},{"role":"user"},"s",7]"#,
                    r#"[{"type":"web_search_preview"},{"type":"function","name":"f"}]"#,
                    r#"{"effort":"high"}"#, r#"{"summary":"auto","effort":""}"#,
                    r#""system""#, r#"{"a":[1,{"b":null}]}"#,
                ]),
                0..10,
            ),
            ws in proptest::sample::select(vec!["", " ", "
	 ", "
"]),
        ) {
            let mut body = format!("{ws}{{");
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    body.push_str(&format!("{ws},"));
                }
                body.push_str(&format!("{ws}\"{k}\"{ws}:{ws}{v}"));
            }
            body.push_str(&format!("{ws}}}{ws}"));
            agree(body.as_bytes());
        }
    }

    #[test]
    fn a_repeated_field_counts_once_with_its_last_value() {
        let (n, v) = norm(r#"{"model":"a","x":1,"model":"b","x":2,"store":true,"store":false}"#);
        assert_eq!(n.model, "b");
        assert_eq!(n.store, Some(false));
        assert_eq!(v["x"].as_i64(), Some(2));
        let text = String::from_utf8(n.body).unwrap();
        assert_eq!(text.matches("\"model\"").count(), 1, "{text}");
        assert_eq!(text.matches("\"x\"").count(), 1, "{text}");
        assert_eq!(text.matches("\"store\"").count(), 1, "{text}");
    }

    #[test]
    fn many_fields_and_repeats_past_the_scan_limit() {
        let mut body = String::from(r#"{"model":"m""#);
        for i in 0..200_000 {
            body.push_str(&format!(r#","f{}":{i}"#, i % 50_000));
        }
        body.push('}');
        let (_, v) = norm(&body);
        assert_eq!(
            v["f7"].as_i64(),
            Some(150_007),
            "the last value of a name sent four times"
        );
        use sonic_rs::JsonContainerTrait;
        assert_eq!(v.as_object().map(|o| o.len()), Some(50_000 + 5));
    }

    #[test]
    fn untouched_values_keep_the_clients_bytes() {
        let body = br#"{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"caf\u00e9 1.50"}]}],"n2":1.50e+2,"text":{"verbosity":"low"}}"#;
        let n = normalize_responses(body).unwrap();
        let text = String::from_utf8(n.body).unwrap();
        for kept in [
            r#""input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"caf\u00e9 1.50"}]}]"#,
            r#""n2":1.50e+2"#,
            r#""text":{"verbosity":"low"}"#,
        ] {
            assert!(text.contains(kept), "{kept} not in {text}");
        }
    }

    #[test]
    fn rejects_bad_bodies() {
        assert!(normalize_responses(b"{nope").is_err());
        assert_eq!(normalize_responses(b"[]").unwrap_err().param, None);
        assert_eq!(normalize_responses(b"{}").unwrap_err().param, Some("model"));
        assert_eq!(
            normalize_responses(br#"{"model":"m","input":5}"#)
                .unwrap_err()
                .param,
            Some("input")
        );
        assert_eq!(
            normalize_responses(br#"{"model":"m","stream":"yes"}"#)
                .unwrap_err()
                .param,
            Some("stream")
        );
    }

    #[test]
    fn strings_are_written_as_sonic_writes_them() {
        let mut every: String = (0u8..0x80).map(char::from).collect();
        every.push_str("é😀\u{7f}\u{2028}</script>");
        for s in [every.as_str(), "", "plain", "\"\\"] {
            let mut ours = Vec::new();
            write_str(&mut ours, s);
            assert_eq!(ours, sonic_rs::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn installation_ids_inside_the_payload_are_replaced() {
        let turn = r#"{"installation_id":"client-iid","session_id":"s1","request_kind":"turn"}"#;
        let body = format!(
            r#"{{"model":"m","input":[{{"type":"message","role":"user","content":"installation"}}],"client_metadata":{{"thread_id":"t","x-codex-installation-id":"client-iid","x-codex-turn-metadata":{}}},"store":false}}"#,
            sonic_rs::to_string(turn).unwrap_or_default()
        );
        let out = with_installation_id(body.as_bytes(), "acct-iid").expect("changed");
        let v: Value = sonic_rs::from_slice(&out).expect("json");
        assert_eq!(
            v["client_metadata"]["x-codex-installation-id"].as_str(),
            Some("acct-iid")
        );
        assert_eq!(v["client_metadata"]["thread_id"].as_str(), Some("t"));
        let t: Value = sonic_rs::from_str(
            v["client_metadata"]["x-codex-turn-metadata"]
                .as_str()
                .unwrap_or(""),
        )
        .expect("turn json");
        assert_eq!(t["installation_id"].as_str(), Some("acct-iid"));
        assert_eq!(t["session_id"].as_str(), Some("s1"));
        // Byte for byte outside client_metadata.
        assert!(out.starts_with(br#"{"model":"m","input":[{"type":"message","role":"user","content":"installation"}],"client_metadata":{"#));
        assert!(out.ends_with(br#","store":false}"#));
        // Already ours, or nothing to replace: unchanged.
        assert_eq!(with_installation_id(&out, "acct-iid"), None);
        assert_eq!(
            with_installation_id(br#"{"model":"m","input":[]}"#, "x"),
            None
        );
        assert_eq!(
            with_installation_id(
                br#"{"input":"installation","client_metadata":{"a":"b"}}"#,
                "x"
            ),
            None
        );
        assert_eq!(
            turn_metadata_with_installation_id(turn, "acct-iid")
                .as_deref()
                .map(|t| t.contains("acct-iid")),
            Some(true)
        );
        assert_eq!(
            turn_metadata_with_installation_id("not json installation_id", "x"),
            None
        );
    }
}
