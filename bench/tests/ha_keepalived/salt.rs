//! The real-Salt variant's masters: three salt-master 3008.5 processes (the venv's) forming one
//! Salt 3008 cluster in namespace `m` (interop/harness/cluster.py's configuration and start), and
//! [`SaltJobs`], the publisher that runs `saltjobd.py` beside them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context};
use saltgate_bench::lab::{random_hex, Published};
use saltgate_test_support::{venv, ProcGuard};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::lab::{in_ns, sh, until, Lab};
use crate::{MASTER_IPS, PORTS};

const CLUSTER_ID: &str = "ha_keepalived";
const SALTJOBD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/ha_keepalived/saltjobd.py"
);

/// The cluster's shared `cluster_pki_dir` (its `.aes` is the key every member encrypts
/// publishes with: saltgate's `dedup_cluster_pki_dir` reads it).
pub fn cluster_pki_dir(d: &Path) -> PathBuf {
    d.join("shared/pki")
}

/// Master `i`'s directory (0-based).
fn mdir(d: &Path, i: usize) -> PathBuf {
    d.join(format!("salt-m{}", i + 1))
}

/// Master `i`'s configuration (interop/harness/cluster.py's, with `auto_accept` and two worker
/// threads: six Salt processes, not the default five workers each, share the CI's two cores),
/// and `grains_cache: True`: a 3008.5 cluster member forwards a peer's publish to its own
/// minions in its EventMonitor, the same process that mirrors every peer's job and every
/// return into the job cache, building a `MasterMinion` for each (`salt/master.py`
/// `EventMonitor.handle_event`, `salt/utils/job.py` `store_job`), and each of those computes
/// the grains again (eight subprocesses) unless they are cached: measured 0.52 s per return
/// without the cache, 0.18 s with it. Behind that backlog a minion whose publish connection is on
/// another member than master1 gets master1's jobs later and later (docs/ha.md).
fn write_config(d: &Path, i: usize, secret: &str) -> PathBuf {
    let m = mdir(d, i);
    for sub in ["conf", "pki", "sock", "queues"] {
        std::fs::create_dir_all(m.join(sub)).unwrap();
    }
    let shared = d.join("shared");
    let ip = MASTER_IPS[i];
    let peers: String = MASTER_IPS
        .iter()
        .filter(|p| **p != ip)
        .map(|p| format!("  - {p}\n"))
        .collect();
    let (m, s) = (m.display(), shared.display());
    let text = format!(
        "# ha_keepalived's real-Salt variant (bench/tests/ha_keepalived/salt.rs): master {ip}
id: {ip}
interface: {ip}
publish_port: {pub_port}
ret_port: {req_port}
user: root
cluster_id: {CLUSTER_ID}
cluster_peers:
{peers}cluster_pki_dir: {pki}
cluster_pool_port: {pool}
cluster_secret: \"{secret}\"
cachedir: {s}/cache
pki_dir: {m}/pki
sock_dir: {m}/sock
sqlite_queue_dir: {m}/queues
pidfile: {m}/salt-master.pid
log_file: {m}/master.log
key_logfile: {m}/key.log
log_level_logfile: info
autosign_file: {m}/conf/autosign.conf
autoreject_file: {m}/conf/autoreject.conf
autosign_grains_dir: {m}/conf/autosign_grains
auto_accept: True
worker_threads: 2
enable_fqdns_grains: False
grains_cache: True
file_roots:
  base:
    - {s}/srv/salt
pillar_roots:
  base:
    - {s}/srv/pillar
",
        pub_port = PORTS.publish,
        req_port = PORTS.request,
        pool = PORTS.cluster,
        pki = cluster_pki_dir(d).display(),
    );
    let conf = mdir(d, i).join("conf");
    std::fs::write(conf.join("master"), text).unwrap();
    conf
}

/// The shared directories, and the cluster key pair made before any master starts (masters
/// started together race on creating it in 3008.5; so do they on the shared subdirectories).
fn prepare_shared(d: &Path) {
    let shared = d.join("shared");
    for sub in [
        "pki/minions",
        "pki/minions_pre",
        "pki/minions_rejected",
        "pki/minions_denied",
        "pki/minions_autosign",
        "pki/peers",
        "cache/jobs",
        "cache/proc",
        "cache/pillar",
        "cache/sessions",
        "cache/health",
        "cache/roots",
        "cache/syndics",
        "cache/grains",
        "cache/tokens",
        "cache/cluster",
        "srv/salt",
        "srv/pillar",
    ] {
        std::fs::create_dir_all(shared.join(sub)).unwrap();
    }
    let code = "import os,sys,salt.crypt\n\
                d=sys.argv[1]; priv,pub=salt.crypt.gen_keys(2048)\n\
                for n,data,mode in (('cluster.pem',priv,0o400),('cluster.pub',pub,0o644)):\n    \
                fd=os.open(os.path.join(d,n),os.O_WRONLY|os.O_CREAT|os.O_EXCL,mode)\n    \
                f=os.fdopen(fd,'w'); f.write(data); f.close()\n";
    let py = venv().join("bin/python");
    sh(&[
        py.to_str().unwrap(),
        "-c",
        code,
        shared.join("pki").to_str().unwrap(),
    ]);
}

