//! `saltgate-bench authstorm --authstorm-masters 3` end to end: a real salt-master 3008.5 cluster
//! of three members (`bench/src/scenarios/saltcluster.rs`), a small swarm through saltgate with
//! `auth_limit`, then the rotation storm through the cluster. Checks that the cluster starts and
//! every minion authenticates and answers after the rotation, not figures (those are the bench's,
//! on a quiet machine: docs/performance.md). Needs Salt 3008.5 (`SALTGATE_VENV`, as
//! scripts/test.sh sets it) and builds the release binaries as bench/tests/quick.rs does.

use std::process::Command;

#[test]
fn a_three_member_salt_cluster_authenticates_every_minion_through_the_limit_and_after_a_rotation() {
    if std::env::var_os("SALTGATE_VENV").is_none() {
        panic!("SALTGATE_VENV is not set: run scripts/test.sh (it builds the venv with interop/setup.sh)");
    }
    let n = 40;
    let out = tempfile::tempdir().unwrap();
    let res = Command::new(env!("CARGO_BIN_EXE_saltgate-bench"))
        .args(["--json", "--net", "127.39.0", "--out"])
        .arg(out.path())
        .args([
            "--authstorm-masters",
            "3",
            "--authstorm-minions",
            &n.to_string(),
            "--authstorm-ways",
            "limit",
            "--authstorm-cap",
            "90",
            "authstorm",
        ])
        .output()
        .expect("run saltgate-bench");
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        res.status.success(),
        "saltgate-bench authstorm failed:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&res.stdout).expect("JSON on stdout");
    assert_eq!(report["masters"], 3, "{report}");
    assert_eq!(
        report["failures"].as_array().map(Vec::len),
        Some(0),
        "{stderr}"
    );
    let run = &report["runs"][0];
    assert_eq!(run["way"], "saltgate-limit", "{run}");
    assert_eq!(run["authenticated"], n, "{run}\n{stderr}");
    assert!(run["secs_to_all"].is_f64(), "{run}");
    // The gate admitted every minion's `_auth` (at least one each) and never marked a member down.
    assert!(run["gate_admitted"].as_f64() >= Some(n as f64), "{run}");
    assert_eq!(run["downs"], 0, "{run}");
    // Three members' logs: every `_auth` the cluster processed is counted, whichever member.
    assert!(run["auth_processed"].as_u64() >= Some(n as u64), "{run}");
    // The rotation: the key deleted on the first member, the dropfile taken from the shared
    // cachedir, and every minion answered the publish after it.
    let rot = &run["rotation"];
    assert!(rot["secs_to_rotate"].is_f64(), "{run}\n{stderr}");
    assert!(
        rot["returns"].as_u64() >= Some(n as u64 - 1),
        "{run}\n{stderr}"
    );
}
