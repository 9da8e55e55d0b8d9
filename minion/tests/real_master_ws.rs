//! Our minion against a real salt-master 3008.5 on `transport: ws`, plain (127.42.0.3) and over
//! TLS (127.42.0.4, Salt's `ssl` on both sides, a client certificate required), and a swarm on ws
//! (127.42.0.5). The key is accepted with `salt-key`, then the real `salt` CLI's jobs
//! (`test.ping`, `test.echo`, `cmd.run`, a list, a glob aimed at others) reach our minion through
//! the master's LocalClient and its ws publisher, and our returns come back on its ws request
//! server. Salt's ws publisher sends every job to every connection (no topics, no hello): the
//! minion filters, and answers only its own.
//!
//! The plain test then restarts the master: the publish websocket is dialled again, the first
//! publish under the new key makes the minion authenticate again, and it is answered again.
//!
//! The steps are common/salt_transport.rs, shared with the tcp test. The TLS master runs with
//! `worker_pools_enabled: False`, as on tcp (issue 27). The test CA and certificates are made at
//! run time; none is committed.

mod common;

use std::time::{Duration, Instant};

use common::salt_transport::{jobs_are_answered, make_pki, swarm_answers, wait_ready_on};
use common::{start_minion, tempdir, wait_for, Master};
use saltgate_wire::salt_tcp::probe::Transport;
use saltgate_wire::salt_tcp::tls::TlsSettings;
use serde_json::json;

#[test]
fn real_ws_master_authenticates_us_and_its_cli_gets_answers() {
    const IP: &str = "127.42.0.3";
    let tmp = tempdir();
    let mut master = Master::start(IP, &tmp.path().join("master"), "transport: ws\n");
    wait_ready_on(&mut master, Transport::Ws, None);
    let id = "sg-ws-minion";
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster: {IP}:{}\ntransport: ws\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\nrecon_default: 200\nrecon_max: 1000\n\
             random_reauth_delay: 1\n",
            master.ret_port,
            mdir.display()
        ),
    );
    let first = jobs_are_answered(&master, id, &mdir, "ws");
    eprintln!("ws: first test.ping answered {first:?} after the key was accepted");
    master.guard = None;
    master.spawn();
    wait_ready_on(&mut master, Transport::Ws, None);
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
        "ws: answered {:?} after the master restarted",
        restarted.elapsed()
    );
}

#[test]
fn real_ws_master_over_tls_authenticates_us_and_its_cli_gets_answers() {
    const IP: &str = "127.42.0.4";
    let tmp = tempdir();
    let pki = tmp.path().join("tls");
    let id = "sg-wss-minion";
    make_pki(&pki, IP, id);
    let p = pki.display();
    let mut master = Master::start(
        IP,
        &tmp.path().join("master"),
        &format!(
            "transport: ws\nworker_pools_enabled: False\nssl:\n  certfile: {p}/master.pem\n  \
             keyfile: {p}/master.key\n  ca_certs: {p}/ca.pem\n  cert_reqs: CERT_REQUIRED\n"
        ),
    );
    wait_ready_on(
        &mut master,
        Transport::Ws,
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
            "id: {id}\nmaster: {IP}:{}\ntransport: ws\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\nssl:\n  ca_certs: {p}/ca.pem\n  certfile: {p}/minion.pem\n  \
             keyfile: {p}/minion.key\n  cert_reqs: CERT_REQUIRED\n",
            master.ret_port,
            mdir.display()
        ),
    );
    let first = jobs_are_answered(&master, id, &mdir, "ws");
    eprintln!("ws+TLS: first test.ping answered {first:?} after the key was accepted");
}

#[test]
fn real_ws_master_is_answered_by_a_ws_swarm() {
    const IP: &str = "127.42.0.5";
    const N: usize = 10;
    let tmp = tempdir();
    let mut master = Master::start(
        IP,
        &tmp.path().join("master"),
        "transport: ws\nauto_accept: True\n",
    );
    wait_ready_on(&mut master, Transport::Ws, None);
    let took = swarm_answers(&master, "ws", "sww-", N, &tmp.path().join("swarm-pki"));
    eprintln!("ws swarm: {N} answers {took:?} after start");
}
