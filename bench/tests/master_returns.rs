//! Every return of a burst reaches `saltgate-master`: a master (in this process, on its own
//! runtime) and a swarm of 300 minions (one shared key) on 127.21.0.2. Once all answer, three
//! `test.ping` jobs are published at once (900 returns racing in) and each must collect all 300.
//!
//! Before the fix this failed: the master's request loop waited for a free handler inside its
//! receive branch while handlers waited for that loop to take their replies off a bounded
//! channel; once the channel filled (after some 800 requests in a burst), the master stopped
//! answering for good (docs/master.md, "1,000 minions").
//!
//! Each minion also fires Salt's start event (`salt/minion/<id>/start`) once connected; the
//! swarm's summary must count an answer from the master for every one.
//!
//! Then it failed differently: one of the three concurrent jobs lost (almost) all its returns,
//! `(300, 0, 300)`. The master took each job's `serial` (the minion's replay guard) in one order
//! and queued the jobs in another, so a minion dropped the job whose serial came late as a
//! replay. Serials and queue order are now one step (`security::concurrent_publishes_*`).

use std::path::Path;
use std::time::{Duration, Instant};

use saltgate_bench::lab::MasterHandle;
use saltgate_config::salt_master::parse_salt_master;
use saltgate_config::salt_minion::MasterAddr;
use saltgate_minion::swarm::{run_swarm, SwarmOptions};
use saltgate_test_support::write_openssl_key;
use serde_json::json;

const IP: &str = "127.21.0.2";
const N: usize = 300;

/// Publishes `test.ping` to every swarm minion; returns how many answered `true`.
async fn ping_all(socket: &Path, timeout_secs: u64) -> usize {
    let req =
        json!({"tgt": "burst-*", "fun": "test.ping", "arg": [], "timeout_secs": timeout_secs});
    let out = saltgate_master::cli::publish(socket, &req)
        .await
        .expect("publish");
    out.returns
        .iter()
        .filter(|r| r.record.get("return") == Some(&json!(true)))
        .count()
}

#[test]
fn a_burst_of_900_returns_from_300_minions_all_arrive() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().display();
        write_openssl_key(&tmp.path().join("pki/master.pem"));
        write_openssl_key(&tmp.path().join("swarm/shared.pem"));
        let text = format!(
            "id: m1\ninterface: {IP}\npublish_port: 0\nret_port: 0\npki_dir: {d}/pki\n\
             cachedir: {d}/cache\nsock_dir: {d}/sock\nauto_accept: True\n"
        );
        let cfg = parse_salt_master(&text, None).unwrap().config;
        let master = MasterHandle::start("m1", cfg).await.expect("master");
        let socket = master.bound.cli_socket.clone();

        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let opts = SwarmOptions {
            count: N,
            master: MasterAddr {
                host: IP.into(),
                port: master.bound.ret.port(),
            },
            id_prefix: "burst-".into(),
            id_start: 0,
            pki_dir: tmp.path().join("swarm"),
            shared_key: true,
            report_every: Duration::from_secs(3600),
            json: true,
            duration: None,
            start_rate: 1000,
            acceptance_wait_time: Duration::from_secs(1),
            publish_port: None,
            pillar: false,
            transport: Default::default(),
        };
        let swarm = tokio::spawn(run_swarm(opts, stop));

        // Every minion up: a round of test.ping gets all N.
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut last = 0;
        while last < N {
            assert!(
                Instant::now() < deadline,
                "only {last} of {N} minions answered within 240 s"
            );
            last = ping_all(&socket, 10).await;
        }

        // The burst: three jobs at once, each must collect every return.
        let got = tokio::join!(
            ping_all(&socket, 90),
            ping_all(&socket, 90),
            ping_all(&socket, 90)
        );
        assert_eq!(got, (N, N, N), "returns collected per job");

        let _ = stop_tx.send(true);
        let summary = tokio::time::timeout(Duration::from_secs(30), swarm)
            .await
            .expect("swarm stops")
            .expect("swarm task")
            .expect("swarm summary");
        // Each minion fired Salt's start event once it was connected, and the master answered
        // it (so each `tok` was checked before the first job, as with stock minions).
        assert_eq!(summary["start_events"], json!(N), "{summary}");
        master.kill().await;
    });
}
