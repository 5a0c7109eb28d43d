//! `loadgen`: N concurrent HTTP/1.1 clients (SSE streams or plain JSON requests), or N
//! Responses WebSocket sessions ([`ws`]), against one URL, with ramp-up, and the CPU / memory of
//! the target process while they run.
//!
//! # Key Components
//! - [`LoadConfig`]: what to send, how many clients, for how long, which processes to watch.
//! - [`run`]: runs the load on the current Tokio runtime and returns a [`Report`].
//! - [`Report`]: time to first byte, full latency and inter-event gap percentiles, events/s,
//!   errors by kind, peak open streams, and the target's CPU per event / request and RSS per
//!   open stream; [`Report::table`] renders it for humans, `serde` as JSON.
//!
//! # Usage
//! Each of the `concurrency` virtual users owns one keep-alive connection (one connection per
//! stream, as SSE clients do) and sends requests back to back. User `i` starts at
//! `ramp_up * i / concurrency`. The *measurement window* runs from the end of the ramp-up to the
//! deadline (`--duration-secs`), or over the whole run with `--requests`: events/s, requests/s
//! and the target's CPU per event are taken over the window. At the deadline open requests are
//! cut and counted as `cut`, not as errors.
//!
//! # Error handling
//! Every failure is counted, never fatal: connect errors, non-2xx statuses (by code), I/O
//! errors, idle timeouts, SSE streams that end with a failure event (`response.failed`,
//! `error`) and SSE streams that end without a terminal event (`truncated`).

pub mod hist;
pub mod procfs;
pub mod sse;
pub mod ws;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::{net::TcpStream, time::Instant};

use self::{
    hist::{Histogram, Summary},
    procfs::ProcSample,
    sse::{EventScanner, Terminal},
    ws::WsConfig,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// A label copied into the report (e.g. `gateway/sse-1k`).
    pub label: String,
    /// `http://host:port/path` (plain HTTP/1.1).
    pub url: String,
    /// HTTP method (POST when there is a body).
    pub method: Method,
    /// Request body.
    pub body: Bytes,
    /// Extra headers (`authorization`, `chatgpt-account-id`, `x-mock-*`, ...).
    pub headers: Vec<(String, String)>,
    /// Concurrent virtual users (= connections = open streams at most).
    pub concurrency: usize,
    /// Users start evenly spread over this period.
    pub ramp_up: Duration,
    /// Run until `ramp_up + duration`; open requests are then cut.
    pub duration: Option<Duration>,
    /// Stop after this many requests in total (across users).
    pub requests: Option<u64>,
    /// A request fails when no byte arrives for this long.
    pub idle_timeout: Duration,
    /// Processes whose CPU and RSS are sampled (summed).
    pub target_pids: Vec<u32>,
    /// How often the target's RSS and the open streams are sampled.
    pub sample_every: Duration,
    /// `Some`: Responses WebSocket sessions instead of HTTP requests (see [`ws`]); `url` may
    /// then be `ws://` or `http://`, and `body` is the `response.create` frame of each turn.
    pub ws: Option<WsConfig>,
    /// Local addresses the connections are bound to, round robin (empty: the kernel's
    /// choice). One source address gives one destination about 28,000 ephemeral ports;
    /// spreading over several addresses of 127.0.0.0/8 lets one run hold more connections
    /// to one loopback listener.
    pub source_ips: Vec<std::net::IpAddr>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            label: String::new(),
            url: String::new(),
            method: Method::POST,
            body: Bytes::new(),
            headers: Vec::new(),
            concurrency: 1,
            ramp_up: Duration::ZERO,
            duration: Some(Duration::from_secs(10)),
            requests: None,
            idle_timeout: Duration::from_secs(60),
            target_pids: Vec::new(),
            sample_every: Duration::from_millis(100),
            ws: None,
            source_ips: Vec::new(),
        }
    }
}

