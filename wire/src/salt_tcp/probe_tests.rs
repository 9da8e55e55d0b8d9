//! The tcp and ws probes against small in-test masters (loopback).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::super::probe::*;
use super::*;
use crate::envelope::{self, map, Reply, Value};
use crate::salt_ws::{self as ws, WsDecoder, WsMessage};

const HS: Duration = Duration::from_millis(500);
const T: Duration = Duration::from_secs(3);

fn retry() -> Value {
    map(vec![
        ("enc", envelope::text("clear")),
        (
            "load",
            map(vec![
                ("ret", Value::Boolean(false)),
                ("cluster_retry", Value::Boolean(true)),
            ]),
        ),
    ])
}

/// Serves Salt's tcp request framing on `s`: every request is answered first by a message with
/// another mid (which the probe must skip), then with the echoed load (or `cluster_retry` while
/// not `ready`), split into small writes.
async fn serve_tcp<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, ready: Arc<AtomicBool>) {
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
            let req = RequestEnvelope::from_value(m.body).unwrap();
            let body = if ready.load(Ordering::SeqCst) {
                req.load
            } else {
                retry()
            };
            let mut out = encode_message(map(vec![("mid", envelope::text("other"))]), Value::Nil);
            out.extend(encode_message(m.head, body));
            for c in out.chunks(3) {
                if s.write_all(c).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

async fn tcp_master(ready: bool) -> (SocketAddr, Arc<AtomicBool>) {
    let (l, a) = listener().await;
    let r = Arc::new(AtomicBool::new(ready));
    let rr = r.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(serve_tcp(s, rr.clone()));
        }
    });
    (a, r)
}

#[tokio::test]
async fn tcp_ping_is_matched_by_mid_and_cluster_retry_is_not_ready() {
    let (a, ready) = tcp_master(true).await;
    let t = Target::plain(a, Transport::Tcp);
    let r = salt_ping_staged(&t, HS, T).await.unwrap();
    assert_eq!(
        envelope::get(
            match &r.reply {
                Reply::Plain(v) => v,
                other => panic!("{other:?}"),
            },
            "cmd"
        )
        .and_then(envelope::as_str),
        Some("ping")
    );
    ready.store(false, Ordering::SeqCst);
    let e = salt_ping_staged(&t, HS, T).await.unwrap_err();
    assert!(e.is_not_ready(), "{e}");
    // The publish check: the read stage (this master reads what it is sent).
    publish_check(&t, HS).await.unwrap();
}

#[tokio::test]
async fn a_zeromq_master_is_named_and_a_closing_one_points_at_transport() {
    let (l, a) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1];
            g.extend(b"NULL");
            g.resize(64, 0);
            let _ = s.write_all(&g).await;
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    for tr in [Transport::Tcp, Transport::Ws] {
        let e = salt_ping_staged(&Target::plain(a, tr), HS, T)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("`transport: zeromq`"), "{tr:?}: {e}");
    }
    let (l, a) = listener().await;
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    let e = salt_ping_staged(&Target::plain(a, Transport::Tcp), HS, T)
        .await
        .unwrap_err();
    assert!(
        matches!(e, SaltProbeError::Closed("tcp") | SaltProbeError::Io(_)),
        "{e}"
    );
    if let SaltProbeError::Closed(_) = e {
        assert!(e.to_string().contains("`transport"), "{e}");
    }
}

