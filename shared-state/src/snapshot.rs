//! Immutable, versioned snapshots published by the sidecar and read by workers.
//!
//! # Key Components
//! - [`Snapshot`]: accounts, client keys and settings at one version.
//! - [`AccountEntry`]: one account's identity, current access token and limits, plus an `Arc`
//!   to its process-lifetime [`AccountLive`].
//! - [`SharedSnapshot`]: the `ArcSwap` cell; workers `load()` it per request.
//! - [`Health`]: process-wide health flags the sidecar maintains (storage reachable).
//! - [`Settings`] and [`Strategy`]: runtime knobs, including how `gateway::scheduler` orders
//!   accounts.

use std::{
    collections::HashMap,
    fmt,
    str::FromStr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
};

use arc_swap::ArcSwap;

use crate::{account::AccountLive, AccountStatus, Secret};

/// The cell through which the sidecar publishes snapshots.
pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

/// Everything a worker needs to serve a request, at one version.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Monotonic version; bumps on every publish.
    pub version: u64,
    /// Accounts ordered by id.
    pub accounts: Vec<Arc<AccountEntry>>,
    /// Client keys by SHA-256 of the key.
    pub keys: HashMap<[u8; 32], ClientKey>,
    /// Runtime settings.
    pub settings: Settings,
}

// === impl Snapshot ===

impl Snapshot {
    /// Creates an empty snapshot cell.
    pub fn shared() -> SharedSnapshot {
        Arc::new(ArcSwap::from_pointee(Snapshot::default()))
    }

    /// Looks a client key up by its plain text.
    pub fn key(&self, plain: &str) -> Option<&ClientKey> {
        self.keys.get(&crate::keys::hash_key(plain))
    }

    /// An account by storage id.
    pub fn account(&self, id: i64) -> Option<&Arc<AccountEntry>> {
        self.accounts
            .binary_search_by_key(&id, |a| a.id)
            .ok()
            .map(|i| &self.accounts[i])
    }
}

/// One pooled Codex account as the data plane sees it.
#[derive(Debug)]
pub struct AccountEntry {
    /// Storage id.
    pub id: i64,
    /// Human label (email when known).
    pub label: String,
    /// `ChatGPT-Account-Id` sent upstream.
    pub chatgpt_account_id: String,
    /// ChatGPT user id (Team workspaces share the account id across users).
    pub user_id: Option<String>,
    /// Plan type from the JWT (`plus`, `pro`, `team`, ...).
    pub plan: Option<String>,
    /// Current access token.
    pub access_token: Secret,
    /// Access token expiry (unix seconds), when known.
    pub access_expires_at: Option<i64>,
    /// Persisted status.
    pub status: AccountStatus,
    /// Scheduling weight (>= 1).
    pub weight: u32,
    /// Concurrency limit (0 = unlimited).
    pub max_concurrency: u32,
    /// Live state, shared across snapshots.
    pub live: Arc<AccountLive>,
    /// Account group (`None`: the shared pool); only keys of this group use the account.
    pub group: Option<Arc<str>>,
    /// The egress proxy its upstream connections go through (`None`: direct).
    pub egress: Option<Arc<crate::ProxyEntry>>,
}

// === impl AccountEntry ===

impl AccountEntry {
    /// The effective status: an in-memory override from the data plane wins.
    pub fn effective_status(&self) -> AccountStatus {
        self.live.status_override().unwrap_or(self.status)
    }

    /// True when the account may be picked at `now_ms` (ignoring concurrency).
    pub fn is_schedulable(&self, now_ms: u64) -> bool {
        self.effective_status() == AccountStatus::Active
            && !self.access_token.is_empty()
            && !self.live.is_cooling(now_ms)
            && self.egress_allows(now_ms)
    }

    /// Whether the account's egress can carry a request at `now_ms`: direct, or a usable
    /// proxy whose breaker is closed (a proxy's failure skips its accounts for the breaker's
    /// few seconds; it never changes the accounts' own state).
    pub fn egress_allows(&self, now_ms: u64) -> bool {
        self.egress
            .as_ref()
            .is_none_or(|e| e.usable && e.live.allows(now_ms))
    }
}

/// A client key as the data plane sees it (the key itself is never kept).
#[derive(Debug, Clone)]
pub struct ClientKey {
    /// Storage id.
    pub id: i64,
    /// Operator-given name.
    pub name: String,
    /// The operator's limits.
    pub limits: Arc<crate::keys::KeyLimits>,
    /// Live counters, shared by every worker and kept across snapshots.
    pub live: Arc<crate::keys::KeyLive>,
    /// The key's name in shared counters (Redis): the first 16 hex digits of its hash, unique
    /// across installations sharing one Redis.
    pub tag: Arc<str>,
}

