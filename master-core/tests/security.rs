//! Every refusal of the request port and every key-state rule, against an in-process master on
//! 127.0.1.20 driven by a Rust client (the wire crate's REQ socket): no real Salt needed. Each
//! test ends by reading the refusal counters off the metrics endpoint: every refusal it caused
//! is counted under its reason, and nothing else is.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::salt_master::parse_salt_master;
use saltgate_master::keys::{KeyState, KeyStore};
use saltgate_master::server::Bound;
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, as_bytes, as_str, get, map, text, RequestEnvelope, Value};
use saltgate_wire::rsa::{EncAlgo, PrivateKey, PublicKey, SigAlgo};
use saltgate_wire::zmtp::{ReqOptions, ReqSocket};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::counts;

const IP: &str = "127.0.1.20";

fn openssl_key_pem() -> String {
    String::from_utf8(saltgate_test_support::openssl_pem()).unwrap()
}

fn openssl_key() -> PrivateKey {
    PrivateKey::from_pem(&openssl_key_pem()).expect("openssl key parses")
}

struct TestMaster {
    bound: Bound,
    dir: tempfile::TempDir,
    run: common::InProcess,
}

impl TestMaster {
    async fn start(extra: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("sgsec")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path().display();
        let text = format!(
            "id: sec\ninterface: {IP}\npublish_port: 0\nret_port: 0\npki_dir: {d}/pki\n\
             cachedir: {d}/cache\nsock_dir: {d}/sock\npillar_roots: {{base: [{d}/pillar]}}\n\
             saltgate_metrics_bind: {IP}:0\n{extra}"
        );
        let config = parse_salt_master(&text, None).unwrap().config;
        // An openssl key instead of a debug-build RSA key generation (tens of seconds).
        std::fs::create_dir_all(dir.path().join("pki")).unwrap();
        std::fs::write(dir.path().join("pki/master.pem"), openssl_key_pem()).unwrap();
        let run = common::InProcess::start(config).await;
        TestMaster {
            bound: run.bound.clone(),
            dir,
            run,
        }
    }

    fn pki(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    fn keys(&self) -> KeyStore {
        KeyStore::new(self.pki())
    }

    /// The refusal counters that are not zero (`"port/reason"` → count).
    async fn refusals(&self) -> std::collections::BTreeMap<String, u64> {
        common::refusals(self.bound.metrics.expect("saltgate_metrics_bind is set")).await
    }

    async fn stop(self) {
        self.run.stop().await;
    }
}

async fn request(addr: SocketAddr, body: Vec<u8>) -> Value {
    let mut req = ReqSocket::new(addr, ReqOptions::default());
    let reply = req
        .request(vec![Bytes::from(body)], Duration::from_secs(30))
        .await
        .expect("a reply");
    envelope::decode(&reply[0]).expect("reply is msgpack")
}

fn nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn auth_body(id: &str, pub_pem: &str, nonce: &str) -> Vec<u8> {
    RequestEnvelope::clear(map(vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text(nonce)),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text(pub_pem)),
    ]))
    .encode()
}

/// Verifies the master's signature and returns the inner load of a signed `_auth` reply.
fn signed_inner(reply: &Value, master_pub: &PublicKey) -> Value {
    assert_eq!(get(reply, "enc").and_then(as_str), Some("clear"), "{reply}");
    let load = as_bytes(get(reply, "load").expect("load")).unwrap();
    let sig = as_bytes(get(reply, "sig").expect("sig")).unwrap();
    assert!(
        master_pub.verify(SigAlgo::Pkcs1v15Sha1, load, sig),
        "auth reply signature"
    );
    envelope::decode(load).unwrap()
}

fn master_pub(pki: &Path) -> PublicKey {
    PublicKey::from_pem(&std::fs::read_to_string(pki.join("master.pub")).unwrap()).unwrap()
}

struct Minion {
    id: String,
    key: PrivateKey,
    session: Option<Crypticle>,
}

impl Minion {
    fn new(id: &str) -> Self {
        Minion {
            id: id.to_string(),
            key: openssl_key(),
            session: None,
        }
    }

    fn pub_pem(&self) -> String {
        self.key.public_key().to_clean_pem().unwrap()
    }

