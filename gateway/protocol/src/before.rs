//! The body passes as they were at bec3ff1, before issue 25 (each re-read the top level of
//! the body with a strict parser): the reference the differential tests below hold the
//! current ones to, byte for byte, on the recorded Codex CLI request, the fuzz corpus and
//! generated variants.
//!
//! Test-only. The code is the old code, unchanged but for paths (`item_blob`'s kind mapping
//! and the small helpers are copied, being private to their modules).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

use crate::bound::{fingerprint, BlobKind, Stripped};
use crate::normalize::{
    Asked, ModelChoice, NormalizeError, Normalized, DROPPED_FIELDS, INPUT_TYPE_ERROR,
    SESSION_FIELDS,
};

fn err(message: impl Into<String>, param: Option<&'static str>) -> NormalizeError {
    NormalizeError {
        message: message.into(),
        param,
        unknown_model: None,
    }
}

/// Writes `s` as a JSON string.
fn write_str(out: &mut Vec<u8>, s: &str) {
    // Serializing a `&str` cannot fail.
    let _ = sonic_rs::to_writer(&mut *out, s);
}

fn of_item_type(t: Option<&str>) -> BlobKind {
    match t {
        Some("reasoning") => BlobKind::Reasoning,
        Some("compaction") => BlobKind::Compaction,
        _ => BlobKind::Other,
    }
}

/// The key every blob hides behind.
const KEY: &[u8] = b"encrypted_content";

// === normalize.rs at bec3ff1 ===

pub fn normalize_responses_with(
    body: &[u8],
    choose: &dyn Fn(&str) -> ModelChoice,
) -> Result<Normalized, NormalizeError> {
    let parse_err = |e: &dyn std::fmt::Display| {
        err(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    };
    let fields = top_level_fields(body, &parse_err)?;
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

    let mut out = Vec::with_capacity(body.len() + 96);
    out.push(b'{');
    let put_key = |out: &mut Vec<u8>, k: &str| {
        if out.len() > 1 {
            out.push(b',');
        }
        write_str(out, k);
        out.push(b':');
    };
    for (k, v) in &fields {
        let k = k.as_ref();
        let raw = v.as_raw_str().as_bytes();
        match k {
            "previous_response_id" | "type" | "generate" => {}
            k if DROPPED_FIELDS.contains(&k) => {}
            "model" => {
                put_key(&mut out, k);
                match &slug {
                    Some(slug) => write_str(&mut out, slug),
                    None => out.extend_from_slice(raw),
                }
            }
            "stream" => {
                put_key(&mut out, k);
                out.extend_from_slice(b"true");
            }
            "store" => {
                put_key(&mut out, k);
                out.extend_from_slice(b"false");
            }
            "instructions" => {
                put_key(&mut out, k);
                if v.is_null() {
                    out.extend_from_slice(b"\"\"");
                } else {
                    out.extend_from_slice(raw);
                }
            }
            "input" => {
                put_key(&mut out, k);
                if v.is_str() {
                    out.extend_from_slice(
                        br#"[{"type":"message","role":"user","content":[{"type":"input_text","text":"#,
                    );
                    out.extend_from_slice(raw);
                    out.extend_from_slice(b"}]}]");
                } else {
                    rewrite_items(
                        &mut out,
                        raw,
                        br#""system""#,
                        "role",
                        &|r| r == "system",
                        "developer",
                    )
                    .map_err(|e| parse_err(&e))?;
                }
            }
            "tools" if v.is_array() => {
                put_key(&mut out, k);
                let legacy = |t: &str| t.starts_with("web_search") && t != "web_search";
                rewrite_items(
                    &mut out,
                    raw,
                    br#""web_search"#,
                    "type",
                    &legacy,
                    "web_search",
                )
                .map_err(|e| parse_err(&e))?;
            }
            "service_tier" => {
                if priority {
                    put_key(&mut out, k);
                    out.extend_from_slice(b"\"priority\"");
                }
            }
            "reasoning" => {
                put_key(&mut out, k);
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
                        sonic_rs::to_writer(&mut out, &r).map_err(|e| parse_err(&e))?;
                    }
                    None => out.extend_from_slice(raw),
                }
            }
            _ => {
                put_key(&mut out, k);
                out.extend_from_slice(raw);
            }
        }
    }
    // What the backend needs and the client did not send.
    if let (Some(e), None) = (&effort, field("reasoning")) {
        put_key(&mut out, "reasoning");
        out.extend_from_slice(br#"{"effort":"#);
        write_str(&mut out, e);
        out.push(b'}');
    }
    let defaults: [(&str, &[u8]); 4] = [
        ("instructions", b"\"\""),
        ("input", b"[]"),
        ("store", b"false"),
        ("stream", b"true"),
    ];
    for (k, v) in defaults {
        if field(k).is_none() {
            put_key(&mut out, k);
            out.extend_from_slice(v);
        }
    }
    out.push(b'}');
    Ok(Normalized {
        body: out,
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
    })
}

