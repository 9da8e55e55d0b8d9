//! One websocket over a plain or TLS stream, either side: the opening handshake
//! ([`WsConn::connect`] as a client, [`WsConn::accept`] as a server), then whole messages in
//! ([`WsConn::recv`], cancel-safe: a `select!` may drop it between reads without losing bytes)
//! and frames out ([`WsConn::send`]: masked from a client, unmasked from a server). Control
//! frames are handed to the caller, which answers a ping with a pong and a close with a close
//! ([`WsConn::answer`]). Every size is bounded by the `max` given (a message, its fragments
//! together) and [`super::MAX_HANDSHAKE`] (a handshake); bad bytes are a [`ConnError`] naming
//! what was wrong, never a panic.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::upgrade::{read_upgrade, refusal_response, server_frame, Upgrade};
use super::{
    client_frame, handshake_request, new_key, read_handshake, WsDecoder, WsError, WsMessage,
    MAX_HANDSHAKE, OP_CLOSE, OP_PONG,
};
use crate::salt_tcp::client::Stream;

/// Why a websocket ended or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Ws(#[from] WsError),
    /// The peer closed the stream (no close frame).
    #[error("the peer closed the connection")]
    Eof,
    #[error("no websocket handshake within {0:?}")]
    Timeout(Duration),
    /// No first byte of a message within the idle limit.
    #[error("no message within {0:?}")]
    Idle(Duration),
    /// A message begun and not completed within the limit.
    #[error("a message was not completed within {0:?} of its first byte")]
    Slow(Duration),
    /// The peer speaks ZeroMQ (its greeting came instead of HTTP).
    #[error("the peer answers with a ZMTP greeting: it speaks `transport: zeromq`; set `transport` the same on both sides")]
    Zmtp,
}

/// A websocket, client or server side.
pub struct WsConn {
    s: Stream,
    dec: WsDecoder,
    client: bool,
    /// A close frame was sent (nothing more may be).
    close_sent: bool,
}

impl WsConn {
    /// The client's opening handshake on `s` (for `host`, as `Host:` carries it, and `path`),
    /// within `timeout`.
    pub(crate) async fn connect(
        mut s: Stream,
        host: &str,
        path: &str,
        max: usize,
        timeout: Duration,
    ) -> Result<Self, ConnError> {
        let key = new_key();
        let hs = async {
            s.write_all(&handshake_request(host, path, &key)).await?;
            s.flush().await?;
            let mut buf = Vec::with_capacity(512);
            let mut chunk = [0u8; 4096];
            loop {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err(ConnError::Eof);
                }
                if buf.is_empty() && crate::salt_tcp::looks_like_zmtp(&chunk[..n]) {
                    return Err(ConnError::Zmtp);
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(len) = read_handshake(&buf, &key)? {
                    return Ok(buf.split_off(len));
                }
            }
        };
        let rest = tokio::time::timeout(timeout, hs)
            .await
            .map_err(|_| ConnError::Timeout(timeout))??;
        let mut dec = WsDecoder::new(max);
        dec.push(&rest)?;
        Ok(WsConn {
            s,
            dec,
            client: true,
            close_sent: false,
        })
    }

    /// The server's side of the handshake on `s`, within `timeout`: a bad request is answered
    /// `400` (naming why) and is the error.
    pub(crate) async fn accept(
        mut s: Stream,
        max: usize,
        timeout: Duration,
    ) -> Result<(Self, Upgrade), ConnError> {
        let hs = async {
            let mut buf = Vec::with_capacity(512);
            let mut chunk = [0u8; 4096];
            loop {
                match read_upgrade(&buf) {
                    Ok(Some(u)) => return Ok((u, buf)),
                    Ok(None) => {}
                    Err(e) => {
                        if !buf.is_empty() && crate::salt_tcp::looks_like_zmtp(&buf) {
                            return Err(ConnError::Zmtp);
                        }
                        let _ = s.write_all(&refusal_response(&e.to_string())).await;
                        let _ = s.flush().await;
                        return Err(e.into());
                    }
                }
                let want = chunk
                    .len()
                    .min(MAX_HANDSHAKE + 4 - buf.len().min(MAX_HANDSHAKE));
                let n = s.read(&mut chunk[..want]).await?;
                if n == 0 {
                    return Err(ConnError::Eof);
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        };
        let (up, buf) = tokio::time::timeout(timeout, hs)
            .await
            .map_err(|_| ConnError::Timeout(timeout))??;
        s.write_all(&super::upgrade::upgrade_response(&up.key))
            .await?;
        s.flush().await?;
        let mut dec = WsDecoder::for_client_frames(max);
        dec.push(buf.get(up.len..).unwrap_or_default())?;
        Ok((
            WsConn {
                s,
                dec,
                client: false,
                close_sent: false,
            },
            up,
        ))
    }

    /// Whether this is the client side.
    pub fn is_client(&self) -> bool {
        self.client
    }

    /// The frame bytes for one message from this side.
    pub fn frame(&self, opcode: u8, payload: &[u8]) -> Vec<u8> {
        if self.client {
            client_frame(opcode, payload)
        } else {
            server_frame(opcode, payload)
        }
    }

    /// Sends one message (a single frame) and flushes.
    pub async fn send(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        let f = self.frame(opcode, payload);
        self.send_raw(&f).await
    }

    /// Writes frame bytes made by [`WsConn::frame`] (or a cached copy of them).
    pub async fn send_raw(&mut self, frame: &[u8]) -> std::io::Result<()> {
        if self.close_sent {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the websocket is closing",
            ));
        }
        if frame.first().is_some_and(|b| b & 0x0f == OP_CLOSE) {
            self.close_sent = true;
        }
        self.s.write_all(frame).await?;
        self.s.flush().await
    }

