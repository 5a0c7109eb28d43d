# Shared set-up of the bench scripts (sourced by run.sh, memory.sh, scaling.sh and
# cpu-per-request.sh after they set NAME, the prefix of their log lines):
#   bench_setup PREFIX   a scratch directory $WORK (removed on exit) and the PIDS array,
#                        whose processes are killed on exit; raises the open-file limit
#   log MSG...           "[NAME] MSG" on stderr
#   wait_line FILE RE [TENTHS]
#                        waits (TENTHS x 0.1 s, default 300) until FILE has a line matching
#                        RE and prints the first match; else prints FILE and fails
#   free_port            a free TCP port on 127.0.0.1
# shellcheck shell=bash

bench_setup() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  PIDS=()
  trap bench_cleanup EXIT
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
}

bench_cleanup() {
  for p in "${PIDS[@]:-}"; do
    [[ -n $p ]] && kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

log() { echo "[$NAME] $*" >&2; }

wait_line() {
  local file=$1 re=$2 tenths=${3:-300} i
  for i in $(seq 1 "$tenths"); do
    if grep -Eo "$re" "$file" 2>/dev/null | head -1 | grep .; then
      return 0
    fi
    sleep 0.1
  done
  echo "$NAME: timed out waiting for /$re/ in $file" >&2
  cat "$file" >&2
  return 1
}

free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  else
    echo $((20000 + RANDOM % 20000))
  fi
}
