//! A fake master's request port built from `wire`'s ZMTP pieces, for request-session tests
//! (continuity, the session span).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use saltgate_wire::zmtp::{Connection, Frame, HandshakeConfig, SocketType};
use tokio::net::TcpStream;

use super::mode_master::{ModeMaster, ANSWER, HOLD};

/// A master's request port: a ROUTER per connection that answers `<name>:<request>` (or, in mode
/// [`HOLD`], swallows requests: a hung or dying master). `kill` drops every connection. It notes
/// (peer identity, request payload) in arrival order.
pub type FakeRouter = ModeMaster<Vec<(Bytes, Bytes)>>;

impl FakeRouter {
    pub async fn start(name: &'static str, ip: &str, answer: bool) -> FakeRouter {
        let mode = if answer { ANSWER } else { HOLD };
        FakeRouter::serving(name, ip, mode, serve).await
    }

    pub fn requests(&self) -> Vec<String> {
        let got = self.seen.lock().unwrap();
        got.iter()
            .map(|(_, p)| String::from_utf8_lossy(p).into_owned())
            .collect()
    }
}

/// Serves one connection as a ROUTER: notes each request, answers it in mode [`ANSWER`].
pub async fn serve(
    name: &'static str,
    s: TcpStream,
    mode: Arc<AtomicU8>,
    got: Arc<Mutex<Vec<(Bytes, Bytes)>>>,
) {
    let mut hs = HandshakeConfig::new(SocketType::Router);
    hs.as_server = true;
    let Ok(mut c) = Connection::handshake(s, &hs).await else {
        return;
    };
    let id = c.peer().identity.clone();
    let mut parts = Vec::new();
    while let Ok(f) = c.read_frame().await {
        let Frame::Message { body, more } = f else {
            continue;
        };
        parts.push(body);
        if more {
            continue;
        }
        let payload = parts.pop().unwrap_or_default();
        parts.clear();
        got.lock().unwrap().push((id.clone(), payload.clone()));
        if mode.load(Ordering::SeqCst) == ANSWER {
            let reply = format!("{name}:{}", String::from_utf8_lossy(&payload));
            let _ = c.send_message(&[&b""[..], reply.as_bytes()]).await;
        }
    }
}
