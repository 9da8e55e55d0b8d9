//! saltgate's own YAML configuration, validated into [`crate::model::Config`]. The reference for
//! every key is in the README.
//!
//! The file is read into a tree of nodes ([`crate::yaml_tree`]) and checked key by key here, so one
//! run reports every problem: wrong types, values out of range, unknown and duplicate keys. Only a
//! YAML syntax error stops the reading (nothing after it can be trusted).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use crate::addr::parse_bind;
use crate::error::{ConfigError, ConfigErrors, Position};
use crate::model::{
    defaults, AdminConfig, AdminLimits, Balance, Config, Global, HealthSettings, ListenerConfig,
    ListenerMode, MasterConfig, OnMasterDown, Role,
};
use crate::yaml_syntax::syntax_error;
pub use crate::yaml_syntax::yaml_path_at;
use crate::yaml_tree::{self, Kind, Node};
use crate::yaml_values::{join, Checker, Fields};

#[rustfmt::skip] // one line: this file is near the 800-line limit
const ROOT_KEYS: &[&str] = &["global", "health", "masters", "listeners", "admin", "discovery", "presence", "transport", "ssl"];
const GLOBAL_KEYS: &[&str] = &[
    "maxconn",
    "shutdown_grace",
    "raise_nofile",
    "threads",
    "drain_timeout",
    "tcp_user_timeout",
];
const ADMIN_KEYS: &[&str] = &[
    "enabled",
    "bind",
    "token_file",
    "allow_unauthenticated",
    "max_connections",
    "max_waiting",
    "header_timeout",
    "unauthenticated_header_timeout",
    "connection_lifetime",
];
const MASTER_KEYS: &[&str] = &[
    "name",
    "host",
    "publish_port",
    "request_port",
    "weight",
    "maxconn",
    "backup",
    "disabled",
    "check",
    "health",
];
const LISTENERS_KEYS: &[&str] = &["publish", "request"];
const LISTENER_KEYS: &[&str] = &[
    "bind",
    "mode",
    "dedup_cluster_pki_dir",
    "hwm",
    "max_frame",
    "max_topics",
    "max_topic_bytes",
    "frame_timeout",
    "replay_window",
    "replay_max_jobs",
    "replay_max_bytes",
    "replay_peer",
    "balance",
    "timeout_client",
    "timeout_server",
    "timeout_client_fin",
    "timeout_server_fin",
    "timeout_connect",
    "retries",
    "maxconn",
    "timeout_queue",
    "maxqueue",
    "backlog",
    "on_master_down",
    "migrate_buffer",
    "auth_limit",
    "close_rate",
    "access_log",
    "rebalance",
    "failback",
    "reuse_port",
    "freebind",
];

