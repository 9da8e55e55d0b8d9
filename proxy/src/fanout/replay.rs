//! Replay on reconnect (`listeners.publish.replay_window`, fan-out only): the hub keeps the
//! jobs of the last window, and a minion whose publish session comes back gets, before any
//! live traffic, the ones it missed. docs/ha.md, "Replay on reconnect", states the rule and
//! what it cannot cover.
//!
//! - **Identity.** A minion is known by the ZMTP `Identity` of its publish session: a Salt
//!   minion sets it to its id on its SUB socket (`salt/transport/zeromq.py`), saltgate-minion
//!   too. A session without one is never replayed to (several minions may share an address
//!   behind NAT: the address is no identity).
//! - **The rule.** When a session ends, the sequence number of the last job written to it is
//!   remembered under its identity for the window. When a session of that identity comes back
//!   within the window, it is sent the kept jobs after that number, in order, that match its
//!   subscriptions: never a job this node already wrote to it (a restarted minion process has
//!   forgotten the jids it ran, and must not run one twice), and every job published while it
//!   was away, as long as the window and the bounds kept it.
//! - **An identity this node never served** (a minion moving here from a node that died) is not
//!   replayed to: this node cannot tell which jobs it already ran. See docs/ha.md.
//! - **Bounds.** At most `replay_max_jobs` jobs (Salt's `minion_jid_queue_hwm`, 100) and
//!   `replay_max_bytes`, none older than the window; departed sessions are remembered for the
//!   window, at most [`MAX_DEPARTED`] of them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::ReplayConfig;
use tokio::time::Instant;

/// Departed sessions remembered at most (about 100 bytes each).
pub(crate) const MAX_DEPARTED: usize = 200_000;

/// A job kept for replay: its hub-wide sequence number, when it was forwarded, its first frame
/// (the topic a subscription matches) and its encoded message.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub seq: u64,
    pub at: Instant,
    pub topic: Bytes,
    pub encoded: Bytes,
}

/// A session that ended: the last sequence number written to it, and when it ended.
#[derive(Debug, Clone, Copy)]
struct Departed {
    delivered: u64,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    cfg: Option<ReplayConfig>,
    kept: VecDeque<Kept>,
    bytes: u64,
    departed: HashMap<Bytes, Departed>,
    /// Departures in time order (an identity may appear more than once: the map has the last).
    order: VecDeque<(Instant, Bytes)>,
}

impl Inner {
    /// Drops what the window and the bounds no longer keep.
    fn trim(&mut self, now: Instant) {
        let Some(cfg) = self.cfg else {
            self.kept.clear();
            self.bytes = 0;
            self.departed.clear();
            self.order.clear();
            return;
        };
        let oldest = now.checked_sub(cfg.window);
        while let Some(k) = self.kept.front() {
            let stale = oldest.is_some_and(|o| k.at < o);
            if stale || self.kept.len() > cfg.max_jobs as usize || self.bytes > cfg.max_bytes {
                self.bytes -= k.encoded.len() as u64;
                self.kept.pop_front();
            } else {
                break;
            }
        }
        while let Some((at, id)) = self.order.front() {
            let stale = oldest.is_some_and(|o| *at < o);
            if !stale && self.order.len() <= MAX_DEPARTED {
                break;
            }
            if self.departed.get(id).is_some_and(|d| d.at == *at) {
                self.departed.remove(id);
            }
            self.order.pop_front();
        }
    }
}

/// What one replay sent (counted in the metrics and the admin view).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub jobs: usize,
    /// The highest sequence number the batch covered: queued copies up to it are skipped.
    pub upto: u64,
}

/// The hub's replay log.
#[derive(Default)]
pub(crate) struct ReplayLog {
    inner: Mutex<Inner>,
}

