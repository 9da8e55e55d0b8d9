//! Operating saltgate: metrics, every admin route (and its refusals), drain, disable, enable, and
//! hot reload (including 200 reloads under 500 streaming sessions).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use saltgate_config::{Config, Role};
use saltgate_proxy::{start, ConfigSource, Options, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

async fn run_with(cfg: Config, opts: Options) -> (Running, oneshot::Sender<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let r = start(cfg, opts, async move {
        let _ = rx.await;
    })
    .await
    .expect("proxy starts");
    (r, tx)
}

/// Runs with `file` as the reload source (SIGHUP/API/watch would read it).
async fn run_from_file(cfg: Config, file: &std::path::Path) -> (Running, oneshot::Sender<()>) {
    let source = ConfigSource {
        path: file.to_path_buf(),
        format: saltgate_config::Format::Yaml,
    };
    run_with(
        cfg,
        Options {
            prober: Arc::new(ScriptedProber::default()),
            source: Some(source),
            ..Default::default()
        },
    )
    .await
}

async fn run(cfg: Config) -> (Running, oneshot::Sender<()>, Arc<ScriptedProber>) {
    let p = Arc::new(ScriptedProber::default());
    let (r, tx) = run_with(
        cfg,
        Options {
            prober: p.clone(),
            ..Default::default()
        },
    )
    .await;
    (r, tx, p)
}

fn addr(r: &Running, role: Role) -> SocketAddr {
    r.local_addrs(role)[0]
}

/// A raw HTTP/1.1 request; returns the status and the body.
async fn http(admin: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(admin)
        .await
        .expect("admin API reachable");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(T, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn json(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let (code, body) = http(admin, method, path, token).await;
    (
        code,
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body}")),
    )
}

/// Scrapes /metrics and parses it with a Prometheus text-format parser.
async fn scrape(admin: SocketAddr) -> prometheus_parse::Scrape {
    let (code, body) = http(admin, "GET", "/metrics", None).await;
    assert_eq!(code, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition format")
}

fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .collect();
    assert!(!matching.is_empty(), "no sample {name}{labels:?}");
    matching.iter().sum()
}

#[tokio::test]
async fn metrics_count_a_known_set_of_sessions() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop, p) = run(c.config()).await;
    let admin = r.admin_addr().unwrap();
    for _ in 0..3 {
        let (mut s, _) = connect(addr(&r, Role::Publish)).await;
        assert_eq!(echo(&mut s, b"ping").await, b"ping");
    }
    let (mut held, _) = connect(addr(&r, Role::Request)).await;
    echo(&mut held, b"x").await;
    wait_for("3 publish sessions closed", || {
        r.masters()
            .iter()
            .all(|m| m.session_count(Role::Publish) == 0)
    })
    .await;
    let live = scrape(admin).await;
    assert_eq!(
        value(
            &live,
            "saltgate_listener_sessions_current",
            &[("listener", "request")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &live,
            "saltgate_master_sessions_current",
            &[("port", "request")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &live,
            "saltgate_master_state",
            &[("master", "a"), ("state", "up")]
        ),
        1.0
    );
    // Every master goes DOWN: the held request session is closed (master-down), a new client is refused.
    p.all_down.store(true, Ordering::SeqCst);
    wait_for("all down", || r.masters().iter().all(|m| !m.is_up())).await;
    let mut refused = tokio::net::TcpStream::connect(addr(&r, Role::Publish))
        .await
        .unwrap();
    assert!(closed(&mut refused).await);
    let sc = scrape(admin).await;
    wait_for_metric(
        admin,
        "saltgate_listener_sessions_refused_total",
        &[("listener", "publish"), ("reason", "no-master")],
        1.0,
    )
    .await;

    assert_eq!(
        value(
            &sc,
            "saltgate_listener_sessions_total",
            &[("listener", "publish")]
        ),
        4.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_bytes_total",
            &[("listener", "publish"), ("direction", "in")]
        ),
        12.0
    );
    // Each master sends its name banner ("a\n") first, then echoes: 2 + 4 bytes per session.
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_bytes_total",
            &[("listener", "publish"), ("direction", "out")]
        ),
        18.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_master_sessions_closed_total",
            &[("port", "publish"), ("reason", "client-eof")]
        ),
        3.0
    );
    assert!(closed(&mut held).await);
    let sc = scrape(admin).await;
    assert_eq!(
        value(
            &sc,
            "saltgate_master_sessions_closed_total",
            &[("port", "request"), ("reason", "master-down")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_sessions_current",
            &[("listener", "request")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_master_state",
            &[("master", "a"), ("state", "down")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_master_state",
            &[("master", "a"), ("state", "up")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &sc,
            "saltgate_master_state_changes_total",
            &[("master", "a"), ("to", "down")]
        ),
        1.0
    );
    assert!(
        value(
            &sc,
            "saltgate_master_check_failures_total",
            &[("master", "b")]
        ) >= 2.0
    );
    assert!(sc
        .samples
        .iter()
        .any(|x| x.metric == "saltgate_master_check_duration_seconds_count"));
    assert_eq!(value(&sc, "saltgate_config_generation", &[]), 1.0);
    assert_eq!(
        value(
            &sc,
            "saltgate_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(
        value(&sc, "saltgate_reloads_total", &[("result", "ok")]),
        0.0
    );
}

async fn wait_for_metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)], want: f64) {
    for _ in 0..500 {
        let sc = scrape(admin).await;
        if sc.samples.iter().any(|x| x.metric == name) && value(&sc, name, labels) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}{labels:?} never reached {want}");
}

#[tokio::test]
async fn health_and_readiness_routes() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let (r, _stop, p) = run(c.config()).await;
    let admin = r.admin_addr().unwrap();
    assert_eq!(
        json(admin, "GET", "/healthz", None).await,
        (200, serde_json::json!({"status": "alive"}))
    );
    let (code, body) = json(admin, "GET", "/readyz", None).await;
    assert_eq!((code, body["ready"].as_bool()), (200, Some(true)));
    p.all_down.store(true, Ordering::SeqCst);
    wait_for("down", || !r.master("a").unwrap().is_up()).await;
    let (code, body) = json(admin, "GET", "/readyz", None).await;
    assert_eq!((code, body["ready"].as_bool()), (503, Some(false)));
}

