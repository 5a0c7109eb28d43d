//! HTTP/1.1 server codec and connection I/O. See the parent module for the overview.

use std::{
    io,
    time::{Duration, Instant},
};

use monoio::{buf::IoBuf, io::AsyncReadRent};

use crate::wire::{parse_chunk_size, take_line, Line};

/// Most header lines accepted.
const MAX_HEADERS: usize = 96;
/// Largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Initial read buffer; grows only when a request needs it.
const INITIAL_BUF: usize = 4 * 1024;
/// Most spare room reserved ahead of one body read (larger bodies grow by doubling).
const MAX_BODY_STEP: usize = 1024 * 1024;
/// Longest chunk-size line (size plus extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// Most chunk-extension bytes in one body (extensions are ignored; without a cap a client
/// could send gigabytes of them around a small body).
const MAX_CHUNK_EXT_TOTAL: usize = 16 * 1024;

/// Time limits of one client connection (`client_*` keys of the configuration). Each one is a
/// *total* budget, not a per-read one: a byte every few seconds never keeps a request open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request head must be complete this long after its first byte arrived (408).
    pub head: Duration,
    /// A request body must be complete this long after the handler asked for it (408)...
    pub body: Duration,
    /// ...extended by one second per this many bytes received (0: no extension), so a large
    /// upload at a reasonable rate finishes while a trickle does not.
    pub body_min_rate: u64,
    /// A response write that makes no progress (the client does not read) for this long
    /// fails with `TimedOut`: the stream ends and its upstream stream and slot are released.
    pub write: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            head: Duration::from_secs(20),
            body: Duration::from_secs(60),
            body_min_rate: 64 * 1024,
            write: Duration::from_secs(30),
        }
    }
}

/// The deadline of the body being read: `started + body + received / rate`.
#[derive(Debug, Clone, Copy)]
struct BodyClock {
    started: Instant,
    received: u64,
}

/// How the request body is delimited (RFC 9112 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request. [`Conn::read_head`] fills everything but `body`; the handler reads the
/// body with [`Conn::read_body`] once it has authenticated the head.
#[derive(Debug)]
pub struct Request {
    /// Method, upper case.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query string without `?`.
    pub query: Option<String>,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The whole body (empty until [`Conn::read_body`]).
    pub body: Vec<u8>,
    /// HTTP/1.0 request.
    pub http10: bool,
    /// The client allows keep-alive.
    pub keep_alive: bool,
    /// How the body is framed.
    pub framing: Framing,
    /// The client sent `Expect: 100-continue`.
    pub expect_continue: bool,
}

// === impl Request ===

impl Request {
    /// First header with this (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed (or timed out) between requests: close quietly.
    Closed,
    /// I/O failure.
    Io(io::Error),
    /// Malformed or over-limit input: answer with this status and message, then close.
    Reject {
        /// HTTP status.
        status: u16,
        /// Message for the OpenAI-shaped body.
        message: String,
    },
    /// The body exceeds the limit.
    TooLarge,
}

/// One client connection.
pub struct Conn<S> {
    io: S,
    buf: Vec<u8>,
    /// Reused write buffer for stream chunks (owned I/O hands it back after each write).
    wbuf: Vec<u8>,
    /// The current request has a body nobody has read: the connection cannot be reused.
    body_unread: bool,
    /// The current request is `HEAD`: responses carry no body bytes.
    head_request: bool,
    limits: Limits,
    body_clock: Option<BodyClock>,
    /// The current request's id ([`crate::request_id`]), answered in `x-request-id` on every
    /// response; empty until a head is read or a response needs one (then generated).
    request_id: String,
    /// When the current request's head began to arrive (its duration in the access log).
    started: Option<Instant>,
    /// The current request has a usage record ([`Conn::usage_id`]): its access-log line
    /// comes from that record.
    accounted: bool,
    /// The write deadline (`limits.write`), touched per write: one entry on the worker's
    /// deadline wheel for the connection's life instead of a runtime timer per write. Made by
    /// the first write.
    write_deadline: Option<crate::deadline::Idle>,
}

fn reject(status: u16, message: impl Into<String>) -> ReadError {
    ReadError::Reject {
        status,
        message: message.into(),
    }
}

