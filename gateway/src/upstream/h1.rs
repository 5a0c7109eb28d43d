//! A streaming HTTP/1.1 client (monoio-transports buffers whole bodies,
//! docs/io-traps.md#streaming-http11-client).
//! The body is handed out chunk by chunk as it arrives, for SSE.
//!
//! # Key Components
//! - [`send`]: writes one request on a connection and reads the response head.
//! - [`Body`]: the streaming body; read to its end on a keep-alive response, its connection
//!   goes back to the worker's [`H1Pool`] when the body is dropped (a body dropped before its
//!   end closes the connection: that is how a stream is cancelled upstream).
//! - [`H1Pool`]: a worker's idle keep-alive connections to the origin (newest first, bounded,
//!   expiring after an idle time shorter than common server keep-alive timeouts).
//!
//! # Error handling
//! A pooled connection the origin closed while it idled fails the write or ends before any
//! response byte: [`SendError::Stale`], and the caller sends the request again on a fresh
//! connection (the origin never read it).

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use monoio::{
    buf::{IoBufMut, IoVecBufMut},
    io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt},
    net::TcpStream,
    BufResult,
};

use super::{UpstreamBody, UpstreamError, UpstreamRequest, UpstreamResponse};
use crate::{
    config::UpstreamConfig,
    metrics::WorkerMetrics,
    wire::{parse_chunk_size, read_more, take_line, Line},
};

const READ_CHUNK: usize = 16 * 1024;

/// How long a finished stream's tail (the last chunk marker) is awaited before the connection
/// is given up instead of pooled.
pub const TAIL_BUDGET: Duration = Duration::from_millis(250);
/// Most tail bytes read to reach the end of a finished stream.
const TAIL_MAX: usize = 64 * 1024;

/// A worker's idle keep-alive connections to the origin.
pub struct H1Pool {
    idle: RefCell<Vec<(BodyIo, Instant)>>,
    max_idle: usize,
    idle_timeout: Duration,
    metrics: Arc<WorkerMetrics>,
    /// Idle connections of every pool of the worker (one pool per egress), for the gauge.
    total: Rc<Cell<usize>>,
}

// === impl H1Pool ===

impl H1Pool {
    /// A pool keeping at most `max_idle` connections, each for `idle_timeout`.
    pub fn new(max_idle: usize, idle_timeout: Duration, metrics: Arc<WorkerMetrics>) -> Rc<Self> {
        Self::with_total(max_idle, idle_timeout, metrics, Rc::default())
    }

    /// A pool whose idle count adds into `total` (shared by a worker's pools, one per egress).
    pub fn with_total(
        max_idle: usize,
        idle_timeout: Duration,
        metrics: Arc<WorkerMetrics>,
        total: Rc<Cell<usize>>,
    ) -> Rc<Self> {
        Rc::new(Self {
            idle: RefCell::new(Vec::new()),
            max_idle,
            idle_timeout,
            metrics,
            total,
        })
    }

    /// Reports a change of this pool's idle count from `before` to `after`.
    fn report(&self, before: usize, after: usize) {
        let t = (self.total.get() + after).saturating_sub(before);
        self.total.set(t);
        self.metrics.set_h1_idle(t);
    }

    /// The most recently used idle connection that has not expired.
    pub fn take(&self) -> Option<BodyIo> {
        let mut idle = self.idle.borrow_mut();
        let before = idle.len();
        // Expired ones are all at the front (oldest first).
        let fresh = idle
            .iter()
            .position(|(_, at)| at.elapsed() < self.idle_timeout)
            .unwrap_or(idle.len());
        idle.drain(..fresh);
        let io = idle.pop().map(|(io, _)| io);
        self.report(before, idle.len());
        io
    }

