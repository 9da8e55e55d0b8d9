//! `saltgate-demo`: three saltgate-master cluster members, saltgate in front of them and a swarm
//! of minions, all in this one process on loopback. It publishes `test.ping` through every
//! master, shows where the minions sit and the job latencies, kills one master and shows every
//! minion answering through the others. See docs/demo.md.
//!
//! The masters auto-accept every minion key: this is a demo, not a deployment.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use saltgate_bench::lab::{
    get_json, http_get, master_config, master_states, publish, publish_sessions, random_hex,
    start_saltgate, wait_until, Backend, MasterHandle, MasterPorts,
};
use saltgate_config::salt_minion::MasterAddr;
use saltgate_minion::swarm::{run_swarm, SwarmOptions};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

/// Prefix of the swarm's minion ids (`demo-0`, `demo-1`, ...).
const ID_PREFIX: &str = "demo-";

#[derive(Parser, Debug)]
#[command(
    name = "saltgate-demo",
    about = "Three saltgate-masters, saltgate and a minion swarm in one process on loopback: \
             publishes test.ping through each master, kills one and shows the minions answering \
             through the others"
)]
struct Args {
    /// Number of simulated minions.
    #[arg(long, default_value_t = 50)]
    minions: usize,
    /// Exit after the fail-over round (status 0 only if every job was answered by every minion).
    #[arg(long)]
    once: bool,
    /// Address saltgate's publish, request and admin listeners bind to.
    #[arg(long, default_value = "127.0.6.1")]
    proxy_ip: IpAddr,
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
    /// How long each phase (start-up, fail-over) may take before the demo gives up.
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
    let mut tally = Tally {
        minions: args.minions,
        ..Tally::default()
    };
    let result = rt.block_on(async {
        tokio::select! {
            r = demo(&args, tmp.path(), &mut tally) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    // Everything the demo started is stopped (handles dropped) before the directory goes.
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(tmp);
    // Ctrl-C after the fail-over round is the normal way to stop the interactive demo.
    let result = match result {
        Err(_) if tally.done => Ok(()),
        r => r,
    };
    let ok = result.is_ok() && tally.done && tally.missed == 0;
    let line = format!(
        "{} minions, {} jobs, {} missed",
        tally.minions, tally.jobs, tally.missed
    );
    match result {
        Ok(()) if ok => println!("demo: OK {line}"),
        Ok(()) => println!("demo: FAILED {line}"),
        Err(e) => println!("demo: FAILED {line}: {e:#}"),
    }
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

#[derive(Debug, Default)]
struct Tally {
    minions: usize,
    jobs: usize,
    missed: usize,
    /// The fail-over round has run.
    done: bool,
}

async fn demo(args: &Args, root: &Path, tally: &mut Tally) -> Result<()> {
    if args.master_ips.len() < 2 {
        bail!("--master-ips: give at least two addresses (one master is killed)");
    }
    if args.minions == 0 {
        bail!("--minions: give at least 1");
    }
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

    // 2. saltgate in front of them.
    let (gate_stop, gate_stop_rx) = oneshot::channel::<()>();
    let _gate_stop = gate_stop;
    let gate = start_saltgate(
        [
            SocketAddr::new(args.proxy_ip, args.publish_port),
            SocketAddr::new(args.proxy_ip, args.request_port),
            SocketAddr::new(args.proxy_ip, args.admin_port),
        ],
        &masters.iter().map(Backend::from).collect::<Vec<_>>(),
        gate_stop_rx,
    )
    .await?;
    let admin = gate.admin;
    println!(
        "  saltgate: publish {} request {} admin http://{admin}/",
        gate.publish, gate.request
    );
    println!("    metrics   http://{admin}/metrics");
    println!("    masters   http://{admin}/api/v1/masters");
    println!("    sessions  http://{admin}/api/v1/sessions");
    let t0 = Instant::now();
    wait_until(
        phase,
        "saltgate's health checks pass on every master",
        move || async move {
            let v = get_json(admin, "/api/v1/masters").await?;
            let list = v["masters"].as_array().cloned().unwrap_or_default();
            Ok(!list.is_empty()
                && list.iter().all(|m| {
                    m["state"] == "up"
                        && m["publish"]["last_check"]["ok"] == true
                        && m["request"]["last_check"]["ok"] == true
                }))
        },
    )
    .await?;
    println!(
        "  saltgate's health checks pass on every master ({} ms)",
        t0.elapsed().as_millis()
    );

    // 3. The swarm, pointed at saltgate.
    let (swarm_stop, swarm_stop_rx) = watch::channel(false);
    let swarm_opts = SwarmOptions {
        count: args.minions,
        master: MasterAddr {
            host: gate.request.ip().to_string(),
            port: gate.request.port(),
        },
        id_prefix: ID_PREFIX.to_string(),
        id_start: 0,
        pki_dir: root.join("minions"),
        shared_key: true,
        report_every: Duration::from_secs(24 * 3600),
        json: false,
        duration: None,
        start_rate: 500,
        acceptance_wait_time: Duration::from_secs(1),
        publish_port: Some(gate.publish.port()),
        pillar: false,
        transport: Default::default(),
    };
    let swarm = tokio::spawn(run_swarm(swarm_opts, swarm_stop_rx));
    let _swarm_guard = StopOnDrop(swarm_stop);
    let n = args.minions;
    let t0 = Instant::now();
    wait_until(
        phase,
        "every minion holds a publish session",
        move || async move {
            Ok(publish_sessions(admin)
                .await?
                .values()
                .map(Vec::len)
                .sum::<usize>()
                >= n)
        },
    )
    .await?;
    println!(
        "  {n} minions connected through saltgate ({} ms)",
        t0.elapsed().as_millis()
    );
    let ids: BTreeSet<String> = (0..n).map(|i| format!("{ID_PREFIX}{i}")).collect();

    // 4. test.ping through each master.
    println!("\n== test.ping through each master");
    let deadline = Instant::now() + phase;
    for m in &masters {
        run_job(m, &ids, deadline, tally).await;
    }
    print_placement(admin).await;
    print_metrics(admin).await;

    // 5. Kill one master; every minion must answer through the others.
    let victim = masters.remove(0);
    let victim_name = victim.name.clone();
    println!("\n== killing {victim_name} (its ports close)");
    let t_kill = Instant::now();
    victim.kill().await;
    let deadline = Instant::now() + phase;
    let vn = victim_name.clone();
    wait_until(phase, "saltgate marks the killed master down", move || {
        let vn = vn.clone();
        async move {
            Ok(master_states(admin)
                .await?
                .get(&vn)
                .is_some_and(|s| s != "up"))
        }
    })
    .await?;
    println!(
        "  saltgate marked {victim_name} down after {} ms",
        t_kill.elapsed().as_millis()
    );
    let vn = victim_name.clone();
    let _ = wait_until(
        phase,
        "every minion reconnected to a surviving master",
        move || {
            let vn = vn.clone();
            async move {
                let s = publish_sessions(admin).await?;
                let on_victim = s.get(&vn).map_or(0, Vec::len);
                let total: usize = s.values().map(Vec::len).sum();
                Ok(on_victim == 0 && total >= n)
            }
        },
    )
    .await
    .map(|()| {
        println!(
            "  every minion's publish session is on a surviving master after {} ms",
            t_kill.elapsed().as_millis()
        )
    })
    .map_err(|e| println!("  {e:#} (publishing anyway)"));
    println!("\n== test.ping through the surviving masters");
    for m in &masters {
        run_job(m, &ids, deadline, tally).await;
    }
    print_placement(admin).await;
    println!(
        "\nfail-over: {} minions answered through the surviving masters {} ms after the kill",
        n,
        t_kill.elapsed().as_millis()
    );

    tally.done = true;
    if !args.once {
        println!(
            "\nrunning until Ctrl-C; try: curl http://{admin}/api/v1/masters or open http://{admin}/"
        );
        // main's select! ends the demo on Ctrl-C.
        std::future::pending::<()>().await;
    }
    // Orderly stop: swarm first, then saltgate and the masters (handles dropped).
    let _ = _swarm_guard.0.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), swarm).await;
    Ok(())
}

/// Sends `true` on drop (stops the swarm when the demo ends early).
struct StopOnDrop(watch::Sender<bool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
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

/// Publishes `test.ping` through `m` until one publish is answered by every minion (each retry
/// is a new job) or `deadline` passes. Counts one job in `tally`, missed if not answered.
async fn run_job(m: &MasterHandle, ids: &BTreeSet<String>, deadline: Instant, tally: &mut Tally) {
    tally.jobs += 1;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let tgt = format!("{ID_PREFIX}*");
        match publish(&m.bound.cli_socket, &tgt, "test.ping", &[], 5).await {
            Ok(p) => {
                // test.ping returns true; anything else is not an answer.
                let answered: BTreeMap<&String, Duration> = p
                    .returns
                    .iter()
                    .filter(|(_, (_, v))| *v == Value::Bool(true))
                    .map(|(id, (t, _))| (id, *t))
                    .collect();
                let got = ids.iter().filter(|i| answered.contains_key(*i)).count();
                let mut lat: Vec<Duration> = answered.values().copied().collect();
                lat.sort();
                println!(
                    "  via {}: jid {} answered {got}/{}  p50 {}  p99 {}  max {}{}",
                    m.name,
                    p.jid,
                    ids.len(),
                    ms(pct(&lat, 0.5)),
                    ms(pct(&lat, 0.99)),
                    ms(lat.last().copied().unwrap_or_default()),
                    if attempt > 1 {
                        format!("  (attempt {attempt})")
                    } else {
                        String::new()
                    }
                );
                if got == ids.len() {
                    return;
                }
                let missing: Vec<&String> = ids
                    .iter()
                    .filter(|i| !answered.contains_key(*i))
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
            tally.missed += 1;
            return;
        }
    }
}

/// Which master each minion connection sits on. saltgate works at L4: it sees connections (the
/// minion's address and port), not minion ids.
async fn print_placement(admin: SocketAddr) {
    match (publish_sessions(admin).await, master_states(admin).await) {
        (Ok(s), Ok(states)) => {
            println!("  minion publish sessions per master (from /api/v1/sessions):");
            for (name, state) in &states {
                let clients = s.get(name).cloned().unwrap_or_default();
                let mut ports: Vec<String> = clients
                    .iter()
                    .map(|c| c.rsplit(':').next().unwrap_or(c).to_string())
                    .collect();
                ports.sort();
                let shown: Vec<String> = ports.iter().take(12).cloned().collect();
                println!(
                    "    {name:<8} {state:<8} {:>4} minions  client ports {}{}",
                    clients.len(),
                    shown.join(" "),
                    if ports.len() > shown.len() {
                        " ..."
                    } else {
                        ""
                    }
                );
            }
        }
        (Err(e), _) | (_, Err(e)) => println!("  sessions unavailable: {e:#}"),
    }
}

async fn print_metrics(admin: SocketAddr) {
    match http_get(admin, "/metrics").await {
        Ok(text) => {
            println!("  metrics (http://{admin}/metrics, excerpt):");
            for l in text.lines().filter(|l| {
                l.starts_with("saltgate_master_sessions_current")
                    || (l.starts_with("saltgate_master_state{") && l.ends_with(" 1"))
                    || l.starts_with("saltgate_listener_sessions_total")
            }) {
                println!("    {l}");
            }
        }
        Err(e) => println!("  metrics unavailable: {e:#}"),
    }
}
