#!/usr/bin/env bash
# CPU per request of two gateway binaries, measured in the same run (benches/README.md,
# "Per-request CPU, 2026-12-01").
#
# For each binary (BASE, then NEW; ROUNDS times, alternating, so machine load drifts over both
# alike) the gateway serves REQUESTS requests of the `short` workload (12-event streamed
# answers; `--no-stream` with STREAM=0) from CONCURRENCY clients after a warm-up, and loadgen
# samples its CPU (utime + stime of every thread, and per thread name). Then, unless
# CALLGRIND=0, each binary runs once under `valgrind --tool=callgrind` and the user-space
# instructions of CG_REQUESTS requests (counters zeroed after the warm-up) are counted: a
# figure immune to the machine's load (but blind to kernel work: syscalls, wake-ups).
#
# Build first:  cargo build --release -p codex-gateway -p codex-gateway-benches
# Run:          BASE=/path/to/old/codex-gateway benches/cpu-per-request.sh
# Results:      target/bench-results/cpu-<timestamp>/{summary.txt,*.json,*.log}
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
NEW=${NEW:-$BIN/codex-gateway}
BASE=${BASE:?BASE=path of the baseline codex-gateway binary}
OUT=${OUT:-$ROOT/target/bench-results/cpu-$(date +%Y%m%d-%H%M%S)}
REQUESTS=${REQUESTS:-10000}
CONCURRENCY=${CONCURRENCY:-16}
ROUNDS=${ROUNDS:-2}
STREAM=${STREAM:-1}
CALLGRIND=${CALLGRIND:-1}
PERF=${PERF:-0} # 1: a flat perf profile of each binary's first round (perf-{base,new}.txt)
CG_REQUESTS=${CG_REQUESTS:-400}
# Requests before callgrind's counters are zeroed (connections, caches, prepared statements).
CG_WARMUP=${CG_WARMUP:-50}
WORKERS=${WORKERS:-2}
# Characters of the request's input text (empty: loadgen's default, a body of about 190 B;
# 40000: a Codex-sized body of 3 h2 DATA frames).
INPUT_CHARS=${INPUT_CHARS:-}
# 1: the Codex CLI's recorded request (38 KB, the `codex` workload of run.sh) instead.
CODEX_BODY=${CODEX_BODY:-0}
# 1: measure BASE only (one binary's profile; NEW is not run).
SKIP_NEW=${SKIP_NEW:-0}
MODEL=${MODEL:-gpt-5.5}
# PostgreSQL server URL (e.g. postgres://postgres@127.0.0.1:5432): each binary gets a fresh
# database on it instead of SQLite (dropped at the end). Callgrind then counts the gateway's
# side of the usage path only (the server is another process).
PG=${PG:-}
# 1: also run nginx (the baseline of benches/run.sh) under callgrind with the same load.
NGINX_CG=${NGINX_CG:-0}
NGINX=${NGINX:-nginx}

mkdir -p "$OUT"
NAME=cpu-per-request
# shellcheck source=benches/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup codex-cpu

RUST_LOG=warn "$BIN/mock-codex" --listen 127.0.0.1:0 --workers 1 --max-recorded 0 \
  --h2-max-concurrent-streams 128 --write-auth-json "$WORK/auth" \
  --account acct-cpu-1 --account acct-cpu-2 >"$OUT/mock.log" 2>&1 &
MOCK_PID=$!
PIDS+=("$MOCK_PID")
MOCK=$(wait_line "$OUT/mock.log" 'http://127\.0\.0\.1:[0-9]+')
wait_line "$OUT/mock.log" acct-cpu-2 >/dev/null
log "mock-codex $MOCK"