/// The top-level fields of a JSON object body, in order, a repeated name once (at its first
/// place, with its last value). Every value is validated (strict pass, UTF-8 included), and
/// nothing may follow the object.
fn top_level_fields<'a>(
    body: &'a [u8],
    parse_err: &dyn Fn(&dyn std::fmt::Display) -> NormalizeError,
) -> Result<Vec<(std::borrow::Cow<'a, str>, sonic_rs::LazyValue<'a>)>, NormalizeError> {
    let is_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    if body.iter().find(|b| !is_ws(b)) != Some(&b'{') {
        // Not an object: say whether it is JSON at all (the rare path).
        return Err(match sonic_rs::from_slice::<Value>(body) {
            Ok(_) => err("The request body must be a JSON object.", None),
            Err(e) => parse_err(&e),
        });
    }
    let mut fields: Vec<(std::borrow::Cow<'a, str>, sonic_rs::LazyValue<'a>)> = Vec::new();
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
    if !unicode_escapes_valid(body) {
        return Err(parse_err(&"invalid unicode code point in a \\u escape"));
    }
    Ok(fields)
}

/// Every `\uXXXX` escape of `body` (a document the strict pass accepted: backslashes only in
/// strings, each starting a well-formed escape) is four hex digits naming a code point, a
/// high surrogate followed by a low one, as a parser that decodes the strings requires.
fn unicode_escapes_valid(body: &[u8]) -> bool {
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
    for at in memchr::memmem::find_iter(body, b"\\u") {
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
        let Some(cp) = hex(at + 2) else {
            return false;
        };
        from = at + 6;
        match cp {
            0xD800..=0xDBFF => {
                let low = (body.get(at + 6..at + 8) == Some(b"\\u"))
                    .then(|| hex(at + 8))
                    .flatten();
                if !low.is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)) {
                    return false;
                }
                from = at + 12;
            }
            0xDC00..=0xDFFF => return false,
            _ => {}
        }
    }
    true
}

/// Writes the array `raw` (validated) to `out` with `key` set to `to` in every object item
/// whose `key` is a string that `needs` it; every other item is copied as it is. Only an item
/// whose text contains `hint` (the value's raw JSON, opening quote included: a letter can be
/// escaped only as `\u`, so any other spelling contains one) has its `key` read, and only an
/// item that changes is parsed and written again.
fn rewrite_items(
    out: &mut Vec<u8>,
    raw: &[u8],
    hint: &[u8],
    key: &str,
    needs: &dyn Fn(&str) -> bool,
    to: &str,
) -> Result<(), sonic_rs::Error> {
    let finder = memchr::memmem::Finder::new(hint);
    let maybe = |b: &[u8]| finder.find(b).is_some() || memchr::memmem::find(b, b"\\u").is_some();
    if !maybe(raw) {
        // No item can need it (a SIMD search of the whole array): copied as it is.
        out.extend_from_slice(raw);
        return Ok(());
    }
    out.push(b'[');
    for (i, item) in sonic_rs::to_array_iter(raw).enumerate() {
        let item = item?;
        if i > 0 {
            out.push(b',');
        }
        let bytes = item.as_raw_str().as_bytes();
        let change = item.is_object()
            && maybe(bytes)
            && sonic_rs::get(bytes, &[key])
                .ok()
                .is_some_and(|v| v.as_str().is_some_and(needs));
        if change {
            let mut v: Value = sonic_rs::from_slice(bytes)?;
            if let Some(o) = v.as_object_mut() {
                o.insert(&key, to);
            }
            sonic_rs::to_writer(&mut *out, &v)?;
        } else {
            out.extend_from_slice(bytes);
        }
    }
    out.push(b']');
    Ok(())
}