#[tokio::test]
async fn masters_and_sessions_routes_report_state_and_filter() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop, _p) = run(c.config()).await;
    let admin = r.admin_addr().unwrap();
    let (_s1, n1) = connect(addr(&r, Role::Publish)).await;
    let (_s2, _) = connect(addr(&r, Role::Request)).await;
    let (code, m) = json(admin, "GET", "/api/v1/masters", None).await;
    assert_eq!(code, 200);
    let ms = m["masters"].as_array().unwrap();
    assert_eq!(ms.len(), 2);
    assert_eq!(ms[0]["state"], "up");
    assert_eq!(ms[0]["publish"]["last_check"]["ok"], true);
    assert_eq!(
        ms[0]["publish"]["sessions"].as_u64().unwrap()
            + ms[1]["publish"]["sessions"].as_u64().unwrap(),
        1
    );

    let (code, all) = json(admin, "GET", "/api/v1/sessions", None).await;
    assert_eq!((code, all["count"].as_u64()), (200, Some(2)));
    let (_, only) = json(admin, "GET", "/api/v1/sessions?listener=publish", None).await;
    assert_eq!(only["count"], 1);
    assert_eq!(only["sessions"][0]["master"], n1.as_str());
    let (_, of_master) = json(
        admin,
        "GET",
        &format!("/api/v1/sessions?master={n1}&listener=request"),
        None,
    )
    .await;
    assert!(of_master["count"].as_u64().unwrap() <= 1);

    // Refusals: JSON errors naming the problem.
    let (code, e) = json(admin, "GET", "/api/v1/sessions?listener=pub", None).await;
    assert_eq!(code, 400);
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("unknown listener \"pub\""),
        "{e}"
    );
    let (code, e) = json(admin, "GET", "/api/v1/sessions?master=zz", None).await;
    assert_eq!(code, 404);
    assert!(e["error"].as_str().unwrap().contains("zz"));
    let (code, e) = json(admin, "GET", "/api/v1/sessions?colour=red", None).await;
    assert_eq!(code, 400, "{e}");
    let (code, e) = json(admin, "POST", "/api/v1/masters/zz/drain", None).await;
    assert_eq!(code, 404);
    assert_eq!(e["masters"], serde_json::json!(["a", "b"]));
    let (code, e) = json(admin, "POST", "/api/v1/masters/a/explode", None).await;
    assert_eq!(code, 400);
    assert!(e["error"]
        .as_str()
        .unwrap()
        .contains("drain, disable or enable"));
    let (code, _) = json(admin, "GET", "/api/v1/masters/a/drain", None).await;
    assert_eq!(code, 405);
    let (code, _) = json(admin, "GET", "/nope", None).await;
    assert_eq!(code, 404);
    let (code, e) = json(admin, "POST", "/api/v1/reload", None).await;
    assert_eq!(code, 409, "no file to reload from: {e}");
    assert_eq!(
        r.master("a").unwrap().state(),
        saltgate_proxy::master::MasterState::Up,
        "refusals change nothing"
    );
}

