use std::time::Duration;

use super::*;
use crate::model::{OnMasterDown, Role};

const FIXTURE: &str = include_str!("../../../examples/haproxy/salt-master-cluster.cfg");

fn ok(text: &str) -> Loaded {
    match parse_haproxy(text, Some(Path::new("haproxy.cfg"))) {
        Ok(l) => l,
        Err(e) => panic!("expected a valid config, got:\n{e}"),
    }
}

fn err(text: &str) -> ConfigError {
    match parse_haproxy(text, Some(Path::new("haproxy.cfg"))) {
        Ok(l) => panic!("expected an error, got {:?}", l.config),
        Err(e) => e.first().clone(),
    }
}

/// The fixture with `extra` inserted after line `after` (1-based).
fn fixture_with(after: usize, extra: &str) -> String {
    let mut lines: Vec<&str> = FIXTURE.lines().collect();
    lines.insert(after, extra);
    lines.join("\n")
}

#[test]
fn seed_fixture_recognises_three_masters_on_both_ports() {
    let l = ok(FIXTURE);
    let c = &l.config;
    let names: Vec<_> = c
        .masters
        .iter()
        .map(|m| {
            (
                m.name.as_str(),
                m.host.as_str(),
                m.publish_port,
                m.request_port,
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("rserve1", "10.27.12.13", 4505, 4506),
            ("rserve2", "10.27.7.126", 4505, 4506),
            ("rserve3", "10.27.3.73", 4505, 4506)
        ]
    );
    assert!(c
        .masters
        .iter()
        .all(|m| m.check && m.weight == 1 && !m.backup && !m.disabled));
    assert_eq!(c.publish.bind[0].to_string(), "10.27.5.116:4505");
    assert_eq!(c.request.bind[0].to_string(), "10.27.5.116:4506");
    assert_eq!(c.publish.timeout_client, Some(Duration::from_secs(86400)));
    assert_eq!(c.publish.timeout_server, Some(Duration::from_secs(86400)));
    assert_eq!(c.request.timeout_client, Some(Duration::from_secs(60)));
    assert_eq!(c.request.timeout_server, Some(Duration::from_secs(60)));
    assert_eq!(c.publish.timeout_connect, Duration::from_secs(10));
    assert!(
        c.publish.access_log && c.request.access_log,
        "option tcplog turns the access log on"
    );
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
}

#[test]
fn saltgate_check_schedule_applies_where_the_file_is_silent() {
    let c = ok(FIXTURE).config;
    let h = c.masters[0].health;
    assert_eq!(
        (
            h.interval,
            h.fastinter,
            h.downinter,
            h.rise,
            h.fall,
            h.timeout,
            h.handshake_timeout
        ),
        (
            Duration::from_secs(1),
            Duration::from_millis(500),
            Duration::from_secs(1),
            2,
            3,
            Duration::from_secs(5),
            Duration::from_secs(1)
        ),
        "a bare `check`: saltgate's schedule (a hung master DOWN within 4 s)"
    );
    assert_eq!(h, crate::model::HealthSettings::default());
    assert_eq!(c.publish.retries, 3);
    assert_eq!(c.request.retries, 3);
}

#[test]
fn an_explicit_inter_carries_fastinter_and_downinter_as_in_haproxy() {
    let text = FIXTURE
        .replace(":4505 check", ":4505 check inter 3s")
        .replace(":4506 check", ":4506 check inter 3s");
    let h = ok(&text).config.masters[0].health;
    assert_eq!(
        (h.interval, h.fastinter, h.downinter),
        (
            Duration::from_secs(3),
            Duration::from_secs(3),
            Duration::from_secs(3)
        )
    );
}

#[test]
fn server_options_and_default_server_are_understood() {
    let text = FIXTURE
        .replace("    balance roundrobin\n    timeout connect 10s\n    timeout server 86400s\n", "    balance roundrobin\n    timeout connect 10s\n    timeout server 86400s\n    default-server inter 5s fastinter 1s downinter 10s rise 4 fall 2 maxconn 500\n")
        .replace("    timeout server 1m\n", "    timeout server 1m\n    default-server inter 5s fastinter 1s downinter 10s rise 4 fall 2 maxconn 500\n")
        .replace("server rserve3 10.27.3.73:4505 check", "server rserve3 10.27.3.73:4505 check weight 3 backup on-marked-down shutdown-sessions")
        .replace("server rserve3 10.27.3.73:4506 check", "server rserve3 10.27.3.73:4506 check weight 3 backup")
        .replace("server rserve2 10.27.7.126:4505 check", "server rserve2 10.27.7.126:4505 check disabled on-marked-down shutdown-sessions")
        .replace("server rserve2 10.27.7.126:4506 check", "server rserve2 10.27.7.126:4506 check disabled")
        .replace("server rserve1 10.27.12.13:4505 check", "server rserve1 10.27.12.13:4505 check on-marked-down shutdown-sessions");
    let c = ok(&text).config;
    let h = c.masters[0].health;
    assert_eq!(
        (h.interval, h.fastinter, h.downinter, h.rise, h.fall),
        (
            Duration::from_secs(5),
            Duration::from_secs(1),
            Duration::from_secs(10),
            4,
            2
        )
    );
    assert_eq!(c.masters[0].maxconn, Some(500));
    assert!(c.masters[1].disabled);
    assert!(c.masters[2].backup && c.masters[2].weight == 3);
    assert_eq!(c.publish.on_master_down, OnMasterDown::Close);
}

#[test]
fn global_and_defaults_sections_are_understood() {
    let text = format!(
        "global\n    log /dev/log local0\n    maxconn 20000\n    daemon\n    hard-stop-after 45s\n\ndefaults\n    mode tcp\n    log global\n    option tcplog\n    retries 5\n    timeout connect 3s\n    timeout client 1m\n    timeout server 1m\n\n{}",
        FIXTURE
            .replace("    timeout connect 10s\n", "")
            .replace("    timeout client 1m\n", "")
            .replace("    timeout server 1m\n", "")
    );
    let l = ok(&text);
    assert_eq!(l.config.global.maxconn, Some(20000));
    assert_eq!(l.config.global.shutdown_grace, Duration::from_secs(45));
    assert_eq!(l.config.request.retries, 5);
    assert_eq!(l.config.request.timeout_connect, Duration::from_secs(3));
    assert_eq!(
        l.config.request.timeout_client,
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        l.config.publish.timeout_client,
        Some(Duration::from_secs(86400)),
        "a frontend's own timeout wins over defaults"
    );
    assert!(
        l.warnings
            .iter()
            .any(|w| w.at.line == 2 && w.message.contains("log")),
        "{:?}",
        l.warnings
    );
    assert!(l
        .warnings
        .iter()
        .any(|w| w.at.line == 4 && w.message.contains("daemon")));
}

#[test]
fn listen_sections_work_like_a_frontend_with_its_backend() {
    let text = "listen salt-pub\n  mode tcp\n  bind 127.0.0.1:4505\n  timeout client 1d\n  timeout server 1d\n  timeout connect 2s\n  server m1 127.0.0.2:4505 check\nlisten salt-req\n  mode tcp\n  bind 127.0.0.1:4506\n  timeout client 1m\n  timeout server 1m\n  timeout connect 2s\n  server m1 127.0.0.2:4506 check\n";
    let c = ok(text).config;
    assert_eq!(c.masters.len(), 1);
    assert_eq!(c.publish.timeout_client, Some(Duration::from_secs(86400)));
    assert!(!c.publish.access_log, "no option tcplog: access log off");
}

#[test]
fn server_without_port_uses_the_frontend_port() {
    let c = ok(&FIXTURE
        .replace("10.27.12.13:4505", "10.27.12.13")
        .replace("10.27.12.13:4506", "10.27.12.13"))
    .config;
    assert_eq!(
        (c.masters[0].publish_port, c.masters[0].request_port),
        (4505, 4506)
    );
}

#[test]
fn unsupported_directives_are_errors_naming_the_line_and_the_fix() {
    let cases: &[(String, u32, &str)] = &[
        (
            fixture_with(3, "    tcp-request connection reject"),
            4,
            "tcp-request",
        ),
        (
            fixture_with(13, "    option httpchk GET /"),
            14,
            "option httpchk",
        ),
        (
            FIXTURE.replace(
                "rserve2 10.27.7.126:4505 check",
                "rserve2 10.27.7.126:4505 check send-proxy",
            ),
            14,
            "send-proxy",
        ),
        (
            FIXTURE.replace(
                "    mode tcp\n    bind 10.27.5.116:4505",
                "    mode http\n    bind 10.27.5.116:4505",
            ),
            2,
            "mode",
        ),
        (
            FIXTURE.replace("balance roundrobin", "balance uri"),
            10,
            "balance",
        ),
        (
            FIXTURE.replace("timeout client 1m", "timeout client 1x"),
            20,
            "timeout client",
        ),
        (fixture_with(0, "resolvers dns"), 1, "resolvers"),
        (
            FIXTURE.replace(
                "default_backend salt-master-req-backend",
                "default_backend nope",
            ),
            21,
            "default_backend",
        ),
    ];
    for (text, line, field) in cases {
        let e = err(text);
        assert_eq!(e.at.line, *line, "{e}");
        assert!(
            e.field.contains(field),
            "field {:?} should name {field:?}: {e}",
            e.field
        );
        assert!(!e.fix.is_empty(), "{e}");
        assert!(
            e.to_string().starts_with(&format!("haproxy.cfg:{line}")),
            "{e}"
        );
    }
}

#[test]
fn a_master_missing_from_one_backend_is_an_error() {
    let e = err(&FIXTURE.replace("    server rserve3 10.27.3.73:4506 check\n", ""));
    assert_eq!(e.at.line, 15);
    assert!(e.message.contains("10.27.3.73"), "{e}");
    assert!(e.fix.contains("both backends"), "{e}");
}

#[test]
fn differing_options_for_one_master_are_an_error() {
    let e = err(&FIXTURE.replace(
        "rserve1 10.27.12.13:4506 check",
        "rserve1 10.27.12.13:4506 check rise 5",
    ));
    assert_eq!(e.at.line, 28);
    assert!(e.fix.contains("same check"), "{e}");
}

#[test]
fn role_comes_from_ports_or_section_names() {
    let c = ok(&FIXTURE.replace(":4505", ":5505").replace(":4506", ":5506")).config;
    assert_eq!(c.publish.bind[0].port(), 5505, "'pub' in the name");
    assert_eq!(c.listener(Role::Request).bind[0].port(), 5506);
    let e = err(&FIXTURE
        .replace(":4505", ":5505")
        .replace("salt-master-pub", "salt-a"));
    assert!(e.message.contains("cannot tell"), "{e}");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    // Each input, and what its error must name: the position, the word, and the fix.
    for (text, want) in [
        (
            "\u{0}\u{1}\u{2}",
            "<config>:1:1: \\u{0}\\u{1}\\u{2}: '\\u{0}\\u{1}\\u{2}' appears before any section; put it inside",
        ),
        // Bidi overrides too (issue 31 item 7: every terminal output escapes them).
        (
            "evil\u{202E}gnp",
            "<config>:1:1: evil\\u{202e}gnp: 'evil\\u{202e}gnp' appears before any section",
        ),
        ("server", "<config>:1:1: server: 'server' appears before any section"),
        ("frontend", "<config>:1:1: frontend: 'frontend' needs a name; write 'frontend <name>'"),
        ("frontend a b", "<config>:1:1: frontend: 'frontend a' takes no further words (found \"b\")"),
        ("global\n maxconn", "<config>:2:2: maxconn: 'maxconn' needs a number"),
        ("\"", "<config>:1:1: unterminated \" quote starting at column 1; close the quote"),
        ("backend x\n server a [::1", "<config>:2:2: server a: \"[::1\": missing ']' after the IPv6 address"),
        ("backend x\n server a 1.2.3.4:+1", "<config>:2:2: server a: \"1.2.3.4:+1\": port offsets are not supported"),
    ] {
        let err = match parse_haproxy(text, None) {
            Ok(_) => panic!("{text:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with(want), "{text:?}: {err}");
    }
}

/// Every directive this parser knows, cut short and followed by garbage, in every section: errors,
/// never a panic. (A deterministic sweep; the fuzz target does the random search.)
#[test]
fn truncated_and_garbled_directives_never_panic() {
    let directives = [
        "timeout client 1m", "timeout", "bind 1.2.3.4:4505 v4v6", "server a 1.2.3.4:4505 check inter 2s rise 2 fall 3 weight 1 maxconn 5 on-marked-down shutdown-sessions",
        "default-server inter 1s", "balance roundrobin", "retries 3", "maxconn 10", "backlog 5", "option tcplog", "no option tcplog",
        "mode tcp", "log global", "default_backend b", "maxconn", "hard-stop-after 5s", "use_backend x", "acl a b",
    ];
    let sections = ["global", "defaults", "frontend f", "backend b", "listen l"];
    let junk = [
        "",
        "\"",
        "'",
        "\\",
        "#",
        "-1",
        "99999999999999999999",
        "1.2.3.4:",
        "[::1",
        ":",
        "+1",
    ];
    for sec in sections {
        for d in directives {
            let words: Vec<&str> = d.split(' ').collect();
            for cut in 0..=words.len() {
                for j in junk {
                    let line = format!("{} {j}", words[..cut].join(" "));
                    let _ = parse_haproxy(&format!("{sec}\n    {line}\n"), None);
                }
            }
        }
    }
}

#[test]
fn a_host_port_used_twice_is_an_error_naming_the_line() {
    // Found by the haproxy_import fuzz target: a request server on the publish port.
    let e = err(&FIXTURE.replace("rserve3 10.27.3.73:4506", "rserve3 10.27.3.73:4505"));
    assert_eq!(e.at.line, 30, "{e}");
    assert!(e.message.contains("10.27.3.73:4505"), "{e}");
}

#[test]
fn the_same_address_on_both_frontends_is_an_error() {
    // Found by the haproxy_import fuzz target.
    let e = err(&FIXTURE.replace("bind 10.27.5.116:4506", "bind 10.27.5.116:4505"));
    assert!(e.message.contains("bound by both"), "{e}");
}

#[test]
fn zero_idle_timeouts_mean_none_as_in_haproxy_and_zero_check_times_are_errors() {
    // Found by the haproxy_import fuzz target: `timeout client 0m` was imported as a zero the
    // YAML then refused.
    let c = ok(&FIXTURE.replace("timeout client 1m", "timeout client 0m")).config;
    assert_eq!(c.request.timeout_client, None);
    let back = crate::parse(&crate::emit::to_yaml(&c, "t"), None, crate::Format::Yaml)
        .unwrap()
        .config;
    assert_eq!(back, c);
    assert!(err(&FIXTURE.replace(
        "timeout connect 10s\n    timeout server 1m",
        "timeout connect 0\n    timeout server 1m"
    ))
    .message
    .contains("greater than zero"));
    assert!(err(&FIXTURE.replace(
        "rserve1 10.27.12.13:4505 check",
        "rserve1 10.27.12.13:4505 check inter 0"
    ))
    .message
    .contains("greater than zero"));
}

#[test]
fn an_unsupported_directive_does_not_hide_the_checks_after_it() {
    // Line 4 is refused while reading; line 21 names a backend that does not exist, which only the
    // conversion finds. Both must be reported in one run.
    let text = fixture_with(3, "    tcp-request connection reject").replace(
        "default_backend salt-master-req-backend",
        "default_backend nope",
    );
    let errs = parse_haproxy(&text, Some(Path::new("haproxy.cfg"))).unwrap_err();
    let lines: Vec<u32> = errs.0.iter().map(|e| e.at.line).collect();
    assert_eq!(lines, [4, 22], "{errs}");
    assert!(
        errs.0[1].message.contains("\"nope\" is not defined"),
        "{errs}"
    );
}

#[test]
fn every_refused_line_is_reported_with_its_range() {
    let text = FIXTURE
        .replace(
            "rserve1 10.27.12.13:4505 check",
            "rserve1 10.27.12.13:4505 check rise 0",
        )
        .replace("balance roundrobin", "balance uri")
        .replace("timeout client 1m", "timeout client 1x");
    let errs = parse_haproxy(&text, Some(Path::new("haproxy.cfg"))).unwrap_err();
    let lines: Vec<u32> = errs.0.iter().map(|e| e.at.line).collect();
    assert_eq!(lines, [10, 13, 20, 25], "{errs}");
    assert!(
        errs.0[1]
            .to_string()
            .contains("rise: 0 is out of range; write a whole number from 1 to 1000"),
        "{errs}"
    );
}

#[test]
fn every_refused_server_option_on_a_line_is_reported() {
    let text = FIXTURE.replace(
        "rserve2 10.27.7.126:4505 check",
        "rserve2 10.27.7.126:4505 check send-proxy slowstart 10s rise 0 agent-check",
    );
    let errs = parse_haproxy(&text, Some(Path::new("haproxy.cfg"))).unwrap_err();
    let fields: Vec<&str> = errs.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields.len(), 4, "{errs}");
    assert_eq!(fields[0], "send-proxy", "{errs}");
    assert_eq!(fields[1], "slowstart", "{errs}");
    assert_eq!(fields[2], "server rserve2 rise", "{errs}");
    assert_eq!(fields[3], "agent-check", "{errs}");
}

#[test]
fn errors_point_at_the_line_and_column_of_the_directive() {
    let e = err(&FIXTURE.replace("timeout client 1m", "timeout client 1x"));
    assert!(
        e.to_string()
            .starts_with("haproxy.cfg:20:5: timeout client: "),
        "{e}"
    );
}

#[test]
fn timeout_queue_is_imported_and_defaults_to_timeout_connect() {
    // Without it, HAProxy's queue wait is `timeout connect` (its manual: "if unspecified, the same
    // value as the backend's connection timeout").
    let c = ok(FIXTURE).config;
    assert_eq!(c.request.timeout_queue, None);
    assert_eq!(c.request.queue_timeout(), Duration::from_secs(10));
    // In the request backend only (line 26 is its `timeout connect`).
    let c = ok(&fixture_with(26, "    timeout queue 30s")).config;
    assert_eq!(c.request.timeout_queue, Some(Duration::from_secs(30)));
    assert_eq!(c.request.queue_timeout(), Duration::from_secs(30));
    assert_eq!(c.publish.timeout_queue, None);
    // Through the YAML it converts to, unchanged.
    let back = crate::parse(&crate::emit::to_yaml(&c, "t"), None, crate::Format::Yaml)
        .expect("emitted YAML loads");
    assert_eq!(
        back.config.request.timeout_queue,
        Some(Duration::from_secs(30))
    );
    assert_eq!(back.config.request.maxqueue, c.request.maxqueue);
    // From `defaults`, as every timeout.
    let text = format!("defaults\n    timeout queue 5s\n\n{FIXTURE}");
    let c = ok(&text).config;
    assert_eq!(c.publish.timeout_queue, Some(Duration::from_secs(5)));
    assert_eq!(c.request.timeout_queue, Some(Duration::from_secs(5)));
}

#[test]
fn a_zero_or_misplaced_timeout_queue_is_an_error() {
    let e = err(&fixture_with(26, "    timeout queue 0"));
    assert_eq!(e.field, "timeout queue");
    assert!(e.to_string().contains("greater than zero"), "{e}");
    let e = err(&fixture_with(5, "    timeout queue 5s"));
    assert!(e.to_string().contains("backend"), "{e}");
}

#[test]
fn balance_first_is_imported_with_failback_at_once_as_haproxy() {
    let l = ok(&FIXTURE.replace("balance roundrobin", "balance first"));
    for role in Role::ALL {
        let lc = l.config.listener(role);
        if lc.balance == crate::model::Balance::First {
            assert_eq!(
                lc.failback,
                crate::model::Failback::After(std::time::Duration::ZERO)
            );
        }
    }
    assert!(l
        .config
        .listeners()
        .iter()
        .any(|lc| lc.balance == crate::model::Balance::First));
}

#[test]
fn bind_freebind_becomes_freebind_on_that_listener() {
    let text = "listen salt-pub\n  mode tcp\n  bind 127.0.0.1:4505 freebind\n  timeout client 1d\n  timeout server 1d\n  timeout connect 2s\n  server m1 127.0.0.2:4505 check\nlisten salt-req\n  mode tcp\n  bind 127.0.0.1:4506\n  timeout client 1m\n  timeout server 1m\n  timeout connect 2s\n  server m1 127.0.0.2:4506 check\n";
    let l = ok(text);
    assert!(l.config.publish.freebind && !l.config.request.freebind);
    let yaml = crate::emit::to_yaml(&l.config, "test");
    assert!(yaml.contains("freebind: true"), "{yaml}");
    let back = crate::yaml::parse_yaml(&yaml, None).unwrap();
    assert!(back.publish.freebind && !back.request.freebind);
}
