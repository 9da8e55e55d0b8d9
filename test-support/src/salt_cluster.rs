//! A real salt-master 3008.5 cluster (Salt 3008's `cluster_id`), started as
//! `interop/harness/cluster.py` starts one: the one copy of those steps for the bench's authstorm
//! cluster (`bench/src/scenarios/saltcluster.rs`), the keepalived pair's real-Salt masters in
//! network namespaces (`bench/tests/ha_keepalived/salt.rs`) and the proxy's request-continuity lab.
//! What differs between them is a parameter: the addresses, ports, transport, `worker_threads`,
//! extra configuration lines ([`Spec`]), and how a member's process is started, when it counts as
//! ready and how it is stopped ([`Launch`]; [`Procs`] starts the venv's `salt-master` plainly or
//! inside a network namespace).
//!
//! Two things 3008.5 gets wrong at a fresh start, handled here:
//! - Members started together race on the shared directories ("Failed to create directory path
//!   .../pki/minions - [Errno 17] File exists", and that member exits): they are made first
//!   ([`SHARED_DIRS`]).
//! - They race on the cluster key: a join reply rewrites `cluster.pem`, and a member that starts
//!   in that gap generates a key of its own, keeps it in memory, and its minions then fail with
//!   "Unable to decrypt message" (or a process that reads it in the gap logs "Unable to read
//!   key" and exits). The key pair is made with the venv's `salt.crypt.gen_keys` before any
//!   member starts, the founder (the first address) starts first and the others once its
//!   `ret_port` and `cluster_pool_port` are open, and a start in which a member's log still shows
//!   either line for `cluster.pem` is stopped, wiped and tried again from scratch
//!   ([`Spec::attempts`] times).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ProcGuard;

/// The subdirectories of the shared directory (`cluster_pki_dir` = `pki`, `cachedir` = `cache`,
/// `file_roots` and `pillar_roots` under `srv`) that members started together race to create.
pub const SHARED_DIRS: [&str; 18] = [
    "pki/minions",
    "pki/minions_pre",
    "pki/minions_rejected",
    "pki/minions_denied",
    "pki/minions_autosign",
    "pki/peers",
    "cache/jobs",
    "cache/proc",
    "cache/pillar",
    "cache/sessions",
    "cache/health",
    "cache/roots",
    "cache/syndics",
    "cache/grains",
    "cache/tokens",
    "cache/cluster",
    "srv/salt",
    "srv/pillar",
];

/// The log line of a member that is cluster-ready (Salt's `MasterPubServerChannel`, at `info`).
pub const READY_LINE: &str = "opening request gate";

