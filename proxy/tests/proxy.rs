//! The proxy end to end on loopback: selection, health, timeouts, half-close, mark-down, limits,
//! shutdown, and byte transparency.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use saltgate_config::{Balance, OnMasterDown, Role};
use saltgate_proxy::{start, Options, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

async fn run(
    cfg: saltgate_config::Config,
    prober: Option<Arc<ScriptedProber>>,
) -> (Running, oneshot::Sender<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let opts = match prober {
        Some(p) => Options {
            prober: p,
            ..Default::default()
        },
        None => Options::default(),
    };
    let r = start(cfg, opts, async move {
        let _ = rx.await;
    })
    .await
    .expect("proxy starts");
    (r, tx)
}

fn addr(r: &Running, role: Role) -> std::net::SocketAddr {
    r.local_addrs(role)[0]
}

#[tokio::test]
async fn round_robin_spreads_sessions_over_masters_in_order() {
    let c = FakeCluster::start(3, Behaviour::Echo).await;
    let (r, _stop) = run(c.config(), None).await;
    for role in Role::ALL {
        let mut names = String::new();
        for _ in 0..6 {
            names += &connect(addr(&r, role)).await.1;
        }
        assert_eq!(names, "abcabc", "{role}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_master_is_skipped_and_taken_back_after_rise_successes() {
    let c = FakeCluster::start(3, Behaviour::Echo).await;
    let p = Arc::new(ScriptedProber::default());
    let (r, _stop) = run(c.config(), Some(p.clone())).await;
    let b = r.master("b").unwrap();
    assert!(b.is_up());

    // Only the request port of b fails: the master as a whole is DOWN, on both listeners.
    let req_b = c.port(1, Role::Request).addr;
    p.set_down(req_b, true);
    wait_for("b marked down", || !b.is_up()).await;
    for role in Role::ALL {
        let mut names = String::new();
        for _ in 0..4 {
            names += &connect(addr(&r, role)).await.1;
        }
        assert!(!names.contains('b'), "{role}: {names}");
    }

    // Back after exactly `rise` (2) consecutive successes.
    let before = p.probes(req_b);
    p.set_down(req_b, false);
    wait_for("b marked up", || b.is_up()).await;
    assert_eq!(p.probes(req_b) - before, 2, "UP after rise=2 successes");
    let mut names = String::new();
    for _ in 0..3 {
        names += &connect(addr(&r, Role::Publish)).await.1;
    }
    assert!(names.contains('b'), "{names}");
}

#[tokio::test]
async fn real_tcp_checks_mark_a_stopped_master_down_and_a_restarted_one_up() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop) = run(c.config(), None).await;
    let a = r.master("a").unwrap();
    assert!(a.is_up());
    c.port(0, Role::Publish).stop();
    wait_for("a marked down by TCP checks", || !a.is_up()).await;
    assert_eq!(connect(addr(&r, Role::Publish)).await.1, "b");
    c.port(0, Role::Publish).restart().await;
    wait_for("a marked up again", || a.is_up()).await;
}

#[tokio::test]
async fn connect_failure_falls_through_to_the_next_master() {
    let c = FakeCluster::start(3, Behaviour::Echo).await;
    // Checks say every master is UP, but a's publish port refuses connections.
    let p = Arc::new(ScriptedProber::default());
    let (r, _stop) = run(c.config(), Some(p)).await;
    c.port(0, Role::Publish).stop();
    let mut names = String::new();
    for _ in 0..3 {
        names += &connect(addr(&r, Role::Publish)).await.1;
    }
    assert_eq!(names.len(), 3);
    assert!(!names.contains('a'), "{names}");
}

#[tokio::test]
async fn no_master_up_closes_the_client_connection_at_once() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let p = Arc::new(ScriptedProber::default());
    p.all_down.store(true, std::sync::atomic::Ordering::SeqCst);
    let (r, _stop) = run(c.config(), Some(p)).await;
    // As HAProxy, masters are presumed UP until `fall` checks fail.
    wait_for("every master DOWN", || {
        r.masters().iter().all(|m| !m.is_up())
    })
    .await;
    for role in Role::ALL {
        let mut s = tokio::net::TcpStream::connect(addr(&r, role))
            .await
            .unwrap();
        assert!(closed(&mut s).await, "{role}");
    }
    assert_eq!(
        c.port(0, Role::Publish)
            .accepted
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test]
async fn seed_fixture_timeouts_keep_an_hour_idle_publish_session_and_close_a_61s_idle_request_session(
) {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let fixture = saltgate_config::haproxy::parse_haproxy(
        include_str!("../../examples/haproxy/salt-master-cluster-loopback.cfg"),
        None,
    )
    .unwrap()
    .config;
    let mut cfg = c.config();
    for role in Role::ALL {
        let (f, l) = (
            fixture.listener(role),
            if role == Role::Publish {
                &mut cfg.publish
            } else {
                &mut cfg.request
            },
        );
        l.timeout_client = f.timeout_client;
        l.timeout_server = f.timeout_server;
    }
    assert_eq!(cfg.request.timeout_client, Some(Duration::from_secs(60)));
    let p = Arc::new(ScriptedProber::default());
    let (r, _stop) = run(cfg, Some(p)).await;
    let (mut publ, _) = connect(addr(&r, Role::Publish)).await;
    let (mut req, _) = connect(addr(&r, Role::Request)).await;
    assert_eq!(echo(&mut publ, b"x").await, b"x");
    assert_eq!(echo(&mut req, b"y").await, b"y");

    tokio::time::pause();
    // 50 s, not 59: while paused, every moment the runtime waits on loopback I/O moves the clock
    // on to the next timer (the 20 ms checks), so the echo itself may cost paused seconds.
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(
        echo(&mut req, b"still").await,
        b"still",
        "50 s idle: request session open"
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(closed(&mut req).await, "61 s idle: request session closed");
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(
        echo(&mut publ, b"after an hour").await,
        b"after an hour",
        "publish session outlives the request timeout"
    );
    tokio::time::resume();
}

#[tokio::test]
async fn idle_timeout_counts_from_the_last_byte_in_either_direction() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.request.timeout_client = Some(Duration::from_secs(60));
    cfg.request.timeout_server = Some(Duration::from_secs(60));
    let (r, _stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    let (mut s, _) = connect(addr(&r, Role::Request)).await;
    // Paused time. While paused, a wait on loopback I/O moves the clock to the next timer (the
    // 20 ms checks), so an echo may cost paused seconds: the margins are seconds, not ms.
    tokio::time::pause();
    let t0 = tokio::time::Instant::now();
    for _ in 0..6 {
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(
            echo(&mut s, b"k").await,
            b"k",
            "a byte every 20 s keeps a session with a 60 s limit open"
        );
    }
    assert!(t0.elapsed() >= Duration::from_secs(120), "twice the limit");
    tokio::time::advance(Duration::from_secs(50)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let mut b = [0u8; 8];
    assert!(
        matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "50 s after the last byte the session is still open"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(
        closed(&mut s).await,
        "61 s after the last byte it is closed"
    );
    tokio::time::resume();
}

#[tokio::test]
async fn client_half_close_is_passed_on_and_the_master_can_still_answer() {
    let c = FakeCluster::start(1, Behaviour::ReplyAfterEof).await;
    let (r, _stop) = run(c.config(), Some(Arc::new(ScriptedProber::default()))).await;
    let (mut s, name) = connect(addr(&r, Role::Request)).await;
    assert_eq!(name, "a");
    s.write_all(&[7u8; 5000]).await.unwrap();
    s.shutdown().await.unwrap();
    let mut reply = String::new();
    tokio::time::timeout(T, s.read_to_string(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply, "got 5000");
}

#[tokio::test]
async fn master_half_close_is_passed_on_and_the_client_can_still_send() {
    let c = FakeCluster::start(1, Behaviour::CloseFirst).await;
    let (r, _stop) = run(c.config(), Some(Arc::new(ScriptedProber::default()))).await;
    let (mut s, name) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(name, "a");
    assert!(closed(&mut s).await, "the master's FIN reaches the client");
    s.write_all(&[1u8; 3000]).await.unwrap();
    let received = c.port(0, Role::Publish).received.clone();
    wait_for("3000 bytes reach the master after its FIN", || {
        received.load(std::sync::atomic::Ordering::SeqCst) == 3000
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_down_closes_that_masters_sessions_and_only_those() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let p = Arc::new(ScriptedProber::default());
    let mut cfg = c.config();
    cfg.request.on_master_down = OnMasterDown::Keep;
    let (r, _stop) = run(cfg, Some(p.clone())).await;
    let (mut pa, na) = connect(addr(&r, Role::Publish)).await;
    let (mut pb, nb) = connect(addr(&r, Role::Publish)).await;
    let (mut ra, _) = connect(addr(&r, Role::Request)).await;
    assert_eq!((na.as_str(), nb.as_str()), ("a", "b"));

    p.set_down(c.port(0, Role::Publish).addr, true);
    assert!(closed(&mut pa).await, "a's publish session closed");
    assert_eq!(
        echo(&mut pb, b"b lives").await,
        b"b lives",
        "b's session untouched"
    );
    assert_eq!(
        echo(&mut ra, b"kept").await,
        b"kept",
        "request listener is set to keep"
    );
    assert!(!r.master("a").unwrap().is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_close_spreads_closes_over_time() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let p = Arc::new(ScriptedProber::default());
    let mut cfg = c.config();
    cfg.publish.close_rate = 50; // 20 sessions at 50/s: about 0.4 s
    let (r, _stop) = run(cfg, Some(p.clone())).await;
    let mut sessions = Vec::new();
    for _ in 0..20 {
        sessions.push(connect(addr(&r, Role::Publish)).await.0);
    }
    let t0 = tokio::time::Instant::now();
    p.set_down(c.port(0, Role::Publish).addr, true);
    for s in &mut sessions {
        assert!(closed(s).await);
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "20 closes at 50/s took only {took:?}"
    );
}

#[tokio::test]
async fn listener_maxconn_holds_extra_connections_in_the_backlog() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.publish.maxconn = Some(1);
    let (r, _stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    let (first, _) = connect(addr(&r, Role::Publish)).await;
    let mut second = tokio::net::TcpStream::connect(addr(&r, Role::Publish))
        .await
        .unwrap();
    // An awaited event instead of a sleep: a full session through the other listener (uncapped)
    // is served meanwhile; the second publish client still has nothing to read.
    let (mut other, _) = connect(addr(&r, Role::Request)).await;
    assert_eq!(echo(&mut other, b"r").await, b"r");
    let mut b = [0u8; 2];
    assert!(
        matches!(second.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "second session waits in the backlog"
    );
    drop(first);
    assert_eq!(
        read_line(&mut second).await,
        "a",
        "served once the first ends"
    );
}

#[tokio::test]
async fn master_maxconn_sends_sessions_elsewhere() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.masters[0].maxconn = Some(1);
    cfg.publish.balance = Balance::RoundRobin;
    let (r, _stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    let mut held = Vec::new();
    let mut names = String::new();
    for _ in 0..4 {
        let (s, n) = connect(addr(&r, Role::Publish)).await;
        names += &n;
        held.push(s);
    }
    assert_eq!(names.matches('a').count(), 1, "{names}");
}

#[tokio::test]
async fn shutdown_stops_accepting_drains_then_closes() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.shutdown_grace = Duration::from_secs(2);
    let (r, stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    let pub_addr = addr(&r, Role::Publish);
    let (mut s, _) = connect(pub_addr).await;
    assert_eq!(r.live_sessions(), 1);
    stop.send(()).unwrap();
    // New connections are refused once the listener is gone.
    wait_for_async_refused(pub_addr).await;
    // The live session still works during the grace period...
    assert_eq!(echo(&mut s, b"draining").await, b"draining");
    // ...and is closed when it runs out; then the proxy is done.
    assert!(closed(&mut s).await);
    tokio::time::timeout(T, r.wait())
        .await
        .expect("proxy stops after the grace");
}

#[tokio::test]
async fn shutdown_completes_early_when_sessions_end_by_themselves() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.shutdown_grace = Duration::from_secs(60);
    let (r, stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    let (s, _) = connect(addr(&r, Role::Publish)).await;
    stop.send(()).unwrap();
    drop(s);
    tokio::time::timeout(Duration::from_secs(5), r.wait())
        .await
        .expect("no need to wait for the 60 s grace");
}

async fn wait_for_async_refused(a: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if tokio::net::TcpStream::connect(a).await.is_err() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "listener still accepting"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn garbage_bytes_are_forwarded_untouched() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let (r, _stop) = run(c.config(), Some(Arc::new(ScriptedProber::default()))).await;
    let (mut s, _) = connect(addr(&r, Role::Request)).await;
    // Every byte value, ZMTP-looking prefixes, and a large pseudo-random block.
    let mut data: Vec<u8> = (0..=255u8).collect();
    data.extend_from_slice(&[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1]);
    let mut x: u32 = 0x1234_5678;
    data.extend((0..1_000_000).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as u8
    }));
    let (mut rd, mut wr) = s.split();
    let expected = data.clone();
    let writer = async move {
        wr.write_all(&data).await.unwrap();
    };
    let reader = async move {
        let mut back = vec![0u8; expected.len()];
        rd.read_exact(&mut back).await.unwrap();
        assert!(back == expected, "bytes changed in transit");
    };
    tokio::time::timeout(T, async { tokio::join!(writer, reader) })
        .await
        .unwrap();
}

#[tokio::test]
async fn source_balance_keeps_a_client_on_one_master_for_both_ports() {
    let c = FakeCluster::start(3, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.publish.balance = Balance::Source;
    cfg.request.balance = Balance::Source;
    let (r, _stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    let p1 = connect(addr(&r, Role::Publish)).await.1;
    for _ in 0..3 {
        assert_eq!(connect(addr(&r, Role::Publish)).await.1, p1);
        assert_eq!(connect(addr(&r, Role::Request)).await.1, p1);
    }
}

#[tokio::test]
async fn idle_sessions_hold_no_buffers() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop) = run(c.config(), Some(Arc::new(ScriptedProber::default()))).await;
    let mut sessions = Vec::new();
    for i in 0..100 {
        let role = if i % 2 == 0 {
            Role::Publish
        } else {
            Role::Request
        };
        let (mut s, _) = connect(addr(&r, role)).await;
        assert_eq!(echo(&mut s, &[i as u8; 3000]).await, vec![i as u8; 3000]);
        sessions.push(s);
    }
    assert_eq!(r.live_sessions(), 100);
    wait_for("every buffer back in the pool", || r.buffers_in_use() == 0).await;
}

/// TCP_USER_TIMEOUT, nodelay and keepalive time of each of this process's sockets (the proxy runs
/// in it) whose peer is `peer`.
fn session_opts_to(peer: std::net::SocketAddr) -> Vec<(Option<Duration>, bool, Option<Duration>)> {
    use std::os::fd::BorrowedFd;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: the sockets looked for stay open while the test holds its session open; other
        // descriptors are only asked for their peer (getsockopt-like calls that fail harmlessly).
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = socket2::SockRef::from(&b);
        if s.peer_addr().ok().and_then(|a| a.as_socket()) == Some(peer) {
            let keepalive = s
                .keepalive()
                .unwrap()
                .then(|| s.tcp_keepalive_time().unwrap());
            out.push((
                s.tcp_user_timeout().unwrap(),
                s.tcp_nodelay().unwrap(),
                keepalive,
            ));
        }
    }
    out
}

#[tokio::test]
async fn both_legs_of_a_session_get_tcp_user_timeout() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    let want = Duration::from_secs(7);
    cfg.global.tcp_user_timeout = Some(want);
    let (r, _stop) = run(cfg.clone(), Some(Arc::new(ScriptedProber::default()))).await;
    let ka = Some(saltgate_proxy::listener::KEEPALIVE_TIME);
    let (mut s, _) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(echo(&mut s, b"x").await, b"x");
    // A blackholed peer must not pin the session (and a pooled buffer) until its idle timeout.
    // The client leg gets its options from the listening socket (Linux copies them on accept).
    assert_eq!(
        session_opts_to(s.local_addr().unwrap()),
        [(Some(want), true, ka)],
        "client leg"
    );
    assert_eq!(
        session_opts_to(c.port(0, Role::Publish).addr),
        [(Some(want), true, ka)],
        "master leg"
    );
    // A reload that changes the timeout sets it on the listening socket again; `none` is the
    // kernel's default (0) for sessions accepted after it.
    for (value, seen) in [
        (Some(Duration::from_secs(9)), Some(Duration::from_secs(9))),
        (None, None),
    ] {
        cfg.global.tcp_user_timeout = value;
        r.reload(cfg.clone()).await.unwrap();
        let (mut s, _) = connect(addr(&r, Role::Publish)).await;
        assert_eq!(echo(&mut s, b"y").await, b"y");
        assert_eq!(
            session_opts_to(s.local_addr().unwrap()),
            [(seen, true, ka)],
            "client leg after a reload to {value:?}"
        );
    }
}

#[tokio::test]
async fn a_retry_on_the_only_master_is_not_back_to_back() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.publish.retries = 1;
    let (r, _stop) = run(cfg, Some(Arc::new(ScriptedProber::default()))).await;
    c.port(0, Role::Publish).stop(); // checks still say UP: every connect is refused at once
    let t0 = tokio::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr(&r, Role::Publish))
        .await
        .unwrap();
    assert!(closed(&mut s).await);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "two attempts on one refusing master {took:?} apart"
    );
}
