use std::{fmt, io::Cursor};

use bytes::{BufMut, Bytes, BytesMut};
use http::{
    header::{self, HeaderName, HeaderValue},
    uri, HeaderMap, Method, Request, StatusCode, Uri,
};

use super::{util, StreamDependency, StreamId};
use crate::h2::{
    ext::Protocol,
    fields::Fields,
    frame::{Error, Frame, Head, Kind},
    hpack::{self, BytesStr},
};

type EncodeBuf<'a> = bytes::buf::Limit<&'a mut BytesMut>;
/// Header frame
///
/// This could be either a request or a response.
#[derive(Eq, PartialEq)]
pub struct Headers {
    /// The ID of the stream with which this frame is associated.
    stream_id: StreamId,

    /// The stream dependency information, if any.
    stream_dep: Option<StreamDependency>,

    /// The header block fragment
    header_block: HeaderBlock,

    /// The associated flags
    flags: HeadersFlag,
}

#[derive(Copy, Clone, Eq, PartialEq)]
pub struct HeadersFlag(u8);

#[derive(Eq, PartialEq)]
pub struct PushPromise {
    /// The ID of the stream with which this frame is associated.
    stream_id: StreamId,

    /// The ID of the stream being reserved by this PushPromise.
    promised_id: StreamId,

    /// The header block fragment
    header_block: HeaderBlock,

    /// The associated flags
    flags: PushPromiseFlag,
}

#[derive(Copy, Clone, Eq, PartialEq)]
pub struct PushPromiseFlag(u8);

#[derive(Debug)]
pub struct Continuation {
    /// Stream ID of continuation frame
    stream_id: StreamId,

    header_block: EncodingHeaderBlock,
}

// TODO: These fields shouldn't be `pub`
#[derive(Debug, Default, Eq, PartialEq)]
pub struct Pseudo {
    // Request
    pub method: Option<Method>,
    pub scheme: Option<BytesStr>,
    pub authority: Option<BytesStr>,
    pub path: Option<BytesStr>,
    pub protocol: Option<Protocol>,

    // Response
    pub status: Option<StatusCode>,
}

#[derive(Debug)]
pub struct Iter {
    /// Pseudo headers
    pseudo: Option<Pseudo>,

    /// Header fields
    fields: std::vec::IntoIter<(HeaderName, HeaderValue)>,

    /// Whether the next field has the name of the one yielded last.
    next_nameless: bool,
}

#[derive(Debug, PartialEq, Eq)]
struct HeaderBlock {
    /// The header fields, in wire order (a list, not a `HeaderMap`: `h2::fields`)
    fields: Fields,

    /// Set to true if decoding went over the max header list size.
    is_over_size: bool,

    /// Pseudo headers, these are broken out as they must be sent as part of the
    /// headers frame.
    pseudo: Pseudo,
}

#[derive(Debug)]
struct EncodingHeaderBlock {
    hpack: Bytes,
}

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const ALL: u8 = END_STREAM | END_HEADERS | PADDED | PRIORITY;

// ===== impl Headers =====

impl Headers {
    /// Create a new HEADERS frame
    pub fn new(stream_id: StreamId, pseudo: Pseudo, fields: Fields) -> Self {
        Headers {
            stream_id,
            stream_dep: None,
            header_block: HeaderBlock {
                fields,
                is_over_size: false,
                pseudo,
            },
            flags: HeadersFlag::default(),
        }
    }

    pub fn trailers(stream_id: StreamId, fields: HeaderMap) -> Self {
        let mut flags = HeadersFlag::default();
        flags.set_end_stream();

        Headers {
            stream_id,
            stream_dep: None,
            header_block: HeaderBlock {
                fields: Fields::from_header_map(fields),
                is_over_size: false,
                pseudo: Pseudo::default(),
            },
            flags,
        }
    }

    /// Loads the header frame but doesn't actually do HPACK decoding.
    ///
    /// HPACK decoding is done in the `load_hpack` step.
    pub fn load(head: Head, mut src: BytesMut) -> Result<(Self, BytesMut), Error> {
        let flags = HeadersFlag(head.flag());
        let mut pad = 0;

        tracing::trace!("loading headers; flags={:?}", flags);

        if head.stream_id().is_zero() {
            return Err(Error::InvalidStreamId);
        }

        // Read the padding length
        if flags.is_padded() {
            if src.is_empty() {
                return Err(Error::MalformedMessage);
            }
            pad = src[0] as usize;

            // Drop the padding
            let _ = src.split_to(1);
        }

        // Read the stream dependency
        let stream_dep = if flags.is_priority() {
            if src.len() < 5 {
                return Err(Error::MalformedMessage);
            }
            let stream_dep = StreamDependency::load(&src[..5])?;

            if stream_dep.dependency_id() == head.stream_id() {
                return Err(Error::InvalidDependencyId);
            }

            // Drop the next 5 bytes
            let _ = src.split_to(5);

            Some(stream_dep)
        } else {
            None
        };

        if pad > 0 {
            if pad > src.len() {
                return Err(Error::TooMuchPadding);
            }

            let len = src.len() - pad;
            src.truncate(len);
        }

        let headers = Headers {
            stream_id: head.stream_id(),
            stream_dep,
            header_block: HeaderBlock {
                // Room for a typical response head: one allocation, no regrowth.
                fields: Fields::with_capacity(16),
                is_over_size: false,
                pseudo: Pseudo::default(),
            },
            flags,
        };

        Ok((headers, src))
    }

