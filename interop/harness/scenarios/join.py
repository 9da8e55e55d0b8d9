"""Scenario 7 (issue 10 part 5): a fourth real salt-master joins the running cluster with the suite's
`cluster_secret` (Salt 3008's discover/join handshake, its id = its address), and saltgate, whose
config has `discovery.cluster_pki_dir` on the cluster's key directory from the start (run.sh adds it
when SCENARIOS lists 7), adds it without any edit to its config: /api/v1/masters lists it, its checks
bring it UP, rebalancing moves publish sessions onto it, new request sessions reach it (a real
minion's `salt-call` through saltgate), and every minion, those now attached to the new master
included, answers a round of test.ping (one job through each running master, the new one too).

The round includes the new master because a minion whose publish session sits on it gets the other
masters' jobs only through Salt's peer forwarding (`cluster/event` on port 4520, re-published by the
new master), and on this suite's shared 2-core host that forwarding falls minutes behind after the
kill and restart of scenarios 2 and 4: the minions' own logs show jobs of the original masters
started up to ~190 s after their jid, on HAProxy's minions as much as on saltgate's. That lag is
Salt's; the note `forwarded-job lag` reports it per group (from the minions' logs, `forward_lag`),
so a regression in it stays visible without failing saltgate for it.

The new master stays in the cluster afterwards (Salt has no clean peer removal: peers/<id>.pub and
every master's peer list keep it), so this scenario runs after 2 and 4 (whose Raft quorum it would
change) and before the hang (3), which it leaves with one more live voter."""
import hashlib
import os
import re
import subprocess
import threading

from ..common import Failure, fmt_s, log, now, read_from, wait_for
from ..jobs import forward_lag, group_of
from .base import start_saltgate_scenario

ID, NAME = 7, "master joins the cluster (discovery)"
JOINER = "127.0.0.6"  # a loopback address outside the suite's fixed ones; its Salt id is the same
UP_WITHIN_S = 120.0  # from Salt's 'opening request gate' on the new master to saltgate's UP
SESSIONS_WITHIN_S = 60.0  # from saltgate's UP to publish sessions on it (rebalancing)
ACCESS = re.compile(r"session closed .*\blistener=request\b.*\bmaster_addr=" + re.escape(JOINER) + r":")


def discovery_dir(cfg_path):
    """discovery.cluster_pki_dir of saltgate's YAML config, or None"""
    m = re.search(r"^discovery:\n(?:[ #].*\n)*?\s+cluster_pki_dir:\s*(\S+)", open(cfg_path).read(), re.M)
    return m.group(1) if m else None


def _file_sum(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]


class ApiWatch(threading.Thread):
    """saltgate's /api/v1/masters every 0.2 s: when the joiner is first listed, and first UP"""

    def __init__(self, sg):
        super().__init__(daemon=True)
        self.sg, self.halt = sg, threading.Event()
        self.t_listed = self.t_up = None
        self.listed_state = None
        self.last = None

    def joiner(self):
        try:
            st, body = self.sg.api("GET", "/api/v1/masters")
        except OSError:
            return None
        if st != 200 or not isinstance(body, dict):
            return None
        return next((m for m in body.get("masters", []) if m.get("host") == JOINER), None)

    def run(self):
        while not self.halt.is_set():
            m = self.joiner()
            t = now()
            if m is not None:
                self.last = m
                if self.t_listed is None:
                    self.t_listed, self.listed_state = t, m.get("state")
                if self.t_up is None and m.get("state") == "up":
                    self.t_up = t
            self.halt.wait(0.2)

    def stop(self):
        self.halt.set()
        self.join(2)


def _joiner_errors(s, off):
    """the joiner's ERROR / join lines since OFF (why a join failed)"""
    data = read_from(s.cluster.master_log(JOINER), off) or b""
    lines = [l for l in data.decode(errors="replace").splitlines()
             if "[ERROR" in l or "join" in l.lower() or "Traceback" in l]
    return lines[-8:]


