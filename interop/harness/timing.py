"""Health timing (issue 10 part 3): where the time goes between a master's restart and saltgate's UP,
and which DOWN flips were not caused by the suite's own faults.

- PingWatch: from the harness, Salt's clear `ping` on a master's request port every 0.1 s (pyzmq,
  from the Salt venv the suite runs in; on Salt's `tcp` transport the same ping framed as Salt's tcp
  client frames it, over TLS with TLS=1): when its port first accepts a connect, when it first
  answers `cluster_retry` (up, not yet a cluster member), when it first answers the ping.
- sg_checks: saltgate's own check results for one master, from its debug log lines
  (`saltgate_proxy::check=debug`, which lb.py turns on): time, port, ok, how long, why.
- false_downs: every "master marked DOWN" in saltgate's log outside the windows of the injected
  faults (scenario 2's kill, scenario 3's hang): a busy master must never be marked DOWN."""
import re
import socket
import threading
import time

from .common import REQ_PORT, now

CHECK_LINE = re.compile(r"saltgate_proxy::check: check master=\"?([\w.:-]+)\"? port=(\w+) ok=(true|false) "
                        r"took_ms=(\d+) detail=(.*?) state=")
DOWN_LINE = re.compile(r"master marked DOWN\b.*?\bmaster=\"?([\w.:-]+)")


class PingWatch(threading.Thread):
    """Salt's clear ping on IP's request port, ONE at a time: a ping waits for its answer however
    long the master takes (a master whose workers are not up yet queues it and answers it once they
    are), the next is sent STEP seconds after an answer. (Pinging every 0.1 s with a short timeout
    instead queues thousands of stale pings on a starting master, which its workers must then work
    through before they answer anyone: that measures the harness, not the master.) Stops after
    ANSWERED clear answers or stop()."""

    def __init__(self, ip, step=0.5, answered=3, transport="zeromq", tls_dir=None):
        super().__init__(daemon=True)
        self.ip, self.step, self.want = ip, step, answered
        self.transport, self.tls_dir = transport, tls_dir
        self.halt = threading.Event()
        self.t_port = None  # the request port first accepted a TCP connect
        self.t_retry = None  # first cluster_retry answer
        self.t_answer = None  # first clear ping answer (when it arrived)
        self.answers = 0
        self.error = None

    def stop(self):
        self.halt.set()
        self.join(3)

    def _answer(self, load):
        """record one reply's LOAD (cluster_retry, or an answer)"""
        t = now()
        if isinstance(load, dict) and load.get("cluster_retry"):
            self.t_retry = self.t_retry or t
        else:
            self.t_answer = self.t_answer or t
            self.answers += 1

    def _wait_port(self):
        while not self.halt.is_set() and self.t_port is None:
            try:
                socket.create_connection((self.ip, REQ_PORT), timeout=0.2).close()
                self.t_port = now()
            except OSError:
                self.halt.wait(0.1)

    def _run_tcp(self):
        """Salt's tcp transport (salt/transport/tcp.py, frame.py): one connection per ping, the request
        `msgpack({"head": {"mid": uuid4}, "body": envelope})`, the reply the same map; over TLS with
        the test CA (the certificate names the master's address) and the test client certificate"""
        import ssl
        import uuid
        import msgpack
        ctx = None
        if self.tls_dir:
            ctx = ssl.create_default_context(cafile=f"{self.tls_dir}/ca.pem")
            # the masters require a client certificate (harness/cluster.py)
            ctx.load_cert_chain(f"{self.tls_dir}/client.pem", f"{self.tls_dir}/client.key")
        self._wait_port()
        while not self.halt.is_set() and self.answers < self.want:
            try:
                with socket.create_connection((self.ip, REQ_PORT), timeout=2) as raw:
                    s = ctx.wrap_socket(raw, server_hostname=self.ip) if ctx else raw
                    mid = str(uuid.uuid4())
                    s.sendall(msgpack.packb({"head": {"mid": mid}, "body": {
                        "enc": "clear", "load": {"cmd": "ping"}, "version": 3}}))
                    s.settimeout(0.1)
                    unp = msgpack.Unpacker(raw=False)
                    reply = None
                    while reply is None and not self.halt.is_set():
                        try:
                            b = s.recv(65536)
                        except (socket.timeout, ssl.SSLWantReadError):
                            continue
                        if not b:
                            raise OSError("closed by the master before a reply")
                        unp.feed(b)
                        for msg in unp:
                            if isinstance(msg, dict) and (msg.get("head") or {}).get("mid") == mid:
                                reply = msg
                    if reply is None:
                        break
                    body = reply.get("body")
                    if isinstance(body, bytes):
                        body = msgpack.unpackb(body, raw=False)
                    self._answer(body.get("load", body) if isinstance(body, dict) else body)
            except OSError as exc:  # refused while it restarts, reset: try again
                self.error = None if self.t_answer else f"tcp ping: {exc}"
            self.halt.wait(self.step)
        if self.t_answer:
            self.error = None

    def run(self):
        if self.transport != "zeromq":
            self._run_tcp()
            return
        try:
            import msgpack
            import zmq
        except ImportError as exc:  # the suite runs under the Salt venv, which has both
            self.error = f"no pyzmq/msgpack: {exc}"
            return
        ctx = zmq.Context()
        req = msgpack.packb({"enc": "clear", "load": {"cmd": "ping"}, "version": 3})
        try:
            self._wait_port()
            while not self.halt.is_set() and self.answers < self.want:
                s = ctx.socket(zmq.REQ)
                s.setsockopt(zmq.LINGER, 0)
                try:
                    s.connect(f"tcp://{self.ip}:{REQ_PORT}")
                    s.send(req)
                    while not self.halt.is_set() and not s.poll(100):
                        pass
                    if self.halt.is_set():
                        break
                    reply = msgpack.unpackb(s.recv(), raw=False)
                    self._answer(reply.get("load", reply) if isinstance(reply, dict) else reply)
                except zmq.ZMQError as exc:
                    self.error = f"pyzmq: {exc}"
                    break
                finally:
                    s.close()
                self.halt.wait(self.step)
        finally:
            ctx.term()


