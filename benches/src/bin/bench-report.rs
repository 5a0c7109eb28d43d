//! `bench-report DIR`: reads the loadgen JSON reports `benches/run.sh` wrote to `DIR`
//! (`{direct,gateway,nginx}-{json,short,short-h1,codex,sse,slow,ws,ws-idle-N}.json`) and prints, as Markdown, the
//! results table, the ratios (gateway vs nginx CPU per event, added TTFB vs direct, RSS per
//! open stream, most streams held without error), whether each target is met, and the
//! WebSocket results (RSS per idle session and CPU per forwarded WebSocket event, gateway vs
//! nginx). Targets are reported, never asserted. Exit codes: 0, 64 for bad usage, 1 when DIR
//! holds no report.

use std::{collections::BTreeMap, fmt::Write as _, path::Path, process::ExitCode};

use benches::loadgen::{Report, TargetReport};

const TARGETS: [&str; 3] = ["direct", "gateway", "nginx"];
const WORKLOADS: [&str; 6] = ["json", "short", "short-h1", "codex", "sse", "slow"];
/// The WebSocket streaming workload; the idle ones are `ws-idle-<sessions>`.
const WS: &str = "ws";
const WS_IDLE: &str = "ws-idle-";

/// Target: added TTFB p99 at the SSE workload, ms.
const TTFB_P99_BUDGET_MS: f64 = 1.0;
/// Target: RSS per open SSE stream, KiB.
const RSS_PER_STREAM_BUDGET_KIB: f64 = 8.0;
/// Target: gateway CPU per forwarded SSE event as a share of nginx's (issue 25).
const EVENT_CPU_RATIO: f64 = 0.7;
/// Target: gateway CPU per request (json, short, short-h1, codex) as a share of nginx's.
const REQUEST_CPU_RATIO: f64 = 1.0;
/// Target: gateway CPU per forwarded WebSocket event as a share of nginx's.
const WS_EVENT_CPU_RATIO: f64 = 1.0;
/// Target: gateway RSS per idle WebSocket session as a share of nginx's.
const WS_IDLE_RSS_RATIO: f64 = 1.0;
/// Target: concurrent streams held without error.
const STREAMS_TARGET: u64 = 10_000;

type Reports = BTreeMap<(String, String), Report>;

/// Whether `w` is a workload this report knows.
fn known_workload(w: &str) -> bool {
    WORKLOADS.contains(&w) || w == WS || idle_sessions(w).is_some()
}

/// `N` of a `ws-idle-N` workload.
fn idle_sessions(w: &str) -> Option<u64> {
    w.strip_prefix(WS_IDLE)?.parse().ok()
}

fn load(dir: &Path) -> Result<Reports, String> {
    let mut out = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        let Some((t, w)) = stem.split_once('-') else {
            continue;
        };
        if !TARGETS.contains(&t) || !known_workload(w) {
            continue;
        }
        let p = entry.path();
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let r: Report = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        out.insert((t.to_owned(), w.to_owned()), r);
    }
    Ok(out)
}

/// The `ws-idle-N` workloads present, by N.
fn idle_workloads(r: &Reports) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = r
        .keys()
        .filter_map(|(_, w)| idle_sessions(w).map(|n| (n, w.clone())))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn get<'a>(r: &'a Reports, t: &str, w: &str) -> Option<&'a Report> {
    r.get(&(t.to_owned(), w.to_owned()))
}

fn f(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

fn table(r: &Reports) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| workload | via | clients | ok | cut | errors | peak open | req/s | events/s | TTFB p50 ms | TTFB p99 ms | latency p50 ms | latency p99 ms | gap p99 ms | CPU µs/event | CPU µs/req | of which kernel | cores | RSS KiB/stream | RSS peak MiB | loadgen CPU s |"
    );
    let _ = writeln!(o, "|{}", "---|".repeat(21));
    for w in WORKLOADS.into_iter().chain([WS]) {
        for t in TARGETS {
            let Some(x) = get(r, t, w) else { continue };
            let tg = x.target.clone().unwrap_or_default();
            let _ = writeln!(
                o,
                "| {w} | {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                x.concurrency,
                x.requests_ok,
                x.requests_cut,
                x.errors_total,
                x.open_streams_peak,
                f(x.requests_per_sec, 0),
                f(x.events_per_sec, 0),
                f(x.ttfb_ms.p50, 2),
                f(x.ttfb_ms.p99, 2),
                f(x.latency_ms.p50, 2),
                f(x.latency_ms.p99, 2),
                f(x.gap_ms.p99, 1),
                f(tg.cpu_us_per_event, 2),
                f(tg.cpu_us_per_request, 1),
                f(tg.cpu_sys_us_per_request, 1),
                f(tg.cpu_cores_window, 2),
                f(tg.rss_kib_per_open_stream, 2),
                f(tg.rss_peak_kib as f64 / 1024.0, 1),
                f(x.loadgen_cpu_secs, 1),
            );
        }
    }
    o
}

