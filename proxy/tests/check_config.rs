//! Issue 12 item 7 through the binary: `saltgate check-config` prints every error of a file in one
//! run, in YAML (the issue's own example: `health.rise: invalid` used to hide `interval: 60`,
//! `weight: abc` and `retries: -3`) and in HAProxy files (an unsupported directive used to hide
//! the checks after it). Nothing listens: no address is used.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// `check-config [extra] FILE` on `text`; (exit code, stderr, the file's path).
fn check(extra: &[&str], name: &str, text: &str) -> (Option<i32>, String, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .args(extra)
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path,
    )
}

#[test]
fn every_wrong_type_in_a_yaml_file_is_printed_in_one_run() {
    let text =
        "health:\n  rise: invalid\n  interval: 60\nmasters:\n  - name: a\n    host: 127.0.0.2\n\
                \x20   weight: abc\nlisteners:\n  publish:\n    bind: 127.0.0.1:4505\n  request:\n\
                \x20   bind: 127.0.0.1:4506\n    retries: -3\n";
    let (code, err, path) = check(&[], "saltgate.yaml", text);
    assert_eq!(code, Some(1), "{err}");
    let p = path.display();
    for (line, field) in [
        (2, "health.rise"),
        (3, "health.interval"),
        (7, "masters[0].weight"),
        (13, "listeners.request.retries"),
    ] {
        assert!(
            err.contains(&format!("{p}:{line}:")) && err.contains(&format!(": {field}: ")),
            "{field} (line {line}) missing:\n{err}"
        );
    }
}

#[test]
fn an_unsupported_haproxy_directive_does_not_hide_the_errors_after_it() {
    let text = std::fs::read_to_string(repo("examples/haproxy/salt-master-cluster.cfg"))
        .unwrap()
        .replacen(
            "balance roundrobin",
            "balance roundrobin\n    tcp-request connection reject",
            1,
        )
        .replace("timeout client 1m", "timeout client 1x");
    let (code, err, _) = check(&["--haproxy"], "haproxy.cfg", &text);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("tcp-request"), "the directive missing:\n{err}");
    assert!(
        err.contains("timeout client"),
        "the later error missing:\n{err}"
    );
}
