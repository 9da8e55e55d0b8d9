#!/usr/bin/env bash
# Profiles one proxy inside a real bench run (docs/performance.md, "Where the CPU goes"): runs
# `saltgate-bench --repeat 1 --targets TARGET SCENARIO` and attaches perf to the NTH proxy process
# the bench starts (rr: 1, 2, 3 = 1, 100, 1,000 connections; connect: 1 = sequential,
# 2 = 8 parallel), one second after it starts.
#   bench/syscalls/attach.sh stat   saltgate rr 2 LABEL   -> perf-LABEL.txt  (syscall counts)
#   bench/syscalls/attach.sh record haproxy  rr 2 LABEL   -> perf-LABEL.data (perf record -g)
# Env: BENCH (saltgate-bench binary, default target/release/saltgate-bench), SALTGATE_BIN, NET
# (default 127.0.3), DUR (seconds attached, default 2 for stat, 3 for record), OUT (directory of
# the output files, default the current one). Run it under
# `flock /work/heavy.lock` like any bench run. Stops only the processes it started.
set -u
MODE=$1; TGT=$2; SCEN=$3; NTH=$4; LABEL=${5:-$TGT-$SCEN-$NTH}
BENCH=${BENCH:-target/release/saltgate-bench}
O=${OUT:-.}
EVENTS=task-clock,context-switches
for s in recvfrom sendto epoll_wait epoll_ctl futex accept4 setsockopt getsockopt connect socket close shutdown write read; do
  EVENTS="$EVENTS,syscalls:sys_enter_$s"
done
"$BENCH" --net "${NET:-127.0.3}" --repeat 1 --targets "$TGT" ${SALTGATE_BIN:+--saltgate-bin "$SALTGATE_BIN"} "$SCEN" \
  >"$O/bench-$LABEL.md" 2>"$O/bench-$LABEL.err" &
B=$!
seen=""; k=0
while kill -0 $B 2>/dev/null; do
  p=$(pgrep -P $B -x "$TGT" | head -1)
  if [ -n "$p" ] && [ "$p" != "$seen" ]; then
    seen=$p; k=$((k + 1))
    if [ $k = "$NTH" ]; then
      sleep 1
      if [ "$MODE" = stat ]; then
        timeout -s INT "${DUR:-2}" perf stat -e "$EVENTS" -p "$p" -o "$O/perf-$LABEL.txt"
      else
        timeout -s INT "${DUR:-3}" perf record -F 2000 -g -p "$p" -o "$O/perf-$LABEL.data" >/dev/null 2>&1
      fi
    fi
  fi
  sleep 0.05
done
wait $B
echo "== $LABEL ($(uptime | sed 's/.*load/load/'))"
[ "$MODE" = stat ] && grep -E 'task-clock|syscalls|context' "$O/perf-$LABEL.txt"
grep -E 'CPU per' "$O/bench-$LABEL.md"
