//! Egress proxies on the data plane: the HTTP `CONNECT` and SOCKS5 (RFC 1928, username and
//! password per RFC 1929) client handshakes, and [`connect`], which opens a tunnel to the
//! upstream origin through an account's proxy from a monoio worker (no Tokio on this path).
//!
//! # Key Components
//! - [`handshake`]: runs the proxy's handshake on any owned-buffer stream. It never reads past
//!   the proxy's reply: the HTTP reply head is read at most up to its blank line (each read asks
//!   for no more bytes than the terminator can still need) and SOCKS5 replies are read to their
//!   exact length, so any byte after the reply stays in the socket for the tunnel's protocol
//!   (TLS, h2c, HTTP/1.1) to read.
//! - [`connect`]: the proxy's resolved addresses in order, then the handshake, each within the
//!   upstream connect budget; the proxy's breaker ([`shared_state::ProxyLive`]) is checked
//!   first and updated after.
//! - [`ProxyError`]: what failed, as a [`ProxyFailureKind`]; it never carries a credential.
//!
//! # Error handling
//! Every failure here is the proxy's, not the account's: the caller turns it into
//! `UpstreamError::Proxy` (nothing was sent upstream; the lifecycle fails over without
//! penalising the account). A timeout drops the connection it interrupted.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use base64::Engine;
use monoio::{
    buf::IoBufMut,
    io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt},
    net::TcpStream,
};
use shared_state::{egress::ProxyFailureKind, ProxyEntry, ProxyUrl};

/// Longest proxy reply head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// Where the tunnel goes: the upstream origin.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Host name or IP literal (no brackets).
    pub host: &'a str,
    /// Port.
    pub port: u16,
    /// A locally resolved address of `host` (used by `socks5://`, which resolves locally).
    pub addr: Option<SocketAddr>,
}

// === impl Target ===

impl Target<'_> {
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A failed proxy handshake or connect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProxyError {
    /// What kind of failure.
    pub kind: ProxyFailureKind,
    /// What happened (never a credential).
    pub message: String,
}

fn err(kind: ProxyFailureKind, message: impl Into<String>) -> ProxyError {
    ProxyError {
        kind,
        message: message.into(),
    }
}

/// Opens a tunnel to `target` through `proxy` within `budget` (TCP connect to each of the
/// proxy's addresses, then the handshake). Checks and updates the proxy's breaker.
pub async fn connect(
    proxy: &ProxyEntry,
    target: Target<'_>,
    budget: Duration,
) -> Result<TcpStream, ProxyError> {
    if !proxy.usable {
        return Err(err(
            ProxyFailureKind::Disabled,
            format!("egress proxy `{}` is disabled or unusable", proxy.name),
        ));
    }
    let now = shared_state::now_ms();
    if !proxy.live.allows(now) {
        return Err(err(
            ProxyFailureKind::BreakerOpen,
            format!("egress proxy `{}` failed recently", proxy.name),
        ));
    }
    let res = connect_inner(proxy, target, budget).await;
    match &res {
        Ok(_) => proxy.live.succeeded(shared_state::now_ms()),
        Err(e) => proxy.live.failed(shared_state::now_ms(), e.message.clone()),
    }
    res
}

async fn connect_inner(
    proxy: &ProxyEntry,
    target: Target<'_>,
    budget: Duration,
) -> Result<TcpStream, ProxyError> {
    let name = &proxy.name;
    let mut last = err(
        ProxyFailureKind::Connect,
        format!(
            "egress proxy `{name}`: host `{}` not resolved",
            proxy.url.host
        ),
    );
    for addr in &proxy.addrs {
        match monoio::time::timeout(budget, TcpStream::connect_addr(*addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                let mut s = s;
                return match monoio::time::timeout(budget, handshake(&mut s, &proxy.url, target))
                    .await
                {
                    Ok(Ok(())) => Ok(s),
                    Ok(Err(e)) => Err(ProxyError {
                        kind: e.kind,
                        message: format!("egress proxy `{name}`: {}", e.message),
                    }),
                    Err(_) => Err(err(
                        ProxyFailureKind::Timeout,
                        format!("egress proxy `{name}`: handshake timed out"),
                    )),
                };
            }
            Ok(Err(e)) => {
                last = err(
                    ProxyFailureKind::Connect,
                    format!("egress proxy `{name}`: connect to {addr}: {e}"),
                )
            }
            Err(_) => {
                last = err(
                    ProxyFailureKind::Timeout,
                    format!("egress proxy `{name}`: connect to {addr} timed out"),
                )
            }
        }
    }
    Err(last)
}

