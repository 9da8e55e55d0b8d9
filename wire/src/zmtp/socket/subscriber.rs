//! SUB: one connection to a publisher, re-dialled forever with Salt's randomised interval.
//!
//! Salt's minion sets `RECONNECT_IVL = randint(recon_default, recon_default + recon_max)` ms
//! (1000…11000 by default) and `RECONNECT_IVL_MAX = recon_max`, to spread reconnect storms after
//! a master restart; libzmq then doubles the interval after each failed attempt up to the max,
//! unless the interval already exceeds it. [`ReconnectPolicy`] is that rule as a pure function.
//! Subscriptions are kept here and re-sent on every (re)connect: as SUBSCRIBE commands to a
//! ZMTP 3.1 publisher, as legacy `0x01` frames to a 3.0 one. Every PING is answered.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::accept::Keepalive;
use crate::zmtp::conn::{Connection, HandshakeConfig};
use crate::zmtp::frame::DEFAULT_MAX_FRAME_SIZE;
use crate::zmtp::peer::{drive, Delivered, DriverConfig, Heartbeat, Inbound, OnFull, Outbound};
use crate::zmtp::SocketType;

/// Salt's minion reconnect options (`recon_default`, `recon_max`, `recon_randomize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    pub recon_default: Duration,
    pub recon_max: Duration,
    pub recon_randomize: bool,
}

impl Default for ReconnectPolicy {
    /// Salt's defaults: 1000 ms, 10000 ms, randomised.
    fn default() -> Self {
        ReconnectPolicy {
            recon_default: Duration::from_millis(1000),
            recon_max: Duration::from_millis(10000),
            recon_randomize: true,
        }
    }
}

/// libzmq's own reconnect interval when Salt sets nothing.
const LIBZMQ_DEFAULT_IVL: Duration = Duration::from_millis(100);

impl ReconnectPolicy {
    /// The base interval, chosen once per socket as Salt does.
    pub fn initial_interval<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        if !self.recon_randomize {
            return LIBZMQ_DEFAULT_IVL;
        }
        let lo = self.recon_default.as_millis() as u64;
        let hi = lo.saturating_add(self.recon_max.as_millis() as u64);
        Duration::from_millis(rng.random_range(lo..=hi))
    }

    /// The wait before the next attempt after `failures` consecutive failed attempts
    /// (0 = right after a disconnect): `ivl * 2^failures`, capped at `recon_max`, and no
    /// back-off at all when `ivl >= recon_max` or when Salt set no max.
    pub fn delay(&self, ivl: Duration, failures: u32) -> Duration {
        let max = if self.recon_randomize {
            self.recon_max
        } else {
            Duration::ZERO
        };
        if max <= ivl {
            return ivl;
        }
        let factor = 1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX);
        ivl.saturating_mul(factor).min(max)
    }
}

/// SUB settings.
#[derive(Debug, Clone)]
pub struct SubOptions {
    pub reconnect: ReconnectPolicy,
    /// Our own PINGs (Salt minions send none; answering the master's is always on).
    pub heartbeat: Option<Heartbeat>,
    pub max_frame_size: usize,
    pub handshake_timeout: Duration,
    /// TCP keepalive on the dialled socket (default: Salt's minion `tcp_keepalive*`, idle
    /// 300 s); `None` = off.
    pub keepalive: Option<Keepalive>,
    /// Received messages buffered for [`Subscriber::recv`]; beyond it messages are dropped and
    /// counted ([`Subscriber::dropped_inbound`]) while the connection keeps reading and
    /// answering PINGs (libzmq's `ZMQ_RCVHWM`).
    pub queue: usize,
    /// Local address to dial from (Salt's minion `source_address`); `None` = the kernel's choice.
    pub source: Option<std::net::IpAddr>,
    /// Sent as the READY's `Identity` when not empty. libzmq sends none on a SUB socket (a Salt
    /// minion's id set with `zmq.IDENTITY` never reaches the wire); saltgate-minion sends its id,
    /// which a publisher may ignore and saltgate's fan-out uses to replay to it.
    pub identity: Bytes,
}

