#!/usr/bin/env python3
"""Where a gateway request's user-space instructions go, from a cpu-per-request.sh callgrind
run (benches/README.md, "Profiling").

Usage: benches/cost-breakdown.py OUT_DIR [name ...]

OUT_DIR is a `benches/cpu-per-request.sh` result directory (callgrind-NAME.*.1 and
summary.txt; NAME defaults to every binary in it: base, new). Prints, per binary, the
instructions per counted request of the process by thread and of the parts of a request
named below (inclusive counts of their entry points; callgrind's attribution across async
state machines is approximate, so the parts are guides and the thread totals are exact).
Names differ between builds where inlining differs: each pattern takes the largest matching
entry.
"""
import glob
import re
import subprocess
import sys

THREADS = {
    "data-plane workers (gateway-worker-*)": r"gateway/src/worker\.rs:gateway::worker::run \[",
    "sidecar (Tokio: usage intake, spool, storage calls)": r"admin/src/lib\.rs:std::sys::backtrace::__rust_begin_short_backtrace",
    "SQLite (sqlx-sqlite-worker)": r"sqlx-sqlite-[0-9.]+/src/connection/worker\.rs:std::sys::backtrace::__rust_begin_short_backtrace",
}
# Parts of a request on the workers: (label, pattern, parent label or None). A parent's row is
# its inclusive count; "rest of" rows are the parent minus its listed children.
PARTS = [
    ("request handling (api::handle)", r"gateway/src/api\.rs:gateway::api::handle::\{\{closure\}\} \[", None),
    ("JSON depth guard over the body (depth::check)", r"codex_protocol::depth::check \[", "request handling (api::handle)"),
    ("request normalisation (normalize_responses_with / _owned)", r"codex_protocol::normalize::normalize_responses_(with|owned) \[", "request handling (api::handle)"),
    ("attempt: account pick, body, send (lifecycle::open_with)", r"gateway::lifecycle::open_with::\{\{closure\}\} \[", "request handling (api::handle)"),
    ("account-bound state scan of the input (bound::input_blobs)", r"codex_protocol::bound::input_blobs \[", "attempt: account pick, body, send (lifecycle::open_with)"),
    ("per-account body (Connector::body_for)", r"Connector>::body_for \[", "attempt: account pick, body, send (lifecycle::open_with)"),
    ("upstream request head out, response head in (Upstream::send)", r"gateway::upstream::Upstream::send::\{\{closure\}\} \[", "attempt: account pick, body, send (lifecycle::open_with)"),
    ("SSE split and batching (Committed::next_events)", r"gateway::lifecycle::Committed::next_events::\{\{closure\}\} \[", "request handling (api::handle)"),
    ("event inspection: type, usage, errors (Observed::observe)", r"gateway::pipeline::Observed::observe \[", "request handling (api::handle)"),
    ("client writes (h1 Conn::write_owned)", r"gateway::server::h1::Conn<S>::write_owned::\{\{closure\}\} \[", "request handling (api::handle)"),
    ("the encoder: SSE bytes / JSON aggregation, transcript capture (Capturing::event)", r"Capturing<E> as gateway::pipeline::Encoder>::event \[", "request handling (api::handle)"),
    ("h2 connection task (frames in and out, HPACK, flow control)", r"(client|proto/connection)\.rs:(<monoio_http::h2::client::Connection<T,B> as core::future::future::Future>::poll|monoio_http::h2::proto::connection::Connection<T,P,B>::poll) \[", None),
]
SELF = {
    "memcpy (self, all threads)": r"__memcpy_avx_unaligned_erms",
    "allocator (mimalloc, self, all threads)": r"(mi_|_mi_)",
}


def annotate(path: str, inclusive: bool) -> list[tuple[int, str]]:
    out = subprocess.run(
        ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", "--threshold=100", "--auto=no", path],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.*)", line)
        if m and m.group(2) and not m.group(2).startswith(("PROGRAM TOTALS", "=>", "<", ">")):
            rows.append((int(m.group(1).replace(",", "")), m.group(2)))
    return rows


def largest(rows, pat):
    return max((n for n, name in rows if re.search(pat, name)), default=0)


def main() -> None:
    out_dir = sys.argv[1]
    summary = open(f"{out_dir}/summary.txt").read()
    m = re.search(r"\((?:callgrind[^,]*), (?:legacy driver, )?(\d+) requests", summary)
    n = int(m.group(1)) if m else 2000
    names = sys.argv[2:] or sorted({re.sub(r".*callgrind-([a-z0-9]+)\..*", r"\1", f) for f in glob.glob(f"{out_dir}/callgrind-*.1")} - {"nginx"})
    for name in names:
        f = sorted(glob.glob(f"{out_dir}/callgrind-{name}.*.1"))[-1]
        inc = annotate(f, True)
        exc = annotate(f, False)
        total = int(re.search(r"^(?:summary|totals):\s+(\d+)", open(f).read(), re.M).group(1))
        print(f"## {name}: {total / n:,.0f} instructions per request ({n} requests)\n")
        print("| part | instructions / request | share |\n|---|---:|---:|")
        row = lambda label, v: print(f"| {label} | {v / n:,.0f} | {100 * v / total:.1f} % |")
        for label, pat in THREADS.items():
            row(label, largest(inc, pat))
        vals = {label: largest(inc, pat) for label, pat, _ in PARTS}
        depth = {}
        for label, _, parent in PARTS:
            depth[label] = 0 if parent is None else depth[parent] + 1
        for label, _, parent in PARTS:
            row("  " * (depth[label] + 1) + label, vals[label])
            kids = [k for k, _, p in PARTS if p == label]
            if kids:
                rest = vals[label] - sum(vals[k] for k in kids)
                row("  " * (depth[label] + 2) + f"rest of {label.split(' (')[0]}", max(rest, 0))
        workers = largest(inc, THREADS["data-plane workers (gateway-worker-*)"])
        top = sum(vals[k] for k, _, p in PARTS if p is None)
        row("  rest of the workers (runtime, timers, other tasks)", max(workers - top, 0))
        for label, pat in SELF.items():
            row(label, sum(v for v, nm in exc if re.search(pat, nm)))
        print()


if __name__ == "__main__":
    main()
