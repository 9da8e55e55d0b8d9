//! The real-Salt variant's masters: three salt-master 3008.5 processes (the venv's) forming one
//! Salt 3008 cluster in namespace `m` (interop/harness/cluster.py's configuration and start, by
//! test-support's `salt_cluster`), and
//! [`SaltJobs`], the publisher that runs `saltjobd.py` beside them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context};
use saltgate_bench::lab::Published;
use saltgate_test_support::salt_cluster::{self, Ports, Procs, Spec};
use saltgate_test_support::{venv, ProcGuard};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::lab::Lab;
use crate::{MASTER_IPS, PORTS};

const CLUSTER_ID: &str = "ha_keepalived";
const SALTJOBD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/ha_keepalived/saltjobd.py"
);

/// The cluster's shared `cluster_pki_dir` (its `.aes` is the key every member encrypts
/// publishes with: saltgate's `dedup_cluster_pki_dir` reads it).
pub fn cluster_pki_dir(d: &Path) -> PathBuf {
    spec(d).cluster_pki_dir()
}

/// Master `i`'s directory (0-based).
fn mdir(d: &Path, i: usize) -> PathBuf {
    d.join(format!("salt-m{}", i + 1))
}

/// The cluster: interop/harness/cluster.py's configuration, with `auto_accept` and two worker
/// threads (six Salt processes, not the default five workers each, share the CI's two cores),
/// `enable_fqdns_grains: False`, and `grains_cache: True`: a 3008.5 cluster member forwards a
/// peer's publish to its own minions in its EventMonitor, the same process that mirrors every
/// peer's job and every return into the job cache, building a `MasterMinion` for each
/// (`salt/master.py` `EventMonitor.handle_event`, `salt/utils/job.py` `store_job`), and each of
/// those computes the grains again (eight subprocesses) unless they are cached: measured 0.52 s
/// per return without the cache, 0.18 s with it. Behind that backlog a minion whose publish
/// connection is on another member than master1 gets master1's jobs later and later
/// (docs/ha.md).
fn spec(d: &Path) -> Spec {
    let ips = MASTER_IPS.iter().map(|s| s.parse().unwrap()).collect();
    let ports = Ports {
        publish: PORTS.publish,
        ret: PORTS.request,
        pool: PORTS.cluster,
    };
    Spec {
        worker_threads: Some(2),
        grains_cache: true,
        extra: "enable_fqdns_grains: False\n".into(),
        founder_within: Duration::from_secs(60),
        ..Spec::new(CLUSTER_ID, ips, ports, d.join("shared"))
    }
}

/// Starts the three masters in namespace `m` (`salt-master-{1,2,3}` in `lab.procs`) and waits
/// until each is cluster-ready (it logs "opening request gate"): test-support's `salt_cluster`
/// (the founder first, the others once its ports listen; a start that lost 3008.5's cluster-key
/// race stopped, wiped and started again, at most three times).
pub async fn start_cluster(lab: &mut Lab) {
    let d = lab.dir.clone();
    let spec = spec(&d);
    let mut procs = Procs {
        venv: venv(),
        dir: |i: usize, _| mdir(&d, i),
        netns: Some(lab.ns("m")),
    };
    let masters = salt_cluster::start(&venv(), &spec, &mut procs)
        .await
        .unwrap_or_else(|e| panic!("the real salt-master cluster: {e}"));
    for (i, m) in masters.into_iter().enumerate() {
        lab.procs.insert(format!("salt-master-{}", i + 1), m.guard);
    }
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