    pub fn load_hpack(
        &mut self,
        src: &mut BytesMut,
        max_header_list_size: usize,
        decoder: &mut hpack::Decoder,
    ) -> Result<(), Error> {
        self.header_block.load(src, max_header_list_size, decoder)
    }

    pub fn stream_id(&self) -> StreamId {
        self.stream_id
    }

    pub fn is_end_headers(&self) -> bool {
        self.flags.is_end_headers()
    }

    pub fn set_end_headers(&mut self) {
        self.flags.set_end_headers();
    }

    pub fn is_end_stream(&self) -> bool {
        self.flags.is_end_stream()
    }

    pub fn set_end_stream(&mut self) {
        self.flags.set_end_stream()
    }

    pub fn is_over_size(&self) -> bool {
        self.header_block.is_over_size
    }

    pub fn into_parts(self) -> (Pseudo, Fields) {
        (self.header_block.pseudo, self.header_block.fields)
    }

    #[cfg(feature = "unstable")]
    pub fn pseudo_mut(&mut self) -> &mut Pseudo {
        &mut self.header_block.pseudo
    }

    /// Whether it has status 1xx
    pub(crate) fn is_informational(&self) -> bool {
        self.header_block.pseudo.is_informational()
    }

    pub fn fields(&self) -> &Fields {
        &self.header_block.fields
    }

    pub fn into_fields(self) -> Fields {
        self.header_block.fields
    }

    pub fn encode(
        self,
        encoder: &mut hpack::Encoder,
        dst: &mut EncodeBuf<'_>,
    ) -> Option<Continuation> {
        // At this point, the `is_end_headers` flag should always be set
        debug_assert!(self.flags.is_end_headers());

        // Get the HEADERS frame head
        let head = self.head();

        self.header_block.encode(encoder, &head, dst, |_| {})
    }

    fn head(&self) -> Head {
        Head::new(Kind::Headers, self.flags.into(), self.stream_id)
    }
}

impl<T> From<Headers> for Frame<T> {
    fn from(src: Headers) -> Self {
        Frame::Headers(Box::new(src))
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut builder = f.debug_struct("Headers");
        builder
            .field("stream_id", &self.stream_id)
            .field("flags", &self.flags);

        if let Some(ref protocol) = self.header_block.pseudo.protocol {
            builder.field("protocol", protocol);
        }

        if let Some(ref dep) = self.stream_dep {
            builder.field("stream_dep", dep);
        }

        // `fields` and `pseudo` purposefully not included
        builder.finish()
    }
}

// ===== util =====

#[derive(Debug, PartialEq, Eq)]
pub struct ParseU64Error;

pub fn parse_u64(src: &[u8]) -> Result<u64, ParseU64Error> {
    if src.len() > 19 {
        // At danger for overflow...
        return Err(ParseU64Error);
    }

    let mut ret = 0;

    for &d in src {
        if d < b'0' || d > b'9' {
            return Err(ParseU64Error);
        }

        ret *= 10;
        ret += (d - b'0') as u64;
    }

    Ok(ret)
}

// ===== impl PushPromise =====

#[derive(Debug)]
pub enum PushPromiseHeaderError {
    InvalidContentLength(Result<u64, ParseU64Error>),
    NotSafeAndCacheable,
}

impl PushPromise {
    pub fn new(
        stream_id: StreamId,
        promised_id: StreamId,
        pseudo: Pseudo,
        fields: HeaderMap,
    ) -> Self {
        PushPromise {
            flags: PushPromiseFlag::default(),
            header_block: HeaderBlock {
                fields: Fields::from_header_map(fields),
                is_over_size: false,
                pseudo,
            },
            promised_id,
            stream_id,
        }
    }

    pub fn validate_request(req: &Request<()>) -> Result<(), PushPromiseHeaderError> {
        use PushPromiseHeaderError::*;
        // The spec has some requirements for promised request headers
        // [https://httpwg.org/specs/rfc7540.html#PushRequests]

        // A promised request "that indicates the presence of a request body
        // MUST reset the promised stream with a stream error"
        if let Some(content_length) = req.headers().get(header::CONTENT_LENGTH) {
            let parsed_length = parse_u64(content_length.as_bytes());
            if parsed_length != Ok(0) {
                return Err(InvalidContentLength(parsed_length));
            }
        }
        // "The server MUST include a method in the :method pseudo-header field
        // that is safe and cacheable"
        if !Self::safe_and_cacheable(req.method()) {
            return Err(NotSafeAndCacheable);
        }

        Ok(())
    }

    fn safe_and_cacheable(method: &Method) -> bool {
        // Cacheable: https://httpwg.org/specs/rfc7231.html#cacheable.methods
        // Safe: https://httpwg.org/specs/rfc7231.html#safe.methods
        method == Method::GET || method == Method::HEAD
    }

    pub fn fields(&self) -> &Fields {
        &self.header_block.fields
    }

    #[cfg(feature = "unstable")]
    pub fn into_fields(self) -> Fields {
        self.header_block.fields
    }

