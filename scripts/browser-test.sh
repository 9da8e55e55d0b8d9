#!/usr/bin/env bash
# saltgate's status page in a real browser, and the example Prometheus alert rules through promtool.
#
#   scripts/browser-test.sh [--update-docs]
#
# Installs what it needs on a Debian machine when missing (Debian's chromium, required; Debian's
# prometheus for promtool, optional: without it the rule checks are skipped with a notice), builds
# the saltgate binary (debug; set SALTGATE_BIN to use another), installs playwright-core from the
# lock file (no browser download: it drives /usr/bin/chromium), and runs tests/browser with node's
# test runner. Everything runs on loopback, on SALTGATE_TEST_NET (default 127.0.4).
#
# The screenshot goes to $ARTIFACT_DIR/status-page.png (default target/browser-test/, for CI to
# keep); --update-docs also writes docs/status-page.png.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export ARTIFACT_DIR=${ARTIFACT_DIR:-$ROOT/target/browser-test}
export SCREENSHOT=$ARTIFACT_DIR/status-page.png
mkdir -p "$ARTIFACT_DIR"

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "browser-test: $* missing and not root: install it with apt-get" >&2
    return 1
  fi
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

export CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  apt_install chromium
fi
"$CHROMIUM" --version

if ! command -v promtool >/dev/null; then
  apt_install prometheus || true
fi

# The example alert rules: syntax, then their unit tests (each alert fires on the series it is
# written for, and not before its `for:`).
if command -v promtool >/dev/null; then
  promtool check rules examples/prometheus/alerts.yml examples/prometheus/master-alerts.yml
  promtool test rules examples/prometheus/alerts_test.yml examples/prometheus/master-alerts_test.yml
else
  echo "browser-test: promtool not available (Debian package prometheus): rule checks skipped" >&2
fi

if [ -z "${SALTGATE_BIN:-}" ]; then
  cargo build -p saltgate-proxy --bin saltgate --locked
  export SALTGATE_BIN=$ROOT/target/debug/saltgate
fi

cd tests/browser
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
node --test status_page.test.mjs
cd "$ROOT"

if [ "${1:-}" = "--update-docs" ]; then
  mkdir -p docs
  cp "$SCREENSHOT" docs/status-page.png
  echo "browser-test: docs/status-page.png updated"
fi
echo "browser-test: screenshot in $SCREENSHOT"
