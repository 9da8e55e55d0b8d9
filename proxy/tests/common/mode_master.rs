//! The fake masters' common part: a request port whose connections the test serves its
//! transport's way (ZMTP in router.rs, Salt's `tcp` and `ws` in their continuity tests), in a mode
//! the test switches; and the config of a master whose health the test scripts.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};

use saltgate_config::MasterConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{checked_master, scripted_health};

/// A [`ModeMaster`]'s mode: answers each request.
pub const ANSWER: u8 = 0;
/// Takes requests and never answers (a hung master, or one about to die).
pub const HOLD: u8 = 1;
/// Writes the first half of its reply, then closes the connection.
pub const HALF_THEN_DIE: u8 = 2;

/// A fake master's request port: every connection is served by the test's `serve` (its
/// transport's framing), which reads the `mode` the test may switch ([`ANSWER`], [`HOLD`],
/// [`HALF_THEN_DIE`] or the test's own) and notes what it got in `seen`. `kill` drops the listener
/// and every connection.
pub struct ModeMaster<S> {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub mode: Arc<AtomicU8>,
    pub seen: Arc<Mutex<S>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl<S: Default + Send + 'static> ModeMaster<S> {
    /// Listens on `ip`, port 0, and serves each connection with `serve(name, stream, mode, seen)`.
    pub async fn serving<F, Fut>(name: &'static str, ip: &str, mode: u8, serve: F) -> Self
    where
        F: Fn(&'static str, TcpStream, Arc<AtomicU8>, Arc<Mutex<S>>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let l = TcpListener::bind((ip, 0)).await.unwrap();
        let m = ModeMaster {
            name,
            addr: l.local_addr().unwrap(),
            mode: Arc::new(AtomicU8::new(mode)),
            seen: Default::default(),
            tasks: Default::default(),
        };
        let (mode, seen, tasks) = (m.mode.clone(), m.seen.clone(), m.tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let t = tokio::spawn(serve(name, s, mode.clone(), seen.clone()));
                tasks.lock().unwrap().push(t);
            }
        });
        m.tasks.lock().unwrap().push(accept);
        m
    }
}

impl<S> ModeMaster<S> {
    /// The master dies: its listener and every connection close.
    pub fn kill(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    pub fn config(&self) -> MasterConfig {
        scripted_master(self.name, self.addr)
    }
}

/// Master `name` with one port at `addr` for both roles, checked on the fast
/// [`scripted_health`] schedule: for tests whose prober is scripted (no port is dialled by a
/// check).
pub fn scripted_master(name: &str, addr: SocketAddr) -> MasterConfig {
    checked_master(
        name,
        &addr.ip().to_string(),
        addr.port(),
        addr.port(),
        scripted_health(),
    )
}
