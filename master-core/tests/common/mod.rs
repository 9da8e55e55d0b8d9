//! Helpers for master-core's integration tests: the real-Salt venv, process guards, and a
//! `saltgate-master` started on a loopback address of 127.0.1.0/24 with ports chosen by the OS.
#![allow(dead_code)]

pub mod salt_transport;

#[allow(unused_imports)] // each test binary uses its own subset
pub use saltgate_test_support::{
    start_salt_minion, venv, wait_for, write_minion_config, ProcGuard,
};

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_saltgate-master")
}

/// Writes a Salt-format master config under `dir/conf/master` and returns its path.
pub fn write_master_config(dir: &Path, ip: &str, extra: &str) -> PathBuf {
    let d = dir.display();
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    let path = dir.join("conf/master");
    std::fs::write(
        &path,
        format!(
            "id: sg-test-master\ninterface: {ip}\npublish_port: 0\nret_port: 0\n\
             pki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n\
             key_logfile: {d}/key.log\nlog_file: {d}/salt.log\nuser: root\n\
             pillar_roots: {{base: [{d}/pillar]}}\n{extra}"
        ),
    )
    .unwrap();
    // The master key from openssl: a debug-build RSA key generation takes tens of seconds.
    std::fs::create_dir_all(dir.join("pki")).unwrap();
    std::fs::write(dir.join("pki/master.pem"), openssl_pem()).unwrap();
    path
}

pub use saltgate_test_support::openssl_pem;

/// A running `saltgate-master run`.
pub struct RunningMaster {
    pub guard: ProcGuard,
    pub ret: SocketAddr,
    pub publish: SocketAddr,
    pub config: PathBuf,
    pub log: PathBuf,
    /// The cluster peer port, when the config has `cluster_id`.
    pub cluster: Option<SocketAddr>,
}

pub fn start_master(config: &Path, log: &Path) -> RunningMaster {
    start_master_cmd(Command::new(bin()), config, log)
}

/// `start_master` with at most `nofile` descriptors (util-linux `prlimit`, which execs the
/// master: the guard's PID is the master's).
#[allow(dead_code)] // not every test binary uses it
pub fn start_master_with_nofile(config: &Path, log: &Path, nofile: u64) -> RunningMaster {
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--nofile={nofile}:{nofile}")).arg(bin());
    start_master_cmd(cmd, config, log)
}

fn start_master_cmd(mut cmd: Command, config: &Path, log: &Path) -> RunningMaster {
    cmd.arg("-c")
        .arg(config)
        .arg("run")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    let mut guard = ProcGuard::spawn("saltgate-master", cmd);
    let stdout = guard.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| {
            panic!(
                "master never said ready:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    let field = |k: &str| -> String {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
            .to_string()
    };
    let cluster = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("cluster="))
        .map(|a| a.parse().unwrap());
    RunningMaster {
        cluster,
        ret: field("ret=").parse().unwrap(),
        publish: field("publish=").parse().unwrap(),
        guard,
        config: config.to_path_buf(),
        log: log.to_path_buf(),
    }
}

/// Runs `saltgate-master -c config ARGS...`.
pub fn cli(config: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("-c")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run saltgate-master")
}

