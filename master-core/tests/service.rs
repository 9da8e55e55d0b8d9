//! What the Debian package and its systemd unit rely on: `check-config` (exit 0 valid, 1 invalid
//! naming the key), `--version` with the commit, `Type=notify` (READY=1 once the ports are bound,
//! STOPPING=1 at SIGTERM), and logs without colour codes when stderr is not a terminal.

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn packaged(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/saltgate-master")
        .join(file)
}

fn check(file: &Path) -> std::process::Output {
    Command::new(bin())
        .arg("check-config")
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .expect("run saltgate-master check-config")
}

#[test]
fn check_config_accepts_the_packaged_file_and_names_the_bad_key() {
    let o = check(&packaged("master"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("configuration valid"), "{err}");
    assert!(err.contains("/etc/saltgate/pki/master"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("master");
    std::fs::write(&bad, "interface: 127.0.0.1\nret_port: many\n").unwrap();
    let o = check(&bad);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("ret_port") && err.contains(":2:"), "{err}");

    // Without a FILE, the --config file is checked.
    let o = Command::new(bin())
        .arg("-c")
        .arg(&bad)
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let o = Command::new(bin())
        .arg("-c")
        .arg(dir.path().join("absent"))
        .arg("check-config")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("absent"), "{err}");
}

#[test]
fn version_names_the_commit() {
    let o = Command::new(bin()).arg("--version").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        out.starts_with(&format!(
            "saltgate-master {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );
}

#[test]
fn ready_once_serving_stopping_at_sigterm_and_plain_logs() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_master_config(dir.path(), "127.0.1.41", "");
    let notify = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let log = dir.path().join("master.log");
    let mut cmd = Command::new(bin());
    cmd.arg("-c")
        .arg(&config)
        .arg("run")
        .env("NOTIFY_SOCKET", &notify)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let guard = ProcGuard::spawn("saltgate-master", cmd);
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 within 120 s");
    assert_eq!(&buf[..n], b"READY=1");
    // READY means serving: the ret port named in the log's ready line accepts now.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file:\n{text}"
    );
    let ret: std::net::SocketAddr = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ret="))
        .unwrap_or_else(|| panic!("no ret= in the log:\n{text}"))
        .parse()
        .unwrap();
    std::net::TcpStream::connect(ret).expect("the ret port accepts once READY=1 is sent");

    guard.signal_group("-TERM");
    let n = sock.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    assert_eq!(&buf[..n], b"STOPPING=1");
}
