//! Fast, still safe, health checks against a real libzmq master process (pyzmq from the Salt
//! venv: a PUB on the publish port, a ROUTER on the request port answering Salt's clear `ping`),
//! with saltgate's default check schedule and the Salt probe:
//! - SIGSTOPped (the kernel still completes TCP handshakes from the listen backlog, nothing
//!   greets): DOWN within 5 s; SIGCONTed: UP again within `rise x downinter + 2 s`;
//! - busy (the ZMTP handshake comes at once from libzmq's I/O thread, the ping's answer seconds
//!   later): never DOWN;
//! - killed, then restarted on the same ports but stopped half-way for a while: UP within
//!   `rise x downinter + 2 s` of the moment it can answer.
//!
//! Addresses: 127.13.0.0/16.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use saltgate_config::{HealthSettings, MasterConfig, Probe, Role};
use saltgate_proxy::{start, Options, Running};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The fake master: binds PUB and ROUTER on the given ports (0: any), prints `PORTS pub req`,
/// then answers every ping with the echoed load after `delay` seconds (the busy worker: the main
/// thread sleeps, libzmq's I/O thread still handshakes), printing `ANSWERED n` after each.
const PYZMQ_MASTER: &str = r#"
import sys, time, zmq, msgpack
ip, pub_port, req_port, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
router = ctx.socket(zmq.ROUTER)
for s, p in ((pub, pub_port), (router, req_port)):
    s.setsockopt(zmq.LINGER, 0)
    if p:
        s.bind(f"tcp://{ip}:{p}")
    else:
        s.bind_to_random_port(f"tcp://{ip}")
def port(s):
    return s.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
print(f"PORTS {port(pub)} {port(router)}", flush=True)
n = 0
while True:
    frames = router.recv_multipart()
    req = msgpack.unpackb(frames[-1], raw=False)
    if delay:
        time.sleep(delay)
    router.send_multipart(frames[:-1] + [msgpack.packb(req["load"])])
    n += 1
    print(f"ANSWERED {n}", flush=True)
"#;

const IP: &str = "127.13.0.1";

/// pyzmq (libzmq 4.3, what Salt runs on): `$SALTGATE_VENV/bin/python`.
fn venv_python() -> std::path::PathBuf {
    let venv = std::env::var_os("SALTGATE_VENV").unwrap_or_else(|| {
        panic!("SALTGATE_VENV is not set: run ./scripts/test.sh (it exports the Salt 3008.5 venv with pyzmq)")
    });
    let py = std::path::PathBuf::from(venv).join("bin/python");
    assert!(
        py.exists(),
        "{} missing: run ./scripts/test.sh",
        py.display()
    );
    py
}

struct PyMaster {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
    publish: SocketAddr,
    request: SocketAddr,
}