#[tokio::test]
async fn a_request_without_the_right_token_gets_401_and_changes_nothing() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let mut cfg = c.config();
    cfg.admin.token_file = Some(token);
    let (r, _stop, _p) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    for t in [None, Some("wrong"), Some("s3cre"), Some("s3cret2")] {
        let (code, e) = json(admin, "POST", "/api/v1/masters/a/drain", t).await;
        assert_eq!(code, 401, "{t:?}");
        assert!(e["error"].as_str().unwrap().contains("bearer token"));
        assert_eq!(json(admin, "GET", "/metrics", t).await.0, 401);
    }
    assert_eq!(
        r.master("a").unwrap().state(),
        saltgate_proxy::master::MasterState::Up
    );
    assert_eq!(
        json(admin, "GET", "/healthz", None).await.0,
        200,
        "probes need no token"
    );
    assert_eq!(json(admin, "GET", "/readyz", None).await.0, 200);
    let (code, ok) = json(admin, "POST", "/api/v1/masters/a/drain", Some("s3cret")).await;
    assert_eq!((code, ok["state"].as_str()), (200, Some("draining")));
}

#[tokio::test]
async fn drain_avoids_the_master_then_closes_its_sessions_at_the_deadline() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.drain_timeout = Duration::from_millis(500);
    let (r, _stop, _p) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    let (mut on_a, n) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(n, "a");
    let t0 = tokio::time::Instant::now();
    let (code, _) = json(admin, "POST", "/api/v1/masters/a/drain", None).await;
    assert_eq!(code, 200);
    for _ in 0..4 {
        assert_eq!(
            connect(addr(&r, Role::Publish)).await.1,
            "b",
            "new sessions avoid a draining master"
        );
    }
    assert_eq!(
        echo(&mut on_a, b"still here").await,
        b"still here",
        "live sessions stay until the deadline"
    );
    assert!(closed(&mut on_a).await);
    assert!(
        t0.elapsed() >= Duration::from_millis(450),
        "closed after {:?}",
        t0.elapsed()
    );
    wait_for_metric(
        admin,
        "saltgate_master_sessions_closed_total",
        &[("master", "a"), ("reason", "drained")],
        1.0,
    )
    .await;
    json(admin, "POST", "/api/v1/masters/a/enable", None).await;
    let names: String = [
        connect(addr(&r, Role::Publish)).await.1,
        connect(addr(&r, Role::Publish)).await.1,
    ]
    .concat();
    assert!(names.contains('a'), "enabled again: {names}");
}

#[tokio::test]
async fn enable_cancels_a_pending_drain_deadline() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.drain_timeout = Duration::from_millis(300);
    let (r, _stop, _p) = run(cfg).await;
    let (mut on_a, _) = connect(addr(&r, Role::Publish)).await;
    r.drain("a").unwrap();
    r.enable("a").unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(echo(&mut on_a, b"kept").await, b"kept");
}

