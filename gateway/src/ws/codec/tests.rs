//! Codec tests: the RFC 6455 §5.7 and RFC 7692 §7.2.3 examples byte for byte, every
//! violation to its close code, segmentation (every split point for small inputs, seeded
//! random splits for large ones), and encoder -> decoder round trips.

use super::*;
use crate::ws::deflate::Deflater;

// --- helpers ---------------------------------------------------------------------------

/// A tiny deterministic PRNG (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One raw frame with the minimal length encoding; masked with `mask` if given.
fn raw_frame(fin: bool, rsv1: bool, opcode: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(if fin { 0x80 } else { 0 }) | (if rsv1 { 0x40 } else { 0 }) | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    let len = payload.len();
    if len < 126 {
        out.push(m | len as u8);
    } else if len <= 0xffff {
        out.push(m | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(m | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    let start = out.len();
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend_from_slice(payload);
            apply_mask(&mut out[start + 4..], key);
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// The mask a peer in `role`'s opposite would use: the server decodes masked frames.
fn peer_mask(role: Role, rng: &mut Rng) -> Option<[u8; 4]> {
    match role {
        Role::Server => Some([rng.next() as u8, rng.next() as u8, rng.next() as u8, 0x5a]),
        Role::Client => None,
    }
}

/// Feeds `input` in pieces of the given sizes (the rest at the end), draining messages
/// after each piece, as a read loop would.
fn feed(dec: &mut Decoder, input: &[u8], cuts: &[usize]) -> Result<Vec<Message>, CloseError> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut pieces = cuts.iter().copied().chain(std::iter::once(usize::MAX));
    while pos < input.len() {
        let n = pieces.next().unwrap_or(usize::MAX).min(input.len() - pos);
        buf.extend_from_slice(&input[pos..pos + n]);
        pos += n;
        while let Some(msg) = dec.decode(&mut buf)? {
            out.push(msg);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    Ok(out)
}

fn decode_whole(
    role: Role,
    deflate: Option<DeflateParams>,
    input: &[u8],
) -> Result<Vec<Message>, CloseError> {
    feed(
        &mut Decoder::new(role, Limits::default(), deflate),
        input,
        &[],
    )
}

fn one_byte_cuts(n: usize) -> Vec<usize> {
    vec![1; n]
}

fn random_cuts(rng: &mut Rng, n: usize, max_piece: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut left = n;
    while left > 0 {
        let piece = 1 + rng.below(max_piece.min(left));
        cuts.push(piece);
        left -= piece;
    }
    cuts
}

fn text(s: &str) -> Message {
    Message::Text(s.as_bytes().to_vec())
}

fn err_code(res: Result<Vec<Message>, CloseError>) -> u16 {
    match res {
        Ok(msgs) => panic!("expected an error, decoded {msgs:?}"),
        Err(e) => e.code,
    }
}

const HELLO_MASKED: [u8; 11] = [
    0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
];
const HELLO: [u8; 7] = [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];

// --- RFC 6455 §5.7 ---------------------------------------------------------------------

#[test]
fn rfc6455_examples_decode() {
    assert_eq!(
        decode_whole(Role::Client, None, &HELLO).unwrap(),
        vec![text("Hello")]
    );
    assert_eq!(
        decode_whole(Role::Server, None, &HELLO_MASKED).unwrap(),
        vec![text("Hello")]
    );
    let fragmented = [0x01, 0x03, 0x48, 0x65, 0x6c, 0x80, 0x02, 0x6c, 0x6f];
    assert_eq!(
        decode_whole(Role::Client, None, &fragmented).unwrap(),
        vec![text("Hello")]
    );
    let ping = [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
    assert_eq!(
        decode_whole(Role::Client, None, &ping).unwrap(),
        vec![Message::Ping(b"Hello".to_vec())]
    );
    let pong = [
        0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(
        decode_whole(Role::Server, None, &pong).unwrap(),
        vec![Message::Pong(b"Hello".to_vec())]
    );

    let mut b256 = vec![0x82, 0x7e, 0x01, 0x00];
    b256.extend((0..256).map(|i| i as u8));
    assert_eq!(
        decode_whole(Role::Client, None, &b256).unwrap(),
        vec![Message::Binary((0..256).map(|i| i as u8).collect())]
    );
    let mut b64k = vec![0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0];
    b64k.extend((0..65536).map(|i| (i * 7) as u8));
    assert_eq!(
        decode_whole(Role::Client, None, &b64k).unwrap(),
        vec![Message::Binary((0..65536).map(|i| (i * 7) as u8).collect())]
    );
}

#[test]
fn rfc6455_examples_encode() {
    let mut enc = Encoder::new(Role::Server, None);
    let mut out = Vec::new();
    enc.text(&mut out, b"Hello");
    assert_eq!(out, HELLO);

    out.clear();
    enc.ping(&mut out, b"Hello");
    assert_eq!(out, [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);

    out.clear();
    enc.binary(&mut out, &[7u8; 256]);
    assert_eq!(out[..4], [0x82, 0x7e, 0x01, 0x00]);
    assert_eq!(out.len(), 4 + 256);

    out.clear();
    enc.binary(&mut out, &vec![9u8; 65536]);
    assert_eq!(out[..10], [0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0]);
    assert_eq!(out.len(), 10 + 65536);

    // Boundaries of the length encodings.
    for (len, header) in [(125usize, 2usize), (126, 4), (65535, 4), (65536, 10)] {
        out.clear();
        enc.binary(&mut out, &vec![1u8; len]);
        assert_eq!(out.len(), header + len, "length {len}");
    }

    // The masked example: the key the RFC uses turns "Hello" into its bytes...
    let mut masked = b"Hello".to_vec();
    apply_mask(&mut masked, [0x37, 0xfa, 0x21, 0x3d]);
    assert_eq!(masked, HELLO_MASKED[6..]);
    // ...and the client encoder frames it the same way with its own random key.
    let mut client = Encoder::new(Role::Client, None);
    out.clear();
    client.pong(&mut out, b"Hello");
    assert_eq!(out[..2], [0x8a, 0x85]);
    let key = [out[2], out[3], out[4], out[5]];
    let mut payload = out[6..].to_vec();
    apply_mask(&mut payload, key);
    assert_eq!(payload, b"Hello");
    out.clear();
    client.text(&mut out, b"Hello");
    assert_eq!(out[..2], [0x81, 0x85]);
    assert_eq!(
        decode_whole(Role::Server, None, &out).unwrap(),
        vec![text("Hello")]
    );
}

#[test]
fn client_masks_differ_per_frame() {
    let mut enc = Encoder::new(Role::Client, None);
    let keys: std::collections::HashSet<[u8; 4]> = (0..64)
        .map(|_| {
            let mut out = Vec::new();
            enc.text(&mut out, b"x");
            [out[2], out[3], out[4], out[5]]
        })
        .collect();
    assert!(keys.len() > 60, "mask keys repeat: {}", keys.len());
}

#[test]
fn apply_mask_matches_bytewise_xor() {
    let mut rng = Rng(7);
    for len in 0..70 {
        let data = rng.bytes(len);
        let key = [
            rng.next() as u8,
            rng.next() as u8,
            rng.next() as u8,
            rng.next() as u8,
        ];
        let mut fast = data.clone();
        apply_mask(&mut fast, key);
        let slow: Vec<u8> = data
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect();
        assert_eq!(fast, slow, "length {len}");
    }
}

// --- RFC 7692 §7.2.3 -------------------------------------------------------------------

fn takeover() -> Option<DeflateParams> {
    Some(DeflateParams::default())
}

#[test]
fn rfc7692_examples_decode() {
    let hello = [0xc1, 0x07, 0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
    assert_eq!(
        decode_whole(Role::Client, takeover(), &hello).unwrap(),
        vec![text("Hello")]
    );
    // §7.2.3.1 fragmented.
    let frag = [
        0x41, 0x03, 0xf2, 0x48, 0xcd, 0x80, 0x04, 0xc9, 0xc9, 0x07, 0x00,
    ];
    assert_eq!(
        decode_whole(Role::Client, takeover(), &frag).unwrap(),
        vec![text("Hello")]
    );
    // §7.2.3.2 sharing the LZ77 window: the second "Hello" is a back reference.
    let mut shared = hello.to_vec();
    shared.extend_from_slice(&[0xc1, 0x05, 0xf2, 0x00, 0x11, 0x00, 0x00]);
    assert_eq!(
        decode_whole(Role::Client, takeover(), &shared).unwrap(),
        vec![text("Hello"), text("Hello")]
    );
    // With server_no_context_takeover the client resets its window, so the back reference
    // cannot produce "Hello" again (miniz_oxide reads a fresh window rather than failing).
    let no_takeover = Some(DeflateParams {
        server_no_context_takeover: true,
        ..DeflateParams::default()
    });
    assert_ne!(
        decode_whole(Role::Client, no_takeover, &shared),
        Ok(vec![text("Hello"), text("Hello")])
    );
    // Without context takeover the same message is sent twice as is.
    let mut twice = hello.to_vec();
    twice.extend_from_slice(&hello);
    assert_eq!(
        decode_whole(Role::Client, no_takeover, &twice).unwrap(),
        vec![text("Hello"), text("Hello")]
    );
    // §7.2.3.3 a stored block.
    let stored = [
        0xc1, 0x0b, 0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
    ];
    assert_eq!(
        decode_whole(Role::Client, takeover(), &stored).unwrap(),
        vec![text("Hello")]
    );
    // §7.2.3.4 BFINAL set: the next message starts a fresh stream.
    let mut bfinal = vec![0xc1, 0x08, 0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00];
    bfinal.extend_from_slice(&hello);
    assert_eq!(
        decode_whole(Role::Client, takeover(), &bfinal).unwrap(),
        vec![text("Hello"), text("Hello")]
    );
    // §7.2.3.5 two DEFLATE blocks in one message.
    let two = [
        0xc1, 0x0d, 0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00,
    ];
    assert_eq!(
        decode_whole(Role::Client, takeover(), &two).unwrap(),
        vec![text("Hello")]
    );
    // §7.2.3.6 an empty message.
    assert_eq!(
        decode_whole(Role::Client, takeover(), &[0xc1, 0x01, 0x00]).unwrap(),
        vec![text("")]
    );
    // A compressed frame with an empty payload is an empty message too.
    assert_eq!(
        decode_whole(Role::Client, takeover(), &[0xc1, 0x00]).unwrap(),
        vec![text("")]
    );
}

#[test]
fn rfc7692_hello_compresses_to_the_example_bytes() {
    let mut d = Deflater::new(true);
    let mut out = Vec::new();
    assert!(d.compress(b"Hello", &mut out));
    assert_eq!(out, [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]);
    // No context takeover: the same bytes again.
    out.clear();
    assert!(d.compress(b"Hello", &mut out));
    assert_eq!(out, [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]);
    // With context takeover the second one is a back reference, shorter.
    let mut d = Deflater::new(false);
    out.clear();
    assert!(d.compress(b"Hello", &mut out));
    let mut second = Vec::new();
    assert!(d.compress(b"Hello", &mut second));
    assert!(second.len() < out.len(), "{second:02x?}");
}

#[test]
fn encoder_compresses_with_rsv1_only_on_data() {
    let mut enc = Encoder::new(Role::Server, takeover());
    let body = br#"{"type":"response.output_text.delta","delta":"hello hello hello hello"}"#;
    let mut out = Vec::new();
    enc.text(&mut out, body);
    assert_eq!(out[0], 0xc1, "FIN + RSV1 + text");
    assert!(out.len() < body.len());
    out.clear();
    enc.text(&mut out, b"tiny");
    assert_eq!(out[0], 0x81, "tiny payloads go uncompressed");
    out.clear();
    enc.ping(&mut out, &[b'p'; 100]);
    assert_eq!(out[0], 0x89, "control frames are never compressed");
    out.clear();
    enc.close(&mut out, 1000, &"ü".repeat(100));
    assert_eq!(out[0], 0x88);
    assert_eq!(out[1] as usize, out.len() - 2);
    assert!(out.len() - 2 <= 125);
    let msgs = decode_whole(Role::Client, takeover(), &out).unwrap();
    assert!(
        matches!(&msgs[..], [Message::Close(Some((1000, r)))] if r.chars().all(|c| c == 'ü') && r.len() == 122)
    );
}

// --- violations ------------------------------------------------------------------------

fn server_err(input: &[u8]) -> u16 {
    err_code(decode_whole(Role::Server, None, input))
}

fn client_err(deflate: Option<DeflateParams>, input: &[u8]) -> u16 {
    err_code(decode_whole(Role::Client, deflate, input))
}

#[test]
fn masking_rules() {
    assert_eq!(server_err(&HELLO), 1002, "unmasked frame to a server");
    assert_eq!(
        client_err(None, &HELLO_MASKED),
        1002,
        "masked frame to a client"
    );
}

#[test]
fn reserved_bits() {
    for b0 in [0x81 | 0x20, 0x81 | 0x10, 0x81 | 0x30] {
        assert_eq!(client_err(None, &[b0, 0x00]), 1002);
        assert_eq!(client_err(takeover(), &[b0, 0x00]), 1002);
    }
    assert_eq!(
        client_err(None, &[0xc1, 0x00]),
        1002,
        "RSV1 without deflate"
    );
    // RSV1 on a continuation frame.
    assert_eq!(
        client_err(takeover(), &[0x41, 0x01, 0x00, 0xc0, 0x00]),
        1002
    );
    assert_eq!(
        client_err(takeover(), &[0x01, 0x01, 0x61, 0xc0, 0x00]),
        1002
    );
    // RSV1 on control frames.
    for op in [0x88, 0x89, 0x8a] {
        assert_eq!(client_err(takeover(), &[op | 0x40, 0x00]), 1002);
    }
}

#[test]
fn unknown_opcodes() {
    for op in [3u8, 4, 5, 6, 7, 0xb, 0xc, 0xd, 0xe, 0xf] {
        assert_eq!(client_err(None, &[0x80 | op, 0x00]), 1002, "opcode {op:#x}");
    }
}

#[test]
fn control_frame_rules() {
    // 126 bytes (two-byte length) and 125 bytes of a ping.
    let mut long = vec![0x89, 0x7e, 0x00, 0x7e];
    long.extend_from_slice(&[0; 126]);
    assert_eq!(client_err(None, &long), 1002);
    // Fails on the header alone, before the payload arrives.
    assert_eq!(client_err(None, &long[..2]), 1002);
    let ok = raw_frame(true, false, 0x9, None, &[0; 125]);
    assert_eq!(
        decode_whole(Role::Client, None, &ok).unwrap(),
        vec![Message::Ping(vec![0; 125])]
    );
    // Fragmented control frames.
    for op in [0x08, 0x09, 0x0a] {
        assert_eq!(client_err(None, &[op, 0x00]), 1002);
    }
}

#[test]
fn fragmentation_rules() {
    // A continuation with nothing started.
    assert_eq!(client_err(None, &[0x80, 0x01, 0x61]), 1002);
    assert_eq!(client_err(None, &[0x00, 0x01, 0x61]), 1002);
    // A new data frame inside a fragmented message.
    assert_eq!(
        client_err(None, &[0x01, 0x01, 0x61, 0x81, 0x01, 0x62]),
        1002
    );
    assert_eq!(
        client_err(None, &[0x01, 0x01, 0x61, 0x02, 0x01, 0x62]),
        1002
    );
    // A continuation after a finished message.
    assert_eq!(
        client_err(None, &[0x81, 0x01, 0x61, 0x80, 0x01, 0x62]),
        1002
    );
    // Control frames in between are fine and come out first.
    let input = [
        0x01, 0x01, 0x61, 0x89, 0x00, 0x00, 0x01, 0x62, 0x8a, 0x01, 0x70, 0x80, 0x01, 0x63,
    ];
    assert_eq!(
        decode_whole(Role::Client, None, &input).unwrap(),
        vec![
            Message::Ping(vec![]),
            Message::Pong(b"p".to_vec()),
            text("abc")
        ]
    );
    // Empty fragments are legal.
    let input = [0x01, 0x00, 0x00, 0x00, 0x80, 0x00];
    assert_eq!(
        decode_whole(Role::Client, None, &input).unwrap(),
        vec![text("")]
    );
}

#[test]
fn length_encoding_rules() {
    // Non-minimal 16-bit (125 as 126 + 2 bytes) and 64-bit (65535 as 127 + 8 bytes).
    assert_eq!(client_err(None, &[0x82, 0x7e, 0x00, 0x7d]), 1002);
    assert_eq!(client_err(None, &[0x82, 0x7e, 0x00, 0x00]), 1002);
    assert_eq!(
        client_err(None, &[0x82, 0x7f, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),
        1002
    );
    assert_eq!(
        client_err(None, &[0x82, 0x7f, 0, 0, 0, 0, 0, 0, 0, 1]),
        1002
    );
    // The most significant bit of a 64-bit length.
    assert_eq!(
        client_err(None, &[0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        1002
    );
    assert_eq!(
        client_err(
            None,
            &[0x82, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4]
        ),
        1002
    );
    // The largest legal lengths are too big, refused on the header (no wrap, no panic).
    assert_eq!(
        client_err(
            None,
            &[0x82, 0x7f, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        ),
        1009
    );
    assert_eq!(
        server_err(&[0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4]),
        1009
    );
    assert_eq!(
        client_err(
            takeover(),
            &[0xc2, 0x7f, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        ),
        1009
    );
    // A huge continuation after a started message.
    assert_eq!(
        client_err(
            None,
            &[0x02, 0x01, 0x00, 0x80, 0x7f, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        ),
        1009
    );
    // Incomplete headers wait.
    let mut dec = Decoder::new(Role::Client, Limits::default(), None);
    for partial in [
        &[0x82u8][..],
        &[0x82, 0x7e, 0x01],
        &[0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0],
    ] {
        let mut buf = partial.to_vec();
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(buf, partial, "nothing consumed");
    }
    let mut dec = Decoder::new(Role::Server, Limits::default(), None);
    let mut buf = vec![0x81, 0x85, 0x37, 0xfa, 0x21];
    assert_eq!(dec.decode(&mut buf), Ok(None));
    assert_eq!(buf.len(), 5);
}

#[test]
fn utf8_rules() {
    assert_eq!(client_err(None, &[0x81, 0x02, 0xc3, 0x28]), 1007);
    assert_eq!(client_err(None, &[0x81, 0x01, 0xff]), 1007);
    // Surrogates and overlong forms are invalid UTF-8 too.
    assert_eq!(client_err(None, &[0x81, 0x03, 0xed, 0xa0, 0x80]), 1007);
    assert_eq!(client_err(None, &[0x81, 0x02, 0xc0, 0xaf]), 1007);
    // A character split across fragments is valid once reassembled.
    let input = [0x01, 0x01, 0xc3, 0x80, 0x01, 0xbc];
    assert_eq!(
        decode_whole(Role::Client, None, &input).unwrap(),
        vec![text("ü")]
    );
    // Binary messages are not checked.
    assert_eq!(
        decode_whole(Role::Client, None, &[0x82, 0x01, 0xff]).unwrap(),
        vec![Message::Binary(vec![0xff])]
    );
    // Invalid UTF-8 inside compressed text.
    let mut d = Deflater::new(false);
    let mut c = Vec::new();
    assert!(d.compress(&[b'a', b'b', 0xff, 0xfe], &mut c));
    assert_eq!(
        client_err(takeover(), &raw_frame(true, true, 1, None, &c)),
        1007
    );
}

#[test]
fn close_payload_rules() {
    let close = |payload: &[u8]| {
        decode_whole(
            Role::Client,
            None,
            &raw_frame(true, false, 8, None, payload),
        )
    };
    assert_eq!(close(&[]).unwrap(), vec![Message::Close(None)]);
    assert_eq!(err_code(close(&[0x03])), 1002);
    for code in [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999,
    ] {
        let mut p = code.to_be_bytes().to_vec();
        p.extend_from_slice(b"bye");
        assert_eq!(
            close(&p).unwrap(),
            vec![Message::Close(Some((code, "bye".into())))],
            "{code}"
        );
    }
    for code in [
        0u16, 999, 1004, 1005, 1006, 1012, 1013, 1014, 1015, 1016, 2000, 2999, 5000, 65535,
    ] {
        assert_eq!(err_code(close(&code.to_be_bytes())), 1002, "{code}");
    }
    assert_eq!(err_code(close(&[0x03, 0xe8, 0xff, 0xfe])), 1007);
    // After a Close, further bytes are discarded.
    let mut input = raw_frame(true, false, 8, None, &1000u16.to_be_bytes());
    input.extend_from_slice(&HELLO);
    input.extend_from_slice(&[0xff; 9]);
    assert_eq!(
        decode_whole(Role::Client, None, &input).unwrap(),
        vec![Message::Close(Some((1000, String::new())))]
    );
}

#[test]
fn errors_are_sticky() {
    let mut dec = Decoder::new(Role::Client, Limits::default(), None);
    let mut buf = vec![0x83, 0x00];
    let err = dec.decode(&mut buf).unwrap_err();
    assert_eq!(err.code, 1002);
    let mut buf = HELLO.to_vec();
    assert_eq!(dec.decode(&mut buf), Err(err));
}

#[test]
fn size_limit() {
    let limits = Limits { max_message: 1000 };
    let decode =
        |deflate, input: &[u8]| feed(&mut Decoder::new(Role::Client, limits, deflate), input, &[]);
    // Exactly at the limit is fine, one more is not (refused on the header).
    assert!(decode(None, &raw_frame(true, false, 2, None, &[0; 1000])).is_ok());
    assert_eq!(
        err_code(decode(
            None,
            &raw_frame(true, false, 2, None, &[0; 1001])[..4]
        )),
        1009
    );
    // Counted across fragments.
    let mut frag = raw_frame(false, false, 2, None, &[0; 600]);
    frag.extend(raw_frame(true, false, 0, None, &[0; 400]));
    assert!(decode(None, &frag).is_ok());
    let mut frag = raw_frame(false, false, 2, None, &[0; 600]);
    frag.extend(raw_frame(false, false, 0, None, &[0; 400]));
    frag.extend(raw_frame(true, false, 0, None, &[0; 1]));
    assert_eq!(err_code(decode(None, &frag)), 1009);
    // Counted after decompression.
    let mut d = Deflater::new(false);
    let mut c = Vec::new();
    assert!(d.compress(&[b'x'; 1000], &mut c));
    assert!(decode(takeover(), &raw_frame(true, true, 2, None, &c)).is_ok());
    let mut d = Deflater::new(false);
    c.clear();
    assert!(d.compress(&[b'x'; 1001], &mut c));
    assert!(c.len() < 100);
    assert_eq!(
        err_code(decode(takeover(), &raw_frame(true, true, 2, None, &c))),
        1009
    );
}

#[test]
fn deflate_bomb_stops_at_the_limit() {
    // 64 MiB of zeros compress to about 300 KB (level 1); the decoder stops at 1 MiB.
    let mut d = Deflater::new(false);
    let mut bomb = Vec::new();
    assert!(d.compress(&vec![0u8; 64 << 20], &mut bomb));
    assert!(bomb.len() < 512 << 10, "{}", bomb.len());
    let limits = Limits {
        max_message: 1 << 20,
    };
    // Whole and fragmented, so the limit holds across fragments too.
    let whole = raw_frame(true, true, 2, None, &bomb);
    let mut frags = Vec::new();
    for (i, chunk) in bomb.chunks(1000).enumerate() {
        let last = (i + 1) * 1000 >= bomb.len();
        frags.extend(raw_frame(
            last,
            i == 0,
            if i == 0 { 2 } else { 0 },
            None,
            chunk,
        ));
    }
    for input in [whole, frags] {
        let mut dec = Decoder::new(Role::Client, limits, takeover());
        assert_eq!(err_code(feed(&mut dec, &input, &[])), 1009);
    }
}

#[test]
fn corrupt_compressed_data() {
    // BTYPE=11 is reserved.
    assert_eq!(client_err(takeover(), &[0xc1, 0x01, 0x07]), 1007);
    assert_eq!(
        client_err(takeover(), &[0xc1, 0x03, 0x00, 0x05, 0x00]),
        1007
    );
}

// --- segmentation ----------------------------------------------------------------------

/// A Codex-CLI-sized request body (about 40 KB of JSON).
fn codex_json(target: usize, rng: &mut Rng) -> Vec<u8> {
    let mut s = String::from(r#"{"type":"response.create","model":"gpt-5-codex","input":["#);
    let mut i = 0;
    while s.len() < target {
        let words: String = (0..8 + rng.below(20))
            .map(|_| {
                [
                    "let ", "fn ", "match ", "Ok(", "héllo ", "数据 ", "\\n", "🙂 ",
                ][rng.below(8)]
            })
            .collect();
        s.push_str(&format!(
            r#"{{"type":"message","role":"user","id":"msg_{i:05}","content":[{{"type":"input_text","text":"{words}"}}]}},"#
        ));
        i += 1;
    }
    s.push_str(r#"{"type":"message","role":"user","content":"end"}],"stream":true}"#);
    s.into_bytes()
}

/// Frames one message as several fragments (sizes from `rng`), compressed as a whole when
/// `deflater` is given, with control frames between the fragments.
#[allow(clippy::too_many_arguments)]
fn fragmented(
    role: Role,
    rng: &mut Rng,
    opcode: u8,
    payload: &[u8],
    deflater: Option<&mut Deflater>,
    max_frag: usize,
    out: &mut Vec<u8>,
    expected: &mut Vec<Message>,
) {
    let (body, rsv1) = match deflater {
        Some(d) => {
            let mut c = Vec::new();
            assert!(d.compress(payload, &mut c));
            (c, true)
        }
        None => (payload.to_vec(), false),
    };
    let mut pos = 0;
    let mut first = true;
    loop {
        let n = rng.below(max_frag + 1).min(body.len() - pos);
        let fin = pos + n == body.len();
        out.extend(raw_frame(
            fin,
            rsv1 && first,
            if first { opcode } else { 0 },
            peer_mask(role, rng),
            &body[pos..pos + n],
        ));
        pos += n;
        first = false;
        if fin {
            break;
        }
        if rng.below(4) == 0 {
            let n = rng.below(126);
            let p = rng.bytes(n);
            let op = if rng.below(2) == 0 { 9 } else { 10 };
            out.extend(raw_frame(true, false, op, peer_mask(role, rng), &p));
            expected.push(if op == 9 {
                Message::Ping(p)
            } else {
                Message::Pong(p)
            });
        }
    }
    expected.push(if opcode == 1 {
        Message::Text(payload.to_vec())
    } else {
        Message::Binary(payload.to_vec())
    });
}

/// A conversation: JSON requests and binary blobs of several sizes, fragmented, with
/// control frames, plus some single-frame messages; returns the wire bytes and messages.
fn conversation(
    role: Role,
    seed: u64,
    deflate: Option<DeflateParams>,
    json_size: usize,
) -> (Vec<u8>, Vec<Message>) {
    let mut rng = Rng(seed);
    let mut deflater = deflate.map(|p| {
        Deflater::new(match role {
            Role::Server => p.client_no_context_takeover,
            Role::Client => p.server_no_context_takeover,
        })
    });
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    for i in 0..3 {
        let json = codex_json(json_size, &mut rng);
        fragmented(
            role,
            &mut rng,
            1,
            &json,
            deflater.as_mut(),
            json_size / 5,
            &mut wire,
            &mut expected,
        );
        let blob = rng.bytes(300 + i * 200);
        fragmented(
            role,
            &mut rng,
            2,
            &blob,
            deflater.as_mut(),
            97,
            &mut wire,
            &mut expected,
        );
        wire.extend(raw_frame(
            true,
            false,
            1,
            peer_mask(role, &mut rng),
            b"{\"type\":\"ping\"}",
        ));
        expected.push(text("{\"type\":\"ping\"}"));
    }
    (wire, expected)
}

fn params_variants() -> Vec<Option<DeflateParams>> {
    vec![
        None,
        takeover(),
        Some(DeflateParams {
            server_no_context_takeover: true,
            client_no_context_takeover: true,
            ..DeflateParams::default()
        }),
    ]
}

#[test]
fn segmentation_every_split_point() {
    // About 40 KB JSON requests, so inputs stay near or under 64 KiB for one-byte feeding.
    for role in [Role::Server, Role::Client] {
        for (k, deflate) in params_variants().into_iter().enumerate() {
            let (wire, expected) = conversation(role, 11 + k as u64, deflate, 12_000);
            let whole = feed(
                &mut Decoder::new(role, Limits::default(), deflate),
                &wire,
                &[],
            )
            .unwrap();
            assert_eq!(whole, expected);
            if wire.len() <= 64 << 10 {
                let cuts = one_byte_cuts(wire.len());
                let bytewise = feed(
                    &mut Decoder::new(role, Limits::default(), deflate),
                    &wire,
                    &cuts,
                )
                .unwrap();
                assert_eq!(bytewise, expected, "{role:?} {deflate:?} one byte per read");
            }
            // A smaller conversation split at every single point, in two reads.
            let (small, small_expected) = conversation(role, 21 + k as u64, deflate, 500);
            for cut in 0..small.len() {
                let mut dec = Decoder::new(role, Limits::default(), deflate);
                let got = feed(&mut dec, &small, &[cut]).unwrap();
                assert_eq!(got, small_expected, "{role:?} {deflate:?} cut at {cut}");
            }
        }
    }
}

#[test]
fn segmentation_codex_sized_json_one_byte_per_read() {
    // One ~40 KB JSON message, compressed and not, in many fragments, one byte per read.
    for role in [Role::Server, Role::Client] {
        for deflate in params_variants() {
            let mut rng = Rng(99);
            let json = codex_json(40_000, &mut rng);
            let mut deflater = deflate.map(|p| Deflater::new(p.client_no_context_takeover));
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            fragmented(
                role,
                &mut rng,
                1,
                &json,
                deflater.as_mut(),
                4000,
                &mut wire,
                &mut expected,
            );
            assert!(wire.len() <= 64 << 10);
            let got = feed(
                &mut Decoder::new(role, Limits::default(), deflate),
                &wire,
                &one_byte_cuts(wire.len()),
            )
            .unwrap();
            assert_eq!(got, expected);
        }
    }
}

#[test]
fn segmentation_large_conversations_random_splits() {
    for role in [Role::Server, Role::Client] {
        for (k, deflate) in params_variants().into_iter().enumerate() {
            let (wire, expected) = conversation(role, 1000 + k as u64, deflate, 200_000);
            let mut rng = Rng(5 + k as u64);
            for max_piece in [1usize << 20, 16 << 10, 1500, 7] {
                let cuts = random_cuts(&mut rng, wire.len(), max_piece);
                let got = feed(
                    &mut Decoder::new(role, Limits::default(), deflate),
                    &wire,
                    &cuts,
                )
                .unwrap();
                assert_eq!(
                    got, expected,
                    "{role:?} {deflate:?} pieces up to {max_piece}"
                );
            }
        }
    }
}

#[test]
fn sixteen_mib_message_one_byte_per_read_is_linear() {
    // A single 16 MiB frame (exactly the default limit), one byte per read: each call looks
    // only at the frame header, so this finishes quickly; a re-scanning decoder would not.
    let mut rng = Rng(3);
    let payload: Vec<u8> = (0..16 << 20).map(|i: usize| (i % 251) as u8).collect();
    let wire = raw_frame(true, false, 2, peer_mask(Role::Server, &mut rng), &payload);
    let mut dec = Decoder::new(Role::Server, Limits::default(), None);
    let mut buf = Vec::new();
    let mut got = None;
    let started = std::time::Instant::now();
    for &b in &wire {
        buf.push(b);
        if let Some(m) = dec.decode(&mut buf).unwrap() {
            got = Some(m);
        }
    }
    assert!(buf.is_empty());
    assert!(got == Some(Message::Binary(payload)));
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

#[test]
fn sixteen_mib_messages_fragmented_random_splits() {
    // 16 MiB messages (compressed and not, fragmented, control frames between) in seeded
    // random reads.
    for (k, deflate) in params_variants().into_iter().enumerate() {
        let mut rng = Rng(40 + k as u64);
        let mut payload = Vec::with_capacity(16 << 20);
        while payload.len() < 16 << 20 {
            let json = codex_json(50_000, &mut rng);
            let n = json.len().min((16 << 20) - payload.len());
            payload.extend_from_slice(&json[..n]);
        }
        // Cut to a valid UTF-8 boundary just under 16 MiB.
        let s = String::from_utf8_lossy(&payload[..(16 << 20) - 8]).into_owned();
        let payload = s.into_bytes();
        assert!(payload.len() <= 16 << 20);
        let mut deflater = deflate.map(|p| Deflater::new(p.client_no_context_takeover));
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        fragmented(
            Role::Server,
            &mut rng,
            1,
            &payload,
            deflater.as_mut(),
            1 << 20,
            &mut wire,
            &mut expected,
        );
        fragmented(
            Role::Server,
            &mut rng,
            1,
            b"{\"after\":true,\"padding\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
            deflater.as_mut(),
            20,
            &mut wire,
            &mut expected,
        );
        let cuts = random_cuts(&mut rng, wire.len(), 64 << 10);
        let got = feed(
            &mut Decoder::new(Role::Server, Limits::default(), deflate),
            &wire,
            &cuts,
        )
        .unwrap();
        assert!(got == expected, "{deflate:?}");
    }
}

// --- round trips -----------------------------------------------------------------------

#[test]
fn round_trips_both_roles_with_and_without_deflate() {
    let variants = [
        None,
        takeover(),
        Some(DeflateParams {
            server_no_context_takeover: true,
            ..DeflateParams::default()
        }),
        Some(DeflateParams {
            client_no_context_takeover: true,
            ..DeflateParams::default()
        }),
        Some(DeflateParams {
            server_no_context_takeover: true,
            client_no_context_takeover: true,
            ..DeflateParams::default()
        }),
    ];
    for deflate in variants {
        for sender in [Role::Server, Role::Client] {
            let receiver = if sender == Role::Server {
                Role::Client
            } else {
                Role::Server
            };
            let mut enc = Encoder::new(sender, deflate);
            let mut dec = Decoder::new(receiver, Limits::default(), deflate);
            let mut rng = Rng(17);
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for i in 0..300 {
                match i % 7 {
                    0 => {
                        let j = codex_json(200 + rng.below(5000), &mut rng);
                        enc.text(&mut wire, &j);
                        expected.push(Message::Text(j));
                    }
                    1 => {
                        // Repeated events, where context takeover pays.
                        let e = br#"{"type":"response.output_text.delta","delta":"abc"}"#.to_vec();
                        enc.text(&mut wire, &e);
                        expected.push(Message::Text(e));
                    }
                    2 => {
                        let n = rng.below(3000);
                        let b = rng.bytes(n);
                        enc.binary(&mut wire, &b);
                        expected.push(Message::Binary(b));
                    }
                    3 => {
                        let n = rng.below(126);
                        let p = rng.bytes(n);
                        enc.ping(&mut wire, &p);
                        expected.push(Message::Ping(p));
                    }
                    4 => {
                        enc.pong(&mut wire, b"");
                        expected.push(Message::Pong(vec![]));
                    }
                    5 => {
                        enc.text(&mut wire, b"");
                        expected.push(text(""));
                    }
                    _ => {
                        let b = vec![b'z'; 70_000 + rng.below(10)];
                        enc.binary(&mut wire, &b);
                        expected.push(Message::Binary(b));
                    }
                }
            }
            enc.close(&mut wire, 1000, "done");
            expected.push(Message::Close(Some((1000, "done".into()))));
            let cuts = random_cuts(&mut rng, wire.len(), 5000);
            let got = feed(&mut dec, &wire, &cuts).unwrap();
            assert!(got == expected, "{sender:?} {deflate:?}");
        }
    }
}

#[test]
fn context_takeover_shrinks_repeated_messages() {
    let event =
        br#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"the same words"}"#;
    let sizes = |deflate| {
        let mut enc = Encoder::new(Role::Server, Some(deflate));
        (0..2)
            .map(|_| {
                let mut out = Vec::new();
                enc.text(&mut out, event);
                out.len()
            })
            .collect::<Vec<_>>()
    };
    let on = sizes(DeflateParams::default());
    assert!(on[1] < on[0], "{on:?}");
    let off = sizes(DeflateParams {
        server_no_context_takeover: true,
        ..DeflateParams::default()
    });
    assert_eq!(off[0], off[1]);
    // The client side follows client_no_context_takeover instead.
    let mut enc = Encoder::new(
        Role::Client,
        Some(DeflateParams {
            server_no_context_takeover: true,
            ..DeflateParams::default()
        }),
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    enc.text(&mut a, event);
    enc.text(&mut b, event);
    assert!(b.len() < a.len());
}

#[test]
fn decode_slice_reports_consumption() {
    let mut dec = Decoder::new(Role::Client, Limits::default(), None);
    let mut input = HELLO.to_vec();
    input.extend_from_slice(&HELLO[..3]);
    let (used, msg) = dec.decode_slice(&mut input).unwrap();
    assert_eq!((used, msg), (7, Some(text("Hello"))));
    let (used, msg) = dec.decode_slice(&mut input[7..]).unwrap();
    assert_eq!((used, msg), (0, None));
}
