//! Salt-aware health checks against fake masters built on the `wire` crate: a master is UP only
//! when its publish port greets in ZMTP and its request port answers Salt's clear `ping`; a cluster
//! member answering `cluster_retry` is not ready; a hung master (accepts, never answers) is DOWN,
//! where a TCP check would call it UP.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use saltgate_config::{Probe, Role};
use saltgate_proxy::{start, Options, Running};
use saltgate_wire::envelope::{self, map, text, RequestEnvelope, Value};
use saltgate_wire::zmtp::socket::router::{Router, RouterOptions};
use saltgate_wire::zmtp::{PubOptions, Publisher};

/// A fake Salt master: a ZMTP PUB on its publish port and a ROUTER on its request port that
/// answers `ping` with the echoed load, or with `cluster_retry` while `ready` is false.
struct FakeSalt {
    publish: SocketAddr,
    request: SocketAddr,
    ready: Arc<AtomicBool>,
    _pub: Publisher,
}

impl FakeSalt {
    async fn start(ip: &str, ready: bool) -> FakeSalt {
        let any: SocketAddr = format!("{ip}:0").parse().unwrap();
        let publisher = Publisher::bind(any, PubOptions::default()).await.unwrap();
        let mut router = Router::bind(any, RouterOptions::default()).await.unwrap();
        let ready = Arc::new(AtomicBool::new(ready));
        let (publish, request, r) = (publisher.local_addr(), router.local_addr(), ready.clone());
        tokio::spawn(async move {
            while let Some(msg) = router.recv().await {
                let Some(req) = msg
                    .frames
                    .last()
                    .and_then(|f| RequestEnvelope::decode(f).ok())
                else {
                    continue;
                };
                let reply = if r.load(Ordering::SeqCst) {
                    req.load.clone()
                } else {
                    map(vec![
                        ("enc", text("clear")),
                        (
                            "load",
                            map(vec![
                                ("ret", Value::Boolean(false)),
                                ("cluster_retry", Value::Boolean(true)),
                            ]),
                        ),
                    ])
                };
                let _ = router
                    .send(
                        &msg.peer,
                        vec![Bytes::new(), Bytes::from(envelope::encode(&reply))],
                    )
                    .await;
            }
        });
        FakeSalt {
            publish,
            request,
            ready,
            _pub: publisher,
        }
    }
}

/// A port that accepts connections (the kernel does) but never answers: a SIGSTOPped master.
async fn hung_port(ip: &str) -> (tokio::net::TcpListener, SocketAddr) {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

fn master(
    name: &str,
    publish: SocketAddr,
    request: SocketAddr,
    probe: Probe,
) -> saltgate_config::MasterConfig {
    let base = FakeCluster {
        masters: Vec::new(),
    }
    .config()
    .health;
    saltgate_config::MasterConfig {
        name: name.into(),
        host: publish.ip().to_string(),
        publish_port: publish.port(),
        request_port: request.port(),
        weight: 1,
        maxconn: None,
        backup: false,
        disabled: false,
        check: true,
        health: saltgate_config::HealthSettings {
            probe,
            timeout: Duration::from_millis(300),
            ..base
        },
    }
}

async fn run(
    masters: Vec<saltgate_config::MasterConfig>,
) -> (Running, tokio::sync::oneshot::Sender<()>) {
    let mut cfg = FakeCluster {
        masters: Vec::new(),
    }
    .config();
    cfg.masters = masters;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let r = start(cfg, Options::default(), async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    (r, tx)
}

#[tokio::test]
async fn salt_probe_needs_a_zmtp_publisher_and_a_ping_answer() {
    let ok = FakeSalt::start("127.0.0.2", true).await;
    let not_ready = FakeSalt::start("127.0.0.3", false).await;
    let echo = FakeCluster::start(1, Behaviour::Echo).await; // plain TCP, no ZMTP
    let (r, _stop) = run(vec![
        master("ok", ok.publish, ok.request, Probe::Salt),
        master("joining", not_ready.publish, not_ready.request, Probe::Salt),
        master(
            "plain",
            echo.port(0, Role::Publish).addr,
            echo.port(0, Role::Request).addr,
            Probe::Salt,
        ),
    ])
    .await;
    assert!(r.master("ok").unwrap().is_up());
    let joining = r.master("joining").unwrap();
    wait_for(
        "the not-ready master DOWN after `fall` failed pings",
        || !joining.is_up(),
    )
    .await;
    assert!(joining.port_is_up(Role::Publish), "its publisher greets");
    assert!(
        joining
            .last_check(Role::Request)
            .detail
            .contains("cluster_retry"),
        "{:?}",
        joining.last_check(Role::Request)
    );
    let plain = r.master("plain").unwrap();
    wait_for("the non-ZMTP master DOWN", || !plain.is_up()).await;
    assert!(
        plain.last_check(Role::Publish).detail.contains("ZMTP"),
        "{:?}",
        plain.last_check(Role::Publish)
    );

    // The cluster member becomes ready: UP after `rise` good pings.
    not_ready.ready.store(true, Ordering::SeqCst);
    wait_for("joining master ready", || joining.is_up()).await;
}

#[tokio::test]
async fn a_hung_master_is_down_for_the_salt_probe_and_up_for_tcp() {
    let (_l1, hung_pub) = hung_port("127.0.0.4").await;
    let (_l2, hung_req) = hung_port("127.0.0.4").await;
    let (r, _stop) = run(vec![
        master("hung-salt", hung_pub, hung_req, Probe::Salt),
        master("hung-tcp", hung_pub, hung_req, Probe::Tcp),
    ])
    .await;
    let salt = r.master("hung-salt").unwrap();
    let tcp = r.master("hung-tcp").unwrap();
    wait_for("the Salt probe times out `fall` times", || !salt.is_up()).await;
    assert!(
        tcp.is_up(),
        "a TCP connect succeeds on a hung master (the kernel accepts)"
    );
    assert!(tcp.last_check(Role::Publish).ok && tcp.last_check(Role::Request).ok);
    assert!(
        salt.last_check(Role::Publish)
            .detail
            .contains("no ZMTP handshake"),
        "{:?}",
        salt.last_check(Role::Publish)
    );
}

#[tokio::test]
async fn zmtp_probe_checks_the_greeting_on_both_ports() {
    let ok = FakeSalt::start("127.0.0.5", false).await;
    let (r, _stop) = run(vec![master("z", ok.publish, ok.request, Probe::Zmtp)]).await;
    assert!(
        r.master("z").unwrap().is_up(),
        "greetings suffice, even while not ready for pings"
    );
}
