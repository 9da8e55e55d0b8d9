"""Addresses, ports and timings of the suite, and the small helpers every module uses.
Owns no state: nothing here starts a process or opens a file of its own."""
import os
import socket
import sys
import time

MASTERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PUB_PORT, REQ_PORT, POOL_PORT = 4505, 4506, 4520
CLUSTER_ID = "interop_cluster"
N_MINIONS = 5
# Salt's minion forks a Python process per job by default (`multiprocessing: True`): with 15-20
# minions taking a job a second, those forks alone kept 2 cores at a load of 50-130 and made
# minions late. The suite's minions run jobs in threads (Salt's `multiprocessing: False`); what
# the suite proves is on the wire, which is the same. MINION_MULTIPROCESSING=1 restores the fork.
MINION_MULTIPROCESSING = os.environ.get("MINION_MULTIPROCESSING", "0") == "1"
N_SGM = 3  # saltgate-minion processes behind saltgate (issue 9's real-Salt proof), besides Salt's
# Each minion dials from its own loopback address, so saltgate's presence (and `ss`) can tell them
# apart: 127.0.0.2N for sg-minionN, .3N for ha-minionN, .4N for sgm-minionN, .5N for fo-minionN
# (the fan-out slot; N <= 9). These
# addresses are only ever sources: nothing listens on them.
SOURCE_BASE = {"sg": 20, "ha": 30, "sgm": 40, "fo": 50}
PRE_S = 5  # jobs published before the fault
GRACE_S = 5  # a job younger than this may still be answered (live recovery check)
SETTLE_S = 10  # publishers keep listening this long after the last job, then read the job cache

INTEROP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SALTJOB = os.path.join(INTEROP_DIR, "saltjob.py")


def minion_source(mid):
    """the loopback address minion MID ('sg-minion3') dials from: '127.0.0.23'"""
    group, _, rest = mid.partition("-minion")
    n = int(rest)
    if group not in SOURCE_BASE or not 1 <= n <= 9:
        raise Failure(f"no source address for minion id {mid!r}")
    return f"127.0.0.{SOURCE_BASE[group] + n}"


def now():
    return time.time()


def log(msg):
    print(f"[suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    """the suite cannot go on (a daemon did not start, keys never arrived, ...): RESULT suite: FAIL"""


def fmt_s(v, none="—"):
    return none if v is None else f"{v:.1f} s"


def pct(values, p):
    """nearest-rank percentile"""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


def port_open(host, port, timeout=0.5):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(pred, timeout, step=0.25):
    """PRED's first truthy value, or its last value once TIMEOUT seconds passed"""
    end = now() + timeout
    while True:
        v = pred()
        if v:
            return v
        if now() >= end:
            return v
        time.sleep(step)


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_from(path, off):
    """the bytes of PATH after byte OFF; None when it cannot be read"""
    try:
        with open(path, "rb") as f:
            f.seek(off)
            return f.read()
    except OSError:
        return None


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
