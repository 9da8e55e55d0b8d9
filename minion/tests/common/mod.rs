//! Shared helpers for the real-Salt tests: the venv, a salt-master in a temp dir on loopback
//! (killed with its process group when dropped), the `salt` and `salt-key` CLIs, and our
//! minion binary.
#![allow(dead_code)]

pub mod salt_transport;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test binary uses its own subset
pub use saltgate_test_support::{venv, ProcGuard};

pub fn free_port(ip: &str) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap_or_else(|e| panic!("bind {ip}:0: {e}"));
    l.local_addr().expect("addr").port()
}

/// A real salt-master in `dir` on `ip`.
pub struct Master {
    pub ip: String,
    pub dir: PathBuf,
    pub pub_port: u16,
    pub ret_port: u16,
    pub guard: Option<ProcGuard>,
}

impl Master {
    /// Writes the config and starts the master (heartbeats shortened to 1 s / 3 s).
    pub fn start(ip: &str, dir: &Path, extra: &str) -> Master {
        let (pub_port, ret_port) = (free_port(ip), free_port(ip));
        let d = dir.display();
        let conf = format!(
            "id: master-{ip}\ninterface: {ip}\npublish_port: {pub_port}\nret_port: {ret_port}\n\
             user: root\npki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n\
             sqlite_queue_dir: {d}/queues\npidfile: {d}/master.pid\nlog_file: {d}/master.log\n\
             key_logfile: {d}/key.log\nlog_level_logfile: info\nmax_open_files: 16384\n\
             worker_threads: 2\nzmq_heartbeat_ivl: 1000\nzmq_heartbeat_timeout: 3000\n\
             file_roots: {{base: [{d}/srv/salt]}}\npillar_roots: {{base: [{d}/srv/pillar]}}\n{extra}"
        );
        std::fs::create_dir_all(dir.join("conf")).expect("conf dir");
        std::fs::write(dir.join("conf/master"), conf).expect("write master config");
        let mut m = Master {
            ip: ip.to_owned(),
            dir: dir.to_path_buf(),
            pub_port,
            ret_port,
            guard: None,
        };
        m.spawn();
        m
    }

    pub fn spawn(&mut self) {
        let mut cmd = Command::new(venv().join("bin/salt-master"));
        cmd.arg("-c")
            .arg(self.dir.join("conf"))
            .args(["-l", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                std::fs::File::create(self.dir.join("stdout.log")).expect("log"),
            ))
            .stderr(Stdio::from(
                std::fs::File::create(self.dir.join("stderr.log")).expect("log"),
            ));
        self.guard = Some(ProcGuard::spawn("salt-master", cmd));
    }

    /// Copies `other`'s master key pair so both present the same key (Salt's multi-master
    /// requirement). Call before `start`.
    pub fn share_key(from: &Path, to: &Path) {
        std::fs::create_dir_all(to.join("pki")).expect("pki dir");
        for f in ["master.pem", "master.pub"] {
            std::fs::copy(from.join("pki").join(f), to.join("pki").join(f)).expect("copy key");
        }
    }

    pub fn logs(&self) -> String {
        let mut s = String::new();
        for f in ["stderr.log", "master.log"] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            s.push_str(&format!("--- {f} (newest first)\n{}\n", tail.join("\n")));
        }
        s
    }

    /// Waits until the master answers a clear ping.
    pub fn wait_ready(&mut self) {
        let addr = format!("{}:{}", self.ip, self.ret_port)
            .parse()
            .expect("addr");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        self.wait_answering(Duration::from_secs(120), || {
            rt.block_on(saltgate_wire::probe::salt_ping(
                addr,
                Duration::from_secs(2),
            ))
            .is_ok()
        });
    }

    /// Polls `answered` until it says yes; panics with the master's logs when the master exits
    /// or `within` passes.
    pub fn wait_answering(&mut self, within: Duration, mut answered: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        loop {
            if answered() {
                return;
            }
            if let Some(g) = self.guard.as_mut() {
                if let Ok(Some(st)) = g.child.try_wait() {
                    panic!("salt-master exited ({st})\n{}", self.logs());
                }
            }
            assert!(
                Instant::now() < deadline,
                "master not ready\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Runs a Salt CLI (`salt`, `salt-key`) against this master; returns stdout.
    pub fn cli(&self, tool: &str, args: &[&str]) -> String {
        let out = Command::new(venv().join("bin").join(tool))
            .arg("-c")
            .arg(self.dir.join("conf"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `salt --out json --static` for `tgt fun args...`; the parsed returns (or Null).
    pub fn salt(&self, timeout_s: u32, extra: &[&str]) -> serde_json::Value {
        let t = timeout_s.to_string();
        let mut args = vec!["--out", "json", "--static", "--timeout", &t];
        args.extend_from_slice(extra);
        let out = self.cli("salt", &args);
        serde_json::from_str(&out).unwrap_or(serde_json::Value::Null)
    }

    /// Polls `salt-key` until `id` is pending, then accepts it.
    pub fn accept_when_pending(&self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.cli("salt-key", &["-l", "pre", "--out", "json"]);
            if out.contains(&format!("\"{id}\"")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} never pending: {out}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        self.cli("salt-key", &["-a", id, "-y"]);
    }
}

/// Starts `saltgate-minion run -c <dir>/minion.yaml` with `config`.
pub fn start_minion(dir: &Path, config: &str) -> ProcGuard {
    std::fs::create_dir_all(dir).expect("minion dir");
    let path = dir.join("minion.yaml");
    std::fs::write(&path, config).expect("write minion config");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_saltgate-minion"));
    cmd.args(["run", "-c"])
        .arg(&path)
        .env("SALTGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("minion.log")).expect("log"),
        ));
    ProcGuard::spawn("saltgate-minion", cmd)
}

pub use saltgate_test_support::wait_for;

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sgmin")
        .tempdir_in("/tmp")
        .expect("tempdir")
}
