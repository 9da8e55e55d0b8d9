#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh Debian machine, then runs every test of
# the workspace. Real Salt 3008.5 (for the wire interop tests) is installed into a cached venv by
# interop/setup.sh; HAProxy is not needed here (the real-Salt suite, interop/run.sh, installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
SALTGATE_VENV=$(NEED_HAPROXY=0 interop/setup.sh | tail -n 1)
export SALTGATE_VENV
cargo test --workspace --locked "$@"
