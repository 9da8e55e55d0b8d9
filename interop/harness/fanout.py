"""The third load balancer slot: saltgate in its continuity configuration on 127.0.0.11, with its own
five minions (fo-minion1-5): the publish listener in `mode: fanout` (docs/fanout.md), forwarding the first copy of each job (the shared
cluster_pki_dir's .aes; FANOUT_DEDUP=0 turns it off) and the request
listener L4 with `on_master_down: migrate` (docs/request-continuity.md). Its configuration is the
saltgate slot's imported one with the binds moved to 127.0.0.11, `mode: fanout` added to the publish
listener (with `dedup_cluster_pki_dir` unless FANOUT_DEDUP=0) and the request listener's
`on_master_down: close` turned into `migrate`: those keys are the only difference between the two
saltgate rows.

The slot runs through the same scenarios as the others (its row appears next to saltgate L4 and
HAProxy). What only a fan-out slot has is read here: its metrics (upstream connects per master,
publish sessions accepted), its minions' connects, and how many copies of a job each of its minions
received (one per UP master) against how many times the job started (once).

Its upstream SUB connections leave from 127.0.0.1, the L4 saltgate's source address too: lb.py's
PID_SOURCES tells `ss` apart by the owning process (label 'fanout')."""
import json
import os
import re
import subprocess
import time

from . import lb as lbmod
from .common import Failure, log, wait_for
from .jobs import targets

FO_ADDR = "127.0.0.11"
FO_ADMIN = "127.0.0.11:9505"
FO_LABEL = "saltgate fan-out"


def fanout_config(text, pki=None):
    """the saltgate slot's config TEXT, with every 127.0.0.1 bind on 127.0.0.11 and the publish
    listener in fan-out mode; with PKI (the cluster's cluster_pki_dir) forwarding the first copy of
    each job (listeners.publish.dedup_cluster_pki_dir, docs/fanout.md)"""
    out, n = re.subn(r'(bind:\s*\[?"?)127\.0\.0\.1:', r"\g<1>" + FO_ADDR + ":", text)
    dedup = f"    dedup_cluster_pki_dir: \"{pki}\"\n" if pki else ""
    out, m = re.subn(r"(\n  publish:\n)", lambda g: g.group(1) + "    mode: fanout\n" + dedup, out, count=1)
    # request continuity (docs/request-continuity.md): a request session whose master dies or hangs
    # moves to another master, its unanswered request re-sent
    out, k = re.subn(r"(\n  request:\n(?:    .*\n)*?    on_master_down:) close", r"\1 migrate", out, count=1)
    if n != 3 or m != 1 or k != 1:
        raise Failure(f"could not derive the fan-out config from the saltgate one ({n} binds, {m} publish, {k} request on_master_down)")
    return out


class FanoutLB(lbmod.LB):
    """saltgate in fan-out mode: an LB slot whose `src` is 'fanout' (see lb.PID_SOURCES)"""

    def __init__(self, sg_cfg, rundir, procs, names, sg_bin):
        os.makedirs(rundir, exist_ok=True)
        cfg = os.path.join(rundir, "saltgate.yaml")
        # the suite's shared cluster_pki_dir (cluster.py: RUN/shared/pki; this slot's dir is RUN/fo):
        # its .aes is written by the masters when they start, the hub reads it within a second
        self.dedup = os.environ.get("FANOUT_DEDUP", "1") != "0"
        pki = os.path.join(os.path.dirname(rundir), "shared", "pki") if self.dedup else None
        with open(cfg, "w") as f:
            f.write(fanout_config(open(sg_cfg).read(), pki))
        super().__init__("fo", FO_LABEL, FO_ADDR, "fanout", "saltgate", cfg, rundir, procs, names,
                         sg_bin=sg_bin)
        self.admin_addr = FO_ADMIN

    def start(self):
        super().start()
        lbmod.PID_SOURCES[self.procs.pid(self.name)] = self.src

    def metrics(self):
        """{(name, master label or ''): value} from /metrics (saltgate_fanout_* and the listener's)"""
        st, body = self.api("GET", "/metrics")
        res = {}
        if st != 200 or not isinstance(body, str):
            return res
        for line in body.splitlines():
            m = re.match(r'(saltgate_(?:fanout|listener)_\w+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+)$', line)
            if not m:
                continue
            labels = m.group(2) or ""
            lab = (re.search(r'master="([^"]*)"', labels) or re.search(r'listener="([^"]*)"', labels)
                   or re.search(r'reason="([^"]*)"', labels))
            res[(m.group(1), lab.group(1) if lab else "")] = float(m.group(3))
        return res