/// Whether every one of `ports` listens on `ip` in namespace `ns`.
fn listens(ns: &str, ip: &str, ports: &[u16]) -> bool {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    ports.iter().all(|p| out.contains(&format!("{ip}:{p} ")))
}

fn log_has(d: &Path, i: usize, what: &str, also: Option<&str>) -> bool {
    let text = std::fs::read_to_string(mdir(d, i).join("master.log")).unwrap_or_default();
    text.lines()
        .any(|l| l.contains(what) && also.is_none_or(|a| l.contains(a)))
}

/// Starts the three masters (`salt-master-{1,2,3}` in `lab.procs`) and waits until each is
/// cluster-ready (it logs "opening request gate"). The founder first, the others once its ports
/// listen. 3008.5 may still race on the shared cluster key (a join-reply rewrites cluster.pem,
/// and a master starting in that gap makes a key of its own: "Generating key-pair for
/// .../cluster.pem", and minions later fail to decrypt; or a process that reads it in the gap
/// logs "Unable to read key: .../cluster.pem" and exits); then everything is stopped, wiped and
/// started again, as interop/harness/cluster.py does, at most three times.
pub async fn start_cluster(lab: &mut Lab) {
    let d = lab.dir.clone();
    let ns = lab.ns("m");
    let secret = random_hex().unwrap();
    let salt_master = venv().join("bin/salt-master");
    for attempt in 1..=3 {
        prepare_shared(&d);
        for i in 0..MASTER_IPS.len() {
            let conf = write_config(&d, i, &secret);
            if i == 1 {
                let (ns, ip0) = (ns.clone(), MASTER_IPS[0]);
                until(Duration::from_secs(60), "master1's ports", || {
                    listens(&ns, ip0, &[PORTS.request, PORTS.cluster])
                })
                .await;
            }
            let name = format!("salt-master-{}", i + 1);
            let g = in_ns(
                &ns,
                &name,
                &salt_master,
                &["-c", conf.to_str().unwrap(), "-l", "warning"],
                &mdir(&d, i).join("stdout.log"),
            );
            lab.procs.insert(name, g);
        }
        let dd = d.clone();
        until(
            Duration::from_secs(120),
            "every salt-master cluster-ready (\"opening request gate\" in its master.log)",
            || (0..MASTER_IPS.len()).all(|i| log_has(&dd, i, "opening request gate", None)),
        )
        .await;
        let bad: Vec<usize> = (0..MASTER_IPS.len())
            .filter(|i| {
                log_has(&d, *i, "Generating key-pair", Some("cluster.pem"))
                    || log_has(&d, *i, "Unable to read key", Some("cluster.pem"))
            })
            .collect();
        if bad.is_empty() {
            return;
        }
        println!(
            "attempt {attempt}: salt-master(s) {bad:?} made a cluster key of their own (3008.5's join race); starting again"
        );
        for i in 0..MASTER_IPS.len() {
            lab.kill(&format!("salt-master-{}", i + 1));
        }
        let _ = std::fs::remove_dir_all(d.join("shared"));
        for i in 0..MASTER_IPS.len() {
            let _ = std::fs::remove_dir_all(mdir(&d, i));
        }
    }
    panic!("the salt-masters made diverging cluster keys in three fresh starts");
}

/// A job's request, waiting for its answers.
struct Pending {
    arg: String,
    done: oneshot::Sender<anyhow::Result<Published>>,
}

/// `saltjobd.py` on master1 (see there), driven over its stdin and stdout.
pub struct SaltJobs {
    stdin: Mutex<ChildStdin>,
    next: AtomicU64,
    pending: Arc<Mutex<HashMap<u64, Pending>>>,
    /// The arguments (JSON) of every job published.
    published: Arc<Mutex<Vec<String>>>,
    /// Every return event master1 saw: `{"jid", "id"}` lines.
    rets: PathBuf,
}

