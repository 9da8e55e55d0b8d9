//! Helpers shared by the integration tests of every crate (a dev-dependency, and a dependency of
//! the bench's library, which starts real Salt clusters too): the venv with real Salt 3008.5, a
//! guard that stops a child's whole process group (by PID) when dropped, the condition waits
//! (`wait_for` blocking, `wait_until` async), stock `salt-minion` and `salt-master`
//! configurations, and a real salt-master 3008.5 cluster ([`salt_cluster`]).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod salt_cluster;

/// The venv with Salt 3008.5: `$SALTGATE_VENV` (exported by ./scripts/test.sh), else whatever
/// `interop/setup.sh` prints (it installs Salt on first use). A missing venv fails the test with
/// the reason.
pub fn venv() -> PathBuf {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let v = VENV.get_or_init(|| {
        let v = match std::env::var_os("SALTGATE_VENV") {
            Some(v) => PathBuf::from(v),
            None => {
                let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../interop/setup.sh");
                let out = Command::new("bash")
                    .arg(&setup)
                    .env("NEED_HAPROXY", "0")
                    .stderr(Stdio::inherit())
                    .output()
                    .map_err(|e| format!("cannot run {}: {e}", setup.display()))?;
                if !out.status.success() {
                    return Err(format!("{} failed with {}", setup.display(), out.status));
                }
                let stdout = String::from_utf8_lossy(&out.stdout);
                PathBuf::from(stdout.lines().last().unwrap_or("").trim())
            }
        };
        for bin in ["bin/python", "bin/salt-minion", "bin/salt-master"] {
            if !v.join(bin).exists() {
                return Err(format!(
                    "{} has no {bin}; run ./scripts/test.sh (it installs real Salt 3008.5)",
                    v.display()
                ));
            }
        }
        Ok(v)
    });
    match v {
        Ok(p) => p.clone(),
        Err(e) => panic!("real-Salt venv unavailable: {e}"),
    }
}

/// A child process, leader of its own process group, stopped with its group when dropped.
pub struct ProcGuard {
    pub child: Child,
    pub name: String,
}

impl ProcGuard {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(name: &str, mut cmd: Command) -> Self {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        ProcGuard {
            child,
            name: name.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdout (piped by the caller) as lines; once.
    pub fn stdout_lines(&mut self) -> std::io::Lines<BufReader<ChildStdout>> {
        BufReader::new(self.child.stdout.take().expect("stdout piped")).lines()
    }

    /// Reads `lines` until one satisfies `pred`; `None` at the end of the stream.
    pub fn wait_line(
        lines: &mut impl Iterator<Item = std::io::Result<String>>,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        for line in lines {
            let line = line.ok()?;
            if pred(&line) {
                return Some(line);
            }
        }
        None
    }