    /// Sends a close frame with `code` (once; later calls do nothing), best effort.
    pub async fn close(&mut self, code: u16) {
        if !self.close_sent {
            let _ = self.send(OP_CLOSE, &code.to_be_bytes()).await;
        }
    }

    /// The next whole message (data or control). Cancel-safe.
    pub async fn recv(&mut self) -> Result<WsMessage, ConnError> {
        read_message(&mut self.s, &mut self.dec, None, None).await
    }

    /// The stream and the decoder (holding any bytes read past the handshake), to split the
    /// websocket into a reader and a writer.
    pub(crate) fn into_parts(self) -> (Stream, WsDecoder) {
        (self.s, self.dec)
    }

    /// The protocol's answer to a control message: a pong for a ping; for a close, the close
    /// echoed (true: the websocket is over). Data and pongs need none.
    pub async fn answer(&mut self, m: &WsMessage) -> Result<bool, ConnError> {
        match m {
            WsMessage::Ping(p) => {
                self.send(OP_PONG, p).await?;
                Ok(false)
            }
            WsMessage::Close(code) => {
                // Echo the code (RFC 6455 5.5.1); 1005 (none sent) is never put on the wire.
                self.close(code.filter(|c| *c != 1005).unwrap_or(1000))
                    .await;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Bytes buffered and not yet taken as messages.
    pub fn buffered(&self) -> usize {
        self.dec.buffered()
    }

    /// False when the peer closed (or broke) an idle connection, or sent anything on it (a
    /// close frame, say): nothing may arrive between a request and the next.
    pub async fn still_open(&mut self) -> bool {
        if self.close_sent || self.dec.buffered() > 0 {
            return false;
        }
        let mut probe = [0u8; 1024];
        match tokio::time::timeout(Duration::ZERO, self.s.read(&mut probe)).await {
            Err(_) => true,
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(_)) => false,
        }
    }

    /// Closes the stream's write side (after a close frame).
    pub async fn shutdown(&mut self) {
        let _ = self.s.shutdown().await;
    }
}

/// The next whole message from `rd` through `dec`. `idle`: the first byte of a message must
/// come within it (none: wait for ever); `frame`: a message begun must be whole within it of the
/// first byte read for it. Without limits it is cancel-safe (bytes are pushed as soon as read).
pub async fn read_message<R: AsyncRead + Unpin>(
    rd: &mut R,
    dec: &mut WsDecoder,
    idle: Option<Duration>,
    frame: Option<Duration>,
) -> Result<WsMessage, ConnError> {
    let mut chunk = [0u8; 16 * 1024];
    let mut deadline = match dec.buffered() {
        0 => idle.map(|t| (Instant::now() + t, ConnError::Idle(t))),
        _ => frame.map(|t| (Instant::now() + t, ConnError::Slow(t))),
    };
    loop {
        if let Some(m) = dec.next_message()? {
            return Ok(m);
        }
        let n = match &mut deadline {
            None => rd.read(&mut chunk).await?,
            Some((d, why)) => match tokio::time::timeout_at(*d, rd.read(&mut chunk)).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(std::mem::replace(why, ConnError::Eof));
                }
            },
        };
        if n == 0 {
            return Err(ConnError::Eof);
        }
        dec.push(&chunk[..n])?;
        if !matches!(deadline, Some((_, ConnError::Slow(_)))) {
            deadline = frame.map(|t| (Instant::now() + t, ConnError::Slow(t)));
        }
    }
}
