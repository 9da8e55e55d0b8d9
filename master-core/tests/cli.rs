//! The `key`, `jobs` and `publish` commands without a running master, and config errors.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

const PUB: &str = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
const PUB2: &str = "-----BEGIN PUBLIC KEY-----\nBBBB\n-----END PUBLIC KEY-----\n";
/// `salt.utils.crypt.pem_finger(path=...)` of PUB and PUB2, from Salt 3008.5 itself.
const PUB_FINGER: &str =
    "46:77:94:2d:fa:3e:74:b5:de:a7:48:46:61:a2:48:5b:b7:3b:a4:22:eb:72:d3:11:fd:b3:93:72:c0:19:c6:15";
const PUB2_FINGER: &str =
    "0b:c4:ed:51:5a:e4:0a:64:32:1f:ce:ad:bb:ec:ce:ee:6e:a5:ba:f3:b6:cf:3f:56:6f:05:8c:fc:e5:18:ae:cc";

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn key_commands_work_on_the_pki_dir_like_salt_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_master_config(dir.path(), "127.0.1.30", "");
    let pki = dir.path().join("pki");
    for (sub, id) in [
        ("minions_pre", "p1"),
        ("minions_pre", "p2"),
        ("minions_pre", "p3"),
        ("minions", "a1"),
    ] {
        std::fs::create_dir_all(pki.join(sub)).unwrap();
        std::fs::write(pki.join(sub).join(id), PUB).unwrap();
    }
    let list = || stdout_json(&cli(&config, &["key", "list", "--out", "json"]));
    assert_eq!(list()["minions_pre"], json!(["p1", "p2", "p3"]));

    assert!(cli(&config, &["key", "accept", "p1"]).status.success());
    assert!(cli(&config, &["key", "reject", "p2"]).status.success());
    let l = list();
    assert_eq!(l["minions"], json!(["a1", "p1"]));
    assert_eq!(l["minions_rejected"], json!(["p2"]));

    // Refusals: unknown id, wrong state, unsafe id, nothing named.
    let o = cli(&config, &["key", "accept", "nope"]);
    assert!(
        !o.status.success() && err(&o).contains("no key"),
        "{}",
        err(&o)
    );
    let o = cli(&config, &["key", "accept", "p2"]);
    assert!(
        !o.status.success() && err(&o).contains("rejected"),
        "{}",
        err(&o)
    );
    let o = cli(&config, &["key", "delete", "../pki/minions/a1"]);
    assert!(
        !o.status.success() && err(&o).contains("not allowed"),
        "{}",
        err(&o)
    );
    assert!(pki.join("minions/a1").exists());
    assert!(!cli(&config, &["key", "accept"]).status.success());

    assert!(cli(&config, &["key", "accept", "--all"]).status.success());
    assert_eq!(list()["minions"], json!(["a1", "p1", "p3"]));
    // Fingerprints as `salt-key -F` / `-f GLOB` prints them: Salt's headings in its order, the
    // master's own keys under "Local Keys", statuses with no match left out.
    std::fs::create_dir_all(pki.join("minions_denied")).unwrap();
    std::fs::write(pki.join("minions_denied/a1"), PUB2).unwrap();
    std::fs::write(pki.join("minions_pre/q1"), PUB).unwrap();
    // `key ARGS...`, which must succeed: its stdout.
    let run = |args: &[&str]| {
        let o = cli(&config, &[&["key"], args].concat());
        assert!(o.status.success(), "{args:?}: {}", err(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let finger = |args: &[&str]| run(&[&["finger"], args].concat());
    let (f1, f2) = (PUB_FINGER, PUB2_FINGER);
    assert_eq!(
        finger(&["a1"]),
        format!("Accepted Keys:\na1:  {f1}\nDenied Keys:\na1:  {f2}\n")
    );
    assert_eq!(
        finger(&["a1,p*,q?"]),
        format!(
            "Accepted Keys:\na1:  {f1}\np1:  {f1}\np3:  {f1}\nDenied Keys:\na1:  {f2}\n\
             Unaccepted Keys:\nq1:  {f1}\nRejected Keys:\np2:  {f1}\n"
        )
    );
    assert_eq!(finger(&["nobody*"]), "");
    let all = finger(&[]);
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines[0], "Local Keys:", "{all}");
    // The fixture wrote master.pem only (the master writes master.pub when it first runs).
    let name = "master.pem:  ";
    assert!(
        lines[1].starts_with(name) && lines[1].len() == name.len() + 95,
        "{all}"
    );
    assert!(all.ends_with(&finger(&["a1,p*,q?"])), "{all}");
    let j: serde_json::Value =
        serde_json::from_str(&finger(&["master.*,p1", "--out", "json"])).unwrap();
    assert_eq!(j["minions"], json!({ "p1": f1 }));
    assert_eq!(
        j["local"]["master.pem"].as_str().map(str::len),
        Some(95),
        "{j}"
    );
    assert_eq!(j.as_object().unwrap().len(), 2, "{j}");
    std::fs::remove_file(pki.join("minions_denied/a1")).unwrap();
    std::fs::remove_file(pki.join("minions_pre/q1")).unwrap();

    // Globs, and several names joined by commas, as salt-key -a/-r/-d take them.
    for id in ["g1", "g2", "h1", "h22"] {
        std::fs::write(pki.join("minions_pre").join(id), PUB).unwrap();
    }
    assert_eq!(
        run(&["accept", "g*"]),
        "Key for minion g1 accepted.\nKey for minion g2 accepted.\n"
    );
    assert_eq!(
        run(&["reject", "h?,nomatch"]),
        "Key for minion h1 rejected.\n"
    );
    let o = cli(&config, &["key", "accept", "zz*"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("the key glob \"zz*\" does not match any unaccepted keys"),
        "{}",
        err(&o)
    );
    let l = list();
    assert_eq!(l["minions_pre"], json!(["h22"]));
    assert_eq!(l["minions_rejected"], json!(["h1", "p2"]));
    assert_eq!(
        run(&["delete", "g[12],h1"]),
        "Key for minion g1 deleted.\nKey for minion g2 deleted.\nKey for minion h1 deleted.\n"
    );
    assert!(!cli(&config, &["key", "delete", "g*"]).status.success());
    // An id in two state directories is listed once, in the state Salt reads it in (rejected,
    // then pending, then accepted), as `salt-key -L` lists it.
    for (sub, id) in [
        ("minions_pre", "x0"),
        ("minions_rejected", "x0"),
        ("minions", "x0"),
        ("minions", "x3"),
        ("minions_pre", "x3"),
    ] {
        std::fs::write(pki.join(sub).join(id), PUB).unwrap();
    }
    let l = list();
    assert_eq!(l["minions_rejected"], json!(["p2", "x0"]));
    assert_eq!(l["minions_pre"], json!(["h22", "x3"]));
    assert_eq!(l["minions"], json!(["a1", "p1", "p3"]));
    assert_eq!(
        run(&["delete", "x0,x3"]),
        "Key for minion x0 deleted.\nKey for minion x3 deleted.\n"
    );
    // One failure does not stop the others: x1's pending file is too big to be a key, x2 is
    // rejected all the same, and the failure is named.
    std::fs::write(pki.join("minions_pre/x1"), vec![b'A'; 70_000]).unwrap();
    std::fs::write(pki.join("minions_pre/x2"), PUB).unwrap();
    let o = cli(&config, &["key", "reject", "x*"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "Key for minion x2 rejected.\n"
    );
    assert!(
        err(&o).contains("1 key(s) not rejected: x1:"),
        "{}",
        err(&o)
    );
    assert_eq!(
        run(&["delete", "x*"]),
        "Key for minion x1 deleted.\nKey for minion x2 deleted.\n"
    );
    std::fs::remove_file(pki.join("minions_pre/h22")).unwrap();
    assert!(cli(&config, &["key", "delete", "a1"]).status.success());
    assert!(!cli(&config, &["key", "delete", "a1"]).status.success());
    assert_eq!(list()["minions"], json!(["p1", "p3"]));

    let text = String::from_utf8(cli(&config, &["key", "list"]).stdout).unwrap();
    assert!(
        text.starts_with(
            "Accepted Keys:\np1\np3\nDenied Keys:\nUnaccepted Keys:\nRejected Keys:\np2\n"
        ),
        "{text}"
    );
}

#[test]
fn config_errors_and_a_missing_master_are_reported_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("master");
    std::fs::write(&bad, "id: m\nopen_mode: true\n").unwrap();
    let o = cli(&bad, &["key", "list"]);
    assert_eq!(o.status.code(), Some(2));
    let e = err(&o);
    assert!(
        e.contains(":2") && e.contains("open_mode") && e.contains("; remove open_mode"),
        "{e}"
    );

    let config = write_master_config(dir.path(), "127.0.1.30", "");
    let o = cli(&config, &["publish", "*", "test.ping"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("is `saltgate-master run` running"),
        "{}",
        err(&o)
    );

    let o = cli(&config, &["jobs", "show", "../../etc"]);
    assert!(
        !o.status.success() && err(&o).contains("not a job id"),
        "{}",
        err(&o)
    );
    assert!(cli(&config, &["jobs", "list"]).status.success());

    // The metrics endpoint's address already taken: `run` stops at once and names the key.
    let taken = std::net::TcpListener::bind("127.0.1.30:0").unwrap();
    let extra = format!("saltgate_metrics_bind: {}\n", taken.local_addr().unwrap());
    let config = write_master_config(dir.path(), "127.0.1.30", &extra);
    let o = std::process::Command::new(bin())
        .args(["run", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(err(&o).contains("saltgate_metrics_bind"), "{}", err(&o));
}

/// Issue 31 items 7 and 8: ids are printed with control and bidi characters escaped, and a
/// publish that matches no minion says what happened (its jid) and exits as `salt` does (2).
#[test]
fn key_lists_escape_ids_and_a_publish_to_nobody_names_its_jid() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_master_config(dir.path(), "127.0.1.32", "");
    let pre = dir.path().join("pki/minions_pre");
    std::fs::create_dir_all(&pre).unwrap();
    std::fs::write(pre.join("evil\u{202E}gnp.exe"), PUB).unwrap();
    let o = cli(&config, &["key", "list"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out.contains("evil\\u{202e}gnp.exe") && !out.contains('\u{202E}'),
        "{out}"
    );

    let log = dir.path().join("master.log");
    let _master = start_master(&config, &log);
    let o = cli(&config, &["publish", "nobody", "test.arg"]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("No minions matched the target"), "{e}");
    assert!(!e.contains("no jid was assigned"), "{e}");
    let jid = e
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| w.len() == 20)
        .unwrap_or_else(|| panic!("no jid in {e:?}"));
    assert!(
        cli(&config, &["jobs", "show", jid]).status.success(),
        "the jid printed is the job's"
    );
}

/// Refusals are logged with their reason by the running binary.
#[test]
fn refusals_are_logged_with_their_reason() {
    use bytes::Bytes;
    use saltgate_wire::envelope::{map, text, RequestEnvelope};
    use saltgate_wire::zmtp::{ReqOptions, ReqSocket};
    let dir = tempfile::tempdir().unwrap();
    let config = write_master_config(dir.path(), "127.0.1.31", "");
    let log = dir.path().join("master.log");
    let master = start_master(&config, &log);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut req = ReqSocket::new(master.ret, ReqOptions::default());
        let mut old = RequestEnvelope::ping();
        old.version = Some(1);
        for body in [
            RequestEnvelope::clear(map(vec![("cmd", text("publish"))])).encode(),
            old.encode(),
            RequestEnvelope::aes("../etc", b"x").encode(),
            b"\x82\xa3enc".to_vec(),
        ] {
            req.request(vec![Bytes::from(body)], std::time::Duration::from_secs(30))
                .await
                .expect("a reply to every refused request");
        }
    });
    let text = wait_for(
        std::time::Duration::from_secs(10),
        "the refusals in the log",
        || {
            let t = std::fs::read_to_string(&log).unwrap_or_default();
            (t.matches("request refused").count() >= 4).then_some(t)
        },
    );
    for reason in [
        "clear command \"publish\" is not allowed",
        "protocol version 1 is below the minimum 3",
        "invalid id: minion id contains '/'",
        "not msgpack",
    ] {
        assert!(text.contains(reason), "no {reason:?} in:\n{text}");
    }
}

/// Issue 31 item 3: a flood of connections on the request port used to take every descriptor
/// the master may open (EMFILE): the CLI got through on its reserve, but the publish then found
/// no descriptor for the job cache and waited until the flood went (30 s). Now the network
/// ports hold at most the open-file limit less a headroom (`accept::descriptor_budget`): the
/// rest of the flood waits in the kernel backlog, and the operator's publish is answered at once.
#[test]
fn a_connection_flood_leaves_descriptors_for_the_cli_and_the_job_cache() {
    const NOFILE: u64 = 96;
    let dir = tempfile::tempdir().unwrap();
    let config = write_master_config(dir.path(), "127.0.1.33", "");
    let log = dir.path().join("master.log");
    let master = start_master_with_nofile(&config, &log, NOFILE);
    // Each flood connection completes its ZMTP handshake (a greeting and READY, sent at once),
    // so the handshake deadline does not free it: it holds its descriptor until the heartbeat
    // timeout (30 s), longer than this test.
    let mut hello = bytes::BytesMut::new();
    hello.extend_from_slice(&saltgate_wire::zmtp::Greeting::ours(false).encode());
    saltgate_wire::zmtp::Command::Ready(
        saltgate_wire::zmtp::Properties::default().with("Socket-Type", "REQ"),
    )
    .encode_frame(&mut hello);
    let mut flood = Vec::new();
    for _ in 0..300 {
        match std::net::TcpStream::connect_timeout(&master.ret, Duration::from_secs(2)) {
            Ok(mut s) => {
                use std::io::Write;
                let _ = s.write_all(&hello);
                s.set_nonblocking(true).unwrap();
                flood.push((s, false));
            }
            Err(_) => break,
        }
    }
    // The master answers the connections it serves with its greeting: up to its budget.
    let budget = saltgate_wire::accept::budget_for(NOFILE as usize);
    saltgate_test_support::wait_for(
        Duration::from_secs(20),
        "the flood served up to the budget",
        || {
            for (s, greeted) in flood.iter_mut() {
                use std::io::Read;
                let mut b = [0u8; 64];
                if !*greeted && matches!(s.read(&mut b), Ok(n) if n > 0) {
                    *greeted = true;
                }
            }
            let n = flood.iter().filter(|(_, g)| *g).count();
            // Within a couple of the budget: the master's own links may hold a permit or two.
            (n + 2 >= budget).then_some(n)
        },
    );
    let t0 = std::time::Instant::now();
    let o = cli(
        &config,
        &["publish", "--timeout", "5", "nobody", "test.ping"],
    );
    let took = t0.elapsed();
    let e = err(&o);
    assert!(
        e.contains("No minions matched the target"),
        "the publish failed under the flood ({:?}): {e}\nlog:\n{}",
        o.status.code(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Answered while the flood holds its connections (it used to wait 30 s for them to go).
    assert!(took < Duration::from_secs(10), "the publish took {took:?}");
    let greeted = flood.iter().filter(|(_, g)| *g).count();
    assert!(
        greeted <= budget,
        "{greeted} connections served over the budget of {budget}"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("Too many open files"), "{text}");
    drop(flood);
}
