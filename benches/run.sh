#!/usr/bin/env bash
# Macro benchmark of codex-gateway (see benches/README.md, section "Macro benchmark").
#
# One run measures the same workloads
#   (a) direct to mock-codex,
#   (b) through codex-gateway (gateway -> mock over h2c, as in production over h2),
#   (c) through nginx as a raw reverse proxy (when nginx is installed; else skipped),
# then prints the results, the ratios and the targets (met or not) with bench-report.
#
# Workloads:
#   json     short non-stream JSON answers (closed loop, JSON_CLIENTS clients)
#   sse      SSE_STREAMS concurrent streams at SSE_RATE events/s each
#   slow     SLOW_STREAMS open slow streams (SLOW_RATE events/s each)
#   short    short streamed answers at full rate (closed loop, SHORT_CLIENTS clients, a
#            12-event answer each: per-request costs of a stream)
#   short-h1 `short` through a second gateway whose upstream is HTTP/1.1 (not in the default
#            list; nginx runs it again, direct does not)
#   codex    `short` with the request the Codex CLI 0.171.0 sent (38 KB, recorded:
#            tests/fuzz/corpus/normalize/seed-codex-cli-0.171.0-recorded), not in the default
#            list; bench-report does not tabulate it (read codex-*.json)
#   ws-idle  Responses WebSocket: for each N in WS_IDLE_SESSIONS, N sessions do one turn each,
#            then stay open and silent for WS_IDLE_SECS (RSS per idle session)
#   ws       WS_SESSIONS WebSocket sessions, chained turns back to back, WS_RATE events/s each
#            (CPU per forwarded WebSocket event)
# The WebSocket workloads are not in the default list: WORKLOADS="ws-idle ws" benches/run.sh.
# The gateway terminates the client WebSocket and sends each turn upstream itself (over its
# pooled upstream WebSockets, or HTTP/2 + SSE with GATEWAY_UPSTREAM_WS=0); nginx tunnels the
# bytes to mock-codex's own WebSocket (/backend-api/codex/responses). The mock's counters
# after each run (upstream sockets opened, still open) are kept as mock-stats-VIA-WORKLOAD.json.
#
# Build first:  cargo build --release -p codex-gateway -p codex-gateway-benches
# Run:          benches/run.sh                      (full scale, about 5 minutes)
#               SCALE=0.2 benches/run.sh            (every client count x 0.2)
#               WORKLOADS="sse" VIA="direct gateway" benches/run.sh
#               PROFILE=1 benches/run.sh            (+ unmeasured perf runs of gateway json/sse)
#               WORKLOADS="ws-idle ws" benches/run.sh (the WebSocket workloads)
# Results:      target/bench-results/<timestamp>/{*.json,summary.md,machine.txt,*.log}
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
OUT=${OUT:-$ROOT/target/bench-results/$(date +%Y%m%d-%H%M%S)}
SCALE=${SCALE:-1}
WORKLOADS=${WORKLOADS:-"json short sse slow"}
VIA=${VIA:-"direct gateway nginx"}
GATEWAY_WORKERS=${GATEWAY_WORKERS:-2}
# 0: the gateway sends client WebSocket turns upstream over HTTP/2 + SSE ([upstream]
# websockets = false); empty: its default (pooled upstream WebSockets).
GATEWAY_UPSTREAM_WS=${GATEWAY_UPSTREAM_WS:-}
NGINX_WORKERS=${NGINX_WORKERS:-$GATEWAY_WORKERS}
MOCK_WORKERS=${MOCK_WORKERS:-2}
# SETTINGS_MAX_CONCURRENT_STREAMS of the mock (real origins advertise 100-256), and what the
# gateway puts on one upstream connection before it opens another (GATEWAY_H2_STREAMS) and how
# many it opens per worker (GATEWAY_H2_CONNECTIONS; empty: the gateway's default).
MOCK_H2_MAX_STREAMS=${MOCK_H2_MAX_STREAMS:-128}
GATEWAY_H2_STREAMS=${GATEWAY_H2_STREAMS:-$MOCK_H2_MAX_STREAMS}
GATEWAY_H2_CONNECTIONS=${GATEWAY_H2_CONNECTIONS:-}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
# CPU lists (taskset -c) to pin each process to, e.g. on a many-core host CPUS_GATEWAY=0-3
# CPUS_MOCK=8-11 CPUS_LOADGEN=12-15; empty: not pinned.
CPUS_GATEWAY=${CPUS_GATEWAY:-}
CPUS_NGINX=${CPUS_NGINX:-$CPUS_GATEWAY}
CPUS_MOCK=${CPUS_MOCK:-}
CPUS_LOADGEN=${CPUS_LOADGEN:-}
# The nginx binary (a copy unpacked from a .deb works too).
NGINX=${NGINX:-nginx}
ACCOUNTS=${ACCOUNTS:-4}
PROFILE=${PROFILE:-0}
# A model the gateway's catalog knows (it answers 404 model_not_found otherwise).
MODEL=${MODEL:-gpt-5.5}

