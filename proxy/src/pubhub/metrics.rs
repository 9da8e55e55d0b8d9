//! The fan-out hub's metrics, registered once per process in the proxy's registry (never the
//! global one). Names are listed in docs/fanout.md.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

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
    /// `saltgate_fanout_duplicates_total`: byte-identical messages suppressed by the optional dedup.
    pub duplicates: IntCounter,
}

impl FanoutMetrics {
    /// Creates and registers the handles. A name already registered (a second hub on the same
    /// registry) is not an error: the handles then simply are not exported twice.
    pub fn new(r: &Registry) -> Self {
        let counter_vec = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &["master"]).expect("valid metric");
            let _ = r.register(Box::new(c.clone()));
            c
        };
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
            duplicates: counter(
                "saltgate_fanout_duplicates_total",
                "Byte-identical messages suppressed by the optional dedup window.",
            ),
        }
    }
}
