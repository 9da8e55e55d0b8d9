"""Daemons of the suite: each started in its own session (pid == pgid), recorded in RUN/pids/<name>.pid
(run.sh's trap stops whatever is left there), signalled and stopped by process group, never by name.

Masters and minions are started from a `Command`, so a scenario can run any implementation
(`saltgate-master`, `saltgate-minion`, ...) where Salt's daemons run by default. Names carry the
role as a prefix (`master-`, `minion-`, `lb-`, `pub-`): `stop_all` stops publishers first, masters last."""
import os
import signal
import subprocess
import time

from .common import Failure, log, now


class Command:
    """How to start one master or minion: an argv template and extra environment variables.
    Placeholders in the argv: {conf_dir} (the directory holding its `master`/`minion` config file)
    and {id} (the master's address or the minion's id)."""

    def __init__(self, argv, env=None):
        self.argv = list(argv)
        self.env = dict(env or {})

    @classmethod
    def salt(cls, bin_dir, prog):
        """Salt's own daemon PROG (salt-master, salt-minion) from the venv's BIN_DIR"""
        return cls([os.path.join(bin_dir, prog), "-c", "{conf_dir}", "-l", "warning"])

    def argv_for(self, conf_dir, id_):
        return [a.format(conf_dir=conf_dir, id=id_) for a in self.argv]

    def env_for(self):
        return dict(os.environ, **self.env) if self.env else None


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

    def start_command(self, role, id_, cmd, conf_dir, logfile):
        """start a master or minion (ROLE) from a Command; its process name is ROLE-ID"""
        return self.start(f"{role}-{id_}", cmd.argv_for(conf_dir, id_), logfile, env=cmd.env_for())

    def pid(self, name):
        p = self.popen.get(name)
        return p.pid if p else None

    def alive(self, name):
        p = self.popen.get(name)
        return p is not None and p.poll() is None

    @staticmethod
    def _ps(fields):
        """`ps -eo FIELDS` as lists of columns"""
        out = subprocess.run(["ps", "-eo", fields], capture_output=True, text=True).stdout
        return [l.split() for l in out.splitlines() if len(l.split()) >= 2]

    def group_alive(self, pgid):
        try:
            rows = self._ps("pgid=,stat=")
        except OSError:
            return False
        return any(g == str(pgid) and not stat.startswith("Z") for g, stat, *_ in rows)

    def signal(self, name, sig):
        """signal the whole process group we created for NAME"""
        pid = self.pid(name)
        if pid is None:
            raise Failure(f"no process {name}")
        os.killpg(pid, sig)

    def group_pids(self, name):
        pid = self.pid(name)
        return [int(a) for a, b, *_ in self._ps("pid=,pgid=") if int(b) == pid]

    def _drop_pidfile(self, name):
        try:
            os.unlink(os.path.join(self.piddir, name + ".pid"))
        except FileNotFoundError:
            pass

    @staticmethod
    def _killpg(pid, sig):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, names, timeout=10.0):
        """SIGCONT + SIGTERM to each group of NAMES, SIGKILL to what is left after TIMEOUT seconds"""
        live = []
        for n in names:
            p = self.popen.get(n)
            if p is None:
                continue
            if self.group_alive(p.pid):
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    self._killpg(p.pid, sig)
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
                self._killpg(p.pid, signal.SIGKILL)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for n in names:
            if n in self.popen and not self.group_alive(self.popen[n].pid):
                self._drop_pidfile(n)
                del self.popen[n]

    def forget(self, name):
        """after SIGKILL of a whole group: reap it and drop its pid file"""
        p = self.popen.pop(name, None)
        if p:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._drop_pidfile(name)

    def stop_all(self):
        order = [n for prefix in ("pub-", "minion-", "lb-", "master-") for n in self.popen if n.startswith(prefix)]
        order += [n for n in self.popen if n not in order]
        self.stop(order)
