//! Egress proxies: how an account's upstream connections leave the host (issue 14).
//!
//! # Key Components
//! - [`ProxyUrl`]: a parsed `http://user:pass@host:port`, `socks5://...` or `socks5h://...`
//!   URL (the one parser the admin API, the publisher and the sidecar's HTTP client use); its
//!   password is a [`Secret`] and never reaches `Debug`.
//! - [`ProxyEntry`]: a proxy as the data plane sees it in the snapshot (the parsed URL, the
//!   addresses the sidecar resolved, the egress key pools are keyed by, and its
//!   [`ProxyLive`]).
//! - [`ProxyLive`]: process-lifetime health of one proxy shared by every worker and the
//!   sidecar: a short breaker opened by a failure (connect refused, auth rejected, timeout),
//!   failure/success counters and the last error. A proxy's failure is never its account's.
//!
//! # Usage
//! `AccountEntry::egress` is `None` for a direct account. Connection pools are keyed by
//! [`ProxyEntry::key`] (0 = direct), so a connection through one proxy never carries another
//! egress's requests.

use std::{
    fmt,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use arc_swap::ArcSwapOption;

use crate::Secret;

/// The egress key of direct connections.
pub const DIRECT: u64 = 0;

/// How long a failed proxy's breaker stays open (connects through it fail fast meanwhile;
/// the first one after it closes probes the proxy again).
pub const BREAKER_OPEN_MS: u64 = 5_000;

/// The proxy protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyScheme {
    /// HTTP `CONNECT` tunnels (`http://`).
    Http,
    /// SOCKS5, the target address resolved locally (`socks5://`).
    Socks5,
    /// SOCKS5, the target host name resolved by the proxy (`socks5h://`).
    Socks5h,
}

// === impl ProxyScheme ===

impl ProxyScheme {
    /// The URL scheme.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Socks5 => "socks5",
            Self::Socks5h => "socks5h",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Http => 8080,
            Self::Socks5 | Self::Socks5h => 1080,
        }
    }
}

/// Why a proxy URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid proxy URL: {0}")]
pub struct ProxyUrlError(pub String);

/// A parsed proxy URL.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    /// Protocol.
    pub scheme: ProxyScheme,
    /// Host name or IP literal (no brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// User name (percent-decoded), when the proxy wants credentials.
    pub username: Option<String>,
    /// Password (percent-decoded).
    pub password: Option<Secret>,
}

// === impl ProxyUrl ===

impl ProxyUrl {
    /// Parses `scheme://[user[:password]@]host[:port][/]`; `scheme` is `http`, `socks5` or
    /// `socks5h`. User and password may be percent-encoded.
    pub fn parse(url: &str) -> Result<Self, ProxyUrlError> {
        let bad = |m: &str| ProxyUrlError(m.to_owned());
        let url = url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://host:port"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => ProxyScheme::Http,
            "socks5" => ProxyScheme::Socks5,
            "socks5h" => ProxyScheme::Socks5h,
            "https" => {
                return Err(bad(
                    "https:// proxies are not supported (use http:// CONNECT)",
                ))
            }
            other => return Err(ProxyUrlError(format!("unsupported scheme `{other}`"))),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(bad("a proxy URL has no path, query or fragment"));
        }
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = match u.split_once(':') {
                    Some((a, b)) => (a, Some(b)),
                    None => (u, None),
                };
                let user = percent_decode(user).ok_or_else(|| bad("bad percent-encoding"))?;
                if user.is_empty() {
                    return Err(bad("empty user name"));
                }
                let pass = pass
                    .map(|p| percent_decode(p).ok_or_else(|| bad("bad percent-encoding")))
                    .transpose()?;
                if user.len() > 255 || pass.as_ref().is_some_and(|p| p.len() > 255) {
                    return Err(bad("user name and password are at most 255 bytes"));
                }
                (Some(user), pass.map(Secret::from))
            }
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in host"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected :port after ]"))?,
                ),
            };
            (h, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty()
            || host.len() > 253
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
        {
            return Err(bad("bad host"));
        }
        let port = match port {
            None => scheme.default_port(),
            Some(p) => Some(p)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("bad port"))?,
        };
        Ok(Self {
            scheme,
            host: host.to_owned(),
            port,
            username,
            password,
        })
    }

    /// `host:port` (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL without its password (`scheme://user@host:port`): what the admin API shows.
    pub fn redacted(&self) -> String {
        match &self.username {
            Some(u) => format!(
                "{}://{}@{}",
                self.scheme.as_str(),
                percent_encode(u),
                self.authority()
            ),
            None => format!("{}://{}", self.scheme.as_str(), self.authority()),
        }
    }

    /// The full URL with credentials, percent-encoded: only for the sidecar's HTTP client.
    pub fn expose(&self) -> String {
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => format!(
                "{}://{}:{}@{}",
                self.scheme.as_str(),
                percent_encode(u),
                percent_encode(p.expose()),
                self.authority()
            ),
            _ => self.redacted(),
        }
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyUrl")
            .field("url", &self.redacted())
            .field("password", &self.password)
            .finish()
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One egress proxy as the data plane sees it.
pub struct ProxyEntry {
    /// Storage id.
    pub id: i64,
    /// Operator-given name.
    pub name: String,
    /// The parsed URL (credentials included, redacted in `Debug`).
    pub url: ProxyUrl,
    /// The proxy's addresses, resolved by the sidecar (workers never resolve names).
    pub addrs: Vec<SocketAddr>,
    /// The egress key connection pools are keyed by: never [`DIRECT`], different whenever the
    /// id, the URL or the credentials differ.
    pub key: u64,
    /// Health shared by every worker and the sidecar, across snapshots.
    pub live: Arc<ProxyLive>,
    /// False when its accounts must not connect at all (the proxy is disabled, its password
    /// does not decrypt, or its pool has no usable proxy): never direct instead.
    pub usable: bool,
}

