//! Our ZMTP roles against pyzmq / libzmq 4.3.5 (the library Salt itself runs on).

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::net::SocketAddr;
use std::process::{ChildStdout, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::{hex, py_script, python, ProcGuard};
use saltgate_wire::probe;
use saltgate_wire::zmtp::{
    Connection, Frame, HandshakeConfig, PubOptions, Publisher, ReqOptions, ReqSocket, Router,
    RouterOptions, SocketType, SubOptions, Subscriber, ZmtpError,
};
use serde_json::Value as Json;

/// Starts `zmq_peer.py MODE ARGS...` with stdout piped.
fn peer(args: &[&str]) -> (ProcGuard, Lines<BufReader<ChildStdout>>) {
    let mut cmd = Command::new(python());
    cmd.arg(py_script("zmq_peer.py"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut g = ProcGuard::spawn("zmq_peer.py", cmd);
    let lines = BufReader::new(g.child.stdout.take().expect("stdout")).lines();
    (g, lines)
}

/// Reads the next JSON line from a peer without blocking the runtime.
async fn next_json(lines: Lines<BufReader<ChildStdout>>) -> (Json, Lines<BufReader<ChildStdout>>) {
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            let mut lines = lines;
            let line = lines
                .next()
                .expect("peer closed stdout")
                .expect("read line");
            (serde_json::from_str(&line).expect("json line"), lines)
        }),
    )
    .await
    .expect("peer line within 30 s")
    .expect("join")
}

fn port_of(j: &Json) -> u16 {
    j["port"].as_u64().expect("port") as u16
}

#[tokio::test]
async fn our_pub_fans_out_to_a_pyzmq_sub_honouring_its_subscription() {
    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), PubOptions::default())
        .await
        .unwrap();
    let addr = format!("tcp://{}", publisher.local_addr());
    let (_guard, lines) = peer(&["sub", &addr, "job", "2"]);
    assert!(
        publisher
            .wait_for_subscribed(1, Duration::from_secs(20))
            .await,
        "pyzmq SUB never subscribed"
    );
    // libzmq 4.3.5 sends SUBSCRIBE as a ZMTP 3.1 command to us: filtering happens on our side.
    let other = publisher.publish(vec![Bytes::from_static(b"other"), Bytes::from_static(b"x")]);
    assert_eq!(other.queued, 0, "non-matching topic was queued");
    let r1 = publisher.publish(vec![Bytes::from_static(b"job1"), Bytes::from_static(b"a")]);
    let r2 = publisher.publish(vec![Bytes::from_static(b"jobX")]);
    assert_eq!((r1.queued, r2.queued), (1, 1));
    let (first, lines) = next_json(lines).await;
    assert_eq!(first["event"], "connecting");
    let (m1, lines) = next_json(lines).await;
    let (m2, _) = next_json(lines).await;
    assert_eq!(m1["msg"], serde_json::json!([hex(b"job1"), hex(b"a")]));
    assert_eq!(m2["msg"], serde_json::json!([hex(b"jobX")]));
}

/// pyzmq PUB with `HEARTBEAT_IVL=200 ms`, `HEARTBEAT_TIMEOUT=1000 ms` is Salt 3008's master
/// setting (10 s / 30 s) scaled by 1/50 (timeout relative to interval is even stricter here),
/// so libzmq drops a peer that never answers PING after ~1.2 s instead of ~40 s. Over 5 s (the
/// equivalent of ~4 minutes at Salt's rates) our SUB must keep its first connection, while a
/// silent peer connected alongside it is dropped — proving the heartbeats were really on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_sub_answers_pyzmq_pub_heartbeats_and_stays_connected() {
    // The publisher runs 8 s: the 5 s window below starts only once our SUB is connected.
    let (_guard, lines) = peer(&["pub_hb", "200", "1000", "8"]);
    let (j, lines) = next_json(lines).await;
    let addr: SocketAddr = format!("127.0.0.1:{}", port_of(&j)).parse().unwrap();

    let mut sub = Subscriber::connect(addr, SubOptions::default());
    sub.subscribe(Bytes::from_static(b"tick"));
    assert!(sub.wait_connects(1, Duration::from_secs(10)).await);

    // The silent peer: handshakes as SUB and then never answers anything.
    let silent = tokio::spawn(async move {
        let mut c = Connection::connect(addr, &HandshakeConfig::new(SocketType::Sub))
            .await
            .expect("silent connect");
        let start = std::time::Instant::now();
        let mut pings = 0;
        loop {
            match c.read_frame().await {
                Ok(Frame::Command(_)) => pings += 1,
                Ok(_) => {}
                Err(ZmtpError::Eof) | Err(ZmtpError::Io(_)) => return (start.elapsed(), pings),
                Err(e) => panic!("{e}"),
            }
        }
    });

    let mut received = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(5000);
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.recv()).await {
        assert!(msg[0].starts_with(b"tick "));
        received += 1;
    }
    let (silent_after, silent_pings) = silent.await.unwrap();
    assert!(silent_pings >= 1, "the silent peer was never PINGed");
    assert!(
        silent_after < Duration::from_millis(4500),
        "libzmq took {silent_after:?} to drop the silent peer"
    );
    assert!(received > 30, "only {received} ticks in 5 s");
    assert_eq!(sub.connect_count(), 1, "our SUB reconnected");
    assert!(sub.is_connected());
    let (counts, _) = next_json(lines).await;
    assert_eq!(counts["accepted"], 2, "{counts}");
    assert_eq!(
        counts["disconnected"], 1,
        "only the silent peer may be dropped: {counts}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_router_routes_each_reply_to_the_right_pyzmq_req() {
    let mut router = Router::bind("127.0.0.1:0".parse().unwrap(), RouterOptions::default())
        .await
        .unwrap();
    let addr = format!("tcp://{}", router.local_addr());
    let (_g1, l1) = peer(&["req", &addr, "20"]);
    let (_g2, l2) = peer(&["req", &addr, "20"]);
    let server = async {
        for _ in 0..40 {
            let msg = router.recv().await.expect("router recv");
            let [delim, payload] = msg.frames.as_slice() else {
                panic!("REQ message shape {:?}", msg.frames);
            };
            assert!(delim.is_empty());
            let n = payload.strip_prefix(b"req ").expect("req prefix");
            let mut rep = b"rep ".to_vec();
            rep.extend_from_slice(n);
            router
                .reply(&msg.peer, vec![Bytes::from(rep)])
                .await
                .expect("reply");
        }
    };
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("40 requests within 30 s");
    let (r1, _) = next_json(l1).await;
    let (r2, _) = next_json(l2).await;
    assert_eq!(r1["ok"], 20, "{r1}");
    assert_eq!(r2["ok"], 20, "{r2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_req_and_greeting_probe_work_against_a_pyzmq_router() {
    let (_g, lines) = peer(&["router", "3"]);
    let (j, lines) = next_json(lines).await;
    let addr: SocketAddr = format!("127.0.0.1:{}", port_of(&j)).parse().unwrap();

    let g = probe::zmtp_greeting(addr, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((g.major, g.minor, g.mechanism.as_str()), (3, 1, "NULL"));

    let mut req = ReqSocket::new(addr, ReqOptions::default());
    for i in 0..3 {
        let body = Bytes::from(format!("q{i}"));
        let rep = req
            .request(vec![body], Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(rep, vec![Bytes::from(format!("rep:q{i}"))]);
    }
    let (done, _) = next_json(lines).await;
    assert_eq!(done["done"], 3);
}
