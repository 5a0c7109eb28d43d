mod error;
mod framed_read;
mod framed_write;

use std::{
    cell::UnsafeCell,
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, BytesMut};
use monoio::{
    buf::SliceMut,
    io::{AsyncReadRent, AsyncWriteRent},
};
use monoio_compat::box_future::MaybeArmedBoxFuture;

pub use self::error::{SendError, UserError};
use self::{
    framed_read::{Decoded, FramedRead},
    framed_write::FramedWrite,
};
use crate::h2::{
    frame::{self, Data, Frame},
    proto::Error,
};

#[derive(Debug)]
pub struct Codec<T, B> {
    /// codex-gateway patch (vendor/README.md, change 7): the read in flight, if any (the
    /// read buffer travels with it). Frames already read are decoded without one.
    read_fut: MaybeArmedBoxFuture<(io::Result<usize>, BytesMut)>,
    // Put it at the last to make sure futures depending on it drop first.
    inner: UnsafeCell<FramedRead<FramedWrite<T, B>>>,
}

impl<T, B> Codec<T, B>
where
    T: AsyncReadRent + AsyncWriteRent + Unpin + 'static,
    B: Buf,
{
    /// Returns a new `Codec` with the default max frame size
    #[inline]
    pub fn new(io: T) -> Self {
        Self::with_max_recv_frame_size(io, frame::DEFAULT_MAX_FRAME_SIZE as usize)
    }

    /// Returns a new `Codec` with the given maximum frame size
    pub fn with_max_recv_frame_size(io: T, max_frame_size: usize) -> Self {
        // Wrap with writer
        let framed_write = FramedWrite::new(io);

        let mut inner = FramedRead::new(framed_write);

        // Use FramedRead's method since it checks the value is within range.
        inner.set_max_frame_size(max_frame_size);

        // Junk future to play nice with box_future API, Nothing to see here
        let default_fut = async { (Ok(0), BytesMut::new()) };
        let read_fut = MaybeArmedBoxFuture::new(default_fut);

        Codec {
            inner: UnsafeCell::new(inner),
            read_fut,
        }
    }
}

impl<T, B> Codec<T, B> {
    /// Updates the max received frame size.
    ///
    /// The change takes effect the next time a frame is decoded. In other
    /// words, if a frame is currently in process of being decoded with a frame
    /// size greater than `val` but less than the max frame size in effect
    /// before calling this function, then the frame will be allowed.
    #[inline]
    pub fn set_max_recv_frame_size(&mut self, val: usize) {
        unsafe { (*self.inner.get()).set_max_frame_size(val) }
    }

    /// Returns the current max received frame size setting.
    ///
    /// This is the largest size this codec will accept from the wire. Larger
    /// frames will be rejected.
    #[cfg(feature = "unstable")]
    #[inline]
    pub fn max_recv_frame_size(&self) -> usize {
        unsafe { &*self.inner.get() }.max_frame_size()
    }

    /// Returns the max frame size that can be sent to the peer.
    pub fn max_send_frame_size(&self) -> usize {
        unsafe { &*self.inner.get() }.get_ref().max_frame_size()
    }

    /// Set the peer's max frame size.
    pub fn set_max_send_frame_size(&mut self, val: usize) {
        self.framed_write().set_max_frame_size(val)
    }

    /// Set the peer's header table size size.
    pub fn set_send_header_table_size(&mut self, val: usize) {
        self.framed_write().set_header_table_size(val)
    }

    /// Set the max header list size that can be received.
    pub fn set_max_recv_header_list_size(&mut self, val: usize) {
        self.inner.get_mut().set_max_header_list_size(val)
    }

    /// Get a reference to the inner stream.
    #[cfg(feature = "unstable")]
    pub fn get_ref(&self) -> &T {
        unsafe { &*self.inner.get() }.get_ref().get_ref()
    }

    /// Get a mutable reference to the inner stream.
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut().get_mut().get_mut()
    }

    /// Takes the data payload value that was fully written to the socket
    pub(crate) fn take_last_data_frame(&mut self) -> Option<Data<B>> {
        self.framed_write().take_last_data_frame()
    }

    fn framed_write(&mut self) -> &mut FramedWrite<T, B> {
        self.inner.get_mut().get_mut()
    }
}

