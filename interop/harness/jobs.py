"""Jobs through the masters and what the returns say. Publishing runs in saltjob.py under the venv's
python (it imports salt): `once` (one job, wait for the returns) and `stream` (a test.ping every S
seconds through one master, as JSON lines). Here: starting and stopping those, reading their output,
grouping jobs into rounds, and the per-group numbers (rounds missed, recovery, latency); plus the
minions' own logs (connection lost / ready again)."""
import datetime
import json
import os
import re
import subprocess
import time

from .common import GRACE_S, PRE_S, SALTJOB, SETTLE_S, Failure, log, now, pct, wait_for


JID_START = re.compile(r"Executing command \S+ with jid (\d{20})")


def group_of(minion):
    """the load balancer key of a minion id: 'sg-minion3' -> 'sg'"""
    return minion.split("-", 1)[0]


# FO_ROTATE=1 (default): the fan-out slot's minions get one stream job per round, through each
# publishing master in turn (saltjob.py stream --rotate), instead of every master's job. A Salt minion
# returns one job at a time, so three jobs a second were more than it could return through a loaded
# cluster: its return queue grew for minutes (docs/interop.md, "The fan-out slot's minions").
FO_ROTATE = os.environ.get("FO_ROTATE", "1") != "0"
ROTATED = "fo-"


def targets(j, m):
    """whether stream job J was published to minion M (the master's own list of targeted minions)"""
    return not j.get("expected") or m in j["expected"]