    /// Loads the push promise frame but doesn't actually do HPACK decoding.
    ///
    /// HPACK decoding is done in the `load_hpack` step.
    pub fn load(head: Head, mut src: BytesMut) -> Result<(Self, BytesMut), Error> {
        let flags = PushPromiseFlag(head.flag());
        let mut pad = 0;

        if head.stream_id().is_zero() {
            return Err(Error::InvalidStreamId);
        }

        // Read the padding length
        if flags.is_padded() {
            if src.is_empty() {
                return Err(Error::MalformedMessage);
            }

            // TODO: Ensure payload is sized correctly
            pad = src[0] as usize;

            // Drop the padding
            let _ = src.split_to(1);
        }

        if src.len() < 5 {
            return Err(Error::MalformedMessage);
        }

        let (promised_id, _) = StreamId::parse(&src[..4]);
        // Drop promised_id bytes
        let _ = src.split_to(4);

        if pad > 0 {
            if pad > src.len() {
                return Err(Error::TooMuchPadding);
            }

            let len = src.len() - pad;
            src.truncate(len);
        }

        let frame = PushPromise {
            flags,
            header_block: HeaderBlock {
                fields: Fields::new(),
                is_over_size: false,
                pseudo: Pseudo::default(),
            },
            promised_id,
            stream_id: head.stream_id(),
        };
        Ok((frame, src))
    }

    pub fn load_hpack(
        &mut self,
        src: &mut BytesMut,
        max_header_list_size: usize,
        decoder: &mut hpack::Decoder,
    ) -> Result<(), Error> {
        self.header_block.load(src, max_header_list_size, decoder)
    }

    pub fn stream_id(&self) -> StreamId {
        self.stream_id
    }

    pub fn promised_id(&self) -> StreamId {
        self.promised_id
    }

    pub fn is_end_headers(&self) -> bool {
        self.flags.is_end_headers()
    }

    pub fn set_end_headers(&mut self) {
        self.flags.set_end_headers();
    }

    pub fn is_over_size(&self) -> bool {
        self.header_block.is_over_size
    }

    pub fn encode(
        self,
        encoder: &mut hpack::Encoder,
        dst: &mut EncodeBuf<'_>,
    ) -> Option<Continuation> {
        // At this point, the `is_end_headers` flag should always be set
        debug_assert!(self.flags.is_end_headers());

        let head = self.head();
        let promised_id = self.promised_id;

        self.header_block.encode(encoder, &head, dst, |dst| {
            dst.put_u32(promised_id.into());
        })
    }

    fn head(&self) -> Head {
        Head::new(Kind::PushPromise, self.flags.into(), self.stream_id)
    }

    /// Consume `self`, returning the parts of the frame
    pub fn into_parts(self) -> (Pseudo, Fields) {
        (self.header_block.pseudo, self.header_block.fields)
    }
}

impl<T> From<PushPromise> for Frame<T> {
    fn from(src: PushPromise) -> Self {
        Frame::PushPromise(Box::new(src))
    }
}

impl fmt::Debug for PushPromise {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("PushPromise")
            .field("stream_id", &self.stream_id)
            .field("promised_id", &self.promised_id)
            .field("flags", &self.flags)
            // `fields` and `pseudo` purposefully not included
            .finish()
    }
}

// ===== impl Continuation =====

impl Continuation {
    fn head(&self) -> Head {
        Head::new(Kind::Continuation, END_HEADERS, self.stream_id)
    }

    pub fn encode(self, dst: &mut EncodeBuf<'_>) -> Option<Continuation> {
        // Get the CONTINUATION frame head
        let head = self.head();

        self.header_block.encode(&head, dst, |_| {})
    }
}

// ===== impl Pseudo =====

/// codex-gateway patch (vendor/README.md, change 20): the `:path` and `:authority` values
/// of a connection's last request. A `Uri` does not give out its bytes, so each request's
/// pseudo-header values were copied out of it into new buffers; a client sends the same
/// path and authority on every request of a connection, and those share the copy made for
/// the first (the encoder then finds them by pointer).
#[derive(Debug, Default)]
pub struct UriMemo {
    path: Option<BytesStr>,
    authority: Option<BytesStr>,
}

impl UriMemo {
    fn get(slot: &mut Option<BytesStr>, text: &str) -> BytesStr {
        match slot {
            Some(v) if v.as_str() == text => v.clone(),
            _ => {
                let v = BytesStr::from(text);
                *slot = Some(v.clone());
                v
            }
        }
    }
}

impl Pseudo {
    pub fn request(method: Method, uri: Uri, protocol: Option<Protocol>) -> Self {
        Self::request_with(method, uri, protocol, &mut UriMemo::default())
    }

    /// `request`, with the values of the previous request's `memo` where they are equal.
    pub(crate) fn request_with(
        method: Method,
        uri: Uri,
        protocol: Option<Protocol>,
        memo: &mut UriMemo,
    ) -> Self {
        let parts = uri::Parts::from(uri);

        let mut path = parts
            .path_and_query
            .map(|v| UriMemo::get(&mut memo.path, v.as_str()))
            .unwrap_or(BytesStr::from_static(""));

        match method {
            Method::OPTIONS | Method::CONNECT => {}
            _ if path.is_empty() => {
                path = BytesStr::from_static("/");
            }
            _ => {}
        }

        let mut pseudo = Pseudo {
            method: Some(method),
            scheme: None,
            authority: None,
            path: Some(path).filter(|p| !p.is_empty()),
            protocol,
            status: None,
        };

        // If the URI includes a scheme component, add it to the pseudo headers
        //
        // TODO: Scheme must be set...
        if let Some(scheme) = parts.scheme {
            pseudo.set_scheme(scheme);
        }

        // If the URI includes an authority component, add it to the pseudo
        // headers
        if let Some(authority) = parts.authority {
            pseudo.set_authority(UriMemo::get(&mut memo.authority, authority.as_str()));
        }

        pseudo
    }

