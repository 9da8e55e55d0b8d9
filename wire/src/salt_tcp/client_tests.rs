//! The seam's `tcp` request and publish clients against small in-test servers (loopback).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::envelope::{self, map, text, Value};
use crate::transport::{
    PublishClient, PublishClientOptions, ReconnectPolicy, RequestClient, RequestClientOptions,
    RequestError, Transport,
};

const T: Duration = Duration::from_secs(5);

async fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// What the test master does with each request.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Answers `{"echo": body}`, after a message with another mid, split in 3-byte writes.
    Echo,
    /// Never answers.
    Silent,
    /// Answers, then closes the connection.
    OnceThenClose,
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, mode: Mode) {
    let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE);
    let mut buf = [0u8; 4096];
    loop {
        let Ok(n) = s.read(&mut buf).await else {
            return;
        };
        if n == 0 || dec.push(&buf[..n]).is_err() {
            return;
        }
        while let Ok(Some(m)) = dec.next_message() {
            if mode == Mode::Silent {
                continue;
            }
            let mut out = encode_message(map(vec![("mid", text("other"))]), Value::Nil);
            let cmd = envelope::get(&m.body, "load")
                .and_then(|l| envelope::get(l, "cmd"))
                .and_then(envelope::as_str)
                .map(str::to_owned);
            // An `aes` reply is bytes, not a map.
            let reply = match cmd.as_deref() {
                Some("bytes") => envelope::bin(b"ciphertext"),
                _ => map(vec![("echo", m.body)]),
            };
            out.extend(encode_message(m.head, reply));
            for c in out.chunks(3) {
                if s.write_all(c).await.is_err() {
                    return;
                }
            }
            if mode == Mode::OnceThenClose {
                return;
            }
        }
    }
}

/// A request master; counts its connections.
async fn master(mode: Mode) -> (SocketAddr, Arc<AtomicUsize>) {
    let (l, a) = listener().await;
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s, mode));
        }
    });
    (a, accepted)
}

fn payload(cmd: &str) -> Bytes {
    Bytes::from(envelope::encode(&map(vec![
        ("enc", text("clear")),
        ("load", map(vec![("cmd", text(cmd))])),
    ])))
}

