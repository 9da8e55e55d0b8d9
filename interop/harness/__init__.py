"""saltgate's real-Salt interop and fault suite, as a package; interop/suite.py is its entry point.

One module per concern, arrows pointing down:
  main.py       arguments, the Suite context every scenario gets, the run order, the exit status
  scenarios/    one module per scenario (smoke, reload, drain, fault = kill + hang, restart)
  report.py     RESULT lines and the markdown table
  jobs.py       publishing jobs through the masters (saltjob.py) and turning returns into rounds
  cluster.py    the 3-master Salt cluster: configs, cluster key, start/restart, minions, keys
  lb.py         the two load balancer slots (saltgate / HAProxy): start, health view, admin APIs,
                config variants, publish sessions as `ss` sees them on the masters
  processes.py  daemons in their own session, recorded in RUN/pids, stopped by process group
  common.py     addresses, ports, timings, logging and small helpers
"""
