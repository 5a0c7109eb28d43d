#!/usr/bin/env bash
# Usage: zero lost (issue 12; see benches/README.md, "Usage: zero lost"). Run by hand.
#
# Drives CONCURRENCY concurrent SSE streams through a real codex-gateway (PostgreSQL storage)
# for DURATION seconds. Half-way, PostgreSQL refuses connections to the gateway's database
# (an outage); the gateway is then restarted while the database is still down (SIGTERM: its
# spool file stays behind), the database comes back, and the new process replays the spool.
# Reports: requests sent by loadgen, usage rows stored, duplicates (must be 0), records
# dropped (must be 0), the spool's peak size and the gateway's peak RSS.
#
# KILL=9: the first gateway is killed with SIGKILL at three quarters of DURATION, during the
# outage and while the streams run; the database comes back and a new gateway starts at once on
# the same port (a gateway does not start without its database); its spool adopts the file the
# killed process left and replays it. Checked then: the
# rows of requests the killed process started include every request it had ended 50 ms before
# the kill (its own count, read from /metrics: requests counted minus streams still open), the new process's rows equal its own count,
# no duplicate, nothing dropped, and the replay took the killed process's records.
#
# Build first:  cargo build --release -p codex-gateway -p codex-gateway-benches
# Run:          benches/usage-zero-lost.sh
#               KILL=9 benches/usage-zero-lost.sh
#               CONCURRENCY=200 DURATION=10 OUTAGE=0 benches/usage-zero-lost.sh
set -euo pipefail
BIN=${BIN:-target/release}
CONCURRENCY=${CONCURRENCY:-1000}
DURATION=${DURATION:-20}
OUTAGE=${OUTAGE:-1}
KILL=${KILL:-}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
RATE=${RATE:-20}
TOKENS=${TOKENS:-40}

work=$(mktemp -d)
db="cg_usage_zero_lost_$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # KEEP=DIR: the gateway's log and loadgen's report are copied there.
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/gw.log "$work"/load1.json "$KEEP"/ 2>/dev/null || true; fi
  psql -q "$PG/postgres" -c "ALTER DATABASE $db WITH ALLOW_CONNECTIONS true" >/dev/null 2>&1 || true
  psql -q "$PG/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
psql -q "$PG/postgres" -c "CREATE DATABASE $db" >/dev/null
url="$PG/$db"

"$BIN/mock-codex" --listen 127.0.0.1:0 --account acct-1 --account acct-2 --account acct-3 \
  --account acct-4 --write-auth-json "$work/auth" >"$work/mock.out" 2>"$work/mock.log" &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$work/mock.out" 2>/dev/null && break; sleep 0.1; done
