#!/usr/bin/env bash
# 100,000 open SSE streams on one host (issue 25; benches/README.md, "Open streams at scale").
#
# Opens STREAMS (100,000) concurrent slow SSE streams (SLOW_RATE events/s each, endless
# answers) over RAMP seconds, holds them HOLD seconds, and reports for each VIA (gateway,
# nginx): errors, the target's RSS and CPU, first-event latency (loadgen's time to first byte)
# and the RSS per open stream at each of CHECKPOINTS open streams (is it flat?).
#
# Descriptors: every process needs one descriptor per connection it holds. The script raises
# the open-file limit to what it needs (STREAMS + margin) when it can; where the hard limit
# cannot be raised (no CAP_SYS_RESOURCE: a container), the load is split into LANES, each
# under the limit:
#   gateway: LANES gateway processes (each GATEWAY_WORKERS workers, its own data directory and
#            mock-codex), each with its own loadgen; RSS and CPU are the sums over the lanes;
#   nginx:   one nginx (master + NGINX_WORKERS workers, `reuseport`), each worker under the
#            limit with two descriptors per stream; its upstream is every lane's mock-codex
#            (HTTP/1.1, one upstream connection per stream).
# Each lane's loadgen binds its connections to its own source address in 127.0.0.0/8
# (`--source-ip`): one source address gives one destination about 28,000 ephemeral ports.
#
# Build first:  cargo build --release -p codex-gateway -p codex-gateway-benches
# Run:          benches/streams-100k.sh
#               STREAMS=20000 HOLD=20 RAMP=20 VIA=gateway benches/streams-100k.sh
# Results:      target/bench-results/streams-<timestamp>/{summary.md,samples-*.tsv,*.json,*.log}
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
OUT=${OUT:-$ROOT/target/bench-results/streams-$(date +%Y%m%d-%H%M%S)}
STREAMS=${STREAMS:-100000}
HOLD=${HOLD:-60}
RAMP=${RAMP:-100}
SLOW_RATE=${SLOW_RATE:-0.2}
VIA=${VIA:-"gateway nginx"}
CHECKPOINTS=${CHECKPOINTS:-"10000 50000 100000"}
GATEWAY_WORKERS=${GATEWAY_WORKERS:-2}
MOCK_WORKERS=${MOCK_WORKERS:-1}
MOCK_H2_MAX_STREAMS=${MOCK_H2_MAX_STREAMS:-128}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
MODEL=${MODEL:-gpt-5.5}
NGINX=${NGINX:-nginx}
# Descriptors kept free per process beyond its connections (listeners, files, upstream h2).
MARGIN=${MARGIN:-1000}
# Stop the run when the host's available memory falls below this (MiB).
MIN_AVAILABLE_MIB=${MIN_AVAILABLE_MIB:-1500}
SAMPLE_SECS=${SAMPLE_SECS:-2}

for b in mock-codex loadgen codex-gateway; do
  [[ -x $BIN/$b ]] || { echo "streams-100k.sh: $BIN/$b is missing" >&2; exit 1; }
done
mkdir -p "$OUT"
NAME=streams-100k
# shellcheck source=benches/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup codex-streams

# --- descriptors and lanes --------------------------------------------------------------------
want=$((STREAMS + MARGIN))
ulimit -Hn "$want" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
PER_PROC=$((NOFILE - MARGIN))
((PER_PROC > 0)) || { log "open-file limit $NOFILE is below the margin $MARGIN"; exit 1; }
LANES=${LANES:-$(((STREAMS + PER_PROC - 1) / PER_PROC))}
PER_LANE=$(((STREAMS + LANES - 1) / LANES))
# nginx holds a client and an upstream descriptor per stream.
NGINX_WORKERS=${NGINX_WORKERS:-$(((2 * STREAMS + PER_PROC - 1) / PER_PROC + 1))}
# Upstream h2 connections per gateway worker: enough for the lane's streams, twice over.
H2_CONNECTIONS=${H2_CONNECTIONS:-$((2 * PER_LANE / MOCK_H2_MAX_STREAMS / GATEWAY_WORKERS + 2))}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm); $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
  echo "memory: $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo); available at start $(awk '/MemAvailable/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "open files per process: $NOFILE (wanted $want; fs.nr_open $(cat /proc/sys/fs/nr_open))"
  echo "local port range: $(cat /proc/sys/net/ipv4/ip_local_port_range | tr '\t' '-'); tcp_mem $(cat /proc/sys/net/ipv4/tcp_mem | tr '\t' ' ')"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "streams: $STREAMS at $SLOW_RATE events/s each, ramp ${RAMP}s, hold ${HOLD}s; checkpoints $CHECKPOINTS"
  echo "lanes: $LANES x $PER_LANE streams (one gateway of $GATEWAY_WORKERS workers + one mock-codex of $MOCK_WORKERS workers + one loadgen each); nginx: $NGINX_WORKERS workers"
  echo "via: $VIA"
} | tee "$OUT/machine.txt" >&2

