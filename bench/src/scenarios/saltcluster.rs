//! A real salt-master 3008.5 cluster (Salt 3008's `cluster_id`): `n` members on `n` loopback
//! addresses, the same ports on each (Salt's cluster wants one `publish_port`, `ret_port` and
//! `cluster_pool_port` for all), one shared `cluster_pki_dir`, `cachedir`, `file_roots` and
//! `pillar_roots`, as `interop/harness/cluster.py` starts one for the interop suite.
//!
//! Two things 3008.5 gets wrong at a fresh start, handled as the interop suite handles them:
//! - Members started together race on the shared directories ("Failed to create directory path
//!   .../pki/minions - [Errno 17] File exists", and that member exits): they are made first.
//! - They race on the cluster key: a join reply rewrites `cluster.pem`, and a member that starts
//!   in that gap generates a key of its own, keeps it in memory, and its minions then fail with
//!   "Unable to decrypt message". The key pair is made before any member starts, the founder
//!   (the first address) starts first and the others once its ports are open, and a start in
//!   which a member still logged "Generating key-pair" for `cluster.pem` (or "Unable to read
//!   key" for it: a process that read it in the gap, and exited) is thrown away and
//!   tried again from scratch ([`ATTEMPTS`] times).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use super::saltmaster::{master_dir, SaltMaster, Tuning};
use crate::BenchError;

/// Fresh starts tried before giving up on 3008.5's cluster-key race.
pub const ATTEMPTS: usize = 5;

/// The subdirectories of the shared `cluster_pki_dir` and `cachedir` that members started
/// together race to create.
const SHARED_PKI: [&str; 6] = [
    "minions",
    "minions_pre",
    "minions_rejected",
    "minions_denied",
    "minions_autosign",
    "peers",
];
const SHARED_CACHE: [&str; 10] = [
    "jobs", "proc", "pillar", "sessions", "health", "roots", "syndics", "grains", "tokens",
    "cluster",
];

/// The ports every member listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub publish: u16,
    pub ret: u16,
    pub pool: u16,
}

/// A running cluster. Dropping it kills the members (their process groups); [`SaltCluster::stop`]
/// stops them in order.
pub struct SaltCluster {
    pub members: Vec<SaltMaster>,
    pub ports: Ports,
    shared: tempfile::TempDir,
}

