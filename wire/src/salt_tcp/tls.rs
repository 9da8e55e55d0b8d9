//! The client side of Salt's `ssl` option for the `tcp` and `ws` probes, with rustls (ring): no
//! OpenSSL. Salt builds its client context with `salt.transport.base.ssl_context(ssl,
//! server_side=False)`: Python's `create_default_context(SERVER_AUTH)` (the system's CAs, host
//! name checked), then `certfile`/`keyfile` (a client certificate), `ca_certs` (the CAs trusted),
//! and `cert_reqs`. `CERT_NONE` turns verification and the host-name check off; `CERT_OPTIONAL`
//! and `CERT_REQUIRED` verify alike on a client (a server always sends its certificate).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;
pub use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};

/// Salt's `cert_reqs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CertReqs {
    /// No verification of the master's certificate (nor of its name).
    None,
    /// As `Required` on a client.
    Optional,
    /// Python's default for a client context.
    #[default]
    Required,
}

/// What a TLS probe needs, read from Salt's `ssl` keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// A client certificate (chain) to present, PEM (`certfile`).
    pub certfile: Option<PathBuf>,
    /// Its key, PEM (`keyfile`; Salt allows the key inside `certfile`).
    pub keyfile: Option<PathBuf>,
    /// CAs trusted for the master's certificate, PEM (`ca_certs`). Without it: none is trusted
    /// but with `CERT_NONE` (saltgate does not read the system's CA store).
    pub ca_certs: Option<PathBuf>,
    pub cert_reqs: CertReqs,
    /// The name the master's certificate must carry; `None`: the probed address (as Salt, which
    /// checks the `master` it connects to).
    pub server_name: Option<String>,
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("ssl.{key}: cannot read {path}: {err}")]
    Read {
        key: &'static str,
        path: PathBuf,
        err: String,
    },
    #[error("ssl.{key}: {path} holds no {what}")]
    Empty {
        key: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error("ssl: {0}")]
    Config(String),
}

pub(crate) fn certs(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::Read {
            key,
            path: path.into(),
            err: e.to_string(),
        })?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Read {
            key,
            path: path.into(),
            err: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            key,
            path: path.into(),
            what: "PEM certificate",
        });
    }
    Ok(certs)
}

/// Builds the client configuration once (files are read here: call it at load and reload).
pub fn client_config(s: &TlsSettings) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = if s.cert_reqs == CertReqs::None {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &s.ca_certs {
            for c in certs("ca_certs", ca)? {
                roots.add(c).map_err(|e| TlsError::Read {
                    key: "ca_certs",
                    path: ca.clone(),
                    err: e.to_string(),
                })?;
            }
        }
        builder.with_root_certificates(roots)
    };
    let cfg = match &s.certfile {
        Some(cert) => {
            let chain = certs("certfile", cert)?;
            let key_path = s.keyfile.as_ref().unwrap_or(cert);
            let key_name = if s.keyfile.is_some() {
                "keyfile"
            } else {
                "certfile"
            };
            let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| TlsError::Read {
                key: key_name,
                path: key_path.clone(),
                err: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError::Config(format!("certfile/keyfile: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// The server name to check for a master at `ip` (`server_name` when set).
pub fn server_name(s: &TlsSettings, ip: std::net::IpAddr) -> Result<ServerName<'static>, TlsError> {
    match &s.server_name {
        Some(n) => ServerName::try_from(n.clone())
            .map_err(|e| TlsError::Config(format!("server_name {n:?}: {e}"))),
        None => Ok(ServerName::IpAddress(ip.into())),
    }
}

/// `CERT_NONE`: any certificate is accepted, signatures are still checked (the handshake stays
/// well-formed).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
