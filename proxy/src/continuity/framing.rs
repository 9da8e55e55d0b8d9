//! Which request tracker a relayed session uses: ZeroMQ's ([`super::track`], a REQ socket's
//! frames and handshake), plain `tcp`'s ([`super::tcp_track`], `{head: {mid}, body}` messages,
//! no handshake) or plain `ws`'s ([`super::ws_track`], an HTTP upgrade, then binary messages). The relay ([`super::serve`]) only asks this what the bytes did, what to
//! re-send, and which handshake a new master needs.

use bytes::Bytes;
use saltgate_config::transport::SaltTransport;

use super::handshake::Handshake;
use super::tcp_track::TcpTrack;
use super::track::{Down, ReplyEvents, Skip, Up};
use super::ws_track::WsTrack;

/// A request session's tracker, by the masters' transport.
pub(super) enum Track {
    Zmq { up: Up, down: Down },
    Tcp(TcpTrack),
    Ws(WsTrack),
}

impl Track {
    /// `cap`: bytes kept for re-sending (0: none). Plain `tcp` and plain `ws` get their own
    /// trackers; every other transport ZeroMQ's, which gives up at once on bytes that are not
    /// ZMTP (TLS: where check-config refuses `migrate` anyway), so such a session closes with its
    /// master.
    pub fn new(transport: SaltTransport, tls: bool, cap: usize) -> Self {
        match (transport, tls) {
            (SaltTransport::Tcp, false) => Track::Tcp(TcpTrack::new(cap)),
            (SaltTransport::Ws, false) => Track::Ws(WsTrack::new(cap)),
            _ => Track::Zmq {
                up: Up::new(cap),
                down: Down::new(),
            },
        }
    }

    /// Minion bytes, before they are written to the master.
    pub fn observe_up(&mut self, bytes: &[u8]) {
        match self {
            Track::Zmq { up, .. } => up.observe(bytes),
            Track::Tcp(t) => t.observe_up(bytes),
            Track::Ws(t) => t.observe_up(bytes),
        }
    }

    /// Master bytes written to the minion.
    pub fn observe_down(&mut self, bytes: &[u8]) -> ReplyEvents {
        match self {
            Track::Zmq { up, down } => {
                let ev = down.observe(bytes);
                if ev.started {
                    up.reply_started();
                }
                if ev.done {
                    up.reply_done();
                }
                ev
            }
            Track::Tcp(t) => t.observe_down(bytes),
            Track::Ws(t) => t.observe_down(bytes),
        }
    }

    /// What to re-send to the next master (`Ok(None)`: nothing), or why the session cannot move.
    pub fn plan(&mut self) -> Result<Option<(Bytes, bool)>, Skip> {
        match self {
            Track::Zmq { up, down } => {
                let replay = down.movable().and_then(|()| up.take_replay())?;
                up.ready_frame().ok_or(Skip::Handshake)?;
                Ok(replay)
            }
            Track::Tcp(t) => t.take_replay(),
            Track::Ws(t) => t.take_replay(),
        }
    }

    /// The handshake saltgate does with the next master in the minion's name (ZeroMQ: the
    /// minion's READY; `ws`: its upgrade request); `None`: the transport has none (plain `tcp`).
    pub fn handshake(&self) -> Option<Handshake<'_>> {
        match self {
            Track::Zmq { up, .. } => up.ready_frame().map(Handshake::Zmtp),
            Track::Tcp(_) => None,
            Track::Ws(t) => t.upgrade().map(|(request, key)| Handshake::Ws {
                request,
                key,
                pass: t.pass_answer(),
            }),
        }
    }

    /// The session's protocol ended on its own (a `ws` close frame passed): its master's end is
    /// not a death, there is nothing to move.
    pub fn finished(&self) -> bool {
        matches!(self, Track::Ws(t) if t.finished())
    }

    /// The session now runs on another master, whose handshake (if any) saltgate did.
    pub fn resumed(&mut self) {
        match self {
            Track::Zmq { down, .. } => *down = Down::resumed(),
            Track::Tcp(t) => t.resumed(),
            Track::Ws(t) => t.resumed(),
        }
    }

    /// The master → minion tracker, for the `_auth` drain (ZeroMQ: the only transport with
    /// `auth_limit`).
    pub fn take_down(&mut self) -> Down {
        match self {
            Track::Zmq { down, .. } => std::mem::take(down),
            Track::Tcp(_) | Track::Ws(_) => Down::new(),
        }
    }
}
