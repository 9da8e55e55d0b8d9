//! A stock `salt-minion` 3008.5 attached to master B of a two-master saltgate cluster
//! (127.0.1.50 and .51, shared cluster_pki_dir and cachedir) answers a job published through
//! master A: it pins the cluster key, decrypts publishes made with the cluster AES key (no
//! serial), and its return travels B → A.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

const MINION: &str = "sg-cluster-minion-1";

#[test]
fn stock_salt_minion_on_one_cluster_member_answers_a_publish_from_another() {
    let venv = venv();
    let root = tempfile::Builder::new()
        .prefix("sgmc")
        .tempdir_in("/tmp")
        .unwrap();
    let r = root.path();
    let d = r.display();
    let cpki = r.join("cpki");
    let (a, b) = start_cluster_pair(r, ["127.0.1.50", "127.0.1.51"]);

    let mconf = r.join("minion-conf");
    std::fs::create_dir_all(&mconf).unwrap();
    std::fs::write(
        mconf.join("minion"),
        format!(
            "id: {MINION}\nmaster: 127.0.1.51\nmaster_port: {}\npublish_port: {}\nuser: root\n\
             pki_dir: {d}/minion/pki\ncachedir: {d}/minion/cache\nsock_dir: {d}/minion/sock\n\
             pidfile: {d}/minion/minion.pid\nlog_file: {d}/minion/minion.log\n\
             log_level_logfile: debug\nacceptance_wait_time: 1\nmultiprocessing: False\n",
            b.ret.port(),
            b.publish.port()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(venv.join("bin/salt-minion"));
    cmd.arg("-c")
        .arg(&mconf)
        .args(["-l", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _minion = ProcGuard::spawn("salt-minion", cmd);
    let logs = || {
        let read = |p: &str| std::fs::read_to_string(r.join(p)).unwrap_or_default();
        format!(
            "--- A\n{}\n--- B\n{}\n--- minion\n{}",
            read("a/master.log"),
            read("b/master.log"),
            read("minion/minion.log")
        )
    };

    // Through A's CLI: the job goes A → B → minion, the return minion → B → A.
    let got = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(180), "a cluster round trip", || {
            let o = cli(
                &a.config,
                &[
                    "publish",
                    "--out",
                    "json",
                    "--timeout",
                    "5",
                    "*",
                    "test.ping",
                ],
            );
            o.status.success().then(|| stdout_json(&o))
        })
    })
    .unwrap_or_else(|_| panic!("no round trip\n{}", logs()));
    assert_eq!(got, json!({ MINION: true }));
    let o = cli(
        &a.config,
        &[
            "publish",
            "--out",
            "json",
            "--timeout",
            "10",
            MINION,
            "cmd.run",
            "echo via-cluster",
        ],
    );
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        logs()
    );
    assert_eq!(stdout_json(&o), json!({ MINION: "via-cluster" }));

    // The minion pinned the cluster key, and its key lives in the cluster PKI dir.
    let pinned = std::fs::read_to_string(r.join("minion/pki/minion_master.pub")).unwrap();
    let cluster_pub = std::fs::read_to_string(cpki.join("cluster.pub")).unwrap();
    assert_eq!(pinned.trim(), cluster_pub.trim());
    assert!(cpki.join("minions").join(MINION).exists());
    let l = stdout_json(&cli(&a.config, &["key", "list", "--out", "json"]));
    assert_eq!(l["minions"], json!([MINION]));
    // `key finger` in a cluster lists the cluster key, the one the minion pinned, with the
    // fingerprint Salt computes for it (what `master_finger` is checked against).
    let salt_finger = Command::new(venv.join("bin/python"))
        .arg("-c")
        .arg("import sys, salt.utils.crypt as c; print(c.pem_finger(path=sys.argv[1]))")
        .arg(r.join("minion/pki/minion_master.pub"))
        .output()
        .unwrap();
    let salt_finger = String::from_utf8(salt_finger.stdout).unwrap();
    let ours = stdout_json(&cli(&a.config, &["key", "finger", "--out", "json"]));
    assert_eq!(
        ours["local"]["cluster.pub"],
        json!(salt_finger.trim()),
        "{ours}"
    );
    assert!(ours["minions"][MINION].is_string(), "{ours}");

    // Publish-key rotation requested of A (Salt's dropfile in the shared cachedir, as salt-key
    // writes it): A writes a new cluster key, B reloads it, and the minion on B re-authenticates
    // with B on the next publish and answers it.
    let aes_before = std::fs::read_to_string(cpki.join(".aes")).unwrap();
    let dfn = r.join("shared-cache/.dfn");
    std::fs::write(&dfn, "sg-master-a").unwrap();
    std::fs::set_permissions(&dfn, std::os::unix::fs::PermissionsExt::from_mode(0o400)).unwrap();
    let said = |p: &str, what: &str| {
        std::fs::read_to_string(r.join(p))
            .unwrap_or_default()
            .contains(what)
    };
    wait_for(
        Duration::from_secs(30),
        "A to rotate and B to reload",
        || {
            (said("a/master.log", "publish key rotated")
                && said("b/master.log", "publish key reloaded"))
            .then_some(())
        },
    );
    assert!(
        !said("b/master.log", "publish key rotated"),
        "only A rotates"
    );
    assert_ne!(
        std::fs::read_to_string(cpki.join(".aes")).unwrap(),
        aes_before
    );
    let o = cli(
        &a.config,
        &[
            "publish",
            "--out",
            "json",
            "--timeout",
            "20",
            MINION,
            "test.echo",
            "after-rotation",
        ],
    );
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        logs()
    );
    assert_eq!(stdout_json(&o), json!({ MINION: "after-rotation" }));
}