/// A chunk-framing violation: 400 and close.
fn bad_chunk(what: &'static str) -> ReadError {
    reject(400, format!("Malformed chunked request body: {what}."))
}

// === impl Conn ===

impl<S: AsyncReadRent + monoio::io::AsyncWriteRent> Conn<S> {
    /// Wraps an accepted stream.
    pub fn new(io: S) -> Self {
        Self::with_limits(io, Limits::default())
    }

    /// Wraps an accepted stream with these time limits.
    pub fn with_limits(io: S, limits: Limits) -> Self {
        Self {
            io,
            buf: Vec::new(),
            wbuf: Vec::new(),
            body_unread: false,
            head_request: false,
            limits,
            body_clock: None,
            request_id: String::new(),
            started: None,
            accounted: false,
            write_deadline: None,
        }
    }

    /// The request id for the request's usage record; marks the request as having one.
    pub fn usage_id(&mut self) -> &str {
        self.accounted = true;
        self.request_id()
    }

    /// Whether the current request has a usage record ([`Conn::usage_id`]).
    pub fn accounted(&self) -> bool {
        self.accounted
    }

    /// Time since the current request's head began to arrive (zero when unknown).
    pub fn elapsed(&self) -> Duration {
        self.started.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// The current request's id: the client's well-formed `x-request-id`, else a generated
    /// one (also for a request that could not be read, or an answer without a request).
    pub fn request_id(&mut self) -> &str {
        if self.request_id.is_empty() {
            self.request_id = crate::request_id::generate();
        }
        &self.request_id
    }

    /// Replaces the current request's id (tests; a caller that derives its own).
    pub fn set_request_id(&mut self, id: String) {
        self.request_id = id;
    }

    /// Appends the next read to the buffer; `Ok(0)` on EOF.
    async fn fill(&mut self, min_spare: usize) -> io::Result<usize> {
        crate::wire::read_more(&mut self.io, &mut self.buf, min_spare).await
    }

    /// True while the current request's body has not been read (the response then closes
    /// the connection: its bytes would otherwise be parsed as the next request).
    pub fn body_unread(&self) -> bool {
        self.body_unread
    }

    /// Reads the next request head (the body stays on the wire: see [`Conn::read_body`]).
    /// `idle` bounds the wait for its first byte (a timeout closes the connection).
    pub async fn read_head(&mut self, idle: Duration) -> Result<Request, ReadError> {
        // A new request: a new id (generated when needed if the head cannot be read).
        self.request_id.clear();
        self.accounted = false;
        self.started = None;
        // When the head's first byte arrived (a pipelined head already buffered: now).
        let mut head_started = (!self.buf.is_empty()).then(Instant::now);
        let (head_len, req) = loop {
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut parsed = httparse::Request::new(&mut headers);
                // Only the first MAX_HEAD bytes are ever parsed, so the outcome does not depend
                // on how the head was cut into reads (a head completing inside one large read
                // past the limit is refused like one read byte by byte).
                let window = &self.buf[..self.buf.len().min(MAX_HEAD)];
                match parsed.parse(window) {
                    Ok(httparse::Status::Complete(n)) => {
                        break (n, parse_head(&parsed)?);
                    }
                    Ok(httparse::Status::Partial) => {
                        if self.buf.len() > MAX_HEAD {
                            return Err(reject(431, "Request header fields too large."));
                        }
                    }
                    Err(httparse::Error::TooManyHeaders) => {
                        return Err(reject(431, "Too many request header fields."))
                    }
                    Err(e) => return Err(reject(400, format!("Malformed HTTP request: {e}."))),
                }
            }
            let n = if self.buf.is_empty() {
                // Between requests: a timeout closes the connection (the read is abandoned,
                // never resumed).
                match monoio::time::timeout(idle, self.fill(INITIAL_BUF)).await {
                    Ok(r) => r.map_err(ReadError::Io)?,
                    Err(_) => return Err(ReadError::Closed),
                }
            } else {
                // The whole head within `limits.head` of its first byte: one total deadline,
                // so a byte every few seconds (slowloris) does not keep the connection.
                let deadline = *head_started.get_or_insert_with(Instant::now) + self.limits.head;
                let left = deadline.saturating_duration_since(Instant::now());
                match monoio::time::timeout(left, self.fill(INITIAL_BUF)).await {
                    Ok(r) => r.map_err(ReadError::Io)?,
                    Err(_) => return Err(reject(408, "Timed out reading the request head.")),
                }
            };
            if n > 0 && head_started.is_none() {
                head_started = Some(Instant::now());
            }
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    ReadError::Closed
                } else {
                    reject(400, "Connection closed inside the request head.")
                });
            }
        };
        self.buf.drain(..head_len);
        self.started = head_started;
        self.request_id = crate::request_id::for_request(req.header(crate::request_id::HEADER));
        self.head_request = req.method == "HEAD";
        self.body_unread = req.framing != Framing::None;
        Ok(req)
    }

    /// Reads the body of `req` (after the handler authenticated its head) into `req.body`,
    /// answering `Expect: 100-continue` first. `max_body` is the body limit.
    pub async fn read_body(&mut self, req: &mut Request, max_body: usize) -> Result<(), ReadError> {
        if !self.body_unread {
            return Ok(());
        }
        self.body_clock = Some(BodyClock {
            started: Instant::now(),
            received: 0,
        });
        match req.framing {
            Framing::None => {}
            Framing::Length(len) => {
                if len > max_body {
                    return Err(ReadError::TooLarge);
                }
                if req.expect_continue && self.buf.len() < len {
                    self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
                        .await
                        .map_err(ReadError::Io)?;
                }
                while self.buf.len() < len {
                    // Room for the rest of the body (bounded per step), not a doubling race.
                    let want = (len - self.buf.len()).min(MAX_BODY_STEP);
                    self.read_body_bytes(want).await?;
                }
                // The buffer becomes the body without a copy; what follows (a pipelined
                // request) moves to a fresh buffer.
                let rest = self.buf.split_off(len);
                req.body = std::mem::replace(&mut self.buf, rest);
            }
            Framing::Chunked => {
                if req.expect_continue && self.buf.is_empty() {
                    self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
                        .await
                        .map_err(ReadError::Io)?;
                }
                req.body = self.read_chunked(max_body).await?;
            }
        }
        self.body_unread = false;
        self.shrink();
        Ok(())
    }

    /// What is left of the body's total budget.
    fn body_time_left(&self) -> Duration {
        let Some(clock) = self.body_clock else {
            return self.limits.body;
        };
        let extra = match self.limits.body_min_rate {
            0 => Duration::ZERO,
            rate => Duration::from_secs_f64(clock.received as f64 / rate as f64),
        };
        (clock.started + self.limits.body + extra).saturating_duration_since(Instant::now())
    }

    async fn read_body_bytes(&mut self, min_spare: usize) -> Result<(), ReadError> {
        let left = self.body_time_left();
        match monoio::time::timeout(left, self.fill(min_spare)).await {
            Ok(Ok(0)) => Err(reject(400, "Connection closed inside the request body.")),
            Ok(Ok(n)) => {
                if let Some(c) = &mut self.body_clock {
                    c.received += n as u64;
                }
                Ok(())
            }
            Ok(Err(e)) => Err(ReadError::Io(e)),
            Err(_) => Err(reject(408, "Timed out reading the request body.")),
        }
    }

    /// The next CRLF line at the front of the buffer, reading as needed; returns its length
    /// (the line stays in the buffer, followed by its CRLF).
    async fn chunk_line(&mut self) -> Result<(usize, usize), ReadError> {
        loop {
            // As for heads: only the first MAX_CHUNK_LINE + CRLF bytes are looked at, so the
            // outcome does not depend on how the line was cut into reads.
            let window = &self.buf[..self.buf.len().min(MAX_CHUNK_LINE + 2)];
            match take_line(window).map_err(bad_chunk)? {
                Line::Complete { len, consumed } => return Ok((len, consumed)),
                Line::Partial => {
                    if self.buf.len() > MAX_CHUNK_LINE + 1 {
                        return Err(bad_chunk("line too long"));
                    }
                    self.read_body_bytes(INITIAL_BUF).await?;
                }
            }
        }
    }

    async fn read_chunked(&mut self, max_body: usize) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        let mut ext_bytes = 0usize;
        loop {
            let (len, consumed) = self.chunk_line().await?;
            let size = parse_chunk_size(&self.buf[..len]).map_err(bad_chunk)?;
            let digits = self.buf[..len]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .count();
            ext_bytes += len - digits;
            if ext_bytes > MAX_CHUNK_EXT_TOTAL {
                return Err(bad_chunk("chunk extensions too large"));
            }
            self.buf.drain(..consumed);
            if size == 0 {
                // Trailer fields until the empty line (ignored, but framed strictly).
                let mut trailers = 0usize;
                loop {
                    let (len, consumed) = self.chunk_line().await?;
                    if len > 0 && !is_field_line(&self.buf[..len]) {
                        return Err(bad_chunk("malformed trailer field"));
                    }
                    self.buf.drain(..consumed);
                    if len == 0 {
                        return Ok(body);
                    }
                    trailers += consumed;
                    if trailers > MAX_HEAD {
                        return Err(reject(431, "Request trailer fields too large."));
                    }
                }
            }
            // Sizes come from the wire: checked arithmetic only.
            let size = usize::try_from(size).map_err(|_| ReadError::TooLarge)?;
            match body.len().checked_add(size) {
                Some(total) if total <= max_body => {}
                _ => return Err(ReadError::TooLarge),
            }
            body.reserve(size);
            let mut left = size;
            while left > 0 {
                if self.buf.is_empty() {
                    self.read_body_bytes(left.min(MAX_BODY_STEP)).await?;
                }
                let take = left.min(self.buf.len());
                body.extend_from_slice(&self.buf[..take]);
                self.buf.drain(..take);
                left -= take;
            }
            while self.buf.len() < 2 {
                self.read_body_bytes(INITIAL_BUF).await?;
            }
            if &self.buf[..2] != b"\r\n" {
                return Err(bad_chunk("missing CRLF after chunk data"));
            }
            self.buf.drain(..2);
        }
    }

    /// The socket and the bytes already read past the current request (a client may send its
    /// first WebSocket frames right behind the upgrade request): the upgrade hand-off.
    pub fn into_parts(self) -> (S, Vec<u8>) {
        (self.io, self.buf)
    }

    /// Frees the read buffer while a long response streams (nothing is read meanwhile; a
    /// pipelined request already buffered is kept).
    pub fn release_read_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        }
    }

    /// Gives back the read buffer once the request is read (`read_head` allocates the next
    /// one when it reads again): a streaming response can last for minutes, and its
    /// connection reads nothing meanwhile, so it must not pin the request's buffer (4 KiB of
    /// the about 22 KiB a slow stream held, measured with heaptrack). Bytes of a pipelined
    /// next request are kept, in a buffer no larger than they need.
    fn shrink(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        } else if self.buf.capacity() > 2 * INITIAL_BUF {
            self.buf.shrink_to(self.buf.len().max(INITIAL_BUF));
        }
    }

    /// Before closing after an early response (413): drain what the client is still sending,
    /// for a bounded time, so it reads our answer instead of a reset.
    pub async fn linger(&mut self, budget: Duration, max_bytes: usize) {
        let deadline = std::time::Instant::now() + budget;
        let mut seen = 0usize;
        while seen < max_bytes {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            self.buf.clear();
            match monoio::time::timeout(left, self.fill(INITIAL_BUF)).await {
                Ok(Ok(n)) if n > 0 => seen += n,
                _ => break,
            }
        }
    }

    /// Writes all bytes in one call (one `write` per call unless the kernel takes less).
    pub async fn write_all(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.write_owned(data).await.0
    }

    /// Writes all of `data`; each `write` must make progress within `limits.write` (a client
    /// that stops reading fills the socket buffers, and the write then waits forever). On a
    /// timeout the write is abandoned, never resumed: the caller closes the connection. The
    /// buffer comes back for reuse (a fresh one after a timeout).
    async fn write_owned(&mut self, data: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
        let total = data.len();
        let mut buf = data;
        let mut done = 0;
        while done < total {
            let slice = buf.slice(done..);
            let write = self.limits.write;
            let deadline = self
                .write_deadline
                .get_or_insert_with(|| crate::deadline::Idle::new(write));
            deadline.touch();
            // Boxed: inline, the write would be reserved in every streaming task for its
            // whole life.
            match Box::pin(crate::deadline::within(deadline, self.io.write(slice))).await {
                Some((Ok(0), slice)) => {
                    return (
                        Err(io::Error::new(io::ErrorKind::WriteZero, "client closed")),
                        slice.into_inner(),
                    )
                }
                Some((Ok(n), slice)) => {
                    done += n;
                    buf = slice.into_inner();
                }
                Some((Err(e), slice)) => return (Err(e), slice.into_inner()),
                None => {
                    return (
                        Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "client did not read the response in time",
                        )),
                        Vec::new(),
                    )
                }
            }
        }
        (Ok(()), buf)
    }

    /// Writes a complete response with a fixed body.
    pub async fn write_response(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        let keep_alive = keep_alive && !self.body_unread;
        let mut out = head(status, headers, keep_alive, self.request_id());
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        // A response to HEAD announces the length but never carries the bytes (RFC 9110 §9.3.2).
        if !self.head_request {
            out.extend_from_slice(body);
        }
        self.write_all(out).await
    }

    /// Starts a chunked (or, for HTTP/1.0, close-delimited) streaming response. The head is
    /// held back and leaves with the first [`Conn::write_chunk`] (or [`Conn::finish_stream`]),
    /// in the same socket write.
    pub async fn start_stream(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        http10: bool,
    ) -> io::Result<()> {
        let keep_alive = !http10 && !self.body_unread;
        let mut out = head(status, headers, keep_alive, self.request_id());
        if !http10 {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        out.extend_from_slice(b"\r\n");
        self.wbuf = out;
        Ok(())
    }

    /// Writes one chunk of a streaming response (with a held-back head) as one socket write,
    /// framing it into a reused buffer (no allocation per event once warm). An empty chunk
    /// writes only what was held back.
    pub async fn write_chunk(&mut self, data: &[u8], http10: bool) -> io::Result<()> {
        let mut w = std::mem::take(&mut self.wbuf);
        push_chunk(&mut w, data, http10);
        self.flush_wbuf(w).await
    }

    /// Ends a chunked response: the `last` chunk (if any), the last-chunk marker and a
    /// held-back head, in one socket write.
    pub async fn finish_stream(&mut self, last: &[u8], http10: bool) -> io::Result<()> {
        let mut w = std::mem::take(&mut self.wbuf);
        push_chunk(&mut w, last, http10);
        if !http10 {
            w.extend_from_slice(b"0\r\n\r\n");
        }
        self.flush_wbuf(w).await
    }

    /// Gives back the reused write buffer (a stream gone quiet); the next chunk allocates.
    pub fn trim_write_buffer(&mut self) {
        self.wbuf = Vec::new();
    }

    /// Writes what `w` holds and keeps it, emptied, for the next chunk.
    async fn flush_wbuf(&mut self, w: Vec<u8>) -> io::Result<()> {
        if w.is_empty() {
            self.wbuf = w;
            return Ok(());
        }
        let used = w.len();
        let (res, mut w) = self.write_owned(w).await;
        // The first write (head and leading events) or a large event must not pin a large
        // buffer for the rest of a slow stream; steady large batches keep theirs.
        crate::wire::recycle(&mut w, used);
        self.wbuf = w;
        res
    }
}

