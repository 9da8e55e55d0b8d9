//! The server side of Salt's `ssl` option (saltgate-master on `transport: tcp`), with rustls
//! (ring). Salt builds its server context with `salt.transport.base.ssl_context(ssl,
//! server_side=True)`: Python's `create_default_context(CLIENT_AUTH)`, then `certfile`/`keyfile`
//! (the master's certificate), `ca_certs` (the CAs that sign minion certificates) and
//! `cert_reqs`, **`CERT_REQUIRED` when unset** (3008.5 sets it for a server explicitly).
//!
//! | `cert_reqs` | here |
//! |---|---|
//! | `CERT_REQUIRED` (default) | a client certificate signed by `ca_certs` is required |
//! | `CERT_OPTIONAL` | one is verified when sent; a client without one is served |
//! | `CERT_NONE` | none is asked for |
//!
//! Differences from Salt: the system's CA store is not read (Python's default context loads it),
//! so `ca_certs` is required unless `cert_reqs` is `CERT_NONE`; `ssl_version`, `ciphers`,
//! `verify_locations` and `verify_flags` are not used (rustls: TLS 1.2 and 1.3, its own suites).

use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::PrivateKeyDer;
use tokio_rustls::rustls::server::WebPkiClientVerifier;

use super::tls::{certs, CertReqs, TlsError, TlsSettings};

/// A TLS acceptor's configuration, built once (at load or reload) from Salt's `ssl`.
#[derive(Clone)]
pub struct TlsServer {
    pub config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer").finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Reads the files of `s` and builds the server side; errors name the `ssl` key to fix.
    pub fn new(s: &TlsSettings) -> Result<Self, TlsError> {
        server_config(s).map(|config| TlsServer { config })
    }
}

/// The server configuration for Salt's `ssl` dict `s` (see the module's table).
pub fn server_config(s: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match s.cert_reqs {
        CertReqs::None => builder.with_no_client_auth(),
        reqs => {
            let ca = s.ca_certs.as_ref().ok_or_else(|| {
                TlsError::Config(format!(
                    "ca_certs is required with cert_reqs {}: the CAs that sign the minions' \
                     certificates (saltgate does not read the system's CA store); set \
                     ssl.ca_certs, or cert_reqs: CERT_NONE to ask for no client certificate",
                    if reqs == CertReqs::Optional {
                        "CERT_OPTIONAL"
                    } else {
                        "CERT_REQUIRED (the default on a master)"
                    }
                ))
            })?;
            let mut roots = rustls::RootCertStore::empty();
            for c in certs("ca_certs", ca)? {
                roots.add(c).map_err(|e| TlsError::Read {
                    key: "ca_certs",
                    path: ca.clone(),
                    err: e.to_string(),
                })?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if reqs == CertReqs::Optional {
                v.allow_unauthenticated()
            } else {
                v
            };
            let v = v
                .build()
                .map_err(|e| TlsError::Config(format!("ca_certs: {e}")))?;
            builder.with_client_cert_verifier(v)
        }
    };
    let cert = s.certfile.as_ref().ok_or_else(|| {
        TlsError::Config(
            "certfile is required on a master: its certificate (chain), PEM; set ssl.certfile \
             (and ssl.keyfile when the key is in another file)"
                .into(),
        )
    })?;
    let chain = certs("certfile", cert)?;
    let (key_path, key_name) = match &s.keyfile {
        Some(k) => (k, "keyfile"),
        None => (cert, "certfile"),
    };
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| TlsError::Read {
        key: key_name,
        path: key_path.clone(),
        err: e.to_string(),
    })?;
    let cfg = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("certfile/keyfile: {e}")))?;
    Ok(Arc::new(cfg))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    /// A CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`.
    pub(crate) fn make_pki(dir: &Path) {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca =
            rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        for (name, san) in [("server", "127.0.0.1"), ("client", "minion-1")] {
            let key = rcgen::KeyPair::generate().unwrap();
            let params = rcgen::CertificateParams::new(vec![san.to_string()]).unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
    }

    #[test]
    fn a_master_needs_its_certificate_and_the_minions_ca_unless_cert_none() {
        let dir = tempfile::tempdir().unwrap();
        make_pki(dir.path());
        let p = |n: &str| Some(dir.path().join(n));
        let ok = TlsSettings {
            certfile: p("server.pem"),
            keyfile: p("server.key"),
            ca_certs: p("ca.pem"),
            ..TlsSettings::default()
        };
        assert!(server_config(&ok).is_ok());
        let e = server_config(&TlsSettings {
            ca_certs: None,
            ..ok.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("ca_certs") && e.contains("CERT_NONE"), "{e}");
        assert!(server_config(&TlsSettings {
            ca_certs: None,
            cert_reqs: CertReqs::None,
            ..ok.clone()
        })
        .is_ok());
        let e = server_config(&TlsSettings {
            certfile: None,
            ..ok.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("certfile"), "{e}");
        let e = server_config(&TlsSettings {
            keyfile: p("missing.key"),
            ..ok
        })
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("ssl.keyfile"), "{e}");
    }
}
