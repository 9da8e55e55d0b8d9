"""Scenario 6, drain through the API: `saltgate ctl drain <master>` on the master holding the most
saltgate publish sessions, HAProxy's `set server ... state drain` on the same master, while test.ping
rounds run through all three masters. saltgate must open no new session to the drained master and
close its publish sessions there at global.drain_timeout; its minions must answer again."""
import re
import time

from ..common import MASTERS, PRE_S, PUB_PORT, REQ_PORT, SETTLE_S, fmt_s, log, now
from ..jobs import reconnect_time
from ..lb import conn_set, drain_timeout
from .base import log_bad_rounds, log_minion_events, missed_within_allowance, note_publish_errors, \
    start_saltgate_scenario, stream_row
from .reload import ROUND_S

ID, NAME = 6, "drain through the API"


def _watch(sg, st, s, victim, name, pre, t0, dt):
    """until saltgate's sessions on VICTIM are gone and its minions answer again (or dt + 60 s):
    (connections opened after the drain, when ss saw no publish session left, when the API did,
    sessions the API listed that were opened after the drain)"""
    # saltgate's health checks dial the masters from 127.0.0.1 too (ZMTP greeting, a ping), a few a
    # second and gone at once: a connection counts as a new session only if ss sees it >= 2 s
    new, t_zero, t_zero_api, api_new, seen = set(), None, None, {}, {}
    max_obs = dt + 60
    while True:
        time.sleep(0.5)
        el = now() - t0
        cur = conn_set((PUB_PORT, REQ_PORT), sg.src, victim)
        for c in cur - pre:
            seen.setdefault(c, el)
            if el - seen[c] >= 2.0:
                new.add(c)
        n_pub = sum(1 for c in cur if c.startswith(f"{victim}:{PUB_PORT}<-"))
        if t_zero is None and n_pub == 0:
            t_zero = el
            log(f"T0+{el:.1f}s: no saltgate publish session left on {victim}")
        try:
            code, body = sg.api("GET", f"/api/v1/sessions?master={name}")
            if code == 200 and isinstance(body, dict):
                pubs = [x for x in body["sessions"] if x["listener"] == "publish"]
                if t_zero_api is None and not pubs:
                    t_zero_api = el
                for x in body["sessions"]:
                    if x["age_s"] + 2 < el:
                        api_new[x["id"]] = x
        except OSError:
            pass
        if el >= max_obs:
            break
        if t_zero is not None and el >= t_zero + 12 and s.jobs.live_recovered(st, "sg", t0):
            break
    return new, t_zero, t_zero_api, api_new


