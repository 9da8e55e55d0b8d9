#!/usr/bin/env bash
# Installs what the real-Salt suites need on a fresh Debian machine, idempotently:
#   * HAProxy from Debian (apt-get), for the side-by-side scenarios;
#   * a Python venv with salt==$SALT_VERSION (PyPI), which brings pyzmq and libzmq.
# The venv is cached outside the clone ($SALTGATE_VENV, default ~/.cache/saltgate/venv-salt-<ver>)
# so local reruns and later CI runs on the same machine skip the ~2 min install.
# Prints the venv path on stdout (last line); everything else goes to stderr.
#
# salt 3008.5 pins certifi>=2026.10.23, newer than PyPI may carry. When `pip install salt` fails on
# that floor, we install Salt's own requirement list (base.txt + zeromq.txt from the sdist) with only the
# certifi floor relaxed, then salt itself with --no-deps.
set -euo pipefail
SALT_VERSION=${SALT_VERSION:-3008.5}
VENV=${SALTGATE_VENV:-$HOME/.cache/saltgate/venv-salt-$SALT_VERSION}
NEED_HAPROXY=${NEED_HAPROXY:-1}
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

apt_install() {
  if [ ! -d /var/lib/apt/lists/partial ] || [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' 2>/dev/null | head -1)" ]; then
    apt-get update >&2
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >&2 || {
    apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >&2
  }
}

if [ "$NEED_HAPROXY" = 1 ] && ! command -v haproxy >/dev/null; then
  log "installing haproxy (apt-get)"
  apt_install haproxy
fi

PY=${PYTHON:-python3}
mkdir -p "$(dirname "$VENV")"
# One installer at a time (the wire tests and the interop suite may both call this).
exec 9>"$VENV.lock"
flock 9
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2 || { apt_install python3-venv && "$PY" -m venv "$VENV" >&2; }
fi
have=$("$VENV/bin/python" -c 'import salt.version; print(salt.version.__version__)' 2>/dev/null || true)
if [ "$have" != "$SALT_VERSION" ]; then
  log "installing salt==$SALT_VERSION into $VENV"
  err=$(mktemp)
  if ! "$VENV/bin/pip" install -q "salt==$SALT_VERSION" 2>"$err" >&2; then
    if grep -q "No matching distribution found for certifi" "$err"; then
      log "pip: $(grep 'No matching distribution' "$err" | head -1); relaxing Salt's certifi floor"
      dl=$(mktemp -d)
      "$VENV/bin/pip" download -q --no-deps --no-binary :all: "salt==$SALT_VERSION" -d "$dl" >&2
      tar -xzf "$dl/salt-$SALT_VERSION.tar.gz" -C "$dl"
      cat "$dl/salt-$SALT_VERSION/requirements/base.txt" "$dl/salt-$SALT_VERSION/requirements/zeromq.txt" |
        sed -E 's/^certifi>=[0-9.]+/certifi/' >"$dl/reqs.txt"
      "$VENV/bin/pip" install -q -r "$dl/reqs.txt" >&2
      "$VENV/bin/pip" install -q --no-deps "$dl/salt-$SALT_VERSION.tar.gz" >&2
      rm -rf "$dl"
    else
      cat "$err" >&2
      exit 1
    fi
  fi
  rm -f "$err"
fi
"$VENV/bin/python" -c 'import salt.version, zmq; print("salt", salt.version.__version__, "pyzmq", zmq.__version__, "libzmq", zmq.zmq_version())' >&2
echo "$VENV"