// === impl ClientKey ===

impl ClientKey {
    /// A key without limits (tests, tools).
    pub fn unlimited(id: i64, name: &str) -> Self {
        Self {
            id,
            name: name.to_owned(),
            limits: Arc::new(crate::keys::KeyLimits::unlimited()),
            live: Arc::default(),
            tag: Arc::from(format!("id{id}")),
        }
    }
}

/// Runtime settings published with every snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Most upstream attempts (accounts tried) for one request.
    pub max_attempts: u32,
    /// Concurrency limit applied to accounts that have none of their own (0 = unlimited).
    pub default_max_concurrency: u32,
    /// How the scheduler orders candidate accounts.
    pub strategy: Strategy,
    /// Skip accounts whose quota usage (primary 5 h window, or secondary weekly window) is
    /// at or above this percent; `None` = never pause on usage.
    pub pause_threshold_pct: Option<f64>,
    /// Minimum time between two request starts on one account, in ms (0 = none).
    pub min_request_interval_ms: u64,
    /// How long a request that finds every eligible account cooling waits for the earliest
    /// one to come back (ms; 0 = never wait: the 503 at once). A comeback later than this
    /// bound is not waited for.
    pub max_wait_for_account_ms: u64,
    /// What happens to a request asking for the priority (`fast`) service tier.
    pub service_tier: ServiceTierPolicy,
    /// Front door (`gateway::front_door`): requests per second this instance serves across
    /// all its workers (0 = no limit); past it: 429 with `Retry-After`.
    pub front_door_rps: u32,
    /// Requests over `front_door_rps` that may arrive at once (0 = one second's worth).
    pub front_door_burst: u32,
    /// Front door: requests per second from one client IP (an IPv6 client by its /64;
    /// 0 = no limit); past it: 429 with `Retry-After`.
    pub per_ip_rps: u32,
    /// Requests over `per_ip_rps` one client IP may send at once (0 = one second's worth).
    pub per_ip_burst: u32,
    /// Front door: the client IPs the data plane serves (empty = everyone); others get 403.
    pub ip_allow_list: crate::ip_list::IpAllowList,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            default_max_concurrency: 0,
            strategy: Strategy::default(),
            pause_threshold_pct: None,
            min_request_interval_ms: 0,
            max_wait_for_account_ms: DEFAULT_MAX_WAIT_FOR_ACCOUNT_MS,
            service_tier: ServiceTierPolicy::default(),
            front_door_rps: 0,
            front_door_burst: 0,
            per_ip_rps: 0,
            per_ip_burst: 0,
            ip_allow_list: crate::ip_list::IpAllowList::default(),
        }
    }
}

/// Default of [`Settings::max_wait_for_account_ms`]: a few seconds, enough for a short
/// cooldown (an overload's 5 s is not waited for; a `Retry-After: 1..3` is).
pub const DEFAULT_MAX_WAIT_FOR_ACCOUNT_MS: u64 = 3_000;

/// What the gateway does with a request asking for the priority service tier
/// (`service_tier: "priority"` or `"fast"`), which the upstream bills at a higher rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ServiceTierPolicy {
    /// Sent upstream as asked (the default).
    #[default]
    Pass,
    /// Removed from the request: it runs at the default tier.
    Strip,
    /// Refused with a 400 in the client's dialect.
    Refuse,
}

// === impl ServiceTierPolicy ===

impl ServiceTierPolicy {
    /// Every policy, in documentation order.
    pub const ALL: [ServiceTierPolicy; 3] = [Self::Pass, Self::Strip, Self::Refuse];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Strip => "strip",
            Self::Refuse => "refuse",
        }
    }
}

impl std::str::FromStr for ServiceTierPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == t)
            .ok_or_else(|| format!("expected one of pass, strip, refuse, got {s:?}"))
    }
}

/// How `gateway::scheduler` orders the candidate accounts of a request.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Health tiers, then a score from decaying penalties, EWMA error rate and latency, quota
    /// and load; weighted randomness among near-equals; soft session affinity.
    #[default]
    Smart,
    /// Rotate by the worker's cursor, proportionally to the account weights.
    RoundRobin,
    /// Fixed order by id: fill one account up to its concurrency limit before the next.
    FillFirst,
    /// Rendezvous hashing of the session key: a session stays on one account while that
    /// account is schedulable. Without a key, like `Smart`.
    Sticky,
    /// The account whose primary (then secondary) window resets soonest first.
    QuotaResetPriority,
}

