//! The example alert rules for saltgate-master (`examples/prometheus/master-alerts.yml`) query
//! only what a running master exports: every metric, label and label value in their selectors
//! is checked against a scrape of a cluster member on 127.0.1.60 (a member: it exports the peer
//! link counters too). promtool checks the rules' syntax and behaviour (scripts/browser-test.sh).

use std::collections::{BTreeMap, BTreeSet};

use saltgate_config::salt_master::parse_salt_master;

mod common;

/// Metric → label → the values exported.
type Exported = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

async fn exported() -> Exported {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::create_dir_all(dir.path().join("pki")).unwrap();
    std::fs::write(dir.path().join("pki/master.pem"), common::openssl_pem()).unwrap();
    // The peer does not exist: a member starts without its peers and picks them up later.
    let text = format!(
        "id: alerts\ninterface: 127.0.1.60\npublish_port: 0\nret_port: 0\npki_dir: {d}/pki\n\
         cachedir: {d}/cache\nsock_dir: {d}/sock\ncluster_id: c\ncluster_peers: [127.0.1.61:9]\n\
         cluster_pki_dir: {d}/cpki\ncluster_pool_port: 0\ncluster_secret: s3cret\n\
         saltgate_metrics_bind: 127.0.1.60:0\n"
    );
    let config = parse_salt_master(&text, None).unwrap().config;
    let master = common::InProcess::start(config).await;
    let scrape = common::scrape(master.bound.metrics.expect("metrics endpoint")).await;
    master.stop().await;
    let mut out = Exported::new();
    for s in &scrape.samples {
        let labels = out.entry(s.metric.clone()).or_default();
        for (k, v) in s.labels.iter() {
            labels.entry(k.clone()).or_default().insert(v.clone());
        }
    }
    out
}

/// What the rules query that the master does not export, one line each.
fn problems(rules: &str, exported: &Exported) -> Vec<String> {
    let selector = regex::Regex::new(r"(saltgate_master_[a-z_]+)(\{[^}]*\})?").unwrap();
    let matcher = regex::Regex::new(r#"([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
    let mut bad = Vec::new();
    for c in selector.captures_iter(rules) {
        let name = &c[1];
        let Some(labels) = exported.get(name) else {
            bad.push(format!("{name}: not exported"));
            continue;
        };
        let Some(sel) = c.get(2) else { continue };
        for m in matcher.captures_iter(sel.as_str()) {
            let (label, op, value) = (&m[1], &m[2], &m[3]);
            let Some(values) = labels.get(label) else {
                bad.push(format!("{name}: no label {label}"));
                continue;
            };
            let wanted: Vec<&str> = match op {
                "=~" | "!~" => value.split('|').collect(),
                _ => vec![value],
            };
            for w in wanted {
                if !values.contains(w) {
                    bad.push(format!("{name}: {label} is never {w:?}"));
                }
            }
        }
    }
    bad
}

fn rules() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/prometheus/master-alerts.yml"
    );
    std::fs::read_to_string(path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_label_and_value_the_alerts_query_is_exported() {
    let exported = exported().await;
    let rules = rules();
    assert!(
        rules.matches("saltgate_master_").count() >= 5,
        "the alerts lost their queries"
    );
    assert_eq!(problems(&rules, &exported), Vec::<String>::new());
    // The check itself catches an unknown metric, label and value.
    let broken = "saltgate_master_nothing_total saltgate_master_refusals_total{colour=\"x\"} \
                  saltgate_master_refusals_total{reason=~\"bad_tok|no_such_reason\"}";
    assert_eq!(
        problems(broken, &exported),
        vec![
            "saltgate_master_nothing_total: not exported".to_string(),
            "saltgate_master_refusals_total: no label colour".to_string(),
            "saltgate_master_refusals_total: reason is never \"no_such_reason\"".to_string(),
        ]
    );
}
