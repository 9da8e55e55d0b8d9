//! The swarm: N simulated minions in one process, each with its own id, key (or one shared
//! key), authentication and sessions, against one master. For load tests of masters and of
//! saltgate.
//!
//! Memory per minion is kept small: one task per minion plus its publish connection's task;
//! the request connection is opened for a return and closed after it (a swarm holds one file
//! descriptor per idle minion); keys are shared (`--shared-key`) or loaded once per minion.
//! Keys live in `--pki-dir` as `<id>.pem` (or `shared.pem`) so a rerun does not regenerate
//! them; missing keys are generated on all cores before the first connection.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use saltgate_config::salt_minion::MasterAddr;
use serde_json::json;
use thiserror::Error;
use tokio::sync::watch;

use crate::channel::Identity;
use crate::exec::ExecContext;
use crate::grains::HostGrains;
use crate::job::JidQueue;
use crate::keys::{KeyError, MasterKeyStore, MinionKey};
use crate::link::{Link, LinkConfig, ServeEnd, Stats};
use crate::runner::{resolve, RunError};

/// Swarm settings (the `swarm` subcommand's flags).
#[derive(Debug, Clone)]
pub struct SwarmOptions {
    pub count: usize,
    pub master: MasterAddr,
    pub id_prefix: String,
    /// Index of the first minion (used by `--processes` to split the id range).
    pub id_start: usize,
    pub pki_dir: PathBuf,
    pub shared_key: bool,
    pub report_every: Duration,
    pub json: bool,
    /// Stop after this long (None = until SIGINT/SIGTERM).
    pub duration: Option<Duration>,
    /// Minions started per second (spreads the authentication load on the master).
    pub start_rate: u32,
    pub acceptance_wait_time: Duration,
    pub publish_port: Option<u16>,
    /// Ask for pillar after authenticating, as a real minion does. Off by default: the master
    /// compiles pillar per request (~0.1-0.5 s of master CPU each), which would make the swarm a
    /// pillar benchmark.
    pub pillar: bool,
    /// The master's transport (zeromq or tcp).
    pub transport: saltgate_wire::transport::Transport,
}

#[derive(Debug, Error)]
pub enum SwarmError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Run(#[from] RunError),
}

/// The id of swarm minion `i`.
pub fn minion_id(prefix: &str, i: usize) -> String {
    format!("{prefix}{i}")
}

/// Loads or generates the keys, in parallel on every core. With `shared`, one key for all.
pub fn load_keys(
    dir: &std::path::Path,
    ids: &[String],
    shared: bool,
) -> Result<Vec<Arc<MinionKey>>, KeyError> {
    if shared {
        let k = Arc::new(MinionKey::load_or_create(dir, "shared")?);
        return Ok(vec![k; ids.len()]);
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<MinionKey, KeyError>>>> =
        ids.iter().map(|_| Mutex::new(None)).collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { break };
                let r = MinionKey::load_or_create(dir, id);
                if let Some(slot) = slots.get(i) {
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    let mut out = Vec::with_capacity(ids.len());
    for slot in slots {
        match slot.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(k)) => out.push(Arc::new(k)),
            Some(Err(e)) => return Err(e),
            None => {
                return Err(KeyError::Generate(saltgate_wire::rsa::RsaError::BadKey(
                    "key worker did not finish".into(),
                )))
            }
        }
    }
    Ok(out)
}

/// Resident set size of this process, in KiB (0 if unknown).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Raises the soft open-files limit to the hard one (each minion holds a socket).
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    lim.rlim_cur
}

/// One progress or summary record.
pub fn snapshot(stats: &Stats, count: usize, started: Instant) -> serde_json::Value {
    let rss = rss_kib();
    json!({
        "elapsed_s": started.elapsed().as_secs_f64(),
        "minions": count,
        "connected": stats.connected.load(Ordering::Relaxed),
        "authenticated": stats.authenticated.load(Ordering::Relaxed),
        "jobs_answered": stats.jobs_answered.load(Ordering::Relaxed),
        "publishes_received": stats.publishes_received.load(Ordering::Relaxed),
        "jobs_started": stats.jobs_started.load(Ordering::Relaxed),
        "return_retries": stats.return_retries.load(Ordering::Relaxed),
        "returns_failed": stats.returns_failed.load(Ordering::Relaxed),
        "errors": stats.errors.load(Ordering::Relaxed),
        "auth_timeouts": stats.auth_timeouts.load(Ordering::Relaxed),
        "auth_retries": stats.auth_retries.load(Ordering::Relaxed),
        "auth_pending": stats.auth_pending.load(Ordering::Relaxed),
        "start_events": stats.start_events.load(Ordering::Relaxed),
        "receipt_buckets": stats.receipt.nonzero(),
        "rss_kib": rss,
        "rss_bytes_per_minion": if count > 0 { rss * 1024 / count as u64 } else { 0 },
    })
}

