//! A stock `salt-minion` 3008.5 against one `saltgate-master` on 127.0.1.10: key pending →
//! `key accept` → `publish` of test.ping, test.echo and cmd.run answered with Salt's return
//! values; the real `salt-key` on the same PKI dir agrees with `key list`; the job cache holds
//! the jobs and their returns.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;

const IP: &str = "127.0.1.10";
const MINION: &str = "sg-real-minion-1";

fn publish(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["publish", "--out", "json", "--timeout", "8"];
    all.extend_from_slice(args);
    cli(config, &all)
}

#[test]
fn stock_salt_minion_authenticates_takes_jobs_and_returns() {
    let venv = venv();
    let dir = tempfile::Builder::new()
        .prefix("sgm")
        .tempdir_in("/tmp")
        .unwrap();
    let config = write_master_config(
        dir.path(),
        IP,
        &format!("file_roots: {{base: [{}/salt]}}\n", dir.path().display()),
    );
    write_file_roots(dir.path());
    let master = start_master(&config, &dir.path().join("master.log"));
    assert_eq!(master.ret.ip().to_string(), IP);

    std::fs::create_dir_all(dir.path().join("pillar")).unwrap();
    std::fs::write(
        dir.path().join("pillar/top.sls"),
        format!("base:\n  '{MINION}':\n    - app\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("pillar/app.sls"),
        "app:\n  colour: blue\n  port: 8080\n",
    )
    .unwrap();
    let conf = write_minion_config(
        dir.path(),
        MINION,
        IP,
        master.ret.port(),
        master.publish.port(),
    );
    let _minion = start_salt_minion(&conf, &dir.path().join("minion.stderr"));
    let logs = || {
        format!(
            "--- master log\n{}\n--- minion log\n{}",
            std::fs::read_to_string(&master.log).unwrap_or_default(),
            std::fs::read_to_string(dir.path().join(MINION).join("minion.log")).unwrap_or_default()
        )
    };

    // 1. The minion's key shows up as pending.
    let pending = std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(120),
            "the minion key to be pending",
            || {
                let l = stdout_json(&cli(&config, &["key", "list", "--out", "json"]));
                (l["minions_pre"] == json!([MINION])).then_some(l)
            },
        )
    });
    let pending = pending.unwrap_or_else(|_| panic!("no pending key\n{}", logs()));
    assert_eq!(pending["minions"], json!([]));

    // 2. Before acceptance a publish expects nobody and says so.
    let o = publish(&config, &["*", "test.ping"]);
    assert!(
        !o.status.success(),
        "publish with no accepted minion must fail"
    );

    // 3. Accept it; the minion retries `_auth` after acceptance_wait_time and subscribes.
    let o = cli(&config, &["key", "accept", MINION]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = wait_for(Duration::from_secs(120), "test.ping to be answered", || {
        let o = publish(&config, &["*", "test.ping"]);
        o.status.success().then(|| stdout_json(&o))
    });
    assert_eq!(first, json!({ MINION: true }), "{}", logs());

    let o = publish(&config, &[MINION, "test.echo", "hello world"]);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        logs()
    );
    assert_eq!(stdout_json(&o), json!({ MINION: "hello world" }));

    let o = publish(
        &config,
        &[
            "--tgt-type",
            "list",
            &format!("{MINION},other"),
            "cmd.run",
            "echo hi",
        ],
    );
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        logs()
    );
    assert_eq!(stdout_json(&o), json!({ MINION: "hi" }));

    let o = publish(
        &config,
        &["--tgt-type", "pcre", "sg-real-.*", "test.arg", "a1", "k=v"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ret = stdout_json(&o);
    assert_eq!(ret[MINION]["args"], json!(["a1"]), "{ret}");
    assert_eq!(ret[MINION]["kwargs"]["k"], json!("v"), "{ret}");

    // Pillar from pillar_roots, through Salt's signed send_private reply.
    // (3008 masks pillar values in output unless asked not to.)
    let o = publish(&config, &[MINION, "pillar.get", "app", "unmask=True"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ret = stdout_json(&o);
    assert_eq!(
        ret[MINION],
        json!({"colour": "blue", "port": 8080}),
        "{ret}"
    );

    // The file server: state.apply (top.sls, a file.managed from salt://, a cmd.run),
    // cp.get_file of a binary file larger than one chunk, cp.list_master.
    check_file_server(&config, dir.path(), &logs);

    // 4. A target matching no accepted key: nothing expected, non-zero exit.
    let o = publish(&config, &["nobody*", "test.ping"]);
    assert!(!o.status.success());
    assert_eq!(stdout_json(&o), json!({}));

    // 5. The real salt-key on the same PKI dir sees the same state.
    let salt_key = Command::new(venv.join("bin/salt-key"))
        .arg("-c")
        .arg(config.parent().unwrap())
        .args(["-L", "--out", "json"])
        .output()
        .unwrap();
    assert!(
        salt_key.status.success(),
        "{}",
        String::from_utf8_lossy(&salt_key.stderr)
    );
    let ours = stdout_json(&cli(&config, &["key", "list", "--out", "json"]));
    assert_eq!(stdout_json(&salt_key), ours);
    assert_eq!(ours["minions"], json!([MINION]));

    // 5b. `key finger` prints the fingerprints the minion side computes: its own key
    // (`salt-call --local key.finger`, what an operator compares before accepting) and the
    // master's (`key.finger_master`, what `master_finger` is set to).
    let salt_call = |function: &str| {
        let o = Command::new(venv.join("bin/salt-call"))
            .arg("-c")
            .arg(&conf)
            .args(["--local", "--out", "json", function])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        stdout_json(&o)["local"].clone()
    };
    let (minion_finger, master_finger) = (salt_call("key.finger"), salt_call("key.finger_master"));
    assert!(
        minion_finger.as_str().is_some_and(|f| f.len() == 95),
        "{minion_finger}"
    );
    let fingers = stdout_json(&cli(&config, &["key", "finger", MINION, "--out", "json"]));
    assert_eq!(fingers, json!({ "minions": { MINION: minion_finger } }));
    let fingers = stdout_json(&cli(&config, &["key", "finger", "--out", "json"]));
    assert_eq!(fingers["local"]["master.pub"], master_finger, "{fingers}");
    assert_eq!(fingers["minions"][MINION], minion_finger, "{fingers}");
    let text = String::from_utf8(cli(&config, &["key", "finger", "master.pub"]).stdout).unwrap();
    assert_eq!(
        text,
        format!(
            "Local Keys:\nmaster.pub:  {}\n",
            master_finger.as_str().unwrap()
        )
    );

    // An accepted key whose minion never answers: listed as missing, exit 1, the others printed.
    let pki = dir.path().join("pki/minions");
    std::fs::copy(pki.join(MINION), pki.join("sg-ghost-minion")).unwrap();
    let o = cli(&config, &["publish", "--timeout", "3", "*", "test.ping"]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text, format!("{MINION}:\n    true\n"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sg-ghost-minion: Minion did not return. [No response]"),
        "{err}"
    );
    std::fs::remove_file(pki.join("sg-ghost-minion")).unwrap();

    // 6. The job cache has the jobs with their returns.
    let jobs = cli(&config, &["jobs", "list"]);
    let listing = String::from_utf8_lossy(&jobs.stdout).to_string();
    assert!(listing.contains("cmd.run"), "{listing}");
    let jid = listing
        .lines()
        .find(|l| l.contains("test.echo"))
        .and_then(|l| l.split_whitespace().next())
        .expect("test.echo job listed")
        .to_string();
    let shown = stdout_json(&cli(&config, &["jobs", "show", &jid]));
    assert_eq!(shown["returns"][MINION]["return"], json!("hello world"));
    assert_eq!(shown["load"]["minions"], json!([MINION]));
}

/// `file_roots` for the file server checks: a top file, one state and two files, one of them
/// binary (every byte value) and larger than one `_serve_file` chunk (256 KiB).
fn write_file_roots(dir: &std::path::Path) {
    let root = dir.join("salt");
    std::fs::create_dir_all(root.join("files")).unwrap();
    std::fs::write(root.join("top.sls"), "base:\n  '*':\n    - hello\n").unwrap();
    std::fs::write(
        root.join("hello.sls"),
        format!(
            "hello:\n  file.managed:\n    - name: {}/out/hello.txt\n    - source: salt://files/hello.txt\n    - makedirs: True\ngreet:\n  cmd.run:\n    - name: echo state-ran\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::write(root.join("files/hello.txt"), "hello from saltgate-master\n").unwrap();
    let blob: Vec<u8> = (0..1200).flat_map(|_| 0u8..=255).collect();
    std::fs::write(root.join("files/blob.bin"), blob).unwrap();
}

fn check_file_server(config: &std::path::Path, dir: &std::path::Path, logs: &dyn Fn() -> String) {
    let long = |args: &[&str]| {
        let mut all = vec!["publish", "--out", "json", "--timeout", "90", MINION];
        all.extend_from_slice(args);
        let o = cli(config, &all);
        assert!(
            o.status.success(),
            "{args:?}: {}\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            logs()
        );
        stdout_json(&o)[MINION].clone()
    };
    let states = long(&["state.apply"]);
    let states = states
        .as_object()
        .unwrap_or_else(|| panic!("state.apply: {states}"));
    assert_eq!(states.len(), 2, "{states:?}");
    for (id, r) in states {
        assert_eq!(r["result"], json!(true), "{id}: {r}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("out/hello.txt")).unwrap(),
        "hello from saltgate-master\n"
    );
    let dest = dir.join("out/blob.bin");
    let got = long(&[
        "cp.get_file",
        "salt://files/blob.bin",
        &dest.to_string_lossy(),
    ]);
    assert_eq!(got, json!(dest.to_string_lossy()));
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        std::fs::read(dir.join("salt/files/blob.bin")).unwrap(),
        "cp.get_file must copy every byte"
    );
    let listed = long(&["cp.list_master"]);
    assert_eq!(
        listed,
        json!(["files/blob.bin", "files/hello.txt", "hello.sls", "top.sls"])
    );
}
