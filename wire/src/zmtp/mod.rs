//! ZMTP 3.1 (RFC 37) with the NULL mechanism, on tokio.
//!
//! Layers, bottom up:
//! * [`frame`] — the frame codec (short/long frames, MORE, command frames) and message assembly;
//! * [`command`] — command bodies (READY, PING/PONG, SUBSCRIBE/CANCEL, ERROR);
//! * [`greeting`] — the 64-byte greeting, exchanged in libzmq's staged order;
//! * [`conn`] — one handshaken connection (greeting + READY) with framed reads and writes;
//! * [`peer`] — the per-connection driver every role uses: answers every PING with a PONG,
//!   optionally sends PINGs and drops silent peers, and applies subscriptions;
//! * [`topics`] — a subscriber's topics (a bounded multiset of prefixes);
//! * [`socket`] — the four roles Salt uses: PUB, SUB, REQ, ROUTER.
//!
//! Why not the `zeromq` crate: Salt 3008 masters send ZMTP 3.1 PINGs every 10 s and drop peers
//! that never answer; `zeromq` 0.7 advertises ZMTP 3.0, rejects PING and has no heartbeat or HWM
//! options. It stays a dev-dependency, as an independent peer in tests.

pub mod command;
pub mod conn;
pub mod frame;
pub mod greeting;
pub mod peer;
pub mod socket;
pub mod topics;

use std::fmt;
use std::time::Duration;

use thiserror::Error;

pub use command::{Command, CommandError, Properties};
pub use conn::{Connection, HandshakeConfig, PeerInfo};
pub use frame::{
    Frame, FrameDecoder, FrameError, DEFAULT_MAX_FRAME_SIZE, PUB_DEFAULT_MAX_FRAME_SIZE,
    ROUTER_DEFAULT_MAX_FRAME_SIZE,
};
pub use greeting::{Greeting, Mechanism};
pub use peer::{CloseReason, Heartbeat};
pub use socket::publisher::{PubOptions, PublishReport, Publisher};
pub use socket::req::{ReqError, ReqOptions, ReqSocket};
pub use socket::router::{Router, RouterError, RouterMessage, RouterOptions, RouterSender};
pub use socket::subscriber::{ReconnectPolicy, SubOptions, Subscriber};
pub use socket::ProtocolRefusals;
pub use topics::{TopicLimits, TopicRefusal, TopicSet};

/// Errors on one ZMTP connection. Each says whose fault it is via [`ZmtpError::side`].
#[derive(Debug, Error)]
pub enum ZmtpError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("peer closed the connection")]
    Eof,
    #[error("not a ZMTP peer (bad greeting signature)")]
    BadSignature,
    #[error("peer speaks ZMTP {major}.{minor}; 3.0 or later is required")]
    UnsupportedVersion { major: u8, minor: u8 },
    #[error("peer uses the {0} mechanism; only NULL is supported")]
    UnsupportedMechanism(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("expected READY during the handshake, got {0}")]
    ExpectedReady(String),
    #[error("peer sent ERROR: {0}")]
    PeerError(String),
    #[error("peer socket type {peer} cannot talk to our {ours}")]
    IncompatibleSocketType { ours: SocketType, peer: String },
    #[error("timed out during {0}")]
    Timeout(&'static str),
    /// A frame's first byte arrived, its last did not within the deadline (a slowloris).
    #[error("a frame was not completed within {0:?} of its first byte (raise frame_timeout)")]
    FrameTimeout(Duration),
    /// A write made no progress for this long: the peer does not read.
    #[error("the peer read nothing for {0:?} (a write could not complete)")]
    WriteTimeout(Duration),
    /// A SUBSCRIBE past the subscriber's limits.
    #[error(transparent)]
    Topics(#[from] TopicRefusal),
}

/// Who caused an error: useful as a log level or a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The remote peer broke the protocol or went away.
    Peer,
    /// The network or the OS.
    Network,
}

impl ZmtpError {
    pub fn side(&self) -> Side {
        match self {
            ZmtpError::Io(_) | ZmtpError::Timeout(_) => Side::Network,
            _ => Side::Peer,
        }
    }
}

/// The socket types Salt uses, plus the ones they must accept as peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketType {
    Pub,
    Sub,
    XPub,
    XSub,
    Req,
    Rep,
    Dealer,
    Router,
}

impl SocketType {
    pub fn as_str(&self) -> &'static str {
        match self {
            SocketType::Pub => "PUB",
            SocketType::Sub => "SUB",
            SocketType::XPub => "XPUB",
            SocketType::XSub => "XSUB",
            SocketType::Req => "REQ",
            SocketType::Rep => "REP",
            SocketType::Dealer => "DEALER",
            SocketType::Router => "ROUTER",
        }
    }

    pub fn parse(s: &[u8]) -> Option<Self> {
        Some(match s {
            b"PUB" => SocketType::Pub,
            b"SUB" => SocketType::Sub,
            b"XPUB" => SocketType::XPub,
            b"XSUB" => SocketType::XSub,
            b"REQ" => SocketType::Req,
            b"REP" => SocketType::Rep,
            b"DEALER" => SocketType::Dealer,
            b"ROUTER" => SocketType::Router,
            _ => return None,
        })
    }

    /// The ZMTP compatibility table (RFC 28/37), as libzmq enforces it.
    pub fn compatible_with(&self, peer: SocketType) -> bool {
        use SocketType::*;
        matches!(
            (self, peer),
            (Pub | XPub, Sub | XSub)
                | (Sub | XSub, Pub | XPub)
                | (Req, Rep | Router)
                | (Rep, Req | Dealer)
                | (Dealer, Rep | Dealer | Router)
                | (Router, Req | Dealer | Router)
        )
    }
}

impl fmt::Display for SocketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_type_table_matches_salt_pairs() {
        assert!(SocketType::Pub.compatible_with(SocketType::Sub));
        assert!(SocketType::Req.compatible_with(SocketType::Router));
        assert!(SocketType::Router.compatible_with(SocketType::Req));
        assert!(!SocketType::Req.compatible_with(SocketType::Pub));
        assert!(!SocketType::Sub.compatible_with(SocketType::Sub));
        for t in [SocketType::Pub, SocketType::Router, SocketType::XSub] {
            assert_eq!(SocketType::parse(t.as_str().as_bytes()), Some(t));
        }
    }
}
