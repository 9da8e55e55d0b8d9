//! Shared helpers for the interop tests: finding the real-Salt venv, running the Python peers,
//! and guarding the processes we start.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The venv with Salt 3008.5 and pyzmq: `$SALTGATE_VENV`, else whatever `interop/setup.sh`
/// prints (it installs on first use). A missing venv fails the test with the reason.
pub fn venv() -> &'static Path {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let v = VENV.get_or_init(|| {
        if let Some(v) = std::env::var_os("SALTGATE_VENV") {
            let v = PathBuf::from(v);
            if v.join("bin/python").exists() {
                return Ok(v);
            }
            return Err(format!(
                "SALTGATE_VENV={} has no bin/python; run NEED_HAPROXY=0 interop/setup.sh",
                v.display()
            ));
        }
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
        let path = stdout.lines().last().unwrap_or("").trim().to_owned();
        let path = PathBuf::from(path);
        if path.join("bin/python").exists() {
            Ok(path)
        } else {
            Err(format!("setup.sh printed no usable venv path: {stdout:?}"))
        }
    });
    match v {
        Ok(p) => p,
        Err(e) => panic!("real-Salt venv unavailable: {e}"),
    }
}

pub fn python() -> PathBuf {
    venv().join("bin/python")
}

pub fn py_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// Runs a Python helper with a JSON request on stdin; returns its stdout parsed as JSON lines.
pub fn run_py_json(script: &str, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(python())
        .arg(py_script(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "{script} failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8 stdout")
}

/// A child process killed (with its process group) when dropped, whatever happens.
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

    /// Reads stdout lines until one satisfies `pred` (or the deadline passes).
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

    pub fn stdout_lines(&mut self) -> std::io::Lines<BufReader<ChildStdout>> {
        BufReader::new(self.child.stdout.take().expect("stdout piped")).lines()
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
        // Children of the group may outlive the leader: always finish with SIGKILL.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &pgid])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}
