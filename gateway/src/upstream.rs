//! The per-worker upstream client: HTTP/2 over TLS (ALPN h2) multiplexing every account's
//! requests on a small pool of connections per worker per origin; HTTP/1.1 (our own streaming
//! client) and h2c for plain-HTTP upstreams; HTTP/1.1 over TLS when the origin does not offer h2.
//!
//! # Key Components
//! - [`Upstream`]: owned by one worker (`!Send`); [`Upstream::send`] returns response headers
//!   and a streaming [`UpstreamBody`].
//! - [`UpstreamError`]: transport failures, each saying whether the request may have reached
//!   the upstream ([`UpstreamError::maybe_sent`]): the lifecycle never resends such a payload.
//!
//! - The h2 pool: streams fill the first connection with room (at most
//!   `h2_max_streams_per_connection` each, at or below the origin's
//!   `SETTINGS_MAX_CONCURRENT_STREAMS`); another connection opens when all are full, up to
//!   `h2_max_connections`; past that a request fails fast with [`UpstreamError::Saturated`]
//!   (503), never a silent wait. A connection that refuses new streams (GOAWAY, connection
//!   error) is retired: its streams in flight finish, new ones go elsewhere. Extra connections
//!   idle for a minute are closed.
//!
//! - Egress: an account with a proxy ([`shared_state::ProxyEntry`]) reaches the origin through
//!   an HTTP `CONNECT` or SOCKS5 tunnel ([`proxy`]) on every path (h2, h2c, HTTP/1.1 plain and
//!   TLS, the WebSocket pool). Pools are keyed by egress ([`ProxyEntry::key`], 0 = direct): a
//!   connection through one proxy never carries another egress's requests. A proxy failure is
//!   [`UpstreamError::Proxy`]: nothing was sent, and it is the proxy's fault, not the account's.
//!
//! # Error handling
//! A broken h2 connection is retired and the request (not sent yet) tries another. Timeouts
//! close what they interrupt; nothing is resumed after a cancelled read.

pub mod h1;
pub mod proxy;
pub mod tls;
pub mod ws;

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    net::SocketAddr,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use monoio::net::TcpStream;
use monoio_http::h2::client::SendRequest;
use shared_state::{
    egress::{ProxyFailureKind, DIRECT},
    ProxyEntry,
};

use crate::{
    config::{PlainHttp, UpstreamConfig},
    metrics::WorkerMetrics,
};

/// Extra h2 connections (beyond the first) idle this long are closed.
const H2_IDLE_CLOSE: Duration = Duration::from_secs(60);

/// A request to the Codex backend.
#[derive(Debug)]
pub struct UpstreamRequest {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// Path and query, starting with `/` (the configured prefix already applied).
    pub path: String,
    /// Headers (lower-case names; no hop-by-hop headers). `HeaderValue`s, so a value built
    /// once (a static or configured one) is shared, not copied, into every request; the bearer
    /// token is marked sensitive (never indexed by HPACK, `Sensitive` in `Debug`).
    pub headers: Vec<(&'static str, http::HeaderValue)>,
    /// Body.
    pub body: Bytes,
}

/// Response head plus streaming body.
pub struct UpstreamResponse {
    /// Status code.
    pub status: u16,
    /// Headers with lower-case names.
    pub headers: Head,
    /// The body.
    pub body: UpstreamBody,
    /// `h2` or `http/1.1`.
    pub protocol: &'static str,
}

// === impl UpstreamResponse ===

impl UpstreamResponse {
    /// First header with this lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

/// A response head's headers: an h2 response keeps the field list its decoder built, in
/// wire order (nothing copied per header, no `HeaderMap` hashed: a head is read a dozen times
/// at most, a scan of its fields is cheaper); HTTP/1.1 and WebSocket upgrade heads are parsed
/// into pairs.
#[derive(Debug)]
pub enum Head {
    /// As the h2 decoder built it.
    Fields(monoio_http::h2::Fields),
    /// Lower-case names, values trimmed.
    Pairs(Vec<(String, String)>),
}

// === impl Head ===

impl Head {
    /// First value with this lower-case name (a value that is not UTF-8 counts as absent).
    pub fn get(&self, name: &str) -> Option<&str> {
        match self {
            Self::Fields(f) => f
                .get(name)
                .and_then(|v| std::str::from_utf8(v.as_bytes()).ok()),
            Self::Pairs(p) => p.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()),
        }
    }

