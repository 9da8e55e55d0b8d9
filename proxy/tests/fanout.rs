//! Issue 13, first part: the publish listener in `mode: fanout`. saltgate is each minion's PUB
//! peer and relays what every UP master publishes. Fake masters are wire `Publisher`s and minions
//! wire `Subscriber`s (or a raw ZMTP connection where the test needs to see frames), all on
//! 127.0.5.x.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::{
    AdminConfig, Config, Format, Global, HealthSettings, ListenerConfig, ListenerMode, Role,
};
use saltgate_proxy::{start, Options, Running};
use saltgate_test_support::wait_until;
use saltgate_wire::zmtp::{
    Command, Connection, Frame, HandshakeConfig, PubOptions, Publisher, ReconnectPolicy,
    SocketType, SubOptions, Subscriber,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(20);
const PROXY_IP: [u8; 4] = [127, 0, 5, 10];

fn master_ip(i: usize) -> String {
    format!("127.0.5.{}", i + 1)
}

async fn fake_master(i: usize, port: u16) -> Publisher {
    fake_master_on(&master_ip(i), port).await
}

async fn fake_master_on(ip: &str, port: u16) -> Publisher {
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    Publisher::bind(addr, PubOptions::default())
        .await
        .expect("fake master binds")
}

fn config(masters: &[&Publisher]) -> Config {
    config_at(masters, PROXY_IP)
}

fn config_at(masters: &[&Publisher], proxy_ip: [u8; 4]) -> Config {
    // The request port is not used on the publish side in fanout mode (the request listener
    // stays L4).
    let addrs: Vec<SocketAddr> = masters.iter().map(|p| p.local_addr()).collect();
    let masters = common::masters_at(&addrs);
    let bind = SocketAddr::from((proxy_ip, 0));
    Config {
        global: Global {
            shutdown_grace: Duration::from_secs(1),
            raise_nofile: false,
            ..Global::default()
        },
        health: HealthSettings::default(),
        masters,
        publish: ListenerConfig {
            bind: vec![bind],
            mode: ListenerMode::Fanout,
            ..ListenerConfig::defaults_for(Role::Publish)
        },
        request: ListenerConfig {
            bind: vec![bind],
            ..ListenerConfig::defaults_for(Role::Request)
        },
        admin: AdminConfig {
            enabled: true,
            bind,
            token_file: None,
            allow_unauthenticated: false,
            limits: Default::default(),
        },
        discovery: None,
        presence: Default::default(),
    }
}

async fn run(cfg: Config) -> (Running, oneshot::Sender<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let r = start(cfg, Options::default(), async move {
        let _ = rx.await;
    })
    .await
    .expect("proxy starts");
    (r, tx)
}

fn minion(r: &Running) -> Subscriber {
    let s = Subscriber::connect(
        r.local_addrs(Role::Publish)[0],
        SubOptions {
            reconnect: ReconnectPolicy {
                recon_randomize: false,
                ..ReconnectPolicy::default()
            },
            ..SubOptions::default()
        },
    );
    // What a Salt minion does without zmq_filtering.
    s.subscribe(Bytes::new());
    s
}

/// Publishes "<master>:<n>" from each of `masters` every few milliseconds until the minion has
/// received a message from every one of them; returns the senders seen. Repeating covers the
/// time subscriptions take to propagate (minion → saltgate, saltgate → master).
async fn until_heard_from(sub: &mut Subscriber, masters: &[(usize, &Publisher)]) -> HashSet<usize> {
    let want: HashSet<usize> = masters.iter().map(|(i, _)| *i).collect();
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + T;
    let mut n = 0u64;
    while !want.is_subset(&seen) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "heard from {seen:?}, wanted {want:?}"
        );
        n += 1;
        for (i, p) in masters {
            p.publish(vec![Bytes::from(format!("{i}:{n}"))]);
        }
        let wait = tokio::time::sleep(Duration::from_millis(20));
        tokio::pin!(wait);
        loop {
            tokio::select! {
                m = sub.recv() => {
                    let m = m.expect("minion socket alive");
                    let text = String::from_utf8_lossy(&m[0]).into_owned();
                    let from: usize = text.split(':').next().unwrap().parse().unwrap();
                    seen.insert(from);
                }
                _ = &mut wait => break,
            }
        }
    }
    seen
}