# --- processes --------------------------------------------------------------------------------
# start_mock I: mock-codex of lane I (MOCK_ORIGIN[I], MOCK_PIDS[I]).
MOCK_ORIGIN=()
MOCK_PIDS=()
start_mock() {
  local i=$1
  RUST_LOG=warn "$BIN/mock-codex" --listen 127.0.0.1:0 --workers "$MOCK_WORKERS" --max-recorded 0 \
    --h2-max-concurrent-streams "$MOCK_H2_MAX_STREAMS" --write-auth-json "$WORK/auth-$i" \
    --account "acct-lane-$i" >"$OUT/mock-$i.log" 2>&1 &
  MOCK_PIDS[i]=$!
  PIDS+=("$!")
  MOCK_ORIGIN[i]=$(wait_line "$OUT/mock-$i.log" 'http://127\.0\.0\.1:[0-9]+')
  wait_line "$OUT/mock-$i.log" "acct-lane-$i" >/dev/null
}

GW_PIDS=()
GW_ORIGIN=()
GW_KEY=()
start_gateway() {
  local i=$1 data=$WORK/gateway-$i
  mkdir -p "$data"
  cat >"$WORK/gateway-$i.toml" <<EOF
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "$data"
workers = $GATEWAY_WORKERS
client_idle_timeout_secs = 600
# The automatic bound (open-file limit minus a reserve, halved) keeps a descriptor per client
# connection for an HTTP/1.1 upstream; the h2c upstream here needs a few hundred in all.
max_connections = $((PER_LANE + 200))

[upstream]
base_url = "${MOCK_ORIGIN[i]}/backend-api/codex"
oauth_token_url = "${MOCK_ORIGIN[i]}/oauth/token"
plain_http = "h2c"
h2_max_streams_per_connection = $MOCK_H2_MAX_STREAMS
h2_max_connections = $H2_CONNECTIONS
EOF
  RUST_LOG=warn "$BIN/codex-gateway" accounts import --data-dir "$data" \
    --oauth-token-url "${MOCK_ORIGIN[i]}/oauth/token" "$WORK/auth-$i"/*.json >>"$OUT/gateway-$i.log" 2>&1
  GW_KEY[i]=$(RUST_LOG=warn "$BIN/codex-gateway" keys create bench --data-dir "$data" 2>>"$OUT/gateway-$i.log" | tail -1)
  RUST_LOG=warn "$BIN/codex-gateway" serve --config "$WORK/gateway-$i.toml" >>"$OUT/gateway-$i.log" 2>&1 &
  GW_PIDS[i]=$!
  PIDS+=("$!")
  GW_ORIGIN[i]=$(wait_line "$OUT/gateway-$i.log" 'listening on http://127\.0\.0\.1:[0-9]+' | sed 's/listening on //')
}

NGINX_PID=
NGINX_ORIGIN=
start_nginx() {
  command -v "$NGINX" >/dev/null || { log "nginx not installed: skipped"; return 1; }
  local prefix=$WORK/nginx port upstreams="" i
  port=$(free_port)
  mkdir -p "$prefix"
  for i in $(seq 1 "$LANES"); do
    upstreams+="${upstreams:+; server }${MOCK_ORIGIN[i]#http://}"
  done
  # reuseport: the kernel spreads connections evenly over the workers (each must stay under
  # its descriptor limit); worker_connections as the limit allows.
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@WORKERS@|$NGINX_WORKERS|g" \
    -e "s|@UPSTREAM@|$upstreams|g" -e "s|@LISTEN@|127.0.0.1:$port|g" \
    -e "s|backlog=4096;|backlog=4096 reuseport;|" \
    -e "s|worker_rlimit_nofile 65536;|worker_rlimit_nofile $NOFILE;|" \
    -e "s|worker_connections 32768;|worker_connections $((NOFILE - 100));|" \
    "$ROOT/benches/nginx.conf.template" >"$prefix/nginx.conf"
  "$NGINX" -p "$prefix" -c "$prefix/nginx.conf" >"$OUT/nginx.log" 2>&1 &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  local workers=""
  for i in $(seq 1 100); do
    workers=$(pgrep -P "$NGINX_PID" | paste -sd, - || true)
    [[ $(echo "$workers" | tr ',' '\n' | grep -c .) -ge $NGINX_WORKERS ]] && break
    sleep 0.1
  done
  NGINX_PIDLIST=$NGINX_PID,$workers
  NGINX_ORIGIN=http://127.0.0.1:$port
  log "nginx $NGINX_ORIGIN (master $NGINX_PID, $NGINX_WORKERS workers)"
}

# --- sampling ---------------------------------------------------------------------------------
# rss_sum PIDS...: summed VmRSS (KiB); cpu_sum PIDS...: summed utime + stime (ticks).
rss_sum() { local p s=0 r; for p in "$@"; do r=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0); s=$((s + ${r:-0})); done; echo $s; }
cpu_sum() { local p s=0 r; for p in "$@"; do r=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0); s=$((s + ${r:-0})); done; echo $s; }
open_streams() {
  local i s=0 n
  for i in $(seq 1 "$LANES"); do
    n=$(curl -s --max-time 2 "${MOCK_ORIGIN[i]}/__mock/stats" | sed -n 's/.*"active_streams":\([0-9]*\).*/\1/p')
    s=$((s + ${n:-0}))
  done
  echo $s
}
# sampler VIA FILE TARGET_PIDS...: one line every SAMPLE_SECS until $WORK/stop-sampler exists;
# stops the loadgens when memory runs low.
sampler() {
  local via=$1 file=$2
  shift 2
  local t0=$SECONDS
  echo -e "secs\topen_upstream\ttarget_rss_kib\ttarget_cpu_ticks\tmock_rss_kib\tloadgen_rss_kib\tmem_available_mib\tloadavg" >"$file"
  while [[ ! -e $WORK/stop-sampler ]]; do
    local avail
    avail=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
    echo -e "$((SECONDS - t0))\t$(open_streams)\t$(rss_sum "$@")\t$(cpu_sum "$@")\t$(rss_sum "${MOCK_PIDS[@]}")\t$(rss_sum "${LG_PIDS[@]}")\t$avail\t$(cut -d' ' -f1 /proc/loadavg)" >>"$file"
    if ((avail < MIN_AVAILABLE_MIB)); then
      log "only $avail MiB available: stopping the loadgens"
      echo "stopped: only $avail MiB available" >>"$OUT/$via-stopped.txt"
      kill "${LG_PIDS[@]}" 2>/dev/null || true
    fi
    sleep "$SAMPLE_SECS"
  done
}

