//! Presence: which minion is where (docs/presence.md).
//!
//! On a request session, the first bytes the client sends are read passively for the minion id
//! (the transport's [`Peek`]: a clear `_auth`, or the envelope of an `aes` request; ZeroMQ,
//! plain `tcp` and plain `ws`, see [`peek_transport`]; under TLS by address only), through a
//! [`Tap`] the pump calls with bytes it has already forwarded: nothing is altered or delayed, and
//! once the id is found (or the sniffer gives up, or its budget is spent) the tap is dropped and
//! the session's data path is exactly what it is without presence.
//!
//! The id is paired with the publish session from the same client IP address (the publish port
//! carries no id; a minion connects to both ports from the same host). Several minions behind one
//! address (a NAT, a swarm on one IP) make that pairing ambiguous when their publish sessions sit
//! on different masters: the minion is then listed with every candidate and no publish master,
//! rather than a guess.
//!
//! The [`table`] is bounded (`presence.max_minions`, oldest evicted) and a minion with no session
//! left is listed for `presence.expire_after`, then forgotten. Served by `GET /api/v1/minions`
//! ([`api`]), `saltgate ctl minions` and the `saltgate_minions_*` metrics.

pub mod table;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use saltgate_config::transport::SaltTransport;
use saltgate_config::{Global, PresenceConfig, Role};
use saltgate_wire::transport::{AnyPeeker, GiveUp, Peek, Source, Transport, Verdict};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::data::pump::Tap;
use table::Table;

/// Wall-clock milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What each sniffed request session ended in: `saltgate_presence_inspections_total{result}`,
/// every label resolved once.
struct Inspections {
    found: [IntCounter; 2],
    gave_up: [IntCounter; GiveUp::ALL.len()],
    /// The session ended before a verdict.
    ended: IntCounter,
}

/// The presence table and what feeds it; one per process, in the data plane.
pub struct Presence {
    enabled: AtomicBool,
    budget: AtomicUsize,
    table: Mutex<Table>,
    inspections: Inspections,
    evicted: IntCounter,
    /// Publish sessions waiting to learn the minion id at their address ([`IdWait`]).
    id_waiters: Mutex<HashMap<IpAddr, Vec<Arc<Notify>>>>,
    /// How many are registered (a request session's identification skips the lock when 0).
    id_waiting: AtomicUsize,
}

