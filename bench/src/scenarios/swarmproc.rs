//! `saltgate-minion swarm` as the load: one or more invocations (each maybe `--processes K`),
//! each a separate process tree so its CPU is not the proxy's nor the bench's, with
//! `--shared-key` (one key pair for every simulated minion: a load-test shortcut, see
//! docs/minion.md) copied into a fresh `--pki-dir` per run, since each run's cluster has a new
//! master key that the swarm pins. Their JSON progress lines are summed here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::BenchError;

/// Where one invocation points and which ids it runs.
#[derive(Debug, Clone)]
pub struct Part {
    pub master: SocketAddr,
    /// `--publish-port` (a proxy's publish listener); None: what the master announces.
    pub publish_port: Option<u16>,
    pub count: usize,
    pub id_start: usize,
    pub processes: usize,
}

/// The swarm's own counters, summed over the invocations' latest lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub connected: i64,
    pub authenticated: i64,
    pub jobs_answered: i64,
    pub errors: i64,
    /// `_auth` tries that got no answer within `auth_timeout`, and tries sent again.
    pub auth_timeouts: i64,
    pub auth_retries: i64,
    /// Minions that sent their start event (each once it first authenticated).
    pub start_events: i64,
}

impl Totals {
    fn from_line(v: &serde_json::Value) -> Totals {
        let g = |k: &str| v.get(k).and_then(serde_json::Value::as_i64).unwrap_or(0);
        Totals {
            connected: g("connected"),
            authenticated: g("authenticated"),
            jobs_answered: g("jobs_answered"),
            errors: g("errors"),
            auth_timeouts: g("auth_timeouts"),
            auth_retries: g("auth_retries"),
            start_events: g("start_events"),
        }
    }
}

/// Makes the shared key once (in `cache`) and returns a fresh per-run pki dir holding it.
/// `nowhere` is an address in the bench's range where nothing listens.
pub fn fresh_pki(
    cache: &Path,
    minion_bin: &Path,
    run_dir: &Path,
    nowhere: SocketAddr,
) -> Result<PathBuf, BenchError> {
    let pem = cache.join("shared.pem");
    if !pem.exists() {
        // A swarm of one minion pointed nowhere makes and caches the key, then stops.
        let st = std::process::Command::new(minion_bin)
            .args(["swarm", "--count", "1", "--master", &nowhere.to_string()])
            .args(["--shared-key", "--duration", "0.1", "--json"])
            .arg("--pki-dir")
            .arg(cache)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| BenchError::Io(format!("run {}: {e}", minion_bin.display())))?;
        if !pem.exists() {
            return Err(BenchError::Io(format!(
                "{} swarm did not create {} ({st})",
                minion_bin.display(),
                pem.display()
            )));
        }
    }
    let dir = run_dir.join("swarm-pki");
    std::fs::create_dir_all(&dir)
        .map_err(|e| BenchError::Io(format!("create {}: {e}", dir.display())))?;
    for f in ["shared.pem", "shared.pub"] {
        std::fs::copy(cache.join(f), dir.join(f))
            .map_err(|e| BenchError::Io(format!("copy {f}: {e}")))?;
    }
    Ok(dir)
}

pub struct Swarm {
    children: Vec<Child>,
    latest: Arc<Mutex<Vec<Totals>>>,
    /// Each invocation's latest receipt-latency counts (saltgate_minion::latency buckets).
    receipts: Arc<Mutex<Vec<Vec<u64>>>>,
    pub started: Instant,
    pub count: usize,
}

impl Swarm {
    /// Starts every part (ids `<prefix><i>`), progress every 100 ms, `acceptance_wait_time` 1 s.
    pub fn start(
        bin: &Path,
        pki: &Path,
        prefix: &str,
        start_rate: u32,
        parts: &[Part],
    ) -> Result<Swarm, BenchError> {
        Swarm::start_with_wait(bin, pki, prefix, start_rate, parts, 1.0)
    }

