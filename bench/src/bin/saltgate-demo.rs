//! `saltgate-demo`: three saltgate-master cluster members and, in front of them, two saltgates
//! side by side, one in L4 mode and one in cluster fan-out mode, each with its own swarm of
//! minions, all in this one process on loopback. It publishes `test.ping` through every master,
//! then a stream of jobs through the survivors while one master is killed, and shows the
//! difference: the L4 minions on the killed master reconnect and miss the jobs published while
//! they were away; the fan-out minions neither reconnect nor miss a job. See docs/demo.md.
//!
//! The masters auto-accept every minion key: this is a demo, not a deployment.

mod demo;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use saltgate_bench::lab::{
    http_get, master_config, master_states, publish, random_hex, Backend, MasterHandle, MasterPorts,
};
use serde_json::Value;

use demo::report::{table, timeline, Summary};
use demo::side::{Mode, Side};
use demo::stream::{outcome, start_job, stream_done, STREAM_EVERY};

/// Every job targets both sides' minions (`demo-l4-*` and `demo-fo-*`).
const TARGET: &str = "demo-*";
/// Stream jobs published before the kill, and after every L4 minion is back.
const BEFORE_KILL: Duration = Duration::from_secs(3);
const AFTER_RECOVERY: Duration = Duration::from_secs(3);
/// How long a job collects returns. Salt's default is 5 s; a loaded machine running a debug
/// build can take longer to get 2N returns through the cluster, and a miss here would be the
/// demo's, not the mode's. Every job of the gap waits this long for the absent L4 minions.
const JOB_TIMEOUT_S: u64 = 8;