pub fn stdout_json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// A two-member saltgate-master cluster under `root` on `ips`: the cluster key made with openssl
/// in `root/cpki` (the shared `cluster_pki_dir`), one shared cachedir (`root/shared-cache`,
/// Salt's default cluster topology), `auto_accept`, and ids `sg-master-a` and `sg-master-b`. A
/// starts first (its configured peer is unreachable) and B joins it.
pub fn start_cluster_pair(root: &Path, ips: [&str; 2]) -> (RunningMaster, RunningMaster) {
    let d = root.display();
    let cpki = root.join("cpki");
    std::fs::create_dir_all(&cpki).unwrap();
    std::fs::write(cpki.join("cluster.pem"), openssl_pem()).unwrap();
    let cluster = |peers: &str| {
        format!(
            "cluster_id: sgc\ncluster_peers: [{peers}]\ncluster_pki_dir: {d}/cpki\n\
             cluster_pool_port: 0\ncluster_secret: a-long-random-secret\nauto_accept: True\n"
        )
    };
    // Each master its own id; both share one cachedir.
    let fix = |path: &Path, id: &str| {
        let own_dir = path
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .display()
            .to_string();
        let text = std::fs::read_to_string(path)
            .unwrap()
            .replace("id: sg-test-master", &format!("id: {id}"))
            .replace(
                &format!("cachedir: {own_dir}/"),
                &format!("cachedir: {d}/shared-"),
            );
        std::fs::write(path, text).unwrap();
    };
    for m in ["a", "b"] {
        std::fs::create_dir_all(root.join(m)).unwrap();
    }
    let conf_a = write_master_config(&root.join("a"), ips[0], &cluster(&format!("{}:1", ips[1])));
    fix(&conf_a, "sg-master-a");
    let a = start_master(&conf_a, &root.join("a/master.log"));
    let a_pool = a.cluster.expect("A reports its cluster port");
    let conf_b = write_master_config(&root.join("b"), ips[1], &cluster(&a_pool.to_string()));
    fix(&conf_b, "sg-master-b");
    let b = start_master(&conf_b, &root.join("b/master.log"));
    (a, b)
}

/// The status line of `method path` on the metrics endpoint.
pub async fn http_status(metrics: SocketAddr, method: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(metrics)
        .await
        .expect("metrics endpoint");
    let req = format!("{method} {path} HTTP/1.1\r\nHost: master\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    raw.lines().next().unwrap_or("").to_string()
}

/// Scrapes a master's metrics endpoint (`saltgate_metrics_bind`) and parses it as Prometheus's
/// exposition format (panics if it does not parse).
pub async fn scrape(metrics: SocketAddr) -> prometheus_parse::Scrape {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(metrics)
        .await
        .expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: master\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition format")
}

/// Every refusal counter of the metrics endpoint that is not zero, as `"port/reason"` → count;
/// checks that every reason's series is there (0 until it happens), the two ZMTP ports' too.
pub async fn refusals(metrics: SocketAddr) -> std::collections::BTreeMap<String, u64> {
    let scrape = scrape(metrics).await;
    let series: Vec<_> = scrape
        .samples
        .iter()
        .filter(|x| x.metric == "saltgate_master_refusals_total")
        .collect();
    assert_eq!(
        series.len(),
        saltgate_master::metrics::Refused::ALL.len()
            + 2 * saltgate_wire::zmtp::ProtocolRefusals::default()
                .by_reason()
                .len(),
        "{series:?}"
    );
    series
        .into_iter()
        .filter_map(|x| match x.value {
            prometheus_parse::Value::Counter(v) if v > 0.0 => Some((
                format!("{}/{}", x.labels.get("port")?, x.labels.get("reason")?),
                v as u64,
            )),
            _ => None,
        })
        .collect()
}

/// `[("port/reason", n), …]` as the map [`refusals`] returns.
pub fn counts(pairs: &[(&str, u64)]) -> std::collections::BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// `saltgate_master::server::run` in this process: its bound addresses; stopped by
/// [`InProcess::stop`] or when dropped.
pub struct InProcess {
    pub bound: saltgate_master::server::Bound,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Starts a master with `config` and waits until it is ready (it panics on a start error).
    pub async fn start(config: saltgate_config::salt_master::SaltMasterConfig) -> Self {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let stop = async {
                let _ = stop_rx.await;
            };
            let r = saltgate_master::server::run(config, stop, |b| {
                if let Some(tx) = ready_tx.take() {
                    let _ = tx.send(b.clone());
                }
            })
            .await;
            if let Err(e) = r {
                panic!("master failed: {e}");
            }
        });
        let bound = tokio::time::timeout(Duration::from_secs(120), ready_rx)
            .await
            .expect("master ready in time")
            .expect("master ready");
        InProcess {
            bound,
            stop: Some(stop_tx),
            task,
        }
    }

    /// Stops the master and waits (10 s at most) for it to end.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