/// Why a cluster did not start.
#[derive(Debug)]
pub enum Error {
    /// The shared directories, the secret, the cluster key or a member's files could not be made.
    Setup(String),
    /// A member did not come up in time, or every attempt lost 3008.5's cluster-key race.
    Start(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Setup(s) | Error::Start(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Error {}

/// The ports every member listens on (Salt's cluster wants the same ones on every member).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub publish: u16,
    pub ret: u16,
    pub pool: u16,
}

/// The cluster: what every member's configuration shares, and how long its start may take.
#[derive(Debug, Clone)]
pub struct Spec {
    pub cluster_id: String,
    /// One member per address, the founder first. A member's `id` is its address: 3008.5 finds a
    /// peer's key by the id the peer announces and the address `cluster_peers` names, and a
    /// member with another id never becomes ready (`KeyError: '<id>'` in its log).
    pub ips: Vec<IpAddr>,
    pub ports: Ports,
    /// The shared directory: `cluster_pki_dir` is `pki` in it, `cachedir` `cache`, the file and
    /// pillar roots `srv/salt` and `srv/pillar`. Wiped at every attempt.
    pub shared: PathBuf,
    /// `log_level_logfile`; the default `info` logs [`READY_LINE`] and "Generating key-pair",
    /// which the start reads.
    pub log_level: String,
    /// `transport` (Salt's default, `zeromq`, when `None`).
    pub transport: Option<String>,
    /// `worker_threads` (Salt's default, 5, when `None`).
    pub worker_threads: Option<u32>,
    /// `grains_cache: True`.
    pub grains_cache: bool,
    /// More top-level keys, one `key: value` line each (none may repeat a key written here:
    /// Salt's YAML loader refuses a key written twice).
    pub extra: String,
    /// Fresh starts tried before giving up on the cluster-key race.
    pub attempts: usize,
    /// How long the founder may take to open its ports.
    pub founder_within: Duration,
    /// How long the members may take to become cluster-ready.
    pub ready_within: Duration,
}

impl Spec {
    /// A cluster of `ips` on `ports` sharing `shared`, with Salt's defaults for everything else
    /// but `log_level_logfile: info`; three attempts, 90 s for the founder's ports, 120 s for
    /// the members to become ready.
    pub fn new(cluster_id: &str, ips: Vec<IpAddr>, ports: Ports, shared: PathBuf) -> Spec {
        Spec {
            cluster_id: cluster_id.to_owned(),
            ips,
            ports,
            shared,
            log_level: "info".into(),
            transport: None,
            worker_threads: None,
            grains_cache: false,
            extra: String::new(),
            attempts: 3,
            founder_within: Duration::from_secs(90),
            ready_within: Duration::from_secs(120),
        }
    }

    /// The shared `cluster_pki_dir` (its `.aes` is the key every member encrypts publishes with).
    pub fn cluster_pki_dir(&self) -> PathBuf {
        self.shared.join("pki")
    }

    /// The shared `cachedir`.
    pub fn cachedir(&self) -> PathBuf {
        self.shared.join("cache")
    }

    /// Member `ip`'s configuration, its own files (keys, sockets, logs) under `dir`, with the
    /// cluster secret `secret`: the other members as `cluster_peers`, the shared directories,
    /// `auto_accept`, and the autosign files in its own `conf` (not the host's `/etc/salt`).
    pub fn config(&self, ip: IpAddr, dir: &Path, secret: &str) -> String {
        let (d, sh) = (dir.display(), self.shared.display());
        let peers: String = self
            .ips
            .iter()
            .filter(|p| **p != ip)
            .map(|p| format!("  - {p}\n"))
            .collect();
        let transport = self
            .transport
            .as_ref()
            .map(|t| format!("transport: {t}\n"))
            .unwrap_or_default();
        let workers = self
            .worker_threads
            .map(|n| format!("worker_threads: {n}\n"))
            .unwrap_or_default();
        let grains = if self.grains_cache {
            "grains_cache: True\n"
        } else {
            ""
        };
        let (id, p, level, extra) = (&self.cluster_id, self.ports, &self.log_level, &self.extra);
        format!(
            "# salt cluster {id}: member {ip} (written by test-support/src/salt_cluster.rs)\n\
             id: {ip}\ninterface: {ip}\npublish_port: {}\nret_port: {}\nuser: root\n{transport}\
             cluster_id: {id}\ncluster_peers:\n{peers}cluster_pki_dir: {sh}/pki\n\
             cluster_pool_port: {}\ncluster_secret: \"{secret}\"\ncachedir: {sh}/cache\n\
             pki_dir: {d}/pki\nsock_dir: {d}/sock\nsqlite_queue_dir: {d}/queues\n\
             pidfile: {d}/master.pid\nlog_file: {d}/master.log\nkey_logfile: {d}/key.log\n\
             log_level_logfile: {level}\nautosign_file: {d}/conf/autosign.conf\n\
             autoreject_file: {d}/conf/autoreject.conf\n\
             autosign_grains_dir: {d}/conf/autosign_grains\nauto_accept: True\n{workers}{grains}\
             file_roots: {{base: [{sh}/srv/salt]}}\npillar_roots: {{base: [{sh}/srv/pillar]}}\n\
             {extra}",
            p.publish, p.ret, p.pool
        )
    }
}

/// One member about to start: its index (0 is the founder), its address, and its configuration.
pub struct Member<'a> {
    pub index: usize,
    pub ip: IpAddr,
    spec: &'a Spec,
    secret: &'a str,
}

impl Member<'_> {
    /// The ports every member listens on.
    pub fn ports(&self) -> Ports {
        self.spec.ports
    }

    /// Its configuration with its own files under `dir` ([`Spec::config`]).
    pub fn config(&self, dir: &Path) -> String {
        self.spec.config(self.ip, dir, self.secret)
    }

    /// Writes [`Member::config`] as `dir/conf/master` (making `dir`'s `conf`, `pki`, `sock` and
    /// `queues`) and returns the configuration directory, `dir/conf`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, Error> {
        for sub in ["conf", "pki", "sock", "queues"] {
            let s = dir.join(sub);
            std::fs::create_dir_all(&s)
                .map_err(|e| Error::Setup(format!("{}: {e}", s.display())))?;
        }
        let conf = dir.join("conf");
        std::fs::write(conf.join("master"), self.config(dir))
            .map_err(|e| Error::Setup(format!("{}/master: {e}", conf.display())))?;
        Ok(conf)
    }
}

