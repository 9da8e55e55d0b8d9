"""Scenarios 2 and 3: a master fails under both load balancers at once, while test.ping is published
every second through each of the other two. 2: SIGKILL (the master stays down until scenario 4);
3: SIGSTOP for --hang seconds, then SIGCONT. Measured per load balancer: when it marked the master
DOWN, the rounds its minions missed, when they all answered again, when they reconnected."""
import signal
import time

from ..common import MASTERS, PRE_S, log, now
from ..jobs import reconnect_time
from ..lb import Watcher
from .. import fanout, misses
from .base import log_bad_rounds, log_minion_events, missed_within_allowance, new_result, note_publish_errors, \
    stream_row

HANG_DETECT_S = 5.0  # issue 10 part 3: a SIGSTOPped master is DOWN within this
TITLES = {"kill": "master killed (SIGKILL)", "hang": "master hung (SIGSTOP, later SIGCONT)"}


def kill(s):
    return run(s, 2, "kill")


def hang(s):
    return run(s, 3, "hang")


def _observe(s, st, t0, since, min_obs, max_obs):
    """until both groups answer again (live, rounds from T0 on) once MIN_OBS seconds passed since SINCE,
    or MAX_OBS seconds passed"""
    while True:
        time.sleep(1)
        el = now() - since
        if el >= max_obs:
            break
        if el >= min_obs and all(s.jobs.live_recovered(st, lb.key, t0) for lb in s.lbs):
            break


def _row(lb, a, victim, n_victim, t0, t_end, t_cont, events):
    down = lb.first_event(victim, "DOWN", t0 - 1)
    up = lb.first_event(victim, "UP", down) if down else None
    hit = [m for m, n in a["missed"].items() if n]
    row = stream_row(a, late_jobs=a["late_jobs"],
                     detect_s=None if down is None else down - t0,
                     up_again_s=None if up is None else up - t0,
                     recovery_s=a["recovery"], recovered=a["recovered"],
                     sessions_on_victim=n_victim, bad=[(tk - t0, ms, m) for tk, ms, m in a["bad"]])
    if down is None:
        row["detect"] = f"not marked down ({t_end - t0:.0f} s)"
    else:
        row["detect"] = f"{down - t0:.1f} s"
    if not a["recovered"]:
        row["recovery"] = f"not recovered ({t_end - t0:.0f} s)"
    elif not hit:
        row["recovery"] = "no round missed"
    elif a["recovery"] <= 0.0:
        row["recovery"] = "0 s (missed only rounds published before T0)"
    else:
        row["recovery"] = f"{a['recovery']:.1f} s"
        if t_cont is not None and a["recovery"] > t_cont - t0:
            row["recovery"] += f" ({a['recovery'] - (t_cont - t0):.1f} s after SIGCONT)"
    row["n_missed"] = sum(a["missed"].values())
    row["reconnect"] = reconnect_time(events, lb.minions)
    return row