#[tokio::test]
async fn disable_closes_the_masters_sessions_at_once() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop, _p) = run(c.config()).await;
    let admin = r.admin_addr().unwrap();
    let (mut on_a, _) = connect(addr(&r, Role::Publish)).await;
    let (mut on_b, _) = connect(addr(&r, Role::Publish)).await;
    let (code, v) = json(admin, "POST", "/api/v1/masters/a/disable", None).await;
    assert_eq!((code, v["state"].as_str()), (200, Some("disabled")));
    assert!(closed(&mut on_a).await);
    assert_eq!(echo(&mut on_b, b"b").await, b"b");
    assert_eq!(connect(addr(&r, Role::Publish)).await.1, "b");
    wait_for_metric(
        admin,
        "saltgate_master_sessions_closed_total",
        &[("master", "a"), ("reason", "disabled")],
        1.0,
    )
    .await;
}

#[tokio::test]
async fn reload_keeps_health_of_unchanged_masters_and_adds_and_removes_masters() {
    let c = FakeCluster::start(3, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.drain_timeout = Duration::from_millis(400);
    let full = cfg.clone();
    cfg.masters.truncate(2); // start with a, b
    let (r, _stop, p) = run(cfg.clone()).await;
    let a_before = r.master("a").unwrap();
    let (mut on_b, nb) = {
        connect(addr(&r, Role::Publish)).await;
        connect(addr(&r, Role::Publish)).await
    };
    assert_eq!(nb, "b");

    // Reload: c added, b removed, a unchanged.
    let mut next = full.clone();
    next.masters.remove(1);
    let probes_a = p.probes(c.port(0, Role::Publish).addr);
    assert_eq!(r.reload(next).await.unwrap(), 2);
    let a_after = r.master("a").unwrap();
    assert!(
        Arc::ptr_eq(&a_before, &a_after),
        "a is the same master: health and sessions carried over"
    );
    assert!(a_after.is_up(), "a is UP at once, without waiting for rise");
    assert!(p.probes(c.port(0, Role::Publish).addr) - probes_a < 2);
    assert!(r.master("b").is_none());
    wait_for("c checked UP", || r.master("c").is_some_and(|m| m.is_up())).await;
    let mut names = String::new();
    for _ in 0..4 {
        names += &connect(addr(&r, Role::Publish)).await.1;
    }
    assert!(names.contains('c') && !names.contains('b'), "{names}");
    // b's live session is drained: alive until drain_timeout, then closed.
    assert_eq!(echo(&mut on_b, b"draining").await, b"draining");
    assert!(closed(&mut on_b).await);
}

#[tokio::test]
async fn reload_applies_new_timeouts_to_new_sessions_only() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let (mut old, _) = connect(addr(&r, Role::Request)).await;
    let mut next = cfg.clone();
    next.request.timeout_client = Some(Duration::from_millis(300));
    next.request.timeout_server = Some(Duration::from_millis(300));
    r.reload(next).await.unwrap();
    let (mut new, _) = connect(addr(&r, Role::Request)).await;
    assert!(
        closed(&mut new).await,
        "new session uses the 300 ms idle timeout"
    );
    assert_eq!(
        echo(&mut old, b"old").await,
        b"old",
        "the old session keeps its timeout"
    );
}

#[tokio::test]
async fn reload_rebinds_a_changed_listener_without_touching_the_other() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let old_pub = addr(&r, Role::Publish);
    let (mut pub_s, _) = connect(old_pub).await;
    let (mut req_s, _) = connect(addr(&r, Role::Request)).await;
    let mut next = cfg.clone();
    next.request.bind = vec![addr(&r, Role::Request), "127.0.0.5:0".parse().unwrap()];
    next.publish.bind = vec!["127.0.0.6:0".parse().unwrap()];
    r.reload(next).await.unwrap();
    let new_pub = addr(&r, Role::Publish);
    assert_eq!(new_pub.ip().to_string(), "127.0.0.6");
    assert!(
        tokio::net::TcpStream::connect(old_pub).await.is_err(),
        "old publish address closed"
    );
    assert_eq!(connect(new_pub).await.1, "a");
    assert_eq!(
        echo(&mut pub_s, b"p").await,
        b"p",
        "sessions of the old listener carry on"
    );
    assert_eq!(echo(&mut req_s, b"r").await, b"r");
    assert_eq!(r.local_addrs(Role::Request).len(), 2);
}

