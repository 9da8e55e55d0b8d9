//! Issue 12 item 10: when every master that could take a client is at its `maxconn`, the client
//! waits in the listener's queue (HAProxy's queue), served in arrival order as places free, closed
//! with `queue-timeout` after `timeout_queue`, refused with `queue-full` over `maxqueue`, and never
//! left waiting on a master that went DOWN. Real sockets on 127.12.1.x; every wait is on an event
//! (a banner, a close, a gauge), never a sleep.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::api::{addr, json, scrape, value};
use common::migrate_lab::Lab;
use common::*;
use saltgate_config::{Config, MasterConfig, Role};
use saltgate_proxy::close::CloseReason;
use tokio::net::TcpStream;

const IP: &str = "127.12.1.1";

/// Echo masters named `names` on 127.12.1.2, .3, ..., each with `maxconn 1`.
async fn masters(names: &[&str]) -> (Vec<(Arc<FakeMaster>, Arc<FakeMaster>)>, Vec<MasterConfig>) {
    let mut fakes = Vec::new();
    let mut cfgs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let ip = format!("127.12.1.{}", i + 2);
        let p = FakeMaster::start(name, &ip, Behaviour::Echo).await;
        let r = FakeMaster::start(name, &ip, Behaviour::Echo).await;
        cfgs.push(MasterConfig {
            maxconn: Some(1),
            ..checked_master(name, &ip, p.addr.port(), r.addr.port(), scripted_health())
        });
        fakes.push((p, r));
    }
    (fakes, cfgs)
}

/// saltgate with a scripted prober and an in-memory access log (the migrate lab's, not waiting
/// for any master).
type Proxy = Lab;

async fn proxy(cfg: Config) -> Proxy {
    common::migrate_lab::run_scripted(cfg).await
}

impl Proxy {
    /// Clients waiting in the request listener's queue, as the admin API shows them.
    async fn queued(&self) -> u64 {
        let (code, v) = json(self.admin(), "GET", "/api/v1/masters", None).await;
        assert_eq!(code, 200);
        v["queued"]["request"].as_u64().expect("queued.request")
    }

