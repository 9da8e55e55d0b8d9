//! The lab: namespaces on a bridge, the processes in them (saltgate or HAProxy and keepalived on
//! the two nodes), and the small waits and probes the scenarios use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use saltgate_test_support::ProcGuard;

use crate::{Mode, EXAMPLES, MASTER_IPS, MINION_IP, NODE_IPS, PORTS, STOCK_IPS, VIP};

/// Runs a command; its standard output, or a panic naming it.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespaces; deleted when dropped (after the processes in them: see [`Lab`]).
pub struct Netns {
    names: Vec<String>,
}

impl Netns {
    /// The switch (`{prefix}sw`, a bridge) and the hosts: `a`, `b` (the nodes), `m` (the
    /// masters), `c` (the swarm) and `s0`, `s1` (one stock minion each: presence knows a Salt
    /// minion's publish session by its address, so each has its own, as on real hosts).
    pub fn create(prefix: &str) -> Netns {
        let mut n = Netns { names: Vec::new() };
        let sw = format!("{prefix}sw");
        sh(&["ip", "netns", "add", &sw]);
        n.names.push(sw.clone());
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        sh(&[
            "ip",
            "-n",
            &sw,
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ]);
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        let hosts: [(&str, &[&str]); 6] = [
            ("a", &[NODE_IPS[0]]),
            ("b", &[NODE_IPS[1]]),
            ("m", &MASTER_IPS),
            ("c", &[MINION_IP]),
            ("s0", &[STOCK_IPS[0]]),
            ("s1", &[STOCK_IPS[1]]),
        ];
        for (h, ips) in hosts {
            let ns = format!("{prefix}{h}");
            sh(&["ip", "netns", "add", &ns]);
            n.names.push(ns.clone());
            let peer = format!("p-{h}");
            sh(&[
                "ip", "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &peer,
                "netns", &sw,
            ]);
            sh(&["ip", "-n", &sw, "link", "set", &peer, "master", "br0", "up"]);
            for ip in ips {
                sh(&[
                    "ip",
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{ip}/24"),
                    "dev",
                    "eth0",
                ]);
            }
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        n
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in self.names.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Whether the test can run here; the reason it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: creating network namespaces needs root".into());
    }
    for tool in ["ip", "keepalived", "haproxy"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!(
                "{tool} not found (apt-get install iproute2 keepalived haproxy)"
            ));
        }
    }
    None
}

/// A workspace binary in target/debug (beside this test's own directory).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace's binaries first (cargo build --bins)",
        p.display()
    );
    p
}

/// `cmd` run inside namespace `ns`, as its own process group, output appended to `log` (a
/// restarted process keeps its earlier log: `SALTGATE_KEEP=1` shows both). `ip netns exec`
/// execs the program: the guard's pid is the program's.
pub fn in_ns(ns: &str, name: &str, program: &Path, args: &[&str], log: &Path) -> ProcGuard {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program).args(args);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    c.stdout(f.try_clone().unwrap())
        .stderr(f)
        .stdin(Stdio::null());
    ProcGuard::spawn(name, c)
}

/// Whether namespace `ns` holds the VIP.
pub fn holds_vip(ns: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.contains(&format!(" {VIP}/"))
}

/// `saltgate ctl ready` inside `ns`: (ready, its line).
fn ready(ns: &str, saltgate: &Path) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(saltgate)
        .args([
            "ctl",
            "--admin",
            "127.0.0.1:9505",
            "--timeout",
            "2s",
            "ready",
        ])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// Replay mode: the counters of node `ns`'s `GET /api/v1/fanout` `replay` section (its admin
/// listener takes no token there), through curl inside the namespace; why not, when it cannot.
pub fn replay_counters(ns: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-s", "--max-time", "2"])
        .arg("http://127.0.0.1:9505/api/v1/fanout")
        .output();
    let body = match out {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => return format!("curl failed: {}", o.status),
        Err(e) => return format!("no curl: {e}"),
    };
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let r = &v["replay"];
    format!(
        "replays {}, jobs replayed {}, of which late-identity replays {}, sessions awaiting an identity {}",
        r["replays"], r["jobs_replayed"], r["late_identity_replays"], r["sessions_awaiting_identity"]
    )
}

/// Whether something in `ns` listens on both of the VIP's ports.
fn listening(ns: &str) -> bool {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    [PORTS.publish, PORTS.request]
        .iter()
        .all(|p| out.contains(&format!("{VIP}:{p} ")))
}

