//! Helpers of the tests that run real Salt 3008.5 behind saltgate (the daemons themselves are
//! started by test-support's `start_salt_master` / `start_salt_minion`): a log's tail for failure
//! messages, a `test.ping` through the master's CLI, and a temporary directory kept on failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use saltgate_test_support::venv;

/// The last 40 lines of `path` (empty if it cannot be read).
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `salt <minion> test.ping` on the master's own CLI (config directory `master_conf`), until it
/// answers True (the minion reaches the master through saltgate on both ports); on the deadline,
/// fails with the tails of `logs`.
pub fn minion_answers(master_conf: &Path, minion: &str, logs: &[&Path], deadline: Instant) {
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
            let logs: Vec<String> = logs
                .iter()
                .map(|l| format!("--- {}\n{}", l.display(), tail(l)))
                .collect();
            panic!(
                "{minion} never answered test.ping: {text}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                logs.join("\n")
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
