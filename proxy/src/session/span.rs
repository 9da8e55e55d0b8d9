//! The span every proxied session runs in, so that every log line of a session can be found by
//! its id: `session{id=42 listener=request client=10.1.2.3:55294 master=m1}` in text logs, and
//! a `spans` entry of the same fields in JSON logs.
//!
//! * `id`: the session id (the admin API's and presence's), taken at accept;
//! * `listener`: `publish` or `request`;
//! * `client`: the minion's address;
//! * `master`: the master the session was given, recorded when chosen (and again when a request
//!   session moves, [`crate::continuity`]); absent while none is (queued, refused) and on the
//!   fan-out port, where every master serves every session.
//!
//! The span is attached to the session's task (`Instrument`), so it is entered once per poll of
//! the task, never per byte. It is an `INFO` span with a target of its own,
//! [`SPAN_TARGET`]: the events keep their targets, and
//! `RUST_LOG=info,saltgate_proxy::session_span=off` turns the span alone off (an enabled span
//! holds about 450 B per live session in the subscriber's registry; docs/operations.md, "Logs").

use std::net::SocketAddr;

use saltgate_config::Role;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

/// The span's target (not its events').
pub const SPAN_TARGET: &str = "saltgate_proxy::session_span";

/// The span of session `id` of `listener` from `client`; `master` is empty until chosen.
pub fn session_span(id: u64, listener: Role, client: SocketAddr) -> Span {
    tracing::info_span!(
        target: SPAN_TARGET,
        "session",
        id,
        listener = %listener,
        client = %client,
        master = tracing::field::Empty,
    )
}

/// Records the master the current session was given (or moved to) on its span.
pub fn record_master(master: &str) {
    Span::current().record("master", tracing::field::display(master));
}

/// Spawns a session's task on `tracker`, in its span when that span is enabled. A disabled span
/// (log level above `info`, or `saltgate_proxy::session_span=off`) is not kept in the task at
/// all: it would add 40 B to every session's task, and tokio allocates a task in steps of 128 B
/// (its task cell is cache-line aligned on x86_64 and aarch64), so those 40 B cost an idle
/// session 128 (issue 26's before/after bench: +120 B per idle session). See
/// `session::l4`'s `an_idle_sessions_task_stays_within_1024_bytes`.
pub(crate) fn in_span<F>(tracker: &TaskTracker, (run, span): (F, Span))
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if span.is_disabled() {
        tracker.spawn(run);
    } else {
        tracker.spawn(run.instrument(span));
    }
}
