"""Where every missed round comes from (issue 13, "find where the misses come from").

A round is missed by a minion when none of that round's jobs (one per publishing master) has its
return, live or in the job cache (jobs.Jobs.analyse). For each such (minion, round) the minion's own
log tells how far the furthest of the round's jobs got, and the cause is named after the first step
that did not happen:

  publish-gap     no job of the round reached the minion, and its publish connection was down
                  (Salt's minion logged 'Connection to master ... lost' and was not ready again yet)
  publish-stalled no job of the round reached the minion, its connection was up, and its receipts
                  paused for more than STALL_S after the publish (or never resumed): its publish
                  path stopped (a hung master behind an L4 tunnel, a blocked publisher)
  not-delivered   no job of the round reached the minion although it received jobs published
                  later (the masters did not publish this one to it: cluster forwarding)
  recv-backlog    no job of the round reached the minion by the end of the scenario, but it kept
                  handling older publishes, without a pause, after this one was sent: it is behind on its own
                  publish socket (a Salt minion handles one payload at a time; jids carry their
                  publish time, so its 'Executing command' lines tell how far it got)
  not-started     the minion received the job ('Executing command') but its job process never
                  started within the window ('Starting a new job'): the minion's job backlog
  late            the minion started the job more than LATE_S after the publish (its job backlog:
                  the return came after the publisher stopped listening)
  return-queued   the job ran in time and its return was handed to the minion's request channel,
                  but it reached a master only after the harness stopped counting: a master logged
                  'Got return' for it later, or the minion's returns were still reaching the masters
                  that far behind when the round was judged. A Salt minion sends one request at a
                  time (salt/channel/client.py AsyncReqChannel._crypted_transfer holds _req_lock
                  around each send and reply), so its returns queue behind each other; the job
                  thread's 60 s wait gives up first ('failed to return the job information') while
                  the main process still holds the return and sends it later, which is why this
                  comes before return-failed
  return-failed   the job ran, the return was sent, Salt's minion gave up on it ('failed to return
                  the job information'), and no master has it (nor is it plausibly still queued)
  return-lost     the job ran and the return was sent without an error on the minion, yet no master
                  reported it to the publisher, it is not in the job cache, and no master logged it

Plus the cluster's own evidence over the same window (the masters' logs): events a survivor could
not forward to the victim peer, the AES-key re-announcements those failures schedule, and Raft
errors. docs/fanout.md ("Where the misses come from") explains what they show."""
import datetime
import json
import os
import re
import time

from .common import MASTERS, PRE_S
from .jobs import targets

STALL_S = 10.0  # a pause this long in a minion's receipts after a publish: its publish path stalled
LATE_S = 30.0  # a job started this long after its publish is counted as late (the window is ~60 s)
CAUSES = ("publish-gap", "publish-stalled", "not-delivered", "recv-backlog", "not-started", "late", "return-queued",
          "return-failed", "return-lost")
# the causes that are the Salt minion's own backlog (its publish handling, its job threads, its one-at-a-time
# request channel), not a path the load balancer carries
MINION_BACKLOG = ("recv-backlog", "not-started", "late", "return-queued")

_TS_LEN = 23  # '2026-11-22 19:35:35,187'
_JOB_PATTERNS = (
    ("recv", re.compile(r"Executing command \S+ with jid (\d{20})")),
    ("start", re.compile(r"Starting a new job (\d{20})")),
    ("done", re.compile(r"Job (\d{20}) execution finished")),
    ("ret", re.compile(r"Returning information for job: (\d{20})")),
    ("fail", re.compile(r"failed to return the job information for job (\d{20})")),
)
_CONN = (("lost", "Connection to master"), ("ready", "ready to receive requests"))
_MASTER_PATTERNS = (
    ("forward-failed", re.compile(r"Unable to forward event to cluster peer")),
    ("aes-key-received", re.compile(r"Received new AES key from peer")),
    ("raft-send-failed", re.compile(r"SaltPeer: failed to send cluster/raft")),
    ("raft-role-change", re.compile(r"BECOMING (FOLLOWER|CANDIDATE|LEADER)")),
    ("returns-stored", re.compile(r"Got return from")),
)
_STORED = re.compile(r"Got return from (\S+) for job (\d{20})")