    pub fn response(status: StatusCode) -> Self {
        Pseudo {
            method: None,
            scheme: None,
            authority: None,
            path: None,
            protocol: None,
            status: Some(status),
        }
    }

    #[cfg(feature = "unstable")]
    pub fn set_status(&mut self, value: StatusCode) {
        self.status = Some(value);
    }

    pub fn set_scheme(&mut self, scheme: uri::Scheme) {
        let bytes_str = match scheme.as_str() {
            "http" => BytesStr::from_static("http"),
            "https" => BytesStr::from_static("https"),
            s => BytesStr::from(s),
        };
        self.scheme = Some(bytes_str);
    }

    #[cfg(feature = "unstable")]
    pub fn set_protocol(&mut self, protocol: Protocol) {
        self.protocol = Some(protocol);
    }

    pub fn set_authority(&mut self, authority: BytesStr) {
        self.authority = Some(authority);
    }

    /// Whether it has status 1xx
    pub(crate) fn is_informational(&self) -> bool {
        self.status
            .map_or(false, |status| status.is_informational())
    }
}

// ===== impl EncodingHeaderBlock =====

impl EncodingHeaderBlock {
    fn encode<F>(mut self, head: &Head, dst: &mut EncodeBuf<'_>, f: F) -> Option<Continuation>
    where
        F: FnOnce(&mut EncodeBuf<'_>),
    {
        let head_pos = dst.get_ref().len();

        // At this point, we don't know how big the h2 frame will be.
        // So, we write the head with length 0, then write the body, and
        // finally write the length once we know the size.
        head.encode(0, dst);

        let payload_pos = dst.get_ref().len();

        f(dst);

        // Now, encode the header payload
        let continuation = if self.hpack.len() > dst.remaining_mut() {
            dst.put_slice(&self.hpack.split_to(dst.remaining_mut()));

            Some(Continuation {
                stream_id: head.stream_id(),
                header_block: self,
            })
        } else {
            dst.put_slice(&self.hpack);

            None
        };

        finish_frame(dst, head_pos, payload_pos, continuation.is_some());
        continuation
    }
}

/// Writes a header-block frame's length (its head is at `head_pos`, its payload from
/// `payload_pos` to the end of `dst`), and unsets END_HEADERS when a continuation follows.
fn finish_frame(dst: &mut EncodeBuf<'_>, head_pos: usize, payload_pos: usize, continued: bool) {
    // Compute the header block length
    let payload_len = (dst.get_ref().len() - payload_pos) as u64;

    // Write the frame length
    let payload_len_be = payload_len.to_be_bytes();
    assert!(payload_len_be[0..5].iter().all(|b| *b == 0));
    (dst.get_mut()[head_pos..head_pos + 3]).copy_from_slice(&payload_len_be[5..]);

    if continued {
        // There will be continuation frames, so the `is_end_headers` flag
        // must be unset
        debug_assert!(dst.get_ref()[head_pos + 4] & END_HEADERS == END_HEADERS);

        dst.get_mut()[head_pos + 4] -= END_HEADERS;
    }
}

// ===== impl Iter =====

impl Iterator for Iter {
    type Item = hpack::Header<Option<HeaderName>>;

    fn next(&mut self) -> Option<Self::Item> {
        use crate::h2::hpack::Header::*;

        if let Some(ref mut pseudo) = self.pseudo {
            if let Some(method) = pseudo.method.take() {
                return Some(Method(method));
            }

            if let Some(scheme) = pseudo.scheme.take() {
                return Some(Scheme(scheme));
            }

            if let Some(authority) = pseudo.authority.take() {
                return Some(Authority(authority));
            }

            if let Some(path) = pseudo.path.take() {
                return Some(Path(path));
            }

            if let Some(protocol) = pseudo.protocol.take() {
                return Some(Protocol(protocol));
            }

            if let Some(status) = pseudo.status.take() {
                return Some(Status(status));
            }
        }

        self.pseudo = None;

        // A name equal to the previous field's is yielded as `None` (the encoder reuses the
        // previous index), as the published crate's `HeaderMap` iteration did for a name's
        // second and later values.
        let (name, value) = self.fields.next()?;
        let nameless = std::mem::replace(
            &mut self.next_nameless,
            self.fields
                .as_slice()
                .first()
                .is_some_and(|(n, _)| *n == name),
        );
        Some(Field {
            name: (!nameless).then_some(name),
            value,
        })
    }
}

// ===== impl HeadersFlag =====

impl HeadersFlag {
    pub fn empty() -> HeadersFlag {
        HeadersFlag(0)
    }

    pub fn load(bits: u8) -> HeadersFlag {
        HeadersFlag(bits & ALL)
    }

    pub fn is_end_stream(&self) -> bool {
        self.0 & END_STREAM == END_STREAM
    }

    pub fn set_end_stream(&mut self) {
        self.0 |= END_STREAM;
    }

    pub fn is_end_headers(&self) -> bool {
        self.0 & END_HEADERS == END_HEADERS
    }

    pub fn set_end_headers(&mut self) {
        self.0 |= END_HEADERS;
    }

    pub fn is_padded(&self) -> bool {
        self.0 & PADDED == PADDED
    }

    pub fn is_priority(&self) -> bool {
        self.0 & PRIORITY == PRIORITY
    }
}

impl Default for HeadersFlag {
    /// Returns a `HeadersFlag` value with `END_HEADERS` set.
    fn default() -> Self {
        HeadersFlag(END_HEADERS)
    }
}

impl From<HeadersFlag> for u8 {
    fn from(src: HeadersFlag) -> u8 {
        src.0
    }
}

impl fmt::Debug for HeadersFlag {
    fn fmt(&self, fmt: &mut fmt::Formatter) -> fmt::Result {
        util::debug_flags(fmt, self.0)
            .flag_if(self.is_end_headers(), "END_HEADERS")
            .flag_if(self.is_end_stream(), "END_STREAM")
            .flag_if(self.is_padded(), "PADDED")
            .flag_if(self.is_priority(), "PRIORITY")
            .finish()
    }
}

// ===== impl PushPromiseFlag =====

impl PushPromiseFlag {
    pub fn empty() -> PushPromiseFlag {
        PushPromiseFlag(0)
    }

    pub fn load(bits: u8) -> PushPromiseFlag {
        PushPromiseFlag(bits & ALL)
    }

    pub fn is_end_headers(&self) -> bool {
        self.0 & END_HEADERS == END_HEADERS
    }

    pub fn set_end_headers(&mut self) {
        self.0 |= END_HEADERS;
    }

    pub fn is_padded(&self) -> bool {
        self.0 & PADDED == PADDED
    }
}

impl Default for PushPromiseFlag {
    /// Returns a `PushPromiseFlag` value with `END_HEADERS` set.
    fn default() -> Self {
        PushPromiseFlag(END_HEADERS)
    }
}

impl From<PushPromiseFlag> for u8 {
    fn from(src: PushPromiseFlag) -> u8 {
        src.0
    }
}

impl fmt::Debug for PushPromiseFlag {
    fn fmt(&self, fmt: &mut fmt::Formatter) -> fmt::Result {
        util::debug_flags(fmt, self.0)
            .flag_if(self.is_end_headers(), "END_HEADERS")
            .flag_if(self.is_padded(), "PADDED")
            .finish()
    }
}

// ===== HeaderBlock =====

impl HeaderBlock {
    fn load(
        &mut self,
        src: &mut BytesMut,
        max_header_list_size: usize,
        decoder: &mut hpack::Decoder,
    ) -> Result<(), Error> {
        let mut reg = !self.fields.is_empty();
        let mut malformed = false;
        let mut headers_size = self.calculate_header_list_size();

        macro_rules! set_pseudo {
            ($field:ident, $val:expr) => {{
                if reg {
                    tracing::trace!("load_hpack; header malformed -- pseudo not at head of block");
                    malformed = true;
                } else if self.pseudo.$field.is_some() {
                    tracing::trace!("load_hpack; header malformed -- repeated pseudo");
                    malformed = true;
                } else {
                    let __val = $val;
                    headers_size +=
                        decoded_header_size(stringify!($field).len() + 1, __val.as_str().len());
                    if headers_size < max_header_list_size {
                        self.pseudo.$field = Some(__val);
                    } else if !self.is_over_size {
                        tracing::trace!("load_hpack; header list size over max");
                        self.is_over_size = true;
                    }
                }
            }};
        }

        let mut cursor = Cursor::new(src);

        // If the header frame is malformed, we still have to continue decoding
        // the headers. A malformed header frame is a stream level error, but
        // the hpack state is connection level. In order to maintain correct
        // state for other streams, the hpack decoding process must complete.
        let res = decoder.decode(&mut cursor, |header| {
            use crate::h2::hpack::Header::*;

            match header {
                Field { name, value } => {
                    // Connection level header fields are not supported and must
                    // result in a protocol error.
                    //
                    // codex-gateway patch (vendor/README.md, change 15): one match on the
                    // name's text (decoded names are lower-case, and the `http` crate keeps
                    // every standard name in its standard form), instead of six `HeaderName`
                    // comparisons, two of them case-insensitive against a `&str`.
                    let text = name.as_str();
                    let connection_level = matches!(
                        text,
                        "connection"
                            | "transfer-encoding"
                            | "upgrade"
                            | "keep-alive"
                            | "proxy-connection"
                    );
                    if connection_level {
                        tracing::trace!("load_hpack; connection level header");
                        malformed = true;
                    } else if text == "te" && value != "trailers" {
                        tracing::trace!(
                            "load_hpack; TE header not set to trailers; val={:?}",
                            value
                        );
                        malformed = true;
                    } else {
                        reg = true;

                        headers_size += decoded_header_size(text.len(), value.len());
                        if headers_size < max_header_list_size {
                            self.fields.push(name, value);
                        } else if !self.is_over_size {
                            tracing::trace!("load_hpack; header list size over max");
                            self.is_over_size = true;
                        }
                    }
                }
                Authority(v) => set_pseudo!(authority, v),
                Method(v) => set_pseudo!(method, v),
                Scheme(v) => set_pseudo!(scheme, v),
                Path(v) => set_pseudo!(path, v),
                Protocol(v) => set_pseudo!(protocol, v),
                Status(v) => set_pseudo!(status, v),
            }
        });

        if let Err(e) = res {
            tracing::trace!("hpack decoding error; err={:?}", e);
            return Err(e.into());
        }

        if malformed {
            tracing::trace!("malformed message");
            return Err(Error::MalformedMessage);
        }

        Ok(())
    }

    /// Encodes the block as a frame (head `head`, then what `f` writes, then the block) into
    /// `dst`, up to its limit; the rest of the block is returned as a continuation.
    ///
    /// codex-gateway patch (vendor/README.md, change 10): the block is encoded straight
    /// into the write buffer after the frame head. The published code encoded it into a new
    /// buffer grown from empty and then copied it in; a block longer than the frame allows
    /// (more than `SETTINGS_MAX_FRAME_SIZE`, 16 KiB at least) has its tail moved out into
    /// the continuation, which the published code split off the same way. Same bytes.
    fn encode<F>(
        self,
        encoder: &mut hpack::Encoder,
        head: &Head,
        dst: &mut EncodeBuf<'_>,
        f: F,
    ) -> Option<Continuation>
    where
        F: FnOnce(&mut EncodeBuf<'_>),
    {
        let head_pos = dst.get_ref().len();
        // The end of the room this frame has, head included (the limit is not consulted
        // again: the head and the block are written into the buffer itself, the block past
        // the end, then cut).
        let end = head_pos + dst.remaining_mut();
        assert!(end >= head_pos + super::HEADER_LEN);

        // At this point, we don't know how big the h2 frame will be.
        // So, we write the head with length 0, then write the body, and
        // finally write the length once we know the size.
        dst.get_mut().extend_from_slice(&head.to_bytes(0));

        let payload_pos = dst.get_ref().len();

        f(dst);

        let pseudo = Iter {
            pseudo: Some(self.pseudo),
            fields: Vec::new().into_iter(),
            next_nameless: false,
        };
        encoder.encode_fields(pseudo, self.fields.iter().as_slice(), dst.get_mut());

        let continuation = if dst.get_ref().len() > end {
            let rest = Bytes::copy_from_slice(&dst.get_ref()[end..]);
            dst.get_mut().truncate(end);
            Some(Continuation {
                stream_id: head.stream_id(),
                header_block: EncodingHeaderBlock { hpack: rest },
            })
        } else {
            None
        };

        finish_frame(dst, head_pos, payload_pos, continuation.is_some());
        continuation
    }

    /// Calculates the size of the currently decoded header list.
    ///
    /// According to http://httpwg.org/specs/rfc7540.html#SETTINGS_MAX_HEADER_LIST_SIZE
    ///
    /// > The value is based on the uncompressed size of header fields,
    /// > including the length of the name and value in octets plus an
    /// > overhead of 32 octets for each header field.
    fn calculate_header_list_size(&self) -> usize {
        macro_rules! pseudo_size {
            ($name:ident) => {{
                self.pseudo
                    .$name
                    .as_ref()
                    .map(|m| decoded_header_size(stringify!($name).len() + 1, m.as_str().len()))
                    .unwrap_or(0)
            }};
        }

        pseudo_size!(method)
            + pseudo_size!(scheme)
            + pseudo_size!(status)
            + pseudo_size!(authority)
            + pseudo_size!(path)
            + self
                .fields
                .iter()
                .map(|(name, value)| decoded_header_size(name.as_str().len(), value.len()))
                .sum::<usize>()
    }
}

fn decoded_header_size(name: usize, value: usize) -> usize {
    name + value + 32
}

#[cfg(test)]
mod test {

    use super::*;
    use crate::h2::{
        frame,
        hpack::{huffman, Encoder},
    };

    #[test]
    fn test_nameless_header_at_resume() {
        let mut encoder = Encoder::default();
        let mut dst = BytesMut::new();

        let headers = Headers::new(
            StreamId::ZERO,
            Default::default(),
            Fields::from_header_map(HeaderMap::from_iter(vec![
                (
                    HeaderName::from_static("hello"),
                    HeaderValue::from_static("world"),
                ),
                (
                    HeaderName::from_static("hello"),
                    HeaderValue::from_static("zomg"),
                ),
                (
                    HeaderName::from_static("hello"),
                    HeaderValue::from_static("sup"),
                ),
            ])),
        );

        let continuation = headers
            .encode(&mut encoder, &mut (&mut dst).limit(frame::HEADER_LEN + 8))
            .unwrap();

        assert_eq!(17, dst.len());
        assert_eq!([0, 0, 8, 1, 0, 0, 0, 0, 0], &dst[0..9]);
        assert_eq!(&[0x40, 0x80 | 4], &dst[9..11]);
        assert_eq!("hello", huff_decode(&dst[11..15]));
        assert_eq!(0x80 | 4, dst[15]);

        let mut world = dst[16..17].to_owned();

        dst.clear();

        assert!(continuation
            .encode(&mut (&mut dst).limit(frame::HEADER_LEN + 16))
            .is_none());

        world.extend_from_slice(&dst[9..12]);
        assert_eq!("world", huff_decode(&world));

        assert_eq!(24, dst.len());
        assert_eq!([0, 0, 15, 9, 4, 0, 0, 0, 0], &dst[0..9]);

        // // Next is not indexed
        assert_eq!(&[15, 47, 0x80 | 3], &dst[12..15]);
        assert_eq!("zomg", huff_decode(&dst[15..18]));
        assert_eq!(&[15, 47, 0x80 | 3], &dst[18..21]);
        assert_eq!("sup", huff_decode(&dst[21..]));
    }

    // ===== codex-gateway patch: header blocks as `Fields` (vendor/README.md) =====

    fn request_fields(token: &str, turn: &str) -> Fields {
        let mut auth = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        auth.set_sensitive(true);
        let mut f = Fields::new();
        f.push(header::AUTHORIZATION, auth);
        f.push(
            HeaderName::from_static("chatgpt-account-id"),
            HeaderValue::from_static("acct-1"),
        );
        f.push(
            HeaderName::from_static("originator"),
            HeaderValue::from_static("codex_cli_rs"),
        );
        f.push(
            header::USER_AGENT,
            HeaderValue::from_static("codex_cli_rs/0.99.0 (Linux; x86_64)"),
        );
        f.push(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        f.push(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        f.push(
            HeaderName::from_static("x-codex-turn-state"),
            HeaderValue::from_str(turn).unwrap(),
        );
        f.push(header::CONTENT_LENGTH, HeaderValue::from(1234usize));
        f
    }

    fn request_pseudo() -> Pseudo {
        Pseudo::request(
            Method::POST,
            Uri::from_static("http://127.0.0.1:8080/backend-api/codex/responses"),
            None,
        )
    }

    /// One HEADERS frame encoded whole: (frame bytes, header block bytes).
    fn encode_block(encoder: &mut Encoder, stream: u32, fields: Fields) -> (BytesMut, Vec<u8>) {
        let mut dst = BytesMut::new();
        let headers = Headers::new(StreamId::from(stream), request_pseudo(), fields);
        assert!(headers
            .encode(encoder, &mut (&mut dst).limit(1 << 20))
            .is_none());
        let block = dst[frame::HEADER_LEN..].to_vec();
        (dst, block)
    }

    /// Decodes a frame made by `encode_block` with the crate's own decoder.
    fn decode_block(decoder: &mut hpack::Decoder, mut frame_bytes: BytesMut) -> (Pseudo, Fields) {
        let head = Head::parse(&frame_bytes);
        let payload = frame_bytes.split_off(frame::HEADER_LEN);
        let (mut headers, mut rest) = Headers::load(head, payload).unwrap();
        headers.load_hpack(&mut rest, 1 << 20, decoder).unwrap();
        headers.into_parts()
    }

    #[test]
    fn fields_round_trip_in_wire_order_across_requests() {
        let mut encoder = Encoder::default();
        let mut decoder = hpack::Decoder::new(4096);
        let token = "t".repeat(900);
        let mut sizes = Vec::new();
        for (i, turn) in ["ts-1", "ts-2", "ts-2"].iter().enumerate() {
            let sent = request_fields(&token, turn);
            let (bytes, block) = encode_block(&mut encoder, 1 + 2 * i as u32, sent.clone());
            sizes.push(block.len());
            let (pseudo, got) = decode_block(&mut decoder, bytes);
            assert_eq!(pseudo.method, Some(Method::POST));
            assert_eq!(
                pseudo.path.as_ref().map(|p| p.as_str()),
                Some("/backend-api/codex/responses")
            );
            assert_eq!(
                pseudo.authority.as_ref().map(|p| p.as_str()),
                Some("127.0.0.1:8080")
            );
            let sent: Vec<_> = sent
                .iter()
                .map(|(n, v)| (n.clone(), v.as_bytes().to_vec()))
                .collect();
            let got: Vec<_> = got
                .iter()
                .map(|(n, v)| (n.clone(), v.as_bytes().to_vec()))
                .collect();
            assert_eq!(sent, got, "request {i}");
        }
        // The constant fields were indexed by the first request: the later blocks carry the
        // token (a literal every time) and one-byte indexed fields.
        let token_literal = 2 + 7 + token.len();
        assert!(sizes[0] > token_literal + 100, "{sizes:?}");
        assert!(sizes[1] < token_literal + 60, "{sizes:?}");
        assert!(sizes[2] < sizes[1], "{sizes:?}");
    }

    #[test]
    fn authorization_is_a_never_indexed_literal_every_time() {
        let mut encoder = Encoder::default();
        let token = "abc".repeat(100);
        for stream in [1, 3, 5] {
            let (_, block) = encode_block(&mut encoder, stream, request_fields(&token, "ts"));
            let value = format!("Bearer {token}");
            let at = block
                .windows(value.len())
                .position(|w| w == value.as_bytes())
                .expect("the token is a raw literal (over 256 bytes)");
            // RFC 7541 §6.2.3: 0001xxxx with the static name index 23 (4-bit prefix: 15 + 8),
            // then a raw (not Huffman) length of 307 (7-bit prefix: 127 + 180 as 0xb4 0x01).
            assert_eq!(
                &block[at - 5..at],
                &[0x1f, 0x08, 0x7f, 0xb4, 0x01],
                "stream {stream}"
            );
        }
    }

    #[test]
    fn fields_decode_after_eviction_and_table_size_changes() {
        let mut encoder = Encoder::default();
        let mut decoder = hpack::Decoder::new(4096);
        let token = "k".repeat(300);
        for i in 0..40u32 {
            // A value that changes every request fills the 4 KiB table and evicts the
            // oldest entries, the constant ones included, again and again.
            let turn = format!("ts-{i}-{}", "x".repeat(200));
            if i == 10 {
                // SETTINGS_HEADER_TABLE_SIZE from the peer: the next block starts with a
                // dynamic table size update, and the encoder indexes within 256 bytes.
                encoder.update_max_size(256);
            }
            if i == 20 {
                encoder.update_max_size(0);
            }
            if i == 30 {
                encoder.update_max_size(4096);
            }
            let sent = request_fields(&token, &turn);
            let (bytes, block) = encode_block(&mut encoder, 1 + 2 * i, sent.clone());
            if i == 10 {
                assert_eq!(&block[..3], &[0x3f, 0xe1, 0x01], "size update to 256 first");
            }
            if i == 20 {
                assert_eq!(block[0], 0x20, "size update to 0 first");
            }
            let (_, got) = decode_block(&mut decoder, bytes);
            assert_eq!(sent, got, "request {i}");
        }
    }

    #[test]
    fn decoded_fields_keep_repeats_and_order() {
        let mut encoder = Encoder::default();
        let mut decoder = hpack::Decoder::new(4096);
        let mut f = Fields::new();
        f.push(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        f.push(
            HeaderName::from_static("x-codex-primary-used-percent"),
            HeaderValue::from_static("12"),
        );
        f.push(header::SET_COOKIE, HeaderValue::from_static("b=2"));
        f.push(header::SET_COOKIE, HeaderValue::from_static("c=3"));
        let mut dst = BytesMut::new();
        let headers = Headers::new(
            StreamId::from(1),
            Pseudo::response(StatusCode::OK),
            f.clone(),
        );
        assert!(headers
            .encode(&mut encoder, &mut (&mut dst).limit(1 << 20))
            .is_none());
        let (pseudo, got) = decode_block(&mut decoder, dst);
        assert_eq!(pseudo.status, Some(StatusCode::OK));
        assert_eq!(got, f);
        let cookies: Vec<_> = got
            .get_all("set-cookie")
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(cookies, ["a=1", "b=2", "c=3"]);
        assert_eq!(got.get("x-codex-primary-used-percent").unwrap(), "12");
        assert_eq!(got.get("set-cookie").unwrap(), "a=1");
        assert!(got.get("retry-after").is_none());
        let map = got.into_header_map();
        assert_eq!(map.get_all(header::SET_COOKIE).iter().count(), 3);
        assert_eq!(Fields::from_header_map(map).len(), 4);
    }

    /// codex-gateway patch (change 15): the connection-specific fields make a head
    /// malformed (a stream error), `te` only with a value other than `trailers`; the block
    /// is still decoded whole (the HPACK state is the connection's).
    #[test]
    fn connection_level_fields_make_a_head_malformed() {
        let cases: [(&str, &str, bool); 9] = [
            ("connection", "close", true),
            ("transfer-encoding", "chunked", true),
            ("upgrade", "h2c", true),
            ("keep-alive", "timeout=5", true),
            ("proxy-connection", "keep-alive", true),
            ("te", "gzip", true),
            ("te", "trailers", false),
            ("tea", "green", false),
            ("x-connection", "close", false),
        ];
        let mut encoder = Encoder::default();
        let mut decoder = hpack::Decoder::new(4096);
        for (name, value, malformed) in cases {
            let mut f = Fields::new();
            f.push(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            f.push(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
            f.push(
                HeaderName::from_static("x-after"),
                HeaderValue::from_static("1"),
            );
            let mut dst = BytesMut::new();
            let headers = Headers::new(
                StreamId::from(1),
                Pseudo::response(StatusCode::OK),
                f.clone(),
            );
            assert!(headers
                .encode(&mut encoder, &mut (&mut dst).limit(1 << 20))
                .is_none());
            let head = Head::parse(&dst);
            let payload = dst.split_off(frame::HEADER_LEN);
            let (mut headers, mut rest) = Headers::load(head, payload).unwrap();
            let res = headers.load_hpack(&mut rest, 1 << 20, &mut decoder);
            assert!(rest.is_empty(), "{name}: the block is decoded whole");
            if malformed {
                assert_eq!(res, Err(Error::MalformedMessage), "{name}: {value}");
            } else {
                assert_eq!(res, Ok(()), "{name}: {value}");
                assert_eq!(headers.into_parts().1, f);
            }
        }
        // The decoder is still in step with the encoder.
        let mut f = Fields::new();
        f.push(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let (_, got) = {
            let mut dst = BytesMut::new();
            let headers = Headers::new(
                StreamId::from(3),
                Pseudo::response(StatusCode::OK),
                f.clone(),
            );
            assert!(headers
                .encode(&mut encoder, &mut (&mut dst).limit(1 << 20))
                .is_none());
            decode_block(&mut decoder, dst)
        };
        assert_eq!(got, f);
    }

    /// codex-gateway patch (change 20): a connection's requests share their path and
    /// authority values while they stay the same, and get their own when they change.
    #[test]
    fn request_pseudo_fields_share_the_previous_request_values() {
        let mut memo = UriMemo::default();
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let ptr = |v: &Option<BytesStr>| v.as_ref().unwrap().as_str().as_ptr();
        let a = Pseudo::request_with(
            Method::POST,
            uri("https://chatgpt.com/backend-api/codex/responses"),
            None,
            &mut memo,
        );
        let b = Pseudo::request_with(
            Method::POST,
            uri("https://chatgpt.com/backend-api/codex/responses"),
            None,
            &mut memo,
        );
        assert_eq!(a, b);
        assert_eq!(ptr(&a.path), ptr(&b.path));
        assert_eq!(ptr(&a.authority), ptr(&b.authority));
        let c = Pseudo::request_with(
            Method::GET,
            uri("https://example.com:8443/models?x=1"),
            None,
            &mut memo,
        );
        assert_eq!(c.path.as_ref().unwrap().as_str(), "/models?x=1");
        assert_eq!(c.authority.as_ref().unwrap().as_str(), "example.com:8443");
        assert_eq!(c.scheme.as_ref().unwrap().as_str(), "https");
        assert_eq!(
            c,
            Pseudo::request(
                Method::GET,
                uri("https://example.com:8443/models?x=1"),
                None
            )
        );
        // An empty path is `/` for every method but OPTIONS and CONNECT, as before.
        let d = Pseudo::request_with(Method::GET, uri("https://example.com"), None, &mut memo);
        assert_eq!(d.path.as_ref().unwrap().as_str(), "/");
    }

    fn huff_decode(src: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        huffman::decode(src, &mut buf).unwrap()
    }
}
