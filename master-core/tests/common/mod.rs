//! Helpers for master-core's integration tests: the real-Salt venv, process guards, and a
//! `saltgate-master` started on a loopback address of 127.0.1.0/24 with ports chosen by the OS.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The venv with Salt 3008.5 (`$SALTGATE_VENV`, exported by ./scripts/test.sh).
pub fn venv() -> PathBuf {
    let v = std::env::var_os("SALTGATE_VENV").unwrap_or_else(|| {
        panic!("SALTGATE_VENV is not set: run ./scripts/test.sh (it installs real Salt 3008.5 and exports it)")
    });
    let v = PathBuf::from(v);
    assert!(
        v.join("bin/salt-minion").exists(),
        "SALTGATE_VENV={} has no bin/salt-minion; run ./scripts/test.sh",
        v.display()
    );
    v
}

/// A child process (and its process group) killed when dropped.
pub struct ProcGuard {
    pub child: Child,
}

impl ProcGuard {
    pub fn spawn(mut cmd: Command) -> Self {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        ProcGuard {
            child: cmd.spawn().expect("spawn"),
        }
    }
}

impl Drop for ProcGuard {
    fn drop(&mut self) {
        let pgid = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-TERM", "--", &pgid])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &pgid])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_saltgate-master")
}

/// Writes a Salt-format master config under `dir/conf/master` and returns its path.
pub fn write_master_config(dir: &Path, ip: &str, extra: &str) -> PathBuf {
    let d = dir.display();
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    let path = dir.join("conf/master");
    std::fs::write(
        &path,
        format!(
            "id: sg-test-master\ninterface: {ip}\npublish_port: 0\nret_port: 0\n\
             pki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n\
             key_logfile: {d}/key.log\nlog_file: {d}/salt.log\nuser: root\n\
             pillar_roots: {{base: [{d}/pillar]}}\n{extra}"
        ),
    )
    .unwrap();
    // The master key from openssl: a debug-build RSA key generation takes tens of seconds.
    std::fs::create_dir_all(dir.join("pki")).unwrap();
    let key = Command::new("openssl")
        .args(["genrsa", "-traditional", "2048"])
        .output()
        .expect("openssl genrsa");
    assert!(key.status.success(), "openssl genrsa failed");
    std::fs::write(dir.join("pki/master.pem"), key.stdout).unwrap();
    path
}

/// A running `saltgate-master run`.
pub struct RunningMaster {
    pub guard: ProcGuard,
    pub ret: SocketAddr,
    pub publish: SocketAddr,
    pub config: PathBuf,
    pub log: PathBuf,
    /// The cluster peer port, when the config has `cluster_id`.
    pub cluster: Option<SocketAddr>,
}

pub fn start_master(config: &Path, log: &Path) -> RunningMaster {
    let mut cmd = Command::new(bin());
    cmd.arg("-c")
        .arg(config)
        .arg("run")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    let mut guard = ProcGuard::spawn(cmd);
    let stdout = guard.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| {
            panic!(
                "master never said ready:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    let field = |k: &str| -> String {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
            .to_string()
    };
    let cluster = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("cluster="))
        .map(|a| a.parse().unwrap());
    RunningMaster {
        cluster,
        ret: field("ret=").parse().unwrap(),
        publish: field("publish=").parse().unwrap(),
        guard,
        config: config.to_path_buf(),
        log: log.to_path_buf(),
    }
}

/// Runs `saltgate-master -c config ARGS...`.
pub fn cli(config: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("-c")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run saltgate-master")
}

pub fn stdout_json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Writes a stock salt-minion config for `id` under `dir/<id>-conf/minion` (state under
/// `dir/<id>/`) and returns the config directory.
pub fn write_minion_config(
    dir: &Path,
    id: &str,
    ip: &str,
    ret_port: u16,
    pub_port: u16,
) -> PathBuf {
    let m = dir.join(id);
    let m = m.display();
    let conf = dir.join(format!("{id}-conf"));
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("minion"),
        format!(
            "id: {id}\nmaster: {ip}\nmaster_port: {ret_port}\npublish_port: {pub_port}\n\
             user: root\npki_dir: {m}/pki\ncachedir: {m}/cache\n\
             sock_dir: {m}/sock\npidfile: {m}/minion.pid\n\
             log_file: {m}/minion.log\nlog_level_logfile: debug\n\
             acceptance_wait_time: 1\nacceptance_wait_time_max: 1\nrandom_reauth_delay: 1\n\
             auth_timeout: 10\nmaster_tries: -1\nmultiprocessing: False\n"
        ),
    )
    .unwrap();
    conf
}

/// Starts the stock salt-minion of `venv` on the config directory `conf`.
pub fn start_salt_minion(conf: &Path, stderr: &Path) -> ProcGuard {
    let mut cmd = Command::new(venv().join("bin/salt-minion"));
    cmd.arg("-c")
        .arg(conf)
        .args(["-l", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(stderr).unwrap()));
    ProcGuard::spawn(cmd)
}
