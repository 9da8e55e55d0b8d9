"""Scenario 4: restart the master killed in scenario 2; once it is back, count the publish sessions
per master (does either load balancer send minions to it again?) and check, with rounds of test.ping
through all three masters, that every minion answers."""
import time

from ..common import MASTERS, log, now
from .. import fanout
from ..lb import Watcher
from ..timing import PingWatch, fmt_breakdown, health_of, restart_breakdown
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
    ping = PingWatch(victim)
    ping.start()
    fo_before = fanout.snapshot(s)
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
    ping.stop()
    for lb in s.lbs:
        lb.poll()  # the flips logged since the watcher stopped (a slow start comes UP late)
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
    _timing_notes(s, res, victim, t0, ping, t_ready)
    res["notes"].append(f"every minion answered a round {all_ok_s:.0f} s after the restart began"
                        if not missing else "not every minion answered again after the restart")
    fanout.restart_checks(s, res, fo_before, t_ready, jobs)
    res["ok"] = res["rows"]["sg"]["ok"] and res["rows"].get("fo", {}).get("ok", True)
    s.record(res)


def _timing_notes(s, res, victim, t0, ping, t_ready):
    """where the time between the restart and saltgate's UP goes (see docs/operations.md)"""
    if ping.error:
        res["notes"].append(f"restart timing not measured: {ping.error}")
    for lb in s.lbs:
        up = lb.first_event(victim, "UP", t0)
        if up and ping.t_answer:
            res["rows"][lb.key]["detect"] += f" ({up - ping.t_answer:.1f} s after its first clear ping answer)"
    if s.sg.kind != "saltgate":
        return
    h = health_of(s.sg.cfg)
    bound = h.get("rise", 2) * h.get("downinter", 2.0)
    name = s.sg.names.get(victim, victim)
    t_up = s.sg.first_event(victim, "UP", t0)
    rel, within, failed = restart_breakdown(s.sg, name, t0, ping, t_up, bound)
    rel.insert(1, ("Salt logged 'opening request gate'", t_ready - t0))
    rel.sort(key=lambda x: float("inf") if x[1] is None else x[1])
    res["restart_timing"] = rel
    line = f"{s.sg.label} restart time line (from the restart's start): {fmt_breakdown(rel)}"
    if within is not None:
        gap = t_up - ping.t_answer
        line += (f"; UP {gap:.1f} s after the master first answered a clear ping "
                 f"(bound rise x downinter + 2 s = {bound + 2:.1f} s: {'within' if within else 'EXCEEDED'})")
        # Reported, not a failure yet: saltgate's stale pings on a starting master can still add
        # ~0.5 s under load (docs/operations.md, "A master restarts"); issue 10 keeps it open.
    res["notes"].append(line)
    for (port, detail), took in sorted(failed.items()):
        res["notes"].append(f"{s.sg.label} failing {port} checks while it started: {len(took)} x '{detail}' "
                            f"(each {min(took) / 1000:.1f}-{max(took) / 1000:.1f} s)")
