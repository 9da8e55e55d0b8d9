//! Salt's `transport` and `ssl` (top-level keys of saltgate.yaml, as in the masters' own
//! configuration), stored in [`crate::Global`]. Kept out of `model.rs` (near its size limit);
//! read, and checked against the rest, in `yaml_transport.rs`.
//!
//! ```yaml
//! transport: tcp          # zeromq (default) | tcp | ws: what the masters' `transport` says
//! ssl:                    # Salt's `ssl` dict: the probes reach the masters over TLS
//!   ca_certs: /etc/salt/pki/ca.pem
//!   cert_reqs: CERT_REQUIRED
//! ```

use std::path::PathBuf;

/// Salt's `transport` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaltTransport {
    /// ZeroMQ (ZMTP 3.1), Salt's default.
    #[default]
    Zeromq,
    /// `salt/transport/tcp.py`: msgpack `{head, body}` maps on a plain stream.
    Tcp,
    /// `salt/transport/ws.py`: an aiohttp websocket on `/ws`.
    Ws,
}

/// What `transport:` accepts.
pub const TRANSPORTS: &[&str] = &["zeromq", "tcp", "ws"];

impl SaltTransport {
    pub fn as_str(self) -> &'static str {
        match self {
            SaltTransport::Zeromq => "zeromq",
            SaltTransport::Tcp => "tcp",
            SaltTransport::Ws => "ws",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "zeromq" => Some(SaltTransport::Zeromq),
            "tcp" => Some(SaltTransport::Tcp),
            "ws" => Some(SaltTransport::Ws),
            _ => None,
        }
    }
}

/// Salt's `cert_reqs` (Python's `ssl.VerifyMode` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CertReqs {
    None,
    Optional,
    /// Python's default for a client.
    #[default]
    Required,
}

pub const CERT_REQS: &[&str] = &["CERT_NONE", "CERT_OPTIONAL", "CERT_REQUIRED"];

impl CertReqs {
    pub fn as_str(self) -> &'static str {
        match self {
            CertReqs::None => "CERT_NONE",
            CertReqs::Optional => "CERT_OPTIONAL",
            CertReqs::Required => "CERT_REQUIRED",
        }
    }
    /// As Salt's `_update_ssl_config` reads it: the constant's name, `CERT_` prefix optional.
    pub fn parse(s: &str) -> Option<Self> {
        match s.strip_prefix("CERT_").unwrap_or(s) {
            "NONE" => Some(CertReqs::None),
            "OPTIONAL" => Some(CertReqs::Optional),
            "REQUIRED" => Some(CertReqs::Required),
            _ => None,
        }
    }
}

/// Salt's `ssl` dict, as saltgate's probes use it (client side).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SslConfig {
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    pub ca_certs: Option<PathBuf>,
    pub cert_reqs: CertReqs,
    /// saltgate's own: the name the masters' certificates carry, when it is not their address.
    pub server_name: Option<String>,
}

/// The keys of `ssl:`. Salt's other keys (`ssl_version`, `ciphers`, `verify_locations`,
/// `verify_flags`) are accepted and not used by saltgate's client (rustls picks TLS 1.2/1.3).
pub const SSL_KEYS: &[&str] = &[
    "certfile",
    "keyfile",
    "ca_certs",
    "cert_reqs",
    "server_name",
    "ssl_version",
    "ciphers",
    "verify_locations",
    "verify_flags",
];
