//! The `ws` publish server with the seam's `ws` subscriber and raw websockets.

use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::salt_ws::{client_frame, handshake_request, read_handshake, OP_CLOSE, OP_PING, WS_PATH};
use crate::transport::{AnyPublishServer, PublishClient, PublishClientOptions, Transport};

const T: Duration = Duration::from_secs(10);
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

async fn publisher() -> AnyPublishServer {
    Transport::Ws
        .bind_publish_server(
            "127.0.0.1:0".parse().unwrap(),
            &PublishServerOptions::default(),
        )
        .await
        .unwrap()
}

async fn raw_subscriber(addr: SocketAddr) -> (TcpStream, WsDecoder) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&handshake_request(&addr.to_string(), WS_PATH, KEY))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(T, c.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(len) = read_handshake(&buf, KEY).unwrap() {
            let mut dec = WsDecoder::new(1 << 20);
            dec.push(&buf[len..]).unwrap();
            return (c, dec);
        }
    }
}

async fn read_msg(c: &mut TcpStream, dec: &mut WsDecoder) -> Option<WsMessage> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(m) = dec.next_message().unwrap() {
            return Some(m);
        }
        match tokio::time::timeout(T, c.read(&mut chunk)).await.unwrap() {
            Ok(0) | Err(_) => return None,
            Ok(n) => dec.push(&chunk[..n]).unwrap(),
        }
    }
}

#[tokio::test]
async fn every_publish_reaches_every_subscriber_whatever_the_targets() {
    let p = publisher().await;
    let addr = p.local_addr();
    let opts = PublishClientOptions::default();
    let mut a = Transport::Ws.publish_client(addr, &opts).unwrap();
    let mut b = Transport::Ws.publish_client(addr, &opts).unwrap();
    let (mut raw, mut dec) = raw_subscriber(addr).await;
    wait_until("three subscribers", T, || {
        p.subscriber_count() == 3 && a.is_connected() && b.connect_count() == 1
    })
    .await;
    let payload = Bytes::from(vec![0x81, 0xa3, b'e', b'n', b'c', 0xa3, b'a', b'e', b's']);
    // Targeted at a minion none of them is: Salt's ws publisher sends to all the same.
    let r = p.publish(payload.clone(), Targets::Minions(&["nobody"]));
    assert_eq!((r.queued, r.dropped), (3, 0));
    for sub in [&mut a, &mut b] {
        let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
        assert_eq!(got, payload);
    }
    // On the wire: one binary frame holding the payload as a msgpack bin.
    let m = read_msg(&mut raw, &mut dec).await.unwrap();
    let mut want = vec![0xc4, payload.len() as u8];
    want.extend_from_slice(&payload);
    assert_eq!(m, WsMessage::Binary(want));
    // A big one (a bin32 header, fragments none).
    let big = Bytes::from(vec![0xc0; 100_000]);
    p.publish(big.clone(), Targets::All);
    assert_eq!(
        tokio::time::timeout(T, a.recv()).await.unwrap().unwrap(),
        big
    );
    // Pings are answered; a close is echoed and the subscriber forgotten.
    raw.write_all(&client_frame(OP_PING, b"x")).await.unwrap();
    let m = read_msg(&mut raw, &mut dec).await.unwrap();
    assert!(matches!(m, WsMessage::Binary(_)), "{m:?}");
    assert_eq!(
        read_msg(&mut raw, &mut dec).await,
        Some(WsMessage::Pong(b"x".to_vec()))
    );
    raw.write_all(&client_frame(OP_CLOSE, &1000u16.to_be_bytes()))
        .await
        .unwrap();
    assert_eq!(
        read_msg(&mut raw, &mut dec).await,
        Some(WsMessage::Close(Some(1000)))
    );
    wait_until("the raw one forgotten", T, || p.subscriber_count() == 2).await;
    assert_eq!(p.refusals().malformed(), 0);
}

#[tokio::test]
async fn the_subscriber_reconnects_after_the_publisher_restarts() {
    let p = publisher().await;
    let addr = p.local_addr();
    let opts = PublishClientOptions {
        reconnect: crate::transport::ReconnectPolicy {
            recon_default: Duration::from_millis(50),
            recon_max: Duration::from_millis(100),
            recon_randomize: false,
        },
        ..PublishClientOptions::default()
    };
    let mut sub = Transport::Ws.publish_client(addr, &opts).unwrap();
    wait_until("connected", T, || p.subscriber_count() == 1).await;
    drop(p);
    wait_until("the loss seen", T, || !sub.is_connected()).await;
    let p = Transport::Ws
        .bind_publish_server(addr, &PublishServerOptions::default())
        .await
        .unwrap();
    wait_until("reconnected", T, || p.subscriber_count() == 1).await;
    assert_eq!(sub.connect_count(), 2);
    p.publish(Bytes::from_static(b"\xc3"), Targets::All);
    assert_eq!(
        &tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap()[..],
        b"\xc3"
    );
}

#[tokio::test]
async fn a_subscriber_sending_garbage_is_cut_and_counted() {
    let p = publisher().await;
    let addr = p.local_addr();
    let (mut raw, mut dec) = raw_subscriber(addr).await;
    wait_until("one subscriber", T, || p.subscriber_count() == 1).await;
    // A message over the subscriber limit.
    raw.write_all(&client_frame(OP_BINARY, &vec![0; MAX_HELLO + 1]))
        .await
        .unwrap();
    assert_eq!(
        read_msg(&mut raw, &mut dec).await,
        Some(WsMessage::Close(Some(super::super::upgrade::CLOSE_TOO_BIG)))
    );
    wait_until("cut", T, || p.refusals().oversized() == 1).await;
    wait_until("forgotten", T, || p.subscriber_count() == 0).await;
}
