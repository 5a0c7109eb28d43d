//! The WebSocket protocol (RFC 6455) with `permessage-deflate` (RFC 7692), sans IO: the
//! Responses WebSocket transport uses it inbound (clients such as the Codex CLI and the
//! OpenAI SDK's `responses.connect()`) and outbound (the gateway's connection to the Codex
//! backend). Nothing here touches a socket: callers feed bytes read with
//! [`crate::wire::read_more`] to a [`Decoder`] and write what an [`Encoder`] appends with
//! `write_all`.
//!
//! # Key Components
//! - [`handshake`]: the opening handshake both ways ([`accept`] + [`response_head`] for the
//!   front door, [`client_request`] + [`client_verify`] upstream), including the
//!   `permessage-deflate` negotiation.
//! - [`codec`]: [`Decoder`] (frames from the front of a buffer to whole messages, fragments
//!   reassembled, every RFC 6455 rule checked, linear under any segmentation) and [`Encoder`]
//!   (one frame per message, masked as a client, compressed when negotiated).
//! - [`deflate`]: [`DeflateParams`] and the per-message compressor/decompressor.
//!
//! # Usage
//! ```ignore
//! let hs = ws::accept(&head.headers)?;            // HandshakeError -> status()/message()
//! io.write_all(ws::response_head(&hs, &[])).await;
//! let mut dec = ws::Decoder::new(ws::Role::Server, ws::Limits::default(), hs.deflate);
//! let mut enc = ws::Encoder::new(ws::Role::Server, hs.deflate);
//! loop {
//!     match dec.decode(&mut buf) {
//!         Ok(Some(ws::Message::Ping(p))) => enc.pong(&mut out, &p),
//!         Ok(Some(msg)) => { /* ... */ }
//!         Ok(None) => { read_more(&mut io, &mut buf, 16 << 10).await?; }
//!         Err(e) => { enc.close(&mut out, e.code, e.reason); /* write, then close */ }
//!     }
//! }
//! ```
//!
//! # Error handling
//! Handshake failures are [`HandshakeError`] (an HTTP status and message on the server, 502
//! on the client). Frame-level violations are [`CloseError`]: the close code and reason to
//! send before closing (1002 protocol, 1007 invalid data, 1009 too big); the decoder stays
//! failed afterwards.
//!
//! Deliberate limits: we never fragment what we send, never select a subprotocol, and as a
//! server decline `permessage-deflate` offers that demand `server_max_window_bits` below 15
//! (the miniz_oxide backend cannot shrink its window).

pub mod codec;
pub mod deflate;
pub mod handshake;

#[cfg(test)]
mod interop;

pub use codec::{CloseError, Decoder, Encoder, Limits, Message, Role};
pub use deflate::DeflateParams;
pub use handshake::{
    accept, client_request, client_verify, response_head, ClientHandshake, HandshakeError,
    ServerHandshake,
};
