//! The cluster's persistent peer links and MAC'd forwards (127.29.0.x): many returns over one
//! connection, a peer that restarts, and every refusal of a forwarded message (bad mac, unknown
//! peer, stale ts, replayed publish), with the RSA-signed form still accepted. The hello and the
//! acks (127.34.0.x): an old receiver served one frame per connection, frames a dying peer read
//! but never acknowledged sent again, an old sender served without hello or acks.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use saltgate_config::salt_master::parse_salt_master;
use saltgate_master::cluster::{self, open_message, Auth, ClusterState};
use saltgate_master::jobbook::ReturnEvent;
use saltgate_master::keys::MasterKey;
use saltgate_master::metrics::Refused;
use saltgate_master::peerlink::read_frame_idle;
use saltgate_master::peerserve::{self, PeerPort};
use saltgate_master::publish::PublishRequest;
use saltgate_master::server::build_master;
use saltgate_master::state::Master;
use saltgate_master::target::{Target, TargetType};
use saltgate_test_support::wait_until;
use saltgate_wire::envelope::{self, map, raw_str, text, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

mod common;
/// How long a condition of these tests may take.
const WAIT: Duration = Duration::from_secs(30);
use common::openssl_pem;

/// A cluster member without minion sockets: its state and its bound (unserved) peer port.
async fn member(root: &Path, name: &str, ip: &str, secret: &str) -> (Arc<Master>, TcpListener) {
    let d = root.display();
    std::fs::create_dir_all(root.join(name).join("pki")).unwrap();
    std::fs::write(root.join(name).join("pki/master.pem"), openssl_pem()).unwrap();
    let cpki = root.join("cpki");
    if !cpki.join("cluster.pem").exists() {
        std::fs::create_dir_all(&cpki).unwrap();
        std::fs::write(cpki.join("cluster.pem"), openssl_pem()).unwrap();
    }
    let insecure = if secret.is_empty() {
        "cluster_allow_insecure_empty_secret: true\n"
    } else {
        ""
    };
    let text = format!(
        "id: {name}\ninterface: {ip}\npki_dir: {d}/{name}/pki\ncachedir: {d}/{name}/cache\n\
         sock_dir: {d}/{name}/sock\ncluster_id: c1\ncluster_peers: [127.29.0.99:1]\n\
         cluster_pki_dir: {d}/cpki\ncluster_pool_port: 0\ncluster_secret: '{secret}'\n{insecure}"
    );
    let cfg = parse_salt_master(&text, None).unwrap().config;
    std::fs::create_dir_all(&cfg.cachedir).unwrap();
    let key = MasterKey::load_or_create(&cfg.pki_dir, "master").unwrap();
    let (m, l, _) = build_master(cfg, key, 0, None, None).await.unwrap();
    (Arc::new(m), l.expect("cluster port"))
}

fn root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sgpl")
        .tempdir_in("/tmp")
        .unwrap()
}

/// Members `ma` and `mb` on `ips` with `secret`, both serving their peer ports, `mb` joined to
/// `ma`.
async fn joined_pair(root: &Path, ips: [&str; 2], secret: &str) -> (Arc<Master>, Arc<Master>) {
    let (a, al) = member(root, "ma", ips[0], secret).await;
    let (b, bl) = member(root, "mb", ips[1], secret).await;
    tokio::spawn(peerserve::serve(al, port(&a)));
    tokio::spawn(peerserve::serve(bl, port(&b)));
    cluster::join(cl(&b), cl(&a).pool_addr).await.expect("join");
    (a, b)
}

fn cl(m: &Master) -> &ClusterState {
    m.cluster.as_ref().unwrap()
}

/// `m`'s peer port, to serve.
fn port(m: &Master) -> Arc<PeerPort> {
    m.peers.clone().unwrap()
}

/// Handles one peer frame as `m`'s peer port does.
fn handle_message(m: &Master, frame: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let p = port(m);
    cluster::handle_message(&p.cluster, &*p.sink, &p.refusals, frame)
}

/// A job published on `m` (no minions: only its record and its forward to the peers).
async fn publish_job(m: &Arc<Master>) -> String {
    let jid = m.jobs.jids.next();
    let req = PublishRequest {
        tgt: "*".into(),
        tgt_type: TargetType::Glob,
        fun: "test.ping".into(),
        arg: vec![],
        user: "t".into(),
    };
    let target = Target::new(TargetType::Glob, "*").unwrap();
    let (m2, j2) = (m.clone(), jid.clone());
    tokio::task::spawn_blocking(move || m2.publish.publish(&j2, &req, &target).unwrap())
        .await
        .unwrap();
    jid
}