/// A Responses API body: `model`, empty `instructions`, one user message, `stream`,
/// `store: false`, and `client_metadata` when given (mock-codex reads `x-mock-*` controls
/// there, and the gateway forwards it).
pub fn responses_body(
    model: &str,
    input: &str,
    stream: bool,
    client_metadata: &[(String, String)],
) -> Bytes {
    let mut v = serde_json::json!({
        "model": model,
        "instructions": "",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": input}]}],
        "stream": stream,
        "store": false,
    });
    if !client_metadata.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> = client_metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        v["client_metadata"] = serde_json::Value::Object(m);
    }
    Bytes::from(v.to_string())
}

/// Error counts by kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Errors {
    /// TCP connect or HTTP handshake failed.
    pub connect: u64,
    /// Non-2xx answers, by status code.
    pub status: BTreeMap<u16, u64>,
    /// The connection broke while sending or receiving.
    pub io: u64,
    /// No byte for `idle_timeout`.
    pub timeout: u64,
    /// SSE stream ended with `response.failed` / `error`.
    pub stream_failed: u64,
    /// SSE stream (or WebSocket turn) ended without a terminal event.
    pub truncated: u64,
    /// WebSocket mode: the peer closed (or dropped) an idle socket, between turns.
    #[serde(default)]
    pub closed: u64,
}

impl Errors {
    /// All errors.
    pub fn total(&self) -> u64 {
        self.connect
            + self.status.values().sum::<u64>()
            + self.io
            + self.timeout
            + self.stream_failed
            + self.truncated
            + self.closed
    }
}

/// CPU and memory of the target process(es).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetReport {
    /// The sampled processes.
    pub pids: Vec<u32>,
    /// CPU seconds over the whole run.
    pub cpu_secs_total: f64,
    /// CPU seconds over the measurement window.
    pub cpu_secs_window: f64,
    /// CPU cores busy on average over the window.
    pub cpu_cores_window: f64,
    /// CPU µs per SSE event received in the window (0 without events).
    pub cpu_us_per_event: f64,
    /// CPU µs per request completed in the window.
    pub cpu_us_per_request: f64,
    /// The kernel's (system time's) part of `cpu_us_per_request`: syscalls, and the TCP
    /// receive work of loopback peers that runs in this process's context.
    #[serde(default)]
    pub cpu_sys_us_per_request: f64,
    /// RSS before the first connection, KiB.
    pub rss_start_kib: u64,
    /// Largest RSS seen, KiB.
    pub rss_peak_kib: u64,
    /// RSS when the most streams were open, KiB.
    pub rss_at_peak_open_kib: u64,
    /// RSS at the end, KiB.
    pub rss_end_kib: u64,
    /// `(rss_at_peak_open - rss_start) / open streams at that sample`, KiB (0 when no sample
    /// saw an open stream).
    pub rss_kib_per_open_stream: f64,
    /// RSS at the end of the measurement window, KiB.
    #[serde(default)]
    pub rss_window_end_kib: u64,
    /// `(rss_window_end - rss_start) / open streams (sockets) at the window end`, KiB: the
    /// memory per idle WebSocket session in `--idle` runs (0 when none was open).
    #[serde(default)]
    pub rss_kib_per_open_at_window_end: f64,
    /// Processes that could not be read at the end.
    pub missing: usize,
    /// CPU seconds in the window per thread name (trailing digits dropped, e.g.
    /// `gateway-worker-`, `codex-sidecar`, `sqlx-sqlite-worker-`).
    #[serde(default)]
    pub threads_cpu_secs_window: BTreeMap<String, f64>,
}

