//! `swarm`: N `saltgate-minion swarm` minions (separate processes, `--shared-key`) through the
//! target to a three-member `saltgate-master` cluster (separate processes). Direct: the swarm is
//! split over the three members. Figures: time from the swarm's start until every minion is
//! authenticated and its publish connection is up; proxy CPU per minion for that; proxy RSS per
//! session; then `test.ping` published through member 1's local socket to all N: time until
//! every return, p50/p99 of the returns' arrival, proxy CPU per return. The masters' CPU (sum
//! of the three process trees) and RSS, and the swarm's RSS, are reported for every target.
//!
//! With `gates` > 1, saltgate runs as that many processes on the same ports (`reuse_port:
//! true`): one process holds at most 20,000 file descriptors, two per proxied session.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::cluster::Cluster;
use super::proctree::{self, TreeSample};
use super::swarmproc::{fresh_pki, Part, Swarm};
use super::{count_label, Ctx, Sample};
use crate::measure::Spent;
use crate::targets::{haproxy_cfg, saltgate_yaml, Target, TargetKind};
use crate::{procfs, stats, BenchError};

/// How big a swarm run is (`--swarm-minions`, `--swarm-processes`, `--swarm-gates`,
/// `--swarm-start-rate`).
#[derive(Debug, Clone, Copy)]
pub struct SwarmSize {
    pub minions: usize,
    /// Swarm processes (`--processes`) in all.
    pub processes: usize,
    /// saltgate processes sharing the listeners (reuse_port).
    pub gates: usize,
    /// Minions started per second, all processes together.
    pub start_rate: u32,
}

impl SwarmSize {
    pub fn default_for(quick: bool) -> SwarmSize {
        SwarmSize {
            minions: if quick { 30 } else { 1000 },
            processes: 1,
            gates: 1,
            start_rate: if quick { 200 } else { 500 },
        }
    }
}

/// Where the shared swarm key is cached between runs (generated once).
pub fn key_cache() -> PathBuf {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/saltgate/bench-swarm-key"))
        .unwrap_or_else(|| std::env::temp_dir().join("saltgate-bench-swarm-key"))
}

/// CPU of the proxies, the masters and the swarm over a window.
struct Window {
    at: Instant,
    proxies: Vec<u32>,
    masters: Vec<u32>,
    proxy: TreeSample,
    master: TreeSample,
    me: u64,
    sys: procfs::SysSample,
}

impl Window {
    fn start(proxies: &[u32], masters: &[u32]) -> Result<Window, BenchError> {
        Ok(Window {
            at: Instant::now(),
            proxies: proxies.to_vec(),
            masters: masters.to_vec(),
            proxy: proctree::sample(proxies)?,
            master: proctree::sample(masters)?,
            me: procfs::sample(0)?.ticks,
            sys: procfs::sys_sample()?,
        })
    }

    /// `swarm_ticks`: what the swarm spent over the window. Masters count as the backend, the
    /// swarm and this process as the load generator.
    fn end(&self, swarm_ticks: u64) -> Result<Spent, BenchError> {
        let proxy = proctree::sample(&self.proxies)?
            .ticks
            .saturating_sub(self.proxy.ticks);
        let master = proctree::sample(&self.masters)?
            .ticks
            .saturating_sub(self.master.ticks);
        let me = procfs::sample(0)?.ticks.saturating_sub(self.me);
        let sys = procfs::sys_sample()?;
        let busy = sys.busy().saturating_sub(self.sys.busy());
        let loadgen = me + swarm_ticks;
        let proxy = (!self.proxies.is_empty()).then_some(proxy);
        Ok(Spent {
            secs: self.at.elapsed().as_secs_f64(),
            proxy_ticks: proxy,
            loadgen_ticks: loadgen,
            backend_ticks: master,
            foreign_ticks: busy.saturating_sub(proxy.unwrap_or(0) + loadgen + master),
            machine_ticks: sys.total.saturating_sub(self.sys.total),
        })
    }
}

/// How saltgate's publish listener serves the swarm: an L4 tunnel per minion to one master, or
/// the cluster fan-out (one upstream per master, every minion a session of saltgate's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishMode {
    L4,
    Fanout,
}

