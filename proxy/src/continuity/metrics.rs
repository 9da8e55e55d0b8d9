//! Request-session continuity metrics (`on_master_down: migrate`), registered once per process in
//! the proxy's registry. Listed in docs/request-continuity.md.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use super::track::Skip;
use crate::data::close::CloseReason;

/// Handles for `saltgate_request_*` continuity counters.
pub struct ReplayMetrics {
    migrated: IntCounterVec,
    replayed: IntCounterVec,
    skipped: IntCounterVec,
}

impl ReplayMetrics {
    /// Creates and registers the handles (a name already registered is not an error).
    pub fn new(r: &Registry) -> Self {
        let vec = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            let _ = r.register(Box::new(c.clone()));
            c
        };
        ReplayMetrics {
            migrated: vec(
                "saltgate_request_sessions_migrated_total",
                "Request sessions moved to another master without closing the minion's connection, by why the first master was left (master-reset, master-eof, master-down).",
                "reason",
            ),
            replayed: vec(
                "saltgate_requests_replayed_total",
                "Requests re-sent to the master a session moved to: complete (sent whole, never answered) or partial (the rest follows from the minion).",
                "request",
            ),
            skipped: vec(
                "saltgate_request_migrations_skipped_total",
                "Request sessions closed with their master instead of moving, by why (protocol, handshake, mid-reply, over-cap, replayed-once, no-master, client).",
                "reason",
            ),
        }
    }

    /// `saltgate_request_sessions_migrated_total{reason}`.
    pub fn migrated(&self, why: CloseReason) -> IntCounter {
        self.migrated.with_label_values(&[why.as_str()])
    }

    /// `saltgate_requests_replayed_total{request}`.
    pub fn replayed(&self, complete: bool) -> IntCounter {
        let l = if complete { "complete" } else { "partial" };
        self.replayed.with_label_values(&[l])
    }

    /// `saltgate_request_migrations_skipped_total{reason}`.
    pub fn skipped(&self, why: Skip) -> IntCounter {
        self.skipped.with_label_values(&[why.as_str()])
    }
}
