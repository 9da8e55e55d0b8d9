//! The control frames of the peer link ([`crate::peerlink`]) and the fallback for an old peer.
//!
//! * `hello` — `{peer_id, hello: "saltgate-peerlink", v: 1}`, the first frame a sender writes on
//!   a new connection; a receiver that acknowledges answers with its own `hello` on the same
//!   connection. An old member (one message per connection) refuses it (it has no `body`) and
//!   closes: no answer within [`HELLO_TIMEOUT`] means "old peer".
//! * `ack` — `{ack: n}`, receiver to sender: `n` frames of this connection (after the hello)
//!   have been handled, cumulative, so acks may be coalesced.
//! * The fallback ([`send_one`]): one frame per connection, RSA-signed ([`signed_copy`]; an old
//!   member knows no MAC), then wait for the peer to close, which an old member does once it
//!   has handled the frame.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use saltgate_wire::envelope::{self, as_bytes, as_str, get, map, raw_str, text, Value};
use saltgate_wire::rsa::PrivateKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use crate::peerwire::{write_frame, FRAME_TIMEOUT, PEER_SIG};

/// How long a sender waits for the answer to its hello before it treats the peer as old.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a peer found old is sent one frame per connection before it is probed again.
pub const REPROBE_EVERY: Duration = Duration::from_secs(60);
/// Times a frame is written at most (the first send and two re-sends) before it is dropped.
pub const MAX_SENDS: u8 = 3;
/// A receiver acknowledges at least every this many frames (else when no frame is waiting).
pub const ACK_EVERY: u64 = 256;
const HELLO: &str = "saltgate-peerlink";
const VERSION: u64 = 1;
/// Largest control frame (a hello or an ack is a few dozen bytes).
const MAX_CONTROL: usize = 4096;

/// The hello a sender writes first and a receiver answers with.
pub fn hello_frame(own_id: &str) -> Vec<u8> {
    envelope::encode(&map(vec![
        ("peer_id", text(own_id)),
        ("hello", text(HELLO)),
        ("v", Value::from(VERSION)),
    ]))
}

/// True when a connection's first frame is a hello (a peer frame never has a `hello` key).
pub fn is_hello(frame: &[u8]) -> bool {
    envelope::decode(frame)
        .ok()
        .is_some_and(|v| get(&v, "hello").and_then(as_str) == Some(HELLO))
}

/// A cumulative acknowledgement: `n` frames of this connection are handled.
pub fn ack_frame(n: u64) -> Vec<u8> {
    envelope::encode(&map(vec![("ack", Value::from(n))]))
}

/// A frame a receiver sends back on a link.
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    Hello,
    Ack(u64),
}

fn parse_control(frame: &[u8]) -> Result<Control, String> {
    let v = envelope::decode(frame).map_err(|e| format!("control frame not msgpack: {e}"))?;
    if get(&v, "hello").and_then(as_str) == Some(HELLO) {
        return Ok(Control::Hello);
    }
    get(&v, "ack")
        .and_then(Value::as_u64)
        .map(Control::Ack)
        .ok_or_else(|| "control frame is neither a hello nor an ack".into())
}

/// What a non-blocking peek at a socket shows.
#[derive(Debug, PartialEq, Eq)]
pub enum Peeked {
    /// The peer closed (EOF) or the socket failed.
    Closed,
    /// Bytes are waiting.
    Data,
    Nothing,
}

/// Peeks at the socket itself without waiting (tokio's `try_read` trusts the reactor's cached
/// readiness, which may not have seen the FIN yet).
pub fn peek(sock: socket2::SockRef<'_>) -> Peeked {
    let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    match sock.peek(&mut b) {
        Ok(0) => Peeked::Closed,
        Ok(_) => Peeked::Data,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Peeked::Nothing,
        Err(_) => Peeked::Closed,
    }
}

/// Reads the receiver's control frames on the sender's side of a link.
pub struct ControlReader {
    rd: OwnedReadHalf,
    buf: BytesMut,
}

impl ControlReader {
    pub fn new(rd: OwnedReadHalf) -> Self {
        ControlReader {
            rd,
            buf: BytesMut::with_capacity(256),
        }
    }

    pub fn peek(&self) -> Peeked {
        peek(socket2::SockRef::from(self.rd.as_ref()))
    }

    /// The next control frame. Cancel-safe: a partial frame stays in the buffer.
    pub async fn next(&mut self) -> Result<Control, String> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if len > MAX_CONTROL {
                    return Err(format!("control frame of {len} bytes is over the limit"));
                }
                if self.buf.len() >= 4 + len {
                    self.buf.advance(4);
                    let frame = self.buf.split_to(len);
                    return parse_control(&frame);
                }
            }
            match self.rd.read_buf(&mut self.buf).await {
                Ok(0) => return Err("peer closed the connection".into()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// The RSA-signed form `{peer_id, body, sig}` of a sealed frame: a MAC'd frame is signed
/// again with `key` (an old member knows no MAC); a signed one is returned as it is.
pub fn signed_copy(key: &PrivateKey, frame: &[u8]) -> Result<Vec<u8>, String> {
    let v = envelope::decode(frame).map_err(|e| format!("not msgpack: {e}"))?;
    if get(&v, "sig").is_some() {
        return Ok(frame.to_vec());
    }
    let peer_id = get(&v, "peer_id").and_then(as_str).ok_or("no peer_id")?;
    let body = get(&v, "body").and_then(as_bytes).ok_or("no body")?;
    let sig = key.sign(PEER_SIG, body).map_err(|e| e.to_string())?;
    Ok(envelope::encode(&map(vec![
        ("peer_id", text(peer_id)),
        ("body", raw_str(body.to_vec())),
        ("sig", raw_str(sig)),
    ])))
}

/// Why [`send_one`] failed, and whether the frame may have reached the peer.
#[derive(Debug)]
pub struct SendOneError {
    pub written: bool,
    pub error: String,
}

/// The old sender's way, for an old peer: connect, write one frame, close our side, then wait
/// (at most [`FRAME_TIMEOUT`]) for the peer to close, which an old member does after handling
/// the frame. Whatever the peer writes back is ignored.
pub async fn send_one(addr: SocketAddr, frame: &[u8]) -> Result<(), SendOneError> {
    let fail = |written: bool| {
        move |e: std::io::Error| SendOneError {
            written,
            error: e.to_string(),
        }
    };
    let timed_out = |written: bool| SendOneError {
        written,
        error: "timed out".into(),
    };
    let mut s = tokio::time::timeout(FRAME_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out(false))?
        .map_err(fail(false))?;
    let _ = s.set_nodelay(true);
    let go = async {
        write_frame(&mut s, frame).await?;
        s.shutdown().await?;
        let mut sink = [0u8; 512];
        while s.read(&mut sink).await? > 0 {}
        Ok(())
    };
    tokio::time::timeout(FRAME_TIMEOUT, go)
        .await
        .map_err(|_| timed_out(true))?
        .map_err(fail(true))
}
