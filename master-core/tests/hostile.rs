//! Hostile clients of the request port (issue 31 item 2), against an in-process master on
//! 127.0.1.31: what an unauthenticated client can make it hold is bounded, and each cut is
//! counted under its reason on the metrics endpoint (ZeroMQ, and Salt's tcp and ws).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use saltgate_config::salt_master::parse_salt_master;
use saltgate_wire::envelope::{self, map, text, RequestEnvelope, Value};
use saltgate_wire::zmtp::frame::encode_message;
use saltgate_wire::zmtp::{Connection, HandshakeConfig, ReqOptions, ReqSocket, SocketType};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

mod common;

const IP: &str = "127.0.1.31";

async fn master(extra: &str) -> (common::InProcess, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("sghostile")
        .tempdir_in("/tmp")
        .unwrap();
    let d = dir.path().display();
    let text = format!(
        "id: hostile\ninterface: {IP}\npublish_port: 0\nret_port: 0\npki_dir: {d}/pki\n\
         cachedir: {d}/cache\nsock_dir: {d}/sock\nsaltgate_metrics_bind: {IP}:0\n{extra}"
    );
    let config = parse_salt_master(&text, None).unwrap().config;
    std::fs::create_dir_all(dir.path().join("pki")).unwrap();
    std::fs::write(
        dir.path().join("pki/master.pem"),
        saltgate_test_support::openssl_pem(),
    )
    .unwrap();
    (common::InProcess::start(config).await, dir)
}

fn metrics(m: &common::InProcess) -> SocketAddr {
    m.bound.metrics.expect("saltgate_metrics_bind is set")
}

/// Waits (10 s at most) until the refusal `key` ("port/reason") has been counted.
async fn counted(m: &common::InProcess, key: &str) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = common::refusals(metrics(m)).await;
        if let Some(n) = r.get(key) {
            return *n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} was never counted: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ping(pad: usize) -> Vec<u8> {
    RequestEnvelope::clear(map(vec![
        ("cmd", text("ping")),
        ("pad", Value::Binary(vec![b'p'; pad])),
    ]))
    .encode()
}

/// A raw REQ past the handshake: what it sends next is up to the test.
async fn raw_req(addr: SocketAddr) -> Connection {
    Connection::connect(addr, &HandshakeConfig::new(SocketType::Req))
        .await
        .unwrap()
}

