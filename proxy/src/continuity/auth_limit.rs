//! `listeners.request.auth_limit`: the per-master gate that paces minions' `_auth` requests
//! (docs/configuration.md, docs/performance.md).
//!
//! Each master has a [`Gate`]: at most `max_in_flight` `_auth` sent to it and not yet answered.
//! One more waits in the gate, its bytes held by the session ([`super::auth_hold`]); the master
//! does not see it. A free place goes to the oldest waiting `_auth` while the oldest has waited
//! less than a quarter of `auth_timeout`, and to the newest past that ([`Gate::dispatch`]: in a
//! storm the oldest are the ones whose minions give up before the master's answer). A waiting `_auth` leaves the
//! queue without reaching the master when its minion closes the connection (`minion_closed`),
//! when it waited longer than `max_wait` (`max_wait`), or at once when `max_queue` are waiting
//! already (`queue_full`). A permit is given back when the master's reply to that `_auth` is
//! complete, or when the session ends or moves.
//!
//! A waiting `_auth` whose turn comes too late to be answered before its minion's `auth_timeout`
//! (its wait plus the master's recent `_auth` latency) is dropped too (`max_wait`): the master
//! would do the work for a minion that has given up.
//!
//! `max_in_flight: auto` starts at 5 (Salt 3008.5's `worker_threads`, the pool that serves
//! `_auth`) and adapts to the latency measured from admission to the end of the reply: one more
//! while answers come within an eighth of the minions' `auth_timeout` (and at least half the limit
//! is in use), per `limit` such answers, a quarter less (at most once per `auth_timeout / 4`) when an answer takes longer than a
//! quarter of it, so that an `_auth` admitted after a wait is still answered before its minion's
//! `auth_timeout`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use saltgate_config::auth_limit::{AuthLimit, MaxInFlight};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Where `max_in_flight: auto` starts: Salt 3008.5's `worker_threads` default.
pub const AUTO_START: u32 = 5;
/// The highest limit `auto` reaches.
pub const AUTO_MAX: u32 = 1024;

/// Why a held `_auth` was dropped without reaching the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    MinionClosed,
    MaxWait,
    QueueFull,
}

impl Dropped {
    pub const ALL: [Dropped; 3] = [Dropped::MinionClosed, Dropped::MaxWait, Dropped::QueueFull];
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::MinionClosed => "minion_closed",
            Dropped::MaxWait => "max_wait",
            Dropped::QueueFull => "queue_full",
        }
    }
}

/// The `saltgate_auth_*` metrics, labelled by master.
pub struct AuthMetrics {
    admitted: IntCounterVec,
    dropped: IntCounterVec,
    queued: IntGaugeVec,
    in_flight: IntGaugeVec,
    limit: IntGaugeVec,
    wait: HistogramVec,
    orphaned: IntCounterVec,
}

impl AuthMetrics {
    pub fn new(r: &Registry) -> Self {
        fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
            let _ = r.register(Box::new(c.clone()));
            c
        }
        let m = &["master"];
        AuthMetrics {
            admitted: reg(r, IntCounterVec::new(Opts::new("saltgate_auth_admitted_total", "_auth requests sent on to the master by listeners.request.auth_limit (at once or after waiting)."), m).expect("valid metric")),
            dropped: reg(r, IntCounterVec::new(Opts::new("saltgate_auth_dropped_total", "Held _auth requests dropped without reaching the master, by reason (minion_closed, max_wait, queue_full)."), &["master", "reason"]).expect("valid metric")),
            queued: reg(r, IntGaugeVec::new(Opts::new("saltgate_auth_queued", "_auth requests held in saltgate, waiting for their master's auth_limit."), m).expect("valid metric")),
            in_flight: reg(r, IntGaugeVec::new(Opts::new("saltgate_auth_in_flight", "_auth requests sent to the master and not yet answered (paced by auth_limit)."), m).expect("valid metric")),
            limit: reg(r, IntGaugeVec::new(Opts::new("saltgate_auth_limit", "The master's current max_in_flight (fixed, or adapted by auto)."), m).expect("valid metric")),
            orphaned: reg(r, IntCounterVec::new(Opts::new("saltgate_auth_orphaned_total", "Admitted _auth requests whose minion left before the master answered: the master's work wasted (the place stays taken until the answer)."), m).expect("valid metric")),
            wait: reg(r, HistogramVec::new(HistogramOpts::new("saltgate_auth_wait_seconds", "How long admitted _auth requests waited in saltgate before going to the master.").buckets(vec![0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0]), m).expect("valid metric")),
        }
    }
}

