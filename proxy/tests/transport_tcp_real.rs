//! Salt's `tcp` transport with real Salt 3008.5 (issue 27): a `salt-master` on `transport: tcp`,
//! plain and over TLS (a test CA and server certificate made here by the `openssl` CLI), behind
//! saltgate with `transport: tcp` and its default Salt-aware probe and schedule:
//! - the master is UP; SIGSTOP (every process of it) -> DOWN within 5 s; SIGCONT -> UP again;
//! - the master's log holds no parsing traceback (the ZeroMQ probe's greeting made a tcp master
//!   log "Exception parsing response ... TypeError" on every check);
//! - (plain tcp) a stock `salt-minion` on `transport: tcp`, knowing only saltgate's address,
//!   answers `test.ping` and is listed by presence with its id and master (the tcp `_auth` read);
//! - (plain tcp) stopped, the master is DOWN within 5 s: its process no longer reads the check's
//!   bytes. (A busy master passing that stage is tested against a fake master in
//!   wire/src/salt_tcp/probe_tests.rs; a real busy master is not covered yet.)
//!
//! Salt 3008.5 with TLS needs `worker_pools_enabled: False` on the master (its pool router wraps
//! the internal IPC server in TLS while the IPC client speaks plain text). Plain tcp has no
//! handshake: its checks' first stage is that the master's process reads what it is sent (Salt's
//! `PoolRouter` reads every connection while the workers are busy; a stopped master reads
//! nothing: wire/src/salt_tcp/probe.rs). Under TLS the TLS handshake is the stage. Needs the Salt
//! venv (`SALTGATE_VENV` or test-support's setup) and `openssl`. Addresses: 127.15.0.0/24. Run
//! under `flock /tmp/heavy.lock`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::api::{json, run_with, scrape, value};
use common::salt_real::{
    kept_dir, minion_answers, real_master, run_ok, salt_aware, spawn, stopped_down_and_resumed,
    tail,
};
use common::*;
use saltgate_config::transport::{CertReqs, SaltTransport, SslConfig};
use saltgate_proxy::Options;
use saltgate_test_support::{venv, ProcGuard};

/// A test CA and a server certificate for `ips` (the master's and saltgate's addresses).
fn make_pki(dir: &Path, ips: &[&str]) {
    let run = |args: &[&str]| {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(dir);
        run_ok(cmd, &format!("openssl {args:?}"));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=saltgate test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    let san: Vec<String> = ips.iter().map(|ip| format!("IP:{ip}")).collect();
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName={}\n", san.join(",")),
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=salt-master",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.pem",
    ]);
}

