//! The listener policies (`rebalance`, `failback`, `reuse_port`) and the `discovery` section of
//! saltgate's YAML, for [`crate::yaml`].

use crate::duration::{parse_duration, BareNumber};
use crate::model::{
    defaults, Balance, Discovery, Failback, ListenerConfig, OnMasterDown, Rebalance, Role,
};
use crate::yaml::duration_text;
use crate::yaml_tree::{Kind, Node};
use crate::yaml_values::{join, Checker, Fields};

const REBALANCE_KEYS: &[&str] = &["enabled", "tolerance", "rate", "delay"];
const DISCOVERY_KEYS: &[&str] = &[
    "cluster_pki_dir",
    // Read by yaml_master_config (the masters' `transport` and `ssl`).
    "master_config",
    "interval",
    "publish_port",
    "request_port",
    "peers",
];

impl Checker<'_> {
    /// `rebalance`, `failback` and `reuse_port` of the listener at `p` (its `balance` is read).
    pub(crate) fn listener_policies(&mut self, f: &Fields<'_>, p: &str, l: &mut ListenerConfig) {
        if let Some(v) = f.get("rebalance") {
            if l.role == Role::Publish {
                l.rebalance = self.rebalance(v, &join(p, "rebalance"));
            } else {
                self.err(
                    v,
                    &join(p, "rebalance"),
                    "only publish sessions are rebalanced (request sessions are short)",
                    "move it under listeners.publish",
                );
            }
        }
        if let Some(v) = f.get("failback") {
            let field = join(p, "failback");
            if l.balance != Balance::First {
                self.err(
                    v,
                    &field,
                    format!(
                        "failback applies to balance: first only (this listener balances {})",
                        l.balance.as_str()
                    ),
                    format!("set {p}.balance: first, or remove failback"),
                );
            } else if let Kind::Bool(b) = v.kind {
                if b {
                    self.err(
                        v,
                        &field,
                        "failback: true does not say after how long",
                        "write a delay such as failback: 30s (the default), 0s for at once, or false for never",
                    );
                } else {
                    l.failback = Failback::Never;
                }
            } else if let Some(t) = self.text(v, &field, "a delay such as 30s, 0s or false") {
                match parse_duration(&t, BareNumber::Refuse) {
                    Ok(d) => l.failback = Failback::After(d),
                    Err(m) => self.err(
                        v,
                        &field,
                        m,
                        format!(
                            "write a delay such as 30s (default {}), 0s for at once, or false for never",
                            duration_text(defaults::FAILBACK)
                        ),
                    ),
                }
            }
        }
        l.reuse_port = self.boolean(f.get("reuse_port"), &join(p, "reuse_port"), false);
        l.freebind = self.boolean(f.get("freebind"), &join(p, "freebind"), false);
        if let Some(v) = f.get("auth_limit") {
            if l.role == Role::Request {
                l.auth_limit = self.auth_limit(v, p);
            } else {
                self.err(
                    v,
                    &join(p, "auth_limit"),
                    "minions send _auth on the request channel only",
                    "move auth_limit under listeners.request",
                );
            }
        }
        if let Some(v) = f.get("migrate_buffer") {
            let field = join(p, "migrate_buffer");
            if l.on_master_down != OnMasterDown::Migrate {
                self.err(
                    v,
                    &field,
                    "migrate_buffer applies with on_master_down: migrate only",
                    "set listeners.request.on_master_down: migrate, or remove migrate_buffer",
                );
            } else if let Some(n) = self.u32_in(
                v,
                &field,
                0,
                defaults::MIGRATE_BUFFER_MAX,
                &defaults::MIGRATE_BUFFER.to_string(),
            ) {
                l.migrate_buffer = n;
            }
        }
    }

    /// `rebalance: {enabled, tolerance: 10%, rate: 50/s, delay: 10s}`; `rebalance: false` turns
    /// it off.
    pub(crate) fn rebalance(&mut self, n: &Node, p: &str) -> Rebalance {
        let mut r = Rebalance::ON;
        if let Kind::Bool(b) = n.kind {
            r.enabled = b;
            return r;
        }
        let f = self.fields(Some(n), p, REBALANCE_KEYS);
        r.enabled = self.boolean(f.get("enabled"), &join(p, "enabled"), r.enabled);
        if let Some(v) = f.get("tolerance") {
            let field = join(p, "tolerance");
            let write = "a percentage from 1% to 100%, e.g. 10%";
            if let Some(t) = self.text(v, &field, write) {
                let num = t.trim().trim_end_matches('%').trim();
                match num.parse::<u32>() {
                    Ok(n) if (1..=100).contains(&n) => r.tolerance_pct = n,
                    _ => self.err(
                        v,
                        &field,
                        format!("{t:?} is not a percentage from 1% to 100%"),
                        format!(
                            "write {write} (default {}%)",
                            defaults::REBALANCE_TOLERANCE_PCT
                        ),
                    ),
                }
            }
        }
        if let Some(v) = f.get("rate") {
            let field = join(p, "rate");
            let write = "sessions per second, e.g. 50/s";
            if let Some(t) = self.text(v, &field, write) {
                let num = t.trim().trim_end_matches("/s").trim();
                match num.parse::<u32>() {
                    Ok(n) if n >= 1 => r.rate = n,
                    _ => self.err(
                        v,
                        &field,
                        format!("{t:?} is not a number of sessions per second (1 or more)"),
                        format!("write {write} (default {}/s)", defaults::REBALANCE_RATE),
                    ),
                }
            }
        }
        if let Some(v) = f.get("delay") {
            r.delay = self
                .duration(
                    v,
                    &join(p, "delay"),
                    &duration_text(defaults::REBALANCE_DELAY),
                )
                .unwrap_or(r.delay);
        }
        r
    }
}

