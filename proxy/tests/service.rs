//! What the Debian package relies on: `--version` with the commit, and `gen-docs` writing the man
//! pages and shell completions from the command line's definition.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");

#[test]
fn version_names_the_commit() {
    let o = Command::new(BIN).arg("--version").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    let rest = out
        .strip_prefix(&format!("saltgate {} (commit ", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("{out}"));
    let commit = rest.trim_end().trim_end_matches(')');
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{out}"
    );
}

#[test]
fn gen_docs_writes_a_man_page_per_command_and_both_completions() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .arg("gen-docs")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let man = |name: &str| std::fs::read_to_string(dir.path().join("man").join(name));
    let top = man("saltgate.1").unwrap();
    assert!(top.contains(".TH saltgate 1"), "{top}");
    assert!(top.contains("check\\-config"), "{top}");
    let check = man("saltgate-check-config.1").unwrap();
    assert!(check.contains("exit 0 valid, 1 invalid"), "{check}");
    assert!(man("saltgate-ctl-drain.1").is_ok());
    // The hidden command documents nothing.
    assert!(man("saltgate-gen-docs.1").is_err());
    assert!(!top.contains("gen\\-docs"), "{top}");
    let bash = std::fs::read_to_string(dir.path().join("completions/saltgate.bash")).unwrap();
    assert!(
        bash.contains("complete -F") && bash.contains("check-config"),
        "{bash}"
    );
    let zsh = std::fs::read_to_string(dir.path().join("completions/_saltgate")).unwrap();
    assert!(zsh.starts_with("#compdef saltgate"), "{zsh}");

    let o = Command::new(BIN)
        .arg("gen-docs")
        .arg("/proc/no-such-dir")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/proc/no-such-dir"));
}