/// Runs the handshake of `url`'s protocol on `io`, asking for a tunnel to `target`. On success
/// `io` is the tunnel: nothing after the proxy's reply was read.
pub async fn handshake<S: AsyncReadRent + AsyncWriteRent>(
    io: &mut S,
    url: &ProxyUrl,
    target: Target<'_>,
) -> Result<(), ProxyError> {
    match url.scheme {
        shared_state::egress::ProxyScheme::Http => http_connect(io, url, target).await,
        shared_state::egress::ProxyScheme::Socks5 => socks5(io, url, target, false).await,
        shared_state::egress::ProxyScheme::Socks5h => socks5(io, url, target, true).await,
    }
}

async fn write<S: AsyncWriteRent>(io: &mut S, bytes: Vec<u8>) -> Result<(), ProxyError> {
    let (res, _) = io.write_all(bytes).await;
    res.map(|_| ())
        .map_err(|e| err(ProxyFailureKind::Connect, format!("write to proxy: {e}")))
}

/// Appends at most `n` bytes from one read to `buf`; `Ok(0)` is EOF.
async fn read_at_most<S: AsyncReadRent>(
    io: &mut S,
    buf: &mut Vec<u8>,
    n: usize,
) -> Result<usize, ProxyError> {
    buf.reserve(n);
    let len = buf.len();
    let slice = std::mem::take(buf).slice_mut(len..len + n);
    let (res, slice) = io.read(slice).await;
    *buf = slice.into_inner();
    res.map_err(|e| err(ProxyFailureKind::Connect, format!("read from proxy: {e}")))
}

/// Reads exactly `n` more bytes into `buf` (never more).
async fn read_exact<S: AsyncReadRent>(
    io: &mut S,
    buf: &mut Vec<u8>,
    n: usize,
) -> Result<(), ProxyError> {
    let end = buf.len() + n;
    while buf.len() < end {
        let want = end - buf.len();
        if read_at_most(io, buf, want).await? == 0 {
            return Err(err(
                ProxyFailureKind::Protocol,
                "proxy closed the connection during the handshake",
            ));
        }
    }
    Ok(())
}

/// How many bytes of `\r\n\r\n` the end of `buf` already holds.
fn terminator_matched(buf: &[u8]) -> usize {
    const T: &[u8] = b"\r\n\r\n";
    (1..=3).rev().find(|&k| buf.ends_with(&T[..k])).unwrap_or(0)
}

async fn http_connect<S: AsyncReadRent + AsyncWriteRent>(
    io: &mut S,
    url: &ProxyUrl,
    target: Target<'_>,
) -> Result<(), ProxyError> {
    let authority = target.authority();
    let mut req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(user) = &url.username {
        let pass = url.password.as_ref().map_or("", |p| p.expose());
        let cred = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        req.push_str("Proxy-Authorization: Basic ");
        req.push_str(&cred);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    write(io, req.into_bytes()).await?;

    // Never read past the blank line: what follows belongs to the tunnel.
    let mut buf = Vec::with_capacity(256);
    while !buf.ends_with(b"\r\n\r\n") {
        if buf.len() >= MAX_HEAD {
            return Err(err(
                ProxyFailureKind::Protocol,
                "proxy reply head too large",
            ));
        }
        let want = 4 - terminator_matched(&buf);
        if read_at_most(io, &mut buf, want).await? == 0 {
            return Err(err(
                ProxyFailureKind::Protocol,
                "proxy closed the connection before its CONNECT reply",
            ));
        }
    }
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut hs);
    match resp.parse(&buf) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => {
            return Err(err(
                ProxyFailureKind::Protocol,
                "malformed proxy CONNECT reply",
            ))
        }
    }
    match resp.code.unwrap_or(0) {
        200..=299 => Ok(()),
        407 => Err(err(
            ProxyFailureKind::Auth,
            "proxy refused the credentials (407)",
        )),
        code => Err(err(
            ProxyFailureKind::Refused,
            format!("proxy answered CONNECT with {code}"),
        )),
    }
}