/// The installation id the Codex CLI repeats inside its payload (docs/protocol.md#one-installation-per-account):
/// `body` with the body's `client_metadata` carrying `id` in place of the client's, in
/// `x-codex-installation-id` and in the `installation_id` of the `x-codex-turn-metadata` JSON
/// string it mirrors. `None`: nothing to change (one SIMD search when the body names no
/// installation). Only the `client_metadata` object is rewritten; the rest of the body is
/// copied byte for byte.
pub fn with_installation_id(body: &[u8], id: &str) -> Option<Vec<u8>> {
    memchr::memmem::find(body, b"installation")?;
    let mut span = None;
    for entry in sonic_rs::to_object_iter(body) {
        let (k, v) = entry.ok()?;
        if k == "client_metadata" && v.is_object() {
            let raw = v.as_raw_str().as_bytes();
            let (at, base) = (raw.as_ptr() as usize, body.as_ptr() as usize);
            if at < base || at + raw.len() > base + body.len() {
                return None;
            }
            span = Some((at - base, at - base + raw.len()));
        }
    }
    let (start, end) = span?;
    let mut meta: Value = sonic_rs::from_slice(&body[start..end]).ok()?;
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
        .and_then(|t| crate::normalize::turn_metadata_with_installation_id(t, id));
    if let Some(t) = turn {
        o.insert(&"x-codex-turn-metadata", t.as_str());
        changed = true;
    }
    if !changed {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 16);
    out.extend_from_slice(&body[..start]);
    sonic_rs::to_writer(&mut out, &meta).ok()?;
    out.extend_from_slice(&body[end..]);
    Some(out)
}

// === bound.rs at bec3ff1 ===

/// Whether `raw` may hold a blob: the key, or a `\u` escape that could spell it.
fn maybe(raw: &[u8]) -> bool {
    memchr::memmem::find(raw, KEY).is_some() || memchr::memmem::find(raw, b"\\u").is_some()
}

/// The `input` array of a body: its raw bytes and where they are in `body`.
fn input_span(body: &[u8]) -> Option<(usize, usize)> {
    let mut found = None;
    for entry in sonic_rs::to_object_iter(body) {
        let (k, v) = entry.ok()?;
        if k == "input" && v.is_array() {
            let raw = v.as_raw_str().as_bytes();
            let (at, base) = (raw.as_ptr() as usize, body.as_ptr() as usize);
            if at < base || at + raw.len() > base + body.len() {
                return None;
            }
            // A repeated name counts with its last value.
            found = Some((at - base, at - base + raw.len()));
        }
    }
    found
}

/// The blob of an item (`encrypted_content` as a string) and the item's kind.
fn item_blob(item: &Value) -> Option<(BlobKind, &str)> {
    let blob = item.get("encrypted_content")?.as_str()?;
    let kind = of_item_type(item.get("type").and_then(|t| t.as_str()));
    Some((kind, blob))
}

/// Calls `f` with the kind and fingerprint of every blob in `body`'s `input`.
pub fn input_blobs(body: &[u8], mut f: impl FnMut(BlobKind, u64)) {
    if !maybe(body) {
        return;
    }
    let Some((start, end)) = input_span(body) else {
        return;
    };
    for item in sonic_rs::to_array_iter(&body[start..end]) {
        let Ok(item) = item else {
            return;
        };
        let bytes = item.as_raw_str().as_bytes();
        if !item.is_object() || !maybe(bytes) {
            continue;
        }
        let Ok(v) = sonic_rs::from_slice::<Value>(bytes) else {
            continue;
        };
        if let Some((kind, blob)) = item_blob(&v) {
            f(kind, fingerprint(blob));
        }
    }
}

/// Whether an item without its blob still says something portable: any field but `type`,
/// `id` and `status`, or a non-empty `summary` / `content`.
fn portable_rest(item: &Value) -> bool {
    let Some(o) = item.as_object() else {
        return false;
    };
    o.iter().any(|(k, v)| match k {
        "type" | "id" | "status" | "encrypted_content" => false,
        "summary" | "content" => v.as_array().is_some_and(|a| !a.is_empty()) || v.is_str(),
        _ => !v.is_null(),
    })
}

