//! The RFC 6455 opening handshake, both ways: validating a client's upgrade request and
//! writing our `101` ([`accept`], [`response_head`]), and the gateway's own upgrade request to
//! the Codex backend and the check of its answer ([`client_request`], [`client_verify`]).
//!
//! # Key Components
//! - [`accept`]: the server side; negotiates `permessage-deflate` from the client's offers.
//! - [`response_head`]: the `101 Switching Protocols` head.
//! - [`client_request`] / [`client_verify`]: the client side, with a fresh random key and an
//!   optional `permessage-deflate; client_max_window_bits` offer.
//! - [`accept_key`]: `base64(SHA-1(key + GUID))`.
//!
//! # Error handling
//! [`HandshakeError`] names the failure. On the server, [`HandshakeError::status`] is the
//! HTTP status to answer (400, or 426 with [`HandshakeError::headers`] =
//! `sec-websocket-version: 13` for a wrong version); on the client it is 502 (the upstream
//! did not speak WebSocket correctly).

use base64::{engine::general_purpose::STANDARD, Engine as _};
use sha1::{Digest, Sha1};

use crate::ws::deflate::{self, DeflateParams};

/// The GUID appended to the key (RFC 6455 §1.3).
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Why an opening handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// No `upgrade: websocket` token.
    #[error("missing upgrade: websocket")]
    NotUpgrade,
    /// `connection` lacks the `upgrade` token.
    #[error("connection header lacks the upgrade token")]
    ConnectionNotUpgrade,
    /// No `sec-websocket-version`.
    #[error("missing sec-websocket-version")]
    MissingVersion,
    /// A version other than 13.
    #[error("unsupported sec-websocket-version (only 13)")]
    UnsupportedVersion,
    /// No (or more than one) `sec-websocket-key`.
    #[error("missing sec-websocket-key")]
    MissingKey,
    /// A key that is not the base64 of 16 bytes.
    #[error("sec-websocket-key is not base64 of 16 bytes")]
    InvalidKey,
    /// Client side: the response status was not 101.
    #[error("upstream answered the upgrade with a status other than 101")]
    UnexpectedStatus(u16),
    /// Client side: `sec-websocket-accept` missing or wrong.
    #[error("sec-websocket-accept missing or wrong")]
    InvalidAccept,
    /// Client side: the server chose an extension or parameters we cannot use.
    #[error("{0}")]
    Extension(&'static str),
    /// Client side: the server chose a subprotocol we did not offer.
    #[error("the server chose a subprotocol we did not offer")]
    UnexpectedProtocol,
}

// === impl HandshakeError ===

impl HandshakeError {
    /// The HTTP status to answer with (server side), or 502 for an upstream failure.
    pub fn status(&self) -> u16 {
        match self {
            Self::UnsupportedVersion => 426,
            Self::NotUpgrade
            | Self::ConnectionNotUpgrade
            | Self::MissingVersion
            | Self::MissingKey
            | Self::InvalidKey => 400,
            Self::UnexpectedStatus(_)
            | Self::InvalidAccept
            | Self::Extension(_)
            | Self::UnexpectedProtocol => 502,
        }
    }

    /// Extra headers for the error response (`sec-websocket-version: 13` with a 426).
    pub fn headers(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::UnsupportedVersion => &[("sec-websocket-version", "13")],
            _ => &[],
        }
    }

    /// A short description for the error body and logs.
    pub fn message(&self) -> &str {
        match self {
            Self::NotUpgrade => "missing upgrade: websocket",
            Self::ConnectionNotUpgrade => "connection header lacks the upgrade token",
            Self::MissingVersion => "missing sec-websocket-version",
            Self::UnsupportedVersion => "unsupported sec-websocket-version (only 13)",
            Self::MissingKey => "missing sec-websocket-key",
            Self::InvalidKey => "sec-websocket-key is not base64 of 16 bytes",
            Self::UnexpectedStatus(_) => {
                "upstream answered the upgrade with a status other than 101"
            }
            Self::InvalidAccept => "sec-websocket-accept missing or wrong",
            Self::Extension(m) => m,
            Self::UnexpectedProtocol => "the server chose a subprotocol we did not offer",
        }
    }
}

/// What the server answers to a valid upgrade request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHandshake {
    /// The `sec-websocket-accept` value.
    pub accept: String,
    /// The negotiated `permessage-deflate`, if any.
    pub deflate: Option<DeflateParams>,
    /// The `sec-websocket-extensions` response value, if an extension was accepted.
    pub extensions: Option<String>,
}

/// `base64(SHA-1(key + GUID))` (RFC 6455 §4.2.2).
pub fn accept_key(key: &str) -> String {
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(GUID.as_bytes());
    STANDARD.encode(sha.finalize())
}

/// All values of header `name` (lower-case) in order.
fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Whether the comma-separated lists in `name`'s values contain `token`
/// (case-insensitive). For `upgrade`, a protocol version suffix (`websocket/13`) does not
/// match.
fn has_token(headers: &[(String, String)], name: &str, token: &str) -> bool {
    values(headers, name)
        .iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Whether the request asks for a WebSocket upgrade at all (`upgrade: websocket`); routes use
/// it to tell a WebSocket GET from a plain one.
pub fn is_upgrade_request(headers: &[(String, String)]) -> bool {
    has_token(headers, "upgrade", "websocket")
}

/// The one value of `name`, trimmed; `None` if absent or repeated.
fn single<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    match values(headers, name).as_slice() {
        [v] => Some(v.trim()),
        _ => None,
    }
}

