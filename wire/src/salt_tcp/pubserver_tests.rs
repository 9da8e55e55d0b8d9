//! The `tcp` publish server against the seam's own subscriber and raw sockets. The presence
//! check here is a stand-in for the master's: a hello `{"id": x, "proof": "ok"}` proves `x`.

use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::envelope::{self, as_str, get, map, text};
use crate::transport::{
    AnyPublishClient, AnyPublishServer, PublishClient, PublishClientOptions, Transport,
};

const T: Duration = Duration::from_secs(10);

fn check() -> PresenceCheck {
    PresenceCheck::new(|body| {
        let v = envelope::decode(body).ok()?;
        (get(&v, "proof").and_then(as_str) == Some("ok"))
            .then(|| get(&v, "id").and_then(as_str).map(str::to_string))
            .flatten()
    })
}

fn hello(id: &str, proof: &str) -> Bytes {
    Bytes::from(envelope::encode(&map(vec![
        ("id", text(id)),
        ("proof", text(proof)),
    ])))
}

async fn publisher(opts: PublishServerOptions) -> AnyPublishServer {
    Transport::Tcp
        .bind_publish_server("127.0.0.1:0".parse().unwrap(), &opts)
        .await
        .unwrap()
}

fn subscriber(addr: SocketAddr, hello: Option<Bytes>) -> AnyPublishClient {
    Transport::Tcp
        .publish_client(
            addr,
            &PublishClientOptions {
                hello,
                ..PublishClientOptions::default()
            },
        )
        .unwrap()
}

/// The next publish of `c` within `wait`, if any.
async fn got(c: &mut AnyPublishClient, wait: Duration) -> Option<Bytes> {
    tokio::time::timeout(wait, c.recv()).await.ok().flatten()
}

#[tokio::test]
async fn a_targeted_publish_reaches_only_the_subscribers_that_proved_a_listed_id() {
    let p = publisher(PublishServerOptions {
        presence: Some(check()),
        ..PublishServerOptions::default()
    })
    .await;
    let AnyPublishServer::Tcp(tcp) = &p else {
        panic!("not tcp")
    };
    let addr = PublishServer::local_addr(&p);
    let mut a = subscriber(addr, Some(hello("a", "ok")));
    let mut b = subscriber(addr, Some(hello("b", "ok")));
    let mut liar = subscriber(addr, Some(hello("a", "forged")));
    let mut silent = subscriber(addr, None);
    wait_until("four subscribers, two proved", T, || {
        p.subscriber_count() == 4 && tcp.present().len() == 2
    })
    .await;
    let mut present = tcp.present();
    present.sort();
    assert_eq!(present, ["a", "b"]);

    let r = p.publish(Bytes::from_static(b"for-a"), Targets::Minions(&["a", "c"]));
    assert_eq!((r.queued, r.dropped), (1, 0));
    assert_eq!(got(&mut a, T).await.as_deref(), Some(&b"for-a"[..]));
    // Everyone: tagged or not.
    let r = p.publish(Bytes::from_static(b"all"), Targets::All);
    assert_eq!(r.queued, 4);
    // An empty list is everyone too, as Salt's `if topic_list:`.
    let r = p.publish(Bytes::from_static(b"empty"), Targets::Minions(&[]));
    assert_eq!(r.queued, 4);
    for c in [&mut a, &mut b, &mut liar, &mut silent] {
        assert_eq!(got(c, T).await.as_deref(), Some(&b"all"[..]));
        assert_eq!(got(c, T).await.as_deref(), Some(&b"empty"[..]));
    }
    // What was for `a` alone reached none of the others (they got "all" first).
    let r = p.publish(Bytes::from_static(b"for-b"), Targets::Minions(&["b"]));
    assert_eq!(r.queued, 1);
    assert_eq!(got(&mut b, T).await.as_deref(), Some(&b"for-b"[..]));
    let short = Duration::from_millis(200);
    for c in [&mut a, &mut liar, &mut silent] {
        assert_eq!(got(c, short).await, None);
    }
    drop(a);
    wait_until("a forgotten", T, || tcp.present() == ["b"]).await;
}