    fn put(&self, io: BodyIo) {
        if self.max_idle == 0 {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let before = idle.len();
        if idle.len() >= self.max_idle {
            idle.remove(0);
        }
        idle.push((io, Instant::now()));
        self.report(before, idle.len());
    }

    /// Idle connections held.
    pub fn idle_count(&self) -> usize {
        self.idle.borrow().len()
    }

    /// Closes every idle connection.
    pub fn clear(&self) {
        let before = std::mem::take(&mut *self.idle.borrow_mut()).len();
        self.report(before, 0);
    }
}

/// Why [`send`] failed.
#[derive(Debug)]
pub enum SendError {
    /// A reused connection that the origin had closed: nothing was read by the origin; send
    /// again on a fresh connection.
    Stale,
    /// Any other failure.
    Failed(UpstreamError),
}

impl From<UpstreamError> for SendError {
    fn from(e: UpstreamError) -> Self {
        Self::Failed(e)
    }
}

/// Sends `req` over `io` and reads the response head. With `pool`, the connection is kept
/// alive and goes back to the pool once the body is read to its end; `reused`: `io` came from
/// the pool (a failure before any response byte is then [`SendError::Stale`]).
pub async fn send<S>(
    mut io: S,
    cfg: &UpstreamConfig,
    req: &UpstreamRequest,
    pool: Option<Rc<H1Pool>>,
    reused: bool,
) -> Result<UpstreamResponse, SendError>
where
    S: AsyncReadRent + AsyncWriteRent + 'static,
    BodyIo: From<S>,
{
    let mut out = Vec::with_capacity(512 + req.body.len());
    out.extend_from_slice(
        format!(
            "{} {} HTTP/1.1\r\nhost: {}\r\n",
            req.method,
            req.path,
            cfg.authority()
        )
        .as_bytes(),
    );
    for (n, v) in &req.headers {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(
        format!(
            "content-length: {}\r\n{}\r\n",
            req.body.len(),
            if pool.is_some() {
                ""
            } else {
                "connection: close\r\n"
            }
        )
        .as_bytes(),
    );
    out.extend_from_slice(&req.body);
    let (res, _) = io.write_all(out).await;
    if let Err(e) = res {
        if reused {
            return Err(SendError::Stale);
        }
        return Err(SendError::Failed(UpstreamError::Protocol {
            sent: true,
            message: format!("h1 write: {e}"),
        }));
    }

    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let (status, headers, head_len) =
        match read_head(&mut io, &mut buf, cfg.first_byte_timeout).await {
            Ok(h) => h,
            // Closed (or reset) before a single response byte: the origin dropped the idle
            // connection without reading the request.
            Err(UpstreamError::Protocol { .. }) if reused && buf.is_empty() => {
                return Err(SendError::Stale)
            }
            Err(e) => return Err(e.into()),
        };
    let keep_alive = pool.is_some()
        && buf.starts_with(b"HTTP/1.1")
        && !headers
            .iter()
            .any(|(n, v)| n == "connection" && v.to_ascii_lowercase().contains("close"));
    buf.drain(..head_len);
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let mode =
        if find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            Mode::Chunked(ChunkState::Size)
        } else if let Some(len) = find("content-length")
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
        {
            Mode::Length(len)
        } else if status == 204 || status == 304 {
            Mode::Length(0)
        } else {
            Mode::Close
        };
    let keep = (keep_alive && !matches!(mode, Mode::Close))
        .then_some(pool)
        .flatten();
    Ok(UpstreamResponse {
        status,
        headers: super::Head::Pairs(headers),
        body: UpstreamBody::H1(Box::new(Body {
            io: Some(BodyIo::from(io)),
            buf,
            mode,
            keep,
        })),
        protocol: "http/1.1",
    })
}

/// Reads a response head into `buf` (appending; a head may arrive in many reads) within
/// `deadline`; returns the status, the lower-cased headers and the head's length in `buf`.
/// A timeout abandons the connection.
pub(crate) async fn read_head<S: AsyncReadRent>(
    io: &mut S,
    buf: &mut Vec<u8>,
    deadline: std::time::Duration,
) -> Result<(u16, Vec<(String, String)>, usize), UpstreamError> {
    loop {
        let res = match monoio::time::timeout(deadline, read_more(io, buf, 1024)).await {
            Ok(r) => r,
            Err(_) => return Err(UpstreamError::Timeout { sent: true }),
        };
        let n = res.map_err(|e| UpstreamError::Protocol {
            sent: true,
            message: format!("h1 read: {e}"),
        })?;
        if n == 0 {
            return Err(UpstreamError::Protocol {
                sent: true,
                message: "upstream closed before the response head".into(),
            });
        }
        let mut hs = [httparse::EMPTY_HEADER; 128];
        let mut r = httparse::Response::new(&mut hs);
        match r.parse(buf) {
            Ok(httparse::Status::Complete(len)) => {
                let headers: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).trim().to_owned(),
                        )
                    })
                    .collect();
                return Ok((r.code.unwrap_or(0), headers, len));
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > 256 * 1024 {
                    return Err(UpstreamError::Protocol {
                        sent: true,
                        message: "upstream response head too large".into(),
                    });
                }
            }
            Err(e) => {
                return Err(UpstreamError::Protocol {
                    sent: true,
                    message: format!("malformed upstream response head: {e}"),
                })
            }
        }
    }
}

