//! Our minion against a real salt-master 3008.5 on `transport: tcp`, plain (127.0.13.1) and over
//! TLS (127.0.13.2, Salt's `ssl` on both sides, a client certificate required). The key is
//! accepted with `salt-key`, then the real `salt` CLI's jobs, aimed at our id (Salt's tcp
//! publish server sends those only to the connection that said our id: the hello), are answered.
//!
//! The plain test then restarts the master: the minion re-authenticates after the reconnect and
//! says hello with the new publish key, and is answered again.
//!
//! The TLS master runs with `worker_pools_enabled: False`: 3008.5's worker-pool router wraps its
//! internal IPC server in TLS while its IPC client speaks plain text (issue 27). The test CA and
//! certificates are made at run time in the test's temporary directory; none is committed.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{start_minion, tempdir, wait_for, Master};
use saltgate_wire::salt_tcp::probe::{salt_ping_staged, Target, TlsClient, Transport};
use saltgate_wire::salt_tcp::tls::{client_config, server_name, TlsSettings};
use serde_json::json;

/// Waits until the master answers Salt's clear `ping` over tcp (TLS when given).
fn wait_ready_tcp(master: &mut Master, tls: Option<TlsSettings>) {
    let addr = format!("{}:{}", master.ip, master.ret_port)
        .parse()
        .expect("addr");
    let target = Target {
        addr,
        transport: Transport::Tcp,
        tls: tls.map(|s| TlsClient {
            config: client_config(&s).expect("tls config"),
            server_name: server_name(&s, addr.ip()).expect("name"),
        }),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let two = Duration::from_secs(2);
        if rt.block_on(salt_ping_staged(&target, two, two)).is_ok() {
            return;
        }
        if let Some(g) = master.guard.as_mut() {
            if let Ok(Some(st)) = g.child.try_wait() {
                panic!("salt-master exited ({st})\n{}", master.logs());
            }
        }
        assert!(
            Instant::now() < deadline,
            "master not ready\n{}",
            master.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Accepts the minion's key, then checks the CLI's jobs reach it; returns how long from the
/// acceptance to the first answered `test.ping`.
fn jobs_are_answered(master: &Master, id: &str, mdir: &Path) -> Duration {
    master.accept_when_pending(id);
    let accepted = Instant::now();
    wait_for(Duration::from_secs(30), "test.ping answered", || {
        let v = master.salt(3, &[id, "test.ping"]);
        (v == json!({ id: true })).then_some(())
    });
    let first = accepted.elapsed();
    assert_eq!(
        master.salt(10, &[id, "test.echo", "over tcp"]),
        json!({ id: "over tcp" })
    );
    // A list target is a topic list on Salt's tcp publisher: only the named connections get it.
    assert_eq!(
        master.salt(10, &["-L", &format!("other,{id}"), "test.ping"]),
        json!({ id: true })
    );
    let nobody = master.salt(3, &["nobody-*", "test.ping"]);
    assert!(
        nobody.get(id).is_none(),
        "answered a job for others: {nobody}"
    );
    wait_for(Duration::from_secs(20), "start event answered", || {
        let log = std::fs::read_to_string(mdir.join("minion.log")).unwrap_or_default();
        log.contains("start event delivered").then_some(())
    });
    let log = std::fs::read_to_string(mdir.join("minion.log")).unwrap_or_default();
    assert!(!log.contains("transport: a Salt minion option"), "{log}");
    first
}

#[test]
fn real_tcp_master_authenticates_us_and_its_cli_gets_answers() {
    const IP: &str = "127.0.13.1";
    let tmp = tempdir();
    let mut master = Master::start(IP, &tmp.path().join("master"), "transport: tcp\n");
    wait_ready_tcp(&mut master, None);
    let id = "sg-tcp-minion";
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster: {IP}:{}\ntransport: tcp\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\nrecon_default: 200\nrecon_max: 1000\n",
            master.ret_port,
            mdir.display()
        ),
    );
    let first = jobs_are_answered(&master, id, &mdir);
    eprintln!("tcp: first test.ping answered {first:?} after the key was accepted");
    // A restarted master has a new publish key: after the reconnect the minion authenticates
    // again and says hello with the new key, or the master would never send it a targeted job.
    master.guard = None;
    master.spawn();
    wait_ready_tcp(&mut master, None);
    let restarted = Instant::now();
    wait_for(
        Duration::from_secs(40),
        "test.ping after a master restart",
        || {
            let v = master.salt(3, &[id, "test.ping"]);
            (v == json!({ id: true })).then_some(())
        },
    );
    eprintln!(
        "tcp: answered {:?} after the master restarted",
        restarted.elapsed()
    );
}

/// Writes a test CA, a server certificate for `ip` and a client certificate for `id` into `dir`.
fn make_pki(dir: &Path, ip: &str, id: &str) {
    std::fs::create_dir_all(dir).expect("pki dir");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("ca");
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca");
    for (name, san) in [("master", ip), ("minion", id)] {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec![san.to_string()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, san);
        let cert = params.signed_by(&key, &ca).expect("sign");
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).expect("write cert");
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).expect("write key");
    }
}

