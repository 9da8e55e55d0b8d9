//! Issue 12 item 1, the probers' reserve: while a flood holds every descriptor saltgate may open,
//! health checks still run (on a few descriptors held back for them), so a master that really dies
//! during the exhaustion is marked DOWN, and a healthy one is not; the shortage is logged per
//! episode, not once per check. The saltgate binary under `ulimit -n 48`. Addresses 127.23.4.x.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");
const IP: &str = "127.23.4.1";

/// Kills the child (by its PID) when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

async fn wait_log(log: &Path, what: &str, n: usize, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let t = text(log);
        if t.matches(what).count() >= n {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {n} × {what:?} in the log:\n{t}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_dying_while_descriptors_are_exhausted_is_still_found_down() {
    let a = (
        FakeMaster::start("a", "127.23.4.2", Behaviour::Echo).await,
        FakeMaster::start("a", "127.23.4.2", Behaviour::Echo).await,
    );
    let b = (
        FakeMaster::start("b", "127.23.4.3", Behaviour::Echo).await,
        FakeMaster::start("b", "127.23.4.3", Behaviour::Echo).await,
    );
    let request = SocketAddr::new(IP.parse().unwrap(), free_port(IP));
    let publish = SocketAddr::new(IP.parse().unwrap(), free_port(IP));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    let log = dir.path().join("saltgate.log");
    let mut yaml = String::from(
        "global:\n  raise_nofile: false\nhealth:\n  interval: 50ms\n  fall: 2\n  rise: 2\n  timeout: 1s\nmasters:\n",
    );
    for (name, (p, r)) in [("a", &a), ("b", &b)] {
        yaml += &format!(
            "  - name: {name}\n    host: {}\n    publish_port: {}\n    request_port: {}\n",
            p.addr.ip(),
            p.addr.port(),
            r.addr.port()
        );
    }
    yaml +=
        &format!("listeners:\n  publish:\n    bind: {publish}\n  request:\n    bind: {request}\n");
    std::fs::write(&path, yaml).unwrap();
    let _child = Child(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n 48 && exec {BIN} --log-level info,saltgate_proxy::check=debug run --probe tcp --admin-bind off --config {} >{} 2>&1",
                path.display(),
                log.display()
            ))
            .spawn()
            .unwrap(),
    );
    let t = Duration::from_secs(20);
    wait_log(&log, "configuration in force", 1, t).await;
    // Silent clients take every descriptor saltgate has (each session also holds one upstream).
    let mut held = Vec::new();
    for _ in 0..60 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(request),
        )
        .await
        {
            held.push(s);
        }
    }
    wait_log(&log, "out of local resources (descriptors", 1, t).await;
    // b dies while the flood holds on: its checks still run, and fail.
    b.0.stop();
    b.1.stop();
    let found = wait_log(&log, "marked DOWN", 1, t).await;
    let down: Vec<&str> = found
        .lines()
        .filter(|l| l.contains("marked DOWN"))
        .collect();
    assert!(
        down.iter().all(|l| l.contains("master=b")),
        "only b is DOWN: {down:#?}"
    );
    // Still exhausted (the flood holds on), a dozen more check rounds: a stays UP, and the episode
    // was logged once.
    let t0 = tokio::time::Instant::now();
    wait_log(&log, "met the local resource shortage", 24, t).await;
    let now = text(&log);
    assert!(
        !now.lines()
            .any(|l| l.contains("marked DOWN") && l.contains("master=a")),
        "a healthy master was marked DOWN:\n{now}"
    );
    let episodes = now.matches("out of local resources (descriptors").count();
    let met = now.matches("met the local resource shortage").count();
    assert!(
        episodes * 4 <= met,
        "{episodes} episode lines for {met} checks that met the shortage in {:?}:\n{now}",
        t0.elapsed()
    );
    drop(held);
}
