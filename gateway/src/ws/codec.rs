//! RFC 6455 framing: a sans-IO [`Decoder`] (bytes in, whole messages out) and [`Encoder`]
//! (messages in, frames appended to an output buffer), for either end of a connection.
//!
//! # Key Components
//! - [`Decoder::decode`]: takes complete frames from the front of the caller's buffer,
//!   reassembles fragmented data messages (decompressing `permessage-deflate` as it goes),
//!   returns control frames as they come, and validates everything RFC 6455 and RFC 7692
//!   require. A partial frame stays in the buffer and costs O(1) per call (only its header is
//!   looked at again), so a message arriving one byte per read is linear, not quadratic.
//! - [`Encoder`]: one unfragmented frame per message; masked with a fresh random key in the
//!   client role; data messages compressed (RSV1) when deflate was negotiated.
//! - [`apply_mask`]: XOR masking eight bytes at a time (safe code).
//!
//! # Error handling
//! Every violation is a [`CloseError`]: the close code and reason to send in our Close frame
//! before closing the connection (1002 protocol error, 1007 invalid payload data, 1009 too
//! big). After an error the decoder returns the same error forever.

use std::fmt;

use crate::ws::deflate::{DeflateParams, Deflater, InflateError, Inflater};

/// Which end of the connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Expects masked frames, sends unmasked ones.
    Server,
    /// Expects unmasked frames, sends frames masked with random keys.
    Client,
}

/// Decoder limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest data message accepted, counted after decompression (default 16 MiB).
    pub max_message: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message: 16 << 20,
        }
    }
}

/// One WebSocket message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message; the bytes are valid UTF-8 (checked by the decoder).
    Text(Vec<u8>),
    /// A binary message.
    Binary(Vec<u8>),
    /// A Ping; answer with a Pong carrying the same payload.
    Ping(Vec<u8>),
    /// A Pong.
    Pong(Vec<u8>),
    /// A Close with its status code and reason, or none (empty payload).
    Close(Option<(u16, String)>),
}

/// A protocol violation by the peer: what to send in our Close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseError {
    /// The close code (1002, 1007, 1009, ...).
    pub code: u16,
    /// A short reason for the Close frame and logs.
    pub reason: &'static str,
}

// === impl CloseError ===

impl CloseError {
    const fn protocol(reason: &'static str) -> Self {
        Self {
            code: close_code::PROTOCOL,
            reason,
        }
    }
}

impl fmt::Display for CloseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "websocket close {}: {}", self.code, self.reason)
    }
}

impl std::error::Error for CloseError {}

/// Close codes (RFC 6455 §7.4.1).
pub mod close_code {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// The endpoint is going away (server shutdown, navigation).
    pub const GOING_AWAY: u16 = 1001;
    /// Protocol error.
    pub const PROTOCOL: u16 = 1002;
    /// A data type the endpoint cannot accept.
    pub const UNSUPPORTED: u16 = 1003;
    /// No status code was present (never sent on the wire).
    pub const NO_STATUS: u16 = 1005;
    /// Data inconsistent with the message type (invalid UTF-8 in text, corrupt compression).
    pub const INVALID_DATA: u16 = 1007;
    /// A policy violation.
    pub const POLICY: u16 = 1008;
    /// A message too big to process.
    pub const TOO_BIG: u16 = 1009;
    /// An unexpected condition on the server.
    pub const INTERNAL: u16 = 1011;
}

/// Whether `code` may appear in a received Close frame (RFC 6455 §7.4).
pub fn valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999)
}

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

const FIN: u8 = 0x80;
const RSV1: u8 = 0x40;
const RSV23: u8 = 0x30;
const MASK: u8 = 0x80;

/// The largest control-frame payload.
const MAX_CONTROL: usize = 125;

/// Payloads shorter than this are sent uncompressed even with deflate negotiated.
const MIN_COMPRESS: usize = 32;

/// XORs `data` with the 4-byte masking `key`, eight bytes at a time; `data[0]` is payload
/// byte 0 of the frame. Masking twice restores the data.
pub fn apply_mask(data: &mut [u8], key: [u8; 4]) {
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut chunks = data.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    // Chunks are a multiple of 4 long, so the remainder starts at key phase 0.
    for (b, k) in chunks.into_remainder().iter_mut().zip(key.iter().cycle()) {
        *b ^= k;
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy)]
struct Header {
    fin: bool,
    rsv1: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    header_len: usize,
    payload_len: u64,
}

/// A data message being reassembled.
struct Partial {
    text: bool,
    compressed: bool,
    data: Vec<u8>,
}