# setup NAME BINARY: a data directory with the accounts and a key.
PG_DBS=()
setup() {
  local name=$1 bin=$2 data=$WORK/$1 db=() dburl=""
  mkdir -p "$data"
  if [[ -n $PG ]]; then
    local dbname="cg_cpu_${name}_$$"
    psql -q "$PG/postgres" -c "DROP DATABASE IF EXISTS $dbname" -c "CREATE DATABASE $dbname" >/dev/null
    PG_DBS+=("$dbname")
    dburl="$PG/$dbname"
    db=(--database-url "$dburl")
  fi
  local dbline=""
  [[ -n $dburl ]] && dbline="database_url = \"$dburl\""
  cat >"$WORK/$name.toml" <<EOF
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "$data"
workers = $WORKERS
$dbline

[upstream]
base_url = "$MOCK/backend-api/codex"
oauth_token_url = "$MOCK/oauth/token"
plain_http = "h2c"
h2_max_streams_per_connection = 128
EOF
  RUST_LOG=warn "$bin" accounts import --data-dir "$data" "${db[@]}" --oauth-token-url "$MOCK/oauth/token" \
    "$WORK"/auth/*.json >>"$OUT/$name-setup.log" 2>&1
  RUST_LOG=warn "$bin" keys create cpu --data-dir "$data" "${db[@]}" 2>>"$OUT/$name-setup.log" | tail -1 >"$WORK/$name.key"
}

# serve NAME BINARY [WRAPPER...]: starts the gateway; sets GW_PID and GW_URL.
serve() {
  local name=$1 bin=$2
  shift 2
  : >"$OUT/$name-serve.log"
  RUST_LOG=warn "$@" "$bin" serve --config "$WORK/$name.toml" >>"$OUT/$name-serve.log" 2>&1 &
  GW_PID=$!
  PIDS+=("$GW_PID")
  GW_URL=$(wait_line "$OUT/$name-serve.log" 'listening on http://127\.0\.0\.1:[0-9]+' 6000 | sed 's/listening on //')
}

stop() {
  kill -INT "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
}

load() {
  local name=$1 n=$2 json=$3
  local stream=--stream
  # nginx cannot aggregate: with STREAM=0 it reads the whole SSE answer the gateway turns into
  # one JSON body (as run.sh's `json` workload).
  [[ $STREAM == 0 && $name != nginx ]] && stream=--no-stream
  local input=()
  [[ -n $INPUT_CHARS ]] && input=(--input "$(head -c "$INPUT_CHARS" /dev/zero | tr '\0' 'x')")
  [[ $CODEX_BODY == 1 ]] && input=(--body "@$WORK/codex-body.json")
  local via
  if [[ $name == nginx ]]; then
    # nginx proxies to the mock as is: the mock's path, and the account header the gateway adds.
    via=(--url "$GW_URL/backend-api/codex/responses" --key mock-token -H chatgpt-account-id:acct-cpu-1)
  else
    via=(--url "$GW_URL/v1/responses" --key "$(cat "$WORK/$name.key")")
  fi
  "$BIN/loadgen" "${via[@]}" \
    --target-pid "$GW_PID" --model "$MODEL" $stream --concurrency "$CONCURRENCY" \
    --requests "$n" --client-metadata x-mock-deltas=4 --label "$name" "${input[@]}" ${json:+--json}
}

if [[ $CODEX_BODY == 1 ]]; then
  # As run.sh's `codex` workload: the corpus file's first byte is the fuzz target's mode; the
  # CLI sends no `instructions` and the gateway adds an empty one, which the mock requires.
  tail -c +2 "$ROOT/tests/fuzz/corpus/normalize/seed-codex-cli-0.171.0-recorded" |
    python3 -c 'import json, sys; b = json.load(sys.stdin); b.setdefault("instructions", ""); print(json.dumps(b, separators=(",", ":")))' \
      >"$WORK/codex-body.json"
fi
NAMES=(base new)
[[ $SKIP_NEW == 1 ]] && NAMES=(base)
setup base "$BASE"
[[ $SKIP_NEW == 1 ]] || setup new "$NEW"
{
  echo "date: $(date -u +%FT%TZ); host: $(uname -srm); $(nproc) CPUs; loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "workload: $REQUESTS requests, $CONCURRENCY clients, stream=$STREAM, input chars=${INPUT_CHARS:-default}, codex body=$CODEX_BODY, gateway workers=$WORKERS, storage=$([[ -n $PG ]] && echo PostgreSQL || echo SQLite)"
  echo "base: $BASE"
  echo "new:  $NEW"
  echo
  echo "| round | binary | req/s | CPU µs/req | per thread (µs/req) |"
  echo "|---|---|---|---|---|"
} >"$OUT/summary.txt"

for r in $(seq 1 "$ROUNDS"); do
  for name in "${NAMES[@]}"; do
    bin=$BASE
    [[ $name == new ]] && bin=$NEW
    serve "$name" "$bin"
    load "$name" 200 "" >/dev/null
    sleep 1
    if [[ $PERF == 1 && $r == 1 ]] && command -v perf >/dev/null; then
      # Flat profile of the measured load (self time by thread, then by symbol).
      # PERF_ARGS="--call-graph dwarf,16384 -F 299" for call graphs (perf-$name.data is kept).
      perf record ${PERF_ARGS:--F 999} -p "$GW_PID" -o "$OUT/perf-$name.data" >"$OUT/perf-$name.log" 2>&1 &
      perf_pid=$!
      sleep 0.5
    fi
    load "$name" "$REQUESTS" 1 >"$OUT/$name-$r.json"
    if [[ -n ${perf_pid:-} ]]; then
      kill -INT "$perf_pid" 2>/dev/null || true
      wait "$perf_pid" 2>/dev/null || true
      perf_pid=
      {
        perf report -i "$OUT/perf-$name.data" --no-children --sort comm --stdio 2>/dev/null | grep -v '^#' | grep .
        perf report -i "$OUT/perf-$name.data" --no-children --sort comm,dso,sym --stdio --percent-limit 0.4 2>/dev/null | grep -v '^#' | grep .
      } >"$OUT/perf-$name.txt"
      [[ -z ${PERF_ARGS:-} ]] && rm -f "$OUT/perf-$name.data"
    fi
    stop
    label=$r
    [[ $PERF == 1 && $r == 1 ]] && label="$r (under perf)"
    python3 - "$OUT/$name-$r.json" "$label" "$name" >>"$OUT/summary.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("target") or {}
ok = r.get("requests_completed") or 0
threads = t.get("threads_cpu_secs_window") or {}
per = ", ".join(f"{k} {v * 1e6 / max(ok, 1):.1f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r.get('requests_per_sec', 0):.0f} | {t.get('cpu_us_per_request', 0):.1f} | {per} |")
PY
    log "round $r $name: $(tail -1 "$OUT/summary.txt")"
  done
done

if [[ $CALLGRIND == 1 ]] && command -v valgrind >/dev/null; then
  echo >>"$OUT/summary.txt"
  echo "| binary | user-space instructions per request (callgrind, legacy driver, $CG_REQUESTS requests after $CG_WARMUP) |" >>"$OUT/summary.txt"
  echo "|---|---|" >>"$OUT/summary.txt"
  for name in "${NAMES[@]}"; do
    bin=$BASE
    [[ $name == new ]] && bin=$NEW
    # io_uring submissions are invisible to valgrind (the workers would wait forever): the
    # legacy (epoll) driver, for both binaries.
    MONOIO_FORCE_LEGACY_DRIVER=1 serve "$name" "$bin" valgrind --tool=callgrind \
      --callgrind-out-file="$OUT/callgrind-$name.%p"
    load "$name" "$CG_WARMUP" "" >/dev/null
    sleep 2
    callgrind_control -z "$GW_PID" >/dev/null
    load "$name" "$CG_REQUESTS" 1 >"$OUT/$name-callgrind.json"
    sleep 1
    callgrind_control -d "$GW_PID" >/dev/null
    sleep 2
    stop
    f=$(ls -t "$OUT"/callgrind-"$name".*.1 2>/dev/null | head -1 || true)
    ir=$(grep -h '^summary:\|^totals:' "$f" 2>/dev/null | head -1 | awk '{print $2}')
    echo "| $name | $(awk -v i="${ir:-0}" -v n="$CG_REQUESTS" 'BEGIN { printf "%.0f", i / n }') |" >>"$OUT/summary.txt"
  done
fi
# nginx under callgrind, the same load (the issue-25 baseline's user-space instructions): one
# worker, no master (master_process off), proxying to the same mock over HTTP/1.1 keep-alive.
if [[ $NGINX_CG == 1 && $CALLGRIND == 1 ]] && command -v valgrind >/dev/null && command -v "$NGINX" >/dev/null; then
  prefix=$WORK/nginx
  port=$(free_port)
  mkdir -p "$prefix"
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@WORKERS@|1|g" \
    -e "s|@UPSTREAM@|${MOCK#http://}|g" -e "s|@LISTEN@|127.0.0.1:$port|g" \
    "$ROOT/benches/nginx.conf.template" >"$prefix/nginx.conf"
  sed -i 's/^daemon off;/daemon off;\nmaster_process off;/' "$prefix/nginx.conf"
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind-nginx.%p" \
    "$NGINX" -p "$prefix" -c "$prefix/nginx.conf" >"$OUT/nginx.log" 2>&1 &
  GW_PID=$!
  PIDS+=("$GW_PID")
  GW_URL=http://127.0.0.1:$port
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "$GW_URL/healthz" && break
    sleep 0.2
  done
  load nginx "$CG_WARMUP" "" >/dev/null
  sleep 2
  callgrind_control -z "$GW_PID" >/dev/null
  load nginx "$CG_REQUESTS" 1 >"$OUT/nginx-callgrind.json"
  sleep 1
  callgrind_control -d "$GW_PID" >/dev/null
  sleep 2
  kill -QUIT "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
  f=$(ls -t "$OUT"/callgrind-nginx.*.1 2>/dev/null | head -1 || true)
  ir=$(grep -h '^summary:\|^totals:' "$f" 2>/dev/null | head -1 | awk '{print $2}')
  echo "| nginx (HTTP/1.1 upstream, 1 worker) | $(awk -v i="${ir:-0}" -v n="$CG_REQUESTS" 'BEGIN { printf "%.0f", i / n }') |" >>"$OUT/summary.txt"
fi
for d in "${PG_DBS[@]}"; do
  psql -q "$PG/postgres" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
done
cat "$OUT/summary.txt"