/// A new job recorded in `a`'s cache as published by member `ma` (where forwarded returns go).
fn job_of_ma(a: &Master) -> String {
    let jid = a.jobs.jids.next();
    a.jobs
        .cache
        .save_load(
            &jid,
            &serde_json::json!({"fun": "test.ping", "master_id": "ma"}),
        )
        .unwrap();
    jid
}

fn ret_body(jid: &str, minion: &str) -> Value {
    map(vec![
        ("kind", text("return")),
        ("jid", text(jid)),
        ("minion", text(minion)),
        ("ret", text(r#"{"return": true}"#)),
    ])
}

fn n(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_forwarded_returns_share_one_connection() {
    let root = root();
    let (a, b) = joined_pair(root.path(), ["127.29.0.1", "127.29.0.2"], "s3cret").await;
    assert_eq!(n(&cl(&a).stats.accepted), 1, "the join's own connection");

    // A's publish reaches B (MAC'd, on A's link to B).
    let jid = publish_job(&a).await;
    wait_until("the publish on B", WAIT, || n(&cl(&b).stats.handled) == 1).await;
    assert!(b.jobs.cache.exists(&jid));

    let mut rx = a.jobs.wait_returns(&jid);
    let (b2, j2) = (b.clone(), jid.clone());
    tokio::task::spawn_blocking(move || {
        for i in 0..1000 {
            cluster::forward(cl(&b2), ret_body(&j2, &format!("m-{i:04}")), Some("ma"));
        }
    })
    .await
    .unwrap();
    let mut got = std::collections::BTreeSet::new();
    while got.len() < 1000 {
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("returns within 30 s")
            .unwrap();
        got.insert(ev.minion);
    }
    // One connection for the join, one for the 1,000 returns.
    assert_eq!(n(&cl(&a).stats.accepted), 2);
    assert_eq!(n(&cl(&b).stats.connects), 1);
    assert_eq!(n(&cl(&b).stats.sent), 1000);
    assert_eq!(n(&cl(&a).stats.refused), 0);
    assert_eq!(n(&cl(&b).stats.dropped), 0);
    // The link: its hello answered, nothing one per connection, every frame acknowledged.
    assert_eq!(n(&cl(&b).stats.hellos), 1);
    assert_eq!(n(&cl(&b).stats.old_peer), 0);
    assert_eq!(n(&cl(&b).stats.single), 0);
    wait_until("1,000 acks", WAIT, || n(&cl(&b).stats.acked) == 1000).await;
    assert_eq!(n(&cl(&b).stats.resent), 0);
}

/// Serves `l` like `cluster::serve` but on one connection (hello, acks and all), until the
/// task is aborted (its sockets close: the peer "restarts").
fn fake_serve(l: TcpListener, m: Arc<Master>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (s, from) = l.accept().await.unwrap();
        peerserve::serve_connection(s, from, port(&m)).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_reconnects_to_a_restarted_peer() {
    let root = root();
    let (a, al) = member(root.path(), "ma", "127.29.0.3", "s3cret").await;
    let (b, bl) = member(root.path(), "mb", "127.29.0.4", "s3cret").await;
    let a_addr: SocketAddr = cl(&a).pool_addr;
    tokio::spawn(peerserve::serve(bl, port(&b)));
    // A joins B, so B links to A's port, which this test serves itself.
    cluster::join(cl(&a), cl(&b).pool_addr).await.expect("join");
    let jid = job_of_ma(&a);
    let mut rx = a.jobs.wait_returns(&jid);
    let count = || n(&cl(&a).stats.handled) as usize;
    let first = fake_serve(al, a.clone());
    let send = |from: usize| {
        let (b2, j2) = (b.clone(), jid.clone());
        tokio::task::spawn_blocking(move || {
            for i in from..from + 100 {
                cluster::forward(cl(&b2), ret_body(&j2, &format!("m-{i:04}")), Some("ma"));
            }
        })
    };
    send(0).await.unwrap();
    wait_until("the first 100", WAIT, || count() == 100).await;
    // A "restarts": its sockets close, its port is bound again.
    first.abort();
    let _ = first.await;
    let al = TcpListener::bind(a_addr).await.unwrap();
    send(100).await.unwrap();
    let second = fake_serve(al, a.clone());
    let mut got = std::collections::BTreeSet::new();
    while got.len() < 200 {
        let st = &cl(&b).stats;
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} of 200 returns; handled {}, B sent {} connects {} dropped {}",
                    got.len(),
                    count(),
                    n(&st.sent),
                    n(&st.connects),
                    n(&st.dropped)
                )
            })
            .unwrap();
        got.insert(ev.minion);
    }
    assert_eq!(n(&cl(&b).stats.connects), 2, "one reconnection");
    assert_eq!(n(&cl(&b).stats.hellos), 2, "both connections are links");
    assert_eq!(n(&cl(&b).stats.dropped), 0);
    second.abort();
}