impl ReplayLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `listeners.publish.replay_*` (read from each snapshot; `None`: off, everything
    /// kept is dropped).
    pub(crate) fn configure(&self, cfg: Option<ReplayConfig>) {
        let mut g = self.lock();
        if g.cfg != cfg {
            g.cfg = cfg;
            g.trim(Instant::now());
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.lock().cfg.is_some()
    }

    /// Keeps a forwarded job (a no-op when replay is off).
    pub(crate) fn keep(&self, seq: u64, topic: &Bytes, encoded: &Bytes) {
        let mut g = self.lock();
        if g.cfg.is_none() {
            return;
        }
        let now = Instant::now();
        g.bytes += encoded.len() as u64;
        g.kept.push_back(Kept {
            seq,
            at: now,
            topic: topic.clone(),
            encoded: encoded.clone(),
        });
        g.trim(now);
    }

    /// A session of `identity` ended after `delivered` (the last sequence number written to it).
    pub(crate) fn departed(&self, identity: &Bytes, delivered: u64) {
        if identity.is_empty() {
            return;
        }
        let mut g = self.lock();
        if g.cfg.is_none() {
            return;
        }
        let now = Instant::now();
        g.departed
            .insert(identity.clone(), Departed { delivered, at: now });
        g.order.push_back((now, identity.clone()));
        g.trim(now);
    }

    /// A session of `identity` starts: the sequence number after which it is owed the kept
    /// jobs, when this node served it within the window (the record is taken: one replay per
    /// return). `None`: nothing to replay.
    pub(crate) fn returning(&self, identity: &Bytes) -> Option<u64> {
        if identity.is_empty() {
            return None;
        }
        let mut g = self.lock();
        g.cfg?;
        g.trim(Instant::now());
        g.departed.remove(identity).map(|d| d.delivered)
    }

    /// The kept jobs after `after` that `matches` accepts, in order, and the highest sequence
    /// number kept now (queued copies up to it are not sent again).
    pub(crate) fn batch(
        &self,
        after: u64,
        mut matches: impl FnMut(&[u8]) -> bool,
    ) -> (Vec<Bytes>, Replayed) {
        let mut g = self.lock();
        g.trim(Instant::now());
        let upto = g.kept.back().map_or(after, |k| k.seq.max(after));
        let jobs: Vec<Bytes> = g
            .kept
            .iter()
            .filter(|k| k.seq > after && matches(&k.topic))
            .map(|k| k.encoded.clone())
            .collect();
        let n = jobs.len();
        (jobs, Replayed { jobs: n, upto })
    }

    /// Jobs and bytes kept now, and departed sessions remembered (the admin view).
    pub(crate) fn sizes(&self) -> (usize, u64, usize) {
        let mut g = self.lock();
        g.trim(Instant::now());
        (g.kept.len(), g.bytes, g.departed.len())
    }

    /// The window in force (`None`: off).
    pub(crate) fn window(&self) -> Option<Duration> {
        self.lock().cfg.map(|c| c.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(window_s: u64, max_jobs: u32) -> ReplayLog {
        let l = ReplayLog::default();
        l.configure(Some(ReplayConfig {
            window: Duration::from_secs(window_s),
            max_jobs,
            max_bytes: 1 << 20,
        }));
        l
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_session_gets_what_followed_its_last_job_and_never_that_job() {
        let l = log(30, 100);
        let all = |_: &[u8]| true;
        for seq in 1..=3 {
            l.keep(seq, &b(""), &b(&format!("job{seq}")));
        }
        // The minion received up to job 2, then its connection went.
        l.departed(&b("web-01"), 2);
        l.keep(4, &b(""), &b("job4"));
        let after = l
            .returning(&b("web-01"))
            .expect("served here within the window");
        let (jobs, r) = l.batch(after, all);
        assert_eq!(jobs, vec![b("job3"), b("job4")]);
        assert_eq!(r, Replayed { jobs: 2, upto: 4 });
        assert_eq!(l.returning(&b("web-01")), None, "one replay per return");
        assert_eq!(
            l.returning(&b("never-here")),
            None,
            "unknown identity: nothing"
        );
        assert_eq!(l.returning(&Bytes::new()), None, "no identity: nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_and_the_bounds_limit_what_is_kept_and_remembered() {
        let l = log(10, 3);
        for seq in 1..=5 {
            l.keep(seq, &b(""), &b("j"));
        }
        assert_eq!(l.sizes().0, 3, "replay_max_jobs");
        l.departed(&b("m"), 0);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(l.sizes(), (0, 0, 0), "all older than the window");
        assert_eq!(l.returning(&b("m")), None);
        // Subscriptions: only matching topics are replayed.
        l.keep(6, &b("aaaa"), &b("for-a"));
        l.keep(7, &b("bbbb"), &b("for-b"));
        let (jobs, r) = l.batch(5, |t| t.starts_with(b"bbbb"));
        assert_eq!((jobs, r.upto), (vec![b("for-b")], 7));
        // Off: nothing kept, nothing remembered.
        l.configure(None);
        l.keep(8, &b(""), &b("x"));
        l.departed(&b("m"), 8);
        assert_eq!(l.sizes(), (0, 0, 0));
    }
}