impl Checker<'_> {
    /// `discovery: {cluster_pki_dir, interval, publish_port, request_port, peers: {ID: HOST}}`.
    pub(crate) fn discovery(&mut self, n: Option<&Node>) -> Option<Discovery> {
        let n = n.filter(|n| !matches!(n.kind, Kind::Null))?;
        let f = self.fields(Some(n), "discovery", DISCOVERY_KEYS);
        if !matches!(n.kind, Kind::Map(_)) {
            return None;
        }
        let dir = self
            .required(
                &f,
                "cluster_pki_dir",
                "add cluster_pki_dir: the Salt cluster's cluster_pki_dir (its peers/*.pub are watched)",
            )
            .and_then(|v| {
                self.text(v, "discovery.cluster_pki_dir", "a directory path")
                    .map(|t| (t, v))
            });
        let dir = match dir {
            Some((t, v)) if t.trim().is_empty() => {
                self.err(
                    v,
                    "discovery.cluster_pki_dir",
                    "empty path",
                    "name the Salt cluster's cluster_pki_dir, e.g. /etc/salt/pki/master",
                );
                None
            }
            Some((t, _)) => Some(std::path::PathBuf::from(t.trim())),
            None => None,
        };
        let mut interval = defaults::DISCOVERY_INTERVAL;
        if let Some(v) = f.get("interval") {
            interval = self
                .duration(v, "discovery.interval", &duration_text(interval))
                .unwrap_or(interval);
        }
        let publish_port = self.port(
            f.get("publish_port"),
            "discovery.publish_port",
            Role::Publish,
        );
        let request_port = self.port(
            f.get("request_port"),
            "discovery.request_port",
            Role::Request,
        );
        let mut peers: Vec<(String, String)> = Vec::new();
        if let Some(v) = f.get("peers") {
            match &v.kind {
                Kind::Null => {}
                Kind::Map(entries) => {
                    for (k, h) in entries {
                        let Some(id) = k.scalar_text() else {
                            self.err(
                                k,
                                "discovery.peers",
                                "a peer id must be text",
                                "write ID: ADDRESS",
                            );
                            continue;
                        };
                        let field = format!("discovery.peers.{id}");
                        if peers.iter().any(|(i, _)| *i == id) {
                            self.err(
                                k,
                                &field,
                                format!("peer id {id:?} is mapped twice"),
                                "map each peer id once",
                            );
                            continue;
                        }
                        match self.text(h, &field, "the peer's IP address or DNS name") {
                            Some(t)
                                if t.trim().is_empty()
                                    || t.trim().contains(char::is_whitespace) =>
                            {
                                self.err(
                                    h,
                                    &field,
                                    format!("invalid host {t:?}"),
                                    "write the peer master's IP address or DNS name",
                                )
                            }
                            Some(t) => peers.push((id, t.trim().to_string())),
                            None => {}
                        }
                    }
                }
                _ => self.err(
                    v,
                    "discovery.peers",
                    format!(
                        "expected a mapping of peer id to address, found {}",
                        v.describe()
                    ),
                    "write one 'ID: ADDRESS' line per peer indented below peers:",
                ),
            }
        }
        Some(Discovery {
            cluster_pki_dir: dir?,
            interval,
            publish_port,
            request_port,
            peers,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::model::{Balance, Config, Failback};
    use crate::yaml::parse_yaml;
    use crate::ConfigErrors;

    const LISTENERS: &str = "listeners:
  publish:
    bind: 127.0.0.1:4505
    balance: first
    reuse_port: true
  request:
    bind: 127.0.0.1:4506
    balance: first
";

    fn load(extra: &str) -> Result<Config, ConfigErrors> {
        parse_yaml(
            &format!("masters:\n  - name: a\n    host: 127.0.0.2\n{LISTENERS}{extra}"),
            None,
        )
    }

    #[test]
    fn first_failback_and_reuse_port_are_read_and_written_back() {
        let c = load("").unwrap();
        assert_eq!(c.publish.balance, Balance::First);
        assert_eq!(c.publish.failback, Failback::After(Duration::from_secs(30)));
        assert!(c.publish.reuse_port && !c.request.reuse_port);
        let c = load("    failback: false\n").unwrap();
        assert_eq!(c.request.failback, Failback::Never);
        let c = load("    failback: 0s\n").unwrap();
        assert_eq!(c.request.failback, Failback::After(Duration::ZERO));
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn freebind_is_read_written_back_and_must_be_a_boolean() {
        let text = |v: &str| {
            format!("masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish:\n    bind: 127.0.0.1:4505\n    freebind: {v}\n  request:\n    bind: 127.0.0.1:4506\n")
        };
        let c = parse_yaml(&text("true"), None).unwrap();
        assert!(c.publish.freebind && !c.request.freebind);
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back, c);
        let e = parse_yaml(&text("maybe"), None).unwrap_err().to_string();
        assert!(e.contains("listeners.publish.freebind"), "{e}");
    }

    #[test]
    fn failback_without_first_or_with_true_is_refused_with_the_fix() {
        let e = load("    failback: true\n").unwrap_err().to_string();
        assert!(
            e.contains("listeners.request.failback") && e.contains("false for never"),
            "{e}"
        );
        let e = parse_yaml(
            "masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish: {bind: 127.0.0.1:4505, failback: 10s}\n  request: {bind: 127.0.0.1:4506}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("balance: first"), "{e}");
    }

    #[test]
    fn migrate_is_read_for_requests_written_back_and_refused_on_publish() {
        use crate::model::OnMasterDown;
        let c = load("    on_master_down: migrate\n    migrate_buffer: 65536\n").unwrap();
        assert_eq!(c.request.on_master_down, OnMasterDown::Migrate);
        assert_eq!(c.request.migrate_buffer, 65536);
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back, c);
        let e = load("    migrate_buffer: 100\n").unwrap_err().to_string();
        assert!(
            e.contains("listeners.request.migrate_buffer") && e.contains("on_master_down: migrate"),
            "{e}"
        );
        let e = load("    on_master_down: migrate\n    migrate_buffer: 1GiB\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a whole number from 0 to 67108864"), "{e}");
        let e = parse_yaml(
            "masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish: {bind: 127.0.0.1:4505, on_master_down: migrate}\n  request: {bind: 127.0.0.1:4506}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("listeners.publish.on_master_down") && e.contains("request listener only"),
            "{e}"
        );
    }

    #[test]
    fn discovery_is_read_and_lets_masters_be_left_out() {
        let text = format!(
            "{LISTENERS}discovery:\n  cluster_pki_dir: /etc/salt/pki/master\n  interval: 5s\n  request_port: 14506\n  peers:\n    saltmaster-b: 10.0.0.12\n"
        );
        let c = parse_yaml(&text, None).unwrap();
        let d = c.discovery.clone().unwrap();
        assert!(c.masters.is_empty());
        assert_eq!(
            d.cluster_pki_dir,
            std::path::Path::new("/etc/salt/pki/master")
        );
        assert_eq!(
            (d.interval, d.publish_port, d.request_port),
            (Duration::from_secs(5), 4505, 14506)
        );
        assert_eq!(
            d.peers,
            [("saltmaster-b".to_string(), "10.0.0.12".to_string())]
        );
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back.discovery, c.discovery, "written back as read");
        let e = parse_yaml(
            &format!("{LISTENERS}discovery:\n  interval: 1s\n  peers: [a]\n"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("discovery.cluster_pki_dir") && e.contains("discovery.peers"),
            "{e}"
        );
        let e = parse_yaml(LISTENERS, None).unwrap_err().to_string();
        assert!(
            e.contains("missing key masters"),
            "without discovery masters stay required: {e}"
        );
    }
}
