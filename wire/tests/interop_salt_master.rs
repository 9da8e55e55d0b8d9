//! Against a real `salt-master` 3008.5 started here on 127.0.0.61 (loopback only), with its
//! ZMTP heartbeats shortened to 500 ms / 1500 ms so that "stays connected past the drop time"
//! takes seconds instead of Salt's 10 s / 30 s (drop at ~40 s). The master runs in its own
//! process group in a temp dir and is killed by a guard whatever the test outcome.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{python, ProcGuard};
use saltgate_wire::envelope::{self, map, text, Reply, RequestEnvelope};
use saltgate_wire::probe::{self, ProbeError};
use saltgate_wire::zmtp::{
    Command as ZCommand, Connection, Frame, HandshakeConfig, ReqOptions, ReqSocket, SocketType,
    SubOptions, Subscriber, ZmtpError,
};

const IP: &str = "127.0.0.61";
const HB_IVL_MS: u64 = 500;
const HB_TIMEOUT_MS: u64 = 1500;

fn free_port() -> u16 {
    let l = TcpListener::bind((IP, 0)).expect("bind probe port on 127.0.0.61");
    l.local_addr().expect("addr").port()
}

fn write_config(dir: &Path, pub_port: u16, ret_port: u16, extra: &str) {
    let d = dir.display();
    let conf = format!(
        "id: saltgate-wire-test\n\
         interface: {IP}\n\
         publish_port: {pub_port}\n\
         ret_port: {ret_port}\n\
         user: root\n\
         pki_dir: {d}/pki\n\
         cachedir: {d}/cache\n\
         sock_dir: {d}/sock\n\
         sqlite_queue_dir: {d}/queues\n\
         pidfile: {d}/master.pid\n\
         log_file: {d}/master.log\n\
         key_logfile: {d}/key.log\n\
         log_level_logfile: info\n\
         max_open_files: 16384\n\
         worker_threads: 2\n\
         zmq_heartbeat_ivl: {HB_IVL_MS}\n\
         zmq_heartbeat_timeout: {HB_TIMEOUT_MS}\n\
         file_roots: {{base: [{d}/srv/salt]}}\n\
         pillar_roots: {{base: [{d}/srv/pillar]}}\n\
         {extra}"
    );
    std::fs::create_dir_all(dir.join("conf")).expect("conf dir");
    std::fs::write(dir.join("conf/master"), conf).expect("write master config");
}

fn start_master(dir: &Path) -> ProcGuard {
    let salt_master = python().with_file_name("salt-master");
    let mut cmd = Command::new(salt_master);
    cmd.arg("-c")
        .arg(dir.join("conf"))
        .args(["-l", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            std::fs::File::create(dir.join("stdout.log")).expect("stdout log"),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("stderr.log")).expect("stderr log"),
        ));
    ProcGuard::spawn("salt-master", cmd)
}

fn logs(dir: &Path) -> String {
    let mut s = String::new();
    for f in ["stderr.log", "master.log"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        s.push_str(&format!(
            "--- {f} (last lines, newest first)\n{}\n",
            tail.join("\n")
        ));
    }
    s
}

