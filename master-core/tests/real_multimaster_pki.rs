//! MultiMaster-PKI with a stock `salt-minion` 3008.5 (issue 28), on 127.28.1.0/24.
//!
//! * Two saltgate-masters with different master keys and one signing pair: A signs at `_auth`
//!   time with the `master_sign.pem` it created, B serves a signature file made by
//!   `saltgate-master key gen-signature` from a copy of that pair (`master_use_pubkey_signature`).
//!   A stock minion with `verify_master_pubkey_sign: True` and `master_type: failover` answers
//!   `test.ping` through A; A is killed; the minion verifies B's other key by its signature,
//!   takes it, and answers through B.
//! * A stock minion holding a `master_sign.pub` that did not sign the master's key refuses it.
//!
//! Real Salt is heavy: run under `flock /tmp/heavy.lock`.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;

/// Ports free on every one of `ips` (Salt's failover list shares one master_port/publish_port).
fn shared_ports(ips: &[&str]) -> (u16, u16) {
    let mut got = Vec::new();
    'search: while got.len() < 2 {
        let l = TcpListener::bind((ips[0], 0)).unwrap();
        let p = l.local_addr().unwrap().port();
        let mut held = vec![l];
        for ip in &ips[1..] {
            match TcpListener::bind((*ip, p)) {
                Ok(l) => held.push(l),
                Err(_) => continue 'search,
            }
        }
        if !got.contains(&p) {
            got.push(p);
        }
    }
    (got[0], got[1])
}

/// A saltgate-master config in `dir` on `ip` with fixed ports, auto_accept and `extra`.
fn master_config(dir: &Path, ip: &str, id: &str, ports: (u16, u16), extra: &str) -> PathBuf {
    let path = write_master_config(dir, ip, &format!("auto_accept: True\n{extra}"));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("id: sg-test-master", &format!("id: {id}"))
        .replace("publish_port: 0", &format!("publish_port: {}", ports.0))
        .replace("ret_port: 0", &format!("ret_port: {}", ports.1));
    std::fs::write(&path, text).unwrap();
    path
}

/// A stock minion config: `masters` (one, or a failover list), the signing key's public half
/// in its pki_dir, Salt's timeouts shortened.
fn minion_config(
    dir: &Path,
    id: &str,
    masters: &[&str],
    ports: (u16, u16),
    sign_pub: &str,
) -> PathBuf {
    let m = dir.join(id);
    std::fs::create_dir_all(m.join("pki")).unwrap();
    std::fs::write(m.join("pki/master_sign.pub"), sign_pub).unwrap();
    let conf = dir.join(format!("{id}-conf"));
    std::fs::create_dir_all(&conf).unwrap();
    let master = if masters.len() > 1 {
        format!(
            "[{}]\nmaster_type: failover\nretry_dns: 0",
            masters.join(", ")
        )
    } else {
        masters[0].to_string()
    };
    let m = m.display();
    std::fs::write(
        conf.join("minion"),
        format!(
            "id: {id}\nmaster: {master}\nmaster_port: {ret}\npublish_port: {publ}\n\
             verify_master_pubkey_sign: True\nmaster_alive_interval: 1\n\
             user: root\npki_dir: {m}/pki\ncachedir: {m}/cache\n\
             sock_dir: {m}/sock\npidfile: {m}/minion.pid\n\
             log_file: {m}/minion.log\nlog_level_logfile: debug\n\
             acceptance_wait_time: 1\nacceptance_wait_time_max: 1\nrandom_reauth_delay: 1\n\
             auth_timeout: 3\nauth_tries: 1\nmaster_tries: -1\nmultiprocessing: False\n",
            publ = ports.0,
            ret = ports.1,
        ),
    )
    .unwrap();
    conf
}

fn ping(config: &Path, id: &str) -> Option<serde_json::Value> {
    let o = cli(
        config,
        &[
            "publish",
            "--out",
            "json",
            "--timeout",
            "3",
            id,
            "test.ping",
        ],
    );
    o.status.success().then(|| stdout_json(&o))
}