impl SaltJobs {
    /// Starts `saltjobd.py` in namespace `m` on master1's configuration (`saltjobd` in
    /// `lab.procs`) and waits until it listens to master1's event bus.
    pub async fn start(lab: &mut Lab) -> SaltJobs {
        let conf = mdir(&lab.dir, 0).join("conf/master");
        let rets = lab.dir.join("salt-returns.jsonl");
        let log = std::fs::File::create(lab.dir.join("saltjobd.log")).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &lab.ns("m")])
            .arg(venv().join("bin/python"))
            .args([SALTJOBD, conf.to_str().unwrap(), rets.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut g = ProcGuard::spawn("saltjobd", c);
        let stdin = g.child.stdin.take().unwrap();
        let lines = BufReader::new(g.child.stdout.take().unwrap()).lines();
        lab.procs.insert("saltjobd".into(), g);
        let (ready_tx, ready_rx) = oneshot::channel();
        let pending: Arc<Mutex<HashMap<u64, Pending>>> = Arc::default();
        let published: Arc<Mutex<Vec<String>>> = Arc::default();
        let (p, pu) = (pending.clone(), published.clone());
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            for line in lines.map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let n = v["n"].as_u64().unwrap_or(u64::MAX);
                match v["ev"].as_str() {
                    Some("ready") => {
                        if let Some(t) = ready_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Some("pub") => {
                        if let Some(q) = p.lock().unwrap().get(&n) {
                            pu.lock().unwrap().push(q.arg.clone());
                        }
                    }
                    Some("done") => {
                        if let Some(q) = p.lock().unwrap().remove(&n) {
                            let _ = q.done.send(answer(&v));
                        }
                    }
                    _ => {}
                }
            }
            // Its end: every job still waiting fails (the senders drop).
            p.lock().unwrap().clear();
        });
        tokio::time::timeout(Duration::from_secs(90), ready_rx)
            .await
            .expect("saltjobd.py listening on master1's event bus within 90 s (see saltjobd.log)")
            .expect("saltjobd.py ended before it was ready (see saltjobd.log)");
        SaltJobs {
            stdin: Mutex::new(stdin),
            next: AtomicU64::new(0),
            pending,
            published,
            rets,
        }
    }

    pub async fn publish(
        &self,
        tgt: &str,
        fun: &str,
        args: &[Value],
        timeout_secs: u64,
    ) -> anyhow::Result<Published> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let arg = Value::from(args.to_vec()).to_string();
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap()
            .insert(n, Pending { arg, done: tx });
        let req = json!({"n": n, "tgt": tgt, "fun": fun, "arg": args, "timeout": timeout_secs});
        writeln!(self.stdin.lock().unwrap(), "{req}").context("saltjobd.py's stdin")?;
        tokio::time::timeout(Duration::from_secs(timeout_secs + 30), rx)
            .await
            .map_err(|_| anyhow!("the job did not finish in time"))?
            .map_err(|_| anyhow!("saltjobd.py ended (see saltjobd.log)"))?
    }

    pub fn published(&self, word: &str) -> bool {
        self.published
            .lock()
            .unwrap()
            .iter()
            .any(|a| a.contains(word))
    }

    /// Every return master1's event bus carried: (jid, minion).
    pub fn returns(&self) -> Vec<(String, String)> {
        self.returns_with_lag()
            .into_iter()
            .map(|(jid, id, _)| (jid, id))
            .collect()
    }

    /// Every return master1's event bus carried: (jid, minion, seconds from the publish to the
    /// return event, when saltjobd.py could tell), late ones included.
    pub fn returns_with_lag(&self) -> Vec<(String, String, Option<f64>)> {
        std::fs::read_to_string(&self.rets)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| {
                Some((
                    v["jid"].as_str()?.into(),
                    v["id"].as_str()?.into(),
                    v["lag"].as_f64(),
                ))
            })
            .collect()
    }
}

/// A `done` line as the publish's result.
fn answer(v: &Value) -> anyhow::Result<Published> {
    if let Some(e) = v["error"].as_str() {
        return Err(anyhow!("publish through master1: {e}"));
    }
    let returns = v["returns"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(id, r)| {
            let lat = Duration::from_secs_f64(r["lat"].as_f64().unwrap_or(0.0).max(0.0));
            (id.clone(), (lat, r["ret"].clone()))
        })
        .collect();
    Ok(Published {
        jid: v["jid"].as_str().unwrap_or_default().to_string(),
        returns,
    })
}