/// Validates an upgrade request. `headers` are (lower-case name, value) pairs; the method
/// (GET) and HTTP version (1.1) are checked by the caller. Negotiates `permessage-deflate`
/// from the client's offers (the first acceptable offer wins).
pub fn accept(headers: &[(String, String)]) -> Result<ServerHandshake, HandshakeError> {
    if !is_upgrade_request(headers) {
        return Err(HandshakeError::NotUpgrade);
    }
    if !has_token(headers, "connection", "upgrade") {
        return Err(HandshakeError::ConnectionNotUpgrade);
    }
    let versions = values(headers, "sec-websocket-version");
    match versions.as_slice() {
        [] => return Err(HandshakeError::MissingVersion),
        [v] if v.trim() == "13" => {}
        _ => return Err(HandshakeError::UnsupportedVersion),
    }
    let key = single(headers, "sec-websocket-key").ok_or(HandshakeError::MissingKey)?;
    match STANDARD.decode(key) {
        Ok(raw) if raw.len() == 16 => {}
        _ => return Err(HandshakeError::InvalidKey),
    }
    let deflate = deflate::negotiate_offers(&values(headers, "sec-websocket-extensions"));
    Ok(ServerHandshake {
        accept: accept_key(key),
        deflate,
        extensions: deflate.map(|p| p.response_value()),
    })
}

/// Whether a header name or value would break the head (CR, LF, NUL).
fn injectable(s: &str) -> bool {
    s.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0))
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &str) {
    if name.is_empty() || injectable(name) || injectable(value) {
        return;
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The `HTTP/1.1 101 Switching Protocols` head: upgrade, connection, accept, the
/// extension if any, then `extra` (a header with CR or LF in it is left out), and the blank
/// line.
pub fn response_head(h: &ServerHandshake, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\n");
    push_header(&mut out, "upgrade", "websocket");
    push_header(&mut out, "connection", "Upgrade");
    push_header(&mut out, "sec-websocket-accept", &h.accept);
    if let Some(ext) = &h.extensions {
        push_header(&mut out, "sec-websocket-extensions", ext);
    }
    for (name, value) in extra {
        push_header(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The client side of a handshake in progress: what [`client_verify`] checks against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHandshake {
    /// The `sec-websocket-key` we sent.
    pub key: String,
    /// The `sec-websocket-accept` the server must answer.
    pub expected_accept: String,
    /// Whether we offered `permessage-deflate`.
    pub offered_deflate: bool,
    /// Whether the caller's headers offered a subprotocol.
    pub offered_protocol: bool,
}

/// A `GET` request head for `path` on `host` with a fresh random key, our `headers` (a
/// header with CR or LF in it is left out) and a `permessage-deflate; client_max_window_bits`
/// offer when `offer_deflate`.
pub fn client_request(
    host: &str,
    path: &str,
    headers: &[(&str, String)],
    offer_deflate: bool,
) -> (ClientHandshake, Vec<u8>) {
    let key = STANDARD.encode(rand::random::<[u8; 16]>());
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(b"GET ");
    out.extend_from_slice(
        if path.is_empty() || injectable(path) || path.contains(' ') {
            b"/"
        } else {
            path.as_bytes()
        },
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    push_header(&mut out, "host", host);
    push_header(&mut out, "upgrade", "websocket");
    push_header(&mut out, "connection", "Upgrade");
    push_header(&mut out, "sec-websocket-key", &key);
    push_header(&mut out, "sec-websocket-version", "13");
    if offer_deflate {
        push_header(&mut out, "sec-websocket-extensions", deflate::CLIENT_OFFER);
    }
    for (name, value) in headers {
        push_header(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    let handshake = ClientHandshake {
        expected_accept: accept_key(&key),
        key,
        offered_deflate: offer_deflate,
        offered_protocol: headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-protocol")),
    };
    (handshake, out)
}

/// Checks the server's response head (status and lower-case headers): 101, the upgrade and
/// connection tokens, the accept hash, and the extension the server chose (which must be the
/// one we offered, with parameters we can honour). Returns the negotiated deflate.
pub fn client_verify(
    h: &ClientHandshake,
    status: u16,
    headers: &[(String, String)],
) -> Result<Option<DeflateParams>, HandshakeError> {
    if status != 101 {
        return Err(HandshakeError::UnexpectedStatus(status));
    }
    if !is_upgrade_request(headers) {
        return Err(HandshakeError::NotUpgrade);
    }
    if !has_token(headers, "connection", "upgrade") {
        return Err(HandshakeError::ConnectionNotUpgrade);
    }
    if single(headers, "sec-websocket-accept") != Some(h.expected_accept.as_str()) {
        return Err(HandshakeError::InvalidAccept);
    }
    if !h.offered_protocol && !values(headers, "sec-websocket-protocol").is_empty() {
        return Err(HandshakeError::UnexpectedProtocol);
    }
    let ext = values(headers, "sec-websocket-extensions");
    if !h.offered_deflate {
        return if ext.iter().all(|v| v.trim().is_empty()) {
            Ok(None)
        } else {
            Err(HandshakeError::Extension(
                "the server chose an extension we did not offer",
            ))
        };
    }
    deflate::parse_response(&ext).map_err(HandshakeError::Extension)
}

#[cfg(test)]
mod tests;