#[tokio::test]
async fn a_hung_tcp_master_fails_the_read_stage_and_a_hung_ws_one_the_upgrade() {
    let (_l, a) = listener().await; // the kernel accepts; nobody reads
    let t0 = std::time::Instant::now();
    let e = salt_ping_staged(&Target::plain(a, Transport::Tcp), HS, T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            SaltProbeError::NoHandshake {
                what: "read of the check's bytes",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        t0.elapsed() < HS + Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    let e = salt_ping_staged(&Target::plain(a, Transport::Ws), HS, T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            SaltProbeError::NoHandshake {
                what: "websocket upgrade",
                ..
            }
        ),
        "{e}"
    );
}

/// A websocket master: checks the upgrade, answers 101, then answers each binary frame with a
/// ping and the echoed load in two fragments.
async fn ws_master(ready: bool) -> SocketAddr {
    let (l, a) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut b).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&b[..n]);
                }
                let text = String::from_utf8(req).unwrap();
                assert!(text.starts_with("GET /ws HTTP/1.1\r\n"), "{text}");
                let key = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                    .unwrap();
                let resp = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
                    ws::accept_key(key)
                );
                s.write_all(resp.as_bytes()).await.unwrap();
                // Read one masked client frame.
                let mut f = Vec::new();
                loop {
                    let n = s.read(&mut b).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    f.extend_from_slice(&b[..n]);
                    if f.len() >= 6 && f.len() >= 6 + usize::from(f[1] & 0x7f) {
                        break;
                    }
                }
                assert_eq!(f[0], 0x82, "binary, FIN");
                assert!(f[1] & 0x80 != 0, "a client frame is masked");
                let mask = [f[2], f[3], f[4], f[5]];
                let payload: Vec<u8> = f[6..]
                    .iter()
                    .enumerate()
                    .map(|(i, x)| x ^ mask[i % 4])
                    .collect();
                let req = RequestEnvelope::decode(&payload).unwrap();
                let body = envelope::encode(&if ready { req.load } else { retry() });
                let (x, y) = body.split_at(body.len() / 2);
                let mut out = vec![0x89, 0x01, b'p']; // a ping first
                out.extend([0x02, x.len() as u8]);
                out.extend(x);
                out.extend([0x80, y.len() as u8]);
                out.extend(y);
                s.write_all(&out).await.unwrap();
                // The pong comes back masked.
                let n = s.read(&mut b).await.unwrap();
                assert!(n >= 2 && b[0] == 0x8a && b[1] & 0x80 != 0, "{:?}", &b[..n]);
                while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    a
}

#[tokio::test]
async fn ws_ping_over_an_upgraded_connection() {
    let a = ws_master(true).await;
    let t = Target::plain(a, Transport::Ws);
    salt_ping_staged(&t, HS, T).await.unwrap();
    let a = ws_master(false).await;
    let e = salt_ping_staged(&Target::plain(a, Transport::Ws), HS, T)
        .await
        .unwrap_err();
    assert!(e.is_not_ready(), "{e}");
}

#[tokio::test]
async fn ws_decoder_answers_frames_split_anywhere() {
    let mut stream = vec![
        0x89, 0x00, 0x02, 0x03, 1, 2, 3, 0x80, 0x01, 4, 0x88, 0x02, 0x03, 0xe8,
    ];
    stream.extend([0x82, 126, 0x01, 0x00]);
    stream.extend([9u8; 256]);
    for cut in 0..=stream.len() {
        let mut d = WsDecoder::new(1024);
        let mut got = Vec::new();
        for part in [&stream[..cut], &stream[cut..]] {
            d.push(part).unwrap();
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            vec![
                WsMessage::Ping(vec![]),
                WsMessage::Binary(vec![1, 2, 3, 4]),
                WsMessage::Close(Some(1000)),
                WsMessage::Binary(vec![9; 256]),
            ],
            "cut {cut}"
        );
    }
}

#[cfg(feature = "tls")]
mod tls_probe {
    use super::*;
    use crate::salt_tcp::tls::{client_config, server_name, CertReqs, TlsSettings};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    struct Pki {
        dir: tempfile::TempDir,
        server: Arc<rustls::ServerConfig>,
    }

