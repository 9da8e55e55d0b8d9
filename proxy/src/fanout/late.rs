//! Late identity (fan-out replay): a publish session that opened with no identity learns it
//! when presence later reads the minion's id at its address.
//!
//! A stock Salt minion's SUB sends no ZMTP `Identity`, so a node knows its publish session only
//! by the id presence read from an `_auth` at the same address ([`super::replay`]). After a
//! failover the SUB often reaches the surviving node before the minion's new `_auth` does
//! (libzmq re-opens the SUB as soon as the VIP answers; the minion retries its `_auth` on its own
//! schedule): at open, presence has no id there yet. Such a session waits, for at most the
//! replay window after it opened, for a request session from its address to be identified
//! ([`crate::presence::Presence::wait_for_id`]). Then the same rule as at open decides: the
//! session takes the id only when presence knows exactly one at the address (several minions
//! behind one NAT address: no identity, no replay); then [`super::replay::ReplayLog::returning`]
//! says what it is owed (this node served it within the window, or the peer is down), and it is
//! sent those jobs **except the ones already written to it live** (their sequence numbers are
//! remembered while it waits). So no job goes twice to one session; what is sent comes *after*
//! the live jobs it already had (a Salt minion runs each job as it comes, so the order of
//! independent jobs does not matter to it; docs/ha.md).
//!
//! Past the window, or on a wake that finds no single id, the session stops waiting and is never
//! replayed to: a long-lived session whose address's id presence learns late is left alone.
//! Sessions that opened with an identity never wait, and the hub's publish path does nothing
//! for any of them: the sequence numbers are noted by the waiting session's own loop.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use saltgate_config::defaults::REPLAY_MAX_JOBS;
use tokio::time::Instant;

use super::hub::{Hub, Slot};
use crate::presence::{IdWait, Presence};

/// Live sequence numbers a waiting session remembers: when more arrive, the older half goes.
/// The replay log keeps at most `replay_max_jobs` (<= [`REPLAY_MAX_JOBS`]) jobs, all among the
/// latest published, so a live job older than the latest [`REPLAY_MAX_JOBS`] live ones is no
/// longer kept and cannot be sent again.
const MAX_LIVE: usize = 2 * REPLAY_MAX_JOBS as usize;

/// A session waiting to learn its identity.
pub(crate) struct Late<'a> {
    wait: IdWait<'a>,
    /// After this, a learned id no longer leads to a replay.
    until: Instant,
    /// Sequence numbers written to the session live while it waited. Under a lock: the session
    /// notes them while its wait ([`Late::wake`], a future holding the `Late`) is pending.
    live: std::sync::Mutex<Vec<u64>>,
    /// The hub's count of waiting sessions (the admin view).
    awaiting: &'a AtomicU64,
}

/// How a wait ended.
pub(crate) enum Wake {
    /// A request session from the address was identified.
    Identified,
    /// The window after the session opened is over.
    TooLate,
}

/// Jobs owed to a session: the kept jobs after `after` but those in `except` (sorted).
#[derive(Debug, Default)]
pub(crate) struct Due {
    pub after: u64,
    pub except: Vec<u64>,
    /// The identity was learned after the session opened (counted apart).
    pub late: bool,
}

/// The identity of a session that just finished its handshake: the READY's `Identity` if it
/// sent one, else the one minion id presence knows at its address (`identity` empty: none). With
/// replay on and no identity yet, also a [`Late`] that waits for presence to learn one (it is
/// registered before presence is asked, so an `_auth` read in between is not missed).
pub(crate) fn at_open<'a>(
    hub: &'a Hub,
    presence: Option<&'a Presence>,
    peer: std::net::IpAddr,
    ready_identity: Bytes,
    opened: Instant,
) -> (Bytes, Option<Late<'a>>) {
    if !ready_identity.is_empty() || !hub.replay.enabled() {
        return (ready_identity, None);
    }
    let Some(p) = presence.filter(|p| p.enabled()) else {
        return (Bytes::new(), None);
    };
    let wait = p.wait_for_id(peer);
    if let Some(id) = wait.sole_id() {
        return (Bytes::from(id), None);
    }
    let late = hub.replay.window().map(|within| {
        hub.awaiting_identity.fetch_add(1, Ordering::Relaxed);
        Late {
            wait,
            until: opened + within,
            live: Default::default(),
            awaiting: &hub.awaiting_identity,
        }
    });
    (Bytes::new(), late)
}

