//! `ws`: WebSocket frame decoding (`gateway::ws::Decoder`) with and without
//! `permessage-deflate`, and the `Encoder` that pairs with it.
//!
//! Input: byte 0 holds flags (bit 0 client role, bit 1 deflate, bits 2-3 no-context-takeover
//! for server/client, bit 4 a small message limit, bit 5 "generate" mode), byte 1 the largest
//! segment (0 or 1: one byte per read), byte 2 the cut seed (see [`cut`]: one cut pattern per
//! execution, the fuzzer explores them), the rest:
//! - decode mode: raw bytes from the peer. Invariants: the messages (and the error that ends
//!   them) are the same whole and cut; text is UTF-8, control payloads fit
//!   125 bytes; every message, re-encoded by the peer's `Encoder` and decoded again, comes back
//!   equal (the compressor and decompressor contexts carry over between messages).
//! - generate mode: a list of messages (`kind`, `len`, payload), encoded by the peer, the
//!   frames cut and decoded: exactly those messages come back.

use gateway::ws::{CloseError, Decoder, DeflateParams, Encoder, Limits, Message, Role};

use crate::memio::{self, cut};

const SMALL_LIMIT: usize = 512;

fn peer(role: Role) -> Role {
    match role {
        Role::Server => Role::Client,
        Role::Client => Role::Server,
    }
}

/// Feeds `segments` to a fresh decoder; the messages, then the error if one ended them.
fn decode_all(
    role: Role,
    limits: Limits,
    deflate: Option<DeflateParams>,
    segments: Vec<&[u8]>,
) -> (Vec<Message>, Option<CloseError>) {
    let mut d = Decoder::new(role, limits, deflate);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for seg in segments {
        buf.extend_from_slice(seg);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(m)) => out.push(m),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

fn encode(e: &mut Encoder, out: &mut Vec<u8>, m: &Message) {
    match m {
        Message::Text(p) => e.text(out, p),
        Message::Binary(p) => e.binary(out, p),
        Message::Ping(p) => e.ping(out, p),
        Message::Pong(p) => e.pong(out, p),
        Message::Close(None) => e.close(out, 1005, ""),
        Message::Close(Some((code, reason))) => e.close(out, *code, reason),
    }
}

fn check_message(m: &Message, limits: Limits) {
    match m {
        Message::Text(p) => {
            assert!(std::str::from_utf8(p).is_ok(), "text is UTF-8");
            assert!(p.len() <= limits.max_message, "text within the limit");
        }
        Message::Binary(p) => assert!(p.len() <= limits.max_message, "binary within the limit"),
        Message::Ping(p) | Message::Pong(p) => assert!(p.len() <= 125, "control payload"),
        Message::Close(Some((_, reason))) => assert!(reason.len() <= 123, "close reason"),
        Message::Close(None) => {}
    }
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [flags, max_seg, seed, rest @ ..] = data else {
        return;
    };
    let role = if flags & 1 != 0 {
        Role::Client
    } else {
        Role::Server
    };
    let deflate = (flags & 2 != 0).then_some(DeflateParams {
        server_no_context_takeover: flags & 4 != 0,
        client_no_context_takeover: flags & 8 != 0,
        ..DeflateParams::default()
    });
    let limits = if flags & 16 != 0 {
        Limits {
            max_message: SMALL_LIMIT,
        }
    } else {
        Limits::default()
    };
    let (seed, max_seg) = (u64::from(*seed), usize::from(*max_seg));
    if flags & 32 != 0 {
        generate(role, limits, deflate, seed, max_seg, rest);
        return;
    }

    let whole = decode_all(role, limits, deflate, memio::whole(rest));
    let split = decode_all(role, limits, deflate, cut(rest, seed, max_seg));
    assert_eq!(whole, split, "cut at seed {seed} max {max_seg}");

    // Re-encode what was decoded, as the peer would have sent it, and decode it again.
    let mut enc = Encoder::new(peer(role), deflate);
    let mut dec = Decoder::new(role, limits, deflate);
    for m in &whole.0 {
        check_message(m, limits);
        let mut wire = Vec::new();
        encode(&mut enc, &mut wire, m);
        let got = dec.decode(&mut wire);
        assert_eq!(got, Ok(Some(m.clone())), "re-encoded message");
        assert!(wire.is_empty(), "one frame per message");
        if matches!(m, Message::Close(_)) {
            break;
        }
    }
}

/// Generate mode: messages from the input, encoded by the peer, decoded by us.
fn generate(
    role: Role,
    limits: Limits,
    deflate: Option<DeflateParams>,
    seed: u64,
    max_seg: usize,
    mut rest: &[u8],
) {
    let mut msgs = Vec::new();
    while let [kind, len, tail @ ..] = rest {
        // Lengths up to 8 KiB (two bytes when the first has its top bit set).
        let (len, tail) = match (len & 0x80 != 0, tail) {
            (true, [lo, t @ ..]) => ((usize::from(len & 0x1f) << 8) | usize::from(*lo), t),
            _ => (usize::from(*len), tail),
        };
        let len = len.min(tail.len());
        let (payload, tail) = tail.split_at(len);
        rest = tail;
        let m = match kind % 5 {
            0 => match std::str::from_utf8(payload) {
                Ok(_) => Message::Text(payload.to_vec()),
                Err(_) => Message::Binary(payload.to_vec()),
            },
            1 => Message::Binary(payload.to_vec()),
            2 => Message::Ping(payload[..payload.len().min(125)].to_vec()),
            3 => Message::Pong(payload[..payload.len().min(125)].to_vec()),
            _ => {
                // A valid close code and a reason that fits.
                let code = [1000, 1001, 1003, 1008, 1011, 3000, 4999][usize::from(*kind) % 7];
                let reason = String::from_utf8_lossy(payload);
                let mut end = reason.len().min(123);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                Message::Close(Some((code, reason[..end].to_owned())))
            }
        };
        let is_close = matches!(m, Message::Close(_));
        msgs.push(m);
        if is_close {
            break;
        }
    }
    let mut enc = Encoder::new(peer(role), deflate);
    let mut wire = Vec::new();
    for m in &msgs {
        encode(&mut enc, &mut wire, m);
    }
    let (got, err) = decode_all(role, limits, deflate, cut(&wire, seed, max_seg));
    // Everything within the limit comes back; the first message over it ends the connection
    // with 1009 (compressed data is checked while inflating, so that also holds for deflate).
    let fits = |m: &Message| match m {
        Message::Text(p) | Message::Binary(p) => p.len() <= limits.max_message,
        _ => true,
    };
    let ok = msgs.iter().take_while(|m| fits(m)).count();
    assert_eq!(got.as_slice(), &msgs[..ok], "messages back");
    match msgs.get(ok) {
        Some(_) => assert_eq!(err.map(|e| e.code), Some(1009), "too big"),
        None => assert_eq!(err, None),
    }
}
