//! The four socket roles Salt uses, each on top of the per-connection driver in [`super::peer`]:
//! [`publisher`] (PUB), [`subscriber`] (SUB), [`req`] (REQ) and [`router`] (ROUTER).
//!
//! Each role owns its queues, its accept or dial loop and its tasks; dropping the role value
//! stops them all.

pub mod publisher;
pub mod req;
pub mod router;
pub mod subscriber;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use super::frame::FrameError;
use super::{CloseReason, ZmtpError};

/// Seconds between two warnings of a socket's protocol refusals.
const WARN_EVERY_SECS: u64 = 10;

/// Connections a bound socket ([`router::Router`], [`publisher::Publisher`]) closed because the
/// peer broke the protocol, by class: what an operator counts as refusals. A peer that closes,
/// times out or resets is not counted.
#[derive(Debug, Default)]
pub struct ProtocolRefusals {
    /// A frame or message over the size limit, refused before its body was allocated.
    oversized: AtomicU64,
    /// Anything else the peer got wrong: not a ZMTP greeting, another version or mechanism, a
    /// malformed frame or command, an incompatible socket type.
    malformed: AtomicU64,
    /// A frame not completed within its deadline (`frame_timeout`: one byte now and then).
    slow: AtomicU64,
    /// A write that made no progress within its deadline: the peer does not read.
    stalled: AtomicU64,
    /// A handshake not completed within `handshake_timeout` (a silent connection).
    handshake_timeout: AtomicU64,
    /// A SUBSCRIBE past the subscriber's topic limits.
    topics: AtomicU64,
    /// When a refusal was last logged at warn (Unix seconds).
    last_warn: AtomicU64,
}

impl ProtocolRefusals {
    /// Frames or messages over the size limit so far.
    pub fn oversized(&self) -> u64 {
        self.oversized.load(Ordering::Relaxed)
    }

    /// Other protocol violations so far.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// Frames cut for not completing within `frame_timeout`.
    pub fn slow(&self) -> u64 {
        self.slow.load(Ordering::Relaxed)
    }

    /// Peers cut because a write to them made no progress within `write_timeout`.
    pub fn stalled(&self) -> u64 {
        self.stalled.load(Ordering::Relaxed)
    }

    /// Connections cut for not completing the handshake within `handshake_timeout`.
    pub fn handshake_timeouts(&self) -> u64 {
        self.handshake_timeout.load(Ordering::Relaxed)
    }

    /// Subscribers cut for a SUBSCRIBE past their topic limits.
    pub fn topics(&self) -> u64 {
        self.topics.load(Ordering::Relaxed)
    }

