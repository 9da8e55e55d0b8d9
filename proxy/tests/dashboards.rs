//! The shipped Grafana dashboard (`examples/grafana/saltgate.json`) and Prometheus alert rules
//! (`examples/prometheus/alerts.yml`) query only metrics saltgate exports, with labels those metrics
//! have. The exported names are read from a running saltgate's `/metrics` (on 127.0.4.x, with every
//! `maxconn` set so the cap gauges show) plus the declared descriptors of [`Metrics`] (counters
//! that nothing has incremented yet are not in `/metrics`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use common::api::*;
use common::*;
use prometheus::core::Collector;
use saltgate_config::{Config, MasterConfig};
use saltgate_proxy::metrics::Metrics;

/// Metric name → its label names.
type Exported = BTreeMap<String, BTreeSet<String>>;

fn repo_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn config(maxconn: bool) -> Config {
    let mut c = FakeCluster { masters: vec![] }.config();
    let any: SocketAddr = "127.0.4.1:0".parse().unwrap();
    c.publish.bind = vec![any];
    c.request.bind = vec![any];
    c.admin.bind = any;
    c.masters = vec![MasterConfig {
        name: "m1".into(),
        host: "127.0.4.20".into(),
        publish_port: 4505,
        request_port: 4506,
        weight: 1,
        maxconn: maxconn.then_some(100),
        backup: false,
        disabled: false,
        check: true,
        health: c.health,
    }];
    if maxconn {
        c.global.maxconn = Some(1000);
        c.publish.maxconn = Some(900);
        c.request.maxconn = Some(900);
    }
    c
}

/// Families and labels in a running saltgate's `/metrics` (from the `# TYPE` lines and samples).
async fn scraped(maxconn: bool) -> Exported {
    let (r, _stop, _p) = run(config(maxconn)).await;
    let admin = r.admin_addr().unwrap();
    wait_for("a first round of checks", || {
        r.masters().iter().all(|m| m.first_round_done())
    })
    .await;
    let (code, text) = http(admin, "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    let mut out = Exported::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, kind) = (it.next().unwrap(), it.next().unwrap());
            let names: Vec<String> = if kind == "histogram" {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect()
            } else {
                vec![name.to_string()]
            };
            for n in names {
                out.entry(n).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = out.entry(line[..name_end].to_string()).or_default();
            if let Some(body) = line[name_end..]
                .strip_prefix('{')
                .and_then(|b| b.split_once('}'))
            {
                for l in label_names(body.0) {
                    labels.insert(l);
                }
            }
        }
    }
    out
}

/// Every metric saltgate declares, scraped or not.
async fn exported() -> Exported {
    let mut out = scraped(true).await;
    let m = Metrics::new();
    let collectors: Vec<Box<dyn Collector>> = vec![
        Box::new(m.sessions_total.clone()),
        Box::new(m.sessions_current.clone()),
        Box::new(m.bytes.clone()),
        Box::new(m.accept_errors.clone()),
        Box::new(m.refused.clone()),
        Box::new(m.check_duration.clone()),
        Box::new(m.check_failures.clone()),
        Box::new(m.state_changes.clone()),
        Box::new(m.connect_errors.clone()),
        Box::new(m.sessions_closed.clone()),
        Box::new(m.reloads.clone()),
        Box::new(m.generation.clone()),
    ];
    for c in &collectors {
        for d in c.desc() {
            let names = if d.fq_name == "saltgate_master_check_duration_seconds" {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{}{s}", d.fq_name))
                    .collect()
            } else {
                vec![d.fq_name.clone()]
            };
            for n in names {
                let labels = out.entry(n.clone()).or_default();
                labels.extend(d.variable_labels.iter().cloned());
                if n.ends_with("_bucket") {
                    labels.insert("le".into());
                }
            }
        }
    }
    out
}

/// Label names in a selector body such as `master="a",state=~"down|up"` (or a sample's labels).
fn label_names(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(op) = rest.find(['=', '!']) {
        let name = rest[..op].trim().trim_start_matches(',').trim();
        if !name.is_empty() {
            out.push(name.to_string());
        }
        // Skip the quoted value.
        let Some(q) = rest[op..].find('"') else { break };
        let value = &rest[op + q + 1..];
        let mut end = 0;
        let mut esc = false;
        for (i, ch) in value.char_indices() {
            match (esc, ch) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        rest = &value[(end + 1).min(value.len())..];
    }
    out
}

/// Problems with the saltgate metrics a query text uses: unknown names, unknown labels.
fn problems(text: &str, exported: &Exported) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(off) = text[i..].find("saltgate_") {
        let start = i + off;
        let prev_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        i = end;
        if !prev_ok {
            continue;
        }
        let name = &text[start..end];
        let Some(labels) = exported.get(name) else {
            out.push(format!("unknown metric {name}"));
            continue;
        };
        if let Some(body) = text[end..]
            .strip_prefix('{')
            .and_then(|b| b.split_once('}'))
        {
            for l in label_names(body.0) {
                if l != "instance" && l != "job" && !labels.contains(&l) {
                    out.push(format!("{name} has no label {l:?} (it has {labels:?})"));
                }
            }
        }
    }
    out
}