impl Checker<'_> {
    fn listener(&mut self, n: Option<&Node>, role: Role) -> ListenerConfig {
        let p = format!("listeners.{role}");
        let f = self.fields(n, &p, LISTENER_KEYS);
        let mut l = ListenerConfig::defaults_for(role);
        if let Some(b) = f.get("bind").filter(|b| {
            let default = format!("0.0.0.0:{}", role.default_port());
            self.not_null(
                b,
                &join(&p, "bind"),
                &default,
                "an address such as 127.0.0.1:4505",
            )
        }) {
            let field = join(&p, "bind");
            let example = format!("0.0.0.0:{}", role.default_port());
            let texts: Vec<(String, &Node)> = match &b.kind {
                Kind::Seq(items) => items
                    .iter()
                    .filter_map(|i| {
                        self.text(i, &field, &format!("an address such as {example}"))
                            .map(|t| (t, i))
                    })
                    .collect(),
                _ => self
                    .text(b, &field, &format!("an address such as {example}"))
                    .map(|t| vec![(t, b)])
                    .unwrap_or_default(),
            };
            if matches!(&b.kind, Kind::Seq(items) if items.is_empty()) {
                self.err(
                    b,
                    &field,
                    "no address to listen on",
                    format!("write at least one address, e.g. bind: {example}"),
                );
            }
            let mut bind = Vec::new();
            for (text, at) in &texts {
                match parse_bind(text) {
                    Ok(a) if bind.contains(&a) => self.err(
                        at,
                        &field,
                        format!("{a} is listed twice"),
                        "list each address once",
                    ),
                    Ok(a) => bind.push(a),
                    Err(m) => self.err(at, &field, m, "write IP:PORT"),
                }
            }
            if !texts.is_empty() || matches!(&b.kind, Kind::Seq(_)) {
                l.bind = bind;
            }
        }
        if let Some(v) = f.get("mode") {
            let field = join(&p, "mode");
            if let Some(t) = self.text(v, &field, "l4 or fanout") {
                match (t.as_str(), role) {
                    ("l4", _) => l.mode = ListenerMode::L4,
                    ("fanout", Role::Publish) => l.mode = ListenerMode::Fanout,
                    ("fanout", Role::Request) => self.err(
                        v,
                        &field,
                        "fanout is a mode of the publish listener only (requests go to one master)",
                        "remove mode from listeners.request, or set listeners.publish.mode: fanout",
                    ),
                    (other, _) => self.err(
                        v,
                        &field,
                        format!("unknown mode {other:?}"),
                        "use l4 (the default) or fanout (publish listener only)",
                    ),
                }
            }
        }
        self.dedup_dir(f.get("dedup_cluster_pki_dir"), &p, &mut l);
        self.fanout_hwm(f.get("hwm"), &p, &mut l);
        self.fanout_limits(&f, &p, &mut l);
        self.replay(&f, &p, &mut l);
        if let Some(b) = f.get("balance") {
            let field = join(&p, "balance");
            if let Some(t) = self.text(b, &field, "roundrobin, leastconn, source or first") {
                match parse_balance(&t) {
                    Some(v) => l.balance = v,
                    None => self.err(
                        b,
                        &field,
                        format!("unknown balance {t:?}"),
                        "use roundrobin, leastconn, source or first",
                    ),
                }
            }
        }
        l.timeout_client = self.idle_timeout(
            f.get("timeout_client"),
            &join(&p, "timeout_client"),
            l.timeout_client,
        );
        l.timeout_server = self.idle_timeout(
            f.get("timeout_server"),
            &join(&p, "timeout_server"),
            l.timeout_server,
        );
        l.timeout_client_fin = self.idle_timeout(
            f.get("timeout_client_fin"),
            &join(&p, "timeout_client_fin"),
            None,
        );
        l.timeout_server_fin = self.idle_timeout(
            f.get("timeout_server_fin"),
            &join(&p, "timeout_server_fin"),
            None,
        );
        if let Some(v) = f.get("timeout_connect") {
            l.timeout_connect = self
                .duration(
                    v,
                    &join(&p, "timeout_connect"),
                    &format!("{}s", defaults::CONNECT_TIMEOUT.as_secs()),
                )
                .unwrap_or(l.timeout_connect);
        }
        if let Some(v) = f.get("retries") {
            l.retries = self
                .u32_in(
                    v,
                    &join(&p, "retries"),
                    0,
                    MAX_RETRIES,
                    &defaults::RETRIES.to_string(),
                )
                .unwrap_or(l.retries);
        }
        if let Some(v) = f.get("maxconn") {
            l.maxconn = self.u32_in(v, &join(&p, "maxconn"), 1, u32::MAX, "(no cap)");
        }
        self.listener_queue(&f, &p, &mut l);
        if let Some(v) = f.get("backlog") {
            l.backlog = self
                .u32_in(
                    v,
                    &join(&p, "backlog"),
                    1,
                    MAX_BACKLOG,
                    &defaults::BACKLOG.to_string(),
                )
                .unwrap_or(l.backlog);
        }
        if let Some(v) = f.get("on_master_down") {
            let field = join(&p, "on_master_down");
            if let Some(t) = self.text(v, &field, "close, keep or migrate") {
                match (t.as_str(), role) {
                    ("close", _) => l.on_master_down = OnMasterDown::Close,
                    ("keep", _) => l.on_master_down = OnMasterDown::Keep,
                    ("migrate", Role::Request) => l.on_master_down = OnMasterDown::Migrate,
                    ("migrate", Role::Publish) => self.err(
                        v,
                        &field,
                        "migrate is for the request listener only (a publish session has no request to re-send)",
                        "use close or keep here (or mode: fanout), and on_master_down: migrate under listeners.request",
                    ),
                    (other, _) => self.err(
                        v,
                        &field,
                        format!("unknown value {other:?}"),
                        "use close, keep or migrate (request listener only)",
                    ),
                }
            }
        }
        if let Some(v) = f.get("close_rate") {
            l.close_rate = self
                .u32_in(
                    v,
                    &join(&p, "close_rate"),
                    0,
                    u32::MAX,
                    &defaults::CLOSE_RATE.to_string(),
                )
                .unwrap_or(l.close_rate);
        }
        l.access_log = self.boolean(f.get("access_log"), &join(&p, "access_log"), l.access_log);
        self.listener_policies(&f, &p, &mut l);
        l
    }
}