impl Presence {
    pub fn new(cfg: &PresenceConfig, registry: &Registry) -> Arc<Self> {
        let vec = IntCounterVec::new(
            Opts::new(
                "saltgate_presence_inspections_total",
                "Request sessions read for a minion id, by result: auth or aes (id found in a clear _auth or an aes envelope), a reason for giving up, or ended (closed first).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let evicted = IntCounter::new(
            "saltgate_minions_evicted_total",
            "Minions dropped from the presence table because it was full (presence.max_minions).",
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(vec.clone()));
        let _ = registry.register(Box::new(evicted.clone()));
        let inspections = Inspections {
            found: [Source::Auth, Source::Aes].map(|s| vec.with_label_values(&[s.as_str()])),
            gave_up: GiveUp::ALL.map(|g| vec.with_label_values(&[g.as_str()])),
            ended: vec.with_label_values(&["ended"]),
        };
        let p = Arc::new(Presence {
            enabled: AtomicBool::new(false),
            budget: AtomicUsize::new(0),
            table: Mutex::new(Table::new(cfg.max_minions as usize, cfg.expire_after)),
            inspections,
            evicted,
            id_waiters: Mutex::new(HashMap::new()),
            id_waiting: AtomicUsize::new(0),
        });
        p.configure(cfg);
        p
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Every table operation leaves it consistent before it could panic.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a (reloaded) `presence:` section in force: a lower cap evicts at once, turning
    /// presence off forgets every minion.
    pub fn configure(&self, cfg: &PresenceConfig) {
        self.budget
            .store(cfg.inspect_bytes as usize, Ordering::Relaxed);
        self.enabled.store(cfg.enabled, Ordering::Relaxed);
        let mut t = self.lock();
        t.max = (cfg.max_minions as usize).max(1);
        t.expire = cfg.expire_after;
        if cfg.enabled {
            t.shrink_to_cap();
        } else {
            t.clear();
        }
        self.sync_evicted(&t);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn sync_evicted(&self, t: &Table) {
        let n = t.evicted.saturating_sub(self.evicted.get());
        if n > 0 {
            self.evicted.inc_by(n);
        }
    }

    /// What a new session of `role` on `master` needs: a tap for a request session (read with
    /// the [`Peek`] of `peek`, see [`peek_transport`]; `None`: by address only), a guard that
    /// tells the table when the session ends. Nothing when presence is off.
    pub(crate) fn attach(
        self: &Arc<Self>,
        role: Role,
        session: u64,
        client: SocketAddr,
        master: &Arc<str>,
        peek: Option<Transport>,
    ) -> Attached {
        if !self.enabled() {
            return Attached {
                tap: None,
                _guard: None,
            };
        }
        match role {
            Role::Publish => Attached {
                tap: None,
                _guard: Some(self.publish_opened(session, client, Some(master.clone()))),
            },
            Role::Request => {
                let identified = Arc::new(AtomicBool::new(false));
                // A transport whose requests cannot be peeked at (TLS) leaves presence by
                // address only.
                let budget = self.budget.load(Ordering::Relaxed);
                let peeker = peek.and_then(|t| t.peeker(budget).ok());
                let tap = peeker.map(|peeker| RequestTap {
                    peeker,
                    presence: self.clone(),
                    session,
                    client,
                    master: master.to_string(),
                    identified: identified.clone(),
                    done: false,
                });
                Attached {
                    tap: tap.map(|t| Box::new(t) as Box<dyn Tap>),
                    _guard: Some(Guard {
                        presence: Arc::downgrade(self),
                        session,
                        client,
                        kind: GuardKind::Request(identified),
                    }),
                }
            }
        }
    }

    /// Registers a publish session (`master` `None`: the fan-out hub); it is removed when the
    /// guard drops.
    pub(crate) fn publish_opened(
        self: &Arc<Self>,
        session: u64,
        client: SocketAddr,
        master: Option<Arc<str>>,
    ) -> Guard {
        self.lock()
            .publish_opened(session, client, master, Instant::now(), now_ms());
        Guard {
            presence: Arc::downgrade(self),
            session,
            client,
            kind: GuardKind::Publish,
        }
    }

    /// The minion id presence has seen `_auth` for at `ip`, when exactly one is known there
    /// (`None` when presence is off, none is known, or several share the address).
    pub(crate) fn sole_id_at(&self, ip: std::net::IpAddr) -> Option<String> {
        if !self.enabled() {
            return None;
        }
        self.lock().sole_id_at(ip).map(str::to_string)
    }

    /// Registers a publish session from `ip` that has no minion id yet: the returned guard is
    /// woken each time a request session from `ip` is identified, until it is dropped. Register
    /// before asking [`Presence::sole_id_at`], so an identification in between is not missed.
    /// (Fan-out replay: a stock minion's SUB may reach a node before its `_auth` does.)
    pub(crate) fn wait_for_id(&self, ip: IpAddr) -> IdWait<'_> {
        let notify = Arc::new(Notify::new());
        self.id_waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(ip)
            .or_default()
            .push(notify.clone());
        self.id_waiting.fetch_add(1, Ordering::AcqRel);
        IdWait {
            presence: self,
            ip,
            notify,
        }
    }

    /// Wakes the publish sessions waiting for an id at `ip` (a request session from it was
    /// just identified). Free when none waits.
    fn wake_id_waiters(&self, ip: IpAddr) {
        if self.id_waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let w = self.id_waiters.lock().unwrap_or_else(|e| e.into_inner());
        for n in w.get(&ip).into_iter().flatten() {
            n.notify_one();
        }
    }

    /// What a request session's tap does when it reads `id` (tests of the modules presence
    /// notifies).
    #[cfg(test)]
    pub(crate) fn identify_for_test(&self, session: u64, client: SocketAddr, id: &str) {
        let s = saltgate_wire::transport::Sighting {
            id: id.to_string(),
            source: Source::Auth,
        };
        self.lock()
            .identified(session, client, "test", &s, Instant::now(), now_ms());
        self.wake_id_waiters(client.ip());
    }

    /// A page of minions (see [`api`]).
    pub fn page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<(String, table::Minion, table::PublishOf)>, bool, usize) {
        let mut t = self.lock();
        let (page, more) = t.page(after, limit, Instant::now());
        (page, more, t.len())
    }

    /// Totals and minions per master (metrics).
    pub fn counts(&self) -> table::Counts {
        self.lock().counts(Instant::now())
    }

    /// How long a minion with no session stays listed, and the table's cap.
    pub fn limits(&self) -> (std::time::Duration, usize) {
        let t = self.lock();
        (t.expire, t.max)
    }
}

/// A publish session waiting to learn the minion id at its address
/// ([`Presence::wait_for_id`]); unregistered when dropped.
pub(crate) struct IdWait<'a> {
    presence: &'a Presence,
    ip: IpAddr,
    notify: Arc<Notify>,
}

