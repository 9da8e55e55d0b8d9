//! `authstorm` (issue 25's proof): N `saltgate-minion swarm` minions started at a high rate
//! against one real salt-master 3008.5 (Salt's defaults, `auto_accept`), or a real 3008 cluster of
//! `--authstorm-masters` members (`saltcluster`; direct, the minions are spread evenly over the
//! members, as DNS round robin would; behind a proxy, the proxy balances), four ways in turn per
//! size: **direct**, through **HAProxy**, through **saltgate L4** (no `auth_limit`), and through
//! **saltgate with `auth_limit`**. Each way gets a fresh master, a fresh front and a fresh swarm.
//! Measured per way: the time until every minion is authenticated (a run capped at `cap` reports
//! how many made it), the master's CPU (its whole process tree, from /proc) per authenticated
//! minion (all members' trees), the `_auth` requests the master processed per authenticated minion (its log at
//! `info` has one `Authentication request from <id>` line per `_auth` a worker handles), and
//! whether saltgate marked the master DOWN (`saltgate_master_state_changes_total{to="down"}`).
//! Then the rotation storm: `salt-key -d` of one minion (`rotate_aes_key: True` makes it leave
//! the dropfile `cachedir/.dfn`), and once the master's Maintenance process has taken the
//! dropfile away (it rotates the AES key as it does), `test.ping` to all through Salt's `LocalClient`; each minion finds
//! the new key on that publish, authenticates again and answers: the time until every return.
//! The report and its rows live in `authstorm_report`.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::authstorm_report::{rows, AuthstormReport};
use super::proctree;
use super::saltcluster::SaltCluster;
use super::saltmaster::{self, SaltMaster, Tuning};
use super::swarmproc::{fresh_pki, Part, Swarm, Totals};
use super::Ctx;
use crate::lab::http_get;
use crate::report::utc;
use crate::targets::{Target, TargetKind};
use crate::{procfs, BenchError};

/// The line salt-master 3008.5 logs (at `info`) for every `_auth` a worker processes
/// (`salt/channel/server.py`, `ReqServerChannel._auth`).
pub const AUTH_LINE: &str = "Authentication request from";

/// How the minions reach the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Way {
    Direct,
    Haproxy,
    SaltgateL4,
    SaltgateLimit,
}

impl Way {
    pub const ALL: [Way; 4] = [
        Way::Direct,
        Way::Haproxy,
        Way::SaltgateL4,
        Way::SaltgateLimit,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::Haproxy => "HAProxy",
            Way::SaltgateL4 => "saltgate L4",
            Way::SaltgateLimit => "saltgate auth_limit",
        }
    }

    pub fn parse(s: &str) -> Option<Way> {
        match s.trim() {
            "direct" => Some(Way::Direct),
            "haproxy" => Some(Way::Haproxy),
            "l4" => Some(Way::SaltgateL4),
            "limit" => Some(Way::SaltgateLimit),
            _ => None,
        }
    }
}

/// `--authstorm-ways`: `direct`, `haproxy`, `l4`, `limit` (each at most once, at least one).
pub fn parse_ways(names: &[String]) -> Result<Vec<Way>, String> {
    let mut ways = Vec::new();
    for n in names {
        let w = Way::parse(n).ok_or_else(|| {
            format!("--authstorm-ways: unknown way {n:?}; use direct, haproxy, l4, limit")
        })?;
        if !ways.contains(&w) {
            ways.push(w);
        }
    }
    if ways.is_empty() {
        return Err("--authstorm-ways: name at least one of direct, haproxy, l4, limit".into());
    }
    Ok(ways)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    pub ways: Vec<Way>,
    /// Longest wait for every minion to authenticate, and for every `test.ping` return.
    pub cap: Duration,
    /// `auth_limit.max_in_flight` of the limited way: a number or `auto`.
    pub max_in_flight: String,
    pub rotate: bool,
    /// One salt-master (1), or a cluster of this many members.
    pub masters: usize,
}

/// The master side of one way: one salt-master or a cluster.
enum Masters {
    One(Box<SaltMaster>),
    Cluster(SaltCluster),
}

