//! Two saltgate-masters in one cluster (127.0.1.40 and .41, shared cluster_pki_dir and
//! cachedir): a minion authenticated on B is accepted through the shared keys, answers a job
//! published through A's CLI (A forwards the publish to B, B forwards the return to A), and sees
//! the cluster key. Joins with a wrong secret or an unsafe peer id are refused, and so is a join
//! reply changed in transit (signature, proof) or replayed (127.0.1.43-.45).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::salt_master::{parse_salt_master, SaltMasterConfig};
use saltgate_master::cluster::{self, ClusterState};
use saltgate_master::keys::{same_key, MasterKey};
use saltgate_master::state::Master;
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, as_bytes, as_str, get, map, text, RequestEnvelope, Value};
use saltgate_wire::rsa::{EncAlgo, PrivateKey, PublicKey};
use saltgate_wire::zmtp::{ReqOptions, ReqSocket, SubOptions, Subscriber};

mod common;
use common::openssl_pem;

fn config(root: &Path, name: &str, ip: &str, peers: &str, secret: &str) -> SaltMasterConfig {
    let d = root.display();
    std::fs::create_dir_all(root.join(name).join("pki")).unwrap();
    std::fs::write(root.join(name).join("pki/master.pem"), openssl_pem()).unwrap();
    let text = format!(
        "id: {name}\ninterface: {ip}\npublish_port: 0\nret_port: 0\npki_dir: {d}/{name}/pki\n\
         cachedir: {d}/shared/cache\nsock_dir: {d}/{name}/sock\nauto_accept: True\n\
         cluster_id: c1\ncluster_peers: [{peers}]\ncluster_pki_dir: {d}/shared/cpki\n\
         cluster_pool_port: 0\ncluster_secret: {secret}\nsaltgate_metrics_bind: {ip}:0\n"
    );
    parse_salt_master(&text, None).unwrap().config
}

/// A temporary root whose `shared/cpki` holds the cluster key (the shared cluster_pki_dir).
fn cluster_root(prefix: &str) -> tempfile::TempDir {
    let root = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::create_dir_all(root.path().join("shared/cpki")).unwrap();
    std::fs::write(root.path().join("shared/cpki/cluster.pem"), openssl_pem()).unwrap();
    root
}

/// A cluster member that is not served, calling itself `peer_id`: it only joins (tests call
/// `cluster::join` with it).
fn joiner(cfg: SaltMasterConfig, peer_id: &str, pool: &str) -> Master {
    let own = MasterKey::load_or_create(&cfg.pki_dir, "master").unwrap();
    let st = ClusterState::new(
        cfg.cluster.clone().unwrap(),
        peer_id,
        own.clone(),
        pool.parse().unwrap(),
    );
    Master::builder(cfg, own.clone(), 0, None)
        .with_cluster(own, CrypticleKey::generate(), st)
        .build()
}

async fn start(config: SaltMasterConfig) -> common::InProcess {
    common::InProcess::start(config).await
}

