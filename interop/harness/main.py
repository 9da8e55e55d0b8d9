"""The suite's entry: arguments (from run.sh), the Suite context every scenario gets, bring-up
(cluster, load balancers, minions, keys), the scenarios, the table, stopping everything, the exit status
(0 only if every scenario passed)."""
import argparse
import os
import signal
import sys

from . import report, scenarios, timing
from .cluster import Cluster
from .fanout import FanoutLB
from .common import MASTERS, N_SGM, Failure, log, now, wait_for
from .jobs import Jobs
from .lb import LB, fixture_names, spread
from .processes import Procs


class Suite:
    """What a scenario works with: the cluster, both load balancer slots (sg first, ha second), the jobs,
    the processes, the arguments, and the results recorded so far."""

    def __init__(self, a):
        self.a = a
        self.run = a.run
        self.procs = Procs(os.path.join(self.run, "pids"))
        self.cluster = Cluster(self.run, os.path.join(a.venv, "bin"), self.procs, transport=a.transport,
                               tls_dir=a.tls_dir)
        names = fixture_names(a.fixture)
        if a.sg_bin:
            sg = LB("sg", "saltgate", "127.0.0.1", "127.0.0.1", "saltgate", a.sg_config,
                    os.path.join(self.run, "sg"), self.procs, names, sg_bin=a.sg_bin)
        else:
            sg = LB("sg", "saltgate-slot(HAProxy)", "127.0.0.1", "127.0.0.1", "haproxy", a.sg_haproxy,
                    os.path.join(self.run, "sg"), self.procs, names)
        ha = LB("ha", "HAProxy", "127.0.0.10", "127.0.0.10", "haproxy", a.ha_config,
                os.path.join(self.run, "ha"), self.procs, names)
        self.sg, self.ha = sg, ha
        self.lbs = [sg, ha]
        self.fo = None  # the fan-out slot (harness/fanout.py), FANOUT=1 (the default) with saltgate
        if a.sg_bin and a.fanout and a.transport == "zeromq":
            self.fo = FanoutLB(a.sg_config, os.path.join(self.run, "fo"), self.procs, names, a.sg_bin)
            self.lbs.append(self.fo)
        self.minions = [m for lb in self.lbs for m in lb.minions]  # Salt's minions: the job streams
        # saltgate-minion processes behind saltgate: scenario 1 (smoke) and presence only
        self.sgm_minions = [f"sgm-minion{i}" for i in range(1, N_SGM + 1)] if a.sgm_bin else []
        self.jobs = Jobs(self.run, self.cluster, self.procs, self.minions)
        self.results = []  # dicts, one per scenario
        self.killed = None  # victim of scenario 2, restarted by scenario 4
        self.t_scenarios = None  # when bring-up ended and the first scenario began
        self.t_start = now()

    def record(self, res):
        """a scenario's result: kept for the table, and its RESULT line printed now"""
        self.results.append(res)
        report.result_line(self.lbs, res)

    def spread(self):
        return spread(self.lbs)

    def pick_victim(self, exclude=()):
        sp = self.spread()
        cands = [ip for ip in MASTERS if ip not in exclude]
        # a master holding publish sessions of BOTH load balancers, most balanced first
        cands.sort(key=lambda ip: (-min(sp["sg"][ip], sp["ha"][ip]), -(sp["sg"][ip] + sp["ha"][ip]),
                                   MASTERS.index(ip)))
        return cands[0], sp

    def bring_up(self):
        self.cluster.start_cluster()
        for lb in self.lbs:
            lb.start()
        if not wait_for(lambda: all(lb.all_up() for lb in self.lbs), 30, 0.5):
            log("warning: HAProxy does not show every server UP after 30 s")
        self.cluster.start_minions(self.lbs)
        if self.sgm_minions:
            self.cluster.start_sgm_minions(self.sg, self.sgm_minions, self.a.sgm_bin)
        self.cluster.accept_keys(self.minions + self.sgm_minions)

    def main(self):
        self.t_start = now()
        ok = True
        try:
            self.bring_up()
            self.t_scenarios = now()
            scenarios.run(self, self.a.scenarios.split())
        except Failure as exc:
            log(f"FAILED: {exc}")
            print(f"RESULT suite: FAIL ({exc})", flush=True)
            ok = False
        except KeyboardInterrupt:
            log("interrupted")
            print("RESULT suite: FAIL (interrupted)", flush=True)
            ok = False
        finally:
            self.results.sort(key=lambda r: r["id"])
            extra = timing.suite_lines(self)
            if self.cluster.transport != "zeromq" and self.results:
                pe = self.cluster.parse_errors()
                extra.append(f"- masters' logs: {sum(pe.values())} request-parsing traceback(s) ('Exception parsing', "
                             f"'not subscriptable'; per master {' / '.join(str(pe[ip]) for ip in MASTERS)})"
                             + ("" if not sum(pe.values()) else ": FAIL (saltgate's tcp checks must send only "
                                                                "well-formed frames)"))
                if sum(pe.values()):
                    ok = False
                    print("RESULT suite: FAIL (request-parsing tracebacks in the masters' logs)", flush=True)
            if self.results:
                t = report.table(self.results, self.lbs, self.t_start, self.a.spread_wait,
                                 extra=extra, n_sgm=len(self.sgm_minions),
                                 transport=self.cluster.transport_label())
                with open(self.a.results, "w") as f:
                    f.write(t)
                print("\n" + t, flush=True)
            for lb in self.lbs:
                report.dump_lb_log(lb)
            log("stopping everything this suite started")
            self.procs.stop_all()
        ok = ok and bool(self.results) and all(r.get("ok") for r in self.results)
        print(f"RESULT suite: {'PASS' if ok else 'FAIL'} ({len(self.results)} scenarios, "
              f"{now() - self.t_start:.0f} s)", flush=True)
        return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(prog="suite.py")
    p.add_argument("--run", required=True)
    p.add_argument("--venv", required=True)
    p.add_argument("--fixture", required=True)
    p.add_argument("--ha-config", required=True)
    p.add_argument("--sg-bin")
    p.add_argument("--sg-config")
    p.add_argument("--sg-haproxy")
    p.add_argument("--sgm-bin", help="saltgate-minion binary: N_SGM of them behind saltgate (smoke, presence)")
    p.add_argument("--scenarios", default="1 5 6 2 4 3")
    p.add_argument("--hang", type=float, default=30, help="seconds the hung master stays SIGSTOPped")
    p.add_argument("--after-cont", type=float, default=45, help="max seconds to wait for recovery after SIGCONT")
    p.add_argument("--spread-wait", type=float, default=20, help="seconds after the restart before counting sessions")
    p.add_argument("--results", required=True)
    p.add_argument("--fanout", type=int, default=1, help="1: add the fan-out saltgate slot on 127.0.0.11")
    p.add_argument("--transport", choices=("zeromq", "tcp"), default="zeromq",
                   help="Salt's transport of the masters and minions (tcp: issue 27)")
    p.add_argument("--tls-dir", help="with --transport tcp: Salt's ssl on masters and minions, from the test "
                                     "CA and server certificate in this directory (run.sh's make_test_pki)")
    a = p.parse_args()
    if not (a.sg_bin and a.sg_config) and not a.sg_haproxy:
        p.error("need --sg-bin and --sg-config, or --sg-haproxy")
    if a.tls_dir and a.transport != "tcp":
        p.error("--tls-dir needs --transport tcp")
    if a.transport != "zeromq" and (a.fanout or a.sgm_bin):
        p.error("--transport tcp runs Salt's minions only: give --fanout 0 and no --sgm-bin")

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    s = Suite(a)
    try:
        rc = s.main()
    except BaseException:
        s.procs.stop_all()
        raise
    sys.exit(rc)
