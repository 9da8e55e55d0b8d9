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
use tracing::Span;

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
