//! Request continuity on Salt's plain `ws` transport with real Salt 3008.5 (issue 27): two
//! `salt-master`s (A, B) in one Salt cluster (`cluster_id`, shared `cluster_pki_dir` and
//! `cachedir`, started as interop/harness/cluster.py starts them) on `transport: ws`, and a stock
//! `salt-minion` on `transport: ws` that knows only saltgate's address. saltgate serves its
//! request port over A then B with `on_master_down: migrate` and the default Salt-aware probe; a
//! second saltgate on the same address serves the publish port from B only (as in the `tcp`
//! test: the publish connection must not be on the master that goes).
//!
//! A job's return is put in flight to A: the job (a `cmd.run` that waits for a file the test
//! creates) starts, A is SIGSTOPped, the job is let go, and the minion opens a websocket for its
//! return (Salt 3008.5's `RequestClient` dials one per request), which saltgate connects to A,
//! still UP: the kernel takes the connection, the stopped A answers nothing. saltgate marks A
//! DOWN and moves the session: it sends the minion's upgrade to B and, as the minion has no `101`
//! yet, passes B's; whatever of the return had passed is re-sent. B stores the return (`Got
//! return from ... for job ...` in its log). The minion must not have failed a send (its trace
//! log: `AsyncReqChannel.send` logs "Failed to send msg" before each retry): without `migrate`,
//! saltgate closes the session at DOWN and the minion sends the return again on a new websocket.
//!
//! Needs the Salt venv (`SALTGATE_VENV` or test-support's setup). Addresses: 127.41.0.0/24. Run
//! under `flock /tmp/heavy.lock`.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::api::{run_with, scrape, value};
use common::salt_real::{minion_answers, spawn, tail, Keep};
use common::*;
use saltgate_config::transport::SaltTransport;
use saltgate_config::{Balance, HealthSettings, MasterConfig, OnMasterDown, Probe, Role};
use saltgate_proxy::Options;
use saltgate_test_support::{venv, write_minion_config, ProcGuard};

const GATE: &str = "127.41.0.1";
const MASTERS: [&str; 2] = ["127.41.0.11", "127.41.0.12"];
const MINION: &str = "ws-migrate-minion";
/// The minion waits this long for a return's answer before it sends the return again.
const RETURN_RETRY_TIMER: u64 = 30;

fn mdir(d: &Path, ip: &str) -> PathBuf {
    d.join(format!("m-{ip}"))
}

