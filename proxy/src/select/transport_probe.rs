//! The checks of masters on Salt's `tcp` and `ws` transports (top-level `transport:`), over TLS
//! with `ssl:`. What `probe: salt` means there: the request port answers Salt's clear `ping`
//! framed for the transport (a 3008 cluster member answering `cluster_retry` is not ready); the
//! publish port completes the connect, the TLS handshake and the websocket upgrade, then is closed
//! cleanly. `probe: tcp` stays a TCP connect. The TLS client is built once per configuration (the
//! files are read at load and reload), and each master keeps the one in force
//! ([`crate::select::master::Master::probe_transport`]).

use std::net::SocketAddr;
use std::sync::Arc;

use saltgate_config::transport::{CertReqs, SaltTransport, SslConfig};
use saltgate_config::{Global, HealthSettings, Probe, Role};
use saltgate_wire::salt_tcp::probe::{self as p, SaltProbeError, Target, TlsClient, Transport};
use saltgate_wire::salt_tcp::tls::{self, TlsSettings};

use crate::select::check_failure::CheckFailure;
use crate::select::local_resource::connect_error;

/// The transport the checks speak, with the TLS client prepared from `ssl:`.
#[derive(Debug)]
pub struct ProbeTransport {
    pub transport: SaltTransport,
    tls: Option<Result<(Arc<tls::rustls::ClientConfig>, TlsSettings), String>>,
}

impl Default for ProbeTransport {
    fn default() -> Self {
        ProbeTransport {
            transport: SaltTransport::Zeromq,
            tls: None,
        }
    }
}

impl ProbeTransport {
    /// Prepares the checks of a configuration (reads the `ssl` files; a failure is kept and every
    /// check reports it).
    pub fn prepare(global: &Global) -> Arc<Self> {
        let tls = global.ssl.as_ref().map(|s| {
            let settings = settings(s);
            tls::client_config(&settings)
                .map(|c| (c, settings))
                .map_err(|e| e.to_string())
        });
        if let Some(Err(e)) = &tls {
            tracing::error!(target: "saltgate_proxy::check", error = %e, "ssl: the TLS client of the health checks cannot be built: every check of a master fails until this is fixed");
        }
        Arc::new(ProbeTransport {
            transport: global.transport,
            tls,
        })
    }

    /// Whether the checks go the ZeroMQ way (the [`crate::select::check::SaltProbes`] of old).
    pub fn is_zeromq(&self) -> bool {
        self.transport == SaltTransport::Zeromq
    }

    fn target(&self, addr: SocketAddr) -> Result<Target, String> {
        let transport = match self.transport {
            SaltTransport::Ws => Transport::Ws,
            _ => Transport::Tcp,
        };
        let tls = match &self.tls {
            None => None,
            Some(Err(e)) => return Err(e.clone()),
            Some(Ok((config, settings))) => Some(TlsClient {
                config: config.clone(),
                server_name: tls::server_name(settings, addr.ip()).map_err(|e| e.to_string())?,
            }),
        };
        Ok(Target {
            addr,
            transport,
            tls,
        })
    }
}

fn settings(s: &SslConfig) -> TlsSettings {
    TlsSettings {
        certfile: s.certfile.clone(),
        keyfile: s.keyfile.clone(),
        ca_certs: s.ca_certs.clone(),
        cert_reqs: match s.cert_reqs {
            CertReqs::None => tls::CertReqs::None,
            CertReqs::Optional => tls::CertReqs::Optional,
            CertReqs::Required => tls::CertReqs::Required,
        },
        server_name: s.server_name.clone(),
    }
}

/// One check of a port of a `tcp` or `ws` master. The publish check waits up to `timeout` and
/// says whether it passed within `handshake_timeout` (see [`crate::select::check::SaltProbes`]).
pub async fn check(
    t: &ProbeTransport,
    addr: SocketAddr,
    role: Role,
    health: HealthSettings,
) -> Result<(), CheckFailure> {
    let timeout = health.timeout;
    let handshake = health.handshake_timeout.min(timeout);
    if health.probe == Probe::Tcp {
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(connect_error("connect", &e)),
            Err(_) => Err(format!("connect: no answer within {timeout:?}").into()),
        };
    }
    let name = t.transport.as_str();
    let target = t
        .target(addr)
        .map_err(|e| CheckFailure::failed(format!("{name} check: {e}")))?;
    let tls = if target.tls.is_some() { "+TLS" } else { "" };
    let what = match role {
        Role::Request => format!("salt ping ({name}{tls})"),
        Role::Publish => format!("{name}{tls} publish check"),
    };
    let began = tokio::time::Instant::now();
    let r = match role {
        Role::Request => p::salt_ping_staged(&target, handshake, timeout)
            .await
            .map(|_| ()),
        Role::Publish => p::publish_check(&target, timeout).await.map(|_| ()),
    };
    match r {
        Ok(()) if role == Role::Publish => CheckFailure::on_time(
            format_args!("{what}: the handshake"),
            began.elapsed(),
            handshake,
        ),
        Ok(()) => Ok(()),
        Err(SaltProbeError::NotReady) => Err(CheckFailure::failed(format!(
            "{what}: not ready (cluster_retry: not yet a cluster member)"
        ))),
        Err(SaltProbeError::Connect(e)) => Err(connect_error(&format!("{what}: connect"), &e)),
        // A full accept backlog or a saturated publish server looks the same from here as a
        // stopped one; the request port and the busy rule tell which.
        Err(
            e @ (SaltProbeError::ConnectTimeout(_)
            | SaltProbeError::NoHandshake { .. }
            | SaltProbeError::Timeout(_)),
        ) if role == Role::Publish => Err(CheckFailure::no_greeting(format_args!("{what}: {e}"))),
        Err(SaltProbeError::Timeout(d)) if tls.is_empty() && t.transport == SaltTransport::Tcp => {
            Err(CheckFailure::no_answer(format_args!(
                "{what}: the master reads (its process runs), no answer within {d:?}"
            )))
        }
        Err(SaltProbeError::Timeout(d)) => Err(CheckFailure::no_answer(format_args!(
            "{what}: handshake done, no answer within {d:?}"
        ))),
        Err(e) => Err(CheckFailure::failed(format!("{what}: {e}"))),
    }
}

#[cfg(test)]
#[path = "transport_probe_tests.rs"]
mod tests;
