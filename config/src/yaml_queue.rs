//! The listener's queue keys (`timeout_queue`, `maxqueue`) for [`crate::yaml`]: clients wait there
//! while every master that could take them is at its `maxconn` (HAProxy's queue).

use crate::model::{defaults, ListenerConfig};
use crate::yaml_values::{join, Checker, Fields};

/// The most clients a listener's queue may hold (each holds a descriptor while it waits).
pub(crate) const MAX_MAXQUEUE: u32 = 1_000_000;

impl Checker<'_> {
    /// Reads `timeout_queue` and `maxqueue` of the listener at `p` into `l`.
    pub(crate) fn listener_queue(&mut self, f: &Fields<'_>, p: &str, l: &mut ListenerConfig) {
        if let Some(v) = f.get("timeout_queue") {
            let field = join(p, "timeout_queue");
            l.timeout_queue = self
                .duration(v, &field, "timeout_connect (HAProxy's default)")
                .or(l.timeout_queue);
        }
        if let Some(v) = f.get("maxqueue") {
            l.maxqueue = self
                .u32_in(
                    v,
                    &join(p, "maxqueue"),
                    0,
                    MAX_MAXQUEUE,
                    &defaults::MAXQUEUE.to_string(),
                )
                .unwrap_or(l.maxqueue);
        }
    }
}
