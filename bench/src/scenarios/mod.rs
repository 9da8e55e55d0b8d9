//! The scenarios and what they share: one fresh backend child and one fresh target per run,
//! the sample a figure becomes, and opening many sessions at once. Each scenario lives in its
//! own file and returns samples; ordering, repeats and medians are `runner`'s.

pub mod authstorm;
pub mod authstorm_report;
pub mod cluster;
pub mod connect;
pub mod idle;
pub mod master;
pub mod proctree;
pub mod rr;
pub mod saltcluster;
pub mod saltmaster;
pub mod storm;
pub mod swarm;
pub mod swarmproc;
pub mod throughput;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::net::TcpStream;

use crate::backend::Backend;
use crate::measure::{Pids, Spent};
use crate::targets::{Binaries, Net, ProxySettings, Target, TargetKind};
use crate::{client, procfs, BenchError};

/// What every scenario needs to know.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub net: Net,
    pub bins: Binaries,
    /// This executable (started again as the backend child).
    pub exe: PathBuf,
    pub quick: bool,
    pub settings: ProxySettings,
    /// Sizes of the `swarm` scenario.
    pub swarm: swarm::SwarmSize,
}

/// One measured figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub scenario: &'static str,
    pub figure: &'static str,
    pub case: String,
    pub unit: &'static str,
    pub target: TargetKind,
    pub repeat: usize,
    pub value: f64,
    /// Proxy CPU ticks (utime + stime, all threads) the figure rests on; None for RSS figures
    /// and the direct target.
    pub proxy_ticks: Option<u64>,
    /// Load generator (this process) CPU over the window, % of one core.
    pub loadgen_cpu_pct: f64,
    /// Fake masters' CPU over the window, % of one core.
    pub backend_cpu_pct: f64,
    /// Other processes' CPU over the window, % of the whole machine.
    pub foreign_cpu_pct: f64,
    /// Window length, seconds.
    pub secs: f64,
}

impl Sample {
    pub fn new(
        scenario: &'static str,
        figure: &'static str,
        case: impl Into<String>,
        unit: &'static str,
        target: TargetKind,
        value: f64,
        spent: Option<&Spent>,
    ) -> Sample {
        let tck = procfs::clock_ticks_per_sec() as f64;
        let (lg, be, fo, secs, ticks) = match spent {
            Some(s) => (
                s.loadgen_pct(),
                100.0 * s.backend_ticks as f64 / tck / s.secs.max(1e-9),
                s.foreign_pct(),
                s.secs,
                s.proxy_ticks,
            ),
            None => (0.0, 0.0, 0.0, 0.0, None),
        };
        Sample {
            scenario,
            figure,
            case: case.into(),
            unit,
            target,
            repeat: 0,
            value,
            proxy_ticks: ticks,
            loadgen_cpu_pct: lg,
            backend_cpu_pct: be,
            foreign_cpu_pct: fo,
            secs,
        }
    }
}

/// A fresh backend child and target for one run.
pub struct Run {
    pub backend: Backend,
    pub target: Target,
    pub src: IpAddr,
}

impl Run {
    pub async fn start(ctx: &Ctx, kind: TargetKind, masters: usize) -> Result<Run, BenchError> {
        let backend = Backend::start(&ctx.exe, &ctx.net.masters(masters)).await?;
        let target =
            Target::start(kind, &ctx.net, &ctx.bins, &ctx.settings, &backend.masters).await?;
        Ok(Run {
            backend,
            target,
            src: ctx.net.client(),
        })
    }

    pub fn pids(&self) -> Pids {
        Pids {
            proxy: self.target.pid(),
            backend: self.backend.pid(),
        }
    }

    /// The proxy's RSS now, KiB.
    pub fn proxy_rss_kib(&self) -> Result<u64, BenchError> {
        let pid = self
            .target
            .pid()
            .ok_or_else(|| BenchError::Target("no proxy process".into()))?;
        Ok(procfs::sample(pid)?.rss_kib)
    }

    /// Waits until the fake masters hold at most `n` sessions.
    pub async fn wait_backend_live_at_most(
        &mut self,
        n: usize,
        limit: Duration,
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + limit;
        loop {
            let live = self.backend.live(None).await?;
            if live <= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Scenario(format!(
                    "the fake masters still hold {live} sessions after {limit:?} (expected ≤ {n}): sessions were not closed through the proxy"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        self.target.stop().await;
    }
}

/// Opens `n` echo sessions (connect + one echo each) spread over `addrs`, `parallel` at a time.
pub async fn open_sessions(
    addrs: &[SocketAddr],
    src: IpAddr,
    n: usize,
    parallel: usize,
) -> Result<Vec<TcpStream>, BenchError> {
    let parallel = parallel.clamp(1, n.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..parallel {
        let addrs = addrs.to_vec();
        let count = n / parallel + usize::from(w < n % parallel);
        tasks.spawn(async move {
            let mut v = Vec::with_capacity(count);
            for i in 0..count {
                let addr = addrs[(w + i * parallel) % addrs.len()];
                let s =
                    tokio::time::timeout(Duration::from_secs(10), client::open_session(addr, src))
                        .await
                        .map_err(|_| {
                            BenchError::Scenario(format!(
                                "opening session {} to {addr}: no echo within 10 s",
                                v.len() + 1
                            ))
                        })?
                        .map_err(|e| {
                            BenchError::Scenario(format!("opening a session to {addr}: {e}"))
                        })?;
                v.push(s);
            }
            Ok::<_, BenchError>(v)
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        all.extend(r.map_err(|e| BenchError::Scenario(format!("opener task: {e}")))??);
    }
    Ok(all)
}

/// `1000` → `1k`, `100` → `100`.
pub fn count_label(n: usize) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}
