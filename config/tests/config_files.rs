//! Every shipped configuration parses; import output loads back unchanged; YAML errors name the
//! file, line and field.

use std::path::Path;
use std::time::Duration;

use saltgate_config::{emit, load, parse, Format, Role};

fn repo(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

#[test]
fn every_shipped_example_parses() {
    let mut n = 0;
    for entry in std::fs::read_dir(repo("examples"))
        .unwrap()
        .chain(std::fs::read_dir(repo("examples/haproxy")).unwrap())
    {
        let path = entry.unwrap().path();
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("yaml") => Format::Yaml,
            Some("cfg") => Format::Haproxy,
            _ => continue,
        };
        if let Err(e) = load(&path, format) {
            panic!("{} does not parse:\n{e}", path.display());
        }
        n += 1;
    }
    assert!(n >= 3, "found only {n} examples");
}

#[test]
fn embedded_default_parses() {
    let c = parse(saltgate_config::EMBEDDED_DEFAULT, None, Format::Yaml)
        .unwrap()
        .config;
    assert_eq!(c.masters.len(), 3);
    assert_eq!(c.publish.bind[0].to_string(), "127.0.0.1:4505");
}

#[test]
fn imported_fixture_loads_back_as_the_same_config() {
    for f in [
        "examples/haproxy/salt-master-cluster.cfg",
        "examples/haproxy/salt-master-cluster-loopback.cfg",
    ] {
        let from_haproxy = load(&repo(f), Format::Haproxy).unwrap().config;
        let yaml = emit::to_yaml(&from_haproxy, f);
        let back = match parse(&yaml, Some(Path::new("imported.yaml")), Format::Yaml) {
            Ok(l) => l.config,
            Err(e) => panic!("emitted YAML does not load:\n{e}\n---\n{yaml}"),
        };
        assert_eq!(back, from_haproxy, "{yaml}");
    }
}

#[test]
fn timeouts_and_none_round_trip_through_yaml() {
    let mut c = load(
        &repo("examples/haproxy/salt-master-cluster.cfg"),
        Format::Haproxy,
    )
    .unwrap()
    .config;
    c.publish.timeout_client = None;
    c.request.timeout_server_fin = Some(Duration::from_millis(1500));
    c.masters[1].health.rise = 7;
    c.masters[2].maxconn = Some(10);
    let back = parse(&emit::to_yaml(&c, "test"), None, Format::Yaml)
        .unwrap()
        .config;
    assert_eq!(back, c);
}

const GOOD: &str = "masters:
  - name: a
    host: 127.0.0.2
  - name: b
    host: 127.0.0.3
listeners:
  publish:
    bind: 127.0.0.1:4505
  request:
    bind: 127.0.0.1:4506
";

#[test]
fn yaml_defaults_are_the_documented_ones() {
    let c = parse(GOOD, None, Format::Yaml).unwrap().config;
    assert_eq!(
        c.listener(Role::Publish).timeout_client,
        Some(Duration::from_secs(86400))
    );
    assert_eq!(
        c.listener(Role::Request).timeout_client,
        Some(Duration::from_secs(60))
    );
    let h = c.masters[0].health;
    assert_eq!(
        (
            h.interval,
            h.fastinter,
            h.downinter,
            h.timeout,
            h.handshake_timeout
        ),
        (
            Duration::from_secs(1),
            Duration::from_millis(500),
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(1)
        )
    );
    assert_eq!(
        (c.masters[0].publish_port, c.masters[0].request_port),
        (4505, 4506)
    );
}

#[test]
fn handshake_timeout_is_read_globally_and_per_master_and_survives_emit() {
    let text = GOOD
        .replace(
            "masters:\n",
            "health:\n  handshake_timeout: 700ms\nmasters:\n",
        )
        .replace(
            "    host: 127.0.0.3\n",
            "    host: 127.0.0.3\n    health: {handshake_timeout: 2s}\n",
        );
    let c = parse(&text, None, Format::Yaml).unwrap().config;
    assert_eq!(c.health.handshake_timeout, Duration::from_millis(700));
    assert_eq!(
        c.masters[0].health.handshake_timeout,
        Duration::from_millis(700)
    );
    assert_eq!(
        c.masters[1].health.handshake_timeout,
        Duration::from_secs(2)
    );
    let again = parse(&emit::to_yaml(&c, "test"), None, Format::Yaml)
        .unwrap()
        .config;
    assert_eq!(again, c);
    let bad = GOOD.replace("masters:\n", "health:\n  handshake_timeout: 1\nmasters:\n");
    let err = parse(&bad, None, Format::Yaml).unwrap_err().to_string();
    assert!(err.contains("health.handshake_timeout"), "{err}");
}

