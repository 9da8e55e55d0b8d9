//! The transport tests' shared steps (real_master_tcp.rs, real_master_ws.rs): waiting for a
//! stock master's clear `ping` on its transport, a test CA made at run time, the jobs a stock
//! master's CLI sends our minion, and a swarm on a transport.

use std::path::Path;
use std::time::{Duration, Instant};

use saltgate_wire::salt_tcp::probe::{salt_ping_staged, Target, TlsClient, Transport};
use saltgate_wire::salt_tcp::tls::{client_config, server_name, TlsSettings};
use serde_json::json;

use super::{start_minion, tempdir, wait_for, Master, ProcGuard};

/// Waits until the master answers Salt's clear `ping` on `transport` (TLS when given).
pub fn wait_ready_on(master: &mut Master, transport: Transport, tls: Option<TlsSettings>) {
    let addr = format!("{}:{}", master.ip, master.ret_port)
        .parse()
        .expect("addr");
    let target = Target {
        addr,
        transport,
        tls: tls.map(|s| TlsClient {
            config: client_config(&s).expect("tls config"),
            server_name: server_name(&s, addr.ip()).expect("name"),
        }),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let two = Duration::from_secs(2);
    master.wait_answering(Duration::from_secs(60), || {
        rt.block_on(salt_ping_staged(&target, two, two)).is_ok()
    });
}

/// A stock master on `transport` at `ip` and our minion `id` (with `extra` minion options): the
/// CLI's jobs are answered, then the master restarts and `test.ping` is answered again.
pub fn plain_master_answers_across_a_restart(
    transport: Transport,
    ip: &str,
    id: &str,
    extra: &str,
) {
    let t = transport.as_str();
    let tmp = tempdir();
    let mut master = Master::start(ip, &tmp.path().join("master"), &format!("transport: {t}\n"));
    wait_ready_on(&mut master, transport, None);
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster: {ip}:{}\ntransport: {t}\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\nrecon_default: 200\nrecon_max: 1000\n{extra}",
            master.ret_port,
            mdir.display()
        ),
    );
    let first = jobs_are_answered(&master, id, &mdir, t);
    eprintln!("{t}: first test.ping answered {first:?} after the key was accepted");
    // A restarted master has a new publish key: after the reconnect the minion authenticates
    // again (on tcp it says hello with the new key, or the master would never send it a
    // targeted job), and is answered.
    master.guard = None;
    master.spawn();
    wait_ready_on(&mut master, transport, None);
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
        "{t}: answered {:?} after the master restarted",
        restarted.elapsed()
    );
}

/// A stock master on `transport` over TLS at `ip` (Salt's `ssl` on both sides, a client
/// certificate required; `worker_pools_enabled: False`, issue 27) and our minion `id`: the
/// CLI's jobs are answered.
pub fn tls_master_answers(transport: Transport, ip: &str, id: &str) {
    let t = transport.as_str();
    let tmp = tempdir();
    let pki = tmp.path().join("tls");
    make_pki(&pki, ip, id);
    let p = pki.display();
    let mut master = Master::start(
        ip,
        &tmp.path().join("master"),
        &format!(
            "transport: {t}\nworker_pools_enabled: False\nssl:\n  certfile: {p}/master.pem\n  \
             keyfile: {p}/master.key\n  ca_certs: {p}/ca.pem\n  cert_reqs: CERT_REQUIRED\n"
        ),
    );
    wait_ready_on(
        &mut master,
        transport,
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
            "id: {id}\nmaster: {ip}:{}\ntransport: {t}\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\nssl:\n  ca_certs: {p}/ca.pem\n  certfile: {p}/minion.pem\n  \
             keyfile: {p}/minion.key\n  cert_reqs: CERT_REQUIRED\n",
            master.ret_port,
            mdir.display()
        ),
    );
    let first = jobs_are_answered(&master, id, &mdir, t);
    eprintln!("{t}+TLS: first test.ping answered {first:?} after the key was accepted");
}

/// A stock master on `transport` at `ip` (`auto_accept`) and a swarm of `n` minions named
/// `prefix`*: each answers a glob `test.ping`.
pub fn swarm_on_master_answers(transport: Transport, ip: &str, prefix: &str, n: usize) {
    let t = transport.as_str();
    let tmp = tempdir();
    let mut master = Master::start(
        ip,
        &tmp.path().join("master"),
        &format!("transport: {t}\nauto_accept: True\n"),
    );
    wait_ready_on(&mut master, transport, None);
    let took = swarm_answers(&master, t, prefix, n, &tmp.path().join("swarm-pki"));
    eprintln!("{t} swarm: {n} answers {took:?} after start");
}

/// Accepts the minion's key, then checks the CLI's jobs reach it; returns how long from the
/// acceptance to the first answered `test.ping`. `transport` names the words echoed.
pub fn jobs_are_answered(master: &Master, id: &str, mdir: &Path, transport: &str) -> Duration {
    master.accept_when_pending(id);
    let accepted = Instant::now();
    wait_for(Duration::from_secs(30), "test.ping answered", || {
        let v = master.salt(3, &[id, "test.ping"]);
        (v == json!({ id: true })).then_some(())
    });
    let first = accepted.elapsed();
    let said = format!("over {transport}");
    assert_eq!(
        master.salt(10, &[id, "test.echo", &said]),
        json!({ id: said })
    );
    let ran = master.salt(10, &[id, "cmd.run", &format!("echo ran {transport}")]);
    assert_eq!(ran, json!({ id: format!("ran {transport}") }));
    // A list target is a topic list on Salt's tcp publisher (only the named connections get
    // it); its ws publisher sends it to all, and the minion keeps it.
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

/// Writes a test CA, a server certificate for `ip` and a client certificate for `id` into `dir`.
pub fn make_pki(dir: &Path, ip: &str, id: &str) {
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

/// Runs `saltgate-minion swarm --transport <transport>` of `n` minions against `master` (set to
/// `auto_accept`) and waits until each answers a glob `test.ping`; returns how long it took.
pub fn swarm_answers(
    master: &Master,
    transport: &str,
    prefix: &str,
    n: usize,
    pki: &Path,
) -> Duration {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_saltgate-minion"));
    cmd.args(["swarm", "--count", &n.to_string(), "--transport", transport])
        .args(["--master", &format!("{}:{}", master.ip, master.ret_port)])
        .args(["--id-prefix", prefix, "--shared-key", "--json"])
        .args(["--acceptance-wait-time", "1"])
        .arg("--pki-dir")
        .arg(pki)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _swarm = ProcGuard::spawn("saltgate-minion swarm", cmd);
    let started = Instant::now();
    let glob = format!("{prefix}*");
    wait_for(
        Duration::from_secs(30),
        &format!("every {transport} swarm minion answers"),
        || {
            let v = master.salt(3, &[&glob, "test.ping"]);
            let got = v
                .as_object()
                .map(|m| m.values().filter(|x| **x == json!(true)).count())
                .unwrap_or(0);
            (got == n).then_some(())
        },
    );
    started.elapsed()
}