impl Masters {
    async fn start(ctx: &Ctx, n: usize, venv: &Path, tuning: &Tuning) -> Result<Self, BenchError> {
        if n <= 1 {
            return Ok(Masters::One(Box::new(
                SaltMaster::start_with(venv, ctx.net.ip(2), tuning).await?,
            )));
        }
        let ips = ctx.net.masters(n);
        Ok(Masters::Cluster(
            SaltCluster::start(venv, &ips, tuning).await?,
        ))
    }

    fn members(&self) -> &[SaltMaster] {
        match self {
            Masters::One(m) => std::slice::from_ref(m),
            Masters::Cluster(c) => &c.members,
        }
    }

    /// The member jobs are published through (and keys deleted on).
    fn first(&self) -> &SaltMaster {
        &self.members()[0]
    }

    fn pids(&self) -> Vec<u32> {
        self.members().iter().map(SaltMaster::pid).collect()
    }

    /// `_auth` requests processed so far, over every member's log.
    fn auth_lines(&self) -> u64 {
        self.members()
            .iter()
            .map(|m| count_lines(&m.log_path(), AUTH_LINE))
            .sum()
    }

    fn log_tail(&self) -> String {
        let tails: Vec<String> = self
            .members()
            .iter()
            .map(|m| format!("{}: {}", m.ret.ip(), m.log_tail()))
            .collect();
        tails.join("; ")
    }

    async fn stop(self) {
        match self {
            Masters::One(m) => (*m).stop().await,
            Masters::Cluster(c) => c.stop().await,
        }
    }
}

pub use super::authstorm_report::{Rotation, WayRun};

/// The front the minions connect to.
struct Front {
    /// The request addresses the swarm is spread over (direct: every member's).
    request: Vec<SocketAddr>,
    /// The proxy's publish listener (None: direct, the master's announced port).
    publish_port: Option<u16>,
    admin: Option<SocketAddr>,
    target: Option<Target>,
}

fn free_addr(ip: IpAddr) -> Result<SocketAddr, BenchError> {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| BenchError::Io(format!("bind {ip}:0: {e}")))
}

/// saltgate in front of the masters (each: its request address, its publish port): Salt-aware
/// health checks with saltgate's defaults (the ones that marked a busy master DOWN in issue
/// 25), and `auth_limit` on the limited way.
pub fn saltgate_yaml(
    masters: &[(SocketAddr, u16)],
    [publish, request, admin]: [SocketAddr; 3],
    limit: Option<&str>,
) -> String {
    let auth = limit.map_or(String::new(), |m| {
        format!("    auth_limit:\n      max_in_flight: {m}\n")
    });
    let list: String = masters
        .iter()
        .enumerate()
        .map(|(i, (m, p))| {
            format!(
                "  - name: m{}\n    host: {}\n    publish_port: {p}\n    request_port: {}\n",
                i + 1,
                m.ip(),
                m.port()
            )
        })
        .collect();
    format!(
        "# generated by saltgate-bench authstorm\n\
         global:\n  shutdown_grace: 1s\n  raise_nofile: true\n\
         masters:\n{list}\
         admin:\n  enabled: true\n  bind: \"{admin}\"\n\
         listeners:\n  publish:\n    bind: \"{publish}\"\n    access_log: false\n    maxconn: 30000\n\
         \x20 request:\n    bind: \"{request}\"\n    access_log: false\n    maxconn: 30000\n{auth}"
    )
}

/// HAProxy in front of one master, TCP mode, its default TCP check. `maxconn 9900`: HAProxy
/// wants 2 fds per session and this machine's hard limit is 20,000 (5,000 minions hold 5,000
/// publish sessions; their request sessions are short).
pub fn haproxy_cfg(masters: &[(SocketAddr, u16)], [publish, request]: [SocketAddr; 2]) -> String {
    let servers = |publish_side: bool| -> String {
        masters
            .iter()
            .enumerate()
            .map(|(i, (m, p))| {
                let to = if publish_side {
                    SocketAddr::new(m.ip(), *p)
                } else {
                    *m
                };
                format!("    server m{} {to} check\n", i + 1)
            })
            .collect()
    };
    format!(
        "# generated by saltgate-bench authstorm\n\
         global\n    maxconn 9900\n\n\
         defaults\n    mode tcp\n    timeout connect 10s\n    timeout client 86400s\n    timeout server 86400s\n\n\
         listen publish\n    bind {publish}\n    backlog 4096\n{}\n\
         listen request\n    bind {request}\n    backlog 4096\n    balance roundrobin\n{}",
        servers(true),
        servers(false)
    )
}

