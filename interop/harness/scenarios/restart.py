"""Scenario 4: restart the master killed in scenario 2; once it is back, count the publish sessions
per master (does either load balancer send minions to it again?) and check, with rounds of test.ping
through all three masters, that every minion answers. saltgate must mark it UP within
`rise x downinter + 2 s` of its first answered clear ping, and (rebalancing on) hold its share of
publish sessions, within the configured tolerance, within 60 s of that UP (harness/rebalance.py)."""
import time

from .. import misses, presence, rebalance
from ..common import MASTERS, log, now
from .. import fanout
from ..lb import Watcher, spread_txt
from ..timing import PingWatch, fmt_breakdown, health_of, restart_breakdown
from .base import new_result, note_publish_errors, stream_row

REBALANCE_WITHIN_S = 60.0  # issue 10 part 2: the restarted master holds its share within this after UP

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
    ping = PingWatch(victim, transport=s.cluster.transport, tls_dir=s.cluster.tls_dir)
    ping.start()
    fo_before = fanout.snapshot(s)
    t0 = now()
    ready_s = s.cluster.start_masters([victim])
    t_ready = now()
    st = s.jobs.start_streams("s4", MASTERS)
    time.sleep(max(0.0, t_ready + s.a.spread_wait - now()))
    sp_back = s.spread()
    t_spread = now()
    reb = rebalance.observe(s, victim, t0, after_up=REBALANCE_WITHIN_S) if s.sg.kind == "saltgate" else None
    time.sleep(5)
    s.jobs.stop_streams(st)
    t_end = now()
    w.finish()
    missing = s.jobs.wait_healthy("after the restart", timeout=90)
    ping.stop()
    for lb in s.lbs:
        lb.poll()  # the flips logged since the watcher stopped (a slow start comes UP late)
    all_ok_s = now() - t0
    jobs, perr = s.jobs.read_jobs(st["files"])
    res.update(spread_down=sp_down, spread_back=sp_back, ready_s=ready_s, t_spread=t_spread - t_ready)
    note_publish_errors(res, perr)
    # Judged against HAProxy under the same restart (as scenarios 2 and 3): a slot fails when a
    # larger share of its minions never answered again than of HAProxy's (when the cluster itself
    # has not recovered within 90 s, every group misses alike: that is Salt, not the load balancer).
    ha_share = len([m for m in s.ha.minions if m in missing]) / max(1, len(s.ha.minions))
    analyses = {lb.key: s.jobs.analyse(jobs, lb.key, t_ready) for lb in s.lbs}
    for lb in s.lbs:
        up = lb.first_event(victim, "UP", t0)
        res["rows"][lb.key] = stream_row(
            analyses[lb.key],
            detect=(f"marked UP {up - t0:.1f} s after the restart began" if up else
                    ("no UP flip logged" if lb.kind == "saltgate" else "not UP")),
            recovery=(f"{sp_back[lb.key][victim]} publish session(s) on {victim} "
                      f"{t_spread - t_ready:.0f} s after it was ready"))
    misses.note_causes(s, res, jobs, analyses, t_ready, t_end, victim, what="the restart")
    for lb in s.lbs:
        row, miss = res["rows"][lb.key], [m for m in lb.minions if m in missing]
        share = len(miss) / max(1, len(lb.minions))
        row["ok"] = not miss or (lb is not s.ha and share <= ha_share) or _backlog_only(s, res, lb, miss)
        if miss:
            res["notes"].append(f"{lb.label}: {miss} never answered a round within 90 s after the restart checks"
                                + ("" if lb is s.ha else f" (HAProxy's minions: {ha_share:.0%} of them did not either)"))
    if reb and reb["samples"]:
        el, counts = reb["samples"][-1][0], {"sg": reb["samples"][-1][1], "ha": reb["samples"][-1][2]}
        for lb in s.lbs:
            if lb.key in counts:  # the fan-out slot has no L4 publish sessions to move
                res["rows"][lb.key]["recovery"] += f"; {counts[lb.key][victim]} {el:.0f} s after saltgate's UP"
    bound_ok = _timing_notes(s, res, victim, t0, ping, t_ready)
    reb_ok = _rebalance_notes(s, res, victim, reb, jobs) if reb else True
    res["notes"].append(f"every minion answered a round {all_ok_s:.0f} s after the restart began"
                        if not missing else "not every minion answered again after the restart")
    fanout.restart_checks(s, res, fo_before, t_ready, jobs)
    if s.sg.kind == "saltgate":
        p_ok, p_note = presence.check(s, "after the restart and the rebalancing")
        res["notes"].append(p_note)
        reb_ok = reb_ok and p_ok
    if bound_ok is False:
        # judged (issue 10 part 3): a kept ping lost before Salt's request gate opened no longer
        # holds UP back, a fresh ping goes beside it each check (proxy/src/select/check.rs)
        res["notes"].append("scenario 4: saltgate's UP came later than the bound rise x downinter + 2 s "
                            "(plus the master's own answer time) after the master's first clear ping "
                            "answer: FAIL")
        reb_ok = False
    res["rows"]["sg"]["ok"] = res["rows"]["sg"]["ok"] and reb_ok
    res["ok"] = res["rows"]["sg"]["ok"] and res["rows"].get("fo", {}).get("ok", True)
    s.record(res)


