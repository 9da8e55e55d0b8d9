//! Replay on reconnect (`listeners.publish.replay_window`, fan-out only): the hub keeps the
//! jobs of the last window, and a minion whose publish session comes back gets, before any
//! live traffic, the ones it missed. docs/ha.md, "Replay on reconnect", states the rule and
//! what it cannot cover.
//!
//! - **Identity.** A minion is known by the ZMTP `Identity` of its publish session's READY:
//!   saltgate-minion and its swarm send their id there. libzmq sends none from a SUB socket, so
//!   a stock Salt minion's session has none; for it the session falls back to presence, the id
//!   seen in the `_auth` from the session's address when exactly one minion uses that address
//!   ([`crate::fanout::session`]). A session with neither is never replayed to (several minions
//!   may share an address behind NAT: the address is no identity). A session that opens with
//!   no identity waits, for at most the window, for presence to learn the id at its address (a
//!   stock minion's SUB often reaches the surviving node before its new `_auth`): then the same
//!   rule decides, and it is sent what it is owed but the jobs it already had live
//!   ([`crate::fanout::late`]).
//! - **The rule.** When a session ends, the sequence number of the last job written to it is
//!   remembered under its identity for the window. When a session of that identity comes back
//!   within the window, it is sent the kept jobs after that number, in order, that match its
//!   subscriptions: never a job this node already wrote to it (a restarted minion process has
//!   forgotten the jids it ran, and must not run one twice), and every job published while it
//!   was away, as long as the window and the bounds kept it.
//! - **An identity this node never served** (a minion moving here from a node that died) is
//!   replayed to only with `replay_peer` (the other node's admin address), while that peer's
//!   `/ready` fails: it is sent the kept jobs published since [`PEER_MARGIN`] before the peer
//!   was last seen ready (what the dead node may not have written to it). A minion process that
//!   did not restart drops the ones it already ran by jid; one that restarted in those seconds
//!   may run one twice (docs/ha.md). Without `replay_peer`, or while the peer is ready, nothing.
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

/// Failover replay starts this long before the peer was last seen ready: a job reaches the two
/// nodes' hubs within milliseconds of each other, and the peer may have died just after its
/// last good check; a second more costs a duplicate the minion drops by jid.
pub(crate) const PEER_MARGIN: Duration = Duration::from_secs(2);

/// How often the peer's `/ready` is asked.
pub(crate) const PEER_INTERVAL: Duration = Duration::from_millis(500);

/// What this node knows of its peer (`replay_peer`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PeerSeen {
    /// The last answer was "ready".
    pub ready: bool,
    /// When the peer was last seen ready.
    pub last_ready: Option<Instant>,
    /// Checks made (the admin view; tests wait on it).
    pub checks: u64,
}

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
    peer: PeerSeen,
}

impl Inner {
    /// The sequence number just before the first kept job forwarded at or after `from` (every
    /// kept job when all are later; the last one when none is).
    fn seq_before(&self, from: Instant) -> u64 {
        match self.kept.iter().find(|k| k.at >= from) {
            Some(k) => k.seq - 1,
            None => self.kept.back().map_or(0, |k| k.seq),
        }
    }

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
    /// return), or, for one it never served, while the peer is down (a failover: the jobs
    /// since shortly before the peer was last ready). `None`: nothing to replay.
    pub(crate) fn returning(&self, identity: &Bytes) -> Option<u64> {
        if identity.is_empty() {
            return None;
        }
        let mut g = self.lock();
        let cfg = g.cfg?;
        let now = Instant::now();
        g.trim(now);
        if let Some(d) = g.departed.remove(identity) {
            return Some(d.delivered);
        }
        cfg.peer?;
        let peer = g.peer;
        let last = peer.last_ready.filter(|_| !peer.ready)?;
        if now.checked_duration_since(last)? > cfg.window {
            return None;
        }
        let from = last.checked_sub(PEER_MARGIN).unwrap_or(last);
        Some(g.seq_before(from))
    }

    /// Records a check of the peer's `/ready`.
    pub(crate) fn peer_checked(&self, ready: bool) {
        let mut g = self.lock();
        g.peer.ready = ready;
        g.peer.checks += 1;
        if ready {
            g.peer.last_ready = Some(Instant::now());
        }
    }

