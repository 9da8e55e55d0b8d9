//! `master` (issue 8's performance goal): Salt's own `salt-master` 3008.5 beside one
//! `saltgate-master`, each a fresh process on the same machine in the same run, interleaved and
//! repeated. N `saltgate-minion swarm` minions (`--shared-key`, started at the same rate for
//! both) authenticate with it; then `test.ping` is published to all of them and every return
//! collected (Salt's own `LocalClient` for Salt, the local socket for ours). Master CPU is the
//! master's whole process tree (salt-master forks its workers). Reported: time and master CPU
//! per minion to authenticate all, time until every return, master CPU per return, and the
//! ratio salt-master / saltgate-master (issue 8's goals: ≥ 10× less master CPU per minion per
//! job, and 5,000 returns within 2 s; authentication is measured beside them, with no goal: the
//! protocol's two RSA private-key operations per `_auth` bound it, docs/master.md).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::cluster::Cluster;
use super::proctree;
use super::saltmaster::{self, SaltMaster};
use super::swarmproc::{fresh_pki, Part, Swarm};
use super::{count_label, Ctx};
use crate::report::{num, utc};
use crate::stats::{median, percentile_sorted};
use crate::{procfs, BenchError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MasterKind {
    SaltMaster,
    SaltgateMaster,
}

/// One figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct MasterSample {
    pub kind: MasterKind,
    pub repeat: usize,
    pub minions: usize,
    pub figure: &'static str,
    pub unit: &'static str,
    pub value: f64,
    /// The master's CPU ticks the figure rests on (CPU figures).
    pub ticks: Option<u64>,
    /// Other processes' CPU over the window, % of the machine.
    pub foreign_cpu_pct: f64,
    pub loadavg: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct MasterRow {
    pub figure: &'static str,
    pub case: String,
    pub unit: &'static str,
    pub salt_master: Option<f64>,
    pub saltgate_master: Option<f64>,
    /// salt-master / saltgate-master of the medians: how many times less ours takes.
    pub times_less: Option<f64>,
    pub goal: Option<String>,
    pub met: Option<bool>,
    pub ticks_salt: Option<f64>,
    pub ticks_saltgate: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MasterReport {
    pub command: String,
    pub started_utc: String,
    pub finished_utc: String,
    pub cpus: usize,
    pub loadavg_before: String,
    pub loadavg_after: String,
    pub machine_idle_pct: f64,
    pub start_rate: u32,
    pub rows: Vec<MasterRow>,
    pub samples: Vec<MasterSample>,
    /// Runs that did not complete (e.g. a master that could not authenticate every minion in
    /// time): a finding, reported beside the rows, and the other runs go on.
    pub failures: Vec<String>,
}

const FIGURES: [(&str, &str); 6] = [
    ("time to authenticate all", "s"),
    ("master CPU per minion auth", "µs"),
    ("test.ping: time until every return", "ms"),
    ("test.ping: returns received", "count"),
    ("master CPU per test.ping return", "µs"),
    ("master RSS per minion", "KiB"),
];

/// The master under test, whichever it is.
enum Running {
    Salt(Box<SaltMaster>),
    Ours(Cluster),
}

impl Running {
    fn pid(&self) -> u32 {
        match self {
            Running::Salt(m) => m.pid(),
            Running::Ours(c) => c.pids()[0],
        }
    }
    fn ret(&self) -> SocketAddr {
        match self {
            Running::Salt(m) => m.ret,
            Running::Ours(c) => c.members[0].ret,
        }
    }
    async fn stop(self) {
        match self {
            Running::Salt(m) => m.stop().await,
            Running::Ours(c) => c.stop().await,
        }
    }
}

fn foreign_pct(before: procfs::SysSample, after: procfs::SysSample, ours: u64) -> f64 {
    let total = after.total.saturating_sub(before.total).max(1);
    let busy = after.busy().saturating_sub(before.busy());
    100.0 * busy.saturating_sub(ours) as f64 / total as f64
}

/// One run of one master kind with `n` minions.
async fn one(
    ctx: &Ctx,
    kind: MasterKind,
    n: usize,
    repeat: usize,
) -> Result<Vec<MasterSample>, BenchError> {
    let venv = saltmaster::venv()?;
    let ip = ctx.net.ip(2);
    let m = match kind {
        MasterKind::SaltMaster => Running::Salt(Box::new(SaltMaster::start(&venv, ip).await?)),
        MasterKind::SaltgateMaster => Running::Ours(Cluster::single(&ctx.bins.master, ip).await?),
    };
    let r = measure(ctx, kind, &m, n, repeat, &venv).await;
    let r = match (&m, r) {
        (Running::Salt(s), Err(e)) => Err(BenchError::Scenario(format!("{e}; {}", s.log_tail()))),
        (Running::Ours(c), Err(e)) => {
            Err(BenchError::Scenario(format!("{e}; {}", c.stderr_tail())))
        }
        (_, ok) => ok,
    };
    m.stop().await;
    r
}

async fn measure(
    ctx: &Ctx,
    kind: MasterKind,
    m: &Running,
    n: usize,
    repeat: usize,
    venv: &std::path::Path,
) -> Result<Vec<MasterSample>, BenchError> {
    let tck = procfs::clock_ticks_per_sec() as f64;
    let mut out = Vec::new();
    let mut push = |figure: &'static str, value: f64, ticks: Option<u64>, foreign: f64| {
        let unit = FIGURES.iter().find(|f| f.0 == figure).map_or("", |f| f.1);
        out.push(MasterSample {
            kind,
            repeat,
            minions: n,
            figure,
            unit,
            value,
            ticks,
            foreign_cpu_pct: foreign,
            loadavg: procfs::loadavg(),
        });
    };
    let run_dir = tempfile::Builder::new()
        .prefix("saltgate-bench-master.")
        .tempdir()
        .map_err(|e| BenchError::Io(format!("temp dir: {e}")))?;
    let nowhere = SocketAddr::new(ctx.net.ip(250), 9);
    let key_cache = super::swarm::key_cache();
    let pki = fresh_pki(&key_cache, &ctx.bins.minion, run_dir.path(), nowhere)?;
    let part = Part {
        master: m.ret(),
        publish_port: None,
        count: n,
        id_start: 0,
        processes: ctx.swarm.processes,
    };
    let root = [m.pid()];

    // Authenticate all.
    let (c0, s0) = (proctree::sample(&root)?.ticks, procfs::sys_sample()?);
    let mut swarm = Swarm::start(
        &ctx.bins.minion,
        &pki,
        "swarm-",
        ctx.swarm.start_rate,
        &[part],
    )?;
    let limit = Duration::from_secs(
        120 + 2 * n as u64 / ctx.swarm.start_rate.max(1) as u64 + n as u64 / 10,
    );
    let up = swarm
        .wait("every minion authenticated and connected", limit, |t| {
            t.authenticated >= n as i64 && t.connected >= n as i64
        })
        .await?;
    let c1 = proctree::sample(&root)?;
    let swarm_ticks = proctree::sample(&swarm.pids())?.ticks;
    let s1 = procfs::sys_sample()?;
    let auth = c1.ticks.saturating_sub(c0);
    let fg = foreign_pct(s0, s1, auth + swarm_ticks);
    push(
        "time to authenticate all",
        up.duration_since(swarm.started).as_secs_f64(),
        None,
        fg,
    );
    push(
        "master CPU per minion auth",
        auth as f64 / tck * 1e6 / n as f64,
        Some(auth),
        fg,
    );
    // Let the subscriptions settle, then the memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    push(
        "master RSS per minion",
        proctree::sample(&root)?.rss_kib as f64 / n as f64,
        None,
        fg,
    );

    // test.ping to all.
    let timeout = 30 + n as u64 / 100;
    let (c0, s0, w0) = (
        proctree::sample(&root)?.ticks,
        procfs::sys_sample()?,
        proctree::sample(&swarm.pids())?.ticks,
    );
    let profiler = JobProfiler::start().await?;
    let t0 = Instant::now();
    let mut after: Vec<Duration> = match m {
        Running::Salt(s) => saltmaster::publish(venv, s, "swarm-*", "test.ping", timeout).await?,
        Running::Ours(c) => {
            let req =
                json!({"tgt": "swarm-*", "fun": "test.ping", "arg": [], "timeout_secs": timeout});
            saltgate_master::cli::publish(&c.members[0].socket, &req)
                .await
                .map_err(|e| BenchError::Scenario(format!("publish: {e}")))?
                .returns
                .into_iter()
                .filter(|r| r.record.get("return") == Some(&json!(true)))
                .map(|r| r.after)
                .collect()
        }
    };
    let _wall = t0.elapsed();
    let c1 = proctree::sample(&root)?.ticks;
    let w1 = proctree::sample(&swarm.pids())?.ticks;
    if let Some(p) = profiler {
        p.stop().await;
    }
    let s1 = procfs::sys_sample()?;
    let job = c1.saturating_sub(c0);
    let fg = foreign_pct(s0, s1, job + w1.saturating_sub(w0));
    after.sort_unstable();
    let got = after.len();
    push("test.ping: returns received", got as f64, None, fg);
    if got >= n {
        let us: Vec<u32> = after
            .iter()
            .map(|d| d.as_micros().min(u32::MAX as u128) as u32)
            .collect();
        let last = percentile_sorted(&us, 100.0).unwrap_or(0) as f64 / 1e3;
        push("test.ping: time until every return", last, Some(job), fg);
    }
    push(
        "master CPU per test.ping return",
        job as f64 / tck * 1e6 / got.max(1) as f64,
        Some(job),
        fg,
    );
    eprintln!(
        "saltgate-bench: master {kind:?} n={n}: auth {:.1} s, {got} returns, master CPU {:.2} s auth / {:.2} s job, swarm CPU {:.2} s job",
        up.duration_since(swarm.started).as_secs_f64(),
        auth as f64 / tck,
        job as f64 / tck,
        w1.saturating_sub(w0) as f64 / tck
    );
    swarm.stop().await;
    Ok(out)
}