    /// `_auth`; returns the verified inner load.
    async fn auth(&mut self, m: &TestMaster) -> Value {
        let n = nonce();
        let reply = request(m.bound.ret, auth_body(&self.id, &self.pub_pem(), &n)).await;
        let inner = signed_inner(&reply, &master_pub(&m.pki()));
        assert_eq!(get(&inner, "nonce").and_then(as_str), Some(n.as_str()));
        if let Some(s) = get(&inner, "session").and_then(as_bytes) {
            let s = self.key.decrypt(EncAlgo::OaepSha1, s).unwrap();
            self.session = Some(Crypticle::new(
                CrypticleKey::from_key_string(std::str::from_utf8(&s).unwrap()).unwrap(),
            ));
        }
        inner
    }

    fn tok(&self) -> Vec<u8> {
        self.key.private_encrypt_x931(b"salt").unwrap()
    }

    /// A v3 aes request with the given load fields (plus id, nonce, ts, tok unless overridden).
    fn aes_body(&self, fields: Vec<(&str, Value)>, nonce: &str, envelope_id: &str) -> Vec<u8> {
        let mut load = vec![
            ("id", text(&self.id)),
            ("nonce", text(nonce)),
            ("ts", Value::from(now())),
            ("tok", envelope::bin(&self.tok())),
        ];
        for (k, v) in fields {
            load.retain(|(x, _)| *x != k);
            if v != Value::Nil {
                load.push((k, v));
            }
        }
        let ct = self
            .session
            .as_ref()
            .expect("authenticated")
            .dumps(&envelope::salt_compat(map(load)), None);
        RequestEnvelope::aes(envelope_id, &ct).encode()
    }

    async fn aes(&self, m: &TestMaster, fields: Vec<(&str, Value)>, nonce: &str) -> Value {
        request(m.bound.ret, self.aes_body(fields, nonce, &self.id)).await
    }

