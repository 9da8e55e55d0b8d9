#!/usr/bin/env python3
"""Publish Salt jobs through ONE master, in-process, and record every return.

Runs under the interop venv's python (it imports salt). One LocalClient is
reused, so no CLI start-up time is ever counted. Returns are taken live from
the publishing master's event bus (salt/job/<jid>/ret/<id>); in a 3008 cluster
a return that reached another master is forwarded to the publisher over the
cluster pool port, and it also lands in the shared job cache, which `stream`
reads once more after it stops.

  saltjob.py once   MASTER_CONF TGT_LIST FUN [ARG...]   [--timeout S] [--jid JID] [--glob PATTERN]
      one job (under JID if given: the same job can be published through several
      masters), waits until every minion in TGT_LIST returned or S seconds
      passed; prints one JSON object:
      {"jid", "t_pub", "expected", "targeted", "returns": {id: {"ret": ..., "lat": s}}, "error"}
      --glob PATTERN publishes to PATTERN (tgt_type=glob, as `salt 'PATTERN' FUN`) instead of
      the list; TGT_LIST is still what must answer. "targeted": the minions the master said
      the job went to.

  saltjob.py stream MASTER_CONF TGT_LIST OUT_JSONL STOP_FILE [--interval S] [--settle S] [--rotate P:K:N]
      publishes test.ping every S seconds WITHOUT waiting for returns (a dead
      minion cannot stall the loop) until STOP_FILE exists. Publishes are aligned to
      multiples of S on the wall clock, so streams through several masters publish in the
      same "round" ("tick": the aligned time). Then it keeps listening
      --settle seconds more, then reads the job cache for every job.
      --rotate P:K:N targets the minions whose id starts with P only in the rounds where
      (tick / S) mod N == K: N streams given K = 0..N-1 send those minions one job per round,
      through each master in turn (the others get every stream's job).
      Writes JSON lines as things happen:
        {"ev": "pub",   "jid", "t", "tick", "dt", "master", "expected": [...]}   (dt: publish call time)
        {"ev": "perr",  "t", "master", "error"}                           (publish failed)
        {"ev": "ret",   "jid", "id", "t", "lat"}                          (lat: s after publish)
        {"ev": "cache", "jid", "ids": [...]}                              (after the stop)
        {"ev": "done"}

TGT_LIST is a comma-separated list of minion ids (tgt_type=list).
"""
import argparse
import json
import math
import os
import sys
import threading
import time

import salt.client
import salt.config
import salt.utils.event


class Listener(threading.Thread):
    """Collects salt/job/<jid>/ret/<id> events from the master's event bus."""

    def __init__(self, opts, on_ret):
        super().__init__(daemon=True)
        self.opts = opts
        self.on_ret = on_ret
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self):
        with salt.utils.event.get_master_event(
            self.opts, self.opts["sock_dir"], listen=True
        ) as ev:
            # subscribe before the first publish
            ev.get_event(wait=0.01, tag="salt/job/")
            self.ready.set()
            while not self.stop.is_set():
                data = ev.get_event(wait=0.25, tag="salt/job/", full=True)
                if not data:
                    continue
                parts = data.get("tag", "").split("/")
                if len(parts) >= 5 and parts[3] == "ret":
                    self.on_ret(parts[2], parts[4], time.time(), data.get("data") or {})


