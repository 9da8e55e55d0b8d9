#!/usr/bin/env python3
"""saltgate's real-Salt interop and fault suite. Started by interop/run.sh (read that first).

One Salt 3008 cluster (masters 127.0.0.2-4), two load balancers in front of it at the same time:
  sg: saltgate on 127.0.0.1:4505/4506  (or, with SG_IMPL=haproxy, a stand-in HAProxy)
  ha: HAProxy  on 127.0.0.10:4505/4506 (the same fixture, rebound; dials masters from 127.0.0.10)
and five salt-minions behind each (sg-minion1..5 -> 127.0.0.1, ha-minion1..5 -> 127.0.0.10).
Every job targets all ten minions, so each fault hits both load balancers at the same moment and
the numbers of the two groups compare directly.

Every process is started in its own session (pid == pgid) and recorded in RUN/pids/<name>.pid;
the suite stops them at the end, and run.sh's trap stops whatever is left.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

MASTERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PUB_PORT, REQ_PORT, POOL_PORT = 4505, 4506, 4520
CLUSTER_ID = "interop_cluster"
N_MINIONS = 5
PRE_S = 5  # jobs published before the fault
GRACE_S = 5  # a job younger than this may still be answered (live recovery check)
SETTLE_S = 10  # publishers keep listening this long after the last job, then read the job cache


def now():
    return time.time()


def log(msg):
    print(f"[suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    pass


def fmt_s(v, none="—"):
    return none if v is None else f"{v:.1f} s"


def pct(values, p):
    """nearest-rank percentile"""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


# --------------------------------------------------------------------------------------------
# processes


class Procs:
    """Daemons started in their own session, recorded in RUN/pids/<name>.pid."""

    def __init__(self, piddir):
        self.piddir = piddir
        self.popen = {}
        os.makedirs(piddir, exist_ok=True)

    def start(self, name, argv, logfile, env=None):
        if self.alive(name):
            raise Failure(f"{name} already running")
        os.makedirs(os.path.dirname(logfile), exist_ok=True)
        with open(logfile, "ab") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
        self.popen[name] = p
        with open(os.path.join(self.piddir, name + ".pid"), "w") as f:
            f.write(f"{p.pid}\n")
        return p.pid

    def pid(self, name):
        p = self.popen.get(name)
        return p.pid if p else None

    def alive(self, name):
        p = self.popen.get(name)
        return p is not None and p.poll() is None

    def group_alive(self, pgid):
        try:
            out = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True).stdout
        except OSError:
            return False
        return any(l.split()[0] == str(pgid) and not l.split()[1].startswith("Z")
                   for l in out.splitlines() if len(l.split()) >= 2)

    def signal(self, name, sig):
        """signal the whole process group we created for NAME"""
        pid = self.pid(name)
        if pid is None:
            raise Failure(f"no process {name}")
        os.killpg(pid, sig)

    def group_pids(self, name):
        pid = self.pid(name)
        out = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout
        return [int(a) for a, b in (l.split() for l in out.splitlines()) if int(b) == pid]

    def stop(self, names, timeout=10.0):
        live = []
        for n in names:
            p = self.popen.get(n)
            if p is None:
                continue
            if self.group_alive(p.pid):
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
                live.append((n, p))
        end = now() + timeout
        while live and now() < end:
            for _, p in live:
                p.poll()
            if not any(self.group_alive(p.pid) for _, p in live):
                break
            time.sleep(0.25)
        for n, p in live:
            if self.group_alive(p.pid):
                log(f"{n} (pgid {p.pid}) still alive {timeout:.0f} s after SIGTERM: SIGKILL")
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for n in names:
            if n in self.popen and not self.group_alive(self.popen[n].pid):
                try:
                    os.unlink(os.path.join(self.piddir, n + ".pid"))
                except FileNotFoundError:
                    pass
                del self.popen[n]

    def forget(self, name):
        """after SIGKILL of a whole group: reap it and drop its pid file"""
        p = self.popen.pop(name, None)
        if p:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.unlink(os.path.join(self.piddir, name + ".pid"))
        except FileNotFoundError:
            pass

    def stop_all(self):
        order = [n for n in self.popen if n.startswith("pub-")] + \
                [n for n in self.popen if n.startswith("minion-")] + \
                [n for n in self.popen if n.startswith("lb-")] + \
                [n for n in self.popen if n.startswith("master-")]
        order += [n for n in self.popen if n not in order]
        self.stop(order)


def port_open(host, port, timeout=0.5):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(pred, timeout, step=0.25):
    end = now() + timeout
    while True:
        v = pred()
        if v:
            return v
        if now() >= end:
            return v
        time.sleep(step)


def pub_sessions():
    """ESTABLISHED TCP connections on each master's :4505, by master and by peer (LB source) address"""
    out = subprocess.run(["ss", "-tnH", "state", "established", "( sport = :4505 )"],
                         capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        local, peer = f[-2], f[-1]
        lip, pip = local.rsplit(":", 1)[0], peer.rsplit(":", 1)[0]
        if lip in MASTERS:
            res.setdefault(lip, {}).setdefault(pip, 0)
            res[lip][pip] += 1
    return res


def conn_set(ports=(PUB_PORT,), peer_ip=None, master=None):
    """ESTABLISHED connections on the masters' PORTS as a set of 'master:port<-peer:port' (one per session)"""
    flt = " or ".join(f"sport = :{p}" for p in ports)
    out = subprocess.run(["ss", "-tnH", "state", "established", f"( {flt} )"],
                         capture_output=True, text=True).stdout
    res = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        local, peer = f[-2], f[-1]
        lip, pip = local.rsplit(":", 1)[0], peer.rsplit(":", 1)[0]
        if lip in MASTERS and (peer_ip is None or pip == peer_ip) and (master is None or lip == master):
            res.add(f"{local}<-{peer}")
    return res


# --------------------------------------------------------------------------------------------
# load balancers


class LB:
    """One load balancer slot: its address, how it dials the masters, and how to read its health view."""

    def __init__(self, key, label, addr, src, kind, cfg, rundir, procs, names, sg_bin=None):
        self.key, self.label, self.addr, self.src, self.kind = key, label, addr, src, kind
        self.cfg, self.dir, self.procs, self.names, self.sg_bin = cfg, rundir, procs, names, sg_bin
        self.minions = [f"{key}-minion{i}" for i in range(1, N_MINIONS + 1)]
        self.logfile = os.path.join(rundir, "lb.log")
        self.sock = os.path.join(rundir, "admin.sock")
        self._log_off = 0
        self._partial = ""
        self.events = []  # (t, master_ip, "DOWN"|"UP", text)
        self._hastate = {}

    @property
    def name(self):
        return "lb-" + self.key

    def start(self):
        if self.kind == "saltgate":
            env = dict(os.environ, NO_COLOR="1", RUST_LOG=os.environ.get("SALTGATE_LOG", "info"))
            argv = [self.sg_bin, "run", "--config", self.cfg]
        else:
            env = None
            argv = ["haproxy", "-db", "-f", self.cfg]
        self.procs.start(self.name, argv, self.logfile, env=env)
        ok = wait_for(lambda: port_open(self.addr, PUB_PORT) and port_open(self.addr, REQ_PORT), 20)
        if not ok or not self.procs.alive(self.name):
            raise Failure(f"{self.label} did not listen on {self.addr}:{PUB_PORT}/{REQ_PORT} (see {self.logfile})")
        log(f"{self.label} listening on {self.addr}:{PUB_PORT}/{REQ_PORT} (pid {self.procs.pid(self.name)})")

    # -- health view ---------------------------------------------------------------------
    def _haproxy_stat(self):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(self.sock)
        s.sendall(b"show stat\n")
        buf = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            buf += b
        s.close()
        st = {}
        for line in buf.decode().splitlines():
            f = line.split(",")
            if len(f) > 17 and not line.startswith("#") and f[1] not in ("FRONTEND", "BACKEND"):
                st[(f[0], f[1])] = f[17]
        return st

    _TS = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)?")
    _FLIP = re.compile(r"master marked (DOWN|UP)\b.*?\bmaster=\"?([\w.:-]+)")
    _ANSI = re.compile(r"\x1b\[[0-9;]*m")

    def _parse_ts(self, line):
        m = self._TS.search(line[:40])
        if not m:
            return None
        import datetime
        txt = m.group(1).replace(" ", "T")
        if "." in txt:  # python wants at most 6 fraction digits
            a, b = txt.split(".")
            txt = a + "." + b[:6]
        tz = m.group(2)
        try:
            d = datetime.datetime.fromisoformat(txt)
        except ValueError:
            return None
        if tz in (None, "Z"):
            d = d.replace(tzinfo=datetime.timezone.utc) if tz == "Z" else d
        else:
            d = datetime.datetime.fromisoformat(txt + tz[:3] + ":" + tz[-2:])
        return d.timestamp()

    def poll(self):
        """record health flips (per master) seen since the last call"""
        t = now()
        if self.kind == "haproxy":
            try:
                st = self._haproxy_stat()
            except OSError:
                return
            for ip in MASTERS:
                name = self.names.get(ip)
                srv = [v for (b, s), v in st.items() if s == name]
                if not srv:
                    continue
                state = "DOWN" if any(v.startswith(("DOWN", "MAINT")) for v in srv) else (
                    "UP" if all(v.startswith("UP") for v in srv) else None)
                if state and self._hastate.get(ip, "UP") != state:
                    self.events.append((t, ip, state, " ".join(f"{b}/{s}={v}" for (b, s), v in st.items()
                                                              if s == name)))
                if state:
                    self._hastate[ip] = state
            return
        try:
            with open(self.logfile, "rb") as f:
                f.seek(self._log_off)
                data = f.read()
        except OSError:
            return
        self._log_off += len(data)
        text = self._partial + data.decode(errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        ipof = {v: k for k, v in self.names.items()}
        for line in lines:
            line = self._ANSI.sub("", line)
            m = self._FLIP.search(line)
            if not m:
                continue
            ip = ipof.get(m.group(2), m.group(2))
            ts = self._parse_ts(line)
            # use the log's own timestamp when it has one (UTC), else when we read it
            self.events.append((ts if ts and abs(ts - t) < 60 else t, ip, m.group(1), line.strip()[:200]))

    # -- admin: saltgate's API / HAProxy's runtime API ---------------------------------------------
    admin_addr = "127.0.0.1:9505"

    def api(self, method, path, timeout=5):
        """saltgate admin API: (status, parsed JSON or text)"""
        import http.client
        host, port = self.admin_addr.rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            c.request(method, path)
            r = c.getresponse()
            body = r.read().decode(errors="replace")
        finally:
            c.close()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, body

    def ctl(self, *args, timeout=15):
        """`saltgate ctl --admin ADDR ARGS`: (exit code, stdout+stderr)"""
        r = subprocess.run([self.sg_bin, "ctl", "--admin", self.admin_addr, *args], capture_output=True,
                           text=True, timeout=timeout, env=dict(os.environ, NO_COLOR="1"))
        return r.returncode, (r.stdout + r.stderr).strip()

    def generation(self):
        st, body = self.api("GET", "/api/v1/masters")
        return body.get("generation") if st == 200 and isinstance(body, dict) else None

    def haproxy_cmd(self, cmd):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(self.sock)
        s.sendall(cmd.encode() + b"\n")
        buf = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            buf += b
        s.close()
        return buf.decode(errors="replace").strip()

    def log_since(self, off):
        try:
            with open(self.logfile, "rb") as f:
                f.seek(off)
                return [self._ANSI.sub("", l) for l in f.read().decode(errors="replace").splitlines()]
        except OSError:
            return []

    def log_size(self):
        try:
            return os.path.getsize(self.logfile)
        except OSError:
            return 0

    def first_event(self, ip, state, after):
        for t, i, s, _ in self.events:
            if i == ip and s == state and t >= after:
                return t
        return None

    def all_up(self):
        if self.kind != "haproxy":
            return True
        try:
            st = self._haproxy_stat()
        except OSError:
            return False
        return len(st) >= 6 and all(v.startswith("UP") for v in st.values())


class Watcher(threading.Thread):
    """Polls every LB's health view every 0.2 s while a fault scenario runs."""

    def __init__(self, lbs):
        super().__init__(daemon=True)
        self.lbs = lbs
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            for lb in self.lbs:
                try:
                    lb.poll()
                except Exception as exc:  # pylint: disable=broad-except
                    log(f"watcher: {lb.label}: {exc}")
            self.halt.wait(0.2)


# --------------------------------------------------------------------------------------------
# the suite


class Suite:
    def __init__(self, a):
        self.a = a
        self.run = a.run
        self.venv = a.venv
        self.bin = os.path.join(a.venv, "bin")
        self.py = os.path.join(self.bin, "python")
        self.shared = os.path.join(self.run, "shared")
        self.procs = Procs(os.path.join(self.run, "pids"))
        self.here = os.path.dirname(os.path.abspath(__file__))
        names = self._fixture_names(a.fixture)
        if a.sg_bin:
            sg = LB("sg", "saltgate", "127.0.0.1", "127.0.0.1", "saltgate", a.sg_config,
                    os.path.join(self.run, "sg"), self.procs, names, sg_bin=a.sg_bin)
        else:
            sg = LB("sg", "saltgate-slot(HAProxy)", "127.0.0.1", "127.0.0.1", "haproxy", a.sg_haproxy,
                    os.path.join(self.run, "sg"), self.procs, names)
        ha = LB("ha", "HAProxy", "127.0.0.10", "127.0.0.10", "haproxy", a.ha_config,
                os.path.join(self.run, "ha"), self.procs, names)
        self.lbs = [sg, ha]
        self.minions = sg.minions + ha.minions
        self.results = []  # dicts, one per scenario
        self.killed = None  # victim of scenario 2, restarted by scenario 4
        self.master_log_off = {}

    @staticmethod
    def _fixture_names(path):
        names = {}
        for line in open(path):
            m = re.match(r"\s*server\s+(\S+)\s+(127\.[\d.]+):(\d+)", line)
            if m:
                names[m.group(2)] = m.group(1)
        if sorted(names) != MASTERS:
            raise Failure(f"fixture {path} must list servers on {MASTERS}, found {names}")
        return names

    def group_of(self, minion):
        return minion.split("-", 1)[0]

    # -- cluster ------------------------------------------------------------------------
    def mdir(self, ip):
        return os.path.join(self.run, "m-" + ip)

    def mconf(self, ip):
        return os.path.join(self.mdir(ip), "conf", "master")

    def write_master_conf(self, ip):
        d = self.mdir(ip)
        for sub in ("conf", "pki", "sock", "queues"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        sock, cache = os.path.join(d, "sock"), os.path.join(self.shared, "cache")
        if len(sock) > len(cache) + 10:
            raise Failure(f"sock_dir {sock} too long: Salt would move it into the shared cachedir")
        secret = open(os.path.join(self.shared, "cluster_secret")).read().strip()
        peers = "".join(f"  - {p}\n" for p in MASTERS if p != ip)
        with open(self.mconf(ip), "w") as f:
            f.write(f"""# generated by interop/suite.py -- master {ip}
id: {ip}
interface: {ip}
publish_port: {PUB_PORT}
ret_port: {REQ_PORT}
user: root
cluster_id: {CLUSTER_ID}
cluster_peers:
{peers}cluster_pki_dir: {self.shared}/pki
cluster_pool_port: {POOL_PORT}
cluster_secret: "{secret}"
cachedir: {cache}
pki_dir: {d}/pki
sock_dir: {sock}
sqlite_queue_dir: {d}/queues
pidfile: {d}/salt-master.pid
log_file: {d}/master.log
key_logfile: {d}/key.log
log_level_logfile: info
autosign_file: {d}/conf/autosign.conf
autoreject_file: {d}/conf/autoreject.conf
autosign_grains_dir: {d}/conf/autosign_grains
max_open_files: 16384
worker_threads: 3
file_roots:
  base:
    - {self.shared}/srv/salt
pillar_roots:
  base:
    - {self.shared}/srv/pillar
""")

    def master_log(self, ip):
        return os.path.join(self.mdir(ip), "master.log")

    def log_size(self, ip):
        try:
            return os.path.getsize(self.master_log(ip))
        except OSError:
            return 0

    def log_has(self, ip, off, pat, also=None):
        """PAT appears in the master's log after byte OFF (on one line together with ALSO, if given)"""
        try:
            with open(self.master_log(ip), "rb") as f:
                f.seek(off)
                data = f.read()
        except OSError:
            return False
        if also is None:
            return pat.encode() in data
        return any(pat.encode() in l and also.encode() in l for l in data.splitlines())

    def ensure_cluster_key(self):
        """create cluster.pem before any master starts: masters started together race on it (3008.5)"""
        pki = os.path.join(self.shared, "pki")
        if os.path.exists(os.path.join(pki, "cluster.pem")):
            return
        code = ("import os,sys,salt.crypt\n"
                "d=sys.argv[1]; priv,pub=salt.crypt.gen_keys(2048)\n"
                "for n,data,mode in (('cluster.pem',priv,0o400),('cluster.pub',pub,0o644)):\n"
                "    fd=os.open(os.path.join(d,n),os.O_WRONLY|os.O_CREAT|os.O_EXCL,mode)\n"
                "    f=os.fdopen(fd,'w'); f.write(data); f.close()\n")
        subprocess.run([self.py, "-c", code, pki], check=True)
        log("cluster key pair created in shared cluster_pki_dir before the masters start")

    def cluster_key_sum(self):
        """identity of the shared cluster key: a hash of its public modulus (join-replies rewrite cluster.pem
        in another PEM encoding, so the file's bytes may change while the key stays the same)"""
        code = ("import hashlib,sys\n"
                "from cryptography.hazmat.primitives.serialization import load_pem_private_key\n"
                "k=load_pem_private_key(open(sys.argv[1],'rb').read(),None)\n"
                "print(hashlib.sha256(str(k.public_key().public_numbers().n).encode()).hexdigest()[:16])\n")
        r = subprocess.run([self.py, "-c", code, os.path.join(self.shared, "pki", "cluster.pem")],
                           capture_output=True, text=True)
        return r.stdout.strip() or r.stderr.strip()[-200:]

    def start_cluster(self, attempts=3):
        """fresh start of all masters. 3008.5 still races on the shared cluster key even when cluster.pem
        exists beforehand: a join-reply unlinks and rewrites cluster.pem, and a master process that starts
        in that gap generates a key of its own ("Generating key-pair for .../cluster.pem") and keeps it in
        memory; minions then fail with "Unable to decrypt message". The founder (lowest address) is started
        first, the others once its ports are open; if a master still generated a cluster key, everything
        is stopped, the state wiped, and the start retried."""
        import shutil
        for attempt in range(1, attempts + 1):
            self.start_masters(MASTERS)
            bad = [ip for ip in MASTERS if self.log_has(ip, 0, "cluster.pem", also="Generating key-pair")]
            if self.key_changed and not bad:
                bad = ["(cluster.pem replaced)"]
            if not bad:
                return
            log(f"attempt {attempt}: master(s) {bad} generated their own cluster key during start-up "
                "(Salt 3008.5 join race); wiping the cluster state and starting again")
            self.procs.stop(["master-" + ip for ip in MASTERS])
            for d in [self.shared] + [self.mdir(ip) for ip in MASTERS]:
                shutil.rmtree(d, ignore_errors=True)
        raise Failure(f"masters generated diverging cluster keys in {attempts} fresh starts")

    def start_masters(self, ips):
        """start IPS (all masters on a fresh or fully stopped cluster, or the missing ones) and wait
        until each logs 'opening request gate'. After a FULL restart 3008.5's Raft never re-applies
        its config (no no-op entry at the start of a term): append one entry (the nudge)."""
        for sub in ("pki", "cache", "srv/salt", "srv/pillar"):
            os.makedirs(os.path.join(self.shared, sub), exist_ok=True)
        sec = os.path.join(self.shared, "cluster_secret")
        if not os.path.exists(sec):
            with open(sec, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
        running = [ip for ip in MASTERS if self.procs.alive("master-" + ip)]
        joined = any(n.startswith(".cluster_joined") for n in os.listdir(os.path.join(self.shared, "cache")))
        mode = "partial" if running else ("restart" if joined else "fresh")
        if mode == "fresh":
            self.ensure_cluster_key()
            # masters started together race on creating these in the shared dirs ("Failed to create
            # directory path .../shared/pki/minions - [Errno 17] File exists", and that master exits)
            for sub in ("minions", "minions_pre", "minions_rejected", "minions_denied", "minions_autosign",
                        "peers"):
                os.makedirs(os.path.join(self.shared, "pki", sub), mode=0o755, exist_ok=True)
            for sub in ("jobs", "proc", "pillar", "sessions", "health", "roots", "syndics", "grains", "tokens",
                        "cluster"):
                os.makedirs(os.path.join(self.shared, "cache", sub), mode=0o755, exist_ok=True)
        keysum = self.cluster_key_sum() if mode == "fresh" else None
        log(f"starting masters {' '.join(ips)} ({mode})")
        t0 = now()
        for n, ip in enumerate(ips):
            if n == 1 and mode != "partial":
                # the founder first: fewer concurrent joins, fewer cluster-key rewrites (see start_cluster)
                wait_for(lambda: all(port_open(ips[0], p) for p in (REQ_PORT, POOL_PORT))
                         or not self.procs.alive("master-" + ips[0]), 60)
            for port in (PUB_PORT, REQ_PORT, POOL_PORT):
                if port_open(ip, port, 0.2):
                    raise Failure(f"{ip}:{port} already in use by something this suite did not start")
            self.write_master_conf(ip)
            self.master_log_off[ip] = self.log_size(ip)
            self.procs.start("master-" + ip, [os.path.join(self.bin, "salt-master"), "-c",
                                              os.path.dirname(self.mconf(ip)), "-l", "warning"],
                             os.path.join(self.mdir(ip), "stdout.log"))
        for ip in ips:
            if not wait_for(lambda: all(port_open(ip, p) for p in (PUB_PORT, REQ_PORT, POOL_PORT))
                            or not self.procs.alive("master-" + ip), 90) or not self.procs.alive("master-" + ip):
                raise Failure(f"master {ip} did not open its ports (see {self.master_log(ip)})")

        def not_ready():
            return [ip for ip in ips if not self.log_has(ip, self.master_log_off[ip], "opening request gate")]
        wait_for(lambda: not not_ready(), 25 if mode == "restart" else 45, 0.5)
        if not_ready():
            log(f"not cluster-ready after {now() - t0:.0f} s: {not_ready()}; appending a Raft entry "
                "(3008.5 full-restart workaround)")
            subprocess.run([os.path.join(self.bin, "salt-run"), "-c", os.path.dirname(self.mconf(ips[0])),
                            "cluster.route_clear", "data_type=interop_restart_nudge"],
                           capture_output=True, timeout=60)
            wait_for(lambda: not not_ready(), 30, 0.5)
            if not_ready():
                raise Failure(f"masters never became cluster-ready: {not_ready()}")
        self.key_changed = bool(keysum) and self.cluster_key_sum() != keysum
        if self.key_changed:
            log("cluster.pem holds another key than the one created before the start (join race)")
        log(f"masters {' '.join(ips)} cluster-ready in {now() - t0:.1f} s")
        return now() - t0

    # -- minions ------------------------------------------------------------------------
    def start_minions(self):
        for lb in self.lbs:
            for mid in lb.minions:
                d = os.path.join(self.run, "n", mid)
                os.makedirs(os.path.join(d, "conf"), exist_ok=True)
                with open(os.path.join(d, "conf", "minion"), "w") as f:
                    f.write(f"""# generated by interop/suite.py -- minion {mid}, behind {lb.label}
id: {mid}
master: {lb.addr}
master_port: {REQ_PORT}
publish_port: {PUB_PORT}
root_dir: {d}
user: root
log_level_logfile: info
enable_fqdns_grains: False
acceptance_wait_time: 5
""")
                self.procs.start("minion-" + mid, [os.path.join(self.bin, "salt-minion"), "-c",
                                                   os.path.join(d, "conf"), "-l", "warning"],
                                 os.path.join(d, "stdout.log"))
        log(f"started {len(self.minions)} minions: {' '.join(self.minions)}")

    def salt_key(self, ip, *args):
        r = subprocess.run([os.path.join(self.bin, "salt-key"), "-c", os.path.dirname(self.mconf(ip)),
                            *args], capture_output=True, text=True, timeout=60)
        return r.stdout

    def accepted(self, ip):
        try:
            return set(json.loads(self.salt_key(ip, "-l", "acc", "--out=json") or "{}").get("minions", []))
        except (ValueError, subprocess.TimeoutExpired):
            return set()

    def accept_keys(self):
        first = MASTERS[0]
        t0 = now()
        while True:
            self.salt_key(first, "-A", "-y")
            acc = self.accepted(first)
            missing = [m for m in self.minions if m not in acc]
            if not missing:
                break
            if now() - t0 > 120:
                raise Failure(f"minion keys never arrived: {missing}")
            time.sleep(2)
        log(f"keys of all {len(self.minions)} minions accepted on {first} only, in {now() - t0:.1f} s")

    # -- jobs ---------------------------------------------------------------------------
    def job_once(self, ip, fun, *args, timeout=20):
        r = subprocess.run([self.py, os.path.join(self.here, "saltjob.py"), "once", self.mconf(ip),
                            ",".join(self.minions), fun, *args, "--timeout", str(timeout)],
                           capture_output=True, text=True, timeout=timeout + 60)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": (r.stderr or r.stdout)[-500:], "returns": {}}

    def start_streams(self, tag, ips, interval=1, settle=SETTLE_S):
        d = os.path.join(self.run, "jobs", tag)
        os.makedirs(d, exist_ok=True)
        stop = os.path.join(d, "STOP")
        files = {}
        for ip in ips:
            out = os.path.join(d, f"{ip}.jsonl")
            files[ip] = out
            self.procs.start(f"pub-{tag}-{ip}", [self.py, os.path.join(self.here, "saltjob.py"), "stream",
                                                 self.mconf(ip), ",".join(self.minions), out, stop,
                                                 "--interval", str(interval), "--settle", str(settle)],
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
                if ev == "pub":
                    jobs.setdefault(r["jid"], {"live": {}, "cache": set()}).update(
                        t=r["t"], master=r["master"], tick=r.get("tick", round(r["t"])))
                elif ev == "ret":
                    jobs.setdefault(r["jid"], {"live": {}, "cache": set()})["live"][r["id"]] = r["lat"]
                elif ev == "cache":
                    jobs.setdefault(r["jid"], {"live": {}, "cache": set()})["cache"].update(r["ids"])
                elif ev == "perr":
                    perr.append(r)
        jobs = {j: v for j, v in jobs.items() if "t" in v}
        return jobs, perr

    @staticmethod
    def rounds(jobs):
        """group the jobs of all publishers by round (the same aligned second): [(tick, [jobs])]"""
        by = {}
        for j in jobs.values():
            by.setdefault(j["tick"], []).append(j)
        return sorted(by.items())

    def analyse(self, jobs, group, t0, t_end=None, live_only=False):
        """per-group numbers of a job stream, per ROUND: every second one test.ping is published through
        each surviving master. A minion MISSED a round if it answered none of that round's jobs (its return
        is neither live on the publishing master's event bus nor in the shared job cache after the stream
        stopped). Counting rounds instead of single jobs keeps Salt's master-to-master job forwarding out of
        the number: one job of each round reaches the minion straight from the master holding its publish
        session, so a round is only lost when the minion's own publish path (the load balancer) is broken.
        Latency: per round and minion, the fastest return."""
        mins = [m for m in self.minions if self.group_of(m) == group]
        rounds = [(tk, js) for tk, js in self.rounds(jobs) if t_end is None or tk <= t_end]
        missed = {m: 0 for m in mins}
        lats = []
        bad = []  # (tick, [masters], [missing minions])
        late_jobs = 0  # single jobs some minion missed although it answered that round (forwarding)
        for tk, js in rounds:
            got = {}  # minion -> fastest live latency of the round (None: only in the job cache)
            for j in js:
                for m in mins:
                    if m in j["live"]:
                        prev = got.get(m)
                        got[m] = j["live"][m] if prev is None else min(prev, j["live"][m])
                    elif not live_only and m in j["cache"]:
                        got.setdefault(m, None)
                late_jobs += sum(1 for m in mins if m not in j["live"] and m not in j["cache"])
            miss = [m for m in mins if m not in got]
            late_jobs -= len(miss) * len(js)
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
        mins = [m for m in self.minions if self.group_of(m) == group]
        tail = 0
        for tk, js in reversed([(tk, js) for tk, js in self.rounds(jobs) if t0 - PRE_S <= tk <= cut]):
            got = set().union(*(set(j["live"]) for j in js))
            if any(m not in got for m in mins):
                break
            tail += 1
        return tail >= min_rounds

    # -- bits of reporting ---------------------------------------------------------------
    def spread(self):
        s = pub_sessions()
        res = {}
        for lb in self.lbs:
            res[lb.key] = {ip: s.get(ip, {}).get(lb.src, 0) for ip in MASTERS}
        return res

    @staticmethod
    def spread_txt(sp):
        return " / ".join(str(sp[ip]) for ip in MASTERS)

    def pick_victim(self, exclude=()):
        sp = self.spread()
        cands = [ip for ip in MASTERS if ip not in exclude]
        # a master holding publish sessions of BOTH load balancers, most balanced first
        cands.sort(key=lambda ip: (-min(sp["sg"][ip], sp["ha"][ip]), -(sp["sg"][ip] + sp["ha"][ip]),
                                   MASTERS.index(ip)))
        return cands[0], sp

    @staticmethod
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

    def minion_events(self, t0, t1):
        """per minion: connection-loss / ready lines from its own log between t0 and t1 (T0-relative)"""
        import datetime
        res = {}
        for m in self.minions:
            path = os.path.join(self.run, "n", m, "var", "log", "salt", "minion")
            ev = []
            try:
                lines = open(path, errors="replace").read().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    ts = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    continue
                if not t0 - 2 <= ts <= t1:
                    continue
                for key, label in (("Connection to master", "lost"), ("ready to receive requests", "ready"),
                                   ("failed to return the job", "return-failed"),
                                   ("Trying to tune in", "tune-in")):
                    if key in line:
                        ev.append(f"{label}@{ts - t0:+.1f}")
            if ev:
                res[m] = ev
        return res

    # -- scenarios ------------------------------------------------------------------------
    def s1_smoke(self):
        name = "1 smoke"
        log("== scenario 1: smoke ==")
        res = {"id": 1, "name": "smoke", "rows": {}, "notes": []}
        ok = True
        for ip in MASTERS:
            acc = self.accepted(ip)
            miss = [m for m in self.minions if m not in acc]
            if miss:
                ok = False
                res["notes"].append(f"master {ip} does not list accepted keys of {miss}")
        # wait until every minion answers once (they authenticate after their key was accepted)
        t0 = now()
        while True:
            r = self.job_once(MASTERS[0], "test.ping", timeout=10)
            missing = [m for m in self.minions if m not in r.get("returns", {})]
            if not missing:
                break
            if now() - t0 > 120:
                ok = False
                res["notes"].append(f"minions never answered a first test.ping: {missing}")
                break
            time.sleep(2)
        log(f"all minions answer (readiness wait {now() - t0:.1f} s, not counted)")
        runs = []
        for ip in MASTERS:
            for fun, args, want in (("test.ping", [], True), ("cmd.run", ["echo hi"], "hi")):
                r = self.job_once(ip, fun, *args, timeout=20)
                runs.append((ip, fun, r))
                rets = r.get("returns", {})
                bad = [m for m in self.minions if m not in rets or rets[m]["ret"] != want]
                line = "all answered" if not bad else f"missing/wrong: {bad}"
                if r.get("error"):
                    line += f" (error: {r['error'][:200]})"
                log(f"  via {ip} {fun} {' '.join(args)}: {line}")
                if bad:
                    ok = False
        for lb in self.lbs:
            missed = {m: 0 for m in lb.minions}
            lats = []
            for ip, fun, r in runs:
                for m in lb.minions:
                    want = True if fun == "test.ping" else "hi"
                    rr = r.get("returns", {}).get(m)
                    if rr is None or rr["ret"] != want:
                        missed[m] += 1
                    else:
                        lats.append(rr["lat"])
            res["rows"][lb.key] = {"jobs": f"{len(runs)} ({len(runs)})", "missed": missed, "detect": "n/a",
                                   "recovery": "n/a",
                                   "p50": pct(lats, 50), "p95": pct(lats, 95),
                                   "ok": all(v == 0 for v in missed.values())}
        res["ok"] = ok and all(r["ok"] for r in res["rows"].values())
        res["summary"] = (f"{len(runs)} jobs (test.ping + cmd.run 'echo hi' through each of the 3 masters) "
                          f"x {len(self.minions)} minions")
        self.results.append(res)
        self.result_line(name, res)

    def job_round(self, fun="test.ping", timeout=15):
        """one job through every running master at the same time; minion -> fastest return"""
        masters = [ip for ip in MASTERS if self.procs.alive("master-" + ip)]
        ps = [subprocess.Popen([self.py, os.path.join(self.here, "saltjob.py"), "once", self.mconf(ip),
                                ",".join(self.minions), fun, "--timeout", str(timeout)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for ip in masters]
        got = {}
        for p in ps:
            try:
                out, _ = p.communicate(timeout=timeout + 60)
                r = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError, subprocess.TimeoutExpired):
                p.kill()
                continue
            for m, v in r.get("returns", {}).items():
                got[m] = min(got.get(m, 1e9), v["lat"])
        return got

    def wait_healthy(self, why, timeout=90):
        """until every minion answers a round of test.ping (one job through each running master, at once);
        returns the minions that still did not answer when the time was up"""
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

    def fault(self, sid, kind):
        """scenario 2 (kind=kill) or 3 (kind=hang)"""
        title = {"kill": "master killed (SIGKILL)", "hang": "master hung (SIGSTOP, later SIGCONT)"}[kind]
        log(f"== scenario {sid}: {title} ==")
        healthy = not self.wait_healthy(f"before scenario {sid}")
        # the hang never picks the master restarted in scenario 4 (it holds no sessions anyway)
        victim, sp0 = self.pick_victim(exclude=(self.killed,) if kind == "hang" and self.killed else ())
        observers = [ip for ip in MASTERS if ip != victim]
        res = {"id": sid, "name": title, "victim": victim, "spread_before": sp0, "rows": {}, "notes": []}
        if not healthy:
            res["notes"].append("the cluster was not healthy when the scenario started (see the log)")
        log(f"victim {victim} (publish sessions before: {self.lbs[0].label} {sp0['sg'][victim]}, "
            f"HAProxy {sp0['ha'][victim]}); publishing test.ping every 1 s through each of {observers}")
        for lb in self.lbs:
            lb.poll()
        w = Watcher(self.lbs)
        w.start()
        st = self.start_streams(f"s{sid}", observers)
        time.sleep(PRE_S)
        vname = "master-" + victim
        t0 = now()
        t_cont = None
        if kind == "kill":
            self.procs.signal(vname, signal.SIGKILL)
            log(f"T0: SIGKILL to every process of master {victim} (pgid {self.procs.pid(vname)})")
            min_obs, max_obs = 12, 60
        else:
            pids = self.procs.group_pids(vname)
            self.procs.signal(vname, signal.SIGSTOP)
            log(f"T0: SIGSTOP to every process of master {victim} ({len(pids)} processes)")
            min_obs, max_obs = self.a.hang, self.a.hang
        try:
            # observe until both groups answer again (live) or the window closes
            while True:
                time.sleep(1)
                el = now() - t0
                if el >= max_obs:
                    break
                if el >= min_obs and all(self.live_recovered(st, lb.key, t0) for lb in self.lbs):
                    break
            sp1 = self.spread()
            if kind == "hang":
                self.procs.signal(vname, signal.SIGCONT)
                t_cont = now()
                log(f"T0+{t_cont - t0:.1f}s: SIGCONT to master {victim}")
                while True:
                    time.sleep(1)
                    el = now() - t_cont
                    if el >= self.a.after_cont:
                        break
                    if el >= 10 and all(self.live_recovered(st, lb.key, t0) for lb in self.lbs):
                        break
        finally:
            if kind == "hang" and t_cont is None:
                self.procs.signal(vname, signal.SIGCONT)
        t_end = now()
        self.stop_streams(st)
        w.halt.set()
        w.join(2)
        for lb in self.lbs:
            lb.poll()
        if kind == "kill":
            self.procs.forget(vname)
            self.killed = victim
        jobs, perr = self.read_jobs(st["files"])
        res.update(t0=t0, t_cont=t_cont, spread_during=sp1, spread_after=self.spread(), perr=len(perr),
                   duration=t_end - t0, minion_events=self.minion_events(t0, t_end))
        if perr:
            res["notes"].append(f"{len(perr)} publish calls failed (e.g. {perr[0]['error'][:150]})")
        for lb in self.lbs:
            a = self.analyse(jobs, lb.key, t0, t_end=t_end)
            down = lb.first_event(victim, "DOWN", t0 - 1)
            up = lb.first_event(victim, "UP", down) if down else None
            n_victim = sp0[lb.key][victim]
            hit = [m for m, n in a["missed"].items() if n]
            row = {"jobs": f"{a['rounds']} ({a['jobs']})", "missed": a["missed"], "p50": a["p50"], "p95": a["p95"],
                   "late_jobs": a["late_jobs"],
                   "detect_s": None if down is None else down - t0,
                   "up_again_s": None if up is None else up - t0,
                   "recovery_s": a["recovery"], "recovered": a["recovered"],
                   "sessions_on_victim": n_victim, "bad": [(tk - t0, ms, m) for tk, ms, m in a["bad"]]}
            if down is None:
                row["detect"] = f"not marked down ({t_end - t0:.0f} s)"
            else:
                row["detect"] = f"{down - t0:.1f} s"
            if not a["recovered"]:
                row["recovery"] = f"not recovered ({t_end - t0:.0f} s)"
            elif not hit:
                row["recovery"] = "no round missed"
            elif a["recovery"] <= 0.0:
                row["recovery"] = "0 s (missed only rounds published before T0)"
            else:
                row["recovery"] = f"{a['recovery']:.1f} s"
                if t_cont is not None and a["recovery"] > t_cont - t0:
                    row["recovery"] += f" ({a['recovery'] - (t_cont - t0):.1f} s after SIGCONT)"
            row["n_missed"] = sum(a["missed"].values())
            row["reconnect"] = self.reconnect_time(res["minion_events"], lb.minions)
            res["rows"][lb.key] = row
        # Pass/fail is relative: the same fault hits both load balancers at the same moment, so saltgate's
        # minions must do no worse than HAProxy's. Allowed: 1.5 x HAProxy's missed rounds, scaled by how many
        # publish sessions each had on the victim, + 10 rounds of slack; and for a killed master, saltgate's
        # minions must all answer again before the window closes whenever HAProxy's do.
        sg, ha = res["rows"]["sg"], res["rows"]["ha"]
        scale = max(1, sg["sessions_on_victim"]) / max(1, ha["sessions_on_victim"])
        allowed = 1.5 * ha["n_missed"] * scale + 10
        ok = sg["n_missed"] <= allowed
        if not ok:
            res["notes"].append(f"{self.lbs[0].label} minions missed {sg['n_missed']} rounds, more than the "
                                f"{allowed:.0f} allowed next to HAProxy's {ha['n_missed']}")
        if kind == "kill" and ha["recovered"] and not sg["recovered"]:
            ok = False
            res["notes"].append(f"{self.lbs[0].label} minions did not all answer again within "
                                f"{t_end - t0:.0f} s; HAProxy's did")
        sg["ok"] = ok
        res["ok"] = ok
        self.results.append(res)
        for lb in self.lbs:
            row = res["rows"][lb.key]
            for t, ms, miss in row["bad"][:90]:
                log(f"  {lb.label}: round T0{t:+.0f}s (via {', '.join(ms)}) missed by {', '.join(miss)}")
            if row["late_jobs"]:
                log(f"  {lb.label}: {row['late_jobs']} single jobs were missed by minions that answered another job "
                    "of the same round (Salt's master-to-master forwarding, not the load balancer)")
        for m, ev in sorted(res["minion_events"].items()):
            log(f"  minion log {m}: {' '.join(ev[:10])}")
        self.result_line(f"{sid} {title}", res)
        return victim

    def s4_restart(self):
        """restart the master killed in scenario 2; after it is back, count the publish sessions per master
        and check, with rounds of test.ping through all three masters, that every minion answers"""
        log("== scenario 4: master restarted ==")
        victim = self.killed
        res = {"id": 4, "name": "master restarted", "victim": victim, "rows": {}, "notes": []}
        if victim is None:
            res.update(ok=False, notes=["scenario 2 did not kill a master"])
            self.results.append(res)
            self.result_line("4 master restarted", res)
            return
        sp_down = self.spread()
        w = Watcher(self.lbs)
        for lb in self.lbs:
            lb.poll()
        w.start()
        t0 = now()
        ready_s = self.start_masters([victim])
        t_ready = now()
        st = self.start_streams("s4", MASTERS)
        time.sleep(max(0.0, t_ready + self.a.spread_wait - now()))
        sp_back = self.spread()
        t_spread = now()
        time.sleep(5)
        self.stop_streams(st)
        w.halt.set()
        w.join(2)
        for lb in self.lbs:
            lb.poll()
        missing = self.wait_healthy("after the restart", timeout=90)
        all_ok_s = now() - t0
        jobs, perr = self.read_jobs(st["files"])
        res.update(spread_down=sp_down, spread_back=sp_back, ready_s=ready_s, t_spread=t_spread - t_ready)
        if perr:
            res["notes"].append(f"{len(perr)} publish calls failed (e.g. {perr[0]['error'][:150]})")
        for lb in self.lbs:
            a = self.analyse(jobs, lb.key, t_ready)
            up = lb.first_event(victim, "UP", t0)
            miss = [m for m in lb.minions if m in missing]
            res["rows"][lb.key] = {
                "jobs": f"{a['rounds']} ({a['jobs']})", "missed": a["missed"], "p50": a["p50"], "p95": a["p95"],
                "detect": (f"marked UP {up - t0:.1f} s after the restart began" if up else
                           ("no UP flip logged" if lb.kind == "saltgate" else "not UP")),
                "recovery": (f"{sp_back[lb.key][victim]} publish session(s) on {victim} "
                             f"{t_spread - t_ready:.0f} s after it was ready"),
                "ok": not miss}
            if miss:
                res["notes"].append(f"{lb.label}: {miss} never answered a round within 90 s after the restart checks")
        res["notes"].append(f"every minion answered a round {all_ok_s:.0f} s after the restart began"
                            if not missing else "not every minion answered again after the restart")
        res["ok"] = res["rows"]["sg"]["ok"]
        self.results.append(res)
        self.result_line("4 master restarted", res)

    # -- scenarios 5 and 6: reload under load, drain through the API -------------------------
    RELOADS = 20
    RELOAD_EVERY_S = 1.5
    ROUND_S = 2  # one round every 2 s in 5 and 6: three jobs a second overload Salt on a busy 2-core host
    NORMAL_PUB_CLOSE = ("client-eof", "client-reset")

    def _sg_variants(self):
        """two valid configurations: the imported one (A) and A with rserve1's weight 1 -> 3 and the
        request listener's timeout_connect 10s -> 5s (B); the weight shows in /api/v1/masters"""
        a = open(self.a.sg_config).read()
        b = re.sub(r"(name: \S+\n(?:\s+\w+: .*\n)*?\s+weight:) 1\b", r"\1 3", a, count=1)
        b = re.sub(r"(request:\n(?:.*\n)*?\s+timeout_connect:) 10s", r"\1 5s", b, count=1)
        if a == b or "weight: 3" not in b:
            raise Failure("could not derive the second config variant for the reload scenario")
        return a, b

    def _weights(self, lb):
        st, body = lb.api("GET", "/api/v1/masters")
        if st != 200 or not isinstance(body, dict):
            return None, None
        return body.get("generation"), {m["name"]: m["weight"] for m in body.get("masters", [])}

    @staticmethod
    def _write_atomic(path, text):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def _start_saltgate_scenario(self, sid, title):
        """The result record of a scenario that needs saltgate's admin API, once the cluster is
        healthy; None (a FAIL already recorded) when the saltgate slot holds HAProxy."""
        res = {"id": sid, "name": title, "rows": {}, "notes": []}
        if self.lbs[0].kind != "saltgate":
            res.update(ok=False, notes=["needs saltgate in the saltgate slot"])
            self.results.append(res)
            self.result_line(f"{sid} {title}", res)
            return None
        if self.wait_healthy(f"before scenario {sid}"):
            res["notes"].append("the cluster was not healthy when the scenario started (see the log)")
        return res

    def s5_reload(self):
        sid, title = 5, "reload under load"
        log(f"== scenario {sid}: {title} ({self.RELOADS} reloads, one every {self.RELOAD_EVERY_S} s) ==")
        sg, ha = self.lbs
        res = self._start_saltgate_scenario(sid, title)
        if res is None:
            return
        va, vb = self._sg_variants()
        first = open(self.a.sg_config).read()
        w_name = self.lbs[0].names[MASTERS[0]]
        sp0 = self.spread()
        conns0 = {lb.key: conn_set((PUB_PORT,), lb.src) for lb in self.lbs}
        g0, _ = self._weights(sg)
        off = sg.log_size()
        st = self.start_streams(f"s{sid}", MASTERS, interval=self.ROUND_S, settle=2 * SETTLE_S)
        time.sleep(PRE_S)
        t0 = now()
        pid = self.procs.pid(sg.name)
        took, fails, gens = 0, [], [g0]
        triggers = ("SIGHUP", "ctl reload", "POST /api/v1/reload")
        for i in range(self.RELOADS):
            t_i = t0 + i * self.RELOAD_EVERY_S
            time.sleep(max(0.0, t_i - now()))
            text, want = (vb, 3) if i % 2 == 0 else (va, 1)
            self._write_atomic(self.a.sg_config, text)
            how = triggers[i % 3]
            prev = gens[-1] or 0
            try:
                if how == "SIGHUP":
                    os.kill(pid, signal.SIGHUP)
                elif how == "ctl reload":
                    rc, out = sg.ctl("reload")
                    if rc != 0:
                        fails.append(f"reload {i + 1} ({how}): exit {rc}: {out[-200:]}")
                else:
                    code, body = sg.api("POST", "/api/v1/reload")
                    if code != 200:
                        fails.append(f"reload {i + 1} ({how}): HTTP {code} {str(body)[:200]}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                fails.append(f"reload {i + 1} ({how}): {exc}")
            ok_i = wait_for(lambda: (lambda g, w: g is not None and g > prev and w and w.get(w_name) == want)(
                *self._weights(sg)), 5, 0.1)
            g, w = self._weights(sg)
            gens.append(g)
            if ok_i:
                took += 1
            else:
                fails.append(f"reload {i + 1} ({how}) not in effect after 5 s: generation {prev} -> {g}, "
                             f"weight of {w_name} {None if not w else w.get(w_name)} (want {want})")
        t_rel = now()
        rc, status = sg.ctl("status")
        last = status.splitlines()[-1] if status else ""
        time.sleep(PRE_S)
        t_end = now()
        conns1 = {lb.key: conn_set((PUB_PORT,), lb.src) for lb in self.lbs}
        sp1 = self.spread()
        self.stop_streams(st)
        self._write_atomic(self.a.sg_config, first)  # leave the imported config in force
        wait_for(lambda: (lambda g, w: w and w.get(w_name) == 1)(*self._weights(sg)), 6, 0.2)
        # saltgate's own log in the window: publish sessions it closed, and any reload errors
        lines = sg.log_since(off)
        closes = {}
        for l in lines:
            m = re.search(r"listener=(\w+).*?reason=([\w-]+)", l)
            if m and "session closed" in l:
                closes.setdefault(m.group(1), {}).setdefault(m.group(2), 0)
                closes[m.group(1)][m.group(2)] += 1
        odd_pub = {r: n for r, n in closes.get("publish", {}).items() if r not in self.NORMAL_PUB_CLOSE}
        errs = [l for l in lines if re.search(r"\b(ERROR)\b|reload refused", l)]
        n_done = sum(1 for l in lines if "reload done" in l)
        jobs, perr = self.read_jobs(st["files"])
        if perr:
            res["notes"].append(f"{len(perr)} publish calls failed (e.g. {perr[0]['error'][:150]})")
        ev = self.minion_events(t0, t_end)
        an = {lb.key: self.analyse(jobs, lb.key, t0 - PRE_S, t_end=t_end) for lb in self.lbs}
        ha_bad = {tk for tk, _, _ in an["ha"]["bad"]}
        sg_only = [(tk, miss) for tk, _, miss in an["sg"]["bad"] if tk not in ha_bad]
        for lb in self.lbs:
            a = an[lb.key]
            kept = conns0[lb.key] & conns1[lb.key]
            row = {"jobs": f"{a['rounds']} ({a['jobs']})", "missed": a["missed"], "p50": a["p50"], "p95": a["p95"],
                   "reconnect": self.reconnect_time(ev, lb.minions),
                   "recovery": (f"publish sessions {len(conns0[lb.key])} before, {len(conns1[lb.key])} after, "
                                f"{len(kept)} the same")}
            if lb.kind == "saltgate":
                row["detect"] = (f"{took}/{self.RELOADS} reloads in effect (generation {g0} -> {gens[-1]}; "
                                 f"SIGHUP, ctl, API in turn)")
            else:
                row["detect"] = "n/a (not reloaded)"
            res["rows"][lb.key] = row
        r = res["rows"]["sg"]
        ok = True
        if took != self.RELOADS or fails:
            ok = False
            res["notes"] += fails[:5]
        if not last.startswith("config generation"):
            res["notes"].append(f"`saltgate ctl status` (exit {rc}) did not end with 'config generation N': {last!r}")
            ok = False
        else:
            res["notes"].append(f"`saltgate ctl status` after the reloads: {last!r}; saltgate logged "
                                f"{n_done} 'reload done' (the file watcher may add some)")
        if conns0["sg"] != conns1["sg"]:
            ok = False
            res["notes"].append(f"saltgate's publish sessions changed: {len(conns0['sg'] - conns1['sg'])} gone, "
                                f"{len(conns1['sg'] - conns0['sg'])} new")
        if odd_pub:
            ok = False
            res["notes"].append(f"saltgate closed publish sessions during the reloads: {odd_pub}")
        if errs:
            ok = False
            res["notes"].append(f"saltgate logged {len(errs)} ERROR/refused line(s), e.g. {errs[0][:200]}")
        n_sg, n_ha = sum(an["sg"]["missed"].values()), sum(an["ha"]["missed"].values())
        allowed = 1.5 * n_ha + 10
        lost = [m for m in sg.minions if any(e.startswith("lost@") for e in ev.get(m, []))]
        if lost:
            ok = False
            res["notes"].append(f"saltgate minions logged a lost master connection during the reloads: {lost}")
        if n_sg > allowed:
            ok = False
            res["notes"].append(f"saltgate minions missed {n_sg} rounds, more than the {allowed:.0f} allowed next "
                                f"to HAProxy's {n_ha}")
        if sg_only:
            res["notes"].append(f"{len(sg_only)} round(s) missed by a saltgate minion in which every HAProxy minion "
                                f"answered (its connections unchanged: Salt's noise unless saltgate stalled bytes): "
                                f"{[(round(tk - t0), m) for tk, m in sg_only[:5]]}")
        elif an["sg"]["bad"]:
            res["notes"].append("every round a saltgate minion missed was also missed by an HAProxy minion "
                                "(Salt's own noise)")
        res["notes"].append(f"publish sessions closed by saltgate in the window, by reason: "
                            f"{closes.get('publish', {}) or 'none'}; request sessions: {closes.get('request', {}) or 'none'}")
        r["ok"] = ok
        res.update(ok=ok, spread_before=sp0, spread_after=sp1, t0=t0, reload_s=t_rel - t0)
        self.results.append(res)
        for lb in self.lbs:
            for tk, ms, miss in an[lb.key]["bad"][:30]:
                log(f"  {lb.label}: round T0{tk - t0:+.0f}s (via {', '.join(ms)}) missed by {', '.join(miss)}")
        self.result_line(f"{sid} {title}", res)

    def _drain_timeout(self):
        m = re.search(r"^\s*drain_timeout:\s*(\d+)(ms|s|m)\b", open(self.a.sg_config).read(), re.M)
        if not m:
            return 300.0
        return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]

    def s6_drain(self):
        sid, title = 6, "drain through the API"
        log(f"== scenario {sid}: {title} ==")
        sg, ha = self.lbs
        res = self._start_saltgate_scenario(sid, title)
        if res is None:
            return
        dt = self._drain_timeout()
        sp = self.spread()
        # the master holding the most saltgate publish sessions (HAProxy's too, if it can)
        victim = sorted(MASTERS, key=lambda ip: (-sp["sg"][ip], -sp["ha"][ip], MASTERS.index(ip)))[0]
        name = sg.names[victim]
        res.update(victim=victim, spread_before=sp)
        log(f"victim {name} ({victim}; publish sessions: saltgate {sp['sg'][victim]}, HAProxy {sp['ha'][victim]}); "
            f"drain_timeout {dt:.0f} s; publishing test.ping every {self.ROUND_S} s through each of {MASTERS}")
        st = self.start_streams(f"s{sid}", MASTERS, interval=self.ROUND_S, settle=2 * SETTLE_S)
        time.sleep(PRE_S)
        pre = conn_set((PUB_PORT, REQ_PORT), sg.src, victim)
        n_sg0 = len(conn_set((PUB_PORT,), sg.src, victim))
        n_ha0 = len(conn_set((PUB_PORT,), ha.src, victim))
        t0 = now()
        rc, out = sg.ctl("drain", name)
        log(f"T0: saltgate ctl drain {name}: exit {rc}: {out[-200:]}")
        ha_out = [ha.haproxy_cmd(f"set server {be}/{name} state drain")
                  for be in ("salt-master-pub-backend", "salt-master-req-backend")]
        log(f"T0+{now() - t0:.1f}s: HAProxy set server .../{name} state drain: {ha_out}")
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
                    pubs = [s for s in body["sessions"] if s["listener"] == "publish"]
                    if t_zero_api is None and not pubs:
                        t_zero_api = el
                    for x in body["sessions"]:
                        if x["age_s"] + 2 < el:
                            api_new[x["id"]] = x
            except OSError:
                pass
            if el >= max_obs:
                break
            if t_zero is not None and el >= t_zero + 12 and self.live_recovered(st, "sg", t0):
                break
        t_end = now()
        n_ha1 = len(conn_set((PUB_PORT,), ha.src, victim))
        sp1 = self.spread()
        self.stop_streams(st)
        jobs, perr = self.read_jobs(st["files"])
        ev = self.minion_events(t0, t_end)
        # back to normal: enable on both
        rc_en, out_en = sg.ctl("enable", name)
        ha_en = [ha.haproxy_cmd(f"set server {be}/{name} state ready")
                 for be in ("salt-master-pub-backend", "salt-master-req-backend")]
        log(f"saltgate ctl enable {name}: exit {rc_en}: {out_en[-200:]}; HAProxy state ready: {ha_en}")
        if perr:
            res["notes"].append(f"{len(perr)} publish calls failed (e.g. {perr[0]['error'][:150]})")
        for lb in self.lbs:
            a = self.analyse(jobs, lb.key, t0 - PRE_S, t_end=t_end)
            row = {"jobs": f"{a['rounds']} ({a['jobs']})", "missed": a["missed"], "p50": a["p50"], "p95": a["p95"],
                   "reconnect": self.reconnect_time(ev, lb.minions), "recovered": a["recovered"]}
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
        n_sg = sum(r["missed"].values())
        n_ha = sum(res["rows"]["ha"]["missed"].values())
        allowed = 1.5 * n_ha + 10
        if n_sg > allowed:
            ok = False
            res["notes"].append(f"saltgate minions missed {n_sg} rounds, more than the {allowed:.0f} allowed next "
                                f"to HAProxy's {n_ha}")
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
        self.results.append(res)
        for lb in self.lbs:
            a = self.analyse(jobs, lb.key, t0 - PRE_S, t_end=t_end)
            for tk, ms, miss in a["bad"][:30]:
                log(f"  {lb.label}: round T0{tk - t0:+.0f}s (via {', '.join(ms)}) missed by {', '.join(miss)}")
        for m, e in sorted(ev.items()):
            log(f"  minion log {m}: {' '.join(e[:10])}")
        self.result_line(f"{sid} {title}", res)

    def result_line(self, title, res):
        parts = []
        for lb in self.lbs:
            r = res["rows"].get(lb.key)
            if not r:
                continue
            nm = sum(r["missed"].values())
            parts.append(f"{lb.label}: rounds(jobs)={r['jobs']} missed={nm} detect={r.get('detect')} "
                         f"recovery={r.get('recovery')} reconnected={r.get('reconnect', 'n/a')} p50={fmt_s(r['p50'])} p95={fmt_s(r['p95'])}")
        status = "PASS" if res.get("ok") else "FAIL"
        print(f"RESULT scenario {title}: {status} | " + " | ".join(parts), flush=True)
        for n in res.get("notes", []):
            print(f"       note: {n}", flush=True)

    # -- the table -------------------------------------------------------------------------
    def table(self):
        L = []
        sg_label = self.lbs[0].label
        L.append(f"Latest run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Salt 3008.5, "
                 f"3 masters (127.0.0.2-4), {sg_label} on 127.0.0.1 and HAProxy on 127.0.0.10 "
                 f"(both from `examples/haproxy/salt-master-cluster-loopback.cfg`), "
                 f"{N_MINIONS} minions behind each. Suite wall time: {now() - self.t_start:.0f} s.")
        L.append("")
        L.append("| scenario | load balancer | rounds (jobs) | rounds missed per minion | detection | recovery "
                 "| minions reconnected | latency p50 | latency p95 | result |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for res in self.results:
            title = f"{res['id']}. {res['name']}"
            if res.get("victim"):
                title += f" ({res['victim']})"
            for lb in self.lbs:
                r = res["rows"].get(lb.key)
                if not r:
                    continue
                hit = {m: n for m, n in r["missed"].items() if n}
                missed = ", ".join(f"{m}: {n}" for m, n in sorted(hit.items())) if hit else "none"
                if hit and len(r["missed"]) > len(hit):
                    missed += f" (the other {len(r['missed']) - len(hit)}: none)"
                ok = "PASS" if r.get("ok") else "FAIL"
                if lb.key != "sg" and res["id"] in (2, 3, 5, 6):
                    ok = "(reference)"
                L.append(f"| {title} | {lb.label} | {r['jobs']} | {missed} | {r.get('detect')} | "
                         f"{r.get('recovery')} | {r.get('reconnect', 'n/a')} | {fmt_s(r['p50'])} | "
                         f"{fmt_s(r['p95'])} | {ok} |")
        L.append("")
        sp = [r for r in self.results if r["id"] in (2, 3, 4, 5, 6) and ("spread_after" in r or "spread_back" in r)]
        if sp:
            L.append("Publish sessions per master (ESTABLISHED connections on 127.0.0.2 / .3 / .4 :4505 "
                     "from each load balancer):")
            L.append("")
            L.append("| moment | " + " | ".join(lb.label for lb in self.lbs) + " |")
            L.append("|---|" + "---|" * len(self.lbs))
            for r in sp:
                if r["id"] in (2, 3, 5, 6):
                    vic = f" (victim {r['victim']})" if r.get("victim") else ""
                    L.append(f"| before scenario {r['id']}{vic} | " +
                             " | ".join(self.spread_txt(r["spread_before"][lb.key]) for lb in self.lbs) + " |")
                    L.append(f"| end of scenario {r['id']} | " +
                             " | ".join(self.spread_txt(r["spread_after"][lb.key]) for lb in self.lbs) + " |")
                else:
                    if "spread_back" in r:
                        L.append(f"| {r['victim']} restarted, +{self.a.spread_wait:.0f} s | " +
                                 " | ".join(self.spread_txt(r["spread_back"][lb.key]) for lb in self.lbs) + " |")
            L.append("")
        for res in self.results:
            if res.get("notes"):
                for n in res["notes"]:
                    L.append(f"- scenario {res['id']}: {n}")
        return "\n".join(L) + "\n"

    # -- main -------------------------------------------------------------------------------
    def main(self):
        self.t_start = now()
        scen = self.a.scenarios.split()
        ok = True
        try:
            self.start_cluster()
            for lb in self.lbs:
                lb.start()
            if not wait_for(lambda: all(lb.all_up() for lb in self.lbs), 30, 0.5):
                log("warning: HAProxy does not show every server UP after 30 s")
            self.start_minions()
            self.accept_keys()
            if "1" in scen:
                self.s1_smoke()
            # the hang last: after SIGCONT, Salt 3008.5 does not serve the hung master's minions again
            # for minutes (see README), which would spoil whatever runs after it
            # reload and drain while all three masters are healthy (before the kill degrades the cluster)
            if "5" in scen:
                self.s5_reload()
            if "6" in scen:
                self.s6_drain()
            if "2" in scen:
                self.fault(2, "kill")
            if "4" in scen:
                self.s4_restart()
            if "3" in scen:
                self.fault(3, "hang")
        except Failure as exc:
            log(f"FAILED: {exc}")
            print(f"RESULT suite: FAIL ({exc})", flush=True)
            ok = False
        except KeyboardInterrupt:
            log("interrupted")
            print("RESULT suite: FAIL (interrupted)", flush=True)
            ok = False
        finally:
            self.results.sort(key=lambda r: r["id"])
            if self.results:
                t = self.table()
                with open(self.a.results, "w") as f:
                    f.write(t)
                print("\n" + t, flush=True)
            for lb in self.lbs:
                self._dump_lb_log(lb)
            log("stopping everything this suite started")
            self.procs.stop_all()
        ok = ok and bool(self.results) and all(r.get("ok") for r in self.results)
        print(f"RESULT suite: {'PASS' if ok else 'FAIL'} ({len(self.results)} scenarios, "
              f"{now() - self.t_start:.0f} s)", flush=True)
        return 0 if ok else 1

    def _dump_lb_log(self, lb):
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--venv", required=True)
    p.add_argument("--fixture", required=True)
    p.add_argument("--ha-config", required=True)
    p.add_argument("--sg-bin")
    p.add_argument("--sg-config")
    p.add_argument("--sg-haproxy")
    p.add_argument("--scenarios", default="1 5 6 2 4 3")
    p.add_argument("--hang", type=float, default=30, help="seconds the hung master stays SIGSTOPped")
    p.add_argument("--after-cont", type=float, default=45, help="max seconds to wait for recovery after SIGCONT")
    p.add_argument("--spread-wait", type=float, default=20, help="seconds after the restart before counting sessions")
    p.add_argument("--results", required=True)
    a = p.parse_args()
    if not (a.sg_bin and a.sg_config) and not a.sg_haproxy:
        p.error("need --sg-bin and --sg-config, or --sg-haproxy")

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    s = Suite(a)
    try:
        rc = s.main()
    except BaseException:
        s.procs.stop_all()
        raise
    sys.exit(rc)


if __name__ == "__main__":
    main()
