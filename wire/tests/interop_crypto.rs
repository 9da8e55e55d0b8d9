//! Crypto interop with real Salt 3008.5 (`salt.crypt` in the venv): Python encrypts, Rust
//! decrypts, and the reverse, for Crypticle, OAEP, PKCS#1 v1.5 signatures and X9.31; PEM text
//! is compared byte for byte with what `cryptography` writes for Salt.

mod common;

use std::sync::OnceLock;

use common::{hex, run_py_json, unhex};
use saltgate_wire::crypticle::{Crypticle, CrypticleError, CrypticleKey};
use saltgate_wire::envelope::{self, map, text};
use saltgate_wire::rsa::{EncAlgo, PrivateKey, PublicKey, SigAlgo};
use serde_json::{json, Value as Json};

fn py(ops: Json) -> Vec<Json> {
    let out = run_py_json("salt_crypto.py", &[], &ops.to_string());
    let results: Vec<Json> = serde_json::from_str(&out).expect("json from python");
    results
}

fn ok(r: &Json) -> &Json {
    match r.get("ok") {
        Some(v) => v,
        None => panic!("python op failed: {r}"),
    }
}

fn ok_hex(r: &Json) -> Vec<u8> {
    unhex(ok(r).as_str().expect("hex string"))
}

/// A Rust-generated key shared by the tests of this binary.
fn rust_key() -> &'static PrivateKey {
    static K: OnceLock<PrivateKey> = OnceLock::new();
    K.get_or_init(|| PrivateKey::generate(2048).expect("keygen"))
}

#[test]
fn crypticle_interoperates_with_salt_in_both_directions() {
    let key = CrypticleKey::generate();
    let ks = key.to_key_string();
    let mut c = Crypticle::new(key);
    let rust_ct = c.encrypt(b"from rust \xff\x00");
    let nonce = "0123456789abcdef0123456789abcdef";
    let rust_dumped = c.dumps(
        &envelope::salt_compat(map(vec![
            ("cmd", text("_return")),
            ("blob", envelope::bin(b"\xff\xfe")),
        ])),
        Some(nonce),
    );
    let r = py(json!([
        {"op": "crypticle_decrypt", "key": ks, "data": hex(&rust_ct)},
        {"op": "crypticle_encrypt", "key": ks, "data": hex(b"from python \x00\xff")},
        {"op": "crypticle_loads", "key": ks, "data": hex(&rust_dumped), "nonce": nonce},
        {"op": "crypticle_dumps", "key": ks, "obj": {"fun": "test.ping", "serial": 5}, "nonce": nonce},
        {"op": "crypticle_key"},
    ]));
    assert_eq!(ok_hex(&r[0]), b"from rust \xff\x00");
    assert_eq!(c.decrypt(&ok_hex(&r[1])).unwrap(), b"from python \x00\xff");
    assert_eq!(
        ok(&r[2]),
        &json!({"cmd": "_return", "blob": {"__bytes__": "fffe"}})
    );
    let job = c.loads(&ok_hex(&r[3]), Some(nonce)).unwrap();
    assert_eq!(
        envelope::as_str(envelope::get(&job, "fun").unwrap()),
        Some("test.ping")
    );
    assert!(envelope::get(&job, "serial").is_none(), "serial is popped");
    assert_eq!(c.last_serial(), 5);
    // Replaying the same publish is refused.
    assert!(matches!(
        c.loads(&ok_hex(&r[3]), Some(nonce)),
        Err(CrypticleError::Replay { serial: 5, last: 5 })
    ));
    // A key string made by Salt parses.
    let salt_key = ok(&r[4]).as_str().unwrap();
    assert_eq!(salt_key.len(), 76);
    CrypticleKey::from_key_string(salt_key).unwrap();
}

#[test]
fn salt_rejects_a_rust_ciphertext_with_a_flipped_bit() {
    let key = CrypticleKey::generate();
    let c = Crypticle::new(key.clone());
    let mut ct = c.encrypt(b"payload");
    ct[17] ^= 0x80;
    let r = py(json!([{"op": "crypticle_decrypt", "key": key.to_key_string(), "data": hex(&ct)}]));
    let err = r[0].get("err").and_then(Json::as_str).unwrap_or("");
    assert!(err.contains("AuthenticationError"), "{}", r[0]);
}

#[test]
fn oaep_sha1_interoperates_with_salt_in_both_directions() {
    let k = rust_key();
    let priv_pem = k.to_pem().unwrap();
    let pub_pem = k.public_key().to_pem().unwrap();
    let rust_ct = k
        .public_key()
        .encrypt(EncAlgo::OaepSha1, b"aes key string")
        .unwrap();
    let r = py(json!([
        {"op": "oaep_decrypt", "priv": priv_pem, "data": hex(&rust_ct)},
        {"op": "oaep_encrypt", "pub": pub_pem, "data": hex(b"token from python")},
        {"op": "oaep_encrypt", "pub": pub_pem, "data": hex(b"sha224"), "algo": "OAEP-SHA224"},
    ]));
    assert_eq!(ok_hex(&r[0]), b"aes key string");
    assert_eq!(
        k.decrypt(EncAlgo::OaepSha1, &ok_hex(&r[1])).unwrap(),
        b"token from python"
    );
    assert_eq!(
        k.decrypt(EncAlgo::OaepSha224, &ok_hex(&r[2])).unwrap(),
        b"sha224"
    );
}

