//! The status page (`GET /`) and the events it reads (`GET /api/v1/events`): served without the
//! token (the page holds no data), events behind it; flips, check history, admin actions and
//! reloads appear; the ring stays bounded. All on 127.0.4.x.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::api::*;
use common::*;
use saltgate_config::{Config, MasterConfig, Role};
use saltgate_proxy::events::{MAX_CHECKS, MAX_EVENTS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IP: &str = "127.0.4.1";

/// A config with `names` as masters on 127.0.4.10, .11, ... (never connected to: the scripted
/// prober answers for them), listeners and admin on 127.0.4.1, fast checks.
fn config(names: &[&str]) -> Config {
    let mut c = FakeCluster { masters: vec![] }.config();
    let any: SocketAddr = format!("{IP}:0").parse().unwrap();
    c.publish.bind = vec![any];
    c.request.bind = vec![any];
    c.admin.bind = any;
    c.masters = names
        .iter()
        .enumerate()
        .map(|(i, n)| MasterConfig {
            name: n.to_string(),
            host: format!("127.0.4.{}", 10 + i),
            publish_port: 4505,
            request_port: 4506,
            weight: 1 + i as u32,
            maxconn: None,
            backup: false,
            disabled: false,
            check: true,
            health: c.health,
        })
        .collect();
    c
}

fn with_token(mut c: Config, dir: &Path, token: &str) -> Config {
    let f = dir.join("token");
    std::fs::write(&f, format!("{token}\n")).unwrap();
    c.admin.token_file = Some(f);
    c
}

/// GET `path`; returns the status, the header block (lower-cased) and the body.
async fn get_raw(admin: SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(T, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

async fn events(admin: SocketAddr, token: Option<&str>) -> serde_json::Value {
    let (code, v) = json(admin, "GET", "/api/v1/events", token).await;
    assert_eq!(code, 200, "{v}");
    v
}

/// Polls the events until `cond` holds (deadline [`T`]).
async fn wait_events(
    admin: SocketAddr,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let v = events(admin, None).await;
        if cond(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}; last events: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn of_kind<'a>(v: &'a serde_json::Value, kind: &str) -> Vec<&'a serde_json::Value> {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

#[tokio::test]
async fn the_page_is_served_without_the_token_and_loads_nothing_from_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (r, _stop, _p) = run(with_token(config(&["a"]), dir.path(), "s3cret")).await;
    let admin = r.admin_addr().unwrap();
    let (code, head, body) = get_raw(admin, "/").await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(head.contains("connect-src 'self'"), "{head}");
    assert!(head.contains("x-frame-options: deny"), "{head}");
    assert!(body.contains("<title>saltgate status</title>"));
    assert!(!body.contains("s3cret"), "the page carries no secret");
    assert!(!body.contains("https://") && !body.contains("http://"));
    // The data behind the page still needs the token.
    let (code, _) = http(admin, "GET", "/api/v1/masters", None).await;
    assert_eq!(code, 401);
}

#[tokio::test]
async fn events_need_the_token_when_one_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let (r, _stop, _p) = run(with_token(config(&["a"]), dir.path(), "s3cret")).await;
    let admin = r.admin_addr().unwrap();
    let (code, e) = json(admin, "GET", "/api/v1/events", None).await;
    assert_eq!(code, 401);
    assert!(e["error"].as_str().unwrap().contains("bearer token"), "{e}");
    let (code, _) = json(admin, "GET", "/api/v1/events", Some("wrong")).await;
    assert_eq!(code, 401);
    let (code, v) = json(admin, "GET", "/api/v1/events", Some("s3cret")).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["generation"], 1);
    let start = of_kind(&v, "reload");
    assert_eq!(start.len(), 1, "{v}");
    assert_eq!(start[0]["trigger"], "start");
    assert_eq!(start[0]["ok"], true);
    assert!(v["loaded_at_ms"].as_u64().unwrap() <= v["now_ms"].as_u64().unwrap());
}