def run(s):
    sid, title = ID, NAME
    log(f"== scenario {sid}: {title} ==")
    sg, ha = s.sg, s.ha
    res = start_saltgate_scenario(s, sid, title)
    if res is None:
        return
    dt = drain_timeout(s.a.sg_config)
    sp = s.spread()
    # the master holding the most saltgate publish sessions (HAProxy's too, if it can)
    victim = sorted(MASTERS, key=lambda ip: (-sp["sg"][ip], -sp["ha"][ip], MASTERS.index(ip)))[0]
    name = sg.names[victim]
    res.update(victim=victim, spread_before=sp)
    log(f"victim {name} ({victim}; publish sessions: saltgate {sp['sg'][victim]}, HAProxy {sp['ha'][victim]}); "
        f"drain_timeout {dt:.0f} s; publishing test.ping every {ROUND_S} s through each of {MASTERS}")
    st = s.jobs.start_streams(f"s{sid}", MASTERS, interval=ROUND_S, settle=2 * SETTLE_S)
    time.sleep(PRE_S)
    pre = conn_set((PUB_PORT, REQ_PORT), sg.src, victim)
    n_sg0 = len(conn_set((PUB_PORT,), sg.src, victim))
    n_ha0 = len(conn_set((PUB_PORT,), ha.src, victim))
    t0 = now()
    rc, out = sg.ctl("drain", name)
    log(f"T0: saltgate ctl drain {name}: exit {rc}: {out[-200:]}")
    ha_out = ha.haproxy_set_state(name, "drain")
    log(f"T0+{now() - t0:.1f}s: HAProxy set server .../{name} state drain: {ha_out}")
    new, t_zero, t_zero_api, api_new = _watch(sg, st, s, victim, name, pre, t0, dt)
    t_end = now()
    n_ha1 = len(conn_set((PUB_PORT,), ha.src, victim))
    sp1 = s.spread()
    s.jobs.stop_streams(st)
    jobs, perr = s.jobs.read_jobs(st["files"])
    ev = s.jobs.minion_events(t0, t_end)
    # back to normal: enable on both
    rc_en, out_en = sg.ctl("enable", name)
    ha_en = ha.haproxy_set_state(name, "ready")
    log(f"saltgate ctl enable {name}: exit {rc_en}: {out_en[-200:]}; HAProxy state ready: {ha_en}")
    note_publish_errors(res, perr)
    an = {lb.key: s.jobs.analyse(jobs, lb.key, t0 - PRE_S, t_end=t_end) for lb in s.lbs}
    for lb in s.lbs:
        a = an[lb.key]
        row = stream_row(a, reconnect=reconnect_time(ev, lb.minions), recovered=a["recovered"])
        if lb.kind == "saltgate":
            row["detect"] = (f"`ctl drain` exit {rc}; new sessions to {victim}: "
                             f"{len(new) if new else 'none'}")
            row["recovery"] = (f"{n_sg0} publish session(s) closed at {fmt_s(t_zero, 'never')} "
                               f"(drain_timeout {dt:.0f} s); " +
                               ("every minion answers again" if a["recovered"] else
                                f"not recovered ({t_end - t0:.0f} s)") +
                               (f" {a['recovery']:.1f} s after the drain" if a["recovered"] and a["bad"] else ""))
        else:
            row["detect"] = "`set server state drain`"
            row["recovery"] = (f"{n_ha0} publish session(s) on {victim} at T0, {n_ha1} still there after "
                               f"{t_end - t0:.0f} s (HAProxy's drain keeps them)")
        res["rows"][lb.key] = row
    r = res["rows"]["sg"]
    ok = rc == 0 and rc_en == 0
    if rc != 0 or rc_en != 0:
        res["notes"].append(f"ctl drain exit {rc} ({out[-150:]}), ctl enable exit {rc_en} ({out_en[-150:]})")
    if new:
        ok = False
        res["notes"].append(f"saltgate opened {len(new)} new connection(s) to the drained master: "
                            f"{sorted(new)[:4]}")
    if api_new:
        ok = False
        res["notes"].append(f"/api/v1/sessions?master={name} listed {len(api_new)} session(s) opened after "
                            f"the drain: {list(api_new.values())[:3]}")
    if n_sg0 and (t_zero is None or not dt - 2 <= t_zero <= dt + 5):
        ok = False
        res["notes"].append(f"saltgate's publish sessions on {victim} reached 0 at {fmt_s(t_zero, 'never')}, "
                            f"not at the drain deadline ({dt:.0f} s)")
    if not n_sg0:
        res["notes"].append(f"saltgate had no publish session on {victim} at T0: nothing to drain")
    if not missed_within_allowance(s, res, sum(r["missed"].values()), sum(res["rows"]["ha"]["missed"].values())):
        ok = False
    if r["reconnect"] == "not all reconnected":
        ok = False
        res["notes"].append("a saltgate minion lost its connection and did not reconnect within the window")
    if not r["recovered"]:
        if res["rows"]["ha"]["recovered"]:
            ok = False
        res["notes"].append("not every saltgate minion answered the last rounds of the window" +
                            ("" if res["rows"]["ha"]["recovered"] else
                             " (nor did HAProxy's, whose sessions were untouched: Salt's own noise)"))
    res["notes"].append(f"saltgate publish sessions on {name}: ss 0 at {fmt_s(t_zero, 'never')}, "
                        f"/api/v1/sessions 0 at {fmt_s(t_zero_api, 'never')} after the drain call")
    m = re.match(r"([\d.]+) s$", str(r["reconnect"]))
    if m and t_zero is not None:
        res["notes"].append(f"the drained minions were all ready again {float(m.group(1)) - t_zero:.1f} s after "
                            f"saltgate closed their sessions (minion logs)")
    r["ok"] = ok
    res.update(ok=ok, spread_after=sp1, t0=t0)
    for lb in s.lbs:
        log_bad_rounds(lb, an[lb.key]["bad"], t0, 30)
    log_minion_events(ev)
    s.record(res)
