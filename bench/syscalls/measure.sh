#!/usr/bin/env bash
# Syscalls per 200 B request/response through a saltgate binary (docs/performance.md, "Changes since
# the latest full run"): two echo masters (127.0.2.50:7001/7002), saltgate on 127.0.2.51:7006 with
# saltgate.yaml, a 20-thread client doing 2,500 round trips each, `perf stat` attached to saltgate.
#   bench/syscalls/measure.sh target/release/saltgate LABEL    -> perf-LABEL.txt in the current dir
# Needs perf (Debian: linux-perf) and python3. Stops only the processes it started.
set -euo pipefail
BIN=$1; LABEL=${2:-saltgate}
HERE=$(cd "$(dirname "$0")" && pwd)
python3 "$HERE/rr.py" echo 7001 & E1=$!
python3 "$HERE/rr.py" echo 7002 & E2=$!
"$BIN" run --config "$HERE/saltgate.yaml" --log-level warn & SG=$!
trap 'kill $SG $E1 $E2 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.2.51/7006) 2>/dev/null && break; sleep 0.1; done
python3 "$HERE/rr.py" client 127.0.2.51 7006 10 200 >/dev/null   # warm-up
perf stat -e 'task-clock,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait' \
  -p "$SG" -o "perf-$LABEL.txt" & PERF=$!
sleep 0.5
python3 "$HERE/rr.py" client 127.0.2.51 7006 20 2500
kill -INT $PERF; wait $PERF || true
echo "== $LABEL: 50,000 request/responses"; grep -E 'task-clock|syscalls' "perf-$LABEL.txt"
