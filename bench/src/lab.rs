//! A loopback lab: `saltgate-master` cluster members, each on its own thread and runtime (so
//! killing one closes every socket it holds, as a crashed process would), saltgate in front of
//! them through the proxy library, and small clients for the admin API and the masters' local
//! publish socket. Used by `saltgate-demo` and by the end-to-end tests with stock minions.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use saltgate_config::salt_master::{parse_salt_master, SaltMasterConfig};
use saltgate_master::server::{self, Bound};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// 32 random hex digits (a cluster secret).
pub fn random_hex() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .context("reading /dev/urandom for the cluster secret")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Ports of one master: publish, request (`ret_port`) and cluster pool; 0 lets the OS choose.
#[derive(Debug, Clone, Copy, Default)]
pub struct MasterPorts {
    pub publish: u16,
    pub request: u16,
    pub cluster: u16,
}

/// A cluster member's configuration: its own `pki_dir` and `sock_dir` under `root/<name>`, the
/// cluster's `cachedir` and `cluster_pki_dir` shared under `root/shared`, `auto_accept: True`
/// (a lab, never a deployment).
pub fn master_config(
    root: &Path,
    name: &str,
    ip: IpAddr,
    ports: MasterPorts,
    peers: &[String],
    secret: &str,
) -> Result<SaltMasterConfig> {
    let text = master_config_text(root, name, ip, ports, peers, secret);
    parse_salt_master(&text, None)
        .map(|l| l.config)
        .map_err(|e| anyhow!("master configuration for {name}: {e}"))
}

/// The text of [`master_config`] (Salt's master YAML), for a master started as a process.
pub fn master_config_text(
    root: &Path,
    name: &str,
    ip: IpAddr,
    ports: MasterPorts,
    peers: &[String],
    secret: &str,
) -> String {
    let d = root.display();
    let MasterPorts {
        publish,
        request,
        cluster,
    } = ports;
    format!(
        "id: {name}\ninterface: {ip}\npublish_port: {publish}\nret_port: {request}\n\
         pki_dir: {d}/{name}/pki\n\
         cachedir: {d}/shared/cache\nsock_dir: {d}/{name}/sock\nauto_accept: True\n\
         cluster_id: demo\ncluster_peers: [{}]\ncluster_pki_dir: {d}/shared/cpki\n\
         cluster_pool_port: {cluster}\ncluster_secret: {secret}\n",
        peers.join(", ")
    )
}

