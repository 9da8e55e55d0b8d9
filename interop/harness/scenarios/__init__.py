"""The scenarios, one module each, and the order they run in.

A scenario is a function `run(s)` taking the Suite (harness/main.py: s.cluster, s.lbs, s.sg, s.ha,
s.jobs, s.procs, s.a (the arguments), s.spread(), s.pick_victim(), s.killed) that builds a result
record (base.new_result) and hands it to s.record(res). See interop/README.md, "Adding a scenario"."""
from . import drain, fault, join, reload, restart, smoke

# (id as given in SCENARIOS, function): they run in this order whatever order SCENARIOS lists them in.
ORDER = [
    ("1", smoke.run),
    # reload and drain while all three masters are healthy (before the kill degrades the cluster)
    ("5", reload.run),
    ("6", drain.run),
    ("2", fault.kill),
    ("4", restart.run),  # restarts the master killed in 2
    # a fourth master joins and stays (Salt cannot remove a peer cleanly): after 2 and 4, whose
    # Raft quorum it would change; not in run.sh's default list (see join.py)
    ("7", join.run),
    # the hang last: after SIGCONT, Salt 3008.5 does not serve the hung master's minions again
    # for minutes (see README), which would spoil whatever runs after it
    ("3", fault.hang),
]


def run(s, wanted):
    """run the scenarios whose ids are in WANTED (a list of strings), in ORDER"""
    for sid, fn in ORDER:
        if sid in wanted:
            fn(s)