/// Whether the master closed `c` within 10 s (it may first send PINGs, which are read past).
async fn closed_by_master(c: &mut Connection) -> bool {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if c.read_frame().await.is_err() {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// A clear `ping` used to echo its whole load (a 16 MB ping, never read, pinned 16 MB).
#[tokio::test]
async fn a_clear_ping_over_max_clear_load_is_refused_not_echoed() {
    let (m, _dir) = master("saltgate_max_clear_load: 4096\n").await;
    let mut req = ReqSocket::new(m.bound.ret, ReqOptions::default());
    let small = req
        .request(vec![Bytes::from(ping(16))], Duration::from_secs(10))
        .await
        .unwrap();
    let v = envelope::decode(small.last().unwrap()).unwrap();
    assert!(envelope::get(&v, "pad").is_some(), "a small ping is echoed");
    let big = req
        .request(vec![Bytes::from(ping(100_000))], Duration::from_secs(10))
        .await
        .unwrap();
    let reply = big.last().unwrap();
    assert!(reply.len() < 1000, "{} bytes came back", reply.len());
    assert_eq!(envelope::decode(reply).unwrap(), text("bad load"));
    assert_eq!(counted(&m, "request/clear_too_large").await, 1);
    m.stop().await;
}

/// Before a connection proves a session key its frames are capped far below 64 MiB: a 60 MiB
/// header is refused at once (it used to be accepted and its body held).
#[tokio::test]
async fn an_untrusted_connection_is_cut_at_a_frame_header_over_the_untrusted_limit() {
    let (m, _dir) = master("saltgate_untrusted_max_frame: 65536\n").await;
    let mut c = raw_req(m.bound.ret).await;
    // The REQ delimiter, then a frame header announcing 60 MiB and a little of its body.
    let mut out = BytesMut::new();
    saltgate_wire::zmtp::frame::encode_frame(&mut out, 1, &[]);
    out.extend_from_slice(&[0x02]);
    out.extend_from_slice(&(60u64 << 20).to_be_bytes());
    out.extend_from_slice(&[0u8; 4096]);
    c.send_encoded(&out).await.unwrap();
    assert!(closed_by_master(&mut c).await, "the 60 MiB frame was taken");
    assert_eq!(counted(&m, "request/oversized").await, 1);
    m.stop().await;
}

/// One byte every so often kept a half-sent frame alive (each byte is traffic: the heartbeat
/// never fired).
#[tokio::test]
async fn a_frame_trickled_a_byte_at_a_time_is_cut_at_frame_timeout() {
    let (m, _dir) = master("saltgate_frame_timeout: 1\n").await;
    let addr = m.bound.ret;
    let c = raw_req(addr).await;
    let mut framed = BytesMut::new();
    encode_message(&mut framed, &[&b""[..], &ping(300)]);
    let mut s = c;
    let trickle = tokio::spawn(async move {
        // 100 ms a byte: 30 s for the request, far past the 1 s deadline.
        for b in framed.iter() {
            if s.send_encoded(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(counted(&m, "request/frame_timeout").await, 1);
    trickle.abort();
    m.stop().await;
}

/// A client that sends requests and never reads the replies: the master's writes block, and the
/// heartbeat was not checked meanwhile (eight such clients held 500 MB for over 65 s). A reply
/// that makes no progress within saltgate_write_timeout closes the connection.
#[tokio::test]
async fn a_client_that_never_reads_its_replies_is_cut_at_write_timeout() {
    let (m, _dir) = master("saltgate_write_timeout: 1\n").await;
    let mut s = TcpStream::connect(m.bound.ret).await.unwrap();
    // Our own handshake, then pings pipelined, 60 KiB each (echoed), never reading a byte.
    let mut hello = BytesMut::new();
    hello.extend_from_slice(&saltgate_wire::zmtp::Greeting::ours(false).encode());
    saltgate_wire::zmtp::Command::Ready(
        saltgate_wire::zmtp::Properties::default().with("Socket-Type", "DEALER"),
    )
    .encode_frame(&mut hello);
    s.write_all(&hello).await.unwrap();
    let mut one = BytesMut::new();
    encode_message(&mut one, &[&b""[..], &ping(60_000)]);
    let sender = tokio::spawn(async move {
        for _ in 0..1000 {
            if s.write_all(&one).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    });
    assert_eq!(counted(&m, "request/write_timeout").await, 1);
    sender.abort();
    m.stop().await;
}

/// Issue 31 item 3: 19,990 silent connections to the cluster peer port took a member to its
/// descriptor limit (nothing closed them). Now at most `saltgate_cluster_max_unauthenticated`
/// are held, each for at most `saltgate_cluster_auth_timeout`.
#[tokio::test]
async fn silent_cluster_connections_are_capped_and_cut_at_the_auth_deadline() {
    let dir = tempfile::Builder::new()
        .prefix("sghostilec")
        .tempdir_in("/tmp")
        .unwrap();
    let cpki = dir.path().join("cpki");
    std::fs::create_dir_all(&cpki).unwrap();
    std::fs::write(
        cpki.join("cluster.pem"),
        saltgate_test_support::openssl_pem(),
    )
    .unwrap();
    let extra = format!(
        "cluster_id: c31\ncluster_peers: [{IP}:1]\ncluster_pki_dir: {}\ncluster_pool_port: 0\n\
         cluster_secret: a-long-random-secret\nsaltgate_cluster_max_unauthenticated: 4\n\
         saltgate_cluster_auth_timeout: 1\n",
        cpki.display()
    );
    let (m, _dir) = master(&extra).await;
    let pool = m.bound.cluster.expect("a cluster port");
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(pool).await.unwrap());
    }
    // Six over the cap are closed at once, the four others at the deadline: every one ends.
    for s in &mut silent {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read(s, &mut b),
        )
        .await
        .expect("the master never closed a silent cluster connection");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
    // Every close was counted before it happened. Six over the cap, unless the machine was so
    // slow that a slot came free while the ten were being accepted.
    let r = common::refusals(metrics(&m)).await;
    let (cap, late) = (
        r.get("cluster/unauthenticated_cap").copied().unwrap_or(0),
        r.get("cluster/auth_timeout").copied().unwrap_or(0),
    );
    assert_eq!(cap + late, 10, "{r:?}");
    assert!(cap >= 1 && late >= 4, "{r:?}");
    m.stop().await;
}

/// Issue 31 item 3, applied to the request port: with `saltgate_request_max_connections` a flood
/// of connections holds at most that many; one more waits in the kernel backlog (its handshake
/// is not answered) until one of them goes.
#[tokio::test]
async fn the_request_port_serves_at_most_its_max_connections() {
    let (m, _dir) = master("saltgate_request_max_connections: 2\n").await;
    let addr = m.bound.ret;
    let a = raw_req(addr).await;
    let b = raw_req(addr).await;
    let cfg = HandshakeConfig::new(SocketType::Req);
    let third = tokio::spawn(async move { Connection::connect(addr, &cfg).await });
    // Not served while two are: its greeting goes unanswered.
    let waited = tokio::time::timeout(Duration::from_millis(1500), async {
        while !third.is_finished() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_err(),
        "a third connection was served over the cap of 2"
    );
    drop(a);
    let c = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("the third connection was never served after one of two closed")
        .unwrap();
    assert!(c.is_ok(), "{:?}", c.err());
    drop(b);
    m.stop().await;
}

/// A master on `transport` with a 64 KiB untrusted frame limit and a 1 s frame timeout; a clear
/// ping through the seam's client on `transport` is echoed (the port speaks it).
async fn limited_master_on(
    transport: saltgate_wire::transport::Transport,
) -> (common::InProcess, tempfile::TempDir) {
    let (m, dir) = master(&format!(
        "transport: {}\nsaltgate_untrusted_max_frame: 65536\nsaltgate_frame_timeout: 1\n",
        transport.as_str()
    ))
    .await;
    let mut c = transport
        .request_client(m.bound.ret, &Default::default())
        .unwrap();
    let reply = saltgate_wire::transport::RequestClient::send(
        &mut c,
        Bytes::from(ping(16)),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let v = envelope::decode(&reply).unwrap();
    assert!(envelope::get(&v, "pad").is_some(), "a small ping is echoed");
    (m, dir)
}

/// Sends `bytes` on `s` a byte every 100 ms: the master cuts it at its frame timeout and counts
/// it under `request/frame_timeout`.
async fn a_trickle_is_cut_and_counted(m: &common::InProcess, mut s: TcpStream, bytes: Vec<u8>) {
    let trickle = tokio::spawn(async move {
        for b in bytes {
            if s.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(counted(m, "request/frame_timeout").await, 1);
    trickle.abort();
}

/// A ZeroMQ minion's greeting is cut and counted under `request/zmtp_protocol` (the label keeps
/// its ZeroMQ-era name on tcp and ws: docs/master.md, Metrics); then the master stops.
async fn a_zeromq_greeting_is_cut_and_counted(m: common::InProcess) {
    let mut z = TcpStream::connect(m.bound.ret).await.unwrap();
    z.write_all(&saltgate_wire::zmtp::Greeting::ours(false).encode())
        .await
        .unwrap();
    assert_eq!(counted(&m, "request/zmtp_protocol").await, 1);
    m.stop().await;
}

/// Issue 27: the same limits hold on `transport: tcp` (Salt's `{head, body}` msgpack stream, no
/// length prefix), and its cuts are counted under the same reasons: a message announcing 60 MiB
/// before the connection is trusted, a request trickled past `saltgate_frame_timeout`, and bytes
/// that are not Salt's framing (a ZeroMQ minion's greeting, counted as `zmtp_protocol`).
#[tokio::test]
async fn on_tcp_an_oversized_message_a_trickle_and_a_zeromq_peer_are_cut_and_counted() {
    let (m, _dir) = limited_master_on(saltgate_wire::transport::Transport::Tcp).await;
    let addr = m.bound.ret;
    let mut big = saltgate_wire::salt_tcp::request_frame("m", Value::Nil);
    big.pop();
    big.extend_from_slice(&[0xc6, 0x03, 0xc0, 0, 0]);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&big).await.unwrap();
    assert_eq!(counted(&m, "request/oversized").await, 1);

    let frame = saltgate_wire::salt_tcp::request_frame("m", envelope::decode(&ping(300)).unwrap());
    let s = TcpStream::connect(addr).await.unwrap();
    a_trickle_is_cut_and_counted(&m, s, frame).await;
    a_zeromq_greeting_is_cut_and_counted(m).await;
}

/// Issue 27: the same limits on `transport: ws` (Salt's websocket, one binary message a
/// request): a frame header announcing 60 MiB before the connection is trusted, a request
/// trickled past `saltgate_frame_timeout`, and a ZeroMQ minion's greeting, each counted under
/// the same reason; a clear ping through the seam's ws client is answered.
#[tokio::test]
async fn on_ws_an_oversized_frame_a_trickle_and_a_zeromq_peer_are_cut_and_counted() {
    use saltgate_wire::salt_ws::{client_frame, handshake_request, OP_BINARY};
    let (m, _dir) = limited_master_on(saltgate_wire::transport::Transport::Ws).await;
    let addr = m.bound.ret;
    let upgrade = handshake_request(&addr.to_string(), "/", "dGhlIHNhbXBsZSBub25jZQ==");
    let mut big = upgrade.clone();
    // A frame header announcing 60 MiB (64-bit length), masked.
    big.extend_from_slice(&[0x82, 0x80 | 127]);
    big.extend_from_slice(&(60u64 << 20).to_be_bytes());
    big.extend_from_slice(&[1, 2, 3, 4]);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&big).await.unwrap();
    assert_eq!(counted(&m, "request/oversized").await, 1);

    // The upgrade at once, then the request a byte every 100 ms.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&upgrade).await.unwrap();
    a_trickle_is_cut_and_counted(&m, s, client_frame(OP_BINARY, &ping(300))).await;
    a_zeromq_greeting_is_cut_and_counted(m).await;
}