/// The receiving half of a connection: bytes in, messages out.
pub struct Decoder {
    role: Role,
    limits: Limits,
    inflater: Option<Inflater>,
    partial: Option<Partial>,
    /// A Close was returned: the peer may send nothing more.
    closed: bool,
    failed: Option<CloseError>,
}

// === impl Decoder ===

impl Decoder {
    /// A decoder for `role`; `deflate` is the negotiated `permessage-deflate`, if any.
    pub fn new(role: Role, limits: Limits, deflate: Option<DeflateParams>) -> Self {
        let inflater = deflate.map(|p| {
            // We decompress what the peer compresses.
            Inflater::new(match role {
                Role::Server => p.client_no_context_takeover,
                Role::Client => p.server_no_context_takeover,
            })
        });
        Self {
            role,
            limits,
            inflater,
            partial: None,
            closed: false,
            failed: None,
        }
    }

    /// Consumes complete frames from the front of `buf` (draining what it used, leaving a
    /// partial frame in place) and returns the next complete message, or `Ok(None)` when more
    /// bytes are needed. Control frames may arrive between the fragments of a data message
    /// and are returned as they come. After a Close has been returned, further bytes are
    /// discarded and `Ok(None)` is returned.
    ///
    /// The drain moves the bytes left behind, once per call; a caller that keeps many
    /// messages buffered can use [`Decoder::decode_slice`] and drain in bulk instead.
    pub fn decode(&mut self, buf: &mut Vec<u8>) -> Result<Option<Message>, CloseError> {
        let (used, msg) = self.decode_slice(buf)?;
        buf.drain(..used);
        Ok(msg)
    }

