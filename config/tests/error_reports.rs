//! Issue 12 ("Reliability"): every error of a file in one run, each naming the file, line, field,
//! what is wrong and the fix in saltgate's words.

use std::path::Path;

use saltgate_config::{load, parse, ConfigErrors, Format};

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

fn errors(text: &str) -> ConfigErrors {
    match parse(text, Some(Path::new("saltgate.yaml")), Format::Yaml) {
        Ok(l) => panic!("expected errors, got {:?}\n---\n{text}", l.config),
        Err(e) => e,
    }
}

/// The one error of `text`, as printed.
fn only_error(text: &str) -> String {
    let errs = errors(text);
    assert_eq!(errs.0.len(), 1, "{errs}");
    errs.0[0].to_string()
}

#[test]
fn every_wrong_type_is_reported_in_one_run() {
    let text = format!(
        "health:\n  rise: invalid\n  interval: 60\n{}",
        GOOD.replace("host: 127.0.0.3", "host: 127.0.0.3\n    weight: abc")
            .replace(
                "bind: 127.0.0.1:4506",
                "bind: 127.0.0.1:4506\n    retries: -3"
            )
    );
    let errs = errors(&text);
    let got: Vec<(u32, &str)> = errs
        .0
        .iter()
        .map(|e| (e.at.line, e.field.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (2, "health.rise"),
            (3, "health.interval"),
            (9, "masters[1].weight"),
            (15, "listeners.request.retries"),
        ],
        "{errs}"
    );
    for e in &errs.0 {
        assert!(!e.fix.is_empty(), "{e}");
    }
    assert!(
        errs.0[3].to_string().contains("-3 is out of range"),
        "{errs}"
    );
}

#[test]
fn unknown_and_duplicate_keys_do_not_hide_other_errors() {
    let text = GOOD
        .replace("host: 127.0.0.2", "host: 127.0.0.2\n    wieght: 2")
        .replace(
            "bind: 127.0.0.1:4506",
            "bind: 127.0.0.1:4506\n    retries: lots",
        );
    let errs = errors(&text);
    let fields: Vec<&str> = errs.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["masters[0].wieght", "listeners.request.retries"],
        "{errs}"
    );
}

#[test]
fn messages_read_file_line_column_field_problem_and_fix() {
    let e = only_error(&GOOD.replace("host: 127.0.0.3", "host: 127.0.0.3\n    weight: 999"));
    assert_eq!(
        e,
        "saltgate.yaml:6:13: masters[1].weight: 999 is out of range; write a whole number from 0 to 256"
    );
}

#[test]
fn a_duplicate_key_names_both_lines_in_saltgates_words() {
    let e = only_error(&GOOD.replace("host: 127.0.0.2", "host: 127.0.0.2\n    host: 127.0.0.9"));
    assert!(
        e.contains("masters[0].host: key host appears twice (lines 3 and 4); keep one"),
        "{e}"
    );
    assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
}

#[test]
fn a_yaml_syntax_error_gets_a_syntax_fix() {
    let e = only_error(&GOOD.replace("    host: 127.0.0.3", "    host: [127.0.0.3"));
    assert!(e.contains("YAML syntax error"), "{e}");
    assert!(!e.contains("type this field takes"), "{e}");
    let e = only_error(&GOOD.replace("  - name: b", "  - name: b: c"));
    assert!(e.contains("quote the value"), "{e}");
}

#[test]
fn out_of_range_numbers_name_the_range() {
    let e = only_error(&GOOD.replace(
        "host: 127.0.0.2",
        "host: 127.0.0.2\n    request_port: 70000",
    ));
    assert!(
        e.contains(
            "masters[0].request_port: 70000 is out of range; write a whole number from 1 to 65535"
        ),
        "{e}"
    );
    let e = only_error(&format!("health:\n  rise: -1\n{GOOD}"));
    assert!(
        e.contains("health.rise: -1 is out of range; write a whole number from 1 to 1000"),
        "{e}"
    );
}

#[test]
fn a_null_or_quoted_port_is_refused_not_defaulted() {
    let e = only_error(&GOOD.replace("host: 127.0.0.2", "host: 127.0.0.2\n    publish_port: ~"));
    assert!(
        e.contains("masters[0].publish_port: has no value; remove the key to use the default 4505 or write a port"),
        "{e}"
    );
    let e = only_error(&GOOD.replace(
        "host: 127.0.0.2",
        "host: 127.0.0.2\n    publish_port: \"4505\"",
    ));
    assert!(e.contains("masters[0].publish_port"), "{e}");
    assert!(e.contains("write the port as a number"), "{e}");
}

