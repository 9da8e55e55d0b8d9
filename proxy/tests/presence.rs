//! Presence end to end: minions (clients from their own loopback addresses) send a real `_auth`
//! (and `aes` requests) through saltgate to fake masters; `/api/v1/minions`, `saltgate ctl
//! minions` and the metrics must say which master each sits on. Everything on 127.14.0.0/16.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use common::api::*;
use common::*;
use saltgate_config::{Config, HealthSettings, MasterConfig, Probe, Role};
use saltgate_wire::envelope::{self, bin, map, salt_compat, text, RequestEnvelope};
use saltgate_wire::rsa::{EncAlgo, PrivateKey};
use saltgate_wire::zmtp::frame::Frame;
use saltgate_wire::zmtp::{Connection, HandshakeConfig, Router, RouterOptions, SocketType};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");
/// saltgate's listeners and admin API.
const PROXY_IP: &str = "127.14.0.1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A minion key and a cached master key (2048 bits, as Salt's), generated once.
fn keys() -> &'static (PrivateKey, PrivateKey) {
    static KEYS: OnceLock<(PrivateKey, PrivateKey)> = OnceLock::new();
    KEYS.get_or_init(|| {
        (
            PrivateKey::generate(2048).unwrap(),
            PrivateKey::generate(2048).unwrap(),
        )
    })
}

/// A clear `_auth` as a Salt 3008 minion sends it (the load of `crypt.py`'s
/// `minion_sign_in_payload`, packed with `use_bin_type=False`).
fn auth_payload(id: &str) -> Vec<u8> {
    let (minion, master) = keys();
    let token = master
        .public_key()
        .encrypt(EncAlgo::OaepSha1, b"0123456789abcdef0123456789abcdef")
        .unwrap();
    let load = map(vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text("5f0c1b8e9a7d4c3b2a1908f7e6d5c4b3")),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text(&minion.public_key().to_clean_pem().unwrap())),
        ("token", bin(&token)),
    ]);
    envelope::encode(&salt_compat(RequestEnvelope::clear(load).to_value()))
}

/// An `aes` request of the minion's long-lived request socket.
fn aes_payload(id: &str) -> Vec<u8> {
    RequestEnvelope::aes(id, &[0x5a; 240]).encode()
}

/// A fake master: a ROUTER on its request port answering every request with its name, and a
/// TCP publish port that sends "<name>\n".
struct FakeSaltMaster {
    name: String,
    publish: Arc<FakeMaster>,
    request: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for FakeSaltMaster {
    fn drop(&mut self) {
        self.task.abort();
        self.publish.stop();
    }
}

impl FakeSaltMaster {
    async fn start(name: &str, at: &str) -> FakeSaltMaster {
        let publish = FakeMaster::start(name, at, Behaviour::Echo).await;
        let mut router = Router::bind(SocketAddr::new(ip(at), 0), RouterOptions::default())
            .await
            .unwrap();
        let request = router.local_addr();
        let n = Bytes::from(name.to_string());
        let task = tokio::spawn(async move {
            while let Some(m) = router.recv().await {
                let _ = router.reply(&m.peer, vec![n.clone()]).await;
            }
        });
        FakeSaltMaster {
            name: name.into(),
            publish,
            request,
            task,
        }
    }

    fn config(&self) -> MasterConfig {
        checked_master(
            &self.name,
            &self.request.ip().to_string(),
            self.publish.addr.port(),
            self.request.port(),
            health(),
        )
    }
}

fn health() -> HealthSettings {
    HealthSettings {
        interval: Duration::from_millis(50),
        fastinter: Duration::from_millis(50),
        downinter: Duration::from_millis(50),
        rise: 1,
        fall: 2,
        timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(500),
        probe: Probe::Tcp,
    }
}

fn proxy_config(masters: Vec<MasterConfig>) -> Config {
    config_on(PROXY_IP, masters, health())
}

/// A TCP connection to `to` from the address `from` (each minion has its own).
async fn tcp_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::new(ip(from), 0)).unwrap();
    tokio::time::timeout(T, s.connect(to))
        .await
        .expect("connect timed out")
        .expect("connect")
}

