//! Request-session continuity on Salt's plain `ws` transport (`transport: ws`,
//! `on_master_down: migrate`; docs/request-continuity.md, "On Salt's `ws` transport"): fake
//! masters that answer the HTTP upgrade with a `101` and each binary message with one binary
//! reply, in order, as Salt's `RequestServer.handle_message` (aiohttp) does; a minion stand-in
//! that upgrades once, sends its request and reads the one `101` and the reply on that same
//! connection (Salt's `RequestClient.send`). The connection it holds is the proof that the minion
//! never reconnected; its decoder taking every byte after the `101` as frames is the proof that no
//! second `101` reached it. Addresses 127.40.0.x.

mod common;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use common::api::{addr, scrape, value};
use common::migrate_lab::{self, Lab};
use common::mode_master::{ModeMaster, ANSWER, HALF_THEN_DIE, HOLD};
use common::*;
use saltgate_config::transport::SaltTransport;
use saltgate_config::Role;
use saltgate_proxy::Running;
use saltgate_wire::salt_ws::{
    accept_key, client_frame, handshake_request, new_key, read_handshake, WsDecoder, WsMessage,
    OP_BINARY,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A [`ModeMaster`] mode of this test's own: reads the upgrade request and never answers it.
const NO_UPGRADE: u8 = 3;

#[derive(Default)]
struct Seen {
    /// `Sec-WebSocket-Key` of each upgrade, in order.
    keys: Vec<String>,
    /// Bytes of client frames received (upgrades left out).
    frame_bytes: usize,
    /// Binary messages, unmasked.
    bodies: Vec<String>,
}

/// A Salt `ws` master's request port.
type WsMaster = ModeMaster<Seen>;

impl WsMaster {
    fn bodies(&self) -> Vec<String> {
        self.seen.lock().unwrap().bodies.clone()
    }

    fn keys(&self) -> Vec<String> {
        self.seen.lock().unwrap().keys.clone()
    }

    fn frame_bytes(&self) -> usize {
        self.seen.lock().unwrap().frame_bytes
    }
}

/// One whole masked client frame at the start of `buf`: (fin, opcode, unmasked payload, size).
fn client_frame_at(buf: &[u8]) -> Option<(bool, u8, Vec<u8>, usize)> {
    let (b0, b1) = (*buf.first()?, *buf.get(1)?);
    assert!(b1 & 0x80 != 0, "a client frame is masked");
    let (len, at) = match b1 & 0x7f {
        126 => (u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize, 4),
        127 => {
            let b: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            (u64::from_be_bytes(b) as usize, 10)
        }
        n => (n as usize, 2),
    };
    let key = buf.get(at..at + 4)?;
    let body = buf.get(at + 4..at + 4 + len)?;
    let body = body
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ key[i % 4])
        .collect();
    Some((b0 & 0x80 != 0, b0 & 0x0f, body, at + 4 + len))
}

/// A server frame (unmasked).
fn server_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | OP_BINARY];
    if payload.len() < 126 {
        out.push(payload.len() as u8);
    } else {
        out.push(126);
        out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(payload);
    out
}

