"""pyzmq (libzmq 4.3.5) peers for the Rust ZMTP interop tests.

Modes (all on loopback; every mode exits by itself within its time budget):
  sub ADDR TOPIC COUNT         SUB: connect, subscribe, print each received message as hex JSON
  pub_hb                       PUB with ZMTP heartbeats (ivl/timeout from argv), bound on port 0;
                               prints the port, publishes b"tick <n>" every 50 ms for SECONDS,
                               then prints socket-monitor counts as JSON
  req ADDR COUNT               REQ: send b"req <i>", expect b"rep <i>", print "ok"
  router                       ROUTER bound on port 0: prints the port, answers COUNT requests
                               with b"rep:" + payload
"""
import json
import sys
import time

import zmq
from zmq.utils.monitor import recv_monitor_message


def out(obj):
    print(json.dumps(obj), flush=True)


def mode_sub(addr, topic, count):
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 20000)
    s.setsockopt(zmq.SUBSCRIBE, topic.encode())
    s.connect(addr)
    out({"event": "connecting"})
    for _ in range(int(count)):
        parts = s.recv_multipart()
        out({"msg": [p.hex() for p in parts]})
    s.close()
    ctx.term()


def mode_pub_hb(ivl_ms, timeout_ms, seconds):
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.HEARTBEAT_IVL, int(ivl_ms))
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(timeout_ms))
    mon = s.get_monitor_socket()
    port = s.bind_to_random_port("tcp://127.0.0.1")
    out({"port": port})
    counts = {"accepted": 0, "disconnected": 0}
    end = time.time() + float(seconds)
    n = 0
    while time.time() < end:
        s.send(b"tick %d" % n)
        n += 1
        while mon.poll(0):
            ev = recv_monitor_message(mon)
            if ev["event"] == zmq.EVENT_ACCEPTED:
                counts["accepted"] += 1
            elif ev["event"] == zmq.EVENT_DISCONNECTED:
                counts["disconnected"] += 1
        time.sleep(0.05)
    out(counts)
    s.disable_monitor()
    s.close()
    ctx.term()


def mode_req(addr, count):
    ctx = zmq.Context()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 10000)
    s.connect(addr)
    for i in range(int(count)):
        s.send(b"req %d" % i)
        rep = s.recv()
        if rep != b"rep %d" % i:
            out({"error": rep.hex()})
            sys.exit(1)
    out({"ok": int(count)})
    s.close()
    ctx.term()


def mode_router(count):
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 1000)
    s.setsockopt(zmq.RCVTIMEO, 20000)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    out({"port": port})
    for _ in range(int(count)):
        ident, delim, payload = s.recv_multipart()
        s.send_multipart([ident, delim, b"rep:" + payload])
    out({"done": int(count)})
    time.sleep(0.2)
    s.close()
    ctx.term()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"sub": mode_sub, "pub_hb": mode_pub_hb, "req": mode_req, "router": mode_router}[mode](*args)