impl PyMaster {
    async fn start(ip: &str, ports: (u16, u16), delay_s: f64) -> PyMaster {
        let mut child = Command::new(venv_python())
            .arg("-c")
            .arg(PYZMQ_MASTER)
            .arg(ip)
            .arg(ports.0.to_string())
            .arg(ports.1.to_string())
            .arg(delay_s.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python starts");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
            .await
            .expect("the fake master binds within 20 s")
            .unwrap()
            .expect("the fake master prints its ports");
        let p: Vec<u16> = line
            .strip_prefix("PORTS ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .split(' ')
            .map(|p| p.parse().unwrap())
            .collect();
        PyMaster {
            child,
            out,
            publish: format!("{ip}:{}", p[0]).parse().unwrap(),
            request: format!("{ip}:{}", p[1]).parse().unwrap(),
        }
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.id().expect("the fake master runs") as i32;
        // SAFETY: kill(2) on the PID of a child this test spawned and still owns.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// The next `ANSWERED n` line's n.
    async fn answered(&mut self) -> u64 {
        let line = tokio::time::timeout(Duration::from_secs(30), self.out.next_line())
            .await
            .expect("a ping answered within 30 s")
            .unwrap()
            .expect("the fake master runs");
        line.strip_prefix("ANSWERED ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
    }
}

async fn run_with(m: &PyMaster) -> (Running, tokio::sync::oneshot::Sender<()>) {
    let health = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let master = MasterConfig {
        name: "py".into(),
        host: m.publish.ip().to_string(),
        publish_port: m.publish.port(),
        request_port: m.request.port(),
        weight: 1,
        maxconn: None,
        backup: false,
        disabled: false,
        check: true,
        health,
    };
    let cfg = config_on(IP, vec![master], health);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let r = start(cfg, Options::default(), async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    (r, tx)
}

/// Waits (polling every 10 ms, up to `limit`) until `cond`; returns how long it took.
async fn took_until(what: &str, limit: Duration, cond: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

/// Both ports passed a check (not merely presumed UP).
fn checked_up(r: &Running) -> bool {
    let m = r.master("py").unwrap();
    m.is_up() && m.last_check(Role::Publish).ok && m.last_check(Role::Request).ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_master_is_down_within_5_s_and_up_again_soon_after_sigcont() {
    let h = HealthSettings::default();
    let py = PyMaster::start(IP, (0, 0), 0.0).await;
    let (r, _stop) = run_with(&py).await;
    took_until("UP at start", Duration::from_secs(10), || checked_up(&r)).await;
    let m = r.master("py").unwrap();

    py.signal(libc::SIGSTOP);
    let down = took_until("DOWN after SIGSTOP", Duration::from_secs(10), || !m.is_up()).await;
    let detail = [Role::Publish, Role::Request]
        .map(|role| m.last_check(role).detail)
        .join(" / ");
    assert!(
        detail.contains("no ZMTP handshake"),
        "the reason names the stopped handshake: {detail}"
    );
    assert!(
        down <= Duration::from_secs(5),
        "a SIGSTOPped master must be DOWN within 5 s, took {down:?}"
    );

    py.signal(libc::SIGCONT);
    let bound = h.downinter * h.rise + Duration::from_secs(2);
    let up = took_until("UP after SIGCONT", Duration::from_secs(20), || {
        checked_up(&r)
    })
    .await;
    assert!(
        up <= bound,
        "UP {up:?} after SIGCONT, bound rise x downinter + 2 s = {bound:?}"
    );
    eprintln!("SIGSTOP -> DOWN {down:?}; SIGCONT -> UP {up:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_master_that_greets_at_once_but_pings_slowly_is_never_down() {
    let h = HealthSettings::default();
    // Every ping answered 3 s late (the timeout is 5 s), the handshake at once.
    let mut py = PyMaster::start(IP, (0, 0), 3.0).await;
    assert!(Duration::from_secs(3) < h.timeout && h.handshake_timeout < Duration::from_secs(3));
    let (r, _stop) = run_with(&py).await;
    let m = r.master("py").unwrap();
    // Five slow answers (about 15 s of a busy master, checked throughout): UP at every one.
    for n in 1..=5 {
        assert_eq!(py.answered().await, n);
        assert!(
            m.is_up(),
            "DOWN after {n} slow answer(s): {:?}",
            m.last_check(Role::Request)
        );
        assert!(m.port_is_up(Role::Request) && m.port_is_up(Role::Publish));
    }
    let last = m.last_check(Role::Request);
    assert!(last.ok && last.duration_ms >= 2900, "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_is_up_within_rise_downinters_of_answering_even_after_a_stalled_start() {
    let h = HealthSettings::default();
    let py = PyMaster::start(IP, (0, 0), 0.0).await;
    let ports = (py.publish.port(), py.request.port());
    let (r, _stop) = run_with(&py).await;
    took_until("UP at start", Duration::from_secs(10), || checked_up(&r)).await;
    let m = r.master("py").unwrap();
    drop(py); // killed (kill_on_drop): connects refused
    took_until("DOWN after the kill", Duration::from_secs(10), || {
        !m.is_up()
    })
    .await;
    // Restarted on the same ports, but stalled half-way (bound, not answering) for 3 s: the checks
    // meanwhile hang until their handshake deadline, not the 5 s timeout.
    let py = PyMaster::start(IP, ports, 0.0).await;
    py.signal(libc::SIGSTOP);
    // Checks reach the stalled process (no longer refused) and give up at the handshake deadline.
    took_until(
        "both ports' checks to reach the stalled restart",
        Duration::from_secs(10),
        || {
            [Role::Publish, Role::Request]
                .iter()
                .all(|&role| m.last_check(role).detail.contains("no ZMTP handshake"))
        },
    )
    .await;
    assert!(!m.is_up());
    py.signal(libc::SIGCONT);
    let bound = h.downinter * h.rise + Duration::from_secs(2);
    let up = took_until("UP after the restart", Duration::from_secs(20), || {
        checked_up(&r)
    })
    .await;
    assert!(
        up <= bound,
        "UP {up:?} after the master could answer, bound rise x downinter + 2 s = {bound:?}"
    );
    eprintln!("restart: answering -> UP {up:?}");
}