fn openssl_pub(pem: &Path, out: &Path) {
    let st = Command::new("openssl")
        .args(["rsa", "-pubout", "-in"])
        .arg(pem)
        .arg("-out")
        .arg(out)
        .status()
        .expect("openssl rsa");
    assert!(st.success());
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn stock_failover_minion_verifies_signed_masters_and_moves_to_the_second() {
    let _ = venv();
    let (ip_a, ip_b) = ("127.28.1.1", "127.28.1.2");
    let dir = tempfile::Builder::new()
        .prefix("sgpki")
        .tempdir_in("/tmp")
        .unwrap();
    let ports = shared_ports(&[ip_a, ip_b]);
    // A: signs at auth time; creates master_sign.pem/.pub on start.
    let conf_a = master_config(
        &dir.path().join("a"),
        ip_a,
        "sg-mm-a",
        ports,
        "master_sign_pubkey: True\n",
    );
    let mut a = start_master(&conf_a, &dir.path().join("a/master.log"));
    let a_pki = dir.path().join("a/pki");
    assert!(a_pki.join("master_sign.pem").exists(), "{}", read(&a.log));
    let sign_pub = read(&a_pki.join("master_sign.pub"));

    // B: another master key, the same signing pair (copied, as Salt's tutorial says), and a
    // pre-computed signature made with `key gen-signature`.
    let b_dir = dir.path().join("b");
    let conf_b = master_config(
        &b_dir,
        ip_b,
        "sg-mm-b",
        ports,
        "master_sign_pubkey: True\nmaster_use_pubkey_signature: True\n",
    );
    for f in ["master_sign.pem", "master_sign.pub"] {
        std::fs::copy(a_pki.join(f), b_dir.join("pki").join(f)).unwrap();
    }
    openssl_pub(&b_dir.join("pki/master.pem"), &b_dir.join("pki/master.pub"));
    let o = cli(&conf_b, &["key", "gen-signature"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sig_file = b_dir.join("pki/sg-mm-b_pubkey_signature");
    assert!(sig_file.exists(), "{}", String::from_utf8_lossy(&o.stdout));
    let o = cli(&conf_b, &["key", "gen-signature"]);
    assert!(!o.status.success(), "an existing signature is not replaced");
    let b = start_master(&conf_b, &b_dir.join("master.log"));

    let id = "sg-pki-failover";
    let conf = minion_config(dir.path(), id, &[ip_a, ip_b], ports, &sign_pub);
    let _minion = start_salt_minion(&conf, &dir.path().join("minion.stderr"));
    let mlog = dir.path().join(id).join("minion.log");
    let logs = |a: &Path| {
        format!(
            "--- master\n{}\n--- minion\n{}",
            read(a),
            read(&mlog)
                .lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    let first = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(60), "test.ping through A", || {
            ping(&conf_a, id).filter(|v| *v == json!({ id: true }))
        })
    });
    first.unwrap_or_else(|_| panic!("no answer through A\n{}", logs(&a.log)));
    assert!(
        read(&mlog).contains("Received signed and verified master pubkey"),
        "{}",
        logs(&a.log)
    );
    assert_eq!(
        read(&dir.path().join(id).join("pki/minion_master.pub")).trim(),
        read(&a_pki.join("master.pub")).trim()
    );

    // A dies: the minion moves to B, whose other key it takes on the strength of its signature.
    a.guard.signal_group("-KILL");
    let _ = a.guard.child.wait();
    let second = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(60), "test.ping through B", || {
            ping(&conf_b, id).filter(|v| *v == json!({ id: true }))
        })
    });
    second.unwrap_or_else(|_| panic!("no answer through B\n{}", logs(&b.log)));
    assert_eq!(
        read(&dir.path().join(id).join("pki/minion_master.pub")).trim(),
        read(&b_dir.join("pki/master.pub")).trim(),
        "the minion now trusts B's key"
    );
}