    /// Every value with this lower-case name, in order (values that are not UTF-8 left out).
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let (fields, pairs) = match self {
            Self::Fields(f) => (Some(f), None),
            Self::Pairs(p) => (None, Some(p)),
        };
        let from_fields = fields
            .into_iter()
            .flat_map(move |f| f.get_all(name))
            .filter_map(|v| v.to_str().ok());
        let from_pairs = pairs
            .into_iter()
            .flat_map(|p| p.iter())
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str());
        from_fields.chain(from_pairs)
    }
}

/// A streaming response body.
pub enum UpstreamBody {
    /// An HTTP/2 stream (dropping it resets the stream upstream and frees its pool slot).
    H2(monoio_http::h2::RecvStream, StreamSlot),
    /// An HTTP/1.1 body over a dedicated connection (dropping it closes the connection).
    /// Boxed, like `Ws`: every committed stream holds an `UpstreamBody` for its whole life,
    /// and the common h2 variant is 40 bytes where these are over 1 KiB.
    H1(Box<h1::Body>),
    /// One turn on a pooled upstream WebSocket, as SSE-shaped events.
    Ws(Box<ws::WsTurn>),
    /// A body already read whole (an upgrade refused with an account status).
    Full(Option<Bytes>),
    /// A unit test's scripted chunks and breaks, in turn, then the end
    /// (`crate::testing::FakeConnector`).
    #[cfg(test)]
    Scripted(std::collections::VecDeque<Result<Bytes, UpstreamError>>),
}

// === impl UpstreamBody ===

impl UpstreamBody {
    /// The next chunk; `Ok(None)` at the end of the body.
    pub async fn chunk(&mut self, idle: Duration) -> Result<Option<Bytes>, UpstreamError> {
        match self {
            // Boxed (as every arm): the timer is 640 bytes aligned to 128, and the future
            // awaiting this one lives as long as the stream.
            Self::H2(rs, _) => match Box::pin(monoio::time::timeout(idle, rs.data())).await {
                Err(_) => Err(UpstreamError::Timeout { sent: true }),
                Ok(r) => h2_data(rs, r),
            },
            Self::H1(b) => match Box::pin(monoio::time::timeout(idle, b.chunk())).await {
                Err(_) => Err(UpstreamError::Timeout { sent: true }),
                Ok(r) => r,
            },
            Self::Ws(t) => Box::pin(t.chunk(idle)).await,
            Self::Full(b) => Ok(b.take()),
            #[cfg(test)]
            Self::Scripted(q) => q.pop_front().transpose(),
        }
    }

    /// The next chunk of a committed stream, failing with a timeout once `idle` passes
    /// without one: the per-worker deadline wheel instead of a runtime timer per awaited
    /// chunk (the h2 body, and the HTTP/1.1 and WebSocket bodies through
    /// [`crate::deadline::within`], which waits through the quiet stage: their reads cannot be
    /// set aside). Every chunk touches `idle`. [`Waited::Quiet`] once `idle`'s quiet stage passes first (the caller
    /// then gives back its idle buffers and waits again).
    pub async fn chunk_within(&mut self, idle: &mut crate::deadline::Idle) -> Waited {
        use crate::deadline::Expired;
        let r = match self {
            Self::H2(rs, _) => {
                let polled = std::future::poll_fn(|cx| {
                    if let std::task::Poll::Ready(r) = rs.poll_data_released(cx) {
                        return std::task::Poll::Ready(Ok(r));
                    }
                    idle.poll_expired(cx).map(Err)
                })
                .await;
                match polled {
                    Err(Expired::Quiet) => return Waited::Quiet,
                    Err(Expired::Idle) => Err(UpstreamError::Timeout { sent: true }),
                    Ok(r) => h2_chunk(r),
                }
            }
            // Boxed: the read futures are large, and this one lives as long as the stream.
            Self::H1(b) => Box::pin(crate::deadline::within(idle, b.chunk()))
                .await
                .unwrap_or(Err(UpstreamError::Timeout { sent: true })),
            Self::Ws(t) => Box::pin(t.chunk_within(idle)).await,
            _ => self.chunk(idle.span()).await,
        };
        if matches!(r, Ok(Some(_))) {
            idle.touch();
        }
        Waited::Chunk(r)
    }

