//! Issue 12, item 4: an admin API reachable beyond loopback without a token is refused unless the
//! operator writes `admin.allow_unauthenticated: true`; the model then says so, for the proxy to warn.

use std::path::Path;

use saltgate_config::{parse, AdminConfig, Format};

const BASE: &str = "masters:
  - name: a
    host: 127.0.0.2
listeners:
  publish:
    bind: 127.0.0.1:4505
  request:
    bind: 127.0.0.1:4506
";

fn with_admin(admin: &str) -> Result<AdminConfig, String> {
    let text = format!("{BASE}admin:\n{admin}");
    parse(&text, Some(Path::new("saltgate.yaml")), Format::Yaml)
        .map(|l| l.config.admin)
        .map_err(|e| e.to_string())
}

#[test]
fn admin_beyond_loopback_without_a_token_is_refused() {
    for bind in ["0.0.0.0:9505", "10.1.2.3:9505", "[::]:9505"] {
        let e = with_admin(&format!("  bind: \"{bind}\"\n")).unwrap_err();
        assert!(
            e.starts_with("saltgate.yaml:10:9: admin.bind: "),
            "{bind}: {e}"
        );
        assert!(e.contains("no token"), "{e}");
        assert!(e.contains("admin.allow_unauthenticated: true"), "{e}");
    }
}

#[test]
fn allow_unauthenticated_accepts_the_risk_and_the_model_flags_it() {
    let a = with_admin("  bind: 0.0.0.0:9505\n  allow_unauthenticated: true\n").unwrap();
    assert!(a.allow_unauthenticated);
    assert!(a.exposed_without_token());
}

#[test]
fn loopback_a_token_or_a_disabled_api_needs_no_opt_in() {
    for admin in [
        "  bind: 127.0.0.1:9505\n",
        "  bind: \"[::1]:9505\"\n",
        "  bind: 0.0.0.0:9505\n  token_file: /etc/saltgate/admin.token\n",
        "  bind: 0.0.0.0:9505\n  enabled: false\n",
    ] {
        let a = with_admin(admin).unwrap_or_else(|e| panic!("{admin}: {e}"));
        assert!(!a.exposed_without_token(), "{admin}");
    }
}

#[test]
fn allow_unauthenticated_must_be_a_boolean() {
    let e = with_admin("  allow_unauthenticated: yes please\n").unwrap_err();
    assert!(e.contains("admin.allow_unauthenticated"), "{e}");
    assert!(e.contains("write true or false"), "{e}");
}

#[test]
fn a_bind_moved_after_loading_is_checked_again() {
    let mut a = with_admin("  bind: 127.0.0.1:9505\n").unwrap();
    assert!(a.exposure_refusal().is_none());
    a.bind = "0.0.0.0:9505".parse().unwrap();
    assert!(a.exposure_refusal().is_some());
    a.allow_unauthenticated = true;
    assert!(a.exposure_refusal().is_none());
}

/// Issue 31 item 5: the admin listener's connection bounds are keys, with the defaults the
/// flood tests were written against.
#[test]
fn admin_connection_limits_are_keys_with_safe_defaults() {
    use std::time::Duration;
    let d = with_admin("  enabled: true\n").unwrap().limits;
    assert_eq!(d, saltgate_config::AdminLimits::default());
    assert_eq!(
        (d.max_connections, d.max_waiting),
        (64, 256),
        "documented defaults"
    );
    assert_eq!(d.unauthenticated_header_timeout, Duration::from_secs(2));
    let l = with_admin(
        "  max_connections: 8\n  max_waiting: 1000\n  header_timeout: 3s\n  \
         unauthenticated_header_timeout: 750ms\n  connection_lifetime: 5m\n",
    )
    .unwrap()
    .limits;
    assert_eq!(l.max_connections, 8);
    assert_eq!(l.max_waiting, 1000);
    assert_eq!(l.header_timeout, Duration::from_secs(3));
    assert_eq!(l.unauthenticated_header_timeout, Duration::from_millis(750));
    assert_eq!(l.connection_lifetime, Duration::from_secs(300));
    // What saltgate writes (import-haproxy, reload dumps) reads back the same.
    let full = saltgate_config::parse(
        &format!("{BASE}admin:\n  max_connections: 8\n  unauthenticated_header_timeout: 750ms\n"),
        None,
        Format::Yaml,
    )
    .unwrap()
    .config;
    let back = saltgate_config::parse(
        &saltgate_config::emit::to_yaml(&full, "test"),
        None,
        Format::Yaml,
    )
    .unwrap()
    .config;
    assert_eq!(back.admin.limits, full.admin.limits);
}

#[test]
fn bad_admin_limits_name_the_key_and_the_fix() {
    for (text, key, fix) in [
        ("  max_connections: 0\n", "admin.max_connections", "1 to"),
        ("  max_waiting: many\n", "admin.max_waiting", "whole number"),
        ("  header_timeout: 0s\n", "admin.header_timeout", "positive"),
        (
            "  unauthenticated_header_timeout: 5\n",
            "admin.unauthenticated_header_timeout",
            "unit",
        ),
        (
            "  connection_lifetime: soon\n",
            "admin.connection_lifetime",
            "unit",
        ),
    ] {
        let e = with_admin(text).unwrap_err();
        assert!(e.contains(key), "{text}: {e}");
        assert!(e.contains(fix), "{text}: {e}");
    }
}