fn master_log(d: &Path, ip: &str) -> PathBuf {
    mdir(d, ip).join("master.log")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn port_open(ip: &str, port: u16) -> bool {
    let a: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok()
}

/// Polls `cond` every 100 ms until it holds, or panics naming `what` (and the logs) after
/// `timeout`.
async fn poll(what: &str, timeout: Duration, d: &Path, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for: {what}\n--- minion\n{}\n--- {}\n{}\n--- {}\n{}",
                tail(&d.join(MINION).join("minion.log")),
                MASTERS[0],
                tail(&master_log(d, MASTERS[0])),
                MASTERS[1],
                tail(&master_log(d, MASTERS[1])),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The shared `cluster_pki_dir` and `cachedir`, the cluster secret, and the cluster key made
/// before any master starts (3008.5 masters started together race on creating it).
fn prepare_shared(shared: &Path) {
    for sub in [
        "pki/minions",
        "pki/minions_pre",
        "pki/minions_rejected",
        "pki/minions_denied",
        "pki/minions_autosign",
        "pki/peers",
        "cache/jobs",
        "cache/proc",
        "cache/pillar",
        "cache/sessions",
        "cache/health",
        "cache/roots",
        "cache/syndics",
        "cache/grains",
        "cache/tokens",
        "cache/cluster",
        "srv/salt",
        "srv/pillar",
    ] {
        std::fs::create_dir_all(shared.join(sub)).unwrap();
    }
    let secret: String = (0..4)
        .map(|_| format!("{:016x}", rand::random::<u64>()))
        .collect();
    std::fs::write(shared.join("cluster_secret"), secret).unwrap();
    let code = "import os,sys,salt.crypt\n\
                d=sys.argv[1]; priv,pub=salt.crypt.gen_keys(2048)\n\
                for n,data,mode in (('cluster.pem',priv,0o400),('cluster.pub',pub,0o644)):\n\
                \x20   fd=os.open(os.path.join(d,n),os.O_WRONLY|os.O_CREAT|os.O_EXCL,mode)\n\
                \x20   f=os.fdopen(fd,'w'); f.write(data); f.close()\n";
    let out = Command::new(venv().join("bin/python"))
        .args(["-c", code])
        .arg(shared.join("pki"))
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "cluster key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write_master_conf(d: &Path, ip: &str, shared: &Path) -> PathBuf {
    let m = mdir(d, ip);
    for sub in ["conf", "pki", "sock", "queues"] {
        std::fs::create_dir_all(m.join(sub)).unwrap();
    }
    let (ms, ss) = (m.display(), shared.display());
    let peer = MASTERS.iter().find(|p| **p != ip).unwrap();
    let secret = read(&shared.join("cluster_secret"));
    std::fs::write(
        m.join("conf/master"),
        format!(
            "id: {ip}\ninterface: {ip}\npublish_port: 4505\nret_port: 4506\nuser: root\n\
             transport: ws\nauto_accept: True\n\
             cluster_id: ws_migrate\ncluster_peers:\n  - {peer}\ncluster_pki_dir: {ss}/pki\n\
             cluster_pool_port: 4520\ncluster_secret: \"{secret}\"\ncachedir: {ss}/cache\n\
             pki_dir: {ms}/pki\nsock_dir: {ms}/sock\nsqlite_queue_dir: {ms}/queues\n\
             pidfile: {ms}/master.pid\nlog_file: {ms}/master.log\nkey_logfile: {ms}/key.log\n\
             log_level_logfile: info\nworker_threads: 2\n\
             file_roots: {{base: [{ss}/srv/salt]}}\npillar_roots: {{base: [{ss}/srv/pillar]}}\n"
        ),
    )
    .unwrap();
    m.join("conf")
}

/// Starts the two masters, the founder first, until both are cluster-ready (`opening request
/// gate`). A start in which a master generated a cluster key of its own (3008.5's join race,
/// see interop/harness/cluster.py) is wiped and retried, three times at most.
async fn start_cluster(d: &Path) -> Vec<ProcGuard> {
    for attempt in 1..=3 {
        let shared = d.join("shared");
        let _ = std::fs::remove_dir_all(&shared);
        for ip in MASTERS {
            let _ = std::fs::remove_dir_all(mdir(d, ip));
        }
        prepare_shared(&shared);
        let mut guards = Vec::new();
        for (n, ip) in MASTERS.iter().enumerate() {
            if n == 1 {
                let founder = MASTERS[0];
                poll("the founder's ports", Duration::from_secs(90), d, || {
                    port_open(founder, 4506) && port_open(founder, 4520)
                })
                .await;
            }
            let conf = write_master_conf(d, ip, &shared);
            let mut cmd = Command::new(venv().join("bin/salt-master"));
            cmd.arg("-c").arg(&conf).args(["-l", "warning"]);
            guards.push(spawn(
                "salt-master",
                cmd,
                &mdir(d, ip).join("master.stderr"),
            ));
        }
        poll(
            "both masters cluster-ready",
            Duration::from_secs(90),
            d,
            || {
                MASTERS
                    .iter()
                    .all(|ip| read(&master_log(d, ip)).contains("opening request gate"))
            },
        )
        .await;
        let raced = MASTERS.iter().any(|ip| {
            read(&master_log(d, ip))
                .lines()
                .any(|l| l.contains("Generating key-pair") && l.contains("cluster.pem"))
        });
        if !raced {
            return guards;
        }
        eprintln!("attempt {attempt}: a master generated its own cluster key (3008.5 join race); starting again");
    }
    panic!("the masters generated diverging cluster keys in 3 fresh starts");
}

fn salt(d: &Path, ip: &str, args: &[&str]) -> String {
    let out = Command::new(venv().join("bin/salt"))
        .arg("-c")
        .arg(mdir(d, ip).join("conf"))
        .args(args)
        .output()
        .expect("salt runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Publishes (from `via`) a job that waits for `go` and returns; returns its jid once the minion
/// runs it (it touches `started`).
async fn start_waiting_job(d: &Path, via: &str, n: u32) -> (String, PathBuf) {
    let (started, go) = (d.join(format!("started-{n}")), d.join(format!("go-{n}")));
    let script = format!(
        "touch {}; for i in $(seq 600); do [ -e {} ] && exit 0; sleep 0.1; done",
        started.display(),
        go.display()
    );
    let out = salt(d, via, &["--async", MINION, "cmd.run", &script]);
    // The CLI's own `ws` client warns on stderr after the jid (aiohttp's "Unclosed client
    // session": `RequestClient` replaces its session on every send).
    let jid = out
        .split_whitespace()
        .find(|j| j.len() == 20 && j.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no jid from salt --async: {out}"))
        .to_string();
    poll(
        &format!("job {jid} running"),
        Duration::from_secs(60),
        d,
        || started.exists(),
    )
    .await;
    (jid, go)
}

fn request_bytes_in(s: &prometheus_parse::Scrape) -> f64 {
    value(
        s,
        "saltgate_listener_bytes_total",
        &[("listener", "request"), ("direction", "in")],
    )
}

/// A counter's value, 0 while it has no sample yet.
fn count(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    if s.samples.iter().any(|x| x.metric == name) {
        value(s, name, labels)
    } else {
        0.0
    }
}

/// saltgate over `masters` (in this order, `balance: first`), on `transport: ws` with the
/// default Salt-aware probe, serving `role` on its Salt port of [`GATE`] (the other listener on
/// a port nobody uses).
fn gate(masters: &[&str], role: Role) -> saltgate_config::Config {
    let health = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let mut cfg = config_on(
        GATE,
        masters
            .iter()
            .map(|ip| MasterConfig {
                name: (*ip).into(),
                host: (*ip).into(),
                publish_port: 4505,
                request_port: 4506,
                weight: 1,
                maxconn: None,
                backup: false,
                disabled: false,
                check: true,
                health,
            })
            .collect(),
        health,
    );
    cfg.global.transport = SaltTransport::Ws;
    cfg.publish.balance = Balance::First;
    cfg.request.balance = Balance::First;
    match role {
        Role::Publish => cfg.publish.bind = vec![format!("{GATE}:4505").parse().unwrap()],
        Role::Request => {
            cfg.request.bind = vec![format!("{GATE}:4506").parse().unwrap()];
            cfg.request.on_master_down = OnMasterDown::Migrate;
        }
    }
    cfg
}

/// Starts the minion (its keys kept from an earlier start) and waits until it answers.
async fn start_minion(d: &Path) -> ProcGuard {
    let conf = d.join(format!("{MINION}-conf"));
    if !conf.join("minion").exists() {
        let conf = write_minion_config(d, MINION, GATE, 4506, 4505);
        // Trace: `AsyncReqChannel.send` logs its failed tries there.
        let mut text = read(&conf.join("minion"))
            .replace("log_level_logfile: debug", "log_level_logfile: trace");
        text.push_str(&format!(
            "transport: ws\nreturn_retry_timer: {RETURN_RETRY_TIMER}\nreturn_retry_timer_max: {RETURN_RETRY_TIMER}\n"
        ));
        std::fs::write(conf.join("minion"), text).unwrap();
    }
    let mut cmd = Command::new(venv().join("bin/salt-minion"));
    cmd.arg("-c").arg(&conf).args(["-l", "warning"]);
    let minion = spawn("salt-minion", cmd, &d.join("minion.stderr"));
    let (mconf, logs) = (
        mdir(d, MASTERS[1]).join("conf"),
        vec![
            d.join(MINION).join("minion.log"),
            master_log(d, MASTERS[0]),
            master_log(d, MASTERS[1]),
        ],
    );
    tokio::task::spawn_blocking(move || {
        minion_answers(
            &mconf,
            MINION,
            Instant::now() + Duration::from_secs(150),
            &logs,
        )
    })
    .await
    .unwrap();
    minion
}

/// What a stock 3008.5 minion logs when a request failed and is tried again
/// (`AsyncReqChannel.send`, at trace), or when it lost its master.
fn failure_lines() -> [&'static str; 3] {
    [
        "Failed to send msg",
        "Async-closing AsyncReqChannel",
        "Re-initialising subsystems",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_minions_return_in_flight_to_a_stopped_master_is_stored_by_the_other_without_a_retry()
{
    let dir = tempfile::Builder::new()
        .prefix("sg-wsmig")
        .tempdir_in("/tmp")
        .unwrap();
    let keep = Keep(dir.path().to_path_buf());
    let d = dir.path();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("saltgate_proxy=info")
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(
            std::fs::File::create(d.join("saltgate.log")).unwrap(),
        ))
        .try_init();
    let masters = start_cluster(d).await;
    let (a, b) = (MASTERS[0], MASTERS[1]);

    let (req, _stop_req) = run_with(gate(&[a, b], Role::Request), Options::default()).await;
    let (publ, _stop_pub) = run_with(gate(&[b], Role::Publish), Options::default()).await;
    let admin = req.admin_addr().unwrap();
    let ready = |ip: &str| {
        let m = req.master(ip).unwrap();
        m.is_up() && m.last_check(Role::Request).ok
    };
    poll(
        "both masters UP in saltgate",
        Duration::from_secs(60),
        d,
        || MASTERS.iter().all(|ip| ready(ip)) && publ.master(b).unwrap().is_up(),
    )
    .await;
    let minion_log = d.join(MINION).join("minion.log");

    let minion = start_minion(d).await;
    let log_at = read(&minion_log).len();
    let (jid, go) = start_waiting_job(d, b, 0).await;
    let before = request_bytes_in(&scrape(admin).await);
    masters[0].signal_group("-STOP");
    std::fs::write(&go, b"").unwrap();
    let returning = format!("Returning information for job: {jid}");
    poll("the minion returning", Duration::from_secs(30), d, || {
        read(&minion_log).contains(&returning)
    })
    .await;
    let sent_at = Instant::now();
    // Its websocket's upgrade passed saltgate towards the stopped master.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while request_bytes_in(&scrape(admin).await) < before + 100.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the return's websocket never reached saltgate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = format!("Got return from {MINION} for job {jid}");
    poll(
        &format!("{b} storing the return of {jid} (SIGSTOP of {a})"),
        Duration::from_secs(RETURN_RETRY_TIMER - 5),
        d,
        || read(&master_log(d, b)).contains(&got),
    )
    .await;
    let took = sent_at.elapsed();
    let s = scrape(admin).await;
    let moved = count(
        &s,
        "saltgate_request_sessions_migrated_total",
        &[("reason", "master-down")],
    );
    let replayed = count(&s, "saltgate_requests_replayed_total", &[]);
    let log = read(&d.join("saltgate.log"));
    let moves: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request session moved"))
        .collect();
    eprintln!(
        "SIGSTOP of {a}: the return of {jid} stored by {b} {took:?} after the minion sent it; \
         sessions moved at DOWN {moved}, re-sends {replayed}; {moves:?}"
    );
    assert!(moved >= 1.0, "the return's session moved at DOWN ({moved})");
    let since = read(&minion_log).split_off(log_at);
    // The check below needs the minion's trace lines.
    assert!(since.contains("[TRACE"), "the minion logs at trace");
    for line in failure_lines() {
        assert!(
            !since.contains(line),
            "the minion failed a send or lost its master ({line:?}):\n{}",
            tail(&minion_log)
        );
    }
    drop(minion);
    drop(masters);
    std::mem::forget(keep);
}