async fn request(addr: SocketAddr, body: Vec<u8>) -> Value {
    let mut req = ReqSocket::new(addr, ReqOptions::default());
    let r = req
        .request(vec![Bytes::from(body)], Duration::from_secs(30))
        .await
        .expect("reply");
    envelope::decode(&r[0]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_published_on_one_master_is_answered_through_another() {
    let root = cluster_root("sgcl");
    // A's configured peer is unreachable; B joins A and A learns B from the join.
    let a = start(config(
        root.path(),
        "ma",
        "127.0.1.40",
        "127.0.1.41:1",
        "s3cret",
    ))
    .await;
    let a_pool = a.bound.cluster.expect("cluster port");
    let b = start(config(
        root.path(),
        "mb",
        "127.0.1.41",
        &a_pool.to_string(),
        "s3cret",
    ))
    .await;

    // A Rust minion authenticates with B.
    let key = PrivateKey::from_pem(&String::from_utf8(openssl_pem()).unwrap()).unwrap();
    let id = "m-cluster";
    let nonce = format!("{:032x}", rand::random::<u128>());
    let auth = RequestEnvelope::clear(map(vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text(&nonce)),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text(&key.public_key().to_clean_pem().unwrap())),
    ]));
    let reply = request(b.bound.ret, auth.encode()).await;
    let inner = envelope::decode(as_bytes(get(&reply, "load").unwrap()).unwrap()).unwrap();
    // Minions see the cluster key, not B's own.
    let cluster_pub = std::fs::read_to_string(root.path().join("shared/cpki/cluster.pub")).unwrap();
    assert!(same_key(
        get(&inner, "pub_key").and_then(as_str).unwrap(),
        &cluster_pub
    ));
    let cpub = PublicKey::from_pem(&cluster_pub).unwrap();
    assert!(cpub.verify(
        saltgate_wire::rsa::SigAlgo::Pkcs1v15Sha1,
        as_bytes(get(&reply, "load").unwrap()).unwrap(),
        as_bytes(get(&reply, "sig").unwrap()).unwrap()
    ));
    let dec = |k: &str| {
        let b = key
            .decrypt(
                EncAlgo::OaepSha1,
                as_bytes(get(&inner, k).unwrap()).unwrap(),
            )
            .unwrap();
        CrypticleKey::from_key_string(std::str::from_utf8(&b).unwrap()).unwrap()
    };
    let (aes, session) = (dec("aes"), dec("session"));
    // The key was stored once, in the cluster PKI dir, so A knows the minion too.
    assert!(root.path().join("shared/cpki/minions").join(id).exists());
    assert!(!root.path().join("mb/pki/minions").join(id).exists());

    let mut sub = Subscriber::connect(b.bound.publish, SubOptions::default());
    sub.subscribe(Bytes::new());
    assert!(sub.wait_connects(1, Duration::from_secs(10)).await);

    let sock = a.bound.cli_socket.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no cluster round trip within 60 s"
        );
        let s = sock.clone();
        let cli = tokio::spawn(async move {
            let req = serde_json::json!({"tgt": "m-*", "fun": "test.ping", "timeout_secs": 5});
            saltgate_master::cli::publish(&s, &req).await
        });
        // The job reaches B's publish port (forwarded by A).
        let Ok(Some(frames)) = tokio::time::timeout(Duration::from_secs(5), sub.recv()).await
        else {
            let _ = cli.await;
            continue; // B had not joined yet
        };
        let publish = envelope::PublishEnvelope::decode(&frames[0]).unwrap();
        assert!(cpub.verify(
            saltgate_wire::rsa::SigAlgo::Pkcs1v15Sha1,
            &publish.load,
            publish.sig.as_deref().unwrap()
        ));
        let job = Crypticle::new(aes.clone())
            .loads(&publish.load, None)
            .unwrap();
        assert_eq!(
            get(&job, "serial"),
            None,
            "cluster publishes carry no serial"
        );
        let jid = get(&job, "jid").and_then(as_str).unwrap().to_string();
        // The minion returns to B; B forwards the return to A, whose CLI waits.
        let rn = format!("{:032x}", rand::random::<u128>());
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let load = envelope::salt_compat(map(vec![
            ("cmd", text("_return")),
            ("id", text(id)),
            ("jid", text(&jid)),
            ("fun", text("test.ping")),
            ("return", Value::Boolean(true)),
            ("retcode", Value::from(0)),
            ("nonce", text(&rn)),
            ("ts", Value::from(ts)),
            (
                "tok",
                envelope::bin(&key.private_encrypt_x931(b"salt").unwrap()),
            ),
        ]));
        let ct = Crypticle::new(session.clone()).dumps(&load, None);
        let r = request(b.bound.ret, RequestEnvelope::aes(id, &ct).encode()).await;
        assert!(as_bytes(&r).is_some(), "B refused the return: {r}");
        break cli.await.unwrap().expect("publish through A");
    };
    assert_eq!(outcome.expected, vec![id.to_string()]);
    assert_eq!(outcome.returns.len(), 1, "{outcome:?}");
    assert_eq!(outcome.returns[0].record["return"], serde_json::json!(true));
    assert!(outcome.missing.is_empty());
    // Both masters' own keys are registered as peers.
    for m in ["ma", "mb"] {
        assert!(root
            .path()
            .join("shared/cpki/peers")
            .join(format!("{m}.pub"))
            .exists());
    }

    // Joins that must be refused: a wrong secret, an unsafe peer id.
    // (The same code path with the right secret and a safe id is the positive control.)
    for (secret, peer_id, ok) in [
        ("wrong", "intruder", false),
        ("s3cret", "../evil", false),
        ("s3cret", "legit", true),
    ] {
        let cfg = config(root.path(), "intr", "127.0.1.42", "127.0.1.40:1", secret);
        let m = joiner(cfg, peer_id, "127.0.1.42:9");
        let r = cluster::join(m.cluster.as_deref().unwrap(), a_pool).await;
        assert_eq!(r.is_ok(), ok, "{peer_id} with {secret}: {r:?}");
        if let Ok(j) = r {
            // A names its other member, B, so a joiner that knows only A joins B too.
            let b_pool = b.bound.cluster.expect("B's cluster port");
            assert_eq!(j.members, vec![b_pool], "members named by A");
        }
        assert!(!root.path().join("shared/cpki/peers/intruder.pub").exists());
        assert!(!root.path().join("shared/evil.pub").exists());
        assert!(!root.path().join("shared/cpki/evil.pub").exists());
    }
    assert!(root.path().join("shared/cpki/peers/legit.pub").exists());
    // A counted both refused joins (the unsafe id's too: it is classed by its kind).
    let counted = common::refusals(a.bound.metrics.expect("A's metrics endpoint")).await;
    assert_eq!(counted, common::counts(&[("cluster/peer_join", 2)]));
    drop(sub);
    drop(a);
    drop(b);
}