    /// The peer to check (`replay_peer`), if replay is on and one is set.
    pub(crate) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.lock().cfg.and_then(|c| c.peer)
    }

    /// What is known of the peer now.
    pub(crate) fn peer(&self) -> PeerSeen {
        self.lock().peer
    }

    /// The kept jobs after `after` that `matches` accepts (given each one's sequence number and
    /// topic), in order, with their sequence numbers, and the highest sequence number kept now.
    pub(crate) fn batch(
        &self,
        after: u64,
        mut matches: impl FnMut(u64, &[u8]) -> bool,
    ) -> (Vec<(u64, Bytes)>, Replayed) {
        let mut g = self.lock();
        g.trim(Instant::now());
        let upto = g.kept.back().map_or(after, |k| k.seq.max(after));
        let jobs: Vec<(u64, Bytes)> = g
            .kept
            .iter()
            .filter(|k| k.seq > after && matches(k.seq, &k.topic))
            .map(|k| (k.seq, k.encoded.clone()))
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

/// Asks the peer's `/ready` (`replay_peer`) every [`PEER_INTERVAL`] and records the answer,
/// until cancelled by the caller. Nothing is asked while no peer is configured.
pub(crate) async fn watch_peer(log: &ReplayLog) {
    let mut tick = tokio::time::interval(PEER_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(addr) = log.peer_addr() {
            log.peer_checked(peer_ready(addr).await);
        }
    }
}

/// `GET /ready` on the peer's admin listener answered 200 within a second (a probe needs no
/// token). Anything else, a refused connection included, is "not ready".
async fn peer_ready(addr: std::net::SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /ready HTTP/1.1\r\nHost: saltgate-peer\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(&head == b"HTTP/1.1 200")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ask).await,
        Ok(Some(true))
    )
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
            peer: None,
        }));
        l
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn bodies(jobs: Vec<(u64, Bytes)>) -> Vec<Bytes> {
        jobs.into_iter().map(|(_, j)| j).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_session_gets_what_followed_its_last_job_and_never_that_job() {
        let l = log(30, 100);
        let all = |_: u64, _: &[u8]| true;
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
        assert_eq!(bodies(jobs), vec![b("job3"), b("job4")]);
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
    async fn with_the_peer_down_an_unknown_minion_gets_what_followed_its_last_ready() {
        let l = ReplayLog::default();
        l.configure(Some(ReplayConfig {
            peer: Some("127.0.0.1:9505".parse().unwrap()),
            ..ReplayConfig::with_window(Duration::from_secs(30))
        }));
        l.keep(1, &b(""), &b("old"));
        tokio::time::advance(Duration::from_secs(5)).await;
        l.peer_checked(true);
        assert_eq!(
            l.returning(&b("moved")),
            None,
            "peer ready: no failover replay"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        l.keep(2, &b(""), &b("late")); // within the margin of the last ready
        l.peer_checked(false);
        tokio::time::advance(Duration::from_secs(1)).await;
        l.keep(3, &b(""), &b("gap"));
        let after = l.returning(&b("moved")).expect("peer down: replay");
        let (jobs, _) = l.batch(after, |_, _| true);
        assert_eq!(
            bodies(jobs),
            vec![b("late"), b("gap")],
            "from the margin before its last ready"
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(
            l.returning(&b("moved")),
            None,
            "peer down longer than the window"
        );
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
        let (jobs, r) = l.batch(5, |_, t| t.starts_with(b"bbbb"));
        assert_eq!((bodies(jobs), r.upto), (vec![b("for-b")], 7));
        // A late identity: what was written live is excluded by sequence number.
        l.keep(8, &b("bbbb"), &b("live"));
        let (jobs, _) = l.batch(5, |seq, t| seq != 8 && t.starts_with(b"bbbb"));
        assert_eq!(jobs, vec![(7, b("for-b"))]);
        // Off: nothing kept, nothing remembered.
        l.configure(None);
        l.keep(9, &b(""), &b("x"));
        l.departed(&b("m"), 9);
        assert_eq!(l.sizes(), (0, 0, 0));
    }
}
