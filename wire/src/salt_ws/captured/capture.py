"""Captures what Salt 3008.5's `ws` RequestClient (salt/transport/ws.py, over aiohttp) sends on
the wire for two requests: a clear `_auth`-shaped envelope and an `aes` one, each through a relay
that records the client's bytes. Salt dials a new websocket per request, so each is its own
connection: salt_ws_auth.bin and salt_ws_aes.bin (the upgrade request, then the frames).
Run with the venv's python:  $SALTGATE_VENV/bin/python capture.py  (writes into this directory).
The bytes are read by wire/src/salt_ws/peek_tests.rs.
"""
import asyncio, sys, os
import aiohttp, aiohttp.web
import salt.payload, salt.transport.ws as ws

HERE = os.path.dirname(os.path.abspath(__file__))
streams = []

async def main():
    async def handler(request):
        w = aiohttp.web.WebSocketResponse()
        await w.prepare(request)
        async for msg in w:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await w.send_bytes(salt.payload.dumps({"ok": True}))
        return w
    server = aiohttp.web.Server(handler)
    runner = aiohttp.web.ServerRunner(server)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port_a = site._server.sockets[0].getsockname()[1]

    async def relay(cr, cw):
        rec = bytearray(); streams.append(rec)
        sr, sw = await asyncio.open_connection("127.0.0.1", port_a)
        async def pipe(r, w, record):
            try:
                while True:
                    b = await r.read(65536)
                    if not b: break
                    if record is not None: record.extend(b)
                    w.write(b); await w.drain()
            except Exception:
                pass
            finally:
                try: w.close()
                except Exception: pass
        await asyncio.gather(pipe(cr, sw, rec), pipe(sr, cw, None))
    rs = await asyncio.start_server(relay, "127.0.0.1", 0)
    port_b = rs.sockets[0].getsockname()[1]

    opts = {"master_uri": f"tcp://127.0.0.1:{port_b}"}
    client = ws.RequestClient(opts, io_loop=asyncio.get_running_loop())
    pub = "-----BEGIN PUBLIC KEY-----\n" + "A" * 392 + "\n-----END PUBLIC KEY-----\n"
    auth = {"enc": "clear", "load": {"cmd": "_auth", "id": "captured-ws-minion", "nonce": "5f0c1b8e9a7d4c3b2a1908f7e6d5c4b3", "enc_algo": "OAEP-SHA1", "sig_algo": "PKCS1v15-SHA1", "pub": pub, "token": os.urandom(256)}}
    print(await client.send(auth), file=sys.stderr)
    aes = {"enc": "aes", "load": os.urandom(180), "id": "captured-ws-minion", "ts": "1764336000", "tok": os.urandom(256), "version": 3, "nonce": "0123456789abcdef0123456789abcdef"}
    print(await client.send(aes), file=sys.stderr)
    await asyncio.sleep(0.5)
    client.close()
    await asyncio.sleep(0.5)
    print(len(streams), [len(s) for s in streams], file=sys.stderr)
    for i, s in enumerate(streams):
        open(os.path.join(HERE, ["salt_ws_auth.bin", "salt_ws_aes.bin"][i]), "wb").write(bytes(s))
    await runner.cleanup()
asyncio.run(main())