/// An unknown [`Strategy`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduling strategy `{0}` (expected one of: smart, round_robin, fill_first, sticky, quota_reset_priority)")]
pub struct UnknownStrategy(pub String);

// === impl Strategy ===

impl Strategy {
    /// Every strategy, in documentation order.
    pub const ALL: [Strategy; 5] = [
        Self::Smart,
        Self::RoundRobin,
        Self::FillFirst,
        Self::Sticky,
        Self::QuotaResetPriority,
    ];

    /// The stored / configured name (snake_case).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Smart => "smart",
            Self::RoundRobin => "round_robin",
            Self::FillFirst => "fill_first",
            Self::Sticky => "sticky",
            Self::QuotaResetPriority => "quota_reset_priority",
        }
    }
}

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `/healthz` reports, written by whoever observes it: the sidecar (storage and Redis
/// probes, its supervised tasks), each worker (a heartbeat every 250 ms), the lifecycle (upstream connects).
#[derive(Debug)]
pub struct Health {
    storage_up: AtomicBool,
    /// 0: Redis not configured, 1: up, 2: down.
    redis: std::sync::atomic::AtomicU8,
    /// Per worker: its last heartbeat (ms since epoch; 0: not started).
    beats: Box<[AtomicU64]>,
    /// Since when connecting to the upstream fails (ms since epoch; 0: it does not).
    upstream_failing_since_ms: AtomicU64,
    /// Per-key limits are enforced fleet-wide (Redis reconciliation succeeding).
    key_limits_fleet: AtomicBool,
    /// The sidecar's supervised tasks (restarts, failing).
    tasks: crate::tasks::SidecarTasks,
}

// === impl Health ===

impl Default for Health {
    fn default() -> Self {
        Self::with_workers(0)
    }
}

impl Health {
    /// Health of a process with `workers` data-plane workers.
    pub fn with_workers(workers: usize) -> Self {
        Self {
            storage_up: AtomicBool::new(true),
            redis: std::sync::atomic::AtomicU8::new(0),
            beats: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            upstream_failing_since_ms: AtomicU64::new(0),
            key_limits_fleet: AtomicBool::new(false),
            tasks: crate::tasks::SidecarTasks::default(),
        }
    }

    /// The sidecar's supervised tasks.
    pub fn sidecar_tasks(&self) -> &crate::tasks::SidecarTasks {
        &self.tasks
    }

    /// Whether per-key counters are reconciled across the fleet (Redis up); false: each
    /// instance enforces the limits on what it knows locally.
    pub fn key_limits_fleet(&self) -> bool {
        self.key_limits_fleet.load(Ordering::Acquire)
    }

    /// Records whether the last per-key counter reconciliation with Redis succeeded.
    pub fn set_key_limits_fleet(&self, fleet: bool) {
        self.key_limits_fleet.store(fleet, Ordering::Release);
    }

    /// Whether the last storage probe succeeded.
    pub fn storage_up(&self) -> bool {
        self.storage_up.load(Ordering::Acquire)
    }

    /// Records the result of a storage probe.
    pub fn set_storage_up(&self, up: bool) {
        self.storage_up.store(up, Ordering::Release);
    }

    /// Redis: `None` when not configured, else whether the last probe succeeded.
    pub fn redis_up(&self) -> Option<bool> {
        match self.redis.load(Ordering::Acquire) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    /// Records the result of a Redis probe.
    pub fn set_redis_up(&self, up: bool) {
        self.redis.store(if up { 1 } else { 2 }, Ordering::Release);
    }

    /// Worker `id` is alive at `now_ms`.
    pub fn beat(&self, id: usize, now_ms: u64) {
        if let Some(b) = self.beats.get(id) {
            b.store(now_ms, Ordering::Release);
        }
    }

    /// (workers whose last heartbeat is at most `max_age_ms` old, all workers).
    pub fn workers_alive(&self, now_ms: u64, max_age_ms: u64) -> (usize, usize) {
        let alive = self
            .beats
            .iter()
            .filter(|b| {
                let t = b.load(Ordering::Acquire);
                t != 0 && now_ms.saturating_sub(t) <= max_age_ms
            })
            .count();
        (alive, self.beats.len())
    }

    /// A connection to the upstream failed at `now_ms`.
    pub fn upstream_failed(&self, now_ms: u64) {
        let _ = self.upstream_failing_since_ms.compare_exchange(
            0,
            now_ms.max(1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The upstream answered.
    pub fn upstream_ok(&self) {
        if self.upstream_failing_since_ms.load(Ordering::Relaxed) != 0 {
            self.upstream_failing_since_ms.store(0, Ordering::Release);
        }
    }

    /// Since when connecting to the upstream fails (ms since epoch), if it does.
    pub fn upstream_failing_since(&self) -> Option<u64> {
        Some(self.upstream_failing_since_ms.load(Ordering::Acquire)).filter(|&t| t != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: i64) -> Arc<AccountEntry> {
        Arc::new(AccountEntry {
            id,
            label: format!("a{id}"),
            chatgpt_account_id: format!("acc-{id}"),
            user_id: None,
            plan: None,
            access_token: Secret::new("tok"),
            access_expires_at: None,
            status: AccountStatus::Active,
            weight: 1,
            max_concurrency: 0,
            live: Arc::default(),
            group: None,
            egress: None,
        })
    }

    #[test]
    fn lookup_by_id_and_key() {
        let mut s = Snapshot {
            accounts: vec![entry(1), entry(5), entry(9)],
            ..Default::default()
        };
        s.keys.insert(
            crate::keys::hash_key("sk-cg-x"),
            ClientKey::unlimited(7, "k"),
        );
        assert_eq!(s.account(5).map(|a| a.id), Some(5));
        assert!(s.account(4).is_none());
        assert_eq!(s.key("sk-cg-x").map(|k| k.id), Some(7));
        assert!(s.key("sk-cg-y").is_none());
    }

    #[test]
    fn strategy_names_roundtrip() {
        for st in Strategy::ALL {
            assert_eq!(st.as_str().parse::<Strategy>(), Ok(st));
            assert_eq!(st.to_string(), st.as_str());
        }
        assert_eq!(Strategy::default(), Strategy::Smart);
        assert!("weighted".parse::<Strategy>().is_err());
        let d = Settings::default();
        assert_eq!(d.strategy, Strategy::Smart);
        assert_eq!(d.pause_threshold_pct, None);
        assert_eq!(d.min_request_interval_ms, 0);
    }

    #[test]
    fn override_and_cooldown_block_scheduling() {
        let a = entry(1);
        assert!(a.is_schedulable(10));
        a.live.apply(&crate::AccountEffect::cooldown(100, "test"));
        assert!(!a.is_schedulable(10));
        a.live.apply(&crate::AccountEffect::OperatorStatus {
            status: AccountStatus::Active,
            cooldown_until_ms: 0,
        });
        assert!(a.is_schedulable(10));
        a.live
            .apply(&crate::AccountEffect::Status(AccountStatus::ReauthRequired));
        assert!(!a.is_schedulable(10));
        assert_eq!(a.effective_status(), AccountStatus::ReauthRequired);
        // a refreshed token lifts a re-auth override; the stored status lifts what it confirms
        a.live.apply(&crate::AccountEffect::TokenRefreshed {
            clear_cooldown: false,
        });
        assert_eq!(a.effective_status(), AccountStatus::Active);
        a.live
            .apply(&crate::AccountEffect::Status(AccountStatus::Banned));
        a.live
            .apply(&crate::AccountEffect::StatusStored(AccountStatus::Disabled));
        assert_eq!(a.effective_status(), AccountStatus::Banned);
        a.live
            .apply(&crate::AccountEffect::StatusStored(AccountStatus::Banned));
        assert_eq!(a.live.status_override(), None);
    }

    #[test]
    fn a_failed_or_unusable_proxy_skips_its_accounts() {
        let url = crate::ProxyUrl::parse("http://127.0.0.1:1").unwrap();
        let p = Arc::new(crate::ProxyEntry::new(
            1,
            "p".into(),
            url,
            vec![],
            Arc::default(),
        ));
        let mut e = Arc::try_unwrap(entry(1)).unwrap();
        e.egress = Some(Arc::clone(&p));
        assert!(e.is_schedulable(10));
        p.live.failed(10, "407".into());
        assert!(!e.is_schedulable(11), "breaker open");
        assert!(e.is_schedulable(10 + crate::egress::BREAKER_OPEN_MS));
        assert_eq!(
            e.effective_status(),
            AccountStatus::Active,
            "the account is untouched"
        );
        let mut off = crate::ProxyEntry::new(
            2,
            "off".into(),
            crate::ProxyUrl::parse("socks5://h:1").unwrap(),
            vec![],
            Arc::default(),
        );
        off.usable = false;
        e.egress = Some(Arc::new(off));
        assert!(!e.is_schedulable(10 + crate::egress::BREAKER_OPEN_MS));
    }
}
