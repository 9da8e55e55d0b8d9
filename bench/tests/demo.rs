//! `saltgate-demo --once --minions 10` end to end on 127.0.6.x: three masters, saltgate and the
//! swarm in one process; every job (one per master, then one per surviving master after one is
//! killed) must be answered by every minion, the last line must say so, and the temporary
//! directory must be gone afterwards.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the demo if the test ends before it does.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = pipe.read_to_string(&mut out);
        out
    })
}

#[test]
fn demo_once_fails_over_and_every_minion_answers() {
    let child = Command::new(env!("CARGO_BIN_EXE_saltgate-demo"))
        .args([
            "--once",
            "--minions",
            "10",
            "--proxy-ip",
            "127.0.6.201",
            "--master-ips",
            "127.0.6.211,127.0.6.212,127.0.6.213",
            "--publish-port",
            "0",
            "--request-port",
            "0",
            "--admin-port",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start saltgate-demo");
    let mut guard = Guard(child);
    // Read both pipes while the demo runs: a demo that logs more than a pipe holds (about 64 KiB,
    // say on a loaded machine that retries) would otherwise block on its write and never finish.
    let out = drain(guard.0.stdout.take().expect("piped"));
    let err = drain(guard.0.stderr.take().expect("piped"));
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = guard.0.try_wait().expect("wait for saltgate-demo") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "saltgate-demo --once did not finish within 300 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out.join().expect("stdout reader");
    let stderr = err.join().expect("stderr reader");
    let all = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(status.success(), "saltgate-demo failed ({status}):\n{all}");
    let last = stdout.lines().last().unwrap_or("");
    assert_eq!(last, "demo: OK 10 minions, 5 jobs, 0 missed", "{all}");
    // Jobs went through every master before the kill and through both survivors after it.
    let after_kill = stdout
        .split("== killing master1")
        .nth(1)
        .unwrap_or_else(|| panic!("no kill in the output:\n{all}"));
    for m in ["master2", "master3"] {
        assert!(
            after_kill
                .lines()
                .any(|l| l.contains(&format!("via {m}: jid ")) && l.contains("answered 10/10")),
            "no full answer through {m} after the kill:\n{all}"
        );
    }
    assert!(stdout.contains("via master1: jid "), "{all}");
    // The temporary directory is removed at exit.
    let dir = stdout
        .lines()
        .find_map(|l| l.split_once("files in ").map(|(_, d)| d.trim().to_string()))
        .unwrap_or_else(|| panic!("no temporary directory named:\n{all}"));
    assert!(
        !std::path::Path::new(&dir).exists(),
        "{dir} left behind:\n{all}"
    );
}
