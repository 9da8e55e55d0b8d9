//! `discovery.master_config`: Salt's `transport` and `ssl` read from the masters' own
//! configuration file, as saltgate reads the cluster's `cluster_pki_dir` for its masters.
//!
//! The file is read as Salt reads it: the file itself, then `master.d/*.conf` beside it in name
//! order (Salt's `default_include`), a later file's key replacing an earlier one's. Only
//! `transport` and `ssl` are looked at; every other key is Salt's and left alone. Read at load and
//! at every reload. Errors in those two keys point into the master's file (file, line, column).
//!
//! How they combine with saltgate.yaml's own keys ([`combine`]):
//! - `transport`: the masters' (Salt's default `zeromq` when their file has none). Written in
//!   saltgate.yaml too, it must agree.
//! - `ssl`: the masters' is the *server* side (their certificate and key, the CA they check
//!   clients against); saltgate is a client. Written in saltgate.yaml, saltgate's own is used.
//!   Otherwise saltgate trusts the masters' `ca_certs` (`cert_reqs: CERT_REQUIRED`), which works
//!   when that CA signed the masters' certificates and the masters do not ask for a client
//!   certificate (their `cert_reqs: CERT_NONE`; Salt's server default is `CERT_REQUIRED`): for
//!   anything else saltgate.yaml must say it, and the error says what to write.

use std::path::{Path, PathBuf};

use crate::error::Position;
use crate::transport::{CertReqs, SaltTransport, SslConfig};
use crate::yaml_tree::{Kind, Node};
use crate::yaml_values::Checker;

const FIELD: &str = "discovery.master_config";

/// What the masters' files say.
#[derive(Debug, Default)]
pub(crate) struct Masters {
    pub path: PathBuf,
    /// Where saltgate.yaml names it (errors about the combination point there).
    pub at: Position,
    /// `None`: not in their files (Salt's default, `zeromq`).
    pub transport: Option<SaltTransport>,
    /// `None`: no `ssl` (or `ssl: False`).
    pub ssl: Option<SslConfig>,
    /// Whether they ask clients for a certificate (their `cert_reqs` is not `CERT_NONE`).
    pub want_client_cert: bool,
}