impl<T, B> Codec<T, B>
where
    T: AsyncWriteRent + Unpin + 'static,
    B: Buf,
{
    /// Returns `Ready` when the codec can buffer a frame
    pub fn poll_ready(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().poll_ready(cx)
    }

    /// Buffer a frame.
    ///
    /// `poll_ready` must be called first to ensure that a frame may be
    /// accepted.
    ///
    /// TODO: Rename this to avoid conflicts with Sink::buffer
    pub fn buffer(&mut self, item: Frame<B>) -> Result<(), UserError> {
        self.framed_write().buffer(item)
    }

    /// Flush buffered data to the wire
    pub fn flush(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().flush(cx)
    }

    /// Shutdown the send half
    pub fn shutdown(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().shutdown(cx)
    }
}

impl<T, B: 'static> futures_core::Stream for Codec<T, B>
where
    T: AsyncReadRent + Unpin + 'static,
{
    type Item = Result<Frame, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.read_fut.armed() {
                let (res, buf) = ready!(this.read_fut.poll(cx));
                let inner = unsafe { &mut *(this.inner.get()) };
                if let Some(e) = inner.read_done(buf, res) {
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let inner = unsafe { &mut *(this.inner.get()) };
            match inner.decode_buffered() {
                Decoded::Frame(frame) => return Poll::Ready(Some(Ok(frame))),
                Decoded::Err(e) => return Poll::Ready(Some(Err(e))),
                Decoded::End => return Poll::Ready(None),
                Decoded::NeedMore(want) => {
                    let buf = inner.take_read_buf(want);
                    // As the write futures do: the future borrows the I/O, which lives in
                    // `inner` (dropped after `read_fut`).
                    let io = unsafe { &mut *(this.inner.get()) }.get_mut();
                    this.read_fut.arm_future(read_into(io, buf));
                }
            }
        }
    }
}

/// One read into the free room of `buf` (after its bytes).
async fn read_into<R: AsyncReadRent>(io: &mut R, buf: BytesMut) -> (io::Result<usize>, BytesMut) {
    let (begin, end) = (buf.len(), buf.capacity());
    // SAFETY: `begin..end` is `buf`'s spare capacity, which it owns.
    let slice = unsafe { SliceMut::new_unchecked(buf, begin, end) };
    let (res, slice) = io.read(slice).await;
    (res, slice.into_inner())
}

// TODO: remove (or improve) this
impl<T> From<T> for Codec<T, bytes::Bytes>
where
    T: AsyncReadRent + AsyncWriteRent + Unpin + 'static,
{
    fn from(src: T) -> Self {
        Self::new(src)
    }
}

// ===== codex-gateway patch: the frame reader under segmentation (vendor/README.md) =====

#[cfg(test)]
mod tests {
    use std::{collections::VecDeque, task::Waker};