impl PublishMode {
    /// The case label the figures carry: "1k minions" (L4) or "1k minions, fan-out".
    fn case(self, n: usize) -> String {
        match self {
            PublishMode::L4 => format!("{} minions", count_label(n)),
            PublishMode::Fanout => format!("{} minions, fan-out", count_label(n)),
        }
    }
}

/// The proxies in front of the cluster (none for direct), ready for Salt traffic.
async fn start_proxies(
    ctx: &Ctx,
    kind: TargetKind,
    cluster: &Cluster,
    n: usize,
    mode: PublishMode,
) -> Result<Vec<Target>, BenchError> {
    if kind == TargetKind::Direct {
        return Ok(Vec::new());
    }
    let mut settings = ctx.settings;
    let gates = if kind == TargetKind::Saltgate {
        ctx.swarm.gates.max(1)
    } else {
        1
    };
    // Room for every session and the request connections in flight, on each process.
    settings.maxconn = settings.maxconn.max((n + 2000) as u32);
    let ip = ctx.net.listen(kind);
    let publish = SocketAddr::new(ip, free_port(ip)?);
    let request = SocketAddr::new(ip, free_port(ip)?);
    let backends = cluster.as_backends();
    let text = match kind {
        TargetKind::Haproxy => haproxy_cfg(&settings, publish, request, &backends),
        _ => with_publish_mode(
            &with_reuse_port(
                &saltgate_yaml(&settings, publish, request, &backends),
                gates > 1,
            ),
            mode,
            &cluster.cluster_pki_dir(),
        ),
    };
    let mut out = Vec::new();
    for _ in 0..gates {
        out.push(Target::spawn(kind, &ctx.bins, &text, publish, request)?);
    }
    // Ready when a Salt ping goes through the request listener, 4 times in a row (with
    // several processes, each gets its share of the connections).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ok = 0;
    while ok < 4 * gates {
        for t in &mut out {
            t.check_alive()?;
        }
        match saltgate_wire::probe::salt_ping(request, Duration::from_secs(2)).await {
            Ok(_) => ok += 1,
            Err(e) => {
                ok = 0;
                if Instant::now() > deadline {
                    return Err(BenchError::Target(format!(
                        "{}: no Salt ping through {request} within 20 s: {e}; {}",
                        kind.label(),
                        out[0].stderr_tail()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(out)
}

/// saltgate's generated YAML with `reuse_port: true` on both listeners.
pub fn with_reuse_port(yaml: &str, on: bool) -> String {
    if !on {
        return yaml.to_string();
    }
    yaml.replace(
        "    access_log: false\n",
        "    access_log: false\n    reuse_port: true\n",
    )
}

/// saltgate's generated YAML with the publish listener in `mode` (the request listener stays
/// L4: fan-out is a publish-side mode). Fan-out reads the cluster's key from `cluster_pki_dir`
/// (`dedup_cluster_pki_dir`), as docs/fanout.md and examples/keepalived/saltgate.yaml configure
/// it for a 3008 cluster: each minion gets the first copy of a job, not one per member (without
/// it, three copies each, and three times L4's writes).
pub fn with_publish_mode(yaml: &str, mode: PublishMode, cluster_pki_dir: &Path) -> String {
    match mode {
        PublishMode::L4 => yaml.to_string(),
        PublishMode::Fanout => yaml.replacen(
            "  publish:\n",
            &format!(
                "  publish:\n    mode: fanout\n    dedup_cluster_pki_dir: \"{}\"\n",
                cluster_pki_dir.display()
            ),
            1,
        ),
    }
}

fn free_port(ip: std::net::IpAddr) -> Result<u16, BenchError> {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::Io(format!("bind {ip}:0: {e}")))
}

pub async fn run(ctx: &Ctx, kind: TargetKind) -> Result<Vec<Sample>, BenchError> {
    let size = ctx.swarm;
    let n = size.minions.max(1);
    let cluster = Cluster::start(&ctx.bins.master, &ctx.net.masters(3)).await?;
    let mut r = measure(ctx, kind, &cluster, n, size, PublishMode::L4).await;
    // saltgate also serves the same swarm in cluster fan-out mode (issue 13): the masters'
    // publishers then serve three upstreams instead of every minion.
    if kind == TargetKind::Saltgate {
        if let Ok(out) = &mut r {
            match measure(ctx, kind, &cluster, n, size, PublishMode::Fanout).await {
                Ok(more) => out.extend(more),
                Err(e) => r = Err(BenchError::Scenario(format!("fan-out: {e}"))),
            }
        }
    }
    let r = r.map_err(|e| BenchError::Scenario(format!("{e}; masters: {}", cluster.stderr_tail())));
    cluster.stop().await;
    r
}

async fn measure(
    ctx: &Ctx,
    kind: TargetKind,
    cluster: &Cluster,
    n: usize,
    size: SwarmSize,
    mode: PublishMode,
) -> Result<Vec<Sample>, BenchError> {
    let case = mode.case(n);
    let settle = Duration::from_millis(if ctx.quick { 200 } else { 1000 });
    let mut proxies = start_proxies(ctx, kind, cluster, n, mode).await?;
    let proxy_pids: Vec<u32> = proxies.iter().filter_map(Target::pid).collect();
    let parts = match proxies.first() {
        Some(t) => vec![Part {
            master: t.stream[0],
            publish_port: Some(t.echo[0].port()),
            count: n,
            id_start: 0,
            processes: size.processes,
        }],
        None => {
            let k = cluster.members.len();
            (0..k)
                .map(|i| Part {
                    master: cluster.members[i].ret,
                    publish_port: None,
                    count: n / k + usize::from(i < n % k),
                    id_start: (0..i).map(|j| n / k + usize::from(j < n % k)).sum(),
                    processes: size.processes.div_ceil(k),
                })
                .filter(|p| p.count > 0)
                .collect()
        }
    };
    let run_dir = tempfile::Builder::new()
        .prefix("saltgate-bench-swarm.")
        .tempdir()
        .map_err(|e| BenchError::Io(format!("temp dir: {e}")))?;
    let nowhere = SocketAddr::new(ctx.net.ip(250), 9);
    let pki = fresh_pki(&key_cache(), &ctx.bins.minion, run_dir.path(), nowhere)?;
    tokio::time::sleep(settle).await;
    let proxy_base = proctree::sample(&proxy_pids)?.rss_kib;

    // Connect and authenticate every minion.
    let w = Window::start(&proxy_pids, &cluster.pids())?;
    let mut swarm = Swarm::start(&ctx.bins.minion, &pki, "swarm-", size.start_rate, &parts)?;
    let limit = Duration::from_secs(60 + (n as u64) / 20);
    let all_up = swarm
        .wait("every minion authenticated and connected", limit, |t| {
            t.authenticated >= n as i64 && t.connected >= n as i64
        })
        .await?;
    let swarm_ticks = proctree::sample(&swarm.pids())?.ticks;
    let spent = w.end(swarm_ticks)?;
    let up_secs = all_up.duration_since(swarm.started).as_secs_f64();
    let mut out = vec![Sample::new(
        "swarm",
        "time to connect and authenticate all",
        &case,
        "s",
        kind,
        up_secs,
        Some(&spent),
    )];
    let tck = procfs::clock_ticks_per_sec() as f64;
    let per = |ticks: u64| ticks as f64 / tck * 1e6 / n as f64;
    if let Some(t) = spent.proxy_ticks {
        out.push(Sample::new(
            "swarm",
            "CPU per minion connect + auth",
            &case,
            "µs",
            kind,
            per(t),
            Some(&spent),
        ));
    }
    out.push(Sample::new(
        "swarm",
        "masters' CPU per minion auth",
        &case,
        "µs",
        kind,
        per(spent.backend_ticks),
        Some(&spent),
    ));

    tokio::time::sleep(settle).await;
    for t in &mut proxies {
        // A proxy that died would make every figure below meaningless.
        t.check_alive()?;
    }
    let kib = |x: u64| x as f64 / n as f64;
    if !proxy_pids.is_empty() {
        let rss = proctree::sample(&proxy_pids)?.rss_kib;
        out.push(Sample::new(
            "swarm",
            "RSS per session",
            &case,
            "KiB",
            kind,
            kib(rss.saturating_sub(proxy_base)),
            None,
        ));
    }
    let swarm_rss = proctree::sample(&swarm.pids())?.rss_kib;
    let master_rss = proctree::sample(&cluster.pids())?.rss_kib;
    out.push(Sample::new(
        "swarm",
        "swarm RSS per minion",
        &case,
        "KiB",
        kind,
        kib(swarm_rss),
        None,
    ));
    out.push(Sample::new(
        "swarm",
        "masters' RSS per minion",
        &case,
        "KiB",
        kind,
        kib(master_rss),
        None,
    ));

    // test.ping to all, published on member 1.
    let receipts_before = swarm.receipts();
    let swarm_before = proctree::sample(&swarm.pids())?.ticks;
    let w = Window::start(&proxy_pids, &cluster.pids())?;
    let timeout = if ctx.quick { 30 } else { 60 + n as u64 / 100 };
    let req = json!({"tgt": "swarm-*", "fun": "test.ping", "arg": [], "timeout_secs": timeout});
    let got = tokio::time::timeout(
        Duration::from_secs(timeout + 30),
        saltgate_master::cli::publish(&cluster.members[0].socket, &req),
    )
    .await
    .map_err(|_| BenchError::Scenario("test.ping: the publish did not finish".into()))?
    .map_err(|e| BenchError::Scenario(format!("test.ping: {e}")))?;
    let swarm_ticks = proctree::sample(&swarm.pids())?
        .ticks
        .saturating_sub(swarm_before);
    let spent = w.end(swarm_ticks)?;
    let answered = got
        .returns
        .iter()
        .filter(|r| r.record.get("return") == Some(&json!(true)))
        .count();
    if answered < n {
        return Err(BenchError::Scenario(format!(
            "test.ping (jid {}): {answered} of {n} minions answered True within {timeout} s; {} missing, e.g. {:?}",
            got.jid,
            got.missing.len(),
            got.missing.iter().take(3).collect::<Vec<_>>()
        )));
    }
    // Arrival of each return after the publish, µs.
    let mut after: Vec<u32> = got
        .returns
        .iter()
        .map(|r| r.after.as_micros().min(u32::MAX as u128) as u32)
        .collect();
    after.sort_unstable();
    let ms = |p: f64| stats::percentile_sorted(&after, p).unwrap_or(0) as f64 / 1e3;
    let last = ms(100.0);
    for (fig, p) in [
        ("test.ping: time until every return", 100.0),
        ("test.ping: return p50", 50.0),
        ("test.ping: return p99", 99.0),
    ] {
        out.push(Sample::new(
            "swarm",
            fig,
            &case,
            "ms",
            kind,
            ms(p),
            Some(&spent),
        ));
    }
    // Publish to receipt at the minions (the JID's moment to the job's arrival), once every
    // minion's progress line counted it.
    let receipts = swarm
        .wait_receipts(&receipts_before, answered as u64, Duration::from_secs(5))
        .await;
    for (fig, p) in [
        ("test.ping: publish to receipt p50", 50.0),
        ("test.ping: publish to receipt p99", 99.0),
    ] {
        if let Some(us) = saltgate_minion::latency::percentile_us(&receipts, p) {
            out.push(Sample::new(
                "swarm",
                fig,
                &case,
                "ms",
                kind,
                us / 1e3,
                Some(&spent),
            ));
        }
    }
    if let Some(t) = spent.proxy_ticks {
        out.push(Sample::new(
            "swarm",
            "CPU per test.ping return",
            &case,
            "µs",
            kind,
            per(t),
            Some(&spent),
        ));
    }
    out.push(Sample::new(
        "swarm",
        "masters' CPU per test.ping return",
        &case,
        "µs",
        kind,
        per(spent.backend_ticks),
        Some(&spent),
    ));
    out.extend(publish_cost(ctx, kind, &case, cluster, &proxy_pids).await?);
    let t = swarm.totals();
    eprintln!(
        "saltgate-bench: swarm via {} ({mode:?}): {n} up in {up_secs:.2} s, {answered} returns, last at {last:.0} ms; swarm errors {}, proxies {:?}",
        kind.label(),
        t.errors,
        proxy_pids
    );
    swarm.stop().await;
    for p in proxies {
        p.stop().await;
    }
    Ok(out)
}

/// Jobs published for [`publish_cost`].
const PUBLISH_COST_JOBS: u32 = 50;

/// What publishing costs the masters (the three process trees) and the proxy per job, apart from
/// the returns: `PUBLISH_COST_JOBS` jobs targeted at no minion, one after another through member
/// 1 (each member publishes every job, peers forwarding it; every minion receives it, decrypts it
/// and drops it, unanswered). In L4 mode each member's publisher writes one copy per minion
/// session on it; in fan-out mode one per saltgate upstream, whatever the number of minions.
async fn publish_cost(
    ctx: &Ctx,
    kind: TargetKind,
    case: &str,
    cluster: &Cluster,
    proxy_pids: &[u32],
) -> Result<Vec<Sample>, BenchError> {
    let jobs = if ctx.quick { 5 } else { PUBLISH_COST_JOBS };
    let w = Window::start(proxy_pids, &cluster.pids())?;
    for _ in 0..jobs {
        let req = json!({"tgt": "nobody-here-*", "fun": "test.ping", "arg": [], "timeout_secs": 1});
        saltgate_master::cli::publish(&cluster.members[0].socket, &req)
            .await
            .map_err(|e| BenchError::Scenario(format!("publish to no minion: {e}")))?;
    }
    // The publishers' queues drain after the CLI returns: leave them the time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = w.end(0)?;
    let per_job =
        |ticks: u64| ticks as f64 / procfs::clock_ticks_per_sec() as f64 * 1e6 / f64::from(jobs);
    let mut out = vec![Sample::new(
        "swarm",
        "masters' CPU per published job (no returns)",
        case,
        "µs",
        kind,
        per_job(spent.backend_ticks),
        Some(&spent),
    )];
    if let Some(t) = spent.proxy_ticks {
        out.push(Sample::new(
            "swarm",
            "proxy CPU per published job (no returns)",
            case,
            "µs",
            kind,
            per_job(t),
            Some(&spent),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MasterAddrs;
    use crate::targets::ProxySettings;

    /// The bench's generated saltgate YAML for one master, and its parse.
    fn base_yaml() -> String {
        let m = vec![MasterAddrs {
            echo: "127.19.0.2:4505".parse().unwrap(),
            stream: "127.19.0.2:4506".parse().unwrap(),
        }];
        saltgate_yaml(
            &ProxySettings::default(),
            "127.19.0.11:5000".parse().unwrap(),
            "127.19.0.11:5001".parse().unwrap(),
            &m,
        )
    }

    fn parse(y: &str) -> saltgate_config::Loaded {
        saltgate_config::parse(y, None, saltgate_config::Format::Yaml)
            .unwrap_or_else(|e| panic!("{e}\n{y}"))
    }

    #[test]
    fn reuse_port_is_set_on_both_listeners_and_the_config_still_parses() {
        let y = with_reuse_port(&base_yaml(), true);
        assert_eq!(y.matches("reuse_port: true").count(), 2, "{y}");
        let loaded = parse(&y);
        assert!(format!("{:?}", loaded.config).contains("reuse_port: true"));
    }

    #[test]
    fn fanout_mode_is_set_on_the_publish_listener_only_and_the_config_still_parses() {
        let base = base_yaml();
        let cpki = Path::new("/run/cluster/pki");
        assert_eq!(with_publish_mode(&base, PublishMode::L4, cpki), base);
        let y = with_publish_mode(&with_reuse_port(&base, true), PublishMode::Fanout, cpki);
        let loaded = parse(&y);
        assert!(
            format!("{:?}", loaded.config).contains("/run/cluster/pki"),
            "the dedup reads the cluster's key: {y}"
        );
        let modes: Vec<(String, saltgate_config::ListenerMode)> = loaded
            .config
            .listeners()
            .iter()
            .map(|l| (l.role.to_string(), l.mode))
            .collect();
        assert_eq!(
            modes,
            vec![
                ("publish".to_string(), saltgate_config::ListenerMode::Fanout),
                ("request".to_string(), saltgate_config::ListenerMode::L4)
            ],
            "{y}"
        );
        assert_eq!(PublishMode::Fanout.case(1000), "1k minions, fan-out");
    }
}