#[tokio::test]
async fn events_are_open_without_a_token_configured() {
    let (r, _stop, _p) = run(config(&["a"])).await;
    let (code, _) = json(r.admin_addr().unwrap(), "GET", "/api/v1/events", None).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn a_flip_its_reason_and_the_check_history_show_in_the_events() {
    let (r, _stop, p) = run(config(&["a", "b"])).await;
    let admin = r.admin_addr().unwrap();
    let b = r.master("b").unwrap();
    p.set_down(b.addr(Role::Request), true);
    let v = wait_events(admin, "b flips DOWN", |v| {
        of_kind(v, "flip").iter().any(|e| e["master"] == "b")
    })
    .await;
    let flip = of_kind(&v, "flip")[0].clone();
    assert_eq!(
        (&flip["port"], &flip["from"], &flip["to"]),
        (&"request".into(), &"up".into(), &"down".into())
    );
    assert!(
        flip["reason"]
            .as_str()
            .unwrap()
            .contains("scripted failure"),
        "{flip}"
    );
    assert_eq!(v["last_flip"]["b"], flip);
    assert!(v["last_flip"].get("a").is_none(), "a never flipped");

    // The history strip: once more than MAX_CHECKS checks ran, each port keeps the last ones.
    let v = wait_events(admin, "a full check history", |v| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["checks"].as_array().unwrap().len() == MAX_CHECKS)
            && v["checks"].as_array().unwrap().len() == 4
    })
    .await;
    let b_req = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["master"] == "b" && c["port"] == "request")
        .unwrap();
    let last = b_req["checks"].as_array().unwrap().last().unwrap();
    assert_eq!(last["ok"], false);
    assert_eq!(last["detail"], "scripted failure");

    // And back UP.
    p.set_down(b.addr(Role::Request), false);
    wait_events(admin, "b flips UP", |v| v["last_flip"]["b"]["to"] == "up").await;
}

#[tokio::test]
async fn admin_actions_are_events_and_the_ring_stays_bounded() {
    let (r, _stop, _p) = run(config(&["a", "b"])).await;
    let admin = r.admin_addr().unwrap();
    let rounds = MAX_EVENTS + 10;
    for i in 0..rounds {
        let action = if i % 2 == 0 { "drain" } else { "enable" };
        let (code, v) = json(admin, "POST", &format!("/api/v1/masters/a/{action}"), None).await;
        assert_eq!(code, 200, "{v}");
    }
    let (code, _) = json(admin, "POST", "/api/v1/masters/nope/drain", None).await;
    assert_eq!(code, 404, "a refused action is no event");
    let v = events(admin, None).await;
    let list = v["events"].as_array().unwrap();
    assert_eq!(list.len(), MAX_EVENTS, "the ring holds its bound");
    let seqs: Vec<u64> = list.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] == w[1] + 1),
        "newest first, no gap: {seqs:?}"
    );
    // 1 start event + `rounds` actions: the newest is the last enable.
    assert_eq!(seqs[0], 1 + rounds as u64);
    let newest = &list[0];
    assert_eq!(
        (
            &newest["kind"],
            &newest["master"],
            &newest["action"],
            &newest["state"]
        ),
        (&"admin".into(), &"a".into(), &"enable".into(), &"up".into())
    );
    assert!(
        of_kind(&v, "reload").is_empty(),
        "the start event has rolled off the ring"
    );
    assert_eq!(
        v["generation"], 1,
        "the generation in force outlives the ring"
    );
}

#[tokio::test]
async fn reloads_show_with_their_trigger_and_their_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    std::fs::write(
        &file,
        "masters: []\nlisteners: {publish: {}, request: {}}\n",
    )
    .unwrap();
    let (r, _stop) = run_from_file(config(&["a"]), &file).await;
    let admin = r.admin_addr().unwrap();
    let (code, _) = json(admin, "POST", "/api/v1/reload", None).await;
    assert_eq!(code, 422);
    let next = r.reload(config(&["a", "b"])).await.unwrap();
    let v = events(admin, None).await;
    let reloads = of_kind(&v, "reload");
    assert_eq!(reloads.len(), 3, "{v}");
    assert_eq!(reloads[2]["trigger"], "start");
    assert_eq!(
        (&reloads[1]["trigger"], &reloads[1]["ok"]),
        (&"admin API".into(), &false.into())
    );
    assert!(
        reloads[1]["error"]
            .as_str()
            .unwrap()
            .contains("no master is configured"),
        "{}",
        reloads[1]
    );
    assert!(reloads[1]["generation"].is_null());
    assert_eq!(reloads[0]["ok"], true);
    assert_eq!(reloads[0]["generation"], next);
    assert_eq!(v["generation"], next);
}