pub fn strip(body: &[u8], keep: &dyn Fn(BlobKind, u64) -> bool) -> Option<(Vec<u8>, Stripped)> {
    if !maybe(body) {
        return None;
    }
    let (start, end) = input_span(body)?;
    let raw = &body[start..end];
    let mut stripped = Stripped::default();
    let mut changed = false;
    let mut wrote = 0usize;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..start]);
    out.push(b'[');
    for item in sonic_rs::to_array_iter(raw) {
        let item = item.ok()?;
        let bytes = item.as_raw_str().as_bytes();
        let mut write = |out: &mut Vec<u8>, b: &[u8]| {
            if wrote > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b);
            wrote += 1;
        };
        if !item.is_object() || !maybe(bytes) {
            write(&mut out, bytes);
            continue;
        }
        let mut v: Value = match sonic_rs::from_slice(bytes) {
            Ok(v) => v,
            Err(_) => return None,
        };
        let Some((kind, blob)) = item_blob(&v) else {
            write(&mut out, bytes);
            continue;
        };
        if keep(kind, fingerprint(blob)) {
            write(&mut out, bytes);
            continue;
        }
        changed = true;
        match kind {
            BlobKind::Reasoning => stripped.reasoning += 1,
            BlobKind::Compaction => stripped.compaction += 1,
            BlobKind::Other => stripped.other += 1,
        }
        if kind == BlobKind::Compaction {
            continue;
        }
        if let Some(o) = v.as_object_mut() {
            o.remove(&"encrypted_content");
            o.remove(&"id");
        }
        if portable_rest(&v) {
            let mut b = Vec::with_capacity(bytes.len());
            sonic_rs::to_writer(&mut b, &v).ok()?;
            write(&mut out, &b);
        }
    }
    if !changed {
        return None;
    }
    out.push(b']');
    out.extend_from_slice(&body[end..]);
    Some((out, stripped))
}

// === the differential tests ===

mod tests {
    use crate::{bound, normalize};

    fn choose_for(mode: u8) -> impl Fn(&str) -> ModelChoice {
        move |m: &str| match mode % 4 {
            0 => ModelChoice::Keep,
            1 => ModelChoice::Rewrite {
                slug: format!("slug-of-{m}"),
                effort: Some("low".into()),
            },
            2 => ModelChoice::Rewrite {
                slug: "plain-slug".into(),
                effort: None,
            },
            _ => ModelChoice::Reject,
        }
    }

    use super::{ModelChoice, NormalizeError, Normalized};

    fn show(body: &[u8]) -> String {
        let s = String::from_utf8_lossy(body);
        if s.len() > 300 {
            format!(
                "{}...{} ({} bytes)",
                &s[..150],
                &s[s.len() - 150..],
                s.len()
            )
        } else {
            s.into_owned()
        }
    }

    /// A value with its object keys sorted, and a string that holds a JSON object (the turn
    /// metadata) read as one.
    fn canon(v: &sonic_rs::Value) -> String {
        use sonic_rs::{JsonContainerTrait, JsonValueTrait};
        if let Some(o) = v.as_object() {
            let mut kv: Vec<(String, String)> =
                o.iter().map(|(k, v)| (k.to_owned(), canon(v))).collect();
            kv.sort();
            let inner: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
            format!("{{{}}}", inner.join(","))
        } else if let Some(a) = v.as_array() {
            let inner: Vec<String> = a.iter().map(canon).collect();
            format!("[{}]", inner.join(","))
        } else if let Some(inner) = v
            .as_str()
            .and_then(|s| sonic_rs::from_str::<sonic_rs::Value>(s).ok())
            .filter(|i| i.is_object())
        {
            format!("json:{}", canon(&inner))
        } else {
            sonic_rs::to_string(v).unwrap()
        }
    }

    /// The same bytes, but for the order of keys in the objects the old code wrote again from
    /// a tree: sonic-rs keeps a changed object in a hash map, whose order is random (per map),
    /// so the old code's own output varies from run to run there. Such bytes are the same
    /// length and the same JSON with keys sorted.
    fn assert_same_bytes(new: &[u8], old: &[u8], what: &str) {
        if new == old {
            return;
        }
        let parse = |b: &[u8]| sonic_rs::from_slice::<sonic_rs::Value>(b).ok();
        let (n, o) = (parse(new), parse(old));
        assert!(
            new.len() == old.len() && n.is_some() && n.map(|n| canon(&n)) == o.map(|o| canon(&o)),
            "{what}:\nnew {}\nold {}",
            show(new),
            show(old)
        );
    }

    fn assert_same_normalized(
        new: &Result<Normalized, NormalizeError>,
        old: &Result<Normalized, NormalizeError>,
        what: &str,
    ) {
        match (new, old) {
            (Ok(n), Ok(o)) => {
                assert_same_bytes(&n.body, &o.body, what);
                let strip = |n: &Normalized| Normalized {
                    body: Vec::new(),
                    ..n.clone()
                };
                assert_eq!(strip(n), strip(o), "{what}");
            }
            _ => assert_eq!(new, old, "{what}"),
        }
    }