fn start_minion(d: &Path, ds: &str, minion: &str, proxy_ip: &str) -> ProcGuard {
    std::fs::create_dir_all(d.join("minion")).unwrap();
    std::fs::write(
        d.join("minion/minion"),
        format!(
            "id: {minion}\nmaster: {proxy_ip}\nmaster_port: 4506\npublish_port: 4505\n\
             transport: tcp\nuser: root\n\
             pki_dir: {ds}/n/pki\ncachedir: {ds}/n/cache\nsock_dir: {ds}/n/sock\n\
             pidfile: {ds}/n/minion.pid\nlog_file: {ds}/n/minion.log\nlog_level_logfile: info\n\
             acceptance_wait_time: 1\nrandom_reauth_delay: 1\nauth_timeout: 10\n\
             multiprocessing: False\nmaster_tries: -1\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(venv().join("bin/salt-minion"));
    cmd.arg("-c").arg(d.join("minion")).args(["-l", "warning"]);
    spawn("salt-minion", cmd, &d.join("minion.stderr"))
}

async fn scenario(master_ip: &str, proxy_ip: &str, tls: bool) {
    let (dir, keep) = kept_dir("sg-tcp");
    let d = dir.path();
    let ds = d.display().to_string();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("saltgate_proxy=info")
        .with_writer(std::sync::Mutex::new(
            std::fs::File::create(d.join("saltgate.log")).unwrap(),
        ))
        .try_init();
    let minion = if tls { "tcp-tls-minion" } else { "tcp-minion" };
    if tls {
        make_pki(d, &[master_ip, proxy_ip]);
    }
    // Server side: Salt requires a client certificate unless cert_reqs says otherwise.
    let master_ssl = if tls {
        format!("ssl:\n  certfile: {ds}/server.pem\n  keyfile: {ds}/server.key\n  cert_reqs: CERT_NONE\nworker_pools_enabled: False\n")
    } else {
        String::new()
    };
    std::fs::create_dir_all(d.join("master")).unwrap();
    std::fs::write(
        d.join("master/master"),
        format!(
            "id: tcp-master\ninterface: {master_ip}\npublish_port: 4505\nret_port: 4506\n\
             transport: tcp\n{master_ssl}\
             user: root\nauto_accept: True\npki_dir: {ds}/m/pki\ncachedir: {ds}/m/cache\n\
             sock_dir: {ds}/m/sock\nsqlite_queue_dir: {ds}/m/queues\npidfile: {ds}/m/master.pid\n\
             log_file: {ds}/m/master.log\nkey_logfile: {ds}/m/key.log\nlog_level_logfile: info\n\
             worker_threads: 2\nfile_roots: {{base: [{ds}/srv/salt]}}\n\
             pillar_roots: {{base: [{ds}/srv/pillar]}}\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(venv().join("bin/salt-master"));
    cmd.arg("-c").arg(d.join("master")).args(["-l", "warning"]);
    let master = spawn("salt-master", cmd, &d.join("master.stderr"));

    // saltgate: transport tcp, the default Salt-aware probe and schedule.
    let health = salt_aware();
    let mut cfg = config_on(
        proxy_ip,
        vec![real_master("real", master_ip, health)],
        health,
    );
    cfg.global.transport = SaltTransport::Tcp;
    cfg.global.ssl = tls.then(|| SslConfig {
        ca_certs: Some(d.join("ca.pem")),
        cert_reqs: CertReqs::Required,
        ..SslConfig::default()
    });
    cfg.publish.bind = vec![format!("{proxy_ip}:4505").parse().unwrap()];
    cfg.request.bind = vec![format!("{proxy_ip}:4506").parse().unwrap()];
    let (r, _stop) = run_with(cfg, Options::default()).await;
    let m = r.master("real").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    // (A master is UP before its first checks: wait for a passed ping.)
    while !(m.is_up() && m.last_check(saltgate_config::Role::Request).ok) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tcp master never came UP: {:?}\n{}\n{}",
            m.last_check(saltgate_config::Role::Request),
            tail(&d.join("master.stderr")),
            tail(&d.join("m/master.log"))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A stock minion on transport tcp, knowing only saltgate's address (plain tcp: a stock minion
    // over TLS through saltgate did not authenticate within this test's budget; not asserted yet).
    let _minion = if tls {
        None
    } else {
        Some(start_minion(d, &ds, minion, proxy_ip))
    };
    let admin = r.admin_addr().unwrap();
    if !tls {
        let dd = d.to_path_buf();
        tokio::task::spawn_blocking(move || {
            minion_answers(
                &dd.join("master"),
                minion,
                Instant::now() + Duration::from_secs(150),
                &[dd.join("n/minion.log"), dd.join("m/master.log")],
            )
        })
        .await
        .unwrap();
        // Presence read the tcp `_auth` (or an `aes` envelope): listed with its id and master.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let listed = loop {
            let (code, v) = json(admin, "GET", "/api/v1/minions", None).await;
            assert_eq!(code, 200, "{v}");
            if let Some(m) = v["minions"]
                .as_array()
                .and_then(|l| l.iter().find(|m| m["id"] == minion))
            {
                break m.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the tcp minion is not in presence: {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(listed["request_master"], "real", "{listed}");
        assert_eq!(listed["publish_master"], "real", "{listed}");
        let s = scrape(admin).await;
        let read = value(
            &s,
            "saltgate_presence_inspections_total",
            &[("result", "auth")],
        ) + value(
            &s,
            "saltgate_presence_inspections_total",
            &[("result", "aes")],
        );
        assert!(read >= 1.0, "no tcp request session was identified");
        eprintln!("presence: {listed}");
    } else {
        // Under TLS presence is by address only: nothing to list.
        let (code, v) = json(admin, "GET", "/api/v1/minions", None).await;
        assert_eq!((code, v["total"].as_u64()), (200, Some(0)), "{v}");
    }

    // SIGSTOP every process of the master: DOWN within 5 s (the handshake stage: TLS's, or on
    // plain tcp the read of the check's bytes); SIGCONT: UP again; no parsing traceback.
    let what = if tls { "tcp+TLS" } else { "tcp" };
    stopped_down_and_resumed(
        &master,
        &m,
        what,
        &[d.join("m/master.log"), d.join("master.stderr")],
    )
    .await;
    std::mem::forget(keep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_master_behind_saltgate_is_checked_in_salt_and_serves_a_tcp_minion() {
    scenario("127.15.0.10", "127.15.0.11", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_tcp_master_behind_saltgate_is_checked_over_tls_and_down_within_5s_when_stopped() {
    scenario("127.15.0.20", "127.15.0.21", true).await;
}
