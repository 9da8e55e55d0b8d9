//! Issue 10 part 5: masters discovered from a Salt 3008 cluster's `cluster_pki_dir/peers/*.pub`,
//! applied through the reload path. Real loopback sockets on 127.15.1.x, fake masters, real TCP
//! checks; the peer directory is a temporary directory that does not exist at start.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::api::{http, run_with, scrape, value, wait_for_metric_at_least};
use common::*;
use saltgate_config::{Discovery, Role};
use saltgate_proxy::Options;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The log of this test binary, captured.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

const PEER_PUBLISH: u16 = 24515;
const PEER_REQUEST: u16 = 24516;

/// A request connection through the proxy, held open; the master's banner.
async fn request(proxy: std::net::SocketAddr) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let mut b = vec![0u8; 32];
    let k = tokio::time::timeout(T, s.read(&mut b))
        .await
        .unwrap()
        .unwrap();
    (s, String::from_utf8_lossy(&b[..k]).trim().to_string())
}

async fn master_state(admin: std::net::SocketAddr, name: &str) -> Option<String> {
    let (_, body) = http(admin, "GET", "/api/v1/masters", None).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["masters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .map(|m| m["state"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_join_and_leave_through_the_reload_path() {
    let log = Log::default();
    let w = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .init();

    let c = FakeCluster {
        masters: vec![(
            FakeMaster::start("a", "127.15.1.2", Behaviour::Echo).await,
            FakeMaster::start("a", "127.15.1.2", Behaviour::Echo).await,
        )],
    };
    let peer = |last: u8, port: u16| format!("127.15.1.{last}:{port}").parse().unwrap();
    let p3 = [
        FakeMaster::start_at("p3", peer(3, PEER_PUBLISH), Behaviour::Echo).await,
        FakeMaster::start_at("p3", peer(3, PEER_REQUEST), Behaviour::Echo).await,
    ];
    let tmp = tempfile::tempdir().unwrap();
    let pki = tmp.path().join("pki");
    let mut cfg = c.config();
    let bind = "127.15.1.1:0".parse().unwrap();
    cfg.publish.bind = vec![bind];
    cfg.request.bind = vec![bind];
    cfg.admin.bind = bind;
    cfg.global.drain_timeout = Duration::from_millis(300);
    cfg.discovery = Some(Discovery {
        cluster_pki_dir: pki.clone(),
        interval: Duration::from_millis(100),
        publish_port: PEER_PUBLISH,
        request_port: PEER_REQUEST,
        peers: Vec::new(),
    });
    let (r, _stop) = run_with(cfg, Options::default()).await;
    let admin = r.admin_addr().unwrap();
    let proxy = r.local_addrs(Role::Request)[0];
    assert_eq!(
        r.masters().len(),
        1,
        "no peer directory yet: the configured master only"
    );
    assert!(
        log.text()
            .contains("cannot list the cluster's peer keys yet"),
        "{}",
        log.text()
    );

    // The cluster writes its first peer key: a master, UP, taking new sessions.
    std::fs::create_dir_all(pki.join("peers")).unwrap();
    std::fs::write(
        pki.join("peers/127.15.1.3.pub"),
        "-----BEGIN PUBLIC KEY-----\n",
    )
    .unwrap();
    wait_for("the peer is a master and UP", || {
        r.master("127.15.1.3").is_some_and(|m| m.is_up())
    })
    .await;
    assert_eq!(
        master_state(admin, "127.15.1.3").await.as_deref(),
        Some("up")
    );
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(request(proxy).await);
    }
    let on_p3 = held.iter().filter(|(_, m)| m == "p3").count();
    assert!(
        on_p3 >= 2,
        "new sessions reach the discovered master: {on_p3} of 6"
    );
    assert!(p3[1].accepted.load(std::sync::atomic::Ordering::SeqCst) >= on_p3);

    // A peer that does not answer yet: listed as joining, takes nothing.
    std::fs::write(pki.join("peers/127.15.1.9.pub"), "key").unwrap();
    wait_for("the silent peer is listed", || {
        r.master("127.15.1.9").is_some()
    })
    .await;
    for _ in 0..20 {
        assert_eq!(
            master_state(admin, "127.15.1.9").await.as_deref(),
            Some("joining")
        );
        let (_s, m) = request(proxy).await;
        assert_ne!(m, "", "every request is answered by an UP master");
    }
    assert_eq!(
        r.master("127.15.1.9").unwrap().session_count(Role::Request),
        0
    );
    let sc = scrape(admin).await;
    assert_eq!(
        value(
            &sc,
            "saltgate_master_state",
            &[("master", "127.15.1.9"), ("state", "joining")]
        ),
        1.0
    );

    // A file whose name is no address and is not mapped: a warning naming it and the fix.
    std::fs::write(pki.join("peers/not an address!.pub"), "key").unwrap();
    std::fs::write(pki.join("peers/127.15.1.3.pub.tmp"), "key").unwrap();
    let l = log.clone();
    wait_for("the warning", move || {
        l.text().contains("peers/not an address!.pub")
    })
    .await;
    let text = log.text();
    let line = text
        .lines()
        .find(|l| l.contains("not an address!"))
        .unwrap();
    assert!(line.contains("discovery.peers"), "{line}");
    assert_eq!(r.masters().len(), 3, "nothing else changes");
    assert!(r.master("127.15.1.3").unwrap().is_up());

    // The peer's key goes: drained and removed; its sessions close at the drain deadline.
    let generation = r.generation();
    std::fs::remove_file(pki.join("peers/127.15.1.3.pub")).unwrap();
    wait_for("the peer is removed", || r.master("127.15.1.3").is_none()).await;
    assert!(r.generation() > generation);
    assert_eq!(master_state(admin, "127.15.1.3").await, None);
    for (mut s, _) in held.into_iter().filter(|(_, m)| m == "p3") {
        let mut b = [0u8; 8];
        let n = tokio::time::timeout(T, s.read(&mut b))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "a session on the removed peer is closed (drained)");
    }
    // The client may see the close before the session's teardown counts it.
    wait_for_metric_at_least(
        admin,
        "saltgate_master_sessions_closed_total",
        &[("master", "127.15.1.3"), ("reason", "drained")],
        on_p3 as f64,
    )
    .await;
    let (_s, m) = request(proxy).await;
    assert_eq!(m, "a");
}
