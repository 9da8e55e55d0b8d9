#!/usr/bin/env bash
# Proxy CPU and syscalls per GB through a saltgate binary (docs/performance.md, "Changes since the
# latest full run"): a sink/source master (127.22.2.2:7101/7102), saltgate on 127.22.2.1 with
# bulk.yaml, 1 GB client -> master through one session, then 1 GB master -> client; `perf stat`
# attached to saltgate for each.
#   bench/syscalls/bulk.sh target/release/saltgate LABEL   -> perf-bulk-LABEL-{up,down}.txt here
# Needs perf and python3. Stops only the processes it started.
set -euo pipefail
BIN=$1; LABEL=${2:-saltgate}; BYTES=${BYTES:-1000000000}
HERE=$(cd "$(dirname "$0")" && pwd)
python3 "$HERE/bulk.py" master 7101 & M=$!
"$BIN" run --config "$HERE/bulk.yaml" --log-level warn & SG=$!
trap 'kill $SG $M 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.22.2.1/7105) 2>/dev/null && break; sleep 0.1; done
for dir in up down; do
  port=7105; [ $dir = down ] && port=7106
  python3 "$HERE/bulk.py" $dir 127.22.2.1 $port 10000000   # warm-up
  perf stat -e 'task-clock,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_splice,syscalls:sys_enter_epoll_wait' \
    -p "$SG" -o "perf-bulk-$LABEL-$dir.txt" & PERF=$!
  sleep 0.5
  python3 "$HERE/bulk.py" $dir 127.22.2.1 $port "$BYTES"
  kill -INT $PERF; wait $PERF || true
  echo "== $LABEL $dir: $BYTES bytes"; grep -E 'task-clock|syscalls' "perf-bulk-$LABEL-$dir.txt"
done