fn count_names(text: &str) -> usize {
    text.matches("saltgate_").count()
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported_with_those_labels() {
    let exported = exported().await;
    let dash: serde_json::Value =
        serde_json::from_str(&repo_file("examples/grafana/saltgate.json")).expect("valid JSON");
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {} has no targets", p["title"]));
        assert!(!targets.is_empty(), "panel {} has no targets", p["title"]);
        for t in targets {
            let e = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {}: a target without expr", p["title"]));
            assert!(e.contains("saltgate_"), "panel {}: {e}", p["title"]);
            exprs.push(e.to_string());
        }
    }
    for a in dash["annotations"]["list"].as_array().unwrap() {
        exprs.push(a["expr"].as_str().unwrap().to_string());
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }
    assert!(
        exprs.len() >= 15,
        "the dashboard lost panels: {}",
        exprs.len()
    );
    let all = exprs.join("\n");
    let bad = problems(&all, &exported);
    assert!(
        bad.is_empty(),
        "the dashboard queries what saltgate does not export: {bad:#?}"
    );
    // The panels the issue asks for.
    for needle in [
        "saltgate_master_state",
        "saltgate_master_sessions_current",
        "saltgate_listener_sessions_current",
        "saltgate_master_check_duration_seconds_bucket",
        "saltgate_master_connect_errors_total",
        "saltgate_reloads_total",
        "saltgate_master_sessions_closed_total",
    ] {
        assert!(all.contains(needle), "no panel uses {needle}");
    }
}

#[tokio::test]
async fn every_metric_the_alerts_query_is_exported_with_those_labels() {
    let exported = exported().await;
    let text = repo_file("examples/prometheus/alerts.yml");
    assert!(count_names(&text) >= 8, "the alerts lost their queries");
    let bad = problems(&text, &exported);
    assert!(
        bad.is_empty(),
        "the alerts query what saltgate does not export: {bad:#?}"
    );
    for alert in [
        "SaltgateMasterDown",
        "SaltgateNoMasterUp",
        "SaltgateReloadFailed",
        "SaltgateMasterNearMaxconn",
        "SaltgateListenerNearMaxconn",
        "SaltgateNearGlobalMaxconn",
    ] {
        assert!(
            text.contains(&format!("alert: {alert}\n")),
            "no alert {alert}"
        );
    }
}

#[tokio::test]
async fn the_check_catches_an_unknown_metric_or_label() {
    let exported = exported().await;
    assert_eq!(
        problems("rate(saltgate_master_sesions_total[5m])", &exported),
        ["unknown metric saltgate_master_sesions_total"]
    );
    let bad = problems(
        r#"saltgate_master_state{instance="x",stat="up"}"#,
        &exported,
    );
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("no label \"stat\""), "{bad:?}");
    assert!(problems(
        r#"saltgate_master_state{state=~"down|unresolved", master!="a\"b"}"#,
        &exported
    )
    .is_empty());
    assert!(
        problems("my_saltgate_thing", &exported).is_empty(),
        "only whole names count"
    );
}

#[tokio::test]
async fn the_maxconn_gauges_are_exported_only_when_a_cap_is_set() {
    let with = scraped(true).await;
    for (name, label) in [
        ("saltgate_master_maxconn", Some("master")),
        ("saltgate_listener_maxconn", Some("listener")),
        ("saltgate_global_maxconn", None),
    ] {
        let labels = with
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing with a cap set"));
        if let Some(l) = label {
            assert!(labels.contains(l), "{name}: {labels:?}");
        }
    }
    let without = scraped(false).await;
    for name in [
        "saltgate_master_maxconn",
        "saltgate_listener_maxconn",
        "saltgate_global_maxconn",
    ] {
        assert!(
            !without.contains_key(name),
            "{name} exported with no cap set"
        );
    }
}

/// The "Master state" timeline shows every state saltgate reports (a master in a state the panel
/// does not map would vanish from the timeline): its query selects each state by name and its
/// value mappings give each one a distinct value and a label.
#[test]
fn the_state_timeline_shows_every_master_state() {
    let dash: serde_json::Value =
        serde_json::from_str(&repo_file("examples/grafana/saltgate.json")).expect("valid JSON");
    let panel = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "state-timeline")
        .expect("a state timeline panel");
    let expr = panel["targets"][0]["expr"].as_str().unwrap();
    let options = &panel["fieldConfig"]["defaults"]["mappings"][0]["options"];
    let mut values = BTreeSet::new();
    for s in saltgate_proxy::master::MasterState::ALL {
        let name = s.as_str();
        let sel = format!("state=\"{name}\"}} * ");
        let at = expr
            .find(&sel)
            .unwrap_or_else(|| panic!("the timeline does not select state {name}: {expr}"));
        let value: String = expr[at + sel.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert!(values.insert(value.clone()), "{name}: value {value} reused");
        assert_eq!(
            options[&value]["text"].as_str(),
            Some(name.to_uppercase().as_str()),
            "state {name} (value {value}) has no label in the mappings"
        );
    }
}