    /// [`Swarm::start`] with the minions' `acceptance_wait_time` (seconds; Salt's is 10).
    pub fn start_with_wait(
        bin: &Path,
        pki: &Path,
        prefix: &str,
        start_rate: u32,
        parts: &[Part],
        acceptance_wait: f64,
    ) -> Result<Swarm, BenchError> {
        let latest = Arc::new(Mutex::new(vec![Totals::default(); parts.len()]));
        let receipts = Arc::new(Mutex::new(vec![Vec::new(); parts.len()]));
        let mut children = Vec::new();
        let total: usize = parts.iter().map(|p| p.count).sum();
        let started = Instant::now();
        for (i, p) in parts.iter().enumerate() {
            let rate = ((start_rate as usize * p.count) / total.max(1)).max(1);
            let mut cmd = Command::new(bin);
            cmd.arg("swarm")
                .args(["--count", &p.count.to_string()])
                .args(["--master", &p.master.to_string()])
                .args(["--id-prefix", prefix])
                .args(["--id-start", &p.id_start.to_string()])
                .args(["--processes", &p.processes.max(1).to_string()])
                .args(["--start-rate", &rate.to_string()])
                .args(["--report-every", "0.1"])
                .args(["--acceptance-wait-time", &acceptance_wait.to_string()])
                .args(["--shared-key", "--json"])
                .arg("--pki-dir")
                .arg(pki)
                .env("SALTGATE_LOG", "error")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            if let Some(pp) = p.publish_port {
                cmd.args(["--publish-port", &pp.to_string()]);
            }
            let mut child = cmd
                .spawn()
                .map_err(|e| BenchError::Io(format!("start {}: {e}", bin.display())))?;
            let out = child
                .stdout
                .take()
                .ok_or_else(|| BenchError::Io("swarm stdout".into()))?;
            let latest = latest.clone();
            let receipts = receipts.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                        if let Ok(mut g) = latest.lock() {
                            g[i] = Totals::from_line(&v);
                        }
                        if let Ok(mut g) = receipts.lock() {
                            g[i] = saltgate_minion::latency::from_line(&v);
                        }
                    }
                }
            });
            children.push(child);
        }
        Ok(Swarm {
            children,
            latest,
            receipts,
            started,
            count: total,
        })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().filter_map(Child::id).collect()
    }

    pub fn totals(&self) -> Totals {
        let g = self.latest.lock().map(|g| g.clone()).unwrap_or_default();
        g.iter().fold(Totals::default(), |a, t| Totals {
            connected: a.connected + t.connected,
            authenticated: a.authenticated + t.authenticated,
            jobs_answered: a.jobs_answered + t.jobs_answered,
            errors: a.errors + t.errors,
            auth_timeouts: a.auth_timeouts + t.auth_timeouts,
            auth_retries: a.auth_retries + t.auth_retries,
            start_events: a.start_events + t.start_events,
        })
    }

    /// Receipt-latency counts per bucket, summed over the invocations (how long after its
    /// publish each job reached a minion; see saltgate_minion::latency).
    pub fn receipts(&self) -> Vec<u64> {
        let g = self.receipts.lock().map(|g| g.clone()).unwrap_or_default();
        let mut total = vec![0u64; saltgate_minion::latency::BUCKETS];
        for r in g {
            for (t, c) in total.iter_mut().zip(r) {
                *t += c;
            }
        }
        total
    }

    /// The receipt counts gained since `before`, once they add up to `want` or `limit` passed
    /// (progress lines come every 100 ms, so the last receipts may not be printed yet).
    pub async fn wait_receipts(&self, before: &[u64], want: u64, limit: Duration) -> Vec<u64> {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.receipts();
            let gained: Vec<u64> = now
                .iter()
                .zip(before.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            if gained.iter().sum::<u64>() >= want || Instant::now() > deadline {
                return gained;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `done(totals)`, polling every 20 ms; the instant it was first seen. Fails
    /// after `limit`, or when a swarm process exits.
    pub async fn wait(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Totals) -> bool,
    ) -> Result<Instant, BenchError> {
        let deadline = Instant::now() + limit;
        loop {
            let t = self.totals();
            if done(&t) {
                return Ok(Instant::now());
            }
            for c in &mut self.children {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(BenchError::Scenario(format!(
                        "a swarm process exited ({st}) before {what}; last totals {t:?}"
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(BenchError::Scenario(format!(
                    "{what}: not within {limit:?}; swarm totals {t:?} of {} minions",
                    self.count
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM (the parent passes it to its `--processes` children), then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        for c in &self.children {
            if let Some(pid) = c.id() {
                // SAFETY: signalling our own child by its pid.
                unsafe {
                    libc::kill(pid as i32, libc::SIGTERM);
                }
            }
        }
        for c in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(10), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}