/// Replaces the `mac` of a sealed frame.
fn with_mac(frame: &[u8], mac: Vec<u8>) -> Vec<u8> {
    let (peer_id, _, body, _) = open_message(frame).unwrap();
    envelope::encode(&map(vec![
        ("peer_id", text(&peer_id)),
        ("body", raw_str(body)),
        ("mac", raw_str(mac)),
    ]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_messages_are_refused_unless_authentic_and_fresh() {
    let root = root();
    let (a, b) = joined_pair(root.path(), ["127.29.0.5", "127.29.0.6"], "s3cret").await;
    let jid = job_of_ma(&a);
    let bc = cl(&b);
    let handle = |f: &[u8]| handle_message(&a, f);
    let refused = |f: &[u8], why: &str| {
        let r = handle(f);
        assert!(
            r.as_ref().is_err_and(|e| e.contains(why)),
            "expected a refusal with {why:?}: {r:?}"
        );
    };

    // The control: a MAC'd return from a joined peer.
    let good = bc.seal_forward(&ret_body(&jid, "m-1"));
    assert!(matches!(open_message(&good).unwrap().3, Auth::Mac(_)));
    assert_eq!(handle(&good), Ok(None));
    // A wrong mac; a mac under another secret.
    let (_, _, _, Auth::Mac(mut mac)) = open_message(&good).unwrap() else {
        panic!("not MAC'd")
    };
    mac[0] ^= 1;
    refused(&with_mac(&good, mac), "bad mac");
    let (c_other, _) = member(root.path(), "mc", "127.29.0.7", "wrong").await;
    let c_frame = cl(&c_other).seal_forward(&ret_body(&jid, "m-1"));
    // mc's key is stored (same cluster_pki_dir), but its secret is wrong.
    refused(&c_frame, "bad mac");
    // A peer that never joined (no peers/<id>.pub), with the right secret.
    let own = MasterKey::load_or_create(&root.path().join("mb/pki"), "master").unwrap();
    let stranger = ClusterState::new(
        bc.config.clone(),
        "stranger",
        own,
        "127.29.0.8:9".parse().unwrap(),
    );
    refused(
        &stranger.seal_forward(&ret_body(&jid, "m-1")),
        "has not joined",
    );
    // A stale ts, and one from the future.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for ts in [now - 301, now + 301] {
        let Value::Map(mut m) = ret_body(&jid, "m-1") else {
            unreachable!()
        };
        m.push((text("ts"), Value::from(ts)));
        refused(&bc.seal_forward(&Value::Map(m)), "window");
    }
    // The RSA-signed form (an older member, or an empty secret) is still accepted; a bad
    // signature is not.
    let signed = bc.seal(&ret_body(&jid, "m-2"));
    assert!(matches!(open_message(&signed).unwrap().3, Auth::Sig(_)));
    assert_eq!(handle(&signed), Ok(None));
    let (pid, _, body, _) = open_message(&signed).unwrap();
    let forged = envelope::encode(&map(vec![
        ("peer_id", text(&pid)),
        ("body", raw_str(body)),
        ("sig", raw_str(vec![0u8; 256])),
    ]));
    refused(&forged, "bad signature");
    // Each refusal is counted as a peer message (none of them is a join).
    assert_eq!(a.refusals.get(Refused::PeerMessage), 6);
    assert_eq!(a.refusals.get(Refused::PeerJoin), 0);
    // A frame announcing more than the peer message limit closes its connection, counted.
    let mut s = tokio::net::TcpStream::connect(cl(&a).pool_addr)
        .await
        .unwrap();
    s.write_u32(u32::MAX).await.unwrap();
    wait_until("the oversized frame's refusal", WAIT, || {
        a.refusals.get(Refused::PeerOversized) == 1
    })
    .await;
    drop(s);
    // An old one-message-per-connection sender: connect, one frame, close.
    let before = n(&cl(&a).stats.handled);
    let mut s = tokio::net::TcpStream::connect(cl(&a).pool_addr)
        .await
        .unwrap();
    s.write_u32(signed.len() as u32).await.unwrap();
    s.write_all(&signed).await.unwrap();
    drop(s);
    wait_until("the old-style frame", WAIT, || {
        n(&cl(&a).stats.handled) == before + 1
    })
    .await;

    // A peer publish is published once; the same frame again (a replay) is not, nor one of a
    // job this master published itself.
    let pjid = b.jobs.jids.next();
    let publish = |j: &str, origin: &str| {
        bc.seal_forward(&map(vec![
            ("kind", text("publish")),
            ("jid", text(j)),
            ("origin", text(origin)),
            (
                "job",
                map(vec![("fun", text("test.ping")), ("jid", text(j))]),
            ),
        ]))
    };
    let p = publish(&pjid, "mb");
    assert_eq!(handle(&p), Ok(None));
    assert_eq!(n(&cl(&a).stats.replayed), 0);
    assert_eq!(handle(&p), Ok(None));
    assert_eq!(
        n(&cl(&a).stats.replayed),
        1,
        "the replay was published again"
    );
    let own_jid = publish_job(&a).await;
    assert_eq!(handle(&publish(&own_jid, "mb")), Ok(None));
    assert_eq!(n(&cl(&a).stats.replayed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_empty_secret_forwards_are_signed_and_macs_refused() {
    let root = root();
    let (a, b) = joined_pair(root.path(), ["127.29.0.9", "127.29.0.10"], "").await;
    assert_eq!(cluster::peer_mac_key(""), None);
    let jid = job_of_ma(&a);
    let signed = cl(&b).seal_forward(&ret_body(&jid, "m-1"));
    assert!(matches!(open_message(&signed).unwrap().3, Auth::Sig(_)));
    assert_eq!(handle_message(&a, &signed), Ok(None));
    // A MAC'd frame (under any key) proves nothing here.
    let (pid, _, body, _) = open_message(&signed).unwrap();
    let mac_frame = envelope::encode(&map(vec![
        ("peer_id", text(&pid)),
        ("body", raw_str(body)),
        ("mac", raw_str(vec![0u8; 32])),
    ]));
    let r = handle_message(&a, &mac_frame);
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("cluster_secret is empty")),
        "{r:?}"
    );
}

/// Members `ma` (its peer port bound, not served: the test serves it) and `mb` (served) on
/// `ips`; `ma` joined `mb`, so `mb` links to `ma`'s port. Returns `ma`'s listener too.
async fn a_joined_to_b(root: &Path, ips: [&str; 2]) -> (Arc<Master>, Arc<Master>, TcpListener) {
    let (a, al) = member(root, "ma", ips[0], "s3cret").await;
    let (b, bl) = member(root, "mb", ips[1], "s3cret").await;
    tokio::spawn(peerserve::serve(bl, port(&b)));
    cluster::join(cl(&a), cl(&b).pool_addr).await.expect("join");
    (a, b, al)
}

/// Forwards returns `from..to` of `jid` from `b` to `ma`.
async fn forward_returns(b: &Arc<Master>, jid: &str, from: usize, to: usize) {
    let (b2, j2) = (b.clone(), jid.to_string());
    tokio::task::spawn_blocking(move || {
        for i in from..to {
            cluster::forward(cl(&b2), ret_body(&j2, &format!("m-{i:04}")), Some("ma"));
        }
    })
    .await
    .unwrap();
}

/// Waits for `count` distinct returns on `rx`.
async fn distinct_returns(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<ReturnEvent>,
    count: usize,
    b: &Master,
) {
    let mut got = std::collections::BTreeSet::new();
    while got.len() < count {
        let st = &cl(b).stats;
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} of {count} returns; B sent {} resent {} single {} dropped {}",
                    got.len(),
                    n(&st.sent),
                    n(&st.resent),
                    n(&st.single),
                    n(&st.dropped)
                )
            })
            .unwrap();
        got.insert(ev.minion);
    }
}

