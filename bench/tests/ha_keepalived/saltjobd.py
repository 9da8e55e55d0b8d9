#!/usr/bin/env python3
"""The job publisher of ha_keepalived's real-Salt variant (main.rs): publishes jobs through ONE
real salt-master (master1) with Salt's LocalClient, and reports who returned.

Runs under the venv's python, inside the masters' namespace, for the whole test:

  saltjobd.py MASTER_CONF RETS_JSONL

Reads requests on stdin, one JSON object a line:
  {"n": N, "tgt": GLOB, "fun": FUN, "arg": [...], "timeout": S}
publishes each (tgt_type glob, as `salt 'GLOB' FUN ARG...`) at once, in order, and writes on stdout,
one JSON object a line:
  {"ev": "ready"}                                        once, when it listens to the event bus
  {"n": N, "ev": "pub", "jid": JID, "minions": [...]}    published ("minions": the master's targets)
  {"n": N, "ev": "done", "jid": JID, "returns": {ID: {"ret": RET, "lat": S}}}
                                                         every targeted minion returned, or S passed
  {"n": N, "ev": "done", "error": TEXT}                  the publish failed
Returns are taken live from master1's event bus (salt/job/JID/ret/ID): in a 3008 cluster a member
pushes its events to its peers, so master1 sees the return of every job it published, whichever
member the minion returned to. Every return event is also appended to RETS_JSONL as
{"jid", "id", "lag"}: a minion that answers a job twice shows twice there; "lag" is the seconds
from the publish (the time the jid names: master1's clock, this host's) to the return event, also for a
return that came after the job's timeout (the "done" line does not wait for those).
"""
import datetime
import json
import os
import sys
import threading
import time

import salt.client
import salt.config
import salt.utils.event

# Salt prints to stdout now and then ("No minions matched the target..."): stdout is ours.
OUT = sys.stdout
sys.stdout = sys.stderr
LOCK = threading.Lock()
RETS = {}  # jid -> {id: (ret, t)}
PENDING = {}  # n -> (jid, minions, t0, deadline)


def out(rec):
    with LOCK:
        OUT.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        OUT.flush()


def jid_time(jid):
    """The time a jid names (salt/utils/jid.py gen_jid: UTC, %Y%m%d%H%M%S%f), or None."""
    try:
        t = datetime.datetime.strptime(jid.split("_")[0], "%Y%m%d%H%M%S%f")
        return t.replace(tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def listen(opts, rets_file, ready):
    with salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True) as ev:
        ev.get_event(wait=0.01, tag="salt/job/")  # subscribe before the first publish
        ready.set()
        while True:
            data = ev.get_event(wait=0.25, tag="salt/job/", full=True)
            if not data:
                continue
            parts = data.get("tag", "").split("/")
            if len(parts) >= 5 and parts[3] == "ret":
                jid, mid = parts[2], parts[4]
                now = time.time()
                with LOCK:
                    RETS.setdefault(jid, {}).setdefault(mid, ((data.get("data") or {}).get("return"), now))
                published = jid_time(jid)
                lag = round(now - published, 3) if published is not None else None
                rets_file.write(json.dumps({"jid": jid, "id": mid, "lag": lag}) + "\n")
                rets_file.flush()


def finish():
    """Answers the jobs every targeted minion returned, or whose time is up."""
    while True:
        time.sleep(0.05)
        now = time.time()
        done = []
        with LOCK:
            for n, (jid, minions, t0, deadline) in PENDING.items():
                got = RETS.get(jid, {})
                if set(minions) <= set(got) or now >= deadline:
                    done.append((n, jid, {m: {"ret": r, "lat": round(t - t0, 3)} for m, (r, t) in got.items()}))
            for n, _, _ in done:
                del PENDING[n]
        for n, jid, returns in done:
            out({"n": n, "ev": "done", "jid": jid, "returns": returns})


def main():
    conf, rets_path = sys.argv[1], sys.argv[2]
    opts = salt.config.client_config(conf)
    ready = threading.Event()
    rets_file = open(rets_path, "a", buffering=1)
    threading.Thread(target=listen, args=(opts, rets_file, ready), daemon=True).start()
    if not ready.wait(60):
        print("no event bus after 60 s", file=sys.stderr)
        os._exit(1)
    threading.Thread(target=finish, daemon=True).start()
    out({"ev": "ready"})
    with salt.client.LocalClient(mopts=opts) as lc:
        for line in sys.stdin:
            if not line.strip():
                continue
            req = json.loads(line)
            n = req["n"]
            t0 = time.time()
            try:
                pub = lc.run_job(req["tgt"], req["fun"], arg=req.get("arg", []), tgt_type="glob",
                                 timeout=req["timeout"], listen=False)
            except Exception as exc:  # pylint: disable=broad-except
                out({"n": n, "ev": "done", "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            if not pub or "jid" not in pub:
                out({"n": n, "ev": "done", "error": f"publish failed: {pub!r}"[:300]})
                continue
            out({"n": n, "ev": "pub", "jid": pub["jid"], "minions": sorted(pub.get("minions") or [])})
            with LOCK:
                PENDING[n] = (pub["jid"], list(pub.get("minions") or []), t0, t0 + float(req["timeout"]))
    # stdin closed: the test is over. Salt leaves threads behind; do not wait for them.
    OUT.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
