"""Real Salt's crypto as an oracle for the Rust interop tests.

Reads a JSON list of operations on stdin, writes a JSON list of results on stdout.
Bytes travel as hex. Uses salt.crypt itself (Salt 3008.5), not a re-implementation.
"""
import json
import os
import sys
import types

import salt.channel.server
import salt.crypt
import salt.payload
from cryptography.hazmat.primitives import serialization

OPTS = {}


def h(b):
    return b.hex()


def jsonable(obj):
    if isinstance(obj, bytes):
        return {"__bytes__": obj.hex()}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def run(op):
    kind = op["op"]
    if kind == "gen_keys":
        priv, pub = salt.crypt.gen_keys(2048)
        return {"priv": priv, "pub": pub}
    if kind == "crypticle_key":
        return salt.crypt.Crypticle.generate_key_string()
    if kind == "crypticle_encrypt":
        c = salt.crypt.Crypticle(OPTS, op["key"])
        return h(c.encrypt(bytes.fromhex(op["data"])))
    if kind == "crypticle_decrypt":
        c = salt.crypt.Crypticle(OPTS, op["key"])
        return h(c.decrypt(bytes.fromhex(op["data"])))
    if kind == "crypticle_dumps":
        c = salt.crypt.Crypticle(OPTS, op["key"])
        return h(c.dumps(op["obj"], nonce=op.get("nonce")))
    if kind == "crypticle_loads":
        c = salt.crypt.Crypticle(OPTS, op["key"], serial=op.get("serial", 0))
        return jsonable(c.loads(bytes.fromhex(op["data"]), nonce=op.get("nonce")))
    if kind == "oaep_encrypt":
        k = salt.crypt.PublicKey.from_str(op["pub"])
        return h(k.encrypt(bytes.fromhex(op["data"]), algorithm=op.get("algo", "OAEP-SHA1")))
    if kind == "oaep_decrypt":
        k = salt.crypt.PrivateKey.from_str(op["priv"])
        return h(k.decrypt(bytes.fromhex(op["data"]), algorithm=op.get("algo", "OAEP-SHA1")))
    if kind == "sign":
        k = salt.crypt.PrivateKey.from_str(op["priv"])
        return h(k.sign(bytes.fromhex(op["data"]), algorithm=op.get("algo", "PKCS1v15-SHA1")))
    if kind == "verify":
        k = salt.crypt.PublicKey.from_str(op["pub"])
        return bool(
            k.verify(
                bytes.fromhex(op["data"]),
                bytes.fromhex(op["sig"]),
                algorithm=op.get("algo", "PKCS1v15-SHA1"),
            )
        )
    if kind == "x931_encrypt":
        k = salt.crypt.PrivateKey.from_str(op["priv"])
        return h(k.encrypt(bytes.fromhex(op["data"])))
    if kind == "x931_decrypt":
        k = salt.crypt.PublicKey.from_str(op["pub"])
        return h(k.decrypt(bytes.fromhex(op["data"])))
    if kind == "pem_reserialize":
        # Load Rust's PEM with `cryptography` and write it back the way Salt does.
        priv = serialization.load_pem_private_key(op["priv"].encode(), password=None)
        priv_pem = priv.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.TraditionalOpenSSL,
            encryption_algorithm=serialization.NoEncryption(),
        ).decode()
        pub_pem = priv.public_key().public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        ).decode()
        return {"priv": priv_pem, "pub": pub_pem, "clean_pub": salt.crypt.clean_key(pub_pem)}
    if kind == "cluster_aes_write":
        # The cluster key file as a 3008 master writes it (`read_or_generate_key`).
        salt.crypt.Crypticle.write_key(os.path.join(op["dir"], ".aes"))
        return True
    if kind == "wrap_publish":
        # A cluster master's publish payload: PubServerChannel.wrap_payload itself, with the key
        # read from the .aes file as the master reads it.
        class NoTopics:
            def topic_support(self):
                return False

        key = salt.crypt.Crypticle.read_key(os.path.join(op["dir"], ".aes"))
        fake = types.SimpleNamespace(
            opts={"cluster_id": "c1", "sign_pub_messages": False},
            aes_key=key,
            transport=NoTopics(),
        )
        return h(salt.channel.server.PubServerChannel.wrap_payload(fake, op["load"])["payload"])
    if kind == "payload_dumps":
        return h(salt.payload.dumps(op["obj"]))
    if kind == "payload_loads":
        return jsonable(salt.payload.loads(bytes.fromhex(op["data"])))
    raise ValueError(f"unknown op {kind}")


def main():
    ops = json.load(sys.stdin)
    out = []
    for op in ops:
        try:
            out.append({"ok": run(op)})
        except Exception as e:  # report, do not crash: the Rust side asserts on it
            out.append({"err": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
