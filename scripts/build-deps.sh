#!/usr/bin/env bash
# What building the workspace needs besides the Rust toolchain: OpenSSL's headers and pkg-config
# (the `openssl` crate links the system's libcrypto for RSA; docs/wire.md, "RSA"). Installs them
# with apt-get when missing and running as root; otherwise says what to install.
set -euo pipefail
# OPENSSL_DIR (or OPENSSL_LIB_DIR and OPENSSL_INCLUDE_DIR) point the `openssl` crate at an OpenSSL
# of the builder's choosing, without pkg-config.
if [ -n "${OPENSSL_DIR:-}" ] || { [ -n "${OPENSSL_LIB_DIR:-}" ] && [ -n "${OPENSSL_INCLUDE_DIR:-}" ]; }; then
  exit 0
fi
if pkg-config --exists openssl 2>/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "build-deps: installing libssl-dev and pkg-config (apt-get)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libssl-dev pkg-config >/dev/null
  exit 0
fi
echo "build-deps: OpenSSL's headers or pkg-config are missing: install libssl-dev and pkg-config" >&2
echo "  (Debian/Ubuntu: apt-get install libssl-dev pkg-config; Fedora: dnf install openssl-devel pkgconf)" >&2
exit 1