    /// Every cut by its `reason` label (for a metric): `oversized`, `malformed`,
    /// `frame_timeout`, `write_timeout`, `handshake_timeout`, `topics`.
    pub fn by_reason(&self) -> [(&'static str, u64); 6] {
        [
            ("oversized", self.oversized()),
            ("malformed", self.malformed()),
            ("frame_timeout", self.slow()),
            ("write_timeout", self.stalled()),
            ("handshake_timeout", self.handshake_timeouts()),
            ("topics", self.topics()),
        ]
    }

    /// Counts `e` if it is the peer's protocol violation or a limit it hit; returns whether it
    /// was.
    pub(crate) fn count(&self, e: &ZmtpError) -> bool {
        let counter = match e {
            ZmtpError::FrameTimeout(_) => &self.slow,
            ZmtpError::WriteTimeout(_) => &self.stalled,
            ZmtpError::Timeout("handshake") => &self.handshake_timeout,
            ZmtpError::Topics(_) => &self.topics,
            ZmtpError::Frame(FrameError::TooLarge { .. } | FrameError::MessageTooLarge { .. }) => {
                &self.oversized
            }
            ZmtpError::BadSignature
            | ZmtpError::UnsupportedVersion { .. }
            | ZmtpError::UnsupportedMechanism(_)
            | ZmtpError::Frame(_)
            | ZmtpError::Command(_)
            | ZmtpError::ExpectedReady(_)
            | ZmtpError::IncompatibleSocketType { .. } => &self.malformed,
            ZmtpError::Io(_) | ZmtpError::Eof | ZmtpError::PeerError(_) | ZmtpError::Timeout(_) => {
                return false
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether a refusal may be logged at warn now: one every [`WARN_EVERY_SECS`] per socket,
    /// so a scanner cannot flood the log (the others go to debug; all are counted).
    pub(crate) fn may_warn(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_warn.load(Ordering::Relaxed);
        (last == 0 || now >= last + WARN_EVERY_SECS)
            && self
                .last_warn
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// A failed handshake (`what`: "router handshake", "pub handshake"): counted if the peer
    /// broke the protocol, then logged (a refusal at warn, throttled by [`Self::may_warn`]).
    pub(crate) fn note_handshake(&self, peer: SocketAddr, what: &str, e: &ZmtpError) {
        if self.count(e) {
            self.warn_throttled(peer, what, e);
        } else {
            tracing::debug!(%peer, error = %e, "{what} failed");
        }
    }

    /// A connection's end (`what`: "router peer", "pub subscriber"): counted and logged as
    /// [`Self::note_handshake`] does.
    pub(crate) fn note_close(&self, peer: SocketAddr, what: &str, reason: &CloseReason) {
        match reason {
            CloseReason::Error(e) if self.count(e) => self.warn_throttled(peer, what, e),
            _ => tracing::debug!(%peer, ?reason, "{what} closed"),
        }
    }

    /// Counts a cut made by a server of another transport (Salt's `tcp`) under `class`, and
    /// logs it as the ZMTP sockets' cuts are (a warning per 10 s, the rest at debug).
    pub(crate) fn note_cut(
        &self,
        peer: SocketAddr,
        what: &str,
        class: Cut,
        detail: &dyn std::fmt::Display,
    ) {
        let counter = match class {
            Cut::Oversized => &self.oversized,
            Cut::Malformed => &self.malformed,
            Cut::Slow => &self.slow,
            Cut::Stalled => &self.stalled,
            Cut::Handshake => &self.handshake_timeout,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.may_warn() {
            tracing::warn!(%peer, error = %detail, oversized = self.oversized(),
                malformed = self.malformed(),
                "{what} cut: it broke the protocol or a limit (one warning per 10 s, all counted)");
        } else {
            tracing::debug!(%peer, error = %detail, "{what} cut: it broke the protocol or a limit");
        }
    }

    fn warn_throttled(&self, peer: SocketAddr, what: &str, e: &ZmtpError) {
        if self.may_warn() {
            tracing::warn!(%peer, error = %e, oversized = self.oversized(),
                malformed = self.malformed(),
                "{what} cut: it broke the protocol or a limit (one warning per 10 s, all counted)");
        } else {
            tracing::debug!(%peer, error = %e, "{what} cut: it broke the protocol or a limit");
        }
    }
}

/// The classes of [`ProtocolRefusals`], for servers that are not ZMTP's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// A message over the size limit.
    Oversized,
    /// Not the transport's framing (or a failed TLS handshake).
    Malformed,
    /// A message not completed within its deadline.
    Slow,
    /// A write that made no progress within its deadline.
    Stalled,
    /// A handshake (TLS) or first message not completed within its deadline.
    Handshake,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_peers_protocol_violations_are_counted_by_class() {
        let r = ProtocolRefusals::default();
        let too_large = ZmtpError::Frame(FrameError::TooLarge {
            size: 1 << 40,
            max: 1 << 20,
        });
        assert!(r.count(&too_large));
        assert!(r.count(&ZmtpError::BadSignature));
        assert!(r.count(&ZmtpError::ExpectedReady("PING".into())));
        assert!(!r.count(&ZmtpError::Eof));
        assert!(!r.count(&ZmtpError::Timeout("greeting")));
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        r.note_close(peer, "test", &CloseReason::PeerEof);
        r.note_close(peer, "test", &CloseReason::HeartbeatTimeout);
        r.note_close(
            peer,
            "test",
            &CloseReason::Error(ZmtpError::Frame(FrameError::MessageTooLarge {
                size: 10,
                max: 5,
            })),
        );
        assert_eq!((r.oversized(), r.malformed()), (2, 2));
        // The first refusal was logged at warn; the next ones within 10 s are not.
        assert!(!r.may_warn());
    }
}
