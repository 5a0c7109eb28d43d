//! RFC 7692 `permessage-deflate`: negotiation (offers as a server, the response as a client)
//! and the per-message compressor and decompressor.
//!
//! # Key Components
//! - [`DeflateParams`]: the negotiated parameters (context takeover per direction, window bits).
//! - [`negotiate_offers`]: the server's choice among a client's offers (the first acceptable one
//!   wins); [`parse_response`]: the client's check of what the server chose.
//! - `Deflater` / `Inflater` (crate-private): raw DEFLATE with a sync flush per message, the
//!   trailing `00 00 ff ff` removed when compressing and appended when decompressing; the
//!   context is reset per message when the negotiated `*_no_context_takeover` says so.
//!
//! # Error handling
//! Negotiation never fails on the server: an unacceptable or malformed offer is declined
//! (the next offer is tried; none acceptable means no extension). On the client a response we
//! cannot honour is a `&'static str` that the handshake turns into its error. Decompression
//! errors are [`InflateError`]; the codec maps them to close codes (1007 for corrupt data,
//! 1009 past the size limit).
//!
//! The flate2 rust backend (miniz_oxide) always compresses with a 32 KiB (15-bit) window and
//! cannot be limited, so an offer demanding `server_max_window_bits` < 15 is declined; a
//! smaller peer window is always readable by our 15-bit inflater.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The extension's registered name.
pub const EXTENSION: &str = "permessage-deflate";

/// What the client offers when the gateway connects upstream: no limits asked of the server,
/// and the hint that it may limit our window (which we then refuse below 15, see
/// [`parse_response`]).
pub const CLIENT_OFFER: &str = "permessage-deflate; client_max_window_bits";

/// The empty stored block that ends every sync flush (RFC 7692 §7.2.1).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Compression level: fast, since the gateway relays many small JSON events.
const LEVEL: u32 = 1;

/// Negotiated `permessage-deflate` parameters, the same on both ends of a connection.
///
/// `server_*` parameters govern what the server compresses (and the client decompresses),
/// `client_*` the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeflateParams {
    /// The server resets its compressor after each message.
    pub server_no_context_takeover: bool,
    /// The client resets its compressor after each message.
    pub client_no_context_takeover: bool,
    /// `server_max_window_bits` as it appears in the response (`None`: absent, 15).
    pub server_max_window_bits: Option<u8>,
    /// `client_max_window_bits` as it appears in the response (`None`: absent, 15).
    pub client_max_window_bits: Option<u8>,
}

// === impl DeflateParams ===

impl DeflateParams {
    /// The `Sec-WebSocket-Extensions` response value that states these parameters.
    pub fn response_value(&self) -> String {
        let mut v = String::from(EXTENSION);
        if self.server_no_context_takeover {
            v.push_str("; server_no_context_takeover");
        }
        if self.client_no_context_takeover {
            v.push_str("; client_no_context_takeover");
        }
        if let Some(bits) = self.server_max_window_bits {
            v.push_str(&format!("; server_max_window_bits={bits}"));
        }
        if let Some(bits) = self.client_max_window_bits {
            v.push_str(&format!("; client_max_window_bits={bits}"));
        }
        v
    }
}

/// One parsed extension element: its name and `(name, value)` parameters, names
/// lower-cased, quoted values unquoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Extension {
    pub(crate) name: String,
    pub(crate) params: Vec<(String, Option<String>)>,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// Splits `s` at `sep` outside quoted strings (a backslash escapes inside quotes).
fn split_outside_quotes(s: &str, sep: u8) -> Vec<&str> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if quoted {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = false;
            }
        } else if b == b'"' {
            quoted = true;
        } else if b == sep {
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Parses one extension element (`token *( ";" token [ "=" (token / quoted-string) ] )`,
/// RFC 6455 §9.1). A quoted value must itself be a token once unquoted. `None`: malformed.
pub(crate) fn parse_extension(element: &str) -> Option<Extension> {
    let mut pieces = split_outside_quotes(element, b';').into_iter();
    let name = pieces.next()?.trim();
    if !is_token(name) {
        return None;
    }
    let mut params = Vec::new();
    for piece in pieces {
        let (pname, value) = match piece.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (piece.trim(), None),
        };
        if !is_token(pname) {
            return None;
        }
        let value = match value {
            None => None,
            Some(v) => {
                let v = match v.strip_prefix('"') {
                    Some(inner) => unquote(inner)?,
                    None => v.to_owned(),
                };
                if !is_token(&v) {
                    return None;
                }
                Some(v)
            }
        };
        params.push((pname.to_ascii_lowercase(), value));
    }
    Some(Extension {
        name: name.to_ascii_lowercase(),
        params,
    })
}

/// `inner` is a quoted string after its opening quote: returns its unescaped content if the
/// closing quote ends the input.
fn unquote(inner: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return chars.next().is_none().then_some(out),
            c => out.push(c),
        }
    }
    None
}