def run(s, sid, kind):
    """scenario 2 (kind=kill) or 3 (kind=hang)"""
    title = TITLES[kind]
    log(f"== scenario {sid}: {title} ==")
    healthy = not s.jobs.wait_healthy(f"before scenario {sid}")
    # the hang never picks the master restarted in scenario 4 (it holds no sessions anyway)
    victim, sp0 = s.pick_victim(exclude=(s.killed,) if kind == "hang" and s.killed else ())
    observers = [ip for ip in MASTERS if ip != victim]
    res = new_result(sid, title, reference=True, victim=victim, spread_before=sp0)
    if not healthy:
        res["notes"].append("the cluster was not healthy when the scenario started (see the log)")
    log(f"victim {victim} (publish sessions before: {s.sg.label} {sp0['sg'][victim]}, "
        f"HAProxy {sp0['ha'][victim]}); publishing test.ping every 1 s through each of {observers}")
    w = Watcher.started(s.lbs)
    st = s.jobs.start_streams(f"s{sid}", observers)
    time.sleep(PRE_S)
    vname = "master-" + victim
    t0 = now()
    t_cont = None
    if kind == "kill":
        s.procs.signal(vname, signal.SIGKILL)
        log(f"T0: SIGKILL to every process of master {victim} (pgid {s.procs.pid(vname)})")
        min_obs, max_obs = 12, 60
    else:
        pids = s.procs.group_pids(vname)
        s.procs.signal(vname, signal.SIGSTOP)
        log(f"T0: SIGSTOP to every process of master {victim} ({len(pids)} processes)")
        min_obs, max_obs = s.a.hang, s.a.hang
    try:
        _observe(s, st, t0, t0, min_obs, max_obs)
        sp1 = s.spread()
        if kind == "hang":
            s.procs.signal(vname, signal.SIGCONT)
            t_cont = now()
            log(f"T0+{t_cont - t0:.1f}s: SIGCONT to master {victim}")
            _observe(s, st, t0, t_cont, 10, s.a.after_cont)
    finally:
        if kind == "hang" and t_cont is None:
            s.procs.signal(vname, signal.SIGCONT)
    t_end = now()
    s.jobs.stop_streams(st)
    w.finish()
    if kind == "kill":
        s.procs.forget(vname)
        s.killed = victim
    jobs, perr = s.jobs.read_jobs(st["files"])
    res.update(t0=t0, t_cont=t_cont, spread_during=sp1, spread_after=s.spread(), perr=len(perr),
               duration=t_end - t0, minion_events=s.jobs.minion_events(t0, t_end))
    note_publish_errors(res, perr)
    analyses = {}
    for lb in s.lbs:
        a = analyses[lb.key] = s.jobs.analyse(jobs, lb.key, t0, t_end=t_end)
        res["rows"][lb.key] = _row(lb, a, victim, sp0[lb.key][victim], t0, t_end, t_cont, res["minion_events"])
    misses.note_causes(s, res, jobs, analyses, t0, t_end, victim)
    # Pass/fail is relative: saltgate's minions must do no worse than HAProxy's, scaled by how many
    # publish sessions each had on the victim; and for a killed master, saltgate's minions must all
    # answer again before the window closes whenever HAProxy's do.
    sg, ha = res["rows"]["sg"], res["rows"]["ha"]
    scale = max(1, sg["sessions_on_victim"]) / max(1, ha["sessions_on_victim"])
    ok = missed_within_allowance(s, res, sg["n_missed"], ha["n_missed"], scale)
    if kind == "kill" and ha["recovered"] and not sg["recovered"]:
        ok = False
        res["notes"].append(f"{s.sg.label} minions did not all answer again within "
                            f"{t_end - t0:.0f} s; HAProxy's did")
    if kind == "hang" and s.sg.kind == "saltgate":
        # issue 10: a stopped master is DOWN within HANG_DETECT_S (its publish-port greeting and its
        # request-port handshake stop at once; a busy master's do not)
        d = sg.get("detect_s")
        if d is None or d > HANG_DETECT_S:
            ok = False
            res["notes"].append(f"{s.sg.label} marked the hung master DOWN after "
                                f"{'never' if d is None else f'{d:.1f} s'}: the bound is {HANG_DETECT_S:.0f} s")
        else:
            sg["detect"] += f" (bound {HANG_DETECT_S:.0f} s)"
    sg["ok"] = ok
    res["ok"] = ok
    fanout.judge_fault(s, res)
    for lb in s.lbs:
        row = res["rows"][lb.key]
        log_bad_rounds(lb, row["bad"], 0, 90, row.get("miss_causes"), t0)  # the row's rounds are T0-relative
        if row["late_jobs"]:
            log(f"  {lb.label}: {row['late_jobs']} single jobs were missed by minions that answered another job "
                "of the same round (Salt's master-to-master forwarding, not the load balancer)")
    log_minion_events(res["minion_events"])
    s.record(res)
    return victim
