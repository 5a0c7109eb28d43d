#!/usr/bin/env bash
# Runs the vendored monoio-http's own unit tests (codex-gateway addition, vendor/README.md).
#
# The workspace excludes vendor/, so `cargo test` never builds them. This copies the crate
# to a scratch directory, drops what the copy cannot build offline (the dev-dependencies and
# the HPACK fixture/quickcheck modules that use them: the fixtures themselves are not
# vendored; the optional dependencies of features the gateway does not enable), resolves it with the workspace's Cargo.lock and runs `cargo test --lib`.
# Arguments go to the test binary's filter, e.g. `vendor/monoio-http/run-tests.sh frame::headers`.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-$(mktemp -d)}
trap 'rm -rf "$WORK/crate"' EXIT

mkdir -p "$WORK/crate"
cp -r "$HERE/Cargo.toml" "$HERE/src" "$WORK/crate/"
cp "$ROOT/Cargo.lock" "$WORK/crate/Cargo.lock"
# No dev- or optional dependencies (the features that use them off), and no `mod test;` under
# hpack (fixtures + quickcheck).
python3 - "$WORK/crate" <<'PY'
import re, sys
d = sys.argv[1]
toml = open(f"{d}/Cargo.toml").read()
tables = re.split(r"\n(?=\[)", toml)
# Dev-dependencies and optional dependencies (features off here; not in the workspace's lock).
tables = [t for t in tables if not t.startswith("[dev-dependencies.")
          and not (t.startswith("[dependencies.") and "optional = true" in t)
          and not t.startswith("[features]")]
toml = "\n".join(tables) + '\n[features]\ndefault = []\nencoding = []\nlogging = []\nparsed = []\nstream = []\nunstable = []\n'
open(f"{d}/Cargo.toml", "w").write(toml + "\n[workspace]\n")
m = f"{d}/src/h2/hpack/mod.rs"
src = open(m).read().replace("#[cfg(test)]\nmod test;\n", "")
open(m, "w").write(src)
PY
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/vendor-monoio-http} \
  cargo test --offline --manifest-path "$WORK/crate/Cargo.toml" --lib -- "$@"