impl IdWait<'_> {
    /// Resolves once a request session from the address was identified since the last call
    /// (or since registration); cancel-safe (a wake that finds no waiter is kept).
    pub(crate) async fn identified(&self) {
        self.notify.notified().await
    }

    /// The one minion id known at the address now ([`Presence::sole_id_at`]).
    pub(crate) fn sole_id(&self) -> Option<String> {
        self.presence.sole_id_at(self.ip)
    }
}

impl Drop for IdWait<'_> {
    fn drop(&mut self) {
        let mut w = self
            .presence
            .id_waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(list) = w.get_mut(&self.ip) {
            list.retain(|n| !Arc::ptr_eq(n, &self.notify));
            if list.is_empty() {
                w.remove(&self.ip);
            }
        }
        self.presence.id_waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The transport whose [`Peek`] reads the request sessions of a configuration (its top-level
/// `transport` and `ssl`): `zeromq`, plain `tcp` and plain `ws` (its requests in websocket
/// frames behind an HTTP upgrade) carry the `_auth` in clear; under TLS the stream is encrypted
/// end to end (`None`: presence by address only).
pub fn peek_transport(global: &Global) -> Option<Transport> {
    if global.ssl.is_some() {
        return None;
    }
    match global.transport {
        SaltTransport::Zeromq => Some(Transport::Zeromq),
        SaltTransport::Tcp => Some(Transport::Tcp),
        SaltTransport::Ws => Some(Transport::Ws),
    }
}

/// A session's part in presence: the tap for the pump, and the guard kept until it ends.
pub(crate) struct Attached {
    pub tap: Option<Box<dyn Tap>>,
    _guard: Option<Guard>,
}

enum GuardKind {
    Publish,
    /// Set by the tap once the session is in the table.
    Request(Arc<AtomicBool>),
}

/// Takes a session out of the table when it ends, however it ends.
pub(crate) struct Guard {
    presence: Weak<Presence>,
    session: u64,
    client: SocketAddr,
    kind: GuardKind,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(p) = self.presence.upgrade() else {
            return;
        };
        match &self.kind {
            GuardKind::Publish => {
                p.lock()
                    .publish_closed(self.session, self.client, Instant::now(), now_ms());
            }
            GuardKind::Request(identified) if identified.load(Ordering::Acquire) => {
                p.lock()
                    .request_closed(self.session, Instant::now(), now_ms());
            }
            GuardKind::Request(_) => {}
        }
    }
}

/// Feeds a request session's client → master bytes to the transport's [`Peek`] until it has a
/// verdict.
struct RequestTap {
    peeker: AnyPeeker,
    presence: Arc<Presence>,
    session: u64,
    client: SocketAddr,
    master: String,
    identified: Arc<AtomicBool>,
    done: bool,
}

impl Tap for RequestTap {
    fn observe(&mut self, bytes: &[u8]) -> bool {
        let p = &self.presence;
        match self.peeker.feed(bytes) {
            Verdict::Pending => return true,
            Verdict::Found(s) => {
                p.inspections.found[s.source as usize].inc();
                let mut t = p.lock();
                t.identified(
                    self.session,
                    self.client,
                    &self.master,
                    s,
                    Instant::now(),
                    now_ms(),
                );
                p.sync_evicted(&t);
                drop(t);
                self.identified.store(true, Ordering::Release);
                p.wake_id_waiters(self.client.ip());
            }
            Verdict::GaveUp(g) => {
                tracing::debug!(client = %self.client, reason = g.as_str(), "presence: no minion id on this request session");
                if let Some(i) = GiveUp::ALL.iter().position(|x| x == g) {
                    p.inspections.gave_up[i].inc();
                }
            }
        }
        self.done = true;
        false
    }
}

impl Drop for RequestTap {
    fn drop(&mut self) {
        if !self.done {
            self.presence.inspections.ended.inc();
        }
    }
}

/// Where the collector finds the names of the masters in force (so each has its gauges, at 0
/// when no minion is on it).
pub type MasterNames = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// `saltgate_minions_known`, `saltgate_minions_connected`, `saltgate_minions_publish_ambiguous`
/// and `saltgate_master_minions{master,port}`, computed from the table at scrape time.
struct PresenceCollector {
    presence: Weak<Presence>,
    masters: MasterNames,
    descs: Vec<Desc>,
}

impl PresenceCollector {
    fn gauges() -> ([IntGauge; 3], IntGaugeVec) {
        let g = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        (
            [
                g(
                    "saltgate_minions_known",
                    "Minions in the presence table: connected, or gone for less than presence.expire_after.",
                ),
                g(
                    "saltgate_minions_connected",
                    "Minions with an identified request session, or a publish session from their address.",
                ),
                g(
                    "saltgate_minions_publish_ambiguous",
                    "Connected minions whose address has publish sessions on several masters (several minions behind one address).",
                ),
            ],
            IntGaugeVec::new(
                Opts::new(
                    "saltgate_master_minions",
                    "Connected minions per master: port=publish by their address's publish session, port=request by their last identified request session.",
                ),
                &["master", "port"],
            )
            .expect("valid metric"),
        )
    }
}

impl Collector for PresenceCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let ([known, connected, ambiguous], per_master) = Self::gauges();
        if let Some(p) = self.presence.upgrade() {
            let c = p.counts();
            known.set(c.known as i64);
            connected.set(c.connected as i64);
            ambiguous.set(c.publish_ambiguous as i64);
            for name in (self.masters)() {
                for role in Role::ALL {
                    per_master.with_label_values(&[name.as_str(), role.as_str()]);
                }
            }
            for (name, counts) in &c.per_master {
                for role in Role::ALL {
                    per_master
                        .with_label_values(&[name.as_str(), role.as_str()])
                        .set(counts[role as usize] as i64);
                }
            }
        }
        let mut out: Vec<MetricFamily> = [known, connected, ambiguous]
            .iter()
            .flat_map(|g| g.collect())
            .collect();
        out.extend(per_master.collect());
        out
    }
}

