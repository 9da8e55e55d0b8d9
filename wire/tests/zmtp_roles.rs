//! Behaviour of our socket roles, on real loopback sockets, with our own and hand-driven peers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use saltgate_test_support::wait_until;
use saltgate_wire::zmtp::{
    Command, Connection, Frame, HandshakeConfig, Heartbeat, PubOptions, Publisher, ReconnectPolicy,
    ReqError, ReqOptions, ReqSocket, Router, RouterError, RouterOptions, SocketType, SubOptions,
    Subscriber, ZmtpError,
};

const T: Duration = Duration::from_secs(10);

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn fast_reconnect() -> SubOptions {
    SubOptions {
        reconnect: ReconnectPolicy {
            recon_default: Duration::from_millis(20),
            recon_max: Duration::from_millis(20),
            recon_randomize: true,
        },
        ..SubOptions::default()
    }
}

async fn raw(addr: SocketAddr, ty: SocketType, identity: &'static [u8]) -> Connection {
    let mut hs = HandshakeConfig::new(ty);
    hs.identity = Bytes::from_static(identity);
    Connection::connect(addr, &hs).await.expect("raw connect")
}

/// Reads until the peer closes; returns how long that took. Never answers anything.
async fn until_closed(c: &mut Connection) -> Duration {
    let start = Instant::now();
    loop {
        match tokio::time::timeout(T, c.read_frame()).await {
            Err(_) => panic!("peer did not close within {T:?}"),
            Ok(Err(ZmtpError::Eof | ZmtpError::Io(_))) => return start.elapsed(),
            Ok(Err(e)) => panic!("{e}"),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn our_sub_and_pub_filter_by_prefix_and_honour_unsubscribe() {
    let publisher = Publisher::bind(any(), PubOptions::default()).await.unwrap();
    let mut sub = Subscriber::connect(publisher.local_addr(), SubOptions::default());
    sub.subscribe(Bytes::from_static(b"broadcast"));
    sub.subscribe(Bytes::from_static(b"abc"));
    assert!(publisher.wait_for_subscribed(1, T).await);
    // Both subscriptions travel as ZMTP 3.1 SUBSCRIBE commands; wait for the second one too.
    let deadline = Instant::now() + T;
    while publisher
        .publish(vec![Bytes::from_static(b"abcdef")])
        .queued
        == 0
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        publisher.publish(vec![Bytes::from_static(b"zzz")]).queued,
        0
    );
    assert_eq!(
        publisher
            .publish(vec![Bytes::from_static(b"broadcast")])
            .queued,
        1
    );
    assert_eq!(
        sub.recv().await.unwrap(),
        vec![Bytes::from_static(b"abcdef")]
    );
    assert_eq!(
        sub.recv().await.unwrap(),
        vec![Bytes::from_static(b"broadcast")]
    );
    sub.unsubscribe(Bytes::from_static(b"abc"));
    let deadline = Instant::now() + T;
    while publisher
        .publish(vec![Bytes::from_static(b"abc-probe")])
        .queued
        != 0
    {
        assert!(Instant::now() < deadline, "CANCEL never applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_drops_and_counts_for_a_stalled_subscriber_without_slowing_the_others() {
    let opts = PubOptions {
        hwm: 32,
        heartbeat: None,
        ..PubOptions::default()
    };
    let publisher = Publisher::bind(any(), opts).await.unwrap();
    // The stalled subscriber subscribes to everything and then never reads.
    let mut stalled = raw(publisher.local_addr(), SocketType::Sub, b"").await;
    stalled
        .send_command(&Command::Subscribe(Bytes::new()))
        .await
        .unwrap();
    let mut fast = Subscriber::connect(publisher.local_addr(), SubOptions::default());
    fast.subscribe(Bytes::new());
    assert!(publisher.wait_for_subscribed(2, T).await);

    let payload = Bytes::from(vec![7u8; 256 * 1024]);
    let n = 200;
    // The fast subscriber reports each message; the publisher paces itself on those reports,
    // so the fast queue never fills however loaded the machine is, while the stalled one does.
    let (got_tx, mut got_rx) = tokio::sync::watch::channel(0usize);
    let reader = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            match tokio::time::timeout(T, fast.recv()).await {
                Ok(Some(_)) => {
                    got += 1;
                    let _ = got_tx.send(got);
                }
                _ => break,
            }
        }
        got
    });
    let mut slowest_publish = Duration::ZERO;
    for i in 0..n {
        let start = Instant::now();
        let r = publisher.publish(vec![payload.clone()]);
        slowest_publish = slowest_publish.max(start.elapsed());
        assert_eq!(r.queued + r.dropped, 2);
        tokio::time::timeout(T, got_rx.wait_for(|&g| g > i))
            .await
            .expect("fast subscriber stalled")
            .expect("reader alive");
    }
    assert_eq!(
        reader.await.unwrap(),
        n,
        "the fast subscriber lost messages"
    );
    assert!(
        publisher.dropped_total() > 0,
        "the stalled subscriber never hit its HWM"
    );
    assert!(
        slowest_publish < Duration::from_secs(1),
        "publish blocked for {slowest_publish:?}"
    );
    drop(stalled);
}

#[tokio::test]
async fn sub_reconnects_and_resubscribes_after_the_publisher_restarts() {
    let publisher = Publisher::bind(any(), PubOptions::default()).await.unwrap();
    let addr = publisher.local_addr();
    let mut sub = Subscriber::connect(addr, fast_reconnect());
    sub.subscribe(Bytes::from_static(b"t"));
    assert!(publisher.wait_for_subscribed(1, T).await);
    drop(publisher);
    // The aborted accept task releases the port asynchronously: retry the bind briefly.
    let deadline = Instant::now() + T;
    let publisher = loop {
        match Publisher::bind(addr, PubOptions::default()).await {
            Ok(p) => break p,
            Err(e) if Instant::now() < deadline => {
                assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("rebind: {e}"),
        }
    };
    assert!(sub.wait_connects(2, T).await, "no reconnect");
    assert!(
        publisher.wait_for_subscribed(1, T).await,
        "subscription not re-sent"
    );
    publisher.publish(vec![Bytes::from_static(b"t1")]);
    let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
    assert_eq!(got, vec![Bytes::from_static(b"t1")]);
}

#[tokio::test]
async fn pub_heartbeat_drops_a_subscriber_that_never_answers_ping_but_keeps_ours() {
    // A 1 s timeout: ours must answer within it even when a loaded CI machine stalls this
    // single-threaded runtime for a few hundred ms.
    let opts = PubOptions {
        heartbeat: Some(Heartbeat {
            interval: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
            ttl: Duration::ZERO,
        }),
        ..PubOptions::default()
    };
    let publisher = Publisher::bind(any(), opts).await.unwrap();
    let sub = Subscriber::connect(publisher.local_addr(), SubOptions::default());
    sub.subscribe(Bytes::new());
    let mut silent = raw(publisher.local_addr(), SocketType::Sub, b"").await;
    let took = until_closed(&mut silent).await;
    assert!(took < Duration::from_secs(5), "dropped only after {took:?}");
    // Two more timeouts pass (two more silent SUBs are dropped meanwhile): ours, which answers,
    // is kept on its first connection.
    for _ in 0..2 {
        let mut silent = raw(publisher.local_addr(), SocketType::Sub, b"").await;
        until_closed(&mut silent).await;
    }
    wait_until("the silent SUBs to be gone", T, || {
        publisher.subscriber_count() <= 1
    })
    .await;
    assert_eq!(publisher.subscriber_count(), 1);
    assert_eq!(sub.connect_count(), 1);
}

#[tokio::test]
async fn every_ping_is_answered_with_a_pong_echoing_its_context() {
    let router = Router::bind(
        any(),
        RouterOptions {
            heartbeat: None,
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut c = raw(router.local_addr(), SocketType::Req, b"").await;
    for ctx in [&b""[..], b"abc", b"0123456789abcdef"] {
        c.send_command(&Command::Ping {
            ttl: 0,
            context: Bytes::copy_from_slice(ctx),
        })
        .await
        .unwrap();
        let f = tokio::time::timeout(T, c.read_frame())
            .await
            .unwrap()
            .unwrap();
        let Frame::Command(body) = f else {
            panic!("{f:?}")
        };
        assert_eq!(
            Command::parse(&body).unwrap(),
            Command::Pong {
                context: Bytes::copy_from_slice(ctx)
            }
        );
    }
}

#[tokio::test]
async fn a_peers_ping_ttl_makes_us_close_when_it_then_goes_silent() {
    let router = Router::bind(
        any(),
        RouterOptions {
            heartbeat: None,
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut c = raw(router.local_addr(), SocketType::Req, b"").await;
    c.send_command(&Command::Ping {
        ttl: 3, // 300 ms
        context: Bytes::new(),
    })
    .await
    .unwrap();
    let took = until_closed(&mut c).await;
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn oversized_frame_closes_the_connection() {
    let mut router = Router::bind(
        any(),
        RouterOptions {
            max_frame_size: 1024,
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut c = raw(router.local_addr(), SocketType::Req, b"").await;
    c.send_message(&[Bytes::new(), Bytes::from(vec![0u8; 2000])])
        .await
        .unwrap();
    until_closed(&mut c).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), router.recv())
            .await
            .is_err(),
        "oversized message was delivered"
    );
}

#[tokio::test]
async fn req_times_out_then_redials_for_the_next_request() {
    let mut router = Router::bind(any(), RouterOptions::default()).await.unwrap();
    let mut req = ReqSocket::new(router.local_addr(), ReqOptions::default());
    let first = req
        .request(
            vec![Bytes::from_static(b"lost")],
            Duration::from_millis(200),
        )
        .await;
    assert!(matches!(first, Err(ReqError::Timeout(_))), "{first:?}");
    let lost = router.recv().await.unwrap();
    // A late reply to the abandoned request must not be taken for the next answer.
    let _ = router
        .reply(&lost.peer, vec![Bytes::from_static(b"late")])
        .await;
    let server = async {
        let m = router.recv().await.unwrap();
        assert_eq!(m.frames[1], Bytes::from_static(b"second"));
        router
            .reply(&m.peer, vec![Bytes::from_static(b"answer")])
            .await
            .unwrap();
    };
    let (reply, ()) = tokio::join!(req.request(vec![Bytes::from_static(b"second")], T), server);
    assert_eq!(reply.unwrap(), vec![Bytes::from_static(b"answer")]);
    assert_eq!(req.dial_count(), 2);
}

#[tokio::test]
async fn req_to_a_closed_port_is_a_connect_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut req = ReqSocket::new(port, ReqOptions::default());
    let err = req.request(vec![Bytes::new()], T).await.unwrap_err();
    assert!(matches!(err, ReqError::Connect { .. }), "{err}");
}

#[tokio::test]
async fn router_uses_the_peer_identity_and_hands_it_over_to_the_newest_peer() {
    let router = Router::bind(any(), RouterOptions::default()).await.unwrap();
    let mut old = raw(router.local_addr(), SocketType::Req, b"minion1").await;
    let deadline = Instant::now() + T;
    while router.peer_count() < 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut new = raw(router.local_addr(), SocketType::Req, b"minion1").await;
    // The old connection is closed when the new one takes the id over.
    until_closed(&mut old).await;
    router
        .send(
            &Bytes::from_static(b"minion1"),
            vec![Bytes::new(), Bytes::from_static(b"hi")],
        )
        .await
        .unwrap();
    let f = new.read_frame().await.unwrap();
    assert_eq!(
        f,
        Frame::Message {
            body: Bytes::new(),
            more: true
        }
    );
    assert_eq!(
        router
            .send(&Bytes::from_static(b"nobody"), vec![Bytes::new()])
            .await,
        Err(RouterError::UnknownPeer(Bytes::from_static(b"nobody")))
    );
}

#[tokio::test]
async fn router_generates_distinct_ids_for_anonymous_peers() {
    let mut router = Router::bind(any(), RouterOptions::default()).await.unwrap();
    let mut a = raw(router.local_addr(), SocketType::Req, b"").await;
    let mut b = raw(router.local_addr(), SocketType::Req, b"").await;
    a.send_message(&[&b""[..], b"from a"]).await.unwrap();
    b.send_message(&[&b""[..], b"from b"]).await.unwrap();
    let m1 = router.recv().await.unwrap();
    let m2 = router.recv().await.unwrap();
    assert_ne!(m1.peer, m2.peer);
    assert_eq!(m1.peer.len(), 5);
    assert_eq!(m1.peer[0], 0);
    for m in [&m1, &m2] {
        let answer = [b"to ".as_slice(), &m.frames[1]].concat();
        router
            .reply(&m.peer, vec![Bytes::from(answer)])
            .await
            .unwrap();
    }
    for (c, want) in [(&mut a, &b"to from a"[..]), (&mut b, b"to from b")] {
        let _delim = c.read_frame().await.unwrap();
        let Frame::Message { body, .. } = c.read_frame().await.unwrap() else {
            panic!()
        };
        assert_eq!(&body[..], want);
    }
}

#[tokio::test]
async fn handshake_with_an_incompatible_socket_type_is_refused() {
    let publisher = Publisher::bind(any(), PubOptions::default()).await.unwrap();
    let err = Connection::connect(
        publisher.local_addr(),
        &HandshakeConfig::new(SocketType::Req),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, ZmtpError::IncompatibleSocketType { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn pub_accepts_legacy_0x01_and_0x00_subscription_frames() {
    let publisher = Publisher::bind(any(), PubOptions::default()).await.unwrap();
    let mut c = raw(publisher.local_addr(), SocketType::Sub, b"").await;
    c.send_message(&[&b"\x01abc"[..]]).await.unwrap();
    assert!(publisher.wait_for_subscribed(1, T).await);
    assert_eq!(
        publisher.publish(vec![Bytes::from_static(b"abcd")]).queued,
        1
    );
    assert_eq!(
        publisher.publish(vec![Bytes::from_static(b"xyz")]).queued,
        0
    );
    let f = c.read_frame().await.unwrap();
    assert_eq!(
        f,
        Frame::Message {
            body: Bytes::from_static(b"abcd"),
            more: false
        }
    );
    c.send_message(&[&b"\x00abc"[..]]).await.unwrap();
    let deadline = Instant::now() + T;
    while publisher.subscribed_count() != 0 {
        assert!(Instant::now() < deadline, "legacy cancel never applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn degenerate_heartbeat_settings_neither_panic_nor_drop_peers() {
    for hb in [
        Heartbeat {
            interval: Duration::ZERO,
            timeout: Duration::ZERO,
            ttl: Duration::ZERO,
        },
        Heartbeat {
            interval: Duration::MAX,
            timeout: Duration::MAX,
            ttl: Duration::MAX,
        },
    ] {
        let publisher = Publisher::bind(
            any(),
            PubOptions {
                heartbeat: Some(hb),
                ..PubOptions::default()
            },
        )
        .await
        .unwrap();
        let mut sub = Subscriber::connect(publisher.local_addr(), SubOptions::default());
        sub.subscribe(Bytes::new());
        assert!(publisher.wait_for_subscribed(1, Duration::MAX).await);
        // The connection's driver turns many times with these settings (each turn computes its
        // PING and silence deadlines): every message arrives, on the first connection.
        for i in 0..50 {
            let msg = Bytes::from(format!("turn {i}"));
            publisher.publish(vec![msg.clone()]);
            let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
            assert_eq!(got, vec![msg]);
        }
        publisher.publish(vec![Bytes::from_static(b"still here")]);
        let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
        assert_eq!(got, vec![Bytes::from_static(b"still here")]);
        assert_eq!(sub.connect_count(), 1);
    }
}

#[tokio::test]
async fn a_large_frame_trickling_in_counts_as_traffic_for_the_heartbeat() {
    use saltgate_wire::zmtp::greeting::{exchange, Greeting};
    use saltgate_wire::zmtp::Properties;
    use tokio::io::AsyncWriteExt;

    let mut router = Router::bind(
        any(),
        RouterOptions {
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
    // A hand-driven REQ that never answers PINGs but sends a 2000-byte frame in slow pieces.
    let mut s = tokio::net::TcpStream::connect(router.local_addr())
        .await
        .unwrap();
    exchange(&mut s, &Greeting::ours(false)).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    Command::Ready(Properties::default().with("Socket-Type", "REQ")).encode_frame(&mut buf);
    buf.extend_from_slice(b"\x01\x00"); // empty delimiter, MORE
    buf.extend_from_slice(&[0x02, 0, 0, 0, 0, 0, 0, 0x07, 0xd0]); // long frame, 2000 bytes
    s.write_all(&buf).await.unwrap();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(&[b'z'; 100]).await.unwrap();
    }
    // 1 s of trickle is over three silence timeouts: the frame still arrives whole.
    let m = tokio::time::timeout(T, router.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.frames[1].len(), 2000);
}
