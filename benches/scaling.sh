#!/usr/bin/env bash
# Thread-per-core scaling check of codex-gateway on a many-core host (see benches/README.md,
# "Scaling"). For each worker count in SCALING_WORKERS the gateway runs pinned to that many
# CPUs (0..W-1), mock-codex and loadgen on CPUs of their own, and two closed-loop workloads
# are measured through the gateway:
#   fast   FAST_CLIENTS long streams at full speed (x-mock-tokens=FAST_TOKENS, no pacing):
#          events/s and CPU per forwarded event
#   short  SHORT_CLIENTS clients of short streamed answers (12 events): requests/s and CPU
#          per request
# A worker count larger than the CPUs left for the gateway runs unpinned (reported so).
# Results: OUT/scale-W-{fast,short}.json (loadgen reports) and OUT/scaling.md.
# Build first: cargo build --release -p codex-gateway -p codex-gateway-benches
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release}
OUT=${OUT:-$ROOT/target/bench-results/scaling-$(date +%Y%m%d-%H%M%S)}
SCALING_WORKERS=${SCALING_WORKERS:-"1 2 4 8 16"}
GATEWAY_CPUS_MAX=${GATEWAY_CPUS_MAX:-8}   # CPUs 0..7 for the gateway
CPUS_MOCK=${CPUS_MOCK:-8-11}
MOCK_WORKERS=${MOCK_WORKERS:-4}
CPUS_LOADGEN=${CPUS_LOADGEN:-12-15}
LOADGEN_THREADS=${LOADGEN_THREADS:-4}
FAST_CLIENTS=${FAST_CLIENTS:-256}
FAST_TOKENS=${FAST_TOKENS:-2000}
SHORT_CLIENTS=${SHORT_CLIENTS:-256}
SECS=${SECS:-8}
ACCOUNTS=${ACCOUNTS:-16}
MODEL=${MODEL:-gpt-5.5}
mkdir -p "$OUT"
NAME=scaling.sh
# shellcheck source=benches/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup codex-scaling

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc) online"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "mock: CPUs $CPUS_MOCK ($MOCK_WORKERS workers); loadgen: CPUs $CPUS_LOADGEN ($LOADGEN_THREADS threads)"
  echo "fast: $FAST_CLIENTS streams x $FAST_TOKENS tokens unpaced; short: $SHORT_CLIENTS clients, 12-event answers; ${SECS}s each"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

accounts=()
for i in $(seq 1 "$ACCOUNTS"); do accounts+=(--account "acct-bench-$i"); done
RUST_LOG=warn taskset -c "$CPUS_MOCK" "$BIN/mock-codex" --listen 127.0.0.1:0 --workers "$MOCK_WORKERS" \
  --max-recorded 0 --h2-max-concurrent-streams 128 --write-auth-json "$WORK/auth" "${accounts[@]}" \
  >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
MOCK=$(wait_line "$OUT/mock.log" 'http://127\.0\.0\.1:[0-9]+')
wait_line "$OUT/mock.log" "acct-bench-$ACCOUNTS" >/dev/null

echo "| workers | pinned | fast events/s | fast CPU µs/event | fast cores | short req/s | short CPU µs/req | short cores | errors |" >"$OUT/scaling.md"
echo "|---|---|---|---|---|---|---|---|---|" >>"$OUT/scaling.md"
for w in $SCALING_WORKERS; do
  data=$WORK/gw-$w
  mkdir -p "$data"
  cat >"$WORK/gw-$w.toml" <<EOT
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "$data"
workers = $w

[upstream]
base_url = "$MOCK/backend-api/codex"
oauth_token_url = "$MOCK/oauth/token"
plain_http = "h2c"
EOT
  RUST_LOG=warn "$BIN/codex-gateway" accounts import --data-dir "$data" \
    --oauth-token-url "$MOCK/oauth/token" "$WORK"/auth/*.json >>"$OUT/gateway-$w.log" 2>&1
  key=$(RUST_LOG=warn "$BIN/codex-gateway" keys create bench --data-dir "$data" 2>>"$OUT/gateway-$w.log" | tail -1)
  pin=()
  pinned="0-$((w - 1))"
  if ((w <= GATEWAY_CPUS_MAX)); then pin=(taskset -c "$pinned"); else pinned="no (shares all CPUs)"; fi
  RUST_LOG=warn "${pin[@]}" "$BIN/codex-gateway" serve --config "$WORK/gw-$w.toml" >>"$OUT/gateway-$w.log" 2>&1 &
  gpid=$!
  origin=$(wait_line "$OUT/gateway-$w.log" 'listening on http://127\.0\.0\.1:[0-9]+' | sed 's/listening on //')
  lg() {
    taskset -c "$CPUS_LOADGEN" "$BIN/loadgen" --url "$origin/v1/responses" --key "$key" \
      --target-pid "$gpid" --threads "$LOADGEN_THREADS" --model "$MODEL" "$@"
  }
  lg --concurrency 8 --requests 200 --client-metadata x-mock-deltas=4 >/dev/null
  lg --json --label "scale-$w/fast" --concurrency "$FAST_CLIENTS" --ramp-up-secs 1 --duration-secs "$SECS" \
    --client-metadata "x-mock-tokens=$FAST_TOKENS" >"$OUT/scale-$w-fast.json"
  lg --json --label "scale-$w/short" --concurrency "$SHORT_CLIENTS" --ramp-up-secs 1 --duration-secs "$SECS" \
    --client-metadata x-mock-deltas=4 >"$OUT/scale-$w-short.json"
  python3 - "$OUT" "$w" "$pinned" >>"$OUT/scaling.md" <<'PY'
import json, sys
out, w, pinned = sys.argv[1], sys.argv[2], sys.argv[3]
f = json.load(open(f"{out}/scale-{w}-fast.json"))
s = json.load(open(f"{out}/scale-{w}-short.json"))
def t(r, k): return (r.get("target") or {}).get(k, 0.0)
def cores(r): return t(r, "cpu_cores_window")
print(f"| {w} | {pinned} | {f.get('events_per_sec',0):,.0f} | {t(f,'cpu_us_per_event'):.2f} | {cores(f):.2f} | "
      f"{s.get('requests_per_sec',0):,.0f} | {t(s,'cpu_us_per_request'):.1f} | {cores(s):.2f} | {f.get('errors_total',0)}+{s.get('errors_total',0)} |")
PY
  tail -1 "$OUT/scaling.md" >&2
  kill "$gpid" 2>/dev/null || true
  wait "$gpid" 2>/dev/null || true
  sleep 1
done
cat "$OUT/scaling.md"