/// Registers the presence gauges; `masters` names the masters in force at scrape time.
pub fn watch(registry: &Registry, presence: &Arc<Presence>, masters: MasterNames) {
    let (singles, per_master) = PresenceCollector::gauges();
    let descs = singles
        .iter()
        .flat_map(|g| g.desc().into_iter().cloned())
        .chain(per_master.desc().into_iter().cloned())
        .collect();
    let _ = registry.register(Box::new(PresenceCollector {
        presence: Arc::downgrade(presence),
        masters,
        descs,
    }));
}

#[cfg(test)]
mod peek_tests {
    use super::*;
    use saltgate_config::transport::SslConfig;

    #[test]
    fn request_sessions_are_read_on_plain_zeromq_tcp_and_ws_and_by_address_under_tls() {
        let g = |transport, ssl: Option<SslConfig>| Global {
            transport,
            ssl,
            ..Global::default()
        };
        let tls = Some(SslConfig::default());
        for (global, want) in [
            (g(SaltTransport::Zeromq, None), Some(Transport::Zeromq)),
            (g(SaltTransport::Tcp, None), Some(Transport::Tcp)),
            (g(SaltTransport::Tcp, tls.clone()), None),
            (g(SaltTransport::Ws, None), Some(Transport::Ws)),
            (g(SaltTransport::Ws, tls), None),
        ] {
            assert_eq!(peek_transport(&global), want, "{global:?}");
            // Every transport named here has a peek to attach.
            if let Some(t) = want {
                assert!(t.peeker(4096).is_ok(), "{t}");
            }
        }
    }
}