    fn assert_same_stripped(
        new: Option<(Vec<u8>, bound::Stripped)>,
        old: Option<(Vec<u8>, bound::Stripped)>,
        what: &str,
    ) {
        match (new, old) {
            (Some((nb, nn)), Some((ob, on))) => {
                assert_eq!(nn, on, "{what}");
                assert_same_bytes(&nb, &ob, what);
            }
            (n, o) => assert_eq!(n, o, "{what}"),
        }
    }

    /// Every body pass, before and now, on `body`: the same result, byte for byte.
    fn same(body: &[u8]) {
        for mode in 0..4u8 {
            let choose = choose_for(mode);
            let new = normalize::normalize_responses_with(body, &choose);
            let old = super::normalize_responses_with(body, &choose);
            assert_same_normalized(&new, &old, &format!("mode {mode}: {}", show(body)));
            let owned = normalize::normalize_responses_owned(body.to_vec(), &choose);
            assert_same_normalized(&owned, &old, &format!("owned, mode {mode}: {}", show(body)));
            if let Ok(n) = new {
                later_passes_agree(&n.body);
            }
        }
        // A body the strict pass accepts is valid JSON: the later passes may be handed one
        // the gateway did not normalise (a translated body) that looks like it, one that
        // names each member once (as every body the gateway writes does).
        if super::normalize_responses_with(body, &|_| ModelChoice::Keep).is_ok() && names_once(body)
        {
            later_passes_agree(body);
        }
    }

    /// Whether the top level of `body` names each member once (escapes decoded).
    fn names_once(body: &[u8]) -> bool {
        let mut names = std::collections::HashSet::new();
        sonic_rs::to_object_iter(body).all(|e| e.is_ok_and(|(k, _)| names.insert(k.to_string())))
    }

    #[test]
    fn every_normalised_body_names_each_member_once() {
        for body in [
            r#"{"model":"a","input":[],"model":"b","client_metadata":{},"client\u005fmetadata":5}"#,
            r#"{"model":"m","\u0069nput":"x","input":[1],"x":1,"x":2,"x":3}"#,
        ] {
            assert!(!names_once(body.as_bytes()));
            let n = normalize::normalize_responses(body.as_bytes()).unwrap();
            assert!(names_once(&n.body), "{}", show(&n.body));
        }
    }

    /// The passes that run on a normalised body (per attempt, per request): the same result.
    fn later_passes_agree(body: &[u8]) {
        let ids = [
            "f95987d4-a6df-4b78-9ef5-72ffcf008a02",
            "acct-0000-4000-8000-000000000000",
            "",
            "a\"quoted\\id",
        ];
        for id in ids {
            let what = format!("installation id {id:?}: {}", show(body));
            match (
                normalize::with_installation_id(body, id),
                super::with_installation_id(body, id),
            ) {
                (Some(n), Some(o)) => assert_same_bytes(&n, &o, &what),
                (n, o) => assert_eq!(n, o, "{what}"),
            }
        }
        let mut new = Vec::new();
        bound::input_blobs(body, |k, f| new.push((k, f)));
        let mut old = Vec::new();
        super::input_blobs(body, |k, f| old.push((k, f)));
        assert_eq!(new, old, "blobs: {}", show(body));
        assert!(
            old.is_empty() || bound::may_carry_blobs(body),
            "a body with blobs said to carry none: {}",
            show(body)
        );
        assert_same_stripped(
            bound::strip_all(body),
            super::strip(body, &|_, _| false),
            &format!("strip_all: {}", show(body)),
        );
        let some = |_: bound::BlobKind, fp: u64| fp.is_multiple_of(2);
        assert_same_stripped(
            bound::strip(body, &some),
            super::strip(body, &some),
            &format!("strip: {}", show(body)),
        );
    }

