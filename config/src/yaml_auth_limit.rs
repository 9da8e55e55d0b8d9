//! `listeners.request.auth_limit` in saltgate's YAML, for [`crate::yaml`] (the model is
//! [`crate::auth_limit`]).

use crate::auth_limit::{
    AuthLimit, MaxInFlight, AUTH_TIMEOUT, MAX_IN_FLIGHT_MAX, MAX_QUEUE, MAX_WAIT,
};
use crate::yaml::duration_text;
use crate::yaml_tree::{Kind, Node};
use crate::yaml_values::{join, Checker};

const KEYS: &[&str] = &["max_in_flight", "max_wait", "max_queue", "auth_timeout"];

impl Checker<'_> {
    /// `auth_limit` of the request listener at `p`: a mapping, `true` (the defaults) or `false`.
    pub(crate) fn auth_limit(&mut self, n: &Node, p: &str) -> Option<AuthLimit> {
        let p = join(p, "auth_limit");
        if let Kind::Bool(b) = n.kind {
            return b.then(AuthLimit::default);
        }
        if !matches!(n.kind, Kind::Map(_)) {
            self.err(
                n,
                &p,
                format!("expected a mapping, found {}", n.describe()),
                "write auth_limit: {max_in_flight: 5, max_wait: 5s}, true for the defaults, or false",
            );
            return None;
        }
        let f = self.fields(Some(n), &p, KEYS);
        let mut a = AuthLimit::default();
        if let Some(v) = f.get("max_in_flight") {
            let field = join(&p, "max_in_flight");
            let auto = matches!(&v.kind, Kind::Str(s) if s.trim() == "auto");
            if auto {
                a.max_in_flight = MaxInFlight::Auto;
            } else if matches!(v.kind, Kind::Int(_)) {
                if let Some(k) = self.u32_in(v, &field, 1, MAX_IN_FLIGHT_MAX, "auto") {
                    a.max_in_flight = MaxInFlight::Fixed(k);
                }
            } else {
                self.err(
                    v,
                    &field,
                    format!("{} is neither a number nor auto", v.shown()),
                    format!("write a whole number from 1 to {MAX_IN_FLIGHT_MAX} (per master; Salt's master has 5 worker_threads), or auto"),
                );
            }
        }
        if let Some(v) = f.get("max_wait") {
            if let Some(d) = self.duration(v, &join(&p, "max_wait"), &duration_text(MAX_WAIT)) {
                a.max_wait = d;
            }
        }
        if let Some(v) = f.get("max_queue") {
            if let Some(q) = self.u32_in(
                v,
                &join(&p, "max_queue"),
                0,
                u32::MAX,
                &MAX_QUEUE.to_string(),
            ) {
                a.max_queue = q;
            }
        }
        if let Some(v) = f.get("auth_timeout") {
            if let Some(d) =
                self.duration(v, &join(&p, "auth_timeout"), &duration_text(AUTH_TIMEOUT))
            {
                a.auth_timeout = d;
            }
        }
        Some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse_yaml;
    use std::time::Duration;

    fn load(extra: &str) -> Result<crate::model::Config, crate::ConfigErrors> {
        parse_yaml(
            &format!("masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish:\n    bind: 127.0.0.1:4505\n  request:\n    bind: 127.0.0.1:4506\n{extra}"),
            None,
        )
    }

    #[test]
    fn auth_limit_is_off_unless_set_and_read_with_its_defaults() {
        assert_eq!(load("").unwrap().request.auth_limit, None);
        assert_eq!(
            load("    auth_limit: false\n").unwrap().request.auth_limit,
            None
        );
        assert_eq!(
            load("    auth_limit: true\n").unwrap().request.auth_limit,
            Some(AuthLimit::default())
        );
        let c = load("    auth_limit:\n      max_in_flight: 3\n      max_wait: 2s\n      max_queue: 50\n      auth_timeout: 10s\n").unwrap();
        let a = c.request.auth_limit.unwrap();
        assert_eq!(a.max_in_flight, MaxInFlight::Fixed(3));
        assert_eq!(a.max_wait, Duration::from_secs(2));
        assert_eq!(a.max_queue, 50);
        assert_eq!(a.auth_timeout, Duration::from_secs(10));
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back, c);
        let a = load("    auth_limit: {max_in_flight: auto}\n").unwrap();
        assert_eq!(
            a.request.auth_limit.unwrap().max_in_flight,
            MaxInFlight::Auto
        );
    }

    #[test]
    fn bad_auth_limits_name_the_key_and_the_fix() {
        let e = load("    auth_limit: {max_in_flight: 0}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("listeners.request.auth_limit.max_in_flight")
                && e.contains("a whole number from 1"),
            "{e}"
        );
        let e = load("    auth_limit: {max_in_flight: lots}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither a number nor auto"), "{e}");
        let e = load("    auth_limit: {max_wait: 0s}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("listeners.request.auth_limit.max_wait") && e.contains("greater than zero"),
            "{e}"
        );
        let e = load("    auth_limit: {max_inflight: 3}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_inflight"), "{e}");
        let e = load("    auth_limit: 5\n").unwrap_err().to_string();
        assert!(
            e.contains("listeners.request.auth_limit") && e.contains("expected a mapping"),
            "{e}"
        );
        let e = parse_yaml(
            "masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish: {bind: 127.0.0.1:4505, auth_limit: true}\n  request: {bind: 127.0.0.1:4506}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("listeners.publish.auth_limit") && e.contains("listeners.request"),
            "{e}"
        );
    }
}
