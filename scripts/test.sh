#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh Debian machine, then runs every test of
# the workspace. OpenSSL's headers (libssl-dev, for RSA) come from scripts/build-deps.sh; real
# Salt 3008.5 (for the wire interop tests) is installed into a cached venv by interop/setup.sh,
# and HAProxy with apt-get (the bench's tests check the HAProxy config they generate with
# `haproxy -c`, and run HAProxy beside saltgate).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
scripts/build-deps.sh
SALTGATE_VENV=$(interop/setup.sh | tail -n 1)
export SALTGATE_VENV
if [ "$#" -gt 0 ]; then
  exec cargo test --workspace --locked "$@"
fi
# Every test binary, in two lanes at once (scripts/test-lanes.py says why and how).
exec python3 scripts/test-lanes.py
