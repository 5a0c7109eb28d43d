//! A streaming HTTP/1.1 client (monoio-transports buffers whole bodies, monoio-notes.md §2.2).
//! One connection per request (`connection: close`); the body is handed out chunk by chunk as
//! it arrives, for SSE.

use bytes::Bytes;
use monoio::{
    io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt},
    net::TcpStream,
};

use super::{UpstreamBody, UpstreamError, UpstreamRequest, UpstreamResponse};
use crate::config::UpstreamConfig;

const READ_CHUNK: usize = 16 * 1024;

/// Sends `req` over `io` and reads the response head.
pub async fn send<S>(
    mut io: S,
    cfg: &UpstreamConfig,
    req: UpstreamRequest,
) -> Result<UpstreamResponse, UpstreamError>
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
            "content-length: {}\r\nconnection: close\r\n\r\n",
            req.body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(&req.body);
    let (res, _) = io.write_all(out).await;
    res.map_err(|e| UpstreamError::Protocol {
        sent: true,
        message: format!("h1 write: {e}"),
    })?;

    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let deadline = cfg.first_byte_timeout;
    let (status, headers, head_len) = loop {
        let (res, b) = match monoio::time::timeout(deadline, io.read(buf)).await {
            Ok(r) => r,
            Err(_) => return Err(UpstreamError::Timeout { sent: true }),
        };
        buf = b;
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
        match r.parse(&buf) {
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
                break (r.code.unwrap_or(0), headers, len);
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > 256 * 1024 {
                    return Err(UpstreamError::Protocol {
                        sent: true,
                        message: "upstream response head too large".into(),
                    });
                }
                if buf.capacity() - buf.len() < 1024 {
                    buf.reserve(READ_CHUNK);
                }
            }
            Err(e) => {
                return Err(UpstreamError::Protocol {
                    sent: true,
                    message: format!("malformed upstream response head: {e}"),
                })
            }
        }
    };
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
        } else if let Some(len) = find("content-length").and_then(|v| v.parse::<u64>().ok()) {
            Mode::Length(len)
        } else if status == 204 || status == 304 {
            Mode::Length(0)
        } else {
            Mode::Close
        };
    Ok(UpstreamResponse {
        status,
        headers,
        body: UpstreamBody::H1(Body {
            io: BodyIo::from(io),
            buf,
            mode,
        }),
        protocol: "http/1.1",
    })
}

/// The connection a body is read from.
pub enum BodyIo {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS.
    Tls(monoio_rustls::ClientTlsStream<TcpStream>),
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

impl BodyIo {
    async fn read(&mut self, buf: Vec<u8>) -> (std::io::Result<usize>, Vec<u8>) {
        match self {
            Self::Plain(s) => s.read(buf).await,
            Self::Tls(s) => s.read(buf).await,
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
    io: BodyIo,
    buf: Vec<u8>,
    mode: Mode,
}

fn proto(message: &str) -> UpstreamError {
    UpstreamError::Protocol {
        sent: true,
        message: message.to_owned(),
    }
}

// === impl Body ===

impl Body {
    async fn fill(&mut self) -> Result<usize, UpstreamError> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_CHUNK);
        }
        let buf = std::mem::take(&mut self.buf);
        let (res, buf) = self.io.read(buf).await;
        self.buf = buf;
        res.map_err(|e| UpstreamError::Protocol {
            sent: true,
            message: format!("h1 body read: {e}"),
        })
    }

    /// The next chunk of body bytes; `Ok(None)` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        loop {
            match self.mode {
                Mode::Done => return Ok(None),
                Mode::Length(0) => {
                    self.mode = Mode::Done;
                    return Ok(None);
                }
                Mode::Length(rem) => {
                    if self.buf.is_empty() && self.fill().await? == 0 {
                        return Err(proto("upstream closed inside the body"));
                    }
                    let take = (rem as usize).min(self.buf.len());
                    let out = Bytes::from(self.buf.drain(..take).collect::<Vec<u8>>());
                    self.mode = Mode::Length(rem - take as u64);
                    return Ok(Some(out));
                }
                Mode::Close => {
                    if self.buf.is_empty() && self.fill().await? == 0 {
                        self.mode = Mode::Done;
                        return Ok(None);
                    }
                    return Ok(Some(Bytes::from(std::mem::take(&mut self.buf))));
                }
                Mode::Chunked(ChunkState::Size) => {
                    match self.buf.windows(2).position(|w| w == b"\r\n") {
                        Some(p) => {
                            let line = std::str::from_utf8(&self.buf[..p])
                                .map_err(|_| proto("bad chunk size"))?;
                            let size = u64::from_str_radix(
                                line.split(';').next().unwrap_or("").trim(),
                                16,
                            )
                            .map_err(|_| proto("bad chunk size"))?;
                            self.buf.drain(..p + 2);
                            self.mode = Mode::Chunked(if size == 0 {
                                ChunkState::Trailers
                            } else {
                                ChunkState::Data(size)
                            });
                        }
                        None => {
                            if self.buf.len() > 4096 {
                                return Err(proto("bad chunk size line"));
                            }
                            if self.fill().await? == 0 {
                                return Err(proto("upstream closed inside a chunk"));
                            }
                        }
                    }
                }
                Mode::Chunked(ChunkState::Data(rem)) => {
                    if self.buf.is_empty() && self.fill().await? == 0 {
                        return Err(proto("upstream closed inside a chunk"));
                    }
                    let take = (rem as usize).min(self.buf.len());
                    let out = Bytes::from(self.buf.drain(..take).collect::<Vec<u8>>());
                    let left = rem - take as u64;
                    self.mode = Mode::Chunked(if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    });
                    return Ok(Some(out));
                }
                Mode::Chunked(ChunkState::DataEnd) => {
                    if self.buf.len() < 2 {
                        if self.fill().await? == 0 {
                            return Err(proto("upstream closed inside a chunk"));
                        }
                        continue;
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(proto("bad chunk terminator"));
                    }
                    self.buf.drain(..2);
                    self.mode = Mode::Chunked(ChunkState::Size);
                }
                Mode::Chunked(ChunkState::Trailers) => {
                    match self.buf.windows(2).position(|w| w == b"\r\n") {
                        Some(0) => {
                            self.buf.drain(..2);
                            self.mode = Mode::Done;
                            return Ok(None);
                        }
                        Some(p) => {
                            self.buf.drain(..p + 2);
                        }
                        None => {
                            if self.fill().await? == 0 {
                                self.mode = Mode::Done;
                                return Ok(None);
                            }
                        }
                    }
                }
            }
        }
    }
}