fn cpu_event(x: &Report) -> Option<f64> {
    x.target
        .as_ref()
        .map(|t| t.cpu_us_per_event)
        .filter(|v| *v > 0.0)
}

/// CPU µs per event of the gateway's data-plane threads only (`gateway-worker-*`).
fn worker_cpu_event(x: &Report) -> Option<f64> {
    let t = x.target.as_ref()?;
    let cpu: f64 = t
        .threads_cpu_secs_window
        .iter()
        .filter(|(n, _)| n.starts_with("gateway-worker"))
        .map(|(_, c)| *c)
        .sum();
    (cpu > 0.0 && x.events_window > 0).then(|| cpu * 1e6 / x.events_window as f64)
}

/// `name 1.23 s (45%)` per thread name of the target in the window.
fn thread_split(x: &Report) -> Option<String> {
    let t = x.target.as_ref()?;
    let total: f64 = t.threads_cpu_secs_window.values().sum();
    if total <= 0.0 {
        return None;
    }
    let parts: Vec<String> = t
        .threads_cpu_secs_window
        .iter()
        .filter(|(_, c)| **c > 0.0)
        .map(|(n, c)| format!("{n} {c:.2} s ({:.0} %)", c * 100.0 / total))
        .collect();
    Some(parts.join(", "))
}

fn ratios(r: &Reports) -> String {
    let mut o = String::new();
    for w in ["sse", "slow"] {
        match (get(r, "gateway", w), get(r, "nginx", w)) {
            (Some(g), Some(n)) => {
                if let (Some(a), Some(b)) = (cpu_event(g), cpu_event(n)) {
                    let _ = writeln!(
                        o,
                        "- CPU per forwarded event ({w}): gateway {a:.2} µs, nginx {b:.2} µs: **{:.2}× nginx**",
                        a / b
                    );
                }
                if let (Some(a), Some(b)) = (worker_cpu_event(g), cpu_event(n)) {
                    let _ = writeln!(
                        o,
                        "- CPU per forwarded event ({w}), gateway worker threads only (no sidecar): {a:.2} µs: {:.2}× nginx",
                        a / b
                    );
                }
            }
            (Some(g), None) => {
                if let Some(a) = cpu_event(g) {
                    let _ = writeln!(
                        o,
                        "- CPU per forwarded event ({w}): gateway {a:.2} µs (no nginx run)"
                    );
                }
            }
            _ => {}
        }
    }
    for w in ["json", "short", "short-h1", "codex"] {
        if let Some((a, b)) = request_cpu(r, w) {
            let _ = writeln!(
                o,
                "- CPU per request ({w}): gateway {a:.1} µs, nginx {b:.1} µs: **{:.2}× nginx**",
                a / b
            );
            if let Some(((ua, ka), (ub, kb))) = request_cpu_split(r, w) {
                let _ = writeln!(
                    o,
                    "  - user / kernel ({w}): gateway {ua:.1} / {ka:.1} µs, nginx {ub:.1} / {kb:.1} µs: user {:.2}×, kernel {:.2}×",
                    ua / ub.max(1e-9),
                    ka / kb.max(1e-9)
                );
            }
        }
    }
    for w in WORKLOADS {
        if let Some(split) = get(r, "gateway", w).and_then(thread_split) {
            let _ = writeln!(o, "- Gateway CPU by thread ({w}, window): {split}");
        }
    }
    for via in ["gateway", "nginx"] {
        for w in ["sse", "slow"] {
            if let (Some(d), Some(g)) = (get(r, "direct", w), get(r, via, w)) {
                let _ = writeln!(
                    o,
                    "- Added TTFB vs direct ({w}, {} streams) through {via}: p50 {:+.2} ms, p99 {:+.2} ms",
                    g.concurrency,
                    g.ttfb_ms.p50 - d.ttfb_ms.p50,
                    g.ttfb_ms.p99 - d.ttfb_ms.p99
                );
            }
        }
        if let (Some(d), Some(g)) = (get(r, "direct", "json"), get(r, via, "json")) {
            let _ = writeln!(
                o,
                "- Added latency vs direct (json, full answer) through {via}: p50 {:+.2} ms, p99 {:+.2} ms",
                g.latency_ms.p50 - d.latency_ms.p50,
                g.latency_ms.p99 - d.latency_ms.p99
            );
        }
    }
    for via in ["gateway", "nginx"] {
        for w in ["sse", "slow"] {
            if let Some(t) = get(r, via, w).and_then(|x| x.target.as_ref()) {
                let _ = writeln!(
                    o,
                    "- RSS per open stream ({w}) in {via}: {:.2} KiB ({} → {} KiB at {} open)",
                    t.rss_kib_per_open_stream,
                    t.rss_start_kib,
                    t.rss_at_peak_open_kib,
                    get(r, via, w).map_or(0, |x| x.open_streams_peak)
                );
            }
        }
    }
    for via in TARGETS {
        let best = ["sse", "slow"]
            .iter()
            .filter_map(|w| get(r, via, w))
            .filter(|x| x.errors_total == 0)
            .map(|x| x.open_streams_peak)
            .max();
        if let Some(n) = best {
            let _ = writeln!(
                o,
                "- Most concurrent streams held with zero errors, {via}: {n}"
            );
        }
    }
    o
}

