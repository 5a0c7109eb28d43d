use proptest::{prelude::*, strategy::ValueTree};
use sonic_rs::JsonValueTrait;

use super::*;
use crate::events::usage_of_terminal;

/// The reader this module replaced (the depth check, sonic-rs's validating `get`, a tree of
/// the usage value), kept unchanged as the flat pass's fallback: every answer of the flat pass
/// must be its answer.
fn reference(data: &[u8]) -> Option<Usage> {
    crate::events::usage_by_tree(data)
}

/// What the pipeline read the response id with: sonic-rs's lazy `get` and its `as_str`.
fn reference_id(data: &[u8]) -> Option<String> {
    sonic_rs::get(data, &["response", "id"])
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

/// The flat pass answers the id as the reference does, when it answers; the reader always
/// does.
fn check_id(data: &[u8]) -> Result<(), TestCaseError> {
    let want = reference_id(data);
    if let Ok(got) = super::response_id(data) {
        prop_assert_eq!(
            got.map(str::to_owned),
            want.clone(),
            "{}",
            String::from_utf8_lossy(data)
        );
    }
    prop_assert_eq!(crate::events::response_id(data), want);
    Ok(())
}

/// The flat pass over a terminal event.
fn read(data: &[u8]) -> Result<Option<Usage>, Unsure> {
    super::usage(data)
}

/// The flat pass answers `data` itself, and as the reference does.
#[track_caller]
fn fast(data: &str) -> Option<Usage> {
    let got = read(data.as_bytes());
    assert_eq!(got, Ok(reference(data.as_bytes())), "{data}");
    assert_eq!(
        usage_of_terminal(data.as_bytes()),
        reference(data.as_bytes())
    );
    got.unwrap_or(None)
}

/// The flat pass leaves `data` to the tree reader.
#[track_caller]
fn unsure(data: &str) -> Option<Usage> {
    assert_eq!(read(data.as_bytes()), Err(Unsure), "{data}");
    let want = reference(data.as_bytes());
    assert_eq!(usage_of_terminal(data.as_bytes()), want, "{data}");
    want
}

fn usage(i: u64, c: u64, o: u64, r: u64, t: u64) -> Option<Usage> {
    Some(Usage {
        input_tokens: i,
        cached_tokens: c,
        output_tokens: o,
        reasoning_tokens: r,
        total_tokens: t,
    })
}

/// A `response.completed` event as mock-codex and the Codex backend write it.
fn completed(output: &str, usage: &str) -> String {
    format!(
        r#"{{"type":"response.completed","sequence_number":11,"response":{{"id":"resp_1","object":"response","created_at":1,"status":"completed","background":false,"error":null,"incomplete_details":null,"instructions":null,"model":"gpt-5.5","output":[{output}],"parallel_tool_calls":true,"reasoning":null,"service_tier":"default","store":false,"tool_choice":"auto","tools":[],"usage":{usage}}}}}"#
    )
}

const FULL: &str = r#"{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":15}"#;

#[test]
fn reads_a_real_terminal_event_in_one_pass() {
    let msg = r#"{"id":"msg_1","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Hello \"usage\": {\"input_tokens\":99} \\ caf\u00e9 ☕ [[{{"}],"role":"assistant"}"#;
    assert_eq!(fast(&completed(msg, FULL)), usage(10, 4, 5, 2, 15));
    assert_eq!(fast(&completed("", FULL)), usage(10, 4, 5, 2, 15));
    // response.incomplete and response.failed carry the same response object.
    let failed = r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_error","message":"boom"},"usage":null}}"#;
    assert_eq!(fast(failed), usage(0, 0, 0, 0, 0));
}

#[test]
fn usage_absent_null_or_not_an_object() {
    assert_eq!(
        fast(r#"{"type":"response.completed","response":{"id":"r"}}"#),
        None
    );
    assert_eq!(fast(r#"{"type":"response.completed","response":{}}"#), None);
    assert_eq!(fast(r#"{"type":"response.completed"}"#), None);
    assert_eq!(fast(r#"{}"#), None);
    assert_eq!(fast(&completed("", "null")), usage(0, 0, 0, 0, 0));
    assert_eq!(fast(&completed("", "7")), usage(0, 0, 0, 0, 0));
    assert_eq!(fast(&completed("", r#""x""#)), usage(0, 0, 0, 0, 0));
    assert_eq!(
        fast(&completed("", r#"[{"input_tokens":3}]"#)),
        usage(0, 0, 0, 0, 0)
    );
    assert_eq!(fast(&completed("", "{}")), usage(0, 0, 0, 0, 0));
}

#[test]
fn response_not_an_object_or_not_json() {
    assert_eq!(
        fast(r#"{"response":null,"usage":{"input_tokens":1}}"#),
        None
    );
    assert_eq!(fast(r#"{"response":[{"usage":{"input_tokens":1}}]}"#), None);
    assert_eq!(fast(r#"{"response":"{\"usage\":{}}"}"#), None);
    assert_eq!(fast(r#"[{"response":{"usage":{"input_tokens":1}}}]"#), None);
    assert_eq!(fast(""), None);
    assert_eq!(fast("not json"), None);
    // The first `response` is the one read, as sonic-rs's `get` reads it.
    assert_eq!(
        fast(r#"{"response":{"id":"a"},"response":{"usage":{"input_tokens":1}}}"#),
        None
    );
    assert_eq!(
        fast(
            r#"{"response":{"usage":{"input_tokens":1}},"response":{"usage":{"input_tokens":2}}}"#
        ),
        usage(1, 0, 0, 0, 1)
    );
}

#[test]
fn total_is_the_sum_when_zero_or_absent() {
    let u = |s: &str| fast(&completed("", s));
    assert_eq!(
        u(r#"{"input_tokens":3,"output_tokens":4}"#),
        usage(3, 0, 4, 0, 7)
    );
    assert_eq!(
        u(r#"{"input_tokens":3,"output_tokens":4,"total_tokens":0}"#),
        usage(3, 0, 4, 0, 7)
    );
    assert_eq!(
        u(r#"{"input_tokens":3,"output_tokens":4,"total_tokens":null}"#),
        usage(3, 0, 4, 0, 7)
    );
    assert_eq!(
        u(r#"{"input_tokens":3,"output_tokens":4,"total_tokens":100}"#),
        usage(3, 0, 4, 0, 100)
    );
    // Counters that are not numbers read 0.
    assert_eq!(
        u(r#"{"input_tokens":"3","output_tokens":true,"total_tokens":[1]}"#),
        usage(0, 0, 0, 0, 0)
    );
    assert_eq!(
        u(r#"{"input_tokens":9999999999999999999,"output_tokens":1}"#),
        usage(
            9_999_999_999_999_999_999,
            0,
            1,
            0,
            10_000_000_000_000_000_000
        )
    );
}

#[test]
fn details_absent_or_odd() {
    let u = |s: &str| fast(&completed("", s));
    assert_eq!(
        u(r#"{"input_tokens":3,"output_tokens":4,"total_tokens":7}"#),
        usage(3, 0, 4, 0, 7)
    );
    assert_eq!(
        u(r#"{"input_tokens_details":null,"output_tokens_details":{}}"#),
        usage(0, 0, 0, 0, 0)
    );
    assert_eq!(
        u(r#"{"input_tokens_details":[{"cached_tokens":1}],"output_tokens_details":"x"}"#),
        usage(0, 0, 0, 0, 0)
    );
    assert_eq!(
        u(
            r#"{"input_tokens_details":{"x":{"cached_tokens":9},"cached_tokens":2,"y":[]},"output_tokens_details":{"reasoning_tokens":5}}"#
        ),
        usage(0, 2, 0, 5, 0)
    );
    // Counters are read at their own level only.
    assert_eq!(
        u(r#"{"cached_tokens":1,"reasoning_tokens":2,"extra":{"input_tokens":3}}"#),
        usage(0, 0, 0, 0, 0)
    );
}

#[test]
fn keys_named_usage_elsewhere_do_not_match() {
    // In strings, as a value, deeper, at the top level, in an array.
    assert_eq!(
        fast(
            r#"{"usage":{"input_tokens":1},"response":{"id":"usage","output":[{"usage":{"input_tokens":2}}],"metadata":{"usage":{"input_tokens":3}},"x":"\"usage\":{\"input_tokens\":4}","usage":{"input_tokens":5}}}"#
        ),
        usage(5, 0, 0, 0, 5)
    );
    assert_eq!(
        fast(r#"{"response":{"output":[{"usage":{"input_tokens":2}}],"x":"\"usage\":{"}}"#),
        None
    );
    assert_eq!(fast(r#"{"response":{"usage_":{"input_tokens":1}}}"#), None);
    assert_eq!(fast(r#"{"response":{"usag":{"input_tokens":1}}}"#), None);
    // Escaped keys are compared unescaped by the tree reader: left to it.
    assert_eq!(
        unsure(r#"{"response":{"us\u0061ge":{"input_tokens":1}}}"#),
        usage(1, 0, 0, 0, 1)
    );
    assert_eq!(
        unsure(r#"{"\u0072esponse":{"usage":{"input_tokens":1}}}"#),
        usage(1, 0, 0, 0, 1)
    );
    assert_eq!(
        unsure(&completed("", r#"{"input\u005ftokens":6}"#)),
        usage(6, 0, 0, 0, 6)
    );
}

#[test]
fn escaped_quotes_and_backslashes_in_strings() {
    let out = r#"{"text":"a\\","t2":"\\\"usage\\\":","t3":"\"}]}","t4":"\\\\\\","t5":"\/\b\f\n\r\t\u00e9\uD83D\uDE00"}"#;
    assert_eq!(fast(&completed(out, FULL)), usage(10, 4, 5, 2, 15));
    // Escaped keys inside skipped values are fine.
    let out = r#"{"k\"ey":1,"\\":{"\u0041":[]}}"#;
    assert_eq!(fast(&completed(out, FULL)), usage(10, 4, 5, 2, 15));
}

#[test]
fn whitespace_between_tokens() {
    let spaced = " \r\n\t{ \"type\" : \"response.completed\" ,\n \"response\" :\t{ \"output\" : [ { \"a\" : [ 1 , 2.5e-3 , true , false , null ] } , \"x\" ] ,\r\n \"usage\" : { \"input_tokens\" : 10 , \"input_tokens_details\" : { \"cached_tokens\" : 4 } , \"output_tokens\" : 5 , \"output_tokens_details\" : { \"reasoning_tokens\" : 2 } , \"total_tokens\" : 15 } } } \n";
    assert_eq!(fast(spaced), usage(10, 4, 5, 2, 15));
}

fn nested(n: usize) -> String {
    format!("{}{}", "[".repeat(n), "]".repeat(n))
}

#[test]
fn nesting_past_the_limit_is_refused_before_and_after_the_usage() {
    // Top object (1) and response (2): 126 more levels fit.
    for (n, ok) in [(126, true), (127, false), (10_000, false)] {
        let want = ok.then_some(usage(10, 4, 5, 2, 15)).flatten();
        let before = format!(
            r#"{{"response":{{"output":{},"usage":{FULL}}}}}"#,
            nested(n)
        );
        assert_eq!(fast(&before), want, "before {n}");
        let after = format!(r#"{{"response":{{"usage":{FULL},"tools":{}}}}}"#, nested(n));
        assert_eq!(fast(&after), want, "after {n}");
        let outside = format!(r#"{{"response":{{"usage":{FULL}}},"x":{}}}"#, nested(n + 1));
        assert_eq!(fast(&outside), want, "outside {n}");
        // Unclosed past the end of the object: the depth check still counts it.
        let trailing = format!(r#"{{"response":{{"usage":{FULL}}}}}{}"#, "[".repeat(n + 2));
        assert_eq!(fast(&trailing), want, "trailing {n}");
    }
    // In the usage itself.
    let deep = format!(
        r#"{{"response":{{"usage":{{"input_tokens":1,"x":{}}}}}}}"#,
        nested(125)
    );
    assert_eq!(fast(&deep), usage(1, 0, 0, 0, 1));
    let deep = format!(
        r#"{{"response":{{"usage":{{"input_tokens":1,"x":{}}}}}}}"#,
        nested(126)
    );
    assert_eq!(fast(&deep), None);
}

#[test]
fn malformed_text_is_left_to_the_tree_reader() {
    for data in [
        // before the usage: bad literal, bad number, raw control byte, bad escape, missing colon
        &completed(r#"{"a":tru}"#, FULL),
        &completed(r#"{"a":01}"#, FULL),
        &completed(r#"{"a":1.}"#, FULL),
        &completed(r#"{"a":-}"#, FULL),
        &completed("{\"a\":\"x\u{1}y\"}", FULL),
        &completed(r#"{"a":"\x"}"#, FULL),
        &completed(r#"{"a":"\u12G4"}"#, FULL),
        &completed(r#"{"a" 1}"#, FULL),
        &completed(r#"{"a":1,}"#, FULL),
        &completed(r#"[1,]"#, FULL),
        &completed(r#"{"a":[1}"#, FULL),
        // a malformed usage value itself (nothing after it is checked)
        &completed("", "01"),
        &completed("", "-"),
        &completed("", "1."),
        &completed("", "tru"),
        &completed("", r#""\q""#),
        // numbers the tree reader reads its own way, escapes in the usage
        &completed("", r#"{"input_tokens":1.0}"#),
        &completed("", r#"{"input_tokens":-1,"output_tokens":2}"#),
        &completed("", r#"{"input_tokens":1e2}"#),
        &completed("", r#"{"input_tokens":99999999999999999999}"#),
        &completed("", r#"{"input_tokens":1,"note":"a\nb"}"#),
        &completed("", r#"{"input_tokens":1,"input_tokens":2}"#),
        &completed(
            "",
            r#"{"input_tokens_details":{},"input_tokens_details":{"cached_tokens":1}}"#,
        ),
        // truncated
        r#"{"type":"response.completed","response":{"usage":{"input_tokens":1"#,
        r#"{"type":"response.completed","response":{"usage":"#,
        r#"{"type":"response.completed""#,
    ] {
        unsure(data);
    }
    // Whatever follows the usage value is only measured, as the tree reader does.
    assert_eq!(
        fast(&format!(r#"{{"response":{{"usage":{FULL}, garbage"#)),
        usage(10, 4, 5, 2, 15)
    );
    assert_eq!(
        fast(&format!(
            r#"{{"response":{{"usage":{FULL}}}}} "unterminated [[["#
        )),
        usage(10, 4, 5, 2, 15)
    );
}

#[test]
fn invalid_utf8_before_the_usage_is_left_to_the_tree_reader() {
    let mut data = br#"{"response":{"x":"caf"#.to_vec();
    data.push(0xff);
    data.extend_from_slice(br#"","usage":{"input_tokens":1}}}"#);
    assert_eq!(read(&data), Err(Unsure));
    assert_eq!(usage_of_terminal(&data), reference(&data));
    // Valid UTF-8 past ASCII is read.
    let data = "{\"response\":{\"x\":\"caf\u{e9} \u{1f600}\",\"usage\":{\"input_tokens\":1}}}";
    assert_eq!(fast(data), usage(1, 0, 0, 0, 1));
}

/// A string of every length around the word and long-run thresholds, with an escape, a raw
/// control byte, a byte past ASCII or invalid UTF-8 at every position.
#[test]
fn strings_of_every_length_with_anything_anywhere() {
    let lens = (0..24).chain(56..76).chain([127, 128, 129, 300]);
    for len in lens {
        for at in 0..=len {
            for (piece, ok) in [
                (&br#"\""#[..], true),
                (br"\\", true),
                (br"\u00e9", true),
                (b"\xc3\xa9", true),
                (b"\x01", false),
                (b"\x1f", false),
                (b"\xff", false),
                (br"\x", false),
            ] {
                let mut text = vec![b'a'; len];
                text.splice(at.min(len)..at.min(len), piece.iter().copied());
                let mut data = br#"{"response":{"output":[{"text":""#.to_vec();
                data.extend_from_slice(&text);
                data.extend_from_slice(br#""}],"usage":{"input_tokens":3}}}"#);
                let want = reference(&data);
                match read(&data) {
                    Ok(got) => {
                        assert!(ok, "len {len} at {at} {piece:?}");
                        assert_eq!(got, want, "len {len} at {at} {piece:?}");
                        assert_eq!(got, usage(3, 0, 0, 0, 3));
                    }
                    Err(Unsure) => assert!(!ok, "len {len} at {at} {piece:?}"),
                }
                assert_eq!(usage_of_terminal(&data), want);
            }
        }
    }
}

#[test]
fn response_ids() {
    fn id(d: &str) -> (Result<Option<&str>, Unsure>, Option<String>) {
        check_id(d.as_bytes()).unwrap();
        (
            super::response_id(d.as_bytes()),
            crate::events::response_id(d.as_bytes()),
        )
    }
    let created = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_0a1b","object":"response","status":"in_progress","output":[],"usage":null}}"#;
    assert_eq!(
        id(created),
        (Ok(Some("resp_0a1b")), Some("resp_0a1b".to_owned()))
    );
    let spaced = "{ \"response\" : { \"x\" : [ {\"id\":\"no\"} ] , \"id\" : \"caf\u{e9}\" } }";
    assert_eq!(
        id(spaced),
        (Ok(Some("caf\u{e9}")), Some("caf\u{e9}".to_owned()))
    );
    assert_eq!(id(r#"{"response":{"id":7}}"#), (Ok(None), None));
    assert_eq!(id(r#"{"response":{"id":null}}"#), (Ok(None), None));
    assert_eq!(id(r#"{"response":{}}"#), (Ok(None), None));
    assert_eq!(
        id(r#"{"id":"top","response":{"object":"response"}}"#),
        (Ok(None), None)
    );
    assert_eq!(id(r#"{"response":"x"}"#), (Ok(None), None));
    // Escaped ids, escaped keys, malformed text and deep nesting: the lazy `get` reads them.
    assert_eq!(
        id(r#"{"response":{"id":"a\"b"}}"#),
        (Err(Unsure), Some("a\"b".to_owned()))
    );
    assert_eq!(
        id(r#"{"response":{"\u0069d":"x"}}"#),
        (Err(Unsure), Some("x".to_owned()))
    );
    assert_eq!(
        id(r#"{"response":{"output":[1,],"id":"x"}}"#).0,
        Err(Unsure)
    );
    let deep = format!(r#"{{"type":{},"response":{{"id":"x"}}}}"#, nested(200));
    assert_eq!(id(&deep).0, Err(Unsure));
}

#[test]
fn specials_finds_the_first_quote_backslash_or_control_byte() {
    for at in 0..8 {
        for b in [b'"', b'\\', 0, 0x1f] {
            for fill in [b'a', b' ', 0x7f, 0x80, 0xff, b'!', b'#', b'[', b']'] {
                let mut w = [fill; 8];
                w[at] = b;
                // Anything after the first one.
                for j in at + 1..8 {
                    w[j] = [b'"', 0x01, b'\\', b'x'][j % 4];
                }
                let m = specials(u64::from_le_bytes(w));
                assert_eq!((m.trailing_zeros() / 8) as usize, at, "{w:?}");
            }
        }
    }
    for fill in 0x20..=0xffu8 {
        if fill != b'"' && fill != b'\\' {
            assert_eq!(specials(u64::from_le_bytes([fill; 8])), 0, "{fill}");
        }
    }
}

// === property tests: generated terminal events against the reference ===

/// A JSON value, with string contents and keys written raw (escapes included).
#[derive(Debug, Clone)]
enum J {
    Lit(&'static str),
    Str(&'static str),
    Arr(Vec<J>),
    Obj(Vec<(&'static str, J)>),
}

/// What generated events are made of.
struct Vocab {
    keys: &'static [&'static str],
    strings: &'static [&'static str],
    literals: &'static [&'static str],
    /// Usage objects name each counter once.
    distinct: bool,
}

/// Everything: escaped keys and strings, numbers the flat pass leaves to the tree reader,
/// counters named twice.
const ALL: Vocab = Vocab {
    keys: &[
        "type",
        "id",
        "response",
        "usage",
        "output",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "input_tokens_details",
        "output_tokens_details",
        "cached_tokens",
        "reasoning_tokens",
        "text",
        r"us\u0061ge",
        r#"usage\""#,
        "",
    ],
    strings: &[
        "",
        "usage",
        r#"\"usage\":{\"input_tokens\":1}"#,
        r"a\\",
        r#"\\\""#,
        "[[{{",
        "]]}}",
        r"\u00e9\n\t\/",
        "caf\u{e9} \u{1f600}",
        "response.completed",
    ],
    literals: LITERALS,
    distinct: false,
};

/// What real terminal events are made of: the flat pass answers every one of them.
const CLEAN: Vocab = Vocab {
    keys: &["type", "id", "response", "usage", "output", "text", ""],
    strings: &[
        "",
        "usage",
        "[[{{",
        "]]}}",
        "caf\u{e9} \u{1f600}",
        "response.completed",
    ],
    literals: LITERALS.split_at(8).0,
    distinct: true,
};

const LITERALS: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "7",
    "42",
    "4611686018427387904",
    // 19 digits, below 2^63: no two of them overflow the reference's sum (`+`).
    "8999999999999999999",
    "99999999999999999999",
    "-3",
    "-0",
    "1.5",
    "10.0",
    "1e3",
    "2E-2",
];

const COUNTERS: &[&str] = &["input_tokens", "output_tokens", "total_tokens"];
const DETAILS: &[&str] = &["input_tokens_details", "output_tokens_details"];
const INNER: &[&str] = &["cached_tokens", "reasoning_tokens"];

fn value(v: &'static Vocab) -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        prop::sample::select(v.literals).prop_map(J::Lit),
        prop::sample::select(v.strings).prop_map(J::Str),
    ];
    leaf.prop_recursive(6, 48, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            prop::collection::vec((prop::sample::select(v.keys), inner), 0..5).prop_map(J::Obj),
        ]
    })
}

/// An object of these members, each name once when `distinct`.
fn object(mut members: Vec<(&'static str, J)>, distinct: bool) -> J {
    if distinct {
        let mut seen = Vec::new();
        members.retain(|(k, _)| {
            let first = !seen.contains(k);
            seen.push(*k);
            first
        });
    }
    J::Obj(members)
}

/// A usage object: the counters (any value shape), maybe details, maybe extra keys.
fn usage_value(v: &'static Vocab) -> impl Strategy<Value = J> {
    let counter = prop_oneof![
        4 => prop::sample::select(&LITERALS[3..8]).prop_map(J::Lit),
        1 => value(v),
    ];
    let member = prop_oneof![
        (prop::sample::select(COUNTERS), counter.clone()),
        (
            prop::sample::select(DETAILS),
            prop_oneof![
                3 => prop::collection::vec((prop::sample::select(INNER), counter.clone()), 0..3)
                    .prop_map(move |m| object(m, v.distinct)),
                1 => value(v),
            ]
        ),
        (prop::sample::select(v.keys), value(v)),
    ];
    prop_oneof![
        6 => prop::collection::vec(member, 0..7).prop_map(move |m| object(m, v.distinct)),
        1 => value(v),
    ]
}

/// A terminal event: members before and after `response`, which holds members before and
/// after `usage`.
fn terminal(v: &'static Vocab) -> impl Strategy<Value = J> {
    let members = move || prop::collection::vec((prop::sample::select(v.keys), value(v)), 0..4);
    let response = prop_oneof![
        8 => (members(), prop::option::weighted(0.9, usage_value(v)), members()).prop_map(
            |(mut before, usage, after)| {
                before.extend(usage.map(|u| ("usage", u)));
                before.extend(after);
                J::Obj(before)
            }
        ),
        1 => value(v),
    ];
    (members(), response, members()).prop_map(|(mut before, response, after)| {
        before.push(("response", response));
        before.extend(after);
        J::Obj(before)
    })
}

/// Whitespace picked by `ws` (cycled).
fn pad(ws: &[u8], k: &mut usize, out: &mut String) {
    let w = ws.get(*k % ws.len().max(1)).copied().unwrap_or(7);
    *k += 1;
    out.push_str(match w % 8 {
        0 => " ",
        1 => "\n  ",
        2 => "\t",
        3 => "\r\n",
        _ => "",
    });
}

/// Writes `v`; `ws` picks the whitespace around each token.
fn write(v: &J, ws: &[u8], k: &mut usize, out: &mut String) {
    let pad = |k: &mut usize, out: &mut String| pad(ws, k, out);
    pad(k, out);
    match v {
        J::Lit(l) => out.push_str(l),
        J::Str(s) => {
            out.push('"');
            out.push_str(s);
            out.push('"');
        }
        J::Arr(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, ws, k, out);
            }
            pad(k, out);
            out.push(']');
        }
        J::Obj(members) => {
            out.push('{');
            for (i, (key, x)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                pad(k, out);
                out.push('"');
                out.push_str(key);
                out.push('"');
                pad(k, out);
                out.push(':');
                write(x, ws, k, out);
            }
            pad(k, out);
            out.push('}');
        }
    }
    pad(k, out);
}

fn text(v: &J, ws: &[u8]) -> String {
    let mut out = String::new();
    write(v, ws, &mut 0, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// Generated terminal events, compact and spaced: the flat pass answers most of them,
    /// and always as the reference does; `usage_of_terminal` always does.
    #[test]
    fn generated_events_read_as_the_reference_reads_them(
        ev in prop_oneof![terminal(&ALL), terminal(&CLEAN)],
        ws in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        for data in [text(&ev, &[]), text(&ev, &ws)] {
            let data = data.as_bytes();
            let want = reference(data);
            if let Ok(got) = read(data) {
                prop_assert_eq!(got, want, "{}", String::from_utf8_lossy(data));
            }
            prop_assert_eq!(usage_of_terminal(data), want);
            check_id(data)?;
        }
    }

    /// The same events cut short, with a byte changed, removed or inserted anywhere: when the
    /// flat pass answers, it answers as the reference.
    #[test]
    fn damaged_events_read_as_the_reference_reads_them(
        ev in prop_oneof![terminal(&ALL), terminal(&CLEAN)],
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, prop::sample::select(
            &b"\"\\{}[]:,0-.eEtnu \x01\xc3\xa9\xff"[..]
        )), 1..4),
    ) {
        let mut data = text(&ev, &[]).into_bytes();
        for (at, op, b) in edits {
            if data.is_empty() {
                break;
            }
            let i = at.index(data.len());
            match op {
                0 => data[i] = b,
                1 => {
                    data.remove(i);
                }
                2 => data.insert(i, b),
                _ => data.truncate(i),
            }
        }
        let want = reference(&data);
        if let Ok(got) = read(&data) {
            prop_assert_eq!(got, want, "{}", String::from_utf8_lossy(&data));
        }
        prop_assert_eq!(usage_of_terminal(&data), want);
        check_id(&data)?;
    }

    /// Nesting anywhere, around the limit: refused exactly where the depth check refuses.
    #[test]
    fn nesting_is_refused_where_the_depth_check_refuses(
        ev in prop_oneof![terminal(&ALL), terminal(&CLEAN)],
        levels in prop_oneof![0usize..4, 120usize..132],
        at in any::<prop::sample::Index>(),
    ) {
        let data = text(&ev, &[]);
        // Wrap one value position (right after a colon) in `levels` arrays.
        let colons: Vec<usize> = data.match_indices(':').map(|(i, _)| i).collect();
        prop_assume!(!colons.is_empty());
        let c = colons[at.index(colons.len())] + 1;
        let data = format!("{}{}null{}{}", &data[..c], "[".repeat(levels), "]".repeat(levels), &data[c..]);
        // The wrap may land inside a string (then it is text): the reference decides.
        let data = data.as_bytes();
        let want = reference(data);
        if let Ok(got) = read(data) {
            prop_assert_eq!(got, want, "{}", String::from_utf8_lossy(data));
        }
        prop_assert_eq!(usage_of_terminal(data), want);
        check_id(data)?;
    }
}

/// The flat pass answers events made like real ones itself, compact and spaced (else the
/// comparisons above could pass with the tree reader answering everything).
#[test]
fn the_flat_pass_answers_clean_events() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for n in 0..2000u32 {
        let Ok(tree) = terminal(&CLEAN).new_tree(&mut runner) else {
            continue;
        };
        let ev = tree.current();
        for data in [text(&ev, &[]), text(&ev, &n.to_le_bytes())] {
            assert!(read(data.as_bytes()).is_ok(), "{data}");
            assert!(super::response_id(data.as_bytes()).is_ok(), "{data}");
        }
    }
}
