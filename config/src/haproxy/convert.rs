//! Turns parsed HAProxy sections into saltgate's model: one publish and one request listener, and
//! the masters recognised as one set from the servers of both backends (same host on 4505 and 4506).

use std::collections::BTreeMap;

use super::{Kind, Parsed, Parser, Proxy, Server};
use crate::addr::parse_bind;
use crate::model::{
    defaults, Config, Global, HealthSettings, ListenerConfig, MasterConfig, OnMasterDown, Role,
};

/// A frontend with the backend that serves it (the same section for `listen`).
struct Pair<'a> {
    front: &'a Proxy,
    back: &'a Proxy,
}

pub(super) fn convert(ps: &mut Parser<'_>, parsed: &Parsed) -> Option<Config> {
    let mut roles: BTreeMap<Role, Pair<'_>> = BTreeMap::new();
    let mut used_backends = Vec::new();
    // Frontends already reported (no backend, no bind, ...): the role they were meant to carry
    // is unknown, so "no frontend carries X" would only repeat their error.
    let errors_before = ps.errors.len();
    for front in parsed
        .proxies
        .iter()
        .filter(|p| matches!(p.kind, Kind::Frontend | Kind::Listen))
    {
        let back = if front.kind == Kind::Listen {
            front
        } else {
            let Some(name) = &front.default_backend else {
                ps.error(
                    front.line,
                    "default_backend",
                    format!("frontend {} has no default_backend", front.name),
                    "add 'default_backend <backend name>'",
                );
                continue;
            };
            match parsed
                .proxies
                .iter()
                .find(|p| p.kind == Kind::Backend && p.name == name.v)
            {
                Some(b) => b,
                None => {
                    ps.error(
                        name.line,
                        "default_backend",
                        format!("backend {:?} is not defined", name.v),
                        "define it with 'backend <name>' or fix the name",
                    );
                    continue;
                }
            }
        };
        used_backends.push(back.name.clone());
        for p in [front, back] {
            if let Some(m) = p.mode_http.filter(|m| m.v) {
                ps.error(
                    m.line,
                    "mode",
                    format!(
                        "{} {} runs in HTTP mode (set on this line)",
                        p.kind.as_str(),
                        p.name
                    ),
                    "saltgate proxies TCP: write 'mode tcp' in that section",
                );
            }
        }
        if front.binds.is_empty() {
            ps.error(
                front.line,
                "bind",
                format!("{} {} has no bind line", front.kind.as_str(), front.name),
                "add 'bind <ip>:<port>'",
            );
            continue;
        }
        let Some(role) = detect_role(front, back) else {
            ps.error(front.line, front.kind.as_str(), format!("cannot tell whether {} carries Salt's publish (4505) or request (4506) traffic", front.name), "bind or forward to port 4505/4506, or put 'pub' or 'req' in the section name");
            continue;
        };
        if let Some(other) = roles.get(&role) {
            ps.error(
                front.line,
                front.kind.as_str(),
                format!(
                    "{} and {} both carry Salt's {role} traffic",
                    other.front.name, front.name
                ),
                "keep one frontend per Salt port; list several addresses on one bind line instead",
            );
            continue;
        }
        roles.insert(role, Pair { front, back });
    }
    for b in parsed
        .proxies
        .iter()
        .filter(|p| p.kind == Kind::Backend && !used_backends.contains(&p.name))
    {
        ps.warn(
            b.line,
            format!("backend {} is not used by any frontend; ignored", b.name),
        );
    }
    let (Some(publish), Some(request)) = (roles.get(&Role::Publish), roles.get(&Role::Request))
    else {
        if ps.errors.len() > errors_before {
            return None;
        }
        for role in Role::ALL.into_iter().filter(|r| !roles.contains_key(r)) {
            ps.error(
                0,
                "frontend",
                format!(
                    "no frontend carries Salt's {role} traffic (port {})",
                    role.default_port()
                ),
                "saltgate needs one frontend (or listen) for 4505 and one for 4506",
            );
        }
        return None;
    };

    let publish_l = listener(ps, Role::Publish, publish);
    let request_l = listener(ps, Role::Request, request);
    let masters = masters(ps, publish, request, &publish_l, &request_l);
    let mut global = Global::default();
    let publish_binds = publish_l.bind.clone();
    for a in publish_binds.iter().filter(|a| request_l.bind.contains(a)) {
        ps.error(
            request.front.line,
            "bind",
            format!(
                "{a} is bound by both {} and {}",
                publish.front.name, request.front.name
            ),
            "give the publish and request frontends different ports",
        );
    }
    let mut admin = crate::model::AdminConfig::default();
    if publish_binds
        .iter()
        .chain(&request_l.bind)
        .any(|a| *a == admin.bind)
    {
        ps.warn(request.front.line, format!("a frontend binds {}, saltgate's default admin API address: the admin API is off (turn it on elsewhere with saltgate run --admin-bind ADDR)", admin.bind));
        admin.enabled = false;
    }
    global.maxconn = parsed.global.maxconn;
    global.threads = parsed.global.nbthread.map(|n| n as u16);
    if let Some(d) = parsed.global.hard_stop_after {
        global.shutdown_grace = d;
    }
    Some(Config {
        global,
        health: HealthSettings::default(),
        masters,
        publish: publish_l,
        request: request_l,
        admin,
        discovery: None,
        presence: Default::default(),
    })
}