scaled() { awk -v n="$1" -v s="$SCALE" 'BEGIN { v = int(n * s + 0.5); print (v < 1 ? 1 : v) }'; }
JSON_CLIENTS=${JSON_CLIENTS:-$(scaled 64)}
JSON_SECS=${JSON_SECS:-10}
SHORT_CLIENTS=${SHORT_CLIENTS:-$(scaled 32)}
SHORT_SECS=${SHORT_SECS:-10}
SSE_STREAMS=${SSE_STREAMS:-$(scaled 1000)}
SSE_RATE=${SSE_RATE:-20}
SSE_TOKENS=${SSE_TOKENS:-200}
SSE_RAMP=${SSE_RAMP:-5}
SSE_SECS=${SSE_SECS:-20}
SLOW_STREAMS=${SLOW_STREAMS:-$(scaled 10000)}
SLOW_RATE=${SLOW_RATE:-0.2}
SLOW_RAMP=${SLOW_RAMP:-20}
SLOW_SECS=${SLOW_SECS:-20}
WS_SESSIONS=${WS_SESSIONS:-$(scaled 1000)}
WS_RATE=${WS_RATE:-20}
WS_TOKENS=${WS_TOKENS:-200}
WS_TURNS=${WS_TURNS:-0} # turns per socket (0: back to back until the end of the run)
WS_THINK_MS=${WS_THINK_MS:-0}
WS_CHAIN=${WS_CHAIN:-1} # 1: each turn continues the previous one by previous_response_id
WS_RAMP=${WS_RAMP:-5}
WS_SECS=${WS_SECS:-20}
WS_IDLE_SESSIONS=${WS_IDLE_SESSIONS:-"$(scaled 1000) $(scaled 5000)"}
WS_IDLE_RAMP=${WS_IDLE_RAMP:-10}
WS_IDLE_SECS=${WS_IDLE_SECS:-10}

for b in mock-codex loadgen bench-report codex-gateway; do
  if [[ ! -x $BIN/$b ]]; then
    echo "run.sh: $BIN/$b is missing; build with: cargo build --release -p codex-gateway -p codex-gateway-benches" >&2
    exit 1
  fi
done
mkdir -p "$OUT"
NAME=run.sh
# shellcheck source=benches/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup codex-bench

# pinned CPUS CMD...: runs CMD under taskset when CPUS is set.
pinned() {
  local cpus=$1
  shift
  if [[ -n $cpus ]]; then taskset -c "$cpus" "$@"; else "$@"; fi
}
# pinned_exec CPUS CMD...: the same for a background process (`pinned_exec ... &`): the
# subshell is replaced by CMD, so $! is CMD's pid (the one loadgen samples).
pinned_exec() {
  local cpus=$1
  shift
  if [[ -n $cpus ]]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi
}

machine() {
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc) online"
    echo "memory: $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "open files: $(ulimit -n)"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "nginx: $("$NGINX" -v 2>&1 || echo absent)"
    echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo '(dirty tree)')"
    echo "scale: SCALE=$SCALE json=$JSON_CLIENTS clients x ${JSON_SECS}s; short=$SHORT_CLIENTS clients x ${SHORT_SECS}s; sse=$SSE_STREAMS streams x ${SSE_RATE} ev/s (${SSE_TOKENS} tokens per answer), ramp ${SSE_RAMP}s + ${SSE_SECS}s; slow=$SLOW_STREAMS streams x ${SLOW_RATE} ev/s, ramp ${SLOW_RAMP}s + ${SLOW_SECS}s; ws=$WS_SESSIONS sessions x ${WS_RATE} ev/s (${WS_TOKENS} tokens per turn, turns per socket ${WS_TURNS}, think ${WS_THINK_MS} ms, chain ${WS_CHAIN}), ramp ${WS_RAMP}s + ${WS_SECS}s; ws-idle=$WS_IDLE_SESSIONS sessions, ramp ${WS_IDLE_RAMP}s + hold ${WS_IDLE_SECS}s"
    echo "processes: gateway workers=$GATEWAY_WORKERS, nginx workers=$NGINX_WORKERS, mock workers=$MOCK_WORKERS, loadgen threads=$LOADGEN_THREADS, all on the same machine"
    echo "pinning: gateway=${CPUS_GATEWAY:-none} nginx=${CPUS_NGINX:-none} mock=${CPUS_MOCK:-none} loadgen=${CPUS_LOADGEN:-none}"
    echo "workloads: $WORKLOADS; via: $VIA"
  } >"$OUT/machine.txt"
  cat "$OUT/machine.txt" >&2
}

