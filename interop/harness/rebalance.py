"""Rebalancing after a restart (issue 10 part 2, docs/configuration.md "Rebalancing"): once saltgate
marks the restarted master UP, the publish sessions per master as the masters' sockets show them
(`ss`), second by second, judged against saltgate's configured `rebalance.tolerance` (each master
within tolerance of its weighted share, at least one session); the sessions saltgate moved (its
access log: `session closed ... reason=rebalanced`, the client address naming the minion, since
each minion dials from its own address) and the rounds those minions missed after their move."""
import re
import time

from .common import MASTERS, log, minion_source, now
from .lb import spread_txt
from .timing import _secs

MOVED = re.compile(r"session closed.*?\bclient=([\d.]+):\d+.*?\blistener=publish\b.*?\bmaster=\"?([\w.:-]+)"
                   r".*?\breason=rebalanced\b")


def settings_of(cfg_path):
    """listeners.publish.rebalance of saltgate's YAML config: {enabled, tolerance_pct, rate, delay_s}"""
    out = {"enabled": True, "tolerance_pct": 10.0, "rate": 50.0, "delay_s": 10.0}  # saltgate's defaults
    try:
        text = open(cfg_path).read()
    except OSError:
        return out
    m = re.search(r"^ {4}rebalance:.*\n((?: {6}.*\n)*)", text, re.M)
    if not m:
        return out
    for line in m.group(1).splitlines():
        kv = re.match(r"\s+(\w+):\s*([^#\s]+)", line)
        if not kv:
            continue
        k, v = kv.groups()
        if k == "enabled":
            out["enabled"] = v.lower() in ("true", "yes", "on")
        elif k == "tolerance":
            out["tolerance_pct"] = float(v.rstrip("%"))
        elif k == "rate":
            out["rate"] = float(v.split("/")[0])
        elif k == "delay":
            out["delay_s"] = _secs(v)
    return out


def within(counts, weights, tol_pct):
    """every master within tolerance of its weighted share (at least one session): (bool, shares)"""
    total = sum(counts.values())
    wsum = sum(weights.values()) or 1
    shares = {ip: total * weights[ip] / wsum for ip in counts}
    ok = all(abs(counts[ip] - shares[ip]) <= max(tol_pct / 100.0 * shares[ip], 1.0) for ip in counts)
    return ok, shares


def moves(sg, t_from, ids):
    """saltgate's rebalancing moves since T_FROM: [(t, minion id or client ip, from master)]"""
    byip = {minion_source(m): m for m in ids}
    out = []
    for line in sg.log_since(0):
        m = MOVED.search(line)
        if not m:
            continue
        t = sg._parse_ts(line)  # pylint: disable=protected-access
        if t is None or t < t_from:
            continue
        out.append((t, byip.get(m.group(1), m.group(1)), m.group(2)))
    return out


def observe(s, victim, t0, up_limit=150.0, after_up=60.0, hold=15.0):
    """Waits for saltgate's UP of VICTIM (at most UP_LIMIT s after T0; the Watcher polls the log), then
    samples the publish sessions per master every second until the spread is within tolerance and HOLD
    seconds more passed (rounds for the moved minions to answer), or AFTER_UP seconds after the UP.
    Returns {t_up, t_within (s after UP), samples [(s after UP, sg counts, ha counts)], settings, shares}."""
    cfg = settings_of(s.sg.cfg)
    _, w = s.sg.weights()
    names = s.sg.names
    weights = {ip: (w or {}).get(names[ip], 1) for ip in MASTERS}
    out = {"settings": cfg, "weights": weights, "t_up": None, "t_within": None, "samples": [], "shares": None}
    while now() < t0 + up_limit:
        out["t_up"] = s.sg.first_event(victim, "UP", t0)
        if out["t_up"]:
            break
        time.sleep(0.5)
    if not out["t_up"]:
        log(f"rebalance: saltgate did not mark {victim} UP within {up_limit:.0f} s of the restart")
        return out
    t_up = out["t_up"]
    log(f"rebalance: saltgate marked {victim} UP at T0+{t_up - t0:.1f}s; tolerance {cfg['tolerance_pct']:g}%, "
        f"rate {cfg['rate']:g}/s, delay {cfg['delay_s']:g} s; watching the spread for up to {after_up:.0f} s")
    first_ok = None  # a sample within tolerance; kept when the next one is too (a health check's
    # short-lived greeting connection on :4505 may show in one `ss` sample)
    while now() < t_up + after_up:
        sp = s.spread()
        el = now() - t_up
        out["samples"].append((el, sp["sg"], sp["ha"]))
        ok, shares = within(sp["sg"], weights, cfg["tolerance_pct"])
        if not ok:
            first_ok = None
        elif first_ok is None:
            first_ok = el
        elif out["t_within"] is None:
            out["t_within"], out["shares"] = first_ok, shares
            log(f"rebalance: saltgate's publish sessions {spread_txt(sp['sg'])} within tolerance "
                f"{first_ok:.1f} s after UP")
        if out["t_within"] is not None and el >= out["t_within"] + hold:
            break
        time.sleep(1)
    if out["shares"] is None:
        out["shares"] = within(out["samples"][-1][1], weights, cfg["tolerance_pct"])[1] if out["samples"] else {}
    return out


def moved_misses(s, jobs, mv):
    """rounds each moved minion missed from its move on: {minion: rounds}, and the minions not in the
    job stream (saltgate-minions are not targeted by the streams)"""
    first = {}
    for t, mid, _ in mv:
        first.setdefault(mid, t)
    out, unknown = {}, []
    for mid, t in sorted(first.items()):
        if mid not in s.jobs.minions:
            unknown.append(mid)
            continue
        after = {j: v for j, v in jobs.items() if v["tick"] >= t - 1}
        out[mid] = s.jobs.analyse(after, None, t, mins=[mid])["missed"][mid]
    return out, unknown


def unmoved_misses(s, jobs, mv):
    """for comparison: rounds missed by saltgate's minions that were NOT moved, over the same rounds
    (from the first move on): {minion: rounds} (Salt's own noise when it is overloaded)"""
    if not mv:
        return {}
    moved = {mid for _, mid, _ in mv}
    rest = [m for m in s.sg.minions if m not in moved]
    t = min(t for t, _, _ in mv)
    after = {j: v for j, v in jobs.items() if v["tick"] >= t - 1}
    return s.jobs.analyse(after, None, t, mins=rest)["missed"] if rest else {}