class Jobs:
    def __init__(self, run, cluster, procs, minions):
        self.run, self.cluster, self.procs, self.minions = run, cluster, procs, minions
        self.py = cluster.py
        self.rotate = ROTATED if FO_ROTATE and any(m.startswith(ROTATED) for m in minions) else ""

    def _saltjob(self, *args):
        return [self.py, SALTJOB, *args]

    def _once_argv(self, ip, fun, args, timeout, expect=None, glob=None):
        return self._saltjob("once", self.cluster.mconf(ip), ",".join(expect or self.minions), fun, *args,
                             "--timeout", str(timeout), *(("--glob", glob) if glob else ()))

    @staticmethod
    def _last_json(out):
        return json.loads(out.strip().splitlines()[-1])

    # -- single jobs --------------------------------------------------------------------------
    def job_once(self, ip, fun, *args, timeout=20, expect=None, glob=None):
        """one job through master IP; EXPECT: the minions that must answer (default: Salt's);
        GLOB: publish to this glob (`salt 'GLOB' FUN`) instead of the list EXPECT"""
        r = subprocess.run(self._once_argv(ip, fun, args, timeout, expect, glob), capture_output=True, text=True,
                           timeout=timeout + 60)
        try:
            return self._last_json(r.stdout)
        except (ValueError, IndexError):
            return {"error": (r.stderr or r.stdout)[-500:], "returns": {}}

    def job_round(self, fun="test.ping", timeout=15):
        """one job through every running master (a master that joined the cluster too) at the same
        time; minion -> fastest return"""
        ps = [subprocess.Popen(self._once_argv(ip, fun, (), timeout), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True) for ip in self.cluster.publishers()]
        got = {}
        for p in ps:
            try:
                out, _ = p.communicate(timeout=timeout + 60)
                r = self._last_json(out)
            except (ValueError, IndexError, subprocess.TimeoutExpired):
                p.kill()
                continue
            for m, v in r.get("returns", {}).items():
                got[m] = min(got.get(m, 1e9), v["lat"])
        return got

    def wait_healthy(self, why, timeout=90):
        """until every minion answers a round of test.ping (one job through each running master, a
        joined one too, at once); returns the minions that still did not answer when the time was up"""
        t0 = now()
        while True:
            got = self.job_round()
            miss = [m for m in self.minions if m not in got]
            if not miss:
                log(f"every minion answers ({why}; {now() - t0:.1f} s)")
                return []
            if now() - t0 > timeout:
                log(f"minions still not answering {why} after {now() - t0:.0f} s: {miss}")
                return miss
            time.sleep(1)

    # -- streams ------------------------------------------------------------------------------
    def start_streams(self, tag, ips, interval=1, settle=SETTLE_S):
        d = os.path.join(self.run, "jobs", tag)
        os.makedirs(d, exist_ok=True)
        stop = os.path.join(d, "STOP")
        files = {}
        for k, ip in enumerate(ips):
            out = os.path.join(d, f"{ip}.jsonl")
            files[ip] = out
            rot = ("--rotate", f"{self.rotate}:{k}:{len(ips)}") if self.rotate else ()
            self.procs.start(f"pub-{tag}-{ip}",
                             self._saltjob("stream", self.cluster.mconf(ip), ",".join(self.minions), out, stop,
                                           "--interval", str(interval), "--settle", str(settle), *rot),
                             os.path.join(d, f"{ip}.err"))
        # every publisher has published, or reported a failed publish (a master that has just come back
        # may time out for a while under load: that is a result, recorded as a publish error)
        wait_for(lambda: all(self._has_pub(f, True) for f in files.values()), 30, 0.2)
        if not any(self._has_pub(f) for f in files.values()):
            raise Failure(f"none of the publishers through {ips} published within 30 s (see {d}/*.err)")
        return {"dir": d, "stop": stop, "files": files, "tag": tag}

    @staticmethod
    def _has_pub(path, or_error=False):
        try:
            with open(path) as f:
                data = f.read()
        except OSError:
            return False
        return '"ev": "pub"' in data or (or_error and '"ev": "perr"' in data)

    def stop_streams(self, st):
        open(st["stop"], "w").close()
        names = [f"pub-{st['tag']}-{ip}" for ip in st["files"]]
        done = wait_for(lambda: not any(self.procs.alive(n) for n in names), SETTLE_S + 100, 0.5)
        if not done:
            log("publishers did not finish reading the job cache in time; stopping them")
        self.procs.stop(names)

    @staticmethod
    def read_jobs(files):
        """jid -> {t, master, answered: {minion: lat or None}}, plus publish errors"""
        jobs, perr = {}, []
        for path in files.values():
            try:
                lines = open(path).read().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                ev = r.get("ev")
                if ev == "perr":
                    perr.append(r)
                    continue
                if ev not in ("pub", "ret", "cache"):
                    continue
                j = jobs.setdefault(r["jid"], {"live": {}, "cache": set()})
                if ev == "pub":
                    j.update(t=r["t"], master=r["master"], tick=r.get("tick", round(r["t"])),
                             expected=r.get("expected", ()))
                elif ev == "ret":
                    j["live"][r["id"]] = r["lat"]
                else:
                    j["cache"].update(r["ids"])
        jobs = {j: v for j, v in jobs.items() if "t" in v}
        return jobs, perr

    @staticmethod
    def rounds(jobs):
        """group the jobs of all publishers by round (the same aligned second): [(tick, [jobs])]"""
        by = {}
        for j in jobs.values():
            by.setdefault(j["tick"], []).append(j)
        return sorted(by.items())

    def group(self, key):
        return [m for m in self.minions if group_of(m) == key]

    def analyse(self, jobs, group, t0, t_end=None, live_only=False, mins=None):
        """per-group numbers of a job stream, per ROUND: every second one test.ping is published through
        each surviving master. A minion MISSED a round if it answered none of that round's jobs (its return
        is neither live on the publishing master's event bus nor in the shared job cache after the stream
        stopped). Counting rounds instead of single jobs keeps Salt's master-to-master job forwarding out of
        the number: one job of each round reaches the minion straight from the master holding its publish
        session, so a round is only lost when the minion's own publish path (the load balancer) is broken.
        Latency: per round and minion, the fastest return."""
        mins = self.group(group) if mins is None else mins
        rounds = [(tk, js) for tk, js in self.rounds(jobs) if t_end is None or tk <= t_end]
        missed = {m: 0 for m in mins}
        lats = []
        bad = []  # (tick, [masters], [missing minions])
        late_jobs = 0  # single jobs some minion missed although it answered that round (forwarding)
        for tk, js in rounds:
            got = {}  # minion -> fastest live latency of the round (None: only in the job cache)
            sent = {m: [j for j in js if targets(j, m)] for m in mins}  # a rotated minion: one job a round
            for m in mins:
                for j in sent[m]:
                    if m in j["live"]:
                        prev = got.get(m)
                        got[m] = j["live"][m] if prev is None else min(prev, j["live"][m])
                    elif not live_only and m in j["cache"]:
                        got.setdefault(m, None)
                    else:
                        late_jobs += 1
            miss = [m for m in mins if m not in got and sent[m]]
            late_jobs -= sum(len(sent[m]) for m in miss)
            for m in miss:
                missed[m] += 1
            if miss:
                bad.append((tk, sorted(j["master"] for j in js), miss))
            lats += [v for v in got.values() if v is not None]
        recovery, recovered = 0.0, True
        if bad:
            after = [tk for tk, _ in rounds if tk > bad[-1][0]]
            if after:
                recovery = max(0.0, after[0] - t0)
            else:
                recovered, recovery = False, None
        return {"rounds": len(rounds), "jobs": sum(len(js) for _, js in rounds), "missed": missed, "bad": bad,
                "recovery": recovery, "recovered": recovered, "p50": pct(lats, 50), "p95": pct(lats, 95),
                "late_jobs": late_jobs, "first_bad": (bad[0][0] - t0) if bad else None}

    def live_recovered(self, st, group, t0, min_rounds=3):
        """live view while the fault lasts: the last >= min_rounds rounds older than GRACE_S were all answered"""
        jobs, _ = self.read_jobs(st["files"])
        cut = now() - GRACE_S
        mins = self.group(group)
        tail = 0
        for tk, js in reversed([(tk, js) for tk, js in self.rounds(jobs) if t0 - PRE_S <= tk <= cut]):
            got = set().union(*(set(j["live"]) for j in js))
            if any(m not in got for m in mins if any(targets(j, m) for j in js)):
                break
            tail += 1
        return tail >= min_rounds

    # -- the minions' own logs ------------------------------------------------------------------
    def minion_events(self, t0, t1):
        """per minion: connection-loss / ready lines from its own log between t0 and t1 (T0-relative)"""
        res = {}
        for m in self.minions:
            ev = []
            for ts, line in log_lines(self.cluster.minion_log(m), t0 - 2, t1):
                for key, label in (("Connection to master", "lost"), ("ready to receive requests", "ready"),
                                   ("failed to return the job", "return-failed"),
                                   ("Trying to tune in", "tune-in")):
                    if key in line:
                        ev.append(f"{label}@{ts - t0:+.1f}")
            if ev:
                res[m] = ev
        return res


