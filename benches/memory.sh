#!/usr/bin/env bash
# Memory benchmark of codex-gateway (issue 15; see benches/README.md, section "Memory").
#
# One gateway (GATEWAY_WORKERS workers, upstream h2c to mock-codex, as run.sh sets it up) gets
#   IDLE      idle client connections (connected, nothing sent), opened over IDLE_RAMP s,
#   SLOW      slow readers of SSE streams (4 KiB receive buffer, SLOW_READ_BYTES read every
#             SLOW_EVERY_MS while the mock streams SLOW_RATE events/s), opened over SLOW_RAMP s,
#   NORMAL    clients sending non-streamed requests back to back the whole time,
# everything held HOLD s; memory-hold samples the gateway's RSS and descriptors and reports RSS
# per idle connection, per slow reader, and the normal requests served meanwhile.
#
# Build first:  cargo build --release -p gateway -p codex-gateway-benches
# Run:          benches/memory.sh                    (10,000 idle + 1,000 slow, about 2 minutes)
#               IDLE=2000 SLOW=200 benches/memory.sh
#               BIN=target/debug benches/memory.sh   (a debug build; say so with the figures)
# Results:      target/bench-results/memory-<timestamp>/{memory.json,machine.txt,*.log}
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
OUT=${OUT:-$ROOT/target/bench-results/memory-$(date +%Y%m%d-%H%M%S)}
GATEWAY_WORKERS=${GATEWAY_WORKERS:-2}
MOCK_WORKERS=${MOCK_WORKERS:-2}
MOCK_H2_MAX_STREAMS=${MOCK_H2_MAX_STREAMS:-128}
ACCOUNTS=${ACCOUNTS:-4}
MODEL=${MODEL:-gpt-5.5}
IDLE=${IDLE:-10000}
IDLE_RAMP=${IDLE_RAMP:-10}
SLOW=${SLOW:-1000}
SLOW_RAMP=${SLOW_RAMP:-10}
SLOW_RATE=${SLOW_RATE:-20}
SLOW_READ_BYTES=${SLOW_READ_BYTES:-2048}
SLOW_EVERY_MS=${SLOW_EVERY_MS:-1000}
# mock-codex controls of the slow streams (client_metadata K=V, space-separated). Default: endless
# small events at SLOW_RATE/s. SLOW_META="x-mock-text=<256 KiB> x-mock-deltas=64 ..." makes big
# answers that arrive faster than a slow reader reads them (what the upstream window bounds).
SLOW_META=${SLOW_META:-"x-mock-tokens=1000000 x-mock-events-per-second=$SLOW_RATE"}
NORMAL=${NORMAL:-2}
HOLD=${HOLD:-40}

for b in mock-codex memory-hold codex-gateway; do
  if [[ ! -x $BIN/$b ]]; then
    echo "memory.sh: $BIN/$b is missing; build with: cargo build --release -p gateway -p codex-gateway-benches" >&2
    exit 1
  fi
done
mkdir -p "$OUT"
NAME=memory.sh
# shellcheck source=benches/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup codex-memory
# Every connection is a descriptor in memory-hold and in the gateway (both inherit the limit
# bench_setup raised).
if (($(ulimit -n) < IDLE + SLOW + 1000)); then
  echo "memory.sh: the open-file limit $(ulimit -n) is too low for $IDLE + $SLOW connections" >&2
  exit 1
fi


{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc) online"
  echo "memory: $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "open files: $(ulimit -n)"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "binaries: $BIN"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo '(dirty tree)')"
  echo "run: idle=$IDLE over ${IDLE_RAMP}s; slow=$SLOW over ${SLOW_RAMP}s (${SLOW_META:0:80}), reading ${SLOW_READ_BYTES} B every ${SLOW_EVERY_MS} ms; normal=$NORMAL clients; hold ${HOLD}s"
  echo "processes: gateway workers=$GATEWAY_WORKERS, mock workers=$MOCK_WORKERS, all on the same machine"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

accounts=()
for i in $(seq 1 "$ACCOUNTS"); do accounts+=(--account "acct-bench-$i"); done
RUST_LOG=warn "$BIN/mock-codex" --listen 127.0.0.1:0 --workers "$MOCK_WORKERS" --max-recorded 0 \
  --h2-max-concurrent-streams "$MOCK_H2_MAX_STREAMS" --write-auth-json "$WORK/auth" \
  "${accounts[@]}" >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
MOCK_ORIGIN=$(wait_line "$OUT/mock.log" 'http://127\.0\.0\.1:[0-9]+')
wait_line "$OUT/mock.log" "acct-bench-$ACCOUNTS" >/dev/null
log "mock-codex $MOCK_ORIGIN"

data=$WORK/gateway
mkdir -p "$data"
# Idle connections must outlive the run (the default idle timeout is 75 s).
cat >"$WORK/gateway.toml" <<EOF
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "$data"
workers = $GATEWAY_WORKERS
client_idle_timeout_secs = 600

[upstream]
base_url = "$MOCK_ORIGIN/backend-api/codex"
oauth_token_url = "$MOCK_ORIGIN/oauth/token"
plain_http = "h2c"
h2_max_streams_per_connection = $MOCK_H2_MAX_STREAMS
EOF
RUST_LOG=warn "$BIN/codex-gateway" accounts import --data-dir "$data" \
  --oauth-token-url "$MOCK_ORIGIN/oauth/token" "$WORK"/auth/*.json >>"$OUT/gateway.log" 2>&1
KEY=$(RUST_LOG=warn "$BIN/codex-gateway" keys create bench --data-dir "$data" 2>>"$OUT/gateway.log" | tail -1)
RUST_LOG=warn "$BIN/codex-gateway" serve --config "$WORK/gateway.toml" >>"$OUT/gateway.log" 2>&1 &
GATEWAY_PID=$!
PIDS+=("$GATEWAY_PID")
ORIGIN=$(wait_line "$OUT/gateway.log" 'listening on http://127\.0\.0\.1:[0-9]+' | sed 's/listening on //')
log "codex-gateway $ORIGIN (pid $GATEWAY_PID)"

"$BIN/memory-hold" --addr "${ORIGIN#http://}" --key "$KEY" --model "$MODEL" --target-pid "$GATEWAY_PID" \
  --idle "$IDLE" --idle-ramp-secs "$IDLE_RAMP" --slow "$SLOW" --slow-ramp-secs "$SLOW_RAMP" \
  --slow-read-bytes "$SLOW_READ_BYTES" --slow-read-every-ms "$SLOW_EVERY_MS" \
  $(for m in $SLOW_META; do printf -- '--slow-metadata %s ' "$m"; done) \
  --normal "$NORMAL" --hold-secs "$HOLD" --json >"$OUT/memory.json"
curl -s "$ORIGIN/metrics" >"$OUT/gateway-metrics.txt" 2>/dev/null || true
cat "$OUT/memory.json"
log "results: $OUT"
