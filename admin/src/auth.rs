//! Admin authentication: the admin password (Argon2id), browser sessions, admin API tokens,
//! login rate limiting, and the start-up bootstrap that keeps the admin API closed by default.
//!
//! # Key Components
//! - [`bootstrap`]: at start, makes sure a credential exists. `admin_password` (from
//!   `CODEX_GATEWAY_ADMIN_PASSWORD`) is stored as an Argon2id hash (replacing a different
//!   one); with no credential at all a random password is generated, stored by hash and
//!   printed **once** on stderr. A non-loopback admin listener is refused unless the operator
//!   set a credential (a password set by env or by `admin reset-password`, or a configured
//!   admin token).
//! - [`reset_password`]: the `codex-gateway admin reset-password` helper: a new random password,
//!   stored by hash, every session ended.
//! - [`AdminAuth`]: what the admin API's guard checks on each request: the
//!   `cg_admin_session` cookie (HttpOnly, SameSite=Strict, hashed in storage), an admin API token
//!   (`Authorization: Bearer cgadm-...`, hashed in storage) or the configured static token
//!   (`admin_token`), all compared by SHA-256 digest in constant time.
//! - [`LoginLimiter`]: login attempts per client IP (10 per 5 minutes) and overall (100 per 5
//!   minutes), each **reserved before** the password is hashed (so parallel attempts cannot all
//!   pass the check), given back on success; over the limit, `POST /api/admin/login` answers
//!   429 with `Retry-After` without checking the password. A source that logged in
//!   successfully in the last [`KNOWN_SOURCE_TTL`] is exempt from the overall cap (attackers
//!   elsewhere cannot lock the operator out); its own per-IP limit still holds.
//! - [`AdminAuth::hashes`]: at most [`LOGIN_HASHES_MAX`] Argon2 checks run at once; an attempt
//!   that finds them busy gets 429 `Retry-After: 1` at once (never a queue).
//! - [`TokenScope`]: admin API tokens are `read` (GET only) or `admin` (everything), and may
//!   expire (`expires_at`); an expired token is refused like an unknown one.
//!
//! # Error handling
//! Hashing failures are [`AuthError`]; nothing here logs a password, a token or a cookie.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use argon2::{
    password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString},
    Argon2,
};
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};
use shared_state::Secret;
use subtle::ConstantTimeEq;

use crate::{error::StorageError, storage::Storage};

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "cg_admin_session";
/// How long a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Prefix of admin API tokens (tells them from client keys at a glance).
pub const ADMIN_TOKEN_PREFIX: &str = "cgadm-";
/// Failed logins allowed per client IP per [`LOGIN_WINDOW`].
pub const LOGIN_FAILURES_PER_IP: u32 = 10;
/// Failed logins allowed overall per [`LOGIN_WINDOW`].
pub const LOGIN_FAILURES_TOTAL: u32 = 100;
/// The rate-limit window.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(300);
/// How long a source that logged in successfully stays exempt from the overall cap.
pub const KNOWN_SOURCE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How many exempt sources are remembered (the oldest is forgotten first).
const KNOWN_SOURCES_MAX: usize = 256;
/// Argon2 checks running at once (each takes 19 MiB and tens of milliseconds of a core).
pub const LOGIN_HASHES_MAX: usize = 4;
/// Longest password a login checks (bytes); a longer one is refused before hashing.
pub const MAX_PASSWORD_BYTES: usize = 1024;
/// Largest `POST /api/admin/login` body (a [`MAX_PASSWORD_BYTES`] password fully
/// `\u`-escaped fits).
pub const LOGIN_MAX_BODY_BYTES: usize = 16 << 10;

/// Login passwords checked by Argon2 in this process (diagnostics; tests read it).
static PASSWORD_CHECKS: AtomicU64 = AtomicU64::new(0);

/// How many login passwords this process has checked by Argon2.
pub fn password_checks() -> u64 {
    PASSWORD_CHECKS.load(Ordering::Relaxed)
}

/// What an admin API token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenScope {
    /// `GET` (and `HEAD`) only: dashboards and monitoring.
    Read,
    /// Everything (tokens created before scopes existed have it).
    Admin,
}

