//! Issue 12 item 5, end to end: saltgate starts with a master whose host does not resolve yet (a
//! resolver the test controls, injected through `Options::lookup`): the master is `unresolved`,
//! its lookup is retried with back-off (seen in the metrics), the other master serves; once the
//! name resolves, the master comes UP and takes sessions without any reload by the operator.
//! Addresses: 127.12.3.x.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::api::{addr, json, run_with, scrape, value};
use common::*;
use saltgate_config::{HealthSettings, MasterConfig, Probe, Role};
use saltgate_proxy::master::MasterState;
use saltgate_proxy::serve::BoxFuture;
use saltgate_proxy::Options;

const IP: &str = "127.12.3.1";
/// The name the test's resolver answers for only once told to.
const LATE: &str = "late-master.saltgate.test";
/// Where it resolves to.
const LATE_IP: &str = "127.12.3.3";

static RESOLVES: AtomicBool = AtomicBool::new(false);
/// When each lookup of [`LATE`] happened.
static LOOKUPS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// The test's resolver: [`LATE`] fails until [`RESOLVES`] is set; IP literals resolve as such.
fn lookup(host: String) -> BoxFuture<Result<SocketAddr, String>> {
    Box::pin(async move {
        if host == LATE {
            LOOKUPS.lock().unwrap().push(Instant::now());
            return if RESOLVES.load(Ordering::SeqCst) {
                Ok(SocketAddr::new(LATE_IP.parse().unwrap(), 0))
            } else {
                Err("Name or service not known (test resolver)".into())
            };
        }
        host.parse()
            .map(|ip| SocketAddr::new(ip, 0))
            .map_err(|_| format!("{host}: not an IP address (test resolver)"))
    })
}

fn master(name: &str, host: &str, p: u16, r: u16, health: HealthSettings) -> MasterConfig {
    MasterConfig {
        name: name.into(),
        host: host.into(),
        publish_port: p,
        request_port: r,
        weight: 1,
        maxconn: None,
        backup: false,
        disabled: false,
        check: true,
        health,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_master_is_retried_with_back_off_and_serves_once_it_resolves() {
    let health = HealthSettings {
        interval: Duration::from_millis(100),
        fastinter: Duration::from_millis(20),
        downinter: Duration::from_millis(20),
        rise: 1,
        fall: 2,
        timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(500),
        probe: Probe::Tcp,
    };
    let ap = FakeMaster::start("a", "127.12.3.2", Behaviour::Echo).await;
    let ar = FakeMaster::start("a", "127.12.3.2", Behaviour::Echo).await;
    let lp = FakeMaster::start("late", LATE_IP, Behaviour::Echo).await;
    let lr = FakeMaster::start("late", LATE_IP, Behaviour::Echo).await;
    let cfg = config_on(
        IP,
        vec![
            master("a", "127.12.3.2", ap.addr.port(), ar.addr.port(), health),
            master("late", LATE, lp.addr.port(), lr.addr.port(), health),
        ],
        health,
    );
    let (r, _stop) = run_with(
        cfg,
        Options {
            prober: std::sync::Arc::new(saltgate_proxy::check::SaltProbes),
            lookup,
            ..Default::default()
        },
    )
    .await;
    let admin = r.admin_addr().unwrap();
    let generation = r.generation();

    // Unresolved: DOWN, never selected, in the API; the other master serves.
    assert_eq!(r.master("late").unwrap().state(), MasterState::Unresolved);
    let (_, v) = json(admin, "GET", "/api/v1/masters", None).await;
    let late = v["masters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "late")
        .cloned()
        .unwrap();
    assert_eq!(late["state"], "unresolved", "{late}");
    assert!(
        late["request"]["last_check"]["detail"]
            .as_str()
            .unwrap()
            .contains("test resolver"),
        "{late}"
    );
    for _ in 0..3 {
        assert_eq!(connect(addr(&r, Role::Request)).await.1, "a");
    }

    // Retried with back-off: the waits between lookups double (100 ms, 200 ms, 400 ms, ...).
    wait_for("four lookups of the late master", || {
        LOOKUPS.lock().unwrap().len() >= 4
    })
    .await;
    let at = LOOKUPS.lock().unwrap().clone();
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // Lower bounds only (a loaded host stretches waits, never shortens them): without the
    // back-off every gap would be about 100 ms.
    for (i, gap) in gaps.iter().take(3).enumerate() {
        let floor = Duration::from_millis(90) * (1 << i);
        assert!(
            *gap >= floor,
            "wait {i} is {gap:?}, under {floor:?}: {gaps:?}"
        );
    }
    let s = scrape(admin).await;
    assert!(
        value(
            &s,
            "saltgate_master_resolve_failures_total",
            &[("master", "late")]
        ) >= 2.0
    );
    assert_eq!(
        value(
            &s,
            "saltgate_master_state",
            &[("master", "late"), ("state", "unresolved")]
        ),
        1.0
    );

    // The name resolves: the master is put in force by the retry loop, comes UP by its checks
    // and takes sessions. Nobody reloaded.
    RESOLVES.store(true, Ordering::SeqCst);
    wait_for("late UP", || {
        r.master("late")
            .is_some_and(|m| m.state() == MasterState::Up)
    })
    .await;
    assert!(
        r.generation() > generation,
        "the configuration in force was applied again"
    );
    let mut names = Vec::new();
    for _ in 0..4 {
        let (mut s, name) = connect(addr(&r, Role::Request)).await;
        assert_eq!(echo(&mut s, b"ping").await, b"ping");
        names.push(name);
    }
    assert!(names.iter().any(|n| n == "late"), "{names:?}");
    assert!(names.iter().any(|n| n == "a"), "{names:?}");
    assert!(lr.accepted.load(Ordering::SeqCst) >= 1);
    let s = scrape(admin).await;
    assert_eq!(
        value(
            &s,
            "saltgate_master_state",
            &[("master", "late"), ("state", "up")]
        ),
        1.0
    );
}