    /// A test CA and a server certificate for 127.0.0.1, written to a temporary directory.
    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca =
            rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
        let k = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, k)
        .unwrap();
        Pki {
            dir,
            server: Arc::new(server),
        }
    }

    async fn tls_tcp_master(p: &Pki) -> SocketAddr {
        let (l, a) = listener().await;
        let acc = tokio_rustls::TlsAcceptor::from(p.server.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let acc = acc.clone();
                tokio::spawn(async move {
                    if let Ok(s) = acc.accept(s).await {
                        serve_tcp(s, Arc::new(AtomicBool::new(true))).await;
                    }
                });
            }
        });
        a
    }

    fn target(a: SocketAddr, s: &TlsSettings) -> Result<Target, String> {
        Ok(Target {
            addr: a,
            transport: Transport::Tcp,
            tls: Some(TlsClient {
                config: client_config(s).map_err(|e| e.to_string())?,
                server_name: server_name(s, a.ip()).map_err(|e| e.to_string())?,
            }),
        })
    }

    #[tokio::test]
    async fn tls_tcp_ping_verifies_the_master_as_salt_does() {
        let p = pki();
        let a = tls_tcp_master(&p).await;
        let with_ca = TlsSettings {
            ca_certs: Some(p.dir.path().join("ca.pem")),
            ..TlsSettings::default()
        };
        salt_ping_staged(&target(a, &with_ca).unwrap(), HS, T)
            .await
            .unwrap();
        publish_check(&target(a, &with_ca).unwrap(), HS)
            .await
            .unwrap();
        // CERT_NONE: no CA needed.
        let none = TlsSettings {
            cert_reqs: CertReqs::None,
            ..TlsSettings::default()
        };
        salt_ping_staged(&target(a, &none).unwrap(), HS, T)
            .await
            .unwrap();
        // CERT_REQUIRED without the CA: refused, and the error says so.
        let e = salt_ping_staged(&target(a, &TlsSettings::default()).unwrap(), HS, T)
            .await
            .unwrap_err();
        assert!(matches!(e, SaltProbeError::Tls(_)), "{e}");
        // The wrong name.
        let named = TlsSettings {
            server_name: Some("elsewhere.example".into()),
            ..with_ca.clone()
        };
        let e = salt_ping_staged(&target(a, &named).unwrap(), HS, T)
            .await
            .unwrap_err();
        assert!(matches!(e, SaltProbeError::Tls(_)), "{e}");
        // A plain master behind a TLS probe.
        let (plain, _) = tcp_master(true).await;
        let e = salt_ping_staged(&target(plain, &none).unwrap(), HS, T)
            .await
            .unwrap_err();
        assert!(!e.is_not_ready(), "{e}");
        // A hung TLS master fails the handshake stage.
        let (_l, hung) = listener().await;
        let e = salt_ping_staged(&target(hung, &none).unwrap(), HS, T)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                SaltProbeError::NoHandshake {
                    what: "TLS handshake",
                    ..
                }
            ),
            "{e}"
        );
        // A missing file names the key.
        let missing = TlsSettings {
            ca_certs: Some(p.dir.path().join("nope.pem")),
            ..TlsSettings::default()
        };
        let e = target(a, &missing).unwrap_err();
        assert!(e.contains("ssl.ca_certs"), "{e}");
    }
}

/// A master whose process reads every connection but whose workers answer nothing (Salt's
/// `PoolRouter` in front of busy workers).
async fn busy_tcp_master() -> SocketAddr {
    let (l, a) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut b = vec![0u8; 65536];
                while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    a
}

#[tokio::test]
async fn a_busy_tcp_master_passes_the_read_stage_and_times_out_on_the_reply() {
    let a = busy_tcp_master().await;
    reads_check(a, HS).await.unwrap();
    let t = Duration::from_millis(900);
    let e = salt_ping_staged(&Target::plain(a, Transport::Tcp), HS, t)
        .await
        .unwrap_err();
    assert!(matches!(e, SaltProbeError::Timeout(d) if d == t), "{e}");
}

#[tokio::test]
async fn the_read_stage_passes_on_a_master_that_answers_or_closes_at_once() {
    // A ZeroMQ master (greeting first): the stage passes, the ping names the transport.
    let (l, a) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(&[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f]).await;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                drop(s);
            });
        }
    });
    reads_check(a, HS).await.unwrap();
    let (l, a) = listener().await;
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    reads_check(a, HS).await.unwrap();
}

#[test]
fn the_read_stage_sends_a_salt_message_that_never_ends() {
    let bytes = super::super::probe::unfinished_message_for_tests(READ_STAGE_BYTES);
    assert_eq!(bytes.len(), READ_STAGE_BYTES);
    // Salt's reader (and ours) sees the start of one `{head, body}` message, still incomplete,
    // well under its Unpacker's 100 MiB.
    assert_eq!(scan(&bytes, 100 << 20), Ok(None));
    let mut dec = FrameDecoder::new(4 * READ_STAGE_BYTES);
    dec.push(&bytes).unwrap();
    assert_eq!(dec.next_message(), Ok(None));
    assert_eq!(&bytes[..6], &[0x82, 0xa4, b'h', b'e', b'a', b'd']);
}