/// One member's configuration: Salt's defaults but for paths, ports, `auto_accept`, the
/// open-files limit and the cluster keys. Its `id` is its address: 3008.5 finds a peer's key
/// by the id the peer announces and the address `cluster_peers` names, and a member with another
/// id never becomes ready (`KeyError: '<id>'` in its log).
pub fn member_config(
    dir: &Path,
    shared: &Path,
    ip: IpAddr,
    peers: &[IpAddr],
    ports: Ports,
    secret: &str,
    tuning: &Tuning,
) -> String {
    let (d, sh) = (dir.display(), shared.display());
    let peers: String = peers
        .iter()
        .filter(|p| **p != ip)
        .map(|p| format!("  - {p}\n"))
        .collect();
    format!(
        "id: {ip}\ninterface: {ip}\npublish_port: {}\nret_port: {}\n\
         cluster_id: saltgate_bench\ncluster_peers:\n{peers}cluster_pki_dir: {sh}/pki\n\
         cluster_pool_port: {}\ncluster_secret: \"{secret}\"\n\
         user: root\npki_dir: {d}/pki\ncachedir: {sh}/cache\nsock_dir: {d}/sock\n\
         sqlite_queue_dir: {d}/queues\npidfile: {d}/master.pid\nlog_file: {d}/master.log\n\
         key_logfile: {d}/key.log\nlog_level_logfile: {}\nmax_open_files: 20000\n\
         auto_accept: True\nfile_roots: {{base: [{sh}/srv/salt]}}\n\
         pillar_roots: {{base: [{sh}/srv/pillar]}}\n{}",
        ports.publish, ports.ret, ports.pool, tuning.log_level, tuning.extra
    )
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

fn mkdirs(shared: &Path) -> Result<(), BenchError> {
    let dirs = SHARED_PKI
        .iter()
        .map(|s| shared.join("pki").join(s))
        .chain(SHARED_CACHE.iter().map(|s| shared.join("cache").join(s)))
        .chain([shared.join("srv/salt"), shared.join("srv/pillar")]);
    for d in dirs {
        std::fs::create_dir_all(&d).map_err(|e| BenchError::Io(format!("{}: {e}", d.display())))?;
    }
    Ok(())
}

/// The cluster key pair, made with Salt's own `salt.crypt.gen_keys` before any member starts.
fn cluster_key(venv: &Path, pki: &Path) -> Result<(), BenchError> {
    const CODE: &str = "import os,sys,salt.crypt\n\
        d=sys.argv[1]; priv,pub=salt.crypt.gen_keys(2048)\n\
        for n,data,mode in (('cluster.pem',priv,0o400),('cluster.pub',pub,0o644)):\n\
        \x20   fd=os.open(os.path.join(d,n),os.O_WRONLY|os.O_CREAT|os.O_EXCL,mode)\n\
        \x20   f=os.fdopen(fd,'w'); f.write(data); f.close()\n";
    let out = std::process::Command::new(venv.join("bin/python"))
        .args(["-c", CODE])
        .arg(pki)
        .output()
        .map_err(|e| BenchError::Io(format!("cluster key: {e}")))?;
    if !out.status.success() {
        return Err(BenchError::Io(format!(
            "cluster key (salt.crypt.gen_keys): {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Whether the member's log says it generated a cluster key of its own (the join race).
fn lost_key_race(m: &SaltMaster) -> bool {
    std::fs::read_to_string(m.log_path()).is_ok_and(|t| {
        t.lines().any(|l| {
            (l.contains("Generating key-pair") || l.contains("Unable to read key"))
                && l.contains("cluster.pem")
        })
    })
}

/// The `cluster_secret` new members join with (hex of 32 random bytes).
fn secret() -> Result<String, BenchError> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| BenchError::Io(format!("/dev/urandom: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
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
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            let c = SaltCluster::start_once(venv, ips, tuning).await?;
            let racers: Vec<IpAddr> = c
                .members
                .iter()
                .filter(|m| lost_key_race(m))
                .map(|m| m.ret.ip())
                .collect();
            if racers.is_empty() {
                return Ok(c);
            }
            last = format!("member(s) {racers:?} generated a cluster key of their own");
            eprintln!(
                "saltgate-bench: salt-master cluster, attempt {attempt}: {last} (3008.5's join race); starting again"
            );
            c.stop().await;
        }
        Err(BenchError::Target(format!(
            "the salt-master cluster lost 3008.5's cluster-key race in {ATTEMPTS} fresh starts: {last}"
        )))
    }

    async fn start_once(
        venv: &Path,
        ips: &[IpAddr],
        tuning: &Tuning,
    ) -> Result<SaltCluster, BenchError> {
        let shared = tempfile::Builder::new()
            .prefix("saltgate-bench-cluster.")
            .tempdir()
            .map_err(|e| BenchError::Io(format!("temp dir: {e}")))?;
        mkdirs(shared.path())?;
        cluster_key(venv, &shared.path().join("pki"))?;
        let (ports, secret) = (common_ports(ips)?, secret()?);
        let mut c = SaltCluster {
            members: Vec::new(),
            ports,
            shared,
        };
        for (i, &ip) in ips.iter().enumerate() {
            let dir = master_dir()?;
            let text = member_config(dir.path(), c.shared.path(), ip, ips, ports, &secret, tuning);
            let ret = SocketAddr::new(ip, ports.ret);
            let cache = c.shared.path().join("cache");
            c.members.push(SaltMaster::spawn(
                venv,
                dir,
                ret,
                ports.publish,
                cache,
                &text,
            )?);
            if i == 0 {
                // The founder first: the others join it once its ports are open.
                wait_ports(ip, &[ports.ret, ports.pool], Duration::from_secs(90)).await?;
            }
        }
        for m in &mut c.members {
            m.wait_ready(Duration::from_secs(120)).await?;
        }
        Ok(c)
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

async fn wait_ports(ip: IpAddr, ports: &[u16], within: Duration) -> Result<(), BenchError> {
    let deadline = Instant::now() + within;
    loop {
        let mut open = true;
        for &p in ports {
            open &= tokio::net::TcpStream::connect((ip, p)).await.is_ok();
        }
        if open {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Target(format!(
                "salt-master {ip} did not open ports {ports:?} within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_config_names_its_peers_and_the_shared_dirs() {
        let ips: Vec<IpAddr> = ["127.0.3.2", "127.0.3.3", "127.0.3.4"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let ports = Ports {
            publish: 4505,
            ret: 4506,
            pool: 4520,
        };
        let t = member_config(
            Path::new("/m2"),
            Path::new("/sh"),
            ips[1],
            &ips,
            ports,
            "s3cr3t",
            &Tuning::default(),
        );
        assert!(
            t.contains("cluster_peers:\n  - 127.0.3.2\n  - 127.0.3.4\ncluster_pki_dir: /sh/pki\n"),
            "{t}"
        );
        assert!(t.contains("id: 127.0.3.3\ninterface: 127.0.3.3\n"), "{t}");
        assert!(t.contains("cachedir: /sh/cache\n") && t.contains("pki_dir: /m2/pki\n"));
        assert!(t.contains("cluster_pool_port: 4520\n") && t.contains("ret_port: 4506\n"));
        assert!(t.contains("cluster_secret: \"s3cr3t\"\n"));
        // Every key once: Salt's YAML loader refuses a key written twice.
        let keys: Vec<&str> = t
            .lines()
            .filter(|l| !l.starts_with(' '))
            .filter_map(|l| l.split(':').next())
            .collect();
        let mut uniq = keys.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(keys.len(), uniq.len(), "{t}");
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
