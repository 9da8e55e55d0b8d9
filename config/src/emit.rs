//! Writes a [`Config`] as saltgate YAML, with a comment on each key, so `saltgate import-haproxy`
//! output can be read, edited and loaded back unchanged.

use std::fmt::Write;
use std::time::Duration;

use crate::duration::format_duration;
use crate::model::{Config, HealthSettings, ListenerConfig, ListenerMode, Role};

fn idle(d: Option<Duration>) -> String {
    d.map(format_duration).unwrap_or_else(|| "none".to_string())
}

/// Renders the configuration. `source` names where it came from, for the header comment.
pub fn to_yaml(c: &Config, source: &str) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = write_all(&mut o, c, source);
    o
}

fn write_all(o: &mut String, c: &Config, source: &str) -> std::fmt::Result {
    writeln!(o, "# saltgate configuration, converted from {source}.")?;
    writeln!(o, "# Reference: README.md, \"Configuration reference\". Check with: saltgate check-config FILE")?;
    writeln!(o)?;
    writeln!(o, "global:")?;
    match c.global.maxconn {
        Some(n) => writeln!(
            o,
            "  maxconn: {n}                 # cap on client sessions, all listeners"
        )?,
        None => writeln!(
            o,
            "  # maxconn: 100000            # cap on client sessions, all listeners (unset: none)"
        )?,
    }
    writeln!(
        o,
        "  shutdown_grace: {}       # SIGTERM: how long live sessions may drain",
        format_duration(c.global.shutdown_grace)
    )?;
    writeln!(o, "  raise_nofile: {}", c.global.raise_nofile)?;
    match c.global.threads {
        Some(n) => writeln!(
            o,
            "  threads: {n}                  # worker threads (HAProxy nbthread); read at start"
        )?,
        None => writeln!(
            o,
            "  # threads: 2                 # worker threads (unset: one per CPU); read at start"
        )?,
    }
    writeln!(
        o,
        "  drain_timeout: {}        # a drained or removed master's sessions are closed after this",
        format_duration(c.global.drain_timeout)
    )?;
    writeln!(
        o,
        "  tcp_user_timeout: {}     # unacknowledged data this long drops a session's connection",
        idle(c.global.tcp_user_timeout)
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "# Health checks every master starts from (HAProxy inter/fastinter/downinter/rise/fall)."
    )?;
    writeln!(o, "health:")?;
    write_health(o, &c.health, "  ")?;
    writeln!(o)?;
    writeln!(
        o,
        "# A master is UP when the checks of both its ports pass."
    )?;
    writeln!(o, "masters:")?;
    for m in &c.masters {
        writeln!(o, "  - name: {}", m.name)?;
        writeln!(o, "    host: {}", m.host)?;
        writeln!(o, "    publish_port: {}", m.publish_port)?;
        writeln!(o, "    request_port: {}", m.request_port)?;
        writeln!(o, "    weight: {}", m.weight)?;
        if let Some(n) = m.maxconn {
            writeln!(o, "    maxconn: {n}               # per port")?;
        }
        if m.backup {
            writeln!(o, "    backup: true")?;
        }
        if m.disabled {
            writeln!(o, "    disabled: true")?;
        }
        writeln!(o, "    check: {}", m.check)?;
        if m.health != c.health {
            writeln!(o, "    health:")?;
            write_health(o, &m.health, "      ")?;
        }
    }
    writeln!(o)?;
    writeln!(o, "listeners:")?;
    write_listener(o, &c.publish)?;
    write_listener(o, &c.request)?;
    writeln!(o)?;
    writeln!(
        o,
        "# Admin API and /metrics (keep it on loopback, or set a token_file)."
    )?;
    writeln!(o, "admin:")?;
    writeln!(o, "  enabled: {}", c.admin.enabled)?;
    writeln!(o, "  bind: \"{}\"", c.admin.bind)?;
    match &c.admin.token_file {
        Some(p) => writeln!(o, "  token_file: {}", p.display())?,
        None => writeln!(o, "  # token_file: /etc/saltgate/admin.token")?,
    }
    if c.admin.allow_unauthenticated {
        writeln!(o, "  allow_unauthenticated: true")?;
    }
    let (l, d) = (&c.admin.limits, crate::AdminLimits::default());
    if l.max_connections != d.max_connections {
        writeln!(o, "  max_connections: {}", l.max_connections)?;
    }
    if l.max_waiting != d.max_waiting {
        writeln!(o, "  max_waiting: {}", l.max_waiting)?;
    }
    for (key, v, dv) in [
        ("header_timeout", l.header_timeout, d.header_timeout),
        (
            "unauthenticated_header_timeout",
            l.unauthenticated_header_timeout,
            d.unauthenticated_header_timeout,
        ),
        (
            "connection_lifetime",
            l.connection_lifetime,
            d.connection_lifetime,
        ),
    ] {
        if v != dv {
            writeln!(o, "  {key}: {}", format_duration(v))?;
        }
    }
    if let Some(d) = &c.discovery {
        writeln!(o)?;
        writeln!(o, "# Masters found in the Salt cluster's peers/*.pub.")?;
        writeln!(o, "discovery:")?;
        writeln!(o, "  cluster_pki_dir: \"{}\"", d.cluster_pki_dir.display())?;
        writeln!(o, "  interval: {}", format_duration(d.interval))?;
        writeln!(o, "  publish_port: {}", d.publish_port)?;
        writeln!(o, "  request_port: {}", d.request_port)?;
        if !d.peers.is_empty() {
            writeln!(o, "  peers:")?;
            for (id, host) in &d.peers {
                writeln!(o, "    \"{id}\": \"{host}\"")?;
            }
        }
    }
    writeln!(o)?;
    crate::yaml_transport::emit(o, c)?;
    writeln!(o)?;
    crate::yaml_presence::emit(o, &c.presence)
}