def _ts(line):
    try:
        return datetime.datetime.strptime(line[:_TS_LEN], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def read_minion_log(path, t_from, t_to):
    """(jid -> {step: time}, [(time, 'lost'|'ready')]) from a Salt minion log, lines in [t_from, t_to]"""
    jobs, conn = {}, []
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return jobs, conn
    for line in lines:
        t = _ts(line)
        if t is None or not t_from <= t <= t_to:
            continue
        for step, pat in _JOB_PATTERNS:
            m = pat.search(line)
            if m:
                jobs.setdefault(m.group(1), {}).setdefault(step, t)
                break
        else:
            for label, key in _CONN:
                if key in line:
                    conn.append((t, label))
    return jobs, conn


def _connected_at(conn, t):
    """False when the minion's last connection event before T is a loss (no 'ready' since)"""
    state = True
    for tc, label in conn:
        if tc > t:
            break
        state = label == "ready"
    return state


def stored_returns(master_logs, minions):
    """{minion: {jid: time}}: when a master first logged 'Got return from MINION for job JID' (every line
    of every master's log: a queued return is stored long after its round was judged)"""
    want, out = set(minions), {}
    for path in master_logs.values():
        try:
            f = open(path, errors="replace")
        except OSError:
            continue
        with f:
            for line in f:
                if "Got return from" not in line:
                    continue
                m = _STORED.search(line)
                t = _ts(line) if m and m.group(1) in want else None
                if t is None:
                    continue
                per = out.setdefault(m.group(1), {})
                if t < per.get(m.group(2), float("inf")):
                    per[m.group(2)] = t
    return out


def return_queue(stored, mlog):
    """(time, seconds): the minion's request-queue delay at its newest stored return, from its own
    'Returning information' to the master's 'Got return'; None when no return of the log was stored"""
    best = None
    for jid, t_st in stored.items():
        t_ret = mlog.get(jid, {}).get("ret")
        if t_ret is not None and (best is None or t_st > best[0]):
            best = (t_st, t_st - t_ret)
    return best


def classify(jobs_of_round, mlog, conn, stored=None, queue=None, t_judged=None):
    """the cause of one missed round for one minion (see the module doc); MLOG: read_minion_log's jobs;
    STORED: {jid: time a master stored the minion's return}; QUEUE: return_queue's (time, delay);
    T_JUDGED: when the round is judged (a return handed over less than the queue delay before is queued)"""
    best = None  # the furthest step any job of the round reached
    order = ("recv", "start", "ret")
    for j in jobs_of_round:
        steps = mlog.get(j["jid"], {})
        reached = [s for s in order if s in steps]
        if not reached:
            continue
        rank = order.index(reached[-1])
        if best is None or rank > best[0]:
            best = (rank, j, steps)
    if best is None:
        t_pub = min(j["t"] for j in jobs_of_round)
        if not _connected_at(conn, t_pub):
            return "publish-gap"
        first = min(j["jid"] for j in jobs_of_round)
        if any(jid > first and "recv" in st for jid, st in mlog.items()):
            return "not-delivered"  # jids sort by publish time: later jobs came, this one did not
        after = sorted(st["recv"] for st in mlog.values() if st.get("recv", 0) > t_pub)
        gaps = [b - a for a, b in zip([t_pub] + after, after)]
        if after and max(gaps) <= STALL_S:
            return "recv-backlog"  # busy with older publishes, without a pause, after this one was sent
        return "publish-stalled"
    _, j, steps = best
    if "start" not in steps:
        return "not-started"
    if steps["start"] - j["t"] > LATE_S:
        return "late"
    if "ret" not in steps:
        return "not-started"  # started but never finished within the window: still the backlog
    if stored and any(jj["jid"] in stored for jj in jobs_of_round):
        return "return-queued"  # a master has it: it arrived after the harness stopped counting
    if queue and t_judged is not None and t_judged - steps["ret"] < queue[1]:
        return "return-queued"  # the minion's returns were reaching the masters later than this one is old
    if "fail" in steps:
        return "return-failed"
    return "return-lost"


def breakdown(run_jobs, analysis, minion_logs, t_from, t_to, master_logs=None, t_judged=None):
    """({cause: count}, {minion: {cause: count}}, {minion: return_queue}) for the missed rounds of one group.
    RUN_JOBS: Jobs.read_jobs output; ANALYSIS: Jobs.analyse output; MINION_LOGS: {minion: log path};
    MASTER_LOGS: {ip: path} (their 'Got return' lines tell a queued return from a lost one)."""
    by_tick = {}
    for jid, j in run_jobs.items():
        by_tick.setdefault(j["tick"], []).append(dict(j, jid=jid))
    logs = {m: read_minion_log(p, t_from - 5, t_to + 120) for m, p in minion_logs.items()}
    stored = stored_returns(master_logs, logs) if master_logs else {}
    queues = {m: return_queue(stored.get(m, {}), logs[m][0]) for m in logs}
    total = {c: 0 for c in CAUSES}
    per, each = {}, []
    for tick, _masters, miss in analysis["bad"]:
        js = by_tick.get(tick, [])
        for m in miss:
            mlog, conn = logs.get(m, ({}, []))
            c = classify([j for j in js if targets(j, m)], mlog, conn, stored.get(m), queues.get(m), t_judged)
            total[c] += 1
            per.setdefault(m, {c2: 0 for c2 in CAUSES})[c] += 1
            each.append({"tick": tick, "minion": m, "cause": c})
    return total, per, queues, each


def fmt_queues(queues, t_judged=None):
    """'fo-minion1 131 s (4 s before), ...': each minion's request-queue delay at its newest stored
    return (and how long before T_JUDGED that return was stored)"""
    parts = [f"{m} {q[1]:.0f} s" + ("" if t_judged is None else f" ({t_judged - q[0]:.0f} s before)")
             for m, q in sorted(queues.items()) if q]
    return ", ".join(parts) if parts else "no return of theirs stored"


def fmt_causes(total):
    """'not-delivered 12, return-failed 3' (causes with a count only); 'none' when nothing was missed"""
    parts = [f"{c} {n}" for c, n in total.items() if n]
    return ", ".join(parts) if parts else "none"


def master_evidence(master_logs, t0, t_from, t_to, victim):
    """{pattern: (count before T0, count after T0)} over the survivors' logs in [t_from, t_to]: what the
    cluster did while the victim was gone"""
    res = {}
    for ip, path in master_logs.items():
        if ip == victim:
            continue
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError:
            continue
        for line in lines:
            t = _ts(line)
            if t is None or not t_from <= t <= t_to:
                continue
            for key, pat in _MASTER_PATTERNS:
                if pat.search(line):
                    before, after = res.get(key, (0, 0))
                    res[key] = (before + 1, after) if t < t0 else (before, after + 1)
    return res


def fmt_evidence(ev, t0, t_from, t_to):
    """'forward-failed 0 before / 412 after T0 (7.1/s), ...'"""
    parts = []
    for key, (before, after) in sorted(ev.items()):
        rate = after / max(1.0, t_to - t0)
        pre = before / max(1.0, t0 - t_from)
        parts.append(f"{key} {pre:.1f}/s before T0, {rate:.1f}/s after")
    return "; ".join(parts) if parts else "no forwarding/AES/Raft errors logged"


def minion_log_paths(cluster, minions):
    return {m: cluster.minion_log(m) for m in minions if os.path.exists(cluster.minion_log(m))}


def note_causes(s, res, jobs, analyses, t0, t_end, victim, pre_s=PRE_S, what="the fault"):
    """the per-scenario breakdown: one note per load balancer (causes of its missed rounds, per cause
    and per minion, and its minions' request-queue delays when returns were queued) and one for the
    cluster's own evidence; the totals also go in each row ('causes'); returns {lb key: return queues}"""
    ml = {ip: s.cluster.master_log(ip) for ip in MASTERS}
    t_judged, queues = time.time(), {}
    out = os.path.join(s.run, "jobs", f"s{res['id']}", "misses.jsonl")  # one line per missed (minion, round)
    for lb in s.lbs:
        a = analyses[lb.key]
        total, per, queues[lb.key], each = breakdown(jobs, a, minion_log_paths(s.cluster, lb.minions), t0 - pre_s,
                                                     t_end, ml, t_judged)
        res["rows"][lb.key]["causes"] = total
        res["rows"][lb.key]["miss_causes"] = {(round(e["tick"]), e["minion"]): e["cause"] for e in each}
        _write_misses(out, lb.key, each, t0)
        if not any(total.values()):
            continue
        mins = "; ".join(f"{m}: {fmt_causes(c)}" for m, c in sorted(per.items()))
        res["notes"].append(f"miss causes, {lb.label}: {fmt_causes(total)} ({mins})")
        if total["return-queued"]:
            res["notes"].append(f"return queues, {lb.label} (delay from the minion's 'Returning information' to a "
                                f"master's 'Got return', at its newest stored return): "
                                f"{fmt_queues(queues[lb.key], t_judged)}")
    ev = master_evidence(ml, t0, t0 - pre_s, t_end, victim)
    res["cluster_evidence"] = ev
    res["notes"].append(f"cluster logs (survivors) during {what}: {fmt_evidence(ev, t0, t0 - pre_s, t_end)}")
    return queues


def _write_misses(path, key, each, t0):
    try:
        with open(path, "a") as f:
            for e in each:
                f.write(json.dumps(dict(e, lb=key, t0_rel=round(e["tick"] - t0, 1)), sort_keys=True) + "\n")
    except OSError:
        pass  # the notes carry the totals


def main(argv=None):
    """offline: python3 -m harness.misses RUN_DIR TAG VICTIM (from interop/): the breakdown of a kept run
    directory's stream TAG (jobs/TAG), T0 taken as the first publish + PRE_S"""
    import sys
    from .jobs import Jobs, group_of

    run, tag, victim = (argv or sys.argv[1:])[:3]
    d = os.path.join(run, "jobs", tag)
    files = {f: os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jsonl")}
    jobs, _ = Jobs.read_jobs(files)
    t0 = min(j["t"] for j in jobs.values()) + PRE_S
    t_end = max(j["t"] for j in jobs.values())
    mins = sorted(os.listdir(os.path.join(run, "n")))

    class _C:  # the two Cluster paths this needs
        @staticmethod
        def minion_log(m):
            return os.path.join(run, "n", m, "var", "log", "salt", "minion")
    jb = Jobs.__new__(Jobs)
    jb.minions = mins
    ml = {ip: os.path.join(run, "m-" + ip, "master.log") for ip in MASTERS}
    streamed = {m for j in jobs.values() for m in j.get("expected", ())} or set(mins)
    for g in sorted({group_of(m) for m in mins if m in streamed}):
        a = jb.analyse(jobs, g, t0, t_end=t_end)
        # judged now: every return a master stored since counts as queued, not lost
        total, per, q, _each = breakdown(jobs, a, minion_log_paths(_C, jb.group(g)), t0 - PRE_S, t_end, ml, t_end)
        print(f"{g}: missed {sum(a['missed'].values())}: {fmt_causes(total)}")
        for m, c in sorted(per.items()):
            print(f"   {m}: {fmt_causes(c)}")
        print(f"   return queues (at their newest stored return): {fmt_queues(q)}")
    print("masters:", fmt_evidence(master_evidence(ml, t0, t0 - PRE_S, t_end, victim), t0, t0 - PRE_S, t_end))


if __name__ == "__main__":
    main()
