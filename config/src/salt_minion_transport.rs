//! The minion's `transport`, `ssl` and `disable_aes_with_tls` keys (Salt's names and values),
//! read into the model the proxy uses ([`crate::transport`]). A child of `salt_minion.rs` (kept
//! apart for its size).
//!
//! * `transport`: `zeromq` (Salt's default), `tcp` or `ws`
//!   (saltgate-minion does not speak it yet).
//! * `ssl`: Salt's dict (`certfile`, `keyfile`, `ca_certs`, `cert_reqs`; `ssl_version`,
//!   `ciphers`, `verify_locations`, `verify_flags` accepted and not used) plus saltgate's
//!   `server_name`; `True` is `{}`, `False`/null off. Only with `transport: tcp` or `ws`.
//! * `disable_aes_with_tls`: accepted, with a warning when True: Salt 3008.5's own minion never
//!   reads it (only the master's request channel builds a `TLSAwareCrypticle`, and no caller gives
//!   it the peer's certificate), so the wire keeps Salt's AES layer either way; so does
//!   saltgate-minion.

use std::path::PathBuf;

use serde_saphyr::Spanned;

use super::{show, Checker, Raw};
use crate::error::ConfigWarning;
use crate::transport::{CertReqs, SaltTransport, SslConfig, CERT_REQS, SSL_KEYS};

/// Salt's `ssl` keys that saltgate-minion reads; the rest of [`SSL_KEYS`] are accepted, unused.
const SSL_USED: &[&str] = &[
    "certfile",
    "keyfile",
    "ca_certs",
    "cert_reqs",
    "server_name",
];

pub(super) fn transport(c: &mut Checker<'_>, v: &Spanned<Raw>) -> Option<SaltTransport> {
    let t = c.text(v, "transport", "write transport: zeromq, tcp or ws")?;
    match SaltTransport::parse(&t) {
        Some(x) => Some(x),
        None => {
            c.err(
                v,
                "transport",
                format!("unknown transport {t:?}"),
                "use zeromq, tcp or ws (the master's own `transport`)",
            );
            None
        }
    }
}

pub(super) fn ssl(c: &mut Checker<'_>, v: &Spanned<Raw>) -> Option<SslConfig> {
    let entries = match &v.value {
        Raw::Null => return None,
        Raw::Bool(b) => return b.then(SslConfig::default),
        Raw::Map(m) => m,
        other => {
            let m = format!("expected a mapping, found {}", other.kind());
            c.err(
                v,
                "ssl",
                m,
                "write Salt's ssl dict, e.g. ssl: {ca_certs: /etc/salt/pki/ca.pem}",
            );
            return None;
        }
    };
    let mut out = SslConfig::default();
    for (k, val) in entries {
        let key = format!("ssl.{k}");
        let path = |c: &mut Checker<'_>| match val {
            Raw::Str(s) if !s.trim().is_empty() => Some(PathBuf::from(s.trim())),
            other => {
                let m = format!("expected the path of a PEM file, found {}", show(other));
                c.err(v, &key, m, "write the path of a PEM file");
                None
            }
        };
        match k.as_str() {
            "certfile" => out.certfile = path(c),
            "keyfile" => out.keyfile = path(c),
            "ca_certs" => out.ca_certs = path(c),
            "server_name" => match val {
                Raw::Str(s) if !s.trim().is_empty() => out.server_name = Some(s.trim().into()),
                other => {
                    let m = format!("expected a host name, found {}", show(other));
                    c.err(
                        v,
                        &key,
                        m,
                        "write the name the master's certificate carries",
                    );
                }
            },
            "cert_reqs" => match val {
                Raw::Str(s) => match CertReqs::parse(s.trim()) {
                    Some(r) => out.cert_reqs = r,
                    None => c.err(
                        v,
                        &key,
                        format!("unknown cert_reqs {s:?}"),
                        &format!("use one of {}", CERT_REQS.join(", ")),
                    ),
                },
                other => {
                    let m = format!("expected a name, found {}", show(other));
                    c.err(
                        v,
                        &key,
                        m,
                        "write CERT_REQUIRED, CERT_OPTIONAL or CERT_NONE",
                    );
                }
            },
            other if SSL_KEYS.contains(&other) && !SSL_USED.contains(&other) => {
                c.warnings.push(ConfigWarning {
                    at: c.at(v),
                    message: format!(
                        "{key}: accepted and not used (saltgate-minion's TLS is rustls: TLS 1.2 \
                         and 1.3, its own cipher suites)"
                    ),
                })
            }
            _ => c.warnings.push(ConfigWarning {
                at: c.at(v),
                message: format!("{key}: unknown ssl option; ignored (check the spelling)"),
            }),
        }
    }
    if out.keyfile.is_some() && out.certfile.is_none() {
        c.err(
            v,
            "ssl.keyfile",
            "a keyfile without a certfile",
            "add ssl.certfile (the client certificate of that key), or remove ssl.keyfile",
        );
    }
    Some(out)
}

