//! State shared by every connection of one mock: config, counters, the account registry and
//! the recorded requests.
//!
//! # Key Components
//! - [`Shared`]: immutable config plus atomics (read on every request) and one `Mutex<Inner>`
//!   taken briefly for account and recording updates.
//! - [`AccountState`]: tokens, behaviour and quota of one `chatgpt_account_id`.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::SocketAddr,
    sync::{
        atomic::{AtomicU16, AtomicUsize},
        Mutex, MutexGuard,
    },
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use rand::Rng;

use super::{ws::WsCommand, Behaviour, MockAccount, MockConfig, RecordedRequest};

/// Primary (5 h) window length in minutes.
pub(crate) const PRIMARY_WINDOW_MIN: u64 = 300;
/// Secondary (weekly) window length in minutes.
pub(crate) const SECONDARY_WINDOW_MIN: u64 = 10_080;

/// Locks a mutex, recovering the data of a poisoned one (a panicking test thread must not
/// take the mock down with it).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unix time in seconds.
pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `2 * bytes` random lowercase hex characters.
pub(crate) fn rand_hex(bytes: usize) -> String {
    use std::fmt::Write;
    let mut rng = rand::rng();
    let mut s = String::with_capacity(bytes * 2);
    for _ in 0..bytes {
        let b: u8 = rng.random();
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Counters read by [`super::MockHandle`] without taking the lock.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) token_calls: AtomicUsize,
    /// [`super::MockHandle::set_token_delay`]: the token endpoint's delay in ms plus one
    /// (0: the configured `token_delay`).
    pub(crate) token_delay_ms_plus_one: std::sync::atomic::AtomicU64,
    pub(crate) active_streams: AtomicUsize,
    pub(crate) completed_streams: AtomicUsize,
    pub(crate) responses: AtomicUsize,
    /// WebSocket handshakes answered with 101.
    pub(crate) ws_handshakes: AtomicUsize,
    /// WebSocket handshakes answered with an HTTP error (refused, auth, bad key).
    pub(crate) ws_rejected: AtomicUsize,
    /// WebSocket sockets currently open.
    pub(crate) ws_open: AtomicUsize,
    /// `response.create` frames received.
    pub(crate) ws_requests: AtomicUsize,
    /// `response.create` frames answered with a response (`response.created` sent).
    pub(crate) ws_responses: AtomicUsize,
}

/// Everything one running mock shares between its connections.
pub(crate) struct Shared {
    pub(crate) cfg: MockConfig,
    /// Normalized prefix: empty or `/x/y` without a trailing slash.
    pub(crate) prefix: String,
    pub(crate) responses_path: String,
    pub(crate) models_path: String,
    pub(crate) addr: SocketAddr,
    /// `http(s)://host:port`.
    pub(crate) origin: String,
    pub(crate) started: Instant,
    pub(crate) started_unix: u64,
    /// Quoted strong ETag of [`super::MODELS_CATALOG`].
    pub(crate) catalog_etag: String,
    pub(crate) counters: Counters,
    /// `0`, or the HTTP status answered to WebSocket upgrades instead of 101 (set from
    /// [`MockConfig::ws_refuse_upgrade`], changed by [`super::MockHandle::set_ws_refuse_upgrade`]).
    pub(crate) ws_refuse_upgrade: AtomicU16,
    /// Commands to every open WebSocket socket (kill, close).
    pub(crate) ws_control: tokio::sync::broadcast::Sender<WsCommand>,
    inner: Mutex<Inner>,
}

/// The mutable part, behind [`Shared::lock`].
#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) accounts: HashMap<String, AccountState>,
    /// Every refresh token ever issued, current or rotated away.
    pub(crate) refresh_tokens: HashMap<String, RefreshEntry>,
    pub(crate) requests: VecDeque<RecordedRequest>,
    pub(crate) token_requests: VecDeque<RecordedRequest>,
    pub(crate) models_requests: VecDeque<RecordedRequest>,
    pub(crate) used_codes: HashSet<String>,
}

/// The request logs of [`Shared::record_in`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Log {
    /// `/responses`.
    Responses,
    /// The OAuth token endpoint.
    Token,
    /// The model catalog (`GET {prefix}/models`).
    Models,
}

/// Which account a refresh token belongs to, and whether it was already rotated away.
pub(crate) struct RefreshEntry {
    pub(crate) account_id: String,
    pub(crate) rotated: bool,
}

/// Tokens, behaviour and quota of one account.
pub(crate) struct AccountState {
    pub(crate) account: MockAccount,
    /// Set by `add_account` / the code exchange; behaviour-only entries are not registered.
    pub(crate) registered: bool,
    pub(crate) access_token: Option<String>,
    pub(crate) access_exp: u64,
    pub(crate) refresh_token: Option<String>,
    pub(crate) id_token: Option<String>,
    pub(crate) behaviour: Option<Behaviour>,
    /// How many times the behaviour was applied (for `fail_times`).
    pub(crate) behaviour_uses: u32,
    pub(crate) quota: Option<(f64, f64)>,
    /// `rate_limit_reset_credits.available_count` in `/wham/usage` (issue 27).
    pub(crate) reset_credits: u64,
}

// === impl Shared ===