/// The result of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`LoadConfig::label`].
    pub label: String,
    /// `http`, `ws` (WebSocket turns) or `ws-idle` (WebSocket sessions held idle).
    #[serde(default)]
    pub mode: String,
    /// Target URL.
    pub url: String,
    /// Virtual users.
    pub concurrency: usize,
    /// Seconds from the first connection to the end.
    pub elapsed_secs: f64,
    /// Seconds of the measurement window.
    pub window_secs: f64,
    /// Requests sent (WebSocket: turns, i.e. `response.create` frames).
    pub requests_started: u64,
    /// Requests that ended (well or not; cut ones excluded).
    pub requests_completed: u64,
    /// Requests that ended well.
    pub requests_ok: u64,
    /// Requests cut at the deadline.
    pub requests_cut: u64,
    /// Completed requests per second in the window.
    pub requests_per_sec: f64,
    /// Failures by kind.
    pub errors: Errors,
    /// `errors.total()`.
    pub errors_total: u64,
    /// SSE events received (WebSocket: event frames).
    pub events: u64,
    /// Events received in the window.
    pub events_window: u64,
    /// Events per second in the window.
    pub events_per_sec: f64,
    /// Body bytes received.
    pub bytes: u64,
    /// Most SSE streams open at once (2xx head received, body not finished); WebSocket: most
    /// sockets open at once (handshake done, not closed).
    pub open_streams_peak: u64,
    /// Streams (sockets) open at the end of the measurement window.
    #[serde(default)]
    pub open_at_window_end: u64,
    /// WebSocket sessions opened (101 received).
    #[serde(default)]
    pub sessions: u64,
    /// Time to connect: TCP connect, plus the WebSocket handshake (to the 101) in ws mode.
    #[serde(default)]
    pub connect_ms: Summary,
    /// Time from sending a request to the first body byte (WebSocket: from sending
    /// `response.create` to the first event frame).
    pub ttfb_ms: Summary,
    /// Time from sending a request to the end of its body (WebSocket: to the terminal event).
    pub latency_ms: Summary,
    /// Time between two consecutive events of one stream.
    pub gap_ms: Summary,
    /// The target's CPU and RSS, when `target_pids` was given.
    pub target: Option<TargetReport>,
    /// CPU seconds loadgen itself used.
    pub loadgen_cpu_secs: f64,
}

#[derive(Default)]
struct Stats {
    started: AtomicU64,
    completed: AtomicU64,
    ok: AtomicU64,
    cut: AtomicU64,
    events: AtomicU64,
    bytes: AtomicU64,
    open: AtomicU64,
    open_peak: AtomicU64,
    connect: AtomicU64,
    io: AtomicU64,
    timeout: AtomicU64,
    stream_failed: AtomicU64,
    truncated: AtomicU64,
    closed: AtomicU64,
    sessions: AtomicU64,
    status: Mutex<BTreeMap<u16, u64>>,
    connect_time: Histogram,
    ttfb: Histogram,
    latency: Histogram,
    gap: Histogram,
}

struct Shared {
    cfg: LoadConfig,
    addr: SocketAddr,
    uri: Uri,
    host: HeaderValue,
    headers: Vec<(HeaderName, HeaderValue)>,
    stats: Stats,
    /// Requests left in `--requests` mode.
    budget: Option<AtomicU64>,
    stop: AtomicBool,
    users_done: AtomicUsize,
    /// WebSocket mode: the handshake URI and the `response.create` frame.
    ws: Option<ws::WsTarget>,
    /// The next of [`LoadConfig::source_ips`] to bind to.
    next_source: AtomicUsize,
}

/// How one request ended.
enum Outcome {
    Ok,
    /// The connection cannot be reused.
    Broken,
    /// Answered with an error; the connection may be reused.
    Failed,
}

