//! Test harness: tagged echo masters on 127.0.0.x, a scripted prober, configs, and waits with
//! deadlines (no sleeps where a condition can be awaited).
#![allow(dead_code)]

pub mod api;
pub mod logs;
pub mod migrate_lab;
pub mod migrate_real;
pub mod mode_master;
pub mod router;
pub mod salt_real;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saltgate_config::{
    AdminConfig, Balance, Config, Global, HealthSettings, ListenerConfig, MasterConfig,
    OnMasterDown, Probe, Role,
};
use saltgate_proxy::check::Prober;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub const T: Duration = Duration::from_secs(10);

/// Awaits `cond` with the proxy tests' deadline `T` (test-support's one condition wait).
pub async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    saltgate_test_support::wait_until(what, T, cond).await
}

/// A port on `ip` that was free a moment ago, for configuration files, which must name their
/// listener ports (the loaders refuse port 0). Racy by nature: everything else binds port 0.
pub fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `127.0.0.1:<free port>`.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port("127.0.0.1")))
}

/// How a fake master behaves on each connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Sends "<name>\n", then echoes everything.
    Echo,
    /// Sends "<name>\n", reads to EOF, then replies "got <n>" and closes.
    ReplyAfterEof,
    /// Sends "<name>\n" and half-closes; counts what it still receives.
    CloseFirst,
}

/// A fake master port's connections; `stopped` set, the accept task takes no more.
#[derive(Default)]
struct Conns {
    stopped: bool,
    tasks: Vec<JoinHandle<()>>,
}

/// A fake master port: a TCP server on a fixed address that can be stopped and started again.
pub struct FakeMaster {
    pub name: String,
    pub addr: SocketAddr,
    behaviour: Behaviour,
    /// The accept task and its listener, while serving.
    task: Mutex<Option<(JoinHandle<()>, Arc<TcpListener>)>>,
    conns: Arc<Mutex<Conns>>,
    pub accepted: Arc<AtomicUsize>,
    pub received: Arc<AtomicU64>,
}

impl FakeMaster {
    pub async fn start(name: &str, ip: &str, behaviour: Behaviour) -> Arc<FakeMaster> {
        Self::start_at(name, SocketAddr::new(ip.parse().unwrap(), 0), behaviour).await
    }

    pub async fn start_at(name: &str, addr: SocketAddr, behaviour: Behaviour) -> Arc<FakeMaster> {
        Self::try_start_at(name, addr, behaviour)
            .await
            .expect("bind fake master")
    }

    /// As [`FakeMaster::start_at`]; `None` when the address is taken.
    pub async fn try_start_at(
        name: &str,
        addr: SocketAddr,
        behaviour: Behaviour,
    ) -> Option<Arc<FakeMaster>> {
        let l = TcpListener::bind(addr).await.ok()?;
        let m = Arc::new(FakeMaster {
            name: name.into(),
            addr: l.local_addr().unwrap(),
            behaviour,
            task: Mutex::new(None),
            conns: Default::default(),
            accepted: Default::default(),
            received: Default::default(),
        });
        m.serve(l);
        Some(m)
    }

