//! Prometheus metrics. Each worker writes only its own [`WorkerMetrics`] (no shared cache
//! line on the hot path); `/metrics` on any worker sums all of them.
//!
//! # Key Components
//! - [`WorkerMetrics`]: requests by route and status, open streams, upstream time-to-first-byte
//!   histogram, the worker's I/O driver.
//! - [`Registry`]: every worker's metrics; [`Registry::render`] writes the text format.

use std::{
    fmt::Write,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc, OnceLock,
    },
};

use shared_state::egress::ProxyFailureKind;

/// Routes we count: the labels of `crate::api::route::Route::label` (the last, `other`, also
/// takes any name not listed).
pub const ROUTES: [&str; 11] = shared_state::channels::ROUTE_LABELS;
const STATUSES: [u16; 17] = [
    101, 200, 400, 401, 403, 404, 405, 408, 413, 426, 429, 500, 501, 502, 503, 504, 0,
];
const TTFB_BUCKETS_MS: [u64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 30000];

/// Index of a route name in [`ROUTES`].
pub fn route_index(route: &str) -> usize {
    ROUTES
        .iter()
        .position(|r| *r == route)
        .unwrap_or(ROUTES.len() - 1)
}

/// One worker's counters.
#[derive(Debug)]
pub struct WorkerMetrics {
    id: usize,
    driver: OnceLock<&'static str>,
    requests: [[AtomicU64; STATUSES.len()]; ROUTES.len()],
    open_streams: AtomicI64,
    ttfb_buckets: [AtomicU64; TTFB_BUCKETS_MS.len()],
    ttfb_count: AtomicU64,
    ttfb_sum_us: AtomicU64,
    upstream_attempts: AtomicU64,
    failovers: AtomicU64,
    /// Blobs stripped before sending (`codex_protocol::bound::BlobKind` order).
    stripped: [AtomicU64; codex_protocol::bound::BlobKind::ALL.len()],
    /// Requests whose blobs' minting account could not serve them (another account did).
    account_switches: AtomicU64,
    panics: AtomicU64,
    ws_sessions: AtomicI64,
    ws_upstream_connects: AtomicU64,
    ws_upstream_dead: AtomicU64,
    ws_upstream_too_big: AtomicU64,
    ws_upstream_turns: AtomicU64,
    ws_upstream_reused: AtomicU64,
    ws_upstream_fallbacks: AtomicU64,
    ws_upstream_idle: AtomicI64,
    events: AtomicU64,
    h1_idle: AtomicI64,
    h1_connects: AtomicU64,
    h1_reused: AtomicU64,
    h2_connections: AtomicI64,
    h2_streams: AtomicI64,
    h2_retired: AtomicU64,
    h2_saturated: AtomicU64,
    connections: AtomicI64,
    guards: [AtomicU64; Guard::ALL.len()],
    /// Tunnels opened through egress proxies.
    proxy_tunnels: AtomicU64,
    /// Egress proxy failures by [`ProxyFailureKind`].
    proxy_failures: [AtomicU64; ProxyFailureKind::ALL.len()],
}

/// A hostile-client guard that fired (issue 15): each is a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// A connection refused at `max_connections` (503).
    RefusedGlobal,
    /// A connection refused at `max_connections_per_ip` (429).
    RefusedPerIp,
    /// A request head past `client_header_timeout` (408).
    HeadTimeout,
    /// A request body past its deadline (408).
    BodyTimeout,
    /// A response write without progress for `client_write_timeout` (stream closed).
    WriteTimeout,
    /// A response past `max_stream_output_bytes` (ended with an error).
    OutputCap,
    /// A request body or WebSocket message nesting JSON past `depth::MAX_DEPTH` (400 / 1009).
    JsonTooDeep,
    /// A WebSocket session ended for spending its error budget (close 1008).
    WsErrorBudget,
    /// A WebSocket reader paused because the client was not reading what it was sent.
    WsReaderPaused,
    /// A failed `accept` (descriptors exhausted, most often).
    AcceptFailed,
    /// A request refused over `front_door_rps` (429; `crate::front_door`).
    FrontDoorGlobal,
    /// A request refused over `per_ip_rps` (429).
    FrontDoorPerIp,
    /// A request (or a connection closed unanswered) from an address not on
    /// `ip_allow_list` (403).
    FrontDoorNotAllowed,
}