# run_via VIA: the loadgens of every lane at once, the sampler beside them.
run_via() {
  local via=$1 i url key pids target=() acct=()
  rm -f "$WORK/stop-sampler"
  LG_PIDS=()
  # Warm-up (upstream connections, caches), not measured.
  for i in $(seq 1 "$LANES"); do
    case $via in
      gateway) url=${GW_ORIGIN[i]}/v1/responses key=${GW_KEY[i]} acct=() ;;
      nginx) url=$NGINX_ORIGIN/backend-api/codex/responses key=mock-token acct=(-H "chatgpt-account-id:acct-lane-$i") ;;
    esac
    "$BIN/loadgen" --url "$url" --key "$key" "${acct[@]}" --model "$MODEL" \
      --concurrency 4 --requests 40 --client-metadata x-mock-deltas=4 >/dev/null
  done
  sleep 2
  case $via in
    gateway) target=("${GW_PIDS[@]}") ;;
    nginx) IFS=, read -r -a target <<<"$NGINX_PIDLIST" ;;
  esac
  local base_rss
  base_rss=$(rss_sum "${target[@]}")
  echo "$base_rss" >"$OUT/$via-base-rss-kib.txt"
  for i in $(seq 1 "$LANES"); do
    case $via in
      gateway) url=${GW_ORIGIN[i]}/v1/responses key=${GW_KEY[i]} pids=${GW_PIDS[i]} acct=() ;;
      nginx) url=$NGINX_ORIGIN/backend-api/codex/responses key=mock-token pids=$NGINX_PIDLIST acct=(-H "chatgpt-account-id:acct-lane-$i") ;;
    esac
    # Lane i's source address: 127.0.1.i (its own ephemeral port range to the target).
    "$BIN/loadgen" --url "$url" --key "$key" "${acct[@]}" --model "$MODEL" \
      --source-ip "127.0.1.$i" --target-pid "$pids" --threads "$LOADGEN_THREADS" \
      --concurrency "$PER_LANE" --ramp-up-secs "$RAMP" --duration-secs "$HOLD" \
      --idle-timeout-secs 120 --sample-ms 1000 --label "$via/lane-$i" --json \
      --client-metadata "x-mock-events-per-second=$SLOW_RATE" \
      --client-metadata "x-mock-tokens=1000000" >"$OUT/$via-lane-$i.json" 2>"$OUT/$via-lane-$i.log" &
    LG_PIDS+=("$!")
  done
  log "$via: $LANES loadgens, $PER_LANE streams each, ramp ${RAMP}s + hold ${HOLD}s"
  sampler "$via" "$OUT/samples-$via.tsv" "${target[@]}" &
  local sampler_pid=$!
  local rc=0
  for i in "${LG_PIDS[@]}"; do wait "$i" || rc=1; done
  touch "$WORK/stop-sampler"
  wait "$sampler_pid" || true
  ((rc == 0)) || log "$via: a loadgen failed (see $OUT/$via-lane-*.log)"
  report "$via" "$base_rss"
  sleep 5
}

