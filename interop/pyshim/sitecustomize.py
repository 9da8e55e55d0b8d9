"""Loaded by the suite's salt-minion processes only (run.sh puts this directory on their
PYTHONPATH through harness/cluster.py, with INTEROP_REQ_SOURCE=1).

Salt 3008.5 applies the minion's `source_address` to its publish socket only: resolve_dns()
(salt/minion.py) sets opts["master_uri"] without the source, and the request client
(salt/transport/zeromq.py RequestClient.get_master_uri) prefers master_uri over building the URI
with `source_ip` / `source_ret_port`. Every request connection (`_auth`, returns) therefore leaves
from the kernel's choice (127.0.0.1 on loopback), and saltgate's presence cannot pair a minion's
request session with its publish session by address. This applies the source to the request
socket too, exactly as Salt builds the publish socket's URI (zeromq._get_master_uri), and changes
nothing else.

Salt's `tcp` transport (TRANSPORT=tcp) ignores the source on both sockets: its PublishClient and
RequestClient pass `source_ip`/`source_port` to tornado's TCPClient.connect, but Salt's own
TCPClientKeepAlive._create_stream (salt/transport/tcp.py) swallows them ("use **kwargs to swallow
these") and connects an unbound socket, so every tcp minion dials from 127.0.0.1. The second patch
(INTEROP_TCP_SOURCE=1: TRANSPORT=tcp runs
only) binds that socket to the source before the connect, and changes nothing else (the socket options,
keepalive and write-buffer cap are Salt's own helpers, as in the original)."""
import os

if os.environ.get("INTEROP_REQ_SOURCE") == "1":
    try:
        import salt.transport.zeromq as _zmq
    except Exception:  # pylint: disable=broad-except
        _zmq = None
    if _zmq is not None:
        _orig = _zmq.RequestClient.get_master_uri

        def _get_master_uri(opts):
            uri = _orig(opts)
            src = opts.get("source_ip")
            if src and uri.startswith("tcp://") and ";" not in uri:
                host, port = uri[len("tcp://"):].rsplit(":", 1)
                return _zmq._get_master_uri(host.strip("[]"), int(port), source_ip=src,
                                            source_port=opts.get("source_ret_port"))
            return uri

        _zmq.RequestClient.get_master_uri = staticmethod(_get_master_uri)

if os.environ.get("INTEROP_TCP_SOURCE") == "1":
    try:
        import salt.transport.tcp as _tcp
        import tornado.iostream as _iostream
    except Exception:  # pylint: disable=broad-except
        _tcp = None
    if _tcp is not None and hasattr(_tcp, "TCPClientKeepAlive"):
        _orig_create = _tcp.TCPClientKeepAlive._create_stream

        def _create_stream(self, max_buffer_size, af, addr, **kwargs):
            src, sport = kwargs.get("source_ip"), kwargs.get("source_port")
            if not src and not sport:
                return _orig_create(self, max_buffer_size, af, addr, **kwargs)
            sock = _tcp._get_socket(self.opts)
            _tcp._set_tcp_keepalive(sock, self.opts)
            sock.bind((src or "", int(sport or 0)))
            stream = _iostream.IOStream(sock, max_buffer_size=max_buffer_size)
            _tcp._cap_stream_write_buffer(stream, self.opts)
            return stream, stream.connect(addr)

        _tcp.TCPClientKeepAlive._create_stream = _create_stream