#[tokio::test]
async fn an_invalid_reload_is_refused_counted_and_the_running_config_stays() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    std::fs::write(
        &file,
        "masters: []\nlisteners: {publish: {}, request: {}}\n",
    )
    .unwrap();
    let (r, _stop) = run_from_file(c.config(), &file).await;
    let admin = r.admin_addr().unwrap();
    let (code, e) = json(admin, "POST", "/api/v1/reload", None).await;
    assert_eq!(code, 422);
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("no master is configured"),
        "{e}"
    );
    assert_eq!(r.generation(), 1);
    assert_eq!(connect(addr(&r, Role::Publish)).await.1, "a");
    wait_for_metric(
        admin,
        "saltgate_reloads_total",
        &[("result", "invalid")],
        1.0,
    )
    .await;
}

/// The YAML for `cfg`'s masters with listeners on fixed addresses (for file-based reloads).
fn yaml(
    c: &FakeCluster,
    n: usize,
    weights: &[u32],
    publish: SocketAddr,
    request: SocketAddr,
    idle: &str,
) -> String {
    let mut y = String::from("global:\n  raise_nofile: false\n  drain_timeout: 1h\nhealth:\n  interval: 50ms\nmasters:\n");
    for i in 0..n {
        let (p, q) = (c.port(i, Role::Publish).addr, c.port(i, Role::Request).addr);
        y += &format!("  - name: {}\n    host: {}\n    publish_port: {}\n    request_port: {}\n    weight: {}\n", p_name(i), p.ip(), p.port(), q.port(), weights[i % weights.len()]);
    }
    y += &format!("listeners:\n  publish:\n    bind: {publish}\n    timeout_client: {idle}\n    timeout_server: {idle}\n  request:\n    bind: {request}\nadmin:\n  enabled: false\n");
    y
}

