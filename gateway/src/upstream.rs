//! The per-worker upstream client: HTTP/2 over TLS (ALPN h2) multiplexing every account's
//! requests on one connection per worker per origin; HTTP/1.1 (our own streaming client) and
//! h2c for plain-HTTP upstreams; HTTP/1.1 over TLS when the origin does not offer h2.
//!
//! # Key Components
//! - [`Upstream`]: owned by one worker (`!Send`); [`Upstream::send`] returns response headers
//!   and a streaming [`UpstreamBody`].
//! - [`UpstreamError`]: transport failures, each saying whether the request may have reached
//!   the upstream ([`UpstreamError::maybe_sent`]): the lifecycle never resends such a payload.
//!
//! # Error handling
//! A broken h2 connection is dropped and rebuilt on the next request. Timeouts close what they
//! interrupt; nothing is resumed after a cancelled read.

pub mod h1;
pub mod tls;

use std::{cell::RefCell, net::SocketAddr, rc::Rc, time::Duration};

use bytes::Bytes;
use monoio::net::TcpStream;
use monoio_http::h2::client::SendRequest;

use crate::config::{PlainHttp, UpstreamConfig};

/// A request to the Codex backend.
#[derive(Debug)]
pub struct UpstreamRequest {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// Path and query, starting with `/` (the configured prefix already applied).
    pub path: String,
    /// Headers (lower-case names; no hop-by-hop headers).
    pub headers: Vec<(&'static str, String)>,
    /// Body.
    pub body: Bytes,
}

/// Response head plus streaming body.
pub struct UpstreamResponse {
    /// Status code.
    pub status: u16,
    /// Headers with lower-case names.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: UpstreamBody,
    /// `h2` or `http/1.1`.
    pub protocol: &'static str,
}

// === impl UpstreamResponse ===

impl UpstreamResponse {
    /// First header with this lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A streaming response body.
pub enum UpstreamBody {
    /// An HTTP/2 stream (dropping it resets the stream upstream).
    H2(monoio_http::h2::RecvStream),
    /// An HTTP/1.1 body over a dedicated connection (dropping it closes the connection).
    H1(h1::Body),
}

// === impl UpstreamBody ===

impl UpstreamBody {
    /// The next chunk; `Ok(None)` at the end of the body.
    pub async fn chunk(&mut self, idle: Duration) -> Result<Option<Bytes>, UpstreamError> {
        match self {
            Self::H2(rs) => match monoio::time::timeout(idle, rs.data()).await {
                Err(_) => Err(UpstreamError::Timeout { sent: true }),
                Ok(None) => Ok(None),
                Ok(Some(Ok(b))) => {
                    let _ = rs.flow_control().release_capacity(b.len());
                    Ok(Some(b))
                }
                Ok(Some(Err(e))) => Err(UpstreamError::Protocol {
                    sent: true,
                    message: format!("h2 stream error: {e}"),
                }),
            },
            Self::H1(b) => match monoio::time::timeout(idle, b.chunk()).await {
                Err(_) => Err(UpstreamError::Timeout { sent: true }),
                Ok(r) => r,
            },
        }
    }

