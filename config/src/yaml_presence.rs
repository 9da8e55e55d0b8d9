//! Reading and writing the `presence:` section ([`crate::presence`] holds its model). Kept out of
//! `yaml.rs` (near its size limit); called from [`crate::yaml::parse_yaml`] and [`crate::emit`].

use crate::presence::{defaults, PresenceConfig, KEYS};
use crate::yaml_tree::Node;
use crate::yaml_values::{join, Checker};

/// Writes the section as saltgate YAML (for [`crate::emit`]).
pub(crate) fn emit(o: &mut String, p: &PresenceConfig) -> std::fmt::Result {
    use std::fmt::Write;
    writeln!(
        o,
        "# Which minion is where: ids read on the request port (docs/presence.md)."
    )?;
    writeln!(o, "presence:")?;
    writeln!(o, "  enabled: {}", p.enabled)?;
    writeln!(
        o,
        "  max_minions: {}        # when full, the entry gone longest goes",
        p.max_minions
    )?;
    writeln!(
        o,
        "  expire_after: {}       # how long a minion with no session stays listed",
        crate::duration::format_duration(p.expire_after)
    )?;
    writeln!(
        o,
        "  inspect_bytes: {}       # bytes of each request connection looked at, at most",
        p.inspect_bytes
    )
}

/// Reads the `presence:` section (absent: the defaults).
pub(crate) fn parse(c: &mut Checker<'_>, n: Option<&Node>) -> PresenceConfig {
    let p = "presence";
    let f = c.fields(n, p, KEYS);
    let mut out = PresenceConfig::default();
    out.enabled = c.boolean(f.get("enabled"), &join(p, "enabled"), out.enabled);
    if let Some(v) = f.get("max_minions") {
        let d = out.max_minions;
        out.max_minions = c
            .u32_in(
                v,
                &join(p, "max_minions"),
                1,
                defaults::MAX_MINIONS_LIMIT,
                &d.to_string(),
            )
            .unwrap_or(d);
    }
    if let Some(v) = f.get("expire_after") {
        let d = out.expire_after;
        out.expire_after = c
            .duration(v, &join(p, "expire_after"), &format!("{}s", d.as_secs()))
            .unwrap_or(d);
    }
    if let Some(v) = f.get("inspect_bytes") {
        let d = out.inspect_bytes;
        out.inspect_bytes = c
            .u32_in(
                v,
                &join(p, "inspect_bytes"),
                defaults::INSPECT_BYTES_MIN,
                defaults::INSPECT_BYTES_MAX,
                &d.to_string(),
            )
            .unwrap_or(d);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse_yaml;
    use std::time::Duration;

    const BASE: &str = "masters:
  - name: a
    host: 127.0.0.2
listeners:
  request:
    bind: 127.0.0.1:4506
  publish:
    bind: 127.0.0.1:4505
";

    #[test]
    fn presence_is_on_with_defaults_when_the_section_is_absent() {
        let c = parse_yaml(BASE, None).unwrap();
        assert_eq!(c.presence, PresenceConfig::default());
        assert!(c.presence.enabled);
    }

    #[test]
    fn every_key_is_read() {
        let c = parse_yaml(
            &format!(
                "{BASE}presence:\n  enabled: false\n  max_minions: 500\n  expire_after: 90s\n  inspect_bytes: 4096\n"
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            c.presence,
            PresenceConfig {
                enabled: false,
                max_minions: 500,
                expire_after: Duration::from_secs(90),
                inspect_bytes: 4096,
            }
        );
    }

    #[test]
    fn the_section_survives_a_round_trip_through_the_emitter() {
        for extra in [
            "",
            "presence:\n  enabled: false\n  max_minions: 7\n  expire_after: 1500ms\n  inspect_bytes: 300\n",
        ] {
            let c = parse_yaml(&format!("{BASE}{extra}"), None).unwrap();
            let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
            assert_eq!(back.presence, c.presence, "{extra}");
        }
    }

    #[test]
    fn bad_values_name_the_field_and_the_fix() {
        let e = parse_yaml(
            &format!(
                "{BASE}presence:\n  max_minions: 0\n  expire_after: 10\n  inspect_bytes: 100\n  size: 3\n"
            ),
            None,
        )
        .unwrap_err()
        .to_string();
        for want in [
            "presence.max_minions",
            "presence.expire_after",
            "presence.inspect_bytes",
            "a whole number from 256 to 1048576",
            "presence.size",
            "max_minions, expire_after, inspect_bytes",
        ] {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
    }
}
