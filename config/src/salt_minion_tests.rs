//! Tests of the Salt minion config reader (`salt_minion.rs`).

use super::*;

fn ok(text: &str) -> LoadedMinion {
    parse_minion(text, Some(Path::new("minion"))).unwrap_or_else(|e| panic!("{e}"))
}

fn err(text: &str) -> ConfigError {
    parse_minion(text, Some(Path::new("minion")))
        .expect_err("must fail")
        .first()
        .clone()
}

#[test]
fn empty_file_gives_salt_defaults() {
    let c = ok("").config;
    assert_eq!(c, MinionConfig::default());
    assert_eq!(c.masters[0].host, "salt");
    assert_eq!(c.masters[0].port, 4506);
    assert_eq!(c.acceptance_wait_time, Duration::from_secs(10));
    assert_eq!(c.auth_tries, 7);
    assert_eq!(c.recon_max, Duration::from_millis(10000));
}

#[test]
fn master_list_with_ports_and_failover_keys_parse() {
    let c = ok(
        "id: m1\nmaster:\n  - 10.0.0.1\n  - 10.0.0.2:5506\n  - '[::1]:7'\nmaster_port: 4510\n\
                master_type: failover\nmaster_alive_interval: 5\nmaster_failback: True\n",
    )
    .config;
    assert_eq!(c.id.as_deref(), Some("m1"));
    assert!(c.master_is_list);
    assert_eq!(c.masters[0].port, 4510);
    assert_eq!(c.masters[1].port, 5506);
    assert_eq!(c.masters[2].host, "::1");
    assert_eq!(c.master_type, MasterType::Failover);
    assert_eq!(c.master_failback_interval, Duration::from_secs(5));
}

#[test]
fn unknown_and_unused_keys_are_warned_not_refused() {
    let l = ok("master: m\nlog_level: debug\nmastr: x\n");
    assert_eq!(l.warnings.len(), 2);
    assert!(l.warnings[1].message.contains("mastr"));
    assert_eq!(l.warnings[1].at.line, 3);
}

#[test]
fn bad_values_name_line_key_and_fix() {
    let e = err("master: m\nauth_tries: many\n");
    assert_eq!((e.at.line, e.field.as_str()), (2, "auth_tries"));
    assert!(e.fix.contains("whole number"));
    let e = err("master_type: distributed\n");
    assert_eq!(e.field, "master_type");
    let e = err("master: [a, 'b:0']\n");
    assert!(e.message.contains("port"), "{e}");
    let e = err("master_type: failover\nmaster: one\n");
    assert!(e.message.contains("list"), "{e}");
    let e = err("master_finger: nope\n");
    assert_eq!(e.field, "master_finger");
    let e = err("id: a/b\n");
    assert_eq!(e.field, "id");
}

#[test]
fn not_yaml_is_an_error_with_a_position() {
    let e = err("master: [unclosed\n");
    assert!(e.at.line >= 1, "{e}");
}

#[test]
fn host_port_split() {
    assert_eq!(split_host_port("a").unwrap(), ("a".into(), None));
    assert_eq!(split_host_port("a:1").unwrap(), ("a".into(), Some(1)));
    assert_eq!(split_host_port("::1").unwrap(), ("::1".into(), None));
    assert!(split_host_port("a:x").is_err());
    assert!(split_host_port("").is_err());
}

#[test]
fn source_address_is_an_ip_and_a_name_is_refused() {
    let c = ok("master: m\nsource_address: 127.16.0.7\n").config;
    assert_eq!(c.source_address, Some("127.16.0.7".parse().unwrap()));
    assert_eq!(ok("source_address: ''\n").config.source_address, None);
    let e = err("master: m\nsource_address: eth0.example\n");
    assert_eq!((e.at.line, e.field.as_str()), (2, "source_address"));
    assert!(e.fix.contains("IP address"), "{e}");
}

#[test]
fn multimaster_pki_keys_are_read_not_warned() {
    let l = ok(
        "master: m\nverify_master_pubkey_sign: True\nalways_verify_signature: yes\n\
                master_sign_key_name: mm_sign\n",
    );
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let c = l.config;
    assert!(c.verify_master_pubkey_sign && c.always_verify_signature);
    assert_eq!(c.master_sign_key_name, "mm_sign");
    let d = ok("master: m\nmaster_sign_key_name: master_sign\n");
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(MinionConfig::default().master_sign_key_name, "master_sign");
    assert!(!MinionConfig::default().verify_master_pubkey_sign);
    let e = err("master: m\nmaster_sign_key_name: ../x\n");
    assert_eq!((e.field.as_str(), e.at.line), ("master_sign_key_name", 2));
    let e = err("master: m\nverify_master_pubkey_sign: maybe\n");
    assert_eq!(e.field, "verify_master_pubkey_sign");
}
