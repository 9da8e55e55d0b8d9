//! Helpers of the tests that run real Salt 3008.5 daemons (the venv's): a daemon spawned with
//! its stderr to a file, the tail of a log for a failure message, a test directory kept when the
//! test fails, `salt <minion> test.ping` until it answers, a command that must succeed, and a
//! real master as saltgate's config names it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use saltgate_config::{HealthSettings, MasterConfig, Probe, Role};
use saltgate_proxy::select::master::Master;
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

/// SIGSTOPs every process of the real `master` (saltgate's `m`): DOWN within 5 s, as for
/// ZeroMQ (issue 27; the probe's handshake stage); SIGCONT: UP again within 20 s; then the
/// master's `logs` hold no parsing traceback from the probes (the ZeroMQ greeting made a tcp
/// master log "Exception parsing response ... TypeError" on every check). `what` names the
/// transport in the messages.
pub async fn stopped_down_and_resumed(
    master: &ProcGuard,
    m: &Master,
    what: &str,
    logs: &[PathBuf],
) {
    assert!(m.is_up(), "{what}: {:?}", m.last_check(Role::Request));
    master.signal_group("-STOP");
    let t0 = Instant::now();
    let within = Duration::from_secs(5);
    let limit = tokio::time::Instant::now() + within;
    while m.is_up() {
        assert!(
            tokio::time::Instant::now() < limit,
            "a stopped {what} master still UP after {within:?}: {:?}",
            m.last_check(Role::Request)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let down_after = t0.elapsed();
    let reason = m.last_check(Role::Request).detail;
    master.signal_group("-CONT");
    let t1 = Instant::now();
    let limit = tokio::time::Instant::now() + Duration::from_secs(20);
    while !m.is_up() {
        assert!(
            tokio::time::Instant::now() < limit,
            "the resumed {what} master not UP within 20 s: {:?}",
            m.last_check(Role::Request)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "transport {what}: DOWN {down_after:?} after SIGSTOP ({reason}); UP {:?} after SIGCONT",
        t1.elapsed()
    );
    let checks = m.last_check(Role::Request);
    assert!(checks.ok, "{what}: {checks:?}");
    let log: String = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    // (A ping the probe gave up on while the master was stopped is answered after SIGCONT onto a
    // closed stream: Salt logs that as "Task exception was never retrieved ... StreamClosedError",
    // as it does for any client that gives up. Not a parsing error.)
    for bad in ["Exception parsing", "TypeError", "not subscriptable"] {
        assert!(
            !log.contains(bad),
            "the {what} master logged {bad:?}:\n{}",
            tail(&logs[0])
        );
    }
    eprintln!(
        "{what} master log: {} StreamClosedError line(s), 0 parsing errors",
        log.matches("StreamClosedError(").count()
    );
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