impl Guard {
    /// Every guard, in rendering order.
    pub const ALL: [Guard; 13] = [
        Guard::RefusedGlobal,
        Guard::RefusedPerIp,
        Guard::HeadTimeout,
        Guard::BodyTimeout,
        Guard::WriteTimeout,
        Guard::OutputCap,
        Guard::JsonTooDeep,
        Guard::WsErrorBudget,
        Guard::WsReaderPaused,
        Guard::AcceptFailed,
        Guard::FrontDoorGlobal,
        Guard::FrontDoorPerIp,
        Guard::FrontDoorNotAllowed,
    ];

    fn metric(self) -> (&'static str, &'static str) {
        match self {
            Guard::RefusedGlobal => (
                "codex_gateway_connections_refused_total",
                "reason=\"global\"",
            ),
            Guard::RefusedPerIp => (
                "codex_gateway_connections_refused_total",
                "reason=\"per_ip\"",
            ),
            Guard::HeadTimeout => ("codex_gateway_client_timeouts_total", "phase=\"head\""),
            Guard::BodyTimeout => ("codex_gateway_client_timeouts_total", "phase=\"body\""),
            Guard::WriteTimeout => ("codex_gateway_client_timeouts_total", "phase=\"write\""),
            Guard::OutputCap => ("codex_gateway_stream_output_capped_total", ""),
            Guard::JsonTooDeep => ("codex_gateway_json_too_deep_total", ""),
            Guard::WsErrorBudget => ("codex_gateway_ws_error_budget_closed_total", ""),
            Guard::WsReaderPaused => ("codex_gateway_ws_reader_paused_total", ""),
            Guard::AcceptFailed => ("codex_gateway_accept_failed_total", ""),
            Guard::FrontDoorGlobal => (
                "codex_gateway_front_door_refused_total",
                "reason=\"global\"",
            ),
            Guard::FrontDoorPerIp => (
                "codex_gateway_front_door_refused_total",
                "reason=\"per_ip\"",
            ),
            Guard::FrontDoorNotAllowed => (
                "codex_gateway_front_door_refused_total",
                "reason=\"not_allowed\"",
            ),
        }
    }
}

// === impl WorkerMetrics ===

impl WorkerMetrics {
    /// Metrics for worker `id`.
    pub fn new(id: usize) -> Self {
        Self {
            id,
            driver: OnceLock::new(),
            requests: Default::default(),
            open_streams: AtomicI64::new(0),
            ttfb_buckets: Default::default(),
            ttfb_count: AtomicU64::new(0),
            ttfb_sum_us: AtomicU64::new(0),
            upstream_attempts: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            stripped: Default::default(),
            account_switches: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            ws_sessions: AtomicI64::new(0),
            ws_upstream_connects: AtomicU64::new(0),
            ws_upstream_dead: AtomicU64::new(0),
            ws_upstream_too_big: AtomicU64::new(0),
            ws_upstream_turns: AtomicU64::new(0),
            ws_upstream_reused: AtomicU64::new(0),
            ws_upstream_fallbacks: AtomicU64::new(0),
            ws_upstream_idle: AtomicI64::new(0),
            events: AtomicU64::new(0),
            h1_idle: AtomicI64::new(0),
            h1_connects: AtomicU64::new(0),
            h1_reused: AtomicU64::new(0),
            h2_connections: AtomicI64::new(0),
            h2_streams: AtomicI64::new(0),
            h2_retired: AtomicU64::new(0),
            h2_saturated: AtomicU64::new(0),
            connections: AtomicI64::new(0),
            guards: Default::default(),
            proxy_tunnels: AtomicU64::new(0),
            proxy_failures: Default::default(),
        }
    }

