//! `MasterLimits`: the `saltgate_*` keys of saltgate-master's Salt-format file that bound what
//! an unauthenticated client can make it hold (read in [`crate::salt_master`], which
//! holds their defaults).

/// What an unauthenticated client can make saltgate-master hold (issue 31): the `saltgate_*`
/// keys of the same names. Salt has none of them (libzmq: no frame limit, no deadlines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasterLimits {
    /// `saltgate_max_clear_load`: bytes of a clear request (`ping`, `_auth`).
    pub max_clear_load: usize,
    /// `saltgate_untrusted_max_frame`: bytes of a frame before the connection is trusted.
    pub untrusted_max_frame: usize,
    /// `saltgate_untrusted_queue_bytes`: bytes of requests from connections not yet trusted
    /// waiting for a handler, all together; a connection whose request does not fit stops
    /// being read until room is made.
    pub untrusted_queue_bytes: usize,
    /// `saltgate_request_max_connections`: connections the request port serves at once
    /// (handshaking or established); beyond it new ones wait in the kernel backlog. `None`
    /// (default): no cap but the descriptor limit.
    pub request_max_connections: Option<usize>,
    /// `saltgate_publish_max_connections`: the same for the publish port.
    pub publish_max_connections: Option<usize>,
    /// `saltgate_frame_timeout`, seconds.
    pub frame_timeout_secs: u64,
    /// `saltgate_write_timeout`, seconds.
    pub write_timeout_secs: u64,
    /// `saltgate_cluster_auth_timeout`, seconds.
    pub cluster_auth_timeout_secs: u64,
    /// `saltgate_cluster_max_unauthenticated`.
    pub cluster_max_unauthenticated: usize,
}
