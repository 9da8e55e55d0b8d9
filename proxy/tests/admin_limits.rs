//! Issue 12 items 2 and 4, the parts the other tests leave out (without a token, the header
//! deadline is `UNAUTHENTICATED_HEADER_TIMEOUT`, issue 31 item 5): a client trickling its request
//! headers a byte at a time (slowloris) and an idle kept-alive connection are closed at the header
//! timeout, not kept; an admin API exposed beyond loopback without a token is refused by
//! `check-config` too, and with `admin.allow_unauthenticated: true` it is accepted with a warning
//! from `check-config` and from `run` at start. Nothing binds beyond loopback: the exposed address
//! is TEST-NET-1 (192.0.2.1), never local, so `run` warns and then fails to bind. Addresses
//! 127.23.3.x.

mod common;

use std::time::{Duration, Instant};

use common::api::*;
use common::*;
use saltgate_config::{HealthSettings, MasterConfig, Probe};
use saltgate_proxy::admin::UNAUTHENTICATED_HEADER_TIMEOUT as HEADER_READ_TIMEOUT;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IP: &str = "127.23.3.1";
const BIN: &str = env!("CARGO_BIN_EXE_saltgate");

async fn admin() -> (saltgate_proxy::Running, tokio::sync::oneshot::Sender<()>) {
    admin_with(saltgate_config::AdminLimits::default()).await
}

async fn admin_with(
    limits: saltgate_config::AdminLimits,
) -> (saltgate_proxy::Running, tokio::sync::oneshot::Sender<()>) {
    let health = HealthSettings {
        interval: Duration::from_secs(1),
        fastinter: Duration::from_secs(1),
        downinter: Duration::from_secs(1),
        rise: 1,
        fall: 1,
        timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(500),
        probe: Probe::Tcp,
    };
    // Only the admin API matters here: one master, never checked nor connected to.
    let master = MasterConfig {
        name: "a".into(),
        host: "127.23.3.2".into(),
        publish_port: 4505,
        request_port: 4506,
        weight: 1,
        maxconn: None,
        backup: false,
        disabled: false,
        check: false,
        health,
    };
    let mut cfg = config_on(IP, vec![master], health);
    cfg.admin.limits = limits;
    let (r, stop, _p) = run(cfg).await;
    (r, stop)
}

/// Reads until the peer closes (EOF or reset), or `within` passes; true when closed.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut b = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // a response (such as 408) before the close
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_closed_at_the_header_timeout() {
    let (r, _stop) = admin().await;
    let mut s = TcpStream::connect(r.admin_addr().unwrap()).await.unwrap();
    let t0 = Instant::now();
    let request = b"GET /healthz HTTP/1.1\r\nHost: saltgate\r\nX-Slow: ".repeat(4);
    // One byte every 300 ms: each read makes progress, the request never completes.
    let mut closed = false;
    for &b in request.iter() {
        if s.write_all(&[b]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(_)) => {
                // A 408 answer: the close follows.
                closed = closed_within(&mut s, Duration::from_secs(2)).await;
                break;
            }
            Err(_) => {}
        }
        assert!(
            t0.elapsed() < HEADER_READ_TIMEOUT + Duration::from_secs(3),
            "a trickling client kept for {:?}",
            t0.elapsed()
        );
    }
    assert!(closed, "the trickling client was never closed");
    let took = t0.elapsed();
    assert!(
        took >= HEADER_READ_TIMEOUT - Duration::from_millis(500)
            && took < HEADER_READ_TIMEOUT + Duration::from_secs(3),
        "closed after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_at_the_header_timeout() {
    let (r, _stop) = admin().await;
    let mut s = TcpStream::connect(r.admin_addr().unwrap()).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: saltgate\r\n\r\n")
        .await
        .unwrap();
    let mut b = [0u8; 1024];
    let n = s.read(&mut b).await.unwrap();
    assert!(
        String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&b[..n])
    );
    let t0 = Instant::now();
    assert!(
        closed_within(&mut s, HEADER_READ_TIMEOUT + Duration::from_secs(3)).await,
        "an idle kept-alive admin connection stays open"
    );
    assert!(t0.elapsed() >= HEADER_READ_TIMEOUT - Duration::from_millis(500));
}

