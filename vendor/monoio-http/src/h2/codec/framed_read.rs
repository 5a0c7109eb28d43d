use std::io;

use bytes::{Buf, BytesMut};

use crate::h2::{
    frame::{
        self, Frame, Kind, Reason, DEFAULT_MAX_FRAME_SIZE, DEFAULT_SETTINGS_HEADER_TABLE_SIZE,
        MAX_MAX_FRAME_SIZE,
    },
    hpack,
    proto::Error,
};

// 16 MB "sane default" taken from golang http2
const DEFAULT_SETTINGS_MAX_HEADER_LIST_SIZE: usize = 16 << 20;

/// Read buffer: the capacity it starts with, and the least free room a read is given (as
/// `monoio_codec`'s `FramedRead`, which this replaces).
const INITIAL_CAPACITY: usize = 8 * 1024;
const RESERVE: usize = 4096;

/// Bytes of a frame head that carry the payload length.
const LENGTH_LEN: usize = 3;

/// codex-gateway patch (vendor/README.md, change 7): the frame reader. The published crate
/// read frames through `monoio_codec`'s `FramedRead` with a `LengthDelimitedCodec` and an
/// `async fn next` that the connection re-armed in a boxed future for every frame; each frame
/// was split off the read buffer, its head split off again, and its HPACK block split once
/// per field. Frames are now decoded straight from the read buffer (`decode_buffered`) and a
/// future exists only while bytes are awaited (`Codec::poll_next`); a DATA or header-block
/// payload is split off once, every other frame is parsed in place. Errors and end of
/// stream are as before: a length over `max_frame_size` is a FRAME_SIZE_ERROR, bytes left
/// at the end of the stream are an I/O error ("bytes remaining on stream").
#[derive(Debug)]
pub struct FramedRead<T> {
    io: T,

    /// Bytes read and not decoded yet; frames are taken off its front.
    buf: BytesMut,

    state: ReadState,

    /// Largest payload accepted (our SETTINGS_MAX_FRAME_SIZE).
    max_frame_size: usize,

    // hpack decoder state
    hpack: hpack::Decoder,

    max_header_list_size: usize,

    partial: Option<Partial>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadState {
    Open,
    /// The peer closed its side: what is buffered is all there is.
    Eof,
    /// Ended (end of stream, or a framing or I/O error returned): nothing more.
    Done,
}

/// What [`FramedRead::decode_buffered`] found.
pub(super) enum Decoded {
    Frame(Frame),
    Err(Error),
    /// The end of the frames.
    End,
    /// A read is needed: the next frame is this many bytes long in all (as far as known).
    NeedMore(usize),
}

/// Partially loaded headers frame
#[derive(Debug)]
struct Partial {
    /// Empty frame
    frame: Continuable,

    /// Partial header payload
    buf: BytesMut,
}

#[derive(Debug)]
enum Continuable {
    Headers(frame::Headers),
    PushPromise(frame::PushPromise),
}

impl<T> FramedRead<T> {
    pub fn new(io: T) -> FramedRead<T> {
        FramedRead {
            io,
            buf: BytesMut::with_capacity(INITIAL_CAPACITY),
            state: ReadState::Open,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE as usize,
            hpack: hpack::Decoder::new(DEFAULT_SETTINGS_HEADER_TABLE_SIZE),
            max_header_list_size: DEFAULT_SETTINGS_MAX_HEADER_LIST_SIZE,
            partial: None,
        }
    }

    #[inline]
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    #[inline]
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// Returns the current max frame size setting
    #[cfg(feature = "unstable")]
    #[inline]
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// Updates the max frame size setting.
    ///
    /// Must be within 16,384 and 16,777,215.
    #[inline]
    pub fn set_max_frame_size(&mut self, val: usize) {
        assert!(DEFAULT_MAX_FRAME_SIZE as usize <= val && val <= MAX_MAX_FRAME_SIZE as usize);
        self.max_frame_size = val;
    }

    /// Update the max header list size setting.
    #[inline]
    pub fn set_max_header_list_size(&mut self, val: usize) {
        self.max_header_list_size = val;
    }

