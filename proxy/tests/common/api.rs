//! Helpers for tests that drive a running proxy and its admin API.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use saltgate_config::{Config, Role};
use saltgate_proxy::{start, ConfigSource, Options, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::{ScriptedProber, T};

pub async fn run_with(cfg: Config, opts: Options) -> (Running, oneshot::Sender<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let r = start(cfg, opts, async move {
        let _ = rx.await;
    })
    .await
    .expect("proxy starts");
    (r, tx)
}

/// Runs with `file` as the reload source (SIGHUP/API/watch would read it).
pub async fn run_from_file(cfg: Config, file: &std::path::Path) -> (Running, oneshot::Sender<()>) {
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

pub async fn run(cfg: Config) -> (Running, oneshot::Sender<()>, Arc<ScriptedProber>) {
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

pub fn addr(r: &Running, role: Role) -> SocketAddr {
    r.local_addrs(role)[0]
}

/// A raw HTTP/1.1 request; returns the status and the body.
pub async fn http(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
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

pub async fn json(
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
pub async fn scrape(admin: SocketAddr) -> prometheus_parse::Scrape {
    let (code, body) = http(admin, "GET", "/metrics", None).await;
    assert_eq!(code, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition format")
}

pub fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
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

pub async fn wait_for_metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)], want: f64) {
    wait_for_sample(admin, name, labels, &format!("== {want}"), |v| v == want).await
}

/// Waits until the sample is at least `want` (a counter that other sessions may also move).
#[allow(dead_code)]
pub async fn wait_for_metric_at_least(
    admin: SocketAddr,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
) {
    wait_for_sample(admin, name, labels, &format!(">= {want}"), |v| v >= want).await
}

async fn wait_for_sample(
    admin: SocketAddr,
    name: &str,
    labels: &[(&str, &str)],
    what: &str,
    ok: impl Fn(f64) -> bool,
) {
    let mut last = None;
    for _ in 0..500 {
        let sc = scrape(admin).await;
        let present = sc
            .samples
            .iter()
            .any(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)));
        if present {
            let v = value(&sc, name, labels);
            if ok(v) {
                return;
            }
            last = Some(v);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}{labels:?} never reached {what} (last {last:?})");
}

/// Polls presence (`GET /api/v1/minions` on `admin`) until `minion` is listed with master
/// `master` on its publish port, connected, within `within`; then checks the request master is
/// the same and the pairing `by-address`. Returns its entry; on a timeout the message says
/// `never` and carries `logs()`.
pub async fn listed_by_address(
    admin: SocketAddr,
    minion: &str,
    master: &str,
    within: Duration,
    never: &str,
    logs: impl Fn() -> String,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + within;
    let m = loop {
        let (code, v) = json(admin, "GET", "/api/v1/minions", None).await;
        assert_eq!(code, 200, "{v}");
        if let Some(m) = v["minions"]
            .as_array()
            .and_then(|l| l.iter().find(|m| m["id"] == minion))
            .filter(|m| m["publish_master"] == master && m["connected"] == true)
        {
            break m.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{never}: {v}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(m["request_master"], master, "{m}");
    assert_eq!(m["publish_pairing"], "by-address", "{m}");
    m
}
