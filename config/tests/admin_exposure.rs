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
