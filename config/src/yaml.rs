//! saltgate's own YAML configuration: raw serde structs (with source spans), validated into
//! [`crate::model::Config`]. The reference for every key is in the README.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::addr::parse_bind;
use crate::duration::{parse_duration, BareNumber};
use crate::error::{ConfigError, ConfigErrors, Position};
use crate::model::{
    AdminConfig, Balance, Config, Global, HealthSettings, ListenerConfig, MasterConfig,
    OnMasterDown, Role,
};

/// A duration as written in YAML: a string such as `10s`, or a bare number (refused with a hint).
#[derive(Debug, Clone)]
struct DurationText(String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationText;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a duration such as 10s, 1m or 500ms")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One address or a list of them (`bind: 0.0.0.0:4505` or `bind: [a, b]`). Not an untagged enum:
/// those lose source spans.
#[derive(Debug, Clone)]
struct StringList(Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StringList;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an address or a list of addresses")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StringList, E> {
                Ok(StringList(vec![v.to_string()]))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<StringList, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(StringList(out))
            }
        }
        d.deserialize_any(V)
    }
}

type Sp<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    global: Option<RawGlobal>,
    #[serde(default)]
    health: Option<RawHealth>,
    masters: Sp<Vec<RawMaster>>,
    listeners: RawListeners,
    #[serde(default)]
    admin: Option<RawAdmin>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    enabled: Option<bool>,
    bind: Option<Sp<String>>,
    token_file: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGlobal {
    maxconn: Option<Sp<u32>>,
    shutdown_grace: Option<Sp<DurationText>>,
    raise_nofile: Option<bool>,
    drain_timeout: Option<Sp<DurationText>>,
    tcp_user_timeout: Option<Sp<DurationText>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: Option<Sp<DurationText>>,
    fastinter: Option<Sp<DurationText>>,
    downinter: Option<Sp<DurationText>>,
    timeout: Option<Sp<DurationText>>,
    rise: Option<Sp<u32>>,
    fall: Option<Sp<u32>>,
    probe: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMaster {
    name: Sp<String>,
    host: Sp<String>,
    publish_port: Option<Sp<u16>>,
    request_port: Option<Sp<u16>>,
    weight: Option<Sp<u32>>,
    maxconn: Option<Sp<u32>>,
    backup: Option<bool>,
    disabled: Option<bool>,
    check: Option<bool>,
    health: Option<RawHealth>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListeners {
    publish: RawListener,
    request: RawListener,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    bind: Option<Sp<StringList>>,
    balance: Option<Sp<String>>,
    timeout_client: Option<Sp<DurationText>>,
    timeout_server: Option<Sp<DurationText>>,
    timeout_client_fin: Option<Sp<DurationText>>,
    timeout_server_fin: Option<Sp<DurationText>>,
    timeout_connect: Option<Sp<DurationText>>,
    retries: Option<Sp<u32>>,
    maxconn: Option<Sp<u32>>,
    backlog: Option<Sp<u32>>,
    on_master_down: Option<Sp<String>>,
    close_rate: Option<Sp<u32>>,
    access_log: Option<bool>,
}

/// Collects errors while validating, so one run reports all of them.
struct Checker<'a> {
    file: Option<&'a Path>,
    errors: Vec<ConfigError>,
}

impl Checker<'_> {
    fn at<T>(&self, s: &Sp<T>) -> Position {
        Position::new(
            self.file,
            clamp(s.referenced.line()),
            clamp(s.referenced.column()),
        )
    }

    fn err<T>(
        &mut self,
        s: &Sp<T>,
        field: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let at = self.at(s);
        self.errors.push(ConfigError::new(at, field, message, fix));
    }

    fn duration(&mut self, s: &Sp<DurationText>, field: &str) -> Option<Duration> {
        match parse_duration(&s.value.0, BareNumber::Refuse) {
            Ok(d) if d.is_zero() => {
                self.err(
                    s,
                    field,
                    "must be greater than zero",
                    "write a positive duration such as 2s",
                );
                None
            }
            Ok(d) => Some(d),
            Err(m) => {
                self.err(
                    s,
                    field,
                    m,
                    "write a number with a unit: us, ms, s, m, h or d (e.g. 86400s)",
                );
                None
            }
        }
    }

    /// An idle timeout: a duration, or `none` to never time out.
    fn idle_timeout(
        &mut self,
        s: &Option<Sp<DurationText>>,
        field: &str,
        default: Option<Duration>,
    ) -> Option<Duration> {
        match s {
            None => default,
            Some(s) if s.value.0.trim() == "none" => None,
            Some(s) => self.duration(s, field).or(default),
        }
    }

    fn positive(&mut self, s: &Sp<u32>, field: &str, max: u32) -> Option<u32> {
        if s.value == 0 || s.value > max {
            self.err(
                s,
                field,
                format!("{} is out of range", s.value),
                format!("use a whole number from 1 to {max}"),
            );
            None
        } else {
            Some(s.value)
        }
    }

    fn health(&mut self, raw: &RawHealth, base: HealthSettings, prefix: &str) -> HealthSettings {
        let mut h = base;
        if let Some(v) = &raw.interval {
            h.interval = self
                .duration(v, &format!("{prefix}.interval"))
                .unwrap_or(h.interval);
            // Like HAProxy: fastinter and downinter follow inter unless set themselves.
            h.fastinter = h.interval;
            h.downinter = h.interval;
        }
        if let Some(v) = &raw.fastinter {
            h.fastinter = self
                .duration(v, &format!("{prefix}.fastinter"))
                .unwrap_or(h.fastinter);
        }
        if let Some(v) = &raw.downinter {
            h.downinter = self
                .duration(v, &format!("{prefix}.downinter"))
                .unwrap_or(h.downinter);
        }
        if let Some(v) = &raw.timeout {
            h.timeout = self
                .duration(v, &format!("{prefix}.timeout"))
                .unwrap_or(h.timeout);
        }
        if let Some(v) = &raw.rise {
            h.rise = self
                .positive(v, &format!("{prefix}.rise"), 1000)
                .unwrap_or(h.rise);
        }
        if let Some(v) = &raw.fall {
            h.fall = self
                .positive(v, &format!("{prefix}.fall"), 1000)
                .unwrap_or(h.fall);
        }
        if let Some(v) = &raw.probe {
            match crate::model::Probe::parse(&v.value) {
                Some(p) => h.probe = p,
                None => self.err(
                    v,
                    &format!("{prefix}.probe"),
                    format!("unknown probe {:?}", v.value),
                    "use salt (ZMTP greeting on publish, clear ping on request), zmtp or tcp",
                ),
            }
        }
        h
    }

    fn listener(&mut self, raw: &RawListener, role: Role) -> ListenerConfig {
        let p = format!("listeners.{role}");
        let mut l = ListenerConfig::defaults_for(role);
        if let Some(b) = &raw.bind {
            if b.value.0.is_empty() {
                self.err(
                    b,
                    &format!("{p}.bind"),
                    "no address to listen on",
                    format!(
                        "write at least one address, e.g. bind: 0.0.0.0:{}",
                        role.default_port()
                    ),
                );
            }
            let mut bind = Vec::new();
            for text in &b.value.0 {
                match parse_bind(text) {
                    Ok(a) if bind.contains(&a) => self.err(
                        b,
                        &format!("{p}.bind"),
                        format!("{a} is listed twice"),
                        "list each address once",
                    ),
                    Ok(a) => bind.push(a),
                    Err(m) => self.err(b, &format!("{p}.bind"), m, "write IP:PORT"),
                }
            }
            l.bind = bind;
        }
        if let Some(b) = &raw.balance {
            match parse_balance(&b.value) {
                Some(v) => l.balance = v,
                None => self.err(
                    b,
                    &format!("{p}.balance"),
                    format!("unknown balance {:?}", b.value),
                    "use roundrobin, leastconn or source",
                ),
            }
        }
        l.timeout_client = self.idle_timeout(
            &raw.timeout_client,
            &format!("{p}.timeout_client"),
            l.timeout_client,
        );
        l.timeout_server = self.idle_timeout(
            &raw.timeout_server,
            &format!("{p}.timeout_server"),
            l.timeout_server,
        );
        l.timeout_client_fin = self.idle_timeout(
            &raw.timeout_client_fin,
            &format!("{p}.timeout_client_fin"),
            None,
        );
        l.timeout_server_fin = self.idle_timeout(
            &raw.timeout_server_fin,
            &format!("{p}.timeout_server_fin"),
            None,
        );
        if let Some(v) = &raw.timeout_connect {
            l.timeout_connect = self
                .duration(v, &format!("{p}.timeout_connect"))
                .unwrap_or(l.timeout_connect);
        }
        if let Some(v) = &raw.retries {
            if v.value > 100 {
                self.err(
                    v,
                    &format!("{p}.retries"),
                    format!("{} is too many", v.value),
                    "use 0 to 100",
                );
            } else {
                l.retries = v.value;
            }
        }
        if let Some(v) = &raw.maxconn {
            l.maxconn = self.positive(v, &format!("{p}.maxconn"), u32::MAX);
        }
        if let Some(v) = &raw.backlog {
            l.backlog = self
                .positive(v, &format!("{p}.backlog"), 1 << 20)
                .unwrap_or(l.backlog);
        }
        if let Some(v) = &raw.on_master_down {
            match v.value.as_str() {
                "close" => l.on_master_down = OnMasterDown::Close,
                "keep" => l.on_master_down = OnMasterDown::Keep,
                other => self.err(
                    v,
                    &format!("{p}.on_master_down"),
                    format!("unknown value {other:?}"),
                    "use close or keep",
                ),
            }
        }
        if let Some(v) = &raw.close_rate {
            l.close_rate = v.value;
        }
        if let Some(v) = raw.access_log {
            l.access_log = v;
        }
        l
    }
}

