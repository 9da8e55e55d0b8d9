//! Request-session continuity end to end (issue 13), with real `saltgate-master` cluster members
//! (127.18.1.11 and .12, shared `cachedir` and `cluster_pki_dir`) and a Rust minion (`saltgate-minion`'s
//! request channel: `_auth`, then a v3 `_pillar` encrypted with its session key).
//!
//! saltgate reaches master A through a relay that can withhold A's replies and then drop the
//! connection: A receives the minion's `_pillar`, processes it and answers, the answer never
//! reaches the minion, A's connection dies. With `on_master_down: migrate`, saltgate moves the
//! minion's connection to master B and re-sends the request, byte for byte: B decrypts it (the
//! cluster's shared session key), answers, and the minion decrypts and verifies B's reply on the
//! connection it opened once.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saltgate_bench::lab::{
    http_get, master_config, master_states, random_hex, wait_until, MasterHandle, MasterPorts,
};
use saltgate_minion::auth::AuthOutcome;
use saltgate_minion::channel::{Identity, ReqChannel};
use saltgate_minion::keys::{MasterKeyStore, MinionKey};
use saltgate_wire::crypticle::Crypticle;
use saltgate_wire::envelope::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const GATE: &str = "127.18.1.1";
const RELAY: &str = "127.18.1.2";
const MASTERS: [&str; 2] = ["127.18.1.11", "127.18.1.12"];
const T: Duration = Duration::from_secs(60);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A TCP relay to `to` whose master → client direction can be held (bytes read and dropped;
/// counted when they answer bytes sent while holding) and whose connections can all be dropped at once: a master that processed a request
/// and died before its reply got out.
struct Relay {
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
    withheld: Arc<AtomicU64>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn start(at: &str, to: SocketAddr) -> Relay {
        let l = TcpListener::bind((at, 0)).await.unwrap();
        let r = Relay {
            addr: l.local_addr().unwrap(),
            hold: Default::default(),
            withheld: Default::default(),
            tasks: Default::default(),
        };
        let (hold, withheld, tasks) = (r.hold.clone(), r.withheld.clone(), r.tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                let Ok(master) = TcpStream::connect(to).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut mr, mut mw) = master.into_split();
                // Bytes this connection carried to A while replies were held: only a reply to
                // one of them counts as withheld (a health check's connection gets A's greeting
                // and sends nothing; that greeting is no answer to the minion's request).
                let asked = Arc::new(AtomicU64::new(0));
                let (hold_up, asked_up) = (hold.clone(), asked.clone());
                let up = tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        if hold_up.load(Ordering::SeqCst) {
                            asked_up.fetch_add(n as u64, Ordering::SeqCst);
                        }
                        if mw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let (hold, withheld) = (hold.clone(), withheld.clone());
                let down = tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = mr.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        if hold.load(Ordering::SeqCst) {
                            if asked.load(Ordering::SeqCst) > 0 {
                                withheld.fetch_add(n as u64, Ordering::SeqCst);
                            }
                        } else if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                tasks.lock().unwrap().extend([up, down]);
            }
        });
        r.tasks.lock().unwrap().push(accept);
        r
    }

    fn kill(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// saltgate's configuration: A (its requests through the relay) first, then B; `on_master_down:
/// migrate`. `publish`: the masters' publish addresses (checked only; A's on the relay's IP).
fn gate_config(
    relay: SocketAddr,
    b: SocketAddr,
    publish: [SocketAddr; 2],
) -> saltgate_config::Config {
    let text = format!(
        "global:\n  shutdown_grace: 1s\n\
         health:\n  interval: 1s\n  timeout: 2s\n  rise: 1\n  fall: 2\n  probe: tcp\n\
         masters:\n\
         \x20 - {{name: a, host: {}, publish_port: {}, request_port: {}}}\n\
         \x20 - {{name: b, host: {}, publish_port: {}, request_port: {}}}\n\
         listeners:\n\
         \x20 publish:\n    bind: \"{GATE}:1\"\n\
         \x20 request:\n    bind: \"{GATE}:2\"\n    balance: first\n    timeout_connect: 2s\n    \
         on_master_down: migrate\n    migrate_buffer: 65536\n\
         admin:\n  enabled: true\n  bind: \"{GATE}:3\"\n",
        relay.ip(),
        publish[0].port(),
        relay.port(),
        b.ip(),
        publish[1].port(),
        b.port(),
    );
    let mut c = saltgate_config::parse(&text, None, saltgate_config::Format::Yaml)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .config;
    let any = SocketAddr::new(ip(GATE), 0);
    c.publish.bind = vec![any];
    c.request.bind = vec![any];
    c.admin.bind = any;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_answered_by_a_dying_master_is_replayed_to_another_cluster_member() {
    let root = tempfile::Builder::new()
        .prefix("sgrc")
        .tempdir_in("/tmp")
        .unwrap();
    let r = root.path();
    let secret = random_hex().unwrap();
    let ports = MasterPorts {
        publish: 4505,
        request: 4506,
        cluster: 4520,
    };
    let mut masters = Vec::new();
    for (i, addr) in MASTERS.iter().enumerate() {
        let peer = SocketAddr::new(ip(MASTERS[1 - i]), ports.cluster).to_string();
        let name = format!("m{}", i + 1);
        let cfg = master_config(r, &name, ip(addr), ports, &[peer], &secret).unwrap();
        masters.push(MasterHandle::start(&name, cfg).await.unwrap());
    }
    let (a, b) = (masters[0].bound.ret, masters[1].bound.ret);
    let relay = Relay::start(RELAY, a).await;
    // A's publish port behind the relay's address too (never held): A's checks pass on both ports
    // until its request relay dies, so the minion's connection goes to A (`balance: first`).
    let a_publish = Relay::start(RELAY, masters[0].bound.publish).await;
    let (_stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let gate = saltgate_proxy::start(
        gate_config(relay.addr, b, [a_publish.addr, masters[1].bound.publish]),
        saltgate_proxy::Options::default(),
        async move {
            let _ = stop_rx.await;
        },
    )
    .await
    .unwrap();
    let request = gate.local_addrs(saltgate_config::Role::Request)[0];
    let admin = gate.admin_addr().unwrap();
    wait_until(T, "a and b UP", || async {
        let s = master_states(admin).await?;
        Ok(s.values().filter(|v| *v == "up").count() == 2)
    })
    .await
    .unwrap();

    // The minion authenticates with A directly (auto_accept), then uses saltgate.
    let pki = r.join("minion-pki");
    std::fs::create_dir_all(&pki).unwrap();
    let p = pki.clone();
    let key = tokio::task::spawn_blocking(move || MinionKey::load_or_create(&p, "minion"))
        .await
        .unwrap()
        .unwrap();
    let ident = Identity {
        id: "sg-replay-minion".into(),
        key: Arc::new(key),
        store: Arc::new(MasterKeyStore::open(&pki, None).unwrap()),
    };
    let session = {
        let direct = ReqChannel::new(ident.clone(), a, false);
        let mut out = None;
        for _ in 0..30 {
            match direct.authenticate(Duration::from_secs(10)).await {
                Ok(AuthOutcome::Accepted(s)) => {
                    out = Some(s);
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        out.expect("accepted by A")
    };
    let mut crypt = Crypticle::new(session.session.clone());
    let mut chan = ReqChannel::new(ident, request, true);
    // A first request through saltgate (on A) opens the connection and proves the path.
    let first = chan
        .pillar(&mut crypt, Value::Map(Vec::new()), T)
        .await
        .unwrap();
    assert!(matches!(first, Value::Map(_)), "{first:?}");

    // A's replies are withheld from now on; the next request is processed by A, unanswered.
    relay.hold.store(true, Ordering::SeqCst);
    let asking = tokio::spawn(async move {
        let r = chan.pillar(&mut crypt, Value::Map(Vec::new()), T).await;
        (r, chan)
    });
    if let Err(e) = wait_until(T, "A answered (withheld)", || async {
        Ok(relay.withheld.load(Ordering::SeqCst) > 0)
    })
    .await
    {
        let masters = http_get(admin, "/api/v1/masters").await.unwrap_or_default();
        panic!(
            "{e}; the request finished: {}\n{masters}",
            asking.is_finished()
        );
    }
    relay.kill();
    let (second, _chan) = asking.await.unwrap();
    let second = second.expect("the replayed request answered by B, verified by the minion");
    assert!(matches!(second, Value::Map(_)), "{second:?}");

    let metrics = http_get(admin, "/metrics").await.unwrap();
    let line = |name: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        line("saltgate_requests_replayed_total").contains("request=\"complete\"} 1"),
        "{metrics}"
    );
    assert!(
        line("saltgate_listener_sessions_total").contains("listener=\"request\"} 1"),
        "one request connection through saltgate: {metrics}"
    );
    for m in masters {
        m.kill().await;
    }
}
