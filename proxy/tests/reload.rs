//! Hot reload: what carries over, what changes, what is refused, and 200 reloads under 500
//! streaming sessions.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::api::*;
use common::*;
use saltgate_config::Role;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_health_of_unchanged_masters_and_adds_and_removes_masters() {
    let c = FakeCluster::start(3, Behaviour::Echo).await;
    let mut cfg = c.config();
    // Long enough for the checks, connects and echo below on a loaded machine.
    cfg.global.drain_timeout = Duration::from_secs(3);
    let full = cfg.clone();
    cfg.masters.truncate(2); // start with a, b
    let (r, _stop, p) = run(cfg.clone()).await;
    let a_before = r.master("a").unwrap();
    let (mut on_b, nb) = {
        connect(addr(&r, Role::Publish)).await;
        connect(addr(&r, Role::Publish)).await
    };
    assert_eq!(nb, "b");

    // Reload: c added, b removed, a unchanged.
    let mut next = full.clone();
    next.masters.remove(1);
    let probes_a = p.probes(c.port(0, Role::Publish).addr);
    assert_eq!(r.reload(next).await.unwrap(), 2);
    let a_after = r.master("a").unwrap();
    assert!(
        Arc::ptr_eq(&a_before, &a_after),
        "a is the same master: health and sessions carried over"
    );
    assert!(a_after.is_up(), "a is UP at once, without waiting for rise");
    assert!(p.probes(c.port(0, Role::Publish).addr) - probes_a < 2);
    assert!(r.master("b").is_none());
    wait_for("c checked UP", || r.master("c").is_some_and(|m| m.is_up())).await;
    let mut names = String::new();
    for _ in 0..4 {
        names += &connect(addr(&r, Role::Publish)).await.1;
    }
    assert!(names.contains('c') && !names.contains('b'), "{names}");
    // b's live session is drained: alive until drain_timeout, then closed.
    assert_eq!(echo(&mut on_b, b"draining").await, b"draining");
    assert!(closed(&mut on_b).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_new_timeouts_to_new_sessions_only() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let (mut old, _) = connect(addr(&r, Role::Request)).await;
    let mut next = cfg.clone();
    next.request.timeout_client = Some(Duration::from_millis(300));
    next.request.timeout_server = Some(Duration::from_millis(300));
    r.reload(next).await.unwrap();
    let (mut new, _) = connect(addr(&r, Role::Request)).await;
    assert!(
        closed(&mut new).await,
        "new session uses the 300 ms idle timeout"
    );
    assert_eq!(
        echo(&mut old, b"old").await,
        b"old",
        "the old session keeps its timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_rebinds_a_changed_listener_without_touching_the_other() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let old_pub = addr(&r, Role::Publish);
    let (mut pub_s, _) = connect(old_pub).await;
    let (mut req_s, _) = connect(addr(&r, Role::Request)).await;
    let mut next = cfg.clone();
    next.request.bind = vec![addr(&r, Role::Request), "127.0.0.5:0".parse().unwrap()];
    next.publish.bind = vec!["127.0.0.6:0".parse().unwrap()];
    r.reload(next).await.unwrap();
    let new_pub = addr(&r, Role::Publish);
    assert_eq!(new_pub.ip().to_string(), "127.0.0.6");
    // The old accept loop lets go of its socket as it stops (asynchronously).
    let deadline = tokio::time::Instant::now() + T;
    while tokio::net::TcpStream::connect(old_pub).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "old publish address still open"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(connect(new_pub).await.1, "a");
    assert_eq!(
        echo(&mut pub_s, b"p").await,
        b"p",
        "sessions of the old listener carry on"
    );
    assert_eq!(echo(&mut req_s, b"r").await, b"r");
    assert_eq!(r.local_addrs(Role::Request).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_reload_is_refused_counted_and_the_running_config_stays() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    std::fs::write(
        &file,
        "masters: []\nlisteners: {publish: {}, request: {}}\n",
    )
    .unwrap();
    let (r, _stop) = run_from_file(c.config(), &file).await;
    let admin = r.admin_addr().unwrap();
    let (code, e) = json(admin, "POST", "/api/v1/reload", None).await;
    assert_eq!(code, 422);
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("no master is configured"),
        "{e}"
    );
    assert_eq!(r.generation(), 1);
    assert_eq!(connect(addr(&r, Role::Publish)).await.1, "a");
    wait_for_metric(
        admin,
        "saltgate_reloads_total",
        &[("result", "invalid")],
        1.0,
    )
    .await;
}

/// The YAML for `cfg`'s masters with listeners on fixed addresses (for file-based reloads).
fn yaml(
    c: &FakeCluster,
    n: usize,
    weights: &[u32],
    publish: SocketAddr,
    request: SocketAddr,
    idle: &str,
) -> String {
    let mut y = String::from("global:\n  raise_nofile: false\n  drain_timeout: 1h\nhealth:\n  interval: 50ms\nmasters:\n");
    for i in 0..n {
        let (p, q) = (c.port(i, Role::Publish).addr, c.port(i, Role::Request).addr);
        y += &format!("  - name: {}\n    host: {}\n    publish_port: {}\n    request_port: {}\n    weight: {}\n", p_name(i), p.ip(), p.port(), q.port(), weights[i % weights.len()]);
    }
    y += &format!("listeners:\n  publish:\n    bind: {publish}\n    timeout_client: {idle}\n    timeout_server: {idle}\n  request:\n    bind: {request}\nadmin:\n  enabled: false\n");
    y
}

fn p_name(i: usize) -> String {
    ((b'a' + i as u8) as char).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_reloads_under_500_streaming_sessions_drop_nothing() {
    let _ = rlimit::increase_nofile_limit(65_536);
    let c = FakeCluster::start(4, Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    // Fixed addresses: the YAML loader refuses port 0 (minions need a known port).
    let publish = free_addr();
    let request = free_addr();
    let valid_a = yaml(&c, 3, &[1], publish, request, "1d");
    let valid_b = yaml(&c, 4, &[3, 1], publish, request, "12h");
    let invalid = valid_a.replace("weight: 1", "weight: lots");
    std::fs::write(&file, &valid_a).unwrap();
    let cfg = saltgate_config::load(&file, saltgate_config::Format::Yaml)
        .unwrap()
        .config;
    let (r, _stop) = run_from_file(cfg, &file).await;
    let r = Arc::new(r);

    // 500 sessions, each streaming 1 KiB chunks and checking every echoed byte, until the reloads
    // are over.
    const SESSIONS: usize = 500;
    let mut streams = Vec::new();
    for _ in 0..SESSIONS {
        streams.push(connect(publish).await.0);
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chunks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, mut s) in streams.into_iter().enumerate() {
        let (done, chunks) = (done.clone(), chunks.clone());
        tasks.push(tokio::spawn(async move {
            let mut back = vec![0u8; 1024];
            let mut k = 0usize;
            while !done.load(Ordering::SeqCst) {
                let chunk: Vec<u8> = (0..1024).map(|j| (i * 31 + k * 7 + j) as u8).collect();
                s.write_all(&chunk)
                    .await
                    .map_err(|e| format!("session {i} chunk {k}: write: {e}"))?;
                tokio::time::timeout(Duration::from_secs(60), s.read_exact(&mut back))
                    .await
                    .map_err(|_| format!("session {i} chunk {k}: timed out"))?
                    .map_err(|e| format!("session {i} chunk {k}: read: {e}"))?;
                if back != chunk {
                    return Err(format!("session {i} chunk {k}: bytes differ"));
                }
                k += 1;
                chunks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, String>((k * 1024, s))
        }));
    }
    wait_for("every session streaming", || {
        chunks.load(Ordering::SeqCst) >= SESSIONS
    })
    .await;
    let before = chunks.load(Ordering::SeqCst);
    let mut ok = 0;
    let mut refused = 0;
    for n in 0..200 {
        let text = match n % 3 {
            0 => &valid_b,
            1 => &invalid,
            _ => &valid_a,
        };
        std::fs::write(&file, text).unwrap();
        match r.reload_from_source("test").await {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    let during = chunks.load(Ordering::SeqCst) - before;
    done.store(true, Ordering::SeqCst);
    assert_eq!((ok, refused), (133, 67));
    assert!(
        during >= SESSIONS,
        "data flowed while reloading: {during} chunks"
    );
    let mut bytes = 0;
    let mut still_open = Vec::new();
    for t in tasks {
        let (n, s) = t.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        bytes += n;
        still_open.push(s);
    }
    assert_eq!(
        bytes,
        chunks.load(Ordering::SeqCst) * 1024,
        "every byte sent came back intact"
    );
    assert_eq!(r.live_sessions(), SESSIONS, "no session was dropped");
    assert_eq!(r.generation(), 1 + 133);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_that_swaps_listener_roles_keeps_both_addresses_serving() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let (a, b) = (addr(&r, Role::Publish), addr(&r, Role::Request));
    let (mut old_pub, _) = connect(a).await;
    let mut next = cfg.clone();
    next.publish.bind = vec![b];
    next.request.bind = vec![a];
    next.request.timeout_client = Some(Duration::from_millis(300));
    next.request.timeout_server = Some(Duration::from_millis(300));
    r.reload(next).await.expect("the swap is applied");
    assert_eq!(r.local_addrs(Role::Publish), vec![b]);
    assert_eq!(r.local_addrs(Role::Request), vec![a]);
    // `a` now serves the request role (300 ms idle timeout); the old session on it carries on.
    let (mut new_req, _) = connect(a).await;
    assert!(
        closed(&mut new_req).await,
        "request timeouts apply on the swapped address"
    );
    assert_eq!(connect(b).await.1, "a");
    assert_eq!(echo(&mut old_pub, b"old").await, b"old");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_maxconn_still_holds_after_reloads() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.maxconn = Some(2);
    let (r, _stop, _p) = run(cfg.clone()).await;
    let _s1 = connect(addr(&r, Role::Publish)).await;
    let _s2 = connect(addr(&r, Role::Request)).await;
    for _ in 0..3 {
        r.reload(cfg.clone()).await.unwrap();
    }
    let mut third = tokio::net::TcpStream::connect(addr(&r, Role::Publish))
        .await
        .unwrap();
    let mut b = [0u8; 2];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), third.read(&mut b))
            .await
            .is_err(),
        "still capped at 2 after 3 reloads"
    );
    // Raising the cap lets the waiting connection in at once.
    let mut more = cfg.clone();
    more.global.maxconn = Some(3);
    r.reload(more).await.unwrap();
    assert_eq!(read_line(&mut third).await, "a");
}

/// On the single-threaded runtime on purpose: a blocking read on it would stop everything. A token
/// "file" that would block (a FIFO with no writer) is refused at once, and sessions go on.
#[tokio::test]
async fn a_token_file_that_would_block_is_refused_at_once_and_sessions_go_on() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("token");
    let cpath = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let mut next = cfg.clone();
    next.admin.token_file = Some(fifo);
    let e = tokio::time::timeout(T, r.reload(next))
        .await
        .expect("answers at once")
        .expect_err("a FIFO is not a token file");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let (mut s, _) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(echo(&mut s, b"served").await, b"served");
    assert_eq!(r.generation(), 1);
}

/// Threads of this process that are reading a config or token file (named by the proxy,
/// `READ_THREAD`; Linux shows at most 15 bytes of a thread name, and it is 13). Other
/// tests in this binary start and stop runtimes in parallel, so the total thread count says
/// nothing; a reading thread that never returns does.
fn reading_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == saltgate_proxy::control::READ_THREAD)
        .count()
}

/// Issue 12, item 3: a configuration file that blocks on read (here a FIFO with no writer) used to
/// leak a blocked thread per reload attempt and keep SIGTERM from finishing. Now a file that is not
/// regular is refused at once, no thread is left behind, and shutdown completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_that_would_block_is_refused_at_once_and_leaks_nothing() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    std::fs::write(&file, "placeholder: true\n").unwrap();
    let (r, stop) = run_from_file(c.config(), &file).await;
    let admin = r.admin_addr().unwrap();
    std::fs::remove_file(&file).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&file)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", file.display());
    for _ in 0..20 {
        let (code, e) = tokio::time::timeout(T, json(admin, "POST", "/api/v1/reload", None))
            .await
            .expect("a reload of a FIFO answers at once");
        assert_eq!(code, 422, "{e}");
        let msg = e["error"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
    }
    // A reading thread exits just after it answers; one blocked on the FIFO never would. Wait
    // (on the condition, bounded) for every one to be gone.
    wait_for(
        "no reading thread left behind by the reload attempts",
        || reading_threads() == 0,
    )
    .await;
    assert_eq!(r.generation(), 1);
    assert_eq!(connect(addr(&r, Role::Publish)).await.1, "a");
    stop.send(()).unwrap();
    tokio::time::timeout(T, r.wait())
        .await
        .expect("shutdown completes");
}
