//! Front-door limits (issue 27): a request rate for the whole instance, a request rate per
//! client IP, and an IP allow-list, checked before a request is routed or authenticated, so
//! refusing is cheap. All three are runtime settings (`front_door_rps`, `front_door_burst`,
//! `per_ip_rps`, `per_ip_burst`, `ip_allow_list`: `admin::settings`), read from the
//! published snapshot at each check: a change applies to the next request, no restart.
//!
//! # Key Components
//! - [`Gcra`]: one rate limiter in one `AtomicU64` (the generic cell rate algorithm: the
//!   cell holds the theoretical arrival time of the next request; a request is admitted when
//!   taking its emission interval keeps that time within the burst tolerance of now). One
//!   compare-and-swap per admitted request, no lock, no allocation; shared by every worker.
//! - [`FrontDoor`]: the instance's cells, created once by the assembly
//!   (`codex_gateway::app`) and shared by its workers (`worker::WorkerSeed::front_door`): one
//!   global cell and a fixed table of [`PER_IP_CELLS`] per-IP cells indexed by a keyed hash
//!   of the client's address. Memory is bounded whatever the number of clients; two
//!   addresses that land on one cell share its rate (conservative: never more than the
//!   limit for either). An IPv6 client is keyed by its /64 (one host usually holds a whole
//!   /64, and rotating within it must not multiply its rate); an IPv4-mapped address is its
//!   IPv4 address.
//! - [`Refusal`]: why a request was refused; the one error mapping (`crate::error`,
//!   `ErrorKind::FrontDoor`) renders it in the route's dialect: 429 with `Retry-After` for
//!   the rates (OpenAI's `{"error":{...}}`, Anthropic's `rate_limit_error` on the messages
//!   routes), 403 for an address not on the allow-list.
//! - `/healthz` and `/metrics` are never limited (the route table says which:
//!   `crate::api::Route::front_door_exempt`).
//!
//! Where the checks run (`crate::worker`): the allow-list at accept (an address not on it
//! takes no connection place: its one request is answered 403 and the connection closed,
//! or closed at once past the refusal bound), and all three per request head, before the
//! WebSocket upgrade and before routing. The order is allow-list, per-IP, then global, so
//! a client over its own rate does not spend the instance's. A refused request is counted
//! in `codex_gateway_front_door_refused_total{reason="global|per_ip|not_allowed"}`.
//!
//! The client address is the TCP peer: there is no trusted-proxy setting (no
//! `X-Forwarded-For` is believed). Behind a reverse proxy, every client is the proxy's
//! address; limit per client at the proxy then, and use the global rate here.
//!
//! # Error handling
//! Nothing fails here: a refusal is a value.

use std::{
    hash::{BuildHasher, RandomState},
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

use shared_state::Settings;

/// Per-IP cells of an instance (a power of two; 64 KiB).
pub const PER_IP_CELLS: usize = 8192;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Why the front door refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The instance is over `front_door_rps`.
    Global {
        /// The configured rate (requests per second).
        rps: u32,
        /// Whole seconds until a request would be admitted (at least 1).
        retry_after: u64,
    },
    /// This client IP is over `per_ip_rps`.
    PerIp {
        /// The configured rate (requests per second).
        rps: u32,
        /// Whole seconds until a request would be admitted (at least 1).
        retry_after: u64,
    },
    /// The client IP is not on `ip_allow_list`.
    NotAllowed,
}

// === impl Refusal ===

impl Refusal {
    /// The `reason` label of `codex_gateway_front_door_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Global { .. } => "global",
            Self::PerIp { .. } => "per_ip",
            Self::NotAllowed => "not_allowed",
        }
    }

    /// Its counter in `/metrics`.
    pub fn guard(self) -> crate::metrics::Guard {
        match self {
            Self::Global { .. } => crate::metrics::Guard::FrontDoorGlobal,
            Self::PerIp { .. } => crate::metrics::Guard::FrontDoorPerIp,
            Self::NotAllowed => crate::metrics::Guard::FrontDoorNotAllowed,
        }
    }
}

/// One GCRA rate limiter: the theoretical arrival time (ns since the owner's epoch) of the
/// next request at the steady rate; 0 when unused.
#[derive(Debug, Default)]
pub struct Gcra(AtomicU64);

// === impl Gcra ===

impl Gcra {
    /// Takes one request at `now_ns` under `rate` requests per second with `burst` requests
    /// of tolerance (`rate` and `burst` at least 1). `Err` holds the nanoseconds until one
    /// would be admitted; a refused request takes nothing.
    pub fn take(&self, now_ns: u64, rate: u32, burst: u32) -> Result<(), u64> {
        let interval = (NANOS_PER_SEC / u64::from(rate.max(1))).max(1);
        let tolerance = interval.saturating_mul(u64::from(burst.max(1)));
        let mut tat = self.0.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now_ns).saturating_add(interval);
            let ahead = next - now_ns;
            if ahead > tolerance {
                return Err(ahead - tolerance);
            }
            match self
                .0
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }
}