/// Gateway and nginx CPU per completed request of workload `w`, µs.
fn request_cpu(r: &Reports, w: &str) -> Option<(f64, f64)> {
    let a = get(r, "gateway", w)?.target.as_ref()?.cpu_us_per_request;
    let b = get(r, "nginx", w)?.target.as_ref()?.cpu_us_per_request;
    (b > 0.0).then_some((a, b))
}

/// Gateway and nginx CPU per completed request of workload `w`, split as (user, kernel) µs;
/// `None` when a report has no kernel figure (older loadgen).
fn request_cpu_split(r: &Reports, w: &str) -> Option<((f64, f64), (f64, f64))> {
    let a = get(r, "gateway", w)?.target.as_ref()?;
    let b = get(r, "nginx", w)?.target.as_ref()?;
    let split = |t: &TargetReport| {
        (
            t.cpu_us_per_request - t.cpu_sys_us_per_request,
            t.cpu_sys_us_per_request,
        )
    };
    (a.cpu_sys_us_per_request > 0.0 && b.cpu_sys_us_per_request > 0.0).then(|| (split(a), split(b)))
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "not measured",
    }
}

/// The RSS target's verdict: `None` (not measured) when RSS did not grow with the open
/// streams (the sampled process is not the one holding them, e.g. a wrapper script).
fn rss_per_stream_met(kib: f64) -> Option<bool> {
    (kib > 0.0).then_some(kib <= RSS_PER_STREAM_BUDGET_KIB)
}

