# Sink/source master and client for bench/syscalls/bulk.sh (loopback only, 127.22.2.x).
#   bulk.py master PORT          publish port: sink (reads to EOF); request port (PORT+1): source
#   bulk.py up HOST PORT BYTES   client sends BYTES then closes, waits for the master's close
#   bulk.py down HOST PORT BYTES client reads to EOF, checks it got BYTES
import socket, sys, threading
MB = 1 << 20
mode = sys.argv[1]
if mode == "master":
    port = int(sys.argv[2])
    def serve(p, fn):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.22.2.2", p)); s.listen(64)
        while True:
            c, _ = s.accept(); threading.Thread(target=fn, args=(c,), daemon=True).start()
    def sink(c):
        buf = bytearray(MB)
        while c.recv_into(buf):
            pass
        c.close()
    def source(c):
        n = int(c.recv(64).decode()); chunk = b"s" * MB
        while n > 0:
            k = min(n, MB); c.sendall(chunk[:k]); n -= k
        c.close()
    threading.Thread(target=serve, args=(port + 1, source), daemon=True).start()
    serve(port, sink)
else:
    host, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = socket.create_connection((host, port))
    if mode == "up":
        chunk = b"u" * MB; left = n
        while left > 0:
            k = min(left, MB); c.sendall(chunk[:k]); left -= k
        c.shutdown(socket.SHUT_WR)
        while c.recv(65536):
            pass
    else:
        c.sendall(str(n).encode()); buf = bytearray(MB); got = 0
        while True:
            k = c.recv_into(buf)
            if not k: break
            got += k
        assert got == n, (got, n)
