//! Salt's own `salt-master` 3008.5 (from the venv in `SALTGATE_VENV`, the one `interop/setup.sh`
//! builds) as a process group of its own, and Salt's own client (`salt.client.LocalClient`,
//! in the venv's Python) to publish a job and time each return as it arrives, the way
//! `saltgate_master::cli::publish` does for ours. The client is imported and connected before
//! the clock starts, so Python's start-up is not counted.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::BenchError;

/// The venv: `$SALTGATE_VENV`, which must hold `bin/salt-master` and `bin/python`.
pub fn venv() -> Result<PathBuf, BenchError> {
    let v = std::env::var_os("SALTGATE_VENV").map(PathBuf::from).ok_or_else(|| {
        BenchError::Usage(
            "master: set SALTGATE_VENV to a venv with Salt 3008.5 (interop/setup.sh prints one, e.g. \
             export SALTGATE_VENV=$HOME/.cache/saltgate/venv-salt-3008.5)"
                .into(),
        )
    })?;
    for b in ["bin/salt-master", "bin/python"] {
        if !v.join(b).exists() {
            return Err(BenchError::Usage(format!(
                "master: {} has no {b}; run interop/setup.sh",
                v.display()
            )));
        }
    }
    Ok(v)
}

/// A running salt-master (the leader of its own process group).
pub struct SaltMaster {
    pub ret: SocketAddr,
    pub conf_dir: PathBuf,
    /// Its `cachedir` (a cluster's members share one).
    pub cachedir: PathBuf,
    publish: u16,
    child: Child,
    dir: tempfile::TempDir,
}

/// A fresh directory for one master's files.
pub(crate) fn master_dir() -> Result<tempfile::TempDir, BenchError> {
    tempfile::Builder::new()
        .prefix("saltgate-bench-salt.")
        .tempdir()
        .map_err(|e| BenchError::Io(format!("temp dir: {e}")))
}

fn free_port(ip: IpAddr) -> Result<u16, BenchError> {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::Io(format!("bind {ip}:0: {e}")))
}

/// The master's configuration: Salt's defaults (5 worker threads included) but for paths,
/// ports, `auto_accept` and the open-files limit this machine allows.
pub fn config_text(dir: &Path, ip: IpAddr, publish: u16, ret: u16) -> String {
    config_text_with(dir, ip, publish, ret, &Tuning::default())
}

/// What a scenario may change in [`config_text`].
#[derive(Debug, Clone)]
pub struct Tuning {
    /// `log_level_logfile` (`warning`; `info` logs one line per `_auth` the master processes).
    pub log_level: &'static str,
    /// Extra top-level keys, one `key: value` per line (none by default).
    pub extra: String,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            log_level: "warning",
            extra: String::new(),
        }
    }
}

/// [`config_text`] with `tuning`.
pub fn config_text_with(dir: &Path, ip: IpAddr, publish: u16, ret: u16, tuning: &Tuning) -> String {
    let d = dir.display();
    let level = tuning.log_level;
    let extra = &tuning.extra;
    format!(
        "id: bench-salt-master\ninterface: {ip}\npublish_port: {publish}\nret_port: {ret}\n\
         user: root\npki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n\
         sqlite_queue_dir: {d}/queues\npidfile: {d}/master.pid\nlog_file: {d}/master.log\n\
         key_logfile: {d}/key.log\nlog_level_logfile: {level}\nmax_open_files: 20000\n\
         auto_accept: True\nfile_roots: {{base: [{d}/srv/salt]}}\n\
         pillar_roots: {{base: [{d}/srv/pillar]}}\n{extra}"
    )
}

impl SaltMaster {
    /// Starts it on `ip` and waits until it answers a clear `ping`.
    pub async fn start(venv: &Path, ip: IpAddr) -> Result<SaltMaster, BenchError> {
        SaltMaster::start_with(venv, ip, &Tuning::default()).await
    }

    /// [`SaltMaster::start`] with `tuning` in its configuration.
    pub async fn start_with(
        venv: &Path,
        ip: IpAddr,
        tuning: &Tuning,
    ) -> Result<SaltMaster, BenchError> {
        let dir = master_dir()?;
        let (publish, ret) = (free_port(ip)?, free_port(ip)?);
        let text = config_text_with(dir.path(), ip, publish, ret, tuning);
        let cachedir = dir.path().join("cache");
        let mut m = SaltMaster::spawn(
            venv,
            dir,
            SocketAddr::new(ip, ret),
            publish,
            cachedir,
            &text,
        )?;
        m.wait_ready(Duration::from_secs(120)).await?;
        Ok(m)
    }