    /// Like [`Decoder::decode`], but leaves `buf` in place and returns how many bytes from
    /// its front were consumed (unmasking may have modified those bytes); the caller removes
    /// them before the next call.
    pub fn decode_slice(&mut self, buf: &mut [u8]) -> Result<(usize, Option<Message>), CloseError> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        if self.closed {
            return Ok((buf.len(), None));
        }
        let res = self.decode_inner(buf);
        if let Err(err) = res {
            self.failed = Some(err);
            self.partial = None;
        }
        res
    }

    fn decode_inner(&mut self, buf: &mut [u8]) -> Result<(usize, Option<Message>), CloseError> {
        let mut pos = 0;
        loop {
            let Some(h) = self.parse_header(&buf[pos..])? else {
                return Ok((pos, None));
            };
            // Bounded by the checks in parse_header, so this fits.
            let payload_len = usize::try_from(h.payload_len)
                .map_err(|_| CloseError::protocol("frame length too large"))?;
            let end = pos
                .checked_add(h.header_len)
                .and_then(|p| p.checked_add(payload_len))
                .ok_or(CloseError::protocol("frame length too large"))?;
            if buf.len() < end {
                return Ok((pos, None));
            }
            let payload = &mut buf[pos + h.header_len..end];
            pos = end;
            if let Some(key) = h.mask {
                apply_mask(payload, key);
            }
            if h.opcode >= OP_CLOSE {
                let msg = control_message(h.opcode, payload)?;
                if matches!(msg, Message::Close(_)) {
                    self.closed = true;
                }
                return Ok((pos, Some(msg)));
            }
            if let Some(msg) = self.data_frame(&h, payload)? {
                return Ok((pos, Some(msg)));
            }
        }
    }

    /// Parses and validates the header at the front of `b`; `Ok(None)` if incomplete. Checks
    /// everything knowable from the bytes present, so a bad frame fails before its payload.
    fn parse_header(&self, b: &[u8]) -> Result<Option<Header>, CloseError> {
        let (Some(&b0), Some(&b1)) = (b.first(), b.get(1)) else {
            return Ok(None);
        };
        let fin = b0 & FIN != 0;
        let rsv1 = b0 & RSV1 != 0;
        let opcode = b0 & 0x0f;
        let masked = b1 & MASK != 0;
        let len7 = b1 & 0x7f;
        if b0 & RSV23 != 0 {
            return Err(CloseError::protocol("reserved bit set"));
        }
        match (self.role, masked) {
            (Role::Server, false) => return Err(CloseError::protocol("unmasked client frame")),
            (Role::Client, true) => return Err(CloseError::protocol("masked server frame")),
            _ => {}
        }
        match opcode {
            OP_CLOSE | OP_PING | OP_PONG => {
                if !fin {
                    return Err(CloseError::protocol("fragmented control frame"));
                }
                if usize::from(len7) > MAX_CONTROL {
                    return Err(CloseError::protocol("control frame too long"));
                }
                if rsv1 {
                    return Err(CloseError::protocol("RSV1 on a control frame"));
                }
            }
            OP_CONTINUATION => {
                if self.partial.is_none() {
                    return Err(CloseError::protocol("continuation without a message"));
                }
                if rsv1 {
                    return Err(CloseError::protocol("RSV1 on a continuation frame"));
                }
            }
            OP_TEXT | OP_BINARY => {
                if self.partial.is_some() {
                    return Err(CloseError::protocol("new message inside a fragmented one"));
                }
                if rsv1 && self.inflater.is_none() {
                    return Err(CloseError::protocol("RSV1 without permessage-deflate"));
                }
            }
            _ => return Err(CloseError::protocol("unknown opcode")),
        }
        let (payload_len, mut header_len) = match len7 {
            126 => {
                let Some(ext) = b.get(2..4) else {
                    return Ok(None);
                };
                let len = u16::from_be_bytes([ext[0], ext[1]]);
                if len < 126 {
                    return Err(CloseError::protocol("non-minimal frame length"));
                }
                (u64::from(len), 4)
            }
            127 => {
                let Some(ext) = b.get(2..10) else {
                    return Ok(None);
                };
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(ext);
                let len = u64::from_be_bytes(bytes);
                if len >> 63 != 0 {
                    return Err(CloseError::protocol("frame length with the high bit set"));
                }
                if len <= 0xffff {
                    return Err(CloseError::protocol("non-minimal frame length"));
                }
                (len, 10)
            }
            n => (u64::from(n), 2),
        };
        let mask = if masked {
            let Some(k) = b.get(header_len..header_len + 4) else {
                return Ok(None);
            };
            header_len += 4;
            Some([k[0], k[1], k[2], k[3]])
        } else {
            None
        };
        if opcode < OP_CLOSE {
            self.check_size(opcode, rsv1, payload_len)?;
        }
        Ok(Some(Header {
            fin,
            rsv1,
            opcode,
            mask,
            header_len,
            payload_len,
        }))
    }

    /// Refuses a data frame whose payload cannot fit the message limit, before it arrives.
    fn check_size(&self, opcode: u8, rsv1: bool, payload_len: u64) -> Result<(), CloseError> {
        let max = self.limits.max_message as u64;
        let compressed = match (&self.partial, opcode) {
            (Some(p), _) => p.compressed,
            (None, _) => rsv1,
        };
        let too_big = if compressed {
            // Compressed data can be a little larger than what it decodes to (stored
            // blocks); the decoded size is checked while decompressing.
            payload_len > max.saturating_add(max / 1024).saturating_add(1024)
        } else {
            let have = self.partial.as_ref().map_or(0, |p| p.data.len() as u64);
            have.saturating_add(payload_len) > max
        };
        if too_big {
            return Err(CloseError {
                code: close_code::TOO_BIG,
                reason: "message too big",
            });
        }
        Ok(())
    }

    /// Adds one (unmasked) data frame to the message; returns the message when it is done.
    fn data_frame(&mut self, h: &Header, payload: &[u8]) -> Result<Option<Message>, CloseError> {
        let max = self.limits.max_message;
        let mut partial = match self.partial.take() {
            Some(p) => p,
            None => Partial {
                text: h.opcode == OP_TEXT,
                compressed: h.rsv1,
                data: if h.rsv1 {
                    Vec::new()
                } else {
                    Vec::with_capacity(payload.len())
                },
            },
        };
        if partial.compressed {
            let inflater = self
                .inflater
                .as_mut()
                .ok_or(CloseError::protocol("RSV1 without permessage-deflate"))?;
            inflater
                .inflate(payload, &mut partial.data, max)
                .map_err(inflate_error)?;
            if h.fin {
                inflater
                    .finish(&mut partial.data, max)
                    .map_err(inflate_error)?;
            }
        } else {
            partial.data.extend_from_slice(payload);
        }
        if !h.fin {
            self.partial = Some(partial);
            return Ok(None);
        }
        if partial.text {
            if std::str::from_utf8(&partial.data).is_err() {
                return Err(CloseError {
                    code: close_code::INVALID_DATA,
                    reason: "invalid UTF-8 in a text message",
                });
            }
            Ok(Some(Message::Text(partial.data)))
        } else {
            Ok(Some(Message::Binary(partial.data)))
        }
    }
}

fn inflate_error(e: InflateError) -> CloseError {
    match e {
        InflateError::Corrupt => CloseError {
            code: close_code::INVALID_DATA,
            reason: "corrupt compressed data",
        },
        InflateError::TooBig => CloseError {
            code: close_code::TOO_BIG,
            reason: "message too big",
        },
    }
}

