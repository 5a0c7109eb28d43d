//! HTTP/1.1 server codec and connection I/O. See the parent module for the overview.

use std::{io, time::Duration};

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

/// Most header lines accepted.
const MAX_HEADERS: usize = 96;
/// Largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Initial read buffer; grows only when a request needs it.
const INITIAL_BUF: usize = 4 * 1024;

/// A parsed request.
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
    /// The whole body.
    pub body: Vec<u8>,
    /// HTTP/1.0 request.
    pub http10: bool,
    /// The client allows keep-alive.
    pub keep_alive: bool,
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
}

fn reject(status: u16, message: impl Into<String>) -> ReadError {
    ReadError::Reject {
        status,
        message: message.into(),
    }
}

// === impl Conn ===

impl<S: AsyncReadRent + monoio::io::AsyncWriteRent> Conn<S> {
    /// Wraps an accepted stream.
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::new(),
            wbuf: Vec::new(),
        }
    }

    /// Reads more bytes into the buffer; `Ok(0)` on EOF.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            let grow = self.buf.capacity().max(INITIAL_BUF);
            self.buf.reserve(grow);
        }
        let buf = std::mem::take(&mut self.buf);
        let (res, buf) = self.io.read(buf).await;
        self.buf = buf;
        res
    }

    /// Reads the next request. `idle` bounds the wait for its first byte (a timeout closes
    /// the connection); `max_body` is the body limit.
    pub async fn read_request(
        &mut self,
        idle: Duration,
        max_body: usize,
    ) -> Result<Request, ReadError> {
        // Wait for the head.
        let (head_len, mut req, content_length, chunked, expect_continue) = loop {
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut parsed = httparse::Request::new(&mut headers);
                match parsed.parse(&self.buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        break parse_head(&parsed, n)?;
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
                match monoio::time::timeout(idle, self.fill()).await {
                    Ok(r) => r.map_err(ReadError::Io)?,
                    Err(_) => return Err(ReadError::Closed),
                }
            } else {
                match monoio::time::timeout(Duration::from_secs(30), self.fill()).await {
                    Ok(r) => r.map_err(ReadError::Io)?,
                    Err(_) => return Err(reject(408, "Timed out reading the request head.")),
                }
            };
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    ReadError::Closed
                } else {
                    reject(400, "Connection closed inside the request head.")
                });
            }
        };
        self.buf.drain(..head_len);

        if let Some(len) = content_length {
            if len > max_body {
                return Err(ReadError::TooLarge);
            }
            if expect_continue && self.buf.len() < len {
                self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
                    .await
                    .map_err(ReadError::Io)?;
            }
            while self.buf.len() < len {
                self.read_body_bytes().await?;
            }
            req.body = self.buf.drain(..len).collect();
            self.shrink();
        } else if chunked {
            if expect_continue && self.buf.is_empty() {
                self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
                    .await
                    .map_err(ReadError::Io)?;
            }
            req.body = self.read_chunked(max_body).await?;
            self.shrink();
        }
        Ok(req)
    }

    async fn read_body_bytes(&mut self) -> Result<(), ReadError> {
        match monoio::time::timeout(Duration::from_secs(60), self.fill()).await {
            Ok(Ok(0)) => Err(reject(400, "Connection closed inside the request body.")),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ReadError::Io(e)),
            Err(_) => Err(reject(408, "Timed out reading the request body.")),
        }
    }

    async fn read_chunked(&mut self, max_body: usize) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        loop {
            // chunk-size line
            let line_end = loop {
                if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                if self.buf.len() > 4096 {
                    return Err(reject(400, "Malformed chunk size line."));
                }
                self.read_body_bytes().await?;
            };
            let line = std::str::from_utf8(&self.buf[..line_end])
                .map_err(|_| reject(400, "Malformed chunk size line."))?;
            let size_str = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_str, 16)
                .map_err(|_| reject(400, "Malformed chunk size."))?;
            self.buf.drain(..line_end + 2);
            if size == 0 {
                // trailers until empty line
                loop {
                    if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        self.buf.drain(..p + 2);
                        if p == 0 {
                            return Ok(body);
                        }
                        continue;
                    }
                    self.read_body_bytes().await?;
                }
            }
            if body.len() + size > max_body {
                return Err(ReadError::TooLarge);
            }
            while self.buf.len() < size + 2 {
                self.read_body_bytes().await?;
            }
            body.extend_from_slice(&self.buf[..size]);
            if &self.buf[size..size + 2] != b"\r\n" {
                return Err(reject(400, "Malformed chunk terminator."));
            }
            self.buf.drain(..size + 2);
        }
    }

    /// Frees the read buffer while a long response streams (nothing is read meanwhile; a
    /// pipelined request already buffered is kept).
    pub fn release_read_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        }
    }

    /// Gives back a buffer that grew for a large body (idle connections must not pin memory).
    fn shrink(&mut self) {
        // A streaming response can last for minutes: don't hold the request's buffer meanwhile.
        if self.buf.capacity() > 2 * INITIAL_BUF {
            if self.buf.is_empty() {
                self.buf = Vec::new();
            } else {
                self.buf.shrink_to(self.buf.len().max(INITIAL_BUF));
            }
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
            match monoio::time::timeout(left, self.fill()).await {
                Ok(Ok(n)) if n > 0 => seen += n,
                _ => break,
            }
        }
    }

    /// Writes all bytes in one call (one `write` per call unless the kernel takes less).
    pub async fn write_all(&mut self, data: Vec<u8>) -> io::Result<()> {
        let (res, _) = self.io.write_all(data).await;
        res.map(|_| ())
    }

    /// Writes a complete response with a fixed body.
    pub async fn write_response(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        let mut out = head(status, headers, keep_alive);
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(body);
        self.write_all(out).await
    }

    /// Starts a chunked (or, for HTTP/1.0, close-delimited) streaming response.
    pub async fn start_stream(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        http10: bool,
    ) -> io::Result<()> {
        let mut out = head(status, headers, !http10);
        if !http10 {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        out.extend_from_slice(b"\r\n");
        self.write_all(out).await
    }

    /// Writes one chunk of a streaming response as one socket write, framing it into a
    /// reused buffer (no allocation per event once warm).
    pub async fn write_chunk(&mut self, data: &[u8], http10: bool) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut w = std::mem::take(&mut self.wbuf);
        w.clear();
        if !http10 {
            push_hex(&mut w, data.len());
            w.extend_from_slice(b"\r\n");
        }
        w.extend_from_slice(data);
        if !http10 {
            w.extend_from_slice(b"\r\n");
        }
        let (res, mut w) = self.io.write_all(w).await;
        // Keep a small buffer for the next event; give back what a large one grew.
        if w.capacity() > 64 * 1024 {
            w = Vec::new();
        }
        self.wbuf = w;
        res.map(|_| ())
    }

    /// Ends a chunked response.
    pub async fn finish_stream(&mut self, http10: bool) -> io::Result<()> {
        if http10 {
            return Ok(());
        }
        self.write_all(b"0\r\n\r\n".to_vec()).await
    }
}