/// `SALTGATE_BENCH_JOB_PROFILE`: a shell command (e.g. `perf record -a -g -o /tmp/job.data`)
/// run over the `test.ping` job only, and stopped with SIGINT once every return is in, so a
/// profile holds the job and not the authentication before it.
struct JobProfiler(tokio::process::Child);

impl JobProfiler {
    async fn start() -> Result<Option<Self>, BenchError> {
        let Ok(cmd) = std::env::var("SALTGATE_BENCH_JOB_PROFILE") else {
            return Ok(None);
        };
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec {cmd}"))
            .spawn()
            .map_err(|e| BenchError::Io(format!("SALTGATE_BENCH_JOB_PROFILE `{cmd}`: {e}")))?;
        // The profiler needs a moment to attach; this is the bench's own pacing, not a test's.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Some(JobProfiler(child)))
    }

    async fn stop(mut self) {
        if let Some(pid) = self.0.id() {
            // SAFETY: kill(2) on the profiler this bench started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        }
        let _ = self.0.wait().await;
    }
}

/// Issue 8's goals, per figure: the job's CPU per return and, at 5,000 minions, the time until
/// every return. Authentication has none (see the module's comment).
fn goal(figure: &str, case_n: usize) -> Option<String> {
    match figure {
        "master CPU per test.ping return" => Some("≥ 10× less".into()),
        "test.ping: time until every return" if case_n >= 5000 => Some("ours ≤ 2000 ms".into()),
        _ => None,
    }
}

pub fn rows(samples: &[MasterSample], sizes: &[usize]) -> Vec<MasterRow> {
    let mut out = Vec::new();
    for &n in sizes {
        for (figure, unit) in FIGURES {
            let pick = |k: MasterKind| -> Vec<&MasterSample> {
                samples
                    .iter()
                    .filter(|s| s.kind == k && s.minions == n && s.figure == figure)
                    .collect()
            };
            let med = |k| median(&pick(k).iter().map(|s| s.value).collect::<Vec<_>>());
            let ticks = |k| {
                median(
                    &pick(k)
                        .iter()
                        .filter_map(|s| s.ticks.map(|t| t as f64))
                        .collect::<Vec<_>>(),
                )
            };
            let (s, g) = (med(MasterKind::SaltMaster), med(MasterKind::SaltgateMaster));
            let times_less = match (s, g) {
                (Some(s), Some(g)) if g > 0.0 && unit != "count" => Some(s / g),
                _ => None,
            };
            let goal = goal(figure, n);
            let met = match figure {
                "test.ping: time until every return" => goal.as_ref().and(g).map(|g| g <= 2000.0),
                _ => goal.as_ref().and(times_less).map(|r| r >= 10.0),
            };
            out.push(MasterRow {
                figure,
                case: format!("{} minions", count_label(n)),
                unit,
                salt_master: s,
                saltgate_master: g,
                times_less,
                goal,
                met,
                ticks_salt: ticks(MasterKind::SaltMaster),
                ticks_saltgate: ticks(MasterKind::SaltgateMaster),
            });
        }
    }
    out
}

/// `--master-kinds`: `salt`, `saltgate` (each at most once, at least one).
pub fn parse_kinds(names: &[String]) -> Result<Vec<MasterKind>, String> {
    let mut kinds = Vec::new();
    for n in names {
        let k = match n.trim() {
            "salt" => MasterKind::SaltMaster,
            "saltgate" => MasterKind::SaltgateMaster,
            other => {
                return Err(format!(
                    "--master-kinds: unknown master {other:?}; use salt, saltgate or both"
                ))
            }
        };
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    if kinds.is_empty() {
        return Err("--master-kinds: name at least one of salt, saltgate".into());
    }
    Ok(kinds)
}

/// Runs every size, `repeat` rounds, the masters in an order rotated each round.
pub async fn bench(
    ctx: &Ctx,
    sizes: &[usize],
    only: &[MasterKind],
    repeat: usize,
    command: String,
) -> Result<MasterReport, BenchError> {
    if only.contains(&MasterKind::SaltMaster) {
        saltmaster::venv()?;
    }
    let started = std::time::SystemTime::now();
    let (load_before, sys0) = (procfs::loadavg(), procfs::sys_sample()?);
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    for &n in sizes {
        for r in 0..repeat {
            let mut kinds = only.to_vec();
            let turn = r % kinds.len();
            kinds.rotate_left(turn);
            for kind in kinds {
                eprintln!(
                    "saltgate-bench: master {kind:?} {n} minions round {}/{repeat} (loadavg {})",
                    r + 1,
                    procfs::loadavg()
                );
                match one(ctx, kind, n, r).await {
                    Ok(s) => samples.extend(s),
                    Err(e) => {
                        let what = format!("{kind:?}, {n} minions, round {}: {e}", r + 1);
                        eprintln!("saltgate-bench: master run failed: {what}");
                        failures.push(what);
                    }
                }
            }
        }
    }
    let sys1 = procfs::sys_sample()?;
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    Ok(MasterReport {
        command,
        started_utc: utc(secs(started)),
        finished_utc: utc(secs(std::time::SystemTime::now())),
        cpus: procfs::cpus(),
        loadavg_before: load_before,
        loadavg_after: procfs::loadavg(),
        machine_idle_pct: 100.0 * sys1.idle.saturating_sub(sys0.idle) as f64
            / sys1.total.saturating_sub(sys0.total).max(1) as f64,
        start_rate: ctx.swarm.start_rate,
        rows: rows(&samples, sizes),
        samples,
        failures,
    })
}

pub fn markdown(r: &MasterReport) -> String {
    let mut s = String::from(
        "| figure | case | unit | salt-master 3008.5 | saltgate-master | salt ÷ ours | goal | met | master ticks salt / ours |\n|---|---|---|---:|---:|---:|---|---|---:|\n",
    );
    let o = |v: Option<f64>| v.map(num).unwrap_or_else(|| "—".into());
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            row.figure,
            row.case,
            row.unit,
            o(row.salt_master),
            o(row.saltgate_master),
            row.times_less
                .map(|x| format!("{}×", num(x)))
                .unwrap_or_else(|| "—".into()),
            row.goal.clone().unwrap_or_default(),
            match row.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "",
            },
            o(row.ticks_salt),
            o(row.ticks_saltgate),
        );
    }
    let fg: Vec<f64> = r.samples.iter().map(|x| x.foreign_cpu_pct).collect();
    let _ = write!(
        s,
        "\n- command: `{}`\n- run: {} → {} (UTC), {} CPU(s); minions started at {}/s for both\n- background: loadavg before `{}`, after `{}`; machine idle over the run {:.0} %; other processes' CPU during the windows: median {:.0} %, max {:.0} % of the machine\n",
        r.command,
        r.started_utc,
        r.finished_utc,
        r.cpus,
        r.start_rate,
        r.loadavg_before,
        r.loadavg_after,
        r.machine_idle_pct,
        median(&fg).unwrap_or(0.0),
        fg.iter().copied().fold(0.0, f64::max)
    );
    for f in &r.failures {
        let _ = writeln!(s, "- **did not complete:** {f}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_kinds_parse_and_refuse_unknown_names() {
        let k = |v: &[&str]| parse_kinds(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            k(&["salt", "saltgate"]),
            Ok(vec![MasterKind::SaltMaster, MasterKind::SaltgateMaster])
        );
        assert_eq!(
            k(&["saltgate", "saltgate"]),
            Ok(vec![MasterKind::SaltgateMaster])
        );
        let e = k(&["salt-master"]).unwrap_err();
        assert!(
            e.contains("--master-kinds") && e.contains("salt-master"),
            "{e}"
        );
        assert!(k(&[]).is_err());
    }

    fn sample(kind: MasterKind, figure: &'static str, value: f64) -> MasterSample {
        MasterSample {
            kind,
            repeat: 0,
            minions: 5000,
            figure,
            unit: "µs",
            value,
            ticks: Some(100),
            foreign_cpu_pct: 0.0,
            loadavg: String::new(),
        }
    }

    #[test]
    fn rows_give_the_ratio_salt_over_ours_and_judge_the_goals() {
        let s = vec![
            sample(
                MasterKind::SaltMaster,
                "master CPU per test.ping return",
                900.0,
            ),
            sample(
                MasterKind::SaltgateMaster,
                "master CPU per test.ping return",
                60.0,
            ),
            sample(
                MasterKind::SaltgateMaster,
                "test.ping: time until every return",
                2500.0,
            ),
            sample(
                MasterKind::SaltMaster,
                "master CPU per minion auth",
                13000.0,
            ),
            sample(
                MasterKind::SaltgateMaster,
                "master CPU per minion auth",
                6500.0,
            ),
        ];
        let rows = rows(&s, &[5000]);
        // Authentication is measured and compared, but issue 8's goal is per job.
        let auth = rows
            .iter()
            .find(|r| r.figure == "master CPU per minion auth")
            .unwrap();
        assert_eq!(
            (auth.times_less, auth.goal.as_deref(), auth.met),
            (Some(2.0), None, None)
        );
        let cpu = rows
            .iter()
            .find(|r| r.figure == "master CPU per test.ping return")
            .unwrap();
        assert_eq!(cpu.times_less, Some(15.0));
        assert_eq!(cpu.met, Some(true));
        let t = rows
            .iter()
            .find(|r| r.figure == "test.ping: time until every return")
            .unwrap();
        assert_eq!(t.met, Some(false));
        let md = markdown(&MasterReport {
            command: "x".into(),
            started_utc: String::new(),
            finished_utc: String::new(),
            cpus: 2,
            loadavg_before: String::new(),
            loadavg_after: String::new(),
            machine_idle_pct: 0.0,
            start_rate: 100,
            rows,
            samples: s,
            failures: vec!["SaltMaster, 5000 minions, round 1: not within 720s".into()],
        });
        assert!(md.contains("| 15.0× |"));
        assert!(md.contains("- **did not complete:** SaltMaster, 5000 minions"));
    }
}