/// Builds a control message from its unmasked payload, validating Close payloads.
fn control_message(opcode: u8, payload: &[u8]) -> Result<Message, CloseError> {
    Ok(match opcode {
        OP_PING => Message::Ping(payload.to_vec()),
        OP_PONG => Message::Pong(payload.to_vec()),
        _ => match payload {
            [] => Message::Close(None),
            [_] => return Err(CloseError::protocol("close payload of one byte")),
            [hi, lo, reason @ ..] => {
                let code = u16::from_be_bytes([*hi, *lo]);
                if !valid_close_code(code) {
                    return Err(CloseError::protocol("invalid close code"));
                }
                let reason = std::str::from_utf8(reason).map_err(|_| CloseError {
                    code: close_code::INVALID_DATA,
                    reason: "invalid UTF-8 in a close reason",
                })?;
                Message::Close(Some((code, reason.to_owned())))
            }
        },
    })
}

/// The sending half of a connection: messages in, frames out.
pub struct Encoder {
    role: Role,
    deflater: Option<Deflater>,
    /// Reused compression output.
    scratch: Vec<u8>,
}

// === impl Encoder ===

impl Encoder {
    /// An encoder for `role`; `deflate` is the negotiated `permessage-deflate`, if any.
    pub fn new(role: Role, deflate: Option<DeflateParams>) -> Self {
        let deflater = deflate.map(|p| {
            Deflater::new(match role {
                Role::Server => p.server_no_context_takeover,
                Role::Client => p.client_no_context_takeover,
            })
        });
        Self {
            role,
            deflater,
            scratch: Vec::new(),
        }
    }

    /// Appends one text frame (`payload` must be UTF-8; compressed when negotiated and worth
    /// it).
    pub fn text(&mut self, out: &mut Vec<u8>, payload: &[u8]) {
        self.data(out, OP_TEXT, payload);
    }

    /// Appends one binary frame (compressed when negotiated and worth it).
    pub fn binary(&mut self, out: &mut Vec<u8>, payload: &[u8]) {
        self.data(out, OP_BINARY, payload);
    }

    /// Appends a Ping (a payload over 125 bytes is truncated).
    pub fn ping(&mut self, out: &mut Vec<u8>, payload: &[u8]) {
        self.frame(
            out,
            OP_PING,
            false,
            &payload[..payload.len().min(MAX_CONTROL)],
        );
    }

    /// Appends a Pong (a payload over 125 bytes is truncated).
    pub fn pong(&mut self, out: &mut Vec<u8>, payload: &[u8]) {
        self.frame(
            out,
            OP_PONG,
            false,
            &payload[..payload.len().min(MAX_CONTROL)],
        );
    }

    /// Appends a Close with `code` and `reason` (truncated at a character boundary to fit
    /// 125 bytes). Code 1005 ("no status") sends an empty Close payload.
    pub fn close(&mut self, out: &mut Vec<u8>, code: u16, reason: &str) {
        if code == close_code::NO_STATUS {
            self.frame(out, OP_CLOSE, false, &[]);
            return;
        }
        let mut end = reason.len().min(MAX_CONTROL - 2);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let mut payload = [0u8; MAX_CONTROL];
        payload[..2].copy_from_slice(&code.to_be_bytes());
        payload[2..2 + end].copy_from_slice(&reason.as_bytes()[..end]);
        self.frame(out, OP_CLOSE, false, &payload[..2 + end]);
    }

    fn data(&mut self, out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
        if payload.len() >= MIN_COMPRESS {
            if let Some(deflater) = self.deflater.as_mut() {
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                if deflater.compress(payload, &mut scratch) {
                    self.frame(out, opcode, true, &scratch);
                    self.scratch = scratch;
                    return;
                }
                self.scratch = scratch;
            }
        }
        self.frame(out, opcode, false, payload);
    }

    /// Appends one final frame with the minimal length encoding, masked in the client role.
    fn frame(&mut self, out: &mut Vec<u8>, opcode: u8, rsv1: bool, payload: &[u8]) {
        let mask_bit = if self.role == Role::Client { MASK } else { 0 };
        out.reserve(14 + payload.len());
        out.push(FIN | if rsv1 { RSV1 } else { 0 } | opcode);
        let len = payload.len();
        if len < 126 {
            // Fits in 7 bits.
            out.push(mask_bit | len as u8);
        } else if let Ok(len16) = u16::try_from(len) {
            out.push(mask_bit | 126);
            out.extend_from_slice(&len16.to_be_bytes());
        } else {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
        if self.role == Role::Client {
            let key: [u8; 4] = rand::random();
            out.extend_from_slice(&key);
            let start = out.len();
            out.extend_from_slice(payload);
            apply_mask(&mut out[start..], key);
        } else {
            out.extend_from_slice(payload);
        }
    }
}

#[cfg(test)]
mod tests;
