//! Negotiation (offers as a server, responses as a client) and the compressor and
//! decompressor on their own.

use super::*;

fn offer(values: &[&str]) -> Option<String> {
    negotiate_offers(values).map(|p| p.response_value())
}

#[test]
fn real_client_offers() {
    // Codex CLI, Chrome, node `ws` (the OpenAI Node SDK), Python `websockets`.
    assert_eq!(
        offer(&["permessage-deflate; client_max_window_bits"]).as_deref(),
        Some("permessage-deflate")
    );
    // Firefox.
    assert_eq!(
        offer(&["permessage-deflate"]).as_deref(),
        Some("permessage-deflate")
    );
    // Older Python websockets / aiohttp style offers.
    assert_eq!(
        offer(&["permessage-deflate; server_max_window_bits=15; client_max_window_bits=15"])
            .as_deref(),
        Some("permessage-deflate; server_max_window_bits=15")
    );
    // Safari's old draft extension next to the real one.
    assert_eq!(
        offer(&["x-webkit-deflate-frame, permessage-deflate; client_max_window_bits"]).as_deref(),
        Some("permessage-deflate")
    );
    assert_eq!(offer(&[]), None);
    assert_eq!(offer(&["x-webkit-deflate-frame"]), None);
    assert_eq!(offer(&[""]), None);
}

#[test]
fn context_takeover_parameters_are_honoured() {
    let p = negotiate_offers(&[
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
    ]);
    assert_eq!(
        p,
        Some(DeflateParams {
            server_no_context_takeover: true,
            client_no_context_takeover: true,
            server_max_window_bits: None,
            client_max_window_bits: None,
        })
    );
    assert_eq!(
        p.map(|p| p.response_value()).as_deref(),
        Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover")
    );
}

#[test]
fn server_window_below_15_is_declined_and_the_next_offer_tried() {
    assert_eq!(
        offer(&["permessage-deflate; server_max_window_bits=10"]),
        None
    );
    assert_eq!(
        offer(&["permessage-deflate; server_max_window_bits=10, permessage-deflate; client_max_window_bits"]).as_deref(),
        Some("permessage-deflate")
    );
    // The same across two header lines.
    assert_eq!(
        offer(&[
            "permessage-deflate; server_max_window_bits=10; server_no_context_takeover",
            "permessage-deflate; server_no_context_takeover",
        ])
        .as_deref(),
        Some("permessage-deflate; server_no_context_takeover")
    );
}

#[test]
fn client_window_is_accepted_with_or_without_value() {
    for v in [
        "permessage-deflate; client_max_window_bits",
        "permessage-deflate; client_max_window_bits=8",
        "permessage-deflate; client_max_window_bits=10",
        "permessage-deflate; client_max_window_bits=15",
        "permessage-deflate; client_max_window_bits=\"12\"",
        "Permessage-Deflate;Client_Max_Window_Bits = 9",
    ] {
        assert_eq!(offer(&[v]).as_deref(), Some("permessage-deflate"), "{v}");
    }
}

#[test]
fn malformed_offers_are_declined() {
    for v in [
        // Duplicates.
        "permessage-deflate; client_max_window_bits; client_max_window_bits",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        // Unknown parameters.
        "permessage-deflate; foo",
        "permessage-deflate; mux=1",
        // Values where none belongs, or bad values.
        "permessage-deflate; server_no_context_takeover=1",
        "permessage-deflate; client_no_context_takeover=\"x\"",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits=015",
        "permessage-deflate; client_max_window_bits=7",
        "permessage-deflate; client_max_window_bits=16",
        "permessage-deflate; client_max_window_bits=08",
        "permessage-deflate; client_max_window_bits=abc",
        "permessage-deflate; client_max_window_bits=",
        "permessage-deflate; client_max_window_bits=\"10",
        "permessage-deflate; client_max_window_bits=\"1 0\"",
        "permessage-deflate;; client_max_window_bits",
        "permessage deflate",
    ] {
        assert_eq!(offer(&[v]), None, "{v}");
        // A good offer after it still wins (unless an open quote swallows it).
        if v.matches('"').count() % 2 == 1 {
            continue;
        }
        let both = format!("{v}, permessage-deflate; server_no_context_takeover");
        assert_eq!(
            offer(&[&both]).as_deref(),
            Some("permessage-deflate; server_no_context_takeover"),
            "{v}"
        );
    }
}

