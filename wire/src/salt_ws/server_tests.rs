//! The `ws` request server against raw sockets and the seam's own `ws` client.

use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::salt_ws::{accept_key, client_frame, handshake_request, OP_PING, OP_TEXT};
use crate::transport::{AnyRequestServer, RequestClient, RequestClientOptions, Transport};

const T: Duration = Duration::from_secs(10);
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

async fn server(opts: RequestServerOptions) -> AnyRequestServer {
    Transport::Ws
        .bind_request_server("127.0.0.1:0".parse().unwrap(), &opts)
        .await
        .unwrap()
}

async fn next(s: &mut AnyRequestServer) -> Request {
    match tokio::time::timeout(T, s.recv()).await.unwrap().unwrap() {
        Incoming::Request(r) => r,
        other => panic!("{other:?}"),
    }
}

/// A raw client, upgraded on `/`; returns the stream and any bytes read past the 101.
async fn upgraded(addr: SocketAddr) -> (TcpStream, WsDecoder) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&handshake_request(&addr.to_string(), "/", KEY))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(T, c.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed during the upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(len) = super::super::read_handshake(&buf, KEY).unwrap() {
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

/// Reads until the server closes `c`; true if it did within 10 s.
async fn closed(c: &mut TcpStream) -> bool {
    let mut b = [0u8; 1024];
    tokio::time::timeout(T, async {
        loop {
            match c.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn requests_and_replies_through_the_seam_on_one_kept_websocket() {
    let mut s = server(RequestServerOptions::default()).await;
    let addr = RequestServer::local_addr(&s);
    let r = s.replier();
    let serve = tokio::spawn(async move {
        for _ in 0..3 {
            let q = next(&mut s).await;
            // The reply is the request reversed: its bytes crossed the seam as they were sent.
            let mut back = q.payload.to_vec();
            back.reverse();
            r.reply(&q.reply_to, Bytes::from(back)).await.unwrap();
        }
        s
    });
    let mut c =
        crate::salt_ws::client::WsRequestClient::new(addr, &RequestClientOptions::default());
    for i in 0..3u8 {
        let req = Bytes::from(vec![0x93, i, 1, 2]);
        let rep = c.send(req, T).await.unwrap();
        assert_eq!(&rep[..], &[2, 1, i, 0x93]);
    }
    assert_eq!(c.dial_count(), 1, "one websocket for every request");
    let s = serve.await.unwrap();
    assert_eq!(s.replier().peer_count(), 1);
    // The server closing the idle websocket: the next request dials again.
    drop(s);
    let mut s = server(RequestServerOptions::default()).await;
    let mut c = crate::salt_ws::client::WsRequestClient::new(
        RequestServer::local_addr(&s),
        &RequestClientOptions::default(),
    );
    let r = s.replier();
    let serve = tokio::spawn(async move {
        let q = next(&mut s).await;
        r.reply(&q.reply_to, Bytes::from_static(b"\xc3"))
            .await
            .unwrap();
        s
    });
    assert_eq!(
        &c.send(Bytes::from_static(b"\xc0"), T).await.unwrap()[..],
        b"\xc3"
    );
    drop(serve.await.unwrap());
    let e = c
        .send(Bytes::from_static(b"\xc0"), Duration::from_secs(2))
        .await;
    assert!(e.is_err(), "no server, no reply");
}

#[tokio::test]
async fn control_frames_are_answered_and_a_text_close_closes() {
    let mut s = server(RequestServerOptions::default()).await;
    let addr = RequestServer::local_addr(&s);
    let (mut c, mut dec) = upgraded(addr).await;
    c.write_all(&client_frame(OP_PING, b"p1")).await.unwrap();
    assert_eq!(
        read_msg(&mut c, &mut dec).await,
        Some(WsMessage::Pong(b"p1".to_vec()))
    );
    // A fragmented request with a ping in between is one request.
    let mut first = client_frame(OP_BINARY, b"\x92\x01");
    first[0] &= 0x7f;
    c.write_all(&first).await.unwrap();
    c.write_all(&client_frame(OP_PING, b"")).await.unwrap();
    c.write_all(&client_frame(super::super::OP_CONT, b"\x02"))
        .await
        .unwrap();
    let q = next(&mut s).await;
    assert_eq!(&q.payload[..], b"\x92\x01\x02");
    assert_eq!(
        read_msg(&mut c, &mut dec).await,
        Some(WsMessage::Pong(vec![]))
    );
    s.replier()
        .reply(&q.reply_to, Bytes::from_static(b"\xc2"))
        .await
        .unwrap();
    assert_eq!(
        read_msg(&mut c, &mut dec).await,
        Some(WsMessage::Binary(b"\xc2".to_vec()))
    );
    c.write_all(&client_frame(OP_TEXT, b"close")).await.unwrap();
    assert_eq!(
        read_msg(&mut c, &mut dec).await,
        Some(WsMessage::Close(Some(1000)))
    );
    assert!(closed(&mut c).await);
    assert_eq!(RequestServer::refusals(&s).malformed(), 0);
}

#[tokio::test]
async fn hostile_peers_are_cut_and_counted() {
    let s = server(RequestServerOptions {
        untrusted_max_payload: Some(1024),
        ..RequestServerOptions::default()
    })
    .await;
    let addr = RequestServer::local_addr(&s);
    let refusals = RequestServer::refusals(&s);
    // A plain HTTP request: a 400 naming what is missing.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(T, c.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("Upgrade: websocket"), "{answer}");
    // A ZeroMQ minion's greeting.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f])
        .await
        .unwrap();
    assert!(closed(&mut c).await);
    // An unmasked frame.
    let (mut c, mut dec) = upgraded(addr).await;
    c.write_all(&server_frame(OP_BINARY, b"x")).await.unwrap();
    assert_eq!(
        read_msg(&mut c, &mut dec).await,
        Some(WsMessage::Close(Some(CLOSE_PROTOCOL)))
    );
    assert!(closed(&mut c).await);
    wait_until("three malformed", T, || refusals.malformed() == 3).await;
    // A header announcing more than an untrusted peer may send: cut before the payload.
    let (mut c, mut dec) = upgraded(addr).await;
    let mut f = vec![0x82, 0x80 | 127];
    f.extend((60u64 << 20).to_be_bytes());
    f.extend([1, 2, 3, 4]);
    c.write_all(&f).await.unwrap();
    assert_eq!(
        read_msg(&mut c, &mut dec).await,
        Some(WsMessage::Close(Some(CLOSE_TOO_BIG)))
    );
    wait_until("oversized counted", T, || refusals.oversized() == 1).await;
    // The upgrade answer holds the accept of the key.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&handshake_request("h", "/anything", KEY))
        .await
        .unwrap();
    let mut b = [0u8; 512];
    let n = c.read(&mut b).await.unwrap();
    assert!(String::from_utf8_lossy(&b[..n]).contains(&accept_key(KEY)));
}

#[tokio::test]
async fn a_silent_connection_and_a_trickled_request_are_cut_at_their_deadlines() {
    let s = server(RequestServerOptions {
        payload_timeout: Some(Duration::from_millis(300)),
        ..RequestServerOptions::default()
    })
    .await;
    let addr = RequestServer::local_addr(&s);
    let refusals = RequestServer::refusals(&s);
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed(&mut silent).await);
    let (mut upgraded_silent, _) = upgraded(addr).await;
    assert!(closed(&mut upgraded_silent).await);
    wait_until("the silent ones counted", T, || {
        refusals.handshake_timeouts() == 2
    })
    .await;
    let (mut c, _) = upgraded(addr).await;
    let frame = client_frame(OP_BINARY, &[1u8; 200]);
    let trickle = tokio::spawn(async move {
        for b in frame {
            if c.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    wait_until("the trickle cut", T, || refusals.slow() == 1).await;
    trickle.abort();
}