    fn serve(&self, l: TcpListener) {
        let (name, beh, conns, accepted, received) = (
            self.name.clone(),
            self.behaviour,
            self.conns.clone(),
            self.accepted.clone(),
            self.received.clone(),
        );
        let l = Arc::new(l);
        let listener = l.clone();
        conns.lock().unwrap().stopped = false;
        let t = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                // Under the lock `stop` takes: a connection accepted as it stops is dropped
                // here, not left serving after it.
                let mut c = conns.lock().unwrap();
                if c.stopped {
                    continue;
                }
                accepted.fetch_add(1, Ordering::SeqCst);
                let name = name.clone();
                let received = received.clone();
                c.tasks.push(tokio::spawn(async move {
                    if s.write_all(format!("{name}\n").as_bytes()).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; 65536];
                    match beh {
                        Behaviour::Echo => loop {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    received.fetch_add(n as u64, Ordering::SeqCst);
                                    if s.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        },
                        Behaviour::ReplyAfterEof => {
                            let mut total = 0;
                            while let Ok(n) = s.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                total += n;
                            }
                            let _ = s.write_all(format!("got {total}").as_bytes()).await;
                        }
                        Behaviour::CloseFirst => {
                            let _ = s.shutdown().await;
                            while let Ok(n) = s.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                received.fetch_add(n as u64, Ordering::SeqCst);
                            }
                        }
                    }
                }));
            }
        });
        *self.task.lock().unwrap() = Some((t, listener));
    }

    /// Stops listening and drops every connection (the peer sees FIN/RST). The listening socket
    /// is shut down before this returns: aborting the accept task alone closes it only when a
    /// worker next polls that task, and a connect in between completed in the kernel and was
    /// then reset, where the test expected a refusal.
    pub fn stop(&self) {
        let mut c = self.conns.lock().unwrap();
        c.stopped = true;
        if let Some((t, l)) = self.task.lock().unwrap().take() {
            let _ = socket2::SockRef::from(&*l).shutdown(std::net::Shutdown::Both);
            t.abort();
        }
        for t in c.tasks.drain(..) {
            t.abort();
        }
    }

    /// Listens again on the same address.
    pub async fn restart(&self) {
        let mut tries = 0;
        let l = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 200 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("rebind {}: {e}", self.addr),
            }
        };
        self.serve(l);
    }
}

/// A master with both ports (publish, request).
pub struct FakeCluster {
    pub masters: Vec<(Arc<FakeMaster>, Arc<FakeMaster>)>,
}

impl FakeCluster {
    /// Masters named a, b, c... on 127.0.0.2, .3, .4...
    pub async fn start(n: usize, behaviour: Behaviour) -> FakeCluster {
        let mut masters = Vec::new();
        for i in 0..n {
            let name = ((b'a' + i as u8) as char).to_string();
            let ip = format!("127.0.0.{}", i + 2);
            masters.push((
                FakeMaster::start(&name, &ip, behaviour).await,
                FakeMaster::start(&name, &ip, behaviour).await,
            ));
        }
        FakeCluster { masters }
    }

    pub fn port(&self, i: usize, role: Role) -> &Arc<FakeMaster> {
        match role {
            Role::Publish => &self.masters[i].0,
            Role::Request => &self.masters[i].1,
        }
    }

    /// A saltgate config for these masters, listeners on 127.0.0.1:0, fast checks.
    pub fn config(&self) -> Config {
        let masters = self
            .masters
            .iter()
            .map(|(p, r)| {
                checked_master(
                    &p.name,
                    &p.addr.ip().to_string(),
                    p.addr.port(),
                    r.addr.port(),
                    scripted_health(),
                )
            })
            .collect();
        config_on("127.0.0.1", masters, scripted_health())
    }
}

/// Master `m<i>` with its publish and request ports, unchecked, weight 1.
pub fn master_at(i: usize, publish: SocketAddr, request: SocketAddr) -> MasterConfig {
    MasterConfig {
        check: false,
        ..checked_master(
            &format!("m{i}"),
            &publish.ip().to_string(),
            publish.port(),
            request.port(),
            HealthSettings::default(),
        )
    }
}

/// Master `name` at `host` with its publish and request ports, weight 1, no `maxconn`, checked
/// on `health`: the fake (and real) masters' config the tests build.
pub fn checked_master(
    name: &str,
    host: &str,
    publish_port: u16,
    request_port: u16,
    health: HealthSettings,
) -> MasterConfig {
    MasterConfig {
        name: name.into(),
        host: host.into(),
        publish_port,
        request_port,
        weight: 1,
        maxconn: None,
        backup: false,
        disabled: false,
        check: true,
        health,
    }
}