#[test]
fn real_tcp_master_over_tls_authenticates_us_and_its_cli_gets_answers() {
    const IP: &str = "127.0.13.2";
    let tmp = tempdir();
    let pki = tmp.path().join("tls");
    let id = "sg-tls-minion";
    make_pki(&pki, IP, id);
    let p = pki.display();
    let mut master = Master::start(
        IP,
        &tmp.path().join("master"),
        &format!(
            "transport: tcp\nworker_pools_enabled: False\nssl:\n  certfile: {p}/master.pem\n  \
             keyfile: {p}/master.key\n  ca_certs: {p}/ca.pem\n  cert_reqs: CERT_REQUIRED\n"
        ),
    );
    wait_ready_tcp(
        &mut master,
        Some(TlsSettings {
            ca_certs: Some(pki.join("ca.pem")),
            certfile: Some(pki.join("minion.pem")),
            keyfile: Some(pki.join("minion.key")),
            ..TlsSettings::default()
        }),
    );
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster: {IP}:{}\ntransport: tcp\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\nssl:\n  ca_certs: {p}/ca.pem\n  certfile: {p}/minion.pem\n  \
             keyfile: {p}/minion.key\n  cert_reqs: CERT_REQUIRED\n",
            master.ret_port,
            mdir.display()
        ),
    );
    let first = jobs_are_answered(&master, id, &mdir);
    eprintln!("tcp+TLS: first test.ping answered {first:?} after the key was accepted");
}

#[test]
fn real_tcp_master_is_answered_by_a_tcp_swarm() {
    const IP: &str = "127.0.13.3";
    const N: usize = 10;
    let tmp = tempdir();
    let mut master = Master::start(
        IP,
        &tmp.path().join("master"),
        "transport: tcp\nauto_accept: True\n",
    );
    wait_ready_tcp(&mut master, None);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_saltgate-minion"));
    cmd.args(["swarm", "--count", &N.to_string(), "--transport", "tcp"])
        .args(["--master", &format!("{IP}:{}", master.ret_port)])
        .args(["--id-prefix", "swt-", "--shared-key", "--json"])
        .args(["--acceptance-wait-time", "1"])
        .arg("--pki-dir")
        .arg(tmp.path().join("swarm-pki"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _swarm = common::ProcGuard::spawn("saltgate-minion swarm", cmd);
    let started = Instant::now();
    // A glob is a topic list on Salt's tcp publisher: each minion gets it only if it said hello.
    wait_for(
        Duration::from_secs(30),
        "every tcp swarm minion answers",
        || {
            let v = master.salt(3, &["swt-*", "test.ping"]);
            let n = v
                .as_object()
                .map(|m| m.values().filter(|x| **x == json!(true)).count())
                .unwrap_or(0);
            (n == N).then_some(())
        },
    );
    eprintln!("tcp swarm: {N} answers {:?} after start", started.elapsed());
}