/// Highest `rise`/`fall`: more consecutive checks than this is a typo, not a policy.
pub(crate) const MAX_RISE_FALL: u32 = 1000;
/// Highest `retries`.
const MAX_RETRIES: u32 = 100;
/// Highest listen `backlog` (the kernel caps it at somaxconn anyway).
const MAX_BACKLOG: u32 = 1 << 20;
/// Highest master `weight`, as in HAProxy.
const MAX_WEIGHT: u32 = 256;
/// `global.threads`: tokio sizes its worker pool freely; more than this is a typo, not a plan.
const MAX_THREADS: u32 = 1024;

pub(crate) fn parse_balance(s: &str) -> Option<Balance> {
    match s {
        "roundrobin" | "static-rr" => Some(Balance::RoundRobin),
        "leastconn" => Some(Balance::LeastConn),
        "source" => Some(Balance::Source),
        "first" => Some(Balance::First),
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

/// A duration as the YAML would say it: `2s`, `500ms`.
pub(crate) fn duration_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Parses and validates a saltgate YAML configuration. `file` is used in error messages only.
/// Every problem in the file is reported in one go; only a YAML syntax error stops early.
pub fn parse_yaml(text: &str, file: Option<&Path>) -> Result<Config, ConfigErrors> {
    let root =
        yaml_tree::read(text).map_err(|e| ConfigErrors::one(syntax_error(&e, text, file)))?;
    let mut c = Checker {
        file,
        errors: Vec::new(),
    };
    if matches!(root.kind, Kind::Null) {
        return Err(ConfigErrors::one(ConfigError::new(
            Position::new(file, 0, 0),
            "",
            "the file holds no configuration",
            "write at least masters and listeners; see examples/saltgate.yaml",
        )));
    }
    let top = c.fields(Some(&root), "", ROOT_KEYS);
    if !matches!(root.kind, Kind::Map(_)) {
        return Err(ConfigErrors(c.errors));
    }

    let mut global = Global::default();
    let g = c.fields(top.get("global"), "global", GLOBAL_KEYS);
    if let Some(v) = g.get("maxconn") {
        global.maxconn = c.u32_in(v, "global.maxconn", 1, u32::MAX, "(no cap)");
    }
    if let Some(v) = g.get("shutdown_grace") {
        global.shutdown_grace = c
            .duration(
                v,
                "global.shutdown_grace",
                &duration_text(global.shutdown_grace),
            )
            .unwrap_or(global.shutdown_grace);
    }
    global.raise_nofile = c.boolean(
        g.get("raise_nofile"),
        "global.raise_nofile",
        global.raise_nofile,
    );
    if let Some(v) = g.get("threads") {
        global.threads = c
            .u32_in(v, "global.threads", 1, MAX_THREADS, "(one per CPU)")
            .map(|n| n as u16);
    }
    if let Some(v) = g.get("drain_timeout") {
        global.drain_timeout = c
            .duration(
                v,
                "global.drain_timeout",
                &duration_text(global.drain_timeout),
            )
            .unwrap_or(global.drain_timeout);
    }
    global.tcp_user_timeout = c.idle_timeout(
        g.get("tcp_user_timeout"),
        "global.tcp_user_timeout",
        global.tcp_user_timeout,
    );

    (global.transport, global.ssl) = crate::yaml_transport::parse(&mut c, &top);
    let admin = admin(&mut c, top.get("admin"));
    let presence = crate::yaml_presence::parse(&mut c, top.get("presence"));
    let health = c.health(top.get("health"), HealthSettings::default(), "health");

    let discovery = c.discovery(top.get("discovery"));
    let masters = masters(&mut c, &top, health, discovery.is_some());

    let ls = c.fields(top.get("listeners"), "listeners", LISTENERS_KEYS);
    if top.get("listeners").is_some() {
        for role in Role::ALL {
            c.required(
                &ls,
                role.as_str(),
                &format!(
                    "add listeners.{role} with at least bind: 0.0.0.0:{}",
                    role.default_port()
                ),
            );
        }
    } else {
        c.required(
            &top,
            "listeners",
            "add listeners.publish and listeners.request, each with a bind address",
        );
    }
    let publish = c.listener(ls.get("publish"), Role::Publish);
    let request = c.listener(ls.get("request"), Role::Request);
    let config = Config {
        global,
        health,
        masters,
        publish,
        request,
        admin,
        discovery,
        presence,
    };
    let transport_conflicts = crate::yaml_transport::conflicts(&config);
    for (field, message, fix) in config
        .address_conflicts()
        .into_iter()
        .chain(transport_conflicts)
    {
        let at = node_at(&root, &field)
            .map(|n| c.at(n))
            .unwrap_or_else(|| Position::new(file, 0, 0));
        c.errors.push(ConfigError::new(at, field, message, fix));
    }
    if !c.errors.is_empty() {
        c.errors
            .sort_by_key(|e| (e.at.line == 0, e.at.line, e.at.column));
        return Err(ConfigErrors(c.errors));
    }
    Ok(config)
}

/// `admin.max_connections` and the other bounds on the admin listener's connections.
fn admin_limits(c: &mut Checker<'_>, f: &Fields<'_>, l: &mut AdminLimits) {
    // Counts: at least one (a probe needs a place); at most what a descriptor table holds.
    for (key, slot, default) in [
        ("max_connections", &mut l.max_connections, "64"),
        ("max_waiting", &mut l.max_waiting, "256"),
    ] {
        if let Some(n) = f.get(key) {
            if let Some(v) = c.uint(n, &format!("admin.{key}"), 1, 1_000_000, default) {
                *slot = v as usize;
            }
        }
    }
    for (key, slot, default) in [
        ("header_timeout", &mut l.header_timeout, "5s"),
        (
            "unauthenticated_header_timeout",
            &mut l.unauthenticated_header_timeout,
            "2s",
        ),
        ("connection_lifetime", &mut l.connection_lifetime, "60s"),
    ] {
        if let Some(n) = f.get(key) {
            if let Some(d) = c.duration(n, &format!("admin.{key}"), default) {
                *slot = d;
            }
        }
    }
}

/// The node at a dotted key path (`listeners.request.bind`), first occurrence of each key.
fn node_at<'n>(root: &'n Node, path: &str) -> Option<&'n Node> {
    path.split('.').try_fold(root, |n, key| match &n.kind {
        Kind::Map(entries) => entries
            .iter()
            .find(|(k, _)| matches!(&k.kind, Kind::Str(s) if s == key))
            .map(|(_, v)| v),
        _ => None,
    })
}

