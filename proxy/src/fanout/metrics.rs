//! The fan-out hub's metrics, registered once per process in the proxy's registry (never the
//! global one). Names are listed in docs/fanout.md.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use saltgate_wire::publish_job::JobIdError;

/// Every `reason` of `saltgate_fanout_sessions_cut_total`.
pub const CUT_REASONS: [&str; 7] = [
    "oversized",
    "frame_timeout",
    "write_timeout",
    "topics",
    "topic_bytes",
    "handshake_timeout",
    "heartbeat_timeout",
];

/// Handles for `saltgate_fanout_*`.
pub struct FanoutMetrics {
    /// `saltgate_fanout_upstream_connects_total{master}`: upstream SUB connections established.
    pub upstream_connects: IntCounterVec,
    /// `saltgate_fanout_upstream_disconnects_total{master}`: upstream SUB connections lost or closed.
    pub upstream_disconnects: IntCounterVec,
    /// `saltgate_fanout_upstream_messages_total{master}`: messages received from a master.
    pub upstream_messages: IntCounterVec,
    /// `saltgate_fanout_upstreams_connected`: upstream SUB connections up now.
    pub upstreams_connected: IntGauge,
    /// `saltgate_fanout_sessions_current`: minion sessions attached to the hub.
    pub sessions: IntGauge,
    /// `saltgate_fanout_messages_fanned_total`: copies queued to minion sessions.
    pub fanned: IntCounter,
    /// `saltgate_fanout_messages_dropped_total`: copies dropped at a session's high-water mark.
    pub dropped: IntCounter,
    /// `saltgate_fanout_duplicates_total{master}`: later copies of a job dropped by the dedup,
    /// labelled with the master whose copy it was.
    pub duplicates: IntCounterVec,
    /// `saltgate_fanout_dedup_unreadable_total{reason}`: messages whose jid could not be read
    /// (forwarded as is), one handle per [`JobIdError::ALL`], in order.
    pub unreadable: [IntCounter; 5],
    /// `saltgate_fanout_dedup_key_loads_total`: cluster keys loaded (the first and each change).
    pub key_loads: IntCounter,
    /// `saltgate_fanout_sessions_cut_total{reason}`: minion sessions closed for a limit, one
    /// handle per [`CUT_REASONS`], in order.
    pub cut: [IntCounter; 7],
    /// `saltgate_fanout_replays_total`: returning minion sessions sent the jobs they missed.
    pub replays: IntCounter,
    /// `saltgate_fanout_replayed_jobs_total`: jobs sent again by those replays.
    pub replayed_jobs: IntCounter,
    /// `saltgate_fanout_late_identity_replays_total`: those of the replays whose session
    /// learned its identity after it opened (a stock minion's SUB before its `_auth`).
    pub late_replays: IntCounter,
}

impl FanoutMetrics {
    /// Creates and registers the handles. A name already registered (a second hub on the same
    /// registry) is not an error: the handles then simply are not exported twice.
    pub fn new(r: &Registry) -> Self {
        let counter_vec_by = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            let _ = r.register(Box::new(c.clone()));
            c
        };
        let counter_vec = |name: &str, help: &str| counter_vec_by(name, help, "master");
        let reasons = counter_vec_by(
            "saltgate_fanout_dedup_unreadable_total",
            "Messages whose job id the fan-out dedup could not read; forwarded as is.",
            "reason",
        );
        let cuts = counter_vec_by(
            "saltgate_fanout_sessions_cut_total",
            "Minion sessions the fan-out hub closed for a limit (oversized frame, frame_timeout, write_timeout, topics, topic_bytes, handshake or heartbeat timeout).",
            "reason",
        );
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            let _ = r.register(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            let _ = r.register(Box::new(g.clone()));
            g
        };
        FanoutMetrics {
            upstream_connects: counter_vec(
                "saltgate_fanout_upstream_connects_total",
                "Upstream SUB connections to a master established (fanout mode).",
            ),
            upstream_disconnects: counter_vec(
                "saltgate_fanout_upstream_disconnects_total",
                "Upstream SUB connections to a master lost or closed (fanout mode).",
            ),
            upstream_messages: counter_vec(
                "saltgate_fanout_upstream_messages_total",
                "Messages received from a master's publish port (fanout mode).",
            ),
            upstreams_connected: gauge(
                "saltgate_fanout_upstreams_connected",
                "Upstream SUB connections up now (fanout mode).",
            ),
            sessions: gauge(
                "saltgate_fanout_sessions_current",
                "Minion sessions attached to the fan-out hub.",
            ),
            fanned: counter(
                "saltgate_fanout_messages_fanned_total",
                "Message copies queued to minion sessions.",
            ),
            dropped: counter(
                "saltgate_fanout_messages_dropped_total",
                "Message copies dropped because a minion session's queue was at its high-water mark.",
            ),
            duplicates: counter_vec(
                "saltgate_fanout_duplicates_total",
                "Later copies of a job dropped by the fan-out dedup, by the master that sent the copy.",
            ),
            unreadable: JobIdError::ALL.map(|e| reasons.with_label_values(&[e.label()])),
            key_loads: counter(
                "saltgate_fanout_dedup_key_loads_total",
                "Cluster keys loaded by the fan-out dedup (the first one and each change).",
            ),
            cut: CUT_REASONS.map(|r| cuts.with_label_values(&[r])),
            replays: counter(
                "saltgate_fanout_replays_total",
                "Returning minion publish sessions sent the jobs they missed (listeners.publish.replay_window).",
            ),
            replayed_jobs: counter(
                "saltgate_fanout_replayed_jobs_total",
                "Jobs sent again to returning minion publish sessions (listeners.publish.replay_window).",
            ),
            late_replays: counter(
                "saltgate_fanout_late_identity_replays_total",
                "Replays (also counted in saltgate_fanout_replays_total) to a minion publish session whose minion id presence learned after it opened: a Salt minion's SUB that reached this node before its _auth.",
            ),
        }
    }
}

impl FanoutMetrics {
    /// The `saltgate_fanout_sessions_cut_total` handle for `reason` (one of
    /// [`CUT_REASONS`]).
    pub(crate) fn cut(&self, reason: &str) -> &IntCounter {
        let i = CUT_REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        &self.cut[i]
    }

    /// The `saltgate_fanout_dedup_unreadable_total` handle for `e`.
    pub fn unreadable(&self, e: JobIdError) -> &IntCounter {
        let i = JobIdError::ALL.iter().position(|x| *x == e).unwrap_or(0);
        &self.unreadable[i]
    }
}
