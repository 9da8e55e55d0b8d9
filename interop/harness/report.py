"""What the suite prints and writes: one `RESULT scenario ...` line per scenario (stdout), the markdown
table (results.md in the run dir; run.sh copies it to interop/results/latest.md), and saltgate's
WARN/ERROR lines at the end. Reads the result dicts the scenarios record; measures nothing itself.

A result dict: id, name, optional victim, rows {lb key: row}, notes [str], ok; `reference`: the HAProxy
row is shown as "(reference)" instead of PASS/FAIL; spread_before + spread_after (publish sessions per
master before/at the end) or spread_back (after a restart) add lines to the sessions table. A row:
jobs, missed {minion: rounds}, detect, recovery, optional reconnect, p50, p95, ok."""
import re
import time

from .common import N_MINIONS, fmt_s, log, now
from .lb import spread_txt


def result_line(lbs, res):
    parts = []
    for lb in lbs:
        r = res["rows"].get(lb.key)
        if not r:
            continue
        nm = sum(r["missed"].values())
        parts.append(f"{lb.label}: rounds(jobs)={r['jobs']} missed={nm} detect={r.get('detect')} "
                     f"recovery={r.get('recovery')} reconnected={r.get('reconnect', 'n/a')} p50={fmt_s(r['p50'])} p95={fmt_s(r['p95'])}")
    status = "PASS" if res.get("ok") else "FAIL"
    print(f"RESULT scenario {res['id']} {res['name']}: {status} | " + " | ".join(parts), flush=True)
    for n in res.get("notes", []):
        print(f"       note: {n}", flush=True)


def _missed_txt(missed):
    hit = {m: n for m, n in missed.items() if n}
    txt = ", ".join(f"{m}: {n}" for m, n in sorted(hit.items())) if hit else "none"
    if hit and len(missed) > len(hit):
        txt += f" (the other {len(missed) - len(hit)}: none)"
    return txt


def table(results, lbs, t_start, spread_wait, extra=(), n_sgm=0, transport="zeromq"):
    L = []
    sg_label = lbs[0].label
    if transport != "zeromq":  # (the ZeroMQ run's header stays as it was)
        L.append(f"## Transport: {transport}")
        L.append("")
    L.append(f"Latest run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Salt 3008.5, "
             + ("" if transport == "zeromq" else f"transport: {transport} (masters and minions), ") +
             f"3 masters (127.0.0.2-4), {sg_label} on 127.0.0.1 and HAProxy on 127.0.0.10 "
             f"(both from `examples/haproxy/salt-master-cluster-loopback.cfg`)"
             + ("" if len(lbs) < 3 else f", {lbs[2].label} on {lbs[2].addr} (saltgate's config, publish "
                                        "listener in `mode: fanout`, request `on_master_down: migrate`)") + ", "
             f"{N_MINIONS} minions behind each" + (f" and {n_sgm} saltgate-minions behind {sg_label}" if n_sgm else "") +
             f", each minion from its own 127.0.0.x. Suite wall time: {now() - t_start:.0f} s.")
    L.append("")
    L.append("| scenario | load balancer | rounds (jobs) | rounds missed per minion | detection | recovery "
             "| minions reconnected | latency p50 | latency p95 | result |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        title = f"{res['id']}. {res['name']}"
        if res.get("victim"):
            title += f" ({res['victim']})"
        for lb in lbs:
            r = res["rows"].get(lb.key)
            if not r:
                continue
            ok = "PASS" if r.get("ok") else "FAIL"
            if lb.key != "sg" and res.get("reference"):
                ok = r.get("verdict", "(reference)")
            L.append(f"| {title} | {lb.label} | {r['jobs']} | {_missed_txt(r['missed'])} | {r.get('detect')} | "
                     f"{r.get('recovery')} | {r.get('reconnect', 'n/a')} | {fmt_s(r['p50'])} | "
                     f"{fmt_s(r['p95'])} | {ok} |")
    L.append("")
    sp = [r for r in results if "spread_after" in r or "spread_back" in r]
    if sp:
        L.append("Publish sessions per master (ESTABLISHED connections on 127.0.0.2 / .3 / .4 :4505 "
                 "from each load balancer):")
        L.append("")
        L.append("| moment | " + " | ".join(lb.label for lb in lbs) + " |")
        L.append("|---|" + "---|" * len(lbs))

        def line(moment, spread):
            # the rebalancing sample has the L4 slots only (the fan-out slot moves no publish session)
            L.append(f"| {moment} | " + " | ".join(spread_txt(spread[lb.key]) if lb.key in spread else "—"
                                                   for lb in lbs) + " |")
        for r in sp:
            if "spread_after" in r:
                vic = f" (victim {r['victim']})" if r.get("victim") else ""
                line(f"before scenario {r['id']}{vic}", r["spread_before"])
                line(f"end of scenario {r['id']}", r["spread_after"])
            else:
                line(f"{r['victim']} restarted, +{spread_wait:.0f} s", r["spread_back"])
                reb = r.get("rebalance") or {}
                if reb.get("samples"):
                    el, sg, ha = reb["samples"][-1]
                    line(f"{r['victim']} UP, +{el:.0f} s (saltgate rebalancing)", {"sg": sg, "ha": ha})
        L.append("")
    for res in results:
        for n in res.get("notes") or []:
            L.append(f"- scenario {res['id']}: {n}")
    L.extend(extra)
    return "\n".join(L) + "\n"


def dump_lb_log(lb):
    """saltgate's last WARN/ERROR lines, to the suite's log"""
    if lb.kind != "saltgate":
        return
    try:
        lines = open(lb.logfile, errors="replace").read().splitlines()
    except OSError:
        return
    warn = [l for l in lines if re.search(r"\b(WARN|ERROR)\b", l)]
    log(f"{lb.label} log: {len(lines)} lines, {len(warn)} WARN/ERROR ({lb.logfile})")
    for l in warn[-15:]:
        log(f"  {l[:300]}")
