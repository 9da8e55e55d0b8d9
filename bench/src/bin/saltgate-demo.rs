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
use saltgate_config::salt_master::{parse_salt_master, SaltMasterConfig};
use saltgate_config::salt_minion::MasterAddr;
use saltgate_master::server::{self, Bound};
use saltgate_minion::swarm::{run_swarm, SwarmOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
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
        let cfg = master_config(root, &name, *ip, &peers, &secret)?;
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
        &masters,
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

fn random_hex() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .context("reading /dev/urandom for the cluster secret")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn master_config(
    root: &Path,
    name: &str,
    ip: IpAddr,
    peers: &[String],
    secret: &str,
) -> Result<SaltMasterConfig> {
    let d = root.display();
    let text = format!(
        "id: {name}\ninterface: {ip}\npublish_port: 0\nret_port: 0\npki_dir: {d}/{name}/pki\n\
         cachedir: {d}/shared/cache\nsock_dir: {d}/{name}/sock\nauto_accept: True\n\
         cluster_id: demo\ncluster_peers: [{}]\ncluster_pki_dir: {d}/shared/cpki\n\
         cluster_pool_port: 0\ncluster_secret: {secret}\n",
        peers.join(", ")
    );
    parse_salt_master(&text, None)
        .map(|l| l.config)
        .map_err(|e| anyhow!("master configuration for {name}: {e}"))
}

/// A master running on its own thread and runtime, so killing it closes every socket it holds.
struct MasterHandle {
    name: String,
    bound: Bound,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MasterHandle {
    async fn start(name: &str, cfg: SaltMasterConfig) -> Result<Self> {
        let (ready_tx, ready_rx) = oneshot::channel::<Result<Bound, String>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut ready_tx = Some(ready_tx);
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Err(e.to_string()));
                        }
                        return;
                    }
                };
                let r = rt.block_on(server::run(
                    cfg,
                    async {
                        let _ = stop_rx.await;
                    },
                    |b| {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Ok(b.clone()));
                        }
                    },
                ));
                if let Err(e) = r {
                    match ready_tx.take() {
                        Some(tx) => {
                            let _ = tx.send(Err(e.to_string()));
                        }
                        None => eprintln!("saltgate-demo: master stopped with an error: {e}"),
                    }
                }
                // Drops every task (connections included): the ports close.
                rt.shutdown_background();
            })
            .context("spawning the master thread")?;
        let bound = tokio::time::timeout(Duration::from_secs(120), ready_rx)
            .await
            .map_err(|_| anyhow!("not ready within 120 s"))?
            .map_err(|_| anyhow!("the master thread ended before it was ready"))?
            .map_err(|e| anyhow!("{e}"))?;
        Ok(Self {
            name: name.to_string(),
            bound,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    async fn kill(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

impl Drop for MasterHandle {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

struct Gate {
    publish: SocketAddr,
    request: SocketAddr,
    admin: SocketAddr,
    _running: saltgate_proxy::Running,
}

/// The one place the proxy library is used: a configuration built as YAML text (so it goes
/// through the same validation as a file) and `saltgate_proxy::start`.
async fn start_saltgate(
    [publish, request, admin]: [SocketAddr; 3],
    masters: &[MasterHandle],
    stop: oneshot::Receiver<()>,
) -> Result<Gate> {
    let mut text = String::from(
        "global:\n  shutdown_grace: 1s\n\
         health:\n  interval: 1s\n  timeout: 2s\n  rise: 1\n  fall: 2\n  probe: salt\n\
         masters:\n",
    );
    for m in masters {
        text.push_str(&format!(
            "  - name: {}\n    host: {}\n    publish_port: {}\n    request_port: {}\n",
            m.name,
            m.bound.ret.ip(),
            m.bound.publish.port(),
            m.bound.ret.port()
        ));
    }
    text.push_str(&format!(
        "listeners:\n\
         \x20 publish:\n    bind: \"{}\"\n    timeout_client: 1d\n    timeout_server: 1d\n    \
         timeout_connect: 2s\n    on_master_down: close\n    close_rate: 1000\n\
         \x20 request:\n    bind: \"{}\"\n    timeout_client: 1m\n    timeout_server: 1m\n    \
         timeout_connect: 2s\n    on_master_down: close\n    close_rate: 1000\n\
         admin:\n  enabled: true\n  bind: \"{}\"\n",
        SocketAddr::new(publish.ip(), 1),
        SocketAddr::new(request.ip(), 2),
        SocketAddr::new(admin.ip(), 3)
    ));
    let mut config = saltgate_config::parse(&text, None, saltgate_config::Format::Yaml)
        .map_err(|e| anyhow!("saltgate configuration: {e}\n{text}"))?
        .config;
    // The file format wants real, distinct ports (placeholders above); the chosen ones, which
    // may be 0 (the OS picks), are set here, as the proxy's tests do.
    config.publish.bind = vec![publish];
    config.request.bind = vec![request];
    config.admin.bind = admin;
    let running = saltgate_proxy::start(config, saltgate_proxy::Options::default(), async move {
        let _ = stop.await;
    })
    .await
    .map_err(|e| anyhow!("starting saltgate: {e}"))?;
    let first = |r: saltgate_config::Role| {
        running
            .local_addrs(r)
            .first()
            .copied()
            .ok_or_else(|| anyhow!("saltgate bound no {r:?} listener"))
    };
    let publish = first(saltgate_config::Role::Publish)?;
    let request = first(saltgate_config::Role::Request)?;
    let admin = running
        .admin_addr()
        .ok_or_else(|| anyhow!("saltgate's admin API is not listening"))?;
    Ok(Gate {
        publish,
        request,
        admin,
        _running: running,
    })
}

/// GET over HTTP/1.0 (the admin API is local; no client library needed). Returns the body.
async fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| anyhow!("GET http://{addr}{path}: no answer within 10 s"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("GET http://{addr}{path}: malformed HTTP reply"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!(
            "GET http://{addr}{path}: {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_string())
}

async fn get_json(addr: SocketAddr, path: &str) -> Result<Value> {
    let body = http_get(addr, path).await?;
    serde_json::from_str(&body).with_context(|| format!("GET http://{addr}{path}: not JSON"))
}

/// Master name → state ("up", "down", ...) from `/api/v1/masters`.
async fn master_states(admin: SocketAddr) -> Result<BTreeMap<String, String>> {
    let v = get_json(admin, "/api/v1/masters").await?;
    Ok(v["masters"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or("?").to_string(),
                        m["state"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Master name → client addresses of its publish sessions, from `/api/v1/sessions`.
async fn publish_sessions(admin: SocketAddr) -> Result<BTreeMap<String, Vec<String>>> {
    let v = get_json(admin, "/api/v1/sessions?listener=publish").await?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in v["sessions"].as_array().into_iter().flatten() {
        out.entry(s["master"].as_str().unwrap_or("?").to_string())
            .or_default()
            .push(s["client"].as_str().unwrap_or("?").to_string());
    }
    Ok(out)
}

async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + limit;
    let mut last_err = None;
    loop {
        match cond().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            return Err(match last_err {
                Some(e) => anyhow!(
                    "timed out ({} s): {what}; last error: {e:#}",
                    limit.as_secs()
                ),
                None => anyhow!("timed out ({} s): {what}", limit.as_secs()),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One publish through a master's CLI socket, with the arrival time of every return.
#[derive(Debug, Default)]
struct Published {
    jid: String,
    answered: BTreeMap<String, Duration>,
}

async fn publish_once(socket: &Path, timeout_secs: u64) -> Result<Published> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let (r, mut w) = stream.into_split();
    let tgt = format!("{ID_PREFIX}*");
    let req = json!({"tgt": tgt, "fun": "test.ping", "timeout_secs": timeout_secs});
    let started = Instant::now();
    w.write_all(format!("{req}\n").as_bytes()).await?;
    let mut lines = BufReader::new(r).lines();
    let mut out = Published::default();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            let v: Value = serde_json::from_str(&line).context("bad line from the master")?;
            if let Some(e) = v.get("error").and_then(Value::as_str) {
                bail!("the master refused the publish: {e}");
            } else if let Some(j) = v.get("jid").and_then(Value::as_str) {
                out.jid = j.to_string();
            } else if let Some(m) = v.get("minion").and_then(Value::as_str) {
                // test.ping returns true; anything else is not an answer.
                let ret = v.get("return").map(|r| r.get("return").unwrap_or(r));
                if ret == Some(&Value::Bool(true)) {
                    out.answered
                        .entry(m.to_string())
                        .or_insert_with(|| started.elapsed());
                }
            } else if v.get("done").is_some() {
                return Ok(());
            }
        }
        bail!("the master closed the connection before the job finished")
    };
    tokio::time::timeout(Duration::from_secs(timeout_secs + 10), read)
        .await
        .map_err(|_| anyhow!("the job did not finish in time"))??;
    Ok(out)
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
        match publish_once(&m.bound.cli_socket, 5).await {
            Ok(p) => {
                let got = ids.iter().filter(|i| p.answered.contains_key(*i)).count();
                let mut lat: Vec<Duration> = p.answered.values().copied().collect();
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
                    .filter(|i| !p.answered.contains_key(*i))
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
