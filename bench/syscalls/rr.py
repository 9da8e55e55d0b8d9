# Echo master and request/response client for bench/syscalls/measure.sh (loopback only).
import socket, sys, threading, time
# echo server on 127.0.2.50:7001 (stands in for a master); client does N request/response over C conns via the proxy
mode=sys.argv[1]
if mode=="echo":
    s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); s.bind(("127.0.2.50",int(sys.argv[2]))); s.listen(512)
    def h(c):
        while True:
            d=c.recv(65536)
            if not d: break
            c.sendall(d)
    while True:
        c,_=s.accept(); threading.Thread(target=h,args=(c,),daemon=True).start()
else:
    addr=(sys.argv[2],int(sys.argv[3])); conns=int(sys.argv[4]); n=int(sys.argv[5])
    def w():
        c=socket.create_connection(addr); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY,1)
        msg=b"x"*200
        for _ in range(n):
            c.sendall(msg); got=0
            while got<200: got+=len(c.recv(4096))
        c.close()
    ts=[threading.Thread(target=w) for _ in range(conns)]
    t=time.time(); [x.start() for x in ts]; [x.join() for x in ts]; print("done", conns*n, "in", time.time()-t)