#[test]
fn quoted_commas_do_not_split_elements() {
    let list = parse_extension_list(&["foo; bar=\"a,b\", permessage-deflate"]);
    assert_eq!(list.len(), 2);
    assert_eq!(list[0], None, "a,b is not a token");
    assert_eq!(
        list[1].as_ref().map(|e| e.name.as_str()),
        Some("permessage-deflate")
    );
    let e = parse_extension("permessage-deflate; client_max_window_bits=\"10\"");
    assert_eq!(
        e,
        Some(Extension {
            name: "permessage-deflate".into(),
            params: vec![("client_max_window_bits".into(), Some("10".into()))],
        })
    );
}

#[test]
fn client_side_response_parsing() {
    assert_eq!(parse_response(&[]), Ok(None));
    assert_eq!(
        parse_response(&["permessage-deflate"]),
        Ok(Some(DeflateParams::default()))
    );
    assert_eq!(
        parse_response(&[
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10"
        ]),
        Ok(Some(DeflateParams {
            server_no_context_takeover: true,
            client_no_context_takeover: true,
            server_max_window_bits: Some(10),
            client_max_window_bits: None,
        }))
    );
    assert_eq!(
        parse_response(&["permessage-deflate; client_max_window_bits=15"]),
        Ok(Some(DeflateParams {
            client_max_window_bits: Some(15),
            ..DeflateParams::default()
        }))
    );
    for bad in [
        "permessage-deflate; client_max_window_bits=10",
        "permessage-deflate; client_max_window_bits",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=7",
        "permessage-deflate; foo",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; client_no_context_takeover=1",
        "x-webkit-deflate-frame",
        "permessage-deflate, permessage-deflate",
        "permessage-deflate; client_max_window_bits=\"1",
    ] {
        assert!(parse_response(&[bad]).is_err(), "{bad}");
    }
}

#[test]
fn compressor_and_decompressor_round_trip() {
    for reset in [false, true] {
        let mut d = Deflater::new(reset);
        let mut i = Inflater::new(reset);
        for n in 0..50usize {
            let msg: Vec<u8> =
                format!("{{\"n\":{n},\"text\":\"{}\"}}", "abc ".repeat(n * 37)).into_bytes();
            let mut c = Vec::new();
            assert!(d.compress(&msg, &mut c));
            assert!(!c.ends_with(&TAIL));
            let mut out = Vec::new();
            // Fed in small pieces, as fragments would be.
            for piece in c.chunks(7) {
                i.inflate(piece, &mut out, 1 << 20).unwrap();
            }
            i.finish(&mut out, 1 << 20).unwrap();
            assert_eq!(out, msg);
        }
    }
}

#[test]
fn inflater_never_grows_past_the_limit() {
    let mut d = Deflater::new(false);
    let mut c = Vec::new();
    assert!(d.compress(&vec![0u8; 8 << 20], &mut c));
    let max = 100_000;
    let mut i = Inflater::new(false);
    let mut out = Vec::new();
    assert_eq!(i.inflate(&c, &mut out, max), Err(InflateError::TooBig));
    assert!(out.capacity() <= max + 1, "{}", out.capacity());
    // At exactly the limit it succeeds.
    let mut d = Deflater::new(false);
    let mut c = Vec::new();
    assert!(d.compress(&vec![1u8; max], &mut c));
    let mut i = Inflater::new(false);
    let mut out = Vec::new();
    i.inflate(&c, &mut out, max).unwrap();
    i.finish(&mut out, max).unwrap();
    assert_eq!(out.len(), max);
}

#[test]
fn incompressible_data_round_trips() {
    let mut x = 1u64;
    let data: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut d = Deflater::new(false);
    let mut c = Vec::new();
    assert!(d.compress(&data, &mut c));
    let mut i = Inflater::new(false);
    let mut out = Vec::new();
    i.inflate(&c, &mut out, data.len()).unwrap();
    i.finish(&mut out, data.len()).unwrap();
    assert_eq!(out, data);
}