fn p_name(i: usize) -> String {
    ((b'a' + i as u8) as char).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_reloads_under_500_streaming_sessions_drop_nothing() {
    let _ = rlimit::increase_nofile_limit(65_536);
    let c = FakeCluster::start(4, Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saltgate.yaml");
    let publish: SocketAddr = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    )
    .parse()
    .unwrap();
    let request: SocketAddr = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    )
    .parse()
    .unwrap();
    let valid_a = yaml(&c, 3, &[1], publish, request, "1d");
    let valid_b = yaml(&c, 4, &[3, 1], publish, request, "12h");
    let invalid = valid_a.replace("weight: 1", "weight: lots");
    std::fs::write(&file, &valid_a).unwrap();
    let cfg = saltgate_config::load(&file, saltgate_config::Format::Yaml)
        .unwrap()
        .config;
    let (r, _stop) = run_from_file(cfg, &file).await;
    let r = Arc::new(r);

    // 500 sessions, each streaming 1 KiB chunks and checking every echoed byte, until the reloads
    // are over.
    const SESSIONS: usize = 500;
    let mut streams = Vec::new();
    for _ in 0..SESSIONS {
        streams.push(connect(publish).await.0);
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chunks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, mut s) in streams.into_iter().enumerate() {
        let (done, chunks) = (done.clone(), chunks.clone());
        tasks.push(tokio::spawn(async move {
            let mut back = vec![0u8; 1024];
            let mut k = 0usize;
            while !done.load(Ordering::SeqCst) {
                let chunk: Vec<u8> = (0..1024).map(|j| (i * 31 + k * 7 + j) as u8).collect();
                s.write_all(&chunk)
                    .await
                    .map_err(|e| format!("session {i} chunk {k}: write: {e}"))?;
                tokio::time::timeout(Duration::from_secs(60), s.read_exact(&mut back))
                    .await
                    .map_err(|_| format!("session {i} chunk {k}: timed out"))?
                    .map_err(|e| format!("session {i} chunk {k}: read: {e}"))?;
                if back != chunk {
                    return Err(format!("session {i} chunk {k}: bytes differ"));
                }
                k += 1;
                chunks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, String>((k * 1024, s))
        }));
    }
    wait_for("every session streaming", || {
        chunks.load(Ordering::SeqCst) >= SESSIONS
    })
    .await;
    let before = chunks.load(Ordering::SeqCst);
    let mut ok = 0;
    let mut refused = 0;
    for n in 0..200 {
        let text = match n % 3 {
            0 => &valid_b,
            1 => &invalid,
            _ => &valid_a,
        };
        std::fs::write(&file, text).unwrap();
        match r.reload_from_source("test").await {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    let during = chunks.load(Ordering::SeqCst) - before;
    done.store(true, Ordering::SeqCst);
    assert_eq!((ok, refused), (133, 67));
    assert!(
        during >= SESSIONS,
        "data flowed while reloading: {during} chunks"
    );
    let mut bytes = 0;
    let mut still_open = Vec::new();
    for t in tasks {
        let (n, s) = t.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        bytes += n;
        still_open.push(s);
    }
    assert_eq!(
        bytes,
        chunks.load(Ordering::SeqCst) * 1024,
        "every byte sent came back intact"
    );
    assert_eq!(r.live_sessions(), SESSIONS, "no session was dropped");
    assert_eq!(r.generation(), 1 + 133);
}

#[tokio::test]
async fn reload_that_swaps_listener_roles_keeps_both_addresses_serving() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let cfg = c.config();
    let (r, _stop, _p) = run(cfg.clone()).await;
    let (a, b) = (addr(&r, Role::Publish), addr(&r, Role::Request));
    let (mut old_pub, _) = connect(a).await;
    let mut next = cfg.clone();
    next.publish.bind = vec![b];
    next.request.bind = vec![a];
    next.request.timeout_client = Some(Duration::from_millis(300));
    next.request.timeout_server = Some(Duration::from_millis(300));
    r.reload(next).await.expect("the swap is applied");
    assert_eq!(r.local_addrs(Role::Publish), vec![b]);
    assert_eq!(r.local_addrs(Role::Request), vec![a]);
    // `a` now serves the request role (300 ms idle timeout); the old session on it carries on.
    let (mut new_req, _) = connect(a).await;
    assert!(
        closed(&mut new_req).await,
        "request timeouts apply on the swapped address"
    );
    assert_eq!(connect(b).await.1, "a");
    assert_eq!(echo(&mut old_pub, b"old").await, b"old");
}

#[tokio::test]
async fn global_maxconn_still_holds_after_reloads() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.maxconn = Some(2);
    let (r, _stop, _p) = run(cfg.clone()).await;
    let _s1 = connect(addr(&r, Role::Publish)).await;
    let _s2 = connect(addr(&r, Role::Request)).await;
    for _ in 0..3 {
        r.reload(cfg.clone()).await.unwrap();
    }
    let mut third = tokio::net::TcpStream::connect(addr(&r, Role::Publish))
        .await
        .unwrap();
    let mut b = [0u8; 2];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), third.read(&mut b))
            .await
            .is_err(),
        "still capped at 2 after 3 reloads"
    );
    // Raising the cap lets the waiting connection in at once.
    let mut more = cfg.clone();
    more.global.maxconn = Some(3);
    r.reload(more).await.unwrap();
    assert_eq!(read_line(&mut third).await, "a");
}

#[tokio::test]
async fn a_paced_close_stops_when_the_master_comes_back() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.publish.close_rate = 10; // 40 sessions: 4 s to close them all
    let (r, _stop, p) = run(cfg).await;
    let mut sessions = Vec::new();
    for _ in 0..40 {
        sessions.push(connect(addr(&r, Role::Publish)).await.0);
    }
    let a = r.master("a").unwrap();
    let port = c.port(0, Role::Publish).addr;
    p.set_down(port, true);
    wait_for("a down", || !a.is_up()).await;
    wait_for("some sessions closed", || {
        a.session_count(Role::Publish) < 40
    })
    .await;
    p.set_down(port, false);
    wait_for("a up again", || a.is_up()).await;
    let left = a.session_count(Role::Publish);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        left > 10,
        "the master came back early: {left} sessions left"
    );
    assert_eq!(
        a.session_count(Role::Publish),
        left,
        "no more sessions closed once it is UP"
    );
}