impl Late<'_> {
    /// Resolves when presence may know the address's id, or the window is over.
    pub(crate) fn wake(&self) -> impl Future<Output = Wake> + '_ {
        async move {
            tokio::select! {
                _ = self.wait.identified() => Wake::Identified,
                _ = tokio::time::sleep_until(self.until) => Wake::TooLate,
            }
        }
    }

    /// A job was written to the session live.
    pub(crate) fn written(&self, seq: u64) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.len() >= MAX_LIVE {
            live.drain(..MAX_LIVE / 2);
        }
        live.push(seq);
    }

    /// What the session is owed, now that the wait ended with `wake`: its identity is set on
    /// `slot` (a later return is then known by it) when presence has exactly one id at its
    /// address; `None`: no replay.
    pub(crate) fn decide(mut self, hub: &Hub, slot: &Slot, wake: Wake) -> Option<Due> {
        if matches!(wake, Wake::TooLate) || Instant::now() >= self.until {
            tracing::debug!(target: "saltgate_proxy::pubhub::session", client = %slot.peer, "fanout: no minion id learned within the replay window: no replay");
            return None;
        }
        let Some(id) = self.wait.sole_id() else {
            tracing::debug!(target: "saltgate_proxy::pubhub::session", client = %slot.peer, "fanout: several minion ids at this address: no replay");
            return None;
        };
        let id = Bytes::from(id);
        slot.set_identity(id.clone());
        let after = hub.replay.returning(&id)?;
        let mut except = std::mem::take(self.live.get_mut().unwrap_or_else(|p| p.into_inner()));
        except.sort_unstable();
        Some(Due {
            after,
            except,
            late: true,
        })
    }
}

