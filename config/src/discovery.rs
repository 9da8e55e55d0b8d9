//! Masters discovered in a Salt 3008 cluster's `cluster_pki_dir`: each `peers/<id>.pub` is a
//! peer master, and Salt uses the peer id as the peer's address. Pure: the proxy lists the
//! directory and puts [`merge`]'s configuration in force as a reload.

use std::net::IpAddr;

use crate::model::{defaults, Config, Discovery, MasterConfig};
use crate::yaml::valid_master_name;

/// A `peers/` entry that gives no master, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The file name, as found in `peers/`.
    pub file: String,
    pub problem: String,
    pub fix: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peers/{}: {}; {}", self.file, self.problem, self.fix)
    }
}

/// The peer id of a file in `peers/`: `<id>.pub`. Other files (temporary files, hidden files)
/// are not peers: `None`.
pub fn peer_id(file: &str) -> Option<&str> {
    let id = file.strip_suffix(".pub")?;
    (!id.is_empty() && !id.starts_with('.')).then_some(id)
}

/// A DNS host name (RFC 1123 labels): what Salt can connect to when it uses a peer id as a host.
fn is_host_name(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// The master name of a peer id: the id itself when it is a valid name, else the id with every
/// other character replaced by `-` (an IPv6 address: `fd00--5`).
pub fn master_name(id: &str) -> String {
    if valid_master_name(id) {
        return id.to_string();
    }
    let n: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    n
}

impl Discovery {
    /// The master for the peer file `file` (`<id>.pub`), or why there is none.
    pub fn master_for(&self, file: &str, base: &Config) -> Result<MasterConfig, Skipped> {
        let skip = |problem: String, fix: String| Skipped {
            file: file.to_string(),
            problem,
            fix,
        };
        let id = peer_id(file).ok_or_else(|| {
            skip(
                "not a peer key file (<id>.pub)".into(),
                "ignore it or remove it".into(),
            )
        })?;
        let host = match self.peers.iter().find(|(i, _)| i == id) {
            Some((_, h)) => h.clone(),
            None if id.parse::<IpAddr>().is_ok() || is_host_name(id) => id.to_string(),
            None => {
                return Err(skip(
                    format!("the peer id {id:?} is not an IP address or host name, and discovery.peers does not map it"),
                    format!("add it to saltgate's configuration under discovery.peers (\"{id}\": ADDRESS), or give that Salt master an id that is its address (Salt 3008 connects to peers by id)"),
                ))
            }
        };
        Ok(MasterConfig {
            name: master_name(id),
            host,
            publish_port: self.publish_port,
            request_port: self.request_port,
            weight: defaults::WEIGHT,
            maxconn: None,
            backup: false,
            disabled: false,
            check: true,
            health: base.health,
        })
    }
}

/// The configuration to put in force: `file` (the configuration file) plus a master per peer
/// file in `files` (the names found in `peers/`, any order), in id order after the file's
/// masters. A peer that the file already has (same name, or same host and request port) is not
/// added again. Returns the configuration, the names of the discovered masters, and the files
/// that give no master.
pub fn merge(file: &Config, files: &[String]) -> (Config, Vec<String>, Vec<Skipped>) {
    let mut out = file.clone();
    let (mut added, mut skipped) = (Vec::new(), Vec::new());
    let Some(d) = &file.discovery else {
        return (out, added, skipped);
    };
    let mut files: Vec<&String> = files.iter().filter(|f| peer_id(f).is_some()).collect();
    files.sort();
    files.dedup();
    for f in files {
        let m = match d.master_for(f, file) {
            Ok(m) => m,
            Err(s) => {
                skipped.push(s);
                continue;
            }
        };
        let same_endpoint = |x: &MasterConfig| x.host == m.host && x.request_port == m.request_port;
        if file.masters.iter().any(same_endpoint) {
            continue; // configured in the file: not duplicated
        }
        if let Some(x) = out.masters.iter().find(|x| x.name == m.name) {
            skipped.push(Skipped {
                file: f.clone(),
                problem: format!(
                    "master name {:?} is taken by a master with host {} in the configuration",
                    m.name, x.host
                ),
                fix: "rename that master, or map this peer id to its address under discovery.peers"
                    .into(),
            });
            continue;
        }
        added.push(m.name.clone());
        out.masters.push(m);
    }
    (out, added, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Config {
        let mut c = crate::yaml::parse_yaml(
            "masters:\n  - name: a\n    host: 10.0.0.1\nlisteners:\n  publish: {bind: 127.0.0.1:4505}\n  request: {bind: 127.0.0.1:4506}\n",
            None,
        )
        .unwrap();
        c.discovery = Some(Discovery {
            cluster_pki_dir: "/nonexistent".into(),
            interval: defaults::DISCOVERY_INTERVAL,
            publish_port: 14505,
            request_port: 14506,
            peers: vec![("saltmaster_b".into(), "10.0.0.9".into())],
        });
        c
    }

    fn names(files: &[&str]) -> (Vec<String>, Vec<String>, Vec<Skipped>) {
        let files: Vec<String> = files.iter().map(|s| s.to_string()).collect();
        let (c, added, skipped) = merge(&base(), &files);
        (
            c.masters
                .iter()
                .map(|m| format!("{}={}:{}", m.name, m.host, m.request_port))
                .collect(),
            added,
            skipped,
        )
    }

    #[test]
    fn a_peer_file_is_a_master_with_the_discovery_ports_after_the_files_masters() {
        let (all, added, skipped) =
            names(&["10.0.0.3.pub", "10.0.0.2.pub", ".tmp.pub", "x.pub.tmp"]);
        assert_eq!(
            all,
            [
                "a=10.0.0.1:4506",
                "10.0.0.2=10.0.0.2:14506",
                "10.0.0.3=10.0.0.3:14506"
            ]
        );
        assert_eq!(added, ["10.0.0.2", "10.0.0.3"]);
        assert!(skipped.is_empty());
    }

    #[test]
    fn mapped_ids_host_names_and_ipv6_ids_are_masters() {
        let (all, _, skipped) =
            names(&["saltmaster_b.pub", "salt-c.example.com.pub", "fd00::5.pub"]);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(
            all[1..],
            [
                "fd00--5=fd00::5:14506",
                "salt-c.example.com=salt-c.example.com:14506",
                "saltmaster_b=10.0.0.9:14506"
            ]
        );
    }

    #[test]
    fn an_id_that_is_no_address_is_skipped_with_the_file_and_the_fix() {
        let (all, added, skipped) = names(&["peer one.pub", "10.0.0.2.pub"]);
        assert_eq!(all.len(), 2);
        assert_eq!(added, ["10.0.0.2"]);
        let s = skipped[0].to_string();
        assert!(
            s.contains("peers/peer one.pub") && s.contains("discovery.peers"),
            "{s}"
        );
    }

    #[test]
    fn a_peer_in_the_configuration_file_is_not_duplicated() {
        let mut c = base();
        c.masters[0].request_port = 14506;
        let (out, added, skipped) = merge(&c, &["10.0.0.1.pub".into()]);
        assert_eq!(out.masters.len(), 1);
        assert!(added.is_empty() && skipped.is_empty());
        c.masters[0].name = "10.0.0.2".into();
        let (out, _, skipped) = merge(&c, &["10.0.0.2.pub".into()]);
        assert_eq!(out.masters.len(), 1);
        assert!(skipped[0].problem.contains("taken"), "{skipped:?}");
    }
}
