//! `listeners.publish.replay_window`, `replay_max_jobs` and `replay_max_bytes` (fan-out only),
//! for [`crate::yaml`].

use crate::model::{defaults, ListenerConfig, ListenerMode, ReplayConfig, Role};
use crate::yaml_values::{join, Checker, Fields};

impl Checker<'_> {
    /// The replay keys of the listener at `p` (its `mode` is already read).
    pub(crate) fn replay(&mut self, f: &Fields<'_>, p: &str, l: &mut ListenerConfig) {
        let keys = [
            "replay_window",
            "replay_max_jobs",
            "replay_max_bytes",
            "replay_peer",
        ];
        let given: Vec<_> = keys
            .iter()
            .filter_map(|k| f.get(k).map(|v| (*k, v)))
            .collect();
        if given.is_empty() {
            return;
        }
        if l.role != Role::Publish || l.mode != ListenerMode::Fanout {
            for (key, v) in given {
                self.err(
                    v,
                    &join(p, key),
                    "replay needs the publish fan-out: in l4 mode saltgate does not read the jobs it passes",
                    format!("add mode: fanout to listeners.publish, or remove {key} from {p}"),
                );
            }
            return;
        }
        let Some(w) = f.get("replay_window") else {
            let (key, v) = given[0];
            self.err(
                v,
                &join(p, key),
                "replay_window is not set: replay is off, so this bound applies to nothing",
                format!("set {p}.replay_window (e.g. 30s, at most 60s), or remove {key}"),
            );
            return;
        };
        let field = join(p, "replay_window");
        let Some(window) = self.duration(w, &field, "unset (off)") else {
            return;
        };
        if window > defaults::REPLAY_WINDOW_MAX {
            self.err(
                w,
                &field,
                format!("{} is over the 60 s maximum", w.shown()),
                "write at most 60s: a minion that has been away longer re-authenticates and a job that old is stale",
            );
            return;
        }
        let mut r = ReplayConfig::with_window(window);
        if let Some(v) = f.get("replay_max_jobs") {
            let max = defaults::REPLAY_MAX_JOBS;
            if let Some(n) = self.u32_in(v, &join(p, "replay_max_jobs"), 1, max, &max.to_string()) {
                r.max_jobs = n;
            }
        }
        if let Some(v) = f.get("replay_max_bytes") {
            let d = defaults::REPLAY_MAX_BYTES;
            if let Some(n) = self.uint(
                v,
                &join(p, "replay_max_bytes"),
                1024,
                1 << 30,
                &d.to_string(),
            ) {
                r.max_bytes = n;
            }
        }
        if let Some(v) = f.get("replay_peer") {
            let field = join(p, "replay_peer");
            if let Some(t) = self.text(v, &field, "the other node's admin address, IP:PORT") {
                match crate::addr::parse_bind(&t) {
                    Ok(a) if !a.ip().is_unspecified() && a.port() != 0 => r.peer = Some(a),
                    Ok(_) => self.err(
                        v,
                        &field,
                        format!("{t} is not an address to reach"),
                        "write the other node's admin address, e.g. 10.0.0.12:9505",
                    ),
                    Err(m) => self.err(
                        v,
                        &field,
                        m,
                        "write the other node's admin address, e.g. 10.0.0.12:9505",
                    ),
                }
            }
        }
        l.replay = Some(r);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::yaml::parse_yaml;

    fn with(publish: &str) -> Result<crate::model::Config, String> {
        parse_yaml(
            &format!("masters:\n  - name: a\n    host: 127.0.0.2\nlisteners:\n  publish: {{bind: 127.0.0.1:4505{publish}}}\n  request: {{bind: 127.0.0.1:4506}}\n"),
            None,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn replay_is_off_by_default_and_read_with_its_bounds() {
        assert_eq!(with(", mode: fanout").unwrap().publish.replay, None);
        let r = with(", mode: fanout, replay_window: 30s")
            .unwrap()
            .publish
            .replay
            .unwrap();
        assert_eq!(r.window, Duration::from_secs(30));
        assert_eq!((r.max_jobs, r.max_bytes), (100, 16 << 20));
        let r =
            with(", mode: fanout, replay_window: 5s, replay_max_jobs: 10, replay_max_bytes: 65536")
                .unwrap()
                .publish
                .replay
                .unwrap();
        assert_eq!(
            (r.window, r.max_jobs, r.max_bytes),
            (Duration::from_secs(5), 10, 65536)
        );
        // Written back the same.
        let c = with(", mode: fanout, replay_window: 5s, replay_max_jobs: 10").unwrap();
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back.publish.replay, c.publish.replay);
        let c = with(", mode: fanout, replay_window: 5s, replay_peer: \"10.0.0.12:9505\"").unwrap();
        assert_eq!(
            c.publish.replay.unwrap().peer,
            Some("10.0.0.12:9505".parse().unwrap())
        );
        let back = parse_yaml(&crate::emit::to_yaml(&c, "test"), None).unwrap();
        assert_eq!(back.publish.replay, c.publish.replay);
    }

    #[test]
    fn replay_outside_fanout_over_the_maximum_or_without_a_window_is_refused() {
        for (publish, field, fix) in [
            (
                ", replay_window: 30s",
                "listeners.publish.replay_window",
                "mode: fanout",
            ),
            (
                ", mode: fanout, replay_window: 61s",
                "listeners.publish.replay_window",
                "at most 60s",
            ),
            (
                ", mode: fanout, replay_window: 0s",
                "listeners.publish.replay_window",
                "positive",
            ),
            (
                ", mode: fanout, replay_max_jobs: 10",
                "listeners.publish.replay_max_jobs",
                "replay_window",
            ),
            (
                ", mode: fanout, replay_window: 5s, replay_max_jobs: 101",
                "listeners.publish.replay_max_jobs",
                "1 to 100",
            ),
        ] {
            let e = with(publish).unwrap_err();
            assert!(e.contains(field) && e.contains(fix), "{publish}: {e}");
        }
    }
}
