//! Reading `transport:` and `ssl:` ([`crate::transport`] holds their model; the `ssl` value is
//! read by `yaml_ssl.rs`, the masters' file by `yaml_master_config.rs`), and the combinations
//! with them that cannot work ([`conflicts`]). Kept out of `yaml.rs` (near its size
//! limit); called from [`crate::yaml::parse_yaml`].

use std::path::PathBuf;

use crate::model::{Config, ListenerMode, OnMasterDown, Probe};
use crate::transport::{SaltTransport, SslConfig, TRANSPORTS};
use crate::yaml_values::{Checker, Fields};

/// Reads `transport:` and `ssl:` from the top level, and from the masters' configuration when
/// `discovery.master_config` names it ([`crate::yaml_master_config`]).
pub(crate) fn parse(c: &mut Checker<'_>, top: &Fields<'_>) -> (SaltTransport, Option<SslConfig>) {
    let mut own_transport = None;
    if let Some(n) = top.get("transport") {
        if let Some(t) = c.text(n, "transport", "zeromq, tcp or ws") {
            match SaltTransport::parse(&t) {
                Some(x) => own_transport = Some((x, n)),
                None => c.err(
                    n,
                    "transport",
                    format!("unknown transport {t:?}"),
                    format!(
                        "use one of {} (the masters' own `transport`)",
                        TRANSPORTS.join(", ")
                    ),
                ),
            }
        }
    }
    let own_ssl = top.get("ssl").map(|n| (crate::yaml_ssl::ssl_dict(c, n), n));
    match crate::yaml_master_config::read(c, top.get("discovery")) {
        Some(m) => crate::yaml_master_config::combine(c, own_transport, own_ssl, &m),
        None => (
            own_transport.map(|(t, _)| t).unwrap_or_default(),
            own_ssl.and_then(|(s, _)| s),
        ),
    }
}

/// The combinations that cannot work with `transport` / `ssl`: `(field, problem, fix)`.
/// (Presence is not one: under TLS it is by address only; on plain `tcp` and `ws` it reads the
/// `_auth`, docs/presence.md.)
pub(crate) fn conflicts(cfg: &Config) -> Vec<(String, String, String)> {
    let t = cfg.global.transport;
    let mut out = Vec::new();
    if t != SaltTransport::Zeromq {
        let name = t.as_str();
        if cfg.publish.mode == ListenerMode::Fanout {
            let why = match (t, cfg.global.ssl.is_some()) {
                (_, true) => format!("under TLS (`ssl`) the publish stream is encrypted end to end between each minion and its master: a hub in the middle would have to end TLS with the masters' keys (`transport: {name}`)"),
                (SaltTransport::Tcp, false) => "Salt's tcp publish server sends a targeted job only to the connections whose minion proved its id (`id` and `tok`, per connection): a hub's one connection per master would never receive the jobs aimed at the minions behind it".to_string(),
                _ => "Salt's ws publish server sends every job to every client, so a plain-ws hub could work, but the hub speaks ZMTP only: not built".to_string(),
            };
            out.push((
                "listeners.publish.mode".into(),
                format!("{why} (docs/fanout.md, \"Not on Salt's tcp or ws transports\")"),
                "use mode: l4 on the publish listener, or transport: zeromq".into(),
            ));
        }
        // Plain `tcp` and plain `ws` have their own relays (docs/request-continuity.md, "On Salt's
        // `tcp` transport", "On Salt's `ws` transport"); under TLS nothing can be replayed.
        if cfg.global.ssl.is_some() && cfg.request.on_master_down == OnMasterDown::Migrate {
            out.push((
                "listeners.request.on_master_down".into(),
                format!("under TLS (`ssl`) the request stream is encrypted end to end between the minion and its master: saltgate can neither see which request is unanswered nor re-send it to another master over a TLS session of its own (`transport: {name}`; docs/request-continuity.md, \"Not under TLS\")"),
                "use on_master_down: close (or keep), or drop `ssl` (plain tcp and ws have request continuity), or transport: zeromq".into(),
            ));
        }
        if cfg.request.auth_limit.is_some() {
            out.push((
                "listeners.request.auth_limit".into(),
                format!("the `_auth` limit holds ZeroMQ REQ messages to pace them; it cannot read `transport: {name}` requests{}", if cfg.global.ssl.is_some() { " (encrypted under TLS)" } else { "" }),
                "remove listeners.request.auth_limit, or use transport: zeromq".into(),
            ));
        }
        let zmtp = |h: &crate::HealthSettings| h.probe == Probe::Zmtp;
        if zmtp(&cfg.health) {
            out.push((
                "health.probe".into(),
                format!("the zmtp probe reads a ZMTP greeting, which a `transport: {name}` master never sends (its log fills with tracebacks)"),
                format!("use probe: salt (Salt's ping over {name}) or probe: tcp"),
            ));
        }
        for (i, m) in cfg.masters.iter().enumerate() {
            if zmtp(&m.health) && !zmtp(&cfg.health) {
                out.push((
                    format!("masters[{i}].health.probe"),
                    format!("master {}: the zmtp probe reads a ZMTP greeting, which a `transport: {name}` master never sends", m.name),
                    format!("use probe: salt (Salt's ping over {name}) or probe: tcp"),
                ));
            }
        }
    }
    if cfg.global.ssl.is_some() && t == SaltTransport::Zeromq {
        out.push((
            "ssl".into(),
            "Salt's `ssl` applies to the tcp and ws transports only".into(),
            "set transport: tcp or ws (the masters' own), or remove ssl".into(),
        ));
    }
    out
}