/// The burst of a rate: as configured, or one second's worth (at least 1) when 0.
fn burst_of(rate: u32, burst: u32) -> u32 {
    if burst == 0 {
        rate.max(1)
    } else {
        burst
    }
}

/// Whole seconds of a wait, rounded up, at least 1 (`Retry-After`).
fn retry_secs(wait_ns: u64) -> u64 {
    wait_ns.div_ceil(NANOS_PER_SEC).max(1)
}

/// The per-IP key of an address: IPv4 (mapped IPv6 included) as is, IPv6 by its /64.
fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        v4 => v4,
    }
}

/// The front door of one instance: its global and per-IP cells, shared by its workers.
#[derive(Debug)]
pub struct FrontDoor {
    epoch: Instant,
    global: Gcra,
    per_ip: Box<[Gcra]>,
    /// Keyed per instance: a client cannot aim its addresses at another client's cell.
    hasher: RandomState,
}

impl Default for FrontDoor {
    fn default() -> Self {
        Self::new()
    }
}

// === impl FrontDoor ===

impl FrontDoor {
    /// Fresh cells (every limit unused).
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            global: Gcra::default(),
            per_ip: (0..PER_IP_CELLS).map(|_| Gcra::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// Nanoseconds since this front door was made (never 0 after the first instant).
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn cell(&self, ip: IpAddr) -> &Gcra {
        let h = self.hasher.hash_one(ip_key(ip));
        &self.per_ip[(h as usize) & (PER_IP_CELLS - 1)]
    }

    /// Whether a new connection from `ip` may be served at all (the allow-list only; the
    /// rates are taken per request).
    pub fn allows(settings: &Settings, ip: IpAddr) -> bool {
        settings.ip_allow_list.allows(ip)
    }

    /// Admits one request from `ip` under `settings`, or says why not: the allow-list, then
    /// the client's rate, then the instance's. Lock-free and allocation-free.
    pub fn admit(&self, settings: &Settings, ip: IpAddr) -> Result<(), Refusal> {
        if !settings.ip_allow_list.allows(ip) {
            return Err(Refusal::NotAllowed);
        }
        if settings.per_ip_rps == 0 && settings.front_door_rps == 0 {
            return Ok(());
        }
        self.take_at(settings, ip, self.now_ns())
    }

    /// The rates of [`FrontDoor::admit`] at `now` (ns since the epoch).
    fn take_at(&self, settings: &Settings, ip: IpAddr, now: u64) -> Result<(), Refusal> {
        if settings.per_ip_rps > 0 {
            let rps = settings.per_ip_rps;
            self.cell(ip)
                .take(now, rps, burst_of(rps, settings.per_ip_burst))
                .map_err(|wait| Refusal::PerIp {
                    rps,
                    retry_after: retry_secs(wait),
                })?;
        }
        if settings.front_door_rps > 0 {
            let rps = settings.front_door_rps;
            self.global
                .take(now, rps, burst_of(rps, settings.front_door_burst))
                .map_err(|wait| Refusal::Global {
                    rps,
                    retry_after: retry_secs(wait),
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const S: u64 = NANOS_PER_SEC;

    #[test]
    fn gcra_admits_the_burst_then_the_rate() {
        let g = Gcra::default();
        let t0 = 10 * S;
        // 2 per second, burst 3: three at once, the fourth waits half a second.
        for _ in 0..3 {
            g.take(t0, 2, 3).unwrap();
        }
        let wait = g.take(t0, 2, 3).unwrap_err();
        assert_eq!(wait, S / 2);
        assert_eq!(retry_secs(wait), 1);
        // A refused request took nothing: the same wait again.
        assert_eq!(g.take(t0, 2, 3).unwrap_err(), S / 2);
        // Half a second later, exactly one more.
        g.take(t0 + S / 2, 2, 3).unwrap();
        assert!(g.take(t0 + S / 2, 2, 3).is_err());
        // Idle for a long time: the burst is back, no more.
        let t1 = t0 + 100 * S;
        for _ in 0..3 {
            g.take(t1, 2, 3).unwrap();
        }
        assert!(g.take(t1, 2, 3).is_err());
    }

    #[test]
    fn gcra_rate_one_burst_one_and_retry_after_rounding() {
        let g = Gcra::default();
        g.take(S, 1, 1).unwrap();
        let wait = g.take(S, 1, 1).unwrap_err();
        assert_eq!(wait, S);
        assert_eq!(retry_secs(wait), 1);
        assert_eq!(retry_secs(1), 1, "at least a second");
        assert_eq!(retry_secs(S + 1), 2, "rounded up");
        g.take(2 * S, 1, 1).unwrap();
        // A slow rate: 1 per second with burst 1, then the rate lowered (a hot change):
        // the next request waits no longer than the new interval.
        let g = Gcra::default();
        g.take(S, 1000, 1).unwrap();
        assert!(g.take(S, 1000, 1).is_err());
        g.take(S + S / 1000, 1000, 1).unwrap();
    }

    #[test]
    fn gcra_is_exact_under_contention() {
        // 8 threads race for a burst of 1000 at one instant: exactly 1000 win.
        let g = Arc::new(Gcra::default());
        let won: usize = (0..8)
            .map(|_| {
                let g = Arc::clone(&g);
                std::thread::spawn(move || (0..500).filter(|_| g.take(S, 10, 1000).is_ok()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(won, 1000);
    }

    /// [`FrontDoor::admit`] at a fixed instant (no test depends on the clock).
    fn admit(door: &FrontDoor, s: &Settings, ip: IpAddr) -> Result<(), Refusal> {
        if !s.ip_allow_list.allows(ip) {
            return Err(Refusal::NotAllowed);
        }
        door.take_at(s, ip, 5 * S)
    }

    fn settings(f: impl FnOnce(&mut Settings)) -> Settings {
        let mut s = Settings::default();
        f(&mut s);
        s
    }

    #[test]
    fn per_ip_is_per_address_and_ipv6_per_64() {
        let door = FrontDoor::new();
        let s = settings(|s| {
            s.per_ip_rps = 1;
            s.per_ip_burst = 2;
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        admit(&door, &s, a).unwrap();
        admit(&door, &s, "::ffff:10.0.0.1".parse().unwrap()).unwrap();
        match admit(&door, &s, a) {
            Err(Refusal::PerIp {
                rps: 1,
                retry_after,
            }) => assert!(retry_after >= 1),
            other => panic!("{other:?}"),
        }
        // Another address has its own cell (unless the keyed hash shares it: then it is
        // refused too; never admitted beyond its rate).
        if !std::ptr::eq(door.cell(a), door.cell(b)) {
            admit(&door, &s, b).unwrap();
        }
        // An IPv6 host rotating within its /64 is one client.
        let v6 = |x: &str| -> IpAddr { x.parse().unwrap() };
        assert_eq!(
            ip_key(v6("2001:db8:1:2::1")),
            ip_key(v6("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(ip_key(v6("2001:db8:1:2::1")), ip_key(v6("2001:db8:1:3::1")));
        assert_eq!(ip_key(v6("::ffff:10.0.0.1")), a);
        let door = FrontDoor::new();
        admit(&door, &s, v6("2001:db8:1:2::1")).unwrap();
        admit(&door, &s, v6("2001:db8:1:2::2")).unwrap();
        assert!(admit(&door, &s, v6("2001:db8:1:2::3")).is_err());
    }

    #[test]
    fn global_and_allow_list_and_order() {
        let door = FrontDoor::new();
        let s = settings(|s| {
            s.front_door_rps = 1;
            s.front_door_burst = 1;
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        admit(&door, &s, a).unwrap();
        assert!(matches!(
            admit(&door, &s, "192.0.2.2".parse().unwrap()),
            Err(Refusal::Global { rps: 1, .. })
        ));
        // Off: everything passes, whatever the cells hold.
        let off = Settings::default();
        for _ in 0..100 {
            door.admit(&off, a).unwrap();
        }
        // The allow-list is checked first and takes nothing from the rates.
        let door = FrontDoor::new();
        let s = settings(|s| {
            s.front_door_rps = 1;
            s.front_door_burst = 1;
            s.ip_allow_list = "192.0.2.0/24".parse().unwrap();
        });
        let outsider: IpAddr = "198.51.100.1".parse().unwrap();
        for _ in 0..5 {
            assert_eq!(admit(&door, &s, outsider), Err(Refusal::NotAllowed));
        }
        assert!(!FrontDoor::allows(&s, outsider));
        assert!(FrontDoor::allows(&s, a));
        admit(&door, &s, a).unwrap();
        // A client over its own rate spends nothing of the instance's.
        let door = FrontDoor::new();
        let s = settings(|s| {
            s.per_ip_rps = 1;
            s.per_ip_burst = 1;
            s.front_door_rps = 1;
            s.front_door_burst = 2;
        });
        admit(&door, &s, a).unwrap();
        for _ in 0..10 {
            assert!(matches!(admit(&door, &s, a), Err(Refusal::PerIp { .. })));
        }
        let b: IpAddr = "203.0.113.9".parse().unwrap();
        if !std::ptr::eq(door.cell(a), door.cell(b)) {
            admit(&door, &s, b).unwrap();
        }
        assert_eq!(Refusal::NotAllowed.reason(), "not_allowed");
    }
}
