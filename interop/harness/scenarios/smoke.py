"""Scenario 1, smoke: every master lists every minion's key; test.ping and cmd.run 'echo hi' published
to '*' through each of the three masters reach every minion behind both load balancers: Salt's
minions and the saltgate-minion processes behind saltgate (issue 9's proof with real Salt). Then
saltgate's presence lists every minion behind it with its masters (issue 10, harness/presence.py)."""
import time

from .. import presence
from ..common import MASTERS, log, now, pct
from .. import fanout
from .base import new_result

ID, NAME = 1, "smoke"


def run(s):
    log("== scenario 1: smoke ==")
    res = new_result(ID, NAME)
    ok = True
    everyone = s.minions + s.sgm_minions
    for ip in MASTERS:
        acc = s.cluster.accepted(ip)
        miss = [m for m in everyone if m not in acc]
        if miss:
            ok = False
            res["notes"].append(f"master {ip} does not list accepted keys of {miss}")
    # wait until every minion answers once (they authenticate after their key was accepted)
    t0 = now()
    while True:
        r = s.jobs.job_once(MASTERS[0], "test.ping", timeout=10, expect=everyone, glob="*")
        missing = [m for m in everyone if m not in r.get("returns", {})]
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
            r = s.jobs.job_once(ip, fun, *args, timeout=20, expect=everyone, glob="*")
            runs.append((ip, want, r))
            rets = r.get("returns", {})
            bad = [m for m in everyone if m not in rets or rets[m]["ret"] != want]
            extra = sorted(set(r.get("targeted", everyone)) - set(everyone))
            line = "all answered" if not bad else f"missing/wrong: {bad}"
            if extra:
                line += f" (also targeted: {extra})"
            if r.get("error"):
                line += f" (error: {r['error'][:200]})"
            log(f"  via {ip} salt '*' {fun} {' '.join(args)}: {line}")
            if bad:
                ok = False
    for lb in s.lbs:
        group = lb.minions + (s.sgm_minions if lb is s.sg else [])
        missed = {m: 0 for m in group}
        lats = []
        for _, want, r in runs:
            for m in group:
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
    if s.sgm_minions:
        sgm_ok = all(m in r.get("returns", {}) and r["returns"][m]["ret"] == want
                     for _, want, r in runs for m in s.sgm_minions)
        res["notes"].append(f"{len(s.sgm_minions)} saltgate-minion processes behind saltgate "
                            f"({', '.join(s.sgm_minions)}): keys accepted with salt-key; salt '*' test.ping and "
                            f"salt '*' cmd.run 'echo hi' through each of the 3 masters: " +
                            ("every one answered True / 'hi'" if sgm_ok else "NOT all answered right"))
    p_ok, p_note = presence.check(s, "after the jobs")
    res["notes"].append(p_note)
    res["rows"]["sg"]["ok"] = res["rows"]["sg"]["ok"] and p_ok
    res["ok"] = ok and all(r["ok"] for r in res["rows"].values())
    res["summary"] = (f"{len(runs)} jobs (salt '*' test.ping + cmd.run 'echo hi' through each of the 3 masters) "
                      f"x {len(everyone)} minions")
    s.record(res)
