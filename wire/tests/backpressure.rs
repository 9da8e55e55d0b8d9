//! A slow application: a ROUTER stops reading the peers it cannot deliver for (libzmq's
//! backpressure, nothing lost, other peers unaffected); a subscriber keeps reading, answers PINGs
//! and drops and counts messages beyond its high-water mark. And per-role
//! frame limits are enforced on the header, before the body arrives; connection caps hold new
//! connections in the backlog.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use saltgate_wire::zmtp::{
    Command, Connection, Frame, HandshakeConfig, Heartbeat, PubOptions, Publisher, Router,
    RouterOptions, SocketType, ZmtpError, PUB_DEFAULT_MAX_FRAME_SIZE,
    ROUTER_DEFAULT_MAX_FRAME_SIZE,
};

const T: Duration = Duration::from_secs(10);

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn raw(addr: SocketAddr, ty: SocketType) -> Connection {
    Connection::connect(addr, &HandshakeConfig::new(ty))
        .await
        .expect("raw connect")
}

/// Reads (and never answers) until the peer closes the connection.
async fn until_closed(c: &mut Connection) {
    loop {
        match tokio::time::timeout(T, c.read_frame()).await {
            Err(_) => panic!("the router never dropped a silent peer"),
            Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends a PING and waits for the PONG echoing its context (skipping the peer's own PINGs).
async fn ping_pong(c: &mut Connection, context: &'static [u8]) {
    c.send_command(&Command::Ping {
        ttl: 0,
        context: Bytes::from_static(context),
    })
    .await
    .unwrap();
    loop {
        let f = tokio::time::timeout(T, c.read_frame())
            .await
            .expect("no PONG: the peer stopped reading")
            .expect("connection lost");
        if let Frame::Command(body) = f {
            if let Ok(Command::Pong { context: got }) = Command::parse(&body) {
                assert_eq!(&got[..], context);
                return;
            }
        }
    }
}

#[tokio::test]
async fn router_whose_app_reads_late_gets_every_request_in_order_and_keeps_the_peer() {
    let queue = 4;
    let sent = 50u64;
    let mut router = Router::bind(
        any(),
        RouterOptions {
            queue,
            // The router drops peers silent for 300 ms; the pause below outlasts three of those.
            heartbeat: Some(Heartbeat {
                interval: Duration::from_millis(100),
                timeout: Duration::from_millis(300),
                ttl: Duration::ZERO,
            }),
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut c = raw(router.local_addr(), SocketType::Req).await;
    for i in 0..sent {
        c.send_message(&[Bytes::new(), Bytes::from(format!("req {i}"))])
            .await
            .unwrap();
    }
    // The application does not read: the peer is paused, not dropped, and not taken for
    // silent (it is the router that is not reading). Replies still go out meanwhile.
    wait_until("the peer to be paused", T, || router.paused_inbound() >= 1).await;
    let first = router.recv().await.unwrap();
    // Several silence limits pass while it stays paused: the router drops silent peers meanwhile.
    for _ in 0..3 {
        let mut silent = raw(router.local_addr(), SocketType::Req).await;
        until_closed(&mut silent).await;
    }
    router
        .reply(&first.peer, vec![Bytes::from_static(b"while paused")])
        .await
        .unwrap();
    loop {
        let f = tokio::time::timeout(T, c.read_frame())
            .await
            .unwrap()
            .unwrap();
        if let Frame::Message { body, more: false } = f {
            assert_eq!(&body[..], b"while paused");
            break;
        }
    }
    assert_eq!(router.peer_count(), 1, "the paused peer was dropped");
    // Every request arrives, in order: none was dropped at the queue's limit.
    assert_eq!(first.frames[1], Bytes::from_static(b"req 0"));
    for i in 1..sent {
        let m = tokio::time::timeout(T, router.recv())
            .await
            .expect("a request was lost at the queue's limit")
            .unwrap();
        assert_eq!(m.frames[1], Bytes::from(format!("req {i}")));
    }
    // Reading again: PINGs are answered, the next request is delivered.
    ping_pong(&mut c, b"after").await;
    c.send_message(&[Bytes::new(), Bytes::from_static(b"after")])
        .await
        .unwrap();
    let m = tokio::time::timeout(T, router.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.frames[1][..], b"after");
}

#[tokio::test]
async fn a_paused_router_peer_does_not_hold_up_the_others() {
    let mut router = Router::bind(
        any(),
        RouterOptions {
            queue: 2,
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut busy = raw(router.local_addr(), SocketType::Req).await;
    for i in 0..20 {
        busy.send_message(&[Bytes::new(), Bytes::from(format!("busy {i}"))])
            .await
            .unwrap();
    }
    wait_until("the busy peer to be paused", T, || {
        router.paused_inbound() >= 1
    })
    .await;
    let mut other = raw(router.local_addr(), SocketType::Req).await;
    other
        .send_message(&[Bytes::new(), Bytes::from_static(b"other")])
        .await
        .unwrap();
    // The busy peer's 20 and the other's one all arrive.
    let mut got = Vec::new();
    while got.len() < 21 {
        let m = tokio::time::timeout(T, router.recv())
            .await
            .unwrap()
            .unwrap();
        got.push(m.frames[1].clone());
    }
    assert!(got.contains(&Bytes::from_static(b"other")));
    let busy_order: Vec<_> = got
        .iter()
        .filter(|b| b.starts_with(b"busy"))
        .cloned()
        .collect();
    let want: Vec<_> = (0..20).map(|i| Bytes::from(format!("busy {i}"))).collect();
    assert_eq!(busy_order, want);
}

#[tokio::test]
async fn subscriber_whose_app_never_reads_keeps_its_connection_and_counts_drops() {
    use saltgate_wire::zmtp::{SubOptions, Subscriber};
    let publisher = Publisher::bind(
        any(),
        PubOptions {
            heartbeat: Some(Heartbeat {
                interval: Duration::from_millis(50),
                timeout: Duration::from_millis(200),
                ttl: Duration::ZERO,
            }),
            ..PubOptions::default()
        },
    )
    .await
    .unwrap();
    let mut sub = Subscriber::connect(
        publisher.local_addr(),
        SubOptions {
            queue: 2,
            // A drop would show as a quick reconnect.
            reconnect: saltgate_wire::zmtp::ReconnectPolicy {
                recon_default: Duration::from_millis(20),
                recon_max: Duration::from_millis(20),
                recon_randomize: true,
            },
            ..SubOptions::default()
        },
    );
    sub.subscribe(Bytes::new());
    assert!(publisher.wait_for_subscribed(1, T).await);
    for i in 0..10u8 {
        assert_eq!(publisher.publish(vec![Bytes::from(vec![i])]).queued, 1);
    }
    wait_until("the drops to be counted", T, || sub.dropped_inbound() == 8).await;
    // Several of the publisher's silence timeouts pass without a reconnect: its PINGs are
    // still answered.
    assert!(
        !sub.wait_connects(2, Duration::from_millis(600)).await,
        "the publisher dropped the subscriber"
    );
    assert_eq!(sub.connect_count(), 1);
    assert!(sub.is_connected());
    assert_eq!(publisher.subscriber_count(), 1);
    assert_eq!(sub.recv().await.unwrap(), vec![Bytes::from(vec![0u8])]);
    assert_eq!(sub.recv().await.unwrap(), vec![Bytes::from(vec![1u8])]);
}

/// Sends a frame header announcing `size` bytes (and no body); returns how the peer reacted.
async fn announce(addr: SocketAddr, ty: SocketType, size: u64) -> Result<(), ZmtpError> {
    let mut c = raw(addr, ty).await;
    let mut header = vec![0x02u8];
    header.extend_from_slice(&size.to_be_bytes());
    c.send_encoded(&header).await?;
    // 1 s: a refusal reaches us in microseconds, but a loaded CI machine may stall this
    // single-threaded runtime for a few hundred ms.
    match tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            c.read_frame().await?;
        }
    })
    .await
    {
        Ok(r) => r,
        Err(_) => Ok(()), // still open, waiting for the body
    }
}

#[tokio::test]
async fn each_role_refuses_a_frame_over_its_default_limit_on_the_header() {
    let publisher = Publisher::bind(any(), PubOptions::default()).await.unwrap();
    assert_eq!(
        PubOptions::default().max_frame_size,
        PUB_DEFAULT_MAX_FRAME_SIZE
    );
    let pub_addr = publisher.local_addr();
    let small = PUB_DEFAULT_MAX_FRAME_SIZE as u64;
    assert!(announce(pub_addr, SocketType::Sub, small).await.is_ok());
    assert!(announce(pub_addr, SocketType::Sub, small + 1)
        .await
        .is_err());

    let router = Router::bind(any(), RouterOptions::default()).await.unwrap();
    assert_eq!(
        RouterOptions::default().max_frame_size,
        ROUTER_DEFAULT_MAX_FRAME_SIZE
    );
    let big = ROUTER_DEFAULT_MAX_FRAME_SIZE as u64;
    assert!(announce(router.local_addr(), SocketType::Req, big)
        .await
        .is_ok());
    assert!(announce(router.local_addr(), SocketType::Req, big + 1)
        .await
        .is_err());
}

#[tokio::test]
async fn a_messages_frames_share_its_limit_so_the_header_of_the_excess_frame_is_refused() {
    let mut router = Router::bind(
        any(),
        RouterOptions {
            max_frame_size: 1000,
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut ok = raw(router.local_addr(), SocketType::Req).await;
    ok.send_message(&[
        Bytes::new(),
        Bytes::from(vec![1u8; 500]),
        Bytes::from(vec![2u8; 500]),
    ])
    .await
    .unwrap();
    let m = tokio::time::timeout(T, router.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.frames.len(), 3);
    // 600 + a header announcing 600: refused on that header, with no body sent.
    let mut c = raw(router.local_addr(), SocketType::Req).await;
    let mut bytes = bytes::BytesMut::new();
    saltgate_wire::zmtp::frame::encode_frame(&mut bytes, 1, &[3u8; 600]);
    bytes.extend_from_slice(&[0x02, 0, 0, 0, 0, 0, 0, 0x02, 0x58]);
    c.send_encoded(&bytes).await.unwrap();
    let closed = tokio::time::timeout(T, async {
        loop {
            if c.read_frame().await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a message over the limit was not refused");
}

#[tokio::test]
async fn router_at_max_connections_leaves_the_next_peer_in_the_backlog_until_one_leaves() {
    let mut router = Router::bind(
        any(),
        RouterOptions {
            max_connections: Some(1),
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let addr = router.local_addr();
    let first = raw(addr, SocketType::Req).await;
    // The second peer's TCP connect completes (kernel backlog), but nobody greets it.
    let mut hs = HandshakeConfig::new(SocketType::Req);
    hs.timeout = Duration::from_millis(300);
    let err = Connection::connect(addr, &hs).await.unwrap_err();
    assert!(matches!(err, ZmtpError::Timeout(_)), "{err}");
    assert_eq!(router.accept_stats().accepted(), 1);
    drop(first);
    // The permit comes back when the first connection ends; the next peer is served.
    let mut second = tokio::time::timeout(T, async {
        loop {
            match Connection::connect(addr, &hs).await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("no connection admitted after the first one left");
    second
        .send_message(&[Bytes::new(), Bytes::from_static(b"in")])
        .await
        .unwrap();
    let m = tokio::time::timeout(T, router.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.frames[1][..], b"in");
}
