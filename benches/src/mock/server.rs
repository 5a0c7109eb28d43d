//! The listener: one socket serving HTTP/1.1 and h2c (prior knowledge) on plain TCP, or h2 and
//! HTTP/1.1 via ALPN over TLS, on a dedicated multi-thread Tokio runtime. HTTP/1.1 connections
//! can be upgraded (the Responses WebSocket, [`super::ws`]).
//!
//! # Key Components
//! - [`run`]: the body of the server thread (runtime, bind, ready signal, accept loop).
//! - [`tls_acceptor`]: a rustls (ring) acceptor from PEM files, ALPN `h2`, `http/1.1`.
//!
//! # Error handling
//! Bind and runtime errors are sent back through the ready channel so
//! [`super::MockCodex::start`] can return them; per-connection errors are logged at debug
//! level and only end that connection.

use std::{
    fs::File,
    io::BufReader,
    net::SocketAddr,
    path::Path,
    sync::{mpsc::SyncSender, Arc},
    time::Duration,
};

use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::oneshot,
};
use tokio_rustls::TlsAcceptor;

use super::{routes, state::Shared, MockConfig};

/// Builds the TLS acceptor (rustls with the ring provider).
pub(crate) fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = rustls_pemfile::certs(&mut BufReader::new(
        File::open(cert).with_context(|| format!("open TLS cert {}", cert.display()))?,
    ))
    .collect::<Result<Vec<_>, _>>()
    .with_context(|| format!("read TLS cert {}", cert.display()))?;
    let key = rustls_pemfile::private_key(&mut BufReader::new(
        File::open(key).with_context(|| format!("open TLS key {}", key.display()))?,
    ))
    .with_context(|| format!("read TLS key {}", key.display()))?
    .with_context(|| format!("no private key in {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(4096)
}

/// The server thread: runs until `stop` fires (or its sender is dropped).
pub(crate) fn run(
    cfg: MockConfig,
    tls: Option<TlsAcceptor>,
    workers: usize,
    ready: SyncSender<anyhow::Result<Arc<Shared>>>,
    stop: oneshot::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("mock-codex-worker")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(
                anyhow::Error::from(e).context("build the mock-codex runtime")
            ));
            return;
        }
    };
    rt.block_on(async move {
        let listen = cfg.listen;
        let max_streams = cfg.h2_max_concurrent_streams;
        let goaway_after = cfg.goaway_after_requests;
        let bound = bind(listen).and_then(|l| Ok((l.local_addr()?, l)));
        let (addr, listener) = match bound {
            Ok(x) => x,
            Err(e) => {
                let _ = ready.send(Err(anyhow::Error::from(e).context(format!("bind {listen}"))));
                return;
            }
        };
        let shared = Arc::new(Shared::new(cfg, addr, tls.is_some()));
        if ready.send(Ok(shared.clone())).is_err() {
            return;
        }
        serve(max_streams, goaway_after, listener, shared, tls, stop).await;
    });
    rt.shutdown_timeout(Duration::from_millis(200));
}

async fn serve(
    max_streams: u32,
    goaway_after: Option<usize>,
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(max_streams);
    let builder = Arc::new(builder);
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            r = listener.accept() => r,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "mock-codex accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let shared = shared.clone();
        let builder = builder.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            // Requests seen on this connection; at `goaway_after` the connection shuts down
            // gracefully (GOAWAY on h2: open streams finish, new ones go elsewhere).
            let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let rotate = Arc::new(tokio::sync::Notify::new());
            let svc = {
                let (seen, rotate) = (seen.clone(), rotate.clone());
                service_fn(move |req| {
                    let n = seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if goaway_after == Some(n) {
                        rotate.notify_one();
                    }
                    routes::handle(shared.clone(), req)
                })
            };
            let res = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(s) => {
                        drive(
                            builder.serve_connection_with_upgrades(TokioIo::new(s), svc),
                            &rotate,
                            goaway_after,
                        )
                        .await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "mock-codex TLS handshake failed");
                        return;
                    }
                },
                None => {
                    drive(
                        builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc),
                        &rotate,
                        goaway_after,
                    )
                    .await
                }
            };
            if let Err(e) = res {
                tracing::debug!(error = %e, "mock-codex connection ended with an error");
            }
        });
    }
}

/// Runs a connection, starting its graceful shutdown when `rotate` fires.
async fn drive<C, E>(
    conn: C,
    rotate: &tokio::sync::Notify,
    goaway_after: Option<usize>,
) -> Result<(), E>
where
    C: std::future::Future<Output = Result<(), E>> + GracefulConnection,
{
    let mut conn = std::pin::pin!(conn);
    if goaway_after.is_none() {
        return conn.await;
    }
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = rotate.notified() => {}
    }
    conn.as_mut().shutdown_gracefully();
    conn.await
}

/// hyper-util's auto connection (with HTTP/1.1 upgrades, for the Responses WebSocket),
/// graceful shutdown abstracted for [`drive`].
trait GracefulConnection {
    fn shutdown_gracefully(self: std::pin::Pin<&mut Self>);
}

impl<I, S, E, B> GracefulConnection
    for hyper_util::server::conn::auto::UpgradeableConnection<'_, I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn shutdown_gracefully(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}