fn detect_role(front: &Proxy, back: &Proxy) -> Option<Role> {
    let ports: Vec<u16> = front
        .binds
        .iter()
        .filter_map(|b| b.v.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
        .chain(back.servers.iter().filter_map(|s| s.port))
        .collect();
    let has = |p: u16| ports.contains(&p);
    match (has(4505), has(4506)) {
        (true, false) => return Some(Role::Publish),
        (false, true) => return Some(Role::Request),
        _ => {}
    }
    let name = front.name.to_ascii_lowercase();
    match (
        name.contains("pub"),
        name.contains("req") || name.contains("ret"),
    ) {
        (true, false) => Some(Role::Publish),
        (false, true) => Some(Role::Request),
        _ => None,
    }
}

fn listener(ps: &mut Parser<'_>, role: Role, pair: &Pair<'_>) -> ListenerConfig {
    let (f, b) = (pair.front, pair.back);
    let mut l = ListenerConfig::defaults_for(role);
    l.bind = f
        .binds
        .iter()
        .filter_map(|a| match parse_bind(&a.v) {
            Ok(sa) => Some(sa),
            Err(m) => {
                ps.error(a.line, "bind", m, "write 'bind <ip>:<port>'");
                None
            }
        })
        .collect();
    l.freebind = f.freebind;
    // HAProxy: `timeout tunnel` supersedes client and server once a TCP session is established.
    // HAProxy reads a zero idle timeout as "no timeout".
    let idle = |t: Option<super::At<std::time::Duration>>| t.map(|t| t.v).filter(|d| !d.is_zero());
    let (client, server) = match b.timeout_tunnel {
        Some(t) => (idle(Some(t)), idle(Some(t))),
        None => (idle(f.timeout_client), idle(b.timeout_server)),
    };
    l.timeout_client = client;
    l.timeout_server = server;
    for (missing, what) in [
        (l.timeout_client.is_none(), "client"),
        (l.timeout_server.is_none(), "server"),
    ] {
        if missing {
            ps.warn(f.line, format!("{} {}: no 'timeout {what}': idle {role} sessions are never closed on that side (as in HAProxy)", f.kind.as_str(), f.name));
        }
    }
    l.timeout_client_fin = idle(f.timeout_client_fin);
    l.timeout_server_fin = idle(b.timeout_server_fin);
    match b.timeout_connect {
        Some(t) => l.timeout_connect = t.v,
        None => ps.warn(
            b.line,
            format!(
                "{} {}: no 'timeout connect'; using saltgate's default of {}s",
                b.kind.as_str(),
                b.name,
                defaults::CONNECT_TIMEOUT.as_secs()
            ),
        ),
    }
    // HAProxy: without `timeout queue`, queued clients wait `timeout connect`.
    l.timeout_queue = b.timeout_queue.map(|t| t.v);
    if let Some(bal) = b.balance {
        l.balance = bal.v;
        if bal.v == crate::model::Balance::First {
            // HAProxy's `first`: a server back UP takes new connections at once.
            l.failback = crate::model::Failback::After(std::time::Duration::ZERO);
        }
    }
    l.retries = b.retries.unwrap_or(defaults::RETRIES);
    l.maxconn = f.maxconn;
    if let Some(n) = f.backlog {
        l.backlog = n;
    }
    l.access_log = f.tcplog.unwrap_or(false);
    let shut: Vec<bool> = b
        .servers
        .iter()
        .map(|s| s.opts.shutdown_sessions.unwrap_or(false))
        .collect();
    if shut.iter().any(|s| *s) {
        if shut.iter().all(|s| *s) {
            l.on_master_down = OnMasterDown::Close;
        } else {
            ps.error(b.line, "on-marked-down", format!("backend {}: only some servers have 'on-marked-down shutdown-sessions'", b.name), "saltgate applies it per listener: put it on every server of the backend or on none");
        }
    }
    l
}

/// Groups the servers of the publish and request backends into masters by host.
fn masters(
    ps: &mut Parser<'_>,
    publish: &Pair<'_>,
    request: &Pair<'_>,
    pl: &ListenerConfig,
    rl: &ListenerConfig,
) -> Vec<MasterConfig> {
    let (pb, rb) = (publish.back, request.back);
    if pb.servers.is_empty() {
        ps.error(
            pb.line,
            "server",
            format!("backend {} has no server", pb.name),
            "add 'server <name> <ip>:4505 check' lines",
        );
    }
    let mut out: Vec<MasterConfig> = Vec::new();
    let mut endpoints = std::collections::HashSet::new();
    for ps_srv in &pb.servers {
        let Some(rs) = rb.servers.iter().find(|r| r.host == ps_srv.host) else {
            ps.error(ps_srv.line, &format!("server {}", ps_srv.name), format!("{} is in backend {} but not in backend {}", ps_srv.host, pb.name, rb.name), "saltgate treats a master as one unit with both ports: add the host to both backends");
            continue;
        };
        if rs.name != ps_srv.name {
            ps.warn(rs.line, format!("server {} in backend {} has the same host as {} in backend {}; saltgate calls the master {}", rs.name, rb.name, ps_srv.name, pb.name, ps_srv.name));
        }
        let o = &ps_srv.opts;
        let differs = |a: &Server, b: &Server| {
            let (x, y) = (&a.opts, &b.opts);
            (
                x.check,
                x.inter,
                x.fastinter,
                x.downinter,
                x.rise,
                x.fall,
                x.weight,
                x.backup,
                x.disabled,
                x.maxconn,
            ) != (
                y.check,
                y.inter,
                y.fastinter,
                y.downinter,
                y.rise,
                y.fall,
                y.weight,
                y.backup,
                y.disabled,
                y.maxconn,
            )
        };
        if differs(ps_srv, rs) {
            ps.error(rs.line, &format!("server {}", rs.name), format!("its options differ from server {} (line {}) for the same master", ps_srv.name, ps_srv.line), "saltgate checks and weighs a master as one unit: give both server lines the same check, inter, rise, fall, weight, maxconn, backup and disabled");
            continue;
        }
        // As in HAProxy, fastinter and downinter follow an explicit inter; a server line without
        // inter gets saltgate's schedule (1 s / 500 ms / 1 s: a hung master DOWN within 4 s).
        let base = HealthSettings::default();
        let (inter, fast, down) = match o.inter {
            Some(i) => (i, i, i),
            None => (base.interval, base.fastinter, base.downinter),
        };
        let health = HealthSettings {
            interval: inter,
            fastinter: o.fastinter.unwrap_or(fast),
            downinter: o.downinter.unwrap_or(down),
            rise: o.rise.unwrap_or(defaults::RISE),
            fall: o.fall.unwrap_or(defaults::FALL),
            timeout: pb
                .timeout_check
                .map(|t| t.v)
                .unwrap_or(defaults::CHECK_TIMEOUT),
            handshake_timeout: base.handshake_timeout,
            // HAProxy's `check` becomes saltgate's Salt-aware check: that is the point of the switch.
            probe: crate::model::Probe::Salt,
        };
        let port_of = |s: &Server, l: &ListenerConfig| {
            s.port.unwrap_or_else(|| {
                l.bind
                    .first()
                    .map(|a| a.port())
                    .unwrap_or(l.role.default_port())
            })
        };
        let (pp, rp) = (port_of(ps_srv, pl), port_of(rs, rl));
        let mut clash = false;
        for (srv, port) in [(ps_srv, pp), (rs, rp)] {
            if !endpoints.insert((srv.host.clone(), port)) {
                clash = true;
                ps.error(srv.line, &format!("server {}", srv.name), format!("{}:{port} is already a port of another server line", srv.host), "each master port must be a distinct host:port (publish and request ports differ)");
            }
        }
        if clash {
            continue;
        }
        out.push(MasterConfig {
            name: ps_srv.name.clone(),
            host: ps_srv.host.clone(),
            publish_port: pp,
            request_port: rp,
            weight: o.weight.unwrap_or(defaults::WEIGHT),
            maxconn: o.maxconn.filter(|n| *n > 0),
            backup: o.backup.unwrap_or(false),
            disabled: o.disabled.unwrap_or(false),
            check: o.check.unwrap_or(false),
            health,
        });
    }
    for rs in rb
        .servers
        .iter()
        .filter(|r| !pb.servers.iter().any(|p| p.host == r.host))
    {
        ps.error(
            rs.line,
            &format!("server {}", rs.name),
            format!(
                "{} is in backend {} but not in backend {}",
                rs.host, rb.name, pb.name
            ),
            "saltgate treats a master as one unit with both ports: add the host to both backends",
        );
    }
    let mut seen = Vec::new();
    for m in &out {
        if !crate::yaml::valid_master_name(&m.name) {
            ps.error(
                0,
                "server",
                format!("server name {:?} cannot name a master", m.name),
                "use 1-64 letters, digits, '-', '_' or '.'",
            );
        }
        if seen.contains(&&m.name) {
            ps.error(
                0,
                "server",
                format!("two hosts share the server name {:?}", m.name),
                "give every server its own name",
            );
        }
        seen.push(&m.name);
    }
    out
}
