//! The `presence:` section: which minion is where (docs/presence.md).
//!
//! ```yaml
//! presence:
//!   enabled: true          # read minion ids on the request port
//!   max_minions: 100000    # table size; the oldest entry goes when it is full
//!   expire_after: 10m      # how long a minion with no session stays listed
//!   inspect_bytes: 16384   # bytes of each request connection looked at, at most
//! ```
//!
//! Kept out of `yaml.rs` (near its size limit); called from [`crate::yaml::parse_yaml`].

use std::time::Duration;

use crate::yaml_tree::Node;
use crate::yaml_values::{join, Checker};

/// Keys of the section.
pub const KEYS: &[&str] = &["enabled", "max_minions", "expire_after", "inspect_bytes"];

/// Defaults and limits.
pub mod defaults {
    use std::time::Duration;
    pub const MAX_MINIONS: u32 = 100_000;
    /// Largest `max_minions`: an entry costs a few hundred bytes.
    pub const MAX_MINIONS_LIMIT: u32 = 10_000_000;
    pub const EXPIRE_AFTER: Duration = Duration::from_secs(600);
    /// The first 16 KiB of a request connection: a real `_auth` is about 1 KiB.
    pub const INSPECT_BYTES: u32 = 16 * 1024;
    /// Enough for the ZMTP greeting, READY and a small request.
    pub const INSPECT_BYTES_MIN: u32 = 256;
    pub const INSPECT_BYTES_MAX: u32 = 1024 * 1024;
}

/// Presence: minion ids read passively from request connections, paired with the publish
/// session from the same client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceConfig {
    pub enabled: bool,
    /// Most minions listed; when full, the entry gone longest (or, if none is gone, the one seen
    /// least recently) is evicted.
    pub max_minions: u32,
    /// How long a minion stays listed once it has no session left.
    pub expire_after: Duration,
    /// Bytes of each request connection (client → master) looked at for an id, at most.
    pub inspect_bytes: u32,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_minions: defaults::MAX_MINIONS,
            expire_after: defaults::EXPIRE_AFTER,
            inspect_bytes: defaults::INSPECT_BYTES,
        }
    }
}

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
