//! `listeners.publish.dedup_cluster_pki_dir`, `hwm` and the session limits (`max_frame`,
//! `max_topics`, `max_topic_bytes`, `frame_timeout`), fan-out mode only, for [`crate::yaml`].

use crate::model::{defaults, ListenerConfig, ListenerMode, Role};
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

    /// The session limits of the listener at `p` (its `mode` is already read): `max_frame`,
    /// `max_topics`, `max_topic_bytes` and `frame_timeout`, fan-out only.
    pub(crate) fn fanout_limits(
        &mut self,
        f: &crate::yaml_values::Fields<'_>,
        p: &str,
        l: &mut ListenerConfig,
    ) {
        let fanout = l.role == Role::Publish && l.mode == ListenerMode::Fanout;
        let d = crate::model::FanoutLimits::default();
        let lim = &mut l.fanout_limits;
        let max = defaults::FANOUT_LIMIT_MAX;
        let ints: [(&str, &mut u32, u32, u32, u32); 3] = [
            ("max_frame", &mut lim.max_frame, 256, max, d.max_frame),
            (
                "max_topics",
                &mut lim.max_topics,
                1,
                1_000_000,
                d.max_topics,
            ),
            (
                "max_topic_bytes",
                &mut lim.max_topic_bytes,
                64,
                max,
                d.max_topic_bytes,
            ),
        ];
        for (key, slot, min, max, default) in ints {
            let Some(v) = f.get(key) else { continue };
            let field = join(p, key);
            if !fanout {
                self.not_fanout(v, &field, p, key);
                continue;
            }
            if let Some(n) = self.u32_in(v, &field, min, max, &default.to_string()) {
                *slot = n;
            }
        }
        if let Some(v) = f.get("frame_timeout") {
            let field = join(p, "frame_timeout");
            if !fanout {
                self.not_fanout(v, &field, p, "frame_timeout");
            } else if let Some(t) = self.duration(v, &field, "10s") {
                lim.frame_timeout = t;
            }
        }
    }

    fn not_fanout(&mut self, v: &Node, field: &str, p: &str, key: &str) {
        self.err(
            v,
            field,
            format!("{key} limits what a minion sends the fan-out hub (in l4 mode its bytes pass to a master untouched)"),
            format!("add mode: fanout to listeners.publish, or remove {key} from {p}"),
        );
    }

    /// `hwm` of the listener at `p` (its `mode` is already read): the per-session queue of the
    /// publish fan-out, in messages.
    pub(crate) fn fanout_hwm(&mut self, v: Option<&Node>, p: &str, l: &mut ListenerConfig) {
        let Some(v) = v else { return };
        let field = join(p, "hwm");
        if l.role == Role::Request || l.mode != ListenerMode::Fanout {
            self.err(
                v,
                &field,
                "hwm is the fan-out's per-session queue (in l4 mode the kernel's socket buffers queue the bytes)",
                format!("add mode: fanout to listeners.publish, or remove hwm from {p}"),
            );
            return;
        }
        let default = defaults::FANOUT_HWM.to_string();
        if let Some(n) = self.u32_in(v, &field, 1, defaults::MAX_FANOUT_HWM, &default) {
            l.hwm = n;
        }
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
    fn fanout_limits_are_read_written_back_and_refused_outside_fanout() {
        let c = with(
            ", mode: fanout, max_frame: 4096, max_topics: 3, max_topic_bytes: 512, frame_timeout: 2s",
            "",
        )
        .unwrap();
        let l = c.publish.fanout_limits;
        assert_eq!(
            (l.max_frame, l.max_topics, l.max_topic_bytes),
            (4096, 3, 512)
        );
        assert_eq!(l.frame_timeout, std::time::Duration::from_secs(2));
        let text = crate::emit::to_yaml(&c, "test");
        assert_eq!(parse_yaml(&text, None).unwrap(), c, "written back as read");
        let e = with(", max_topics: 3", "").unwrap_err();
        assert!(
            e.contains("listeners.publish.max_topics") && e.contains("add mode: fanout"),
            "{e}"
        );
        let e = with(", mode: fanout, max_frame: 0", "").unwrap_err();
        assert!(e.contains("listeners.publish.max_frame"), "{e}");
        let e = with(", mode: fanout, frame_timeout: 0s", "").unwrap_err();
        assert!(e.contains("listeners.publish.frame_timeout"), "{e}");
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

    #[test]
    fn hwm_is_read_in_fanout_mode_written_back_and_refused_elsewhere() {
        let c = with(", mode: fanout, hwm: 250", "").unwrap();
        assert_eq!(c.publish.hwm, 250);
        let text = crate::emit::to_yaml(&c, "test");
        assert!(text.contains("hwm: 250"), "{text}");
        assert_eq!(parse_yaml(&text, None).unwrap(), c, "written back as read");
        assert_eq!(
            with(", mode: fanout", "").unwrap().publish.hwm,
            1000,
            "Salt's pub_hwm"
        );
        for (publish, request, want) in [
            (", hwm: 10", "", "listeners.publish.hwm"),
            (", mode: fanout", ", hwm: 10", "listeners.request.hwm"),
        ] {
            let e = with(publish, request).unwrap_err();
            assert!(e.contains(want) && e.contains("add mode: fanout"), "{e}");
        }
        for bad in ["0", "1000001", "'12'", "lots"] {
            let e = with(&format!(", mode: fanout, hwm: {bad}"), "").unwrap_err();
            assert!(
                e.contains("listeners.publish.hwm")
                    && (e.contains("from 1 to 1000000") || e.contains("without quotes: 12")),
                "{bad}: {e}"
            );
        }
    }
}
