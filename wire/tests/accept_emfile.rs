//! The accept loop out of descriptors (EMFILE): it backs off instead of spinning or dying, logs
//! once per episode, and serves again when descriptors come back.
//!
//! Its own test binary, with one test: it lowers this process's RLIMIT_NOFILE, which would break
//! any test running beside it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use saltgate_wire::zmtp::{Connection, HandshakeConfig, Router, RouterOptions, SocketType};
use socket2::{Domain, Socket, Type};

const T: Duration = Duration::from_secs(10);

fn nofile() -> libc::rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r
}

fn set_nofile_soft(cur: libc::rlim_t) {
    let r = libc::rlimit {
        rlim_cur: cur,
        rlim_max: nofile().rlim_max,
    };
    // SAFETY: setrlimit reads the struct we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
}

fn highest_open_fd() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_accept_backs_off_on_emfile_logs_once_and_recovers() {
    let mut router = Router::bind("127.0.0.1:0".parse().unwrap(), RouterOptions::default())
        .await
        .unwrap();
    let addr: SocketAddr = router.local_addr();
    // Client sockets exist before the limit drops (connecting needs no new descriptor).
    let clients: Vec<Socket> = (0..8)
        .map(|_| Socket::new(Domain::IPV4, Type::STREAM, None).unwrap())
        .collect();
    let original = nofile();
    set_nofile_soft(highest_open_fd() + 1);
    // Fill any lower holes so that no descriptor at all is left.
    let mut filler = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        filler.push(f);
    }
    for c in &clients {
        c.connect(&addr.into()).unwrap();
    }
    let stats = router.accept_stats();
    wait_until("accept to fail with EMFILE", T, || {
        stats.exhaustion_errors() >= 3
    })
    .await;
    // Backing off, not spinning: a busy loop would fail millions of times a second.
    let before = stats.exhaustion_errors();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let in_one_second = stats.exhaustion_errors() - before;
    assert!(
        in_one_second <= 20,
        "{in_one_second} accept errors in 1 s: spinning"
    );
    assert_eq!(stats.exhaustion_episodes(), 1, "one warning per episode");
    assert_eq!(stats.accepted(), 0);

    // Descriptors come back: the waiting clients are accepted and new ones served.
    drop(filler);
    set_nofile_soft(original.rlim_cur);
    wait_until("the waiting clients to be accepted", T, || {
        stats.accepted() >= clients.len() as u64
    })
    .await;
    let mut req = Connection::connect(addr, &HandshakeConfig::new(SocketType::Req))
        .await
        .unwrap();
    req.send_message(&[Bytes::new(), Bytes::from_static(b"hello again")])
        .await
        .unwrap();
    let m = tokio::time::timeout(T, router.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.frames[1][..], b"hello again");
    assert_eq!(stats.exhaustion_episodes(), 1);
}