    fn open(&self, reply: &Value, nonce: &str) -> Value {
        let ct = as_bytes(reply).unwrap_or_else(|| panic!("not an encrypted reply: {reply}"));
        let mut s = self.session.clone().unwrap();
        s.loads(ct, Some(nonce))
            .expect("session reply with our nonce")
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn bad_load() -> Value {
    text("bad load")
}

fn tree(p: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                out.push(e.path().display().to_string());
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_commands_are_an_allowlist_and_refusals_touch_no_disk() {
    let m = TestMaster::start("").await;
    let before = tree(m.dir.path());
    for cmd in [
        "publish",
        "_pillar",
        "wheel",
        "runner",
        "mk_token",
        "get_token",
        "",
        "_return",
    ] {
        let body = RequestEnvelope::clear(map(vec![
            ("cmd", text(cmd)),
            ("tgt", text("*")),
            ("fun", text("cmd.run")),
            ("arg", Value::Array(vec![text("touch /tmp/pwned")])),
            ("id", text("x")),
        ]))
        .encode();
        assert_eq!(
            request(m.bound.ret, body).await,
            Value::Map(vec![]),
            "{cmd}"
        );
    }
    // Structurally broken requests: Salt's "bad load".
    let mut old = RequestEnvelope::ping();
    old.version = Some(2);
    let no_version = envelope::encode(&map(vec![
        ("enc", text("clear")),
        ("load", map(vec![("cmd", text("ping"))])),
    ]));
    for body in [
        b"\xc1 not msgpack".to_vec(),
        envelope::encode(&text("just a string")),
        envelope::encode(&map(vec![("enc", text("clear"))])),
        old.encode(),
        no_version,
        RequestEnvelope::aes("../../etc/passwd", b"x").encode(),
        RequestEnvelope::aes("a\0b", b"x").encode(),
        envelope::encode(&map(vec![
            ("enc", text("rot13")),
            ("load", text("x")),
            ("version", Value::from(3)),
        ])),
    ] {
        assert_eq!(request(m.bound.ret, body).await, bad_load());
    }
    assert_eq!(
        tree(m.dir.path()),
        before,
        "a refused request changed the disk"
    );
    // The clear ping is echoed.
    let pong = request(m.bound.ret, RequestEnvelope::ping().encode()).await;
    assert_eq!(get(&pong, "cmd").and_then(as_str), Some("ping"));
    assert_eq!(
        m.refusals().await,
        counts(&[
            ("request/clear_command", 8),
            ("request/malformed", 4),
            ("request/protocol_version", 2),
            ("request/invalid_id", 2),
        ])
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_follows_salt_key_state_rules() {
    let m = TestMaster::start("").await;
    let mpub = master_pub(&m.pki());
    let ks = m.keys();
    let mut a = Minion::new("m-state");

    // Unknown → pending (ret True), twice.
    for _ in 0..2 {
        let inner = a.auth(&m).await;
        assert_eq!(get(&inner, "ret"), Some(&Value::Boolean(true)), "{inner}");
    }
    assert_eq!(ks.list().unwrap().minions_pre, vec!["m-state"]);

    // A different key for the pending id → denied; the pending key stays.
    let mut imposter = Minion::new("m-state");
    let inner = imposter.auth(&m).await;
    assert_eq!(get(&inner, "ret"), Some(&Value::Boolean(false)));
    let l = ks.list().unwrap();
    assert_eq!((l.minions_pre.len(), l.minions_denied.len()), (1, 1));
    assert!(saltgate_master::keys::same_key(
        &ks.denied("m-state").unwrap().unwrap(),
        &imposter.pub_pem()
    ));

    // Accepted → full reply: keys wrapped to us, X9.31 sig over sha256(aes), publish port.
    ks.accept("m-state").unwrap();
    let inner = a.auth(&m).await;
    assert_eq!(get(&inner, "enc").and_then(as_str), Some("pub"), "{inner}");
    assert_eq!(
        get(&inner, "publish_port").and_then(Value::as_u64),
        Some(u64::from(m.bound.publish.port()))
    );
    assert!(saltgate_master::keys::same_key(
        get(&inner, "pub_key").and_then(as_str).unwrap(),
        &std::fs::read_to_string(m.pki().join("master.pub")).unwrap()
    ));
    let aes = a
        .key
        .decrypt(
            EncAlgo::OaepSha1,
            as_bytes(get(&inner, "aes").unwrap()).unwrap(),
        )
        .unwrap();
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(&aes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let sig = mpub
        .public_decrypt_x931(as_bytes(get(&inner, "sig").unwrap()).unwrap())
        .unwrap();
    assert_eq!(sig, digest.as_bytes());
    assert!(a.session.is_some());

    // A minion that pinned the master key sends a token; the master proves it holds the key by
    // sending it back wrapped to the minion.
    let n = nonce();
    let token = mpub
        .encrypt(EncAlgo::OaepSha1, b"minion-token-123")
        .unwrap();
    let body = RequestEnvelope::clear(map(vec![
        ("cmd", text("_auth")),
        ("id", text("m-state")),
        ("nonce", text(&n)),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text(&a.pub_pem())),
        ("token", envelope::bin(&token)),
    ]))
    .encode();
    let inner = signed_inner(&request(m.bound.ret, body).await, &mpub);
    let back = a
        .key
        .decrypt(
            EncAlgo::OaepSha1,
            as_bytes(get(&inner, "token").expect("token")).unwrap(),
        )
        .unwrap();
    assert_eq!(back, b"minion-token-123");

    // A changed key for an accepted id → denied, the accepted key is untouched.
    let inner = imposter.auth(&m).await;
    assert_eq!(get(&inner, "ret"), Some(&Value::Boolean(false)));
    assert_eq!(ks.fetch("m-state").unwrap().unwrap().0, KeyState::Accepted);

    // Rejected → ret False, whatever the key.
    let mut r = Minion::new("m-rejected");
    r.auth(&m).await;
    ks.reject("m-rejected").unwrap();
    let inner = r.auth(&m).await;
    assert_eq!(get(&inner, "ret"), Some(&Value::Boolean(false)));
    assert_eq!(ks.list().unwrap().minions_rejected, vec!["m-rejected"]);

    // Invalid ids: ret False, nothing written anywhere.
    let before = tree(m.dir.path());
    for bad in [
        "../evil",
        "a/b",
        "a\\b",
        "nul\0id",
        ".hidden",
        &"x".repeat(256),
    ] {
        let n = nonce();
        let reply = request(m.bound.ret, auth_body(bad, &a.pub_pem(), &n)).await;
        let inner = signed_inner(&reply, &mpub);
        assert_eq!(get(&inner, "ret"), Some(&Value::Boolean(false)), "{bad:?}");
    }
    // A public key that does not parse: refused, not stored.
    let reply = request(m.bound.ret, auth_body("m-garbage", "not a key", &nonce())).await;
    assert_eq!(
        get(&signed_inner(&reply, &mpub), "ret"),
        Some(&Value::Boolean(false))
    );
    assert_eq!(tree(m.dir.path()), before);
    assert_eq!(
        m.refusals().await,
        counts(&[
            ("request/auth_denied", 2),
            ("request/auth_rejected", 1),
            ("request/invalid_id", 6),
            ("request/auth_unusable_key", 1),
        ])
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_accept_and_autosign_file_accept_on_first_contact() {
    let m = TestMaster::start("auto_accept: True\n").await;
    let mut a = Minion::new("m-auto");
    let inner = a.auth(&m).await;
    assert_eq!(get(&inner, "enc").and_then(as_str), Some("pub"), "{inner}");
    assert_eq!(m.keys().list().unwrap().minions, vec!["m-auto"]);
    m.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("autosign.conf");
    std::fs::write(&f, "web*\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = TestMaster::start(&format!("autosign_file: {}\n", f.display())).await;
    let mut w = Minion::new("web7");
    assert_eq!(get(&w.auth(&m).await, "enc").and_then(as_str), Some("pub"));
    let mut d = Minion::new("db7");
    assert_eq!(get(&d.auth(&m).await, "ret"), Some(&Value::Boolean(true)));
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_requests_check_session_id_tok_nonce_and_time() {
    let m = TestMaster::start("auto_accept: True\n").await;
    std::fs::create_dir_all(m.dir.path().join("pillar")).unwrap();
    std::fs::write(
        m.dir.path().join("pillar/top.sls"),
        "base:\n  'm-*':\n    - data\n",
    )
    .unwrap();
    std::fs::write(m.dir.path().join("pillar/data.sls"), "colour: blue\n").unwrap();
    let mut a = Minion::new("m-aes");
    a.auth(&m).await;

    // The good path: _minion_event → {} under the session key with our nonce.
    let n = nonce();
    let r = a.aes(&m, vec![("cmd", text("_minion_event"))], &n).await;
    assert_eq!(a.open(&r, &n), Value::Map(vec![]));
    // Unknown commands: Salt's False.
    let n = nonce();
    let r = a.aes(&m, vec![("cmd", text("_no_such_thing"))], &n).await;
    assert_eq!(a.open(&r, &n), Value::Boolean(false));

    // _pillar: Salt's send_private shape, signed, with our nonce inside.
    let n = nonce();
    let r = a
        .aes(&m, vec![("cmd", text("_pillar")), ("ver", text("2"))], &n)
        .await;
    let k = a
        .key
        .decrypt(
            EncAlgo::OaepSha1,
            as_bytes(get(&r, "key").unwrap()).unwrap(),
        )
        .unwrap();
    let mut pc =
        Crypticle::new(CrypticleKey::from_key_string(std::str::from_utf8(&k).unwrap()).unwrap());
    let signed = pc
        .loads(as_bytes(get(&r, "pillar").unwrap()).unwrap(), None)
        .unwrap();
    let data = as_bytes(get(&signed, "data").unwrap()).unwrap();
    assert!(master_pub(&m.pki()).verify(
        SigAlgo::Pkcs1v15Sha1,
        data,
        as_bytes(get(&signed, "sig").unwrap()).unwrap()
    ));
    let data = envelope::decode(data).unwrap();
    assert_eq!(get(&data, "nonce").and_then(as_str), Some(n.as_str()));
    assert_eq!(
        get(get(&data, "pillar").unwrap(), "colour").and_then(as_str),
        Some("blue")
    );

    // Replay of the same nonce.
    let body = a.aes_body(vec![("cmd", text("_minion_event"))], &nonce(), &a.id);
    assert!(as_bytes(&request(m.bound.ret, body.clone()).await).is_some());
    assert_eq!(
        request(m.bound.ret, body).await,
        bad_load(),
        "replay accepted"
    );

    // Stale and future timestamps.
    for ts in [now() - 3600, now() + 3600] {
        let r = a
            .aes(
                &m,
                vec![("cmd", text("_minion_event")), ("ts", Value::from(ts))],
                &nonce(),
            )
            .await;
        assert_eq!(r, bad_load(), "ts {ts}");
    }
    // No tok; a tok made with another key; a tok of other bytes.
    let other = Minion::new("m-aes");
    let wrong = other.tok();
    let not_salt = a.key.private_encrypt_x931(b"pepper").unwrap();
    for tok in [Value::Nil, envelope::bin(&wrong), envelope::bin(&not_salt)] {
        let r = a
            .aes(
                &m,
                vec![("cmd", text("_minion_event")), ("tok", tok)],
                &nonce(),
            )
            .await;
        assert_eq!(r, bad_load());
    }
    // Missing or malformed nonce.
    for bad in ["", "short", "zz"] {
        let body = a.aes_body(vec![("cmd", text("_minion_event"))], bad, &a.id);
        assert_eq!(
            request(m.bound.ret, body).await,
            bad_load(),
            "nonce {bad:?}"
        );
    }
    // Envelope id differs from the load id; an id with no session; garbage ciphertext.
    let r = a
        .aes(
            &m,
            vec![("cmd", text("_minion_event")), ("id", text("m-other"))],
            &nonce(),
        )
        .await;
    assert_eq!(r, bad_load(), "a load naming another id");
    let body = a.aes_body(vec![("cmd", text("_minion_event"))], &nonce(), "m-other");
    assert_eq!(request(m.bound.ret, body).await, bad_load());
    let body = RequestEnvelope::aes("m-nobody", &[0u8; 96]).encode();
    assert_eq!(request(m.bound.ret, body).await, bad_load());
    let body = RequestEnvelope::aes("m-aes", &[7u8; 96]).encode();
    assert_eq!(request(m.bound.ret, body).await, bad_load());

    // Deleting the key ends the minion's access at once (tok is checked against the disk).
    m.keys().delete("m-aes").unwrap();
    let r = a
        .aes(&m, vec![("cmd", text("_minion_event"))], &nonce())
        .await;
    assert_eq!(r, bad_load());
    assert_eq!(
        m.refusals().await,
        counts(&[
            ("request/replayed", 1),
            ("request/stale", 2),
            ("request/bad_tok", 3),
            ("request/bad_nonce", 3),
            ("request/id_mismatch", 1),
            // an envelope id without a session (m-other, m-nobody)
            ("request/no_session", 2),
            ("request/undecryptable", 1),
            ("request/not_accepted", 1),
        ])
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_are_stored_only_for_known_jobs() {
    let m = TestMaster::start("auto_accept: True\n").await;
    let mut a = Minion::new("m-ret");
    a.auth(&m).await;
    let cache = saltgate_master::jobs::JobCache::new(&m.dir.path().join("cache"));
    let jid = saltgate_master::jobs::jid_at(std::time::SystemTime::now());
    cache
        .save_load(
            &jid,
            &serde_json::json!({"fun": "test.ping", "minions": ["m-ret"]}),
        )
        .unwrap();
    for (j, _) in [
        (jid.as_str(), true),
        ("20000101000000000000", false),
        ("../../x", false),
    ] {
        let n = nonce();
        let r = a
            .aes(
                &m,
                vec![
                    ("cmd", text("_return")),
                    ("jid", text(j)),
                    ("return", Value::Boolean(true)),
                    ("fun", text("test.ping")),
                ],
                &n,
            )
            .await;
        assert_eq!(a.open(&r, &n), Value::Nil);
    }
    assert_eq!(cache.list().unwrap(), vec![jid.clone()]);
    assert_eq!(
        cache.show(&jid).unwrap()["returns"]["m-ret"]["return"],
        serde_json::json!(true)
    );
    assert_eq!(m.refusals().await, counts(&[("request/unknown_job", 2)]));
    m.stop().await;
}

/// A ZMTP 3.0 NULL greeting and READY as `socket_type`, written raw (so a test can then send
/// what no well-behaved peer would).
async fn zmtp_hello(addr: SocketAddr, socket_type: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    greeting.extend_from_slice(b"NULL");
    greeting.resize(64, 0);
    s.write_all(&greeting).await.unwrap();
    let mut ready = b"\x05READY".to_vec();
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type.as_bytes());
    s.write_all(&[0x04, ready.len() as u8]).await.unwrap();
    s.write_all(&ready).await.unwrap();
    s
}

/// True once the master closes `s` (reads EOF or an error), false after 10 s.
async fn closed_by_peer(s: &mut tokio::net::TcpStream) -> bool {
    let mut buf = vec![0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// A long frame header announcing 1 TiB.
fn huge_frame_header() -> Vec<u8> {
    let mut hdr = vec![0x02];
    hdr.extend_from_slice(&(1u64 << 40).to_be_bytes());
    hdr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_close_the_connection_before_allocation() {
    let m = TestMaster::start("").await;
    let mut s = zmtp_hello(m.bound.ret, "REQ").await;
    s.write_all(&huge_frame_header()).await.unwrap();
    assert!(
        closed_by_peer(&mut s).await,
        "the master kept a connection that announced a 1 TiB frame"
    );
    // The same on the publish port, from a subscriber.
    let mut s = zmtp_hello(m.bound.publish, "SUB").await;
    s.write_all(&huge_frame_header()).await.unwrap();
    assert!(
        closed_by_peer(&mut s).await,
        "publish port kept a 1 TiB frame"
    );
    // Not ZMTP at all.
    let mut s = tokio::net::TcpStream::connect(m.bound.ret).await.unwrap();
    s.write_all(&[b'G'; 64]).await.unwrap();
    assert!(closed_by_peer(&mut s).await, "a non-ZMTP peer was kept");
    // A message without the REQ envelope (one frame, no empty delimiter): ignored, counted.
    let mut s = zmtp_hello(m.bound.ret, "DEALER").await;
    s.write_all(&[0x00, 4, b'p', b'i', b'n', b'g'])
        .await
        .unwrap();
    // And it still serves others.
    let pong = request(m.bound.ret, RequestEnvelope::ping().encode()).await;
    assert_eq!(get(&pong, "cmd").and_then(as_str), Some("ping"));
    let want = counts(&[
        ("request/oversized", 1),
        ("publish/oversized", 1),
        ("request/zmtp_protocol", 1),
        ("request/not_req", 1),
    ]);
    // Counted as each connection ends (asynchronously): wait for the counters to get there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = m.refusals().await;
    while got != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        got = m.refusals().await;
    }
    assert_eq!(got, want);
    // The endpoint serves GET /metrics and nothing else.
    let ep = m.bound.metrics.unwrap();
    assert!(common::http_status(ep, "GET", "/").await.contains(" 404 "));
    assert!(common::http_status(ep, "POST", "/metrics")
        .await
        .contains(" 405 "));
    drop(s);
    m.stop().await;
}

/// Concurrent publishes reach a subscriber in `serial` order, so a minion's replay guard (a
/// serial not above the last one seen is dropped) never drops one of them. Before the fix
/// serials were taken in one order and queued in another: of three jobs published at once, one
/// reached no minion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_reach_minions_in_serial_order() {
    let m = TestMaster::start("auto_accept: True\n").await;
    let mut minion = Minion::new("order");
    let inner = minion.auth(&m).await;
    let aes = minion
        .key
        .decrypt(
            EncAlgo::OaepSha1,
            as_bytes(get(&inner, "aes").expect("aes")).unwrap(),
        )
        .unwrap();
    let aes = CrypticleKey::from_key_string(std::str::from_utf8(&aes).unwrap()).unwrap();
    let mut sub = saltgate_wire::zmtp::Subscriber::connect(
        m.bound.publish,
        saltgate_wire::zmtp::SubOptions::default(),
    );
    sub.subscribe(Bytes::new());
    assert!(sub.wait_connects(1, Duration::from_secs(10)).await);
    let publish = |tgt: &str| {
        let sock = m.bound.cli_socket.clone();
        let req = serde_json::json!({"tgt": tgt, "fun": "test.ping", "timeout_secs": 1});
        async move { saltgate_master::cli::publish(&sock, &req).await.unwrap() }
    };
    // The subscription is in place once a probe arrives.
    loop {
        publish("probe").await;
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(2), sub.recv()).await {
            break;
        }
    }
    let mut guard = Crypticle::new(aes);
    const JOBS: usize = 16;
    let jobs: Vec<_> = (0..JOBS).map(|_| tokio::spawn(publish("nobody"))).collect();
    for j in jobs {
        j.await.unwrap();
    }
    for n in 0..JOBS {
        let frames = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .unwrap_or_else(|_| panic!("publish {n} of {JOBS} never arrived"))
            .unwrap();
        let env = envelope::PublishEnvelope::decode(frames.last().unwrap()).unwrap();
        if let Err(e) = guard.loads(&env.load, None) {
            panic!("publish {n} of {JOBS} refused by the minion's replay guard: {e}");
        }
    }
    m.stop().await;
}