/// Runs the load and returns its report. Must run inside a Tokio runtime with time and IO.
pub async fn run(cfg: LoadConfig) -> anyhow::Result<Report> {
    let uri: Uri = cfg
        .url
        .parse()
        .with_context(|| format!("bad URL {}", cfg.url))?;
    match (&cfg.ws, uri.scheme_str()) {
        (_, Some("http")) | (Some(_), Some("ws")) => {}
        (None, _) => anyhow::bail!("only http:// URLs are supported"),
        (Some(_), _) => anyhow::bail!("only ws:// and http:// URLs are supported"),
    }
    let authority = uri.authority().context("URL without host")?.clone();
    let ws_target = match &cfg.ws {
        Some(w) => {
            anyhow::ensure!(
                !w.idle || cfg.duration.is_some(),
                "an idle WebSocket run needs a duration (the hold)"
            );
            Some(ws::WsTarget::new(&uri, &cfg.body)?)
        }
        None => None,
    };
    let port = authority.port_u16().unwrap_or(80);
    let addr = tokio::net::lookup_host((authority.host(), port))
        .await?
        .next()
        .with_context(|| format!("cannot resolve {authority}"))?;
    let mut headers = Vec::new();
    for (k, v) in &cfg.headers {
        headers.push((
            HeaderName::try_from(k.as_str()).with_context(|| format!("bad header name {k}"))?,
            HeaderValue::try_from(v.as_str()).with_context(|| format!("bad header value {v}"))?,
        ));
    }
    anyhow::ensure!(cfg.concurrency > 0, "concurrency must be > 0");
    anyhow::ensure!(
        cfg.duration.is_some() || cfg.requests.is_some(),
        "give a duration or a request count"
    );
    let shared = Arc::new(Shared {
        host: HeaderValue::try_from(authority.as_str())?,
        budget: cfg.requests.map(AtomicU64::new),
        addr,
        uri,
        headers,
        stats: Stats::default(),
        stop: AtomicBool::new(false),
        users_done: AtomicUsize::new(0),
        ws: ws_target,
        next_source: AtomicUsize::new(0),
        cfg,
    });
    let cfg = &shared.cfg;
    let pids = cfg.target_pids.clone();
    let own_cpu_start = ProcSample::own_cpu();
    let first = ProcSample::of(&pids);
    let start = Instant::now();
    let deadline = cfg.duration.map(|d| start + cfg.ramp_up + d);
    let window_start = if cfg.requests.is_some() {
        start
    } else {
        start + cfg.ramp_up
    };

    // The sampler cuts the users at the deadline right after the window-end snapshot, so that
    // snapshot still sees every stream (socket) open.
    let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
    let mut users = Vec::with_capacity(cfg.concurrency);
    for i in 0..cfg.concurrency {
        let offset = cfg.ramp_up.mul_f64(i as f64 / cfg.concurrency as f64);
        let s = shared.clone();
        let mut cut = cut_rx.clone();
        users.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + offset).await;
            let session = async {
                match &s.cfg.ws {
                    Some(w) => ws::user(&s, w).await,
                    None => user(&s).await,
                }
            };
            match deadline {
                Some(_) => {
                    tokio::select! {
                        () = session => {}
                        // Cut at the deadline: the open request (if any) is counted in `user`.
                        _ = cut.wait_for(|c| *c) => {}
                    }
                }
                None => session.await,
            }
            s.users_done.fetch_add(1, Relaxed);
        }));
    }

    // Sampler: RSS peak, open-stream peak, and the window snapshots.
    let mut sampled_open = 0u64;
    let mut rss_peak = first.rss_kib;
    let mut rss_at_peak_open = first.rss_kib;
    let mut win_a: Option<Snapshot> = None;
    let mut win_b: Option<Snapshot> = None;
    let snapshot = |s: &Shared| Snapshot {
        at: Instant::now(),
        proc: ProcSample::of(&s.cfg.target_pids),
        threads: procfs::cpu_by_thread(&s.cfg.target_pids),
        events: s.stats.events.load(Relaxed),
        completed: s.stats.completed.load(Relaxed),
        open: s.stats.open.load(Relaxed),
    };
    let first_threads = procfs::cpu_by_thread(&pids);
    if window_start <= Instant::now() {
        win_a = Some(Snapshot {
            at: start,
            proc: first,
            threads: first_threads.clone(),
            events: 0,
            completed: 0,
            open: 0,
        });
    }
    let mut tick = tokio::time::interval(cfg.sample_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = Instant::now();
        if win_a.is_none() && now >= window_start {
            win_a = Some(snapshot(&shared));
        }
        if let Some(d) = deadline {
            if win_b.is_none() && now >= d {
                win_b = Some(snapshot(&shared));
                let _ = cut_tx.send(true);
            }
        }
        let open = shared.stats.open.load(Relaxed);
        if !pids.is_empty() {
            let s = ProcSample::of(&pids);
            rss_peak = rss_peak.max(s.rss_kib);
            if open > sampled_open {
                rss_at_peak_open = s.rss_kib;
            }
        }
        sampled_open = sampled_open.max(open);
        if shared.users_done.load(Relaxed) == cfg.concurrency {
            break;
        }
        let next = match (win_a.is_none(), deadline.filter(|_| win_b.is_none())) {
            (true, _) => window_start,
            (false, Some(d)) => d,
            (false, None) => now + cfg.sample_every,
        };
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
    }
    shared.stop.store(true, Relaxed);
    for u in users {
        let _ = u.await;
    }
    let end = Instant::now();
    let last = ProcSample::of(&pids);
    let win_a = win_a.unwrap_or(Snapshot {
        at: start,
        proc: first,
        threads: first_threads,
        events: 0,
        completed: 0,
        open: 0,
    });
    let win_b = win_b.unwrap_or_else(|| Snapshot {
        at: end,
        proc: last,
        threads: procfs::cpu_by_thread(&pids),
        events: shared.stats.events.load(Relaxed),
        completed: shared.stats.completed.load(Relaxed),
        open: shared.stats.open.load(Relaxed),
    });

    let st = &shared.stats;
    let peak_open = sampled_open.max(st.open_peak.load(Relaxed));
    let errors = Errors {
        connect: st.connect.load(Relaxed),
        status: st
            .status
            .lock()
            .map(|m| m.clone())
            .unwrap_or_else(|e| e.into_inner().clone()),
        io: st.io.load(Relaxed),
        timeout: st.timeout.load(Relaxed),
        stream_failed: st.stream_failed.load(Relaxed),
        truncated: st.truncated.load(Relaxed),
        closed: st.closed.load(Relaxed),
    };
    let window_secs = (win_b.at - win_a.at).as_secs_f64().max(1e-9);
    let events_window = win_b.events.saturating_sub(win_a.events);
    let completed_window = win_b.completed.saturating_sub(win_a.completed);
    let target = (!pids.is_empty()).then(|| {
        let cpu_window = win_b.proc.cpu.saturating_sub(win_a.proc.cpu).as_secs_f64();
        let sys_window = win_b.proc.sys.saturating_sub(win_a.proc.sys).as_secs_f64();
        let threads_cpu_secs_window = win_b
            .threads
            .iter()
            .map(|(name, cpu)| {
                let before = win_a.threads.get(name).copied().unwrap_or_default();
                (name.clone(), cpu.saturating_sub(before).as_secs_f64())
            })
            .collect();
        let per = |n: u64| {
            if n == 0 {
                0.0
            } else {
                cpu_window * 1e6 / n as f64
            }
        };
        TargetReport {
            pids: pids.clone(),
            cpu_secs_total: last.cpu.saturating_sub(first.cpu).as_secs_f64(),
            cpu_secs_window: cpu_window,
            cpu_cores_window: cpu_window / window_secs,
            cpu_us_per_event: per(events_window),
            cpu_us_per_request: per(completed_window),
            cpu_sys_us_per_request: if completed_window == 0 {
                0.0
            } else {
                sys_window * 1e6 / completed_window as f64
            },
            rss_start_kib: first.rss_kib,
            rss_peak_kib: rss_peak.max(last.rss_kib),
            rss_at_peak_open_kib: rss_at_peak_open,
            rss_end_kib: last.rss_kib,
            rss_kib_per_open_stream: if sampled_open == 0 {
                0.0
            } else {
                rss_at_peak_open.saturating_sub(first.rss_kib) as f64 / sampled_open as f64
            },
            rss_window_end_kib: win_b.proc.rss_kib,
            rss_kib_per_open_at_window_end: if win_b.open == 0 {
                0.0
            } else {
                win_b.proc.rss_kib.saturating_sub(first.rss_kib) as f64 / win_b.open as f64
            },
            missing: last.missing,
            threads_cpu_secs_window,
        }
    });
    let errors_total = errors.total();
    Ok(Report {
        label: cfg.label.clone(),
        mode: match &cfg.ws {
            None => "http",
            Some(w) if w.idle => "ws-idle",
            Some(_) => "ws",
        }
        .to_owned(),
        url: cfg.url.clone(),
        concurrency: cfg.concurrency,
        elapsed_secs: (end - start).as_secs_f64(),
        window_secs,
        requests_started: st.started.load(Relaxed),
        requests_completed: st.completed.load(Relaxed),
        requests_ok: st.ok.load(Relaxed),
        requests_cut: st.cut.load(Relaxed),
        requests_per_sec: completed_window as f64 / window_secs,
        errors,
        errors_total,
        events: st.events.load(Relaxed),
        events_window,
        events_per_sec: events_window as f64 / window_secs,
        bytes: st.bytes.load(Relaxed),
        open_streams_peak: peak_open,
        open_at_window_end: win_b.open,
        sessions: st.sessions.load(Relaxed),
        connect_ms: st.connect_time.summary(),
        ttfb_ms: st.ttfb.summary(),
        latency_ms: st.latency.summary(),
        gap_ms: st.gap.summary(),
        target,
        loadgen_cpu_secs: ProcSample::own_cpu()
            .saturating_sub(own_cpu_start)
            .as_secs_f64(),
    })
}

