//! The real-Salt request-continuity lab (request_continuity_tcp_real.rs on `transport: tcp`,
//! request_continuity_ws_real.rs on `transport: ws`): two Salt 3008.5 `salt-master`s (A, B) in
//! one Salt cluster (`cluster_id`, shared `cluster_pki_dir` and `cachedir`, started by
//! test-support's `salt_cluster` as interop/harness/cluster.py starts them), two saltgates on
//! one address (the request port over A then B with `on_master_down: migrate`, the publish port
//! from B only), a stock `salt-minion` that knows only saltgate's address, and the round both
//! tests make: a return in flight to A when A is SIGSTOPped. What each test asserts of the round
//! stays in the test.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use saltgate_config::transport::SaltTransport;
use saltgate_config::{Balance, Config, OnMasterDown, Role};
use saltgate_proxy::{Options, Running};
use saltgate_test_support::{salt_cluster, venv, write_minion_config, ProcGuard};

use super::api::{run_with, scrape, value};
use super::config_on;
use super::salt_real::{
    kept_dir, minion_answers, real_master, run_ok, salt_aware, spawn, tail, Keep,
};

/// The minion waits this long for a return's answer before it sends the return again.
pub const RETURN_RETRY_TIMER: u64 = 30;

/// What differs between the two tests' labs.
pub struct Spec {
    /// The masters', saltgate's and the minion's `transport`.
    pub transport: SaltTransport,
    /// saltgate's address (both its saltgates; the minion's `master`).
    pub gate: &'static str,
    /// A (the founder, where the request sessions start), then B.
    pub masters: [&'static str; 2],
    pub cluster_id: &'static str,
    pub minion: &'static str,
    /// The minion's log file at trace rather than test-support's debug (`AsyncReqChannel.send`
    /// logs its failed tries at trace).
    pub minion_trace: bool,
    /// Whether the minion's key is accepted in the cluster's pki before it first starts (see
    /// [`Cluster::preseed_minion_key`]).
    pub preseed_minion_key: bool,
}

/// The lab's directory and what its files are called; the waits that show its logs.
pub struct Cluster {
    pub spec: Spec,
    /// The test's directory.
    pub d: PathBuf,
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// saltgate's bytes in on its request listener.
pub fn request_bytes_in(s: &prometheus_parse::Scrape) -> f64 {
    value(
        s,
        "saltgate_listener_bytes_total",
        &[("listener", "request"), ("direction", "in")],
    )
}

/// A counter's value, 0 while it has no sample yet.
pub fn count(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    if s.samples.iter().any(|x| x.metric == name) {
        value(s, name, labels)
    } else {
        0.0
    }
}

impl Cluster {
    pub fn mdir(&self, ip: &str) -> PathBuf {
        self.d.join(format!("m-{ip}"))
    }

    pub fn master_log(&self, ip: &str) -> PathBuf {
        self.mdir(ip).join("master.log")
    }

    pub fn minion_log(&self) -> PathBuf {
        self.d.join(self.spec.minion).join("minion.log")
    }