/// Frames `data` as one chunk (HTTP/1.0: as it is) onto `w`; nothing for empty data.
fn push_chunk(w: &mut Vec<u8>, data: &[u8], http10: bool) {
    if data.is_empty() {
        return;
    }
    if !http10 {
        push_hex(w, data.len());
        w.extend_from_slice(b"\r\n");
    }
    w.extend_from_slice(data);
    if !http10 {
        w.extend_from_slice(b"\r\n");
    }
}

/// `field-name ":" OWS field-value OWS` (RFC 9112 §5): a token name right at the start (a
/// leading space is an obs-fold, refused), then a colon, then no control characters.
fn is_field_line(line: &[u8]) -> bool {
    let name = line
        .iter()
        .take_while(|&&b| crate::wire::is_tchar(b))
        .count();
    name > 0
        && line.get(name) == Some(&b':')
        && line[name + 1..]
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// Appends `n` in lower-case hex (chunk sizes) without formatting machinery.
fn push_hex(out: &mut Vec<u8>, n: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut tmp = [0u8; 16];
    let mut i = tmp.len();
    let mut v = n;
    loop {
        i -= 1;
        tmp[i] = DIGITS[v & 0xf];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

#[cfg(test)]
mod tests;

fn parse_head(p: &httparse::Request<'_, '_>) -> Result<Request, ReadError> {
    let method = p.method.unwrap_or("GET").to_owned();
    let target = p.path.unwrap_or("/");
    let (path, query) = match target.split_once('?') {
        Some((a, b)) => (a.to_owned(), Some(b.to_owned())),
        None => (target.to_owned(), None),
    };
    let http10 = p.version == Some(0);
    let mut headers = Vec::with_capacity(p.headers.len());
    let mut content_length = None;
    let mut codings: Vec<String> = Vec::new();
    let mut expect_continue = false;
    let mut keep_alive = !http10;
    let mut te_seen = false;
    let mut hosts = 0usize;
    for h in p.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).trim().to_owned();
        match name.as_str() {
            "content-length" => {
                let len = parse_content_length(&value)?;
                // Duplicates are refused even when equal (RFC 9110 §8.6 allows either): an
                // intermediary that kept another one would frame the body differently.
                if content_length.is_some() {
                    return Err(reject(400, "Duplicate Content-Length headers."));
                }
                content_length = Some(len);
            }
            "host" => hosts += 1,
            "transfer-encoding" => {
                te_seen = true;
                codings.extend(
                    value
                        .split(',')
                        .map(|c| c.trim().to_ascii_lowercase())
                        .filter(|c| !c.is_empty()),
                )
            }
            "expect" if value.eq_ignore_ascii_case("100-continue") => expect_continue = true,
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.contains("close") {
                    keep_alive = false;
                } else if v.contains("keep-alive") {
                    keep_alive = true;
                }
            }
            _ => {}
        }
        headers.push((name, value));
    }
    // RFC 9112 §3.2: exactly one Host on HTTP/1.1 (at most one on 1.0).
    if hosts > 1 || (hosts == 0 && !http10) {
        return Err(reject(400, "A request needs exactly one Host header."));
    }
    if te_seen && codings.is_empty() {
        return Err(reject(400, "Empty Transfer-Encoding header."));
    }
    let framing = if codings.is_empty() {
        match content_length {
            Some(0) | None => Framing::None,
            Some(len) => Framing::Length(len),
        }
    } else {
        // RFC 9112 §6.1 and §6.3: any Transfer-Encoding on HTTP/1.0, next to a
        // Content-Length, or without `chunked` as the final coding makes the framing
        // unreliable: 400 and close. Codings other than chunked are not implemented.
        if http10 {
            return Err(reject(400, "Transfer-Encoding is not allowed on HTTP/1.0."));
        }
        if content_length.is_some() {
            return Err(reject(
                400,
                "Both Content-Length and Transfer-Encoding present.",
            ));
        }
        if codings.last().map(String::as_str) != Some("chunked") {
            return Err(reject(400, "Transfer-Encoding must end with chunked."));
        }
        // RFC 9112 §7: chunked is never applied twice.
        if codings.iter().filter(|c| *c == "chunked").count() > 1 {
            return Err(reject(
                400,
                "Transfer-Encoding applies chunked more than once.",
            ));
        }
        if codings.len() > 1 {
            return Err(reject(
                501,
                "Unsupported Transfer-Encoding: only chunked is accepted.",
            ));
        }
        Framing::Chunked
    };
    Ok(Request {
        method,
        path,
        query,
        headers,
        body: Vec::new(),
        http10,
        keep_alive,
        framing,
        expect_continue,
    })
}

/// `Content-Length = 1*DIGIT` (RFC 9110 §8.6): no sign, no spaces inside, no list.
fn parse_content_length(value: &str) -> Result<usize, ReadError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(reject(400, "Invalid Content-Length header."));
    }
    value
        .parse::<usize>()
        .map_err(|_| reject(400, "Invalid Content-Length header."))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

fn head(status: u16, headers: &[(&str, &str)], keep_alive: bool, request_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(format!("HTTP/1.1 {status} {}\r\n", reason(status)).as_bytes());
    // Ours, always; an upstream's id a handler forwards under the same name is answered as
    // `x-upstream-request-id` (what the upstream's support would ask for).
    out.extend_from_slice(b"x-request-id: ");
    out.extend_from_slice(request_id.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (n, v) in headers {
        let n = if *n == crate::request_id::HEADER {
            "x-upstream-request-id"
        } else {
            n
        };
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out
}
