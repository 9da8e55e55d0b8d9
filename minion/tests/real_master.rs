//! Our minion against a real salt-master 3008.5 on 127.0.2.1: the key waits pending until
//! `salt-key -a` accepts it, then the real `salt` CLI's jobs are answered correctly.

mod common;

use std::time::Duration;

use common::{start_minion, tempdir, wait_for, Master};
use serde_json::json;

const IP: &str = "127.0.2.1";

#[test]
fn real_master_accepts_our_key_and_its_cli_gets_correct_answers() {
    let tmp = tempdir();
    let mut master = Master::start(IP, &tmp.path().join("master"), "");
    master.wait_ready();
    let id = "sg-minion-1";
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster: {IP}:{}\npki_dir: {}/pki\nacceptance_wait_time: 1\n\
             log_level: info\n",
            master.ret_port,
            mdir.display()
        ),
    );
    master.accept_when_pending(id);
    // The minion asks again after acceptance_wait_time and then answers jobs.
    let ping = wait_for(Duration::from_secs(60), "test.ping answered", || {
        let v = master.salt(5, &[id, "test.ping"]);
        (v == json!({ id: true })).then_some(v)
    });
    assert_eq!(ping, json!({ id: true }));
    // Once connected it fired Salt's start event, and the real master answered it.
    wait_for(Duration::from_secs(30), "start event answered", || {
        let log = std::fs::read_to_string(mdir.join("minion.log")).unwrap_or_default();
        log.contains("start event delivered").then_some(())
    });
    assert!(
        mdir.join("pki/minion_master.pub").exists(),
        "master key cached"
    );
    assert!(mdir.join("pki/minion.pem").exists(), "key pair created");

    assert_eq!(
        master.salt(10, &[id, "test.echo", "hello world"]),
        json!({ id: "hello world" })
    );
    assert_eq!(
        master.salt(10, &[id, "cmd.run", "echo hi"]),
        json!({ id: "hi" })
    );
    assert_eq!(
        master.salt(10, &[id, "grains.get", "id"]),
        json!({ id: id })
    );
    // Targeting: list and pcre reach us, a glob for another id does not.
    assert_eq!(
        master.salt(10, &["-L", &format!("other,{id}"), "test.ping"]),
        json!({ id: true })
    );
    assert_eq!(
        master.salt(10, &["-E", "sg-min.*", "test.ping"]),
        json!({ id: true })
    );
    let nobody = master.salt(3, &["nobody-*", "test.ping"]);
    assert!(
        nobody.get(id).is_none(),
        "a job for other ids must not be answered: {nobody}"
    );
    // stderr is merged and the retcode is kept, as Salt's cmd.run does.
    let v = master.salt(10, &[id, "cmd.run", "echo out; echo err >&2; exit 3"]);
    assert_eq!(v, json!({ id: "out\nerr" }));
    // Unknown functions get Salt's answer.
    assert_eq!(
        master.salt(10, &[id, "nope.nothing"]),
        json!({ id: "'nope.nothing' is not available." })
    );
    // test.arg sees positional and keyword arguments.
    let v = master.salt(10, &[id, "test.arg", "a1", "k=v"]);
    assert_eq!(v[id]["args"], json!(["a1"]), "{v}");
    assert_eq!(v[id]["kwargs"]["k"], json!("v"), "{v}");
}
