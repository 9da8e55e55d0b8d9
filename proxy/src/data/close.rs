//! Why a session ended. Every closed session has exactly one reason; it appears in the access log
//! (and, with the metrics, as a label).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CloseReason {
    /// The client closed its side first (FIN).
    ClientEof = 1,
    /// The master closed its side first (FIN).
    MasterEof,
    /// The client's connection failed (reset, broken pipe).
    ClientReset,
    /// The master's connection failed (reset, broken pipe).
    MasterReset,
    /// No byte moved for the listener's idle timeout.
    IdleTimeout,
    /// Every connect attempt to a master failed or timed out.
    ConnectFailed,
    /// No master was UP when the client connected (or all were at maxconn and the listener has
    /// no queue: `maxqueue: 0`).
    NoMaster,
    /// The master was marked DOWN and the listener closes its sessions.
    MasterDown,
    /// saltgate was stopping and the shutdown grace ran out.
    Shutdown,
    /// The master was drained (admin API) or removed by a reload, and `drain_timeout` ran out.
    Drained,
    /// The master was disabled through the admin API.
    Disabled,
    /// Moved to a less loaded master by the rebalancer (the minion reconnects and is placed anew).
    Rebalanced,
    /// Waited in the listener's queue (every master at its maxconn) for `timeout_queue`.
    QueueTimeout,
    /// Every master was at its maxconn and the listener's queue held `maxqueue` clients already.
    QueueFull,
}

impl CloseReason {
    pub const ALL: [CloseReason; 14] = [
        CloseReason::ClientEof,
        CloseReason::MasterEof,
        CloseReason::ClientReset,
        CloseReason::MasterReset,
        CloseReason::IdleTimeout,
        CloseReason::ConnectFailed,
        CloseReason::NoMaster,
        CloseReason::MasterDown,
        CloseReason::Shutdown,
        CloseReason::Drained,
        CloseReason::Disabled,
        CloseReason::Rebalanced,
        CloseReason::QueueTimeout,
        CloseReason::QueueFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::ClientEof => "client-eof",
            CloseReason::MasterEof => "master-eof",
            CloseReason::ClientReset => "client-reset",
            CloseReason::MasterReset => "master-reset",
            CloseReason::IdleTimeout => "idle-timeout",
            CloseReason::ConnectFailed => "connect-failed",
            CloseReason::NoMaster => "no-master",
            CloseReason::MasterDown => "master-down",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Drained => "drained",
            CloseReason::Disabled => "disabled",
            CloseReason::Rebalanced => "rebalanced",
            CloseReason::QueueTimeout => "queue-timeout",
            CloseReason::QueueFull => "queue-full",
        }
    }

    /// Position in [`CloseReason::ALL`] (for tables indexed by reason).
    pub fn index(self) -> usize {
        self as usize - 1
    }

    pub fn from_u8(n: u8) -> Option<CloseReason> {
        Self::ALL.into_iter().find(|r| *r as u8 == n)
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_u8() {
        for n in 0..=255u8 {
            if let Some(r) = CloseReason::from_u8(n) {
                assert_eq!(r as u8, n);
            }
        }
        assert_eq!(
            CloseReason::from_u8(CloseReason::Shutdown as u8),
            Some(CloseReason::Shutdown)
        );
        assert_eq!(CloseReason::from_u8(0), None);
        for (i, r) in CloseReason::ALL.into_iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