/// The counters and the target's CPU at one instant (window start or end).
struct Snapshot {
    at: Instant,
    proc: ProcSample,
    threads: BTreeMap<String, Duration>,
    events: u64,
    completed: u64,
    /// Streams (sockets) open.
    open: u64,
}

/// Takes one request from the `--requests` budget.
fn take_budget(s: &Shared) -> bool {
    match &s.budget {
        None => true,
        Some(b) => b
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok(),
    }
}

/// A TCP connection to the target, from the next source address when some are given.
#[allow(unsafe_code)]
async fn tcp_connect(s: &Shared) -> std::io::Result<TcpStream> {
    let ips = &s.cfg.source_ips;
    if ips.is_empty() {
        return TcpStream::connect(s.addr).await;
    }
    let ip = ips[s.next_source.fetch_add(1, Relaxed) % ips.len()];
    let sock = if ip.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // The port is then chosen at connect time, per (source, destination), not at bind time
    // per source address: each source address gives each destination the whole range.
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        let on: libc::c_int = 1;
        // SAFETY: a valid socket, an int option of the right size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    sock.bind(SocketAddr::new(ip, 0))?;
    sock.connect(s.addr).await
}

async fn connect(s: &Shared) -> Option<SendRequest<Full<Bytes>>> {
    let t0 = Instant::now();
    let tcp = match tcp_connect(s).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "connect failed");
            return None;
        }
    };
    let _ = tcp.set_nodelay(true);
    s.stats.connect_time.record_duration(t0.elapsed());
    match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok((send, conn)) => {
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Some(send)
        }
        Err(e) => {
            tracing::debug!(error = %e, "handshake failed");
            None
        }
    }
}