/// Auto mode's state.
#[derive(Debug)]
struct Adapt {
    /// The limit the semaphore stands for (permits out + available - debt).
    limit: u32,
    /// Completions since the last increase.
    grown: u32,
    last_cut: Option<Instant>,
}

/// One master's gate (see the module docs).
pub struct Gate {
    master: String,
    sem: Arc<Semaphore>,
    /// The `_auth` waiting for a place, by arrival (see [`Gate::dispatch`]).
    waiters: Mutex<Waiters>,
    adapt: Mutex<Adapt>,
    auto: std::sync::atomic::AtomicBool,
    auth_timeout_ms: AtomicU64,
    /// The master's recent `_auth` latency (admission to the end of the reply), a moving
    /// average in milliseconds; 0 before the first answer.
    latency_ms: AtomicU64,
    /// Permits to forget as they come back (the limit went down while they were out).
    debt: AtomicUsize,
    queued: AtomicUsize,
    in_flight: AtomicUsize,
    admitted: IntCounter,
    dropped: [IntCounter; 3],
    g_queued: IntGauge,
    g_in_flight: IntGauge,
    g_limit: IntGauge,
    wait: Histogram,
    orphaned: IntCounter,
}

/// What a gate's figures are now (admin JSON, status page).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GateView {
    pub master: String,
    pub limit: u32,
    pub auto: bool,
    pub in_flight: usize,
    pub queued: usize,
    pub admitted: u64,
    pub dropped_minion_closed: u64,
    pub dropped_max_wait: u64,
    pub dropped_queue_full: u64,
    /// Admitted `_auth` whose minion left before the master answered.
    pub orphaned: u64,
}

fn initial(cfg: &AuthLimit) -> u32 {
    match cfg.max_in_flight {
        MaxInFlight::Fixed(n) => n,
        MaxInFlight::Auto => AUTO_START,
    }
}

impl Gate {
    fn new(master: &str, cfg: &AuthLimit, m: &AuthMetrics) -> Arc<Self> {
        let limit = initial(cfg);
        let g = Gate {
            master: master.to_owned(),
            sem: Arc::new(Semaphore::new(limit as usize)),
            waiters: Mutex::new(Waiters::default()),
            adapt: Mutex::new(Adapt {
                limit,
                grown: 0,
                last_cut: None,
            }),
            auto: (cfg.max_in_flight == MaxInFlight::Auto).into(),
            auth_timeout_ms: AtomicU64::new(cfg.auth_timeout.as_millis() as u64),
            latency_ms: AtomicU64::new(0),
            debt: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            admitted: m.admitted.with_label_values(&[master]),
            dropped: Dropped::ALL.map(|d| m.dropped.with_label_values(&[master, d.as_str()])),
            g_queued: m.queued.with_label_values(&[master]),
            g_in_flight: m.in_flight.with_label_values(&[master]),
            g_limit: m.limit.with_label_values(&[master]),
            wait: m.wait.with_label_values(&[master]),
            orphaned: m.orphaned.with_label_values(&[master]),
        };
        g.g_limit.set(limit.into());
        Arc::new(g)
    }

