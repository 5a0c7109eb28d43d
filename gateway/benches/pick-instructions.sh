#!/usr/bin/env bash
# Instructions per account pick (issue 11), counted by callgrind: a noise-immune companion to
# the CPU times of `cargo bench -p gateway --bench pick`. The scheduler before the ranked index
# (the old column of earlier runs) is a recorded figure in gateway/benches/README.md.
#
# Usage: gateway/benches/pick-instructions.sh BENCH_BINARY [COUNT] [SIZE] [CASES...]
#   BENCH_BINARY  the pick bench executable (`cargo bench -p gateway --bench pick --no-run`
#                 prints its path)
#   COUNT         picks counted per run (default 4000)
#   SIZE          accounts in the pool (default 10000)
#   CASES         default: every strategy with and without a key, and the fresh-key cases
#
# Each case runs twice under callgrind: with COUNT picks and with none (the pool, the index
# and the warm-up picks are the same in both), so the difference divided by COUNT is the
# instructions of one pick. Prints a markdown table.
set -euo pipefail
bin=${1:?bench binary}
count=${2:-4000}
size=${3:-10000}
shift $(( $# < 3 ? $# : 3 ))
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  cases=(smart smart+key smart+newkey sticky+key sticky+newkey round_robin fill_first
         quota_reset_priority)
fi
ir() {
  local out
  out=$(PICK_COUNT=$1 PICK_CASE=$2 PICK_SIZE=$size \
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 | grep 'Collected :')
  echo "${out##* }"
}
echo "| case ($size accounts, $count picks) | instructions/pick |"
echo "| --- | --- |"
for c in "${cases[@]}"; do
  base=$(ir 0 "$c")
  full=$(ir "$count" "$c")
  echo "| \`$c\` | $(( (full - base) / count )) |"
done