// === impl TokenScope ===

impl TokenScope {
    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Admin => "admin",
        }
    }

    /// Parses `read` / `admin`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "read" => Some(Self::Read),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    /// Whether a request with this method is allowed.
    pub fn allows(self, method: &axum::http::Method) -> bool {
        self == Self::Admin
            || *method == axum::http::Method::GET
            || *method == axum::http::Method::HEAD
    }
}

/// Defined with the crate's other error types ([`crate::error`], which names it in
/// [`crate::error::SidecarError::AdminAuth`]), so `error` does not depend on this module.
pub use crate::error::AuthError;

/// Argon2id PHC string of `password` with a random salt (the crate's default cost: 19 MiB,
/// 2 passes).
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let mut raw = [0u8; 16];
    rand::rng().fill_bytes(&mut raw);
    let salt = SaltString::encode_b64(&raw).map_err(|e| AuthError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

/// [`verify_password`] for a login (counted in [`password_checks`]).
pub fn verify_login_password(password: &str, phc: &str) -> bool {
    PASSWORD_CHECKS.fetch_add(1, Ordering::Relaxed);
    verify_password(password, phc)
}

/// True when `password` matches the PHC string (constant time inside Argon2).
pub fn verify_password(password: &str, phc: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(h) => Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok(),
        Err(_) => false,
    }
}

fn random_b64(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// A new random admin password (24 URL-safe characters, 144 bits).
pub fn generate_password() -> String {
    random_b64(18)
}

/// A new session cookie value (256 bits).
pub fn generate_session_id() -> String {
    random_b64(32)
}

/// A new admin API token: [`ADMIN_TOKEN_PREFIX`] + 43 URL-safe characters (256 bits).
pub fn generate_admin_token() -> String {
    format!("{ADMIN_TOKEN_PREFIX}{}", random_b64(32))
}

/// Generates a new admin API token and stores it by hash: the plain token (shown once) and
/// its row. Shared by `POST /api/admin/tokens` and [`crate::cli::admin_tokens_create`].
pub async fn create_admin_token(
    storage: &dyn Storage,
    name: &str,
    scope: TokenScope,
    expires_at: Option<i64>,
) -> Result<(Secret, crate::storage::AdminTokenRow), StorageError> {
    let plain = generate_admin_token();
    let prefix: String = plain.chars().take(ADMIN_TOKEN_PREFIX.len() + 4).collect();
    let row = storage
        .create_admin_token(
            name,
            &sha256_hex(&plain),
            &prefix,
            scope.as_str(),
            expires_at,
        )
        .await?;
    Ok((Secret::from(plain), row))
}

/// Hex SHA-256: how sessions and tokens are stored and looked up.
pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Constant-time equality of two secrets (by digest, so lengths do not leak either).
pub fn secret_eq(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes())
        .as_slice()
        .ct_eq(Sha256::digest(b.as_bytes()).as_slice())
        .into()
}

/// What [`bootstrap`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// A password (or token) the operator set is in force.
    Configured,
    /// A password was generated; the caller prints it once.
    Generated(Secret),
}

/// Makes sure the admin API has a credential before it listens (see the module docs).
pub async fn bootstrap(
    storage: &dyn Storage,
    password: Option<&Secret>,
    static_token: bool,
    listen: SocketAddr,
) -> Result<Bootstrap, AuthError> {
    let stored = storage.admin_password_hash().await?;
    if let Some(pw) = password.filter(|p| !p.is_empty()) {
        if pw.expose().len() > MAX_PASSWORD_BYTES {
            tracing::warn!(
                max_bytes = MAX_PASSWORD_BYTES,
                "the configured admin password is longer than a login accepts: log in with a token"
            );
        }
        let same = stored
            .as_deref()
            .is_some_and(|h| verify_password(pw.expose(), h));
        if !same {
            let hash = hash_password(pw.expose())?;
            storage.set_admin_password_hash(&hash, false).await?;
        }
        return Ok(Bootstrap::Configured);
    }
    if stored.is_some() || static_token {
        return Ok(Bootstrap::Configured);
    }
    if !listen.ip().is_loopback() {
        return Err(AuthError::NoCredential(listen));
    }
    let plain = generate_password();
    let hash = hash_password(&plain)?;
    if storage.set_admin_password_hash(&hash, true).await? {
        Ok(Bootstrap::Generated(Secret::from(plain)))
    } else {
        // Another instance sharing the database generated one first: it printed it.
        Ok(Bootstrap::Configured)
    }
}