impl Drop for Late<'_> {
    fn drop(&mut self) {
        self.awaiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::hub::HubOptions;
    use saltgate_config::{PresenceConfig, ReplayConfig};
    use std::net::SocketAddr;
    use std::time::Duration;

    const WINDOW: Duration = Duration::from_secs(30);

    fn hub(peer: bool) -> Hub {
        let h = Hub::new(HubOptions::default());
        h.replay.configure(Some(ReplayConfig {
            peer: peer.then(|| "127.0.5.59:9505".parse().unwrap()),
            ..ReplayConfig::with_window(WINDOW)
        }));
        h
    }

    fn presence() -> std::sync::Arc<Presence> {
        Presence::new(&PresenceConfig::default(), &prometheus::Registry::new())
    }

    fn keep(h: &Hub, seqs: std::ops::RangeInclusive<u64>) {
        for seq in seqs {
            h.replay
                .keep(seq, &Bytes::new(), &Bytes::from(format!("job{seq}")));
        }
    }

    /// The sequence numbers a session is sent for `due`.
    fn owed(h: &Hub, due: &Due) -> Vec<u64> {
        let (jobs, _) = h
            .replay
            .batch(due.after, |seq, _| due.except.binary_search(&seq).is_err());
        jobs.into_iter().map(|(seq, _)| seq).collect()
    }

    const AT: &str = "127.0.5.58:40000";

    #[tokio::test(start_paused = true)]
    async fn a_session_whose_id_comes_later_is_owed_its_gap_but_what_it_had_live() {
        let (h, p) = (hub(false), presence());
        let addr: SocketAddr = AT.parse().unwrap();
        keep(&h, 1..=3);
        // Its previous session here had job 1; jobs 2 and 3 were published while it was away.
        h.replay.departed(&Bytes::from_static(b"web-01"), 1);
        let (slot, _rx) = h.attach(addr, Bytes::new(), 10, Default::default());
        let (id, late) = at_open(&h, Some(&p), addr.ip(), Bytes::new(), Instant::now());
        let late = late.expect("no id known at open: it waits");
        assert!(id.is_empty());
        assert_eq!(h.awaiting_identity.load(Ordering::Relaxed), 1);
        // Live while it waits: jobs 4 and 5.
        keep(&h, 4..=5);
        late.written(4);
        late.written(5);
        tokio::time::advance(Duration::from_secs(5)).await;
        p.identify_for_test(1, addr, "web-01");
        let wake = late.wake().await;
        let due = late.decide(&h, &slot, wake).expect("owed its gap");
        assert_eq!(owed(&h, &due), vec![2, 3], "the gap, not what it had live");
        assert!(due.late);
        assert_eq!(slot.identity(), &Bytes::from_static(b"web-01"));
        assert_eq!(h.awaiting_identity.load(Ordering::Relaxed), 0);
        assert_eq!(
            h.replay.returning(&Bytes::from_static(b"web-01")),
            None,
            "the record was taken: one replay per return"
        );
    }

    /// After a failover (the peer down), a minion this node never served, named late.
    #[tokio::test(start_paused = true)]
    async fn after_a_failover_a_session_named_late_gets_the_jobs_since_the_peer_went() {
        let (h, p) = (hub(true), presence());
        let addr: SocketAddr = AT.parse().unwrap();
        keep(&h, 1..=1);
        tokio::time::advance(Duration::from_secs(5)).await;
        h.replay.peer_checked(true);
        tokio::time::advance(Duration::from_secs(3)).await;
        h.replay.peer_checked(false);
        keep(&h, 2..=3);
        let (slot, _rx) = h.attach(addr, Bytes::new(), 10, Default::default());
        let (_, late) = at_open(&h, Some(&p), addr.ip(), Bytes::new(), Instant::now());
        let late = late.expect("it waits");
        keep(&h, 4..=4);
        late.written(4);
        tokio::time::advance(Duration::from_secs(2)).await;
        p.identify_for_test(1, addr, "moved");
        let wake = late.wake().await;
        let due = late.decide(&h, &slot, wake).expect("peer down: owed");
        assert_eq!(owed(&h, &due), vec![2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn two_ids_at_the_address_no_replay() {
        let (h, p) = (hub(false), presence());
        let addr: SocketAddr = AT.parse().unwrap();
        let other: SocketAddr = "127.0.5.58:40001".parse().unwrap();
        keep(&h, 1..=3);
        h.replay.departed(&Bytes::from_static(b"x"), 1);
        let (slot, _rx) = h.attach(addr, Bytes::new(), 10, Default::default());
        let (_, late) = at_open(&h, Some(&p), addr.ip(), Bytes::new(), Instant::now());
        let late = late.expect("it waits");
        p.identify_for_test(1, other, "y");
        p.identify_for_test(2, addr, "x");
        let wake = late.wake().await;
        assert!(late.decide(&h, &slot, wake).is_none(), "two minions here");
        assert!(slot.identity().is_empty());
        assert_eq!(
            h.replay.returning(&Bytes::from_static(b"x")),
            Some(1),
            "x would have been owed its gap"
        );
    }

    /// An id learned after the window is no reason to replay, even while there is something to
    /// replay (the peer went down lately).
    #[tokio::test(start_paused = true)]
    async fn an_id_learned_after_the_window_no_replay() {
        let (h, p) = (hub(true), presence());
        let addr: SocketAddr = AT.parse().unwrap();
        let (slot, _rx) = h.attach(addr, Bytes::new(), 10, Default::default());
        let (_, late) = at_open(&h, Some(&p), addr.ip(), Bytes::new(), Instant::now());
        let late = late.expect("it waits");
        tokio::time::advance(WINDOW - Duration::from_secs(1)).await;
        h.replay.peer_checked(true);
        keep(&h, 1..=2);
        h.replay.peer_checked(false);
        tokio::time::advance(Duration::from_secs(2)).await;
        p.identify_for_test(1, addr, "long-lived");
        let wake = late.wake().await;
        assert!(late.decide(&h, &slot, wake).is_none(), "past the window");
        assert!(
            h.replay
                .returning(&Bytes::from_static(b"long-lived"))
                .is_some(),
            "the failover rule alone would have replayed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_names_itself_or_is_known_at_open_does_not_wait() {
        let (h, p) = (hub(false), presence());
        let addr: SocketAddr = AT.parse().unwrap();
        let (id, late) = at_open(
            &h,
            Some(&p),
            addr.ip(),
            Bytes::from_static(b"me"),
            Instant::now(),
        );
        assert_eq!((id, late.is_none()), (Bytes::from_static(b"me"), true));
        p.identify_for_test(1, addr, "known");
        let (id, late) = at_open(&h, Some(&p), addr.ip(), Bytes::new(), Instant::now());
        assert_eq!((id, late.is_none()), (Bytes::from_static(b"known"), true));
        h.replay.configure(None);
        let other: std::net::IpAddr = "127.0.5.57".parse().unwrap();
        let (_, late) = at_open(&h, Some(&p), other, Bytes::new(), Instant::now());
        assert!(late.is_none(), "replay off: nothing waits");
        assert_eq!(h.awaiting_identity.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn live_jobs_remembered_are_bounded() {
        let h = hub(false);
        let p = Presence::new(&PresenceConfig::default(), &prometheus::Registry::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _g = rt.enter();
        let (_, late) = at_open(
            &h,
            Some(&p),
            "127.0.5.57".parse().unwrap(),
            Bytes::new(),
            Instant::now(),
        );
        let late = late.expect("it waits");
        for seq in 1..=10_000 {
            late.written(seq);
        }
        let live = late.live.lock().unwrap();
        assert!(live.len() <= MAX_LIVE);
        assert!(live.len() > REPLAY_MAX_JOBS as usize);
        assert_eq!(live.last(), Some(&10_000));
    }
}
