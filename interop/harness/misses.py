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
  return-failed   the job ran, the return was sent, and Salt's minion gave up on it ('failed to
                  return the job information': the request to its master timed out return_retry
                  times, e.g. its request session sat on the dead or hung master, or the master was
                  too busy to answer)
  return-lost     the job ran and the return was sent without an error on the minion, yet no master
                  reported it to the publisher and it is not in the job cache (cluster side)
  late            everything happened, but the minion started the job more than LATE_S after the
                  publish (backlog: the return came after the publisher stopped listening)

Plus the cluster's own evidence over the same window (the masters' logs): events a survivor could
not forward to the victim peer, the AES-key re-announcements those failures schedule, and Raft
errors. docs/fanout.md ("Where the misses come from") explains what they show."""
import datetime
import os
import re

from .common import MASTERS, PRE_S

STALL_S = 10.0  # a pause this long in a minion's receipts after a publish: its publish path stalled
LATE_S = 30.0  # a job started this long after its publish is counted as late (the window is ~60 s)
CAUSES = ("publish-gap", "publish-stalled", "not-delivered", "recv-backlog", "not-started", "return-failed", "return-lost", "late")

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


def classify(jobs_of_round, mlog, conn):
    """the cause of one missed round for one minion (see the module doc); MLOG: read_minion_log's jobs"""
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
    if "fail" in steps:
        return "return-failed"
    if "ret" not in steps:
        return "not-started"  # started but never finished within the window: still the backlog
    return "return-lost"


def breakdown(run_jobs, analysis, minion_logs, t_from, t_to):
    """{cause: count} and {minion: {cause: count}} for the missed rounds of one group.
    RUN_JOBS: Jobs.read_jobs output; ANALYSIS: Jobs.analyse output; MINION_LOGS: {minion: log path}."""
    by_tick = {}
    for jid, j in run_jobs.items():
        by_tick.setdefault(j["tick"], []).append(dict(j, jid=jid))
    logs = {m: read_minion_log(p, t_from - 5, t_to + 120) for m, p in minion_logs.items()}
    total = {c: 0 for c in CAUSES}
    per = {}
    for tick, _masters, miss in analysis["bad"]:
        js = by_tick.get(tick, [])
        for m in miss:
            mlog, conn = logs.get(m, ({}, []))
            c = classify(js, mlog, conn)
            total[c] += 1
            per.setdefault(m, {c2: 0 for c2 in CAUSES})[c] += 1
    return total, per


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


def note_causes(s, res, jobs, analyses, t0, t_end, victim, pre_s=PRE_S):
    """the per-scenario breakdown: one note per load balancer (causes of its missed rounds, per cause
    and per minion) and one for the cluster's own evidence; the totals also go in each row ('causes')"""
    for lb in s.lbs:
        a = analyses[lb.key]
        total, per = breakdown(jobs, a, minion_log_paths(s.cluster, lb.minions), t0 - pre_s, t_end)
        res["rows"][lb.key]["causes"] = total
        if not any(total.values()):
            continue
        mins = "; ".join(f"{m}: {fmt_causes(c)}" for m, c in sorted(per.items()))
        res["notes"].append(f"miss causes, {lb.label}: {fmt_causes(total)} ({mins})")
    ml = {ip: s.cluster.master_log(ip) for ip in MASTERS}
    ev = master_evidence(ml, t0, t0 - pre_s, t_end, victim)
    res["cluster_evidence"] = ev
    res["notes"].append(f"cluster logs (survivors) during the fault: {fmt_evidence(ev, t0, t0 - pre_s, t_end)}")


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
    for g in sorted({group_of(m) for m in mins}):
        a = jb.analyse(jobs, g, t0, t_end=t_end)
        total, per = breakdown(jobs, a, minion_log_paths(_C, jb.group(g)), t0 - PRE_S, t_end)
        print(f"{g}: missed {sum(a['missed'].values())}: {fmt_causes(total)}")
        for m, c in sorted(per.items()):
            print(f"   {m}: {fmt_causes(c)}")
    ml = {ip: os.path.join(run, "m-" + ip, "master.log") for ip in MASTERS}
    print("masters:", fmt_evidence(master_evidence(ml, t0, t0 - PRE_S, t_end, victim), t0, t0 - PRE_S, t_end))


if __name__ == "__main__":
    main()
