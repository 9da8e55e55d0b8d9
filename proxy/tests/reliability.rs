//! Bad days (issue 12): DNS failures, descriptor exhaustion, admin floods. Addresses 127.0.7.0/24.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::api::*;
use common::*;
use saltgate_config::{Config, HealthSettings, MasterConfig, Probe, Role};

const IP: &str = "127.0.7.1";

/// A config with one master per `(name, host, publish, request)`, listeners and admin on 127.0.7.1.
fn config(masters: &[(&str, &str, u16, u16)]) -> Config {
    let health = HealthSettings {
        interval: Duration::from_millis(50),
        fastinter: Duration::from_millis(50),
        downinter: Duration::from_millis(50),
        rise: 2,
        fall: 2,
        timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(500),
        probe: Probe::Tcp,
    };
    let masters = masters
        .iter()
        .map(|&(name, host, p, r)| MasterConfig {
            name: name.into(),
            host: host.into(),
            publish_port: p,
            request_port: r,
            weight: 1,
            maxconn: None,
            backup: false,
            disabled: false,
            check: true,
            health,
        })
        .collect();
    config_on(IP, masters, health)
}

/// A healthy master "a" on 127.0.7.2 and "ghost" whose name never resolves.
async fn with_ghost() -> (
    Config,
    std::sync::Arc<FakeMaster>,
    std::sync::Arc<FakeMaster>,
) {
    let p = FakeMaster::start("a", "127.0.7.2", Behaviour::Echo).await;
    let r = FakeMaster::start("a", "127.0.7.2", Behaviour::Echo).await;
    let cfg = config(&[
        ("a", "127.0.7.2", p.addr.port(), r.addr.port()),
        ("ghost", "saltgate-test.invalid", 4505, 4506),
    ]);
    (cfg, p, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_master_starts_down_as_unresolved_beside_a_healthy_one() {
    let (cfg, _p, _r) = with_ghost().await;
    let (r, _stop, _prober) = run(cfg.clone()).await;
    let ghost = r.master("ghost").expect("ghost is configured");
    assert!(
        !ghost.is_available(),
        "an unresolved master is never selected"
    );
    for _ in 0..4 {
        assert_eq!(connect(addr(&r, Role::Request)).await.1, "a");
    }
    let admin = r.admin_addr().unwrap();
    let (code, v) = json(admin, "GET", "/api/v1/masters", None).await;
    assert_eq!(code, 200, "{v}");
    let list = v.as_array().or_else(|| v["masters"].as_array()).unwrap();
    let g = list.iter().find(|m| m["name"] == "ghost").unwrap();
    assert_eq!(g["state"], "unresolved", "{g}");
    let s = scrape(admin).await;
    assert_eq!(
        value(
            &s,
            "saltgate_master_state",
            &[("master", "ghost"), ("state", "unresolved")]
        ),
        1.0
    );
    // A reload of the same configuration is accepted too, and keeps a's health.
    let a = r.master("a").unwrap();
    r.reload(cfg)
        .await
        .expect("reload with an unresolved master");
    assert!(std::sync::Arc::ptr_eq(&a, &r.master("a").unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_no_master_resolves_start_fails_listing_each_host() {
    let cfg = config(&[
        ("g1", "saltgate-one.invalid", 4505, 4506),
        ("g2", "saltgate-two.invalid", 4505, 4506),
    ]);
    let e = saltgate_proxy::start(cfg, Default::default(), std::future::pending())
        .await
        .err()
        .expect("no master resolves: start fails");
    let msg = e.to_string();
    for want in ["g1", "saltgate-one.invalid", "g2", "saltgate-two.invalid"] {
        assert!(msg.contains(want), "{want} missing in: {msg}");
    }
}

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");

fn yaml(masters: &[(&str, &str)], extra: &str) -> String {
    let mut y = String::from("masters:\n");
    for (name, host) in masters {
        y += &format!("  - name: {name}\n    host: {host}\n");
    }
    y += &format!(
        "listeners:\n  publish:\n    bind: {IP}:4505\n  request:\n    bind: {IP}:4506\n{extra}"
    );
    y
}

fn check_config(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_refuses_a_missing_token_file_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("no-such.token");
    let (code, err) = check_config(&yaml(
        &[("a", "127.0.7.2")],
        &format!(
            "admin:\n  bind: {IP}:9505\n  token_file: {}\n",
            token.display()
        ),
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("token_file") && err.contains("no-such.token"),
        "{err}"
    );
}

#[test]
fn check_config_warns_on_an_unresolvable_master_and_fails_when_none_resolves() {
    let (code, err) = check_config(&yaml(
        &[("a", "127.0.7.2"), ("ghost", "saltgate-test.invalid")],
        "",
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning") && err.contains("saltgate-test.invalid"),
        "{err}"
    );
    let (code, err) = check_config(&yaml(
        &[
            ("g1", "saltgate-one.invalid"),
            ("g2", "saltgate-two.invalid"),
        ],
        "",
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("saltgate-one.invalid") && err.contains("saltgate-two.invalid"),
        "{err}"
    );
}

#[test]
fn admin_bind_beyond_loopback_without_a_token_is_refused_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    std::fs::write(&path, yaml(&[("a", "127.0.7.2")], "")).unwrap();
    // 192.0.2.1 (TEST-NET-1) is never local: the refusal must come before any bind.
    let out = std::process::Command::new(BIN)
        .args(["run", "--admin-bind", "192.0.2.1:9505", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("--admin-bind") && text.contains("token_file"),
        "{text}"
    );
}

/// Kills the child (by its PID) when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_log(log: &std::path::Path, what: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what:?} in the log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_exhaustion_does_not_mark_healthy_masters_down() {
    let p = FakeMaster::start("a", "127.0.7.3", Behaviour::Echo).await;
    let r = FakeMaster::start("a", "127.0.7.3", Behaviour::Echo).await;
    let request = SocketAddr::from(([127, 0, 7, 1], free_port(IP)));
    let publish = SocketAddr::from(([127, 0, 7, 1], free_port(IP)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    let log = dir.path().join("saltgate.log");
    std::fs::write(
        &path,
        format!(
            "global:\n  raise_nofile: false\nhealth:\n  interval: 20ms\n  fall: 2\n  rise: 2\n  timeout: 1s\n\
             masters:\n  - name: a\n    host: 127.0.7.3\n    publish_port: {}\n    request_port: {}\n\
             listeners:\n  publish:\n    bind: {publish}\n  request:\n    bind: {request}\n",
            p.addr.port(),
            r.addr.port()
        ),
    )
    .unwrap();
    let _child = Child(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n 48 && exec {BIN} --log-level info,saltgate_proxy::check=debug run --probe tcp --admin-bind off --config {} >{} 2>&1",
                path.display(),
                log.display()
            ))
            .spawn()
            .unwrap(),
    );
    wait_log(&log, "configuration in force").await;
    // Silent clients hold every descriptor saltgate has (each session also holds one upstream).
    let mut held = Vec::new();
    for _ in 0..60 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(request),
        )
        .await
        {
            held.push(s);
        }
    }
    wait_log(&log, "out of local resources").await;
    // Hold until several checks in a row met the exhaustion (more than `fall`).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.matches("met the local resource shortage").count() >= 6 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no check met the exhaustion:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(held);
    let text = wait_log(&log, "local resources available again").await;
    assert!(!text.contains("marked DOWN"), "{text}");
    // Still serving.
    let (_s, name) = connect(request).await;
    assert_eq!(name, "a");
}

/// True when the peer closes `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // e.g. a 408 response before the close
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_connection_that_sends_nothing_is_closed_at_the_header_timeout() {
    let (cfg, _p, _r) = with_ghost().await;
    let (r, _stop, _prober) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    let t0 = std::time::Instant::now();
    // A connection that has not shown the token gets the short header deadline (issue 31 item 5).
    let deadline = saltgate_proxy::admin::UNAUTHENTICATED_HEADER_TIMEOUT;
    assert!(
        closed_within(&mut s, deadline + Duration::from_secs(3)).await,
        "a silent admin connection stays open"
    );
    assert!(t0.elapsed() >= deadline - Duration::from_millis(100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_connections_over_the_cap_are_closed_at_once() {
    let (cfg, _p, _r) = with_ghost().await;
    let (r, _stop, _prober) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    // Connections that send nothing take no slot; at most MAX_WAITING wait so, and one more
    // evicts the longest-waiting one at once, well before the header deadline.
    let mut held = Vec::new();
    for _ in 0..saltgate_proxy::admin::MAX_WAITING {
        held.push(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    let _extra = tokio::net::TcpStream::connect(admin).await.unwrap();
    assert!(
        closed_within(&mut held[0], Duration::from_secs(1)).await,
        "the longest-waiting connection over the cap was not closed"
    );
    // Once they are gone, the API answers again.
    drop(held);
    let mut ok = false;
    for _ in 0..100 {
        if let Ok(Ok((200, _))) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::spawn(http(admin, "GET", "/healthz", None)),
        )
        .await
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "the admin API does not answer after the flood");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_gives_up_at_its_timeout_with_a_clear_error() {
    // Accepts (the kernel does) but never answers.
    let silent = tokio::net::TcpListener::bind(format!("{IP}:0"))
        .await
        .unwrap();
    let addr = silent.local_addr().unwrap();
    let t0 = std::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args([
                "ctl",
                "--admin",
                &addr.to_string(),
                "--timeout",
                "300ms",
                "status",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("300ms") && err.contains("--timeout"), "{err}");
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_masters_only_to_a_valid_token() {
    let (mut cfg, _p, _r) = with_ghost().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "s3cret\n").unwrap();
    cfg.admin.token_file = Some(token);
    let (r, _stop, _prober) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    for t in [None, Some("wrong")] {
        let (code, body) = http(admin, "GET", "/readyz", t).await;
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.contains("\"a\""),
            "names without a valid token: {body}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["masters_up"], 1, "{body}");
    }
    let (code, v) = json(admin, "GET", "/readyz", Some("s3cret")).await;
    assert_eq!(code, 200);
    assert_eq!(v["masters_up_names"], serde_json::json!(["a"]), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_a_file_that_is_not_utf8() {
    let (cfg, p, r) = with_ghost().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    let mut text = yaml(&[("a", "127.0.7.2")], &format!("admin:\n  bind: {IP}:0\n"))
        .replace("4505", &free_port(IP).to_string())
        .replace("4506", &free_port(IP).to_string())
        .replace(
            "host: 127.0.7.2\n",
            &format!(
                "host: 127.0.7.2\n    publish_port: {}\n    request_port: {}\n",
                p.addr.port(),
                r.addr.port()
            ),
        )
        .into_bytes();
    text.extend_from_slice(b"# caf\xe9 (Latin-1)\n");
    std::fs::write(&file, &text).unwrap();
    let (running, _stop) = run_from_file(cfg, &file).await;
    let before = running.generation();
    let e = running
        .reload_from_source("test")
        .await
        .expect_err("a Latin-1 file is refused");
    assert!(e.to_string().to_lowercase().contains("utf-8"), "{e}");
    assert_eq!(running.generation(), before);
}
