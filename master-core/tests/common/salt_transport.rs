//! The stock-minion side of the transport tests (real_minion_tcp.rs, real_minion_ws.rs): a test
//! CA made at run time, Salt's `ssl` blocks, and two stock `salt-minion` 3008.5s on one
//! transport against a `saltgate-master` on the same.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use super::*;

pub fn publish(config: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["publish", "--out", "json", "--timeout", "10"];
    all.extend_from_slice(args);
    cli(config, &all)
}

/// A CA, a certificate for the master at `ip`, and one per minion id, in `dir`.
pub fn make_pki(dir: &Path, ip: &str, ids: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for name in std::iter::once(ip).chain(ids.iter().copied()) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// The `ssl` block of a config for the certificate `name` in `pki`.
pub fn ssl_block(pki: &Path, name: &str) -> String {
    let p = pki.display();
    format!(
        "ssl:\n  certfile: {p}/{name}.pem\n  keyfile: {p}/{name}.key\n  ca_certs: {p}/ca.pem\n  \
         cert_reqs: CERT_REQUIRED\n"
    )
}

/// Runs two stock minions on `transport` (with `ssl` from `pki` when given) against a
/// saltgate-master on the same transport at `ip`: keys pending → accepted → `test.ping` and
/// `cmd.run` answered; a job aimed at a list naming one of them answered by it alone, and queued
/// on `list_queued` publish connections (tcp: 1, the one that said its id; ws: 2, Salt's ws
/// publisher sends to every connection and the minions filter).
pub fn two_stock_minions(transport: &str, ip: &str, pki: Option<&Path>, list_queued: usize) {
    let _venv = venv();
    let dir = tempfile::Builder::new()
        .prefix(&format!("sgm{transport}"))
        .tempdir_in("/tmp")
        .unwrap();
    let a = format!("sg-{transport}-a");
    let b = format!("sg-{transport}-b");
    let ids = [a.as_str(), b.as_str()];
    let master_extra = match pki {
        None => format!("transport: {transport}\n"),
        Some(pki) => format!(
            "transport: {transport}\ndisable_aes_with_tls: True\n{}",
            ssl_block(pki, ip)
        ),
    };
    let config = write_master_config(dir.path(), ip, &master_extra);
    let master = start_master(&config, &dir.path().join("master.log"));
    let mut minions = Vec::new();
    let mut confs: Vec<PathBuf> = Vec::new();
    for id in ids {
        let conf =
            write_minion_config(dir.path(), id, ip, master.ret.port(), master.publish.port());
        let mut extra = format!("transport: {transport}\n");
        if let Some(pki) = pki {
            extra.push_str(&ssl_block(pki, id));
        }
        let file = conf.join("minion");
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("{text}{extra}")).unwrap();
        minions.push(start_salt_minion(
            &conf,
            &dir.path().join(format!("{id}.stderr")),
        ));
        confs.push(conf);
    }
    let logs = || {
        let mut s = format!(
            "--- master log\n{}",
            std::fs::read_to_string(&master.log).unwrap_or_default()
        );
        for id in ids {
            s.push_str(&format!(
                "\n--- {id} log\n{}",
                std::fs::read_to_string(dir.path().join(id).join("minion.log")).unwrap_or_default()
            ));
        }
        s
    };

    let pending = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(120), "both keys pending", || {
            let l = stdout_json(&cli(&config, &["key", "list", "--out", "json"]));
            (l["minions_pre"] == json!(ids)).then_some(())
        })
    });
    pending.unwrap_or_else(|_| panic!("keys not pending\n{}", logs()));
    for id in ids {
        let o = cli(&config, &["key", "accept", id]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let answered = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(120), "both answer test.ping", || {
            let o = publish(&config, &["*", "test.ping"]);
            (o.status.success() && stdout_json(&o) == json!({ids[0]: true, ids[1]: true}))
                .then_some(())
        })
    });
    answered.unwrap_or_else(|_| panic!("test.ping not answered\n{}", logs()));

    let published = |args: &[&str]| {
        let o = publish(&config, args);
        assert!(
            o.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&o.stderr),
            logs()
        );
        stdout_json(&o)
    };
    let said = format!("hi over {transport}");
    let o = published(&[ids[0], "cmd.run", &format!("echo {said}")]);
    assert_eq!(o, json!({ ids[0]: said }));

    // A list naming one minion: answered by it alone.
    let list = format!("{},other", ids[1]);
    let o = published(&["--tgt-type", "list", &list, "test.ping"]);
    assert_eq!(o, json!({ ids[1]: true }));
    let log = std::fs::read_to_string(&master.log).unwrap();
    let ready = log.lines().find(|l| l.contains("saltgate-master ready"));
    let ready = ready.expect("the ready line");
    assert!(ready.contains(&format!("transport={transport}")), "{ready}");
    assert!(ready.contains(&format!("tls={}", pki.is_some())), "{ready}");
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("published") && l.contains(&format!("tgt={list}")))
        .unwrap_or_else(|| panic!("no publish logged for {list}\n{}", logs()));
    assert!(line.contains(&format!("queued={list_queued} ")), "{line}");
    let all = log
        .lines()
        .rev()
        .find(|l| l.contains("published") && l.contains("tgt=*"))
        .expect("a publish to * logged");
    assert!(all.contains("queued=2 "), "{all}");
    drop(minions);
}

/// [`two_stock_minions`] over TLS with a required client certificate: a test CA and the
/// master's and minions' certificates are made at run time in a temporary directory.
pub fn two_stock_minions_over_tls(transport: &str, ip: &str, list_queued: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let pki = tmp.path().join("tls");
    make_pki(
        &pki,
        ip,
        &[&format!("sg-{transport}-a"), &format!("sg-{transport}-b")],
    );
    two_stock_minions(transport, ip, Some(&pki), list_queued);
}