# report VIA BASE_RSS: the lanes' loadgen reports and the samples, as markdown.
report() {
  local via=$1 base=$2
  python3 - "$OUT" "$via" "$base" "$CHECKPOINTS" "$STREAMS" "$(getconf CLK_TCK)" <<'PY' | tee -a "$OUT/summary.md"
import glob, json, sys
out, via, base, checkpoints, streams, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split()], int(sys.argv[5]), int(sys.argv[6])
lanes = []
for f in sorted(glob.glob(f"{out}/{via}-lane-*.json")):
    try:
        lanes.append(json.load(open(f)))
    except Exception:
        pass
rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/samples-{via}.tsv")][1:]
rows = [[float(x) for x in r] for r in rows if len(r) == 8]
print(f"\n### {via}: {streams:,} streams\n")
if not lanes:
    print("no loadgen report (see the lane logs)")
    sys.exit(0)
errors = {}
for l in lanes:
    e = l["errors"]
    for k in ("connect", "io", "timeout", "stream_failed", "truncated", "closed"):
        errors[k] = errors.get(k, 0) + e.get(k, 0)
    for k, v in e.get("status", {}).items():
        errors[f"status {k}"] = errors.get(f"status {k}", 0) + v
peak = sum(l["open_streams_peak"] for l in lanes)
at_end = sum(l.get("open_at_window_end", 0) for l in lanes)
events = sum(l["events_window"] for l in lanes)
win = max(l["window_secs"] for l in lanes)
ttfb_p50 = max(l["ttfb_ms"]["p50"] for l in lanes)
ttfb_p99 = max(l["ttfb_ms"]["p99"] for l in lanes)
ttfb_max = max(l["ttfb_ms"]["max"] for l in lanes)
print("| figure | value |\n|---|---|")
print(f"| streams open at peak (loadgen, summed) | {peak:,} of {streams:,} |")
print(f"| open at the end of the hold | {at_end:,} |")
print(f"| errors | {sum(errors.values())} {dict((k, v) for k, v in errors.items() if v)} |")
print(f"| first event (time to first byte), worst lane p50 / p99 / max | {ttfb_p50:.2f} / {ttfb_p99:.2f} / {ttfb_max:.1f} ms |")
print(f"| events/s in the hold | {events / max(win, 1e-9):,.0f} |")
if rows:
    peak_row = max(rows, key=lambda r: r[1])
    hold = [r for r in rows if r[1] >= 0.98 * peak_row[1]]
    if len(hold) >= 2:
        cpu = (hold[-1][3] - hold[0][3]) / tck / max(hold[-1][0] - hold[0][0], 1e-9)
        print(f"| target CPU in the hold (cores) | {cpu:.3f} over {hold[-1][0] - hold[0][0]:.0f} s |")
        rate = events / max(win, 1e-9)
        if rate > 0:
            print(f"| target CPU per forwarded event in the hold | {cpu * 1e6 / rate:.1f} µs |")
    cpu_all = (rows[-1][3] - rows[0][3]) / tck
    print(f"| target CPU, whole run (ramp included) | {cpu_all:.1f} s |")
    print(f"| target RSS before / at peak / max | {base / 1024:.1f} / {peak_row[2] / 1024:.1f} / {max(r[2] for r in rows) / 1024:.1f} MiB |")
    print(f"| mock-codex RSS max (all lanes) | {max(r[4] for r in rows) / 1024:.1f} MiB |")
    print(f"| loadgen RSS max (all lanes) | {max(r[5] for r in rows) / 1024:.1f} MiB |")
    print(f"| host memory available, lowest | {min(r[6] for r in rows):,.0f} MiB |")
    print(f"| load average, highest | {max(r[7] for r in rows):.1f} |")
    print("\nRSS per open stream as the streams open ((target RSS - RSS before) / streams open upstream, from the samples):\n")
    print("| open streams | sample at | target RSS MiB | KiB per stream |\n|---:|---:|---:|---:|")
    for c in checkpoints + [int(peak_row[1])]:
        r = next((r for r in rows if r[1] >= c), None)
        if r is None:
            print(f"| {c:,} | not reached | - | - |")
            continue
        print(f"| {int(r[1]):,} | {r[0]:.0f} s | {r[2] / 1024:.1f} | {(r[2] - base) / r[1]:.2f} |")