/// Sets a new random admin password, ends every session, and returns the password.
pub async fn reset_password(storage: &dyn Storage) -> Result<Secret, AuthError> {
    let plain = generate_password();
    let hash = hash_password(&plain)?;
    storage.set_admin_password_hash(&hash, false).await?;
    Ok(Secret::from(plain))
}

/// Prints a generated password once, on stderr, where the operator starting the process sees
/// it (the log only says that it happened).
#[allow(clippy::print_stderr)]
pub fn announce_generated(password: &Secret, admin_addr: SocketAddr) {
    tracing::warn!(
        admin = %admin_addr,
        "no admin credential was configured: generated an admin password (printed once on stderr)"
    );
    eprintln!(
        "\n================================================================\n\
         codex-gateway admin password (shown once): {}\n\
         admin web app: http://{admin_addr}/\n\
         change it with `codex-gateway admin reset-password` or\n\
         CODEX_GATEWAY_ADMIN_PASSWORD\n\
         ================================================================\n",
        password.expose()
    );
}

/// Who made an authenticated admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A browser session (the cookie).
    Session,
    /// An admin API token from storage.
    Token {
        /// Its id.
        id: i64,
        /// What it may do.
        scope: TokenScope,
    },
    /// The configured static `admin_token`.
    StaticToken,
}

/// Login attempt bookkeeping (see the module docs): attempts are reserved before the
/// password is hashed and given back when it was right.
#[derive(Debug, Default)]
pub struct LoginLimiter {
    inner: Mutex<LimiterState>,
}

#[derive(Debug, Default)]
struct LimiterState {
    per_ip: HashMap<IpAddr, Window>,
    total: Window,
    /// Sources that logged in successfully, with the time (exempt from the overall cap).
    known: HashMap<IpAddr, u64>,
}

/// Attempts counted in the window that started at `start` (Unix ms).
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    start: u64,
    n: u32,
}

// === impl Window ===

impl Window {
    fn roll(&mut self, now_ms: u64, w: u64) {
        if now_ms >= self.start + w {
            *self = Self {
                start: now_ms,
                n: 0,
            };
        }
    }

    fn give_back(&mut self, start: u64) {
        if self.start == start {
            self.n = self.n.saturating_sub(1);
        }
    }
}

/// One reserved login attempt ([`LoginLimiter::reserve`]): counted as a failure unless given
/// back with [`LoginLimiter::refund`] or [`LoginLimiter::success`].
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    ip: IpAddr,
    ip_window: u64,
    total_window: Option<u64>,
}

// === impl LoginLimiter ===

impl LoginLimiter {
    fn window_ms() -> u64 {
        u64::try_from(LOGIN_WINDOW.as_millis()).unwrap_or(u64::MAX)
    }

