//! saltgate's side of the handshake with the master a request session moves to: it speaks for
//! the minion, whose own handshake was with the first master.
//!
//! ZeroMQ ([`as_minion`]): greeting (ZMTP 3.1, NULL, as a client), then the minion's READY
//! exactly as the minion sent it (same `Socket-Type: REQ`, same `Identity`, so the master's
//! ROUTER sees the same peer), then the master's greeting and READY are read and kept from the
//! minion, who already has a pair.
//!
//! Plain `ws` ([`ws_upgrade`]): the minion's upgrade request, byte for byte (same key), then the
//! master's `101` is read and checked (`Sec-WebSocket-Accept` for that key), and kept from the
//! minion when it already has one.

use bytes::{Bytes, BytesMut};
use saltgate_wire::transport::zeromq::greeting::{self, Greeting};
use saltgate_wire::transport::zeromq::{Command, Frame, FrameDecoder, SocketType};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::track::MAX_READY;
use super::ws_walk::MAX_HTTP_HEAD;

/// The handshake a request session needs with the master it moves to.
pub enum Handshake<'a> {
    /// ZeroMQ: the minion's READY.
    Zmtp(&'a [u8]),
    /// Plain `ws`: the minion's upgrade request and its key; `pass`: the minion has not had a
    /// `101` yet, the new master's goes to it.
    Ws {
        request: &'a [u8],
        key: &'a str,
        pass: bool,
    },
}

/// Does `h` on a fresh connection to a master (plain `tcp` has none: `None`). Returns the bytes
/// to pass on to the minion, or what went wrong. No timeout of its own.
pub async fn run(master: &mut TcpStream, h: Option<&Handshake<'_>>) -> Result<Bytes, String> {
    match h {
        None => Ok(Bytes::new()),
        Some(Handshake::Zmtp(ready)) => as_minion(master, ready).await,
        Some(Handshake::Ws { request, key, pass }) => ws_upgrade(master, request, key, *pass).await,
    }
}

/// Sends the minion's upgrade `request` and reads the master's `101`. Returns the bytes read past
/// it (frames, to be passed on to the minion), the `101` itself first when `pass`.
pub async fn ws_upgrade(
    master: &mut TcpStream,
    request: &[u8],
    key: &str,
    pass: bool,
) -> Result<Bytes, String> {
    use tokio::io::AsyncWriteExt;
    master
        .write_all(request)
        .await
        .map_err(|e| format!("sending the upgrade request: {e}"))?;
    let mut buf = BytesMut::with_capacity(512);
    loop {
        match saltgate_wire::salt_ws::read_handshake(&buf, key) {
            Ok(Some(end)) => {
                let head = buf.split_to(end);
                if !super::ws_walk::answer_ok(&head) {
                    return Err("the master's 101 negotiated an extension".into());
                }
                if pass {
                    let mut all = BytesMut::from(&head[..]);
                    all.extend_from_slice(&buf);
                    return Ok(all.freeze());
                }
                return Ok(buf.freeze());
            }
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        if buf.len() > MAX_HTTP_HEAD {
            return Err("the upgrade answer is too long".into());
        }
        let n = master
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("reading the upgrade answer: {e}"))?;
        if n == 0 {
            return Err("master closed the connection during the upgrade".into());
        }
    }
}

/// Does the handshake on a fresh connection to a master. Returns the bytes read past the
/// master's READY (to be passed on to the minion), or what went wrong. No timeout of its own.
pub async fn as_minion(master: &mut TcpStream, ready: &[u8]) -> Result<Bytes, String> {
    greeting::exchange_then(master, &Greeting::ours(false), ready)
        .await
        .map_err(|e| format!("greeting and READY: {e}"))?;
    let dec = FrameDecoder::new(MAX_READY);
    let mut buf = BytesMut::with_capacity(512);
    loop {
        match dec.decode(&mut buf) {
            Ok(Some(Frame::Command(body))) => {
                return match Command::parse(&body) {
                    Ok(Command::Ready(p)) => {
                        let t = p.get("Socket-Type").and_then(|t| SocketType::parse(t));
                        match t {
                            Some(t) if SocketType::Req.compatible_with(t) => Ok(buf.freeze()),
                            _ => Err(format!(
                                "master's socket type {:?} does not take a REQ peer",
                                p.get("Socket-Type")
                            )),
                        }
                    }
                    Ok(Command::Error(r)) => Err(format!(
                        "master refused the handshake: {}",
                        String::from_utf8_lossy(&r)
                    )),
                    Ok(other) => Err(format!(
                        "expected READY, got {}",
                        String::from_utf8_lossy(other.name())
                    )),
                    Err(e) => Err(format!("READY: {e}")),
                };
            }
            Ok(Some(Frame::Message { .. })) => return Err("a message before READY".into()),
            Ok(None) => {}
            Err(e) => return Err(format!("READY: {e}")),
        }
        if buf.len() > MAX_READY {
            return Err("READY too large".into());
        }
        let n = master
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("reading READY: {e}"))?;
        if n == 0 {
            return Err("master closed the connection during the handshake".into());
        }
    }
}
