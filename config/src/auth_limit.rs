//! `listeners.request.auth_limit`: saltgate paces the minions' `_auth` requests per master, so an
//! authentication storm does not reach a master faster than its RSA rate (docs/configuration.md,
//! docs/performance.md). Off unless the key is set.
//!
//! ```yaml
//! listeners:
//!   request:
//!     auth_limit:
//!       max_in_flight: 5     # per master: `_auth` sent and not yet answered; or `auto`
//!       max_wait: 5s         # a held `_auth` older than this is dropped (its minion's auth_timeout)
//!       max_queue: 10000     # held `_auth` per master; over it, dropped at once
//!       auth_timeout: 5s     # the minions' auth_timeout, which `auto` keeps answers under
//! ```
//!
//! The model only; the YAML is read in `yaml_auth_limit`.

use std::time::Duration;

/// How many `_auth` a master may have in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxInFlight {
    /// At most this many per master.
    Fixed(u32),
    /// Adapted to the master's measured `_auth` latency (answered within half of `auth_timeout`).
    Auto,
}

/// `listeners.request.auth_limit` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthLimit {
    pub max_in_flight: MaxInFlight,
    /// A held `_auth` waiting longer is dropped and its minion's connection closed.
    pub max_wait: Duration,
    /// Held `_auth` per master; one more is dropped at once (`queue_full`).
    pub max_queue: u32,
    /// The minions' `auth_timeout` (Salt's default 5 s): `auto` aims at answers within half of it.
    pub auth_timeout: Duration,
}

/// Salt 3008.5's minion `auth_timeout` (salt/config/__init__.py): one `_auth` try.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// `max_wait`: once a minion's `auth_timeout` has passed, its REQ socket has given up.
pub const MAX_WAIT: Duration = AUTH_TIMEOUT;
/// `max_queue`: a held `_auth` costs a connection and about 1 KiB.
pub const MAX_QUEUE: u32 = 10_000;
/// Largest fixed `max_in_flight`.
pub const MAX_IN_FLIGHT_MAX: u32 = 100_000;

impl Default for AuthLimit {
    fn default() -> Self {
        AuthLimit {
            max_in_flight: MaxInFlight::Auto,
            max_wait: MAX_WAIT,
            max_queue: MAX_QUEUE,
            auth_timeout: AUTH_TIMEOUT,
        }
    }
}

impl MaxInFlight {
    pub fn text(self) -> String {
        match self {
            MaxInFlight::Fixed(n) => n.to_string(),
            MaxInFlight::Auto => "auto".into(),
        }
    }
}