fn admin(c: &mut Checker<'_>, n: Option<&Node>) -> AdminConfig {
    let f = c.fields(n, "admin", ADMIN_KEYS);
    let mut admin = AdminConfig::default();
    admin.enabled = c.boolean(f.get("enabled"), "admin.enabled", admin.enabled);
    let bind = f.get("bind");
    if let Some(b) = bind {
        if let Some(t) = c.text(b, "admin.bind", "IP:PORT, e.g. 127.0.0.1:9505") {
            match parse_bind(&t) {
                Ok(addr) => admin.bind = addr,
                Err(m) => c.err(b, "admin.bind", m, "write IP:PORT, e.g. 127.0.0.1:9505"),
            }
        }
    }
    if let Some(t) = f.get("token_file") {
        match c.text(
            t,
            "admin.token_file",
            "the path of a file that holds the bearer token",
        ) {
            Some(p) if p.trim().is_empty() => c.err(
                t,
                "admin.token_file",
                "empty path",
                "name a file that holds the bearer token, or remove the key",
            ),
            Some(p) => admin.token_file = Some(p.into()),
            None => {}
        }
    }
    admin.allow_unauthenticated = c.boolean(
        f.get("allow_unauthenticated"),
        "admin.allow_unauthenticated",
        false,
    );
    admin_limits(c, &f, &mut admin.limits);
    if let Some((message, fix)) = admin.exposure_refusal() {
        match bind.or(f.node) {
            Some(at) => c.err(at, "admin.bind", message, fix),
            None => c.errors.push(ConfigError::new(
                Position::new(c.file, 0, 0),
                "admin.bind",
                message,
                fix,
            )),
        }
    }
    admin
}

