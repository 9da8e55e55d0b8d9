//! A fake master's request port built from `wire`'s ZMTP pieces, for request-session tests
//! (continuity, the session span).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::{HealthSettings, MasterConfig, Probe};
use saltgate_wire::zmtp::{Connection, Frame, HandshakeConfig, SocketType};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A master's request port: a ROUTER per connection that answers `<name>:<request>` (or, while
/// `answer` is off, swallows requests: a hung or dying master). `kill` drops every connection.
pub struct FakeRouter {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub answer: Arc<AtomicBool>,
    /// (peer identity, request payload) in arrival order.
    pub got: Arc<Mutex<Vec<(Bytes, Bytes)>>>,
    pub tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl FakeRouter {
    pub async fn start(name: &'static str, ip: &str, answer: bool) -> FakeRouter {
        let l = TcpListener::bind((ip, 0)).await.unwrap();
        let r = FakeRouter {
            name,
            addr: l.local_addr().unwrap(),
            answer: Arc::new(AtomicBool::new(answer)),
            got: Default::default(),
            tasks: Default::default(),
        };
        let (answer, got, tasks) = (r.answer.clone(), r.got.clone(), r.tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let (answer, got) = (answer.clone(), got.clone());
                let t = tokio::spawn(async move {
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
                        if answer.load(Ordering::SeqCst) {
                            let reply = format!("{name}:{}", String::from_utf8_lossy(&payload));
                            let _ = c.send_message(&[&b""[..], reply.as_bytes()]).await;
                        }
                    }
                });
                tasks.lock().unwrap().push(t);
            }
        });
        r.tasks.lock().unwrap().push(accept);
        r
    }

    /// The master dies: its listener and every connection close.
    pub fn kill(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    pub fn requests(&self) -> Vec<String> {
        let got = self.got.lock().unwrap();
        got.iter()
            .map(|(_, p)| String::from_utf8_lossy(p).into_owned())
            .collect()
    }

    pub fn config(&self) -> MasterConfig {
        MasterConfig {
            name: self.name.into(),
            host: self.addr.ip().to_string(),
            // Health is scripted: the publish port is never dialled.
            publish_port: self.addr.port(),
            request_port: self.addr.port(),
            weight: 1,
            maxconn: None,
            backup: false,
            disabled: false,
            check: true,
            health: health(),
        }
    }
}

pub fn health() -> HealthSettings {
    HealthSettings {
        interval: Duration::from_millis(20),
        fastinter: Duration::from_millis(20),
        downinter: Duration::from_millis(20),
        rise: 2,
        fall: 2,
        timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(500),
        probe: Probe::Tcp,
    }
}