    /// Writes `text` as `<dir>/conf/master` and starts salt-master on it (not waiting for it).
    pub(crate) fn spawn(
        venv: &Path,
        dir: tempfile::TempDir,
        ret: SocketAddr,
        publish: u16,
        cachedir: PathBuf,
        text: &str,
    ) -> Result<SaltMaster, BenchError> {
        let conf_dir = dir.path().join("conf");
        std::fs::create_dir_all(&conf_dir)
            .and_then(|_| std::fs::write(conf_dir.join("master"), text))
            .map_err(|e| BenchError::Io(format!("salt-master config: {e}")))?;
        let err = std::fs::File::create(dir.path().join("stderr.log"))
            .map_err(|e| BenchError::Io(format!("salt-master log: {e}")))?;
        let mut cmd = Command::new(venv.join("bin/salt-master"));
        cmd.arg("-c")
            .arg(&conf_dir)
            .args(["-l", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| BenchError::Io(format!("start salt-master: {e}")))?;
        Ok(SaltMaster {
            ret,
            conf_dir,
            cachedir,
            publish,
            child,
            dir,
        })
    }

    /// Waits until it answers a clear `ping` (a cluster member: until it is cluster-ready; its
    /// `cluster_retry` is no answer).
    pub(crate) async fn wait_ready(&mut self, within: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(BenchError::Target(format!(
                    "salt-master {} exited at start ({st}): {}",
                    self.ret.ip(),
                    self.log_tail()
                )));
            }
            if saltgate_wire::probe::salt_ping(self.ret, Duration::from_secs(2))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Target(format!(
                    "salt-master {} did not answer a ping within {within:?}: {}",
                    self.ret.ip(),
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// The master's `publish_port`.
    pub fn publish_port(&self) -> u16 {
        self.publish
    }

    /// The master's own log file (`log_file`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("master.log")
    }

    /// Its directory (configuration, logs, keys).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        for f in ["stderr.log", "master.log"] {
            let t = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(3).collect();
            s.push_str(&format!("{f}: {} ", tail.join(" | ")));
        }
        s
    }

    /// SIGTERM to the group, SIGKILL after 10 s.
    pub async fn stop(mut self) {
        self.stop_group().await;
    }

    async fn stop_group(&mut self) {
        let pg = self.pid() as i32;
        // SAFETY: signalling the process group we created (its leader is our child).
        unsafe {
            libc::kill(-pg, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            // SAFETY: as above.
            unsafe {
                libc::kill(-pg, libc::SIGKILL);
            }
            let _ = self.child.wait().await;
        }
    }
}

/// A master dropped without [`SaltMaster::stop`] (a failed start, an error on the way) takes its
/// whole process group with it: `kill_on_drop` alone would kill only the leader, and its workers
/// would live on, with their directory gone.
impl Drop for SaltMaster {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let pg = self.pid() as i32;
            if pg > 0 {
                // SAFETY: signalling the process group we created (its leader is our child,
                // not yet reaped).
                unsafe {
                    libc::kill(-pg, libc::SIGKILL);
                }
            }
        }
    }
}

/// Salt's LocalClient: connects, says `ready`, waits for a line on stdin, then publishes and
/// prints one JSON line: the seconds after the publish at which each `True` return came.
const CLIENT: &str = r#"
import sys, time, json
import salt.client
conf, tgt, fun, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = salt.client.LocalClient(c_path=conf)
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
after = []
for ret in c.cmd_iter(tgt, fun, timeout=timeout):
    now = time.monotonic() - t0
    for mid, r in ret.items():
        if isinstance(r, dict) and r.get("ret") is True:
            after.append(now)
print(json.dumps({"after": after, "total": time.monotonic() - t0}), flush=True)
"#;

/// Publishes `fun` to `tgt` through Salt's own client; the arrival of each `True` return.
pub async fn publish(
    venv: &Path,
    m: &SaltMaster,
    tgt: &str,
    fun: &str,
    timeout_secs: u64,
) -> Result<Vec<Duration>, BenchError> {
    let script = m.dir.path().join("client.py");
    std::fs::write(&script, CLIENT).map_err(|e| BenchError::Io(format!("client.py: {e}")))?;
    let mut child = Command::new(venv.join("bin/python"))
        .arg(&script)
        .arg(m.conf_dir.join("master"))
        .args([tgt, fun, &timeout_secs.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::Io(format!("start Salt's client: {e}")))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| BenchError::Io("stdin".into()))?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Io("stdout".into()))?;
    let mut lines = BufReader::new(out).lines();
    let fail = |what: &str| BenchError::Scenario(format!("Salt's client: {what}"));
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .map_err(|_| fail("not ready within 60 s"))?
        .map_err(|e| fail(&e.to_string()))?;
    if ready.as_deref() != Some("ready") {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut e, &mut err).await;
        }
        return Err(fail(&format!("did not start: {ready:?} {err}")));
    }
    stdin
        .write_all(b"go\n")
        .await
        .map_err(|e| fail(&e.to_string()))?;
    let line = tokio::time::timeout(Duration::from_secs(timeout_secs + 120), lines.next_line())
        .await
        .map_err(|_| fail("the job did not end"))?
        .map_err(|e| fail(&e.to_string()))?
        .ok_or_else(|| fail("no result line"))?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| fail(&format!("{e}: {line}")))?;
    let _ = child.wait().await;
    Ok(v["after"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(serde_json::Value::as_f64)
                .map(Duration::from_secs_f64)
                .collect()
        })
        .unwrap_or_default())
}