impl Front {
    async fn start(
        ctx: &Ctx,
        way: Way,
        masters: &Masters,
        max_in_flight: &str,
    ) -> Result<Front, BenchError> {
        let list: Vec<(SocketAddr, u16)> = masters
            .members()
            .iter()
            .map(|m| (m.ret, m.publish_port()))
            .collect();
        let (kind, text, publish, request, admin) = match way {
            Way::Direct => {
                return Ok(Front {
                    request: list.iter().map(|(r, _)| *r).collect(),
                    publish_port: None,
                    admin: None,
                    target: None,
                })
            }
            Way::Haproxy => {
                let ip = ctx.net.listen(TargetKind::Haproxy);
                let (p, r) = (free_addr(ip)?, free_addr(ip)?);
                (TargetKind::Haproxy, haproxy_cfg(&list, [p, r]), p, r, None)
            }
            Way::SaltgateL4 | Way::SaltgateLimit => {
                let ip = ctx.net.listen(TargetKind::Saltgate);
                let (p, r, a) = (free_addr(ip)?, free_addr(ip)?, free_addr(ip)?);
                let limit = (way == Way::SaltgateLimit).then_some(max_in_flight);
                let y = saltgate_yaml(&list, [p, r, a], limit);
                (TargetKind::Saltgate, y, p, r, Some(a))
            }
        };
        let mut target = Target::spawn(kind, &ctx.bins, &text, publish, request)?;
        // Ready when the master answers a clear `ping` through the request listener.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            target.check_alive()?;
            if saltgate_wire::probe::salt_ping(request, Duration::from_secs(2))
                .await
                .is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(BenchError::Target(format!(
                    "{} passed no ping to the master within 30 s: {}",
                    way.label(),
                    target.stderr_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Front {
            request: vec![request],
            publish_port: Some(publish.port()),
            admin,
            target: Some(target),
        })
    }

    /// saltgate's metrics: (DOWN flips, `_auth` admitted, dropped, orphaned).
    async fn gate_counts(&self) -> (Option<u64>, Option<f64>, Option<f64>, Option<f64>) {
        let Some(admin) = self.admin else {
            return (None, None, None, None);
        };
        let Ok(text) = http_get(admin, "/metrics").await else {
            return (None, None, None, None);
        };
        let downs = metric(&text, "saltgate_master_state_changes_total", "to=\"down\"");
        let admitted = metric(&text, "saltgate_auth_admitted_total", "");
        let dropped = metric(&text, "saltgate_auth_dropped_total", "");
        let orphaned = metric(&text, "saltgate_auth_orphaned_total", "");
        (
            Some(downs as u64),
            Some(admitted),
            Some(dropped),
            Some(orphaned),
        )
    }

    /// The sum of saltgate's metric `name` over the samples whose labels contain `label`.
    async fn counter(&self, name: &str, label: &str) -> Option<u64> {
        let text = http_get(self.admin?, "/metrics").await.ok()?;
        Some(metric(&text, name, label) as u64)
    }

    /// saltgate's DOWN flips (its event ring, `/api/v1/events`), counted by reason.
    async fn down_reasons(&self) -> Vec<(String, u64)> {
        let Some(admin) = self.admin else {
            return Vec::new();
        };
        let Ok(text) = http_get(admin, "/api/v1/events").await else {
            return Vec::new();
        };
        super::authstorm_report::down_reasons(&text)
    }

    async fn stop(self) {
        if let Some(t) = self.target {
            t.stop().await;
        }
    }
}

/// The sum of the samples of `name` whose labels contain `label`.
pub fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Occurrences of `needle` in the file (0 if it cannot be read).
pub fn count_lines(path: &Path, needle: &str) -> u64 {
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter(|l| l.contains(needle)).count() as u64)
        .unwrap_or(0)
}

fn foreign_pct(before: procfs::SysSample, after: procfs::SysSample, ours: u64) -> f64 {
    let total = after.total.saturating_sub(before.total).max(1);
    let busy = after.busy().saturating_sub(before.busy());
    100.0 * busy.saturating_sub(ours) as f64 / total as f64
}

/// `n` minions spread evenly over `targets` (ids numbered on from one part to the next), each
/// part's share of the swarm's `processes` (at least one each).
fn spread(
    targets: &[SocketAddr],
    publish_port: Option<u16>,
    n: usize,
    processes: usize,
) -> Vec<Part> {
    let k = targets.len().max(1);
    let mut start = 0;
    targets
        .iter()
        .enumerate()
        .map(|(i, &master)| {
            let count = n / k + usize::from(i < n % k);
            let p = Part {
                master,
                publish_port,
                count,
                id_start: start,
                processes: (processes / k).max(1),
            };
            start += count;
            p
        })
        .filter(|p| p.count > 0)
        .collect()
}

/// One way at one size: fresh masters, front and swarm.
async fn one(ctx: &Ctx, o: &Options, way: Way, n: usize) -> Result<WayRun, BenchError> {
    let venv = saltmaster::venv()?;
    let tuning = Tuning {
        log_level: "info",
        // The Maintenance process looks for `salt-key -d`'s rotation request every
        // `loop_interval` (60 s by default): 1 s lets the rotation start at once.
        extra: "loop_interval: 1\n".into(),
    };
    let m = Masters::start(ctx, o.masters, &venv, &tuning).await?;
    let r = match Front::start(ctx, way, &m, &o.max_in_flight).await {
        Ok(front) => {
            let r = measure(ctx, o, way, n, &m, &front, &venv).await;
            let r = r.map_err(|e| match &front.target {
                Some(t) => BenchError::Scenario(format!("{e}; proxy: {}", t.stderr_tail())),
                None => e,
            });
            front.stop().await;
            r
        }
        Err(e) => Err(e),
    };
    let r = r.map_err(|e| BenchError::Scenario(format!("{e}; salt-master: {}", m.log_tail())));
    m.stop().await;
    r
}

async fn measure(
    ctx: &Ctx,
    o: &Options,
    way: Way,
    n: usize,
    m: &Masters,
    front: &Front,
    venv: &Path,
) -> Result<WayRun, BenchError> {
    let tck = procfs::clock_ticks_per_sec() as f64;
    let run_dir = tempfile::Builder::new()
        .prefix("saltgate-bench-authstorm.")
        .tempdir()
        .map_err(|e| BenchError::Io(format!("temp dir: {e}")))?;
    let nowhere = SocketAddr::new(ctx.net.ip(250), 9);
    let pki = fresh_pki(
        &super::swarm::key_cache(),
        &ctx.bins.minion,
        run_dir.path(),
        nowhere,
    )?;
    let parts = spread(&front.request, front.publish_port, n, ctx.swarm.processes);
    let root = m.pids();
    let (c0, s0, a0) = (
        proctree::sample(&root)?.ticks,
        procfs::sys_sample()?,
        m.auth_lines(),
    );
    // Salt's acceptance_wait_time: 10 s (the swarm matches auth_timeout 5 s, auth_tries 7).
    let mut swarm = Swarm::start_with_wait(
        &ctx.bins.minion,
        &pki,
        "swarm-",
        ctx.swarm.start_rate,
        &parts,
        10.0,
    )?;
    let done = |t: &Totals| t.authenticated >= n as i64 && t.connected >= n as i64;
    let up = swarm.wait("every minion authenticated", o.cap, done).await;
    let (secs_to_all, t) = match &up {
        Ok(at) => (
            Some(at.duration_since(swarm.started).as_secs_f64()),
            swarm.totals(),
        ),
        Err(e) if e.to_string().contains("not within") => (None, swarm.totals()),
        Err(_) => {
            let e = up
                .err()
                .unwrap_or_else(|| BenchError::Scenario("swarm".into()));
            swarm.stop().await;
            return Err(e);
        }
    };
    let c1 = proctree::sample(&root)?.ticks;
    let swarm_ticks = proctree::sample(&swarm.pids())?.ticks;
    let gate_ticks = front
        .target
        .as_ref()
        .and_then(Target::pid)
        .map_or(Ok(0), |p| proctree::sample(&[p]).map(|s| s.ticks))?;
    let s1 = procfs::sys_sample()?;
    let a1 = m.auth_lines();
    let cpu = c1.saturating_sub(c0);
    let (downs, admitted, dropped, orphaned) = front.gate_counts().await;
    let authenticated = t.authenticated.max(0) as usize;
    eprintln!(
        "saltgate-bench: authstorm {} n={n}: {authenticated} authenticated in {}, master CPU {:.1} s, {} _auth processed, DOWN {downs:?}, swarm timeouts {} retries {}",
        way.label(),
        secs_to_all.map_or_else(|| format!("(cap {:?})", o.cap), |s| format!("{s:.1} s")),
        cpu as f64 / tck,
        a1.saturating_sub(a0),
        t.auth_timeouts,
        t.auth_retries
    );
    let mut run = WayRun {
        way,
        minions: n,
        authenticated,
        secs_to_all,
        master_cpu_secs: cpu as f64 / tck,
        auth_processed: a1.saturating_sub(a0),
        downs,
        gate_admitted: admitted,
        gate_dropped: dropped,
        gate_orphaned: orphaned,
        down_reasons: front.down_reasons().await,
        swarm_auth_timeouts: t.auth_timeouts,
        swarm_auth_retries: t.auth_retries,
        rotation: None,
        foreign_cpu_pct: foreign_pct(s0, s1, cpu + swarm_ticks + gate_ticks),
        loadavg: procfs::loadavg(),
    };
    if o.rotate && secs_to_all.is_some() {
        let r = rotation(o, n, m, front, venv).await;
        match r {
            Ok(r) => run.rotation = Some(r),
            Err(e) => eprintln!(
                "saltgate-bench: authstorm {} n={n}: rotation: {e}",
                way.label()
            ),
        }
    }
    swarm.stop().await;
    Ok(run)
}

/// `salt-key -d` of one minion, the rotation, then `test.ping` to all until every return.
async fn rotation(
    o: &Options,
    n: usize,
    masters: &Masters,
    front: &Front,
    venv: &Path,
) -> Result<Rotation, BenchError> {
    let tck = procfs::clock_ticks_per_sec() as f64;
    let root = masters.pids();
    let m = masters.first();
    let (c0, a0) = (proctree::sample(&root)?.ticks, masters.auth_lines());
    // `salt-key -d` leaves the dropfile in the (shared) cachedir.
    let dropfile = m.cachedir.join(".dfn");
    let (downs0, ..) = front.gate_counts().await;
    let reasons0 = front.down_reasons().await;
    const SESSIONS: (&str, &str) = ("saltgate_listener_sessions_total", "listener=\"publish\"");
    const BUSY: (&str, &str) = ("saltgate_master_check_busy_total", "port=\"publish\"");
    let sessions0 = front.counter(SESSIONS.0, SESSIONS.1).await;
    let busy0 = front.counter(BUSY.0, BUSY.1).await;
    let t0 = Instant::now();
    let out = tokio::process::Command::new(venv.join("bin/salt-key"))
        .arg("-c")
        .arg(&m.conf_dir)
        .args(["-y", "-d", "swarm-0"])
        .output()
        .await
        .map_err(|e| BenchError::Io(format!("salt-key -d: {e}")))?;
    if !out.status.success() {
        return Err(BenchError::Scenario(format!(
            "salt-key -d swarm-0: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while dropfile.exists() {
        if Instant::now() > deadline {
            return Err(BenchError::Scenario(format!(
                "salt-key -d: the master did not take {} (its AES key rotation) within 90 s",
                dropfile.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let secs_to_rotate = t0.elapsed().as_secs_f64();
    let mut after = saltmaster::publish(venv, m, "swarm-*", "test.ping", o.cap.as_secs()).await?;
    after.sort_unstable();
    let returns = after.len();
    // swarm-0's key was deleted: it is accepted again when it authenticates, and may or may
    // not be among the minions the publish expected.
    let secs_to_all_pinged = (returns + 1 >= n)
        .then(|| after.last().map(Duration::as_secs_f64))
        .flatten();
    let c1 = proctree::sample(&root)?.ticks;
    let (downs1, ..) = front.gate_counts().await;
    let r = Rotation {
        secs_to_rotate,
        secs_to_all_pinged,
        returns,
        auth_processed: masters.auth_lines().saturating_sub(a0),
        master_cpu_secs: c1.saturating_sub(c0) as f64 / tck,
        downs: downs0.zip(downs1).map(|(a, b)| b.saturating_sub(a)),
        down_reasons: super::authstorm_report::reasons_since(&reasons0, front.down_reasons().await),
        publish_sessions: sessions0
            .zip(front.counter(SESSIONS.0, SESSIONS.1).await)
            .map(|(a, b)| b.saturating_sub(a)),
        publish_busy_checks: busy0
            .zip(front.counter(BUSY.0, BUSY.1).await)
            .map(|(a, b)| b.saturating_sub(a)),
    };
    eprintln!("saltgate-bench: authstorm rotation: {r:?}");
    Ok(r)
}

/// Every size, every way in turn (the order rotated from one size to the next).
pub async fn bench(ctx: &Ctx, o: &Options, command: String) -> Result<AuthstormReport, BenchError> {
    saltmaster::venv()?;
    let started = std::time::SystemTime::now();
    let (load_before, sys0) = (procfs::loadavg(), procfs::sys_sample()?);
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for (i, &n) in o.sizes.iter().enumerate() {
        let mut ways = o.ways.clone();
        let turn = i % ways.len();
        ways.rotate_left(turn);
        for way in ways {
            eprintln!(
                "saltgate-bench: authstorm {} {n} minions (loadavg {})",
                way.label(),
                procfs::loadavg()
            );
            match one(ctx, o, way, n).await {
                Ok(r) => runs.push(r),
                Err(e) => {
                    let what = format!("{}, {n} minions: {e}", way.label());
                    eprintln!("saltgate-bench: authstorm run failed: {what}");
                    failures.push(what);
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
    Ok(AuthstormReport {
        command,
        started_utc: utc(secs(started)),
        finished_utc: utc(secs(std::time::SystemTime::now())),
        cpus: procfs::cpus(),
        loadavg_before: load_before,
        loadavg_after: procfs::loadavg(),
        machine_idle_pct: 100.0 * sys1.idle.saturating_sub(sys0.idle) as f64
            / sys1.total.saturating_sub(sys0.total).max(1) as f64,
        start_rate: ctx.swarm.start_rate,
        cap_secs: o.cap.as_secs(),
        max_in_flight: o.max_in_flight.clone(),
        masters: o.masters.max(1),
        rows: rows(&runs, &o.sizes, o.cap.as_secs_f64()),
        runs,
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ways_parse_and_refuse_unknown_names() {
        let w = |v: &[&str]| parse_ways(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            w(&["limit", "l4", "limit"]),
            Ok(vec![Way::SaltgateLimit, Way::SaltgateL4])
        );
        let e = w(&["saltgate"]).unwrap_err();
        assert!(
            e.contains("--authstorm-ways") && e.contains("saltgate"),
            "{e}"
        );
        assert!(w(&[]).is_err());
    }

    #[test]
    fn the_saltgate_config_is_valid_and_limits_only_the_limited_way() {
        let binds = [
            a("127.0.3.11:4001"),
            a("127.0.3.11:4002"),
            a("127.0.3.11:4003"),
        ];
        let one = [(a("127.0.3.2:4506"), 4505)];
        let three = [
            (a("127.0.3.2:5506"), 5505),
            (a("127.0.3.3:5506"), 5505),
            (a("127.0.3.4:5506"), 5505),
        ];
        for limit in [None, Some("auto"), Some("8")] {
            let y = saltgate_yaml(&one, binds, limit);
            let c = saltgate_config::parse(&y, None, saltgate_config::Format::Yaml)
                .unwrap_or_else(|e| panic!("{e}\n{y}"))
                .config;
            assert_eq!(c.request.auth_limit.is_some(), limit.is_some(), "{y}");
            assert_eq!(c.masters[0].request_port, 4506);
            assert_eq!(c.masters[0].publish_port, 4505);
        }
        let y = saltgate_yaml(&three, binds, Some("auto"));
        let c = saltgate_config::parse(&y, None, saltgate_config::Format::Yaml)
            .unwrap_or_else(|e| panic!("{e}\n{y}"))
            .config;
        assert_eq!(c.masters.len(), 3, "{y}");
        assert_eq!(c.masters[2].host, "127.0.3.4");
        assert_eq!(c.masters[2].request_port, 5506);
    }

    #[test]
    fn haproxy_forwards_both_ports_to_the_master() {
        let c = haproxy_cfg(
            &[(a("127.0.3.2:4506"), 4505)],
            [a("127.0.3.10:1"), a("127.0.3.10:2")],
        );
        assert!(
            c.contains("bind 127.0.3.10:1\n    backlog 4096\n    server m1 127.0.3.2:4505 check")
        );
        assert!(c.contains(
            "bind 127.0.3.10:2\n    backlog 4096\n    balance roundrobin\n    server m1 127.0.3.2:4506 check"
        ));
        let c = haproxy_cfg(
            &[(a("127.0.3.2:4506"), 4505), (a("127.0.3.3:4506"), 4505)],
            [a("127.0.3.10:1"), a("127.0.3.10:2")],
        );
        assert!(c.contains("server m2 127.0.3.3:4505 check\n"), "{c}");
        assert!(c.contains("server m2 127.0.3.3:4506 check\n"), "{c}");
    }

    #[test]
    fn direct_minions_are_spread_evenly_over_the_members() {
        let t = [a("127.0.3.2:1"), a("127.0.3.3:1"), a("127.0.3.4:1")];
        let p = spread(&t, None, 10, 4);
        let counts: Vec<(usize, usize)> = p.iter().map(|p| (p.id_start, p.count)).collect();
        assert_eq!(counts, [(0, 4), (4, 3), (7, 3)]);
        assert!(p.iter().all(|p| p.processes == 1));
        assert_eq!(p[1].master, t[1]);
        // Fewer minions than members: no empty part.
        assert_eq!(spread(&t, Some(9), 2, 2).len(), 2);
        assert_eq!(spread(&t[..1], None, 5, 3)[0].processes, 3);
    }

    #[test]
    fn metrics_are_summed_by_name_and_label() {
        let t = "# HELP x\nsaltgate_master_state_changes_total{master=\"m1\",to=\"down\"} 2\n\
                 saltgate_master_state_changes_total{master=\"m1\",to=\"up\"} 3\n\
                 saltgate_auth_dropped_total{master=\"m1\",reason=\"max_wait\"} 4\n\
                 saltgate_auth_dropped_total{master=\"m1\",reason=\"minion_closed\"} 1\n\
                 saltgate_auth_dropped_total_extra 9\n";
        assert_eq!(
            metric(t, "saltgate_master_state_changes_total", "to=\"down\""),
            2.0
        );
        assert_eq!(metric(t, "saltgate_auth_dropped_total", ""), 5.0);
    }

    #[test]
    fn auth_lines_are_counted_in_the_masters_log() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("master.log");
        std::fs::write(
            &p,
            "2026 [salt.master][INFO] Authentication request from swarm-1\n\
             2026 [salt.master][INFO] Authentication accepted from swarm-1\n\
             2026 [salt.master][INFO] Authentication request from swarm-2\n",
        )
        .unwrap();
        assert_eq!(count_lines(&p, AUTH_LINE), 2);
        assert_eq!(count_lines(&d.path().join("none"), AUTH_LINE), 0);
    }
}
