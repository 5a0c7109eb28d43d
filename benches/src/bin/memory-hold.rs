//! `memory-hold`: the memory benchmark of issue 15. Against one gateway it opens N idle client
//! connections (connected, nothing sent), then M slow readers of SSE streams (a small receive
//! buffer, a few bytes read now and then while the upstream streams faster), holds them, and
//! meanwhile sends normal requests back to back; it samples the target's RSS and open
//! descriptors from `/proc` and reports RSS per idle connection, per slow reader, and whether
//! the normal requests were served (see `benches/README.md`, section "Memory").
//!
//! Exit codes: 0 when the run finished (failures are reported, not fatal), 64 for a bad flag,
//! 1 when the run could not start.

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use benches::loadgen::{
    procfs::{raise_nofile_limit, ProcSample},
    responses_body,
};
use clap::Parser;
use serde::Serialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    sync::watch,
};

/// Idle connections + slow SSE readers + normal requests against one gateway; RSS per
/// connection.
#[derive(Parser, Debug)]
#[command(name = "memory-hold", version)]
struct Args {
    /// The gateway's data listener, host:port.
    #[arg(long)]
    addr: SocketAddr,
    /// Path of the streamed and normal requests.
    #[arg(long, default_value = "/v1/responses")]
    path: String,
    /// Client key (`Authorization: Bearer KEY`).
    #[arg(long)]
    key: String,
    /// Model of the requests (one the gateway's catalog knows).
    #[arg(long, default_value = "gpt-5.5")]
    model: String,
    /// Idle connections (connected, nothing sent).
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Idle connections open evenly over this many seconds.
    #[arg(long, default_value_t = 10.0)]
    idle_ramp_secs: f64,
    /// Slow readers: each sends one streamed request, then reads `--slow-read-bytes` every
    /// `--slow-read-every-ms`.
    #[arg(long, default_value_t = 1_000)]
    slow: usize,
    /// Slow readers start evenly over this many seconds.
    #[arg(long, default_value_t = 10.0)]
    slow_ramp_secs: f64,
    /// Bytes a slow reader reads at a time.
    #[arg(long, default_value_t = 2048)]
    slow_read_bytes: usize,
    /// Pause between two reads of a slow reader, ms.
    #[arg(long, default_value_t = 1000)]
    slow_read_every_ms: u64,
    /// `SO_RCVBUF` of a slow reader's socket (set before connecting).
    #[arg(long, default_value_t = 4096)]
    slow_rcvbuf: u32,
    /// `client_metadata` entries of the slow readers' requests (mock-codex controls), K=V.
    #[arg(long = "slow-metadata", default_values_t = ["x-mock-tokens=1000000".to_owned(), "x-mock-events-per-second=20".to_owned()])]
    slow_metadata: Vec<String>,
    /// Clients sending normal (non-streamed) requests back to back during the whole run.
    #[arg(long, default_value_t = 2)]
    normal: usize,
    /// How long everything is held open after the slow readers' ramp-up, seconds.
    #[arg(long, default_value_t = 30.0)]
    hold_secs: f64,
    /// Processes whose RSS and descriptors are sampled (summed).
    #[arg(long, value_delimiter = ',')]
    target_pid: Vec<u32>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// What one run measured.
#[derive(Debug, Default, Serialize)]
struct Report {
    idle: usize,
    slow: usize,
    /// RSS before the first idle connection, KiB.
    rss_base_kib: u64,
    /// RSS with the idle connections open, KiB.
    rss_idle_kib: u64,
    /// RSS at the end of the hold (idle connections and slow readers open), KiB.
    rss_end_kib: u64,
    /// Highest RSS sampled, KiB.
    rss_max_kib: u64,
    /// (rss_idle - rss_base) / idle connections open then.
    kib_per_idle_connection: f64,
    /// (rss_end - rss_idle) / slow readers open at the end.
    kib_per_slow_reader: f64,
    /// Open descriptors of the target: before, with the idle connections, at the end.
    fds_base: u64,
    fds_idle: u64,
    fds_end: u64,
    /// Idle connections open when sampled, and at the end.
    idle_open_sampled: u64,
    idle_open_end: u64,
    /// Idle connections that could not be opened.
    idle_connect_errors: u64,
    /// Slow readers whose answer started with 200, open at the end, closed by the gateway
    /// before the end, failed (connect, status, I/O).
    slow_started: u64,
    slow_open_end: u64,
    slow_closed_early: u64,
    slow_errors: u64,
    /// Bytes the slow readers read in all.
    slow_bytes_read: u64,
    /// Normal requests answered 200, failed, and their latency (ms).
    normal_ok: u64,
    normal_errors: u64,
    normal_p50_ms: f64,
    normal_p99_ms: f64,
    normal_max_ms: f64,
    /// Normal requests answered 200 during the hold alone.
    normal_ok_during_hold: u64,
    /// Seconds of the whole run.
    run_secs: f64,
}

#[derive(Default)]
struct Counters {
    idle_open: AtomicU64,
    idle_errors: AtomicU64,
    slow_started: AtomicU64,
    slow_open: AtomicU64,
    slow_closed_early: AtomicU64,
    slow_errors: AtomicU64,
    slow_bytes: AtomicU64,
    normal_ok: AtomicU64,
    normal_errors: AtomicU64,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 64 } else { 0 });
        }
    };
    let nofile = raise_nofile_limit();
    let need = (args.idle + args.slow + args.normal + 64) as u64;
    if nofile < need {
        eprintln!("memory-hold: open-file limit {nofile} is below the {need} sockets needed");
        return ExitCode::from(1);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("memory-hold: {e}");
            return ExitCode::from(1);
        }
    };
    let report = rt.block_on(run(&args));
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("memory-hold: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        println!("{report:#?}");
    }
    ExitCode::SUCCESS
}