/// The scripted-health tests' schedule: fast (20 ms), two checks to rise or fall.
pub fn scripted_health() -> HealthSettings {
    HealthSettings {
        interval: Duration::from_millis(20),
        fastinter: Duration::from_millis(20),
        downinter: Duration::from_millis(20),
        rise: 2,
        fall: 2,
        timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(500),
        probe: Probe::Tcp,
    }
}

/// Masters `m0`, `m1`, ... at `addrs` (publish and request port both the address's port, as fake
/// publishers have one): the fan-out tests' upstreams.
pub fn masters_at(addrs: &[SocketAddr]) -> Vec<MasterConfig> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| master_at(i, *a, *a))
        .collect()
}

/// A saltgate config over `masters`: listeners and admin API on `ip`, port 0; 2 s connects; a DOWN
/// master's sessions closed at once; 5 s shutdown grace.
pub fn config_on(ip: &str, masters: Vec<MasterConfig>, health: HealthSettings) -> Config {
    let any: SocketAddr = format!("{ip}:0").parse().expect("an IP address");
    let listener = |role| ListenerConfig {
        bind: vec![any],
        balance: Balance::RoundRobin,
        timeout_connect: Duration::from_secs(2),
        on_master_down: OnMasterDown::Close,
        close_rate: 0,
        ..ListenerConfig::defaults_for(role)
    };
    Config {
        global: Global {
            shutdown_grace: Duration::from_secs(5),
            raise_nofile: false,
            maxconn: None,
            drain_timeout: Duration::from_secs(300),
            tcp_user_timeout: Some(Duration::from_secs(60)),
            threads: None,
            ..Global::default()
        },
        health,
        masters,
        publish: listener(Role::Publish),
        request: listener(Role::Request),
        admin: AdminConfig {
            enabled: true,
            bind: any,
            token_file: None,
            allow_unauthenticated: false,
            limits: Default::default(),
        },
        discovery: None,
        presence: Default::default(),
    }
}

/// A prober whose answers the test sets per address; counts probes per address.
#[derive(Default)]
pub struct ScriptedProber {
    pub down: Mutex<HashMap<SocketAddr, bool>>,
    pub probes: Mutex<HashMap<SocketAddr, u64>>,
    pub all_down: AtomicBool,
}

impl ScriptedProber {
    pub fn set_down(&self, addr: SocketAddr, down: bool) {
        self.down.lock().unwrap().insert(addr, down);
    }
    pub fn probes(&self, addr: SocketAddr) -> u64 {
        *self.probes.lock().unwrap().get(&addr).unwrap_or(&0)
    }
}

impl Prober for ScriptedProber {
    fn probe(
        &self,
        addr: SocketAddr,
        _role: Role,
        _health: HealthSettings,
    ) -> Pin<Box<dyn Future<Output = Result<(), saltgate_proxy::check::CheckFailure>> + Send + '_>>
    {
        *self.probes.lock().unwrap().entry(addr).or_default() += 1;
        let down = self.all_down.load(Ordering::SeqCst)
            || *self.down.lock().unwrap().get(&addr).unwrap_or(&false);
        Box::pin(async move {
            if down {
                Err("scripted failure".into())
            } else {
                Ok(())
            }
        })
    }
}

/// Connects to the proxy and reads the master's name banner.
pub async fn connect(addr: SocketAddr) -> (TcpStream, String) {
    let mut s = tokio::time::timeout(T, TcpStream::connect(addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let name = read_line(&mut s).await;
    (s, name)
}

pub async fn read_line(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match tokio::time::timeout(T, s.read(&mut b))
            .await
            .expect("read timed out")
        {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => out.push(b[0]),
            Err(e) => panic!("read: {e}"),
        }
    }
    String::from_utf8(out).unwrap()
}

/// Writes `data` and reads the same number of bytes back.
pub async fn echo(s: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    s.write_all(data).await.expect("write");
    let mut back = vec![0u8; data.len()];
    tokio::time::timeout(T, s.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .expect("echo read");
    back
}

/// True when the peer has closed: read returns EOF or an error within the deadline.
pub async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(T, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}