type Head = (usize, Request, Option<usize>, bool, bool);

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
mod tests {
    use super::push_hex;

    #[test]
    fn hex_chunk_sizes() {
        for n in [0usize, 1, 15, 16, 255, 4096, 0xdead_beef] {
            let mut v = Vec::new();
            push_hex(&mut v, n);
            assert_eq!(String::from_utf8(v).unwrap(), format!("{n:x}"));
        }
    }
}

fn parse_head(p: &httparse::Request<'_, '_>, n: usize) -> Result<Head, ReadError> {
    let method = p.method.unwrap_or("GET").to_owned();
    let target = p.path.unwrap_or("/");
    let (path, query) = match target.split_once('?') {
        Some((a, b)) => (a.to_owned(), Some(b.to_owned())),
        None => (target.to_owned(), None),
    };
    let http10 = p.version == Some(0);
    let mut headers = Vec::with_capacity(p.headers.len());
    let mut content_length = None;
    let mut chunked = false;
    let mut expect_continue = false;
    let mut keep_alive = !http10;
    for h in p.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).trim().to_owned();
        match name.as_str() {
            "content-length" => {
                let len: usize = value
                    .parse()
                    .map_err(|_| reject(400, "Invalid Content-Length header."))?;
                if content_length.is_some_and(|l| l != len) {
                    return Err(reject(400, "Conflicting Content-Length headers."));
                }
                content_length = Some(len);
            }
            "transfer-encoding" => {
                if value.to_ascii_lowercase().ends_with("chunked") {
                    chunked = true;
                } else {
                    return Err(reject(501, "Unsupported Transfer-Encoding."));
                }
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
    if chunked && content_length.is_some() {
        return Err(reject(
            400,
            "Both Content-Length and Transfer-Encoding present.",
        ));
    }
    Ok((
        n,
        Request {
            method,
            path,
            query,
            headers,
            body: Vec::new(),
            http10,
            keep_alive,
        },
        content_length,
        chunked,
        expect_continue,
    ))
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

fn head(status: u16, headers: &[(&str, &str)], keep_alive: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(format!("HTTP/1.1 {status} {}\r\n", reason(status)).as_bytes());
    for (n, v) in headers {
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
