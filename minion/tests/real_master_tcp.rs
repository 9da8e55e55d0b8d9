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

use std::time::{Duration, Instant};

use common::salt_transport::{jobs_are_answered, make_pki, swarm_answers, wait_ready_on};
use common::{start_minion, tempdir, wait_for, Master};
use saltgate_wire::salt_tcp::probe::Transport;
use saltgate_wire::salt_tcp::tls::TlsSettings;
use serde_json::json;

#[test]
fn real_tcp_master_authenticates_us_and_its_cli_gets_answers() {
    const IP: &str = "127.0.13.1";
    let tmp = tempdir();
    let mut master = Master::start(IP, &tmp.path().join("master"), "transport: tcp\n");
    wait_ready_on(&mut master, Transport::Tcp, None);
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
    let first = jobs_are_answered(&master, id, &mdir, "tcp");
    eprintln!("tcp: first test.ping answered {first:?} after the key was accepted");
    // A restarted master has a new publish key: after the reconnect the minion authenticates
    // again and says hello with the new key, or the master would never send it a targeted job.
    master.guard = None;
    master.spawn();
    wait_ready_on(&mut master, Transport::Tcp, None);
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
    wait_ready_on(
        &mut master,
        Transport::Tcp,
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
    let first = jobs_are_answered(&master, id, &mdir, "tcp");
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
    wait_ready_on(&mut master, Transport::Tcp, None);
    // A glob is a topic list on Salt's tcp publisher: each minion gets it only if it said hello.
    let took = swarm_answers(&master, "tcp", "swt-", N, &tmp.path().join("swarm-pki"));
    eprintln!("tcp swarm: {N} answers {took:?} after start");
}