/// A minion's publish session: returns it and the master it reached.
async fn publish_session(from: &str, proxy: SocketAddr) -> (TcpStream, String) {
    let mut s = tcp_from(from, proxy).await;
    let name = read_line(&mut s).await;
    (s, name)
}

/// One request on a REQ connection from `from`; returns the connection and the master that
/// answered.
async fn request(from: &str, proxy: SocketAddr, payload: &[u8]) -> (Connection, String) {
    let s = tcp_from(from, proxy).await;
    let mut c = Connection::handshake(s, &HandshakeConfig::new(SocketType::Req))
        .await
        .expect("handshake through saltgate");
    c.send_message(&[&b""[..], payload]).await.unwrap();
    loop {
        match tokio::time::timeout(T, c.read_frame()).await.unwrap() {
            Ok(Frame::Message { body, more: false }) => {
                return (c, String::from_utf8(body.to_vec()).unwrap())
            }
            Ok(_) => {}
            Err(e) => panic!("reply: {e}"),
        }
    }
}

/// Every page of `/api/v1/minions`, by id.
async fn minions(admin: SocketAddr) -> BTreeMap<String, Value> {
    let (code, v) = json(admin, "GET", "/api/v1/minions", None).await;
    assert_eq!(code, 200, "{v}");
    v["minions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_string(), m.clone()))
        .collect()
}

/// Waits until `/api/v1/minions` satisfies `cond`.
async fn wait_minions(
    admin: SocketAddr,
    what: &str,
    cond: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let m = minions(admin).await;
        if cond(&m) {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn ctl_minions(admin: SocketAddr) -> String {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args(["ctl", "--admin", &admin.to_string(), "minions"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_minion_is_listed_with_its_publish_and_request_master() {
    let a = FakeSaltMaster::start("a", "127.14.0.2").await;
    let b = FakeSaltMaster::start("b", "127.14.0.3").await;
    let (r, _stop, _) = run(proxy_config(vec![a.config(), b.config()])).await;
    let (publish, req) = (addr(&r, Role::Publish), addr(&r, Role::Request));
    let admin = r.admin_addr().unwrap();
    wait_for("both masters up", || {
        r.masters().iter().all(|m| m.is_available())
    })
    .await;

    // Four minions, each from its own address: a publish session, then an _auth on a short-lived
    // connection (closed), as a Salt minion does. The last also keeps a long-lived request
    // connection carrying aes requests.
    let mut expect = BTreeMap::new();
    let mut keep = Vec::new();
    for i in 1..=4 {
        let (id, from) = (format!("minion-{i}.example.com"), format!("127.14.1.{i}"));
        let (p, pub_master) = publish_session(&from, publish).await;
        let (c, mut req_master) = request(&from, req, &auth_payload(&id)).await;
        drop(c);
        keep.push(p);
        if i == 4 {
            let (c, m) = request(&from, req, &aes_payload(&id)).await;
            req_master = m;
            keep.push(tcp_from(&from, req).await); // a request session that never speaks
            drop(c);
        }
        expect.insert(id, (from, pub_master, req_master));
    }
    let masters_seen: std::collections::BTreeSet<&String> =
        expect.values().map(|(_, p, _)| p).collect();
    assert_eq!(
        masters_seen.len(),
        2,
        "round robin spreads the publish sessions"
    );

    let listed = wait_minions(admin, "4 minions, none with a request session left", |m| {
        m.len() == 4 && m.values().all(|v| v["request_sessions"] == 0)
    })
    .await;
    for (id, (from, pub_master, req_master)) in &expect {
        let m = &listed[id];
        let client: SocketAddr = m["client"].as_str().unwrap().parse().unwrap();
        assert_eq!(client.ip(), ip(from), "{m}");
        assert_eq!(m["publish_master"], pub_master.as_str(), "{m}");
        assert_eq!(m["publish_pairing"], "by-address", "{m}");
        assert_eq!(m["request_master"], req_master.as_str(), "{m}");
        assert_eq!(m["connected"], true, "{m}: its publish session is open");
        assert!(m["first_seen"].as_u64().unwrap() <= m["last_seen"].as_u64().unwrap());
    }
    assert_eq!(listed["minion-4.example.com"]["source"], "aes");
    assert_eq!(listed["minion-1.example.com"]["source"], "auth");

    // Pages by id.
    let (_, p1) = json(admin, "GET", "/api/v1/minions?limit=3", None).await;
    assert_eq!(
        (p1["count"].clone(), p1["total"].clone()),
        (3.into(), 4.into())
    );
    assert_eq!(p1["next_after"], "minion-3.example.com");
    let (_, p2) = json(
        admin,
        "GET",
        "/api/v1/minions?limit=3&after=minion-3.example.com",
        None,
    )
    .await;
    assert_eq!(p2["minions"][0]["id"], "minion-4.example.com");
    assert!(p2.get("next_after").is_none(), "{p2}");
    let (code, e) = json(admin, "GET", "/api/v1/minions?limit=0", None).await;
    assert_eq!(code, 400);
    assert!(e["error"].as_str().unwrap().contains("limit=0"), "{e}");

    // Metrics: totals, minions per master and port, what the inspections found.
    let per = |port: usize, master: &str| {
        expect
            .values()
            .filter(|v| if port == 0 { &v.1 } else { &v.2 } == master)
            .count() as f64
    };
    wait_for_metric(admin, "saltgate_minions_known", &[], 4.0).await;
    wait_for_metric(admin, "saltgate_minions_connected", &[], 4.0).await;
    for m in ["a", "b"] {
        let labels = |port| [("master", m), ("port", port)];
        wait_for_metric(
            admin,
            "saltgate_master_minions",
            &labels("publish"),
            per(0, m),
        )
        .await;
        wait_for_metric(
            admin,
            "saltgate_master_minions",
            &labels("request"),
            per(1, m),
        )
        .await;
    }
    let s = scrape(admin).await;
    let inspected = |result| {
        value(
            &s,
            "saltgate_presence_inspections_total",
            &[("result", result)],
        )
    };
    assert_eq!((inspected("auth"), inspected("aes")), (4.0, 1.0));
    assert_eq!(value(&s, "saltgate_minions_publish_ambiguous", &[]), 0.0);

    // saltgate ctl minions: one line per minion with its masters.
    let out = ctl_minions(admin).await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("MINION") && lines[0].contains("PUBLISH"),
        "{out}"
    );
    for (id, (from, pub_master, req_master)) in &expect {
        let line = lines.iter().find(|l| l.starts_with(id.as_str())).expect(id);
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert!(cols[1].starts_with(&format!("{from}:")), "{line}");
        assert_eq!(
            (cols[2], cols[3], cols[4]),
            (pub_master.as_str(), req_master.as_str(), "connected"),
            "{line}"
        );
    }
    assert!(out.contains("4 minion(s), 4 connected"), "{out}");

    // A minion whose last session ends is gone, listed with its masters until it expires.
    let gone = keep.remove(0); // minion-1's publish session
    drop(gone);
    let listed = wait_minions(admin, "minion-1 gone", |m| {
        m["minion-1.example.com"]["connected"] == false
    })
    .await;
    let m1 = &listed["minion-1.example.com"];
    assert_eq!(m1["publish_pairing"], "none");
    assert_eq!(
        m1["request_master"],
        expect["minion-1.example.com"].2.as_str()
    );
    assert!(m1["expires_in_s"].as_u64().unwrap() <= 600, "{m1}");
    wait_for_metric(admin, "saltgate_minions_connected", &[], 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minions_behind_one_address_are_listed_as_ambiguous_not_guessed() {
    let a = FakeSaltMaster::start("a", "127.14.0.4").await;
    let b = FakeSaltMaster::start("b", "127.14.0.5").await;
    let (r, _stop, _) = run(proxy_config(vec![a.config(), b.config()])).await;
    let (publish, req) = (addr(&r, Role::Publish), addr(&r, Role::Request));
    let admin = r.admin_addr().unwrap();
    wait_for("both masters up", || {
        r.masters().iter().all(|m| m.is_available())
    })
    .await;
    let nat = "127.14.2.1";
    // Two minions behind one address, their publish sessions on two masters.
    let (p1, m1) = publish_session(nat, publish).await;
    let (p2, m2) = publish_session(nat, publish).await;
    assert_ne!(m1, m2, "round robin: one publish session on each master");
    for id in ["nat-1", "nat-2"] {
        let _ = request(nat, req, &auth_payload(id)).await;
    }
    let listed = wait_minions(admin, "two minions", |m| m.len() == 2).await;
    for m in listed.values() {
        assert_eq!(m["publish_master"], Value::Null, "{m}");
        assert_eq!(m["publish_pairing"], "ambiguous", "{m}");
        assert_eq!(
            m["publish_candidates"],
            serde_json::json!(["a", "b"]),
            "{m}"
        );
    }
    wait_for_metric(admin, "saltgate_minions_publish_ambiguous", &[], 2.0).await;
    let out = ctl_minions(admin).await;
    assert!(out.contains("a|b?"), "{out}");
    // One publish session left at that address: both are paired with its master (the limit of
    // pairing by address, documented).
    drop(p1);
    wait_minions(admin, "paired by address again", |m| {
        m.values().all(|v| v["publish_master"] == m2.as_str())
    })
    .await;
    drop(p2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pass_unchanged_and_presence_can_be_turned_off() {
    // Echo masters: what saltgate forwards comes back as it was sent.
    let pub_port = FakeMaster::start("a", "127.14.0.6", Behaviour::Echo).await;
    let req_port = FakeMaster::start("a", "127.14.0.6", Behaviour::Echo).await;
    let mut cfg = proxy_config(vec![checked_master(
        "a",
        "127.14.0.6",
        pub_port.addr.port(),
        req_port.addr.port(),
        health(),
    )]);
    cfg.presence.expire_after = Duration::from_secs(1);
    let (r, _stop, _) = run(cfg.clone()).await;
    let req = addr(&r, Role::Request);
    let admin = r.admin_addr().unwrap();
    wait_for("master up", || r.masters()[0].is_available()).await;

    // A REQ client's whole stream (greeting, READY, _auth), written in small uneven pieces.
    let mut stream = bytes::BytesMut::new();
    stream.extend_from_slice(&saltgate_wire::zmtp::Greeting::ours(false).encode());
    saltgate_wire::zmtp::Command::Ready(
        saltgate_wire::zmtp::Properties::default()
            .with("Socket-Type", "REQ")
            .with("Identity", ""),
    )
    .encode_frame(&mut stream);
    saltgate_wire::zmtp::frame::encode_message(&mut stream, &[&b""[..], &auth_payload("echo-1")]);
    let mut s = tcp_from("127.14.3.1", req).await;
    assert_eq!(read_line(&mut s).await, "a");
    for (i, piece) in stream.chunks(37).enumerate() {
        s.write_all(piece).await.unwrap();
        if i % 5 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let mut back = vec![0u8; stream.len()];
    tokio::time::timeout(T, s.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, stream.to_vec(), "saltgate changed the bytes");
    let listed = wait_minions(admin, "echo-1", |m| m.contains_key("echo-1")).await;
    assert_eq!(listed["echo-1"]["request_master"], "a");
    assert_eq!(listed["echo-1"]["request_sessions"], 1);

    // Not ZMTP, and longer than the inspection budget: forwarded as is, given up at once.
    let noise: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut n = tcp_from("127.14.3.2", req).await;
    assert_eq!(read_line(&mut n).await, "a");
    n.write_all(&noise).await.unwrap();
    let mut back = vec![0u8; noise.len()];
    tokio::time::timeout(T, n.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, noise);
    wait_for_metric(
        admin,
        "saltgate_presence_inspections_total",
        &[("result", "not-zmtp")],
        1.0,
    )
    .await;

    // The session ends: gone, then forgotten after expire_after (1 s here).
    drop(s);
    wait_minions(admin, "echo-1 gone", |m| m["echo-1"]["connected"] == false).await;
    wait_minions(admin, "echo-1 forgotten", |m| m.is_empty()).await;
    wait_for_metric(admin, "saltgate_minions_known", &[], 0.0).await;

    // Turned off by a reload: the API says so (the status page shows "not available").
    cfg.presence.enabled = false;
    r.reload(cfg).await.unwrap();
    let (code, e) = json(admin, "GET", "/api/v1/minions", None).await;
    assert_eq!(code, 404);
    assert!(
        e["error"].as_str().unwrap().contains("presence.enabled"),
        "{e}"
    );
}