def _salt_call(s, mid):
    """`salt-call test.ping` with minion MID's config (master: saltgate): new request sessions
    through saltgate (its `_auth` and the calls after it); True when it answered"""
    conf = os.path.join(s.run, "n", mid, "conf")
    try:
        r = subprocess.run([os.path.join(s.cluster.bin, "salt-call"), "-c", conf, "test.ping", "--out=json",
                            "--retcode-passthrough"], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0 and '"local": true' in r.stdout


def _request_sessions(sg, off):
    """saltgate's closed request sessions on the joiner since log line OFF (its access log)"""
    return sum(1 for l in sg.log_since(0)[off:] if ACCESS.search(l))


def run(s):
    log(f"== scenario {ID}: {NAME} ==")
    res = start_saltgate_scenario(s, ID, NAME)
    if res is None:
        return
    res["victim"] = JOINER
    sg = s.sg
    pki = discovery_dir(sg.cfg)
    if pki is None:
        res.update(ok=False, notes=["saltgate's config has no discovery.cluster_pki_dir (run.sh adds it when "
                                    "SCENARIOS lists 7)"])
        s.record(res)
        return
    cfg_sum, gen0 = _file_sum(sg.cfg), sg.generation()
    peer_file = os.path.join(pki, "peers", f"{JOINER}.pub")
    watch = ApiWatch(sg)
    if watch.joiner() is not None or os.path.exists(peer_file):
        res.update(ok=False, notes=[f"{JOINER} is already a peer or a saltgate master before the scenario"])
        s.record(res)
        return
    watch.start()
    log_off = len(sg.log_since(0))
    m_off = os.path.getsize(s.cluster.master_log(JOINER)) if os.path.exists(s.cluster.master_log(JOINER)) else 0
    t0 = now()
    join_err = None
    try:
        s.cluster.start_masters([JOINER])
    except Failure as exc:
        join_err = str(exc)
    t_ready = now()
    t_pub = os.path.getmtime(peer_file) if os.path.exists(peer_file) else None
    if join_err is None:
        wait_for(lambda: watch.t_up, UP_WITHIN_S, 0.2)
    notes = res["notes"]
    if join_err:
        errs = _joiner_errors(s, m_off)
        notes.append(f"{JOINER} did not join: {join_err}; its log: " + " | ".join(e[-200:] for e in errs))
    # sessions on it: publish ones moved by rebalancing, request ones from new connections (salt-call)
    t_sess = None
    n_pub = n_req_closed = 0
    calls = []
    if watch.t_up:
        def pub_on_joiner():
            m = watch.joiner()
            return m and m["publish"]["sessions"]
        n_pub = wait_for(pub_on_joiner, SESSIONS_WITHIN_S, 0.5) or 0
        t_sess = now() if n_pub else None
        for mid in s.sg.minions[:4]:
            calls.append((mid, _salt_call(s, mid)))
            n_req_closed = _request_sessions(sg, log_off)
            if n_req_closed:
                break
    # a round through every master, JOINER included, reaches every minion (those moved to JOINER
    # too), and one job published by JOINER itself
    missing = s.jobs.wait_healthy("after the join", timeout=90)
    own = s.jobs.job_once(JOINER, "test.ping", timeout=20) if join_err is None else {}
    own_got = sorted(own.get("returns", {}))
    watch.stop()
    on_joiner = []
    try:
        st, body = sg.api("GET", "/api/v1/minions?limit=10000")
        if st == 200 and isinstance(body, dict):
            jn = (watch.last or {}).get("name", JOINER)
            on_joiner = sorted(m["id"] for m in body.get("minions", []) if m.get("publish_master") == jn)
    except OSError:
        pass
    cfg_same = _file_sum(sg.cfg) == cfg_sum
    gen1 = sg.generation()

    def rel(t):
        return None if t is None else t - t0
    notes.append(
        f"time line from the new master's start: peers/{JOINER}.pub written +{fmt_s(rel(t_pub))}, "
        f"Salt 'opening request gate' +{fmt_s(rel(t_ready)) if not join_err else '—'}, saltgate lists it "
        f"+{fmt_s(rel(watch.t_listed))} (state {watch.listed_state}), UP +{fmt_s(rel(watch.t_up))}, "
        f"{n_pub} publish session(s) on it +{fmt_s(rel(t_sess))}; config generation {gen0} -> {gen1}, "
        f"saltgate's config file {'unchanged' if cfg_same else 'CHANGED'}")
    if calls:
        tried = ", ".join(f"{m} ({'ok' if ok else 'failed'})" for m, ok in calls)
        notes.append(f"salt-call test.ping through saltgate from {tried}: "
                     f"{n_req_closed} request session(s) served by {JOINER} (saltgate's access log)")
    notes.append(f"minions whose publish session sits on {JOINER} (presence): {', '.join(on_joiner) or 'none'}; "
                 + (f"every minion answered a round through every running master ({JOINER} included)" if not missing else
                    f"{missing} did not answer a round within 90 s"))
    lag = {}
    for mid in s.minions:
        v = forward_lag(s.cluster.minion_log(mid), t0, now())
        if v is not None:
            key = "on " + JOINER if mid in on_joiner else group_of(mid)
            lag[key] = max(lag.get(key, 0.0), v)
    if lag:
        notes.append("forwarded-job lag during the scenario (Salt's peer forwarding; the most a job started "
                     "after its jid, from the minions' logs): "
                     + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(lag.items())))
    if join_err is None:
        notes.append(f"a test.ping published by {JOINER} itself: {len(own_got)} of {len(s.minions)} minions answered"
                     + (f" (error: {own['error'][-200:]})" if own.get("error") else ""))
    ok = (join_err is None and watch.t_listed is not None and watch.t_up is not None and cfg_same
          and n_pub > 0 and n_req_closed > 0 and not missing)
    res["rows"]["sg"] = {"jobs": "n/a", "missed": {m: 1 for m in missing} or {m: 0 for m in s.minions},
                         "p50": None, "p95": None, "ok": ok,
                         "detect": (f"listed {fmt_s(rel(watch.t_listed))}, UP {fmt_s(rel(watch.t_up))} after "
                                    "the new master started (no config edit)"),
                         "recovery": f"{n_pub} publish / {n_req_closed} request session(s) on {JOINER}"}
    res["rows"]["ha"] = {"jobs": "n/a", "missed": {}, "p50": None, "p95": None, "ok": True,
                         "verdict": "n/a (its config lists three masters)", "detect": "—", "recovery": "—"}
    res["duration"] = now() - t0
    notes.append(f"scenario {ID} took {res['duration']:.0f} s")
    res["ok"] = ok
    s.record(res)