    pub fn master(&self) -> &str {
        &self.master
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.adapt.lock().unwrap_or_else(|e| e.into_inner()).limit
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn view(&self) -> GateView {
        GateView {
            master: self.master.clone(),
            limit: self.limit(),
            auto: self.auto.load(Ordering::Relaxed),
            in_flight: self.in_flight(),
            queued: self.queued(),
            admitted: self.admitted.get(),
            dropped_minion_closed: self.dropped[0].get(),
            dropped_max_wait: self.dropped[1].get(),
            dropped_queue_full: self.dropped[2].get(),
            orphaned: self.orphaned.get(),
        }
    }

    /// Follows a reloaded configuration (a fixed limit that changed, auto turned on or off).
    fn configure(&self, cfg: &AuthLimit) {
        let auto = cfg.max_in_flight == MaxInFlight::Auto;
        let was = self.auto.swap(auto, Ordering::Relaxed);
        self.auth_timeout_ms
            .store(cfg.auth_timeout.as_millis() as u64, Ordering::Relaxed);
        match cfg.max_in_flight {
            MaxInFlight::Fixed(n) => self.set_limit(n),
            MaxInFlight::Auto if !was => self.set_limit(AUTO_START),
            MaxInFlight::Auto => {}
        }
    }

    /// Moves the limit to `n` (at least 1): permits added at once, or owed and forgotten as
    /// they come back.
    fn set_limit(&self, n: u32) {
        let n = n.max(1);
        let mut a = self.adapt.lock().unwrap_or_else(|e| e.into_inner());
        if n > a.limit {
            let mut add = (n - a.limit) as usize;
            // Pay back debt first.
            while add > 0 {
                let d = self.debt.load(Ordering::Relaxed);
                if d == 0 {
                    break;
                }
                let pay = d.min(add);
                if self
                    .debt
                    .compare_exchange(d, d - pay, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    add -= pay;
                }
            }
            self.sem.add_permits(add);
        } else if n < a.limit {
            let cut = (a.limit - n) as usize;
            let forgot = self.sem.forget_permits(cut);
            self.debt.fetch_add(cut - forgot, Ordering::AcqRel);
        }
        a.limit = n;
        self.g_limit.set(n.into());
        drop(a);
        self.dispatch();
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives free places to waiting `_auth`, one each: the oldest first while the oldest has
    /// waited less than [`lifo_after`] (a short queue is served in order), the newest first
    /// past it. In a storm the master answers slower than `_auth` come, the queue's oldest are
    /// all about to give up (their minions' `auth_timeout`), and an oldest-first gate would send
    /// the master only `_auth` whose minions leave before the answer: the newest still have
    /// their whole `auth_timeout` ahead (the adaptive LIFO of overloaded servers; the old ones
    /// reach `max_wait` in the queue and cost the master nothing).
    fn dispatch(&self) {
        let mut w = self.waiters();
        let now = Instant::now();
        let lifo = lifo_after(self.auth_timeout());
        while let Some((&oldest, first)) = w.map.first_key_value() {
            let Ok(p) = self.sem.clone().try_acquire_owned() else {
                break;
            };
            let id = if now.saturating_duration_since(first.since) < lifo {
                oldest
            } else {
                w.map.last_key_value().map_or(oldest, |(&id, _)| id)
            };
            let Some(waiter) = w.map.remove(&id) else {
                break;
            };
            // A waiter that went in the meantime gives the place back (to the next, this loop).
            let _ = waiter.tx.send(p);
        }
    }

    fn auth_timeout(&self) -> Duration {
        Duration::from_millis(self.auth_timeout_ms.load(Ordering::Relaxed))
    }

    /// Asks to send one `_auth` to this master: admitted at once, queued (wait on the
    /// [`Queued`]), or dropped when `max_queue` are waiting already.
    pub fn enter(self: &Arc<Self>, max_queue: u32) -> Result<Entry, Dropped> {
        let mut w = self.waiters();
        if let Ok(p) = self.sem.clone().try_acquire_owned() {
            drop(w);
            self.wait.observe(0.0);
            return Ok(Entry::Admitted(self.admit(p)));
        }
        if self.queued.load(Ordering::Relaxed) >= max_queue as usize {
            self.dropped[2].inc();
            return Err(Dropped::QueueFull);
        }
        let since = Instant::now();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let id = w.next;
        w.next += 1;
        w.map.insert(id, Waiter { since, tx });
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.g_queued.inc();
        Ok(Entry::Queued(Queued {
            gate: self.clone(),
            id,
            since,
            rx,
            queued: true,
        }))
    }

    fn admit(self: &Arc<Self>, p: OwnedSemaphorePermit) -> AuthPermit {
        self.admitted.inc();
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.g_in_flight.inc();
        AuthPermit {
            gate: self.clone(),
            permit: Some(p),
            since: Instant::now(),
        }
    }

    /// Auto: one answer took `took`, with `in_flight` out (this one included).
    fn adapt(&self, took: Duration, in_flight: usize) {
        if !self.auto.load(Ordering::Relaxed) {
            return;
        }
        let t = Duration::from_millis(self.auth_timeout_ms.load(Ordering::Relaxed));
        let mut next = None;
        {
            let mut a = self.adapt.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if took > t / 4 {
                if a.last_cut.is_none_or(|c| now - c >= t / 4) {
                    a.last_cut = Some(now);
                    a.grown = 0;
                    next = Some((a.limit - a.limit / 4).max(1));
                }
            } else if took <= t / 8 && in_flight * 2 >= a.limit as usize {
                a.grown += 1;
                if a.grown >= a.limit {
                    a.grown = 0;
                    next = Some((a.limit + 1).min(AUTO_MAX));
                }
            }
        }
        if let Some(n) = next {
            self.set_limit(n);
        }
    }
}

/// The outcome of [`Gate::enter`].
pub enum Entry {
    Admitted(AuthPermit),
    Queued(Queued),
}

/// How long the oldest waiting `_auth` may have waited before the newest go first
/// ([`Gate::dispatch`]): a quarter of the minions' `auth_timeout`.
pub fn lifo_after(auth_timeout: Duration) -> Duration {
    auth_timeout / 4
}

/// The waiting `_auth`, by arrival number.
#[derive(Default)]
struct Waiters {
    next: u64,
    map: std::collections::BTreeMap<u64, Waiter>,
}

struct Waiter {
    since: Instant,
    tx: tokio::sync::oneshot::Sender<OwnedSemaphorePermit>,
}

/// A held `_auth` waiting for its master's gate. Dropped before it is admitted, it leaves the
/// queue and counts as `minion_closed` unless [`Queued::abandon`] said otherwise.
pub struct Queued {
    gate: Arc<Gate>,
    id: u64,
    since: Instant,
    /// Where [`Gate::dispatch`] sends this one's place.
    rx: tokio::sync::oneshot::Receiver<OwnedSemaphorePermit>,
    /// Still counted in the queue.
    queued: bool,
}

impl Queued {
    /// When it was queued.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// Waits for a permit until `since + max_wait`. Cancel-safe: its place in the queue is
    /// kept across calls until it is admitted or dropped.
    pub async fn wait(&mut self, max_wait: Duration) -> Result<AuthPermit, Dropped> {
        let until = self.since + max_wait;
        match tokio::time::timeout_at(until, &mut self.rx).await {
            Ok(Ok(p)) => {
                let g = &self.gate;
                let late = self.since.elapsed()
                    + Duration::from_millis(g.latency_ms.load(Ordering::Relaxed));
                if late >= g.auth_timeout() {
                    // Its minion gives up before the master could answer: the place goes on.
                    drop(p);
                    g.dispatch();
                    self.leave(Some(Dropped::MaxWait));
                    return Err(Dropped::MaxWait);
                }
                self.leave(None);
                self.gate.wait.observe(self.since.elapsed().as_secs_f64());
                Ok(self.gate.admit(p))
            }
            // The gate never drops a waiter's sender without sending; a timeout either way.
            Ok(Err(_)) | Err(_) => {
                self.withdraw();
                self.leave(Some(Dropped::MaxWait));
                Err(Dropped::MaxWait)
            }
        }
    }

    /// Leaves the gate's list of waiters; a place it was given meanwhile goes to the next.
    fn withdraw(&mut self) {
        let listed = self.gate.waiters().map.remove(&self.id).is_some();
        if !listed {
            // Sent under the lock just taken: it is there, or was received already.
            if let Ok(p) = self.rx.try_recv() {
                drop(p);
                self.gate.dispatch();
            }
        }
    }

    /// Leaves the queue once; `why` is counted as a drop.
    fn leave(&mut self, why: Option<Dropped>) {
        if std::mem::take(&mut self.queued) {
            self.gate.queued.fetch_sub(1, Ordering::Relaxed);
            self.gate.g_queued.dec();
            if let Some(d) = why {
                self.gate.dropped[d as usize].inc();
            }
        }
    }

    /// Leaves the queue: `Some(reason)` is counted, `None` (saltgate closed the session) is not.
    pub fn abandon(mut self, why: Option<Dropped>) {
        self.leave(why);
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.withdraw();
        self.leave(Some(Dropped::MinionClosed));
    }
}

/// One admitted `_auth`: its place at the master, given back when dropped.
pub struct AuthPermit {
    gate: Arc<Gate>,
    permit: Option<OwnedSemaphorePermit>,
    since: Instant,
}

impl AuthPermit {
    /// The master's reply is complete: the latency feeds `auto`; the place is given back.
    pub fn answered(self) {
        let n = self.gate.in_flight();
        let took = self.since.elapsed();
        let ms = took.as_millis() as u64;
        let _ = self
            .gate
            .latency_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    ms.max(1)
                } else {
                    (old * 7 + ms) / 8
                })
            });
        self.gate.adapt(took, n);
    }

    /// Its minion left before the answer: counted (the place stays taken, [`super::auth_drain`]).
    pub fn orphaned(&self) {
        self.gate.orphaned.inc();
    }
}