def copies_and_runs(log_path, jids):
    """{jid: (copies received, job starts)} from a Salt minion log: 'Executing command ... with jid J' is
    logged for every copy before the minion's jid check (salt/minion.py 2453-2477), 'Starting a new job
    J' once per run"""
    res = {j: [0, 0] for j in jids}
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return res
    for m in re.finditer(r"Executing command \S+ with jid (\d{20})|Starting a new job (\d{20})", text):
        j = m.group(1) or m.group(2)
        if j in res:
            res[j][0 if m.group(1) else 1] += 1
    return {j: tuple(v) for j, v in res.items()}


def snapshot(s):
    """the fan-out slot's metrics now ({} without the slot)"""
    fo = getattr(s, "fo", None)
    return fo.metrics() if fo else {}


def same_job_through_every_master(s, fo):
    """one test.ping under ONE jid, published through every running master at once (saltjob.py once
    --jid): each master publishes it, so a fan-out minion receives it once per master. Returns the
    jid and the masters that accepted it."""
    jid = time.strftime("%Y%m%d%H%M%S", time.localtime()) + f"{int(time.time() * 1e6) % 1000000:06d}"
    ips = s.cluster.running()
    ps = [subprocess.Popen(s.jobs._saltjob("once", s.cluster.mconf(ip), ",".join(fo.minions), "test.ping",
                                           "--timeout", "20", "--jid", jid),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for ip in ips]
    ok = []
    for ip, p in zip(ips, ps):
        try:
            out, _ = p.communicate(timeout=90)
            if json.loads(out.strip().splitlines()[-1]).get("jid") == jid:
                ok.append(ip)
        except (ValueError, IndexError, subprocess.TimeoutExpired):
            p.kill()
    return jid, ok


def runs_once_check(s, res):
    """one job published under ONE jid through every running master reaches each fan-out minion once
    per master and starts once: a note, and the most starts of it on one minion (0 when not seen)"""
    fo = getattr(s, "fo", None)
    if fo is None:
        return 0
    before = fo.metrics()
    jid, via = same_job_through_every_master(s, fo)

    # copies received vs starts, per minion (a minion that is behind on its publish socket logs them
    # late: wait until every minion logged as many copies as expected -- one with the dedup, else one
    # per master that took the job -- or 30 s, then 3 s more for a copy or a second start that must
    # not come)
    def same_now():
        return {m: copies_and_runs(s.cluster.minion_log(m), [jid])[jid] for m in fo.minions}
    expect = 1 if fo.dedup else len(via)
    wait_for(lambda: all(c >= expect for c, _ in same_now().values()), 30, 0.5)
    time.sleep(3)
    same = same_now()
    after = fo.metrics()

    def grew(name):
        return sum(v - before.get(k, 0) for k, v in after.items() if k[0] == name)
    txt = ", ".join(f"{m}: {c} cop{'y' if c == 1 else 'ies'}, {r} start{'' if r == 1 else 's'}"
                    for m, (c, r) in sorted(same.items()))
    res["notes"].append(f"{FO_LABEL}: one job (jid {jid}) published through each of {', '.join(via)}: {txt}")
    if fo.dedup:
        dups, unread = grew("saltgate_fanout_duplicates_total"), grew("saltgate_fanout_dedup_unreadable_total")
        res["notes"].append(f"{FO_LABEL}: dedup on (listeners.publish.dedup_cluster_pki_dir): copies dropped by "
                            f"saltgate meanwhile {dups:.0f}, unreadable {unread:.0f}; each minion must log 1 copy")
        if len(via) > 1 and any(c != 1 for c, _ in same.values()) and "fo" in res["rows"]:
            res["rows"]["fo"]["ok"] = False  # with the dedup a job published by every master reaches a minion once
    elif not any(c > 1 for c, _ in same.values()):
        res["notes"].append(f"{FO_LABEL}: no minion logged more than one copy of that job: 'runs once' not shown")
    log(f"  {FO_LABEL}: same-jid job through {len(via)} masters: {txt}")
    return max((r for _, r in same.values()), default=0)


def restart_checks(s, res, before, t_from, jobs):
    """scenario 4 for the fan-out slot: the restarted master's upstream came back (its connect counter
    grew) while no fan-out minion reconnected (no publish session accepted during the scenario, no
    'Connection to master ... lost' in their logs since the suite began); and no job of the scenario's
    stream started twice on a fan-out minion"""
    fo = getattr(s, "fo", None)
    if fo is None or "fo" not in res["rows"]:
        return
    after = fo.metrics()
    row = res["rows"]["fo"]
    name = fo.names.get(s.killed, s.killed)
    key = ("saltgate_fanout_upstream_connects_total", name)
    grew = after.get(key, 0) - before.get(key, 0)
    acc = ("saltgate_listener_sessions_total", "publish")
    new_sessions = after.get(acc, 0) - before.get(acc, 0)
    lost = sum(open(s.cluster.minion_log(m), errors="replace").read().count("Connection to master")
               for m in fo.minions if os.path.exists(s.cluster.minion_log(m)))
    row["recovery"] = (f"upstream to {s.killed} re-dialled {grew:.0f}x; minion publish sessions opened during "
                       f"the scenario: {new_sessions:.0f}; minion connection losses since the start: {lost}")
    ok = grew >= 1 and new_sessions == 0 and lost == 0
    # the stream's jobs (one jid per job); the one-jid-through-every-master proof runs in scenario 1,
    # where the minions are idle (here they may be behind, and waiting for them costs suite time)
    late = sorted(j for j, v in jobs.items() if v["t"] >= t_from)
    worst_runs, copies = 0, {}
    for m in fo.minions:
        sent = [j for j in late if targets(jobs[j], m)]  # FO_ROTATE: one job of each round
        for _j, (c, r) in copies_and_runs(s.cluster.minion_log(m), sent).items():
            worst_runs = max(worst_runs, r)
            copies[c] = copies.get(c, 0) + 1
    dist = ", ".join(f"{n} x {c} cop{'y' if c == 1 else 'ies'}" for c, n in sorted(copies.items()))
    res["notes"].append(f"{FO_LABEL}: the {len(late)} stream jobs after the restart"
                        f"{' (one a round to each fan-out minion, FO_ROTATE)' if s.jobs.rotate else ''}, "
                        "per (fan-out minion, job sent to it): "
                        f"{dist}; most starts of one job on one minion: {worst_runs} (a job must run once)")
    res["notes"].append(f"{FO_LABEL}: {row['recovery']}")
    if worst_runs > 1:
        ok = False
    row["ok"] = ok and row.get("ok", True)
    log(f"  {FO_LABEL}: upstream re-dialled {grew:.0f}x, {new_sessions:.0f} new sessions, {lost} losses, "
        f"stream copies {dist}, max starts {worst_runs}")


def judge_fault(s, res):
    """scenarios 2 and 3 for the fan-out slot: what the mode promises is that a master's death or hang
    closes no minion session; the rounds its minions miss are reported next to the others' (their causes
    in the notes), not judged: they come from the request side and the cluster (docs/fanout.md)"""
    row = res["rows"].get("fo")
    if row is None:
        return
    ok = row.get("reconnect") == "no connection lost"
    row["ok"] = ok
    row["verdict"] = "PASS" if ok else "FAIL (a fan-out minion lost its publish connection)"
    res["ok"] = res.get("ok", True) and ok