// === impl ProxyEntry ===

impl ProxyEntry {
    /// An entry; `key` is derived from the id and the full URL.
    pub fn new(
        id: i64,
        name: String,
        url: ProxyUrl,
        addrs: Vec<SocketAddr>,
        live: Arc<ProxyLive>,
    ) -> Self {
        let key = egress_key(id, &url.expose());
        Self {
            id,
            name,
            url,
            addrs,
            key,
            live,
            usable: true,
        }
    }
}

impl fmt::Debug for ProxyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyEntry")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("url", &self.url)
            .field("addrs", &self.addrs)
            .field("usable", &self.usable)
            .finish_non_exhaustive()
    }
}

/// FNV-1a over the id and the URL; never [`DIRECT`].
fn egress_key(id: i64, url: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.to_le_bytes().iter().chain(url.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// What kind of proxy failure happened (metric label, admin API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyFailureKind {
    /// The proxy itself could not be reached (refused, unreachable).
    Connect,
    /// The proxy refused our credentials (HTTP 407, SOCKS5 auth failure or no acceptable
    /// method).
    Auth,
    /// The proxy answered but would not open the tunnel (HTTP status, SOCKS5 reply code).
    Refused,
    /// No answer in time.
    Timeout,
    /// The proxy's answer was malformed.
    Protocol,
    /// The breaker is open after a recent failure: not tried.
    BreakerOpen,
    /// The proxy is disabled or unusable (see [`ProxyEntry::usable`]): not tried.
    Disabled,
}

// === impl ProxyFailureKind ===

impl ProxyFailureKind {
    /// Every kind, in label order.
    pub const ALL: [ProxyFailureKind; 7] = [
        Self::Connect,
        Self::Auth,
        Self::Refused,
        Self::Timeout,
        Self::Protocol,
        Self::BreakerOpen,
        Self::Disabled,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Auth => "auth",
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Protocol => "protocol",
            Self::BreakerOpen => "breaker_open",
            Self::Disabled => "disabled",
        }
    }
}

/// Health of one proxy, shared by every worker and the sidecar.
#[derive(Debug, Default)]
pub struct ProxyLive {
    /// The breaker is open until this time (ms since epoch; 0: closed).
    open_until_ms: AtomicU64,
    failures: AtomicU64,
    successes: AtomicU64,
    last_failure_ms: AtomicU64,
    last_ok_ms: AtomicU64,
    last_error: ArcSwapOption<String>,
}

/// A point-in-time view of [`ProxyLive`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProxyHealth {
    /// `ok`, `failing` (breaker open) or `unknown` (never used).
    pub state: &'static str,
    /// Failed connects through the proxy since start.
    pub failures: u64,
    /// Tunnels opened since start.
    pub successes: u64,
    /// Last failure (ms since epoch).
    pub last_failure_ms: Option<u64>,
    /// Last tunnel opened (ms since epoch).
    pub last_ok_ms: Option<u64>,
    /// The last failure's description (never a credential).
    pub last_error: Option<String>,
}

// === impl ProxyLive ===

impl ProxyLive {
    /// Until when (ms since epoch) the breaker stays open; 0 or a past instant: closed.
    pub fn open_until_ms(&self) -> u64 {
        self.open_until_ms.load(Ordering::Acquire)
    }

    /// Whether a connect through the proxy may be tried at `now_ms` (breaker closed).
    pub fn allows(&self, now_ms: u64) -> bool {
        now_ms >= self.open_until_ms.load(Ordering::Acquire)
    }