    /// A chunk that is already received, without waiting: `None` when the next one needs a
    /// wait (or this body cannot tell without one: WebSocket turns).
    pub fn try_chunk(&mut self) -> Option<Result<Option<Bytes>, UpstreamError>> {
        match self {
            Self::H2(rs, _) => {
                // A no-op waker: the caller always polls again with its own before waiting.
                let cx = std::task::Context::from_waker(std::task::Waker::noop());
                match rs.poll_data_released(&cx) {
                    std::task::Poll::Pending => None,
                    std::task::Poll::Ready(r) => Some(h2_chunk(r)),
                }
            }
            Self::H1(b) => b.try_chunk(),
            Self::Ws(_) => None,
            Self::Full(b) => Some(Ok(b.take())),
            #[cfg(test)]
            Self::Scripted(q) => Some(q.pop_front().transpose()),
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

/// What an h2 body's `data()` gave, as a chunk: a received frame's flow-control capacity is
/// released at once (the chunk is the caller's now), a stream error is a protocol failure.
fn h2_data(
    rs: &mut monoio_http::h2::RecvStream,
    r: Option<Result<Bytes, monoio_http::h2::Error>>,
) -> Result<Option<Bytes>, UpstreamError> {
    if let Some(Ok(b)) = &r {
        let _ = rs.flow_control().release_capacity(b.len());
    }
    h2_chunk(r)
}

/// A chunk whose capacity is released already (`RecvStream::poll_data_released`, which
/// does in one stream lookup what `poll_data` and `release_capacity` do in two), as
/// [`h2_data`] gives it.
fn h2_chunk(
    r: Option<Result<Bytes, monoio_http::h2::Error>>,
) -> Result<Option<Bytes>, UpstreamError> {
    match r {
        None => Ok(None),
        Some(Ok(b)) => Ok(Some(b)),
        Some(Err(e)) => Err(UpstreamError::Protocol {
            sent: true,
            message: format!("h2 stream error: {e}"),
        }),
    }
}

/// What [`UpstreamBody::chunk_within`] waited for.
pub enum Waited {
    /// The next chunk, the end of the body (`Ok(None)`), or a failure.
    Chunk(Result<Option<Bytes>, UpstreamError>),
    /// The `quiet` deadline passed first: nothing was read.
    Quiet,
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
    /// Every pooled h2 connection is at its stream limit and the pool is at its size limit:
    /// nothing was sent (the worker's capacity, not an account's fault).
    #[error("upstream connection pool saturated")]
    Saturated,
    /// The upstream WebSocket could not be used (connect, upgrade refused, breaker open, a
    /// stale socket): nothing was sent; the request goes over HTTP instead.
    #[error("upstream websocket unavailable")]
    WsUnavailable,
    /// The account's egress proxy failed (refused, auth rejected, timed out, breaker open):
    /// nothing was sent; the proxy is marked, never the account.
    #[error("{message}")]
    Proxy {
        /// Storage id of the proxy.
        proxy_id: i64,
        /// What failed.
        kind: ProxyFailureKind,
        /// What happened (never a credential).
        message: String,
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
            Self::Connect(_) | Self::Saturated | Self::WsUnavailable | Self::Proxy { .. } => false,
            Self::Timeout { sent } | Self::Protocol { sent, .. } => *sent,
        }
    }
}

/// One pooled upstream h2 connection.
struct H2Conn {
    send: SendRequest<Bytes>,
    /// Our streams open on it (released by [`StreamSlot`]).
    streams: Cell<usize>,
    /// When `streams` last dropped to zero.
    idle_since: Cell<Instant>,
    /// Takes no new streams (GOAWAY, connection error, idle close); open streams finish.
    retired: Cell<bool>,
}

/// The h2 connections of one egress (direct, or one proxy).
#[derive(Default)]
struct H2Pool {
    conns: RefCell<Vec<Rc<H2Conn>>>,
    /// Serializes connection establishment so concurrent first requests share one.
    connecting: tokio::sync::Mutex<()>,
}

/// A stream's claim on its pooled h2 connection; dropping it frees the slot.
pub struct StreamSlot {
    conn: Rc<H2Conn>,
    metrics: Arc<WorkerMetrics>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let n = self.conn.streams.get().saturating_sub(1);
        self.conn.streams.set(n);
        if n == 0 {
            self.conn.idle_since.set(Instant::now());
        }
        self.metrics.h2_streams_delta(-1);
    }
}

/// The per-worker upstream client.
pub struct Upstream {
    cfg: UpstreamConfig,
    tls: Option<monoio_rustls::TlsConnector>,
    /// h2 connections by egress key.
    h2: RefCell<HashMap<u64, Rc<H2Pool>>>,
    metrics: Arc<WorkerMetrics>,
    /// The upstream WebSocket pool and its breaker.
    ws: Rc<ws::WsPool>,
    /// Idle HTTP/1.1 keep-alive connections (plain-HTTP origins, or TLS origins that chose
    /// HTTP/1.1), by egress key.
    h1: RefCell<HashMap<u64, Rc<h1::H1Pool>>>,
    /// Idle HTTP/1.1 connections over every egress (the gauge).
    h1_total: Rc<Cell<usize>>,
    /// TLS for WebSocket upgrades (ALPN `http/1.1`).
    ws_tls: Option<monoio_rustls::TlsConnector>,
    /// Set when a TLS origin negotiated HTTP/1.1 instead of h2.
    tls_h1_only: RefCell<bool>,
    next_addr: RefCell<usize>,
    /// [`Upstream::uri_of`]'s last path and URI.
    last_uri: RefCell<Option<(String, http::Uri)>>,
}

// === impl Upstream ===

impl Upstream {
    /// Builds the client (TLS roots are loaded once, here).
    pub fn new(cfg: UpstreamConfig, metrics: Arc<WorkerMetrics>) -> Result<Rc<Self>, String> {
        let (tls, ws_tls) = if cfg.tls {
            (
                Some(tls::connector(cfg.ca_file.as_deref())?),
                Some(tls::connector_h1(cfg.ca_file.as_deref())?),
            )
        } else {
            (None, None)
        };
        let ws_metrics = Arc::clone(&metrics);
        Ok(Rc::new(Self {
            h1: RefCell::new(HashMap::new()),
            h1_total: Rc::new(Cell::new(0)),
            cfg,
            tls,
            h2: RefCell::new(HashMap::new()),
            metrics,
            ws: Rc::new(ws::WsPool::new(ws_metrics)),
            ws_tls,
            tls_h1_only: RefCell::new(false),
            next_addr: RefCell::new(0),
            last_uri: RefCell::new(None),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &UpstreamConfig {
        &self.cfg
    }

    /// The h2 request URI of `path` on the origin: the last one built is kept (every
    /// Responses request has the same path; a clone shares its bytes).
    fn uri_of(&self, path: &str) -> Result<http::Uri, http::uri::InvalidUri> {
        let mut last = self.last_uri.borrow_mut();
        if let Some((p, uri)) = last.as_ref() {
            if p == path {
                return Ok(uri.clone());
            }
        }
        let scheme = if self.cfg.tls { "https" } else { "http" };
        let uri = http::Uri::try_from(format!("{scheme}://{}{path}", self.cfg.authority()))?;
        *last = Some((path.to_owned(), uri.clone()));
        Ok(uri)
    }

    /// The HTTP/1.1 keep-alive pool of an egress.
    fn h1_pool(&self, egress: u64) -> Rc<h1::H1Pool> {
        Rc::clone(self.h1.borrow_mut().entry(egress).or_insert_with(|| {
            h1::H1Pool::with_total(
                self.cfg.h1_max_idle,
                self.cfg.h1_idle_timeout,
                Arc::clone(&self.metrics),
                Rc::clone(&self.h1_total),
            )
        }))
    }

    /// A TCP connection to the origin: through the account's egress proxy when it has one
    /// (a tunnel, checked and marked by the proxy's breaker), else direct.
    async fn tcp(&self, egress: Option<&ProxyEntry>) -> Result<TcpStream, UpstreamError> {
        let Some(p) = egress else {
            return self.tcp_direct().await;
        };
        let addrs = self.cfg.addrs.get();
        let target = proxy::Target {
            host: &self.cfg.host,
            port: self.cfg.port,
            addr: addrs.first().copied(),
        };
        match proxy::connect(p, target, self.cfg.connect_timeout).await {
            Ok(s) => {
                self.metrics.proxy_tunnel();
                Ok(s)
            }
            Err(e) => {
                self.metrics.proxy_failure(e.kind);
                if !matches!(
                    e.kind,
                    ProxyFailureKind::BreakerOpen | ProxyFailureKind::Disabled
                ) {
                    tracing::warn!(proxy = p.id, name = %p.name, kind = e.kind.as_str(), error = %e.message, "egress proxy failed");
                }
                Err(UpstreamError::Proxy {
                    proxy_id: p.id,
                    kind: e.kind,
                    message: e.message,
                })
            }
        }
    }

    /// Connects to the next resolved address, trying the others when one refuses.
    async fn tcp_direct(&self) -> Result<TcpStream, UpstreamError> {
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

    /// Sends one request: over a pooled upstream WebSocket when `ws` asks for it (client
    /// WebSocket turns) and the origin allows it, else (or when the WebSocket is unavailable,
    /// nothing sent) over HTTP.
    /// `egress`: the account's proxy (`None`: direct).
    pub async fn send_routed(
        &self,
        account_id: i64,
        egress: Option<&ProxyEntry>,
        ws: Option<&ws::WsRoute>,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse, UpstreamError> {
        if let Some(route) = ws.filter(|_| self.cfg.websockets) {
            match self
                .send_ws(account_id, egress, route, &req, &self.metrics)
                .await
            {
                Err(UpstreamError::WsUnavailable) => self.metrics.ws_upstream_fallback(),
                other => return other,
            }
        }
        self.send(egress, req).await
    }

    /// Idle sockets in this worker's upstream WebSocket pool.
    pub fn ws_idle(&self) -> usize {
        self.ws.idle_count()
    }

    /// Starts the worker-local background work of the upstream side (the liveness pings of
    /// idle pooled WebSockets). Call once, inside the worker's runtime.
    pub fn start_background(&self) {
        if self.cfg.websockets {
            self.ws
                .start_liveness(self.cfg.ws_ping_interval, self.cfg.ws_pong_timeout);
        }
    }

    /// Closes pooled upstream sockets of an account.
    pub fn evict_account(&self, account_id: i64) {
        self.ws.evict(account_id);
        self.reset_connection();
    }

    /// Sends one request through `egress` (`None`: direct) and waits for the response head.
    pub async fn send(
        &self,
        egress: Option<&ProxyEntry>,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let use_h2 = if self.cfg.tls {
            !*self.tls_h1_only.borrow()
        } else {
            self.cfg.plain_http == PlainHttp::H2c
        };
        if use_h2 {
            // A connection that refuses the new stream (GOAWAY, broken) is retired and the
            // request, not sent yet, goes to another one.
            let mut req = req;
            for _ in 0..3 {
                let Some((sender, slot)) = self.h2_slot(egress).await? else {
                    return self.send_h1(egress, req).await;
                };
                match self.send_h2(sender, slot, req).await {
                    Ok(resp) => return Ok(resp),
                    Err(H2SendError::Refused(back, e)) => {
                        tracing::debug!(error = %e, "upstream h2 connection refused a stream; retiring it");
                        req = back;
                    }
                    Err(H2SendError::Failed(e)) => return Err(e),
                }
            }
            return Err(UpstreamError::Connect(
                "upstream h2 connections kept refusing new streams".into(),
            ));
        }
        self.send_h1(egress, req).await
    }

    /// HTTP/1.1 (plain, or TLS when the origin chose it) on a pooled keep-alive connection
    /// when one is idle: a stale one (closed by the origin while idle, the request unread) is
    /// dropped and the next tried, a fresh connection last.
    async fn send_h1(
        &self,
        egress: Option<&ProxyEntry>,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let h1 = self.h1_pool(egress.map_or(DIRECT, |p| p.key));
        loop {
            let (io, reused) = match h1.take() {
                Some(io) => (io, true),
                None => (
                    if self.cfg.tls {
                        h1::BodyIo::from(self.tls_connect(egress).await?.0)
                    } else {
                        h1::BodyIo::from(self.tcp(egress).await?)
                    },
                    false,
                ),
            };
            self.metrics.h1_request(reused);
            let pool = (self.cfg.h1_max_idle > 0).then(|| Rc::clone(&h1));
            match h1::send(io, &self.cfg, &req, pool, reused).await {
                Ok(resp) => return Ok(resp),
                Err(h1::SendError::Stale) => {
                    tracing::debug!("pooled upstream h1 connection was closed while idle");
                }
                Err(h1::SendError::Failed(e)) => return Err(e),
            }
        }
    }

    /// Idle keep-alive connections in this worker's HTTP/1.1 pools (every egress).
    pub fn h1_idle(&self) -> usize {
        self.h1_total.get()
    }

    async fn tls_connect(
        &self,
        egress: Option<&ProxyEntry>,
    ) -> Result<(monoio_rustls::ClientTlsStream<TcpStream>, bool), UpstreamError> {
        let tcp = self.tcp(egress).await?;
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

    /// A slot on a pooled h2 connection with room, connecting another when all are full.
    /// `Ok(None)`: the TLS origin speaks only HTTP/1.1.
    async fn h2_slot(
        &self,
        egress: Option<&ProxyEntry>,
    ) -> Result<Option<(SendRequest<Bytes>, StreamSlot)>, UpstreamError> {
        let pool = Rc::clone(
            self.h2
                .borrow_mut()
                .entry(egress.map_or(DIRECT, |p| p.key))
                .or_default(),
        );
        if let Some(s) = self.pick(&pool) {
            return Ok(Some(s));
        }
        let _guard = pool.connecting.lock().await;
        if let Some(s) = self.pick(&pool) {
            return Ok(Some(s));
        }
        if pool.conns.borrow().len() >= self.cfg.h2_max_connections {
            self.metrics.h2_saturated();
            return Err(UpstreamError::Saturated);
        }
        let Some(send) = self.h2_connect(egress).await? else {
            return Ok(None);
        };
        pool.conns.borrow_mut().push(Rc::new(H2Conn {
            send,
            streams: Cell::new(0),
            idle_since: Cell::new(Instant::now()),
            retired: Cell::new(false),
        }));
        self.metrics.h2_connections_delta(1);
        Ok(self.pick(&pool))
    }

    /// Prunes retired, broken and long-idle extra connections, then takes a slot on the first
    /// connection with room (filling connections in order keeps their number low).
    fn pick(&self, pool: &H2Pool) -> Option<(SendRequest<Bytes>, StreamSlot)> {
        let mut pool = pool.conns.borrow_mut();
        let before = pool.len();
        let mut first = true;
        pool.retain(|c| {
            let idle_extra =
                !first && c.streams.get() == 0 && c.idle_since.get().elapsed() >= H2_IDLE_CLOSE;
            first = false;
            if c.send.has_conn_error() && !c.retired.replace(true) {
                // GOAWAY received (or the connection broke).
                self.metrics.h2_retired();
            }
            if idle_extra {
                c.retired.set(true);
            }
            !c.retired.get()
        });
        let gone = before - pool.len();
        if gone > 0 {
            self.metrics.h2_connections_delta(-(gone as i64));
        }
        let max = self.cfg.h2_max_streams_per_connection;
        let conn = pool.iter().find(|c| c.streams.get() < max)?;
        conn.streams.set(conn.streams.get() + 1);
        self.metrics.h2_streams_delta(1);
        Some((
            conn.send.clone(),
            StreamSlot {
                conn: Rc::clone(conn),
                metrics: Arc::clone(&self.metrics),
            },
        ))
    }

    /// Opens one h2 (or h2c) connection. `Ok(None)`: the TLS origin chose HTTP/1.1.
    async fn h2_connect(
        &self,
        egress: Option<&ProxyEntry>,
    ) -> Result<Option<SendRequest<Bytes>>, UpstreamError> {
        let mut builder = monoio_http::h2::client::Builder::new();
        builder
            .initial_window_size(4 * 1024 * 1024)
            .initial_connection_window_size(16 * 1024 * 1024)
            .max_concurrent_reset_streams(1024);
        let send = if self.cfg.tls {
            let (stream, is_h2) = self.tls_connect(egress).await?;
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
            let tcp = self.tcp(egress).await?;
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
        Ok(Some(send))
    }

    /// Retires every pooled h2 connection (eviction command): streams in flight finish on
    /// them, new requests open fresh connections.
    pub fn reset_connection(&self) {
        let mut pools = self.h2.borrow_mut();
        for pool in pools.values() {
            let mut conns = pool.conns.borrow_mut();
            for c in conns.iter() {
                c.retired.set(true);
            }
            self.metrics.h2_connections_delta(-(conns.len() as i64));
            conns.clear();
        }
        // Pools of egresses no longer in use go too (the direct one stays).
        pools.retain(|k, _| *k == DIRECT);
    }

    /// Marks the connection of `slot` as taking no new streams.
    fn retire(&self, slot: &StreamSlot) {
        if !slot.conn.retired.replace(true) {
            self.metrics.h2_retired();
        }
    }

    async fn send_h2(
        &self,
        sender: SendRequest<Bytes>,
        slot: StreamSlot,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse, H2SendError> {
        let uri = self.uri_of(&req.path).map_err(|e| {
            H2SendError::Failed(UpstreamError::Protocol {
                sent: false,
                message: format!("cannot build request: {e}"),
            })
        })?;
        let method = match req.method {
            "GET" => http::Method::GET,
            "POST" => http::Method::POST,
            m => http::Method::from_bytes(m.as_bytes()).map_err(|e| {
                H2SendError::Failed(UpstreamError::Protocol {
                    sent: false,
                    message: format!("cannot build request: {e}"),
                })
            })?,
        };
        // The fields in our order, straight into the HEADERS frame (no `HeaderMap`). The names
        // are the gateway's own lower-case constants: a static name costs no allocation. A
        // value clone shares its bytes; the bearer token's is marked sensitive, so HPACK
        // sends it as a never-indexed literal (every other constant value is indexed once per
        // connection and then costs one byte).
        let mut fields = monoio_http::h2::Fields::with_capacity(req.headers.len() + 1);
        for (n, v) in &req.headers {
            fields.push(http::HeaderName::from_static(n), v.clone());
        }
        if !req.body.is_empty() {
            fields.push(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from(req.body.len()),
            );
        }
        let ready = match monoio::time::timeout(self.cfg.connect_timeout, sender.ready()).await {
            Err(_) => {
                return Err(H2SendError::Failed(UpstreamError::Connect(
                    "h2 stream capacity wait timed out".into(),
                )))
            }
            Ok(Err(e)) => {
                self.retire(&slot);
                return Err(H2SendError::Refused(req, e.to_string()));
            }
            Ok(Ok(r)) => r,
        };
        let mut ready = ready;
        let end = req.body.is_empty();
        let (resp_fut, mut send_stream) = match ready.send_request_fields(method, uri, fields, end)
        {
            Ok(x) => x,
            Err(e) => {
                self.retire(&slot);
                return Err(H2SendError::Refused(req, e.to_string()));
            }
        };
        if !end {
            // A clone (a reference count): the request stays whole in case the stream is
            // refused unprocessed and goes to another connection.
            send_stream.send_data(req.body.clone(), true).map_err(|e| {
                H2SendError::Failed(UpstreamError::Protocol {
                    sent: true,
                    message: format!("h2 send body: {e}"),
                })
            })?;
        }
        let resp = monoio::time::timeout(self.cfg.first_byte_timeout, resp_fut)
            .await
            .map_err(|_| H2SendError::Failed(UpstreamError::Timeout { sent: true }))?;
        let resp = match resp {
            Ok(r) => r,
            // RFC 9113 §8.7: a stream above the GOAWAY's last stream id, or reset with
            // REFUSED_STREAM, was not processed: safe on another connection.
            Err(e)
                if (e.is_go_away() && e.is_remote())
                    || e.reason() == Some(monoio_http::h2::Reason::REFUSED_STREAM) =>
            {
                self.retire(&slot);
                return Err(H2SendError::Refused(req, e.to_string()));
            }
            Err(e) => {
                if e.is_go_away() || e.is_io() {
                    self.retire(&slot);
                }
                return Err(H2SendError::Failed(UpstreamError::Protocol {
                    sent: true,
                    message: format!("h2 response: {e}"),
                }));
            }
        };
        let (head, body) = resp;
        Ok(UpstreamResponse {
            status: head.status.as_u16(),
            headers: Head::Fields(head.fields),
            body: UpstreamBody::H2(body, slot),
            protocol: "h2",
        })
    }
}

/// Why an h2 send did not produce a response.
enum H2SendError {
    /// The connection refused the stream before anything was sent: the request comes back
    /// for another connection.
    Refused(UpstreamRequest, String),
    /// Anything else.
    Failed(UpstreamError),
}

#[cfg(test)]
mod head_tests {
    use http::{HeaderName, HeaderValue};

    use super::Head;

    fn h2_head() -> Head {
        let mut f = monoio_http::h2::Fields::new();
        for (n, v) in [
            ("content-type", "text/event-stream"),
            ("set-cookie", "__cf_bm=a; Path=/"),
            ("x-codex-primary-used-percent", "12.5"),
            ("set-cookie", "_cfuvid=b; Path=/"),
        ] {
            f.push(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        f.push(
            HeaderName::from_static("x-binary"),
            HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        Head::Fields(f)
    }

    #[test]
    fn an_h2_head_reads_like_a_parsed_one() {
        let pairs = Head::Pairs(vec![
            ("content-type".into(), "text/event-stream".into()),
            ("set-cookie".into(), "__cf_bm=a; Path=/".into()),
            ("x-codex-primary-used-percent".into(), "12.5".into()),
            ("set-cookie".into(), "_cfuvid=b; Path=/".into()),
        ]);
        let fields = h2_head();
        for head in [&fields, &pairs] {
            assert_eq!(head.get("content-type"), Some("text/event-stream"));
            assert_eq!(head.get("x-codex-primary-used-percent"), Some("12.5"));
            assert_eq!(head.get("set-cookie"), Some("__cf_bm=a; Path=/"));
            assert_eq!(head.get("retry-after"), None);
            let cookies: Vec<&str> = head.get_all("set-cookie").collect();
            assert_eq!(cookies, ["__cf_bm=a; Path=/", "_cfuvid=b; Path=/"]);
            assert_eq!(head.get_all("x-missing").count(), 0);
        }
        // A value that is not UTF-8 counts as absent.
        assert_eq!(fields.get("x-binary"), None);
        assert_eq!(fields.get_all("x-binary").count(), 0);
    }
}
