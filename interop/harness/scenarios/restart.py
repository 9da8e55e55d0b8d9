"""Scenario 4: restart the master killed in scenario 2; once it is back, count the publish sessions
per master (does either load balancer send minions to it again?) and check, with rounds of test.ping
through all three masters, that every minion answers."""
import time

from ..common import MASTERS, log, now
from ..lb import Watcher
from .base import new_result, note_publish_errors, stream_row

ID, NAME = 4, "master restarted"


def run(s):
    log("== scenario 4: master restarted ==")
    victim = s.killed
    res = new_result(ID, NAME, victim=victim)
    if victim is None:
        res.update(ok=False, notes=["scenario 2 did not kill a master"])
        s.record(res)
        return
    sp_down = s.spread()
    w = Watcher.started(s.lbs)
    t0 = now()
    ready_s = s.cluster.start_masters([victim])
    t_ready = now()
    st = s.jobs.start_streams("s4", MASTERS)
    time.sleep(max(0.0, t_ready + s.a.spread_wait - now()))
    sp_back = s.spread()
    t_spread = now()
    time.sleep(5)
    s.jobs.stop_streams(st)
    w.finish()
    missing = s.jobs.wait_healthy("after the restart", timeout=90)
    all_ok_s = now() - t0
    jobs, perr = s.jobs.read_jobs(st["files"])
    res.update(spread_down=sp_down, spread_back=sp_back, ready_s=ready_s, t_spread=t_spread - t_ready)
    note_publish_errors(res, perr)
    for lb in s.lbs:
        a = s.jobs.analyse(jobs, lb.key, t_ready)
        up = lb.first_event(victim, "UP", t0)
        miss = [m for m in lb.minions if m in missing]
        res["rows"][lb.key] = stream_row(
            a,
            detect=(f"marked UP {up - t0:.1f} s after the restart began" if up else
                    ("no UP flip logged" if lb.kind == "saltgate" else "not UP")),
            recovery=(f"{sp_back[lb.key][victim]} publish session(s) on {victim} "
                      f"{t_spread - t_ready:.0f} s after it was ready"),
            ok=not miss)
        if miss:
            res["notes"].append(f"{lb.label}: {miss} never answered a round within 90 s after the restart checks")
    res["notes"].append(f"every minion answered a round {all_ok_s:.0f} s after the restart began"
                        if not missing else "not every minion answered again after the restart")
    res["ok"] = res["rows"]["sg"]["ok"]
    s.record(res)
