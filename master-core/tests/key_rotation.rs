//! Publish-key rotation with stock `salt-minion` 3008.5 processes (127.0.1.60): deleting a
//! minion's key — with `saltgate-master key delete` or with the real `salt-key -d` on the same
//! directories — rotates the publish key; the minions that remain re-authenticate on the next
//! publish and answer it, the removed ones cannot decrypt it, never run it, and fall back to
//! pending when they re-authenticate.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;

const IP: &str = "127.0.1.60";
const KEEP: &str = "sg-rot-keep";
const GONE: &str = "sg-rot-gone";
const GONE2: &str = "sg-rot-gone2";

fn publish(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["publish", "--out", "json", "--timeout", "20"];
    all.extend_from_slice(args);
    cli(config, &all)
}

fn rotations(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("publish key rotated")
        .count()
}

#[test]
fn a_deleted_minion_cannot_read_publishes_after_the_key_rotates() {
    let dir = tempfile::Builder::new()
        .prefix("sgrot")
        .tempdir_in("/tmp")
        .unwrap();
    let d = dir.path();
    let config = write_master_config(d, IP, "");
    let master = start_master(&config, &d.join("master.log"));
    let _minions: Vec<_> = [KEEP, GONE, GONE2]
        .iter()
        .map(|id| {
            let conf = write_minion_config(d, id, IP, master.ret.port(), master.publish.port());
            start_salt_minion(&conf, &d.join(format!("{id}.stderr")))
        })
        .collect();
    let logs = || {
        let mut s = format!(
            "--- master log\n{}",
            std::fs::read_to_string(&master.log).unwrap_or_default()
        );
        for id in [KEEP, GONE, GONE2] {
            s += &format!(
                "\n--- {id}\n{}",
                std::fs::read_to_string(d.join(id).join("minion.log")).unwrap_or_default()
            );
        }
        s
    };
    let keys = || stdout_json(&cli(&config, &["key", "list", "--out", "json"]));

    let pending = || -> BTreeSet<String> {
        serde_json::from_value(keys()["minions_pre"].clone()).unwrap_or_default()
    };
    let all3: BTreeSet<String> = [KEEP, GONE, GONE2].map(String::from).into();
    std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(120), "three pending keys", || {
            (pending() == all3).then_some(())
        })
    })
    .unwrap_or_else(|_| panic!("keys never pending\n{}", logs()));
    let o = cli(&config, &["key", "accept", "--all"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(120), "all three to answer", || {
            let o = publish(&config, &["*", "test.ping"]);
            o.status.success().then_some(())
        })
    })
    .unwrap_or_else(|_| panic!("minions never answered\n{}", logs()));
    assert_eq!(rotations(&master.log), 0, "nothing rotates the key yet");

    // 1. Our CLI deletes GONE: the running master rotates the key.
    let o = cli(&config, &["key", "delete", GONE]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_for(Duration::from_secs(30), "the key to rotate", || {
        (rotations(&master.log) == 1).then_some(())
    });
    assert!(!d.join("cache/.dfn").exists(), "the request is consumed");

    // 2. The real salt-key deletes GONE2 on the same directories: rotated again.
    let o = Command::new(venv().join("bin/salt-key"))
        .arg("-c")
        .arg(config.parent().unwrap())
        .args(["-d", GONE2, "-y"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_for(
        Duration::from_secs(30),
        "salt-key's request to rotate the key",
        || (rotations(&master.log) == 2).then_some(()),
    );

    // 3. A job for everyone: KEEP re-authenticates, decrypts and answers; the removed two
    //    cannot decrypt it, re-authenticate, and are pending again without having run it.
    let ran = d.join("ran.log");
    let cmd = format!("echo ran >> {}", ran.display());
    let o = publish(&config, &["*", "cmd.run", &cmd]);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        logs()
    );
    assert_eq!(stdout_json(&o), json!({ KEEP: "" }));
    std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(60),
            "the removed minions to be pending",
            || {
                let pre = pending();
                (pre.contains(GONE) && pre.contains(GONE2)).then_some(())
            },
        )
    })
    .unwrap_or_else(|_| panic!("removed minions never re-authenticated\n{}", logs()));
    assert_eq!(
        std::fs::read_to_string(&ran).unwrap(),
        "ran\n",
        "only the minion that kept its key ran the job\n{}",
        logs()
    );
    assert_eq!(keys()["minions"], json!([KEEP]));
}