    /// A tunnel through an egress proxy opened.
    pub fn proxy_tunnel(&self) {
        self.proxy_tunnels.fetch_add(1, Ordering::Relaxed);
    }

    /// A connect through an egress proxy failed.
    pub fn proxy_failure(&self, kind: ProxyFailureKind) {
        let i = ProxyFailureKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(0);
        self.proxy_failures[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts upstream events forwarded to clients (after the commit).
    pub fn events(&self, n: u64) {
        self.events.fetch_add(n, Ordering::Relaxed);
    }

    /// A client connection opened (+1) or closed (-1) on this worker.
    pub fn connection_delta(&self, d: i64) {
        self.connections.fetch_add(d, Ordering::Relaxed);
    }

    /// Counts a hostile-client guard that fired.
    pub fn guard(&self, g: Guard) {
        self.guards[g as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Records the I/O driver this worker runs on.
    pub fn set_driver(&self, d: &'static str) {
        let _ = self.driver.set(d);
    }

    /// The worker's driver.
    pub fn driver(&self) -> &'static str {
        self.driver.get().copied().unwrap_or("unknown")
    }

    /// Counts a finished request.
    pub fn request(&self, route: &str, status: u16) {
        let s = STATUSES
            .iter()
            .position(|x| *x == status)
            .unwrap_or(STATUSES.len() - 1);
        self.requests[route_index(route)][s].fetch_add(1, Ordering::Relaxed);
    }

    /// A stream opened (+1) or closed (-1).
    pub fn stream_delta(&self, d: i64) {
        self.open_streams.fetch_add(d, Ordering::Relaxed);
    }

    /// Open streams on this worker.
    pub fn open_streams(&self) -> i64 {
        self.open_streams.load(Ordering::Relaxed)
    }

    /// Records an upstream time to first byte.
    pub fn ttfb(&self, d: std::time::Duration) {
        let ms = d.as_millis() as u64;
        for (i, b) in TTFB_BUCKETS_MS.iter().enumerate() {
            if ms <= *b {
                self.ttfb_buckets[i].fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        self.ttfb_count.fetch_add(1, Ordering::Relaxed);
        self.ttfb_sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts a connection task that panicked (caught; the connection was closed).
    pub fn panic(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Client WebSocket sessions opened (+) or closed (-).
    pub fn ws_sessions_delta(&self, d: i64) {
        self.ws_sessions.fetch_add(d, Ordering::Relaxed);
    }

    /// Counts an upstream WebSocket opened.
    pub fn ws_upstream_connect(&self) {
        self.ws_upstream_connects.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an idle pooled upstream WebSocket found dead by its liveness ping.
    pub fn ws_upstream_dead(&self) {
        self.ws_upstream_dead.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a turn the upstream refused over WebSocket as too big (close 1009; sent over
    /// HTTP instead).
    pub fn ws_upstream_too_big(&self) {
        self.ws_upstream_too_big.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a turn sent over an upstream WebSocket (`reused`: a pooled socket).
    pub fn ws_upstream_turn(&self, reused: bool) {
        self.ws_upstream_turns.fetch_add(1, Ordering::Relaxed);
        if reused {
            self.ws_upstream_reused.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Idle keep-alive connections in this worker's upstream HTTP/1.1 pool.
    pub fn set_h1_idle(&self, n: usize) {
        self.h1_idle.store(n as i64, Ordering::Relaxed);
    }

    /// Counts an upstream HTTP/1.1 request: on a new connection, or a pooled one.
    pub fn h1_request(&self, reused: bool) {
        if reused {
            self.h1_reused.fetch_add(1, Ordering::Relaxed);
        } else {
            self.h1_connects.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Idle sockets in this worker's upstream WebSocket pool.
    pub fn set_ws_upstream_idle(&self, n: usize) {
        self.ws_upstream_idle.store(n as i64, Ordering::Relaxed);
    }

    /// Counts a client WebSocket turn sent over HTTP because the upstream WebSocket was not
    /// available.
    pub fn ws_upstream_fallback(&self) {
        self.ws_upstream_fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Pooled upstream h2 connections opened (+) or closed/retired (-).
    pub fn h2_connections_delta(&self, d: i64) {
        self.h2_connections.fetch_add(d, Ordering::Relaxed);
    }

    /// Upstream h2 streams opened (+) or finished (-).
    pub fn h2_streams_delta(&self, d: i64) {
        self.h2_streams.fetch_add(d, Ordering::Relaxed);
    }

    /// Counts an upstream h2 connection retired because it refused new streams (GOAWAY).
    pub fn h2_retired(&self) {
        self.h2_retired.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused because every pooled h2 connection was full.
    pub fn h2_saturated(&self) {
        self.h2_saturated.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an upstream attempt, and a failover when it is not the first.
    /// Blobs stripped from a request before it went upstream, by kind.
    pub fn encrypted_items_stripped(&self, n: &codex_protocol::bound::Stripped) {
        for (i, k) in codex_protocol::bound::BlobKind::ALL.iter().enumerate() {
            let c = n.of(*k);
            if c > 0 {
                self.stripped[i].fetch_add(u64::from(c), Ordering::Relaxed);
            }
        }
    }

    /// A session's request went to an account other than the one that minted its blobs.
    pub fn session_account_switch(&self) {
        self.account_switches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn attempt(&self, nth: u32) {
        self.upstream_attempts.fetch_add(1, Ordering::Relaxed);
        if nth > 0 {
            self.failovers.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// All workers' metrics.
#[derive(Debug, Clone)]
pub struct Registry {
    workers: Arc<Vec<Arc<WorkerMetrics>>>,
}

// === impl Registry ===

impl Registry {
    /// Metrics for `n` workers.
    pub fn new(n: usize) -> Self {
        Self {
            workers: Arc::new((0..n).map(|i| Arc::new(WorkerMetrics::new(i))).collect()),
        }
    }

    /// Worker `i`'s metrics.
    pub fn worker(&self, i: usize) -> Arc<WorkerMetrics> {
        Arc::clone(&self.workers[i])
    }

    /// Total open streams.
    pub fn open_streams(&self) -> i64 {
        self.workers.iter().map(|w| w.open_streams()).sum()
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(4096);
        let _ = writeln!(
            o,
            "# HELP codex_gateway_requests_total Requests by route and status."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_requests_total counter");
        for (ri, route) in ROUTES.iter().enumerate() {
            for (si, status) in STATUSES.iter().enumerate() {
                let n: u64 = self
                    .workers
                    .iter()
                    .map(|w| w.requests[ri][si].load(Ordering::Relaxed))
                    .sum();
                if n > 0 {
                    let st = if *status == 0 {
                        "other".to_owned()
                    } else {
                        status.to_string()
                    };
                    let _ = writeln!(
                        o,
                        "codex_gateway_requests_total{{route=\"{route}\",status=\"{st}\"}} {n}"
                    );
                }
            }
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_open_streams Client streams currently open."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_open_streams gauge");
        let _ = writeln!(o, "codex_gateway_open_streams {}", self.open_streams());
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_ttfb_seconds Upstream time to first byte."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_ttfb_seconds histogram");
        let mut cum = 0;
        for (i, b) in TTFB_BUCKETS_MS.iter().enumerate() {
            cum += self
                .workers
                .iter()
                .map(|w| w.ttfb_buckets[i].load(Ordering::Relaxed))
                .sum::<u64>();
            let _ = writeln!(
                o,
                "codex_gateway_upstream_ttfb_seconds_bucket{{le=\"{}\"}} {cum}",
                *b as f64 / 1000.0
            );
        }
        let count: u64 = self
            .workers
            .iter()
            .map(|w| w.ttfb_count.load(Ordering::Relaxed))
            .sum();
        let sum_us: u64 = self
            .workers
            .iter()
            .map(|w| w.ttfb_sum_us.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            o,
            "codex_gateway_upstream_ttfb_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            o,
            "codex_gateway_upstream_ttfb_seconds_sum {}",
            sum_us as f64 / 1e6
        );
        let _ = writeln!(o, "codex_gateway_upstream_ttfb_seconds_count {count}");
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_attempts_total Upstream attempts (accounts tried)."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_attempts_total counter");
        let a: u64 = self
            .workers
            .iter()
            .map(|w| w.upstream_attempts.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_upstream_attempts_total {a}");
        let _ = writeln!(o, "# TYPE codex_gateway_failovers_total counter");
        let f: u64 = self
            .workers
            .iter()
            .map(|w| w.failovers.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_failovers_total {f}");
        let _ = writeln!(
            o,
            "# HELP codex_gateway_encrypted_items_stripped_total Account-bound blobs (reasoning encrypted_content, compaction items) stripped before a request went to an account that could not verify them."
        );
        let _ = writeln!(
            o,
            "# TYPE codex_gateway_encrypted_items_stripped_total counter"
        );
        for (i, k) in codex_protocol::bound::BlobKind::ALL.iter().enumerate() {
            let n: u64 = self
                .workers
                .iter()
                .map(|w| w.stripped[i].load(Ordering::Relaxed))
                .sum();
            let _ = writeln!(
                o,
                "codex_gateway_encrypted_items_stripped_total{{kind=\"{}\"}} {n}",
                k.as_str()
            );
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_session_account_switches_total Requests carrying blobs one account minted that another account served (cleaned first)."
        );
        let _ = writeln!(
            o,
            "# TYPE codex_gateway_session_account_switches_total counter"
        );
        let n: u64 = self
            .workers
            .iter()
            .map(|w| w.account_switches.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_session_account_switches_total {n}");
        let _ = writeln!(
            o,
            "# HELP codex_gateway_connection_panics_total Connection tasks that panicked (each closed its connection and released its slots)."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_connection_panics_total counter");
        let p: u64 = self
            .workers
            .iter()
            .map(|w| w.panics.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_connection_panics_total {p}");
        let _ = writeln!(
            o,
            "# HELP codex_gateway_client_connections Open client connections."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_client_connections gauge");
        let c: i64 = self
            .workers
            .iter()
            .map(|w| w.connections.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_client_connections {c}");
        let mut typed = Vec::new();
        for g in Guard::ALL {
            let (name, labels) = g.metric();
            if !typed.contains(&name) {
                typed.push(name);
                let _ = writeln!(o, "# TYPE {name} counter");
            }
            let n: u64 = self
                .workers
                .iter()
                .map(|w| w.guards[g as usize].load(Ordering::Relaxed))
                .sum();
            if labels.is_empty() {
                let _ = writeln!(o, "{name} {n}");
            } else {
                let _ = writeln!(o, "{name}{{{labels}}} {n}");
            }
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_ws_sessions Client Responses WebSocket sessions open."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_ws_sessions gauge");
        let n: i64 = self
            .workers
            .iter()
            .map(|w| w.ws_sessions.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_ws_sessions {n}");
        // Per-worker views of the data plane's load (the admin app's ops page).
        for (name, kind, help, pick) in [
            (
                "codex_gateway_worker_client_connections",
                "gauge",
                "Open client connections, per worker.",
                &(|w: &WorkerMetrics| w.connections.load(Ordering::Relaxed))
                    as &dyn Fn(&WorkerMetrics) -> i64,
            ),
            (
                "codex_gateway_worker_open_streams",
                "gauge",
                "Client streams open, per worker.",
                &|w: &WorkerMetrics| w.open_streams.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_worker_ws_sessions",
                "gauge",
                "Client Responses WebSocket sessions open, per worker.",
                &|w: &WorkerMetrics| w.ws_sessions.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_worker_requests_total",
                "counter",
                "Requests answered (every route), per worker.",
                &|w: &WorkerMetrics| {
                    w.requests
                        .iter()
                        .flatten()
                        .map(|c| c.load(Ordering::Relaxed) as i64)
                        .sum()
                },
            ),
            (
                "codex_gateway_worker_events_total",
                "counter",
                "Upstream events forwarded to clients, per worker.",
                &|w: &WorkerMetrics| w.events.load(Ordering::Relaxed) as i64,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} {kind}");
            for w in self.workers.iter() {
                let _ = writeln!(o, "{name}{{worker=\"{}\"}} {}", w.id, pick(w));
            }
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_ws_idle Idle sockets in the upstream WebSocket pool, per worker."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_ws_idle gauge");
        for w in self.workers.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_upstream_ws_idle{{worker=\"{}\"}} {}",
                w.id,
                w.ws_upstream_idle.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_h1_idle Idle keep-alive connections in the upstream HTTP/1.1 pool, per worker."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_h1_idle gauge");
        for w in self.workers.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_upstream_h1_idle{{worker=\"{}\"}} {}",
                w.id,
                w.h1_idle.load(Ordering::Relaxed)
            );
        }
        for (name, help, pick) in [
            (
                "codex_gateway_upstream_h1_connects_total",
                "Upstream HTTP/1.1 requests sent on a new connection.",
                &(|w: &WorkerMetrics| w.h1_connects.load(Ordering::Relaxed))
                    as &dyn Fn(&WorkerMetrics) -> u64,
            ),
            (
                "codex_gateway_upstream_h1_reused_total",
                "Upstream HTTP/1.1 requests sent on a pooled keep-alive connection.",
                &|w: &WorkerMetrics| w.h1_reused.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_upstream_ws_connects_total",
                "Upstream Responses WebSockets opened.",
                &(|w: &WorkerMetrics| w.ws_upstream_connects.load(Ordering::Relaxed))
                    as &dyn Fn(&WorkerMetrics) -> u64,
            ),
            (
                "codex_gateway_upstream_ws_dead_total",
                "Idle pooled upstream WebSockets closed because their liveness ping got no pong.",
                &|w: &WorkerMetrics| w.ws_upstream_dead.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_upstream_ws_too_big_total",
                "Turns the upstream closed as too big over WebSocket (1009), sent over HTTP instead.",
                &|w: &WorkerMetrics| w.ws_upstream_too_big.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_upstream_ws_turns_total",
                "Turns sent over an upstream Responses WebSocket.",
                &|w: &WorkerMetrics| w.ws_upstream_turns.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_upstream_ws_reused_total",
                "Turns sent over a pooled (reused) upstream WebSocket.",
                &|w: &WorkerMetrics| w.ws_upstream_reused.load(Ordering::Relaxed),
            ),
            (
                "codex_gateway_upstream_ws_fallbacks_total",
                "Client WebSocket turns sent over HTTP because the upstream WebSocket was unavailable.",
                &|w: &WorkerMetrics| w.ws_upstream_fallbacks.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} counter");
            let n: u64 = self.workers.iter().map(|w| pick(w)).sum();
            let _ = writeln!(o, "{name} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_h2_connections Pooled upstream HTTP/2 connections, per worker."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_h2_connections gauge");
        for w in self.workers.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_upstream_h2_connections{{worker=\"{}\"}} {}",
                w.id,
                w.h2_connections.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_h2_streams Open upstream HTTP/2 streams, per worker."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_h2_streams gauge");
        for w in self.workers.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_upstream_h2_streams{{worker=\"{}\"}} {}",
                w.id,
                w.h2_streams.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(o, "# HELP codex_gateway_upstream_h2_retired_total Upstream HTTP/2 connections retired after refusing new streams (GOAWAY).");
        let _ = writeln!(o, "# TYPE codex_gateway_upstream_h2_retired_total counter");
        let n: u64 = self
            .workers
            .iter()
            .map(|w| w.h2_retired.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_upstream_h2_retired_total {n}");
        let _ = writeln!(o, "# HELP codex_gateway_upstream_h2_saturated_total Requests refused with 503 because every pooled upstream HTTP/2 connection was full.");
        let _ = writeln!(
            o,
            "# TYPE codex_gateway_upstream_h2_saturated_total counter"
        );
        let n: u64 = self
            .workers
            .iter()
            .map(|w| w.h2_saturated.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_upstream_h2_saturated_total {n}");
        let _ = writeln!(
            o,
            "# HELP codex_gateway_worker_driver The I/O driver each worker runs on (1 = active)."
        );
        let _ = writeln!(o, "# TYPE codex_gateway_worker_driver gauge");
        for w in self.workers.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_worker_driver{{worker=\"{}\",driver=\"{}\"}} 1",
                w.id,
                w.driver()
            );
        }
        self.render_proxies(&mut o);
        o
    }

    fn render_proxies(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_proxy_tunnels_total Upstream connections opened through an egress proxy."
        );
        let _ = writeln!(
            o,
            "# TYPE codex_gateway_upstream_proxy_tunnels_total counter"
        );
        let n: u64 = self
            .workers
            .iter()
            .map(|w| w.proxy_tunnels.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(o, "codex_gateway_upstream_proxy_tunnels_total {n}");
        let _ = writeln!(
            o,
            "# HELP codex_gateway_upstream_proxy_failures_total Egress proxy failures by kind (the proxy's fault, never the account's)."
        );
        let _ = writeln!(
            o,
            "# TYPE codex_gateway_upstream_proxy_failures_total counter"
        );
        for (i, kind) in ProxyFailureKind::ALL.iter().enumerate() {
            let n: u64 = self
                .workers
                .iter()
                .map(|w| w.proxy_failures[i].load(Ordering::Relaxed))
                .sum();
            let _ = writeln!(
                o,
                "codex_gateway_upstream_proxy_failures_total{{kind=\"{}\"}} {n}",
                kind.as_str()
            );
        }
    }
}

/// The quota forecast's gauges (`shared_state::forecast` over the snapshot's live state and
/// the burns the sidecar publishes): the pool's demand, accounts that can serve now, and in
/// how many seconds the pool runs out and capacity returns (`+Inf`: not forecast).
pub fn render_forecast(snap: &shared_state::Snapshot, now_ms: u64) -> String {
    use std::fmt::Write as _;
    let f = shared_state::forecast::pool_of(snap, now_ms);
    let secs = |at: Option<u64>| match at {
        Some(at) if at != 0 => format!("{}", at.saturating_sub(now_ms) as f64 / 1000.0),
        _ => "+Inf".to_owned(),
    };
    let mut o = String::with_capacity(1024);
    for (name, help, value) in [
        (
            "codex_gateway_pool_quota_demand_percent_per_hour",
            "Observed quota burn of the pool (sum of the accounts' 5-hour window burns, percent per hour).",
            format!("{}", f.demand_pct_h),
        ),
        (
            "codex_gateway_pool_accounts_available",
            "Accounts that can serve now by their quota and cooldown.",
            f.available_now.to_string(),
        ),
        (
            "codex_gateway_pool_quota_exhausts_in_seconds",
            "Forecast: seconds until no account can serve at the observed burn (+Inf: not within 8 days).",
            secs(f.exhausts_at_ms),
        ),
        (
            "codex_gateway_pool_capacity_returns_in_seconds",
            "Forecast: seconds until the first account serves again after the pool runs out (+Inf: not forecast).",
            secs(f.exhausts_at_ms.and(f.returns_at_ms)),
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} gauge");
        let _ = writeln!(o, "{name} {value}");
    }
    o
}
