//! Egress proxies on the sidecar side (issue 14): what the publisher puts in the snapshot,
//! the proxied HTTP clients of the sidecar's own upstream calls (token refresh, quota polling)
//! and the admin "test" action.
//!
//! # Key Components
//! - [`EgressInput`] / [`EgressBook`]: the stored proxies and assignments, turned into one
//!   [`ProxyEntry`] per proxy (addresses resolved here: workers never resolve names; the
//!   process-lifetime [`ProxyLive`] reused across snapshots) and each account's egress. A
//!   pool assignment picks one enabled proxy of the pool per account by rendezvous hashing,
//!   preferring proxies whose breaker is closed.
//! - [`EgressClients`]: one reqwest client per egress key (reqwest's `Proxy` with the URL's
//!   credentials), so an account's refresh and quota calls leave through its proxy.
//! - [`test_proxy`]: connects through a proxy to the upstream origin and reports latency or
//!   the error.
//!
//! # Error handling
//! An account assigned to a proxy that is disabled, unparsable or whose password does not
//! decrypt (or to a pool with no usable proxy) gets an unusable egress: its requests fail as
//! proxy failures. It never silently goes direct.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use shared_state::{ProxyEntry, ProxyLive, ProxyUrl};

use crate::{
    error::StorageError,
    storage::{
        proxies::{ProxyAssignment, ProxyCheck, ProxyRow},
        Storage,
    },
};

/// How long resolving a proxy host may take at publish time.
const RESOLVE_BUDGET: Duration = Duration::from_secs(2);

/// Stored proxies and assignments.
#[derive(Debug, Default)]
pub struct EgressInput {
    /// Every proxy.
    pub proxies: Vec<ProxyRow>,
    /// Account id -> assignment.
    pub assignments: Vec<(i64, ProxyAssignment)>,
}

// === impl EgressInput ===

impl EgressInput {
    /// Reads both tables.
    pub async fn load(storage: &dyn Storage) -> Result<Self, StorageError> {
        let store = storage.proxies();
        Ok(Self {
            proxies: store.list_proxies().await?,
            assignments: store.list_proxy_assignments().await?,
        })
    }

    /// A hash of everything the snapshot takes from them.
    pub fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for p in &self.proxies {
            p.id.hash(&mut h);
            p.name.hash(&mut h);
            p.url.hash(&mut h);
            p.password.as_ref().map(|s| s.expose()).hash(&mut h);
            p.decrypt_failed.hash(&mut h);
            p.pool.hash(&mut h);
            p.enabled.hash(&mut h);
        }
        self.assignments.hash(&mut h);
        h.finish()
    }
}

impl Hash for ProxyAssignment {
    fn hash<H: Hasher>(&self, h: &mut H) {
        match self {
            Self::Direct => 0u8.hash(h),
            Self::Proxy(id) => (1u8, id).hash(h),
            Self::Pool(p) => (2u8, p).hash(h),
        }
    }
}

/// The process-lifetime health of every proxy, by id (shared by the publisher and the admin
/// API).
#[derive(Debug, Default)]
pub struct EgressBook {
    lives: Mutex<HashMap<i64, Arc<ProxyLive>>>,
}

// === impl EgressBook ===

impl EgressBook {
    /// The live health of a proxy (created on first use).
    pub fn live(&self, id: i64) -> Arc<ProxyLive> {
        Arc::clone(
            self.lives
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(id)
                .or_default(),
        )
    }

    /// Builds one entry per proxy and each assigned account's egress.
    pub async fn build(&self, input: &EgressInput) -> HashMap<i64, Arc<ProxyEntry>> {
        let mut resolved: HashMap<(String, u16), Vec<SocketAddr>> = HashMap::new();
        let mut entries: HashMap<i64, (Arc<ProxyEntry>, Option<String>)> = HashMap::new();
        for row in &input.proxies {
            let usable = row.enabled && !row.decrypt_failed;
            let url = match row.parsed() {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!(proxy = row.id, error = %e, "stored proxy URL does not parse");
                    continue;
                }
            };
            if row.decrypt_failed {
                tracing::error!(
                    proxy = row.id,
                    "stored proxy password does not decrypt with the current secret key; proxy unusable"
                );
            }
            let addrs = if usable {
                let k = (url.host.clone(), url.port);
                match resolved.get(&k) {
                    Some(a) => a.clone(),
                    None => {
                        let a = resolve(&url).await;
                        resolved.insert(k, a.clone());
                        a
                    }
                }
            } else {
                Vec::new()
            };
            let mut e = ProxyEntry::new(row.id, row.name.clone(), url, addrs, self.live(row.id));
            e.usable = usable;
            entries.insert(row.id, (Arc::new(e), row.pool.clone().filter(|_| usable)));
        }
        let now = shared_state::now_ms();
        let mut out = HashMap::with_capacity(input.assignments.len());
        for (account, a) in &input.assignments {
            let egress = match a {
                ProxyAssignment::Direct => continue,
                ProxyAssignment::Proxy(id) => match entries.get(id) {
                    Some((e, _)) => Arc::clone(e),
                    None => unusable(&format!("proxy #{id}")),
                },
                ProxyAssignment::Pool(name) => {
                    let members: Vec<&Arc<ProxyEntry>> = entries
                        .values()
                        .filter(|(_, pool)| pool.as_deref() == Some(name))
                        .map(|(e, _)| e)
                        .collect();
                    let healthy: Vec<&Arc<ProxyEntry>> = members
                        .iter()
                        .copied()
                        .filter(|e| e.live.allows(now))
                        .collect();
                    let from = if healthy.is_empty() {
                        &members
                    } else {
                        &healthy
                    };
                    match from.iter().max_by_key(|e| rendezvous(*account, e.id)) {
                        Some(e) => Arc::clone(e),
                        None => unusable(&format!("pool `{name}`")),
                    }
                }
            };
            out.insert(*account, egress);
        }
        out
    }
}

