//! `listeners.publish.dedup_cluster_pki_dir` (fan-out mode only) for [`crate::yaml`].

use crate::model::{ListenerConfig, ListenerMode, Role};
use crate::yaml_tree::Node;
use crate::yaml_values::{join, Checker};

impl Checker<'_> {
    /// `dedup_cluster_pki_dir` of the listener at `p` (its `mode` is already read): a path, on
    /// the publish listener in `mode: fanout` only.
    pub(crate) fn dedup_dir(&mut self, v: Option<&Node>, p: &str, l: &mut ListenerConfig) {
        let Some(v) = v else { return };
        let field = join(p, "dedup_cluster_pki_dir");
        if l.role == Role::Request {
            self.err(
                v,
                &field,
                "dedup applies to the publish fan-out only (a request goes to one master)",
                "remove dedup_cluster_pki_dir from listeners.request; set it under listeners.publish with mode: fanout",
            );
            return;
        }
        if l.mode != ListenerMode::Fanout {
            self.err(
                v,
                &field,
                "dedup works in mode: fanout only (in l4 mode a minion hears one master, whose bytes pass untouched)",
                format!("add mode: fanout to {p}, or remove dedup_cluster_pki_dir"),
            );
            return;
        }
        let Some(t) = self.text(v, &field, "a directory path") else {
            return;
        };
        if t.trim().is_empty() {
            self.err(
                v,
                &field,
                "empty path",
                "name the Salt cluster's cluster_pki_dir (where its .aes lives), e.g. /etc/salt/pki/master",
            );
            return;
        }
        l.dedup_cluster_pki_dir = Some(std::path::PathBuf::from(t.trim()));
    }
}

#[cfg(test)]
mod tests {
    use crate::yaml::parse_yaml;

    fn with(publish: &str, request: &str) -> Result<crate::model::Config, String> {
        parse_yaml(
            &format!("masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish: {{bind: 127.0.0.1:4505{publish}}}\n  request: {{bind: 127.0.0.1:4506{request}}}\n"),
            None,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn dedup_dir_is_read_in_fanout_mode_and_written_back() {
        let c = with(
            ", mode: fanout, dedup_cluster_pki_dir: /etc/salt/pki/master",
            "",
        )
        .unwrap();
        assert_eq!(
            c.publish.dedup_cluster_pki_dir.as_deref(),
            Some(std::path::Path::new("/etc/salt/pki/master"))
        );
        let text = crate::emit::to_yaml(&c, "test");
        assert!(
            text.contains("dedup_cluster_pki_dir: \"/etc/salt/pki/master\""),
            "{text}"
        );
        assert_eq!(parse_yaml(&text, None).unwrap(), c, "written back as read");
        let plain = with(", mode: fanout", "").unwrap();
        assert_eq!(plain.publish.dedup_cluster_pki_dir, None, "off by default");
        assert!(!crate::emit::to_yaml(&plain, "test").contains("dedup"));
    }

    #[test]
    fn dedup_dir_is_refused_in_l4_mode_on_requests_and_when_empty() {
        let e = with(", dedup_cluster_pki_dir: /srv/pki", "").unwrap_err();
        assert!(
            e.contains("listeners.publish.dedup_cluster_pki_dir")
                && e.contains("add mode: fanout to listeners.publish"),
            "{e}"
        );
        let e = with(", mode: fanout", ", dedup_cluster_pki_dir: /srv/pki").unwrap_err();
        assert!(
            e.contains("listeners.request.dedup_cluster_pki_dir")
                && e.contains("remove dedup_cluster_pki_dir from listeners.request"),
            "{e}"
        );
        let e = with(", mode: fanout, dedup_cluster_pki_dir: ''", "").unwrap_err();
        assert!(
            e.contains("empty path") && e.contains("/etc/salt/pki/master"),
            "{e}"
        );
        let e = with(", mode: fanout, dedup_cluster_pki_dir: [a]", "").unwrap_err();
        assert!(e.contains("a directory path"), "{e}");
    }
}