pub(super) fn disable_aes_with_tls(c: &mut Checker<'_>, v: &Spanned<Raw>) {
    if c.boolean(v, "disable_aes_with_tls") == Some(true) {
        let at = c.at(v);
        c.warnings.push(ConfigWarning {
            at,
            message:
                "disable_aes_with_tls: accepted; it changes nothing on a minion (Salt 3008.5's \
                      minion does not read it either): requests and publishes keep Salt's AES \
                      layer under TLS (docs/minion.md)"
                    .to_string(),
        });
    }
}

/// The checks across keys: `ssl` needs `transport: tcp` or `ws`.
pub(super) fn check(c: &mut Checker<'_>, transport: SaltTransport, ssl: Option<&Spanned<Raw>>) {
    if let (Some(v), SaltTransport::Zeromq) = (ssl, transport) {
        if !matches!(v.value, Raw::Null | Raw::Bool(false)) {
            c.err(
                v,
                "ssl",
                "Salt's ssl applies to the tcp and ws transports, and transport is zeromq",
                "set transport: tcp or ws (as on the master), or remove ssl",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_minion;
    use crate::transport::{CertReqs, SaltTransport, SslConfig};
    use std::path::{Path, PathBuf};

    fn first_error(text: &str) -> (String, String) {
        let e = parse_minion(text, Some(Path::new("minion")))
            .expect_err("must fail")
            .first()
            .clone();
        (e.to_string(), format!("{e:?}"))
    }

    #[test]
    fn transport_tcp_and_salts_ssl_keys_are_read() {
        let l = parse_minion(
            "master: 127.0.0.1\ntransport: tcp\nssl:\n  ca_certs: /pki/ca.pem\n  certfile: /pki/m.pem\n  \
             keyfile: /pki/m.key\n  cert_reqs: CERT_REQUIRED\n  ssl_version: PROTOCOL_TLS_CLIENT\n",
            None,
        )
        .unwrap();
        assert_eq!(l.config.transport, SaltTransport::Tcp);
        assert_eq!(
            l.config.ssl,
            Some(SslConfig {
                certfile: Some(PathBuf::from("/pki/m.pem")),
                keyfile: Some(PathBuf::from("/pki/m.key")),
                ca_certs: Some(PathBuf::from("/pki/ca.pem")),
                cert_reqs: CertReqs::Required,
                server_name: None,
            })
        );
        assert!(
            l.warnings
                .iter()
                .any(|w| w.message.contains("ssl.ssl_version")),
            "{:?}",
            l.warnings
        );
        assert!(!l
            .warnings
            .iter()
            .any(|w| w.message.starts_with("transport")));
        let l = parse_minion(
            "transport: tcp\nssl: True\ndisable_aes_with_tls: False\n",
            None,
        )
        .unwrap();
        assert_eq!(l.config.ssl, Some(SslConfig::default()));
        let l = parse_minion("transport: zeromq\nssl: null\n", None).unwrap();
        assert_eq!(l.config.transport, SaltTransport::Zeromq);
        assert_eq!(l.config.ssl, None);
        let l = parse_minion("transport: tcp\nssl: {cert_reqs: NONE}\n", None).unwrap();
        assert_eq!(l.config.ssl.unwrap().cert_reqs, CertReqs::None);
    }

    #[test]
    fn what_saltgate_minion_cannot_do_is_refused_naming_the_key() {
        let l = parse_minion("transport: ws\nssl: {cert_reqs: CERT_NONE}\n", None).unwrap();
        assert_eq!(l.config.transport, SaltTransport::Ws);
        assert!(l.config.ssl.is_some());
        let (e, _) = first_error("transport: zmq\n");
        assert!(e.contains("unknown transport"), "{e}");
        let (e, _) = first_error("ssl:\n  ca_certs: /x\n");
        assert!(e.contains("ssl") && e.contains("transport: tcp"), "{e}");
        let (e, _) = first_error("transport: tcp\nssl: {cert_reqs: MAYBE}\n");
        assert!(e.contains("ssl.cert_reqs"), "{e}");
        let (e, _) = first_error("transport: tcp\nssl: {keyfile: /k}\n");
        assert!(e.contains("ssl.keyfile"), "{e}");
        let (e, _) = first_error("transport: tcp\nssl: /etc/ssl\n");
        assert!(e.contains("ssl"), "{e}");
    }

    #[test]
    fn disable_aes_with_tls_is_accepted_with_a_warning_as_salts_minion_ignores_it() {
        let l = parse_minion(
            "transport: tcp\nssl: {}\ndisable_aes_with_tls: True\n",
            None,
        )
        .unwrap();
        assert!(
            l.warnings
                .iter()
                .any(|w| w.message.starts_with("disable_aes_with_tls: accepted")),
            "{:?}",
            l.warnings
        );
        let l = parse_minion("disable_aes_with_tls: False\n", None).unwrap();
        assert!(!l
            .warnings
            .iter()
            .any(|w| w.message.contains("disable_aes_with_tls")));
        let (e, _) = first_error("disable_aes_with_tls: sometimes\n");
        assert!(e.contains("disable_aes_with_tls"), "{e}");
    }
}