fn echoed_cmd(reply: &[u8]) -> String {
    let v = envelope::decode(reply).unwrap();
    let body = envelope::get(&v, "echo").unwrap();
    let load = envelope::get(body, "load").unwrap();
    envelope::get(load, "cmd")
        .and_then(envelope::as_str)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn requests_are_matched_by_mid_on_one_kept_connection() {
    let (a, accepted) = master(Mode::Echo).await;
    let mut c = Transport::Tcp
        .request_client(a, &RequestClientOptions::default())
        .unwrap();
    for cmd in ["one", "two", "three"] {
        let r = c.send(payload(cmd), T).await.unwrap();
        assert_eq!(echoed_cmd(&r), cmd);
    }
    // Bytes come over as a ZeroMQ reply frame holds them: msgpack-encoded.
    let r = c.send(payload("bytes"), T).await.unwrap();
    assert_eq!(envelope::decode(&r).unwrap(), envelope::bin(b"ciphertext"));
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(c.peer_addr(), a);
}

#[tokio::test]
async fn a_timeout_drops_the_connection_and_the_next_request_redials() {
    let (a, accepted) = master(Mode::Silent).await;
    let mut c = client::TcpRequestClient::new(a, &RequestClientOptions::default());
    let e = c
        .send(payload("x"), Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, RequestError::Timeout(_)), "{e}");
    let _ = c.send(payload("y"), Duration::from_millis(200)).await;
    assert_eq!(c.dial_count(), 2);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_idle_connection_the_master_closed_is_redialled_before_a_request() {
    let (a, accepted) = master(Mode::OnceThenClose).await;
    let mut c = client::TcpRequestClient::new(a, &RequestClientOptions::default());
    assert_eq!(echoed_cmd(&c.send(payload("a"), T).await.unwrap()), "a");
    // Wait until the master's close has reached us (a condition, not a sleep).
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Ok(r) = c.send(payload("b"), T).await {
            assert_eq!(echoed_cmd(&r), "b");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never re-dialled");
    }
    assert!(accepted.load(Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn refused_connect_bad_payload_and_a_zeromq_master_are_errors() {
    let (l, a) = listener().await;
    drop(l);
    let mut c = client::TcpRequestClient::new(a, &RequestClientOptions::default());
    let e = c.send(payload("x"), T).await.unwrap_err();
    assert!(matches!(e, RequestError::Connect { .. }), "{e}");
    let e = c
        .send(Bytes::from_static(&[0x92, 0x01]), T)
        .await
        .unwrap_err();
    assert!(matches!(e, RequestError::Malformed(_)), "{e}");
    // A ZeroMQ master greets first.
    let (l, a) = listener().await;
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut g = [0u8; 64];
        g[0] = 0xff;
        g[9] = 0x7f;
        let _ = s.write_all(&g).await;
        let _ = s.read(&mut g).await;
    });
    let mut c = client::TcpRequestClient::new(a, &RequestClientOptions::default());
    let e = c.send(payload("x"), T).await.unwrap_err();
    assert!(e.to_string().contains("transport"), "{e}");
}

fn pub_opts() -> PublishClientOptions {
    PublishClientOptions {
        reconnect: ReconnectPolicy {
            recon_default: Duration::from_millis(20),
            recon_max: Duration::from_millis(50),
            recon_randomize: true,
        },
        hello: Some(payload("hello-1")),
        ..PublishClientOptions::default()
    }
}

/// Reads one framed message from the subscriber's connection.
async fn read_msg(s: &mut TcpStream, dec: &mut FrameDecoder) -> TcpMessage {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(m) = dec.next_message().unwrap() {
            return m;
        }
        let n = tokio::time::timeout(T, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "subscriber closed");
        dec.push(&buf[..n]).unwrap();
    }
}

fn hello_cmd(m: &TcpMessage) -> String {
    assert_eq!(m.head, Value::Map(Vec::new()));
    let load = envelope::get(&m.body, "load").unwrap();
    envelope::get(load, "cmd")
        .and_then(envelope::as_str)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn the_subscriber_says_hello_on_each_connect_and_hands_over_bodies() {
    let (l, a) = listener().await;
    let mut sub = Transport::Tcp.publish_client(a, &pub_opts()).unwrap();
    let (mut s, _) = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE);
    assert_eq!(hello_cmd(&read_msg(&mut s, &mut dec).await), "hello-1");
    // Salt's publish server frames the serialised envelope as bytes; a map body is encoded.
    let job = envelope::encode(&map(vec![
        ("enc", text("aes")),
        ("load", envelope::bin(b"ct")),
    ]));
    let mut out = encode_message(Value::Map(Vec::new()), envelope::bin(&job));
    out.extend(encode_message(
        Value::Map(Vec::new()),
        map(vec![("k", text("v"))]),
    ));
    for c in out.chunks(5) {
        s.write_all(c).await.unwrap();
    }
    let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
    assert_eq!(&got[..], &job[..]);
    let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
    assert_eq!(envelope::decode(&got).unwrap(), map(vec![("k", text("v"))]));
    assert!(sub.is_connected());
    assert_eq!(sub.connect_count(), 1);
    // A new hello goes out at once.
    sub.set_hello(payload("hello-2"));
    assert_eq!(hello_cmd(&read_msg(&mut s, &mut dec).await), "hello-2");
    // The master goes away: the subscriber reconnects and says the current hello again.
    drop(s);
    let (mut s, _) = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE);
    assert_eq!(hello_cmd(&read_msg(&mut s, &mut dec).await), "hello-2");
    let deadline = tokio::time::Instant::now() + T;
    while sub.connect_count() < 2 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    // Garbage ends the connection, not the client.
    s.write_all(&[0xc1, 0xc1]).await.unwrap();
    let (_s, _) = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
}

#[cfg(feature = "tls")]
mod tls_clients {
    use super::*;
    use crate::salt_tcp::probe::TlsClient;
    use crate::salt_tcp::tls::{client_config, server_name, CertReqs, TlsSettings};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    struct Pki {
        dir: tempfile::TempDir,
        server: Arc<rustls::ServerConfig>,
    }

