//! The master's `transport`, `ssl` and `disable_aes_with_tls` keys (Salt's names and values),
//! read into [`MasterTransport`]. A child of `salt_master.rs` (kept apart for its size).
//!
//! * `transport`: `zeromq` (Salt's default), `tcp` or `ws`
//!   (saltgate-master does not speak it).
//! * `ssl`: Salt's dict, the server side: `certfile` (required), `keyfile`, `ca_certs` (required
//!   unless `cert_reqs: CERT_NONE`: saltgate reads no system CA store), `cert_reqs` (default
//!   `CERT_REQUIRED` on a master, as Salt 3008.5); `ssl_version`, `ciphers`, `verify_locations`,
//!   `verify_flags` are accepted and not used. `True` is `{}` (and then fails for lack of a
//!   `certfile`), `False`/null is off. Only with `transport: tcp` or `ws`.
//! * `disable_aes_with_tls`: accepted. In Salt 3008.5 it swaps the master's `Crypticle` for a
//!   `TLSAwareCrypticle` that would skip AES only when handed the peer's certificate, and no
//!   caller hands it one (`salt/channel/server.py`, `salt/crypt.py`): every message stays
//!   AES-encrypted. saltgate-master keeps AES too, so the wire is the same; a warning says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::error::{ConfigError, ConfigWarning, Position};
use crate::transport::{CertReqs, SaltTransport, SslConfig, CERT_REQS, SSL_KEYS};

/// The transport keys of a master file, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MasterTransport {
    /// `transport`: zeromq (Salt's default), tcp or ws.
    pub kind: SaltTransport,
    /// `ssl` (tcp and ws): the master's certificate and what it asks of minions.
    pub ssl: Option<SslConfig>,
    /// `disable_aes_with_tls`, as written (it changes nothing on the wire; see the module doc).
    pub disable_aes_with_tls: bool,
}

/// A value of the `ssl` dict, as YAML wrote it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum SslValue {
    Bool(bool),
    Int(i64),
    Str(String),
    List(Vec<SslValue>),
    Map(BTreeMap<String, SslValue>),
}

impl SslValue {
    /// What was written, for an error message.
    fn shown(&self) -> String {
        match self {
            SslValue::Bool(b) => format!("the boolean {b}"),
            SslValue::Int(i) => format!("the number {i}"),
            SslValue::Str(s) => format!("{s:?}"),
            SslValue::List(l) => format!("a list of {}", l.len()),
            SslValue::Map(m) => format!("a mapping of {} keys", m.len()),
        }
    }
}

/// `ssl:` as YAML wrote it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawSsl {
    Bool(bool),
    Map(BTreeMap<String, Option<SslValue>>),
    Other(SslValue),
}

/// The raw keys.
#[derive(Debug, Default)]
pub(crate) struct RawTransport<'a> {
    pub transport: Option<&'a Spanned<String>>,
    pub ssl: Option<&'a Spanned<Option<RawSsl>>>,
    pub disable_aes_with_tls: Option<&'a Spanned<bool>>,
}

fn at<T>(file: Option<&Path>, s: &Spanned<T>) -> Position {
    Position::new(
        file,
        u32::try_from(s.referenced.line()).unwrap_or(u32::MAX),
        u32::try_from(s.referenced.column()).unwrap_or(u32::MAX),
    )
}