async fn serve(name: &'static str, mut s: TcpStream, mode: Arc<AtomicU8>, seen: Arc<Mutex<Seen>>) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 65536];
    // The upgrade request.
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end);
    let key = head
        .split("\r\n")
        .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
        .unwrap_or_default()
        .to_string();
    {
        let mut seen = seen.lock().unwrap();
        seen.keys.push(key.clone());
        // Frame bytes read with the upgrade.
        seen.frame_bytes += buf.len();
    }
    if mode.load(Ordering::SeqCst) == NO_UPGRADE {
        let _ = s.read(&mut chunk).await;
        std::future::pending::<()>().await;
    }
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\nDate: {name}\r\nServer: Python/3.11 aiohttp/3.14.5\r\n\r\n",
        accept_key(&key)
    );
    if s.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let mut message = Vec::new();
    loop {
        while let Some((fin, op, body, size)) = client_frame_at(&buf) {
            buf.drain(..size);
            if op & 0x8 != 0 {
                continue;
            }
            message.extend_from_slice(&body);
            if !fin {
                continue;
            }
            let body = String::from_utf8_lossy(&std::mem::take(&mut message)).into_owned();
            seen.lock().unwrap().bodies.push(body.clone());
            let reply = server_frame(format!("{name}:{body}").as_bytes());
            match mode.load(Ordering::SeqCst) {
                ANSWER if s.write_all(&reply).await.is_err() => return,
                HALF_THEN_DIE => {
                    let _ = s.write_all(&reply[..reply.len() / 2]).await;
                    return;
                }
                _ => {}
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                seen.lock().unwrap().frame_bytes += n;
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// The minion's request websocket (Salt's `RequestClient`: one upgrade, one request).
struct Minion {
    s: TcpStream,
    key: String,
    /// Bytes read before the `101` was whole.
    head: Vec<u8>,
    upgraded: bool,
    dec: WsDecoder,
}

impl Minion {
    /// Connects and sends the upgrade request (its answer is read with the first reply).
    async fn connect(r: &Running) -> Minion {
        let mut s = TcpStream::connect(addr(r, Role::Request)).await.unwrap();
        let key = new_key();
        let host = addr(r, Role::Request).to_string();
        s.write_all(&handshake_request(&host, "/", &key))
            .await
            .unwrap();
        Minion {
            s,
            key,
            head: Vec::new(),
            upgraded: false,
            dec: WsDecoder::new(1 << 22),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    /// Reads once: false when saltgate closed the connection.
    async fn read(&mut self) -> bool {
        let mut buf = vec![0u8; 65536];
        let n = tokio::time::timeout(T, self.s.read(&mut buf))
            .await
            .expect("bytes or a close within T")
            .unwrap_or(0);
        if n == 0 {
            return false;
        }
        if self.upgraded {
            self.dec.push(&buf[..n]).unwrap();
            return true;
        }
        self.head.extend_from_slice(&buf[..n]);
        if let Some(end) = read_handshake(&self.head, &self.key).expect("a 101") {
            self.upgraded = true;
            self.dec.push(&self.head[end..]).unwrap();
            self.head.truncate(end);
        }
        true
    }

    /// Waits for the `101`, as a websocket client does before it sends.
    async fn upgraded(&mut self) {
        while !self.upgraded {
            assert!(self.read().await, "closed before the 101");
        }
    }

    /// The next message after the one `101`, or `None` once saltgate closed the connection.
    async fn recv(&mut self) -> Option<WsMessage> {
        loop {
            if self.upgraded {
                if let Some(m) = self.dec.next_message().expect("frames after one 101") {
                    return Some(m);
                }
            }
            if !self.read().await {
                return None;
            }
        }
    }
}

fn binary(s: &str) -> Option<WsMessage> {
    Some(WsMessage::Binary(s.as_bytes().to_vec()))
}

/// Masters a (on `ips[0]`, in `a_mode`) and b (on `ips[1]`, answering), and saltgate on
/// 127.40.0.1 over them: the shared migrate lab.
async fn lab(ips: [&str; 2], a_mode: u8, migrate_buffer: u32) -> (WsMaster, WsMaster, Lab) {
    migrate_lab::pair(
        "127.40.0.1",
        SaltTransport::Ws,
        ips,
        a_mode,
        migrate_buffer,
        serve,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_master_dying_mid_request_leaves_the_request_to_another_after_one_101() {
    let (a, b, lab) = lab(["127.40.0.2", "127.40.0.3"], HOLD, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.upgraded().await;
    let body = "r".repeat(3000);
    let req = client_frame(OP_BINARY, body.as_bytes());
    let half = req.len() / 2;
    minion.send(&req[..half]).await;
    wait_for("a has half the request", || a.frame_bytes() == half).await;
    a.kill();
    // saltgate moves the session (the master's end) or finds it gone at the next write.
    minion.send(&req[half..]).await;
    assert_eq!(minion.recv().await, binary(&format!("b:{body}")));
    assert_eq!(b.keys(), [minion.key.clone()], "the minion's own upgrade");
    assert_eq!(b.bodies(), std::slice::from_ref(&body));
    // The same websocket goes on, to b.
    minion.send(&client_frame(OP_BINARY, b"next")).await;
    assert_eq!(minion.recv().await, binary("b:next"));
    assert!(
        String::from_utf8_lossy(&minion.head).contains("Date: a\r\n"),
        "a's 101, alone"
    );
    lab.migrated(&[]).await;
    let s = scrape(lab.admin()).await;
    let replayed = value(&s, "saltgate_requests_replayed_total", &[]);
    assert_eq!(replayed, 1.0, "one re-send, whole or partial");
    drop(minion);
    lab.moved_once_to("b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_ws_master_marked_down_has_its_request_re_sent_whole() {
    let (a, b, lab) = lab(["127.40.0.4", "127.40.0.5"], HOLD, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.upgraded().await;
    minion.send(&client_frame(OP_BINARY, b"return")).await;
    wait_for("a holds the request", || a.bodies() == ["return"]).await;
    lab.prober.set_down(a.addr, true);
    assert_eq!(minion.recv().await, binary("b:return"));
    assert_eq!(b.keys(), [minion.key.clone()]);
    lab.migrated(&[("reason", "master-down")]).await;
    lab.replayed_complete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_master_that_never_answered_the_upgrade_leaves_the_minion_the_next_ones_101() {
    let (a, _b, lab) = lab(["127.40.0.6", "127.40.0.7"], NO_UPGRADE, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    wait_for("a has the upgrade", || a.keys().len() == 1).await;
    lab.prober.set_down(a.addr, true);
    lab.migrated(&[]).await;
    minion.upgraded().await;
    minion.send(&client_frame(OP_BINARY, b"late")).await;
    assert_eq!(minion.recv().await, binary("b:late"));
    assert!(
        String::from_utf8_lossy(&minion.head).contains("Date: b\r\n"),
        "b's 101"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_master_dying_mid_reply_closes_the_session_rather_than_splice_two_replies() {
    let (_a, b, lab) = lab(["127.40.0.8", "127.40.0.9"], HALF_THEN_DIE, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.upgraded().await;
    minion
        .send(&client_frame(OP_BINARY, "x".repeat(3000).as_bytes()))
        .await;
    assert_eq!(minion.recv().await, None, "closed: the minion retries");
    lab.skipped("mid-reply").await;
    assert!(b.keys().is_empty(), "nothing re-sent");
    assert_eq!(lab.record().await.migrate_skip, Some("mid-reply"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_request_over_the_cap_is_not_kept_and_its_session_closes_as_before() {
    let (a, b, lab) = lab(["127.40.0.10", "127.40.0.11"], HOLD, 1024).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.upgraded().await;
    minion.send(&client_frame(OP_BINARY, &[b'x'; 4000])).await;
    wait_for("a holds it", || a.bodies().len() == 1).await;
    a.kill();
    assert_eq!(minion.recv().await, None, "closed: the minion retries");
    lab.skipped("over-cap").await;
    assert!(b.keys().is_empty());
}
