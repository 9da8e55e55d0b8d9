#!/usr/bin/env python3
"""saltgate's real-Salt interop and fault suite. Started by interop/run.sh (read that first).

One Salt 3008 cluster (masters 127.0.0.2-4), two load balancers in front of it at the same time:
  sg: saltgate on 127.0.0.1:4505/4506  (or, with SG_IMPL=haproxy, a stand-in HAProxy)
  ha: HAProxy  on 127.0.0.10:4505/4506 (the same fixture, rebound; dials masters from 127.0.0.10)
and five salt-minions behind each (sg-minion1..5 -> 127.0.0.1, ha-minion1..5 -> 127.0.0.10).
Every job targets all ten minions, so each fault hits both load balancers at the same moment and
the numbers of the two groups compare directly.

Every process is started in its own session (pid == pgid) and recorded in RUN/pids/<name>.pid;
the suite stops them at the end, and run.sh's trap stops whatever is left.

The code is in the `harness` package next to this file (one module per concern; see
harness/__init__.py); this file only runs it, under the interop venv's python (Salt's tools are
run as subprocesses: nothing here imports salt).
"""
from harness.main import main

if __name__ == "__main__":
    main()