#[test]
fn pkcs1v15_sha1_signatures_interoperate_with_salt() {
    let k = rust_key();
    let msg = b"\x93\x01\x02\x03 load bytes";
    let rust_sig = k.sign(SigAlgo::Pkcs1v15Sha1, msg).unwrap();
    let r = py(json!([
        {"op": "verify", "pub": k.public_key().to_pem().unwrap(), "data": hex(msg), "sig": hex(&rust_sig)},
        {"op": "sign", "priv": k.to_pem().unwrap(), "data": hex(msg)},
        {"op": "verify", "pub": k.public_key().to_pem().unwrap(), "data": hex(b"other"), "sig": hex(&rust_sig)},
    ]));
    assert_eq!(ok(&r[0]), &json!(true));
    let py_sig = ok_hex(&r[1]);
    assert!(k.public_key().verify(SigAlgo::Pkcs1v15Sha1, msg, &py_sig));
    // PKCS#1 v1.5 is deterministic: both sides produce the same bytes.
    assert_eq!(py_sig, rust_sig);
    assert_eq!(ok(&r[2]), &json!(false));
}

#[test]
fn x931_interoperates_with_salt_in_both_directions() {
    let k = rust_key();
    // Salt's `tok` is X9.31(minion key, b"salt"); the auth `sig` is X9.31 of a sha256 hexdigest.
    let digest_hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let rust_tok = k.private_encrypt_x931(b"salt").unwrap();
    let r = py(json!([
        {"op": "x931_decrypt", "pub": k.public_key().to_pem().unwrap(), "data": hex(&rust_tok)},
        {"op": "x931_encrypt", "priv": k.to_pem().unwrap(), "data": hex(b"salt")},
        {"op": "x931_encrypt", "priv": k.to_pem().unwrap(), "data": hex(digest_hex.as_bytes())},
    ]));
    assert_eq!(ok_hex(&r[0]), b"salt");
    let py_tok = ok_hex(&r[1]);
    assert_eq!(
        k.public_key().public_decrypt_x931(&py_tok).unwrap(),
        b"salt"
    );
    // X9.31 here is deterministic too: same key, same message, same bytes.
    assert_eq!(py_tok, rust_tok);
    assert_eq!(
        k.public_key().public_decrypt_x931(&ok_hex(&r[2])).unwrap(),
        digest_hex.as_bytes()
    );
}

#[test]
fn pem_text_is_byte_identical_to_salts() {
    let k = rust_key();
    let r = py(json!([
        {"op": "pem_reserialize", "priv": k.to_pem().unwrap()},
        {"op": "gen_keys"},
    ]));
    let same = ok(&r[0]);
    assert_eq!(same["priv"].as_str().unwrap(), k.to_pem().unwrap());
    assert_eq!(
        same["pub"].as_str().unwrap(),
        k.public_key().to_pem().unwrap()
    );
    assert_eq!(
        same["clean_pub"].as_str().unwrap(),
        k.public_key().to_clean_pem().unwrap()
    );
    // A key Salt generated reads back and re-serialises to the same text.
    let salt_keys = ok(&r[1]);
    let sp = PrivateKey::from_pem(salt_keys["priv"].as_str().unwrap()).unwrap();
    assert_eq!(sp.to_pem().unwrap(), salt_keys["priv"].as_str().unwrap());
    let spub = PublicKey::from_pem(salt_keys["pub"].as_str().unwrap()).unwrap();
    assert_eq!(spub.to_pem().unwrap(), salt_keys["pub"].as_str().unwrap());
    assert_eq!(sp.public_key(), spub);
}

#[test]
fn msgpack_from_salt_payload_decodes_and_ours_loads_in_salt() {
    let ours = envelope::encode(&envelope::salt_compat(map(vec![
        ("enc", text("aes")),
        ("load", envelope::bin(b"\xff\x00\x01")),
        ("version", rmpv::Value::from(3)),
    ])));
    let r = py(json!([
        {"op": "payload_dumps", "obj": {"enc": "clear", "load": {"cmd": "ping"}, "version": 3}},
        {"op": "payload_loads", "data": hex(&ours)},
    ]));
    let theirs = ok_hex(&r[0]);
    let env = envelope::RequestEnvelope::decode(&theirs).unwrap();
    assert_eq!(env.enc, "clear");
    assert_eq!(env.version, Some(3));
    assert_eq!(
        ok(&r[1]),
        &json!({"enc": "aes", "load": {"__bytes__": "ff0001"}, "version": 3})
    );
}

#[test]
fn a_cluster_masters_publish_yields_its_jid_with_the_key_from_the_aes_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf8 path");
    let job = json!({"fun": "test.ping", "arg": [], "tgt": "*", "tgt_type": "glob",
                     "jid": "20261123020000123456", "ret": "", "user": "root"});
    let r = py(json!([
        {"op": "cluster_aes_write", "dir": d},
        {"op": "wrap_publish", "dir": d, "load": job},
        {"op": "wrap_publish", "dir": d, "load": job},
    ]));
    ok(&r[0]);
    let (a, b) = (ok_hex(&r[1]), ok_hex(&r[2]));
    assert_ne!(a, b, "each copy has its own IV");
    let text = std::fs::read_to_string(dir.path().join(".aes")).expect("the .aes file");
    assert_eq!(text.len(), 76, "base64 of 56 bytes, no newline");
    let c = Crypticle::new(CrypticleKey::from_key_string(&text).expect("a key string"));
    for payload in [a, b] {
        assert_eq!(
            saltgate_wire::publish_job::publish_jid(&payload, &[&c]).expect("jid"),
            b"20261123020000123456"
        );
    }
    let other = Crypticle::new(CrypticleKey::generate());
    assert_eq!(
        saltgate_wire::publish_job::publish_jid(&ok_hex(&r[1]), &[&other]),
        Err(saltgate_wire::publish_job::JobIdError::BadMac)
    );
}