def _backlog_only(s, res, lb, miss):
    """The fan-out slot's minions that did not answer within 90 s pass when every stream round they
    missed is the Salt minion's own backlog (misses.MINION_BACKLOG: receiving, starting or returning
    behind), none on a path saltgate carries: its row is judged on the mode's promises
    (fanout.restart_checks). The L4 rows keep the rule against HAProxy."""
    causes = res["rows"][lb.key].get("causes") or {}
    if lb is not getattr(s, "fo", None) or not any(causes.values()):
        return False
    other = {c: n for c, n in causes.items() if n and c not in misses.MINION_BACKLOG}
    res["notes"].append(f"{lb.label}: the stream rounds missed by {', '.join(miss)} are "
                        + (f"not all the minions' own backlog ({misses.fmt_causes(other)}): FAIL" if other else
                           "all the Salt minions' own backlog (" + misses.fmt_causes(causes) + "), none on a path "
                           "saltgate carries: judged on the fan-out's promises"))
    return not other


def _rebalance_notes(s, res, victim, reb, jobs):
    """the restarted master's share within REBALANCE_WITHIN_S of UP (against the configured tolerance),
    the moves, and the rounds the moved minions missed: True when it passes"""
    cfg = reb["settings"]
    if reb["t_up"] is None:
        res["notes"].append(f"rebalancing not observed: saltgate never marked {victim} UP")
        return False
    mv = rebalance.moves(s.sg, reb["t_up"], s.sg.minions + s.sgm_minions)
    res["rebalance"] = reb
    tl = "; ".join(f"+{el:.0f} s {spread_txt(sg)}" for el, sg, _ in reb["samples"][::5])
    share = reb["shares"].get(victim, 0.0)
    last = reb["samples"][-1][1] if reb["samples"] else {}
    if not cfg["enabled"]:
        res["notes"].append(f"rebalancing is off in saltgate's config: {victim} holds {last.get(victim)} "
                            f"publish session(s) {reb['samples'][-1][0]:.0f} s after UP" if last else
                            "rebalancing is off in saltgate's config")
        return True
    head = (f"rebalancing (tolerance {cfg['tolerance_pct']:g}%, rate {cfg['rate']:g}/s, delay {cfg['delay_s']:g} s): ")
    if reb["t_within"] is None:
        res["notes"].append(head + f"saltgate's publish sessions NOT within tolerance {REBALANCE_WITHIN_S:.0f} s "
                            f"after {victim} was UP (per master, every 5 s from UP: {tl})")
        ok = False
    else:
        n = next(sg for el, sg, _ in reb["samples"] if el >= reb["t_within"])[victim]
        res["notes"].append(head + f"{victim} held {n} of saltgate's publish sessions (share {share:.1f}) "
                            f"{reb['t_within']:.1f} s after it was UP (within {REBALANCE_WITHIN_S:.0f} s: yes); "
                            f"per master, every 5 s from UP: {tl}; HAProxy (no rebalancing) "
                            f"{spread_txt(reb['samples'][-1][2])} at the end")
        ok = True
    if mv:
        moved_missed, unknown = rebalance.moved_misses(s, jobs, mv)
        others = rebalance.unmoved_misses(s, jobs, mv)
        when = f"+{mv[0][0] - reb['t_up']:.1f}..+{mv[-1][0] - reb['t_up']:.1f} s after UP"
        txt = ", ".join(f"{m}: {n}" for m, n in moved_missed.items()) or "none in the job stream"
        if others:
            txt += (f" (saltgate's minions that were not moved, over the same rounds: "
                    f"{', '.join(f'{m}: {n}' for m, n in others.items())})")
        res["notes"].append(f"rebalanced: {len(mv)} publish session(s) moved ({when}; "
                            f"{', '.join(f'{m} from {src}' for _, m, src in mv)}); rounds the moved minions missed "
                            f"after their move (1 round/s through each master): {txt}" +
                            (f"; {', '.join(unknown)} not in the job stream (saltgate-minions)" if unknown else ""))
    else:
        res["notes"].append("rebalanced: no publish session moved")
    return ok


def _timing_notes(s, res, victim, t0, ping, t_ready):
    """where the time between the restart and saltgate's UP goes (see docs/operations.md); whether
    the UP came within the bound (None: not measured)"""
    if ping.error:
        res["notes"].append(f"restart timing not measured: {ping.error}")
    for lb in s.lbs:
        up = lb.first_event(victim, "UP", t0)
        if up and ping.t_answer:
            res["rows"][lb.key]["detect"] += f" ({up - ping.t_answer:.1f} s after its first clear ping answer)"
    if s.sg.kind != "saltgate":
        return None
    h = health_of(s.sg.cfg)
    bound = h.get("rise", 2) * h.get("downinter", 2.0)
    name = s.sg.names.get(victim, victim)
    t_up = s.sg.first_event(victim, "UP", t0)
    rel, within, failed, answering = restart_breakdown(s.sg, name, t0, ping, t_up, bound,
                                                       h.get("rise", 2))
    rel.insert(1, ("Salt logged 'opening request gate'", t_ready - t0))
    rel.sort(key=lambda x: float("inf") if x[1] is None else x[1])
    res["restart_timing"] = rel
    line = f"{s.sg.label} restart time line (from the restart's start): {fmt_breakdown(rel)}"
    if within is not None:
        gap = t_up - ping.t_answer
        line += (f"; UP {gap:.1f} s after the master first answered a clear ping "
                 f"(bound rise x downinter + 2 s = {bound + 2:.1f} s, plus the {answering:.1f} s the master "
                 f"took to answer the checks that made it UP: {'within' if within else 'EXCEEDED: FAIL'})")
    res["notes"].append(line)
    for (port, detail), took in sorted(failed.items()):
        res["notes"].append(f"{s.sg.label} failing {port} checks while it started: {len(took)} x '{detail}' "
                            f"(each {min(took) / 1000:.1f}-{max(took) / 1000:.1f} s)")
    return within