pub(crate) fn parse_balance(s: &str) -> Option<Balance> {
    match s {
        "roundrobin" | "static-rr" => Some(Balance::RoundRobin),
        "leastconn" => Some(Balance::LeastConn),
        "source" => Some(Balance::Source),
        _ => None,
    }
}

/// Master names appear in metric labels and URLs: keep them plain.
pub(crate) fn valid_master_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Parses and validates a saltgate YAML configuration. `file` is used in error messages only.
pub fn parse_yaml(text: &str, file: Option<&Path>) -> Result<Config, ConfigErrors> {
    let raw: RawConfig =
        serde_saphyr::from_str(text).map_err(|e| ConfigErrors::one(serde_error(&e, text, file)))?;
    let mut c = Checker {
        file,
        errors: Vec::new(),
    };

    let mut global = Global::default();
    if let Some(g) = &raw.global {
        if let Some(v) = &g.maxconn {
            global.maxconn = c.positive(v, "global.maxconn", u32::MAX);
        }
        if let Some(v) = &g.shutdown_grace {
            global.shutdown_grace = c
                .duration(v, "global.shutdown_grace")
                .unwrap_or(global.shutdown_grace);
        }
        if let Some(v) = g.raise_nofile {
            global.raise_nofile = v;
        }
        if let Some(v) = &g.drain_timeout {
            global.drain_timeout = c
                .duration(v, "global.drain_timeout")
                .unwrap_or(global.drain_timeout);
        }
        global.tcp_user_timeout = c.idle_timeout(
            &g.tcp_user_timeout,
            "global.tcp_user_timeout",
            global.tcp_user_timeout,
        );
    }
    let mut admin = AdminConfig::default();
    if let Some(a) = &raw.admin {
        if let Some(v) = a.enabled {
            admin.enabled = v;
        }
        if let Some(b) = &a.bind {
            match parse_bind(&b.value) {
                Ok(addr) => admin.bind = addr,
                Err(m) => c.err(b, "admin.bind", m, "write IP:PORT, e.g. 127.0.0.1:9505"),
            }
        }
        if let Some(t) = &a.token_file {
            if t.value.trim().is_empty() {
                c.err(
                    t,
                    "admin.token_file",
                    "empty path",
                    "name a file that holds the bearer token, or remove the key",
                );
            } else {
                admin.token_file = Some(t.value.clone().into());
            }
        }
    }
    let health = c.health(
        raw.health.as_ref().unwrap_or(&RawHealth::default()),
        HealthSettings::default(),
        "health",
    );

    if raw.masters.value.is_empty() {
        c.err(
            &raw.masters,
            "masters",
            "no master is configured",
            "list at least one master with a name and a host",
        );
    }
    let mut names = HashSet::new();
    let mut endpoints = HashSet::new();
    let mut masters = Vec::new();
    for (i, m) in raw.masters.value.iter().enumerate() {
        let p = format!("masters[{i}]");
        if !valid_master_name(&m.name.value) {
            c.err(
                &m.name,
                &format!("{p}.name"),
                format!("invalid master name {:?}", m.name.value),
                "use 1-64 letters, digits, '-', '_' or '.'",
            );
        } else if !names.insert(m.name.value.clone()) {
            c.err(
                &m.name,
                &format!("{p}.name"),
                format!("duplicate master name {:?}", m.name.value),
                "give every master its own name",
            );
        }
        if m.host.value.trim().is_empty() || m.host.value.contains(char::is_whitespace) {
            c.err(
                &m.host,
                &format!("{p}.host"),
                format!("invalid host {:?}", m.host.value),
                "write the master's IP address or DNS name",
            );
        }
        let mut port = |sp: &Option<Sp<u16>>, role: Role| match sp {
            None => role.default_port(),
            Some(v) if v.value == 0 => {
                c.err(
                    v,
                    &format!("{p}.{role}_port"),
                    "port 0 is not a master port",
                    "write the port the master listens on",
                );
                role.default_port()
            }
            Some(v) => v.value,
        };
        let publish_port = port(&m.publish_port, Role::Publish);
        let request_port = port(&m.request_port, Role::Request);
        for port in [publish_port, request_port] {
            if !endpoints.insert((m.host.value.clone(), port)) {
                c.err(
                    &m.host,
                    &format!("{p}.host"),
                    format!("{}:{port} is used by another master or port", m.host.value),
                    "each master port must be a distinct host:port",
                );
            }
        }
        let weight = match &m.weight {
            Some(w) if w.value > 256 => {
                c.err(
                    w,
                    &format!("{p}.weight"),
                    format!("{} is out of range", w.value),
                    "use 0 to 256",
                );
                1
            }
            Some(w) => w.value,
            None => crate::model::defaults::WEIGHT,
        };
        let maxconn = m
            .maxconn
            .as_ref()
            .and_then(|v| c.positive(v, &format!("{p}.maxconn"), u32::MAX));
        let mh = c.health(
            m.health.as_ref().unwrap_or(&RawHealth::default()),
            health,
            &format!("{p}.health"),
        );
        masters.push(MasterConfig {
            name: m.name.value.clone(),
            host: m.host.value.trim().to_string(),
            publish_port,
            request_port,
            weight,
            maxconn,
            backup: m.backup.unwrap_or(false),
            disabled: m.disabled.unwrap_or(false),
            check: m.check.unwrap_or(true),
            health: mh,
        });
    }

    let publish = c.listener(&raw.listeners.publish, Role::Publish);
    let request = c.listener(&raw.listeners.request, Role::Request);
    let config = Config {
        global,
        health,
        masters,
        publish,
        request,
        admin,
    };
    for (field, message, fix) in config.address_conflicts() {
        c.errors.push(ConfigError::new(
            Position::new(file, 0, 0),
            field,
            message,
            fix,
        ));
    }
    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    Ok(config)
}