def sg_checks(lb, name, t_from, t_to):
    """saltgate's checks of master NAME between T_FROM and T_TO: [(t, port, ok, took_ms, detail)]"""
    out = []
    for line in lb.log_since(0):
        m = CHECK_LINE.search(line)
        if not m or m.group(1) != name:
            continue
        t = lb._parse_ts(line)  # pylint: disable=protected-access
        if t is None or not t_from <= t <= t_to:
            continue
        out.append((t, m.group(2), m.group(3) == "true", int(m.group(4)), m.group(5).strip('"')))
    return out


def restart_breakdown(lb, name, t0, watch, t_up, rise_downinter, rise=2):
    """the restart's time line, relative to T0 (the restart began): a list of (label, seconds);
    whether saltgate's UP came within the bound (first answer + rise x downinter + 2 s, plus the
    time after that first answer the master itself took to answer the `rise` passing request
    checks that made it UP: a restarted Salt master busy with its minions' _auth can take seconds
    per clear ping, which no balancer can shorten); the failing checks; and that answer time (s)"""
    steps = [("request port accepts connects", watch.t_port),
             ("first cluster_retry answer", watch.t_retry),
             ("first clear ping answered", watch.t_answer)]
    checks = sg_checks(lb, name, t0, (t_up or now()) + 1)
    for port in ("publish", "request"):
        first_ok = next((t for t, p, ok, _, _ in checks if p == port and ok), None)
        steps.append((f"saltgate's first passing {port} check", first_ok))
    steps.append(("saltgate marked it UP", t_up))
    rel = [(label, None if t is None else t - t0) for label, t in steps]
    within = None
    answering = 0.0
    if watch.t_answer is not None and t_up is not None:
        # each check's wait for the master, the part of it after the master's first answer
        passing = [(t - took / 1000.0, t) for t, p, ok, took, _ in checks
                   if p == "request" and ok and t <= t_up + 0.01]
        answering = sum(max(0.0, end - max(start, watch.t_answer)) for start, end in passing[-rise:])
        within = t_up - watch.t_answer <= rise_downinter + 2.0 + answering
    failed = {}
    for t, port, ok, took, detail in checks:
        if not ok and (watch.t_answer is None or t < watch.t_answer + 5):
            failed.setdefault((port, detail[:80]), []).append(took)
    return rel, within, failed, answering


def fmt_breakdown(rel):
    return "; ".join(f"{label} +{v:.1f} s" for label, v in rel if v is not None)


def false_downs(lb, windows):
    """DOWN flips in saltgate's whole log outside WINDOWS ([(master_name, t_from, t_to)]): [(t, name)]"""
    out = []
    for line in lb.log_since(0):
        m = DOWN_LINE.search(line)
        if not m:
            continue
        t = lb._parse_ts(line)  # pylint: disable=protected-access
        if t is None:
            continue
        name = m.group(1)
        if not any(name == w and a <= t <= b for w, a, b in windows):
            out.append((t, name))
    return out


def _secs(txt):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", txt.strip())
    if not m:
        return None
    v = float(m.group(1))
    return v / 1000 if m.group(2) == "ms" else v * 60 if m.group(2) == "m" else v


def health_of(cfg_path):
    """saltgate's global health settings from its YAML config: {key: value} (durations in s)"""
    out = {}
    try:
        text = open(cfg_path).read()
    except OSError:
        return out
    sec = re.search(r"^health:\n((?:[ #].*\n|\n)*)", text, re.M)
    for line in (sec.group(1) if sec else "").splitlines():
        m = re.match(r"\s+(\w+):\s*([^#\s]+)", line)
        if m:
            k, v = m.groups()
            out[k] = int(v) if k in ("rise", "fall") and v.isdigit() else _secs(v) if k != "probe" else v
    return out


def suite_lines(s):
    """the table's health lines: DOWN flips outside the injected faults once the scenarios began
    (none expected), and those during bring-up (masters whose workers did not answer yet)"""
    if s.sg.kind != "saltgate":
        return []
    windows = []
    for r in s.results:
        if r["id"] in (2, 3) and r.get("victim") and r.get("t0"):
            end = r["t0"] + r.get("duration", 0) + 5 if r["id"] == 3 else float("inf")
            windows.append((s.sg.names.get(r["victim"], r["victim"]), r["t0"] - 1, end))
    bad = false_downs(s.sg, windows)
    t1 = s.t_scenarios or float("inf")
    early = [(t, n) for t, n in bad if t < t1]
    bad = [(t, n) for t, n in bad if t >= t1]

    def names(v):
        return ", ".join(f"{n} at {time.strftime('%H:%M:%S', time.gmtime(t))}" for t, n in v[:10])
    out = []
    if bad:
        out.append(f"- {s.sg.label}: {len(bad)} DOWN flip(s) outside the injected faults: {names(bad)}")
    else:
        out.append(f"- {s.sg.label}: no master marked DOWN outside the injected faults (kill, hang) "
                   "once the scenarios began")
    if early:
        out.append(f"- {s.sg.label}: during bring-up (before the first scenario) {len(early)} DOWN flip(s): "
                   f"{names(early)} (their request port answered no ping within the check timeout, "
                   "`fall` times in a row: Salt's workers were not serving yet)")
    return out