/// Prints a record as one JSON line or as text.
pub fn print_record(v: &serde_json::Value, json: bool, summary: bool) {
    if json {
        let mut v = v.clone();
        if summary {
            v["summary"] = json!(true);
        }
        println!("{v}");
    } else {
        let g = |k: &str| v.get(k).cloned().unwrap_or(json!(0));
        println!(
            "{}t={:.0}s minions={} connected={} authenticated={} jobs={} errors={} auth_timeouts={} auth_retries={} rss={}KiB ({} B/minion)",
            if summary { "summary: " } else { "" },
            g("elapsed_s").as_f64().unwrap_or(0.0),
            g("minions"),
            g("connected"),
            g("authenticated"),
            g("jobs_answered"),
            g("errors"),
            g("auth_timeouts"),
            g("auth_retries"),
            g("rss_kib"),
            g("rss_bytes_per_minion"),
        );
    }
}

/// Runs the swarm until `stop` fires or `opts.duration` passes; returns the summary record.
pub async fn run_swarm(
    opts: SwarmOptions,
    stop: watch::Receiver<bool>,
) -> Result<serde_json::Value, SwarmError> {
    run_swarm_with(opts, stop, Arc::default()).await
}

/// [`run_swarm`], counting into `stats` (which the caller may read while it runs).
pub async fn run_swarm_with(
    opts: SwarmOptions,
    mut stop: watch::Receiver<bool>,
    stats: Arc<Stats>,
) -> Result<serde_json::Value, SwarmError> {
    let started = Instant::now();
    raise_nofile();
    let ids: Vec<String> = (opts.id_start..opts.id_start + opts.count)
        .map(|i| minion_id(&opts.id_prefix, i))
        .collect();
    let dir = opts.pki_dir.clone();
    let shared = opts.shared_key;
    let ids2 = ids.clone();
    let keys = tokio::task::spawn_blocking(move || load_keys(&dir, &ids2, shared))
        .await
        .map_err(|e| RunError::Task(e.to_string()))??;
    tracing::info!(count = ids.len(), took = ?started.elapsed(), "swarm keys ready");
    let store = Arc::new(MasterKeyStore::open(&opts.pki_dir, None)?);
    let addr = resolve(&opts.master).await?;
    let mut lc = LinkConfig::new(addr);
    lc.keep_req_open = false;
    lc.publish_port = opts.publish_port;
    lc.acceptance_wait_time = opts.acceptance_wait_time;
    lc.pillar = opts.pillar;
    lc.transport = opts.transport;
    lc.sig_cache = Some(Arc::default());
    let lc = Arc::new(lc);
    let host = Arc::new(HostGrains::collect());
    let statics = Arc::new(Vec::new());
    let mut tasks = tokio::task::JoinSet::new();
    let gap = Duration::from_secs_f64(1.0 / f64::from(opts.start_rate.max(1)));
    let mut report = tokio::time::interval(opts.report_every.max(Duration::from_millis(100)));
    report.tick().await;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep_deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_deadline);
    let mut pending = ids.into_iter().zip(keys).peekable();
    let mut start_tick = tokio::time::interval(gap);
    loop {
        tokio::select! {
            _ = start_tick.tick(), if pending.peek().is_some() => {
                if let Some((id, key)) = pending.next() {
                    let id: Arc<str> = id.into();
                    let ident = Identity { id: id.clone(), key, store: store.clone() };
                    let ctx = ExecContext { id, host: host.clone(), statics: statics.clone() };
                    let jids = Arc::new(Mutex::new(JidQueue::new(16)));
                    let mut link = Link::new(lc.clone(), ident, ctx, jids, stats.clone());
                    let mut stop = stop.clone();
                    tasks.spawn(async move {
                        loop {
                            let est = tokio::select! {
                                est = Box::pin(link.establish(false)) => est,
                                _ = stop.changed() => return,
                            };
                            let Ok(est) = est else { continue };
                            if Box::pin(link.serve(est, &mut stop, false)).await == ServeEnd::Stopped {
                                return;
                            }
                        }
                    });
                }
            }
            _ = report.tick() => {
                print_record(&snapshot(&stats, opts.count, started), opts.json, false);
            }
            _ = &mut sleep_deadline => break,
            _ = stop.changed() => break,
        }
    }
    let summary = snapshot(&stats, opts.count, started);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Ok(summary)
}
