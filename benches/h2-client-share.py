#!/usr/bin/env python3
"""The upstream h2 client's share of a cpu-per-request.sh callgrind run (benches/README.md,
"Profiling").

Usage: benches/h2-client-share.py OUT_DIR [base new]

OUT_DIR is a `benches/cpu-per-request.sh` result directory (callgrind-{base,new}.*.1 and
summary.txt). Prints, per binary and per counted request, the inclusive instructions of the
h2 client's entry points: the connection task (`Connection::poll`: frame reading and
writing, HPACK, stream bookkeeping), `Upstream::send` (building and sending the request head,
waiting for the response head), the response-head lookups and the body chunks, plus the
parts inside them named in the table. Names differ between builds where inlining differs,
so each pattern takes the largest matching entry.
"""
import glob
import os
import re
import subprocess
import sys

PARTS = {
    "connection task (Connection::poll)": r"vendor/monoio-http/src/h2/(client|proto/connection)\.rs:(<monoio_http::h2::client::Connection<T,B> as core::future::future::Future>::poll|monoio_http::h2::proto::connection::Connection<T,P,B>::poll) \[",
    "Upstream::send (request head out, response head in)": r"gateway/src/upstream\.rs:gateway::upstream::Upstream::send::\{\{closure\}\} \[",
    "response head lookups": r"(gateway::upstream::UpstreamResponse::header|monoio_http::h2::fields::Fields::get) \[",
    "body chunks (UpstreamBody::try_chunk)": r"gateway::upstream::UpstreamBody::try_chunk \[",
}
INSIDE = {
    "  of which HPACK encode (Encoder::encode)": r"hpack::encoder::Encoder::encode \[",
    "  of which HPACK decode into the head (HeaderBlock::load)": r"HeaderBlock::load \[",
    "  of which frame reading (FramedRead::next)": r"FramedRead<T> as monoio::io::stream::Stream>::next::\{\{closure\}\} \[",
    "  of which DATA frames received (DynStreams::recv_data)": r"DynStreams<B>::recv_data \[",
    "  of which frames written (Prioritize::poll_complete)": r"Prioritize::poll_complete \[",
    "  of which stream lookups (Store::find_mut)": r"store::Store::find_mut \[",
}


def main() -> None:
    out_dir = sys.argv[1]
    names = sys.argv[2:] or ["base", "new"]
    summary = open(f"{out_dir}/summary.txt").read()
    requests = int(re.search(r"legacy driver, (\d+) requests", summary).group(1))
    for name in names:
        f = os.path.abspath(sorted(glob.glob(f"{out_dir}/callgrind-{name}.*.1"))[-1])
        text = subprocess.run(
            ["callgrind_annotate", "--auto=no", "--inclusive=yes", "--threshold=100", f],
            capture_output=True, text=True, check=True,
            # From `/`: under the source tree callgrind_annotate shortens (and regroups) paths.
            cwd="/",
        ).stdout
        total, best = 0, {}
        for line in text.splitlines():
            m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
            if not m:
                continue
            v, fn = int(m.group(1).replace(",", "")), m.group(2)
            if "PROGRAM TOTALS" in fn:
                total = v
                continue
            for k, p in {**PARTS, **INSIDE}.items():
                if re.search(p, fn):
                    best[k] = max(best.get(k, 0), v)
        h2 = sum(best.get(k, 0) for k in PARTS)
        print(f"{name}: {total / requests:,.0f} instructions/request; "
              f"h2 client {h2 / requests:,.0f} ({100 * h2 / max(total, 1):.1f} %)")
        for k in [*PARTS, *INSIDE]:
            print(f"  {k}: {best.get(k, 0) / requests:,.0f}")


if __name__ == "__main__":
    main()
