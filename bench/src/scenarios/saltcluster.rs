//! A real salt-master 3008.5 cluster (Salt 3008's `cluster_id`): `n` members on `n` loopback
//! addresses, the same ports on each (Salt's cluster wants one `publish_port`, `ret_port` and
//! `cluster_pool_port` for all), one shared `cluster_pki_dir`, `cachedir`, `file_roots` and
//! `pillar_roots`, started by test-support's `salt_cluster` (the steps `interop/harness/cluster.py`
//! takes, 3008.5's start-up races handled there): the founder first, then the others, a start
//! that lost the cluster-key race thrown away and tried again ([`ATTEMPTS`] times). Here: the
//! ports, the bench's configuration ([`spec`]), and the members as [`SaltMaster`]s, each ready
//! once it answers a clear `ping`.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use saltgate_test_support::salt_cluster::{self, Launch, Member, Spec};

use super::saltmaster::{master_dir, SaltMaster, Tuning};
use crate::BenchError;

pub use saltgate_test_support::salt_cluster::Ports;

/// Fresh starts tried before giving up on 3008.5's cluster-key race.
pub const ATTEMPTS: usize = 5;

/// A running cluster. Dropping it kills the members (their process groups); [`SaltCluster::stop`]
/// stops them in order.
pub struct SaltCluster {
    pub members: Vec<SaltMaster>,
    pub ports: Ports,
    shared: tempfile::TempDir,
}

impl From<salt_cluster::Error> for BenchError {
    fn from(e: salt_cluster::Error) -> Self {
        match e {
            salt_cluster::Error::Setup(s) => BenchError::Io(s),
            salt_cluster::Error::Start(s) => BenchError::Target(s),
        }
    }
}

/// The cluster's [`Spec`]: Salt's defaults but for paths, ports, `auto_accept`, the open-files
/// limit, the cluster keys and `tuning` (its log level, its extra lines).
pub fn spec(ips: &[IpAddr], ports: Ports, shared: &Path, tuning: &Tuning) -> Spec {
    Spec {
        log_level: tuning.log_level.into(),
        extra: format!("max_open_files: 20000\n{}", tuning.extra),
        attempts: ATTEMPTS,
        ..Spec::new("saltgate_bench", ips.to_vec(), ports, shared.to_path_buf())
    }
}

/// Ports free on every one of `ips` (bound on the first, checked on the others).
fn common_ports(ips: &[IpAddr]) -> Result<Ports, BenchError> {
    let free_on_all = |p: u16| {
        ips.iter()
            .all(|ip| std::net::TcpListener::bind((*ip, p)).is_ok())
    };
    let mut got = Vec::new();
    for _ in 0..50 {
        let l = std::net::TcpListener::bind((ips[0], 0))
            .map_err(|e| BenchError::Io(format!("bind {}:0: {e}", ips[0])))?;
        let p = l
            .local_addr()
            .map_err(|e| BenchError::Io(e.to_string()))?
            .port();
        drop(l);
        if free_on_all(p) && !got.contains(&p) {
            got.push(p);
        }
        if got.len() == 3 {
            return Ok(Ports {
                publish: got[0],
                ret: got[1],
                pool: got[2],
            });
        }
    }
    Err(BenchError::Io(format!(
        "no three ports free on every one of {ips:?}"
    )))
}

/// The members as [`SaltMaster`]s: each in a fresh directory of its own, ready once it answers
/// a clear `ping` (a member answers none until it is cluster-ready), stopped in order.
struct Masters<'a> {
    venv: &'a Path,
    cachedir: std::path::PathBuf,
}