fn targets(r: &Reports) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "| target | measured | verdict |\n|---|---|---|");
    let g = get(r, "gateway", "sse");
    let n = get(r, "nginx", "sse");
    let cpu = g.and_then(cpu_event).zip(n.and_then(cpu_event));
    let workers = g.and_then(worker_cpu_event);
    let _ = writeln!(
        o,
        "| CPU per forwarded event <= {EVENT_CPU_RATIO}x nginx's (sse; whole gateway process) | {}{} | {} |",
        cpu.map_or("-".into(), |(a, b)| format!(
            "{a:.2} µs vs {b:.2} µs = {:.2}x",
            a / b
        )),
        workers.map_or(String::new(), |w| format!(
            " (worker threads alone: {w:.2} µs)"
        )),
        verdict(cpu.map(|(a, b)| a <= EVENT_CPU_RATIO * b))
    );
    for (w, what) in [
        ("json", "short non-stream request"),
        ("short", "short streamed request at full rate"),
        ("short-h1", "short streamed request, HTTP/1.1 upstream"),
        ("codex", "the Codex CLI's real request, streamed"),
    ] {
        let c = request_cpu(r, w);
        let _ = writeln!(
            o,
            "| CPU per {what} <= {REQUEST_CPU_RATIO}x nginx's ({w}) | {} | {} |",
            c.map_or("-".into(), |(a, b)| format!(
                "{a:.1} µs vs {b:.1} µs = {:.2}x",
                a / b
            )),
            verdict(c.map(|(a, b)| a <= REQUEST_CPU_RATIO * b))
        );
    }
    let d = get(r, "direct", "sse");
    let added = g
        .zip(d)
        .map(|(g, d)| (g.ttfb_ms.p99 - d.ttfb_ms.p99, g.concurrency));
    let _ = writeln!(
        o,
        "| added TTFB p99 <= {TTFB_P99_BUDGET_MS} ms at 1,000 streams | {} | {} |",
        added.map_or("-".into(), |(a, c)| format!("{a:+.2} ms at {c} streams")),
        verdict(added.map(|(a, c)| a <= TTFB_P99_BUDGET_MS && c >= 1000))
    );
    let rss = get(r, "gateway", "slow").or(g).and_then(|x| {
        x.target
            .as_ref()
            .map(|t| (t.rss_kib_per_open_stream, x.open_streams_peak))
    });
    let _ = writeln!(
        o,
        "| <= {RSS_PER_STREAM_BUDGET_KIB} KiB RSS per open SSE stream | {} | {} |",
        rss.map_or("-".into(), |(k, n)| format!("{k:.2} KiB at {n} open")),
        verdict(rss.and_then(|(k, _)| rss_per_stream_met(k)))
    );
    let slow = get(r, "gateway", "slow");
    let _ = writeln!(
        o,
        "| {STREAMS_TARGET} concurrent streams, no error, 2 cores | {} | {} |",
        slow.map_or("-".into(), |x| format!(
            "{} open at peak, {} errors",
            x.open_streams_peak, x.errors_total
        )),
        verdict(slow.map(|x| x.open_streams_peak >= STREAMS_TARGET && x.errors_total == 0))
    );
    let ws = get(r, "gateway", WS)
        .and_then(cpu_event)
        .zip(get(r, "nginx", WS).and_then(cpu_event));
    let _ = writeln!(
        o,
        "| CPU per forwarded WebSocket event <= {WS_EVENT_CPU_RATIO}x nginx's (ws) | {} | {} |",
        ws.map_or("-".into(), |(a, b)| format!(
            "{a:.2} µs vs {b:.2} µs = {:.2}x",
            a / b
        )),
        verdict(ws.map(|(a, b)| a <= WS_EVENT_CPU_RATIO * b))
    );
    // The largest idle count: the one least skewed by the RSS the processes start with.
    let idle = idle_workloads(r).into_iter().rev().find_map(|(n, w)| {
        let g = get(r, "gateway", &w).and_then(idle_kib)?;
        let x = get(r, "nginx", &w).and_then(idle_kib)?;
        (x > 0.0).then_some((n, g, x))
    });
    let _ = writeln!(
        o,
        "| RSS per idle WebSocket session <= {WS_IDLE_RSS_RATIO}x nginx's (ws-idle) | {} | {} |",
        idle.map_or("-".into(), |(n, g, x)| format!(
            "{g:.2} KiB vs {x:.2} KiB at {n} sessions = {:.2}x",
            g / x
        )),
        verdict(idle.map(|(_, g, x)| g <= WS_IDLE_RSS_RATIO * x))
    );
    o
}

/// MiB with one decimal.
fn mib(kib: u64) -> String {
    f(kib as f64 / 1024.0, 1)
}

/// KiB per idle session at the end of the hold: `(RSS at the window end - RSS before) / open`.
fn idle_kib(x: &Report) -> Option<f64> {
    let t = x.target.as_ref()?;
    (x.open_at_window_end > 0).then_some(t.rss_kib_per_open_at_window_end)
}