impl Drop for AuthPermit {
    fn drop(&mut self) {
        self.gate.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.gate.g_in_flight.dec();
        let Some(p) = self.permit.take() else { return };
        let owed = self
            .gate
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |d| d.checked_sub(1))
            .is_ok();
        if owed {
            p.forget();
        } else {
            drop(p);
            self.gate.dispatch();
        }
    }
}

/// Every master's gate, created on first use (held by the data plane).
pub struct AuthLimits {
    metrics: AuthMetrics,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

impl AuthLimits {
    pub fn new(r: &Registry) -> Self {
        AuthLimits {
            metrics: AuthMetrics::new(r),
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// The gate of `master`, following `cfg` (a reload may have changed it).
    pub fn gate(&self, master: &str, cfg: &AuthLimit) -> Arc<Gate> {
        let mut g = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        match g.get(master) {
            Some(gate) => {
                let fixed = match cfg.max_in_flight {
                    MaxInFlight::Fixed(n) => Some(n),
                    MaxInFlight::Auto => None,
                };
                let auto = gate.auto.load(Ordering::Relaxed);
                if fixed.is_some_and(|n| auto || n != gate.limit()) || (fixed.is_none() && !auto) {
                    gate.configure(cfg);
                }
                gate.auth_timeout_ms
                    .store(cfg.auth_timeout.as_millis() as u64, Ordering::Relaxed);
                gate.clone()
            }
            None => {
                let gate = Gate::new(master, cfg, &self.metrics);
                g.insert(master.to_owned(), gate.clone());
                gate
            }
        }
    }

    /// Every gate's figures, by master name.
    pub fn views(&self) -> Vec<GateView> {
        let g = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<GateView> = g.values().map(|g| g.view()).collect();
        v.sort_by(|a, b| a.master.cmp(&b.master));
        v
    }
}

#[cfg(test)]
#[path = "auth_limit_tests.rs"]
mod tests;
