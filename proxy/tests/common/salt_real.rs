//! Helpers of the tests that run real Salt 3008.5 daemons (the venv's): a daemon spawned with
//! its stderr to a file, the tail of a log for a failure message, a test directory kept when the
//! test fails, `salt <minion> test.ping` until it answers, a command that must succeed, and a
//! real master as saltgate's config names it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use saltgate_config::{HealthSettings, MasterConfig, Probe};
use saltgate_test_support::{venv, ProcGuard};

/// The default schedule with the default Salt-aware probe (saltgate's `probe: salt`).
pub fn salt_aware() -> HealthSettings {
    HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    }
}

/// Master `name`, a real one at `ip` on Salt's ports (4505, 4506), checked with `health`.
pub fn real_master(name: &str, ip: &str, health: HealthSettings) -> MasterConfig {
    super::checked_master(name, ip, 4505, 4506, health)
}

/// The last 40 lines of `path` (empty if it cannot be read).
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Spawns `cmd` (its own process group, stopped when the guard drops), stderr to `log`.
pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> ProcGuard {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    ProcGuard::spawn(name, cmd)
}

/// `salt <minion> test.ping` on the CLI of the master configured in `master_conf` (a directory),
/// until it answers True (the minion reaches the master through saltgate on both ports). On
/// failure the message carries the tails of `logs`.
pub fn minion_answers(master_conf: &Path, minion: &str, deadline: Instant, logs: &[PathBuf]) {
    loop {
        let out = Command::new(venv().join("bin/salt"))
            .arg("-c")
            .arg(master_conf)
            .args(["--out", "json", "--static", "-t", "15", minion, "test.ping"])
            .output()
            .expect("salt runs");
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains(&format!("\"{minion}\": true")) {
            return;
        }
        if Instant::now() >= deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|l| format!("--- {}\n{}", l.display(), tail(l)))
                .collect();
            panic!(
                "{minion} never answered test.ping: {text}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                tails.join("\n")
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Keeps the directory of a failed test (its logs) by moving it aside on a panic.
pub struct Keep(pub PathBuf);

impl Drop for Keep {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let to = self.0.with_extension("kept");
            let _ = std::fs::rename(&self.0, &to);
            eprintln!("logs kept in {}", to.display());
        }
    }
}

/// A test directory in /tmp named `prefix`…, and its [`Keep`]: kept when the test fails (the
/// logs), removed when it passes.
pub fn kept_dir(prefix: &str) -> (tempfile::TempDir, Keep) {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let keep = Keep(dir.path().to_path_buf());
    (dir, keep)
}

/// Runs `cmd` to its end and checks it succeeded; the failure names `what` and its stderr.
pub fn run_ok(mut cmd: Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