    /// The next frame in the bytes read so far, without reading.
    pub(super) fn decode_buffered(&mut self) -> Decoded {
        loop {
            if self.state == ReadState::Done {
                return Decoded::End;
            }
            let want = if self.buf.len() < LENGTH_LEN {
                LENGTH_LEN
            } else {
                let len = (self.buf[0] as usize) << 16
                    | (self.buf[1] as usize) << 8
                    | self.buf[2] as usize;
                if len > self.max_frame_size {
                    self.state = ReadState::Done;
                    return Decoded::Err(Error::library_go_away(Reason::FRAME_SIZE_ERROR));
                }
                let total = frame::HEADER_LEN + len;
                if self.buf.len() >= total {
                    // A DATA frame (a response is a dozen of them for one head), outside a
                    // header block: taken off whole, its head skipped in the frozen bytes
                    // (the same frame as `decode_frame` makes).
                    if self.buf[3] == Kind::Data as u8 && self.partial.is_none() {
                        let head = frame::Head::parse(&self.buf[..frame::HEADER_LEN]);
                        let mut payload = self.buf.split_to(total).freeze();
                        payload.advance(frame::HEADER_LEN);
                        return match frame::Data::load(head, payload) {
                            Ok(data) => {
                                let frame = Frame::Data(data);
                                tracing::debug!(?frame, "received");
                                Decoded::Frame(frame)
                            }
                            Err(e) => {
                                proto_err!(conn: "failed to load DATA frame; err={:?}", e);
                                Decoded::Err(Error::library_go_away(Reason::PROTOCOL_ERROR))
                            }
                        };
                    }
                    let Self {
                        ref mut hpack,
                        max_header_list_size,
                        ref mut partial,
                        ref mut buf,
                        ..
                    } = *self;
                    match decode_frame(hpack, max_header_list_size, partial, buf, len) {
                        Ok(Some(frame)) => {
                            tracing::debug!(?frame, "received");
                            return Decoded::Frame(frame);
                        }
                        // A frame that yields none (unknown kind, a header block to be
                        // continued): the next one.
                        Ok(None) => continue,
                        Err(e) => return Decoded::Err(e),
                    }
                }
                total
            };
            if self.state == ReadState::Eof {
                self.state = ReadState::Done;
                if self.buf.is_empty() {
                    return Decoded::End;
                }
                return Decoded::Err(
                    io::Error::new(io::ErrorKind::Other, "bytes remaining on stream").into(),
                );
            }
            return Decoded::NeedMore(want);
        }
    }

    /// The read buffer, with room for the rest of a frame of `want` bytes (and at least
    /// `RESERVE`), handed to a read; give it back with [`FramedRead::read_done`].
    pub(super) fn take_read_buf(&mut self, want: usize) -> BytesMut {
        let room = want.saturating_sub(self.buf.len()).max(RESERVE);
        self.buf.reserve(room);
        std::mem::take(&mut self.buf)
    }

