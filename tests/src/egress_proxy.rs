//! A small egress proxy for the tests (issue 14): HTTP `CONNECT`, HTTP forward proxying
//! (absolute-form requests, what reqwest sends for `http://` targets) and SOCKS5, all on one
//! port (the first byte tells SOCKS5 from HTTP), optionally requiring a user name and password
//! (Basic `Proxy-Authorization`, RFC 1929). It counts what it did and keeps the bytes clients
//! sent through it, so a test can tell which requests went through it.
//!
//! # Usage
//! `let p = TestProxy::start(Some(("u", "p")));` then `p.url("socks5", Some(("u","p")))`.
//! It runs on a thread of its own (its own Tokio runtime) and stops when dropped.

#![allow(clippy::expect_used)] // a test harness: a poisoned lock or a failed bind is a test failure

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use base64::Engine;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// What the proxy did.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Tunnels opened (CONNECT and SOCKS5).
    pub tunnels: AtomicUsize,
    /// Forward-proxied HTTP requests (absolute-form).
    pub forwarded: AtomicUsize,
    /// Connections refused for wrong or missing credentials.
    pub auth_failures: AtomicUsize,
    /// Targets asked for (`host:port`).
    pub targets: Mutex<Vec<String>>,
    /// Bytes clients sent through (capped), for "did this request go through it".
    pub seen: Mutex<Vec<u8>>,
}

/// A running test proxy.
pub struct TestProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its counters.
    pub stats: Arc<ProxyStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

// === impl TestProxy ===