mock=$(sed -n 's/^mock-codex listening on \(http:[^ ]*\).*/\1/p' "$work/mock.out")
export CODEX_GATEWAY_ADMIN_TOKEN=bench-admin
"$BIN/codex-gateway" accounts import "$work"/auth/*.json --data-dir "$work/data" \
  --database-url "$url" --oauth-token-url "$mock/oauth/token" >/dev/null
key=$("$BIN/codex-gateway" keys create bench --data-dir "$work/data" --database-url "$url")
cat >"$work/gw.toml" <<TOML
[upstream]
plain_http = "h2c"
[pool]
default_max_concurrency = 0
TOML

start_gw() {
  "$BIN/codex-gateway" serve --config "$work/gw.toml" --listen 127.0.0.1:${PORT:-0} \
    --admin-listen 127.0.0.1:0 --data-dir "$work/data" --database-url "$url" \
    --upstream-base-url "$mock/backend-api/codex" 2>>"$work/gw.log" &
  gw=$!
  pids+=($gw)
  for _ in $(seq 200); do
    addr=$(sed -n 's/^codex-gateway listening on http:\/\/\([^ ]*\).*/\1/p' "$work/gw.log" | tail -1)
    [ -n "$addr" ] && curl -sf "http://$addr/healthz" >/dev/null && return
    sleep 0.1
  done
  echo "gateway did not start" >&2; tail "$work/gw.log" >&2; exit 1
}
metric() { curl -sf "http://$addr/metrics" | awk -v m="$1" '$1==m {print $2}'; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$gw/status" 2>/dev/null || echo 0; }

start_gw
PORT=${addr##*:}
peak_rss=0; peak_spool=0
sample() {
  r=$(rss_kb); [ "${r:-0}" -gt "$peak_rss" ] && peak_rss=$r
  b=$(metric codex_gateway_usage_spool_bytes || echo 0); [ "${b:-0}" -gt "$peak_spool" ] && peak_spool=$b
  return 0
}
"$BIN/loadgen" --url "http://$addr/v1/responses" --key "$key" --concurrency "$CONCURRENCY" \
  --ramp-up-secs 2 --duration-secs "$DURATION" --json \
  --client-metadata "x-mock-events-per-second=$RATE" --client-metadata "x-mock-tokens=$TOKENS" \
  >"$work/load1.json" &
lg=$!
# Wall-clock half-way (sampling takes time of its own on a busy host).
half_at=$((SECONDS + DURATION / 2))
while [ "$SECONDS" -lt "$half_at" ]; do sample; sleep 0.2; done
if [ "$OUTAGE" = 1 ]; then
  psql -q "$PG/postgres" -c "ALTER DATABASE $db WITH ALLOW_CONNECTIONS false" \
    -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '$db'" >/dev/null
  echo "outage: $db refuses connections"
fi
# Requests a gateway process ended on /v1/responses (streams cut at the deadline end when
# their handler notices the client left: give them a moment).
ended() { curl -sf "http://$addr/metrics" | awk '/^codex_gateway_requests_total[{]route="responses"/ {s+=$2} END {print s+0}'; }
kill_ms=
if [ "$KILL" = 9 ]; then
  kill_at=$((half_at + DURATION / 4))
  while [ "$SECONDS" -lt "$kill_at" ]; do sample; sleep 0.2; done
  # A stream counts in requests_total from its head on: the ones still open (cut by the kill,
  # never a record) are taken off, from the same scrape.
  ended_before_kill=$(curl -sf "http://$addr/metrics" | awk '/^codex_gateway_requests_total[{]route="responses"/ {s+=$2} $1=="codex_gateway_open_streams" {o=$2} END {print s-o}')
  spooled_before_kill=$(metric codex_gateway_usage_spool_records)
  sleep 0.05
  kill -9 "$gw"
  kill_ms=$(date +%s%3N)
  wait "$gw" 2>/dev/null || true
  echo "kill -9 of the gateway at $((SECONDS - half_at + DURATION / 2)) s: it had ended $ended_before_kill requests 50 ms before, $spooled_before_kill records spooled"
  # A gateway does not start without its database: the outage ends, then the new process
  # starts on the same port and replays the spool the killed one left.
  psql -q "$PG/postgres" -c "ALTER DATABASE $db WITH ALLOW_CONNECTIONS true" >/dev/null
  start_gw
fi
while kill -0 "$lg" 2>/dev/null; do sample; sleep 0.2; done
sample
spooled=$(metric codex_gateway_usage_spool_records)
handled_before=0
if [ "$KILL" = 9 ]; then
  psql -q "$PG/postgres" -c "ALTER DATABASE $db WITH ALLOW_CONNECTIONS true" >/dev/null
elif [ "$OUTAGE" = 1 ]; then
  sleep 2
  handled_before=$(ended)
  kill -TERM "$gw"; wait "$gw" || true
  echo "gateway stopped with $spooled records spooled; spool files: $(ls "$work/data" | grep -c usage-spool)"
  psql -q "$PG/postgres" -c "ALTER DATABASE $db WITH ALLOW_CONNECTIONS true" >/dev/null
  start_gw
fi
for _ in $(seq 600); do
  [ "$(metric codex_gateway_usage_spool_records)" = 0 ] && break
  sleep 0.1
done
started=$(jq .requests_started "$work/load1.json")
# A request whose connection never opened never reached the gateway: it has no record.
unconnected=$(jq .errors.connect "$work/load1.json")
expected=$((started - unconnected))
# The spool being empty does not mean the last records left the workers (a stream cut at the
# deadline is finalised when its handler notices): wait until the count stops moving.
rows=-1; stable=0
for _ in $(seq 120); do
  now=$(psql -tA "$url" -c "SELECT COUNT(*) FROM usage_records")
  if [ "$now" = "$rows" ]; then stable=$((stable + 1)); else stable=0; fi
  rows=$now
  [ "$stable" -ge 6 ] && break
  sleep 0.5
done
handled=$((handled_before + $(ended)))
dupes=$(psql -tA "$url" -c "SELECT COUNT(*) FROM (SELECT record_id FROM usage_records GROUP BY record_id HAVING COUNT(*) > 1) d")
echo "concurrency=$CONCURRENCY duration=${DURATION}s outage=$OUTAGE kill=${KILL:-none}"
echo "spooled when stopped:       ${spooled:-0}"
echo "requests started (loadgen): $started (ok $(jq .requests_ok "$work/load1.json"), cut at the deadline $(jq .requests_cut "$work/load1.json"), never connected $unconnected)"
echo "usage rows stored:          $rows"
echo "requests the gateway ended: $handled (its own count; loadgen's extra ones never reached a handler)"
echo "duplicated record ids:      $dupes"
echo "replayed after restart:     $(metric codex_gateway_usage_replayed_total)"
echo "dropped (metric):           $(metric codex_gateway_usage_dropped_total)"
echo "peak spool bytes:           $peak_spool"
echo "peak gateway RSS:           $((peak_rss / 1024)) MiB"
if [ "$KILL" = 9 ]; then
  first=$(psql -tA "$url" -c "SELECT COUNT(*) FROM usage_records WHERE started_at_ms < $kill_ms")
  second=$((rows - first))
  replayed=$(metric codex_gateway_usage_replayed_total)
  echo "rows of the killed process:  $first (it had ended $ended_before_kill 50 ms before the kill: $((first - ended_before_kill)) more ended in those 50 ms)"
  echo "rows of the new process:     $second (it ended $handled)"
  if [ "${replayed:-0}" = 0 ]; then
    echo "the new process replayed nothing: not a test of the crash"; exit 1
  fi
  [ "$first" -ge "$ended_before_kill" ] && [ "$second" = "$handled" ] && [ "$dupes" = 0 ] &&
    [ "$(metric codex_gateway_usage_dropped_total)" = 0 ] && echo "ZERO LOST (kill -9)" ||
    { echo "MISMATCH"; exit 1; }
  exit 0
fi
if [ "$OUTAGE" = 1 ] && [ "${spooled:-0}" = 0 ]; then
  echo "the outage caught no records (nothing spooled when the gateway stopped): not a test of the outage"; exit 1
fi
# Every request the gateway ended has exactly one row (and none comes from nowhere).
[ "$rows" = "$handled" ] && [ "$rows" -le "$expected" ] && [ "$dupes" = 0 ] && echo "ZERO LOST" || { echo "MISMATCH"; exit 1; }