def log_lines(path, t0, t1):
    """(time, line) for the lines of a Salt log stamped between t0 and t1 (unreadable file: none)"""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            ts = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if t0 <= ts <= t1:
            yield ts, line


def forward_lag(log_path, t0, t1):
    """from a minion's own log: the largest delay (s) between a job's jid time (the publishing master's
    clock, to the second) and the minion starting it, for jobs started between t0 and t1; None if none"""
    worst = None
    for ts, line in log_lines(log_path, t0, t1):
        m = JID_START.search(line)
        try:
            jt = datetime.datetime.strptime(m.group(1)[:14], "%Y%m%d%H%M%S").timestamp() if m else None
        except ValueError:
            jt = None
        if jt is not None:
            worst = max(worst or 0.0, ts - jt)
    return worst


def reconnect_time(events, minions):
    """from the minions' own logs: for minions that lost their master connection after T0, the time
    (T0-relative) of the 'ready to receive requests' that followed their LAST loss; the group's
    value is the latest of them. None: no minion of the group lost its connection."""
    worst, lost_any, open_loss = None, False, False
    for m in minions:
        ev = events.get(m, [])
        last_lost = None
        for i, e in enumerate(ev):
            label, t = e.split("@")
            if label == "lost" and float(t) >= -1:
                last_lost = i
        if last_lost is None:
            continue
        lost_any = True
        ready = [float(e.split("@")[1]) for e in ev[last_lost:] if e.startswith("ready@")]
        if not ready:
            open_loss = True
            continue
        worst = ready[0] if worst is None else max(worst, ready[0])
    if not lost_any:
        return "no connection lost"
    if open_loss:
        return "not all reconnected"
    return f"{worst:.1f} s"
