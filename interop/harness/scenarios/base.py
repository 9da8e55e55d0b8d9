"""What several scenarios share: the result record, the saltgate-only start, the row every job stream
gives, the relative pass rule against HAProxy, and the log lines after a stream."""
from ..common import log


def new_result(sid, name, reference=False, **kw):
    """a scenario's result record (see report.py); REFERENCE: HAProxy's row is the reference, not judged"""
    res = {"id": sid, "name": name, "rows": {}, "notes": []}
    if reference:
        res["reference"] = True
    res.update(kw)
    return res


def start_saltgate_scenario(s, sid, title):
    """The result record of a scenario that needs saltgate's admin API, once the cluster is
    healthy; None (a FAIL already recorded) when the saltgate slot holds HAProxy."""
    res = new_result(sid, title, reference=True)
    if s.sg.kind != "saltgate":
        res.update(ok=False, notes=["needs saltgate in the saltgate slot"])
        s.record(res)
        return None
    if s.jobs.wait_healthy(f"before scenario {sid}"):
        res["notes"].append("the cluster was not healthy when the scenario started (see the log)")
    return res


def note_publish_errors(res, perr):
    if perr:
        res["notes"].append(f"{len(perr)} publish calls failed (e.g. {perr[0]['error'][:150]})")


def stream_row(a, **kw):
    """the table columns a job stream's analysis (Jobs.analyse) fills"""
    row = {"jobs": f"{a['rounds']} ({a['jobs']})", "missed": a["missed"], "p50": a["p50"], "p95": a["p95"]}
    row.update(kw)
    return row


def missed_within_allowance(s, res, n_sg, n_ha, scale=1.0):
    """The relative rule: the same fault hits both load balancers at the same moment, so saltgate's
    minions may miss at most 1.5 x HAProxy's missed rounds (times SCALE) + 10 rounds of slack."""
    allowed = 1.5 * n_ha * scale + 10
    if n_sg <= allowed:
        return True
    res["notes"].append(f"{s.sg.label} minions missed {n_sg} rounds, more than the {allowed:.0f} allowed next "
                        f"to HAProxy's {n_ha}")
    return False


def log_bad_rounds(lb, bad, t0, limit, causes=None, t_abs=0.0):
    """the first LIMIT rounds LB's minions missed, T0-relative: BAD [(tick, masters, missing minions)];
    CAUSES {(round(tick + T_ABS), minion): cause} (misses.note_causes) adds each miss's cause"""
    def who(tk, m):
        c = (causes or {}).get((round(tk + t_abs), m))
        return f"{m} ({c})" if c else m
    for tk, ms, miss in bad[:limit]:
        log(f"  {lb.label}: round T0{tk - t0:+.0f}s (via {', '.join(ms)}) missed by "
            f"{', '.join(who(tk, m) for m in miss)}")


def log_minion_events(events):
    for m, ev in sorted(events.items()):
        log(f"  minion log {m}: {' '.join(ev[:10])}")