/// A master running on its own thread and runtime, so killing it closes every socket it holds.
pub struct MasterHandle {
    pub name: String,
    pub bound: Bound,
    rt: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MasterHandle {
    pub async fn start(name: &str, cfg: SaltMasterConfig) -> Result<Self> {
        type Ready = Result<(Bound, tokio::runtime::Handle), String>;
        let (ready_tx, ready_rx) = oneshot::channel::<Ready>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut ready_tx = Some(ready_tx);
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Err(e.to_string()));
                        }
                        return;
                    }
                };
                let handle = rt.handle().clone();
                let r = rt.block_on(server::run(
                    cfg,
                    async {
                        let _ = stop_rx.await;
                    },
                    |b| {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Ok((b.clone(), handle.clone())));
                        }
                    },
                ));
                if let Err(e) = r {
                    match ready_tx.take() {
                        Some(tx) => {
                            let _ = tx.send(Err(e.to_string()));
                        }
                        None => eprintln!("saltgate lab: master stopped with an error: {e}"),
                    }
                }
                // Drops every task (connections included): the ports close.
                rt.shutdown_background();
            })
            .context("spawning the master thread")?;
        let (bound, rt) = tokio::time::timeout(Duration::from_secs(120), ready_rx)
            .await
            .map_err(|_| anyhow!("not ready within 120 s"))?
            .map_err(|_| anyhow!("the master thread ended before it was ready"))?
            .map_err(|e| anyhow!("{e}"))?;
        Ok(Self {
            name: name.to_string(),
            bound,
            rt,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Hangs the master as SIGSTOP would: a task blocks its runtime's only worker thread, so
    /// no socket is read, no timer fires and no handler runs, while every connection stays open
    /// (the kernel still accepts and acknowledges). Thawed when the guard drops.
    pub async fn freeze(&self) -> Result<Frozen> {
        let (started_tx, started_rx) = oneshot::channel::<()>();
        let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
        self.rt.spawn(async move {
            let _ = started_tx.send(());
            // Blocking on purpose: this is the hang.
            let _ = thaw_rx.recv();
        });
        tokio::time::timeout(Duration::from_secs(10), started_rx)
            .await
            .map_err(|_| anyhow!("{}: the freeze did not start within 10 s", self.name))?
            .map_err(|_| anyhow!("{}: the runtime dropped the freeze", self.name))?;
        Ok(Frozen(thaw_tx))
    }

    /// Stops the master's runtime: every socket it holds closes at once.
    pub async fn kill(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

impl Drop for MasterHandle {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A master hung by [`MasterHandle::freeze`]; it resumes when this drops.
pub struct Frozen(std::sync::mpsc::Sender<()>);

impl Frozen {
    /// Resumes the master (as dropping the guard does).
    pub fn thaw(self) {}
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// saltgate running in this process.
pub struct Gate {
    pub publish: SocketAddr,
    pub request: SocketAddr,
    pub admin: SocketAddr,
    _running: saltgate_proxy::Running,
}

/// A master as saltgate's configuration names it (it need not be running yet: saltgate starts
/// with it DOWN and picks it up when it answers).
#[derive(Debug, Clone)]
pub struct Backend {
    pub name: String,
    pub ip: IpAddr,
    pub publish_port: u16,
    pub request_port: u16,
}

impl From<&MasterHandle> for Backend {
    fn from(m: &MasterHandle) -> Self {
        Backend {
            name: m.name.clone(),
            ip: m.bound.ret.ip(),
            publish_port: m.bound.publish.port(),
            request_port: m.bound.ret.port(),
        }
    }
}

/// The one place the proxy library is used: a configuration built as YAML text (so it goes
/// through the same validation as a file) and `saltgate_proxy::start`.
pub async fn start_saltgate(
    addrs: [SocketAddr; 3],
    masters: &[Backend],
    stop: oneshot::Receiver<()>,
) -> Result<Gate> {
    start_saltgate_in(addrs, masters, GateMode::L4, stop).await
}

/// How the lab's saltgate serves the publish port.
#[derive(Debug, Clone, Default)]
pub enum GateMode {
    /// Each minion's publish session is a tunnel to one master (the default).
    #[default]
    L4,
    /// Cluster fan-out (docs/fanout.md): saltgate is every minion's publisher and subscribes to
    /// every master; the request listener re-sends a request that a dead or hung master never
    /// answered (`on_master_down: migrate`). With `dedup`, the cluster's `cluster_pki_dir`: one
    /// copy of each job per minion.
    Fanout { dedup: Option<std::path::PathBuf> },
}

/// [`start_saltgate`] with the publish listener in `mode`.
pub async fn start_saltgate_in(
    [publish, request, admin]: [SocketAddr; 3],
    masters: &[Backend],
    mode: GateMode,
    stop: oneshot::Receiver<()>,
) -> Result<Gate> {
    let mut text = String::from(
        "global:\n  shutdown_grace: 1s\n\
         health:\n  interval: 1s\n  timeout: 2s\n  rise: 1\n  fall: 2\n  probe: salt\n\
         masters:\n",
    );
    for m in masters {
        text.push_str(&format!(
            "  - name: {}\n    host: {}\n    publish_port: {}\n    request_port: {}\n",
            m.name, m.ip, m.publish_port, m.request_port
        ));
    }
    // Fan-out: the publish listener's mode (and dedup), and requests re-sent on a master's death.
    let (publish_mode, request_down) = match &mode {
        GateMode::L4 => (String::new(), "close"),
        GateMode::Fanout { dedup } => {
            let dedup = dedup.as_ref().map_or(String::new(), |d| {
                format!("    dedup_cluster_pki_dir: \"{}\"\n", d.display())
            });
            (format!("    mode: fanout\n{dedup}"), "migrate")
        }
    };
    text.push_str(&format!(
        "listeners:\n\
         \x20 publish:\n{publish_mode}    bind: \"{}\"\n    timeout_client: 1d\n    timeout_server: 1d\n    \
         timeout_connect: 2s\n    on_master_down: close\n    close_rate: 1000\n\
         \x20 request:\n    bind: \"{}\"\n    timeout_client: 1m\n    timeout_server: 1m\n    \
         timeout_connect: 2s\n    on_master_down: {request_down}\n    close_rate: 1000\n\
         admin:\n  enabled: true\n  bind: \"{}\"\n",
        SocketAddr::new(publish.ip(), 1),
        SocketAddr::new(request.ip(), 2),
        SocketAddr::new(admin.ip(), 3)
    ));
    let mut config = saltgate_config::parse(&text, None, saltgate_config::Format::Yaml)
        .map_err(|e| anyhow!("saltgate configuration: {e}\n{text}"))?
        .config;
    // The file format wants real, distinct ports (placeholders above); the chosen ones, which
    // may be 0 (the OS picks), are set here, as the proxy's tests do.
    config.publish.bind = vec![publish];
    config.request.bind = vec![request];
    config.admin.bind = admin;
    let running = saltgate_proxy::start(config, saltgate_proxy::Options::default(), async move {
        let _ = stop.await;
    })
    .await
    .map_err(|e| anyhow!("starting saltgate: {e}"))?;
    let first = |r: saltgate_config::Role| {
        running
            .local_addrs(r)
            .first()
            .copied()
            .ok_or_else(|| anyhow!("saltgate bound no {r:?} listener"))
    };
    let publish = first(saltgate_config::Role::Publish)?;
    let request = first(saltgate_config::Role::Request)?;
    let admin = running
        .admin_addr()
        .ok_or_else(|| anyhow!("saltgate's admin API is not listening"))?;
    Ok(Gate {
        publish,
        request,
        admin,
        _running: running,
    })
}

/// GET over HTTP/1.0 (the admin API is local; no client library needed). Returns the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| anyhow!("GET http://{addr}{path}: no answer within 10 s"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("GET http://{addr}{path}: malformed HTTP reply"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!(
            "GET http://{addr}{path}: {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_string())
}

pub async fn get_json(addr: SocketAddr, path: &str) -> Result<Value> {
    let body = http_get(addr, path).await?;
    serde_json::from_str(&body).with_context(|| format!("GET http://{addr}{path}: not JSON"))
}

/// Master name → state ("up", "down", ...) from `/api/v1/masters`.
pub async fn master_states(admin: SocketAddr) -> Result<BTreeMap<String, String>> {
    let v = get_json(admin, "/api/v1/masters").await?;
    Ok(v["masters"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or("?").to_string(),
                        m["state"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Master name → client addresses of its publish sessions, from `/api/v1/sessions`.
pub async fn publish_sessions(admin: SocketAddr) -> Result<BTreeMap<String, Vec<String>>> {
    let v = get_json(admin, "/api/v1/sessions?listener=publish").await?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in v["sessions"].as_array().into_iter().flatten() {
        out.entry(s["master"].as_str().unwrap_or("?").to_string())
            .or_default()
            .push(s["client"].as_str().unwrap_or("?").to_string());
    }
    Ok(out)
}

pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + limit;
    let mut last_err = None;
    loop {
        match cond().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            return Err(match last_err {
                Some(e) => anyhow!(
                    "timed out ({} s): {what}; last error: {e:#}",
                    limit.as_secs()
                ),
                None => anyhow!("timed out ({} s): {what}", limit.as_secs()),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One publish through a master's CLI socket, with every return and when it arrived.
#[derive(Debug, Default)]
pub struct Published {
    pub jid: String,
    /// Minion id → (time from the publish to the return, the return value).
    pub returns: BTreeMap<String, (Duration, Value)>,
}

/// Publishes `fun(args)` to the glob `tgt` through the master's local socket with
/// `saltgate_master::cli::publish` (what `saltgate-master publish` uses).
pub async fn publish(
    socket: &Path,
    tgt: &str,
    fun: &str,
    args: &[Value],
    timeout_secs: u64,
) -> Result<Published> {
    let req = json!({"tgt": tgt, "fun": fun, "arg": args, "timeout_secs": timeout_secs});
    let out = tokio::time::timeout(
        Duration::from_secs(timeout_secs + 10),
        saltgate_master::cli::publish(socket, &req),
    )
    .await
    .map_err(|_| anyhow!("the job did not finish in time"))?
    .map_err(|e| anyhow!("publish through {}: {e}", socket.display()))?;
    let mut returns = BTreeMap::new();
    for r in out.returns {
        let value = r.record.get("return").cloned().unwrap_or(r.record);
        returns.entry(r.minion).or_insert((r.after, value));
    }
    Ok(Published {
        jid: out.jid,
        returns,
    })
}