    fn known_ttl_ms() -> u64 {
        u64::try_from(KNOWN_SOURCE_TTL.as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts an attempt of `ip` in, atomically with the check; `Err(seconds)` when `ip` must
    /// wait (nothing counted).
    pub fn reserve(&self, ip: IpAddr, now_ms: u64) -> Result<Attempt, u64> {
        let w = Self::window_ms();
        let mut st = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let retry = |start: u64| (start + w).saturating_sub(now_ms).div_ceil(1000).max(1);
        if st.per_ip.len() > 10_000 {
            st.per_ip.retain(|_, win| now_ms < win.start + w);
        }
        let ttl = Self::known_ttl_ms();
        let exempt = st
            .known
            .get(&ip)
            .is_some_and(|at| now_ms < at.saturating_add(ttl));
        st.total.roll(now_ms, w);
        let mine = st.per_ip.entry(ip).or_default();
        mine.roll(now_ms, w);
        if mine.n >= LOGIN_FAILURES_PER_IP {
            return Err(retry(mine.start));
        }
        let mine_start = mine.start;
        if !exempt && st.total.n >= LOGIN_FAILURES_TOTAL {
            return Err(retry(st.total.start));
        }
        if let Some(mine) = st.per_ip.get_mut(&ip) {
            mine.n += 1;
        }
        // Exempt sources neither count toward nor are held by the overall cap.
        let total_window = (!exempt).then(|| {
            st.total.n += 1;
            st.total.start
        });
        Ok(Attempt {
            ip,
            ip_window: mine_start,
            total_window,
        })
    }

    /// Gives a reserved attempt back (it was never checked).
    pub fn refund(&self, a: Attempt) {
        let mut st = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(win) = st.per_ip.get_mut(&a.ip) {
            win.give_back(a.ip_window);
        }
        if let Some(start) = a.total_window {
            st.total.give_back(start);
        }
    }

    /// A successful login: forgets the source's failures, gives the attempt back and remembers
    /// the source as known (exempt from the overall cap for [`KNOWN_SOURCE_TTL`]).
    pub fn success(&self, a: Attempt, now_ms: u64) {
        let mut st = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.per_ip.remove(&a.ip);
        if let Some(start) = a.total_window {
            st.total.give_back(start);
        }
        if st.known.len() >= KNOWN_SOURCES_MAX && !st.known.contains_key(&a.ip) {
            if let Some(oldest) = st
                .known
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(ip, _)| *ip)
            {
                st.known.remove(&oldest);
            }
        }
        st.known.insert(a.ip, now_ms);
    }
}

/// The admin API's authentication state (held by `services::Session`).
#[derive(Debug)]
pub struct AdminAuth {
    static_token: Option<Secret>,
    /// Login attempts.
    pub limiter: LoginLimiter,
    /// Permits for Argon2 checks ([`LOGIN_HASHES_MAX`]; a login that finds none gets 429).
    pub hashes: Arc<tokio::sync::Semaphore>,
    /// The listener's address: `Host` may name its IP (any IP literal when it is bound to the
    /// unspecified address), besides loopback names and [`Self::allowed_hosts`].
    pub listen: SocketAddr,
    /// Other host names accepted in `Host` (lowercase, without port).
    pub allowed_hosts: Vec<String>,
    last_touch: Mutex<HashMap<i64, u64>>,
}

// === impl AdminAuth ===

impl AdminAuth {
    /// Auth for a listener on `listen`, with the configured static token (if any) and the
    /// extra host names it answers to.
    pub fn new(static_token: Option<Secret>, listen: SocketAddr, allowed_hosts: &[String]) -> Self {
        Self {
            static_token: static_token.filter(|t| !t.is_empty()),
            limiter: LoginLimiter::default(),
            hashes: Arc::new(tokio::sync::Semaphore::new(LOGIN_HASHES_MAX)),
            listen,
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .map(|h| match h.rsplit_once(':') {
                    Some((name, port))
                        if port.chars().all(|c| c.is_ascii_digit())
                            && !name.ends_with(']')
                            && !name.contains(':') =>
                    {
                        name.to_owned()
                    }
                    _ => h,
                })
                .filter(|h| !h.is_empty())
                .collect(),
            last_touch: Mutex::new(HashMap::new()),
        }
    }

    /// Who presents this bearer token and/or session cookie, if anyone.
    pub async fn authenticate(
        &self,
        storage: &dyn Storage,
        bearer: Option<&str>,
        session: Option<&str>,
    ) -> Result<Option<Principal>, StorageError> {
        let now = crate::storage::now_ms_i64();
        if let Some(b) = bearer.filter(|b| !b.is_empty()) {
            if let Some(t) = &self.static_token {
                if secret_eq(b, t.expose()) {
                    return Ok(Some(Principal::StaticToken));
                }
            }
            if b.starts_with(ADMIN_TOKEN_PREFIX) {
                if let Some(row) = storage.find_admin_token(&sha256_hex(b)).await? {
                    // An expired token is refused like an unknown one.
                    if row.expires_at.is_some_and(|at| now >= at) {
                        return Ok(None);
                    }
                    self.touch(storage, row.id, now).await;
                    return Ok(Some(Principal::Token {
                        id: row.id,
                        // An unknown stored scope gets the least rights.
                        scope: TokenScope::parse(&row.scope).unwrap_or(TokenScope::Read),
                    }));
                }
            }
            // A wrong bearer is a failure even when a valid cookie rides along.
            return Ok(None);
        }
        if let Some(s) = session.filter(|s| !s.is_empty()) {
            if storage.admin_session_valid(&sha256_hex(s), now).await? {
                return Ok(Some(Principal::Session));
            }
        }
        Ok(None)
    }