/// The log file of a member whose files are under `dir` (its `log_file`).
pub fn log_file(dir: &Path) -> PathBuf {
    dir.join("master.log")
}

/// How a caller runs its members. `async fn` in a public trait: every implementation is used
/// with its concrete type, so the futures' `Send` is known where it matters.
#[allow(async_fn_in_trait)]
pub trait Launch {
    /// A started member (its process; dropping it must stop that process).
    type Member;
    type Error: From<Error> + std::fmt::Display;

    /// Starts `m` (writing its configuration where it keeps its files), not waiting for it.
    fn spawn(&mut self, m: &Member<'_>) -> Result<Self::Member, Self::Error>;

    /// Its `log_file`, where the start reads the join race.
    fn log_file(&self, m: &Self::Member) -> PathBuf;

    /// Whether every one of `ports` is open on `ip` (by default: a TCP connection from here).
    async fn listening(&self, ip: IpAddr, ports: &[u16]) -> bool {
        for &p in ports {
            if tokio::net::TcpStream::connect((ip, p)).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Waits until every member is cluster-ready (by default: [`READY_LINE`] in its log, within
    /// [`Spec::ready_within`]).
    async fn wait_ready(
        &mut self,
        spec: &Spec,
        members: &mut [Self::Member],
    ) -> Result<(), Self::Error> {
        let logs: Vec<PathBuf> = members.iter().map(|m| self.log_file(m)).collect();
        let ready = |l: &PathBuf| read(l).contains(READY_LINE);
        let ok = poll(spec.ready_within, || logs.iter().all(ready)).await;
        if ok {
            return Ok(());
        }
        let late: Vec<String> = logs
            .iter()
            .filter(|l| !ready(l))
            .map(|l| format!("{}: {}", l.display(), tail(l)))
            .collect();
        Err(Error::Start(format!(
            "salt-master(s) not cluster-ready (no \"{READY_LINE}\" in their log) within {:?}: {}",
            spec.ready_within,
            late.join("; ")
        ))
        .into())
    }

    /// Stops `members` and removes their own files (by default: drops them).
    async fn stop(&mut self, members: Vec<Self::Member>) {
        drop(members);
    }
}

/// Starts the cluster of `spec` with `launch` and waits until every member is ready, trying
/// [`Spec::attempts`] fresh starts: at each, the shared directory is wiped and made again with
/// its subdirectories ([`SHARED_DIRS`]), a new `cluster_secret` and a new cluster key pair
/// (`venv`'s `salt.crypt.gen_keys`), the founder starts, the others once its ports are open;
/// a start in which a member's log shows the join race ([`lost_key_race`]) is stopped and
/// thrown away. The members in `spec.ips`' order.
pub async fn start<L: Launch>(
    venv: &Path,
    spec: &Spec,
    launch: &mut L,
) -> Result<Vec<L::Member>, L::Error> {
    if spec.ips.is_empty() {
        return Err(Error::Setup("a salt-master cluster needs at least one member".into()).into());
    }
    let mut last = String::new();
    for attempt in 1..=spec.attempts {
        prepare_shared(venv, &spec.shared)?;
        let secret = new_secret()?;
        let mut members = Vec::new();
        for (index, &ip) in spec.ips.iter().enumerate() {
            if index == 1 {
                // The founder first: the others join it once its ports are open.
                let (founder, ports) = (spec.ips[0], [spec.ports.ret, spec.ports.pool]);
                let (launch, ports) = (&*launch, &ports);
                if !poll_async(spec.founder_within, move || {
                    launch.listening(founder, ports)
                })
                .await
                {
                    return Err(Error::Start(format!(
                        "salt-master {founder} did not open ports {ports:?} within {:?}: {}",
                        spec.founder_within,
                        tail(&launch.log_file(&members[0]))
                    ))
                    .into());
                }
            }
            let m = Member {
                index,
                ip,
                spec,
                secret: &secret,
            };
            members.push(launch.spawn(&m)?);
        }
        // A member that never gets ready (a start under a loaded machine: "Publish server did not
        // start within 60 seconds"; a join-race loser that exits) is a failed attempt too.
        if let Err(e) = launch.wait_ready(spec, &mut members).await {
            if attempt == spec.attempts {
                return Err(e);
            }
            last = e.to_string();
            eprintln!(
                "salt cluster {}, attempt {attempt}: not ready ({last}); starting again",
                spec.cluster_id
            );
            launch.stop(members).await;
            continue;
        }
        let racers: Vec<IpAddr> = spec
            .ips
            .iter()
            .zip(&members)
            .filter(|(_, m)| lost_key_race(&launch.log_file(m)))
            .map(|(ip, _)| *ip)
            .collect();
        if racers.is_empty() {
            return Ok(members);
        }
        last = format!(
            "member(s) {racers:?} generated a cluster key of their own or could not read it"
        );
        eprintln!(
            "salt cluster {}, attempt {attempt}: {last} (3008.5's join race); starting again",
            spec.cluster_id
        );
        launch.stop(members).await;
    }
    Err(Error::Start(format!(
        "the salt-master cluster did not start in {} fresh starts (3008.5's cluster-key race, or a member never ready); the last: {last}",
        spec.attempts
    ))
    .into())
}

/// Wipes `shared` and makes it again: [`SHARED_DIRS`] and the cluster key pair in its `pki`.
pub fn prepare_shared(venv: &Path, shared: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(shared) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::Setup(format!("wiping {}: {e}", shared.display())));
        }
        _ => {}
    }
    for sub in SHARED_DIRS {
        let d = shared.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| Error::Setup(format!("{}: {e}", d.display())))?;
    }
    cluster_key(venv, &shared.join("pki"))
}