/// A counter of mock-codex's `/__mock/stats` as run.sh saved it
/// (`mock-stats-VIA-WORKLOAD[-hold].json`).
fn mock_stat(dir: &Path, file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(format!("mock-stats-{file}.json"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get(key)?.as_u64()
}

/// The WebSocket section: idle sessions (RSS) and the streaming workload (CPU per event).
fn websocket(dir: &Path, r: &Reports) -> Option<String> {
    let idle = idle_workloads(r);
    let ws = TARGETS.iter().any(|t| get(r, t, WS).is_some());
    if idle.is_empty() && !ws {
        return None;
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "The gateway terminates each client WebSocket and sends each turn upstream itself: \
         over its per-worker pool of upstream Responses WebSockets (the default; an idle pooled \
         socket is kept per client session, at most 128 per account and worker), or over HTTP/2 + \
         SSE (`websockets = false`); the mock's counters below say which. nginx tunnels the \
         bytes to mock-codex's own WebSocket (`/backend-api/codex/responses`): one upstream \
         connection per session, idle or not. `direct` is mock-codex itself. RSS is the sampled \
         processes' only (nginx: master + workers); kernel socket buffers and the mock's \
         per-socket state behind nginx or the gateway are in neither. No permessage-deflate \
         (loadgen does not offer it).\n"
    );
    if !idle.is_empty() {
        let _ = writeln!(
            o,
            "Idle sessions (one turn each, then open and silent until the end of the hold):\n"
        );
        let _ = writeln!(
            o,
            "| sessions | via | open at end | errors | connect p50 ms | connect p99 ms | first-event p99 ms | RSS before MiB | RSS at end MiB | KiB / idle session | cores during hold | mock WS opened in the run, open in hold |"
        );
        let _ = writeln!(o, "|{}", "---|".repeat(12));
        for (n, w) in &idle {
            for t in TARGETS {
                let Some(x) = get(r, t, w) else { continue };
                let tg = x.target.clone().unwrap_or_default();
                // Upstream sockets at the mock: opened during the run, and open during the hold
                // beyond those open before it (pooled leftovers of earlier runs).
                let opened = mock_stat(dir, &format!("{t}-{w}"), "ws_handshakes");
                let held = mock_stat(dir, &format!("{t}-{w}-hold"), "ws_open").map(|h| {
                    h as i64
                        - mock_stat(dir, &format!("{t}-{w}-before"), "ws_open").unwrap_or(0) as i64
                });
                let upstream = match (opened, held) {
                    (Some(a), Some(b)) => format!("{a}, {b:+}"),
                    (Some(a), None) => format!("{a}, -"),
                    _ => "-".to_owned(),
                };
                let _ = writeln!(
                    o,
                    "| {n} | {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {upstream} |",
                    x.open_at_window_end,
                    x.errors_total,
                    f(x.connect_ms.p50, 2),
                    f(x.connect_ms.p99, 2),
                    f(x.ttfb_ms.p99, 2),
                    mib(tg.rss_start_kib),
                    mib(tg.rss_window_end_kib),
                    idle_kib(x).map_or("-".into(), |k| f(k, 2)),
                    f(tg.cpu_cores_window, 3),
                );
            }
        }
        let _ = writeln!(o);
        for (n, w) in &idle {
            if let (Some(g), Some(x)) = (
                get(r, "gateway", w).and_then(idle_kib),
                get(r, "nginx", w).and_then(idle_kib),
            ) {
                let _ = writeln!(
                    o,
                    "- RSS per idle WebSocket session at {n}: gateway {g:.2} KiB, nginx {x:.2} KiB: **{:.2}× nginx**",
                    g / x
                );
            }
        }
        // The slope between the smallest and the largest count: what each further session
        // costs once the allocator holds the memory of the first run.
        if let (Some((lo, wl)), Some((hi, wh))) = (idle.first(), idle.last()) {
            if hi > lo {
                let slope = |t: &str| {
                    let a = get(r, t, wl)?;
                    let b = get(r, t, wh)?;
                    let (ta, tb) = (a.target.as_ref()?, b.target.as_ref()?);
                    let dn = b.open_at_window_end.checked_sub(a.open_at_window_end)?;
                    (dn > 0).then(|| {
                        (tb.rss_window_end_kib as f64 - ta.rss_window_end_kib as f64) / dn as f64
                    })
                };
                let parts: Vec<String> = TARGETS
                    .iter()
                    .filter_map(|t| slope(t).map(|k| format!("{t} {k:.2} KiB")))
                    .collect();
                if !parts.is_empty() {
                    let ratio = slope("gateway")
                        .zip(slope("nginx"))
                        .filter(|(_, n)| *n > 0.0)
                        .map_or(String::new(), |(g, n)| {
                            format!(" (gateway {:.2}× nginx)", g / n)
                        });
                    let _ = writeln!(
                        o,
                        "- Marginal RSS per idle session from {lo} to {hi} (difference of the RSS at the end of the two holds / difference of open sessions): {}{ratio}",
                        parts.join(", ")
                    );
                }
            }
        }
    }
    if ws {
        if let (Some(g), Some(n)) = (get(r, "gateway", WS), get(r, "nginx", WS)) {
            if let (Some(a), Some(b)) = (cpu_event(g), cpu_event(n)) {
                let _ = writeln!(
                    o,
                    "- CPU per forwarded WebSocket event (ws, {} sessions, {:.0} events/s): gateway {a:.2} µs, nginx {b:.2} µs: **{:.2}× nginx**",
                    g.concurrency,
                    g.events_per_sec,
                    a / b
                );
            }
            if let (Some(a), Some(b)) = (worker_cpu_event(g), cpu_event(n)) {
                let _ = writeln!(
                    o,
                    "- CPU per forwarded WebSocket event, gateway worker threads only: {a:.2} µs: {:.2}× nginx",
                    a / b
                );
            }
        } else if let Some(a) = get(r, "gateway", WS).and_then(cpu_event) {
            let _ = writeln!(
                o,
                "- CPU per forwarded WebSocket event (ws): gateway {a:.2} µs (no nginx run)"
            );
        }
        if let (Some(g), Some(s)) = (
            get(r, "gateway", WS).and_then(cpu_event),
            get(r, "gateway", "sse").and_then(cpu_event),
        ) {
            let _ = writeln!(
                o,
                "- Gateway CPU per event, WebSocket vs SSE (same run): {g:.2} µs vs {s:.2} µs: {:.2}×",
                g / s
            );
        }
        if let Some(split) = get(r, "gateway", WS).and_then(thread_split) {
            let _ = writeln!(o, "- Gateway CPU by thread (ws, window): {split}");
        }
        for via in ["gateway", "nginx"] {
            if let (Some(d), Some(g)) = (get(r, "direct", WS), get(r, via, WS)) {
                let _ = writeln!(
                    o,
                    "- Added time to first event vs direct (ws, {} sessions) through {via}: p50 {:+.2} ms, p99 {:+.2} ms",
                    g.concurrency,
                    g.ttfb_ms.p50 - d.ttfb_ms.p50,
                    g.ttfb_ms.p99 - d.ttfb_ms.p99
                );
            }
        }
        for t in TARGETS {
            if let Some(x) = get(r, t, WS) {
                let upstream = match (
                    mock_stat(dir, &format!("{t}-{WS}"), "ws_handshakes"),
                    mock_stat(dir, &format!("{t}-{WS}"), "responses"),
                ) {
                    (Some(h), Some(p)) => {
                        format!("; the mock saw {h} WebSocket handshakes and {p} HTTP responses")
                    }
                    _ => String::new(),
                };
                let _ = writeln!(
                    o,
                    "- ws through {t}: {:.1} turns/s, {:.0} events/s, {} turns ok, {} errors, {} sessions opened, gap p99 {:.1} ms{upstream}",
                    x.requests_per_sec,
                    x.events_per_sec,
                    x.requests_ok,
                    x.errors_total,
                    x.sessions,
                    x.gap_ms.p99
                );
            }
        }
    }
    Some(o)
}

#[allow(clippy::print_stdout)]
fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: bench-report DIR");
        return ExitCode::from(64);
    };
    let reports = match load(Path::new(&dir)) {
        Ok(r) if !r.is_empty() => r,
        Ok(_) => {
            eprintln!(
                "bench-report: no {{direct,gateway,nginx}}-{{json,sse,slow,ws,ws-idle-N}}.json in {dir}"
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("bench-report: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("#### Results\n\n{}", table(&reports));
    let ratios = ratios(&reports);
    if !ratios.is_empty() {
        println!("#### Ratios\n\n{ratios}");
    }
    let measured = reports
        .keys()
        .any(|(_, w)| WORKLOADS.contains(&w.as_str()) || w == WS || idle_sessions(w).is_some());
    if measured {
        println!("#### Targets\n\n{}", targets(&reports));
    }
    if let Some(ws) = websocket(Path::new(&dir), &reports) {
        println!("#### WebSocket\n\n{ws}");
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_that_did_not_grow_is_not_measured() {
        assert_eq!(rss_per_stream_met(0.0), None);
        assert_eq!(verdict(rss_per_stream_met(0.0)), "not measured");
        assert_eq!(rss_per_stream_met(6.5), Some(true));
        assert_eq!(
            rss_per_stream_met(RSS_PER_STREAM_BUDGET_KIB + 0.1),
            Some(false)
        );
    }
}