fn fds_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_dir(format!("/proc/{p}/fd")).ok())
        .map(|d| d.count() as u64)
        .sum()
}

async fn run(args: &Args) -> Report {
    let t0 = Instant::now();
    let c = Arc::new(Counters::default());
    let (stop_tx, stop) = watch::channel(false);
    let (hold_tx, hold) = watch::channel(false);
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let hold_ok = Arc::new(AtomicU64::new(0));

    // Normal clients, the whole run.
    let normal_body = responses_body(&args.model, "hello", false, &[]);
    let mut normal = Vec::new();
    for _ in 0..args.normal {
        let (c, stop, hold, lat, hold_ok) = (
            Arc::clone(&c),
            stop.clone(),
            hold.clone(),
            Arc::clone(&latencies),
            Arc::clone(&hold_ok),
        );
        let (addr, path, key, body) = (
            args.addr,
            args.path.clone(),
            args.key.clone(),
            normal_body.clone(),
        );
        normal.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let t = Instant::now();
                let ok = matches!(
                    tokio::time::timeout(
                        Duration::from_secs(30),
                        normal_request(addr, &path, &key, &body)
                    )
                    .await,
                    Ok(Ok(200))
                );
                if ok {
                    c.normal_ok.fetch_add(1, Ordering::Relaxed);
                    if *hold.borrow() {
                        hold_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(mut l) = lat.lock() {
                        l.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                } else {
                    c.normal_errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids = &args.target_pid;
    let mut r = Report {
        idle: args.idle,
        slow: args.slow,
        rss_base_kib: ProcSample::of(pids).rss_kib,
        fds_base: fds_of(pids),
        ..Report::default()
    };
    let rss_max = Arc::new(AtomicU64::new(r.rss_base_kib));
    let sampler = {
        let (pids, rss_max, stop) = (pids.clone(), Arc::clone(&rss_max), stop.clone());
        tokio::spawn(async move {
            while !*stop.borrow() {
                rss_max.fetch_max(ProcSample::of(&pids).rss_kib, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // Idle connections.
    let mut idle = Vec::with_capacity(args.idle);
    let step = Duration::from_secs_f64(args.idle_ramp_secs / args.idle.max(1) as f64);
    for i in 0..args.idle {
        let (c, mut stop, addr) = (Arc::clone(&c), stop.clone(), args.addr);
        idle.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(addr).await else {
                c.idle_errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            c.idle_open.fetch_add(1, Ordering::Relaxed);
            let mut b = [0u8; 64];
            tokio::select! {
                _ = s.read(&mut b) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            c.idle_open.fetch_sub(1, Ordering::Relaxed);
        }));
        tokio::time::sleep_until((t0 + Duration::from_secs(2) + step * i as u32).into()).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    r.rss_idle_kib = ProcSample::of(pids).rss_kib;
    r.fds_idle = fds_of(pids);
    r.idle_open_sampled = c.idle_open.load(Ordering::Relaxed);

    // Slow readers.
    let meta: Vec<(String, String)> = args
        .slow_metadata
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let slow_body = responses_body(&args.model, "a long answer", true, &meta);
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        args.path,
        args.key,
        slow_body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(&slow_body);
    let request = Arc::new(request);
    let mut slow = Vec::with_capacity(args.slow);
    let start = Instant::now();
    let step = Duration::from_secs_f64(args.slow_ramp_secs / args.slow.max(1) as f64);
    for i in 0..args.slow {
        let (c, stop, addr, request) = (
            Arc::clone(&c),
            stop.clone(),
            args.addr,
            Arc::clone(&request),
        );
        let (rcvbuf, n, every) = (
            args.slow_rcvbuf,
            args.slow_read_bytes,
            Duration::from_millis(args.slow_read_every_ms),
        );
        slow.push(tokio::spawn(async move {
            slow_reader(addr, &request, rcvbuf, n, every, stop, &c).await;
        }));
        tokio::time::sleep_until((start + step * i as u32).into()).await;
    }
    let _ = hold_tx.send(true);
    tokio::time::sleep(Duration::from_secs_f64(args.hold_secs)).await;
    r.rss_end_kib = ProcSample::of(pids).rss_kib;
    r.fds_end = fds_of(pids);
    r.idle_open_end = c.idle_open.load(Ordering::Relaxed);
    r.slow_open_end = c.slow_open.load(Ordering::Relaxed);
    let _ = stop_tx.send(true);
    for t in normal.into_iter().chain(idle).chain(slow) {
        let _ = t.await;
    }
    let _ = sampler.await;
    r.rss_max_kib = rss_max.load(Ordering::Relaxed);
    r.kib_per_idle_connection =
        r.rss_idle_kib.saturating_sub(r.rss_base_kib) as f64 / r.idle_open_sampled.max(1) as f64;
    r.kib_per_slow_reader =
        r.rss_end_kib.saturating_sub(r.rss_idle_kib) as f64 / r.slow_open_end.max(1) as f64;
    r.idle_connect_errors = c.idle_errors.load(Ordering::Relaxed);
    r.slow_started = c.slow_started.load(Ordering::Relaxed);
    r.slow_closed_early = c.slow_closed_early.load(Ordering::Relaxed);
    r.slow_errors = c.slow_errors.load(Ordering::Relaxed);
    r.slow_bytes_read = c.slow_bytes.load(Ordering::Relaxed);
    r.normal_ok = c.normal_ok.load(Ordering::Relaxed);
    r.normal_errors = c.normal_errors.load(Ordering::Relaxed);
    r.normal_ok_during_hold = hold_ok.load(Ordering::Relaxed);
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    r.normal_p50_ms = pct(0.5);
    r.normal_p99_ms = pct(0.99);
    r.normal_max_ms = l.last().copied().unwrap_or(0.0);
    r.run_secs = t0.elapsed().as_secs_f64();
    r
}

/// One non-streamed request on a fresh connection (`connection: close`); the status.
async fn normal_request(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: &[u8],
) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let status = std::str::from_utf8(out.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    Ok(status)
}

/// One slow reader: the request, then `n` bytes every `every` until told to stop.
async fn slow_reader(
    addr: SocketAddr,
    request: &[u8],
    rcvbuf: u32,
    n: usize,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    c: &Counters,
) {
    let sock = match TcpSocket::new_v4() {
        Ok(s) => s,
        Err(_) => {
            c.slow_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let _ = sock.set_recv_buffer_size(rcvbuf);
    let Ok(mut s) = sock.connect(addr).await else {
        c.slow_errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if s.write_all(request).await.is_err() {
        c.slow_errors.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut buf = vec![0u8; n.max(16)];
    let mut first = true;
    c.slow_open.fetch_add(1, Ordering::Relaxed);
    loop {
        let read = tokio::select! {
            r = s.read(&mut buf) => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        match read {
            Ok(0) | Err(_) => {
                c.slow_closed_early.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Ok(k) => {
                if first {
                    first = false;
                    if buf[..k].starts_with(b"HTTP/1.1 200") {
                        c.slow_started.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.slow_errors.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
                c.slow_bytes.fetch_add(k as u64, Ordering::Relaxed);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    c.slow_open.fetch_sub(1, Ordering::Relaxed);
}
