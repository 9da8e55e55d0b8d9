//! Presence on Salt's `ws` transport with real Salt 3008.5 (issue 27): a stock `salt-master` on
//! `transport: ws` behind saltgate (L4, `transport: ws`, its default Salt-aware probe), and a
//! stock `salt-minion` on `transport: ws` that knows only saltgate's address:
//! - the minion answers `test.ping` through saltgate (its websockets on both ports);
//! - `/api/v1/minions` lists it by id, with that master on both ports: the `ws` peek read the id
//!   from its `_auth` (and from the `aes` requests, each on a websocket of its own: Salt 3008.5's
//!   `RequestClient` dials one per request);
//! - SIGSTOP every process of the master: DOWN within 5 s (the probe's upgrade stage); SIGCONT: UP
//!   again; the master's log holds no parsing traceback from the probes.
//!
//! Needs the Salt venv (`SALTGATE_VENV` or test-support's setup; `aiohttp`, which Salt's `ws`
//! transport is built on, is one of Salt 3008.5's own requirements). Addresses: 127.37.0.0/24.
//! Run under `flock /tmp/heavy.lock`.

mod common;

use std::time::{Duration, Instant};

use common::api::{json, listed_by_address, run_with, scrape, value};
use common::salt_real::{
    kept_dir, minion_answers, real_master, salt_aware, stopped_down_and_resumed, tail,
};
use common::*;
use saltgate_config::transport::SaltTransport;
use saltgate_config::Role;
use saltgate_proxy::Options;
use saltgate_test_support::{
    start_salt_master, start_salt_minion, write_master_config, write_minion_config,
};

const MASTER_IP: &str = "127.37.0.10";
const PROXY_IP: &str = "127.37.0.11";
const MASTER: &str = "ws-master";
const MINION: &str = "ws-minion.example";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_ws_minion_through_saltgate_is_listed_by_id_with_its_master() {
    let (dir, keep) = kept_dir("sg-ws");
    let d = dir.path();
    let master_log = d.join(MASTER).join("master.log");
    let minion_log = d.join(MINION).join("minion.log");

    let master_conf = write_master_config(d, MASTER, MASTER_IP, "transport: ws\n");
    let master = start_salt_master(&master_conf, &d.join("master.stderr"));

    // saltgate: transport ws, the default Salt-aware probe and schedule.
    let health = salt_aware();
    let mut cfg = config_on(
        PROXY_IP,
        vec![real_master("real", MASTER_IP, health)],
        health,
    );
    cfg.global.transport = SaltTransport::Ws;
    cfg.publish.bind = vec![format!("{PROXY_IP}:4505").parse().unwrap()];
    cfg.request.bind = vec![format!("{PROXY_IP}:4506").parse().unwrap()];
    let (r, _stop) = run_with(cfg, Options::default()).await;
    let m = r.master("real").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    // (A master is UP before its first checks: wait for a passed check.)
    while !(m.is_up() && m.last_check(Role::Request).ok) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ws master never came UP: {:?}\n{}\n{}",
            m.last_check(Role::Request),
            tail(&d.join("master.stderr")),
            tail(&master_log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A stock minion on transport ws, knowing only saltgate's address.
    let minion_conf = write_minion_config(d, MINION, PROXY_IP, 4506, 4505);
    let mut conf = std::fs::read_to_string(minion_conf.join("minion")).unwrap();
    conf.push_str("transport: ws\n");
    std::fs::write(minion_conf.join("minion"), conf).unwrap();
    let _minion = start_salt_minion(&minion_conf, &d.join("minion.stderr"));
    let t0 = Instant::now();
    {
        let (master_conf, logs) = (
            master_conf.clone(),
            [minion_log.clone(), master_log.clone()],
        );
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(150);
            minion_answers(&master_conf, MINION, deadline, &logs)
        })
        .await
        .unwrap();
    }
    let answered = t0.elapsed();

    // Listed by the id its ws requests carry, with the master on both ports, connected.
    let admin = r.admin_addr().unwrap();
    let listed = listed_by_address(
        admin,
        MINION,
        "real",
        Duration::from_secs(30),
        "the ws minion is not listed with its publish master",
        || format!("--- minion\n{}", tail(&minion_log)),
    )
    .await;
    assert_eq!(
        listed_total(admin).await,
        1,
        "one minion, under its own id only"
    );

    let s = scrape(admin).await;
    let result = |r: &str| value(&s, "saltgate_presence_inspections_total", &[("result", r)]);
    let (auth, aes) = (result("auth"), result("aes"));
    assert!(auth >= 1.0, "the ws _auth was not read: {auth}");
    // test.ping's return is an `aes` request (`_return`) on a websocket of its own.
    assert!(aes >= 1.0, "no ws aes request was read: {aes}");
    for bad in ["framing", "malformed", "over-budget", "bad-id", "encrypted"] {
        assert_eq!(result(bad), 0.0, "a real ws request session gave {bad}");
    }
    let sessions = |l: &str, n: &str| value(&s, n, &[("listener", l)]);
    eprintln!(
        "ws presence: test.ping answered {answered:?} after the minion started; {listed}\n\
         request sessions: {} accepted, {} open now; read: auth {auth}, aes {aes}, ended {}",
        sessions("request", "saltgate_listener_sessions_total"),
        sessions("request", "saltgate_listener_sessions_current"),
        result("ended"),
    );

    // SIGSTOP every process of the master: DOWN within 5 s (the probe's websocket upgrade
    // stage); SIGCONT: UP again; no parsing traceback in its log.
    stopped_down_and_resumed(
        &master,
        &m,
        "ws",
        &[master_log.clone(), d.join("master.stderr")],
    )
    .await;
    drop(keep);
}

/// How many minions presence lists.
async fn listed_total(admin: std::net::SocketAddr) -> u64 {
    let (_, v) = json(admin, "GET", "/api/v1/minions", None).await;
    v["total"].as_u64().unwrap_or(u64::MAX)
}
