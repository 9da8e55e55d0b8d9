//! The tcp/ws checks as the check loop runs them: the transport and `ssl` of the configuration
//! pick the probe, and their failures read as the operator needs them.

use super::*;
use std::time::Duration;

fn global(transport: SaltTransport, ssl: Option<SslConfig>) -> Global {
    Global {
        transport,
        ssl,
        ..Global::default()
    }
}

fn health(probe: Probe) -> HealthSettings {
    HealthSettings {
        probe,
        timeout: Duration::from_millis(600),
        handshake_timeout: Duration::from_millis(300),
        ..HealthSettings::default()
    }
}

#[tokio::test]
async fn a_zeromq_master_behind_transport_tcp_is_named() {
    // A ZMTP peer: greets at once.
    let a = crate::select::test_peers::zmtp_greeter(Some(std::time::Duration::ZERO)).await;
    let t = ProbeTransport::prepare(&global(SaltTransport::Tcp, None));
    assert!(!t.is_zeromq());
    let e = check(&t, a, Role::Request, health(Probe::Salt))
        .await
        .unwrap_err()
        .detail;
    assert!(e.starts_with("salt ping (tcp)"), "{e}");
    assert!(e.contains("set `transport: zeromq`"), "{e}");
    // A ZMTP publisher passes the publish check (it greets: bytes from the master pass the read
    // stage); the request port tells.
    check(&t, a, Role::Publish, health(Probe::Salt))
        .await
        .unwrap();
    // probe: tcp stays a TCP connect.
    check(&t, a, Role::Request, health(Probe::Tcp))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unreadable_ssl_file_fails_every_check_and_names_the_key() {
    let ssl = SslConfig {
        ca_certs: Some("/nonexistent/saltgate-test/ca.pem".into()),
        ..SslConfig::default()
    };
    let t = ProbeTransport::prepare(&global(SaltTransport::Ws, Some(ssl)));
    let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let e = check(&t, a, Role::Publish, health(Probe::Salt))
        .await
        .unwrap_err()
        .detail;
    assert!(
        e.contains("ssl.ca_certs") && e.starts_with("ws check"),
        "{e}"
    );
}