async fn metric(r: &Running, name: &str, labels: &[(&str, &str)]) -> f64 {
    let admin = r.admin_addr().expect("admin API on");
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut resp = String::new();
    tokio::time::timeout(T, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition");
    scrape
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minion_hears_every_master_and_keeps_its_session_when_one_dies_and_returns() {
    let mut masters = Vec::new();
    for i in 0..3 {
        masters.push(Some(fake_master(i, 0).await));
    }
    let ports: Vec<u16> = masters
        .iter()
        .map(|m| m.as_ref().unwrap().local_addr().port())
        .collect();
    let refs: Vec<&Publisher> = masters.iter().map(|m| m.as_ref().unwrap()).collect();
    let (r, _stop) = run(config(&refs)).await;
    let mut sub = minion(&r);
    assert!(sub.wait_connects(1, T).await, "minion connects to saltgate");

    let all: Vec<(usize, &Publisher)> = masters
        .iter()
        .enumerate()
        .map(|(i, m)| (i, m.as_ref().unwrap()))
        .collect();
    assert_eq!(until_heard_from(&mut sub, &all).await.len(), 3);
    assert_eq!(
        metric(&r, "saltgate_fanout_upstreams_connected", &[]).await,
        3.0
    );

    // Kill master 1: the minion's session stays, the two others keep arriving.
    masters[1] = None;
    let rest: Vec<(usize, &Publisher)> = [0, 2]
        .into_iter()
        .map(|i| (i, masters[i].as_ref().unwrap()))
        .collect();
    let deadline = tokio::time::Instant::now() + T;
    while metric(
        &r,
        "saltgate_fanout_upstream_disconnects_total",
        &[("master", "m1")],
    )
    .await
        < 1.0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "m1's upstream loss is counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_heard_from(&mut sub, &rest).await;
    assert!(sub.is_connected());

    // Restart it on the same address: its messages arrive again, the minion never reconnected.
    masters[1] = Some(fake_master(1, ports[1]).await);
    let all: Vec<(usize, &Publisher)> = masters
        .iter()
        .enumerate()
        .map(|(i, m)| (i, m.as_ref().unwrap()))
        .collect();
    assert_eq!(until_heard_from(&mut sub, &all).await.len(), 3);
    assert_eq!(sub.connect_count(), 1, "the minion's session never closed");
    assert!(
        metric(
            &r,
            "saltgate_fanout_upstream_connects_total",
            &[("master", "m1")]
        )
        .await
            >= 2.0
    );
    assert!(metric(&r, "saltgate_fanout_messages_fanned_total", &[]).await > 0.0);
    assert_eq!(
        metric(&r, "saltgate_fanout_sessions_current", &[]).await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_marked_down_loses_only_its_upstream_and_gets_it_back_when_up() {
    let a = fake_master(0, 0).await;
    let b = fake_master(1, 0).await;
    let (r, _stop) = run(config(&[&a, &b])).await;
    let mut sub = minion(&r);
    until_heard_from(&mut sub, &[(0, &a), (1, &b)]).await;

    let m1 = r.master("m1").expect("m1 configured");
    m1.set_port(Role::Publish, false);
    assert!(!m1.is_up());
    wait_until("m1's upstream closed", T, || b.subscriber_count() == 0).await;
    until_heard_from(&mut sub, &[(0, &a)]).await;
    assert_eq!(a.subscriber_count(), 1, "the other upstream stays");

    m1.set_port(Role::Publish, true);
    until_heard_from(&mut sub, &[(0, &a), (1, &b)]).await;
    assert_eq!(sub.connect_count(), 1);
}

/// A master publishes whatever its request port does: one whose request port fails its checks
/// (overloaded workers; a restarted Salt master whose workers do not answer a `ping` yet) keeps
/// its upstream, and a master coming back gets its upstream as soon as its publish port passes,
/// before it is UP. On 127.26.0.x.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_whose_request_port_is_down_keeps_publishing_to_the_minions() {
    let a = fake_master_on("127.26.0.1", 0).await;
    let b = fake_master_on("127.26.0.2", 0).await;
    let (r, _stop) = run(config_at(&[&a, &b], [127, 26, 0, 10])).await;
    let mut sub = minion(&r);
    until_heard_from(&mut sub, &[(0, &a), (1, &b)]).await;

    let (m0, m1) = (r.master("m0").expect("m0"), r.master("m1").expect("m1"));
    m1.set_port(Role::Request, false);
    assert!(!m1.is_up());
    // A barrier: m0's publish port goes down after m1's request port, and the hub handles every
    // master in one pass, so once m0's upstream is gone the hub has seen m1's flip too.
    m0.set_port(Role::Publish, false);
    wait_until("m0's upstream closed", T, || a.subscriber_count() == 0).await;
    assert_eq!(
        b.subscriber_count(),
        1,
        "m1's upstream stays while its publish port passes"
    );
    until_heard_from(&mut sub, &[(1, &b)]).await;
    m0.set_port(Role::Publish, true);
    until_heard_from(&mut sub, &[(0, &a), (1, &b)]).await;

    // A restart: both ports down (no upstream), then the publish port back first.
    m1.set_port(Role::Publish, false);
    wait_until("m1's upstream closed", T, || b.subscriber_count() == 0).await;
    m1.set_port(Role::Publish, true);
    assert!(!m1.is_up(), "the request port is still down");
    until_heard_from(&mut sub, &[(0, &a), (1, &b)]).await;
    assert_eq!(sub.connect_count(), 1, "the minion never reconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_minion_does_not_delay_a_fast_one_and_its_drops_are_counted() {
    let m = fake_master(0, 0).await;
    let mut cfg = config(&[&m]);
    cfg.publish.hwm = 200;
    let (r, _stop) = run(cfg).await;
    let proxy = r.local_addrs(Role::Publish)[0];

    // The stalled minion: handshakes, subscribes to everything, then never reads.
    let mut stalled = Connection::connect(proxy, &HandshakeConfig::new(SocketType::Sub))
        .await
        .expect("handshake with saltgate");
    stalled
        .send_command(&Command::Subscribe(Bytes::new()))
        .await
        .unwrap();
    let mut fast = minion(&r);
    until_heard_from(&mut fast, &[(0, &m)]).await;
    let deadline = tokio::time::Instant::now() + T;
    while metric(&r, "saltgate_fanout_sessions_current", &[]).await < 2.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "both minions attached"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // 16 KiB messages: the stalled minion's socket buffers fill, then its queue (1000), then
    // its copies are dropped. The fast one gets every message, in order, batch by batch.
    let body = vec![b'x'; 16 * 1024];
    let mut next = 0u32;
    for _batch in 0..25 {
        let first = next;
        for _ in 0..100 {
            let mut payload = next.to_be_bytes().to_vec();
            payload.extend_from_slice(&body);
            let rep = m.publish(vec![Bytes::from(payload)]);
            assert_eq!(rep.dropped, 0, "the fake master's own queue never fills");
            next += 1;
        }
        let mut want = first;
        while want < next {
            let got = tokio::time::timeout(T, fast.recv())
                .await
                .expect("the fast minion is never held up by the stalled one")
                .unwrap();
            let n = u32::from_be_bytes(got[0][..4].try_into().unwrap());
            if n < first {
                continue; // a late copy of the warm-up
            }
            assert_eq!(n, want, "in order, nothing lost for the fast minion");
            want += 1;
        }
    }
    let dropped = metric(&r, "saltgate_fanout_messages_dropped_total", &[]).await;
    assert!(
        dropped > 0.0,
        "the stalled minion's copies are dropped and counted"
    );
    assert!(dropped < f64::from(next), "{dropped}");

    // The admin view names the stalled session, its drops and its queue (at most `hwm`), and
    // the master's upstream.
    let admin = r.admin_addr().unwrap();
    let (code, v) = common::api::json(admin, "GET", "/api/v1/fanout", None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (v["mode"].as_str(), v["running"].as_bool()),
        (Some("fanout"), Some(true))
    );
    assert_eq!(
        (v["hwm"].as_u64(), v["sessions"].as_u64()),
        (Some(200), Some(2)),
        "{v}"
    );
    let drops = v["sessions_dropping"].as_array().unwrap();
    assert_eq!(drops.len(), 1, "only the stalled minion drops: {v}");
    assert_eq!(
        drops[0]["client"].as_str(),
        Some(stalled.stream().local_addr().unwrap().to_string().as_str())
    );
    assert_eq!(drops[0]["dropped"].as_f64(), Some(dropped), "{v}");
    assert!(drops[0]["queued"].as_u64().unwrap() <= 200, "{v}");
    let up = &v["upstreams"][0];
    assert_eq!(
        up["addr"].as_str(),
        Some(m.local_addr().to_string().as_str()),
        "{v}"
    );
    assert_eq!(up["connected"].as_bool(), Some(true), "{v}");
    assert!(up["messages"].as_u64().unwrap() >= u64::from(next), "{v}");
    assert_eq!(v["dedup"]["enabled"].as_bool(), Some(false), "{v}");
    let (code, e) = common::api::json(admin, "GET", "/api/v1/fanout?limit=0", None).await;
    assert!(
        code == 400 && e["error"].as_str().unwrap().contains("limit=1..1000"),
        "{e}"
    );
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fanout_view_follows_upstreams_and_says_when_the_listener_is_l4() {
    let m = fake_master_on("127.30.1.2", 0).await;
    let mut cfg = config_at(&[&m], [127, 30, 1, 1]);
    cfg.masters[0].check = true;
    cfg.masters[0].health.interval = Duration::from_millis(100);
    let (r, _stop) = run(cfg.clone()).await;
    let admin = r.admin_addr().unwrap();
    let (_, v) = common::api::json(admin, "GET", "/api/v1/fanout", None).await;
    assert_eq!(v["running"].as_bool(), Some(false), "no session yet: {v}");
    let mut sub = minion(&r);
    until_heard_from(&mut sub, &[(0, &m)]).await;
    let (_, v) = common::api::json(admin, "GET", "/api/v1/fanout", None).await;
    assert_eq!(v["upstreams_connected"].as_u64(), Some(1), "{v}");
    // The master goes away: the view says why its upstream is down, and once its publish
    // port fails its checks the upstream is gone.
    drop(m);
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (_, v) = common::api::json(admin, "GET", "/api/v1/fanout", None).await;
        if v["upstreams"].as_array().is_some_and(|a| a.is_empty()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead master's upstream stays: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let l4 = Config {
        publish: ListenerConfig {
            mode: ListenerMode::L4,
            ..cfg.publish.clone()
        },
        ..cfg
    };
    let (r, _stop) = run(l4).await;
    let (code, v) = common::api::json(r.admin_addr().unwrap(), "GET", "/api/v1/fanout", None).await;
    assert_eq!(
        (code, v["mode"].as_str(), v["running"].as_bool()),
        (200, Some("l4"), Some(false))
    );
    assert!(
        v["note"]
            .as_str()
            .unwrap()
            .contains("listeners.publish.mode: fanout"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saltgate_answers_a_minions_ping_and_speaks_pub() {
    let m = fake_master(0, 0).await;
    let (r, _stop) = run(config(&[&m])).await;
    let mut c = Connection::connect(
        r.local_addrs(Role::Publish)[0],
        &HandshakeConfig::new(SocketType::Sub),
    )
    .await
    .expect("a SUB handshakes with saltgate");
    assert_eq!(c.peer().socket_type, SocketType::Pub);
    c.send_command(&Command::Ping {
        ttl: 0,
        context: Bytes::from_static(b"hb-1"),
    })
    .await
    .unwrap();
    let pong = tokio::time::timeout(T, async {
        loop {
            if let Frame::Command(body) = c.read_frame().await.expect("connection stays up") {
                if let Ok(Command::Pong { context }) = Command::parse(&body) {
                    return context;
                }
            }
        }
    })
    .await
    .expect("PONG arrives");
    assert_eq!(&pong[..], b"hb-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_peer_is_refused_by_the_hub() {
    let m = fake_master(0, 0).await;
    let (r, _stop) = run(config(&[&m])).await;
    let e = Connection::connect(
        r.local_addrs(Role::Publish)[0],
        &HandshakeConfig::new(SocketType::Req),
    )
    .await
    .expect_err("REQ cannot talk to PUB");
    let text = e.to_string();
    assert!(
        text.contains("PUB") || text.contains("closed") || text.contains("i/o"),
        "{text}"
    );
}

const YAML: &str = "masters:
  - name: a
    host: 127.0.5.1
listeners:
  publish:
    bind: 127.0.5.10:4505
    MODE_P
  request:
    bind: 127.0.5.10:4506
    MODE_R
";

fn parse(p: &str, q: &str) -> Result<Config, String> {
    let text = YAML.replace("MODE_P", p).replace("MODE_R", q);
    saltgate_config::parse(&text, Some(Path::new("saltgate.yaml")), Format::Yaml)
        .map(|l| l.config)
        .map_err(|e| e.to_string())
}

#[test]
fn mode_defaults_to_l4_and_fanout_is_accepted_on_the_publish_listener() {
    let c = parse("", "").unwrap();
    assert_eq!(c.publish.mode, ListenerMode::L4);
    let c = parse("mode: fanout", "mode: l4").unwrap();
    assert_eq!(c.publish.mode, ListenerMode::Fanout);
    assert_eq!(c.request.mode, ListenerMode::L4);
    // The emitter writes it, and what it writes reads back the same.
    let text = saltgate_config::emit::to_yaml(&c, "test");
    assert!(text.contains("mode: fanout"), "{text}");
    let back = saltgate_config::parse(&text, None, Format::Yaml)
        .expect("emitted YAML parses")
        .config;
    assert_eq!(back.publish.mode, ListenerMode::Fanout);
}

#[test]
fn fanout_on_the_request_listener_and_unknown_modes_are_refused_with_the_fix() {
    let e = parse("", "mode: fanout").unwrap_err();
    assert!(e.contains("listeners.request.mode"), "{e}");
    assert!(e.contains("publish listener only"), "{e}");
    let e = parse("mode: broadcast", "").unwrap_err();
    assert!(e.contains("listeners.publish.mode"), "{e}");
    assert!(e.contains("l4") && e.contains("fanout"), "{e}");
}

/// Sends 16 KiB messages from `m` until saltgate counts drops (a minion's queue is full).
async fn publish_until_dropped(r: &Running, m: &Publisher) {
    let body = Bytes::from(vec![b'y'; 16 * 1024]);
    let deadline = tokio::time::Instant::now() + T;
    while metric(r, "saltgate_fanout_messages_dropped_total", &[]).await == 0.0 {
        assert!(tokio::time::Instant::now() < deadline, "no drop counted");
        for _ in 0..200 {
            m.publish(vec![body.clone()]);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One master, saltgate in front, and one minion subscribed to everything through it.
async fn one_subscribed_minion() -> (
    Publisher,
    Running,
    oneshot::Sender<()>,
    Connection<tokio::net::TcpStream>,
) {
    let m = fake_master(0, 0).await;
    let (r, stop) = run(config(&[&m])).await;
    let mut c = Connection::connect(
        r.local_addrs(Role::Publish)[0],
        &HandshakeConfig::new(SocketType::Sub),
    )
    .await
    .unwrap();
    c.send_command(&Command::Subscribe(Bytes::new()))
        .await
        .unwrap();
    assert!(m.wait_for_subscribed(1, T).await, "upstream subscribed");
    (m, r, stop, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_not_held_by_a_minion_that_never_reads() {
    let (m, r, stop, stalled) = one_subscribed_minion().await;
    publish_until_dropped(&r, &m).await;
    // saltgate's write to the stalled minion is blocked now; the drain must still end.
    stop.send(()).unwrap();
    tokio::time::timeout(T, r.wait())
        .await
        .expect("shutdown completes after the grace although the minion never reads");
    drop(stalled);
}

/// An idle minion (it reads, nothing comes) holds the shutdown no longer than the grace: the
/// hub tells its sessions to stop through their queues (no session watches the stop tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_an_idle_minions_session_after_the_grace() {
    let (_m, r, stop, mut idle) = one_subscribed_minion().await;
    stop.send(()).unwrap();
    tokio::time::timeout(T, r.wait())
        .await
        .expect("shutdown completes after the grace with an idle minion connected");
    // Its session was closed: the minion reads the end of the stream.
    let end = tokio::time::timeout(T, async {
        loop {
            if idle.read_frame().await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the idle minion's session stayed open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_turns_an_l4_publish_listener_into_a_fanout_one() {
    let a = fake_master(0, 0).await;
    let b = fake_master(1, 0).await;
    let mut cfg = config(&[&a, &b]);
    cfg.publish.mode = ListenerMode::L4;
    let (r, _stop) = run(cfg.clone()).await;
    cfg.publish.mode = ListenerMode::Fanout;
    r.reload(cfg).await.expect("reload to fanout applies");
    let mut sub = minion(&r);
    assert_eq!(
        until_heard_from(&mut sub, &[(0, &a), (1, &b)]).await.len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_answers_a_masters_pings_so_it_is_never_dropped_for_silence() {
    // A master that PINGs every 50 ms and drops a subscriber silent for 200 ms.
    let addr: SocketAddr = format!("{}:0", master_ip(0)).parse().unwrap();
    let m = Publisher::bind(
        addr,
        PubOptions {
            heartbeat: Some(saltgate_wire::zmtp::Heartbeat {
                interval: Duration::from_millis(50),
                timeout: Duration::from_millis(200),
                ttl: Duration::ZERO,
            }),
            ..PubOptions::default()
        },
    )
    .await
    .unwrap();
    let (r, _stop) = run(config(&[&m])).await;
    let mut sub = minion(&r);
    until_heard_from(&mut sub, &[(0, &m)]).await;
    // Ten times the master's timeout, hearing from it all along.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < until {
        until_heard_from(&mut sub, &[(0, &m)]).await;
    }
    assert_eq!(
        metric(
            &r,
            "saltgate_fanout_upstream_connects_total",
            &[("master", "m0")]
        )
        .await,
        1.0,
        "the upstream PONGs the master's PINGs: never dropped, never re-dialled"
    );
    assert_eq!(
        metric(
            &r,
            "saltgate_fanout_upstream_disconnects_total",
            &[("master", "m0")]
        )
        .await,
        0.0
    );
}

/// pyzmq (libzmq 4.3, what Salt's minion runs on) as the minion: `$SALTGATE_VENV/bin/python`.
fn venv_python() -> std::path::PathBuf {
    let venv = std::env::var_os("SALTGATE_VENV").unwrap_or_else(|| {
        panic!("SALTGATE_VENV is not set: run ./scripts/test.sh (it exports the Salt 3008.5 venv with pyzmq)")
    });
    let py = std::path::PathBuf::from(venv).join("bin/python");
    assert!(
        py.exists(),
        "{} missing: run ./scripts/test.sh",
        py.display()
    );
    py
}

const PYZMQ_MINION: &str = r#"
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.SUB)
s.setsockopt(zmq.RCVTIMEO, 20000)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1])
want = set(sys.argv[2].split(","))
seen = set()
while not want <= seen:
    frames = s.recv_multipart()
    seen.add(frames[0].decode().split(":")[0])
print("heard " + ",".join(sorted(seen)), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pyzmq_minion_hears_every_master_through_the_hub() {
    let py = venv_python();
    let a = fake_master(0, 0).await;
    let b = fake_master(1, 0).await;
    let (r, _stop) = run(config(&[&a, &b])).await;
    let url = format!("tcp://{}", r.local_addrs(Role::Publish)[0]);
    let mut child = tokio::process::Command::new(py)
        .arg("-c")
        .arg(PYZMQ_MINION)
        .arg(&url)
        .arg("0,1")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut out = child.stdout.take().unwrap();
    let reader = tokio::spawn(async move {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s).await;
        s
    });
    // Publish from both masters until the pyzmq minion has heard both and exited.
    let deadline = tokio::time::Instant::now() + T;
    let mut n = 0u64;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pyzmq minion never heard both masters"
        );
        n += 1;
        a.publish(vec![Bytes::from(format!("0:{n}"))]);
        b.publish(vec![Bytes::from(format!("1:{n}"))]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let said = reader.await.unwrap();
    assert!(
        status.success(),
        "pyzmq minion failed: {status}, said {said:?}"
    );
    assert_eq!(said.trim(), "heard 0,1");
}
