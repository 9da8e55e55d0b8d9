//! Typed values out of YAML nodes for [`crate::yaml`]: mappings with their allowed keys, numbers in
//! a range, ports, booleans, text and durations. Each refusal is recorded as an error naming the
//! line, column, field and fix, and validation goes on, so one run reports every problem. Knows no
//! saltgate key; [`crate::yaml`] says which keys exist and what they mean.

use std::path::Path;
use std::time::Duration;

use crate::duration::{parse_duration, BareNumber};
use crate::error::{ConfigError, Position};
use crate::model::Role;
use crate::yaml_tree::{Kind, Node};

/// `a.b` (or `b` at the top).
pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// The keys of one mapping, first occurrence of each (duplicates are reported, not used).
pub(crate) struct Fields<'n> {
    /// The mapping itself (where a missing key is reported); `None` for an absent section.
    pub node: Option<&'n Node>,
    pub path: String,
    entries: Vec<(&'n str, &'n Node)>,
}

impl<'n> Fields<'n> {
    pub(crate) fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }
}

/// Collects errors while validating, so one run reports all of them.
pub(crate) struct Checker<'a> {
    pub file: Option<&'a Path>,
    pub errors: Vec<ConfigError>,
}

impl Checker<'_> {
    pub(crate) fn at(&self, n: &Node) -> Position {
        Position::new(self.file, n.line, n.column)
    }

    pub(crate) fn err(
        &mut self,
        n: &Node,
        field: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let at = self.at(n);
        self.errors.push(ConfigError::new(at, field, message, fix));
    }

    /// A mapping's keys. Reports a value that is not a mapping, keys not in `allowed`, and keys
    /// written twice. `None`/null (an absent or empty section) gives no keys and no error.
    pub(crate) fn fields<'n>(
        &mut self,
        n: Option<&'n Node>,
        path: &str,
        allowed: &[&str],
    ) -> Fields<'n> {
        let mut out = Fields {
            node: n,
            path: path.to_string(),
            entries: Vec::new(),
        };
        let Some(n) = n else { return out };
        let entries = match &n.kind {
            Kind::Map(m) => m,
            Kind::Null => return out,
            _ => {
                self.err(
                    n,
                    path,
                    format!("expected a mapping of keys, found {}", n.describe()),
                    if path.is_empty() {
                        "write saltgate's keys at the top of the file (masters, listeners, ...); see examples/saltgate.yaml".to_string()
                    } else {
                        format!(
                            "write the keys of {path} on their own indented lines: {}",
                            allowed.join(", ")
                        )
                    },
                );
                return out;
            }
        };
        let mut seen: Vec<(&str, u32)> = Vec::new();
        for (k, v) in entries {
            let Kind::Str(key) = &k.kind else {
                self.err(
                    k,
                    path,
                    format!("{} is not a key saltgate knows", k.source.trim()),
                    format!("use one of: {}", allowed.join(", ")),
                );
                continue;
            };
            let field = join(path, key);
            if let Some((_, first)) = seen.iter().find(|(s, _)| s == key) {
                self.err(
                    k,
                    &field,
                    format!("key {key} appears twice (lines {first} and {})", k.line),
                    "keep one",
                );
                continue;
            }
            seen.push((key, k.line));
            if !allowed.contains(&key.as_str()) {
                self.err(
                    k,
                    &field,
                    format!("unknown key {key:?}"),
                    format!(
                        "check the spelling; the keys allowed here are: {}",
                        allowed.join(", ")
                    ),
                );
                continue;
            }
            out.entries.push((key, v));
        }
        out
    }

    /// A key the configuration cannot do without.
    pub(crate) fn required<'n>(
        &mut self,
        f: &Fields<'n>,
        key: &str,
        fix: &str,
    ) -> Option<&'n Node> {
        let v = f.get(key);
        if v.is_none() {
            let field = join(&f.path, key);
            let at = f
                .node
                .map(|n| self.at(n))
                .unwrap_or_else(|| Position::new(self.file, 0, 0));
            self.errors.push(ConfigError::new(
                at,
                field,
                format!("missing key {key}"),
                fix,
            ));
        }
        v
    }

    /// Refuses `key: ~` (or an empty value): a key written without a value is a mistake, not a
    /// request for the default. `default` says what removing the key gives.
    pub(crate) fn not_null(&mut self, n: &Node, field: &str, default: &str, write: &str) -> bool {
        if matches!(n.kind, Kind::Null) {
            self.err(
                n,
                field,
                "has no value",
                if default.is_empty() {
                    format!("write {write}")
                } else {
                    format!("remove the key to use the default {default} or write {write}")
                },
            );
            return false;
        }
        true
    }

    /// A whole number from `min` to `max`. `default` is named in the fix for a null value.
    pub(crate) fn uint(
        &mut self,
        n: &Node,
        field: &str,
        min: u64,
        max: u64,
        default: &str,
    ) -> Option<u64> {
        let range = format!("a whole number from {min} to {max}");
        if !self.not_null(n, field, default, &range) {
            return None;
        }
        match &n.kind {
            Kind::Int(v) if (i128::from(min)..=i128::from(max)).contains(v) => {
                u64::try_from(*v).ok()
            }
            Kind::Int(v) => {
                self.err(
                    n,
                    field,
                    format!("{v} is out of range"),
                    format!("write {range}"),
                );
                None
            }
            Kind::Str(s) if n.quoted() && s.trim().parse::<i128>().is_ok() => {
                self.err(
                    n,
                    field,
                    format!("{} is a string, not a number", n.source.trim()),
                    format!("write the number without quotes: {}", s.trim()),
                );
                None
            }
            _ => {
                let what = n.shown();
                self.err(
                    n,
                    field,
                    format!("{what} is not a whole number"),
                    format!("write {range}"),
                );
                None
            }
        }
    }

    pub(crate) fn u32_in(
        &mut self,
        n: &Node,
        field: &str,
        min: u32,
        max: u32,
        default: &str,
    ) -> Option<u32> {
        self.uint(n, field, min.into(), max.into(), default)
            .and_then(|v| u32::try_from(v).ok())
    }

    /// A master port: 1-65535, written as a number.
    pub(crate) fn port(&mut self, n: Option<&Node>, field: &str, role: Role) -> u16 {
        let default = role.default_port();
        let Some(n) = n else { return default };
        if !self.not_null(n, field, &default.to_string(), "a port from 1 to 65535") {
            return default;
        }
        if let Kind::Str(s) = &n.kind {
            if s.trim().parse::<u16>().is_ok() {
                self.err(
                    n,
                    field,
                    format!("the port is written as a string ({})", n.source.trim()),
                    format!("write the port as a number, without quotes: {}", s.trim()),
                );
                return default;
            }
        }
        self.uint(n, field, 1, 65535, &default.to_string())
            .and_then(|v| u16::try_from(v).ok())
            .unwrap_or(default)
    }

    pub(crate) fn boolean(&mut self, n: Option<&Node>, field: &str, default: bool) -> bool {
        let Some(n) = n else { return default };
        if !self.not_null(n, field, &default.to_string(), "true or false") {
            return default;
        }
        match &n.kind {
            Kind::Bool(b) => *b,
            Kind::Str(s) if n.quoted() && matches!(s.trim(), "true" | "false") => {
                self.err(
                    n,
                    field,
                    format!("{} is a string, not true or false", n.source.trim()),
                    format!("write it without quotes: {}", s.trim()),
                );
                default
            }
            _ => {
                let what = n.shown();
                self.err(
                    n,
                    field,
                    format!("{what} is not true or false"),
                    "write true or false",
                );
                default
            }
        }
    }

    /// A scalar written as text (a number is taken as written: `name: 1` is the name "1").
    pub(crate) fn text(&mut self, n: &Node, field: &str, write: &str) -> Option<String> {
        if !self.not_null(n, field, "", write) {
            return None;
        }
        match &n.kind {
            Kind::Str(_) | Kind::Int(_) | Kind::Float(_) => n.scalar_text(),
            _ => {
                self.err(
                    n,
                    field,
                    format!("expected text, found {}", n.describe()),
                    format!("write {write}"),
                );
                None
            }
        }
    }

    pub(crate) fn duration(&mut self, n: &Node, field: &str, default: &str) -> Option<Duration> {
        let write = "a duration with a unit such as 10s, 1m or 500ms";
        if !self.not_null(n, field, default, write) {
            return None;
        }
        let text = self.text(n, field, write)?;
        match parse_duration(&text, BareNumber::Refuse) {
            Ok(d) if d.is_zero() => {
                self.err(
                    n,
                    field,
                    "must be greater than zero",
                    "write a positive duration such as 2s",
                );
                None
            }
            Ok(d) => Some(d),
            Err(m) => {
                self.err(
                    n,
                    field,
                    m,
                    "write a number with a unit: us, ms, s, m, h or d (e.g. 86400s)",
                );
                None
            }
        }
    }

    /// An idle timeout: a duration, or `none` to never time out.
    pub(crate) fn idle_timeout(
        &mut self,
        n: Option<&Node>,
        field: &str,
        default: Option<Duration>,
    ) -> Option<Duration> {
        let Some(n) = n else { return default };
        let default_text = match default {
            Some(d) => format!("{}s", d.as_secs()),
            None => "none".to_string(),
        };
        if !self.not_null(
            n,
            field,
            &default_text,
            "a duration such as 60s, or none to never time out",
        ) {
            return default;
        }
        if matches!(&n.kind, Kind::Str(s) if s.trim() == "none") {
            return None;
        }
        self.duration(n, field, &default_text).or(default)
    }
}
