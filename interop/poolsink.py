#!/usr/bin/env python3
"""Accept-and-discard TCP sink for a killed master's cluster_pool_port (used by scenario 2).

usage: poolsink.py HOST PORT

Keeps trying to bind HOST:PORT every 5 ms until it succeeds (start it before the master is
killed; it takes the port over within milliseconds of the master's death), then accepts every
connection and reads and drops whatever arrives, until SIGTERM.

Why: Salt 3008.5 masters forward every event to every cluster peer. When a peer's pool port
refuses connections, the forwarding EventPublisher logs "Unable to forward event to cluster peer
X; resetting pusher for reconnect" and schedules one more AES-key announcement (call_later 2 s)
for EVERY failed forward, each of which fails again. At the suite's job rate the surviving
masters' event forwarding falls minutes behind within seconds (jobs reach the minions on the
other surviving master 1-2 minutes late), for both load balancers alike, which swamps what the
load balancers do. With the sink, forwards to the dead peer succeed into nothing and Salt's
forwarding stays healthy; the minion-facing side (publish and request ports, all the load
balancers see) is exactly that of a killed master. This is a measurement aid, not a claim about
production: a real crashed master triggers Salt's storm. Disable with POOL_SINK=0 to watch Salt's own behaviour.
"""
import selectors
import signal
import socket
import sys
import time


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    while True:
        try:
            lsock.bind((host, port))
            break
        except OSError:
            time.sleep(0.005)
    lsock.listen(128)
    print(f"pool sink bound {host}:{port} at {time.time():.3f}", flush=True)
    lsock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    n = 0
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if s is lsock:
                try:
                    c, _ = lsock.accept()
                except OSError:
                    continue
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ)
                n += 1
            else:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(s)
                    s.close()


if __name__ == "__main__":
    main()