    /// Reads the whole body (error bodies), up to `limit` bytes.
    pub async fn collect(&mut self, idle: Duration, limit: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while let Ok(Some(c)) = self.chunk(idle).await {
            out.extend_from_slice(&c);
            if out.len() >= limit {
                break;
            }
        }
        out
    }
}

/// A transport-level upstream failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// TCP/TLS/h2 connection could not be established: nothing was sent.
    #[error("connect failed: {0}")]
    Connect(String),
    /// No answer in time.
    #[error("upstream timed out")]
    Timeout {
        /// Whether the request may have been sent.
        sent: bool,
    },
    /// Protocol or connection failure.
    #[error("{message}")]
    Protocol {
        /// Whether the request may have been sent.
        sent: bool,
        /// What happened.
        message: String,
    },
}

// === impl UpstreamError ===

impl UpstreamError {
    /// True when the request may have reached the upstream (the outcome is ambiguous and the
    /// payload must not be sent again).
    pub fn maybe_sent(&self) -> bool {
        match self {
            Self::Connect(_) => false,
            Self::Timeout { sent } | Self::Protocol { sent, .. } => *sent,
        }
    }
}

/// The per-worker upstream client.
pub struct Upstream {
    cfg: UpstreamConfig,
    tls: Option<monoio_rustls::TlsConnector>,
    h2: RefCell<Option<SendRequest<Bytes>>>,
    /// Serializes h2 connection establishment so concurrent first requests share one.
    connecting: tokio::sync::Mutex<()>,
    /// Set when a TLS origin negotiated HTTP/1.1 instead of h2.
    tls_h1_only: RefCell<bool>,
    next_addr: RefCell<usize>,
}

// === impl Upstream ===

impl Upstream {
    /// Builds the client (TLS roots are loaded once, here).
    pub fn new(cfg: UpstreamConfig) -> Result<Rc<Self>, String> {
        let tls = if cfg.tls {
            Some(tls::connector(cfg.ca_file.as_deref())?)
        } else {
            None
        };
        Ok(Rc::new(Self {
            cfg,
            tls,
            h2: RefCell::new(None),
            connecting: tokio::sync::Mutex::new(()),
            tls_h1_only: RefCell::new(false),
            next_addr: RefCell::new(0),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &UpstreamConfig {
        &self.cfg
    }

    /// Connects to the next resolved address, trying the others when one refuses.
    async fn tcp(&self) -> Result<TcpStream, UpstreamError> {
        let addrs = self.cfg.addrs.get();
        let mut last = format!("upstream host `{}` is not resolved (yet)", self.cfg.host);
        let n = addrs.len();
        let start = *self.next_addr.borrow();
        for i in 0..n {
            let idx = (start + i) % n;
            let addr: SocketAddr = addrs[idx];
            match monoio::time::timeout(self.cfg.connect_timeout, TcpStream::connect_addr(addr))
                .await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    // stick to the address that answered
                    *self.next_addr.borrow_mut() = idx;
                    return Ok(s);
                }
                Ok(Err(e)) => last = format!("connect to {addr}: {e}"),
                Err(_) => last = format!("connect to {addr} timed out"),
            }
        }
        Err(UpstreamError::Connect(last))
    }

    /// Sends one request and waits for the response head.
    pub async fn send(&self, req: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        let use_h2 = if self.cfg.tls {
            !*self.tls_h1_only.borrow()
        } else {
            self.cfg.plain_http == PlainHttp::H2c
        };
        if use_h2 {
            let mut sender = match self.h2_sender().await {
                Ok(Some(s)) => s,
                Ok(None) => return self.send_h1_tls(req).await,
                Err(e) => return Err(e),
            };
            return self.send_h2(&mut sender, req).await;
        }
        if self.cfg.tls {
            return self.send_h1_tls(req).await;
        }
        let tcp = self.tcp().await?;
        h1::send(tcp, &self.cfg, req).await
    }

    async fn send_h1_tls(&self, req: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        let (stream, _) = self.tls_connect().await?;
        h1::send(stream, &self.cfg, req).await
    }

    async fn tls_connect(
        &self,
    ) -> Result<(monoio_rustls::ClientTlsStream<TcpStream>, bool), UpstreamError> {
        let tcp = self.tcp().await?;
        let Some(tls) = &self.tls else {
            return Err(UpstreamError::Connect("TLS connector missing".into()));
        };
        let name = rustls::pki_types::ServerName::try_from(self.cfg.host.clone())
            .map_err(|e| UpstreamError::Connect(format!("invalid TLS server name: {e}")))?;
        let stream = monoio::time::timeout(self.cfg.connect_timeout, tls.connect(name, tcp))
            .await
            .map_err(|_| UpstreamError::Connect("TLS handshake timed out".into()))?
            .map_err(|e| UpstreamError::Connect(format!("TLS handshake: {e}")))?;
        let h2 = stream.alpn_protocol().as_deref() == Some(b"h2".as_slice());
        Ok((stream, h2))
    }

    /// The shared h2 sender, connecting if needed. `Ok(None)`: the TLS origin speaks only
    /// HTTP/1.1.
    async fn h2_sender(&self) -> Result<Option<SendRequest<Bytes>>, UpstreamError> {
        if let Some(s) = self.live_sender() {
            return Ok(Some(s));
        }
        let _guard = self.connecting.lock().await;
        if let Some(s) = self.live_sender() {
            return Ok(Some(s));
        }
        let mut builder = monoio_http::h2::client::Builder::new();
        builder
            .initial_window_size(4 * 1024 * 1024)
            .initial_connection_window_size(16 * 1024 * 1024)
            .max_concurrent_reset_streams(1024);
        let send = if self.cfg.tls {
            let (stream, is_h2) = self.tls_connect().await?;
            if !is_h2 {
                *self.tls_h1_only.borrow_mut() = true;
                return Ok(None);
            }
            let (send, conn) = builder
                .handshake::<_, Bytes>(stream)
                .await
                .map_err(|e| UpstreamError::Connect(format!("h2 handshake: {e}")))?;
            monoio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream h2 connection ended");
                }
            });
            send
        } else {
            let tcp = self.tcp().await?;
            let (send, conn) = builder
                .handshake::<_, Bytes>(tcp)
                .await
                .map_err(|e| UpstreamError::Connect(format!("h2c handshake: {e}")))?;
            monoio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream h2c connection ended");
                }
            });
            send
        };
        *self.h2.borrow_mut() = Some(send.clone());
        Ok(Some(send))
    }

    fn live_sender(&self) -> Option<SendRequest<Bytes>> {
        let mut slot = self.h2.borrow_mut();
        match slot.as_ref() {
            Some(s) if !s.has_conn_error() => Some(s.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// Drops the pooled h2 connection (eviction command or a connection-level error).
    pub fn reset_connection(&self) {
        *self.h2.borrow_mut() = None;
    }

    async fn send_h2(
        &self,
        sender: &mut SendRequest<Bytes>,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let scheme = if self.cfg.tls { "https" } else { "http" };
        let uri = format!("{scheme}://{}{}", self.cfg.authority(), req.path);
        let mut b = http::Request::builder().method(req.method).uri(uri);
        for (n, v) in &req.headers {
            b = b.header(*n, v.as_str());
        }
        if !req.body.is_empty() {
            b = b.header("content-length", req.body.len().to_string());
        }
        let request = b.body(()).map_err(|e| UpstreamError::Protocol {
            sent: false,
            message: format!("cannot build request: {e}"),
        })?;
        let ready = sender.clone().ready();
        let mut ready = monoio::time::timeout(self.cfg.connect_timeout, ready)
            .await
            .map_err(|_| UpstreamError::Connect("h2 stream capacity wait timed out".into()))?
            .map_err(|e| {
                self.reset_connection();
                UpstreamError::Connect(format!("h2 connection not ready: {e}"))
            })?;
        let end = req.body.is_empty();
        let (resp_fut, mut send_stream) = ready.send_request(request, end).map_err(|e| {
            self.reset_connection();
            UpstreamError::Connect(format!("h2 send_request: {e}"))
        })?;
        if !end {
            send_stream
                .send_data(req.body, true)
                .map_err(|e| UpstreamError::Protocol {
                    sent: true,
                    message: format!("h2 send body: {e}"),
                })?;
        }
        let resp = monoio::time::timeout(self.cfg.first_byte_timeout, resp_fut)
            .await
            .map_err(|_| UpstreamError::Timeout { sent: true })?
            .map_err(|e| UpstreamError::Protocol {
                sent: true,
                message: format!("h2 response: {e}"),
            })?;
        let (parts, body) = resp.into_parts();
        let headers = parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        Ok(UpstreamResponse {
            status: parts.status.as_u16(),
            headers,
            body: UpstreamBody::H2(body),
            protocol: "h2",
        })
    }
}