#[test]
fn a_file_that_is_not_utf8_says_so_and_where() {
    let dir = std::env::temp_dir().join(format!("saltgate-config-utf8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("latin1.yaml");
    let mut bytes = GOOD.as_bytes().to_vec();
    // "name: b\xe9" on line 4: é in Latin-1.
    let at = GOOD.find("name: b").unwrap() + "name: b".len();
    bytes.insert(at, 0xe9);
    std::fs::write(&path, &bytes).unwrap();
    let errs = load(&path, Format::Yaml).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    let e = errs.first();
    assert_eq!((e.at.line, e.at.column), (4, 12), "{e}");
    let s = e.to_string();
    assert!(s.contains("not UTF-8"), "{s}");
    assert!(s.contains(&format!("byte offset {at}")), "{s}");
    assert!(!s.contains("permissions"), "{s}");
}

#[test]
fn haproxy_files_that_are_not_utf8_say_so_too() {
    let dir = std::env::temp_dir().join(format!("saltgate-config-utf8h-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, b"frontend pub\n  bind \xff:4505\n").unwrap();
    let errs = load(&path, Format::Haproxy).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(errs.first().at.line, 2, "{errs}");
    assert!(errs.to_string().contains("not UTF-8"), "{errs}");
}

#[test]
fn an_address_used_twice_points_at_the_line_that_repeats_it() {
    let text = GOOD.replace("bind: 127.0.0.1:4506", "bind: 127.0.0.1:4505");
    let e = only_error(&text);
    assert!(
        e.starts_with("saltgate.yaml:10:11: listeners.request.bind: 127.0.0.1:4505 is also a publish address; "),
        "{e}"
    );
}

#[test]
fn a_file_that_is_not_a_mapping_or_nests_too_deep_is_refused_clearly() {
    let e = only_error("- just\n- a list\n");
    assert!(
        e.contains("expected a mapping of keys, found a list"),
        "{e}"
    );
    assert!(e.contains("masters, listeners"), "{e}");
    let deep = format!("masters: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let e = only_error(&deep);
    assert!(e.contains("too deeply nested"), "{e}");
}

#[test]
fn a_bind_without_a_value_names_the_default() {
    let e = only_error(&GOOD.replace("bind: 127.0.0.1:4505", "bind:"));
    assert!(
        e.contains(
            "listeners.publish.bind: has no value; remove the key to use the default 0.0.0.0:4505"
        ),
        "{e}"
    );
}

#[test]
fn each_kind_of_value_is_refused_with_its_own_fix() {
    let cases = [
        ("    backup: \"true\"", "masters[0].backup: \"true\" is a string, not true or false; write it without quotes: true"),
        ("    backup: maybe", "masters[0].backup: \"maybe\" is not true or false; write true or false"),
        ("    weight: \"2\"", "masters[0].weight: \"2\" is a string, not a number; write the number without quotes: 2"),
        ("    weight: 1.5", "masters[0].weight: \"1.5\" is not a whole number; write a whole number from 0 to 256"),
        ("    weight: ~", "masters[0].weight: has no value; remove the key to use the default 1 or write a whole number from 0 to 256"),
        ("    check: ~", "masters[0].check: has no value; remove the key to use the default true or write true or false"),
        ("    health: 3", "masters[0].health: expected a mapping of keys, found a number; write the keys of masters[0].health on their own indented lines"),
        ("    name: [x]", "masters[0].name: expected text, found a list; write a name"),
    ];
    for (line, want) in cases {
        let text = GOOD.replace(
            "    host: 127.0.0.2",
            &format!("    host: 127.0.0.2\n{line}"),
        );
        let text = if line.contains("name:") {
            GOOD.replace(
                "  - name: a\n    host: 127.0.0.2",
                &format!("  - host: 127.0.0.2\n{line}"),
            )
        } else {
            text
        };
        let e = only_error(&text);
        assert!(e.contains(want), "{line}\n got: {e}\nwant: {want}");
    }
}

#[test]
fn the_queue_keys_load_and_bad_values_name_the_field_and_fix() {
    let text = GOOD.replace(
        "bind: 127.0.0.1:4506",
        "bind: 127.0.0.1:4506\n    timeout_queue: 30s\n    maxqueue: 0",
    );
    let c = parse(&text, None, Format::Yaml).expect("loads").config;
    assert_eq!(
        c.request.timeout_queue,
        Some(std::time::Duration::from_secs(30))
    );
    assert_eq!(c.request.maxqueue, 0, "0 turns the queue off");
    assert_eq!(
        c.publish.timeout_queue, None,
        "unset: timeout_connect applies"
    );
    assert_eq!(c.publish.queue_timeout(), c.publish.timeout_connect);
    assert_eq!(c.publish.maxqueue, 1024);

    let errs = errors(&GOOD.replace(
        "bind: 127.0.0.1:4506",
        "bind: 127.0.0.1:4506\n    timeout_queue: 30\n    maxqueue: -1",
    ));
    let got: Vec<String> = errs.0.iter().map(|e| e.to_string()).collect();
    assert_eq!(got.len(), 2, "{errs}");
    assert!(
        got[0].contains("listeners.request.timeout_queue") && got[0].contains("30s"),
        "{}",
        got[0]
    );
    assert!(
        got[1].contains("listeners.request.maxqueue: -1 is out of range; write a whole number from 0 to 1000000"),
        "{}",
        got[1]
    );
    let e = only_error(&GOOD.replace(
        "bind: 127.0.0.1:4506",
        "bind: 127.0.0.1:4506\n    timeout_queue: 0s",
    ));
    assert!(
        e.contains("listeners.request.timeout_queue: must be greater than zero"),
        "{e}"
    );
}