# --- mock-codex ------------------------------------------------------------------------------
start_mock() {
  local accounts=() i
  for i in $(seq 1 "$ACCOUNTS"); do accounts+=(--account "acct-bench-$i"); done
  RUST_LOG=warn pinned_exec "$CPUS_MOCK" "$BIN/mock-codex" --listen 127.0.0.1:0 --workers "$MOCK_WORKERS" \
    --max-recorded 0 --h2-max-concurrent-streams "$MOCK_H2_MAX_STREAMS" \
    --write-auth-json "$WORK/auth" "${accounts[@]}" >"$OUT/mock.log" 2>&1 &
  MOCK_PID=$!
  PIDS+=("$MOCK_PID")
  MOCK_ORIGIN=$(wait_line "$OUT/mock.log" 'http://127\.0\.0\.1:[0-9]+')
  MOCK_HOSTPORT=${MOCK_ORIGIN#http://}
  wait_line "$OUT/mock.log" "acct-bench-$ACCOUNTS" >/dev/null
  log "mock-codex $MOCK_ORIGIN (pid $MOCK_PID)"
}

# --- codex-gateway ---------------------------------------------------------------------------
# start_gateway [h1]: the gateway (upstream h2c); with h1, a second one whose upstream is
# HTTP/1.1 (its log gateway-h1.log), for the short-h1 workload.
start_gateway() {
  local kind=${1:-h2c} sfx=${1:+-$1} n
  local data=$WORK/gateway$sfx log=$OUT/gateway$sfx.log
  MAX_CONNECTIONS=$((SLOW_STREAMS > SSE_STREAMS ? SLOW_STREAMS : SSE_STREAMS))
  for n in $WS_IDLE_SESSIONS $WS_SESSIONS; do ((n > MAX_CONNECTIONS)) && MAX_CONNECTIONS=$n; done
  MAX_CONNECTIONS=$((MAX_CONNECTIONS + 500))
  mkdir -p "$data"
  cat >"$WORK/gateway$sfx.toml" <<EOF
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "$data"
workers = $GATEWAY_WORKERS
# The idle-WebSocket workload holds thousands of sessions of one key.
max_ws_sessions_per_key = 0
# The automatic bound is (open-file limit - 1,024) / 2, a descriptor in reserve per client
# connection for an HTTP/1.1 upstream (9,488 with a 20,000 limit: below the slow workload's
# 10,000); this h2c set-up needs a handful of upstream descriptors.
max_connections = $MAX_CONNECTIONS

[upstream]
base_url = "$MOCK_ORIGIN/backend-api/codex"
oauth_token_url = "$MOCK_ORIGIN/oauth/token"
plain_http = "$kind"
h2_max_streams_per_connection = $GATEWAY_H2_STREAMS
EOF
  if [[ $GATEWAY_UPSTREAM_WS == 0 ]]; then echo "websockets = false" >>"$WORK/gateway$sfx.toml"; fi
  if [[ -n $GATEWAY_H2_CONNECTIONS ]]; then echo "h2_max_connections = $GATEWAY_H2_CONNECTIONS" >>"$WORK/gateway$sfx.toml"; fi
  RUST_LOG=warn "$BIN/codex-gateway" accounts import --data-dir "$data" \
    --oauth-token-url "$MOCK_ORIGIN/oauth/token" "$WORK"/auth/*.json >>"$log" 2>&1
  GATEWAY_KEY=$(RUST_LOG=warn "$BIN/codex-gateway" keys create bench --data-dir "$data" 2>>"$log" | tail -1)
  RUST_LOG=warn pinned_exec "$CPUS_GATEWAY" "$BIN/codex-gateway" serve --config "$WORK/gateway$sfx.toml" >>"$log" 2>&1 &
  GATEWAY_PID=$!
  PIDS+=("$GATEWAY_PID")
  GATEWAY_ORIGIN=$(wait_line "$log" 'listening on http://127\.0\.0\.1:[0-9]+' | sed 's/listening on //')
  log "codex-gateway $GATEWAY_ORIGIN (pid $GATEWAY_PID, $GATEWAY_WORKERS workers, upstream $kind${GATEWAY_UPSTREAM_WS:+, upstream websockets=$GATEWAY_UPSTREAM_WS})"
}

# --- nginx -----------------------------------------------------------------------------------
start_nginx() {
  if ! command -v "$NGINX" >/dev/null; then
    log "nginx not found; trying apt-get install -y nginx-light"
    if command -v apt-get >/dev/null; then
      apt-get install -y nginx-light >"$OUT/nginx-install.log" 2>&1 ||
        apt-get install -y nginx >>"$OUT/nginx-install.log" 2>&1 || true
    fi
  fi
  if ! command -v "$NGINX" >/dev/null; then
    log "nginx is not available: the nginx baseline (c) is SKIPPED"
    echo "nginx: skipped (not installed)" >>"$OUT/machine.txt"
    return 1
  fi
  local prefix=$WORK/nginx port
  port=$(free_port)
  mkdir -p "$prefix"
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@WORKERS@|$NGINX_WORKERS|g" \
    -e "s|@UPSTREAM@|$MOCK_HOSTPORT|g" -e "s|@LISTEN@|127.0.0.1:$port|g" \
    "$ROOT/benches/nginx.conf.template" >"$prefix/nginx.conf"
  pinned_exec "$CPUS_NGINX" "$NGINX" -p "$prefix" -c "$prefix/nginx.conf" >"$OUT/nginx.log" 2>&1 &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  local i
  for i in $(seq 1 50); do
    NGINX_WORKER_PIDS=$(pgrep -P "$NGINX_PID" | paste -sd, - || true)
    [[ $(echo "$NGINX_WORKER_PIDS" | tr ',' '\n' | grep -c .) -ge $NGINX_WORKERS ]] && break
    sleep 0.1
  done
  NGINX_ORIGIN=http://127.0.0.1:$port
  log "nginx $NGINX_ORIGIN (master $NGINX_PID, workers $NGINX_WORKER_PIDS)"
}

# --- profile ---------------------------------------------------------------------------------
# profile_gateway WORKLOAD RAMP_SECS [loadgen args]: a second, unmeasured gateway run of
# WORKLOAD under `perf record` (DWARF call graphs, 10 s after the ramp-up); writes
# perf-gateway-WORKLOAD.{data,txt} (self time by thread and symbol, then inclusive time).
profile_gateway() {
  local w=$1 ramp=$2
  shift 2
  if ! command -v perf >/dev/null; then
    log "PROFILE=1 but perf is not installed (apt-get install linux-perf); skipping"
    return 0
  fi
  log "profiling gateway/$w (unmeasured run)"
  lg gateway "$w-profiled" --json "$@" >"$OUT/gateway-$w-profiled.json" &
  local lg_pid=$! data=$OUT/perf-gateway-$w.data
  sleep "$ramp"
  perf record -F 499 --call-graph dwarf,8192 -p "$GATEWAY_PID" -o "$data" \
    -- sleep 8 >"$OUT/perf.log" 2>&1 || true
  wait "$lg_pid" || true
  {
    echo "# flat profile (self time), by thread name and shared object"
    perf report -i "$data" --no-children --sort comm,dso --stdio -g none 2>/dev/null | grep -v '^#' | grep .
    echo "# flat profile (self time), by symbol"
    perf report -i "$data" --no-children --sort sym --stdio -g none --percent-limit 0.3 2>/dev/null | grep -v '^#' | grep .
    echo "# inclusive time (children), by symbol"
    perf report -i "$data" --children --sort sym --stdio -g none --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep .
  } >"$OUT/perf-gateway-$w.txt"
  log "profile: $OUT/perf-gateway-$w.txt"
}

# --- one loadgen run -------------------------------------------------------------------------
# lg VIA WORKLOAD [loadgen args...]: runs against VIA's URL, sampling VIA's processes.
lg() {
  local via=$1 workload=$2
  shift 2
  local url pids auth=()
  case $via in
    direct)
      url=$MOCK_ORIGIN/backend-api/codex/responses
      pids=$MOCK_PID
      auth=(--key mock-token -H chatgpt-account-id:acct-bench-1)
      ;;
    gateway)
      url=$GATEWAY_ORIGIN/v1/responses
      pids=$GATEWAY_PID
      auth=(--key "$GATEWAY_KEY")
      ;;
    nginx)
      url=$NGINX_ORIGIN/backend-api/codex/responses
      pids=$NGINX_PID,$NGINX_WORKER_PIDS
      auth=(--key mock-token -H chatgpt-account-id:acct-bench-1)
      ;;
  esac
  pinned "$CPUS_LOADGEN" "$BIN/loadgen" --url "$url" "${auth[@]}" --target-pid "$pids" --threads "$LOADGEN_THREADS" \
    --model "$MODEL" --label "$via/$workload" "$@"
}

# mock_stats: prints mock-codex's counters (GET /__mock/stats); mock_stats reset: resets them.
mock_stats() {
  if [[ ${1:-} == reset ]]; then
    curl -s -X POST "$MOCK_ORIGIN/__mock/reset" >/dev/null 2>&1 || true
  else
    curl -s "$MOCK_ORIGIN/__mock/stats" 2>/dev/null || echo '{}'
  fi
}

run_one() {
  local via=$1 workload=$2 file=$OUT/$1-$2.json
  shift 2
  log "$via/$workload: $*"
  # Warm-up (connections, h2c session, caches), not measured; WebSocket runs warm up over
  # WebSocket (4 sockets x 10 turns).
  local warm=()
  [[ $workload == ws* ]] && warm=(--mode ws --turns 10)
  lg "$via" "$workload" "${warm[@]}" --concurrency 4 --requests 40 >/dev/null
  mock_stats reset
  mock_stats >"$OUT/mock-stats-$via-$workload-before.json"
  if [[ $workload == ws-idle* ]]; then
    # The mock's counters during the hold (upstream sockets the gateway or nginx keep open).
    (sleep "$(awk -v a="$WS_IDLE_RAMP" -v b="$WS_IDLE_SECS" 'BEGIN { print a + b - 1 }')" &&
      mock_stats >"$OUT/mock-stats-$via-$workload-hold.json") &
  fi
  lg "$via" "$workload" --json "$@" >"$file"
  mock_stats >"$OUT/mock-stats-$via-$workload.json"
  if [[ $PROFILE == 1 && $via == gateway ]]; then
    case $workload in
      sse) profile_gateway sse "$SSE_RAMP" "$@" ;;
      json) profile_gateway json 1 "$@" ;;
      short) profile_gateway short 1 "$@" ;;
    esac
  fi
  local line
  line=$(awk -F': ' '/^  "(errors_total|open_streams_peak|events_per_sec|requests_per_sec)"/ {
      gsub(/[ ",]/, "", $1); gsub(/,/, "", $2); printf "%s=%.0f ", $1, $2 }
    /^    "(rss_kib_per_open_at_window_end|cpu_us_per_event)"/ {
      gsub(/[ ",]/, "", $1); gsub(/,/, "", $2); printf "%s=%.2f ", $1, $2 }' "$file")
  log "  -> $line"
  sleep 3 # let the target settle (closing sockets) before the next run
}

workload() {
  local via=$1 w=$2
  case $w in
    json)
      # The mock only streams; direct and nginx read its whole (16-event) SSE answer, the
      # gateway aggregates the same answer into one JSON body (stream:false).
      local stream=--stream
      [[ $via == gateway ]] && stream=--no-stream
      run_one "$via" json $stream --concurrency "$JSON_CLIENTS" --ramp-up-secs 1 \
        --duration-secs "$JSON_SECS"
      ;;
    short)
      # Short streamed answers back to back: 4 deltas = 12 events per answer; per-request
      # costs of a stream (head, first and last writes, upstream stream set-up).
      run_one "$via" short --stream --concurrency "$SHORT_CLIENTS" --ramp-up-secs 1 \
        --duration-secs "$SHORT_SECS" --client-metadata "x-mock-deltas=4"
      ;;
    short-h1)
      # `short` through a second gateway whose upstream is HTTP/1.1 (pooled keep-alive
      # connections, like nginx's); nginx runs it again as it is (it always speaks HTTP/1.1 to
      # the mock); direct is `short` itself.
      [[ $via == direct ]] && return 0
      local saved=("$GATEWAY_ORIGIN" "$GATEWAY_PID" "$GATEWAY_KEY")
      if [[ $via == gateway ]]; then
        if [[ -z ${H1_GATEWAY:-} ]]; then
          start_gateway h1
          H1_GATEWAY=("$GATEWAY_ORIGIN" "$GATEWAY_PID" "$GATEWAY_KEY")
        fi
        GATEWAY_ORIGIN=${H1_GATEWAY[0]} GATEWAY_PID=${H1_GATEWAY[1]} GATEWAY_KEY=${H1_GATEWAY[2]}
      fi
      run_one "$via" short-h1 --stream --concurrency "$SHORT_CLIENTS" --ramp-up-secs 1 \
        --duration-secs "$SHORT_SECS" --client-metadata "x-mock-deltas=4"
      GATEWAY_ORIGIN=${saved[0]} GATEWAY_PID=${saved[1]} GATEWAY_KEY=${saved[2]}
      ;;
    codex)
      # The same with the Codex CLI's real request body (the corpus file's first byte is the
      # fuzz target's mode). The CLI sends no `instructions`; the gateway adds an empty one and
      # mock-codex (like the backend) requires it, so the body every path gets has it.
      tail -c +2 "$ROOT/tests/fuzz/corpus/normalize/seed-codex-cli-0.171.0-recorded" |
        python3 -c 'import json, sys; b = json.load(sys.stdin); b.setdefault("instructions", ""); print(json.dumps(b, separators=(",", ":")))' \
          >"$WORK/codex-body.json"
      run_one "$via" codex --body "@$WORK/codex-body.json" --concurrency "$SHORT_CLIENTS" \
        --ramp-up-secs 1 --duration-secs "$SHORT_SECS" --client-metadata "x-mock-deltas=4"
      ;;
    sse)
      run_one "$via" sse --concurrency "$SSE_STREAMS" --ramp-up-secs "$SSE_RAMP" \
        --duration-secs "$SSE_SECS" --client-metadata "x-mock-events-per-second=$SSE_RATE" \
        --client-metadata "x-mock-tokens=$SSE_TOKENS"
      ;;
    slow)
      run_one "$via" slow --concurrency "$SLOW_STREAMS" --ramp-up-secs "$SLOW_RAMP" \
        --duration-secs "$SLOW_SECS" --client-metadata "x-mock-events-per-second=$SLOW_RATE" \
        --client-metadata "x-mock-tokens=1000000" --idle-timeout-secs 120
      ;;
    ws-idle)
      # One short turn per session (the mock's default 8-delta answer), then the socket is held
      # open and silent; RSS per session is taken at the end of the hold.
      local n
      for n in $WS_IDLE_SESSIONS; do
        run_one "$via" "ws-idle-$n" --mode ws --idle --turns 1 --concurrency "$n" \
          --ramp-up-secs "$WS_IDLE_RAMP" --duration-secs "$WS_IDLE_SECS" --idle-timeout-secs 120
      done
      ;;
    ws)
      local chain=(--chain)
      [[ $WS_CHAIN == 0 ]] && chain=()
      run_one "$via" ws --mode ws "${chain[@]}" --turns "$WS_TURNS" --think-time-ms "$WS_THINK_MS" \
        --concurrency "$WS_SESSIONS" --ramp-up-secs "$WS_RAMP" --duration-secs "$WS_SECS" \
        --client-metadata "x-mock-events-per-second=$WS_RATE" \
        --client-metadata "x-mock-tokens=$WS_TOKENS"
      ;;
  esac
}

machine
start_mock
HAVE=()
for v in $VIA; do
  case $v in
    direct) HAVE+=(direct) ;;
    gateway) start_gateway && HAVE+=(gateway) ;;
    nginx) start_nginx && HAVE+=(nginx) || true ;;
  esac
done
for w in $WORKLOADS; do
  for v in "${HAVE[@]}"; do
    workload "$v" "$w"
  done
done

"$BIN/bench-report" "$OUT" | tee "$OUT/summary.md"
{
  echo
  echo '#### Machine and scale'
  echo
  sed 's/^/    /' "$OUT/machine.txt"
} | tee -a "$OUT/summary.md"
log "results in $OUT"