/// Puts `transport` and `ssl` into a configuration read from elsewhere (`saltgate
/// import-haproxy --transport`: HAProxy has no such keys), then checks what cannot work with them
/// as a YAML file's are checked: `(field, problem, fix)` each; empty when it can.
pub fn set_transport(
    cfg: &mut Config,
    transport: SaltTransport,
    ssl: Option<SslConfig>,
) -> Vec<(String, String, String)> {
    cfg.global.transport = transport;
    cfg.global.ssl = ssl;
    let mut out = Vec::new();
    if let Some(s) = &cfg.global.ssl {
        if s.keyfile.is_some() && s.certfile.is_none() {
            out.push((
                "ssl.keyfile".into(),
                "a keyfile without a certfile".into(),
                "add ssl.certfile (the client certificate of that key), or remove ssl.keyfile"
                    .into(),
            ));
        }
    }
    out.extend(conflicts(cfg));
    out
}

/// Writes `transport:` and `ssl:` back as YAML (`saltgate import-haproxy`), commented.
pub(crate) fn emit(o: &mut String, c: &Config) -> std::fmt::Result {
    use std::fmt::Write;
    writeln!(
        o,
        "# Salt's transport of the masters (their own `transport`): zeromq (default), tcp or ws."
    )?;
    if c.global.transport == SaltTransport::Zeromq && c.global.ssl.is_none() {
        return writeln!(o, "# transport: tcp");
    }
    writeln!(o, "transport: {}", c.global.transport.as_str())?;
    let Some(s) = &c.global.ssl else {
        return Ok(());
    };
    writeln!(
        o,
        "# Salt's `ssl` dict: the checks reach the masters over TLS (presence: by address only)."
    )?;
    writeln!(o, "ssl:")?;
    let path = |o: &mut String, key: &str, p: &Option<PathBuf>| match p {
        Some(p) => writeln!(o, "  {key}: \"{}\"", p.display()),
        None => Ok(()),
    };
    path(o, "ca_certs", &s.ca_certs)?;
    writeln!(o, "  cert_reqs: {}", s.cert_reqs.as_str())?;
    path(o, "certfile", &s.certfile)?;
    path(o, "keyfile", &s.keyfile)?;
    if let Some(n) = &s.server_name {
        writeln!(o, "  server_name: \"{n}\"")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::transport::{CertReqs, SaltTransport, SslConfig};
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

    fn errors(extra: &str) -> Vec<(String, String, String)> {
        parse_yaml(&format!("{BASE}{extra}"), None)
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| (e.field, e.message, e.fix))
            .collect()
    }

    #[test]
    fn transport_defaults_to_zeromq_and_reads_salts_names() {
        let c = parse_yaml(BASE, None).unwrap();
        assert_eq!(c.global.transport, SaltTransport::Zeromq);
        assert_eq!(c.global.ssl, None);
        for (t, want) in [
            ("tcp", SaltTransport::Tcp),
            ("ws", SaltTransport::Ws),
            ("zeromq", SaltTransport::Zeromq),
        ] {
            let c = parse_yaml(&format!("{BASE}transport: {t}\n"), None).unwrap();
            assert_eq!(c.global.transport, want);
        }
    }

    #[test]
    fn a_bad_transport_names_the_key_and_the_accepted_values() {
        let e = errors("transport: zmq\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].0, "transport");
        assert!(e[0].1.contains("\"zmq\""), "{e:?}");
        assert!(e[0].2.contains("zeromq, tcp, ws"), "{e:?}");
    }

    #[test]
    fn ssl_takes_salts_keys() {
        let c = parse_yaml(
            &format!("{BASE}transport: tcp\nssl:\n  certfile: /c.pem\n  keyfile: /k.pem\n  ca_certs: /ca.pem\n  cert_reqs: CERT_OPTIONAL\n  ssl_version: PROTOCOL_TLSv1_2\n"),
            None,
        )
        .unwrap();
        assert_eq!(
            c.global.ssl,
            Some(SslConfig {
                certfile: Some("/c.pem".into()),
                keyfile: Some("/k.pem".into()),
                ca_certs: Some("/ca.pem".into()),
                cert_reqs: CertReqs::Optional,
                server_name: None,
            })
        );
        let c = parse_yaml(&format!("{BASE}transport: ws\nssl: true\n"), None).unwrap();
        assert_eq!(c.global.ssl, Some(SslConfig::default()));
        let c = parse_yaml(
            &format!("{BASE}transport: ws\nssl:\n  cert_reqs: NONE\n"),
            None,
        )
        .unwrap();
        assert_eq!(c.global.ssl.unwrap().cert_reqs, CertReqs::None);
        let e = errors("transport: tcp\nssl:\n  cert_reqs: CERT_MAYBE\n  cafile: /x\n");
        assert!(
            e.iter().any(|e| e.0 == "ssl.cert_reqs"
                && e.2.contains("CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED")),
            "{e:?}"
        );
        assert!(e.iter().any(|e| e.0 == "ssl.cafile"), "{e:?}");
        let e = errors("transport: tcp\nssl:\n  keyfile: /k.pem\n");
        assert!(e.iter().any(|e| e.0 == "ssl.keyfile"), "{e:?}");
    }

    #[test]
    fn combinations_that_cannot_work_are_refused() {
        let e = errors("transport: tcp\nhealth:\n  probe: zmtp\n");
        assert!(
            e.iter()
                .any(|e| e.0 == "health.probe" && e.1.contains("ZMTP greeting")),
            "{e:?}"
        );
        let fanout = BASE.replace(
            "    bind: 127.0.0.1:4505\n",
            "    bind: 127.0.0.1:4505\n    mode: fanout\n",
        );
        let e = parse_yaml(&format!("{fanout}transport: ws\n"), None)
            .unwrap_err()
            .0;
        assert!(
            e.iter().any(
                |e| e.field == "listeners.publish.mode" && e.message.contains("docs/fanout.md")
            ),
            "{e:?}"
        );
        let migrate = BASE.replace(
            "    bind: 127.0.0.1:4506\n",
            "    bind: 127.0.0.1:4506\n    on_master_down: migrate\n",
        );
        // The same listeners are fine on zeromq, plain tcp and plain ws.
        parse_yaml(&format!("{migrate}transport: zeromq\n"), None).unwrap();
        parse_yaml(&format!("{migrate}transport: tcp\n"), None).unwrap();
        parse_yaml(&format!("{migrate}transport: ws\n"), None).unwrap();
        let e = errors("ssl: {}\n");
        assert!(
            e.iter()
                .any(|e| e.0 == "ssl" && e.2.contains("transport: tcp or ws")),
            "{e:?}"
        );
        // Presence is by address only under TLS: not an error, whether written or not.
        parse_yaml(
            &format!(
                "{BASE}transport: tcp\nssl:\n  cert_reqs: CERT_NONE\npresence:\n  enabled: true\n"
            ),
            None,
        )
        .unwrap();
        parse_yaml(
            &format!("{BASE}transport: tcp\nssl:\n  cert_reqs: CERT_NONE\n"),
            None,
        )
        .unwrap();
    }

    #[test]
    fn migrate_is_refused_with_why_under_tls_and_taken_on_plain_tcp_and_plain_ws() {
        let migrate = BASE.replace(
            "    bind: 127.0.0.1:4506\n",
            "    bind: 127.0.0.1:4506\n    on_master_down: migrate\n",
        );
        let field = "listeners.request.on_master_down";
        let e = parse_yaml(
            &format!("{migrate}transport: tcp\nssl: {{cert_reqs: CERT_NONE}}\n"),
            None,
        )
        .unwrap_err()
        .0;
        let tls = e.iter().find(|e| e.field == field).expect("refused");
        assert!(tls.message.contains("encrypted end to end"), "{tls:?}");
        assert!(tls.message.contains("transport: tcp"), "{tls:?}");
        assert!(tls.fix.contains("on_master_down: close"), "{tls:?}");
        assert!(tls.fix.contains("drop `ssl`"), "{tls:?}");
        let e = parse_yaml(
            &format!("{migrate}transport: ws\nssl: {{cert_reqs: CERT_NONE}}\n"),
            None,
        )
        .unwrap_err()
        .0;
        let tls = e.iter().find(|e| e.field == field).expect("refused");
        assert!(tls.message.contains("encrypted end to end"), "{tls:?}");
        assert!(tls.message.contains("transport: ws"), "{tls:?}");
        // Plain ws has its relay, with its migrate_buffer.
        let cfg = parse_yaml(
            &format!(
                "{}transport: ws\n",
                migrate.replace(
                    "on_master_down: migrate\n",
                    "on_master_down: migrate\n    migrate_buffer: 4096\n"
                )
            ),
            None,
        )
        .unwrap();
        assert_eq!(cfg.request.on_master_down, crate::OnMasterDown::Migrate);
        assert_eq!(cfg.request.migrate_buffer, 4096);
        // Plain tcp has its relay; a migrate_buffer goes with it.
        let cfg = parse_yaml(
            &format!(
                "{}transport: tcp\n",
                migrate.replace(
                    "on_master_down: migrate\n",
                    "on_master_down: migrate\n    migrate_buffer: 65536\n"
                )
            ),
            None,
        )
        .unwrap();
        assert_eq!(cfg.request.migrate_buffer, 65536);
    }

    #[test]
    fn the_auth_limit_is_refused_off_zeromq() {
        let limited = BASE.replace(
            "    bind: 127.0.0.1:4506\n",
            "    bind: 127.0.0.1:4506\n    auth_limit:\n      max_in_flight: 5\n",
        );
        parse_yaml(&limited, None).unwrap();
        let e = parse_yaml(&format!("{limited}transport: tcp\n"), None)
            .unwrap_err()
            .0;
        assert!(
            e.iter().any(|e| e.field == "listeners.request.auth_limit"
                && e.fix.contains("transport: zeromq")),
            "{e:?}"
        );
    }

    #[test]
    fn transport_and_ssl_are_written_back_and_read_the_same() {
        let c = parse_yaml(
            &format!("{BASE}transport: tcp\nssl:\n  ca_certs: /etc/salt/ca.pem\n  certfile: /c.pem\n  keyfile: /k.pem\n  server_name: salt.example.com\n"),
            None,
        )
        .unwrap();
        let text = crate::emit::to_yaml(&c, "test");
        assert!(text.contains("transport: tcp\n"), "{text}");
        let back = parse_yaml(&text, None).unwrap();
        assert_eq!(back.global.transport, SaltTransport::Tcp);
        assert_eq!(back.global.ssl, c.global.ssl);
        let plain = parse_yaml(BASE, None).unwrap();
        let text = crate::emit::to_yaml(&plain, "test");
        assert!(text.contains("# transport: tcp"), "{text}");
        assert_eq!(
            parse_yaml(&text, None).unwrap().global.transport,
            SaltTransport::Zeromq
        );
    }

    #[test]
    fn set_transport_checks_what_cannot_work_as_a_file_would() {
        let mut c = parse_yaml(BASE, None).unwrap();
        assert!(super::set_transport(&mut c, SaltTransport::Tcp, None).is_empty());
        assert_eq!(c.global.transport, SaltTransport::Tcp);
        let e = super::set_transport(&mut c, SaltTransport::Zeromq, Some(SslConfig::default()));
        assert!(e.iter().any(|e| e.0 == "ssl"), "{e:?}");
        c.health.probe = crate::Probe::Zmtp;
        let e = super::set_transport(&mut c, SaltTransport::Ws, None);
        assert!(e.iter().any(|e| e.0 == "health.probe"), "{e:?}");
    }

    #[test]
    fn fanout_is_refused_with_the_reason_of_each_transport() {
        let fanout = BASE.replace(
            "    bind: 127.0.0.1:4505\n",
            "    bind: 127.0.0.1:4505\n    mode: fanout\n",
        );
        let field = "listeners.publish.mode";
        for (extra, reason) in [
            ("transport: tcp\n", "proved its id"),
            ("transport: ws\n", "not built"),
            ("transport: ws\nssl: {cert_reqs: CERT_NONE}\n", "end TLS"),
            ("transport: tcp\nssl: {cert_reqs: CERT_NONE}\n", "end TLS"),
        ] {
            let e = parse_yaml(&format!("{fanout}{extra}"), None).unwrap_err().0;
            let f = e.iter().find(|e| e.field == field).expect("refused");
            assert!(f.message.contains(reason), "{extra}: {f:?}");
            assert!(f.fix.contains("mode: l4"), "{f:?}");
        }
    }
}