impl TestProxy {
    /// Starts a proxy on `127.0.0.1:0`; `auth`: the credentials it requires.
    pub fn start(auth: Option<(&str, &str)>) -> Self {
        let auth = auth.map(|(u, p)| (u.to_owned(), p.to_owned()));
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let stats = Arc::new(ProxyStats::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let st = Arc::clone(&stats);
        std::thread::Builder::new()
            .name("test-proxy".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(std_listener).expect("listener");
                    let auth = Arc::new(auth);
                    let serve = async {
                        loop {
                            let Ok((sock, _)) = listener.accept().await else {
                                continue;
                            };
                            let st = Arc::clone(&st);
                            let auth = Arc::clone(&auth);
                            tokio::spawn(async move {
                                let _ = serve(sock, &st, auth.as_ref().as_ref()).await;
                            });
                        }
                    };
                    tokio::select! {
                        _ = serve => {}
                        _ = rx => {}
                    }
                });
            })
            .expect("proxy thread");
        Self {
            addr,
            stats,
            stop: Some(tx),
        }
    }

    /// `scheme://[user:pass@]127.0.0.1:port`.
    pub fn url(&self, scheme: &str, creds: Option<(&str, &str)>) -> String {
        match creds {
            Some((u, p)) => format!("{scheme}://{u}:{p}@{}", self.addr),
            None => format!("{scheme}://{}", self.addr),
        }
    }

    /// Tunnels opened so far.
    pub fn tunnels(&self) -> usize {
        self.stats.tunnels.load(Ordering::SeqCst)
    }

    /// Forward-proxied requests so far.
    pub fn forwarded(&self) -> usize {
        self.stats.forwarded.load(Ordering::SeqCst)
    }

    /// Connections refused for credentials so far.
    pub fn auth_failures(&self) -> usize {
        self.stats.auth_failures.load(Ordering::SeqCst)
    }

    /// How many bytes clients sent through the proxy so far.
    pub fn seen_len(&self) -> usize {
        self.stats.seen.lock().expect("seen").len()
    }

    /// Whether clients sent `needle` through the proxy.
    pub fn saw(&self, needle: &str) -> bool {
        let seen = self.stats.seen.lock().expect("seen");
        seen.windows(needle.len()).any(|w| w == needle.as_bytes())
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

type Creds = (String, String);

async fn serve(
    mut sock: TcpStream,
    st: &Arc<ProxyStats>,
    auth: Option<&Creds>,
) -> std::io::Result<()> {
    let mut first = [0u8; 1];
    sock.read_exact(&mut first).await?;
    if first[0] == 5 {
        return socks5(sock, st, auth).await;
    }
    // HTTP: read the head (whatever follows it is the client's next bytes).
    let mut buf = first.to_vec();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut parts = request_line.split(' ');
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let authorized = match auth {
        None => true,
        Some((u, p)) => {
            let want = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            );
            lines.any(|l| {
                l.split_once(':').is_some_and(|(n, v)| {
                    n.eq_ignore_ascii_case("proxy-authorization") && v.trim() == want
                })
            })
        }
    };
    if !authorized {
        st.auth_failures.fetch_add(1, Ordering::SeqCst);
        sock.write_all(
            b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"t\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await?;
        return Ok(());
    }
    if method == "CONNECT" {
        st.targets.lock().expect("targets").push(target.clone());
        let Ok(up) = TcpStream::connect(target.as_str()).await else {
            sock.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return Ok(());
        };
        st.tunnels.fetch_add(1, Ordering::SeqCst);
        sock.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        return pipe(sock, up, buf[head_end..].to_vec(), st).await;
    }
    // Forward proxying: `GET http://host:port/path HTTP/1.1`; the origin gets the request as
    // is (servers accept the absolute form), then the rest of the connection.
    let Some(rest) = target.strip_prefix("http://") else {
        sock.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await?;
        return Ok(());
    };
    let hostport = rest.split('/').next().unwrap_or(rest).to_owned();
    let hostport = if hostport.contains(':') {
        hostport
    } else {
        format!("{hostport}:80")
    };
    st.targets.lock().expect("targets").push(hostport.clone());
    let up = TcpStream::connect(hostport.as_str()).await?;
    st.forwarded.fetch_add(1, Ordering::SeqCst);
    pipe(sock, up, buf, st).await
}

async fn socks5(
    mut sock: TcpStream,
    st: &Arc<ProxyStats>,
    auth: Option<&Creds>,
) -> std::io::Result<()> {
    let n = sock.read_u8().await?;
    let mut methods = vec![0u8; usize::from(n)];
    sock.read_exact(&mut methods).await?;
    match auth {
        None if methods.contains(&0) => sock.write_all(&[5, 0]).await?,
        Some(_) if methods.contains(&2) => sock.write_all(&[5, 2]).await?,
        _ => {
            st.auth_failures.fetch_add(1, Ordering::SeqCst);
            sock.write_all(&[5, 0xff]).await?;
            return Ok(());
        }
    }
    if let Some((u, p)) = auth {
        let _ver = sock.read_u8().await?;
        let ul = sock.read_u8().await?;
        let mut user = vec![0u8; usize::from(ul)];
        sock.read_exact(&mut user).await?;
        let pl = sock.read_u8().await?;
        let mut pass = vec![0u8; usize::from(pl)];
        sock.read_exact(&mut pass).await?;
        if user != u.as_bytes() || pass != p.as_bytes() {
            st.auth_failures.fetch_add(1, Ordering::SeqCst);
            sock.write_all(&[1, 1]).await?;
            return Ok(());
        }
        sock.write_all(&[1, 0]).await?;
    }
    let mut req = [0u8; 4];
    sock.read_exact(&mut req).await?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            sock.read_exact(&mut a).await?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            sock.read_exact(&mut a).await?;
            format!("[{}]", std::net::Ipv6Addr::from(a))
        }
        3 => {
            let l = sock.read_u8().await?;
            let mut h = vec![0u8; usize::from(l)];
            sock.read_exact(&mut h).await?;
            String::from_utf8_lossy(&h).into_owned()
        }
        _ => return Ok(()),
    };
    let port = sock.read_u16().await?;
    let target = format!("{host}:{port}");
    st.targets.lock().expect("targets").push(target.clone());
    let Ok(up) = TcpStream::connect(target.as_str()).await else {
        sock.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        return Ok(());
    };
    st.tunnels.fetch_add(1, Ordering::SeqCst);
    // The reply: bound address 0.0.0.0:0.
    sock.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    pipe(sock, up, Vec::new(), st).await
}

/// Copies both ways; what the client sends is also kept in `st.seen` (first 4 MiB).
async fn pipe(
    client: TcpStream,
    mut up: TcpStream,
    pending: Vec<u8>,
    st: &Arc<ProxyStats>,
) -> std::io::Result<()> {
    if !pending.is_empty() {
        keep(st, &pending);
        up.write_all(&pending).await?;
    }
    let (cr, mut cw) = client.into_split();
    let (mut ur, uw) = up.into_split();
    let st2 = Arc::clone(st);
    let upward = tokio::spawn(async move { copy_seen(cr, uw, &st2).await });
    let _ = tokio::io::copy(&mut ur, &mut cw).await;
    let _ = cw.shutdown().await;
    let _ = upward.await;
    Ok(())
}

async fn copy_seen(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    st: &Arc<ProxyStats>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        keep(st, &buf[..n]);
        to.write_all(&buf[..n]).await?;
    }
}

fn keep(st: &ProxyStats, bytes: &[u8]) {
    let mut seen = st.seen.lock().expect("seen");
    if seen.len() < 4 << 20 {
        seen.extend_from_slice(bytes);
    }
}