fn masters(
    c: &mut Checker,
    top: &Fields,
    health: HealthSettings,
    found: bool,
) -> Vec<MasterConfig> {
    let mut masters = Vec::new();
    if found
        && top
            .get("masters")
            .is_none_or(|m| matches!(m.kind, Kind::Null))
    {
        return masters; // discovery finds them
    }
    let Some(list) = c.required(
        top,
        "masters",
        "add masters: a list of entries, each with a name and a host",
    ) else {
        return masters;
    };
    let items: &[Node] = match &list.kind {
        Kind::Seq(items) => items,
        _ => {
            c.err(
                list,
                "masters",
                format!("expected a list of masters, found {}", list.describe()),
                "write each master as a list entry: '- name: a' then 'host: 10.0.0.1' indented below",
            );
            return masters;
        }
    };
    if items.is_empty() && !found {
        c.err(
            list,
            "masters",
            "no master is configured",
            "list at least one master with a name and a host",
        );
    }
    let mut names = HashSet::new();
    let mut endpoints = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("masters[{i}]");
        if !matches!(item.kind, Kind::Map(_)) {
            c.err(
                item,
                &p,
                format!(
                    "expected a master (a mapping with name and host), found {}",
                    item.describe()
                ),
                "write '- name: a' and 'host: 10.0.0.1' indented below it",
            );
            continue;
        }
        let f = c.fields(Some(item), &p, MASTER_KEYS);
        let name = c
            .required(
                &f,
                "name",
                "add name: <a name for logs, metrics and the admin API>",
            )
            .and_then(|n| c.text(n, &join(&p, "name"), "a name").map(|t| (t, n)));
        if let Some((name, at)) = &name {
            if !valid_master_name(name) {
                c.err(
                    at,
                    &join(&p, "name"),
                    format!("invalid master name {name:?}"),
                    "use 1-64 letters, digits, '-', '_' or '.'",
                );
            } else if !names.insert(name.clone()) {
                c.err(
                    at,
                    &join(&p, "name"),
                    format!("duplicate master name {name:?}"),
                    "give every master its own name",
                );
            }
        }
        let host = c
            .required(
                &f,
                "host",
                "add host: <the master's IP address or DNS name>",
            )
            .and_then(|n| {
                c.text(n, &join(&p, "host"), "the master's IP address or DNS name")
                    .map(|t| (t, n))
            });
        if let Some((h, at)) = &host {
            if h.trim().is_empty() || h.contains(char::is_whitespace) {
                c.err(
                    at,
                    &join(&p, "host"),
                    format!("invalid host {h:?}"),
                    "write the master's IP address or DNS name",
                );
            }
        }
        let publish_port = c.port(
            f.get("publish_port"),
            &join(&p, "publish_port"),
            Role::Publish,
        );
        let request_port = c.port(
            f.get("request_port"),
            &join(&p, "request_port"),
            Role::Request,
        );
        if let Some((h, at)) = &host {
            for port in [publish_port, request_port] {
                if !endpoints.insert((h.clone(), port)) {
                    c.err(
                        at,
                        &join(&p, "host"),
                        format!("{h}:{port} is used by another master or port"),
                        "each master port must be a distinct host:port",
                    );
                }
            }
        }
        let weight = f
            .get("weight")
            .and_then(|w| {
                c.u32_in(
                    w,
                    &join(&p, "weight"),
                    0,
                    MAX_WEIGHT,
                    &defaults::WEIGHT.to_string(),
                )
            })
            .unwrap_or(defaults::WEIGHT);
        let maxconn = f
            .get("maxconn")
            .and_then(|v| c.u32_in(v, &join(&p, "maxconn"), 1, u32::MAX, "(no cap)"));
        let backup = c.boolean(f.get("backup"), &join(&p, "backup"), false);
        let disabled = c.boolean(f.get("disabled"), &join(&p, "disabled"), false);
        let check = c.boolean(f.get("check"), &join(&p, "check"), true);
        let mh = c.health(f.get("health"), health, &join(&p, "health"));
        let (Some((name, _)), Some((host, _))) = (name, host) else {
            continue;
        };
        masters.push(MasterConfig {
            name,
            host: host.trim().to_string(),
            publish_port,
            request_port,
            weight,
            maxconn,
            backup,
            disabled,
            check,
            health: mh,
        });
    }
    masters
}