    use bytes::{BufMut, Bytes, BytesMut};
    use futures_core::Stream;
    use http::{HeaderName, HeaderValue, StatusCode};
    use monoio::{
        buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut},
        BufResult,
    };

    use super::*;
    use crate::h2::{
        fields::Fields,
        frame::{self, Headers, Pseudo, Reason, StreamId},
        hpack,
    };

    /// Serves its chunks one read at a time (a read with less room than the chunk gets a
    /// part, the rest comes next); then the end of the stream. Writes are swallowed.
    struct ChunkIo {
        chunks: VecDeque<Vec<u8>>,
    }

    impl AsyncReadRent for ChunkIo {
        async fn read<T: IoBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
            let Some(chunk) = self.chunks.front_mut() else {
                return (Ok(0), buf);
            };
            let n = chunk.len().min(buf.bytes_total());
            unsafe {
                buf.write_ptr().copy_from_nonoverlapping(chunk.as_ptr(), n);
                buf.set_init(n);
            }
            chunk.drain(..n);
            if chunk.is_empty() {
                self.chunks.pop_front();
            }
            (Ok(n), buf)
        }

        async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
            (Ok(0), buf)
        }
    }

    impl AsyncWriteRent for ChunkIo {
        async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
            let n = buf.bytes_init();
            (Ok(n), buf)
        }

        async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
            (Ok(0), buf)
        }

        async fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }

        async fn shutdown(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Every frame a codec reads from `chunks` (read after read; ChunkIo is always ready),
    /// and the error that ended them, if any.
    fn read_frames(chunks: Vec<Vec<u8>>) -> (Vec<Frame>, Option<Error>) {
        let io = ChunkIo {
            chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
        };
        let mut codec: Codec<ChunkIo, Bytes> = Codec::new(io);
        let mut cx = Context::from_waker(Waker::noop());
        let mut frames = Vec::new();
        loop {
            match Pin::new(&mut codec).poll_next(&mut cx) {
                Poll::Ready(Some(Ok(f))) => frames.push(f),
                Poll::Ready(Some(Err(e))) => {
                    // Nothing after an error that ends the stream.
                    return (frames, Some(e));
                }
                Poll::Ready(None) => {
                    // The end stays the end.
                    assert!(matches!(
                        Pin::new(&mut codec).poll_next(&mut cx),
                        Poll::Ready(None)
                    ));
                    return (frames, None);
                }
                Poll::Pending => panic!("the codec waited on a read that was ready"),
            }
        }
    }

    fn head(dst: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
        dst.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        dst.push(kind);
        dst.push(flags);
        dst.extend_from_slice(&stream.to_be_bytes());
    }

    /// A response head's HPACK block: indexed, Huffman and raw (over 256 bytes) literals,
    /// a new name, a repeated one.
    fn response_block(encoder: &mut hpack::Encoder) -> Vec<u8> {
        let mut fields = Fields::new();
        fields.push(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        fields.push(
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_static("req-0123456789abcdef"),
        );
        fields.push(
            HeaderName::from_static("x-long"),
            HeaderValue::from_str(&"v".repeat(300)).unwrap(),
        );
        fields.push(http::header::SET_COOKIE, HeaderValue::from_static("a=1"));
        fields.push(http::header::SET_COOKIE, HeaderValue::from_static("b=2"));
        let headers = Headers::new(StreamId::from(1), Pseudo::response(StatusCode::OK), fields);
        let mut buf = BytesMut::new();
        assert!(headers
            .encode(encoder, &mut (&mut buf).limit(1 << 20))
            .is_none());
        buf[frame::HEADER_LEN..].to_vec()
    }

    /// A connection's worth of frames from a server: every kind this client reads, a header
    /// block whole and one in CONTINUATION frames (cut at `cut` bytes), padded DATA, an
    /// unknown frame (skipped) and a PRIORITY frame.
    fn server_bytes(cut: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut settings = frame::Settings::default();
        settings.set_max_concurrent_streams(Some(128));
        settings.set_initial_window_size(Some(1 << 20));
        let mut b = BytesMut::new();
        settings.encode(&mut b);
        frame::WindowUpdate::new(StreamId::zero(), 1 << 24).encode(&mut b);
        frame::Ping::new([1, 2, 3, 4, 5, 6, 7, 8]).encode(&mut b);
        out.extend_from_slice(&b);

        let mut encoder = hpack::Encoder::default();
        // Stream 1: the head in one HEADERS frame, then DATA.
        let block = response_block(&mut encoder);
        head(&mut out, block.len(), 1, 0x4, 1);
        out.extend_from_slice(&block);
        for (i, event) in ["data: one\n\n", "data: two\n\n", ""].iter().enumerate() {
            let mut b = BytesMut::new();
            let mut d = frame::Data::new(StreamId::from(1), Bytes::from_static(event.as_bytes()));
            d.set_end_stream(i == 2);
            d.encode_chunk(&mut b);
            out.extend_from_slice(&b);
        }
        // Stream 3: the head (the dynamic table is in use now) cut into HEADERS and
        // CONTINUATION frames, the last of them one byte each.
        let block = response_block(&mut encoder);
        let cut = cut.min(block.len() - 3);
        head(&mut out, cut, 1, 0, 3);
        out.extend_from_slice(&block[..cut]);
        let rest = &block[cut..];
        let (mid, ones) = rest.split_at(rest.len() - 2);
        head(&mut out, mid.len(), 9, 0, 3);
        out.extend_from_slice(mid);
        for (i, byte) in ones.iter().enumerate() {
            head(&mut out, 1, 9, if i == ones.len() - 1 { 0x4 } else { 0 }, 3);
            out.push(*byte);
        }
        // A padded DATA frame (pad length 4).
        let payload = b"data: padded\n\n";
        head(&mut out, 1 + payload.len() + 4, 0, 0x8, 3);
        out.push(4);
        out.extend_from_slice(payload);
        out.extend_from_slice(&[0; 4]);
        // An unknown frame type (skipped), a PRIORITY frame.
        head(&mut out, 3, 0xfa, 0, 3);
        out.extend_from_slice(b"???");
        head(&mut out, 5, 2, 0, 3);
        out.extend_from_slice(&[0, 0, 0, 1, 16]);
        // The end of stream 3, a reset, a GOAWAY with debug data.
        head(&mut out, 0, 0, 0x1, 3);
        let mut b = BytesMut::new();
        frame::Reset::new(StreamId::from(5), Reason::CANCEL).encode(&mut b);
        out.extend_from_slice(&b);
        let debug = b"bye";
        head(&mut out, 8 + debug.len(), 7, 0, 0);
        out.extend_from_slice(&5u32.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(debug);
        out
    }

    fn check_whole(frames: &[Frame]) {
        let kinds: Vec<_> = frames
            .iter()
            .map(|f| match f {
                Frame::Data(_) => "data",
                Frame::Headers(_) => "headers",
                Frame::Priority(_) => "priority",
                Frame::PushPromise(_) => "push",
                Frame::Settings(_) => "settings",
                Frame::Ping(_) => "ping",
                Frame::GoAway(_) => "goaway",
                Frame::WindowUpdate(_) => "window",
                Frame::Reset(_) => "reset",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "settings", "window", "ping", "headers", "data", "data", "data", "headers", "data",
                "priority", "data", "reset", "goaway"
            ]
        );
        for i in [3, 7] {
            let Frame::Headers(h) = &frames[i] else {
                unreachable!()
            };
            let f = h.fields();
            assert_eq!(f.len(), 5);
            assert_eq!(f.get("x-request-id").unwrap(), "req-0123456789abcdef");
            assert_eq!(f.get("x-long").unwrap().len(), 300);
            let cookies: Vec<_> = f.get_all("set-cookie").collect();
            assert_eq!(cookies, ["a=1", "b=2"]);
        }
        let Frame::Data(d) = &frames[8] else {
            unreachable!()
        };
        assert_eq!(&d.payload()[..], b"data: padded\n\n");
        let Frame::GoAway(g) = &frames[12] else {
            unreachable!()
        };
        assert_eq!(&g.debug_data()[..], b"bye");
    }

    #[test]
    fn frames_read_the_same_split_at_every_boundary() {
        for cut in [1, 7, 40] {
            let bytes = server_bytes(cut);
            let (whole, err) = read_frames(vec![bytes.clone()]);
            assert!(err.is_none(), "{err:?}");
            check_whole(&whole);
            // Two reads, split at every byte.
            for k in 1..bytes.len() {
                let (frames, err) = read_frames(vec![bytes[..k].to_vec(), bytes[k..].to_vec()]);
                assert!(err.is_none(), "split at {k}: {err:?}");
                assert_eq!(frames, whole, "split at {k}");
            }
            // One byte per read.
            let (frames, err) = read_frames(bytes.iter().map(|b| vec![*b]).collect());
            assert!(err.is_none());
            assert_eq!(frames, whole);
            // Seeded random splits.
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ cut as u64;
            for _ in 0..200 {
                let mut chunks = Vec::new();
                let mut at = 0;
                while at < bytes.len() {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let n = 1 + (seed % 64) as usize;
                    let end = (at + n).min(bytes.len());
                    chunks.push(bytes[at..end].to_vec());
                    at = end;
                }
                let (frames, err) = read_frames(chunks);
                assert!(err.is_none());
                assert_eq!(frames, whole);
            }
        }
    }

    #[test]
    fn large_data_frames_read_whole_across_many_reads() {
        // Production-sized: a 16 KiB DATA frame (the default max) and a 40 KiB stream of
        // them, read 1,000 bytes at a time (the read buffer grows to a whole frame).
        let mut bytes = Vec::new();
        let payload: Vec<u8> = (0..16_384u32).map(|i| (i % 251) as u8).collect();
        for stream in [1u32, 3, 1] {
            head(&mut bytes, payload.len(), 0, 0, stream);
            bytes.extend_from_slice(&payload);
        }
        let chunks = bytes.chunks(1000).map(<[u8]>::to_vec).collect();
        let (frames, err) = read_frames(chunks);
        assert!(err.is_none());
        assert_eq!(frames.len(), 3);
        for f in &frames {
            let Frame::Data(d) = f else { unreachable!() };
            assert_eq!(&d.payload()[..], &payload[..]);
        }
    }

    #[test]
    fn a_frame_over_the_max_size_is_a_frame_size_error() {
        let mut bytes = Vec::new();
        let mut b = BytesMut::new();
        frame::Ping::new([0; 8]).encode(&mut b);
        bytes.extend_from_slice(&b);
        head(&mut bytes, 16_385, 0, 0, 1);
        bytes.extend_from_slice(&[0; 100]);
        for k in 1..bytes.len() {
            let (frames, err) = read_frames(vec![bytes[..k].to_vec(), bytes[k..].to_vec()]);
            assert_eq!(frames.len(), 1);
            match err {
                Some(Error::GoAway(_, Reason::FRAME_SIZE_ERROR, _)) => {}
                e => panic!("split at {k}: {e:?}"),
            }
        }
    }

    #[test]
    fn the_end_of_stream_inside_a_frame_is_an_error_and_between_frames_is_the_end() {
        let bytes = server_bytes(7);
        let (whole, _) = read_frames(vec![bytes.clone()]);
        // Cut short at every byte: the frames before the cut, then the end of the stream
        // (at a frame boundary) or an I/O error (inside a frame).
        let mut boundaries = vec![0];
        let mut at = 0;
        while at < bytes.len() {
            let len =
                (bytes[at] as usize) << 16 | (bytes[at + 1] as usize) << 8 | bytes[at + 2] as usize;
            at += frame::HEADER_LEN + len;
            boundaries.push(at);
        }
        for k in 1..bytes.len() {
            let (frames, err) = read_frames(vec![bytes[..k].to_vec()]);
            assert_eq!(frames, whole[..frames.len()], "cut at {k}");
            if boundaries.contains(&k) {
                assert!(err.is_none(), "cut at {k}: {err:?}");
            } else {
                match err {
                    Some(Error::Io(io::ErrorKind::Other, Some(ref m)))
                        if m == "bytes remaining on stream" => {}
                    e => panic!("cut at {k}: {e:?}"),
                }
            }
        }
    }

    #[test]
    fn bad_data_frames_are_connection_errors() {
        // DATA on stream 0; padding longer than the payload; DATA inside a header block.
        let mut zero = Vec::new();
        head(&mut zero, 2, 0, 0, 0);
        zero.extend_from_slice(b"hi");
        let mut padded = Vec::new();
        head(&mut padded, 3, 0, 0x8, 1);
        padded.extend_from_slice(&[5, b'h', b'i']);
        let mut inside = Vec::new();
        head(&mut inside, 1, 1, 0, 1); // HEADERS without END_HEADERS: `:status: 200`
        inside.push(0x88);
        head(&mut inside, 2, 0, 0, 1);
        inside.extend_from_slice(b"hi");
        for bytes in [zero, padded, inside] {
            for k in 1..bytes.len() {
                let (frames, err) = read_frames(vec![bytes[..k].to_vec(), bytes[k..].to_vec()]);
                assert!(frames.is_empty());
                match err {
                    Some(Error::GoAway(_, Reason::PROTOCOL_ERROR, _)) => {}
                    e => panic!("split at {k}: {e:?}"),
                }
            }
        }
    }

    #[test]
    fn a_read_error_ends_the_frames() {
        struct Broken;
        impl AsyncReadRent for Broken {
            async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
                (Err(io::ErrorKind::ConnectionReset.into()), buf)
            }
            async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
                (Ok(0), buf)
            }
        }
        impl AsyncWriteRent for Broken {
            async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
                (Ok(0), buf)
            }
            async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
                (Ok(0), buf)
            }
            async fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
            async fn shutdown(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut codec: Codec<Broken, Bytes> = Codec::new(Broken);
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut codec).poll_next(&mut cx) {
            Poll::Ready(Some(Err(Error::Io(io::ErrorKind::ConnectionReset, _)))) => {}
            p => panic!("{p:?}"),
        }
        assert!(matches!(
            Pin::new(&mut codec).poll_next(&mut cx),
            Poll::Ready(None)
        ));
    }
}