    async fn wait_queued(&self, n: u64) {
        for _ in 0..2000 {
            if self.queued().await == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the queue never held {n} (holds {})", self.queued().await);
    }

    fn reasons(&self) -> Vec<CloseReason> {
        self.log.records().iter().map(|r| r.reason).collect()
    }
}

/// Connects without reading: the client may be queued (no banner yet).
async fn dial(p: &Proxy) -> TcpStream {
    TcpStream::connect(addr(&p.r, Role::Request)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_queue_while_every_master_is_full_and_are_served_in_arrival_order() {
    let (_fakes, cfgs) = masters(&["a"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.timeout_queue = Some(Duration::from_secs(30));
    let p = proxy(cfg).await;
    let (mut first, name) = connect(addr(&p.r, Role::Request)).await;
    assert_eq!(name, "a");

    // Three more, one after the other (so their arrival order is known).
    let mut waiting = Vec::new();
    for i in 1..=3u64 {
        waiting.push(dial(&p).await);
        p.wait_queued(i).await;
    }
    let sc = scrape(p.admin()).await;
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_queue_current",
            &[("listener", "request")]
        ),
        3.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_queued_total",
            &[("listener", "request")]
        ),
        3.0
    );
    assert_eq!(echo(&mut first, b"still served").await, b"still served");

    // Each place that frees goes to the longest waiting client, and only to it.
    drop(first);
    for (served, mut s) in waiting.into_iter().enumerate() {
        assert_eq!(read_line(&mut s).await, "a", "client {} served", served + 1);
        p.wait_queued(2 - served as u64).await;
        assert_eq!(echo(&mut s, b"hello").await, b"hello");
        drop(s);
    }
    wait_for("four sessions logged", || p.log.records().len() == 4).await;
    assert!(
        p.reasons().iter().all(|r| *r == CloseReason::ClientEof),
        "{:?}",
        p.reasons()
    );
    assert!(p
        .log
        .records()
        .iter()
        .all(|r| r.master.as_deref() == Some("a")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_wait_expires_is_closed_with_queue_timeout() {
    let (_fakes, cfgs) = masters(&["a"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.timeout_queue = Some(Duration::from_millis(300));
    let p = proxy(cfg).await;
    let (_held, _) = connect(addr(&p.r, Role::Request)).await;
    let started = std::time::Instant::now();
    let mut s = dial(&p).await;
    assert!(closed(&mut s).await, "closed once its wait expired");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waited its timeout_queue first: {:?}",
        started.elapsed()
    );
    wait_for("the access record", || !p.log.records().is_empty()).await;
    let rec = &p.log.records()[0];
    assert_eq!(
        (rec.reason, rec.master.as_deref(), rec.attempts),
        (CloseReason::QueueTimeout, None, 0)
    );
    let sc = scrape(p.admin()).await;
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_sessions_refused_total",
            &[("listener", "request"), ("reason", "queue-timeout")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_queue_current",
            &[("listener", "request")]
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_timeout_queue_the_wait_is_timeout_connect_as_haproxy() {
    let (_fakes, cfgs) = masters(&["a"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.timeout_queue = None;
    cfg.request.timeout_connect = Duration::from_millis(250);
    let p = proxy(cfg).await;
    let (_held, _) = connect(addr(&p.r, Role::Request)).await;
    let started = std::time::Instant::now();
    let mut s = dial(&p).await;
    assert!(closed(&mut s).await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    wait_for("the access record", || !p.log.records().is_empty()).await;
    assert_eq!(p.reasons(), [CloseReason::QueueTimeout]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_maxqueue_a_client_is_refused_at_once_with_queue_full() {
    let (_fakes, cfgs) = masters(&["a"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.timeout_queue = Some(Duration::from_secs(30));
    cfg.request.maxqueue = 1;
    let p = proxy(cfg).await;
    let (held, _) = connect(addr(&p.r, Role::Request)).await;
    let mut queued = dial(&p).await;
    p.wait_queued(1).await;
    let mut over = dial(&p).await;
    assert!(closed(&mut over).await, "refused: the queue is full");
    wait_for("the refusal logged", || !p.log.records().is_empty()).await;
    assert_eq!(p.reasons(), [CloseReason::QueueFull]);
    let sc = scrape(p.admin()).await;
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_sessions_refused_total",
            &[("listener", "request"), ("reason", "queue-full")]
        ),
        1.0
    );
    // The one in the queue is still served.
    drop(held);
    assert_eq!(read_line(&mut queued).await, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_maxqueue_0_a_full_cluster_refuses_at_once_as_before() {
    let (_fakes, cfgs) = masters(&["a"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.maxqueue = 0;
    cfg.request.timeout_queue = Some(Duration::from_secs(30));
    let p = proxy(cfg).await;
    let (_held, _) = connect(addr(&p.r, Role::Request)).await;
    let mut s = dial(&p).await;
    assert!(closed(&mut s).await);
    wait_for("the refusal logged", || !p.log.records().is_empty()).await;
    assert_eq!(p.reasons(), [CloseReason::NoMaster]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_going_down_does_not_strand_queued_clients() {
    let (fakes, cfgs) = masters(&["a", "b"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.timeout_queue = Some(Duration::from_secs(60));
    let p = proxy(cfg).await;
    let (mut on_a, n1) = connect(addr(&p.r, Role::Request)).await;
    let (on_b, n2) = connect(addr(&p.r, Role::Request)).await;
    assert_eq!((n1.as_str(), n2.as_str()), ("a", "b"));
    let mut waiting = dial(&p).await;
    p.wait_queued(1).await;

    // a goes DOWN: its session is closed, which wakes the queue; a is no place for the waiting
    // client, b is still full, so it keeps its place rather than being refused or sent to a.
    p.prober.set_down(fakes[0].1.addr, true);
    wait_for("a DOWN", || !p.r.master("a").unwrap().is_up()).await;
    assert!(
        closed(&mut on_a).await,
        "a's session closed (on_master_down: close)"
    );
    wait_for("a's place given back", || {
        p.r.master("a").unwrap().session_count(Role::Request) == 0
    })
    .await;
    assert_eq!(p.queued().await, 1, "still waiting, for b");

    // A place on b frees: the waiting client goes there.
    drop(on_b);
    assert_eq!(read_line(&mut waiting).await, "b");
    assert_eq!(echo(&mut waiting, b"x").await, b"x");
    assert_eq!(p.queued().await, 0);

    // With b full again and a still DOWN, a new client waits; when b goes DOWN too there is
    // nothing left to wait for: it is refused at once (no-master), not held to its 60 s.
    let mut last = dial(&p).await;
    p.wait_queued(1).await;
    p.prober.all_down.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    assert!(closed(&mut last).await);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    wait_for("the refusal logged", || {
        p.reasons().contains(&CloseReason::NoMaster)
    })
    .await;
    assert_eq!(p.queued().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_raises_maxconn_serves_the_queue_at_once() {
    let (_fakes, cfgs) = masters(&["a"]).await;
    let mut cfg = config_on(IP, cfgs, scripted_health());
    cfg.request.timeout_queue = Some(Duration::from_secs(60));
    let p = proxy(cfg.clone()).await;
    let (_held, _) = connect(addr(&p.r, Role::Request)).await;
    let mut waiting = dial(&p).await;
    p.wait_queued(1).await;
    cfg.masters[0].maxconn = Some(2);
    p.r.reload(cfg).await.expect("reload");
    assert_eq!(read_line(&mut waiting).await, "a");
}
