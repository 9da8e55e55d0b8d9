//! The `tcp` request server against raw sockets and the seam's own client.

use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::envelope::{self, map, text, Value};
use crate::salt_tcp::{request_frame, FrameDecoder};
use crate::transport::{RequestClient, RequestClientOptions, Transport};

const T: Duration = Duration::from_secs(10);

async fn server(opts: RequestServerOptions) -> crate::transport::AnyRequestServer {
    Transport::Tcp
        .bind_request_server("127.0.0.1:0".parse().unwrap(), &opts)
        .await
        .unwrap()
}

async fn next(s: &mut crate::transport::AnyRequestServer) -> Request {
    match tokio::time::timeout(T, s.recv()).await.unwrap().unwrap() {
        Incoming::Request(r) => r,
        other => panic!("{other:?}"),
    }
}

/// Reads messages off `c` until `n` whole ones came.
async fn read_messages(c: &mut TcpStream, n: usize) -> Vec<crate::salt_tcp::TcpMessage> {
    let mut dec = FrameDecoder::new(1 << 20);
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while out.len() < n {
        let got = tokio::time::timeout(T, c.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(got > 0, "closed after {} messages", out.len());
        dec.push(&chunk[..got]).unwrap();
        while let Some(m) = dec.next_message().unwrap() {
            out.push(m);
        }
    }
    out
}

/// Whether the server closed `c` within 10 s.
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
async fn replies_echo_their_requests_head_with_several_in_flight() {
    let mut s = server(RequestServerOptions::default()).await;
    let addr = RequestServer::local_addr(&s);
    let mut c = TcpStream::connect(addr).await.unwrap();
    let body = |n: i64| map(vec![("enc", text("clear")), ("load", Value::from(n))]);
    let mut both = request_frame("mid-a", body(1));
    both.extend(request_frame("mid-b", body(2)));
    c.write_all(&both).await.unwrap();
    let (a, b) = (next(&mut s).await, next(&mut s).await);
    // The payload is the body's own bytes.
    assert_eq!(&a.payload[..], &envelope::encode(&body(1))[..]);
    let r = s.replier();
    assert_eq!(r.peer_count(), 1);
    assert!(r.is_connected(&a.reply_to));
    // Answered out of order: each reply carries its own mid.
    r.reply(&b.reply_to, Bytes::from(envelope::encode(&text("two"))))
        .await
        .unwrap();
    r.reply(&a.reply_to, Bytes::from(envelope::encode(&text("one"))))
        .await
        .unwrap();
    let got = read_messages(&mut c, 2).await;
    assert_eq!(got[0].mid(), Some(&b"mid-b"[..]));
    assert_eq!(got[0].body, text("two"));
    assert_eq!(got[1].mid(), Some(&b"mid-a"[..]));
    assert_eq!(got[1].body, text("one"));
    drop(c);
    wait_until("the closed connection forgotten", T, || r.peer_count() == 0).await;
    assert!(!r.is_connected(&a.reply_to));
    assert_eq!(
        r.reply(&a.reply_to, Bytes::from_static(b"\xc0")).await,
        Err(ReplyError::UnknownPeer)
    );
}

#[tokio::test]
async fn the_seams_tcp_client_is_answered() {
    let mut s = server(RequestServerOptions::default()).await;
    let addr = RequestServer::local_addr(&s);
    let r = s.replier();
    tokio::spawn(async move {
        while let Some(Incoming::Request(q)) = s.recv().await {
            let v = envelope::decode(&q.payload).unwrap();
            let reply = envelope::encode(&map(vec![("echo", v)]));
            let _ = r.reply(&q.reply_to, Bytes::from(reply)).await;
        }
    });
    let mut c = Transport::Tcp
        .request_client(addr, &RequestClientOptions::default())
        .unwrap();
    for n in 0..3 {
        let req = envelope::encode(&map(vec![("n", Value::from(n))]));
        let reply = c.send(Bytes::from(req), T).await.unwrap();
        let v = envelope::decode(&reply).unwrap();
        assert_eq!(
            envelope::get(&v, "echo"),
            Some(&map(vec![("n", Value::from(n))]))
        );
    }
}

#[tokio::test]
async fn a_zeromq_peer_or_garbage_is_cut_and_counted_as_malformed() {
    let s = server(RequestServerOptions::default()).await;
    let addr = RequestServer::local_addr(&s);
    let refusals = RequestServer::refusals(&s);
    // A ZMTP greeting's first ten bytes.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f])
        .await
        .unwrap();
    assert!(closed(&mut c).await);
    // msgpack, but not {head, body}.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&envelope::encode(&map(vec![("body", Value::Nil)])))
        .await
        .unwrap();
    assert!(closed(&mut c).await);
    // Never msgpack.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[0xc1]).await.unwrap();
    assert!(closed(&mut c).await);
    wait_until("three malformed", T, || refusals.malformed() == 3).await;
}

#[tokio::test]
async fn an_untrusted_peer_is_cut_at_a_header_over_its_limit_and_a_trusted_one_is_not() {
    let mut s = server(RequestServerOptions {
        untrusted_max_payload: Some(1024),
        ..RequestServerOptions::default()
    })
    .await;
    let addr = RequestServer::local_addr(&s);
    let refusals = RequestServer::refusals(&s);
    let big = Value::Binary(vec![7u8; 100 * 1024]);

    let mut stranger = TcpStream::connect(addr).await.unwrap();
    // A frame announcing 60 MiB of body: refused at the header, nothing buffered.
    let mut head = request_frame("m", Value::Nil);
    head.truncate(head.len() - 1);
    head.extend_from_slice(&[0xc6, 0x03, 0xc0, 0, 0]);
    stranger.write_all(&head).await.unwrap();
    assert!(closed(&mut stranger).await);
    wait_until("oversized counted", T, || refusals.oversized() == 1).await;

    let mut friend = TcpStream::connect(addr).await.unwrap();
    friend
        .write_all(&request_frame("m1", text("hello")))
        .await
        .unwrap();
    let q = next(&mut s).await;
    let r = s.replier();
    r.trust(&q.reply_to);
    r.reply(&q.reply_to, Bytes::from_static(b"\xc0"))
        .await
        .unwrap();
    let _ = read_messages(&mut friend, 1).await;
    friend
        .write_all(&request_frame("m2", big.clone()))
        .await
        .unwrap();
    let q = next(&mut s).await;
    assert_eq!(envelope::decode(&q.payload).unwrap(), big);
    assert_eq!(refusals.oversized(), 1);
}

#[tokio::test]
async fn a_trickled_request_and_a_silent_connection_are_cut_at_their_deadlines() {
    let s = server(RequestServerOptions {
        payload_timeout: Some(Duration::from_millis(300)),
        ..RequestServerOptions::default()
    })
    .await;
    let addr = RequestServer::local_addr(&s);
    let refusals = RequestServer::refusals(&s);
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed(&mut silent).await);
    wait_until("the silent one counted", T, || {
        refusals.handshake_timeouts() == 1
    })
    .await;
    let frame = request_frame("m", Value::Binary(vec![1u8; 200]));
    let mut c = TcpStream::connect(addr).await.unwrap();
    let trickle = tokio::spawn(async move {
        // 50 ms a byte: 10 s for the request, far past the 300 ms deadline.
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

#[tokio::test]
async fn a_full_queue_stops_reading_a_peer_and_loses_nothing() {
    let mut s = server(RequestServerOptions {
        queue: 1,
        ..RequestServerOptions::default()
    })
    .await;
    let addr = RequestServer::local_addr(&s);
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut all = Vec::new();
    for n in 0..5i64 {
        all.extend(request_frame(&format!("m{n}"), Value::from(n)));
    }
    c.write_all(&all).await.unwrap();
    let r = s.replier();
    wait_until("the peer paused", T, || r.paused_inbound() >= 1).await;
    for n in 0..5i64 {
        let q = next(&mut s).await;
        assert_eq!(envelope::decode(&q.payload).unwrap(), Value::from(n));
    }
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn over_tls_a_client_certificate_is_required_and_requests_are_answered() {
    use crate::salt_tcp::tls::{client_config, server_name, TlsSettings};
    use crate::salt_tcp::tls_server::TlsServer;
    let dir = tempfile::tempdir().unwrap();
    crate::salt_tcp::tls_server::tests::make_pki(dir.path());
    let p = |n: &str| Some(dir.path().join(n));
    let tls = TlsServer::new(&TlsSettings {
        certfile: p("server.pem"),
        keyfile: p("server.key"),
        ca_certs: p("ca.pem"),
        ..TlsSettings::default()
    })
    .unwrap();
    let mut s = server(RequestServerOptions {
        tls: Some(tls),
        ..RequestServerOptions::default()
    })
    .await;
    let addr = RequestServer::local_addr(&s);
    let refusals = RequestServer::refusals(&s);
    let r = s.replier();
    tokio::spawn(async move {
        while let Some(Incoming::Request(q)) = s.recv().await {
            let _ = r.reply(&q.reply_to, q.payload.clone()).await;
        }
    });
    let client = |certfile: Option<std::path::PathBuf>, keyfile| {
        let settings = TlsSettings {
            certfile,
            keyfile,
            ca_certs: p("ca.pem"),
            ..TlsSettings::default()
        };
        let tls = crate::salt_tcp::client::TlsClient {
            config: client_config(&settings).unwrap(),
            server_name: server_name(&settings, addr.ip()).unwrap(),
        };
        Transport::Tcp
            .request_client(
                addr,
                &RequestClientOptions {
                    tls: Some(tls),
                    ..RequestClientOptions::default()
                },
            )
            .unwrap()
    };
    let mut good = client(p("client.pem"), p("client.key"));
    let payload = Bytes::from(envelope::encode(&text("over tls")));
    assert_eq!(good.send(payload.clone(), T).await.unwrap(), payload);
    let mut anonymous = client(None, None);
    assert!(anonymous.send(payload, T).await.is_err());
    wait_until("the anonymous client refused", T, || {
        refusals.malformed() == 1
    })
    .await;
}