    /// A test CA, a server certificate for 127.0.0.1 and a client certificate, all made here;
    /// the server requires the client certificate (Salt's `cert_reqs: CERT_REQUIRED` on a master).
    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let leaf = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec![name.to_string()])
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf("127.0.0.1");
        let (client_cert, client_key) = leaf("minion-1");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("client.pem"), client_cert).unwrap();
        std::fs::write(dir.path().join("client.key"), client_key).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(server_cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(server_key.as_bytes()).unwrap(),
            )
            .unwrap();
        Pki {
            dir,
            server: Arc::new(server),
        }
    }

    async fn tls_master(p: &Pki) -> SocketAddr {
        let (l, a) = listener().await;
        let acc = tokio_rustls::TlsAcceptor::from(p.server.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let acc = acc.clone();
                tokio::spawn(async move {
                    if let Ok(s) = acc.accept(s).await {
                        serve(s, Mode::Echo).await;
                    }
                });
            }
        });
        a
    }

    fn tls(a: SocketAddr, s: &TlsSettings) -> TlsClient {
        TlsClient {
            config: client_config(s).unwrap(),
            server_name: server_name(s, a.ip()).unwrap(),
        }
    }

    #[tokio::test]
    async fn tls_requests_verify_the_master_and_present_the_client_certificate() {
        let p = pki();
        let a = tls_master(&p).await;
        let full = TlsSettings {
            ca_certs: Some(p.dir.path().join("ca.pem")),
            certfile: Some(p.dir.path().join("client.pem")),
            keyfile: Some(p.dir.path().join("client.key")),
            ..TlsSettings::default()
        };
        let opts = |s: &TlsSettings| RequestClientOptions {
            tls: Some(tls(a, s)),
            ..RequestClientOptions::default()
        };
        let mut c = Transport::Tcp.request_client(a, &opts(&full)).unwrap();
        assert_eq!(echoed_cmd(&c.send(payload("tls"), T).await.unwrap()), "tls");
        assert_eq!(
            echoed_cmd(&c.send(payload("again"), T).await.unwrap()),
            "again"
        );
        // No client certificate: the master refuses the handshake (or drops us right after).
        let no_cert = TlsSettings {
            ca_certs: Some(p.dir.path().join("ca.pem")),
            ..TlsSettings::default()
        };
        let mut c = Transport::Tcp.request_client(a, &opts(&no_cert)).unwrap();
        assert!(c.send(payload("x"), T).await.is_err());
        // Without the CA the master's certificate is not trusted (CERT_REQUIRED).
        let no_ca = TlsSettings {
            ca_certs: None,
            ..full.clone()
        };
        let mut c = Transport::Tcp.request_client(a, &opts(&no_ca)).unwrap();
        let e = c.send(payload("x"), T).await.unwrap_err();
        assert!(matches!(e, RequestError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("TLS"), "{e}");
        // CERT_NONE with the client certificate: accepted without the CA.
        let none = TlsSettings {
            ca_certs: None,
            cert_reqs: CertReqs::None,
            ..full.clone()
        };
        let mut c = Transport::Tcp.request_client(a, &opts(&none)).unwrap();
        assert_eq!(echoed_cmd(&c.send(payload("n"), T).await.unwrap()), "n");
        // `ssl` with ZeroMQ is refused, naming the key.
        let e = Transport::Zeromq
            .request_client(a, &opts(&full))
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("ssl: "), "{e}");
    }

    #[tokio::test]
    async fn a_tls_subscriber_says_hello_inside_tls() {
        let p = pki();
        let (l, a) = listener().await;
        let full = TlsSettings {
            ca_certs: Some(p.dir.path().join("ca.pem")),
            certfile: Some(p.dir.path().join("client.pem")),
            keyfile: Some(p.dir.path().join("client.key")),
            ..TlsSettings::default()
        };
        let opts = PublishClientOptions {
            tls: Some(tls(a, &full)),
            ..pub_opts()
        };
        let mut sub = Transport::Tcp.publish_client(a, &opts).unwrap();
        let acc = tokio_rustls::TlsAcceptor::from(p.server.clone());
        let (s, _) = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
        let mut s = acc.accept(s).await.unwrap();
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE);
        let mut buf = [0u8; 4096];
        let hello = loop {
            if let Some(m) = dec.next_message().unwrap() {
                break m;
            }
            let n = tokio::time::timeout(T, s.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0);
            dec.push(&buf[..n]).unwrap();
        };
        assert_eq!(hello_cmd(&hello), "hello-1");
        let job = envelope::encode(&map(vec![("enc", text("aes"))]));
        s.write_all(&encode_message(Value::Map(Vec::new()), envelope::bin(&job)))
            .await
            .unwrap();
        let got = tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap();
        assert_eq!(&got[..], &job[..]);
    }
}