/// The elements of one or more `Sec-WebSocket-Extensions` values, in order; malformed
/// elements are `None` (so that a server declines just that offer).
pub(crate) fn parse_extension_list(values: &[&str]) -> Vec<Option<Extension>> {
    values
        .iter()
        .flat_map(|v| split_outside_quotes(v, b','))
        .filter(|e| !e.trim().is_empty())
        .map(parse_extension)
        .collect()
}

/// A window-bits value: a decimal integer 8..=15 without leading zeros (RFC 7692 §7.1.2).
fn window_bits(v: &str) -> Option<u8> {
    if v.is_empty() || v.len() > 2 || v.starts_with('0') || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u8 = v.parse().ok()?;
    (8..=15).contains(&n).then_some(n)
}

/// The server's answer to one `permessage-deflate` offer; `None` declines it.
fn accept_offer(ext: &Extension) -> Option<DeflateParams> {
    let mut params = DeflateParams::default();
    let mut seen = [false; 4];
    for (name, value) in &ext.params {
        let slot = match name.as_str() {
            "server_no_context_takeover" => 0,
            "client_no_context_takeover" => 1,
            "server_max_window_bits" => 2,
            "client_max_window_bits" => 3,
            _ => return None,
        };
        if std::mem::replace(&mut seen[slot], true) {
            return None;
        }
        match slot {
            0 | 1 => {
                if value.is_some() {
                    return None;
                }
                if slot == 0 {
                    params.server_no_context_takeover = true;
                } else {
                    // A hint; echoing it tells the client it may reset (our inflater resets
                    // too, which is right either way).
                    params.client_no_context_takeover = true;
                }
            }
            2 => {
                // Our compressor always uses 15 bits: only 15 can be honoured.
                let bits = window_bits(value.as_deref()?)?;
                if bits < 15 {
                    return None;
                }
                params.server_max_window_bits = Some(15);
            }
            _ => {
                // The client may limit its own window; our 15-bit inflater reads any
                // smaller window, so we never ask for a limit in the response.
                if let Some(v) = value {
                    window_bits(v)?;
                }
            }
        }
    }
    Some(params)
}

/// The server's negotiation: the first acceptable `permessage-deflate` offer among the
/// client's `Sec-WebSocket-Extensions` values, or `None` (no extension).
pub fn negotiate_offers(values: &[&str]) -> Option<DeflateParams> {
    parse_extension_list(values)
        .into_iter()
        .flatten()
        .filter(|e| e.name == EXTENSION)
        .find_map(|e| accept_offer(&e))
}

/// The client's check of the server's `Sec-WebSocket-Extensions` response values, after
/// offering [`CLIENT_OFFER`]. `Ok(None)`: no extension in use.
pub fn parse_response(values: &[&str]) -> Result<Option<DeflateParams>, &'static str> {
    let elements = parse_extension_list(values);
    let mut chosen = None;
    for element in elements {
        let ext = element.ok_or("malformed sec-websocket-extensions in the response")?;
        if ext.name != EXTENSION {
            return Err("the server chose an extension we did not offer");
        }
        if chosen.is_some() {
            return Err("the server chose permessage-deflate twice");
        }
        chosen = Some(ext);
    }
    let Some(ext) = chosen else {
        return Ok(None);
    };
    let mut params = DeflateParams::default();
    let mut seen = [false; 4];
    for (name, value) in &ext.params {
        let slot = match name.as_str() {
            "server_no_context_takeover" => 0,
            "client_no_context_takeover" => 1,
            "server_max_window_bits" => 2,
            "client_max_window_bits" => 3,
            _ => return Err("unknown permessage-deflate parameter in the response"),
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Err("duplicate permessage-deflate parameter in the response");
        }
        match slot {
            0 | 1 => {
                if value.is_some() {
                    return Err("permessage-deflate parameter with a value it must not have");
                }
                if slot == 0 {
                    params.server_no_context_takeover = true;
                } else {
                    params.client_no_context_takeover = true;
                }
            }
            _ => {
                let bits = value
                    .as_deref()
                    .and_then(window_bits)
                    .ok_or("invalid window bits in the permessage-deflate response")?;
                if slot == 2 {
                    params.server_max_window_bits = Some(bits);
                } else {
                    if bits < 15 {
                        return Err("the server asked for a compression window we cannot limit");
                    }
                    params.client_max_window_bits = Some(bits);
                }
            }
        }
    }
    Ok(Some(params))
}

/// Why a compressed message could not be decompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InflateError {
    /// Not valid DEFLATE data.
    Corrupt,
    /// The output would exceed the message limit.
    TooBig,
}

