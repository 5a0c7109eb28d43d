//! `bench-report DIR`: reads the loadgen JSON reports `benches/run.sh` wrote to `DIR`
//! (`{direct,gateway,nginx}-{json,sse,slow}.json`) and prints, as Markdown, the results table,
//! the ratios (gateway vs nginx CPU per event, added TTFB vs direct, RSS per open stream, most
//! streams held without error) and whether each target is met. Targets are reported, never
//! asserted. Exit codes: 0, 64 for bad usage, 1 when DIR holds no report.

use std::{collections::BTreeMap, fmt::Write as _, path::Path, process::ExitCode};

use benches::loadgen::Report;

const TARGETS: [&str; 3] = ["direct", "gateway", "nginx"];
const WORKLOADS: [&str; 3] = ["json", "sse", "slow"];

/// Target: added TTFB p99 at the SSE workload, ms.
const TTFB_P99_BUDGET_MS: f64 = 2.0;
/// Target: RSS per open SSE stream, KiB.
const RSS_PER_STREAM_BUDGET_KIB: f64 = 16.0;
/// Target: concurrent streams held without error.
const STREAMS_TARGET: u64 = 10_000;

type Reports = BTreeMap<(String, String), Report>;

fn load(dir: &Path) -> Result<Reports, String> {
    let mut out = BTreeMap::new();
    for t in TARGETS {
        for w in WORKLOADS {
            let p = dir.join(format!("{t}-{w}.json"));
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            let r: Report =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            out.insert((t.to_owned(), w.to_owned()), r);
        }
    }
    Ok(out)
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
        "| workload | via | clients | ok | cut | errors | peak open | req/s | events/s | TTFB p50 ms | TTFB p99 ms | latency p50 ms | latency p99 ms | gap p99 ms | CPU µs/event | CPU µs/req | cores | RSS KiB/stream | RSS peak MiB | loadgen CPU s |"
    );
    let _ = writeln!(o, "|{}", "---|".repeat(20));
    for w in WORKLOADS {
        for t in TARGETS {
            let Some(x) = get(r, t, w) else { continue };
            let tg = x.target.clone().unwrap_or_default();
            let _ = writeln!(
                o,
                "| {w} | {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
    if let (Some(g), Some(n)) = (get(r, "gateway", "json"), get(r, "nginx", "json")) {
        let (a, b) = (
            g.target.as_ref().map_or(0.0, |t| t.cpu_us_per_request),
            n.target.as_ref().map_or(0.0, |t| t.cpu_us_per_request),
        );
        if b > 0.0 {
            let _ = writeln!(
                o,
                "- CPU per request (json): gateway {a:.1} µs, nginx {b:.1} µs: **{:.2}× nginx**",
                a / b
            );
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

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "not measured",
    }
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
        "| CPU per forwarded event <= nginx's (sse; whole gateway process) | {}{} | {} |",
        cpu.map_or("-".into(), |(a, b)| format!("{a:.2} µs vs {b:.2} µs")),
        workers.map_or(String::new(), |w| format!(
            " (worker threads alone: {w:.2} µs)"
        )),
        verdict(cpu.map(|(a, b)| a <= b))
    );
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
        verdict(rss.map(|(k, _)| k <= RSS_PER_STREAM_BUDGET_KIB))
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
    o
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
            eprintln!("bench-report: no {{direct,gateway,nginx}}-{{json,sse,slow}}.json in {dir}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("bench-report: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("#### Results\n\n{}", table(&reports));
    println!("#### Ratios\n\n{}", ratios(&reports));
    println!("#### Targets\n\n{}", targets(&reports));
    ExitCode::SUCCESS
}