/// The connection a body is read from.
// The TLS variant is the common one and lives once per pooled connection: boxing it would add
// an allocation per connection and a pointer chase per read for nothing.
#[allow(clippy::large_enum_variant)]
pub enum BodyIo {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS.
    Tls(monoio_rustls::ClientTlsStream<TcpStream>),
    /// A loopback connection fed in chosen segments (tests of this reader).
    #[cfg(test)]
    Segmented(crate::testing::SegmentedIo),
}

#[cfg(test)]
impl From<crate::testing::SegmentedIo> for BodyIo {
    fn from(s: crate::testing::SegmentedIo) -> Self {
        Self::Segmented(s)
    }
}

impl From<TcpStream> for BodyIo {
    fn from(s: TcpStream) -> Self {
        Self::Plain(s)
    }
}

impl From<monoio_rustls::ClientTlsStream<TcpStream>> for BodyIo {
    fn from(s: monoio_rustls::ClientTlsStream<TcpStream>) -> Self {
        Self::Tls(s)
    }
}

// === impl BodyIo ===

impl AsyncWriteRent for BodyIo {
    async fn write<T: monoio::buf::IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Self::Plain(s) => s.write(buf).await,
            Self::Tls(s) => s.write(buf).await,
            #[cfg(test)]
            Self::Segmented(s) => s.write(buf).await,
        }
    }

    async fn writev<T: monoio::buf::IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Self::Plain(s) => s.writev(buf).await,
            Self::Tls(s) => s.writev(buf).await,
            #[cfg(test)]
            Self::Segmented(s) => s.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(s) => s.flush().await,
            Self::Tls(s) => s.flush().await,
            #[cfg(test)]
            Self::Segmented(s) => s.flush().await,
        }
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(s) => s.shutdown().await,
            Self::Tls(s) => s.shutdown().await,
            #[cfg(test)]
            Self::Segmented(s) => s.shutdown().await,
        }
    }
}

impl AsyncReadRent for BodyIo {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Self::Plain(s) => s.read(buf).await,
            Self::Tls(s) => s.read(buf).await,
            #[cfg(test)]
            Self::Segmented(s) => s.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Self::Plain(s) => s.readv(buf).await,
            Self::Tls(s) => s.readv(buf).await,
            #[cfg(test)]
            Self::Segmented(s) => s.readv(buf).await,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum ChunkState {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Length(u64),
    Chunked(ChunkState),
    Close,
    Done,
}

/// A streaming HTTP/1.1 response body.
pub struct Body {
    io: Option<BodyIo>,
    buf: Vec<u8>,
    mode: Mode,
    /// Where the connection goes when the body was read to its end (keep-alive responses).
    keep: Option<Rc<H1Pool>>,
}

impl Drop for Body {
    fn drop(&mut self) {
        if let (Some(pool), Some(io)) = (self.keep.take(), self.io.take()) {
            // Only a connection whose response was read exactly to its end can carry the
            // next request; anything else (a cancelled stream) closes it.
            if matches!(self.mode, Mode::Done) && self.buf.is_empty() {
                pool.put(io);
            }
        }
    }
}

fn proto(message: &'static str) -> UpstreamError {
    UpstreamError::Protocol {
        sent: true,
        message: message.to_owned(),
    }
}

// === impl Body ===

impl Body {
    /// Reads what is left of a finished stream (the last-chunk marker, trailers) within
    /// [`TAIL_BUDGET`], so the keep-alive connection can go back to the pool; a tail that does
    /// not end in time or is larger than expected leaves it to be closed.
    pub async fn finish(&mut self) {
        if self.keep.is_none() {
            return;
        }
        let mut left = TAIL_MAX;
        let tail = async {
            while let Ok(Some(c)) = self.chunk().await {
                left = left.saturating_sub(c.len());
                if left == 0 {
                    return;
                }
            }
        };
        let _ = monoio::time::timeout(TAIL_BUDGET, tail).await;
    }

    /// Appends the next read to the buffer (never overwrites what it holds).
    async fn fill(&mut self) -> Result<usize, UpstreamError> {
        let spare = if self.buf.capacity() - self.buf.len() < 1024 {
            READ_CHUNK
        } else {
            1
        };
        let Some(io) = self.io.as_mut() else {
            return Err(proto("h1 connection gone"));
        };
        read_more(io, &mut self.buf, spare)
            .await
            .map_err(|e| UpstreamError::Protocol {
                sent: true,
                message: format!("h1 body read: {e}"),
            })
    }

