#!/usr/bin/env bash
# Issue 9's swarm target, reproducible: 10,000 `saltgate-minion swarm` minions (2 processes,
# --shared-key) through saltgate (2 processes sharing the ports with reuse_port: true, since one
# process holds at most 20,000 fds, two per session) to a three-member saltgate-master cluster
# (3 processes), then test.ping to all 10,000. Release build. Prints the bench's table and writes
# report.{md,json} and ratios.png to $OUT. See docs/minion.md ("10,000 minions").
#
#   scripts/swarm-10k.sh                      # N=10000, net 127.0.3, out bench/results/swarm-10k
#   N=5000 NET=127.19.0 OUT=/tmp/s scripts/swarm-10k.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0
N="${N:-10000}"
NET="${NET:-127.0.3}"
OUT="${OUT:-bench/results/swarm-10k}"
cargo build --release -p saltgate-bench -p saltgate-proxy -p saltgate-master -p saltgate-minion
bin="${CARGO_TARGET_DIR:-target}/release"
echo "loadavg before: $(cat /proc/loadavg)" >&2
"$bin/saltgate-bench" --saltgate-bin "$bin/saltgate" --master-bin "$bin/saltgate-master" \
  --minion-bin "$bin/saltgate-minion" --targets saltgate --repeat 1 --net "$NET" \
  --swarm-minions "$N" --swarm-processes 2 --swarm-gates 2 --out "$OUT" swarm
echo "loadavg after: $(cat /proc/loadavg)" >&2