/// Reads the three keys; problems go to `errors` and `warnings`.
pub(crate) fn read(
    raw: RawTransport<'_>,
    file: Option<&Path>,
    errors: &mut Vec<ConfigError>,
    warnings: &mut Vec<ConfigWarning>,
) -> MasterTransport {
    let mut out = MasterTransport::default();
    if let Some(t) = raw.transport {
        match SaltTransport::parse(t.value.trim()) {
            Some(k) => out.kind = k,
            None => errors.push(ConfigError::new(
                at(file, t),
                "transport",
                format!("unknown transport {:?}", t.value),
                "use zeromq (Salt's default), tcp or ws",
            )),
        }
    }
    if let Some(v) = raw.ssl {
        out.ssl = ssl(v, file, errors, warnings);
        if out.ssl.is_some() && out.kind == SaltTransport::Zeromq {
            errors.push(ConfigError::new(
                at(file, v),
                "ssl",
                format!(
                    "Salt's ssl applies to the tcp and ws transports, and transport is {}",
                    out.kind.as_str()
                ),
                "set transport: tcp or ws (and the same on the minions), or remove ssl",
            ));
        }
    }
    if let Some(d) = raw.disable_aes_with_tls {
        out.disable_aes_with_tls = d.value;
        if d.value {
            warnings.push(ConfigWarning {
                at: at(file, d),
                message: "disable_aes_with_tls: accepted; Salt 3008.5 keeps its AES layer on the \
                          wire even so (no caller gives its TLSAwareCrypticle the peer's \
                          certificate), and so does saltgate-master (docs/master.md)"
                    .to_string(),
            });
        }
    }
    out
}