/// One virtual user: requests back to back on one connection (reconnecting when it breaks).
async fn user(s: &Shared) {
    let mut conn: Option<SendRequest<Full<Bytes>>> = None;
    while !s.stop.load(Relaxed) && take_budget(s) {
        let sender = match &mut conn {
            Some(c) if !c.is_closed() => c,
            _ => match connect(s).await {
                Some(c) => conn.insert(c),
                None => {
                    s.stats.connect.fetch_add(1, Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let mut guard = Inflight::new(&s.stats);
        let outcome = one_request(s, sender, &mut guard).await;
        guard.finish(matches!(outcome, Outcome::Ok));
        if matches!(outcome, Outcome::Broken) {
            conn = None;
        }
    }
}

/// Counts a request as started; dropped unfinished (the deadline), it counts as cut.
struct Inflight<'a> {
    stats: &'a Stats,
    open_stream: bool,
    done: bool,
}

impl<'a> Inflight<'a> {
    fn new(stats: &'a Stats) -> Self {
        stats.started.fetch_add(1, Relaxed);
        Self {
            stats,
            open_stream: false,
            done: false,
        }
    }

    fn stream_opened(&mut self) {
        self.open_stream = true;
        let now_open = self.stats.open.fetch_add(1, Relaxed) + 1;
        self.stats.open_peak.fetch_max(now_open, Relaxed);
    }

    fn finish(&mut self, ok: bool) {
        self.done = true;
        self.stats.completed.fetch_add(1, Relaxed);
        if ok {
            self.stats.ok.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        if self.open_stream {
            self.stats.open.fetch_sub(1, Relaxed);
        }
        if !self.done {
            self.stats.cut.fetch_add(1, Relaxed);
        }
    }
}

async fn one_request(
    s: &Shared,
    sender: &mut SendRequest<Full<Bytes>>,
    guard: &mut Inflight<'_>,
) -> Outcome {
    let st = &s.stats;
    let cfg = &s.cfg;
    if sender.ready().await.is_err() {
        st.io.fetch_add(1, Relaxed);
        return Outcome::Broken;
    }
    let mut req = Request::new(Full::new(cfg.body.clone()));
    *req.method_mut() = cfg.method.clone();
    *req.uri_mut() = s
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone()));
    let h = req.headers_mut();
    h.insert(http::header::HOST, s.host.clone());
    if !cfg.body.is_empty() {
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    for (k, v) in &s.headers {
        h.insert(k.clone(), v.clone());
    }
    let t0 = Instant::now();
    let resp = match tokio::time::timeout(cfg.idle_timeout, sender.send_request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "request failed");
            st.io.fetch_add(1, Relaxed);
            return Outcome::Broken;
        }
        Err(_) => {
            st.timeout.fetch_add(1, Relaxed);
            return Outcome::Broken;
        }
    };
    let status = resp.status();
    let is_sse = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if status.is_success() && is_sse {
        guard.stream_opened();
    }
    let mut body = resp.into_body();
    let mut scanner = EventScanner::default();
    let mut first = true;
    let mut last_event: Option<Instant> = None;
    let mut terminal = Terminal::No;
    loop {
        let frame = match tokio::time::timeout(cfg.idle_timeout, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                tracing::debug!(error = %e, "body failed");
                st.io.fetch_add(1, Relaxed);
                return Outcome::Broken;
            }
            Err(_) => {
                st.timeout.fetch_add(1, Relaxed);
                return Outcome::Broken;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let now = Instant::now();
        if first {
            first = false;
            st.ttfb.record_duration(now - t0);
        }
        st.bytes.fetch_add(data.len() as u64, Relaxed);
        if is_sse {
            let mut n = 0u64;
            scanner.feed(&data, |t| {
                n += 1;
                if t != Terminal::No && terminal == Terminal::No {
                    terminal = t;
                }
            });
            if n > 0 {
                st.events.fetch_add(n, Relaxed);
                if let Some(prev) = last_event {
                    st.gap.record_duration(now - prev);
                }
                // Events that arrived together are 0 apart.
                for _ in 1..n {
                    st.gap.record(0);
                }
                last_event = Some(now);
            }
        }
    }
    let now = Instant::now();
    if first {
        st.ttfb.record_duration(now - t0);
    }
    st.latency.record_duration(now - t0);
    if !status.is_success() {
        if let Ok(mut m) = st.status.lock() {
            *m.entry(status.as_u16()).or_default() += 1;
        }
        return Outcome::Failed;
    }
    if is_sse {
        match terminal {
            Terminal::Ok => {}
            Terminal::Failed => {
                st.stream_failed.fetch_add(1, Relaxed);
                return Outcome::Failed;
            }
            Terminal::No => {
                st.truncated.fetch_add(1, Relaxed);
                return Outcome::Failed;
            }
        }
    }
    Outcome::Ok
}

// === impl Report ===

impl Report {
    /// A human-readable table.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let row = |o: &mut String, name: &str, s: &Summary| {
            let _ = writeln!(
                o,
                "  {name:<9} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10}",
                s.p50, s.p90, s.p99, s.max, s.mean, s.count
            );
        };
        let _ = writeln!(
            o,
            "loadgen {} -> {} ({})",
            if self.label.is_empty() {
                "-"
            } else {
                &self.label
            },
            self.url,
            if self.mode.is_empty() {
                "http"
            } else {
                &self.mode
            }
        );
        let _ = writeln!(
            o,
            "  users {}  elapsed {:.1}s  window {:.1}s  peak open {}  open at window end {}  sessions {}",
            self.concurrency,
            self.elapsed_secs,
            self.window_secs,
            self.open_streams_peak,
            self.open_at_window_end,
            self.sessions
        );
        let _ = writeln!(
            o,
            "  requests {} started, {} ok, {} cut, {:.1}/s   events {} ({:.0}/s)   {:.1} MiB",
            self.requests_started,
            self.requests_ok,
            self.requests_cut,
            self.requests_per_sec,
            self.events,
            self.events_per_sec,
            self.bytes as f64 / 1_048_576.0
        );
        let e = &self.errors;
        let _ = writeln!(
            o,
            "  errors {}  (connect {}, status {:?}, io {}, timeout {}, failed {}, truncated {}, closed {})",
            self.errors_total,
            e.connect,
            e.status,
            e.io,
            e.timeout,
            e.stream_failed,
            e.truncated,
            e.closed
        );
        let _ = writeln!(
            o,
            "  {:<9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
            "ms", "p50", "p90", "p99", "max", "mean", "count"
        );
        row(&mut o, "connect", &self.connect_ms);
        row(&mut o, "ttfb", &self.ttfb_ms);
        row(&mut o, "latency", &self.latency_ms);
        row(&mut o, "gap", &self.gap_ms);
        if let Some(t) = &self.target {
            let _ = writeln!(
                o,
                "  target {:?}: cpu {:.2}s total, {:.2}s in window ({:.2} cores), {:.2} µs/event, {:.1} µs/request",
                t.pids,
                t.cpu_secs_total,
                t.cpu_secs_window,
                t.cpu_cores_window,
                t.cpu_us_per_event,
                t.cpu_us_per_request
            );
            let threads: Vec<String> = t
                .threads_cpu_secs_window
                .iter()
                .filter(|(_, c)| **c > 0.0)
                .map(|(n, c)| format!("{n} {c:.2}s"))
                .collect();
            let _ = writeln!(o, "  target threads (window): {}", threads.join(", "));
            let _ = writeln!(
                o,
                "  target rss: start {} KiB, peak {} KiB, window end {} KiB, end {} KiB, {:.2} KiB per open stream at peak, {:.2} KiB per open at window end",
                t.rss_start_kib,
                t.rss_peak_kib,
                t.rss_window_end_kib,
                t.rss_end_kib,
                t.rss_kib_per_open_stream,
                t.rss_kib_per_open_at_window_end
            );
        }
        let _ = writeln!(o, "  loadgen cpu {:.2}s", self.loadgen_cpu_secs);
        o
    }
}