#[cfg(test)]
mod rebalance_tests {
    use super::*;
    use crate::model::Rebalance;

    const BASE: &str = "masters:
  - name: a
    host: 127.0.0.2
listeners:
  request:
    bind: 127.0.0.1:4506
  publish:
    bind: 127.0.0.1:4505
";

    fn load(extra: &str) -> Result<Config, ConfigErrors> {
        parse_yaml(&format!("{BASE}{extra}"), None)
    }

    #[test]
    fn rebalancing_is_on_by_default_for_publish_only() {
        let c = load("").unwrap();
        assert_eq!(c.publish.rebalance, Rebalance::ON);
        assert!(c.publish.rebalance.enabled);
        assert!(!c.request.rebalance.enabled);
    }

    #[test]
    fn rebalance_keys_are_read_in_their_written_forms() {
        let c = load("    rebalance: {enabled: true, tolerance: 15%, rate: 20/s, delay: 3s}\n")
            .unwrap();
        let r = c.publish.rebalance;
        assert_eq!((r.tolerance_pct, r.rate), (15, 20));
        assert_eq!(r.delay, Duration::from_secs(3));
        let c = load("    rebalance: {tolerance: 5, rate: 7}\n").unwrap();
        assert_eq!(
            (c.publish.rebalance.tolerance_pct, c.publish.rebalance.rate),
            (5, 7)
        );
        assert!(
            !load("    rebalance: false\n")
                .unwrap()
                .publish
                .rebalance
                .enabled
        );
        let c = load("    rebalance: {enabled: false}\n").unwrap();
        assert!(!c.publish.rebalance.enabled);
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back.publish.rebalance, c.publish.rebalance);
    }

    #[test]
    fn bad_rebalance_values_name_the_field_and_the_fix() {
        let e = load("    rebalance: {tolerance: 0%, rate: 0/s, speed: 3}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listeners.publish.rebalance.tolerance"), "{e}");
        assert!(e.contains("listeners.publish.rebalance.rate"), "{e}");
        assert!(e.contains("speed"), "{e}");
        let e = parse_yaml(
            "masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish:\n    bind: 127.0.0.1:4505\n  request:\n    bind: 127.0.0.1:4506\n    rebalance: {rate: 5}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("move it under listeners.publish"), "{e}");
    }
}