/// Turns a serde/YAML error into a [`ConfigError`] with the YAML path of the offending line.
fn serde_error(e: &serde_saphyr::Error, text: &str, file: Option<&Path>) -> ConfigError {
    let (line, column) = e
        .location()
        .map(|l| (clamp(l.line()), clamp(l.column())))
        .unwrap_or((0, 0));
    let display = e.to_string();
    let first = display.lines().next().unwrap_or("invalid YAML").trim();
    // "error: line 4 column 14: invalid u32" -> "invalid u32"
    let message = first
        .strip_prefix("error: ")
        .map(|rest| match rest.split_once(": ") {
            Some((pos, m)) if pos.starts_with("line ") => m,
            _ => rest,
        })
        .unwrap_or(first)
        .to_string();
    let fix = if message.contains("unknown field") {
        "check the spelling; the keys allowed here are listed in the message and in the README"
    } else if message.contains("missing field") {
        "add the field; see the configuration reference in the README"
    } else if line == 0 {
        "check that the file is YAML"
    } else {
        "write a value of the type this field takes; see the configuration reference in the README"
    };
    let mut field = yaml_path_at(text, line);
    // A missing field is reported at the first key of its mapping: name the missing one instead.
    if let Some(missing) = message
        .split('`')
        .nth(1)
        .filter(|_| message.starts_with("missing field"))
    {
        if let Some((parent, _)) = field.rsplit_once('.') {
            field = parent.to_string();
        } else if !field.ends_with(']') {
            field.clear();
        }
        if !field.is_empty() {
            field.push('.');
        }
        field.push_str(missing);
    }
    ConfigError::new(Position::new(file, line, column), field, message, fix)
}

