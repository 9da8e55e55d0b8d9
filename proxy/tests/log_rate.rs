//! Issue 12 item 9: per-connection log lines are summarised per interval with counts, end to end
//! through the saltgate binary's log. A storm of clients against a master that refuses connects
//! (it used to log one warning per client: 380 in 3 s) and against a listener with no master
//! available (one info line per refused client) gives at most one line per 5 s each; the lines
//! after the first carry `left_out`, and the lines plus what they left out account for every
//! failure the metrics count. Addresses 127.23.1.x.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::api::{json, scrape, value};
use common::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");
const IP: &str = "127.23.1.1";
/// Clients in each storm.
const STORM: usize = 120;

/// Kills the child (by its PID) when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The log's JSON lines whose message starts with `what`.
fn lines(log: &Path, what: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|j| j["message"].as_str().is_some_and(|m| m.starts_with(what)))
        .collect()
}

async fn wait_lines(log: &Path, what: &str, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let l = lines(log, what);
        if l.len() >= n {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} × {what:?} in the log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One client: connects and waits for saltgate to close it (it is refused).
async fn refused_client(to: SocketAddr) {
    let mut s = TcpStream::connect(to).await.expect("connects");
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(T, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => continue,
            Err(_) => panic!("a refused client was not closed within {T:?}"),
        }
    }
}

/// `n` refused clients at once; returns how long the storm took.
async fn storm(to: SocketAddr, n: usize) -> Duration {
    let t0 = Instant::now();
    let all: Vec<_> = (0..n).map(|_| tokio::spawn(refused_client(to))).collect();
    for c in all {
        c.await.unwrap();
    }
    t0.elapsed()
}

/// Lines allowed for a storm that lasted `took`: one per started 5 s interval, plus one.
fn allowed(took: Duration) -> usize {
    2 + (took.as_secs() / 5) as usize
}

/// After a storm of `n` events logged as `what`: few lines; then, once the interval has passed,
/// more events until a later line says how many were left out; every event is accounted for
/// (lines + left_out == the metric's count). `more` makes one more event.
async fn summarised<F: std::future::Future<Output = ()>>(
    log: &Path,
    what: &str,
    n: usize,
    took: Duration,
    admin: SocketAddr,
    metric: (&str, &[(&str, &str)]),
    mut more: impl FnMut() -> F,
) {
    let after_storm = lines(log, what);
    assert!(
        !after_storm.is_empty() && after_storm.len() <= allowed(took),
        "{} lines {what:?} for {n} events in {took:?}",
        after_storm.len()
    );
    let first = after_storm.len();
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(log, what).len() == first {
        assert!(Instant::now() < deadline, "no later line {what:?}");
        more().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = wait_lines(log, what, first + 1).await;
    let left_out: Vec<u64> = got
        .iter()
        .map(|j| {
            j["left_out"]
                .as_u64()
                .unwrap_or_else(|| panic!("a line without left_out: {j}"))
        })
        .collect();
    assert!(
        left_out[first] as usize + first >= n,
        "the line after the storm leaves out {} of {n} events: {left_out:?}",
        left_out[first]
    );
    let s = scrape(admin).await;
    let counted = value(&s, metric.0, metric.1);
    // Events after the last line are counted but not logged yet: at most the ones made since.
    let logged = (got.len() as u64 + left_out.iter().sum::<u64>()) as f64;
    assert!(
        logged <= counted && counted - logged < 30.0,
        "{what:?}: {logged} events in the log (lines + left_out) for {counted} counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_and_refused_clients_are_summarised_per_interval() {
    // A master whose ports refuse connects (bound a moment ago, closed), never health-checked,
    // so it stays selectable and every client's connect fails.
    let closed = || {
        std::net::TcpListener::bind("127.23.1.2:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (mp, mr) = (closed(), closed());
    let (publish, request, admin) = (
        SocketAddr::new(IP.parse().unwrap(), free_port(IP)),
        SocketAddr::new(IP.parse().unwrap(), free_port(IP)),
        SocketAddr::new(IP.parse().unwrap(), free_port(IP)),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    let log = dir.path().join("saltgate.log");
    std::fs::write(
        &path,
        format!(
            "global:\n  raise_nofile: false\nmasters:\n  - name: a\n    host: 127.23.1.2\n\
             \x20   publish_port: {mp}\n    request_port: {mr}\n    check: false\n\
             listeners:\n  publish:\n    bind: {publish}\n    retries: 0\n\
             \x20 request:\n    bind: {request}\n    retries: 0\nadmin:\n  bind: {admin}\n"
        ),
    )
    .unwrap();
    let _child = Child(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec {BIN} --log-format json run --config {} >{} 2>&1",
                path.display(),
                log.display()
            ))
            .spawn()
            .unwrap(),
    );
    wait_lines(&log, "configuration in force", 1).await;

    // 1. Every client's connect to the master fails.
    const FAILED: &str = "connect to master failed";
    let took = storm(request, STORM).await;
    summarised(
        &log,
        FAILED,
        STORM,
        took,
        admin,
        (
            "saltgate_master_connect_errors_total",
            &[("master", "a"), ("port", "request")],
        ),
        || refused_client(request),
    )
    .await;

    // 2. No master available: every client is refused.
    const NO_MASTER: &str = "no master available";
    let (code, v) = json(admin, "POST", "/api/v1/masters/a/disable", None).await;
    assert_eq!(code, 200, "{v}");
    let took = storm(publish, STORM).await;
    summarised(
        &log,
        NO_MASTER,
        STORM,
        took,
        admin,
        (
            "saltgate_listener_sessions_refused_total",
            &[("listener", "publish"), ("reason", "no-master")],
        ),
        || refused_client(publish),
    )
    .await;
}