def cmd_once(a):
    opts = salt.config.client_config(a.conf)
    tgt = a.tgt.split(",")
    rets = {}
    lock = threading.Lock()
    state = {"jid": None, "t": None}
    done = threading.Event()

    def on_ret(jid, mid, t, data):
        with lock:
            if state["jid"] is not None and jid != state["jid"]:
                return
            if mid not in rets:
                rets[mid] = {"ret": data.get("return"), "t": t, "jid": jid}
            if state["jid"] is not None and set(tgt) <= {
                m for m, r in rets.items() if r["jid"] == state["jid"]
            }:
                done.set()

    lst = Listener(opts, on_ret)
    lst.start()
    lst.ready.wait(10)
    time.sleep(0.3)
    out = {"master": opts["id"], "expected": tgt, "returns": {}}
    with salt.client.LocalClient(mopts=opts) as lc:
        t0 = time.time()
        try:
            if a.glob:
                pub = lc.run_job(a.glob, a.fun, arg=a.arg, tgt_type="glob", timeout=a.timeout, listen=False,
                                 jid=a.jid or "")
            else:
                pub = lc.run_job(tgt, a.fun, arg=a.arg, tgt_type="list", timeout=a.timeout, listen=False,
                                 jid=a.jid or "")
        except Exception as exc:  # pylint: disable=broad-except
            pub = None
            out["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if pub and "jid" in pub:
            with lock:
                state["jid"] = pub["jid"]
                # drop returns of other jobs that may have arrived before we knew our jid
                for m in [m for m, r in rets.items() if r["jid"] != pub["jid"]]:
                    del rets[m]
                if set(tgt) <= set(rets):
                    done.set()
            out["jid"] = pub["jid"]
            out["targeted"] = sorted(pub.get("minions") or [])
            done.wait(a.timeout)
        elif "error" not in out:
            out["error"] = f"publish failed: {pub!r}"[:300]
    lst.stop.set()
    with lock:
        out["t_pub"] = t0
        out["returns"] = {
            m: {"ret": r["ret"], "lat": round(r["t"] - t0, 3)} for m, r in rets.items() if r["jid"] == out.get("jid")
        }
    print(json.dumps(out, sort_keys=True, default=str), flush=True)


def targets(tgt, rotate, n_round):
    """TGT, less the minions ROTATE ('P:K:N') leaves out of round N_ROUND (see --rotate)"""
    if not rotate:
        return tgt
    prefix, k, n = rotate.split(":")
    if n_round % int(n) == int(k):
        return tgt
    return [m for m in tgt if not m.startswith(prefix)]


def cmd_stream(a):
    opts = salt.config.client_config(a.conf)
    tgt = a.tgt.split(",")
    out = open(a.out, "a", buffering=1)
    lock = threading.Lock()
    pubs = {}  # jid -> publish time
    early = []  # returns seen before run_job handed us their jid

    def write(rec):
        with lock:
            out.write(json.dumps(rec, sort_keys=True) + "\n")

    def on_ret(jid, mid, t, _data):
        with lock:
            t0 = pubs.get(jid)
            if t0 is None:
                early.append((jid, mid, t))
                return
        write({"ev": "ret", "jid": jid, "id": mid, "t": t, "lat": round(t - t0, 3)})

    lst = Listener(opts, on_ret)
    lst.start()
    lst.ready.wait(10)
    time.sleep(0.3)
    jids = []
    with salt.client.LocalClient(mopts=opts) as lc:
        nxt = math.ceil(time.time() / a.interval) * a.interval
        while not os.path.exists(a.stop):
            time.sleep(max(0.0, nxt - time.time()))
            tick = nxt
            t0 = time.time()
            try:
                pub = lc.run_job(targets(tgt, a.rotate, round(tick / a.interval)), "test.ping", tgt_type="list",
                                 timeout=5, listen=False)
            except Exception as exc:  # pylint: disable=broad-except
                pub = None
                err = f"{type(exc).__name__}: {exc}"
            else:
                err = f"publish failed: {pub!r}"
            t1 = time.time()
            if pub and "jid" in pub:
                jid = pub["jid"]
                jids.append(jid)
                with lock:
                    pubs[jid] = t0
                    late = [e for e in early if e[0] == jid]
                    early[:] = [e for e in early if e[0] != jid]
                write({"ev": "pub", "jid": jid, "t": t0, "tick": tick, "dt": round(t1 - t0, 3), "master": opts["id"],
                       "expected": sorted(pub.get("minions") or [])})
                for _, mid, t in late:
                    write({"ev": "ret", "jid": jid, "id": mid, "t": t, "lat": round(t - t0, 3)})
            else:
                write({"ev": "perr", "t": t0, "tick": tick, "master": opts["id"], "error": err[:300]})
            nxt += a.interval
            while nxt < time.time():  # fell behind (slow publish): skip rounds, do not burst
                nxt += a.interval
        time.sleep(a.settle)
        lst.stop.set()
        for jid in jids:
            try:
                ids = sorted(lc.get_cache_returns(jid) or {})
            except Exception as exc:  # pylint: disable=broad-except
                write({"ev": "cache", "jid": jid, "ids": [], "error": str(exc)[:200]})
                continue
            write({"ev": "cache", "jid": jid, "ids": ids})
    write({"ev": "done"})
    lst.join(timeout=2)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("once")
    o.add_argument("conf")
    o.add_argument("tgt")
    o.add_argument("fun")
    o.add_argument("arg", nargs="*")
    o.add_argument("--timeout", type=float, default=20)
    o.add_argument("--jid", default="", help="publish under this jid (the same job through several masters)")
    o.add_argument("--glob", help="publish to this glob instead of TGT_LIST")
    s = sub.add_parser("stream")
    s.add_argument("conf")
    s.add_argument("tgt")
    s.add_argument("out")
    s.add_argument("stop")
    s.add_argument("--interval", type=float, default=1.0)
    s.add_argument("--settle", type=float, default=10.0)
    s.add_argument("--rotate", default="", help="P:K:N: minions named P* only in rounds where round mod N == K")
    a = p.parse_args()
    {"once": cmd_once, "stream": cmd_stream}[a.cmd](a)
    # salt leaves non-daemon threads/loops behind now and then; do not hang on them
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