/// The previous saltgate-master's receiver, as it was before the persistent link: one frame per
/// connection (10 s to read it), handled, the reply written if any, the connection closed. It
/// knew no MAC: a frame without `sig` (or without `body`, as a hello) is refused unhandled.
/// Counts the refusals.
fn old_receiver(l: TcpListener, m: Arc<Master>, refused: Arc<AtomicUsize>) {
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let (m, refused) = (m.clone(), refused.clone());
            tokio::spawn(async move {
                let read = tokio::time::timeout(Duration::from_secs(10), read_frame_idle(&mut s));
                let Ok(Ok(Some(f))) = read.await else { return };
                if !open_message(&f).is_ok_and(|o| matches!(o.3, Auth::Sig(_))) {
                    refused.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let r = tokio::task::spawn_blocking(move || handle_message(&m, &f))
                    .await
                    .unwrap();
                match r {
                    Ok(Some(reply)) => {
                        let _ = s.write_u32(reply.len() as u32).await;
                        let _ = s.write_all(&reply).await;
                    }
                    Ok(None) => {}
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_receiver_gets_every_frame_one_per_connection() {
    let root = root();
    let (a, b, al) = a_joined_to_b(root.path(), ["127.34.0.1", "127.34.0.2"]).await;
    let jid = job_of_ma(&a);
    let mut rx = a.jobs.wait_returns(&jid);
    let refused = Arc::new(AtomicUsize::new(0));
    old_receiver(al, a.clone(), refused.clone());
    forward_returns(&b, &jid, 0, 100).await;
    distinct_returns(&mut rx, 100, &b).await;
    let st = &cl(&b).stats;
    assert_eq!(n(&st.old_peer), 1, "one probe: the next comes after 60 s");
    assert_eq!(n(&st.hellos), 0);
    // B counts a frame once the receiver closed, just after its return was handled.
    wait_until("100 frames one per connection", WAIT, || {
        n(&st.single) == 100
    })
    .await;
    assert_eq!(n(&st.acked), 100);
    assert_eq!(n(&st.dropped), 0);
    assert_eq!(n(&a.cluster.as_ref().unwrap().stats.handled), 0, "no link");
    // The old receiver refused the hello (it has no body), and nothing else.
    assert_eq!(refused.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_received_but_not_acknowledged_are_sent_again() {
    let root = root();
    let (a, b, al) = a_joined_to_b(root.path(), ["127.34.0.3", "127.34.0.4"]).await;
    let a_addr = cl(&a).pool_addr;
    let jid = job_of_ma(&a);
    let mut rx = a.jobs.wait_returns(&jid);
    // A dies after reading 50 frames it never handled nor acknowledged.
    let dying = tokio::spawn(async move {
        let (mut s, _) = al.accept().await.unwrap();
        let hello = read_frame_idle(&mut s).await.unwrap().unwrap();
        assert!(saltgate_master::peerproto::is_hello(&hello));
        let answer = saltgate_master::peerproto::hello_frame("ma");
        s.write_u32(answer.len() as u32).await.unwrap();
        s.write_all(&answer).await.unwrap();
        for _ in 0..50 {
            read_frame_idle(&mut s).await.unwrap().unwrap();
        }
    });
    forward_returns(&b, &jid, 0, 100).await;
    dying.await.unwrap();
    // A restarts on the same address.
    let al = TcpListener::bind(a_addr).await.unwrap();
    tokio::spawn(peerserve::serve(al, port(&a)));
    distinct_returns(&mut rx, 100, &b).await;
    let st = &cl(&b).stats;
    assert!(n(&st.resent) >= 50, "resent {}", n(&st.resent));
    assert_eq!(
        n(&st.hellos),
        2,
        "the dying peer's link and the restarted one's"
    );
    assert_eq!(n(&st.dropped), 0);
    wait_until("every frame acknowledged", WAIT, || n(&st.acked) == 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_sender_is_served_without_hello_or_acks() {
    let root = root();
    let (a, al) = member(root.path(), "ma", "127.34.0.5", "s3cret").await;
    let (b, _bl) = member(root.path(), "mb", "127.34.0.6", "s3cret").await;
    tokio::spawn(peerserve::serve(al, port(&a)));
    cluster::join(cl(&b), cl(&a).pool_addr).await.expect("join");
    let jid = job_of_ma(&a);
    let handled = || n(&cl(&a).stats.handled);
    // The previous saltgate-master's sender: one RSA-signed frame per connection, no hello;
    // then the first persistent sender's way: several frames on one connection, no hello.
    // Neither gets a byte back (a hello answer or an ack would be read as a reply).
    for frames in [1, 1, 3] {
        let before = handled();
        let mut s = tokio::net::TcpStream::connect(cl(&a).pool_addr)
            .await
            .unwrap();
        for i in 0..frames {
            let f = cl(&b).seal(&ret_body(&jid, &format!("m-{before}-{i}")));
            s.write_u32(f.len() as u32).await.unwrap();
            s.write_all(&f).await.unwrap();
        }
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut back)
            .await
            .unwrap();
        assert!(
            back.is_empty(),
            "{} bytes written to an old sender",
            back.len()
        );
        assert_eq!(handled(), before + frames, "handled before the close");
    }
    assert_eq!(n(&cl(&a).stats.refused), 0);
}
