//! Issue 8's cluster proof with stock minions: three `saltgate-master` cluster members behind
//! saltgate (`probe: salt`), five stock `salt-minion` 3008.5 processes that know only saltgate's
//! address (127.0.9.1, ports 4505/4506; the masters on 127.0.9.11-14 with the same ports).
//!
//! 1. A publish through each master gets all five returns.
//! 2. One master killed (its runtime stops, every socket closes): once saltgate marks it down,
//!    all five answer through the other two.
//! 3. A fourth master joins with `cluster_secret` (saltgate already lists it, DOWN until it
//!    answers; no other master's configuration changes), serves a publish to all five, and,
//!    when a second master is killed, takes the minions that reconnect and all five answer.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use saltgate_bench::lab::{
    master_config, master_states, publish, publish_sessions, random_hex, start_saltgate,
    wait_until, Backend, MasterHandle, MasterPorts,
};
use saltgate_test_support::{start_salt_minion, write_minion_config};
use serde_json::Value;

const GATE: &str = "127.0.9.1";
const MASTER_IPS: [&str; 4] = ["127.0.9.11", "127.0.9.12", "127.0.9.13", "127.0.9.14"];
const PUB: u16 = 4505;
const REQ: u16 = 4506;
const POOL: u16 = 4520;
const MINIONS: usize = 5;
const ID_PREFIX: &str = "sgstock-";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ports() -> MasterPorts {
    MasterPorts {
        publish: PUB,
        request: REQ,
        cluster: POOL,
    }
}

/// Publishes `test.echo` through `m` until one job is answered by every minion with the
/// echoed word (each retry is a new job), within `limit`.
async fn all_answer(m: &MasterHandle, ids: &BTreeSet<String>, word: &str, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let last = match publish(
            &m.bound.cli_socket,
            &format!("{ID_PREFIX}*"),
            "test.echo",
            &[Value::from(word)],
            8,
        )
        .await
        {
            Ok(p) => {
                let got: BTreeSet<String> = p
                    .returns
                    .iter()
                    .filter(|(_, (_, v))| v.as_str() == Some(word))
                    .map(|(id, _)| id.clone())
                    .collect();
                if &got == ids {
                    return;
                }
                format!("jid {} answered by {got:?}", p.jid)
            }
            Err(e) => format!("{e:#}"),
        };
        assert!(
            std::time::Instant::now() < deadline,
            "{word}: not every minion answered through {} within {limit:?}; last: {last}",
            m.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_minions_behind_saltgate_survive_a_dead_master_and_use_one_that_joins() {
    let root = tempfile::Builder::new()
        .prefix("sgstk")
        .tempdir_in("/tmp")
        .unwrap();
    let r = root.path();
    let secret = random_hex().unwrap();
    let cluster_addr = |i: usize| SocketAddr::new(ip(MASTER_IPS[i]), POOL).to_string();

    // Three members; each names the others as peers (Salt's cluster_peers).
    let mut masters = Vec::new();
    for (i, addr) in MASTER_IPS.iter().take(3).enumerate() {
        let peers: Vec<String> = (0..3).filter(|&j| j != i).map(cluster_addr).collect();
        let name = format!("master{}", i + 1);
        let cfg = master_config(r, &name, ip(addr), ports(), &peers, &secret).unwrap();
        masters.push(MasterHandle::start(&name, cfg).await.unwrap());
    }
    // saltgate lists all four; master4 does not exist yet.
    let backends: Vec<Backend> = (0..4)
        .map(|i| Backend {
            name: format!("master{}", i + 1),
            ip: ip(MASTER_IPS[i]),
            publish_port: PUB,
            request_port: REQ,
        })
        .collect();
    let (_stop, stop_rx) = tokio::sync::oneshot::channel();
    let gate = start_saltgate(
        [
            SocketAddr::new(ip(GATE), PUB),
            SocketAddr::new(ip(GATE), REQ),
            SocketAddr::new(ip(GATE), 0),
        ],
        &backends,
        stop_rx,
    )
    .await
    .unwrap();
    let admin = gate.admin;

    let ids: BTreeSet<String> = (0..MINIONS).map(|i| format!("{ID_PREFIX}{i}")).collect();
    let _minions: Vec<_> = ids
        .iter()
        .map(|id| {
            let conf = write_minion_config(r, id, GATE, REQ, PUB);
            start_salt_minion(&conf, &r.join(format!("{id}.stderr")))
        })
        .collect();

    // 1. Every master's publish reaches all five (peers forward it), returns come back.
    for m in &masters {
        all_answer(
            m,
            &ids,
            &format!("hello-{}", m.name),
            Duration::from_secs(180),
        )
        .await;
    }

    // 2. Kill master1: all five answer through master2 and master3 once it is marked down.
    let victim = masters.remove(0);
    victim.kill().await;
    wait_until(Duration::from_secs(30), "master1 marked down", || async {
        Ok(master_states(admin)
            .await?
            .get("master1")
            .is_some_and(|s| s != "up"))
    })
    .await
    .unwrap();
    for m in &masters {
        all_answer(
            m,
            &ids,
            &format!("survived-{}", m.name),
            Duration::from_secs(120),
        )
        .await;
    }

    // 3. master4 joins through master2 with the cluster secret; nothing else changes.
    let cfg = master_config(
        r,
        "master4",
        ip(MASTER_IPS[3]),
        ports(),
        &[cluster_addr(1)],
        &secret,
    )
    .unwrap();
    let m4 = MasterHandle::start("master4", cfg).await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "saltgate marks master4 up",
        || async {
            Ok(master_states(admin)
                .await?
                .get("master4")
                .is_some_and(|s| s == "up"))
        },
    )
    .await
    .unwrap();
    all_answer(&m4, &ids, "joined", Duration::from_secs(120)).await;

    // Kill master2: its minions reconnect through saltgate, which puts new sessions on the
    // member with the fewest (master4), and all five answer through master3 and master4.
    let victim = masters.remove(0);
    victim.kill().await;
    wait_until(
        Duration::from_secs(120),
        "minions re-established on the surviving members, some on master4",
        || async {
            let s = publish_sessions(admin).await?;
            let total: usize = s.values().map(Vec::len).sum();
            Ok(s.get("master2").is_none_or(Vec::is_empty)
                && total >= MINIONS
                && s.get("master4").is_some_and(|v| !v.is_empty()))
        },
    )
    .await
    .unwrap();
    all_answer(&m4, &ids, "after-second-kill-m4", Duration::from_secs(120)).await;
    all_answer(
        &masters[0],
        &ids,
        "after-second-kill-m3",
        Duration::from_secs(120),
    )
    .await;
}
