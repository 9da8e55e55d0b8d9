//! The `ws` servers and clients over TLS (Salt's `ssl`, a client certificate required), and the
//! probe (whose ws speech is checked against Salt's aiohttp master in the proxy's tests) against
//! our request server, plain and over TLS.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use saltgate_test_support::wait_until;

use crate::envelope::RequestEnvelope;
use crate::salt_tcp::probe::{salt_ping_staged, Target, TlsClient, Transport as ProbeTransport};
use crate::salt_tcp::tls::{client_config, server_name, CertReqs, TlsSettings};
use crate::salt_tcp::tls_server::TlsServer;
use crate::transport::{
    Incoming, PublishClient, PublishClientOptions, PublishServer, PublishServerOptions, Replier,
    RequestClient, RequestClientOptions, RequestServer, RequestServerOptions, Targets, Transport,
};

const T: Duration = Duration::from_secs(10);

/// A test CA, a certificate for 127.0.0.1 and one for a minion, written into a temporary
/// directory.
fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    for name in ["127.0.0.1", "minion-1"] {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    dir
}

fn settings(dir: &std::path::Path, name: &str) -> TlsSettings {
    TlsSettings {
        certfile: Some(dir.join(format!("{name}.pem"))),
        keyfile: Some(dir.join(format!("{name}.key"))),
        ca_certs: Some(dir.join("ca.pem")),
        cert_reqs: CertReqs::Required,
        server_name: None,
    }
}

fn client(addr: SocketAddr, s: &TlsSettings) -> TlsClient {
    TlsClient {
        config: client_config(s).unwrap(),
        server_name: server_name(s, addr.ip()).unwrap(),
    }
}

/// Answers every request with its own payload until dropped.
fn echo(mut s: crate::transport::AnyRequestServer) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let r = s.replier();
        while let Some(Incoming::Request(q)) = s.recv().await {
            let _ = r.reply(&q.reply_to, q.payload.clone()).await;
        }
    })
}

#[tokio::test]
async fn both_channels_over_tls_with_a_required_client_certificate() {
    let dir = pki();
    let server_tls = TlsServer::new(&settings(dir.path(), "127.0.0.1")).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let s = Transport::Ws
        .bind_request_server(
            any,
            &RequestServerOptions {
                tls: Some(server_tls.clone()),
                ..RequestServerOptions::default()
            },
        )
        .await
        .unwrap();
    let addr = s.local_addr();
    let refusals = s.refusals();
    let _serve = echo(s);
    let mine = settings(dir.path(), "minion-1");
    let mut c = Transport::Ws
        .request_client(
            addr,
            &RequestClientOptions {
                tls: Some(client(addr, &mine)),
                ..RequestClientOptions::default()
            },
        )
        .unwrap();
    let req = Bytes::from(RequestEnvelope::ping().encode());
    assert_eq!(c.send(req.clone(), T).await.unwrap(), req);
    // The probe, over TLS.
    let target = Target {
        addr,
        transport: ProbeTransport::Ws,
        tls: Some(client(addr, &mine)),
    };
    salt_ping_staged(&target, T, T).await.unwrap();
    // Without a client certificate: refused in the TLS handshake, counted.
    let anonymous = TlsSettings {
        certfile: None,
        keyfile: None,
        ..mine.clone()
    };
    let mut c = Transport::Ws
        .request_client(
            addr,
            &RequestClientOptions {
                tls: Some(client(addr, &anonymous)),
                ..RequestClientOptions::default()
            },
        )
        .unwrap();
    assert!(c.send(req, Duration::from_secs(3)).await.is_err());
    wait_until("the anonymous client refused", T, || {
        refusals.malformed() >= 1
    })
    .await;

    let p = Transport::Ws
        .bind_publish_server(
            any,
            &PublishServerOptions {
                tls: Some(server_tls),
                ..PublishServerOptions::default()
            },
        )
        .await
        .unwrap();
    let mut sub = Transport::Ws
        .publish_client(
            p.local_addr(),
            &PublishClientOptions {
                tls: Some(client(p.local_addr(), &mine)),
                ..PublishClientOptions::default()
            },
        )
        .unwrap();
    wait_until("subscribed over TLS", T, || p.subscriber_count() == 1).await;
    p.publish(Bytes::from_static(b"\x81\xa1a\x01"), Targets::All);
    assert_eq!(
        &tokio::time::timeout(T, sub.recv()).await.unwrap().unwrap()[..],
        b"\x81\xa1a\x01"
    );
}

#[tokio::test]
async fn the_probe_pings_our_plain_request_server() {
    let s = Transport::Ws
        .bind_request_server(
            "127.0.0.1:0".parse().unwrap(),
            &RequestServerOptions::default(),
        )
        .await
        .unwrap();
    let addr = s.local_addr();
    let _serve = echo(s);
    let r = salt_ping_staged(&Target::plain(addr, ProbeTransport::Ws), T, T)
        .await
        .unwrap();
    // The echo is the ping envelope itself, as the probe reads it back.
    match r.reply {
        crate::envelope::Reply::Envelope { enc, .. } => assert_eq!(enc, "clear"),
        other => panic!("{other:?}"),
    }
}
