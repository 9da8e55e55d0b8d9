//! `mode: fanout` is refused, at start and on reload, over masters that are not one Salt cluster:
//! fake masters (wire's `Publisher` and `Router`) answer the cluster check's clear `_auth` with a
//! signed refusal whose signature depends on their key, as Salt's do (docs/fanout.md). Addresses:
//! 127.17.0.0/16.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::{
    AdminConfig, Config, Global, HealthSettings, ListenerConfig, ListenerMode, Role,
};
use saltgate_proxy::{start, Options, Running};
use saltgate_wire::envelope::{self, as_str, bin, get, map, text, RequestEnvelope, Value};
use saltgate_wire::zmtp::socket::router::{Router, RouterOptions};
use saltgate_wire::zmtp::{PubOptions, Publisher};
use tokio::sync::oneshot;

/// A fake master whose `_auth` refusals are "signed" with `key`: the signature is a function of
/// the key and the signed bytes only, deterministic like RSA PKCS#1 v1.5.
struct FakeMaster {
    publish: SocketAddr,
    request: SocketAddr,
    _pub: Publisher,
}

impl FakeMaster {
    async fn start(ip: &str, key: &'static str) -> FakeMaster {
        let any: SocketAddr = format!("{ip}:0").parse().unwrap();
        let publisher = Publisher::bind(any, PubOptions::default()).await.unwrap();
        let mut router = Router::bind(any, RouterOptions::default()).await.unwrap();
        let (publish, request) = (publisher.local_addr(), router.local_addr());
        tokio::spawn(async move {
            while let Some(msg) = router.recv().await {
                let Some(req) = msg
                    .frames
                    .last()
                    .and_then(|f| RequestEnvelope::decode(f).ok())
                else {
                    continue;
                };
                let reply = match get(&req.load, "cmd").and_then(as_str) {
                    Some("_auth") => {
                        let nonce = get(&req.load, "nonce").and_then(as_str).unwrap_or("");
                        let signed = envelope::encode(&map(vec![
                            ("ret", Value::Boolean(false)),
                            ("nonce", text(nonce)),
                        ]));
                        let mut sig = key.as_bytes().to_vec();
                        sig.extend_from_slice(&signed);
                        map(vec![
                            ("enc", text("clear")),
                            ("load", bin(&signed)),
                            ("sig", bin(&sig)),
                        ])
                    }
                    _ => req.load.clone(), // ping: echo
                };
                let _ = router
                    .send(
                        &msg.peer,
                        vec![Bytes::new(), Bytes::from(envelope::encode(&reply))],
                    )
                    .await;
            }
        });
        FakeMaster {
            publish,
            request,
            _pub: publisher,
        }
    }
}

fn config(masters: &[&FakeMaster], mode: ListenerMode, proxy_ip: &str) -> Config {
    let bind = SocketAddr::from((proxy_ip.parse::<std::net::IpAddr>().unwrap(), 0));
    Config {
        global: Global {
            shutdown_grace: Duration::from_secs(1),
            raise_nofile: false,
            ..Global::default()
        },
        health: HealthSettings {
            timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_millis(500),
            ..HealthSettings::default()
        },
        masters: masters
            .iter()
            .enumerate()
            .map(|(i, m)| common::master_at(i, m.publish, m.request))
            .collect(),
        publish: ListenerConfig {
            bind: vec![bind],
            mode,
            ..ListenerConfig::defaults_for(Role::Publish)
        },
        request: ListenerConfig {
            bind: vec![bind],
            ..ListenerConfig::defaults_for(Role::Request)
        },
        admin: AdminConfig {
            enabled: false,
            bind,
            token_file: None,
            allow_unauthenticated: false,
            limits: Default::default(),
        },
        discovery: None,
        presence: Default::default(),
    }
}

async fn run(cfg: Config) -> Result<(Running, oneshot::Sender<()>), String> {
    let (tx, rx) = oneshot::channel::<()>();
    start(cfg, Options::default(), async move {
        let _ = rx.await;
    })
    .await
    .map(|r| (r, tx))
    .map_err(|e| e.to_string())
}

#[tokio::test]
async fn fanout_starts_over_masters_that_sign_with_one_key() {
    let a = FakeMaster::start("127.17.0.1", "cluster").await;
    let b = FakeMaster::start("127.17.0.2", "cluster").await;
    let c = FakeMaster::start("127.17.0.3", "cluster").await;
    let (_r, _stop) = run(config(&[&a, &b, &c], ListenerMode::Fanout, "127.17.0.10"))
        .await
        .expect("one cluster key: fan-out starts");
}

#[tokio::test]
async fn fanout_is_refused_at_start_over_masters_with_different_keys() {
    let a = FakeMaster::start("127.17.1.1", "key-a").await;
    let b = FakeMaster::start("127.17.1.2", "key-b").await;
    let c = FakeMaster::start("127.17.1.3", "key-a").await;
    let e = match run(config(&[&a, &b, &c], ListenerMode::Fanout, "127.17.1.10")).await {
        Ok(_) => panic!("two keys: fan-out must be refused"),
        Err(e) => e,
    };
    assert!(e.contains("listeners.publish.mode: fanout"), "{e}");
    assert!(e.contains("2 different keys"), "{e}");
    assert!(e.contains("m0, m2 | m1"), "{e}");
    assert!(
        e.contains("listeners.publish.mode: l4"),
        "names the fix: {e}"
    );
    // the same masters in l4 mode are fine: independent masters are what L4 balances
    run(config(&[&a, &b, &c], ListenerMode::L4, "127.17.1.10"))
        .await
        .expect("l4 over independent masters starts");
}

#[tokio::test]
async fn a_reload_to_fanout_over_different_keys_is_refused_and_changes_nothing() {
    let a = FakeMaster::start("127.17.2.1", "key-a").await;
    let b = FakeMaster::start("127.17.2.2", "key-b").await;
    let (r, _stop) = run(config(&[&a, &b], ListenerMode::L4, "127.17.2.10"))
        .await
        .expect("l4 starts");
    let before = r.generation();
    let e = r
        .reload(config(&[&a, &b], ListenerMode::Fanout, "127.17.2.10"))
        .await
        .expect_err("a reload to fanout over two keys is refused");
    assert!(e.to_string().contains("2 different keys"), "{e}");
    assert_eq!(r.generation(), before, "the running config stays");
}

#[tokio::test]
async fn a_master_that_cannot_be_asked_is_not_a_reason_to_refuse() {
    let a = FakeMaster::start("127.17.3.1", "cluster").await;
    let b = FakeMaster::start("127.17.3.2", "cluster").await;
    let mut cfg = config(&[&a, &b], ListenerMode::Fanout, "127.17.3.10");
    // a third master whose request port refuses connections (down)
    let dead = std::net::TcpListener::bind("127.17.3.3:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    cfg.masters.push(common::master_at(2, dead_addr, dead_addr));
    let (_r, _stop) = run(cfg)
        .await
        .expect("the answering masters agree: fan-out starts");
}
