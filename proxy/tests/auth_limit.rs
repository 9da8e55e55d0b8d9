//! `listeners.request.auth_limit` (issue 25) through the proxy: a fake master that answers `_auth`
//! when the test lets it, minions from `wire`'s REQ socket sending real `_auth` envelopes.
//! Addresses 127.31.0.x.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::api::{addr, run_with, scrape, value, wait_for_metric};
use common::*;
use saltgate_config::auth_limit::{AuthLimit, MaxInFlight};
use saltgate_config::{HealthSettings, MasterConfig, Probe, Role};
use saltgate_proxy::{Options, Running};
use saltgate_wire::envelope::{self, map, text};
use saltgate_wire::zmtp::{Connection, Frame, HandshakeConfig, ReqOptions, ReqSocket, SocketType};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A master's request port: every request is recorded as it arrives (`<cmd>:<id>`); an `_auth`
/// is answered once the test adds a permit to `release` (other requests at once).
struct SlowMaster {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<String>>>,
    /// `_auth` received and not answered yet, and the most there ever were.
    pending: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

impl SlowMaster {
    async fn start(ip: &str) -> SlowMaster {
        let l = TcpListener::bind((ip, 0)).await.unwrap();
        let m = SlowMaster {
            addr: l.local_addr().unwrap(),
            got: Default::default(),
            pending: Default::default(),
            most: Default::default(),
            release: Arc::new(Semaphore::new(0)),
        };
        let (got, pending, most, release) = (
            m.got.clone(),
            m.pending.clone(),
            m.most.clone(),
            m.release.clone(),
        );
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let (got, pending, most, release) =
                    (got.clone(), pending.clone(), most.clone(), release.clone());
                tokio::spawn(async move {
                    let mut hs = HandshakeConfig::new(SocketType::Router);
                    hs.as_server = true;
                    let Ok(mut c) = Connection::handshake(s, &hs).await else {
                        return;
                    };
                    while let Ok(f) = c.read_frame().await {
                        let Frame::Message { body, more: false } = f else {
                            continue;
                        };
                        let v = envelope::decode(&body).unwrap();
                        let load = envelope::get(&v, "load").unwrap();
                        let field = |k| {
                            envelope::get(load, k)
                                .and_then(envelope::as_str)
                                .unwrap_or("-")
                                .to_owned()
                        };
                        let (cmd, id) = (field("cmd"), field("id"));
                        got.lock().unwrap().push(format!("{cmd}:{id}"));
                        if cmd == "_auth" {
                            let now = pending.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            release.acquire().await.unwrap().forget();
                            pending.fetch_sub(1, Ordering::SeqCst);
                        }
                        let reply = envelope::encode(&map(vec![("ok", text(&id))]));
                        if c.send_message(&[&b""[..], &reply[..]]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        m
    }

    fn got(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }

    fn config(&self) -> MasterConfig {
        checked_master(
            "m",
            &self.addr.ip().to_string(),
            self.addr.port(),
            self.addr.port(),
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

async fn proxy(m: &SlowMaster, limit: AuthLimit) -> (Running, tokio::sync::oneshot::Sender<()>) {
    let mut cfg = config_on("127.31.0.1", vec![m.config()], health());
    cfg.request.auth_limit = Some(limit);
    let (r, stop) = run_with(
        cfg,
        Options {
            prober: Arc::new(ScriptedProber::default()),
            ..Default::default()
        },
    )
    .await;
    wait_for("master UP", || r.master("m").unwrap().is_up()).await;
    (r, stop)
}

fn minion(r: &Running) -> ReqSocket {
    ReqSocket::new(addr(r, Role::Request), ReqOptions::default())
}

/// A Salt request envelope: `{"enc": enc, "load": {"cmd": cmd, "id": id}}`.
fn request(enc: &str, cmd: &str, id: &str) -> Vec<Bytes> {
    let load = map(vec![("cmd", text(cmd)), ("id", text(id))]);
    let env = map(vec![("enc", text(enc)), ("load", load)]);
    vec![Bytes::from(envelope::encode(&env))]
}

fn limit(n: u32) -> AuthLimit {
    AuthLimit {
        max_in_flight: MaxInFlight::Fixed(n),
        max_wait: Duration::from_secs(30),
        max_queue: 100,
        ..AuthLimit::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_in_flight_auth_reach_the_master_and_all_are_answered() {
    let m = SlowMaster::start("127.31.0.2").await;
    let (r, _stop) = proxy(&m, limit(2)).await;
    let admin = r.admin_addr().unwrap();
    let n = 12;
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut s = minion(&r);
        tasks.push(tokio::spawn(async move {
            s.request(request("clear", "_auth", &format!("m{i}")), T)
                .await
        }));
    }
    wait_for_metric(
        admin,
        "saltgate_auth_queued",
        &[("master", "m")],
        (n - 2) as f64,
    )
    .await;
    wait_for("two _auth at the master", || {
        m.pending.load(Ordering::SeqCst) == 2
    })
    .await;
    // Other requests pass while `_auth` wait.
    let mut other = minion(&r);
    let reply = other
        .request(request("clear", "ping", "x"), T)
        .await
        .expect("a ping passes the full gate");
    assert!(!reply.is_empty());
    // The master answers one `_auth` at a time: each answer lets one more through.
    for i in 0..n {
        m.release.add_permits(1);
        wait_for_metric(
            admin,
            "saltgate_auth_admitted_total",
            &[("master", "m")],
            (i + 3).min(n) as f64,
        )
        .await;
    }
    for t in tasks {
        t.await.unwrap().expect("every _auth answered");
    }
    assert_eq!(
        m.most.load(Ordering::SeqCst),
        2,
        "never more than max_in_flight"
    );
    let auths = m.got().iter().filter(|g| g.starts_with("_auth:")).count();
    assert_eq!(auths, n, "each _auth reached the master once");
    let s = scrape(admin).await;
    assert_eq!(
        value(&s, "saltgate_auth_in_flight", &[("master", "m")]),
        0.0
    );
    assert_eq!(value(&s, "saltgate_auth_queued", &[("master", "m")]), 0.0);
    let waited = value(&s, "saltgate_auth_wait_seconds_count", &[("master", "m")]);
    assert_eq!(waited, n as f64);
    // The status page's data: the gate's figures in /api/v1/masters.
    let (code, v) = common::api::json(admin, "GET", "/api/v1/masters", None).await;
    assert_eq!(code, 200);
    let g = &v["auth_limit"][0];
    assert_eq!(g["master"], "m");
    assert_eq!(
        (g["limit"].as_u64(), g["auto"].as_bool()),
        (Some(2), Some(false))
    );
    assert_eq!(g["admitted"].as_u64(), Some(n as u64));
    assert_eq!(
        (g["in_flight"].as_u64(), g["queued"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_auth_whose_minion_closes_never_reaches_the_master() {
    let m = SlowMaster::start("127.31.0.3").await;
    let (r, _stop) = proxy(&m, limit(1)).await;
    let admin = r.admin_addr().unwrap();
    let mut first = minion(&r);
    let a = tokio::spawn(async move { first.request(request("clear", "_auth", "first"), T).await });
    wait_for("the first _auth at the master", || {
        m.got() == ["_auth:first"]
    })
    .await;
    let mut gone = minion(&r);
    let b = tokio::spawn(async move { gone.request(request("clear", "_auth", "gone"), T).await });
    wait_for_metric(admin, "saltgate_auth_queued", &[("master", "m")], 1.0).await;
    // The minion gives up: its socket (and connection) goes.
    b.abort();
    wait_for_metric(
        admin,
        "saltgate_auth_dropped_total",
        &[("master", "m"), ("reason", "minion_closed")],
        1.0,
    )
    .await;
    wait_for_metric(admin, "saltgate_auth_queued", &[("master", "m")], 0.0).await;
    m.release.add_permits(2);
    a.await.unwrap().expect("the first is answered");
    let mut last = minion(&r);
    last.request(request("clear", "_auth", "last"), T)
        .await
        .expect("the next _auth goes through");
    assert_eq!(
        m.got(),
        ["_auth:first", "_auth:last"],
        "never the one whose minion left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_auth_older_than_max_wait_is_dropped_and_its_connection_closed() {
    let m = SlowMaster::start("127.31.0.4").await;
    let l = AuthLimit {
        max_wait: Duration::from_millis(200),
        max_queue: 1,
        ..limit(1)
    };
    let (r, _stop) = proxy(&m, l).await;
    let admin = r.admin_addr().unwrap();
    let mut first = minion(&r);
    let a = tokio::spawn(async move { first.request(request("clear", "_auth", "first"), T).await });
    wait_for("the first _auth at the master", || {
        m.got() == ["_auth:first"]
    })
    .await;
    let mut old = minion(&r);
    let b = tokio::spawn(async move { old.request(request("clear", "_auth", "old"), T).await });
    wait_for_metric(admin, "saltgate_auth_queued", &[("master", "m")], 1.0).await;
    // The queue holds one: the next is dropped at once.
    let mut full = minion(&r);
    assert!(full
        .request(request("clear", "_auth", "full"), T)
        .await
        .is_err());
    // The waiting one is closed once max_wait has passed (its REQ socket sees the close).
    assert!(b.await.unwrap().is_err(), "closed, not answered");
    let s = scrape(admin).await;
    let dropped = |reason| {
        value(
            &s,
            "saltgate_auth_dropped_total",
            &[("master", "m"), ("reason", reason)],
        )
    };
    assert_eq!((dropped("max_wait"), dropped("queue_full")), (1.0, 1.0));
    m.release.add_permits(1);
    a.await.unwrap().expect("the first is answered");
    assert_eq!(m.got(), ["_auth:first"]);
}

/// A minion that gives up after its `_auth` reached the master does not free the place: the
/// master still works on it (Salt cannot cancel a request), so the next `_auth` waits for that
/// answer, which saltgate reads and drops (`saltgate_auth_orphaned_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_auth_whose_minion_left_keeps_its_place_until_the_master_answers() {
    let m = SlowMaster::start("127.31.0.5").await;
    let (r, _stop) = proxy(&m, limit(1)).await;
    let admin = r.admin_addr().unwrap();
    let mut gone = minion(&r);
    let a = tokio::spawn(async move { gone.request(request("clear", "_auth", "gone"), T).await });
    wait_for("the first _auth at the master", || {
        m.got() == ["_auth:gone"]
    })
    .await;
    // Its minion gives up: its socket and connection go while the master works.
    a.abort();
    wait_for_metric(
        admin,
        "saltgate_auth_orphaned_total",
        &[("master", "m")],
        1.0,
    )
    .await;
    let mut next = minion(&r);
    let b = tokio::spawn(async move { next.request(request("clear", "_auth", "next"), T).await });
    wait_for_metric(admin, "saltgate_auth_queued", &[("master", "m")], 1.0).await;
    assert_eq!(
        value(
            &scrape(admin).await,
            "saltgate_auth_in_flight",
            &[("master", "m")]
        ),
        1.0,
        "the master still works on the first"
    );
    assert_eq!(m.got(), ["_auth:gone"], "the next waits in saltgate");
    // The master answers the one nobody waits for: the place passes to the next.
    m.release.add_permits(1);
    wait_for("the next _auth at the master", || {
        m.got() == ["_auth:gone", "_auth:next"]
    })
    .await;
    m.release.add_permits(1);
    b.await.unwrap().expect("the next is answered");
    let s = scrape(admin).await;
    assert_eq!(
        value(&s, "saltgate_auth_in_flight", &[("master", "m")]),
        0.0
    );
    let (code, v) = common::api::json(admin, "GET", "/api/v1/masters", None).await;
    assert_eq!(code, 200);
    assert_eq!(v["auth_limit"][0]["orphaned"].as_u64(), Some(1));
}
