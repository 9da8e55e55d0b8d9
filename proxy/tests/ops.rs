//! Operating saltgate: metrics, every admin route (and its refusals), drain, disable, enable, and
//! hot reload (including 200 reloads under 500 streaming sessions).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::api::*;
use common::*;
use saltgate_config::Role;

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
    // The client may see the close before the session's teardown counts it.
    wait_for_metric(
        admin,
        "saltgate_master_sessions_closed_total",
        &[("port", "request"), ("reason", "master-down")],
        1.0,
    )
    .await;
    let sc = scrape(admin).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_avoids_the_master_then_closes_its_sessions_at_the_deadline() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let mut cfg = c.config();
    // Long enough for the admin call, connects and echo below on a loaded machine.
    cfg.global.drain_timeout = Duration::from_secs(2);
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
        t0.elapsed() >= Duration::from_millis(1950),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_cancels_a_pending_drain_deadline() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.drain_timeout = Duration::from_millis(300);
    let (r, _stop, _p) = run(cfg).await;
    let (mut on_a, na) = connect(addr(&r, Role::Publish)).await;
    let (mut on_b, nb) = connect(addr(&r, Role::Publish)).await;
    assert_eq!((na.as_str(), nb.as_str()), ("a", "b"));
    r.drain("a").unwrap();
    r.enable("a").unwrap();
    // b's drain starts after a's, with the same deadline: once b's session is closed, a's
    // (cancelled) deadline has passed too. An awaited event, not a sleep.
    r.drain("b").unwrap();
    assert!(closed(&mut on_b).await, "b's drain deadline ran out");
    assert_eq!(echo(&mut on_a, b"kept").await, b"kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    // That no more close once it is UP is checked with paused time in master.rs
    // (`a_paced_close_stops_when_the_master_comes_back_up`); here: it stopped well short of 40.
    let left = a.session_count(Role::Publish);
    assert!(
        left > 10,
        "the master came back early: {left} sessions left"
    );
}

#[tokio::test]
async fn sessions_route_pages_by_id() {
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop, _p) = run(c.config()).await;
    let admin = r.admin_addr().unwrap();
    let mut held = Vec::new();
    for i in 0..5 {
        let role = if i % 2 == 0 {
            Role::Publish
        } else {
            Role::Request
        };
        held.push(connect(addr(&r, role)).await.0);
    }
    let mut ids = Vec::new();
    let mut path = "/api/v1/sessions?limit=2".to_string();
    let mut pages = 0;
    loop {
        let (code, page) = json(admin, "GET", &path, None).await;
        assert_eq!(code, 200, "{page}");
        pages += 1;
        let got: Vec<u64> = page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_u64().unwrap())
            .collect();
        assert!(got.len() <= 2, "{page}");
        ids.extend(got);
        match page["next_after"].as_u64() {
            Some(after) => path = format!("/api/v1/sessions?limit=2&after={after}"),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        (ids.len(), sorted),
        (5, ids.clone()),
        "every session once, by id"
    );
    let (code, e) = json(admin, "GET", "/api/v1/sessions?limit=0", None).await;
    assert_eq!(code, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("limit"), "{e}");
}
