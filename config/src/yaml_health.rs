//! The `health` section of saltgate's YAML (global, and per master under `masters[].health`):
//! check timing, thresholds, timeouts and the probe. See docs/configuration.md, "Health and state".

use std::time::Duration;

use crate::model::HealthSettings;
use crate::yaml_tree::Node;
use crate::yaml_values::{join, Checker};

use crate::yaml::MAX_RISE_FALL;

const HEALTH_KEYS: &[&str] = &[
    "interval",
    "fastinter",
    "downinter",
    "timeout",
    "handshake_timeout",
    "rise",
    "fall",
    "probe",
];

impl Checker<'_> {
    pub(crate) fn health(
        &mut self,
        n: Option<&Node>,
        base: HealthSettings,
        prefix: &str,
    ) -> HealthSettings {
        let f = self.fields(n, prefix, HEALTH_KEYS);
        let mut h = base;
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        if let Some(v) = f.get("interval") {
            h.interval = self
                .duration(v, &join(prefix, "interval"), &secs(base.interval))
                .unwrap_or(h.interval);
            // Like HAProxy: fastinter and downinter follow inter unless set themselves.
            h.fastinter = h.interval;
            h.downinter = h.interval;
        }
        if let Some(v) = f.get("fastinter") {
            h.fastinter = self
                .duration(v, &join(prefix, "fastinter"), "(the interval's value)")
                .unwrap_or(h.fastinter);
        }
        if let Some(v) = f.get("downinter") {
            h.downinter = self
                .duration(v, &join(prefix, "downinter"), "(the interval's value)")
                .unwrap_or(h.downinter);
        }
        if let Some(v) = f.get("timeout") {
            h.timeout = self
                .duration(v, &join(prefix, "timeout"), &secs(base.timeout))
                .unwrap_or(h.timeout);
        }
        if let Some(v) = f.get("handshake_timeout") {
            h.handshake_timeout = self
                .duration(
                    v,
                    &join(prefix, "handshake_timeout"),
                    &secs(base.handshake_timeout),
                )
                .unwrap_or(h.handshake_timeout);
        }
        if let Some(v) = f.get("rise") {
            h.rise = self
                .u32_in(
                    v,
                    &join(prefix, "rise"),
                    1,
                    MAX_RISE_FALL,
                    &base.rise.to_string(),
                )
                .unwrap_or(h.rise);
        }
        if let Some(v) = f.get("fall") {
            h.fall = self
                .u32_in(
                    v,
                    &join(prefix, "fall"),
                    1,
                    MAX_RISE_FALL,
                    &base.fall.to_string(),
                )
                .unwrap_or(h.fall);
        }
        if let Some(v) = f.get("probe") {
            let field = join(prefix, "probe");
            let fix = "use salt (ZMTP greeting on publish, clear ping on request), zmtp or tcp";
            if let Some(t) = self.text(v, &field, "salt, zmtp or tcp") {
                match crate::model::Probe::parse(&t) {
                    Some(p) => h.probe = p,
                    None => self.err(v, &field, format!("unknown probe {t:?}"), fix),
                }
            }
        }
        h
    }
}