/// How the man in the middle below changes A's `join_ok` on its way to the joiner.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Passed on as it is (the positive control).
    None,
    /// One bit of the RSA signature flipped: the body and its proof are A's own.
    Signature,
    /// One bit of the body's `proof` flipped (and the body re-sealed with nothing else changed):
    /// what a peer that does not know the `cluster_secret` would send.
    Proof,
    /// A's genuine answer to an earlier join, sent again.
    Replay,
}

/// Relays one join from a joiner to `peer` and its answer back, changed as `tamper` says;
/// `earlier` is a genuine answer kept from a previous join (for [`Tamper::Replay`]).
async fn relay_one_join(
    listener: &tokio::net::TcpListener,
    peer: SocketAddr,
    tamper: Tamper,
    earlier: &mut Option<Vec<u8>>,
) {
    use saltgate_master::peerlink::{read_frame_idle, write_frame};
    let (mut joiner, _) = listener.accept().await.unwrap();
    let join = read_frame_idle(&mut joiner).await.unwrap().expect("a join");
    let mut up = tokio::net::TcpStream::connect(peer).await.unwrap();
    write_frame(&mut up, &join).await.unwrap();
    let reply = read_frame_idle(&mut up).await.unwrap().expect("join_ok");
    let flip = |field: &str, v: &Value| -> Value {
        let Value::Map(m) = v else {
            panic!("not a map")
        };
        Value::Map(
            m.iter()
                .map(|(k, x)| {
                    let x = if as_str(k) == Some(field) {
                        let mut b = as_bytes(x).unwrap().to_vec();
                        b[0] ^= 1;
                        Value::Binary(b)
                    } else {
                        x.clone()
                    };
                    (k.clone(), x)
                })
                .collect(),
        )
    };
    let sent = match tamper {
        Tamper::None => reply.clone(),
        Tamper::Signature => envelope::encode(&flip("sig", &envelope::decode(&reply).unwrap())),
        Tamper::Proof => {
            let outer = envelope::decode(&reply).unwrap();
            let body = envelope::decode(as_bytes(get(&outer, "body").unwrap()).unwrap()).unwrap();
            let body = envelope::encode(&flip("proof", &body));
            let Value::Map(m) = outer else { panic!() };
            envelope::encode(&Value::Map(
                m.into_iter()
                    .map(|(k, x)| match as_str(&k) {
                        Some("body") => (k, Value::Binary(body.clone())),
                        _ => (k, x),
                    })
                    .collect(),
            ))
        }
        Tamper::Replay => earlier.clone().expect("an earlier join_ok"),
    };
    *earlier = Some(reply);
    write_frame(&mut joiner, &sent).await.unwrap();
}

/// Safer than Salt 3008.5, which does not verify the join reply: the joiner checks A's
/// `join_ok` (signature, proof of the secret, the nonce of this join) and adds A only when all
/// hold. Each check is shown alone by a man in the middle that changes one thing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_reply_changed_in_transit_or_replayed_is_refused() {
    let root = cluster_root("sgjr");
    let a = start(config(
        root.path(),
        "ma",
        "127.0.1.43",
        "127.0.1.44:1",
        "s3cret",
    ))
    .await;
    let a_pool = a.bound.cluster.expect("cluster port");
    let mitm = tokio::net::TcpListener::bind("127.0.1.45:0").await.unwrap();
    let mitm_addr = mitm.local_addr().unwrap();
    let mut earlier = None;
    for (n, (tamper, refusal)) in [
        (Tamper::None, None),
        (Tamper::Signature, Some("signature does not verify")),
        (Tamper::Proof, Some("does not know the cluster_secret")),
        (Tamper::Replay, Some("does not answer our join")),
    ]
    .into_iter()
    .enumerate()
    {
        let cfg = config(root.path(), "mj", "127.0.1.44", "127.0.1.43:1", "s3cret");
        let m = joiner(cfg, &format!("joiner{n}"), "127.0.1.44:9");
        let (r, ()) = tokio::join!(
            cluster::join(m.cluster.as_deref().unwrap(), mitm_addr),
            relay_one_join(&mitm, a_pool, tamper, &mut earlier)
        );
        let joined = m.cluster.as_ref().unwrap().joined();
        match refusal {
            None => {
                assert!(r.is_ok(), "{tamper:?}: {r:?}");
                assert_eq!(joined.get("ma"), Some(&a_pool), "{tamper:?}");
            }
            Some(why) => {
                let e = r.expect_err(&format!("{tamper:?} must be refused"));
                assert!(e.contains(why), "{tamper:?}: {e}");
                assert!(joined.is_empty(), "{tamper:?}: {joined:?}");
            }
        }
    }
    drop(a);
}
