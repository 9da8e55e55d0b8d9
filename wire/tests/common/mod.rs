//! Shared helpers for the interop tests: finding the real-Salt venv, running the Python peers,
//! and guarding the processes we start.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[allow(unused_imports)] // each test binary uses its own subset
pub use saltgate_test_support::{venv, ProcGuard};

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

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}
