//! The swarm counts `_auth` tries that time out and are sent again (issue 25): against a master
//! port that takes the ZMTP handshake and never answers (127.0.2.7), the progress lines show
//! `auth_timeouts` and `auth_retries` while `errors` stays 0 (a retry within a round is not an
//! error). Takes one `auth_timeout` (5 s, Salt's default).

use std::process::{Command, Stdio};
use std::time::Duration;

use saltgate_test_support::{wait_for, ProcGuard};
use saltgate_wire::zmtp::{Connection, HandshakeConfig, SocketType};

const IP: &str = "127.0.2.7";

/// A master's request port that reads requests and never answers; returns its port.
fn silent_master(rt: &tokio::runtime::Runtime) -> u16 {
    let l = rt
        .block_on(tokio::net::TcpListener::bind((IP, 0)))
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    rt.spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut hs = HandshakeConfig::new(SocketType::Router);
                hs.as_server = true;
                let Ok(mut c) = Connection::handshake(s, &hs).await else {
                    return;
                };
                while c.read_frame().await.is_ok() {}
            });
        }
    });
    port
}

#[test]
fn unanswered_auth_tries_are_counted_as_timeouts_and_retries_not_errors() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let port = silent_master(&rt);
    let tmp = tempfile::Builder::new()
        .prefix("sgmin")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let log = tmp.path().join("swarm.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_saltgate-minion"));
    cmd.args(["swarm", "--count", "2", "--shared-key", "--json"])
        .args(["--master", &format!("{IP}:{port}")])
        .args(["--publish-port", &port.to_string()])
        .args(["--report-every", "0.5"])
        .arg("--pki-dir")
        .arg(tmp.path().join("pki"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(&log).expect("log")))
        .stderr(Stdio::null());
    let swarm = ProcGuard::spawn("saltgate-minion swarm", cmd);
    let line = wait_for(Duration::from_secs(60), "a line counting retries", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["auth_retries"].as_u64().unwrap_or(0) >= 2)
    });
    assert!(line["auth_timeouts"].as_u64().unwrap_or(0) >= 2, "{line}");
    assert_eq!(line["errors"], serde_json::json!(0), "{line}");
    assert_eq!(line["authenticated"], serde_json::json!(0), "{line}");
    drop(swarm);
}