    async fn touch(&self, storage: &dyn Storage, id: i64, now: i64) {
        let now_u = u64::try_from(now).unwrap_or(0);
        let due = match self.last_touch.lock() {
            Ok(mut m) => {
                let last = m.get(&id).copied().unwrap_or(0);
                if now_u.saturating_sub(last) >= 60_000 {
                    m.insert(id, now_u);
                    true
                } else {
                    false
                }
            }
            Err(_) => false,
        };
        if due {
            if let Err(e) = storage.touch_admin_token(id, now).await {
                tracing::debug!(error = %e, "cannot stamp admin token use");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn password_hash_round_trip() {
        let h = hash_password("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(!h.contains("correct horse"));
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("correct horsf", &h));
        assert!(!verify_password("x", "not a phc string"));
    }

    #[test]
    fn generated_secrets_are_random_and_long() {
        let a = generate_password();
        assert_eq!(a.len(), 24);
        assert_ne!(a, generate_password());
        let t = generate_admin_token();
        assert!(t.starts_with(ADMIN_TOKEN_PREFIX));
        assert_eq!(t.len(), ADMIN_TOKEN_PREFIX.len() + 43);
        assert!(secret_eq(&t, &t.clone()));
        assert!(!secret_eq(&t, &generate_admin_token()));
    }

    #[test]
    fn limiter_reserves_before_checking_and_exempts_known_sources() {
        let l = LoginLimiter::default();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        // Reservations count at once: the 11th parallel attempt is refused before any result.
        let held: Vec<Attempt> = (0..LOGIN_FAILURES_PER_IP)
            .map(|_| l.reserve(ip, 1_000).unwrap())
            .collect();
        let wait = l.reserve(ip, 2_000).unwrap_err();
        assert!(wait > 290 && wait <= 300, "{wait}");
        assert!(l.reserve(other, 2_000).is_ok(), "per IP");
        // An attempt given back (never checked) frees its place.
        l.refund(held[0]);
        let a = l.reserve(ip, 2_000).unwrap();
        assert!(l.reserve(ip, 2_000).is_err());
        // A success forgets the source's failures and makes it known.
        l.success(a, 2_000);
        assert!(l.reserve(ip, 2_000).is_ok());
        assert!(l.reserve(ip, 1_000 + 300_000).is_ok(), "window over");
        // Attackers everywhere fill the overall cap: unknown sources wait, the known one
        // logs in.
        let l = LoginLimiter::default();
        let op: IpAddr = "10.9.9.9".parse().unwrap();
        let a = l.reserve(op, 1_000).unwrap();
        l.success(a, 1_000);
        for i in 0..LOGIN_FAILURES_TOTAL {
            l.reserve(
                IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8]),
                5_000,
            )
            .unwrap();
        }
        assert!(l.reserve(other, 6_000).is_err(), "overall limit");
        assert!(l.reserve(op, 6_000).is_ok(), "a known source is exempt");
    }

    #[test]
    fn token_scopes() {
        use axum::http::Method;
        assert_eq!(TokenScope::parse("read"), Some(TokenScope::Read));
        assert_eq!(TokenScope::parse("admin"), Some(TokenScope::Admin));
        assert_eq!(TokenScope::parse("root"), None);
        assert!(TokenScope::Read.allows(&Method::GET));
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(!TokenScope::Read.allows(&m), "{m}");
            assert!(TokenScope::Admin.allows(&m), "{m}");
        }
    }
}