#[test]
fn yaml_errors_name_file_line_and_field() {
    let cases = [
        (
            GOOD.replace(
                "    bind: 127.0.0.1:4506",
                "    bind: 127.0.0.1:4506\n    timeout_client: 60",
            ),
            11,
            "listeners.request.timeout_client",
            "60s",
        ),
        (
            GOOD.replace(
                "    bind: 127.0.0.1:4506",
                "    bind: 127.0.0.1:4506\n    retriez: 3",
            ),
            11,
            "listeners.request.retriez",
            "unknown key",
        ),
        (
            GOOD.replace("host: 127.0.0.3", "host: 127.0.0.3\n    weight: lots"),
            6,
            "masters[1].weight",
            "\"lots\" is not a whole number; write a whole number from 0 to 256",
        ),
        (
            GOOD.replace("name: b", "name: a"),
            4,
            "masters[1].name",
            "duplicate",
        ),
        (
            GOOD.replace("bind: 127.0.0.1:4505", "bind: 127.0.0.1"),
            8,
            "listeners.publish.bind",
            "no port",
        ),
        (
            GOOD.replace("  request:\n", "  request:\n    balance: random\n"),
            10,
            "listeners.request.balance",
            "unknown balance",
        ),
        (
            GOOD.replace("    host: 127.0.0.2\n", ""),
            2,
            "masters[0].host",
            "missing key host",
        ),
    ];
    for (text, line, field, msg) in cases {
        let errs = parse(&text, Some(Path::new("saltgate.yaml")), Format::Yaml).unwrap_err();
        let e = errs.first();
        assert_eq!(e.at.line, line, "{e}\n---\n{text}");
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().contains(msg), "{e}");
        assert!(
            e.to_string().starts_with(&format!("saltgate.yaml:{line}:")),
            "{e}"
        );
        assert!(!e.fix.is_empty());
    }
}

#[test]
fn all_validation_errors_are_reported_at_once() {
    let text = GOOD.replace("name: b", "name: a").replace(
        "bind: 127.0.0.1:4506",
        "bind: 127.0.0.1:4506\n    balance: nope",
    );
    let errs = parse(&text, None, Format::Yaml).unwrap_err();
    assert_eq!(errs.0.len(), 2, "{errs}");
}

#[test]
fn threads_is_read_range_checked_emitted_and_imported_from_nbthread() {
    let c = parse(GOOD, None, Format::Yaml).unwrap().config;
    assert_eq!(c.global.threads, None, "unset: one per CPU");
    let text = GOOD.replace("masters:\n", "global:\n  threads: 3\nmasters:\n");
    let c = parse(&text, None, Format::Yaml).unwrap().config;
    assert_eq!(c.global.threads, Some(3));
    let again = parse(&emit::to_yaml(&c, "test"), None, Format::Yaml)
        .unwrap()
        .config;
    assert_eq!(again, c);
    for bad in ["0", "2000", "two"] {
        let text = GOOD.replace(
            "masters:\n",
            &format!("global:\n  threads: {bad}\nmasters:\n"),
        );
        let err = parse(&text, None, Format::Yaml).unwrap_err().to_string();
        assert!(err.contains("global.threads"), "{bad}: {err}");
    }
    let ha = format!(
        "global\n    nbthread 2\n\n{}",
        std::fs::read_to_string(repo("examples/haproxy/salt-master-cluster-loopback.cfg")).unwrap()
    );
    let c = parse(&ha, None, Format::Haproxy).unwrap().config;
    assert_eq!(
        c.global.threads,
        Some(2),
        "HAProxy's nbthread is global.threads"
    );
}