/// An egress that refuses every connect (see the module's error handling).
fn unusable(what: &str) -> Arc<ProxyEntry> {
    let url = ProxyUrl {
        scheme: shared_state::egress::ProxyScheme::Http,
        host: "0.0.0.0".into(),
        port: 9,
        username: None,
        password: None,
    };
    let mut e = ProxyEntry::new(0, what.to_owned(), url, Vec::new(), Arc::default());
    e.usable = false;
    Arc::new(e)
}

fn rendezvous(account: i64, proxy: i64) -> u64 {
    let mut h = DefaultHasher::new();
    (account, proxy, "codex-gateway/egress").hash(&mut h);
    h.finish()
}

/// The proxy host's addresses (an IP literal as is; a name within [`RESOLVE_BUDGET`]).
async fn resolve(url: &ProxyUrl) -> Vec<SocketAddr> {
    if let Ok(ip) = url.host.parse::<IpAddr>() {
        return vec![SocketAddr::new(ip, url.port)];
    }
    match tokio::time::timeout(
        RESOLVE_BUDGET,
        tokio::net::lookup_host((url.host.as_str(), url.port)),
    )
    .await
    {
        Ok(Ok(a)) => a.collect(),
        Ok(Err(e)) => {
            tracing::warn!(host = %url.host, error = %e, "cannot resolve egress proxy host");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(host = %url.host, "resolving egress proxy host timed out");
            Vec::new()
        }
    }
}

/// The sidecar's HTTP clients per egress.
#[derive(Debug)]
pub struct EgressClients {
    ca: Option<PathBuf>,
    cache: Mutex<HashMap<u64, reqwest::Client>>,
}

// === impl EgressClients ===

impl EgressClients {
    /// Clients trusting the webpki roots plus `ca`.
    pub fn new(ca: Option<PathBuf>) -> Self {
        Self {
            ca,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The client that leaves through `proxy` (built once per egress key).
    pub fn client(&self, proxy: &ProxyEntry) -> Result<reqwest::Client, String> {
        if !proxy.usable {
            return Err(format!("egress proxy `{}` is not usable", proxy.name));
        }
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = cache.get(&proxy.key) {
            return Ok(c.clone());
        }
        let c = crate::oauth::build_http_client_via(self.ca.as_deref(), Some(&proxy.url))?;
        cache.insert(proxy.key, c.clone());
        Ok(c)
    }
}

/// Connects through `url` to `origin` (`GET`; any HTTP answer but the proxy's 407 counts: the
/// origin was reached) and reports the outcome.
pub async fn test_proxy(url: &ProxyUrl, ca: Option<&std::path::Path>, origin: &str) -> ProxyCheck {
    let started = Instant::now();
    let res = async {
        let client = crate::oauth::build_http_client_via(ca, Some(url))?;
        let resp = client
            .get(origin)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| crate::oauth::describe_reqwest(&e))?;
        // A forward proxy answers an `http://` origin's request itself when it refuses us.
        if resp.status() == reqwest::StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            return Err("the proxy refused the credentials (407)".to_owned());
        }
        Ok::<u16, String>(resp.status().as_u16())
    }
    .await;
    let latency_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    ProxyCheck {
        ok: res.is_ok(),
        latency_ms,
        error: res.err().map(|e| redact(&e, url)),
        at: crate::storage::now_ms_i64(),
    }
}

/// Removes the proxy's password from an error text, should a library echo the URL.
fn redact(text: &str, url: &ProxyUrl) -> String {
    match &url.password {
        Some(p) if !p.is_empty() => text.replace(p.expose(), "<redacted>"),
        _ => text.to_owned(),
    }
}