/// Per-connection compressor (one direction).
pub(crate) struct Deflater {
    compress: Compress,
    reset_each: bool,
}

// === impl Deflater ===

impl Deflater {
    /// A raw-DEFLATE compressor that resets after each message when `no_context_takeover`.
    pub(crate) fn new(no_context_takeover: bool) -> Self {
        Self {
            compress: Compress::new(Compression::new(LEVEL), false),
            reset_each: no_context_takeover,
        }
    }

    /// Appends the compressed form of one whole message to `out` (sync flush, the trailing
    /// `00 00 ff ff` removed). Returns false (with `out` as it was) if compression failed; the
    /// compressor is then reset, so the caller can send the message uncompressed.
    pub(crate) fn compress(&mut self, input: &[u8], out: &mut Vec<u8>) -> bool {
        let start_len = out.len();
        let start_in = self.compress.total_in();
        out.reserve(input.len() / 2 + 64);
        loop {
            let used = self.used(start_in);
            let before_out = out.len();
            let res = self
                .compress
                .compress_vec(&input[used..], out, FlushCompress::Sync);
            let now_used = self.used(start_in);
            if res.is_err()
                || (now_used == used && out.len() == before_out && now_used < input.len())
            {
                return self.fail(out, start_len);
            }
            if now_used == input.len() && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.capacity().max(64));
        }
        if out.len() < start_len + TAIL.len() || out[out.len() - TAIL.len()..] != TAIL {
            return self.fail(out, start_len);
        }
        out.truncate(out.len() - TAIL.len());
        if self.reset_each {
            self.compress.reset();
        }
        true
    }

    fn used(&self, start_in: u64) -> usize {
        usize::try_from(self.compress.total_in() - start_in).unwrap_or(usize::MAX)
    }

    fn fail(&mut self, out: &mut Vec<u8>, start_len: usize) -> bool {
        // The peer's window never saw this message; after a reset ours has not either, and
        // a peer window holding more history than we reference is harmless.
        out.truncate(start_len);
        self.compress.reset();
        false
    }
}

/// Per-connection decompressor (one direction).
pub(crate) struct Inflater {
    decompress: Decompress,
    reset_each: bool,
    /// The current message hit a final block: the rest of it is ignored and the context
    /// starts afresh with the next message.
    ended: bool,
}

// === impl Inflater ===

impl Inflater {
    /// A raw-DEFLATE decompressor (15-bit window) that resets after each message when
    /// `no_context_takeover`.
    pub(crate) fn new(no_context_takeover: bool) -> Self {
        Self {
            decompress: Decompress::new(false),
            reset_each: no_context_takeover,
            ended: false,
        }
    }

    /// Decompresses one fragment of a compressed message, appending to `out`, which never
    /// grows past `max + 1` bytes (so a small "bomb" costs at most the limit).
    pub(crate) fn inflate(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<(), InflateError> {
        self.run(input, out, max, FlushDecompress::None)
    }

    /// Ends the message: feeds the removed `00 00 ff ff` and resets the context if the
    /// parameters (or a final block) say so.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>, max: usize) -> Result<(), InflateError> {
        let res = self.run(&TAIL, out, max, FlushDecompress::Sync);
        if self.reset_each || self.ended || res.is_err() {
            self.decompress.reset(false);
            self.ended = false;
        }
        res
    }

    fn run(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        max: usize,
        flush: FlushDecompress,
    ) -> Result<(), InflateError> {
        if self.ended {
            return Ok(());
        }
        let cap_limit = max.saturating_add(1);
        let start_in = self.decompress.total_in();
        loop {
            let used = usize::try_from(self.decompress.total_in() - start_in)
                .map_err(|_| InflateError::Corrupt)?;
            if out.len() == out.capacity() {
                if out.capacity() >= cap_limit {
                    return Err(InflateError::TooBig);
                }
                let target = out
                    .capacity()
                    .saturating_mul(2)
                    .max(out.len() + 4096)
                    .max(input.len().saturating_mul(2))
                    .min(cap_limit);
                out.reserve_exact(target - out.len());
            }
            let before = (used, out.len());
            let status = self
                .decompress
                .decompress_vec(&input[used..], out, flush)
                .map_err(|_| InflateError::Corrupt)?;
            if out.len() > max {
                return Err(InflateError::TooBig);
            }
            if status == Status::StreamEnd {
                self.ended = true;
                return Ok(());
            }
            let now_used = usize::try_from(self.decompress.total_in() - start_in)
                .map_err(|_| InflateError::Corrupt)?;
            let spare = out.len() < out.capacity();
            if now_used == input.len() && spare {
                return Ok(());
            }
            if (now_used, out.len()) == before && spare {
                // No progress with room to write: the input cannot be consumed.
                return Err(InflateError::Corrupt);
            }
        }
    }
}

#[cfg(test)]
mod tests;
