//! Why a health check failed: the stage the probe reached, which tells a busy master from a dead
//! one (see [`crate::select::check`]'s busy rule), and the detail for the logs and the admin API.

use std::fmt;

/// How far a failed check got, as the busy rule and the descriptor reserve read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Refused, reset, a protocol error, a cluster member not ready, a TLS failure: counted.
    Failed,
    /// This host ran out of descriptors, buffers or memory: says nothing of the master, never
    /// counted (see [`crate::select::local_resource`]).
    LocalResource,
    /// The request port's ping got through the handshake and no answer came in time: the
    /// master's process runs, its workers are busy or stuck.
    NoAnswer,
    /// The publish port's connect or greeting came, after `handshake_timeout` and within
    /// `timeout`: its publish server runs, slowly (a saturated host).
    LateGreeting,
    /// The publish port's connect or greeting did not come within `timeout`: stopped, hung, or
    /// its publish server saturated.
    NoGreeting,
}

/// A failed check: its [`Stage`] and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFailure {
    pub stage: Stage,
    pub detail: String,
}

/// Ends the detail of a [`Stage::NoAnswer`] failure.
pub const BUSY_OR_STUCK: &str = "(master busy, or its workers stuck)";

/// Ends the detail of a [`Stage::NoGreeting`] failure.
pub const NO_GREETING: &str = "(stopped, hung, or its publish server saturated)";

/// Ends the detail of a [`Stage::LateGreeting`] failure.
pub const LATE_GREETING: &str = "(its publish server runs, slowly)";

impl CheckFailure {
    /// A failure the busy rule never excuses.
    pub fn failed(detail: impl Into<String>) -> Self {
        CheckFailure {
            stage: Stage::Failed,
            detail: detail.into(),
        }
    }

    /// A request ping handshaken and not answered in time (`what` says how far it got).
    pub fn no_answer(what: impl fmt::Display) -> Self {
        CheckFailure {
            stage: Stage::NoAnswer,
            detail: format!("{what} {BUSY_OR_STUCK}"),
        }
    }

    /// A publish port that did not connect or greet within `timeout`.
    pub fn no_greeting(what: impl fmt::Display) -> Self {
        CheckFailure {
            stage: Stage::NoGreeting,
            detail: format!("{what} {NO_GREETING}"),
        }
    }

    /// A publish port that greeted after `handshake_timeout`, `took` after the check began.
    pub fn late_greeting(
        what: impl fmt::Display,
        took: std::time::Duration,
        handshake: std::time::Duration,
    ) -> Self {
        CheckFailure {
            stage: Stage::LateGreeting,
            detail: format!(
                "{what} came after {:.2} s, over handshake_timeout {handshake:?} {LATE_GREETING}",
                took.as_secs_f64()
            ),
        }
    }

    /// A publish port that greeted `took` after the check began: passed within `handshake`,
    /// else [`Stage::LateGreeting`] (one rule for every transport's publish check).
    pub fn on_time(
        what: impl fmt::Display,
        took: std::time::Duration,
        handshake: std::time::Duration,
    ) -> Result<(), Self> {
        if took > handshake {
            Err(CheckFailure::late_greeting(what, took, handshake))
        } else {
            Ok(())
        }
    }

    /// A failure for want of a local resource (`detail` as [`crate::select::local_resource`]
    /// words it).
    pub fn local_resource(detail: String) -> Self {
        CheckFailure {
            stage: Stage::LocalResource,
            detail,
        }
    }
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl From<String> for CheckFailure {
    fn from(detail: String) -> Self {
        CheckFailure::failed(detail)
    }
}

impl From<&str> for CheckFailure {
    fn from(detail: &str) -> Self {
        CheckFailure::failed(detail)
    }
}
