//! What the Debian package and its systemd unit rely on: `check-config` (exit 0 valid, 1 invalid
//! naming the key), `--version` with the commit, `Type=notify` (READY=1 once the minion runs),
//! and logs without colour codes when stderr is not a terminal.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate-minion");

fn packaged(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/saltgate-minion")
        .join(file)
}

fn check(file: &Path) -> std::process::Output {
    Command::new(BIN)
        .arg("check-config")
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .expect("run saltgate-minion check-config")
}

#[test]
fn check_config_accepts_the_packaged_file_and_names_the_bad_key() {
    let o = check(&packaged("minion"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("configuration valid"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("minion");
    std::fs::write(&bad, "master: 127.0.0.1\nmaster_port: zero\n").unwrap();
    let o = check(&bad);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("master_port") && err.contains(":2:"), "{err}");

    let o = check(&dir.path().join("absent"));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("absent"));
}

#[test]
fn version_names_the_commit() {
    let o = Command::new(BIN).arg("--version").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        out.starts_with(&format!(
            "saltgate-minion {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );
}

#[test]
fn ready_once_running_and_plain_logs_in_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A master that never answers: a bound listener that is never accepted from. The minion is
    // READY anyway (it connects and retries by itself), and its log is written.
    let quiet = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = quiet.local_addr().unwrap().port();
    std::fs::create_dir_all(d.join("pki")).unwrap();
    std::fs::write(
        d.join("pki/minion.pem"),
        saltgate_test_support::openssl_pem(),
    )
    .unwrap();
    let conf = d.join("minion");
    std::fs::write(
        &conf,
        format!(
            "id: sg-service-test\nmaster: 127.0.0.1\nmaster_port: {port}\npki_dir: {}/pki\n\
             auth_timeout: 1\nunknown_saltgate_key: 1\n",
            d.display()
        ),
    )
    .unwrap();
    let notify = d.join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let log = d.join("minion.log");
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--config")
        .arg(&conf)
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let _guard = saltgate_test_support::ProcGuard::spawn("saltgate-minion", cmd);
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 within 60 s");
    assert_eq!(&buf[..n], b"READY=1");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("minion starting"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file:\n{text}"
    );
}