    /// The buffer back from a read, and what the read gave.
    pub(super) fn read_done(&mut self, buf: BytesMut, res: io::Result<usize>) -> Option<Error> {
        self.buf = buf;
        match res {
            Ok(0) => {
                self.state = ReadState::Eof;
                None
            }
            Ok(_) => None,
            Err(e) => {
                self.state = ReadState::Done;
                Some(e.into())
            }
        }
    }
}

/// Decodes a frame.
///
/// This method is intentionally de-generified and outlined because it is very large.
///
/// codex-gateway patch (vendor/README.md, change 7): the frame (head and `len` bytes of
/// payload) is at the front of `buf`, and is taken off it whatever the outcome: a DATA or
/// header-block payload is split off (it outlives the buffer), any other frame is parsed in
/// place and skipped. The published code was handed the frame already split off.
fn decode_frame(
    hpack: &mut hpack::Decoder,
    max_header_list_size: usize,
    partial_inout: &mut Option<Partial>,
    buf: &mut BytesMut,
    len: usize,
) -> Result<Option<Frame>, Error> {
    tracing::trace!("decoding frame from {}B", frame::HEADER_LEN + len);

    // Parse the head
    let head = frame::Head::parse(&buf[..frame::HEADER_LEN]);

    if partial_inout.is_some() && head.kind() != Kind::Continuation {
        buf.advance(frame::HEADER_LEN + len);
        proto_err!(conn: "expected CONTINUATION, got {:?}", head.kind());
        return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
    }

    // The payload of a frame parsed in place; the frame is skipped first.
    macro_rules! in_place {
        (|$payload:ident| $load:expr) => {{
            let $payload = &buf[frame::HEADER_LEN..frame::HEADER_LEN + len];
            let res = $load;
            buf.advance(frame::HEADER_LEN + len);
            res
        }};
    }

    let kind = head.kind();

    tracing::trace!(frame.kind = ?kind);

    macro_rules! header_block {
        ($frame:ident, $head:ident) => ({
            // Drop the frame header; the payload is the block's own.
            buf.advance(frame::HEADER_LEN);
            let bytes = buf.split_to(len);

            // Parse the header frame w/o parsing the payload
            let (mut frame, mut payload) = match frame::$frame::load($head, bytes) {
                Ok(res) => res,
                Err(frame::Error::InvalidDependencyId) => {
                    proto_err!(stream: "invalid HEADERS dependency ID");
                    // A stream cannot depend on itself. An endpoint MUST
                    // treat this as a stream error (Section 5.4.2) of type
                    // `PROTOCOL_ERROR`.
                    return Err(Error::library_reset($head.stream_id(), Reason::PROTOCOL_ERROR));
                },
                Err(e) => {
                    proto_err!(conn: "failed to load frame; err={:?}", e);
                    return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
                }
            };

            let is_end_headers = frame.is_end_headers();

            // Load the HPACK encoded headers
            match frame.load_hpack(&mut payload, max_header_list_size, hpack) {
                Ok(_) => {},
                Err(frame::Error::Hpack(hpack::DecoderError::NeedMore(_))) if !is_end_headers => {},
                Err(frame::Error::MalformedMessage) => {
                    let id = $head.stream_id();
                    proto_err!(stream: "malformed header block; stream={:?}", id);
                    return Err(Error::library_reset(id, Reason::PROTOCOL_ERROR));
                },
                Err(e) => {
                    proto_err!(conn: "failed HPACK decoding; err={:?}", e);
                    return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
                }
            }

            if is_end_headers {
                frame.into()
            } else {
                tracing::trace!("loaded partial header block");
                // Defer returning the frame
                *partial_inout = Some(Partial {
                    frame: Continuable::$frame(frame),
                    buf: payload,
                });

                return Ok(None);
            }
        });
    }

    let frame = match kind {
        Kind::Settings => {
            let res = in_place!(|payload| frame::Settings::load(head, payload));

            res.map_err(|e| {
                proto_err!(conn: "failed to load SETTINGS frame; err={:?}", e);
                Error::library_go_away(Reason::PROTOCOL_ERROR)
            })?
            .into()
        }
        Kind::Ping => {
            let res = in_place!(|payload| frame::Ping::load(head, payload));

            res.map_err(|e| {
                proto_err!(conn: "failed to load PING frame; err={:?}", e);
                Error::library_go_away(Reason::PROTOCOL_ERROR)
            })?
            .into()
        }
        Kind::WindowUpdate => {
            let res = in_place!(|payload| frame::WindowUpdate::load(head, payload));

            res.map_err(|e| {
                proto_err!(conn: "failed to load WINDOW_UPDATE frame; err={:?}", e);
                Error::library_go_away(Reason::PROTOCOL_ERROR)
            })?
            .into()
        }
        Kind::Data => {
            buf.advance(frame::HEADER_LEN);
            let res = frame::Data::load(head, buf.split_to(len).freeze());

            // TODO: Should this always be connection level? Probably not...
            res.map_err(|e| {
                proto_err!(conn: "failed to load DATA frame; err={:?}", e);
                Error::library_go_away(Reason::PROTOCOL_ERROR)
            })?
            .into()
        }
        Kind::Headers => header_block!(Headers, head),
        Kind::Reset => {
            let res = in_place!(|payload| frame::Reset::load(head, payload));
            res.map_err(|e| {
                proto_err!(conn: "failed to load RESET frame; err={:?}", e);
                Error::library_go_away(Reason::PROTOCOL_ERROR)
            })?
            .into()
        }
        Kind::GoAway => {
            let res = in_place!(|payload| frame::GoAway::load(payload));
            res.map_err(|e| {
                proto_err!(conn: "failed to load GO_AWAY frame; err={:?}", e);
                Error::library_go_away(Reason::PROTOCOL_ERROR)
            })?
            .into()
        }
        Kind::PushPromise => header_block!(PushPromise, head),
        Kind::Priority => {
            if head.stream_id() == 0 {
                buf.advance(frame::HEADER_LEN + len);
                // Invalid stream identifier
                proto_err!(conn: "invalid stream ID 0");
                return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
            }

            match in_place!(|payload| frame::Priority::load(head, payload)) {
                Ok(frame) => frame.into(),
                Err(frame::Error::InvalidDependencyId) => {
                    // A stream cannot depend on itself. An endpoint MUST
                    // treat this as a stream error (Section 5.4.2) of type
                    // `PROTOCOL_ERROR`.
                    let id = head.stream_id();
                    proto_err!(stream: "PRIORITY invalid dependency ID; stream={:?}", id);
                    return Err(Error::library_reset(id, Reason::PROTOCOL_ERROR));
                }
                Err(e) => {
                    proto_err!(conn: "failed to load PRIORITY frame; err={:?};", e);
                    return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
                }
            }
        }
        Kind::Continuation => {
            let is_end_headers = (head.flag() & 0x4) == 0x4;
            buf.advance(frame::HEADER_LEN);
            let bytes = buf.split_to(len);

            let mut partial = match partial_inout.take() {
                Some(partial) => partial,
                None => {
                    proto_err!(conn: "received unexpected CONTINUATION frame");
                    return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
                }
            };

            // The stream identifiers must match
            if partial.frame.stream_id() != head.stream_id() {
                proto_err!(conn: "CONTINUATION frame stream ID does not match previous frame stream ID");
                return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
            }

            // Extend the buf
            if partial.buf.is_empty() {
                partial.buf = bytes;
            } else {
                if partial.frame.is_over_size() {
                    // If there was left over bytes previously, they may be
                    // needed to continue decoding, even though we will
                    // be ignoring this frame. This is done to keep the HPACK
                    // decoder state up-to-date.
                    //
                    // Still, we need to be careful, because if a malicious
                    // attacker were to try to send a gigantic string, such
                    // that it fits over multiple header blocks, we could
                    // grow memory uncontrollably again, and that'd be a shame.
                    //
                    // Instead, we use a simple heuristic to determine if
                    // we should continue to ignore decoding, or to tell
                    // the attacker to go away.
                    // (The frame's length counts its head, as the published code's did.)
                    if partial.buf.len() + frame::HEADER_LEN + bytes.len() > max_header_list_size {
                        proto_err!(conn: "CONTINUATION frame header block size over ignorable limit");
                        return Err(Error::library_go_away(Reason::COMPRESSION_ERROR));
                    }
                }
                partial.buf.extend_from_slice(&bytes);
            }

            match partial
                .frame
                .load_hpack(&mut partial.buf, max_header_list_size, hpack)
            {
                Ok(_) => {}
                Err(frame::Error::Hpack(hpack::DecoderError::NeedMore(_))) if !is_end_headers => {}
                Err(frame::Error::MalformedMessage) => {
                    let id = head.stream_id();
                    proto_err!(stream: "malformed CONTINUATION frame; stream={:?}", id);
                    return Err(Error::library_reset(id, Reason::PROTOCOL_ERROR));
                }
                Err(e) => {
                    proto_err!(conn: "failed HPACK decoding; err={:?}", e);
                    return Err(Error::library_go_away(Reason::PROTOCOL_ERROR));
                }
            }

            if is_end_headers {
                partial.frame.into()
            } else {
                *partial_inout = Some(partial);
                return Ok(None);
            }
        }
        Kind::Unknown => {
            buf.advance(frame::HEADER_LEN + len);
            // Unknown frames are ignored
            return Ok(None);
        }
    };

    Ok(Some(frame))
}

// ===== impl Continuable =====

impl Continuable {
    fn stream_id(&self) -> frame::StreamId {
        match *self {
            Continuable::Headers(ref h) => h.stream_id(),
            Continuable::PushPromise(ref p) => p.stream_id(),
        }
    }

    fn is_over_size(&self) -> bool {
        match *self {
            Continuable::Headers(ref h) => h.is_over_size(),
            Continuable::PushPromise(ref p) => p.is_over_size(),
        }
    }

    fn load_hpack(
        &mut self,
        src: &mut BytesMut,
        max_header_list_size: usize,
        decoder: &mut hpack::Decoder,
    ) -> Result<(), frame::Error> {
        match *self {
            Continuable::Headers(ref mut h) => h.load_hpack(src, max_header_list_size, decoder),
            Continuable::PushPromise(ref mut p) => p.load_hpack(src, max_header_list_size, decoder),
        }
    }
}

impl<T> From<Continuable> for Frame<T> {
    fn from(cont: Continuable) -> Self {
        match cont {
            Continuable::Headers(mut headers) => {
                headers.set_end_headers();
                headers.into()
            }
            Continuable::PushPromise(mut push) => {
                push.set_end_headers();
                push.into()
            }
        }
    }
}
