"""Scenario 5, reload under load: 20 reloads of saltgate (SIGHUP, `saltgate ctl reload`, POST
/api/v1/reload in turn), alternating between two valid configs, while test.ping rounds run through all
three masters. Each reload must be in effect (generation up, weight changed) within 5 s, and no
publish session may be closed or replaced by it. HAProxy is not reloaded: its row is the reference."""
import os
import re
import signal
import subprocess
import time

from ..common import MASTERS, PRE_S, SETTLE_S, log, now, wait_for, write_atomic
from ..jobs import reconnect_time
from ..lb import session_sets, sg_variants
from .base import log_bad_rounds, missed_within_allowance, note_publish_errors, start_saltgate_scenario, stream_row

ID, NAME = 5, "reload under load"
RELOADS = 20
RELOAD_EVERY_S = 1.5
ROUND_S = 2  # one round every 2 s in 5 and 6: three jobs a second overload Salt on a busy 2-core host
NORMAL_PUB_CLOSE = ("client-eof", "client-reset")
TRIGGERS = ("SIGHUP", "ctl reload", "POST /api/v1/reload")


def _trigger(sg, pid, how, i, fails):
    try:
        if how == "SIGHUP":
            os.kill(pid, signal.SIGHUP)
        elif how == "ctl reload":
            rc, out = sg.ctl("reload")
            if rc != 0:
                fails.append(f"reload {i + 1} ({how}): exit {rc}: {out[-200:]}")
        else:
            code, body = sg.api("POST", "/api/v1/reload")
            if code != 200:
                fails.append(f"reload {i + 1} ({how}): HTTP {code} {str(body)[:200]}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        fails.append(f"reload {i + 1} ({how}): {exc}")


def _closes(lines):
    """sessions saltgate logged as closed, {listener: {reason: n}}"""
    closes = {}
    for l in lines:
        m = re.search(r"listener=(\w+).*?reason=([\w-]+)", l)
        if m and "session closed" in l:
            closes.setdefault(m.group(1), {}).setdefault(m.group(2), 0)
            closes[m.group(1)][m.group(2)] += 1
    return closes


def run(s):
    sid, title = ID, NAME
    log(f"== scenario {sid}: {title} ({RELOADS} reloads, one every {RELOAD_EVERY_S} s) ==")
    sg = s.sg
    res = start_saltgate_scenario(s, sid, title)
    if res is None:
        return
    cfg = s.a.sg_config
    va, vb = sg_variants(cfg)
    first = open(cfg).read()
    w_name = sg.names[MASTERS[0]]
    sp0 = s.spread()
    conns0 = session_sets(s.lbs)
    g0, _ = sg.weights()
    off = sg.log_size()
    st = s.jobs.start_streams(f"s{sid}", MASTERS, interval=ROUND_S, settle=2 * SETTLE_S)
    time.sleep(PRE_S)
    t0 = now()
    pid = s.procs.pid(sg.name)
    took, fails, gens = 0, [], [g0]
    for i in range(RELOADS):
        t_i = t0 + i * RELOAD_EVERY_S
        time.sleep(max(0.0, t_i - now()))
        text, want = (vb, 3) if i % 2 == 0 else (va, 1)
        write_atomic(cfg, text)
        how = TRIGGERS[i % 3]
        prev = gens[-1] or 0
        _trigger(sg, pid, how, i, fails)
        ok_i = wait_for(lambda: (lambda g, w: g is not None and g > prev and w and w.get(w_name) == want)(
            *sg.weights()), 5, 0.1)
        g, w = sg.weights()
        gens.append(g)
        if ok_i:
            took += 1
        else:
            fails.append(f"reload {i + 1} ({how}) not in effect after 5 s: generation {prev} -> {g}, "
                         f"weight of {w_name} {None if not w else w.get(w_name)} (want {want})")
    t_rel = now()
    rc, status = sg.ctl("status")
    last = status.splitlines()[-1] if status else ""
    time.sleep(PRE_S)
    t_end = now()
    conns1 = session_sets(s.lbs)
    sp1 = s.spread()
    s.jobs.stop_streams(st)
    write_atomic(cfg, first)  # leave the imported config in force
    wait_for(lambda: (lambda g, w: w and w.get(w_name) == 1)(*sg.weights()), 6, 0.2)
    # saltgate's own log in the window: publish sessions it closed, and any reload errors
    lines = sg.log_since(off)
    closes = _closes(lines)
    odd_pub = {r: n for r, n in closes.get("publish", {}).items() if r not in NORMAL_PUB_CLOSE}
    errs = [l for l in lines if re.search(r"\b(ERROR)\b|reload refused", l)]
    n_done = sum(1 for l in lines if "reload done" in l)
    jobs, perr = s.jobs.read_jobs(st["files"])
    note_publish_errors(res, perr)
    ev = s.jobs.minion_events(t0, t_end)
    an = {lb.key: s.jobs.analyse(jobs, lb.key, t0 - PRE_S, t_end=t_end) for lb in s.lbs}
    ha_bad = {tk for tk, _, _ in an["ha"]["bad"]}
    sg_only = [(tk, miss) for tk, _, miss in an["sg"]["bad"] if tk not in ha_bad]
    for lb in s.lbs:
        kept = conns0[lb.key] & conns1[lb.key]
        row = stream_row(an[lb.key], reconnect=reconnect_time(ev, lb.minions),
                         recovery=(f"publish sessions {len(conns0[lb.key])} before, {len(conns1[lb.key])} after, "
                                   f"{len(kept)} the same"))
        if lb.kind == "saltgate":
            row["detect"] = (f"{took}/{RELOADS} reloads in effect (generation {g0} -> {gens[-1]}; "
                             f"SIGHUP, ctl, API in turn)")
        else:
            row["detect"] = "n/a (not reloaded)"
        res["rows"][lb.key] = row
    r = res["rows"]["sg"]
    ok = True
    if took != RELOADS or fails:
        ok = False
        res["notes"] += fails[:5]
    if not last.startswith("config generation"):
        res["notes"].append(f"`saltgate ctl status` (exit {rc}) did not end with 'config generation N': {last!r}")
        ok = False
    else:
        res["notes"].append(f"`saltgate ctl status` after the reloads: {last!r}; saltgate logged "
                            f"{n_done} 'reload done' (the file watcher may add some)")
    if conns0["sg"] != conns1["sg"]:
        ok = False
        res["notes"].append(f"saltgate's publish sessions changed: {len(conns0['sg'] - conns1['sg'])} gone, "
                            f"{len(conns1['sg'] - conns0['sg'])} new")
    if odd_pub:
        ok = False
        res["notes"].append(f"saltgate closed publish sessions during the reloads: {odd_pub}")
    if errs:
        ok = False
        res["notes"].append(f"saltgate logged {len(errs)} ERROR/refused line(s), e.g. {errs[0][:200]}")
    lost = [m for m in sg.minions if any(e.startswith("lost@") for e in ev.get(m, []))]
    if lost:
        ok = False
        res["notes"].append(f"saltgate minions logged a lost master connection during the reloads: {lost}")
    if not missed_within_allowance(s, res, sum(an["sg"]["missed"].values()), sum(an["ha"]["missed"].values())):
        ok = False
    if sg_only:
        res["notes"].append(f"{len(sg_only)} round(s) missed by a saltgate minion in which every HAProxy minion "
                            f"answered (its connections unchanged: Salt's noise unless saltgate stalled bytes): "
                            f"{[(round(tk - t0), m) for tk, m in sg_only[:5]]}")
    elif an["sg"]["bad"]:
        res["notes"].append("every round a saltgate minion missed was also missed by an HAProxy minion "
                            "(Salt's own noise)")
    res["notes"].append(f"publish sessions closed by saltgate in the window, by reason: "
                        f"{closes.get('publish', {}) or 'none'}; request sessions: {closes.get('request', {}) or 'none'}")
    r["ok"] = ok
    res.update(ok=ok, spread_before=sp0, spread_after=sp1, t0=t0, reload_s=t_rel - t0)
    for lb in s.lbs:
        log_bad_rounds(lb, an[lb.key]["bad"], t0, 30)
    s.record(res)