#[test]
fn stock_minion_refuses_a_master_signed_by_another_key() {
    let _ = venv();
    let ip = "127.28.1.3";
    let dir = tempfile::Builder::new()
        .prefix("sgpki")
        .tempdir_in("/tmp")
        .unwrap();
    let ports = shared_ports(&[ip]);
    let conf_m = master_config(
        &dir.path().join("m"),
        ip,
        "sg-mm-c",
        ports,
        "master_sign_pubkey: True\n",
    );
    let master = start_master(&conf_m, &dir.path().join("m/master.log"));
    // The minion trusts another signing key.
    let other = dir.path().join("other.pem");
    std::fs::write(&other, openssl_pem()).unwrap();
    openssl_pub(&other, &dir.path().join("other.pub"));
    let id = "sg-pki-wrongkey";
    let conf = minion_config(
        dir.path(),
        id,
        &[ip],
        ports,
        &read(&dir.path().join("other.pub")),
    );
    let _minion = start_salt_minion(&conf, &dir.path().join("minion.stderr"));
    let mlog = dir.path().join(id).join("minion.log");
    let refused = std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(60),
            "the minion to refuse the master",
            || {
                read(&mlog)
                    .contains("but signature verification failed")
                    .then_some(())
            },
        )
    });
    refused.unwrap_or_else(|_| {
        panic!(
            "no refusal in the minion log\n{}\n--- master\n{}",
            read(&mlog),
            read(&master.log)
        )
    });
    assert!(
        !dir.path().join(id).join("pki/minion_master.pub").exists(),
        "a refused master key is never cached"
    );
    assert!(
        ping(&conf_m, id).and_then(|v| v.get(id).cloned()).is_none(),
        "a minion that refused its master answers nothing"
    );
}

/// `key gen-signature --auto-create` on a fresh `pki_dir`: the file it writes is what Salt's own
/// `salt.crypt.verify_signature` (the venv's Python) accepts for that master key, and refuses
/// for another.
#[test]
fn gen_signature_output_verifies_with_salts_own_python() {
    let venv = venv();
    let dir = tempfile::Builder::new()
        .prefix("sgpki")
        .tempdir_in("/tmp")
        .unwrap();
    let conf = master_config(&dir.path().join("m"), "127.28.1.4", "sg-mm-d", (0, 0), "");
    let pki = dir.path().join("m/pki");
    openssl_pub(&pki.join("master.pem"), &pki.join("master.pub"));
    let o = cli(&conf, &["key", "gen-signature"]);
    assert!(!o.status.success(), "no signing key without --auto-create");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--auto-create"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = cli(
        &conf,
        &["key", "gen-signature", "--auto-create", "--signature-path"],
    );
    assert!(!o.status.success(), "--signature-path needs a value");
    let out = dir.path().join("sigs");
    let o = Command::new(common::bin())
        .arg("-c")
        .arg(&conf)
        .args(["key", "gen-signature", "--auto-create", "--signature-path"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sig = out.join("sg-mm-d_pubkey_signature");
    assert!(sig.exists() && pki.join("master_sign.pub").exists());
    let other = dir.path().join("other.pem");
    std::fs::write(&other, openssl_pem()).unwrap();
    openssl_pub(&other, &dir.path().join("other.pub"));
    let check = |pub_file: &Path| -> String {
        let o = Command::new(venv.join("bin/python"))
            .arg("-c")
            .arg(
                "import sys, binascii, salt.crypt as c\n\
                 msg = c.clean_key(open(sys.argv[2]).read())\n\
                 sig = binascii.a2b_base64(open(sys.argv[3], 'rb').read())\n\
                 print(c.verify_signature(sys.argv[1], msg, sig))",
            )
            .arg(pki.join("master_sign.pub"))
            .arg(pub_file)
            .arg(&sig)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(check(&pki.join("master.pub")), "True");
    assert_eq!(check(&dir.path().join("other.pub")), "False");
}