impl Launch for Masters<'_> {
    type Member = SaltMaster;
    type Error = BenchError;

    fn spawn(&mut self, m: &Member<'_>) -> Result<SaltMaster, BenchError> {
        let dir = master_dir()?;
        let text = m.config(dir.path());
        let ports = m.ports();
        let ret = SocketAddr::new(m.ip, ports.ret);
        SaltMaster::spawn(
            self.venv,
            dir,
            ret,
            ports.publish,
            self.cachedir.clone(),
            &text,
        )
    }

    fn log_file(&self, m: &SaltMaster) -> std::path::PathBuf {
        m.log_path()
    }

    async fn wait_ready(&mut self, _: &Spec, members: &mut [SaltMaster]) -> Result<(), BenchError> {
        for m in members {
            m.wait_ready(Duration::from_secs(120)).await?;
        }
        Ok(())
    }

    async fn stop(&mut self, members: Vec<SaltMaster>) {
        for m in members {
            m.stop().await;
        }
    }
}

impl SaltCluster {
    /// Starts a cluster of one member per address of `ips` (at least two) and waits until every
    /// member answers a clear `ping` (cluster-ready), trying [`ATTEMPTS`] fresh starts.
    pub async fn start(
        venv: &Path,
        ips: &[IpAddr],
        tuning: &Tuning,
    ) -> Result<SaltCluster, BenchError> {
        if ips.len() < 2 {
            return Err(BenchError::Usage(
                "a salt-master cluster needs at least two members".into(),
            ));
        }
        let shared = tempfile::Builder::new()
            .prefix("saltgate-bench-cluster.")
            .tempdir()
            .map_err(|e| BenchError::Io(format!("temp dir: {e}")))?;
        let ports = common_ports(ips)?;
        let spec = spec(ips, ports, shared.path(), tuning);
        let mut masters = Masters {
            venv,
            cachedir: spec.cachedir(),
        };
        let members = salt_cluster::start(venv, &spec, &mut masters).await?;
        Ok(SaltCluster {
            members,
            ports,
            shared,
        })
    }

    /// Every member's process id (the roots of their process trees).
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(SaltMaster::pid).collect()
    }

    /// The shared `cachedir`.
    pub fn cachedir(&self) -> std::path::PathBuf {
        self.shared.path().join("cache")
    }

    pub async fn stop(self) {
        for m in self.members {
            m.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_config_names_its_peers_the_shared_dirs_and_the_tuning() {
        let ips: Vec<IpAddr> = ["127.0.3.2", "127.0.3.3", "127.0.3.4"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let ports = Ports {
            publish: 4505,
            ret: 4506,
            pool: 4520,
        };
        let tuning = Tuning {
            log_level: "info",
            extra: "loop_interval: 1\n".into(),
        };
        let s = spec(&ips, ports, Path::new("/sh"), &tuning);
        assert_eq!(s.attempts, ATTEMPTS);
        let t = s.config(ips[1], Path::new("/m2"), "s3cr3t");
        assert!(
            t.contains("cluster_peers:\n  - 127.0.3.2\n  - 127.0.3.4\ncluster_pki_dir: /sh/pki\n"),
            "{t}"
        );
        assert!(t.contains("id: 127.0.3.3\ninterface: 127.0.3.3\n"), "{t}");
        assert!(t.contains("cachedir: /sh/cache\n") && t.contains("pki_dir: /m2/pki\n"));
        assert!(t.contains("cluster_pool_port: 4520\n") && t.contains("ret_port: 4506\n"));
        assert!(t.contains("cluster_secret: \"s3cr3t\"\n"));
        assert!(t.contains("cluster_id: saltgate_bench\n"), "{t}");
        assert!(t.contains("log_level_logfile: info\n"), "{t}");
        assert!(
            t.contains("max_open_files: 20000\nloop_interval: 1\n"),
            "{t}"
        );
        // Every key once: Salt's YAML loader refuses a key written twice.
        assert!(salt_cluster::keys_once(&t), "{t}");
    }

    #[test]
    fn the_ports_are_free_on_every_member() {
        let ips: Vec<IpAddr> = ["127.0.3.2", "127.0.3.3"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let p = common_ports(&ips).unwrap();
        assert!(p.publish != p.ret && p.ret != p.pool && p.publish != p.pool);
        for ip in &ips {
            std::net::TcpListener::bind((*ip, p.ret)).unwrap();
        }
    }
}