fn ssl(
    v: &Spanned<Option<RawSsl>>,
    file: Option<&Path>,
    errors: &mut Vec<ConfigError>,
    warnings: &mut Vec<ConfigWarning>,
) -> Option<SslConfig> {
    let mut err = |field: String, message: String, fix: &str| {
        errors.push(ConfigError::new(at(file, v), field, message, fix));
    };
    let entries = match &v.value {
        None | Some(RawSsl::Bool(false)) => return None,
        Some(RawSsl::Bool(true)) => BTreeMap::new(),
        Some(RawSsl::Map(m)) => m.iter().collect(),
        Some(RawSsl::Other(other)) => {
            err(
                "ssl".into(),
                format!("expected a mapping, found {}", other.shown()),
                "write Salt's ssl dict, e.g. ssl: {certfile: /etc/salt/pki/master.crt, keyfile: \
                 /etc/salt/pki/master.key, ca_certs: /etc/salt/pki/ca.pem}",
            );
            return None;
        }
    };
    let mut out = SslConfig::default();
    for (k, val) in entries {
        let key = format!("ssl.{k}");
        let path = |err: &mut dyn FnMut(String, String, &str)| match val {
            Some(SslValue::Str(s)) if !s.trim().is_empty() => Some(PathBuf::from(s.trim())),
            other => {
                let found = other.as_ref().map_or("nothing".into(), SslValue::shown);
                err(
                    key.clone(),
                    format!("expected the path of a PEM file, found {found}"),
                    "write the path of a PEM file",
                );
                None
            }
        };
        match k.as_str() {
            "certfile" => out.certfile = path(&mut err),
            "keyfile" => out.keyfile = path(&mut err),
            "ca_certs" => out.ca_certs = path(&mut err),
            "cert_reqs" => match val {
                Some(SslValue::Str(s)) => match CertReqs::parse(s.trim()) {
                    Some(r) => out.cert_reqs = r,
                    None => err(
                        key.clone(),
                        format!("unknown cert_reqs {s:?}"),
                        &format!("use one of {}", CERT_REQS.join(", ")),
                    ),
                },
                other => err(
                    key.clone(),
                    format!(
                        "expected a name, found {}",
                        other.as_ref().map_or("nothing".into(), SslValue::shown)
                    ),
                    "write CERT_REQUIRED, CERT_OPTIONAL or CERT_NONE",
                ),
            },
            "server_name" => warnings.push(ConfigWarning {
                at: at(file, v),
                message: format!("{key}: a client's option (saltgate's); not used by a master"),
            }),
            other if SSL_KEYS.contains(&other) => warnings.push(ConfigWarning {
                at: at(file, v),
                message: format!(
                    "{key}: accepted and not used (saltgate-master's TLS is rustls: TLS 1.2 and \
                     1.3, its own cipher suites)"
                ),
            }),
            _ => warnings.push(ConfigWarning {
                at: at(file, v),
                message: format!("{key}: unknown ssl option; ignored (check the spelling)"),
            }),
        }
    }
    if out.certfile.is_none() {
        err(
            "ssl.certfile".into(),
            "a master's ssl needs its certificate".into(),
            "set ssl.certfile (PEM, the chain the minions verify) and ssl.keyfile",
        );
    }
    if out.ca_certs.is_none() && out.cert_reqs != CertReqs::None {
        err(
            "ssl.ca_certs".into(),
            format!(
                "cert_reqs {} verifies the minions' certificates, and no ca_certs says which CA \
                 signs them (saltgate reads no system CA store)",
                out.cert_reqs.as_str()
            ),
            "set ssl.ca_certs to the CA's PEM file, or cert_reqs: CERT_NONE to ask minions for no \
             certificate",
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use crate::salt_master::parse_salt_master;
    use crate::transport::{CertReqs, SaltTransport};
    use std::path::{Path, PathBuf};

    fn first_error(text: &str) -> String {
        parse_salt_master(text, Some(Path::new("master")))
            .expect_err("must fail")
            .first()
            .to_string()
    }

    #[test]
    fn transport_tcp_and_the_server_side_of_salts_ssl_are_read() {
        let l = parse_salt_master(
            "transport: tcp\nssl:\n  certfile: /pki/m.crt\n  keyfile: /pki/m.key\n  \
             ca_certs: /pki/ca.pem\n  ssl_version: PROTOCOL_TLS_SERVER\n",
            None,
        )
        .unwrap();
        let t = &l.config.transport;
        assert_eq!(t.kind, SaltTransport::Tcp);
        let ssl = t.ssl.clone().unwrap();
        assert_eq!(ssl.certfile, Some(PathBuf::from("/pki/m.crt")));
        assert_eq!(ssl.keyfile, Some(PathBuf::from("/pki/m.key")));
        assert_eq!(ssl.ca_certs, Some(PathBuf::from("/pki/ca.pem")));
        // Salt 3008.5's default for a server.
        assert_eq!(ssl.cert_reqs, CertReqs::Required);
        assert!(l
            .warnings
            .iter()
            .any(|w| w.message.contains("ssl.ssl_version")));
        assert!(!l
            .warnings
            .iter()
            .any(|w| w.message.starts_with("transport")));
        assert!(!l.warnings.iter().any(|w| w.message.starts_with("ssl:")));

        let l = parse_salt_master(
            "transport: tcp\nssl: {certfile: /c, cert_reqs: CERT_NONE}\ndisable_aes_with_tls: True\n",
            None,
        )
        .unwrap();
        assert_eq!(l.config.transport.ssl.unwrap().cert_reqs, CertReqs::None);
        assert!(l.config.transport.disable_aes_with_tls);
        assert!(l
            .warnings
            .iter()
            .any(|w| w.message.starts_with("disable_aes_with_tls: accepted")));
        let l = parse_salt_master("transport: zeromq\nssl: null\n", None).unwrap();
        assert_eq!(l.config.transport.kind, SaltTransport::Zeromq);
        assert_eq!(l.config.transport.ssl, None);
        let l = parse_salt_master("id: m\n", None).unwrap();
        assert_eq!(l.config.transport, Default::default());
    }

    #[test]
    fn what_saltgate_master_cannot_do_is_refused_naming_the_key() {
        for (text, key, what) in [
            ("transport: zmq\n", "transport", "unknown transport"),
            (
                "ssl: {certfile: /c, ca_certs: /a}\n",
                "ssl",
                "transport: tcp",
            ),
            ("transport: tcp\nssl: True\n", "ssl.certfile", "certificate"),
            (
                "transport: tcp\nssl: {certfile: /c}\n",
                "ssl.ca_certs",
                "CERT_NONE",
            ),
            (
                "transport: tcp\nssl: {certfile: /c, ca_certs: /a, cert_reqs: MAYBE}\n",
                "ssl.cert_reqs",
                "CERT_REQUIRED",
            ),
            ("transport: tcp\nssl: /etc/ssl\n", "ssl", "mapping"),
            (
                "transport: tcp\nssl: {certfile: 7, ca_certs: /a}\n",
                "ssl.certfile",
                "PEM",
            ),
        ] {
            let e = first_error(text);
            assert!(e.contains(key) && e.contains(what), "{text:?}: {e}");
        }
    }
}