    /// A connect through the proxy failed: the breaker opens for [`BREAKER_OPEN_MS`].
    pub fn failed(&self, now_ms: u64, error: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.last_failure_ms.store(now_ms.max(1), Ordering::Relaxed);
        self.last_error.store(Some(Arc::new(error)));
        self.open_until_ms
            .store(now_ms + BREAKER_OPEN_MS, Ordering::Release);
    }

    /// A tunnel opened: the breaker closes.
    pub fn succeeded(&self, now_ms: u64) {
        self.successes.fetch_add(1, Ordering::Relaxed);
        self.last_ok_ms.store(now_ms.max(1), Ordering::Relaxed);
        if self.open_until_ms.load(Ordering::Relaxed) != 0 {
            self.open_until_ms.store(0, Ordering::Release);
        }
    }

    /// A view for the admin API.
    pub fn health(&self, now_ms: u64) -> ProxyHealth {
        let nz = |v: u64| (v != 0).then_some(v);
        let last_failure_ms = nz(self.last_failure_ms.load(Ordering::Relaxed));
        let last_ok_ms = nz(self.last_ok_ms.load(Ordering::Relaxed));
        let state = if !self.allows(now_ms) || last_failure_ms > last_ok_ms {
            "failing"
        } else if last_ok_ms.is_some() {
            "ok"
        } else {
            "unknown"
        };
        ProxyHealth {
            state,
            failures: self.failures.load(Ordering::Relaxed),
            successes: self.successes.load(Ordering::Relaxed),
            last_failure_ms,
            last_ok_ms,
            last_error: self.last_error.load_full().map(|e| (*e).clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_schemes() {
        let u = ProxyUrl::parse("http://alice:s%3Acret@proxy.example:3128").unwrap();
        assert_eq!(u.scheme, ProxyScheme::Http);
        assert_eq!((u.host.as_str(), u.port), ("proxy.example", 3128));
        assert_eq!(u.username.as_deref(), Some("alice"));
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("s:cret"));
        assert_eq!(u.redacted(), "http://alice@proxy.example:3128");
        assert_eq!(u.expose(), "http://alice:s%3Acret@proxy.example:3128");
        assert_eq!(ProxyUrl::parse(&u.expose()).unwrap(), u);

        let s = ProxyUrl::parse("socks5://127.0.0.1").unwrap();
        assert_eq!(
            (s.scheme, s.port, s.username.is_none()),
            (ProxyScheme::Socks5, 1080, true)
        );
        let h = ProxyUrl::parse("SOCKS5H://[::1]:9050/").unwrap();
        assert_eq!(
            (h.scheme, h.host.as_str(), h.port),
            (ProxyScheme::Socks5h, "::1", 9050)
        );
        assert_eq!(h.authority(), "[::1]:9050");
    }

    #[test]
    fn refuses_bad_urls() {
        for bad in [
            "proxy:8080",
            "ftp://h:1",
            "https://h:1",
            "http://h:0",
            "http://h:99999",
            "http://h:1/path",
            "http://:pw@h:1",
            "http://u:%zz@h:1",
            "http://ho st:1",
            "http://[::1:1",
        ] {
            assert!(ProxyUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_never_shows_the_password() {
        let u = ProxyUrl::parse("socks5://bob:hunter2@10.0.0.1:1080").unwrap();
        let e = ProxyEntry::new(1, "p".into(), u.clone(), vec![], Arc::default());
        for s in [format!("{u:?}"), format!("{e:?}")] {
            assert!(!s.contains("hunter2"), "{s}");
            assert!(s.contains("bob"), "{s}");
        }
    }

    #[test]
    fn egress_keys_differ_by_id_url_and_credentials() {
        let a = ProxyUrl::parse("http://u:a@h:1").unwrap();
        let b = ProxyUrl::parse("http://u:b@h:1").unwrap();
        let k = |id, u: &ProxyUrl| {
            ProxyEntry::new(id, "p".into(), u.clone(), vec![], Arc::default()).key
        };
        assert_ne!(k(1, &a), DIRECT);
        assert_eq!(k(1, &a), k(1, &a));
        assert_ne!(k(1, &a), k(2, &a));
        assert_ne!(k(1, &a), k(1, &b));
    }

    #[test]
    fn breaker_opens_on_failure_and_closes_on_success() {
        let l = ProxyLive::default();
        assert!(l.allows(1_000));
        assert_eq!(l.health(1_000).state, "unknown");
        l.failed(1_000, "407".into());
        assert!(!l.allows(1_001));
        assert!(l.allows(1_000 + BREAKER_OPEN_MS));
        let h = l.health(1_001);
        assert_eq!(
            (h.state, h.failures, h.last_error.as_deref()),
            ("failing", 1, Some("407"))
        );
        l.succeeded(2_000);
        assert!(l.allows(2_000));
        assert_eq!(l.health(2_001).state, "ok");
    }
}