    /// Sends `sig` (e.g. `-STOP`) to the whole process group.
    pub fn signal_group(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for ProcGuard {
    fn drop(&mut self) {
        // A stopped group must be continued to act on TERM.
        self.signal_group("-CONT");
        self.signal_group("-TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.signal_group("-KILL");
        let _ = self.child.wait();
    }
}

/// Polls `f` until it returns `Some`, or panics naming `what` after `timeout` (blocking: for tests
/// that drive processes from a plain thread).
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Awaits `cond` on the tokio clock (so paused time works), re-checking every few milliseconds
/// and yielding between checks; panics naming `what` after `timeout`. The one async condition
/// wait of every crate's tests.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Writes a stock salt-minion config for `id` under `dir/<id>-conf/minion` (its state under
/// `dir/<id>/`, log in `dir/<id>/minion.log`) and returns the config directory.
pub fn write_minion_config(
    dir: &Path,
    id: &str,
    master: &str,
    ret_port: u16,
    pub_port: u16,
) -> PathBuf {
    let m = dir.join(id);
    let m = m.display();
    write_daemon_config(
        dir,
        id,
        "minion",
        &format!(
            "id: {id}\nmaster: {master}\nmaster_port: {ret_port}\npublish_port: {pub_port}\n\
             user: root\npki_dir: {m}/pki\ncachedir: {m}/cache\n\
             sock_dir: {m}/sock\npidfile: {m}/minion.pid\n\
             log_file: {m}/minion.log\nlog_level_logfile: debug\n\
             acceptance_wait_time: 1\nacceptance_wait_time_max: 1\nrandom_reauth_delay: 1\n\
             auth_timeout: 10\nmaster_tries: -1\nmultiprocessing: False\n"
        ),
    )
}

/// Writes `text` to `dir/<id>-conf/<file>` (`minion`, `master`); returns the config directory.
fn write_daemon_config(dir: &Path, id: &str, file: &str, text: &str) -> PathBuf {
    let conf = dir.join(format!("{id}-conf"));
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join(file), text).unwrap();
    conf
}

/// Starts the venv's stock salt-minion on the config directory `conf`.
pub fn start_salt_minion(conf: &Path, stderr: &Path) -> ProcGuard {
    start_salt_daemon("salt-minion", conf, stderr)
}

/// Starts the venv's `daemon` (`salt-minion`, `salt-master`) on the config directory `conf`,
/// logging warnings to `stderr`.
fn start_salt_daemon(daemon: &str, conf: &Path, stderr: &Path) -> ProcGuard {
    let mut cmd = Command::new(venv().join("bin").join(daemon));
    cmd.arg("-c")
        .arg(conf)
        .args(["-l", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(stderr).unwrap()));
    ProcGuard::spawn(daemon, cmd)
}

/// Writes a stock salt-master config for `id` listening on `interface` (Salt's ports 4505 and
/// 4506, `auto_accept`, two workers) under `dir/<id>-conf/master` (its state under `dir/<id>/`,
/// log in `dir/<id>/master.log`), with `extra` YAML lines appended (`transport: ws\n`, `ssl`);
/// returns the config directory.
pub fn write_master_config(dir: &Path, id: &str, interface: &str, extra: &str) -> PathBuf {
    let m = dir.join(id);
    let m = m.display();
    write_daemon_config(
        dir,
        id,
        "master",
        &format!(
            "id: {id}\ninterface: {interface}\npublish_port: 4505\nret_port: 4506\n\
             user: root\nauto_accept: True\npki_dir: {m}/pki\ncachedir: {m}/cache\n\
             sock_dir: {m}/sock\nsqlite_queue_dir: {m}/queues\npidfile: {m}/master.pid\n\
             log_file: {m}/master.log\nkey_logfile: {m}/key.log\nlog_level_logfile: info\n\
             worker_threads: 2\nfile_roots: {{base: [{m}/srv/salt]}}\n\
             pillar_roots: {{base: [{m}/srv/pillar]}}\n{extra}"
        ),
    )
}

/// Starts the venv's stock salt-master on the config directory `conf`.
pub fn start_salt_master(conf: &Path, stderr: &Path) -> ProcGuard {
    start_salt_daemon("salt-master", conf, stderr)
}

/// A 2048-bit RSA private key in PEM (PKCS#1, Salt's form) from `openssl genrsa`: a debug
/// build's own key generation takes tens of seconds.
pub fn openssl_pem() -> Vec<u8> {
    let key = Command::new("openssl")
        .args(["genrsa", "-traditional", "2048"])
        .output()
        .expect("openssl genrsa");
    assert!(key.status.success(), "openssl genrsa failed");
    key.stdout
}

/// Writes [`openssl_pem`] to `path`, creating its directory.
pub fn write_openssl_key(path: &Path) {
    std::fs::create_dir_all(path.parent().expect("a key path has a directory")).unwrap();
    std::fs::write(path, openssl_pem()).unwrap();
}

/// Test-only MultiMaster-PKI keys and a signature made by real Salt 3008.5 (see
/// `data/multimaster_pki/README.md`).
pub mod pki_fixture {
    /// The signing private key (`master_sign.pem`).
    pub const SIGN_PEM: &str = include_str!("../data/multimaster_pki/sign.pem");
    /// Its public half (`master_sign.pub`, copied to minions).
    pub const SIGN_PUB: &str = include_str!("../data/multimaster_pki/sign.pub");
    /// A master public key file (`master.pub`).
    pub const MASTER_PUB: &str = include_str!("../data/multimaster_pki/master.pub");
    /// Salt's `b2a_base64(PKCS1v15-SHA1 signature of clean_key(MASTER_PUB) by SIGN_PEM)`.
    pub const SALT_SIG: &str = include_str!("../data/multimaster_pki/salt_sig.b64");
    /// The same with PKCS1v15-SHA224.
    pub const SALT_SIG224: &str = include_str!("../data/multimaster_pki/salt_sig224.b64");
}
