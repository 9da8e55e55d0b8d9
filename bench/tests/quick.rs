//! `saltgate-bench --quick all` end to end: every scenario runs against direct, HAProxy and
//! saltgate, and the JSON, Markdown and PNG come out whole. Checks that it runs, not figures.
//! Needs HAProxy (installed by the bench with apt-get if missing) and builds the release
//! `saltgate`, `saltgate-master` and `saltgate-minion` (`cargo build --release -p
//! saltgate-proxy -p saltgate-master -p saltgate-minion`) unless SALTGATE_BIN,
//! SALTGATE_MASTER_BIN and SALTGATE_MINION_BIN name them.

use std::process::Command;

#[test]
fn quick_run_covers_every_scenario_and_writes_json_markdown_and_chart() {
    let out = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let res = Command::new(env!("CARGO_BIN_EXE_saltgate-bench"))
        .args(["--quick", "--json", "--out"])
        .arg(out.path())
        .arg("all")
        .output()
        .expect("run saltgate-bench");
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        res.status.success(),
        "saltgate-bench --quick all failed:\n{stderr}"
    );
    eprintln!("quick run took {:?}", started.elapsed());

    let report: serde_json::Value = serde_json::from_slice(&res.stdout).expect("JSON on stdout");
    let rows = report["rows"].as_array().expect("rows");
    for scenario in ["idle", "connect", "rr", "throughput", "storm", "swarm"] {
        let with_ratio = rows
            .iter()
            .filter(|r| r["scenario"] == scenario && r["ratio"].is_f64())
            .count();
        assert!(
            with_ratio > 0,
            "{scenario}: no saltgate/HAProxy ratio in {rows:#?}"
        );
    }
    // Every goal of the issue is judged (met or not), whatever the figures.
    let judged = rows.iter().filter(|r| r["met"].is_boolean()).count();
    assert!(judged >= 4, "only {judged} goals judged");
    assert!(report["meta"]["loadavg_before"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    let samples = report["samples"].as_array().expect("samples");
    assert!(samples.iter().any(|s| s["target"] == "direct"));
    // The swarm ran through every target: all minions authenticated and test.ping answered
    // by all (the scenario fails otherwise), with the masters' CPU and the proxies' RSS.
    for target in ["direct", "haproxy", "saltgate"] {
        for figure in [
            "test.ping: time until every return",
            "test.ping: publish to receipt p99",
            "masters' CPU per minion auth",
        ] {
            assert!(
                samples.iter().any(|s| s["scenario"] == "swarm"
                    && s["figure"] == figure
                    && s["target"] == target),
                "swarm via {target}: no {figure:?}"
            );
        }
    }
    assert!(rows.iter().any(|r| r["scenario"] == "swarm"
        && r["figure"] == "RSS per session"
        && r["ratio"].is_f64()));
    // saltgate also served the swarm in cluster fan-out mode (issue 13), every return received.
    for figure in [
        "test.ping: time until every return",
        "masters' CPU per test.ping return",
        "test.ping: publish to receipt p50",
        "RSS per session",
    ] {
        assert!(
            samples.iter().any(|s| s["scenario"] == "swarm"
                && s["figure"] == figure
                && s["target"] == "saltgate"
                && s["case"].as_str().is_some_and(|c| c.ends_with("fan-out"))),
            "swarm via saltgate in fan-out mode: no {figure:?}"
        );
    }

    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.starts_with("| scenario | figure |"), "{md}");
    let png = std::fs::read(out.path().join("ratios.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn an_unknown_scenario_is_refused_naming_the_valid_ones() {
    let res = Command::new(env!("CARGO_BIN_EXE_saltgate-bench"))
        .arg("idel")
        .output()
        .expect("run saltgate-bench");
    assert_eq!(res.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        stderr.contains("\"idel\"") && stderr.contains("throughput"),
        "{stderr}"
    );
}