/// Waits until the request port answers the clear ping.
async fn wait_ready(req: SocketAddr, master: &mut ProcGuard, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match probe::salt_ping(req, Duration::from_secs(2)).await {
            Ok(_) => return,
            Err(e) => {
                if let Ok(Some(status)) = master.child.try_wait() {
                    panic!("salt-master exited early ({status}): {e}\n{}", logs(dir));
                }
                if Instant::now() > deadline {
                    panic!("salt-master request port not ready: {e}\n{}", logs(dir));
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_salt_master_answers_probes_req_ping_and_keeps_our_sockets_connected() {
    let dir = tempfile::Builder::new()
        .prefix("sgw")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let (pub_port, ret_port) = (free_port(), free_port());
    write_config(dir.path(), pub_port, ret_port, "");
    let mut master = start_master(dir.path());
    let pub_addr: SocketAddr = format!("{IP}:{pub_port}").parse().unwrap();
    let req_addr: SocketAddr = format!("{IP}:{ret_port}").parse().unwrap();
    wait_ready(req_addr, &mut master, dir.path()).await;

    // 1. The greeting probe sees ZMTP 3.1 NULL on both ports.
    for addr in [pub_addr, req_addr] {
        let g = probe::zmtp_greeting(addr, Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("greeting probe on {addr}: {e}"));
        assert_eq!((g.major, g.minor, g.mechanism.as_str()), (3, 1, "NULL"));
    }

    // 2. The ping probe gets the echoed load.
    let pong = probe::salt_ping(req_addr, Duration::from_secs(5))
        .await
        .expect("salt_ping");
    let Reply::Plain(load) = &pong.reply else {
        panic!("unexpected ping reply {:?}", pong.reply);
    };
    assert_eq!(
        envelope::get(load, "cmd").and_then(envelope::as_str),
        Some("ping")
    );

    // 3. Our REQ: a clear ping, then an old-version envelope the master refuses with "bad load",
    //    then -- after idling past the heartbeat timeout -- another ping on the same connection.
    let mut req = ReqSocket::new(req_addr, ReqOptions::default());
    let reply = req
        .request(
            vec![Bytes::from(RequestEnvelope::ping().encode())],
            Duration::from_secs(10),
        )
        .await
        .expect("REQ ping");
    let reply = Reply::decode(&reply[0]).expect("msgpack reply");
    assert!(
        matches!(&reply, Reply::Plain(v) if envelope::get(v, "cmd").is_some()),
        "{reply:?}"
    );
    let mut old = RequestEnvelope::clear(map(vec![("cmd", text("ping"))]));
    old.version = Some(2);
    let reply = req
        .request(vec![Bytes::from(old.encode())], Duration::from_secs(10))
        .await
        .expect("REQ v2");
    assert_eq!(
        Reply::decode(&reply[0]).unwrap(),
        Reply::Text("bad load".into())
    );

    // 4. Our SUB on the publish port answers the master's PINGs and stays connected well past
    //    the point where a silent peer is dropped (ivl + timeout = 2 s here, 40 s with defaults).
    let mut sub_opts = SubOptions::default();
    sub_opts.reconnect.recon_default = Duration::from_millis(100);
    sub_opts.reconnect.recon_max = Duration::from_millis(100);
    let sub = Subscriber::connect(pub_addr, sub_opts);
    sub.subscribe(Bytes::new());
    assert!(sub.wait_connects(1, Duration::from_secs(10)).await);

    // Negative control: a SUB that never answers PING is dropped by the master.
    let silent_dropped_after = silent_sub_is_dropped(pub_addr).await;
    assert!(
        silent_dropped_after < Duration::from_millis(4 * (HB_IVL_MS + HB_TIMEOUT_MS)),
        "silent SUB dropped only after {silent_dropped_after:?}"
    );

    // Two more silent SUBs are dropped, one after the other: our SUB lives through at least two
    // more of the master's heartbeat timeouts, measured on the master's own clock.
    for _ in 0..2 {
        silent_sub_is_dropped(pub_addr).await;
    }
    assert!(sub.is_connected(), "our SUB was dropped");
    assert_eq!(sub.connect_count(), 1, "our SUB had to reconnect");

    // The REQ connection idled through several PING rounds and still works without a re-dial.
    let reply = req
        .request(
            vec![Bytes::from(RequestEnvelope::ping().encode())],
            Duration::from_secs(10),
        )
        .await
        .expect("REQ ping after idling");
    assert!(matches!(Reply::decode(&reply[0]).unwrap(), Reply::Plain(_)));
    assert_eq!(req.dial_count(), 1, "REQ connection was lost while idle");

    drop(sub);
    drop(req);
    drop(master);
}

/// Handshakes as SUB, answers nothing, and returns how long until the master closes us.
/// Also checks that what the master sends first is a ZMTP 3.1 PING command.
async fn silent_sub_is_dropped(addr: SocketAddr) -> Duration {
    let mut conn = Connection::connect(addr, &HandshakeConfig::new(SocketType::Sub))
        .await
        .expect("silent sub connect");
    let start = Instant::now();
    let mut saw_ping = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), conn.read_frame()).await {
            Err(_) => panic!("master never dropped a silent SUB"),
            Ok(Ok(Frame::Command(body))) => {
                if matches!(ZCommand::parse(&body), Ok(ZCommand::Ping { .. })) {
                    saw_ping = true;
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(ZmtpError::Eof)) | Ok(Err(ZmtpError::Io(_))) => break,
            Ok(Err(e)) => panic!("unexpected error from master: {e}"),
        }
    }
    assert!(saw_ping, "master closed us without PINGing first");
    start.elapsed()
}

#[tokio::test]
async fn ping_probe_on_a_closed_port_is_a_connect_error_not_not_ready() {
    let port = free_port();
    let addr: SocketAddr = format!("{IP}:{port}").parse().unwrap();
    let err = probe::salt_ping(addr, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(matches!(err, ProbeError::Connect(_)), "{err}");
    assert!(!err.is_not_ready());
}

/// A Rust "minion" authenticates with a real master (`auto_accept: True`), makes a v3 `aes`
/// request and decrypts a real publish. This exercises, against Salt's own code: the `_auth`
/// envelope, OAEP-SHA1 decryption of the `aes` and `session` keys, the master's PKCS#1 v1.5
/// signature over the load, its X9.31 `sig` of the AES key digest, our X9.31 `tok` (the master
/// verifies it against the key it stored), Crypticle with the session key and nonce on the
/// reply, and the publish envelope with its signature and `serial`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_minion_authenticates_makes_an_aes_request_and_decrypts_a_real_publish() {
    use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
    use saltgate_wire::rsa::{EncAlgo, PrivateKey, PublicKey, SigAlgo};
    use sha2::{Digest, Sha256};

    let dir = tempfile::Builder::new()
        .prefix("sgw")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let (pub_port, ret_port) = (free_port(), free_port());
    write_config(dir.path(), pub_port, ret_port, "auto_accept: True\n");
    let mut master = start_master(dir.path());
    let req_addr: SocketAddr = format!("{IP}:{ret_port}").parse().unwrap();
    let key = tokio::task::spawn_blocking(|| PrivateKey::generate(2048).expect("keygen"));
    wait_ready(req_addr, &mut master, dir.path()).await;
    let key = key.await.unwrap();
    let id = "rust-minion";
    let nonce = |n: u128| format!("{n:032x}");
    let auth_nonce = nonce(rand::random());

    let mut req = ReqSocket::new(req_addr, ReqOptions::default());
    let auth = RequestEnvelope::clear(map(vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text(&auth_nonce)),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text(&key.public_key().to_clean_pem().unwrap())),
    ]));
    let reply = req
        .request(vec![Bytes::from(auth.encode())], Duration::from_secs(30))
        .await
        .expect("_auth reply");
    let Reply::Envelope { enc, load, sig } = Reply::decode(&reply[0]).unwrap() else {
        panic!("unexpected _auth reply");
    };
    assert_eq!(enc, "clear");
    let load_bytes = envelope::as_bytes(&load).expect("load is bytes").to_vec();
    let inner = envelope::decode(&load_bytes).expect("inner msgpack");
    let field = |k: &str| envelope::get(&inner, k).unwrap_or_else(|| panic!("no {k} in {inner}"));
    assert_eq!(envelope::as_str(field("enc")), Some("pub"), "{inner}");
    assert_eq!(envelope::as_str(field("nonce")), Some(auth_nonce.as_str()));
    let master_pub = PublicKey::from_pem(envelope::as_str(field("pub_key")).unwrap()).unwrap();
    assert!(
        master_pub.verify(SigAlgo::Pkcs1v15Sha1, &load_bytes, &sig.expect("sig")),
        "master signature over the auth load does not verify"
    );
    let aes = key
        .decrypt(EncAlgo::OaepSha1, envelope::as_bytes(field("aes")).unwrap())
        .expect("OAEP aes");
    let aes = String::from_utf8(aes).expect("key string");
    CrypticleKey::from_key_string(&aes).expect("publish key");
    let digest: String = Sha256::digest(aes.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let x931 = master_pub
        .public_decrypt_x931(envelope::as_bytes(field("sig")).unwrap())
        .expect("X9.31 sig");
    assert_eq!(x931, digest.as_bytes());
    let session = key
        .decrypt(
            EncAlgo::OaepSha1,
            envelope::as_bytes(field("session")).unwrap(),
        )
        .expect("OAEP session");
    let mut session = Crypticle::new(
        CrypticleKey::from_key_string(&String::from_utf8(session).unwrap()).unwrap(),
    );

    // A v3 AES request: the master pops the nonce, checks our X9.31 tok, answers under the
    // session key prefixed by our nonce.
    let req_nonce = nonce(rand::random());
    let tok = key.private_encrypt_x931(b"salt").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let aes_load = envelope::salt_compat(map(vec![
        ("cmd", text("_file_envs")),
        ("id", text(id)),
        ("nonce", text(&req_nonce)),
        ("ts", envelope::Value::from(now)),
        ("tok", envelope::bin(&tok)),
    ]));
    let ct = session.dumps(&aes_load, None);
    let reply = req
        .request(
            vec![Bytes::from(RequestEnvelope::aes(id, &ct).encode())],
            Duration::from_secs(30),
        )
        .await
        .expect("aes reply");
    let reply = Reply::decode(&reply[0]).unwrap();
    let Reply::Encrypted(ct) = reply else {
        panic!(
            "master refused the aes request: {reply:?}\n{}",
            logs(dir.path())
        );
    };
    let envs = session.loads(&ct, Some(&req_nonce)).expect("session reply");
    let envelope::Value::Array(envs) = envs else {
        panic!("_file_envs returned {envs}");
    };
    assert!(
        envs.iter().any(|e| envelope::as_str(e) == Some("base")),
        "{envs:?}"
    );

    // A real publish: `salt rust-minion test.ping` makes the master publish a job on 4505. Our
    // SUB receives the single-frame publish envelope; the master's signature over the
    // ciphertext verifies and the publish key from `_auth` decrypts it.
    let pub_addr: SocketAddr = format!("{IP}:{pub_port}").parse().unwrap();
    let mut sub = Subscriber::connect(pub_addr, SubOptions::default());
    sub.subscribe(Bytes::new());
    assert!(sub.wait_connects(1, Duration::from_secs(10)).await);
    let mut cli = Command::new(python().with_file_name("salt"));
    cli.arg("-c")
        .arg(dir.path().join("conf"))
        .args(["--timeout", "5", id, "test.ping"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let cli = ProcGuard::spawn("salt", cli);
    let frames = tokio::time::timeout(Duration::from_secs(60), sub.recv())
        .await
        .expect("a publish within 60 s")
        .expect("sub alive");
    assert_eq!(
        frames.len(),
        1,
        "zmq_filtering is off: one frame per publish"
    );
    let publish = envelope::PublishEnvelope::decode(&frames[0]).expect("publish envelope");
    assert_eq!(publish.enc, "aes");
    assert_eq!(publish.sig_algo.as_deref(), Some("PKCS1v15-SHA1"));
    assert!(master_pub.verify(
        SigAlgo::Pkcs1v15Sha1,
        &publish.load,
        publish
            .sig
            .as_deref()
            .expect("sign_pub_messages is on by default")
    ));
    let mut pub_crypticle = Crypticle::new(CrypticleKey::from_key_string(&aes).unwrap());
    let job = pub_crypticle
        .loads(&publish.load, None)
        .expect("decrypt publish");
    assert_eq!(
        envelope::get(&job, "fun").and_then(envelope::as_str),
        Some("test.ping")
    );
    assert_eq!(
        envelope::get(&job, "tgt").and_then(envelope::as_str),
        Some(id)
    );
    assert!(
        pub_crypticle.last_serial() > 0,
        "non-cluster publishes carry a serial"
    );
    drop(cli);
    drop(sub);
    drop(req);
    drop(master);
}

/// A 3008 cluster member that cannot reach its peer never becomes a Raft voter, so the real
/// master answers non-`_auth` requests with `cluster_retry`: the ping probe must say "not ready"
/// (not "down", not "refused"). The peer address is a loopback address nothing listens on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_probe_reports_not_ready_for_a_real_cluster_member_that_is_not_a_voter() {
    let dir = tempfile::Builder::new()
        .prefix("sgw")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let (pub_port, ret_port) = (free_port(), free_port());
    let d = dir.path().display();
    // 127.0.0.60 sorts below our interface, so we are a joiner waiting for a founder that never
    // answers.
    let extra = format!(
        "cluster_id: saltgate_wire_test\n\
         cluster_peers: [127.0.0.60]\n\
         cluster_pki_dir: {d}/cluster_pki\n\
         cluster_pool_port: {}\n\
         cluster_secret: not-a-real-secret\n",
        free_port()
    );
    write_config(dir.path(), pub_port, ret_port, &extra);
    let mut master = start_master(dir.path());
    let req_addr: SocketAddr = format!("{IP}:{ret_port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match probe::salt_ping(req_addr, Duration::from_secs(2)).await {
            Err(ProbeError::NotReady) => break,
            Ok(r) => panic!("a non-voter answered the ping: {r:?}\n{}", logs(dir.path())),
            Err(e) => {
                if let Ok(Some(status)) = master.child.try_wait() {
                    panic!(
                        "salt-master exited early ({status}): {e}\n{}",
                        logs(dir.path())
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "no cluster_retry within 120 s, last error: {e}\n{}",
                    logs(dir.path())
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    // The greeting probe still sees a live process: "not ready" is not "down".
    let g = probe::zmtp_greeting(req_addr, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!((g.major, g.minor), (3, 1));
    drop(master);
}