/// Issue 31 item 5: the admin listener's bounds are keys (`admin.max_connections`,
/// `admin.unauthenticated_header_timeout`, ...), not constants: a short header deadline cuts an
/// idle connection at its value, and a small `max_connections` evicts the longest-idle one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_connection_limits_come_from_the_configuration() {
    let limits = saltgate_config::AdminLimits {
        max_connections: 2,
        unauthenticated_header_timeout: Duration::from_millis(400),
        ..Default::default()
    };
    let (r, _stop) = admin_with(limits).await;
    let addr = r.admin_addr().unwrap();
    // A connection that starts a request and stalls: cut at 400 ms, long before the 2 s default.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"G").await.unwrap();
    let t0 = Instant::now();
    assert!(
        closed_within(&mut s, Duration::from_millis(1900)).await,
        "a stalled connection outlived admin.unauthenticated_header_timeout"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );

    // Two idle connections fill max_connections: 2; a third evicts the longest-idle at once.
    // Each of the first two completes a request before the next connects, so the order in which
    // they took their slots is known (the accept tasks otherwise race on a loaded machine). The
    // header deadlines are long, so only an eviction closes a connection within the test.
    let limits = saltgate_config::AdminLimits {
        max_connections: 2,
        header_timeout: Duration::from_secs(30),
        unauthenticated_header_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let (r, _stop) = admin_with(limits).await;
    let addr = r.admin_addr().unwrap();
    let mut first = kept_alive(addr).await;
    let mut second = kept_alive(addr).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(b"G").await.unwrap();
    assert!(
        closed_within(&mut first, Duration::from_secs(5)).await,
        "the longest-idle connection was not evicted for the third (max_connections: 2)"
    );
    assert!(
        !closed_within(&mut second, Duration::from_millis(200)).await,
        "the second connection was cut, not the longest-idle one"
    );
    // The probe still answers: a fourth connection evicts the second.
    assert!(probe_ok(addr).await, "/healthz went unanswered");
    drop((second, third));
}

/// A connection that has had one answer and stays open (kept alive), idle since that answer.
async fn kept_alive(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: saltgate\r\n\r\n")
        .await
        .unwrap();
    let mut b = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
        .await
        .expect("no answer to /healthz within 5 s")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&b[..n])
    );
    s
}

async fn probe_ok(addr: std::net::SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return false;
    };
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: saltgate\r\nConnection: close\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut b = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut b)).await;
    String::from_utf8_lossy(&b).starts_with("HTTP/1.1 200")
}

fn yaml(admin: &str) -> String {
    format!(
        "masters:\n  - name: a\n    host: 127.23.3.2\nlisteners:\n  publish:\n    bind: {IP}:4505\n\
         \x20 request:\n    bind: {IP}:4506\nadmin:\n{admin}"
    )
}

/// Runs the binary with `args` and the configuration `text`; (exit code, stdout + stderr).
fn saltgate(args: &[&str], text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(BIN)
        .args(args)
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn check_config_refuses_an_exposed_admin_api_without_a_token() {
    let (code, out) = saltgate(&["check-config"], &yaml("  bind: 192.0.2.1:9505\n"));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("admin.bind") && out.contains("admin.allow_unauthenticated: true"),
        "{out}"
    );
}

#[test]
fn allow_unauthenticated_is_accepted_with_a_warning_by_check_config_and_at_every_start() {
    let text = yaml("  bind: 192.0.2.1:9505\n  allow_unauthenticated: true\n");
    let (code, out) = saltgate(&["check-config"], &text);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("warning") && out.contains("without a token"),
        "{out}"
    );
    // `run` warns before it binds; 192.0.2.1 is not local, so the admin bind then fails.
    let (code, out) = saltgate(&["run", "--config"], &text);
    assert_eq!(code, Some(1), "{out}");
    let warn = out
        .find("reachable beyond loopback without a token")
        .unwrap_or_else(|| panic!("no warning at start:\n{out}"));
    let bind = out
        .find("cannot listen on 192.0.2.1:9505")
        .unwrap_or_else(|| panic!("no bind error:\n{out}"));
    assert!(warn < bind, "the warning comes before the bind:\n{out}");
}