fn socks_reply(code: u8) -> &'static str {
    match code {
        1 => "general SOCKS server failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unknown reply code",
    }
}

async fn socks5<S: AsyncReadRent + AsyncWriteRent>(
    io: &mut S,
    url: &ProxyUrl,
    target: Target<'_>,
    remote_dns: bool,
) -> Result<(), ProxyError> {
    let proto = |m: &str| err(ProxyFailureKind::Protocol, m.to_owned());
    let creds = url.username.as_deref().map(|u| {
        (
            u.as_bytes(),
            url.password
                .as_ref()
                .map_or(&b""[..], |p| p.expose().as_bytes()),
        )
    });
    // Greeting: no authentication, plus username/password when we have credentials.
    write(
        io,
        if creds.is_some() {
            vec![5, 2, 0, 2]
        } else {
            vec![5, 1, 0]
        },
    )
    .await?;
    let mut buf = Vec::with_capacity(32);
    read_exact(io, &mut buf, 2).await?;
    if buf[0] != 5 {
        return Err(proto("not a SOCKS5 proxy"));
    }
    match (buf[1], creds) {
        (0, _) => {}
        (2, Some((user, pass))) => {
            let mut auth = Vec::with_capacity(3 + user.len() + pass.len());
            auth.push(1);
            auth.push(user.len() as u8);
            auth.extend_from_slice(user);
            auth.push(pass.len() as u8);
            auth.extend_from_slice(pass);
            write(io, auth).await?;
            buf.clear();
            read_exact(io, &mut buf, 2).await?;
            if buf[1] != 0 {
                return Err(err(
                    ProxyFailureKind::Auth,
                    "SOCKS5 proxy refused the credentials",
                ));
            }
        }
        (0xff, _) | (2, None) => {
            return Err(err(
                ProxyFailureKind::Auth,
                "SOCKS5 proxy accepts none of our authentication methods",
            ))
        }
        _ => return Err(proto("SOCKS5 proxy chose a method we did not offer")),
    }

    let mut req = vec![5, 1, 0];
    let ip = target.host.parse::<IpAddr>().ok().or_else(|| {
        (!remote_dns)
            .then_some(target.addr.map(|a| a.ip()))
            .flatten()
    });
    match ip {
        Some(IpAddr::V4(v4)) => {
            req.push(1);
            req.extend_from_slice(&v4.octets());
        }
        Some(IpAddr::V6(v6)) => {
            req.push(4);
            req.extend_from_slice(&v6.octets());
        }
        None => {
            let host = target.host.as_bytes();
            if host.len() > 255 {
                return Err(proto("target host name too long for SOCKS5"));
            }
            req.push(3);
            req.push(host.len() as u8);
            req.extend_from_slice(host);
        }
    }
    req.extend_from_slice(&target.port.to_be_bytes());
    write(io, req).await?;

    buf.clear();
    read_exact(io, &mut buf, 4).await?;
    if buf[0] != 5 {
        return Err(proto("malformed SOCKS5 reply"));
    }
    if buf[1] != 0 {
        return Err(err(
            ProxyFailureKind::Refused,
            format!("SOCKS5 proxy: {} ({})", socks_reply(buf[1]), buf[1]),
        ));
    }
    // The bound address, read to its exact end.
    let rest = match buf[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            buf.clear();
            read_exact(io, &mut buf, 1).await?;
            usize::from(buf[0]) + 2
        }
        _ => return Err(proto("SOCKS5 reply with an unknown address type")),
    };
    buf.clear();
    read_exact(io, &mut buf, rest).await
}

#[cfg(test)]
mod tests;