    /// Polls `cond` every 100 ms until it holds, or panics naming `what` (and the logs) after
    /// `timeout`.
    pub async fn poll(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        let [a, b] = self.spec.masters;
        while !cond() {
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for: {what}\n--- minion\n{}\n--- {a}\n{}\n--- {b}\n{}",
                    tail(&self.minion_log()),
                    tail(&self.master_log(a)),
                    tail(&self.master_log(b)),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The masters' cluster: interop/harness/cluster.py's configuration on Salt's ports (4505,
    /// 4506, `cluster_pool_port` 4520) on the lab's transport, `worker_threads: 2`, the founder
    /// (A) first, 90 s for each step.
    fn cluster_spec(&self) -> salt_cluster::Spec {
        let ports = salt_cluster::Ports {
            publish: 4505,
            ret: 4506,
            pool: 4520,
        };
        let ips = self
            .spec
            .masters
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        salt_cluster::Spec {
            transport: Some(self.spec.transport.as_str().into()),
            worker_threads: Some(2),
            ready_within: Duration::from_secs(90),
            ..salt_cluster::Spec::new(self.spec.cluster_id, ips, ports, self.d.join("shared"))
        }
    }

    /// Starts the two masters until both are cluster-ready (`opening request gate`):
    /// test-support's `salt_cluster` (the founder first, the others once its ports are open; a
    /// start that lost 3008.5's cluster-key race, "Generating key-pair" or "Unable to read key"
    /// for `cluster.pem`, wiped and tried again, three times at most).
    pub async fn start_masters(&self) -> Vec<ProcGuard> {
        let mut procs = salt_cluster::Procs {
            venv: venv(),
            dir: |_, ip: IpAddr| self.mdir(&ip.to_string()),
            netns: None,
        };
        let [a, b] = self.spec.masters;
        let started = salt_cluster::start(&venv(), &self.cluster_spec(), &mut procs).await;
        let masters = started.unwrap_or_else(|e| {
            panic!(
                "the real salt-master cluster: {e}\n--- {a}\n{}\n--- {b}\n{}",
                tail(&self.master_log(a)),
                tail(&self.master_log(b)),
            )
        });
        masters.into_iter().map(|m| m.guard).collect()
    }

    /// The `salt` CLI of master `ip`: its stdout then its stderr.
    pub fn salt(&self, ip: &str, args: &[&str]) -> String {
        let out = Command::new(venv().join("bin/salt"))
            .arg("-c")
            .arg(self.mdir(ip).join("conf"))
            .args(args)
            .output()
            .expect("salt runs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Publishes (from `via`) a job that waits for `go` and returns; returns its jid once the
    /// minion runs it (it touches `started`).
    pub async fn start_waiting_job(&self, via: &str, n: u32) -> (String, PathBuf) {
        let d = &self.d;
        let (started, go) = (d.join(format!("started-{n}")), d.join(format!("go-{n}")));
        let script = format!(
            "touch {}; for i in $(seq 600); do [ -e {} ] && exit 0; sleep 0.1; done",
            started.display(),
            go.display()
        );
        let out = self.salt(via, &["--async", self.spec.minion, "cmd.run", &script]);
        // The jid is the one 20-digit word: the CLI's own `ws` client warns on stderr after it
        // (aiohttp's "Unclosed client session": `RequestClient` replaces its session on every
        // send).
        let jid = out
            .split_whitespace()
            .find(|j| j.len() == 20 && j.bytes().all(|b| b.is_ascii_digit()))
            .unwrap_or_else(|| panic!("no jid from salt --async: {out}"))
            .to_string();
        self.poll(
            &format!("job {jid} running"),
            Duration::from_secs(60),
            || started.exists(),
        )
        .await;
        (jid, go)
    }

    /// saltgate over `masters` (in this order, `balance: first`), on the lab's transport with the
    /// default Salt-aware probe, serving `role` on its Salt port of the gate address (the other
    /// listener on a port nobody uses); the request port with `on_master_down: migrate`.
    pub fn gate(&self, masters: &[&str], role: Role) -> Config {
        let health = salt_aware();
        let gate = self.spec.gate;
        let mut cfg = config_on(
            gate,
            masters
                .iter()
                .map(|ip| real_master(ip, ip, health))
                .collect(),
            health,
        );
        cfg.global.transport = self.spec.transport;
        cfg.publish.balance = Balance::First;
        cfg.request.balance = Balance::First;
        match role {
            Role::Publish => cfg.publish.bind = vec![format!("{gate}:4505").parse().unwrap()],
            Role::Request => {
                cfg.request.bind = vec![format!("{gate}:4506").parse().unwrap()];
                cfg.request.on_master_down = OnMasterDown::Migrate;
            }
        }
        cfg
    }

    /// The minion's key pair, made with Salt's `salt.crypt.gen_keys`, its public key accepted in
    /// the cluster's shared `cluster_pki_dir` before the minion first starts (Salt's "preseed
    /// minion keys"). Needed on `tcp`: left to `auto_accept`, the key is accepted by the member
    /// that got the minion's `_auth` (A), while its publish connection is on B; 3008.5's tcp
    /// publish server checks the id the minion sends on that connection against the key cache
    /// once (`presence_callback`, `verify_minion`) and ignores the subscription when the key is
    /// not there yet ("Unexpectedly got no pub key", B's log): the minion, which never sends its
    /// id again, then got no job at all (a CI run of 2026-11-28, under load).
    fn preseed_minion_key(&self) {
        let code = "import os,sys,salt.crypt\n\
                    pki,acc,mid=sys.argv[1:4]\n\
                    os.makedirs(pki,exist_ok=True); os.makedirs(acc,exist_ok=True)\n\
                    priv,pub=salt.crypt.gen_keys(2048)\n\
                    for p,data,mode in ((os.path.join(pki,'minion.pem'),priv,0o400),\n\
                    \x20   (os.path.join(pki,'minion.pub'),pub,0o644),(os.path.join(acc,mid),pub,0o644)):\n\
                    \x20   fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_EXCL,mode)\n\
                    \x20   f=os.fdopen(fd,'w'); f.write(data); f.close()\n";
        let minion = self.spec.minion;
        let mut cmd = Command::new(venv().join("bin/python"));
        cmd.args(["-c", code])
            .arg(self.d.join(minion).join("pki"))
            .arg(self.d.join("shared/pki/minions"))
            .arg(minion);
        run_ok(cmd, "minion key");
    }

    /// Starts the minion (its keys kept from an earlier start) and waits until it answers.
    pub async fn start_minion(&self) -> ProcGuard {
        let (d, minion) = (&self.d, self.spec.minion);
        let conf = d.join(format!("{minion}-conf"));
        if !conf.join("minion").exists() {
            let conf = write_minion_config(d, minion, self.spec.gate, 4506, 4505);
            let mut text = read(&conf.join("minion"));
            if self.spec.minion_trace {
                text = text.replace("log_level_logfile: debug", "log_level_logfile: trace");
            }
            text.push_str(&format!(
                "transport: {}\nreturn_retry_timer: {RETURN_RETRY_TIMER}\nreturn_retry_timer_max: {RETURN_RETRY_TIMER}\n",
                self.spec.transport.as_str()
            ));
            std::fs::write(conf.join("minion"), text).unwrap();
            if self.spec.preseed_minion_key {
                self.preseed_minion_key();
            }
        }
        let mut cmd = Command::new(venv().join("bin/salt-minion"));
        cmd.arg("-c").arg(&conf).args(["-l", "warning"]);
        let guard = spawn("salt-minion", cmd, &d.join("minion.stderr"));
        let [a, b] = self.spec.masters;
        let (mconf, logs) = (
            self.mdir(b).join("conf"),
            vec![self.minion_log(), self.master_log(a), self.master_log(b)],
        );
        let id = minion.to_string();
        tokio::task::spawn_blocking(move || {
            minion_answers(
                &mconf,
                &id,
                Instant::now() + Duration::from_secs(150),
                &logs,
            )
        })
        .await
        .unwrap();
        guard
    }
}

/// The lab running: the masters, the two saltgates and the minion, stopped (in this order) when
/// it drops; its directory kept when the test fails.
pub struct Lab {
    _minion: ProcGuard,
    /// The saltgate of the request port (over A then B).
    pub req: Running,
    _stop_req: tokio::sync::oneshot::Sender<()>,
    /// The saltgate of the publish port (B only).
    pub publ: Running,
    _stop_pub: tokio::sync::oneshot::Sender<()>,
    pub masters: Vec<ProcGuard>,
    pub cluster: Cluster,
    _keep: Keep,
    _dir: tempfile::TempDir,
}

/// What the round saw.
pub struct Round {
    pub jid: String,
    /// From the minion's "Returning information" to B's "Got return".
    pub took: Duration,
    /// saltgate's metrics once B stored the return.
    pub scrape: prometheus_parse::Scrape,
    /// The minion's log from here on is the round's.
    pub minion_log_at: usize,
}

impl Lab {
    /// The masters (until cluster-ready), saltgate's request port over A then B and its publish
    /// port from B only, until saltgate has both UP, then the minion until it answers. A stock
    /// minion treats the loss of its publish connection as the loss of its master and reconnects
    /// everything (`__master_disconnected`): its publish connection must not be on the master that
    /// goes, for the request connection's continuity to be seen. saltgate's log goes to
    /// `saltgate.log` in the directory.
    pub async fn start(spec: Spec) -> Lab {
        let (dir, keep) = kept_dir(&format!("sg-{}mig", spec.transport.as_str()));
        let cluster = Cluster {
            spec,
            d: dir.path().to_path_buf(),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter("saltgate_proxy=info")
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(
                std::fs::File::create(cluster.d.join("saltgate.log")).unwrap(),
            ))
            .try_init();
        let masters = cluster.start_masters().await;
        let [a, b] = cluster.spec.masters;
        let (req, stop_req) =
            run_with(cluster.gate(&[a, b], Role::Request), Options::default()).await;
        let (publ, stop_pub) =
            run_with(cluster.gate(&[b], Role::Publish), Options::default()).await;
        let ready = |ip: &str| {
            let m = req.master(ip).unwrap();
            m.is_up() && m.last_check(Role::Request).ok
        };
        cluster
            .poll(
                "both masters UP in saltgate",
                Duration::from_secs(60),
                || ready(a) && ready(b) && publ.master(b).unwrap().is_up(),
            )
            .await;
        let minion = cluster.start_minion().await;
        Lab {
            _minion: minion,
            req,
            _stop_req: stop_req,
            publ,
            _stop_pub: stop_pub,
            masters,
            cluster,
            _keep: keep,
            _dir: dir,
        }
    }

    pub fn admin(&self) -> SocketAddr {
        self.req.admin_addr().unwrap()
    }

    /// The SIGSTOP round: a job published from B waits for a file; once the minion runs it, A
    /// (which holds the minion's request connection) is SIGSTOPped and the job let go; the
    /// minion's return passes saltgate towards the stopped A (`min_bytes` of it at least, within
    /// 10 s, or the test fails with `never`); B must store it within `RETURN_RETRY_TIMER - 5` s.
    pub async fn return_in_flight_to_a_stopped_a(&self, min_bytes: f64, never: &str) -> Round {
        let c = &self.cluster;
        let [a, b] = c.spec.masters;
        let admin = self.admin();
        let minion_log = c.minion_log();
        let minion_log_at = read(&minion_log).len();
        let (jid, go) = c.start_waiting_job(b, 0).await;
        let before = request_bytes_in(&scrape(admin).await);
        self.masters[0].signal_group("-STOP");
        std::fs::write(&go, b"").unwrap();
        let returning = format!("Returning information for job: {jid}");
        c.poll("the minion returning", Duration::from_secs(30), || {
            read(&minion_log).contains(&returning)
        })
        .await;
        let sent_at = Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while request_bytes_in(&scrape(admin).await) < before + min_bytes {
            assert!(tokio::time::Instant::now() < deadline, "{never}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let got = format!("Got return from {} for job {jid}", c.spec.minion);
        c.poll(
            &format!("{b} storing the return of {jid} (SIGSTOP of {a})"),
            Duration::from_secs(RETURN_RETRY_TIMER - 5),
            || read(&c.master_log(b)).contains(&got),
        )
        .await;
        let took = sent_at.elapsed();
        Round {
            jid,
            took,
            scrape: scrape(admin).await,
            minion_log_at,
        }
    }
}
