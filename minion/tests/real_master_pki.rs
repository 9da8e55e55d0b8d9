//! MultiMaster-PKI against real salt-master 3008.5 (issue 28), on 127.28.2.0/24: two stock
//! masters with `master_sign_pubkey: True`, each with the signing pair it generated. Our minion
//! (`master_type: failover`, `verify_master_pubkey_sign: True`) holds the second master's
//! `master_sign.pub`: it refuses the first master (its key is signed by another pair) with a
//! clear error, moves to the second, and answers its CLI.
//!
//! Real Salt is heavy: run under `flock /tmp/heavy.lock`.

mod common;

use std::time::Duration;

use common::{start_minion, tempdir, wait_for, Master};
use serde_json::json;

#[test]
fn our_minion_refuses_a_wrongly_signed_master_and_fails_over_to_the_signed_one() {
    let tmp = tempdir();
    let (ip1, ip2) = ("127.28.2.1", "127.28.2.2");
    let extra = "master_sign_pubkey: True\nauto_accept: True\n";
    let mut m1 = Master::start(ip1, &tmp.path().join("m1"), extra);
    let mut m2 = Master::start(ip2, &tmp.path().join("m2"), extra);
    m1.wait_ready();
    m2.wait_ready();
    let trusted = m2.dir.join("pki/master_sign.pub");
    wait_for(Duration::from_secs(30), "the master's signing pair", || {
        trusted.exists().then_some(())
    });
    let id = "sg-pki-minion";
    let mdir = tmp.path().join("minion");
    std::fs::create_dir_all(mdir.join("pki")).unwrap();
    std::fs::copy(&trusted, mdir.join("pki/master_sign.pub")).unwrap();
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster:\n  - {ip1}:{}\n  - {ip2}:{}\nmaster_type: failover\n\
             verify_master_pubkey_sign: True\nmaster_sign_key_name: master_sign\n\
             pki_dir: {}/pki\nacceptance_wait_time: 1\nauth_timeout: 3\n",
            m1.ret_port,
            m2.ret_port,
            mdir.display()
        ),
    );
    let log = || std::fs::read_to_string(mdir.join("minion.log")).unwrap_or_default();
    let answered = std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(60),
            "test.ping through master 2",
            || {
                let v = m2.salt(3, &[id, "test.ping"]);
                (v == json!({ id: true })).then_some(v)
            },
        )
    });
    answered.unwrap_or_else(|_| panic!("no answer\n{}\n{}", log(), m2.logs()));
    let text = log();
    assert!(
        text.contains("does not verify with") && text.contains(&ip1.to_string()),
        "the refusal of master 1 is logged with its reason:\n{text}"
    );
    assert!(
        !text.contains("unknown option"),
        "master_sign_key_name and verify_master_pubkey_sign are known options:\n{text}"
    );
    // The key we trust is master 2's.
    let cached = std::fs::read_to_string(mdir.join("pki/minion_master.pub")).unwrap();
    let m2_pub = std::fs::read_to_string(m2.dir.join("pki/master.pub")).unwrap();
    assert_eq!(cached.trim(), m2_pub.trim());
}