/// The cluster key pair (`cluster.pem`, `cluster.pub`) in `pki`, made with Salt's own
/// `salt.crypt.gen_keys` (the venv's Python).
pub fn cluster_key(venv: &Path, pki: &Path) -> Result<(), Error> {
    const CODE: &str = "import os,sys,salt.crypt\n\
        d=sys.argv[1]; priv,pub=salt.crypt.gen_keys(2048)\n\
        for n,data,mode in (('cluster.pem',priv,0o400),('cluster.pub',pub,0o644)):\n\
        \x20   fd=os.open(os.path.join(d,n),os.O_WRONLY|os.O_CREAT|os.O_EXCL,mode)\n\
        \x20   f=os.fdopen(fd,'w'); f.write(data); f.close()\n";
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", CODE])
        .arg(pki)
        .output()
        .map_err(|e| Error::Setup(format!("cluster key: {}/bin/python: {e}", venv.display())))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "cluster key (salt.crypt.gen_keys): {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// A `cluster_secret` (hex of 32 random bytes).
pub fn new_secret() -> Result<String, Error> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Setup(format!("/dev/urandom (the cluster secret): {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Whether the log `log` says its member generated a cluster key of its own, or could not read
/// the shared one (3008.5's join race): a line with "cluster.pem" and "Generating key-pair" or
/// "Unable to read key".
pub fn lost_key_race(log: &Path) -> bool {
    read(log).lines().any(|l| {
        (l.contains("Generating key-pair") || l.contains("Unable to read key"))
            && l.contains("cluster.pem")
    })
}

/// The venv's `salt-master`s as process groups ([`ProcGuard`]), each with its files in the
/// directory `dir(index, ip)` (removed first), stdout and stderr in its `master.stderr`;
/// plainly, or inside the network namespace `netns` (`ip netns exec`), where the founder's ports
/// are looked up with `ss` in that namespace.
pub struct Procs<F> {
    pub venv: PathBuf,
    pub dir: F,
    pub netns: Option<String>,
}

/// A member started by [`Procs`].
pub struct Proc {
    pub dir: PathBuf,
    pub guard: ProcGuard,
}

impl<F: Fn(usize, IpAddr) -> PathBuf> Launch for Procs<F> {
    type Member = Proc;
    type Error = Error;

    fn spawn(&mut self, m: &Member<'_>) -> Result<Proc, Error> {
        let dir = (self.dir)(m.index, m.ip);
        let _ = std::fs::remove_dir_all(&dir);
        let conf = m.write(&dir)?;
        let out = std::fs::File::create(dir.join("master.stderr"))
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| Error::Setup(format!("{}/master.stderr: {e}", dir.display())))?;
        let master = self.venv.join("bin/salt-master");
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(master);
                c
            }
            None => Command::new(master),
        };
        cmd.arg("-c")
            .arg(&conf)
            .args(["-l", "warning"])
            .stdin(Stdio::null())
            .stdout(out.0)
            .stderr(out.1);
        let guard = ProcGuard::spawn(&format!("salt-master {}", m.ip), cmd);
        Ok(Proc { dir, guard })
    }

    fn log_file(&self, m: &Proc) -> PathBuf {
        log_file(&m.dir)
    }

    async fn listening(&self, ip: IpAddr, ports: &[u16]) -> bool {
        let Some(ns) = &self.netns else {
            for &p in ports {
                if tokio::net::TcpStream::connect((ip, p)).await.is_err() {
                    return false;
                }
            }
            return true;
        };
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-Hltn"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        ports.iter().all(|p| out.contains(&format!("{ip}:{p} ")))
    }

    async fn stop(&mut self, members: Vec<Proc>) {
        for m in members {
            drop(m.guard);
            let _ = std::fs::remove_dir_all(&m.dir);
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The last three lines of `p`.
fn tail(p: &Path) -> String {
    let t = read(p);
    let last: Vec<&str> = t.lines().rev().take(3).collect();
    last.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Polls `cond` every 100 ms until it holds (true) or `within` has passed (false).
async fn poll(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`poll`] with an async condition.
async fn poll_async<Fut: std::future::Future<Output = bool>>(
    within: Duration,
    mut cond: impl FnMut() -> Fut,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether every top-level key of a Salt config text is written once: Salt's YAML loader
/// refuses a key written twice (the members' configs and their callers' extras are checked with
/// it in tests).
pub fn keys_once(config: &str) -> bool {
    let keys: Vec<&str> = config
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('#'))
        .filter_map(|l| l.split(':').next())
        .collect();
    let mut uniq = keys.clone();
    uniq.sort_unstable();
    uniq.dedup();
    keys.len() == uniq.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        let ips = ["127.0.3.2", "127.0.3.3", "127.0.3.4"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let ports = Ports {
            publish: 4505,
            ret: 4506,
            pool: 4520,
        };
        Spec::new("c1", ips, ports, PathBuf::from("/sh"))
    }

    #[test]
    fn a_members_config_names_its_peers_and_the_shared_dirs() {
        let s = spec();
        let t = s.config(s.ips[1], Path::new("/m2"), "s3cr3t");
        assert!(
            t.contains("cluster_peers:\n  - 127.0.3.2\n  - 127.0.3.4\ncluster_pki_dir: /sh/pki\n"),
            "{t}"
        );
        assert!(t.contains("id: 127.0.3.3\ninterface: 127.0.3.3\n"), "{t}");
        assert!(t.contains("cachedir: /sh/cache\n") && t.contains("pki_dir: /m2/pki\n"));
        assert!(t.contains("cluster_pool_port: 4520\n") && t.contains("ret_port: 4506\n"));
        assert!(t.contains("cluster_secret: \"s3cr3t\"\n"), "{t}");
        assert!(t.contains("cluster_id: c1\n") && t.contains("log_file: /m2/master.log\n"));
        assert!(t.contains("log_level_logfile: info\n"));
        assert!(!t.contains("transport:") && !t.contains("worker_threads:"));
        assert!(!t.contains("grains_cache:"));
        assert!(keys_once(&t), "{t}");
    }

    #[test]
    fn the_optional_keys_appear_once_when_set() {
        let mut s = spec();
        s.transport = Some("ws".into());
        s.worker_threads = Some(2);
        s.grains_cache = true;
        s.extra = "enable_fqdns_grains: False\n".into();
        let t = s.config(s.ips[0], Path::new("/m1"), "x");
        for line in [
            "transport: ws\n",
            "worker_threads: 2\n",
            "grains_cache: True\n",
            "enable_fqdns_grains: False\n",
        ] {
            assert_eq!(t.matches(line).count(), 1, "{line} in {t}");
        }
        assert!(keys_once(&t), "{t}");
    }

    #[test]
    fn the_join_race_is_read_from_either_log_line() {
        let d = std::env::temp_dir().join(format!("salt-cluster-race-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let log = d.join("master.log");
        let cases = [
            ("[INFO] Generating key-pair for /sh/pki/cluster.pem\n", true),
            (
                "[ERROR] Unable to read key: /sh/pki/cluster.pem; file may be corrupt\n",
                true,
            ),
            ("[INFO] Generating key-pair for /m/pki/master.pem\n", false),
            ("[INFO] opening request gate\n", false),
        ];
        for (text, raced) in cases {
            std::fs::write(&log, text).unwrap();
            assert_eq!(lost_key_race(&log), raced, "{text}");
        }
        assert!(!lost_key_race(&d.join("absent.log")));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