/// The YAML key path (`listeners.publish.retries`, `masters[1].host`) of the key on `line`.
/// Good enough for block-style configuration files; flow style yields the enclosing key.
pub fn yaml_path_at(text: &str, line: u32) -> String {
    // (indent, segment, is_list_index)
    let mut stack: Vec<(usize, String, bool)> = Vec::new();
    for (no, raw) in text.lines().enumerate() {
        if no as u32 >= line {
            break;
        }
        let content = raw.split(" #").next().unwrap_or("");
        let trimmed = content.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("---") {
            continue;
        }
        let mut indent = content.len() - trimmed.len();
        let mut rest = trimmed;
        if rest == "-" || rest.starts_with("- ") {
            while stack.last().is_some_and(|t| t.0 > indent) {
                stack.pop();
            }
            match stack.last_mut() {
                Some(top) if top.2 && top.0 == indent => {
                    let n: usize = top
                        .1
                        .trim_matches(|c| c == '[' || c == ']')
                        .parse()
                        .unwrap_or(0);
                    top.1 = format!("[{}]", n + 1);
                }
                _ => stack.push((indent, "[0]".to_string(), true)),
            }
            rest = rest.get(2..).unwrap_or("").trim_start();
            indent += 2;
        }
        if let Some((key, _)) = rest.split_once(':') {
            let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
            if key.is_empty() || key.contains(' ') && !key.starts_with('"') {
                continue;
            }
            while stack.last().is_some_and(|t| t.0 >= indent) {
                stack.pop();
            }
            stack.push((indent, key.to_string(), false));
        }
    }
    let mut out = String::new();
    for (_, seg, is_index) in stack {
        if !is_index && !out.is_empty() {
            out.push('.');
        }
        out.push_str(&seg);
    }
    out
}