per = [l.get("target", {}) or {} for l in lanes]
if via == "gateway":
    print("\nPer lane (one gateway process each; loadgen's own figures):\n")
    print("| lane | open at peak | RSS before → at peak MiB | KiB per stream | CPU µs/event | errors |\n|---|---:|---|---:|---:|---:|")
    for i, (l, t) in enumerate(zip(lanes, per), 1):
        print(f"| {i} | {l['open_streams_peak']:,} | {t.get('rss_start_kib', 0) / 1024:.1f} → {t.get('rss_at_peak_open_kib', 0) / 1024:.1f} | {t.get('rss_kib_per_open_stream', 0):.2f} | {t.get('cpu_us_per_event', 0):.1f} | {l['errors_total']} |")
PY
}

# --- the run ----------------------------------------------------------------------------------
for i in $(seq 1 "$LANES"); do start_mock "$i"; done
log "mock-codex: $LANES processes"
for v in $VIA; do
  case $v in
    gateway)
      for i in $(seq 1 "$LANES"); do start_gateway "$i"; done
      log "codex-gateway: $LANES processes of $GATEWAY_WORKERS workers"
      run_via gateway
      for i in $(seq 1 "$LANES"); do kill -INT "${GW_PIDS[i]}" 2>/dev/null || true; done
      for i in $(seq 1 "$LANES"); do wait "${GW_PIDS[i]}" 2>/dev/null || true; done
      ;;
    nginx)
      if start_nginx; then
        run_via nginx
        kill -QUIT "$NGINX_PID" 2>/dev/null || true
        wait "$NGINX_PID" 2>/dev/null || true
      fi
      ;;
  esac
done
{
  echo
  echo '#### Machine'
  echo
  sed 's/^/    /' "$OUT/machine.txt"
} >>"$OUT/summary.md"
log "results in $OUT"