fn write_health(o: &mut String, h: &HealthSettings, ind: &str) -> std::fmt::Result {
    writeln!(o, "{ind}interval: {}", format_duration(h.interval))?;
    writeln!(o, "{ind}fastinter: {}", format_duration(h.fastinter))?;
    writeln!(o, "{ind}downinter: {}", format_duration(h.downinter))?;
    writeln!(o, "{ind}timeout: {}", format_duration(h.timeout))?;
    writeln!(
        o,
        "{ind}handshake_timeout: {}   # connect + ZMTP handshake: a stopped master fails here",
        format_duration(h.handshake_timeout)
    )?;
    writeln!(o, "{ind}rise: {}", h.rise)?;
    writeln!(o, "{ind}fall: {}", h.fall)?;
    writeln!(
        o,
        "{ind}probe: {}             # salt | zmtp | tcp",
        h.probe.as_str()
    )
}

fn write_listener(o: &mut String, l: &ListenerConfig) -> std::fmt::Result {
    writeln!(o, "  {}:", l.role)?;
    let binds: Vec<String> = l.bind.iter().map(|a| format!("\"{a}\"")).collect();
    writeln!(o, "    bind: [{}]", binds.join(", "))?;
    if l.mode != ListenerMode::L4 {
        writeln!(
            o,
            "    mode: {}            # l4 | fanout (publish only)",
            l.mode.as_str()
        )?;
    }
    if l.mode == ListenerMode::Fanout {
        writeln!(
            o,
            "    hwm: {}             # messages queued per minion session; beyond: dropped, counted",
            l.hwm
        )?;
        let f = &l.fanout_limits;
        writeln!(
            o,
            "    max_frame: {}       # largest frame a minion may send the hub (bytes)",
            f.max_frame
        )?;
        writeln!(o, "    max_topics: {}", f.max_topics)?;
        writeln!(o, "    max_topic_bytes: {}", f.max_topic_bytes)?;
        writeln!(
            o,
            "    frame_timeout: {}   # a frame must end this long after its first byte",
            format_duration(f.frame_timeout)
        )?;
        if let Some(r) = &l.replay {
            writeln!(
                o,
                "    replay_window: {}   # jobs sent again to a minion whose session comes back",
                format_duration(r.window)
            )?;
            writeln!(o, "    replay_max_jobs: {}", r.max_jobs)?;
            writeln!(o, "    replay_max_bytes: {}", r.max_bytes)?;
            if let Some(peer) = r.peer {
                writeln!(
                    o,
                    "    replay_peer: \"{peer}\"   # the other node's admin address"
                )?;
            }
        }
    }
    if let Some(d) = &l.dedup_cluster_pki_dir {
        writeln!(
            o,
            "    dedup_cluster_pki_dir: \"{}\"   # forward the first copy of each job (reads <dir>/.aes)",
            d.display()
        )?;
    }
    writeln!(o, "    balance: {}", l.balance.as_str())?;
    if l.balance == crate::model::Balance::First {
        match l.failback {
            crate::model::Failback::After(d) => writeln!(
                o,
                "    failback: {}              # a master back UP regains its place after this",
                format_duration(d)
            )?,
            crate::model::Failback::Never => writeln!(o, "    failback: false")?,
        }
    }
    if l.freebind {
        writeln!(
            o,
            "    freebind: true             # may bind an address the host does not hold yet (a VIP)"
        )?;
    }
    if l.reuse_port {
        writeln!(
            o,
            "    reuse_port: true           # several saltgate processes share the port"
        )?;
    }
    writeln!(
        o,
        "    timeout_client: {}          # idle limit, client side (none: never)",
        idle(l.timeout_client)
    )?;
    writeln!(
        o,
        "    timeout_server: {}          # idle limit, master side (none: never)",
        idle(l.timeout_server)
    )?;
    if l.timeout_client_fin.is_some() {
        writeln!(o, "    timeout_client_fin: {}", idle(l.timeout_client_fin))?;
    }
    if l.timeout_server_fin.is_some() {
        writeln!(o, "    timeout_server_fin: {}", idle(l.timeout_server_fin))?;
    }
    writeln!(
        o,
        "    timeout_connect: {}",
        format_duration(l.timeout_connect)
    )?;
    writeln!(o, "    retries: {}", l.retries)?;
    if let Some(n) = l.maxconn {
        writeln!(o, "    maxconn: {n}")?;
    }
    if let Some(t) = l.timeout_queue {
        writeln!(o, "    timeout_queue: {}", format_duration(t))?;
    }
    writeln!(
        o,
        "    maxqueue: {}              # clients waiting while every master is at maxconn",
        l.maxqueue
    )?;
    writeln!(o, "    backlog: {}", l.backlog)?;
    writeln!(
        o,
        "    on_master_down: {}         # close (at close_rate per second), keep, or migrate (request only)",
        l.on_master_down.as_str()
    )?;
    if l.on_master_down == crate::model::OnMasterDown::Migrate {
        writeln!(
            o,
            "    migrate_buffer: {}     # largest unanswered request kept for re-sending (bytes)",
            l.migrate_buffer
        )?;
    }
    if let Some(a) = &l.auth_limit {
        writeln!(o, "    auth_limit:                # _auth paced per master")?;
        writeln!(o, "      max_in_flight: {}", a.max_in_flight.text())?;
        writeln!(
            o,
            "      max_wait: {}",
            crate::yaml::duration_text(a.max_wait)
        )?;
        writeln!(o, "      max_queue: {}", a.max_queue)?;
        writeln!(
            o,
            "      auth_timeout: {}",
            crate::yaml::duration_text(a.auth_timeout)
        )?;
    }
    writeln!(o, "    close_rate: {}", l.close_rate)?;
    if l.role == Role::Publish {
        let r = &l.rebalance;
        writeln!(
            o,
            "    rebalance:                 # move sessions onto a master back UP or added"
        )?;
        writeln!(o, "      enabled: {}", r.enabled)?;
        writeln!(o, "      tolerance: {}%", r.tolerance_pct)?;
        writeln!(o, "      rate: {}/s", r.rate)?;
        writeln!(o, "      delay: {}", format_duration(r.delay))?;
    }
    writeln!(o, "    access_log: {}", l.access_log)
}