impl Default for SubOptions {
    fn default() -> Self {
        SubOptions {
            reconnect: ReconnectPolicy::default(),
            heartbeat: None,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            handshake_timeout: Duration::from_secs(10),
            keepalive: Some(Keepalive::salt()),
            queue: 1000,
            source: None,
            identity: Bytes::new(),
        }
    }
}

enum Ctl {
    Subscribe(Bytes),
    Cancel(Bytes),
}

struct State {
    connects: AtomicU64,
    dropped: Arc<AtomicU64>,
    connected: AtomicBool,
    changed: Notify,
}

/// A SUB socket connected (and re-connecting) to one publisher.
pub struct Subscriber {
    ctl: mpsc::UnboundedSender<Ctl>,
    rx: mpsc::Receiver<Delivered>,
    state: Arc<State>,
    interval: Duration,
    task: JoinHandle<()>,
}

impl Subscriber {
    /// Starts dialling `addr` in the background (call from within a Tokio runtime).
    pub fn connect(addr: SocketAddr, opts: SubOptions) -> Self {
        let interval = opts.reconnect.initial_interval(&mut rand::rng());
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel(opts.queue.max(1));
        let state = Arc::new(State {
            connects: AtomicU64::new(0),
            dropped: Arc::default(),
            connected: AtomicBool::new(false),
            changed: Notify::new(),
        });
        let task = tokio::spawn(run(addr, opts, interval, ctl_rx, tx, state.clone()));
        Subscriber {
            ctl,
            rx,
            state,
            interval,
            task,
        }
    }

    /// Subscribes to messages whose first frame starts with `topic` (`""` = everything).
    pub fn subscribe(&self, topic: impl Into<Bytes>) {
        let _ = self.ctl.send(Ctl::Subscribe(topic.into()));
    }

    pub fn unsubscribe(&self, topic: impl Into<Bytes>) {
        let _ = self.ctl.send(Ctl::Cancel(topic.into()));
    }

    /// The next message; `None` only if the background task is gone.
    pub async fn recv(&mut self) -> Option<Vec<Bytes>> {
        self.rx.recv().await.map(|d| d.frames)
    }

    pub fn is_connected(&self) -> bool {
        self.state.connected.load(Ordering::SeqCst)
    }

    /// Successful connections so far (1 after the first, +1 per reconnect).
    pub fn connect_count(&self) -> u64 {
        self.state.connects.load(Ordering::SeqCst)
    }

    /// Messages dropped so far because the receive queue (`queue`) was full.
    pub fn dropped_inbound(&self) -> u64 {
        self.state.dropped.load(Ordering::Relaxed)
    }

    /// The randomised base reconnect interval this socket picked.
    pub fn reconnect_interval(&self) -> Duration {
        self.interval
    }

