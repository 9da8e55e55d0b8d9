"""Scenario 1, smoke: every master lists every minion's key; test.ping and cmd.run 'echo hi' through
each of the three masters reach every minion behind both load balancers."""
import time

from ..common import MASTERS, log, now, pct
from .. import fanout
from .base import new_result

ID, NAME = 1, "smoke"


def run(s):
    log("== scenario 1: smoke ==")
    res = new_result(ID, NAME)
    ok = True
    for ip in MASTERS:
        acc = s.cluster.accepted(ip)
        miss = [m for m in s.minions if m not in acc]
        if miss:
            ok = False
            res["notes"].append(f"master {ip} does not list accepted keys of {miss}")
    # wait until every minion answers once (they authenticate after their key was accepted)
    t0 = now()
    while True:
        r = s.jobs.job_once(MASTERS[0], "test.ping", timeout=10)
        missing = [m for m in s.minions if m not in r.get("returns", {})]
        if not missing:
            break
        if now() - t0 > 120:
            ok = False
            res["notes"].append(f"minions never answered a first test.ping: {missing}")
            break
        time.sleep(2)
    log(f"all minions answer (readiness wait {now() - t0:.1f} s, not counted)")
    runs = []
    for ip in MASTERS:
        for fun, args, want in (("test.ping", [], True), ("cmd.run", ["echo hi"], "hi")):
            r = s.jobs.job_once(ip, fun, *args, timeout=20)
            runs.append((ip, want, r))
            rets = r.get("returns", {})
            bad = [m for m in s.minions if m not in rets or rets[m]["ret"] != want]
            line = "all answered" if not bad else f"missing/wrong: {bad}"
            if r.get("error"):
                line += f" (error: {r['error'][:200]})"
            log(f"  via {ip} {fun} {' '.join(args)}: {line}")
            if bad:
                ok = False
    for lb in s.lbs:
        missed = {m: 0 for m in lb.minions}
        lats = []
        for _, want, r in runs:
            for m in lb.minions:
                rr = r.get("returns", {}).get(m)
                if rr is None or rr["ret"] != want:
                    missed[m] += 1
                else:
                    lats.append(rr["lat"])
        res["rows"][lb.key] = {"jobs": f"{len(runs)} ({len(runs)})", "missed": missed, "detect": "n/a",
                               "recovery": "n/a",
                               "p50": pct(lats, 50), "p95": pct(lats, 95),
                               "ok": all(v == 0 for v in missed.values())}
    if "fo" in res["rows"] and fanout.runs_once_check(s, res) > 1:
        res["rows"]["fo"]["ok"] = False  # a job that arrived once per master ran twice
    res["ok"] = ok and all(r["ok"] for r in res["rows"].values())
    res["summary"] = (f"{len(runs)} jobs (test.ping + cmd.run 'echo hi' through each of the 3 masters) "
                      f"x {len(s.minions)} minions")
    s.record(res)