    /// The next chunk of body bytes; `Ok(None)` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        loop {
            match self.step()? {
                Step::Chunk(b) => return Ok(Some(b)),
                Step::End => return Ok(None),
                Step::Read(at_eof) => {
                    if self.fill().await? == 0 {
                        return match at_eof {
                            Eof::End => {
                                self.mode = Mode::Done;
                                Ok(None)
                            }
                            Eof::Error(m) => Err(proto(m)),
                        };
                    }
                }
            }
        }
    }

    /// The next chunk when the buffer already holds it (no read): `None` when a read is
    /// needed first.
    pub fn try_chunk(&mut self) -> Option<Result<Option<Bytes>, UpstreamError>> {
        match self.step() {
            Ok(Step::Chunk(b)) => Some(Ok(Some(b))),
            Ok(Step::End) => Some(Ok(None)),
            Ok(Step::Read(_)) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Decodes as far as the buffer allows, without reading.
    fn step(&mut self) -> Result<Step, UpstreamError> {
        loop {
            match self.mode {
                Mode::Done => return Ok(Step::End),
                Mode::Length(0) => {
                    self.mode = Mode::Done;
                    return Ok(Step::End);
                }
                Mode::Length(rem) => {
                    if self.buf.is_empty() {
                        return Ok(Step::Read(Eof::Error("upstream closed inside the body")));
                    }
                    let take = usize::try_from(rem)
                        .unwrap_or(usize::MAX)
                        .min(self.buf.len());
                    let out = self.take_front(take);
                    self.mode = Mode::Length(rem - take as u64);
                    return Ok(Step::Chunk(out));
                }
                Mode::Close => {
                    if self.buf.is_empty() {
                        return Ok(Step::Read(Eof::End));
                    }
                    return Ok(Step::Chunk(Bytes::from(std::mem::take(&mut self.buf))));
                }
                Mode::Chunked(ChunkState::Size) => match take_line(&self.buf).map_err(proto)? {
                    Line::Complete { len, consumed } => {
                        let size = parse_chunk_size(&self.buf[..len]).map_err(proto)?;
                        self.buf.drain(..consumed);
                        self.mode = Mode::Chunked(if size == 0 {
                            ChunkState::Trailers
                        } else {
                            ChunkState::Data(size)
                        });
                    }
                    Line::Partial => {
                        if self.buf.len() > 4096 {
                            return Err(proto("bad chunk size line"));
                        }
                        return Ok(Step::Read(Eof::Error("upstream closed inside a chunk")));
                    }
                },
                Mode::Chunked(ChunkState::Data(rem)) => {
                    if self.buf.is_empty() {
                        return Ok(Step::Read(Eof::Error("upstream closed inside a chunk")));
                    }
                    let take = usize::try_from(rem)
                        .unwrap_or(usize::MAX)
                        .min(self.buf.len());
                    let out = self.take_front(take);
                    let left = rem - take as u64;
                    self.mode = Mode::Chunked(if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    });
                    return Ok(Step::Chunk(out));
                }
                Mode::Chunked(ChunkState::DataEnd) => {
                    if self.buf.len() < 2 {
                        return Ok(Step::Read(Eof::Error("upstream closed inside a chunk")));
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(proto("bad chunk terminator"));
                    }
                    self.buf.drain(..2);
                    self.mode = Mode::Chunked(ChunkState::Size);
                }
                Mode::Chunked(ChunkState::Trailers) => match take_line(&self.buf).map_err(proto)? {
                    Line::Complete { len: 0, consumed } => {
                        self.buf.drain(..consumed);
                        self.mode = Mode::Done;
                        return Ok(Step::End);
                    }
                    Line::Complete { consumed, .. } => {
                        self.buf.drain(..consumed);
                    }
                    Line::Partial => {
                        if self.buf.len() > 64 * 1024 {
                            return Err(proto("upstream trailers too large"));
                        }
                        return Ok(Step::Read(Eof::End));
                    }
                },
            }
        }
    }

    /// The first `n` buffered bytes, removed from the buffer.
    fn take_front(&mut self, n: usize) -> Bytes {
        if n == self.buf.len() {
            return Bytes::from(std::mem::take(&mut self.buf));
        }
        let out = Bytes::copy_from_slice(&self.buf[..n]);
        self.buf.drain(..n);
        out
    }
}

/// What [`Body::step`] found.
enum Step {
    Chunk(Bytes),
    End,
    /// The buffer needs another read; what the end of the connection then means.
    Read(Eof),
}

/// What a closed connection means where a read is needed.
enum Eof {
    /// The end of the body (close-delimited bodies, a missing trailer section).
    End,
    /// A truncated body.
    Error(&'static str),
}

#[cfg(test)]
mod tests;
