//! `discovery.master_config` against masters' files written here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::transport::{CertReqs, SaltTransport, SslConfig};
use crate::yaml::parse_yaml;

/// A directory of its own under the system's temporary directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "saltgate-master-config-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(p.join("master.d")).unwrap();
        Dir(p)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(master: &Path, extra: &str) -> String {
    format!(
        "listeners:\n  request:\n    bind: 127.0.0.1:4506\n  publish:\n    bind: 127.0.0.1:4505\n\
         discovery:\n  cluster_pki_dir: /etc/salt/pki/master\n  master_config: {}\n{extra}",
        master.display()
    )
}

fn errors(text: &str) -> Vec<(String, String, String, Option<PathBuf>)> {
    parse_yaml(text, Some(Path::new("/etc/saltgate/saltgate.yaml")))
        .unwrap_err()
        .0
        .into_iter()
        .map(|e| (e.field, e.message, e.fix, e.at.file))
        .collect()
}

#[test]
fn the_masters_transport_and_ca_are_taken_from_their_file_and_its_master_d() {
    let d = Dir::new();
    let m = d.write(
        "master",
        "interface: 0.0.0.0\ntransport: zeromq\nworker_threads: 5\nfile_roots: {base: [/srv/salt]}\n",
    );
    // master.d overrides the file, in name order.
    d.write("master.d/10-transport.conf", "transport: tcp\n");
    d.write(
        "master.d/20-tls.conf",
        "ssl:\n  certfile: /etc/salt/tls/server.pem\n  keyfile: /etc/salt/tls/server.key\n  ca_certs: /etc/salt/tls/ca.pem\n  cert_reqs: CERT_NONE\n",
    );
    d.write("master.d/README", "transport: ws\n"); // not a .conf: not read
    let c = parse_yaml(&config(&m, ""), None).unwrap();
    assert_eq!(c.global.transport, SaltTransport::Tcp);
    assert_eq!(
        c.global.ssl,
        Some(SslConfig {
            ca_certs: Some("/etc/salt/tls/ca.pem".into()),
            cert_reqs: CertReqs::Required,
            ..SslConfig::default()
        })
    );
}

#[test]
fn a_master_file_without_transport_is_salts_default_and_must_agree_with_saltgates() {
    let d = Dir::new();
    let m = d.write("master", "interface: 0.0.0.0\n");
    let c = parse_yaml(&config(&m, ""), None).unwrap();
    assert_eq!(c.global.transport, SaltTransport::Zeromq);
    assert_eq!(c.global.ssl, None);
    // Written in both places and agreeing: fine; disagreeing: refused at saltgate's key.
    let m = d.write("master", "transport: tcp\n");
    parse_yaml(&config(&m, "transport: tcp\n"), None).unwrap();
    let e = errors(&config(&m, "transport: ws\n"));
    assert!(
        e.iter().any(|e| e.0 == "transport"
            && e.1.contains("`transport: ws`")
            && e.1.contains("says `tcp`")
            && e.2.contains("discovery.master_config")),
        "{e:?}"
    );
}

#[test]
fn what_saltgate_cannot_take_from_the_masters_ssl_says_what_to_write() {
    let d = Dir::new();
    // Salt's server default asks clients for a certificate.
    let m = d.write(
        "master",
        "transport: tcp\nssl:\n  certfile: /s.pem\n  keyfile: /s.key\n  ca_certs: /ca.pem\n",
    );
    let e = errors(&config(&m, ""));
    assert!(
        e.iter().any(|e| e.0 == "discovery.master_config"
            && e.1.contains("client")
            && e.2.contains("certfile")),
        "{e:?}"
    );
    // saltgate's own ssl (a client certificate) settles it.
    let c = parse_yaml(
        &config(
            &m,
            "ssl:\n  ca_certs: /ca.pem\n  certfile: /c.pem\n  keyfile: /c.key\n",
        ),
        None,
    )
    .unwrap();
    assert_eq!(c.global.ssl.unwrap().certfile, Some("/c.pem".into()));
    // No CA in theirs.
    let m = d.write(
        "master",
        "transport: tcp\nssl: {certfile: /s.pem, cert_reqs: CERT_NONE}\n",
    );
    let e = errors(&config(&m, ""));
    assert!(e.iter().any(|e| e.2.contains("ca_certs")), "{e:?}");
    // saltgate's ssl for masters without TLS.
    let m = d.write("master", "transport: tcp\n");
    let e = errors(&config(&m, "ssl: {ca_certs: /ca.pem}\n"));
    assert!(
        e.iter()
            .any(|e| e.0 == "ssl" && e.1.contains("do not speak TLS")),
        "{e:?}"
    );
}

#[test]
fn errors_in_the_masters_file_name_that_file_and_a_missing_one_the_key() {
    let d = Dir::new();
    let m = d.write("master", "interface: 0.0.0.0\ntransport: zmq\n");
    let e = errors(&config(&m, ""));
    let bad = e.iter().find(|e| e.0 == "transport").expect("{e:?}");
    assert_eq!(bad.3.as_deref(), Some(m.as_path()), "{e:?}");
    assert!(bad.1.contains("\"zmq\""), "{e:?}");
    let e = errors(&config(&d.0.join("nope"), ""));
    assert!(
        e.iter()
            .any(|e| e.0 == "discovery.master_config" && e.1.contains("nope")),
        "{e:?}"
    );
    let m = d.write("master", "transport: [tcp\n");
    let e = errors(&config(&m, ""));
    assert!(
        e.iter()
            .any(|e| e.0 == "discovery.master_config" && e.1.contains("not YAML")),
        "{e:?}"
    );
}

#[test]
fn a_relative_path_is_read_beside_saltgates_file() {
    let d = Dir::new();
    d.write("master", "transport: tcp\n");
    let text = config(Path::new("master"), "");
    let c = parse_yaml(&text, Some(&d.0.join("saltgate.yaml"))).unwrap();
    assert_eq!(c.global.transport, SaltTransport::Tcp);
}