    fn corpus() -> Vec<(String, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fuzz/corpus/normalize");
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                let data = std::fs::read(&p).unwrap();
                // The first byte is the fuzz target's mode.
                (
                    p.display().to_string(),
                    data.get(1..).unwrap_or(&[]).to_vec(),
                )
            })
            .collect();
        files.sort();
        files
    }

    fn recorded() -> Vec<u8> {
        corpus()
            .into_iter()
            .find(|(n, _)| n.ends_with("seed-codex-cli-0.171.0-recorded"))
            .expect("the recorded Codex CLI request")
            .1
    }

    #[test]
    fn the_recorded_codex_cli_request_and_the_corpus() {
        let files = corpus();
        assert!(files.len() >= 5, "{} corpus files", files.len());
        for (_, body) in &files {
            same(body);
        }
        // The recorded request: normalised in its own buffer (only `instructions` is added,
        // at its end), its installation id replaced, and it carries no blob.
        let mut own = recorded();
        own.reserve_exact(64);
        let at = own.as_ptr();
        let n = normalize::normalize_responses_owned(own, &|_| ModelChoice::Keep).unwrap();
        assert!(std::ptr::eq(n.body.as_ptr(), at), "copied");
        // A buffer with far more room than the body needs is not kept.
        let mut roomy = recorded();
        roomy.reserve(roomy.len() + 64 * 1024);
        let n2 = normalize::normalize_responses_owned(roomy, &|_| ModelChoice::Keep).unwrap();
        assert!(n2.body.capacity() < n2.body.len() + 1024);
        assert_eq!(n2, n);
        assert!(n.body.ends_with(br#"},"instructions":""}"#));
        assert_eq!(n, normalize::normalize_responses(&recorded()).unwrap());
        // Its metadata is written as a tree would write it: the ids are spliced in, in the
        // client's order (the old tree wrote them in a random one), and nothing else changes.
        let changed = normalize::with_installation_id(&n.body, "acct-iid").unwrap();
        let client = "f95987d4-a6df-4b78-9ef5-72ffcf008a02";
        let expected = String::from_utf8(n.body.clone())
            .unwrap()
            .replace(client, "acct-iid");
        assert_eq!(String::from_utf8(changed).unwrap(), expected);
        let mut blobs = 0;
        bound::input_blobs(&n.body, |_, _| blobs += 1);
        assert_eq!(blobs, 0);
    }

    #[test]
    fn small_bodies_at_every_edge() {
        for body in [
            r#"{"model":"gpt-5","input":"say hi","temperature":0.2,"max_output_tokens":5,"store":true}"#,
            r#" {"model" : "m" , "stream" : null , "instructions" : null }  "#,
            r#"{"model":"m","input":"caf\u00e9 \ud83d\ude00","instructions":"be \"brief\"\n"}"#,
            r#"{"model":"m","input":[{"type":"message","role":"system","content":"x"},{"role":"\u0073ystem","content":[]},{"role":"user","content":"system"},"loose",5,{"type":"function_call_output","output":"a system prompt"}]}"#,
            r#"{"model":"m","input":[ {"role":"user","content":"caf\u00e9"} , {"role":"user"} ]}"#,
            r#"{"model":"m","input":[ {"role":"user","content":"\"system\""} , 1 ]}"#,
            r#"{"model":"m","tools":[{"type":"web_search_preview"},{"type":"web_search_preview_2025_03_11","x":1},{"type":"function","name":"web_search"},{"type":"\u0077eb_search"},"x"],"tool_choice":"auto"}"#,
            r#"{"model":"m","tools":[ {"type":"web_search"} , {"type":"function","name":"f"} ]}"#,
            r#"{"model":"m","tools":[{"type":"web_search\u005fpreview"},{"type":"web_search\"x"}]}"#,
            r#"{"model":"m","tools":{"type":"web_search_preview"}}"#,
            r#"{"model":"m","input":[],"client_metadata":{"x-codex-installation-id":"c"}}"#,
            r#"{"model":"m","client_metadata":{"x-codex-installation-id":"c"},"client_metadata":5}"#,
            r#"{"model":"m","client_metadata":5,"client\u005fmetadata":{ "x-codex-installation-id" : "c" }}"#,
            r#"{"model":"m","client_metadata":{"x-codex-\u0069nstallation-id":"c"},"input":"installation"}"#,
            r#"{"model":"m","client_metadata":{"x-codex-\u0069nstallation-id":"c"}}"#,
            r#"{"model":"m","client_metadata":{"x-codex-turn-metadata":"{\"installation_id\":\"c\",\"n\":1.0}","a":[1,"}"]}}"#,
            r#"{"model":"m","client_metadata":{"x-codex-turn-metadata":"{\"installation_id\":\"acct-iid\"}","x-codex-installation-id":"acct-iid"}}"#,
            r#"{"model":"m","input":[{"type":"reasoning","encrypted_content":"b1","summary":[]},{"type":"compaction","encrypted_content":"b2"}],"input":"x"}"#,
            r#"{"model":"m","input":"x","input":[{"type":"reasoning","encrypted_content":"b1","summary":[]}]}"#,
            r#"{"model":"m","input":[{"type":"reasoning","\u0065ncrypted_content":"b1","summary":[{"type":"summary_text","text":"t"}],"id":"rs"}, {"type":"web_search_call","encrypted_content":"b3"} ],"include":["reasoning.encrypted_content"]}"#,
            r#"{"model":"m","input":[{"type":"message","role":"user","content":"\"encrypted_content\":\"x\""},{"type":"reasoning","encrypted_content":5}]}"#,
            r#"{"model":"m","input":[{"type":"reasoning","encrypted_content":"a\\\"b","summary":[]},{"type":"reasoning","encrypted_content":"]}\\"}],"x":"{\\\"input\\\":[]}"}"#,
            r#"{"model":"m","input":[[{"encrypted_content":"nested"}],{"x":{"encrypted_content":"deep"}}]}"#,
            r#"{"model":"m","x":"\\u0073","input":[{"role":"system"}]}"#,
            r#"{"model":"m","x":1e999}"#,
            r#"{"model":"m","a\"b\\c\n":1,"\u0001":2,"caf\u00e9":3,"é😀":4}"#,
            r#"{"model":"m","input":5}"#,
            r#"{}"#,
            r#"[]"#,
            "",
            r#"{"model":"m"} x"#,
            r#"{"model":"m","x":"\ud800"}"#,
            "{\n\t\"model\":\"m\",\r\n\"input\":[ ]\n}\n",
        ] {
            same(body.as_bytes());
        }
    }

    /// The recorded request taken apart into its members (raw, as sent).
    fn members_of(body: &[u8]) -> Vec<(String, String)> {
        sonic_rs::to_object_iter(body)
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.to_string(), v.as_raw_str().to_owned())
            })
            .collect()
    }

    /// A body from raw members: `blank` around every `:` and `,`, keys written as given.
    fn render(members: &[(String, String)], blank: &str) -> Vec<u8> {
        let mut s = format!("{blank}{{");
        for (i, (k, v)) in members.iter().enumerate() {
            if i > 0 {
                s.push_str(&format!("{blank},"));
            }
            s.push_str(&format!("{blank}{k}{blank}:{blank}{v}"));
        }
        s.push_str(&format!("{blank}}}{blank}"));
        s.into_bytes()
    }

    /// `array` (raw) with `extra` raw items: before its first item, after its last, or both.
    fn with_items(array: &str, extra: &[&str], at: u8, blank: &str) -> String {
        let inner = array
            .trim()
            .strip_prefix('[')
            .unwrap()
            .strip_suffix(']')
            .unwrap();
        let extra = extra.join(&format!("{blank},{blank}"));
        let mut parts: Vec<&str> = Vec::new();
        if at.is_multiple_of(2) {
            parts.push(&extra);
        }
        if !inner.trim().is_empty() {
            parts.push(inner);
        }
        if at >= 1 {
            parts.push(&extra);
        }
        format!(
            "[{blank}{}{blank}]",
            parts.join(&format!("{blank},{blank}"))
        )
    }

    const BLOBS: &[&str] = &[
        r#"{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thought"}],"encrypted_content":"gAAA-A1"}"#,
        r#"{"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"gAAA-B1"}"#,
        r#"{"type":"compaction","id":"cmp_1","encrypted_content":"gAAA-C1"}"#,
        r#"{"type":"reasoning","summary":[],"\u0065ncrypted_content":"gAAA-X"}"#,
        r#"{ "type" : "web_search_call" , "encrypted_content" : "gAAA-Y\"}]" , "action" : {"q":"[{"} }"#,
        r#"{"type":"message","role":"system","content":[{"type":"input_text","text":"\"encrypted_content\" and \\ and \"}]\""}]}"#,
        r#"{"type":"message","role":"\u0073ystem","content":"caf\u00e9 \ud83d\ude00"}"#,
        r#""a string item""#,
        "7",
    ];

    const METADATA: &[&str] = &[
        r#"{"x-codex-installation-id":"client-iid"}"#,
        r#"{ "thread_id" : "t" , "x-codex-installation-id" : "client-iid" , "x-codex-turn-metadata" : "{\"installation_id\":\"client-iid\",\"session_id\":\"s\"}" }"#,
        r#"{"x-codex-turn-metadata":"{\"session_id\":\"s\"}","note":"installation"}"#,
        r#"{"x-codex-installation-id":"f95987d4-a6df-4b78-9ef5-72ffcf008a02"}"#,
        r#"{"a":{"b":["}","{"]},"x-codex-\u0069nstallation-id":"c\u00e9"}"#,
        "{}",
        "5",
        "null",
    ];

    const TOOLS: &[&str] = &[
        r#"{"type":"web_search_preview"}"#,
        r#"{"type":"\u0077eb_search_preview","search_context_size":"low"}"#,
        r#"{"type":"web_search"}"#,
        r#"{"type":"function","name":"web_search_preview","parameters":{"type":"object"}}"#,
    ];

    /// The recorded request with one part changed at a time, and with many at once.
    #[test]
    fn variants_of_the_recorded_request() {
        let body = recorded();
        let base = members_of(&body);
        let get = |k: &str| base.iter().find(|(n, _)| n == k).unwrap().1.clone();
        let key = |k: &str| format!("\"{k}\"");
        let quoted: Vec<(String, String)> = base.iter().map(|(k, v)| (key(k), v.clone())).collect();
        let mut bodies: Vec<Vec<u8>> = Vec::new();
        for blank in ["", " ", "\n  "] {
            bodies.push(render(&quoted, blank));
            // Reordered: client_metadata first, input last; reversed.
            let mut m = quoted.clone();
            m.rotate_right(1);
            bodies.push(render(&m, blank));
            let mut m = quoted.clone();
            m.reverse();
            bodies.push(render(&m, blank));
            // Blobs and system roles in the input, at either end.
            for at in 0..3 {
                let mut m = quoted.clone();
                for (k, v) in m.iter_mut() {
                    if k == "\"input\"" {
                        *v = with_items(&get("input"), BLOBS, at, blank);
                    }
                    if k == "\"tools\"" {
                        *v = with_items(&get("tools"), TOOLS, at, blank);
                    }
                }
                bodies.push(render(&m, blank));
                m.rotate_left(3);
                bodies.push(render(&m, blank));
            }
            // client_metadata in every shape, escaped, repeated, missing.
            for meta in METADATA {
                let mut m = quoted.clone();
                m.last_mut().unwrap().1 = meta.to_string();
                bodies.push(render(&m, blank));
                let mut again = m.clone();
                again.push((key("client_metadata"), "5".into()));
                bodies.push(render(&again, blank));
                again.insert(
                    0,
                    (r#""client\u005fmetadata""#.into(), get("client_metadata")),
                );
                bodies.push(render(&again, blank));
                m.pop();
                m.push((r#""client\u005fmetadata""#.into(), meta.to_string()));
                bodies.push(render(&m, blank));
            }
            let mut m = quoted.clone();
            m.pop();
            bodies.push(render(&m, blank));
            // input repeated: the last array counts.
            let mut m = quoted.clone();
            m.push((key("input"), format!("[{}]", BLOBS[1])));
            bodies.push(render(&m, blank));
            m.push((r#""\u0069nput""#.into(), r#""text""#.into()));
            bodies.push(render(&m, blank));
        }
        // Pretty-printed as a whole (blanks inside every value).
        let v: sonic_rs::Value = sonic_rs::from_slice(&body).unwrap();
        bodies.push(sonic_rs::to_string_pretty(&v).unwrap().into_bytes());
        for b in &bodies {
            same(b);
        }
        assert!(bodies.len() > 100, "{}", bodies.len());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Bodies made of the members the passes look at, in any order, repeated or not, with
        /// values of every shape and blanks anywhere.
        #[test]
        fn generated_bodies(
            members in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "model", "stream", "store", "input", "tools", "client_metadata",
                        "client\\u005fmetadata", "\\u0069nput", "include", "instructions",
                        "reasoning", "service_tier", "x",
                    ]),
                    0..12usize,
                    proptest::collection::vec(0..BLOBS.len(), 0..4),
                ),
                1..9,
            ),
            blank in proptest::sample::select(vec!["", " ", "\n\t", "\r\n "]),
        ) {
            let mut m: Vec<(String, String)> = vec![("\"model\"".into(), "\"m\"".into())];
            for (k, shape, items) in members {
                let picked: Vec<&str> = items.iter().map(|i| BLOBS[*i]).collect();
                let v = match (k, shape) {
                    ("client_metadata" | "client\\u005fmetadata", s) => {
                        METADATA[s % METADATA.len()].to_string()
                    }
                    ("tools", s) => with_items("[]", &TOOLS[..s % TOOLS.len() + 1], 1, blank),
                    (_, 0) => r#""installation""#.into(),
                    (_, 1) => "true".into(),
                    (_, 2) => "null".into(),
                    (_, 3) => "-1.5e3".into(),
                    (_, 4) => r#"{"effort":"high","encrypted_content":"e"}"#.into(),
                    (_, 5) => r#""\"encrypted_content\"\\""#.into(),
                    _ => with_items("[]", &picked, 1, blank),
                };
                m.push((format!("\"{k}\""), v));
            }
            same(&render(&m, blank));
        }
    }
}