    /// Waits until `connect_count() >= n`; false on timeout.
    pub async fn wait_connects(&self, n: u64, timeout: Duration) -> bool {
        let now = tokio::time::Instant::now();
        // An unrepresentable deadline (absurd timeout) is capped at one day.
        let deadline = now
            .checked_add(timeout)
            .unwrap_or(now + Duration::from_secs(86_400));
        loop {
            let notified = self.state.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.connect_count() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.connect_count() >= n;
            }
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    addr: SocketAddr,
    opts: SubOptions,
    interval: Duration,
    mut ctl_rx: mpsc::UnboundedReceiver<Ctl>,
    tx: mpsc::Sender<Delivered>,
    state: Arc<State>,
) {
    let mut topics: Vec<Bytes> = Vec::new();
    let mut failures = 0u32;
    let mut hs = HandshakeConfig::new(SocketType::Sub);
    hs.identity = opts.identity.clone();
    hs.max_frame_size = opts.max_frame_size;
    hs.timeout = opts.handshake_timeout;
    loop {
        match Connection::connect_from(addr, opts.source, &hs, opts.keepalive.as_ref()).await {
            Ok(conn) => {
                failures = 0;
                state.connects.fetch_add(1, Ordering::SeqCst);
                state.connected.store(true, Ordering::SeqCst);
                state.changed.notify_waiters();
                let (out_tx, out_rx) = mpsc::channel(topics.len() + 64);
                for t in &topics {
                    let _ = out_tx.try_send(Outbound::Subscribe(t.clone()));
                }
                let inbound = Inbound::Channel {
                    tx: tx.clone(),
                    peer: Bytes::new(),
                    full: OnFull::Drop(state.dropped.clone()),
                    budget: None,
                };
                let cfg = DriverConfig::new(opts.heartbeat, opts.max_frame_size);
                let driver = drive(conn, out_rx, inbound, cfg);
                tokio::pin!(driver);
                let reason = loop {
                    tokio::select! {
                        reason = &mut driver => break reason,
                        ctl = ctl_rx.recv() => match ctl {
                            None => return,
                            Some(c) => {
                                let out = apply(&mut topics, c);
                                if out_tx.send(out).await.is_err() {
                                    // The driver is finishing; its reason comes next.
                                }
                            }
                        },
                    }
                };
                tracing::debug!(%addr, ?reason, "sub connection closed");
                state.connected.store(false, Ordering::SeqCst);
                state.changed.notify_waiters();
            }
            Err(e) => {
                tracing::debug!(%addr, error = %e, "sub connect failed");
                failures = failures.saturating_add(1);
            }
        }
        if tx.is_closed() {
            return;
        }
        // Subscriptions changed while disconnected are applied now and sent on the next connect.
        let wait = tokio::time::sleep(opts.reconnect.delay(interval, failures));
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                ctl = ctl_rx.recv() => match ctl {
                    None => return,
                    Some(c) => { apply(&mut topics, c); }
                },
            }
        }
    }
}

fn apply(topics: &mut Vec<Bytes>, ctl: Ctl) -> Outbound {
    match ctl {
        Ctl::Subscribe(t) => {
            topics.push(t.clone());
            Outbound::Subscribe(t)
        }
        Ctl::Cancel(t) => {
            if let Some(i) = topics.iter().position(|x| *x == t) {
                topics.swap_remove(i);
            }
            Outbound::Cancel(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn salt_default_interval_is_between_1_and_11_seconds() {
        let p = ReconnectPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let ivl = p.initial_interval(&mut rng);
            assert!(ivl >= Duration::from_millis(1000) && ivl <= Duration::from_millis(11000));
        }
    }

    #[test]
    fn interval_above_max_means_no_backoff() {
        let p = ReconnectPolicy::default();
        let ivl = Duration::from_millis(10500);
        assert_eq!(p.delay(ivl, 0), ivl);
        assert_eq!(p.delay(ivl, 5), ivl);
    }

    #[test]
    fn interval_below_max_doubles_up_to_max() {
        let p = ReconnectPolicy::default();
        let ivl = Duration::from_millis(2000);
        assert_eq!(p.delay(ivl, 0), ivl);
        assert_eq!(p.delay(ivl, 1), Duration::from_millis(4000));
        assert_eq!(p.delay(ivl, 2), Duration::from_millis(8000));
        assert_eq!(p.delay(ivl, 3), Duration::from_millis(10000));
        assert_eq!(p.delay(ivl, 40), Duration::from_millis(10000));
    }

    #[test]
    fn without_randomize_libzmq_default_100ms_applies() {
        let p = ReconnectPolicy {
            recon_randomize: false,
            ..ReconnectPolicy::default()
        };
        let ivl = p.initial_interval(&mut rand::rng());
        assert_eq!(ivl, Duration::from_millis(100));
        assert_eq!(p.delay(ivl, 3), ivl);
    }
}
