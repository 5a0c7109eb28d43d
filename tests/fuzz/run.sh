#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain: libFuzzer (the libfuzzer-sys crate) linked
# into one driver for every target, the code instrumented with rustc's stable SanitizerCoverage
# flags. See docs/fuzzing.md.
#
#   tests/fuzz/run.sh build                 build the instrumented driver
#   tests/fuzz/run.sh smoke [SECONDS]       every target for SECONDS (default 8) each (CI)
#   tests/fuzz/run.sh run TARGET [ARGS...]  one target, libFuzzer ARGS (e.g. -runs=10000000,
#                                           -max_total_time=600, -jobs=2 -workers=2)
#   tests/fuzz/run.sh merge TARGET [ARGS]   add what a long run found that covers new code to
#                                           the committed corpus (minimized; -set_cover_merge=1
#                                           keeps fewer inputs)
#   tests/fuzz/run.sh list                  the targets
#
# The committed corpus (tests/fuzz/corpus/TARGET) is only read; new inputs go to
# $CARGO_TARGET_DIR/fuzz-work/TARGET, kept between runs. A failing input is written to
# $CARGO_TARGET_DIR/fuzz-work/TARGET-artifacts/ and the run exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."

triple="$(rustc -vV | sed -n 's/^host: //p')"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
bin="$target_dir/$triple/fuzz/codex-gateway-fuzz"
work="$target_dir/fuzz-work"
corpus=tests/fuzz/corpus
targets="h1 sse ws ws_ext chat anthropic normalize resp import encoding depth"

# SanitizerCoverage through stable codegen options (what cargo-fuzz passes, minus the
# nightly-only -Zsanitizer): edge counters, the PC table and comparison tracing, which
# libFuzzer uses to guide mutations. With --target, build scripts and proc macros are not
# instrumented.
rustflags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"

# glibc malloc: no mmap/munmap (and page faults) per execution for the large, short-lived
# (de)compressor states of the ws and encoding targets: a fixed mmap threshold keeps them on
# the heap, and a high trim threshold keeps the heap mapped between executions (halved their
# CPU per execution here). An explicit GLIBC_TUNABLES wins.
tunables="${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456}"

log() { printf '==> %s\n' "$*" >&2; }

build() {
  log "building the instrumented fuzz driver (profile fuzz, $triple)"
  RUSTFLAGS="$rustflags" cargo build --locked --profile fuzz --target "$triple" \
    -p codex-gateway-fuzz --features libfuzzer --bin codex-gateway-fuzz
}

# fuzz TARGET ARGS...: runs libFuzzer on TARGET over its scratch and committed corpora.
fuzz() {
  local t="$1"
  shift
  mkdir -p "$work/$t" "$work/$t-artifacts"
  # Inputs up to 16 KiB while fuzzing (longer corpus files are replayed whole by cargo test);
  # later ARGS override these.
  GLIBC_TUNABLES="$tunables" FUZZ_TARGET="$t" "$bin" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=20 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$work/$t-artifacts/" "$@" "$work/$t" "$corpus/$t"
}

case "${1:-}" in
  build) build ;;
  list) echo "$targets" ;;
  smoke)
    secs="${2:-8}"
    build
    mkdir -p "$work"
    for t in $targets; do
      log "fuzzing $t for ${secs}s"
      if ! fuzz "$t" -max_total_time="$secs" 2>"$work/$t.log"; then
        tail -40 "$work/$t.log" >&2
        log "fuzz target $t failed; the input is in $work/$t-artifacts/"
        exit 1
      fi
      grep -E '^stat::number_of_executed_units' "$work/$t.log" | sed "s/^/$t /" >&2 || true
    done
    ;;
  run)
    t="${2:?target}"
    shift 2
    [ -x "$bin" ] || build
    fuzz "$t" "$@"
    ;;
  merge)
    t="${2:?target}"
    shift 2
    [ -x "$bin" ] || build
    GLIBC_TUNABLES="$tunables" FUZZ_TARGET="$t" "$bin" -merge=1 -rss_limit_mb=2048 "$@" "$corpus/$t" "$work/$t"
    ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 64
    ;;
esac