/// The value of a key of a mapping node.
fn key<'n>(map: &'n Node, name: &str) -> Option<&'n Node> {
    match &map.kind {
        Kind::Map(entries) => entries
            .iter()
            .rev() // YAML's last duplicate wins, as in Salt
            .find(|(k, _)| k.scalar_text().as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// The file `discovery.master_config` names, resolved against saltgate.yaml's directory.
fn resolve(c: &Checker<'_>, written: &str) -> PathBuf {
    let p = PathBuf::from(written);
    match c.file.and_then(Path::parent) {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
}

/// Reads `discovery.master_config` when `discovery` has one; errors go to `c`.
pub(crate) fn read(c: &mut Checker<'_>, discovery: Option<&Node>) -> Option<Masters> {
    let n = discovery.and_then(|d| key(d, "master_config"))?;
    let written = c.text(
        n,
        FIELD,
        "the path of the masters' configuration, e.g. /etc/salt/master",
    )?;
    let path = resolve(c, written.trim());
    let mut files = vec![path.clone()];
    if let Some(dir) = path.parent() {
        let mut more: Vec<PathBuf> = std::fs::read_dir(dir.join("master.d"))
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                    .collect()
            })
            .unwrap_or_default();
        more.sort();
        files.extend(more);
    }
    let mut out = Masters {
        path: path.clone(),
        at: c.at(n),
        ..Masters::default()
    };
    for file in &files {
        let text = match crate::read_text(file) {
            Ok(t) => t,
            Err(e) => {
                c.err(
                    n,
                    FIELD,
                    format!("{}: {}", file.display(), e.message),
                    format!("{} (the masters' own configuration file, which saltgate reads for `transport` and `ssl`)", e.fix),
                );
                return None;
            }
        };
        let root = match crate::yaml_tree::read(&text) {
            Ok(r) => r,
            Err(e) => {
                c.err(
                    n,
                    FIELD,
                    format!("{} is not YAML: {e}", file.display()),
                    "fix that file (Salt could not read it either), or name the right one",
                );
                return None;
            }
        };
        // The two keys, checked as saltgate.yaml's are, with positions in the masters' file.
        let mut mc = Checker {
            file: Some(file),
            errors: Vec::new(),
        };
        if let Some(t) = key(&root, "transport") {
            if let Some(text) = mc.text(t, "transport", "zeromq, tcp or ws") {
                match SaltTransport::parse(&text) {
                    Some(x) => out.transport = Some(x),
                    None => mc.err(
                        t,
                        "transport",
                        format!("unknown transport {text:?} in the masters' configuration"),
                        "use zeromq, tcp or ws there (Salt refuses anything else too)",
                    ),
                }
            }
        }
        if let Some(s) = key(&root, "ssl") {
            out.ssl = crate::yaml_ssl::ssl_dict(&mut mc, s);
            out.want_client_cert = out.ssl.is_some()
                && !key(s, "cert_reqs")
                    .and_then(Node::scalar_text)
                    .and_then(|t| CertReqs::parse(&t))
                    .is_some_and(|r| r == CertReqs::None);
        }
        c.errors.extend(mc.errors);
    }
    Some(out)
}

/// saltgate.yaml's `transport` and `ssl` (each with its node when written) with the masters':
/// what is in force, errors to `c`.
pub(crate) fn combine(
    c: &mut Checker<'_>,
    own_transport: Option<(SaltTransport, &Node)>,
    own_ssl: Option<(Option<SslConfig>, &Node)>,
    m: &Masters,
) -> (SaltTransport, Option<SslConfig>) {
    let at = m.path.display();
    let theirs = m.transport.unwrap_or_default();
    if let Some((own, n)) = own_transport {
        if own != theirs {
            c.err(
                n,
                "transport",
                format!(
                    "saltgate.yaml says `transport: {}`, the masters' configuration ({at}) says `{}`{}",
                    own.as_str(),
                    theirs.as_str(),
                    if m.transport.is_none() { " (Salt's default: it sets none)" } else { "" }
                ),
                "remove transport from saltgate.yaml (discovery.master_config gives it), or make the two agree",
            );
        }
    }
    let ssl = match (own_ssl, &m.ssl) {
        (Some((Some(_), n)), None) => {
            c.err(
                n,
                "ssl",
                format!("the masters' configuration ({at}) has no `ssl`: they do not speak TLS"),
                "remove ssl from saltgate.yaml, or turn ssl on in the masters' configuration",
            );
            None
        }
        (Some((own, _)), _) => own,
        (None, None) => None,
        (None, Some(theirs)) => derive(c, m, theirs),
    };
    (theirs, ssl)
}

/// The client side saltgate can take from the masters' server-side `ssl`, or an error saying
/// what to write.
fn derive(c: &mut Checker<'_>, m: &Masters, theirs: &SslConfig) -> Option<SslConfig> {
    let at = m.path.display();
    let here = m.at.clone();
    let fail = |c: &mut Checker<'_>, message: String, fix: &str| {
        c.errors
            .push(crate::ConfigError::new(here.clone(), FIELD, message, fix));
        None
    };
    let Some(ca) = theirs.ca_certs.clone() else {
        return fail(
            c,
            format!("the masters use `ssl` ({at}) without `ca_certs`: saltgate cannot tell which CA signed their certificates"),
            "write ssl: {ca_certs: CA.pem} in saltgate.yaml (the CA of the masters' certificates)",
        );
    };
    if m.want_client_cert {
        return fail(
            c,
            format!("the masters ask clients for a certificate ({at}: `ssl.cert_reqs` is not CERT_NONE; Salt's default on a server is CERT_REQUIRED), and saltgate has none of its own"),
            "write ssl: {ca_certs: CA.pem, certfile: CLIENT.pem, keyfile: CLIENT.key} in saltgate.yaml, with a client certificate that CA signed",
        );
    }
    Some(SslConfig {
        ca_certs: Some(ca),
        cert_reqs: CertReqs::Required,
        ..SslConfig::default()
    })
}

#[cfg(test)]
#[path = "yaml_master_config_tests.rs"]
mod tests;