/// The TCP connections established in `ns` with `peer`.
pub fn established_with(ns: &str, peer: &str) -> usize {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "ss",
            "-Htn",
            "state",
            "established",
            "dst",
            peer,
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0)
}

/// Waits (polling every 50 ms) until `cond`; how long it took, or a panic naming `what`.
pub async fn until(limit: Duration, what: &str, cond: impl FnMut() -> bool) -> Duration {
    match within(limit, cond).await {
        Some(took) => took,
        None => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Waits (polling every 50 ms) until `cond`, at most `limit`: how long it took, or None.
pub async fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if cond() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything the test starts: processes first, so they stop before the namespaces go.
pub struct Lab {
    pub procs: BTreeMap<String, ProcGuard>,
    pub _net: Netns,
    pub prefix: String,
    pub dir: PathBuf,
    pub saltgate: PathBuf,
    /// How many swarm minions a scenario starts.
    pub swarm: usize,
    /// In fan-out mode, the masters' `cluster_pki_dir` for `dedup_cluster_pki_dir` (real Salt:
    /// every member re-publishes a peer's job, later and later under load; docs/ha.md).
    pub dedup: Option<PathBuf>,
}

impl Lab {
    pub fn ns(&self, h: &str) -> String {
        format!("{}{h}", self.prefix)
    }

    /// Node `n`'s load balancer (`proxy-{n}`): saltgate, or HAProxy.
    pub fn start_proxy(&mut self, n: &str, mode: Mode) {
        match mode {
            Mode::Haproxy => self.start_haproxy(n),
            _ => self.start_saltgate(n, mode),
        }
    }

    /// Node `n` ("a" or "b"): its saltgate, with the example's file (L4: without `mode: fanout`;
    /// replay: with `replay_window` and `replay_peer`, the other node's admin address, so the
    /// admin listener is on every address of the node).
    fn start_saltgate(&mut self, n: &str, mode: Mode) {
        let mut yaml = std::fs::read_to_string(format!("{EXAMPLES}/saltgate.yaml")).unwrap();
        match mode {
            Mode::L4 => yaml = yaml.replace("    mode: fanout\n", ""),
            Mode::Fanout | Mode::Haproxy => {}
            Mode::Replay => {
                let peer = NODE_IPS[usize::from(n == "a")];
                yaml = yaml.replace(
                    "    mode: fanout\n",
                    &format!("    mode: fanout\n    replay_window: 30s\n    replay_peer: \"{peer}:9505\"\n"),
                );
                let admin = yaml
                    .lines()
                    .find(|l| l.trim_start().starts_with("bind: 127.0.0.1:9505"))
                    .expect("the example's admin bind")
                    .to_string();
                yaml = yaml.replace(
                    &admin,
                    "  bind: 0.0.0.0:9505\n  allow_unauthenticated: true   # the peer asks /ready",
                );
            }
        }
        if let (Some(d), Mode::Fanout | Mode::Replay) = (&self.dedup, mode) {
            yaml = yaml.replace(
                "    mode: fanout\n",
                &format!(
                    "    mode: fanout\n    dedup_cluster_pki_dir: \"{}\"\n",
                    d.display()
                ),
            );
        }
        let conf = self.dir.join(format!("saltgate-{n}.yaml"));
        std::fs::write(&conf, yaml).unwrap();
        let log = self.dir.join(format!("saltgate-{n}.log"));
        let g = in_ns(
            &self.ns(n),
            &format!("saltgate-{n}"),
            &self.saltgate,
            &["run", "--config", conf.to_str().unwrap()],
            &log,
        );
        self.procs.insert(format!("proxy-{n}"), g);
    }

    /// Node `n`'s HAProxy (Debian's), in TCP mode with the settings of the saltgate example (the
    /// same masters, checks every second, fall 2, a DOWN master's sessions closed), listening on
    /// the VIP before the node holds it as the HAProxy + keepalived world does it:
    /// `net.ipv4.ip_nonlocal_bind=1` (set on the nodes by [`Lab::nonlocal_bind`]). Its pid goes
    /// to a pid file, which keepalived's check reads.
    fn start_haproxy(&mut self, n: &str) {
        let mut c = String::from(
            "global\n    maxconn 8000\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout check 2s\n    retries 3\n    option redispatch\n\n",
        );
        for (name, port, timeout) in [
            ("salt-master-pub", PORTS.publish, "1d"),
            ("salt-master-req", PORTS.request, "1m"),
        ] {
            c.push_str(&format!(
                "listen {name}\n    bind {VIP}:{port}\n    balance roundrobin\n    timeout client {timeout}\n    timeout server {timeout}\n"
            ));
            for (i, m) in MASTER_IPS.iter().enumerate() {
                c.push_str(&format!(
                    "    server master{} {m}:{port} check inter 1s rise 1 fall 2 on-marked-down shutdown-sessions\n",
                    i + 1
                ));
            }
            c.push('\n');
        }
        let conf = self.dir.join(format!("haproxy-{n}.cfg"));
        std::fs::write(&conf, c).unwrap();
        let log = self.dir.join(format!("haproxy-{n}.log"));
        let g = in_ns(
            &self.ns(n),
            &format!("haproxy-{n}"),
            Path::new("/usr/sbin/haproxy"),
            &["-db", "-f", conf.to_str().unwrap()],
            &log,
        );
        std::fs::write(self.haproxy_pidfile(n), format!("{}\n", g.pid())).unwrap();
        self.procs.insert(format!("proxy-{n}"), g);
    }

    fn haproxy_pidfile(&self, n: &str) -> PathBuf {
        self.dir.join(format!("haproxy-{n}.pid"))
    }

    /// `net.ipv4.ip_nonlocal_bind` on both nodes (per namespace): on for HAProxy, which binds
    /// the VIP that way; off for saltgate, whose listeners say `freebind: true`.
    pub fn nonlocal_bind(&self, on: bool) {
        for n in ["a", "b"] {
            let v = format!("net.ipv4.ip_nonlocal_bind={}", u8::from(on));
            sh(&["ip", "netns", "exec", &self.ns(n), "sysctl", "-qw", &v]);
        }
    }

    /// Node `n`'s keepalived with the example's file: saltgate's check with the binary's path
    /// changed only; for HAProxy, the check the HAProxy + keepalived world uses (is the haproxy
    /// process alive: `killall -0 haproxy`, here by its pid file, `kill -0 $(cat pidfile)`,
    /// since every namespace shares one process table), with the same interval, fall and rise.
    pub fn start_keepalived(&mut self, n: &str, mode: Mode) {
        let mut text = std::fs::read_to_string(format!("{EXAMPLES}/keepalived-{n}.conf"))
            .unwrap()
            .replace("/usr/bin/saltgate", self.saltgate.to_str().unwrap());
        if mode == Mode::Haproxy {
            let check = self.dir.join(format!("chk-haproxy-{n}"));
            std::fs::write(
                &check,
                format!(
                    "#!/bin/sh\n# keepalived's HAProxy check: is haproxy alive?\nexec kill -0 \"$(cat {})\"\n",
                    self.haproxy_pidfile(n).display()
                ),
            )
            .unwrap();
            sh(&["chmod", "0700", check.to_str().unwrap()]);
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with("script \""))
                .expect("the example's track script")
                .to_string();
            text = text.replace(&line, &format!("    script \"{}\"", check.display()));
        }
        let conf = self.dir.join(format!("keepalived-{n}.conf"));
        std::fs::write(&conf, text).unwrap();
        let pid = |what: &str| self.dir.join(format!("keepalived-{n}{what}.pid"));
        // A SIGKILLed keepalived leaves its pid files; a new one refuses to start over them.
        let (p, r) = (pid(""), pid("-vrrp"));
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&r);
        let log = self.dir.join(format!("keepalived-{n}.log"));
        let g = in_ns(
            &self.ns(n),
            &format!("keepalived-{n}"),
            Path::new("keepalived"),
            &[
                "--dont-fork",
                "--log-console",
                "--vrrp",
                "-f",
                conf.to_str().unwrap(),
                "-p",
                p.to_str().unwrap(),
                "-r",
                r.to_str().unwrap(),
            ],
            &log,
        );
        self.procs.insert(format!("keepalived-{n}"), g);
    }

    /// SIGKILLs `name`'s whole process group, and forgets it.
    pub fn kill(&mut self, name: &str) {
        if let Some(mut g) = self.procs.remove(name) {
            g.signal_group("-KILL");
            let _ = g.child.wait();
        }
    }

    /// Until node `n`'s load balancer is ready: `saltgate ctl ready`; HAProxy: listening on
    /// both ports (it has no readiness of its own; its servers start UP).
    pub async fn wait_ready(&self, n: &str, mode: Mode) {
        let (ns, sg) = (self.ns(n), self.saltgate.clone());
        until(
            Duration::from_secs(60),
            &format!("the load balancer on {n} ready"),
            || match mode {
                Mode::Haproxy => listening(&ns),
                _ => ready(&ns, &sg).0,
            },
        )
        .await;
    }
}