impl Shared {
    pub(crate) fn new(cfg: MockConfig, addr: SocketAddr, tls: bool) -> Self {
        let prefix = normalize_prefix(&cfg.prefix);
        let host = if addr.ip().is_unspecified() {
            match addr {
                SocketAddr::V4(_) => format!("127.0.0.1:{}", addr.port()),
                SocketAddr::V6(_) => format!("[::1]:{}", addr.port()),
            }
        } else {
            addr.to_string()
        };
        let origin = format!("{}://{host}", if tls { "https" } else { "http" });
        let mut inner = Inner::default();
        for (id, b) in &cfg.account_behaviours {
            inner.account_mut(id, &cfg).behaviour = Some(b.clone());
        }
        Self {
            responses_path: format!("{prefix}/responses"),
            models_path: format!("{prefix}/models"),
            prefix,
            addr,
            origin,
            started: Instant::now(),
            started_unix: now_unix(),
            catalog_etag: catalog_etag(),
            counters: Counters::default(),
            ws_refuse_upgrade: AtomicU16::new(cfg.ws_refuse_upgrade.unwrap_or(0)),
            ws_control: tokio::sync::broadcast::channel(16).0,
            inner: Mutex::new(inner),
            cfg,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn set_behaviour(&self, account_id: &str, b: Option<Behaviour>) {
        let mut inner = self.lock();
        let st = inner.account_mut(account_id, &self.cfg);
        st.behaviour = b;
        st.behaviour_uses = 0;
    }

    /// Records a request, keeping at most `max_recorded`.
    pub(crate) fn record(&self, req: RecordedRequest, token: bool) {
        self.record_in(req, if token { Log::Token } else { Log::Responses });
    }

    /// Records a request in one of the logs, keeping at most `max_recorded`.
    pub(crate) fn record_in(&self, req: RecordedRequest, log: Log) {
        let max = self.cfg.max_recorded;
        if max == 0 {
            return;
        }
        let mut inner = self.lock();
        let q = match log {
            Log::Responses => &mut inner.requests,
            Log::Token => &mut inner.token_requests,
            Log::Models => &mut inner.models_requests,
        };
        while q.len() >= max {
            q.pop_front();
        }
        q.push_back(req);
    }

    /// `(used_percent, reset_at)` of the primary and secondary windows of an account.
    pub(crate) fn quota(&self, account_id: Option<&str>) -> QuotaView {
        let (p, s, plan) = {
            let inner = self.lock();
            match account_id.and_then(|id| inner.accounts.get(id)) {
                Some(st) => {
                    let (p, s) = st.quota.unwrap_or(self.cfg.default_quota);
                    (p, s, st.account.plan_type.clone())
                }
                None => (
                    self.cfg.default_quota.0,
                    self.cfg.default_quota.1,
                    self.cfg.default_plan_type.clone(),
                ),
            }
        };
        let now = now_unix();
        QuotaView {
            primary_pct: p,
            secondary_pct: s,
            primary_reset_at: self.window_reset_at(PRIMARY_WINDOW_MIN * 60, now),
            secondary_reset_at: self.window_reset_at(SECONDARY_WINDOW_MIN * 60, now),
            plan_type: plan,
            now,
        }
    }

    /// Windows start when the mock starts and roll over every `len` seconds.
    fn window_reset_at(&self, len: u64, now: u64) -> u64 {
        let since = now.saturating_sub(self.started_unix);
        self.started_unix + (since / len + 1) * len
    }
}

/// Quota numbers of one account at one instant.
pub(crate) struct QuotaView {
    pub(crate) primary_pct: f64,
    pub(crate) secondary_pct: f64,
    pub(crate) primary_reset_at: u64,
    pub(crate) secondary_reset_at: u64,
    pub(crate) plan_type: String,
    pub(crate) now: u64,
}

// === impl Inner ===

impl Inner {
    /// The state of an account, created (unregistered) on first use.
    pub(crate) fn account_mut(&mut self, id: &str, cfg: &MockConfig) -> &mut AccountState {
        self.accounts
            .entry(id.to_owned())
            .or_insert_with(|| AccountState {
                account: MockAccount::new(id).with_plan(cfg.default_plan_type.clone()),
                registered: false,
                access_token: None,
                access_exp: 0,
                refresh_token: None,
                id_token: None,
                behaviour: None,
                behaviour_uses: 0,
                quota: None,
                reset_credits: 0,
            })
    }

    /// The behaviour of an account if it still applies (consuming one of its `fail_times`),
    /// considering only behaviours for which `relevant` holds.
    pub(crate) fn take_behaviour(
        &mut self,
        account_id: &str,
        relevant: impl Fn(&Behaviour) -> bool,
    ) -> Option<Behaviour> {
        let st = self.accounts.get_mut(account_id)?;
        let b = st.behaviour.as_ref()?;
        if !relevant(b) {
            return None;
        }
        if let Some(n) = b.fail_times {
            if st.behaviour_uses >= n {
                return None;
            }
        }
        st.behaviour_uses = st.behaviour_uses.saturating_add(1);
        Some(b.clone())
    }
}

/// `""` or `/a/b` (leading slash, no trailing slash).
pub(crate) fn normalize_prefix(p: &str) -> String {
    let t = p.trim().trim_matches('/');
    if t.is_empty() {
        String::new()
    } else {
        format!("/{t}")
    }
}

/// A stable strong ETag of the catalog (FNV-1a 64).
fn catalog_etag() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in super::MODELS_CATALOG.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_normalized() {
        assert_eq!(
            normalize_prefix("/backend-api/codex/"),
            "/backend-api/codex"
        );
        assert_eq!(normalize_prefix("v1"), "/v1");
        assert_eq!(normalize_prefix("/"), "");
    }

    #[test]
    fn rand_hex_has_requested_length() {
        assert_eq!(rand_hex(8).len(), 16);
        assert_ne!(rand_hex(8), rand_hex(8));
    }
}
