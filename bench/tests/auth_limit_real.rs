//! `listeners.request.auth_limit` against a real salt-master 3008.5 (issue 25): a burst of 500
//! swarm minions (`--shared-key`, started at 1,000/s, Salt's `_auth` timing: `auth_timeout` 5 s,
//! `auth_tries` 7) through saltgate with `max_in_flight: 3`; every one authenticates, saltgate
//! admitted each `_auth` through the gate, never had more than 3 at the master (the gauge and
//! the limit), and never marked the master DOWN. Addresses 127.31.1.x. Heavy: run it under
//! `flock /tmp/heavy.lock`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use saltgate_bench::lab::{http_get, master_states, wait_until};
use saltgate_bench::scenarios::saltmaster::SaltMaster;
use saltgate_config::salt_minion::MasterAddr;
use saltgate_minion::link::Stats;
use saltgate_minion::swarm::{run_swarm_with, SwarmOptions};

const GATE: &str = "127.31.1.1";
const MASTER: &str = "127.31.1.11";
const N: usize = 500;
const LIMIT: u32 = 3;

fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_minions_authenticate_behind_a_small_max_in_flight() {
    let venv = saltgate_test_support::venv();
    let ip: IpAddr = MASTER.parse().unwrap();
    let master = SaltMaster::start(&venv, ip).await.expect("salt-master");
    let publish_port = {
        let text = std::fs::read_to_string(master.conf_dir.join("master")).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("publish_port: ")?.trim().parse::<u16>().ok())
            .unwrap()
    };
    let text = format!(
        "health:\n  interval: 1s\n  timeout: 5s\n  rise: 1\n  fall: 2\n  probe: salt\n\
         masters:\n  - name: m\n    host: {MASTER}\n    publish_port: {publish_port}\n    request_port: {}\n\
         listeners:\n  publish:\n    bind: \"{GATE}:1\"\n  request:\n    bind: \"{GATE}:2\"\n    \
         auth_limit:\n      max_in_flight: {LIMIT}\n      max_wait: 5s\n\
         admin:\n  enabled: true\n  bind: \"{GATE}:3\"\n",
        master.ret.port()
    );
    let mut config = saltgate_config::parse(&text, None, saltgate_config::Format::Yaml)
        .expect("config")
        .config;
    let any = |_| SocketAddr::new(GATE.parse().unwrap(), 0);
    config.publish.bind = vec![any(())];
    config.request.bind = vec![any(())];
    config.admin.bind = any(());
    let (stop_gate, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = saltgate_proxy::start(config, Default::default(), async move {
        let _ = stopped.await;
    })
    .await
    .expect("saltgate");
    let request = running.local_addrs(saltgate_config::Role::Request)[0];
    let publish = running.local_addrs(saltgate_config::Role::Publish)[0];
    let admin = running.admin_addr().unwrap();
    wait_until(Duration::from_secs(30), "master UP", || async {
        Ok(master_states(admin).await?.get("m").map(String::as_str) == Some("up"))
    })
    .await
    .unwrap();

    let pki = tempfile::Builder::new()
        .prefix("sgauth")
        .tempdir_in("/tmp")
        .unwrap();
    let (stop_swarm, stop_rx) = tokio::sync::watch::channel(false);
    let stats = std::sync::Arc::new(Stats::default());
    let swarm = tokio::spawn(run_swarm_with(
        SwarmOptions {
            count: N,
            master: MasterAddr {
                host: GATE.into(),
                port: request.port(),
            },
            id_prefix: "al-".into(),
            id_start: 0,
            pki_dir: pki.path().to_path_buf(),
            shared_key: true,
            report_every: Duration::from_secs(5),
            json: true,
            duration: Some(Duration::from_secs(600)),
            start_rate: 1000,
            acceptance_wait_time: Duration::from_secs(10),
            publish_port: Some(publish.port()),
            pillar: false,
            transport: Default::default(),
        },
        stop_rx,
        stats.clone(),
    ));
    // Every minion that authenticated holds a publish session through saltgate; meanwhile the
    // gate never lets more than LIMIT `_auth` reach the master, and the master stays UP.
    let mut most_in_flight = 0.0f64;
    let mut downs = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let m = http_get(admin, "/metrics").await.unwrap();
        most_in_flight = most_in_flight.max(metric(&m, "saltgate_auth_in_flight", "master=\"m\""));
        if master_states(admin)
            .await
            .unwrap()
            .get("m")
            .map(String::as_str)
            != Some("up")
        {
            downs += 1;
        }
        let live = metric(
            &m,
            "saltgate_listener_sessions_current",
            "listener=\"publish\"",
        );
        // Each minion sends its start event once authenticated and subscribed: stop the swarm
        // only when every one has sent it.
        let started = stats
            .start_events
            .load(std::sync::atomic::Ordering::Relaxed);
        if live >= N as f64 && started >= N as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all authenticated within 300 s: {live} publish sessions, {started} start events"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_swarm.send(true).unwrap();
    let summary = swarm.await.unwrap().expect("swarm summary");
    let m = http_get(admin, "/metrics").await.unwrap();
    eprintln!(
        "summary: {summary}\n_auth admitted {} dropped {}",
        metric(&m, "saltgate_auth_admitted_total", "master=\"m\""),
        metric(&m, "saltgate_auth_dropped_total", "master=\"m\"")
    );
    // Each minion sends its start event once authenticated (`authenticated` itself counts links
    // still up, and falls as the swarm stops).
    assert!(
        summary["start_events"].as_u64().unwrap_or(0) >= N as u64,
        "{summary}"
    );
    assert!(metric(&m, "saltgate_auth_admitted_total", "master=\"m\"") >= N as f64);
    assert!(most_in_flight <= LIMIT as f64, "{most_in_flight}");
    assert_eq!(
        metric(&m, "saltgate_auth_limit", "master=\"m\""),
        LIMIT as f64
    );
    assert_eq!(downs, 0, "the master was never marked DOWN");
    let _ = stop_gate.send(());
    master.stop().await;
}
