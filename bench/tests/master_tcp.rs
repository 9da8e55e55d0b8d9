//! `saltgate-master` on `transport: tcp` against `saltgate-minion` swarms on tcp, both in this
//! process on 127.36.0.1 (no venv): the minions authenticate, say their id on the publish port
//! (Salt's `send_id`), answer a glob and a list target, and a job aimed at one minion reaches
//! only that minion's connection (Salt's tcp publisher; ZeroMQ sends every publish to everyone).
//!
//! Two swarms: `tcpm-b-*` (three minions) first, then `tcpm-a-0`. Each publish aimed at
//! `tcpm-a-0` would reach every connection of the B swarm if the publisher broadcast; the B
//! swarm's count of publishes received shows it did not.

use std::path::Path;
use std::time::{Duration, Instant};

use saltgate_bench::lab::MasterHandle;
use saltgate_config::salt_master::parse_salt_master;
use saltgate_config::salt_minion::MasterAddr;
use saltgate_minion::swarm::{run_swarm, SwarmOptions};
use saltgate_test_support::{wait_until, write_openssl_key};
use saltgate_wire::transport::Transport;
use serde_json::json;

const IP: &str = "127.36.0.1";

/// Publishes `fun` to `tgt` (`tgt_type`); returns the minions that answered `true`.
async fn ask(socket: &Path, tgt: &str, tgt_type: &str, timeout_secs: u64) -> Vec<String> {
    let req = json!({"tgt": tgt, "tgt_type": tgt_type, "fun": "test.ping", "arg": [],
        "timeout_secs": timeout_secs});
    let out = saltgate_master::cli::publish(socket, &req)
        .await
        .expect("publish");
    let mut who: Vec<String> = out
        .returns
        .iter()
        .filter(|r| r.record.get("return") == Some(&json!(true)))
        .map(|r| r.minion.clone())
        .collect();
    who.sort();
    who
}

/// Publishes to `tgt` until `want` minions answer; returns how many publishes it took.
async fn until_answered(socket: &Path, tgt: &str, want: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rounds = 0;
    loop {
        rounds += 1;
        let got = ask(socket, tgt, "glob", 5).await;
        if got.len() == want {
            return rounds;
        }
        assert!(
            Instant::now() < deadline,
            "{tgt}: only {got:?} answered within 120 s"
        );
    }
}

fn swarm(
    tmp: &Path,
    port: u16,
    prefix: &str,
    count: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<serde_json::Value, saltgate_minion::swarm::SwarmError>> {
    let pki = tmp.join(prefix);
    write_openssl_key(&pki.join("shared.pem"));
    tokio::spawn(run_swarm(
        SwarmOptions {
            count,
            master: MasterAddr {
                host: IP.into(),
                port,
            },
            id_prefix: prefix.into(),
            id_start: 0,
            pki_dir: pki,
            shared_key: true,
            report_every: Duration::from_secs(3600),
            json: true,
            duration: None,
            start_rate: 1000,
            acceptance_wait_time: Duration::from_secs(1),
            publish_port: None,
            pillar: false,
            transport: Transport::Tcp,
        },
        stop,
    ))
}

#[test]
fn a_tcp_master_serves_tcp_minions_and_sends_a_targeted_job_only_to_its_minion() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().display();
        write_openssl_key(&tmp.path().join("pki/master.pem"));
        let text = format!(
            "id: m1\ninterface: {IP}\npublish_port: 0\nret_port: 0\npki_dir: {d}/pki\n\
             cachedir: {d}/cache\nsock_dir: {d}/sock\nauto_accept: True\ntransport: tcp\n"
        );
        let cfg = parse_salt_master(&text, None).unwrap().config;
        let master = MasterHandle::start("m1", cfg).await.expect("master");
        let socket = master.bound.cli_socket.clone();
        let port = master.bound.ret.port();

        let (stop_b_tx, stop_b) = tokio::sync::watch::channel(false);
        let b = swarm(tmp.path(), port, "tcpm-b-", 3, stop_b);
        let b_rounds = until_answered(&socket, "tcpm-b-*", 3).await;

        let (stop_a_tx, stop_a) = tokio::sync::watch::channel(false);
        let a = swarm(tmp.path(), port, "tcpm-a-", 1, stop_a);
        // A glob that matches no accepted minion goes to every connection, as Salt's does (an
        // empty `topic_lst`): A's rounds are published once its key is accepted, or B's minions
        // would get those (seen in a loaded run: one more publish each).
        let accepted = tmp.path().join("pki/minions/tcpm-a-0");
        wait_until("tcpm-a-0's key accepted", Duration::from_secs(60), || {
            accepted.exists()
        })
        .await;
        let a_rounds = until_answered(&socket, "tcpm-a-*", 1).await;
        // A list target: answered by the one minion listed (`other` has no key).
        const LIST_JOBS: u64 = 5;
        for _ in 0..LIST_JOBS {
            assert_eq!(
                ask(&socket, "tcpm-a-0,other", "list", 10).await,
                ["tcpm-a-0"]
            );
        }
        // And everyone still answers a glob for all.
        assert_eq!(ask(&socket, "tcpm-*", "glob", 10).await.len(), 4);

        let _ = stop_b_tx.send(true);
        let _ = stop_a_tx.send(true);
        type Swarm =
            tokio::task::JoinHandle<Result<serde_json::Value, saltgate_minion::swarm::SwarmError>>;
        let summary = |h: Swarm| async move {
            tokio::time::timeout(Duration::from_secs(30), h)
                .await
                .expect("swarm stops")
                .expect("swarm task")
                .expect("swarm summary")
        };
        let (sa, sb) = (summary(a).await, summary(b).await);
        let got = |s: &serde_json::Value| s["publishes_received"].as_u64().unwrap_or(0);
        eprintln!(
            "tcp: b {} publishes over {b_rounds} rounds, a {} over {a_rounds} rounds and \
             {LIST_JOBS} list jobs",
            got(&sb),
            got(&sa)
        );
        // B's minions got B's rounds and the last glob, none of A's jobs (a broadcast would
        // have added 3 x (a_rounds + LIST_JOBS)).
        assert!(got(&sb) <= 3 * (b_rounds + 1), "{sb}");
        assert!(got(&sa) > LIST_JOBS, "{sa}");
        assert!(got(&sa) <= a_rounds + LIST_JOBS + 1, "{sa}");
        master.kill().await;
    });
}
