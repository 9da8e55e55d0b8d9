//! Our ZMTP roles against the `zeromq` crate (zmq.rs 0.7), an independent implementation that
//! advertises ZMTP 3.0: it needs legacy `0x01` subscriptions, and must never be sent a PING
//! (it rejects unknown commands).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use saltgate_wire::zmtp::{
    Connection, HandshakeConfig, Heartbeat, PubOptions, Publisher, ReqOptions, ReqSocket, Router,
    RouterOptions, SocketType, SubOptions, Subscriber,
};
use zeromq::{Endpoint, Socket, SocketRecv, SocketSend, ZmqMessage};

const T: Duration = Duration::from_secs(10);

fn fast_heartbeat() -> Option<Heartbeat> {
    Some(Heartbeat {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
        ttl: Duration::ZERO,
    })
}

/// Returns once the publisher at `addr` has dropped a ZMTP 3.1 SUB that never answers its PINGs:
/// proof, on the publisher's own clock, that a whole heartbeat timeout passed meanwhile.
async fn heartbeat_timeout_passes(addr: SocketAddr) {
    let mut silent = Connection::connect(addr, &HandshakeConfig::new(SocketType::Sub))
        .await
        .expect("silent SUB connects");
    loop {
        match tokio::time::timeout(T, silent.read_frame()).await {
            Err(_) => panic!("the publisher never dropped a silent SUB"),
            Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

fn tcp_port(ep: &Endpoint) -> u16 {
    match ep {
        Endpoint::Tcp(_, port) => *port,
        other => panic!("not tcp: {other:?}"),
    }
}

#[tokio::test]
async fn our_pub_serves_a_zmtp_3_0_zeromq_sub_with_legacy_subscriptions_and_no_pings() {
    let opts = PubOptions {
        heartbeat: fast_heartbeat(),
        ..PubOptions::default()
    };
    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), opts)
        .await
        .unwrap();
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&format!("tcp://{}", publisher.local_addr()))
        .await
        .unwrap();
    sub.subscribe("salt").await.unwrap();
    assert!(publisher.wait_for_subscribed(1, T).await);
    // A whole heartbeat timeout passes, several PING rounds (a PING would make zmq.rs drop the
    // connection): the publisher drops a silent ZMTP 3.1 SUB meanwhile.
    heartbeat_timeout_passes(publisher.local_addr()).await;
    wait_until("the silent SUB to be gone", T, || {
        publisher.subscriber_count() <= 1
    })
    .await;
    assert_eq!(publisher.subscriber_count(), 1);
    assert_eq!(
        publisher.publish(vec![Bytes::from_static(b"other")]).queued,
        0
    );
    let r = publisher.publish(vec![
        Bytes::from_static(b"salt/job"),
        Bytes::from_static(b"x"),
    ]);
    assert_eq!(r.queued, 1);
    let msg = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
    assert_eq!(
        msg.into_vec(),
        vec![Bytes::from_static(b"salt/job"), Bytes::from_static(b"x")]
    );
}

#[tokio::test]
async fn our_sub_receives_from_a_zeromq_pub() {
    let mut publisher = zeromq::PubSocket::new();
    let ep = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", tcp_port(&ep)).parse().unwrap();
    let mut sub = Subscriber::connect(addr, SubOptions::default());
    sub.subscribe(Bytes::from_static(b"b"));
    assert!(sub.wait_connects(1, T).await);
    // zmq.rs applies the (legacy) subscription asynchronously: publish until one arrives.
    let got = tokio::time::timeout(T, async {
        loop {
            publisher
                .send(ZmqMessage::from("a-filtered"))
                .await
                .unwrap();
            publisher.send(ZmqMessage::from("broadcast")).await.unwrap();
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
                return m;
            }
        }
    })
    .await
    .expect("a message within 10 s");
    assert_eq!(got, vec![Bytes::from_static(b"broadcast")]);
}

#[tokio::test]
async fn our_router_answers_a_zeromq_req() {
    let mut router = Router::bind(
        "127.0.0.1:0".parse().unwrap(),
        RouterOptions {
            heartbeat: fast_heartbeat(),
            ..RouterOptions::default()
        },
    )
    .await
    .unwrap();
    let mut req = zeromq::ReqSocket::new();
    req.connect(&format!("tcp://{}", router.local_addr()))
        .await
        .unwrap();
    for i in 0..3 {
        req.send(ZmqMessage::from(format!("hello {i}")))
            .await
            .unwrap();
        let msg = tokio::time::timeout(T, router.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(msg.frames.len(), 2);
        assert!(msg.frames[0].is_empty());
        assert_eq!(msg.frames[1], Bytes::from(format!("hello {i}")));
        router
            .reply(&msg.peer, vec![Bytes::from(format!("world {i}"))])
            .await
            .unwrap();
        let rep = tokio::time::timeout(T, req.recv()).await.unwrap().unwrap();
        assert_eq!(rep.into_vec(), vec![Bytes::from(format!("world {i}"))]);
    }
}

#[tokio::test]
async fn our_req_talks_to_a_zeromq_rep() {
    let mut rep = zeromq::RepSocket::new();
    let ep = rep.bind("tcp://127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", tcp_port(&ep)).parse().unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let m = rep.recv().await.unwrap();
            let mut frames = m.into_vec();
            frames.insert(0, Bytes::from_static(b"echo"));
            let reply = ZmqMessage::try_from(std::collections::VecDeque::from(frames)).unwrap();
            rep.send(reply).await.unwrap();
        }
        rep
    });
    let mut req = ReqSocket::new(addr, ReqOptions::default());
    for i in 0..2 {
        let body = Bytes::from(format!("r{i}"));
        let reply = req.request(vec![body.clone()], T).await.unwrap();
        assert_eq!(reply, vec![Bytes::from_static(b"echo"), body]);
    }
    let _rep = server.await.unwrap();
}
