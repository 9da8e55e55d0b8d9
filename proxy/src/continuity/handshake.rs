//! saltgate's side of the ZMTP handshake with the master a request session moves to: it speaks
//! for the minion, whose own handshake was with the first master.
//!
//! Greeting (ZMTP 3.1, NULL, as a client), then the minion's READY exactly as the minion sent it
//! (same `Socket-Type: REQ`, same `Identity`, so the master's ROUTER sees the same peer), then
//! the master's greeting and READY are read and kept from the minion, who already has a pair.

use bytes::{Bytes, BytesMut};
use saltgate_wire::transport::zeromq::greeting::{self, Greeting};
use saltgate_wire::transport::zeromq::{Command, Frame, FrameDecoder, SocketType};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::track::MAX_READY;

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
