#!/usr/bin/env bash
# Builds the three Debian packages (saltgate, saltgate-master, saltgate-minion) into target/debian/:
# release binaries, then their man pages and completions (each binary's hidden `gen-docs`, made from
# its command-line definition), then cargo-deb. Prints the paths of the three .deb files, one a line,
# on standard output (everything else goes to standard error). Needs cargo-deb
# (`cargo install --locked cargo-deb`); docs/install.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deb --version >/dev/null 2>&1; then
    echo "cargo-deb missing: cargo install --locked cargo-deb" >&2
    cargo install --locked cargo-deb >&2
fi

cargo build --release --locked -p saltgate-proxy -p saltgate-master -p saltgate-minion --bins >&2

rm -rf target/release/pkg-docs
for bin in saltgate saltgate-master saltgate-minion; do
    "target/release/$bin" gen-docs "target/release/pkg-docs/$bin" >&2
    gzip -9n "target/release/pkg-docs/$bin"/man/*.1
done

for crate in saltgate-proxy saltgate-master saltgate-minion; do
    # cargo-deb prints the path of the package it wrote as its last line.
    cargo deb --no-build --locked -p "$crate" 2>&2 | tail -n 1
done