#[derive(Parser, Debug)]
#[command(
    name = "saltgate-demo",
    about = "Three saltgate-masters, two saltgates (L4 and fan-out) and a minion swarm behind \
             each, in one process on loopback: kills one master while jobs stream and shows, side \
             by side, which minions reconnected and which jobs they missed"
)]
struct Args {
    /// Number of simulated minions on each side (L4 and fan-out).
    #[arg(long, default_value_t = 50)]
    minions: usize,
    /// Exit after the kill round (status 0 only if fan-out missed no job and no minion
    /// reconnected there, and L4 answered every job after it recovered).
    #[arg(long)]
    once: bool,
    /// Address the L4 saltgate's publish, request and admin listeners bind to.
    #[arg(long, default_value = "127.0.6.1")]
    proxy_ip: IpAddr,
    /// Address of the fan-out saltgate (same ports as the L4 one); default: the address after
    /// --proxy-ip.
    #[arg(long)]
    fanout_ip: Option<IpAddr>,
    /// Addresses of the masters, comma-separated (at least two; one is killed).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "127.0.6.11,127.0.6.12,127.0.6.13"
    )]
    master_ips: Vec<IpAddr>,
    /// saltgate's publish port (Salt's 4505; 0 = chosen by the OS).
    #[arg(long, default_value_t = 4505)]
    publish_port: u16,
    /// saltgate's request port, the one minions are given as `master_port` (Salt's 4506; 0 = chosen by the OS).
    #[arg(long, default_value_t = 4506)]
    request_port: u16,
    /// saltgate's admin API and /metrics port (0 = chosen by the OS).
    #[arg(long, default_value_t = 9505)]
    admin_port: u16,
    /// How long each phase (start-up, the kill round) may take before the demo gives up.
    #[arg(long, default_value_t = 60)]
    deadline_secs: u64,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("demo: FAILED cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let tmp = match tempfile::Builder::new().prefix("saltgate-demo").tempdir() {
        Ok(t) => t,
        Err(e) => {
            println!("demo: FAILED cannot create a temporary directory: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut sum = Summary {
        minions: args.minions,
        ..Summary::default()
    };
    let started = Instant::now();
    let result = rt.block_on(async {
        tokio::select! {
            r = demo(&args, tmp.path(), &mut sum) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    // Everything the demo started is stopped (handles dropped) before the directory goes.
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(tmp);
    // Ctrl-C after the kill round is the normal way to stop the interactive demo.
    let result = match result {
        Err(_) if sum.streamed => Ok(()),
        r => r,
    };
    println!("  (the run took {:.1} s)", started.elapsed().as_secs_f64());
    let failures = sum.failures();
    let line = sum.line();
    let ok = match result {
        Ok(()) if failures.is_empty() => {
            println!("demo: OK {line}");
            true
        }
        Ok(()) => {
            println!("demo: FAILED {line}: {}", failures.join("; "));
            false
        }
        Err(e) => {
            println!("demo: FAILED {line}: {e:#}");
            false
        }
    };
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// The fan-out saltgate's address: `--fanout-ip`, or the IPv4 address after `--proxy-ip`.
fn fanout_ip(args: &Args) -> Result<IpAddr> {
    let ip = match (args.fanout_ip, args.proxy_ip) {
        (Some(ip), _) => ip,
        (None, IpAddr::V4(v4)) => match u32::from(v4).checked_add(1) {
            Some(n) => IpAddr::V4(Ipv4Addr::from(n)),
            None => bail!(
                "--proxy-ip {v4}: no address after it for the fan-out saltgate; give --fanout-ip"
            ),
        },
        (None, IpAddr::V6(v6)) => {
            bail!("--proxy-ip {v6}: give --fanout-ip for the fan-out saltgate (derived only from an IPv4 address)")
        }
    };
    if ip == args.proxy_ip {
        bail!(
            "--fanout-ip {ip}: the same as --proxy-ip; the two saltgates need their own addresses"
        );
    }
    if args.master_ips.contains(&ip) {
        bail!("--fanout-ip: {ip} is also in --master-ips; give --fanout-ip an address of its own");
    }
    Ok(ip)
}

async fn demo(args: &Args, root: &Path, sum: &mut Summary) -> Result<()> {
    if args.master_ips.len() < 2 {
        bail!("--master-ips: give at least two addresses (one master is killed)");
    }
    if args.minions == 0 {
        bail!("--minions: give at least 1");
    }
    let fo_ip = fanout_ip(args)?;
    let phase = Duration::from_secs(args.deadline_secs.max(5));
    println!(
        "saltgate-demo: everything runs in this process; files in {}",
        root.display()
    );
    println!("(the masters auto-accept every minion key: fine for a demo, never for production)");

    // 1. The masters: one cluster sharing cluster_pki_dir and cachedir; each joins the ones
    //    started before it (the first lists an unreachable placeholder peer and learns the
    //    others from their joins).
    let secret = random_hex()?;
    let mut masters: Vec<MasterHandle> = Vec::new();
    for (i, ip) in args.master_ips.iter().enumerate() {
        let name = format!("master{}", i + 1);
        let peers: Vec<String> = if masters.is_empty() {
            vec![SocketAddr::new(args.master_ips[1], 1).to_string()]
        } else {
            masters
                .iter()
                .filter_map(|m| m.bound.cluster.map(|a| a.to_string()))
                .collect()
        };
        let cfg = master_config(root, &name, *ip, MasterPorts::default(), &peers, &secret)?;
        let m = MasterHandle::start(&name, cfg)
            .await
            .with_context(|| format!("starting {name} on {ip}"))?;
        println!(
            "  {name}: request {} publish {} cluster {}",
            m.bound.ret,
            m.bound.publish,
            m.bound
                .cluster
                .map_or_else(|| "-".to_string(), |a| a.to_string())
        );
        masters.push(m);
    }

    // 2. Two saltgates in front of them: L4 and fan-out (the first copy of each job forwarded,
    //    with the cluster's key from the shared cluster_pki_dir; lab::master_config's layout).
    let backends: Vec<Backend> = masters.iter().map(Backend::from).collect();
    let addrs = |ip| {
        [
            SocketAddr::new(ip, args.publish_port),
            SocketAddr::new(ip, args.request_port),
            SocketAddr::new(ip, args.admin_port),
        ]
    };
    let cpki = root.join("shared/cpki");
    let mut sides = [
        Side::start(Mode::L4, addrs(args.proxy_ip), &backends, &cpki).await?,
        Side::start(Mode::Fanout, addrs(fo_ip), &backends, &cpki).await?,
    ];
    for s in &sides {
        let g = &s.gate;
        println!(
            "  saltgate {:<7}: publish {} request {} admin http://{}/ (/metrics, /api/v1/masters, /api/v1/{})",
            s.label(),
            g.publish,
            g.request,
            g.admin,
            if s.mode == Mode::L4 { "sessions" } else { "fanout" }
        );
    }
    let t0 = Instant::now();
    for s in &sides {
        s.wait_healthy(phase).await?;
    }
    println!(
        "  both saltgates' health checks pass on every master ({} ms)",
        t0.elapsed().as_millis()
    );

    // 3. A swarm behind each, with one key made once (RSA generation is slow in a debug build).
    let key_dir = root.join("minions-l4");
    let kd = key_dir.clone();
    tokio::task::spawn_blocking(move || {
        saltgate_minion::keys::MinionKey::load_or_create(&kd, "shared")
    })
    .await
    .context("generating the minions' key")??;
    let fo_keys = root.join("minions-fo");
    std::fs::create_dir_all(&fo_keys).with_context(|| format!("creating {}", fo_keys.display()))?;
    std::fs::copy(key_dir.join("shared.pem"), fo_keys.join("shared.pem"))
        .context("copying the minions' key")?;
    sides[0].start_swarm(args.minions, key_dir);
    sides[1].start_swarm(args.minions, fo_keys);
    let t0 = Instant::now();
    for s in &sides {
        s.wait_connected(phase).await?;
    }
    println!(
        "  {} + {} minions connected through the L4 and the fan-out saltgate ({} ms)",
        args.minions,
        args.minions,
        t0.elapsed().as_millis()
    );

    // 4. test.ping through each master: every minion of both sides answers.
    println!("\n== test.ping through each master");
    let deadline = Instant::now() + phase;
    for m in &masters {
        warm_job(m, &sides, deadline, sum).await;
    }
    for s in &sides {
        s.print_placement().await;
    }
    print_metrics(&sides).await;

    // 5. The stream and the kill.
    let victim = masters.remove(0);
    let victim_name = victim.name.clone();
    let survivors: Vec<(String, std::path::PathBuf)> = masters
        .iter()
        .map(|m| (m.name.clone(), m.bound.cli_socket.clone()))
        .collect();
    println!(
        "\n== killing {victim_name} while test.ping is published every {} ms through {}",
        STREAM_EVERY.as_millis(),
        survivors
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let accepted_before = [
        sides[0].publish_sessions_accepted().await?,
        sides[1].publish_sessions_accepted().await?,
    ];
    let start = Instant::now();
    let mut tick = tokio::time::interval(STREAM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    let mut victim = Some(victim);
    let kill_timer = tokio::time::sleep_until((start + BEFORE_KILL + STREAM_EVERY / 2).into());
    tokio::pin!(kill_timer);
    let mut kill: Option<Instant> = None;
    let mut down: [Option<Duration>; 2] = [None, None];
    let mut l4_back: Option<Instant> = None;
    let mut pending = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                if kill.is_some_and(|k| stream_done(now, l4_back, AFTER_RECOVERY, k + phase)) {
                    break;
                }
                let (name, socket) = &survivors[pending.len() % survivors.len()];
                pending.push(start_job(socket.clone(), name, TARGET, JOB_TIMEOUT_S, now - start));
            }
            // Between two jobs, so that no job is published at the kill's instant.
            _ = &mut kill_timer, if victim.is_some() => {
                if let Some(v) = victim.take() {
                    kill = Some(Instant::now());
                    v.kill().await;
                    println!("  {victim_name} killed (its ports close)");
                }
            }
            _ = poll.tick(), if kill.is_some() && (down.iter().any(Option::is_none) || l4_back.is_none()) => {
                let Some(k) = kill else { continue };
                for (s, d) in sides.iter().zip(down.iter_mut()) {
                    if d.is_none() && is_down(s, &victim_name).await {
                        *d = Some(k.elapsed());
                        println!("  {} saltgate marked {victim_name} down after {} ms{}", s.label(), k.elapsed().as_millis(),
                            if s.mode == Mode::Fanout { " (one upstream gone; no minion session closed)" } else { "" });
                    }
                }
                if l4_back.is_none() && sides[0].sessions_off(&victim_name).await.unwrap_or(false) {
                    l4_back = Some(Instant::now());
                    println!("  every L4 minion's publish session is on a surviving master again after {} ms", k.elapsed().as_millis());
                }
            }
        }
    }
    let Some(kill) = kill else {
        bail!("the stream ended before the kill");
    };
    let kill_at = kill - start;
    println!(
        "  {} jobs published; waiting for their returns (up to {JOB_TIMEOUT_S} s each)",
        pending.len()
    );
    let mut jobs = Vec::with_capacity(pending.len());
    for p in pending {
        jobs.push(p.finish().await);
    }
    sum.l4_reconnects = sides[0]
        .publish_sessions_accepted()
        .await?
        .saturating_sub(accepted_before[0]);
    sum.fanout_reconnects = sides[1]
        .publish_sessions_accepted()
        .await?
        .saturating_sub(accepted_before[1]);
    sum.l4 = outcome(&jobs, &sides[0].ids, kill_at);
    sum.fanout = outcome(&jobs, &sides[1].ids, kill_at);
    sum.streamed = true;

    println!("\n== the stream, answered per side (t-kill: when the job was published)");
    for l in timeline(&jobs, kill_at, &sides[0].ids, &sides[1].ids) {
        println!("{l}");
    }
    for s in &sides {
        s.print_placement().await;
    }
    println!(
        "\n== {victim_name} killed: L4 against fan-out ({} minions each)",
        args.minions
    );
    for l in table(sum) {
        println!("{l}");
    }
    println!(
        "  (a reconnect is a publish session the saltgate accepted during the stream; a job counts as \
         answered by a minion when its True came back within {JOB_TIMEOUT_S} s; \"again after\" is from \
         the kill to the last answer to the first job after it that every minion answered)"
    );

    if !args.once {
        println!(
            "\nrunning until Ctrl-C; try: curl http://{}/api/v1/masters, http://{}/api/v1/fanout, or open http://{}/",
            sides[0].admin(),
            sides[1].admin(),
            sides[1].admin()
        );
        // main's select! ends the demo on Ctrl-C.
        std::future::pending::<()>().await;
    }
    // Orderly stop: swarms first, then the saltgates and the masters (handles dropped).
    for s in &mut sides {
        s.stop_swarm().await;
    }
    Ok(())
}

async fn is_down(side: &Side, master: &str) -> bool {
    master_states(side.admin())
        .await
        .is_ok_and(|s| s.get(master).is_some_and(|st| st != "up"))
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Publishes `test.ping` through `m` until one publish is answered by every minion of both
/// sides (each retry is a new job) or `deadline` passes. Counts one warm-up job in `sum`, missed
/// if not answered.
async fn warm_job(m: &MasterHandle, sides: &[Side; 2], deadline: Instant, sum: &mut Summary) {
    sum.warm_jobs += 1;
    let ids: BTreeSet<&String> = sides.iter().flat_map(|s| s.ids.iter()).collect();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match publish(&m.bound.cli_socket, TARGET, "test.ping", &[], 5).await {
            Ok(p) => {
                let answered: Vec<(&String, Duration)> = p
                    .returns
                    .iter()
                    .filter(|(id, (_, v))| *v == Value::Bool(true) && ids.contains(id))
                    .map(|(id, (t, _))| (id, *t))
                    .collect();
                let per_side: Vec<String> = sides
                    .iter()
                    .map(|s| {
                        let got = answered
                            .iter()
                            .filter(|(id, _)| s.ids.contains(*id))
                            .count();
                        format!("{} {got}/{}", s.label(), s.ids.len())
                    })
                    .collect();
                let mut lat: Vec<Duration> = answered.iter().map(|(_, t)| *t).collect();
                lat.sort();
                println!(
                    "  via {}: jid {} answered {}  p50 {}  p99 {}  max {}{}",
                    m.name,
                    p.jid,
                    per_side.join("  "),
                    ms(pct(&lat, 0.5)),
                    ms(pct(&lat, 0.99)),
                    ms(lat.last().copied().unwrap_or_default()),
                    if attempt > 1 {
                        format!("  (attempt {attempt})")
                    } else {
                        String::new()
                    }
                );
                if answered.len() == ids.len() {
                    return;
                }
                let missing: Vec<&&String> = ids
                    .iter()
                    .filter(|i| !answered.iter().any(|(a, _)| a == *i))
                    .take(5)
                    .collect();
                println!("    missing (first 5): {missing:?}; publishing again");
            }
            Err(e) => {
                println!("  via {}: {e:#}; retrying", m.name);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if Instant::now() > deadline {
            println!("  via {}: not answered by every minion in time", m.name);
            sum.warm_missed += 1;
            return;
        }
    }
}

/// A few lines of each saltgate's `/metrics`.
async fn print_metrics(sides: &[Side; 2]) {
    for s in sides {
        let admin = s.admin();
        match http_get(admin, "/metrics").await {
            Ok(text) => {
                println!("  {} metrics (http://{admin}/metrics, excerpt):", s.label());
                for l in text.lines().filter(|l| match s.mode {
                    Mode::L4 => {
                        l.starts_with("saltgate_master_sessions_current{") && l.contains("publish")
                    }
                    Mode::Fanout => {
                        l.starts_with("saltgate_fanout_sessions_current")
                            || l.starts_with("saltgate_fanout_upstreams_connected")
                            || l.starts_with("saltgate_fanout_duplicates_total{")
                    }
                }) {
                    println!("    {l}");
                }
            }
            Err(e) => println!("  {} metrics unavailable: {e:#}", s.label()),
        }
    }
}
