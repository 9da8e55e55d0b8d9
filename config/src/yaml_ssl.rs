//! Salt's `ssl` value, as saltgate.yaml and the masters' own file write it (`transport.rs` holds
//! the model). Shared by `yaml_transport.rs` and `yaml_master_config.rs`.

use std::path::PathBuf;

use crate::transport::{CertReqs, SslConfig, CERT_REQS, SSL_KEYS};
use crate::yaml_tree::{Kind, Node};
use crate::yaml_values::{join, Checker};

/// Salt's `ssl` value: a dict of its keys, `true` (`{}`), `false` or null (off).
pub(crate) fn ssl_dict(c: &mut Checker<'_>, n: &Node) -> Option<SslConfig> {
    match &n.kind {
        Kind::Null => return None,
        // Salt: `ssl: True` is `{}` (verify with the defaults), `False` is off.
        Kind::Bool(b) => return b.then(SslConfig::default),
        _ => {}
    }
    let f = c.fields(Some(n), "ssl", SSL_KEYS);
    let mut out = SslConfig::default();
    let path = |c: &mut Checker<'_>, key: &str| {
        f.get(key).and_then(|v| {
            c.text(v, &join("ssl", key), "the path of a PEM file")
                .map(PathBuf::from)
        })
    };
    out.certfile = path(c, "certfile");
    out.keyfile = path(c, "keyfile");
    out.ca_certs = path(c, "ca_certs");
    if let Some(v) = f.get("server_name") {
        out.server_name = c.text(
            v,
            "ssl.server_name",
            "the name in the masters' certificates",
        );
    }
    if let Some(v) = f.get("cert_reqs") {
        if let Some(t) = c.text(v, "ssl.cert_reqs", "CERT_REQUIRED") {
            match CertReqs::parse(&t) {
                Some(r) => out.cert_reqs = r,
                None => c.err(
                    v,
                    "ssl.cert_reqs",
                    format!("unknown cert_reqs {t:?}"),
                    format!("use one of {}", CERT_REQS.join(", ")),
                ),
            }
        }
    }
    if out.keyfile.is_some() && out.certfile.is_none() {
        if let Some(v) = f.get("keyfile") {
            c.err(
                v,
                "ssl.keyfile",
                "a keyfile without a certfile",
                "add ssl.certfile (the client certificate of that key), or remove ssl.keyfile",
            );
        }
    }
    Some(out)
}