#[tokio::test]
async fn without_a_presence_check_a_targeted_publish_reaches_nobody_tagged() {
    let p = publisher(PublishServerOptions::default()).await;
    let addr = PublishServer::local_addr(&p);
    let mut a = subscriber(addr, Some(hello("a", "ok")));
    wait_until("one subscriber", T, || p.subscriber_count() == 1).await;
    assert_eq!(
        p.publish(Bytes::from_static(b"x"), Targets::Minions(&["a"]))
            .queued,
        0
    );
    assert_eq!(p.publish(Bytes::from_static(b"y"), Targets::All).queued, 1);
    assert_eq!(got(&mut a, T).await.as_deref(), Some(&b"y"[..]));
}

#[tokio::test]
async fn a_subscriber_sending_garbage_or_too_much_is_cut_and_counted() {
    let p = publisher(PublishServerOptions {
        presence: Some(check()),
        ..PublishServerOptions::default()
    })
    .await;
    let addr = PublishServer::local_addr(&p);
    let refusals = PublishServer::refusals(&p);
    let closed = |mut c: TcpStream| async move {
        let mut b = [0u8; 256];
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
    };
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[0xc1, 0, 0]).await.unwrap();
    assert!(closed(c).await);
    let mut c = TcpStream::connect(addr).await.unwrap();
    // A bin32 announcing 1 MiB: over the hello limit at its header.
    c.write_all(&[
        0x82, 0xa4, b'h', b'e', b'a', b'd', 0x80, 0xa4, b'b', b'o', b'd', b'y',
    ])
    .await
    .unwrap();
    c.write_all(&[0xc6, 0, 0x10, 0, 0]).await.unwrap();
    assert!(closed(c).await);
    wait_until("both counted", T, || {
        refusals.malformed() == 1 && refusals.oversized() == 1
    })
    .await;
    wait_until("both forgotten", T, || p.subscriber_count() == 0).await;
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn over_tls_subscribers_get_publishes_and_say_their_id() {
    use crate::salt_tcp::tls::{client_config, server_name, TlsSettings};
    use crate::salt_tcp::tls_server::TlsServer;
    let dir = tempfile::tempdir().unwrap();
    crate::salt_tcp::tls_server::tests::make_pki(dir.path());
    let path = |n: &str| Some(dir.path().join(n));
    let p = publisher(PublishServerOptions {
        presence: Some(check()),
        tls: Some(
            TlsServer::new(&TlsSettings {
                certfile: path("server.pem"),
                keyfile: path("server.key"),
                ca_certs: path("ca.pem"),
                ..TlsSettings::default()
            })
            .unwrap(),
        ),
        ..PublishServerOptions::default()
    })
    .await;
    let addr = PublishServer::local_addr(&p);
    let settings = TlsSettings {
        certfile: path("client.pem"),
        keyfile: path("client.key"),
        ca_certs: path("ca.pem"),
        ..TlsSettings::default()
    };
    let tls = crate::salt_tcp::client::TlsClient {
        config: client_config(&settings).unwrap(),
        server_name: server_name(&settings, addr.ip()).unwrap(),
    };
    let mut a = Transport::Tcp
        .publish_client(
            addr,
            &PublishClientOptions {
                hello: Some(hello("a", "ok")),
                tls: Some(tls),
                ..PublishClientOptions::default()
            },
        )
        .unwrap();
    let AnyPublishServer::Tcp(tcp) = &p else {
        panic!("not tcp")
    };
    wait_until("a proved over TLS", T, || tcp.present() == ["a"]).await;
    assert_eq!(
        p.publish(Bytes::from_static(b"tls"), Targets::Minions(&["a"]))
            .queued,
        1
    );
    assert_eq!(got(&mut a, T).await.as_deref(), Some(&b"tls"[..]));
}
