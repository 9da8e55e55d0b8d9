//! The check loop's schedule on paused time: how long a hung master takes to go DOWN, that a busy
//! one does not, and how soon a restarted one comes back UP. The prober below plays a master whose
//! behaviour the test changes at a known instant; each probe takes as long as the real one would
//! (the handshake deadline for a stopped master, the ping's latency for a busy one).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saltgate_config::{HealthSettings, MasterConfig, Probe, Role};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;

/// What the fake master does when probed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// Answers after this long (a busy master's ping: slow, within the timeout or not).
    Answers(Duration),
    /// SIGSTOPped: the kernel accepts, nothing greets; the probe gives up at the handshake deadline.
    Stopped,
    /// Not running: connection refused at once.
    Refused,
    /// A publish port that accepts and sends no greeting within `timeout` (stopped, hung, or its
    /// publish server saturated).
    NoGreeting,
    /// A publish port whose connect does not complete within `timeout` (its accept backlog full,
    /// or the host gone).
    NoConnect,
    /// A publish port that greets after this long (on time, late, or not within `timeout`).
    Greets(Duration),
    /// This host is out of descriptors: every probe fails with EMFILE before reaching the master.
    NoDescriptors,
    /// Starting: the handshake comes at once, every ping is queued, and the workers answer the
    /// queue in order from `serves_at` on, `per_ping` each (abandoned pings included).
    Queues {
        serves_at: Instant,
        per_ping: Duration,
    },
    /// Starting, and loses the first ping it gets (sent just before Salt's request gate opened):
    /// that one is never answered; every later one is answered from `serves_at` on.
    SwallowsFirst { serves_at: Instant },
    /// Restarted under its minions' `_auth` storm: loses the first ping (as `SwallowsFirst`),
    /// then answers one queue in order from `serves_at` on, `per_item` a request. `backlog` of
    /// work is queued already when the shape is set, and more comes at `load_per_s` requests a
    /// second (the minions'); abandoned pings are worked through too.
    Backlog {
        serves_at: Instant,
        backlog: Duration,
        per_item: Duration,
        load_per_s: f64,
    },
}

struct FakeProber {
    shape: Mutex<Shape>,
    probes: std::sync::atomic::AtomicU64,
    /// When the last queued ping is answered (for [`Shape::Queues`] and [`Shape::Backlog`]).
    last_answer: Mutex<Option<Instant>>,
    /// When [`Shape::Backlog`]'s load was last added to its queue.
    load_until: Mutex<Option<Instant>>,
    /// Whether [`Shape::SwallowsFirst`] has swallowed its ping.
    swallowed: std::sync::atomic::AtomicBool,
    /// Probes in flight (their futures not yet dropped), and the most there ever were at once.
    live: Arc<std::sync::atomic::AtomicU64>,
    max_live: Arc<std::sync::atomic::AtomicU64>,
}

/// Counts a probe in flight until its future is dropped.
struct Live(Arc<std::sync::atomic::AtomicU64>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl FakeProber {
    fn new(shape: Shape) -> Arc<Self> {
        Arc::new(Self {
            shape: Mutex::new(shape),
            probes: Default::default(),
            last_answer: Mutex::new(None),
            load_until: Mutex::new(None),
            swallowed: Default::default(),
            live: Default::default(),
            max_live: Default::default(),
        })
    }
    fn max_live(&self) -> u64 {
        self.max_live.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn count(&self) -> u64 {
        self.probes.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn set(&self, shape: Shape) {
        if let Shape::Backlog {
            serves_at, backlog, ..
        } = shape
        {
            *self.last_answer.lock().unwrap() = Some(serves_at + backlog);
            *self.load_until.lock().unwrap() = Some(Instant::now());
        }
        *self.shape.lock().unwrap() = shape;
        self.swallowed
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.max_live.store(
            self.live.load(std::sync::atomic::Ordering::SeqCst),
            std::sync::atomic::Ordering::SeqCst,
        );
    }
}

impl FakeProber {
    /// [`Shape::Backlog`]: queues one request now (the minions' load since the last one first),
    /// and returns when it is answered.
    fn enqueue(&self, shape: Shape) -> Instant {
        let Shape::Backlog {
            serves_at,
            per_item,
            load_per_s,
            ..
        } = shape
        else {
            unreachable!("only the backlog shape queues")
        };
        let now = Instant::now();
        let mut last = self.last_answer.lock().unwrap();
        let mut since = self.load_until.lock().unwrap();
        let load = (now - since.unwrap_or(now)).as_secs_f64() * load_per_s;
        let queued = last.unwrap_or(serves_at).max(serves_at) + per_item.mul_f64(load);
        let at = queued.max(now) + per_item;
        *last = Some(at);
        *since = Some(now);
        at
    }

    /// Another client's ping (the interop suite's own, one at a time) into the backlog's queue:
    /// when the master answers it.
    fn queue_ping(&self) -> Instant {
        let shape = *self.shape.lock().unwrap();
        self.enqueue(shape)
    }
}

impl Prober for FakeProber {
    fn probe(
        &self,
        _addr: SocketAddr,
        _role: Role,
        h: HealthSettings,
    ) -> Pin<Box<dyn Future<Output = Result<(), CheckFailure>> + Send + '_>> {
        let shape = *self.shape.lock().unwrap();
        self.probes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer_at = match shape {
            Shape::Queues {
                serves_at,
                per_ping,
            } => {
                let mut last = self.last_answer.lock().unwrap();
                let at = last.unwrap_or(serves_at).max(serves_at).max(Instant::now()) + per_ping;
                *last = Some(at);
                Some(at)
            }
            Shape::Backlog { .. } => Some(self.enqueue(shape)),
            _ => None,
        };
        let swallow = matches!(shape, Shape::SwallowsFirst { .. } | Shape::Backlog { .. })
            && !self
                .swallowed
                .swap(true, std::sync::atomic::Ordering::SeqCst);
        let live = self.live.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        self.max_live
            .fetch_max(live, std::sync::atomic::Ordering::SeqCst);
        let guard = Live(self.live.clone());
        Box::pin(async move {
            let _guard = guard;
            match shape {
                Shape::SwallowsFirst { serves_at } => {
                    let deadline = Instant::now() + h.timeout;
                    let at = serves_at.max(Instant::now()) + Duration::from_millis(20);
                    if swallow || at > deadline {
                        tokio::time::sleep_until(deadline).await;
                        Err("no answer".into())
                    } else {
                        tokio::time::sleep_until(at).await;
                        Ok(())
                    }
                }
                Shape::Backlog { .. } if swallow => {
                    tokio::time::sleep(h.timeout).await;
                    Err("no answer".into())
                }
                Shape::Queues { .. } | Shape::Backlog { .. } => {
                    let at = answer_at.expect("queued");
                    let deadline = Instant::now() + h.timeout;
                    tokio::time::sleep_until(at.min(deadline)).await;
                    if at <= deadline {
                        Ok(())
                    } else {
                        Err("no answer".into())
                    }
                }
                Shape::Answers(d) if d <= h.timeout => {
                    tokio::time::sleep(d).await;
                    Ok(())
                }
                Shape::Answers(_) => {
                    tokio::time::sleep(h.timeout).await;
                    // as the real probe says it (check.rs)
                    Err(CheckFailure::no_answer(format_args!(
                        "salt ping: ZMTP handshake done, no answer within {:?}",
                        h.timeout
                    )))
                }
                Shape::Stopped => {
                    tokio::time::sleep(h.handshake_timeout.min(h.timeout)).await;
                    Err("no ZMTP handshake".into())
                }
                Shape::NoGreeting | Shape::NoConnect => {
                    let d = h.timeout;
                    tokio::time::sleep(d).await;
                    // as the real probe says it (check.rs)
                    Err(CheckFailure::no_greeting(
                        if matches!(shape, Shape::NoGreeting) {
                            format!("ZMTP greeting: connected, no ZMTP handshake within {d:?}")
                        } else {
                            format!("ZMTP greeting: connect: no answer within {d:?}")
                        },
                    ))
                }
                Shape::Greets(d) if d > h.timeout => {
                    tokio::time::sleep(h.timeout).await;
                    Err(CheckFailure::no_greeting(
                        "ZMTP greeting: no ZMTP handshake",
                    ))
                }
                Shape::Greets(d) => {
                    tokio::time::sleep(d).await;
                    let handshake = h.handshake_timeout.min(h.timeout);
                    if d > handshake {
                        Err(CheckFailure::late_greeting("ZMTP greeting", d, handshake))
                    } else {
                        Ok(())
                    }
                }
                Shape::Refused => Err("connect: refused".into()),
                Shape::NoDescriptors => Err(CheckFailure::local_resource(format!(
                    "{LOCAL_RESOURCE}: connect: Too many open files (os error 24)"
                ))),
            }
        })
    }
}

fn master(health: HealthSettings) -> Arc<Master> {
    let cfg = MasterConfig {
        name: "m1".into(),
        host: "127.13.0.1".into(),
        publish_port: 4505,
        request_port: 4506,
        weight: 1,
        maxconn: None,
        backup: false,
        disabled: false,
        check: true,
        health,
    };
    let addrs = [
        "127.13.0.1:4505".parse().unwrap(),
        "127.13.0.1:4506".parse().unwrap(),
    ];
    Arc::new(Master::new(cfg, addrs, &CancellationToken::new()))
}

/// Starts the request port's check loop; returns its flips, each with the (paused) time it came.
fn checks(m: &Arc<Master>, prober: Arc<FakeProber>) -> mpsc::UnboundedReceiver<(Instant, Flip)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<MasterEvent>();
    tokio::spawn(run_port_checks(
        m.clone(),
        Role::Request,
        prober,
        tx,
        Metrics::new(),
    ));
    let (ftx, frx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let _ = ftx.send((Instant::now(), ev.flip));
        }
    });
    frx
}

/// Lets the first checks confirm the master UP (a first success does at once).
async fn settle_up(flips: &mut mpsc::UnboundedReceiver<(Instant, Flip)>, m: &Master) {
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(m.is_up(), "the master is UP before the test begins");
    while flips.try_recv().is_ok() {}
}

#[tokio::test(start_paused = true)]
async fn a_stopped_master_is_down_within_interval_plus_fall_handshake_deadlines() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let bound = h.interval + h.handshake_timeout * h.fall;
    assert_eq!(
        bound,
        Duration::from_secs(4),
        "the documented default bound"
    );
    // Stop the master at several phases of the check schedule: the worst is just after a check
    // started (the next starts a full interval later).
    for offset_ms in [0u64, 10, 250, 500, 990] {
        let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
        let m = master(h);
        let mut flips = checks(&m, prober.clone());
        settle_up(&mut flips, &m).await;
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        let t0 = Instant::now();
        prober.set(Shape::Stopped);
        let (at, flip) = flips.recv().await.unwrap();
        assert_eq!(flip, Flip::Down);
        let took = at - t0;
        assert!(
            took <= bound + Duration::from_millis(10),
            "offset {offset_ms} ms: DOWN after {took:?}, bound {bound:?}"
        );
        assert!(
            took >= h.handshake_timeout * h.fall,
            "offset {offset_ms} ms: DOWN after {took:?}: fall checks of a full deadline each"
        );
        m.checks_stop.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn a_busy_master_whose_ping_is_slow_but_within_the_timeout_stays_up() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut flips = checks(&m, prober.clone());
    settle_up(&mut flips, &m).await;
    // Busy: every ping takes 4.5 s (the handshake is prompt), for ten minutes.
    prober.set(Shape::Answers(Duration::from_millis(4500)));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(m.is_up());
    assert!(
        flips.try_recv().is_err(),
        "no flip for a master that answers within the timeout"
    );
    // Past the timeout, it is a failure like any other: DOWN after `fall` of them.
    prober.set(Shape::Answers(Duration::from_secs(60)));
    let t0 = Instant::now();
    let (at, flip) = flips.recv().await.unwrap();
    assert_eq!(flip, Flip::Down);
    assert!(at - t0 <= h.timeout * (h.fall + 1), "{:?}", at - t0);
    m.checks_stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_restarted_master_is_up_within_downinter_and_rise_fastinter_of_its_first_answer() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let bound = h.downinter + h.fastinter * (h.rise - 1);
    for offset_ms in [0u64, 100, 400, 700, 999] {
        let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
        let m = master(h);
        let mut flips = checks(&m, prober.clone());
        settle_up(&mut flips, &m).await;
        // Killed: refused at once, DOWN; then a half-started master (accepts, greets nothing) for
        // a while, then it answers.
        prober.set(Shape::Refused);
        assert_eq!(flips.recv().await.unwrap().1, Flip::Down);
        tokio::time::sleep(Duration::from_secs(20)).await;
        prober.set(Shape::Stopped);
        tokio::time::sleep(Duration::from_secs(5) + Duration::from_millis(offset_ms)).await;
        let t0 = Instant::now();
        prober.set(Shape::Answers(Duration::from_millis(20)));
        let (at, flip) = flips.recv().await.unwrap();
        assert_eq!(flip, Flip::Up);
        let took = at - t0;
        assert!(
            took <= bound + Duration::from_millis(100),
            "offset {offset_ms} ms: UP {took:?} after the first answer, bound {bound:?}"
        );
        m.checks_stop.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn intervals_count_from_the_start_of_the_previous_check() {
    // A steady UP master whose checks take 300 ms: one check per `interval`, not per
    // `interval + 300 ms`.
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(300)));
    let m = master(h);
    let _flips = checks(&m, prober.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = prober.count();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let seen = prober.count() - before;
    assert!(
        (59..=61).contains(&seen),
        "{seen} checks in 60 s with interval {:?}",
        h.interval
    );
    m.checks_stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_sessions_nudge_brings_the_next_check_forward_to_fastinter() {
    let h = HealthSettings {
        probe: Probe::Salt,
        interval: Duration::from_secs(10),
        ..HealthSettings::default()
    };
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let _flips = checks(&m, prober.clone());
    // Just after a check began: the next is 10 s away.
    let n = prober.count();
    while prober.count() == n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let n = prober.count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(prober.count(), n, "nothing before the interval");
    m.upstream.nudge_check(Role::Request);
    m.upstream.nudge_check(Role::Request);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        prober.count(),
        n + 1,
        "a nudge: checked at once (fastinter has passed)"
    );
    // A burst of nudges costs one early check, and the schedule goes on from it.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(prober.count(), n + 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(prober.count(), n + 2);
    m.checks_stop.cancel();
}

/// Runs the checks of `m`'s `role` port; returns its flips.
fn port_checks(
    m: &Arc<Master>,
    role: Role,
    prober: Arc<FakeProber>,
    metrics: Arc<Metrics>,
) -> mpsc::UnboundedReceiver<MasterEvent> {
    let (tx, rx) = mpsc::unbounded_channel::<MasterEvent>();
    tokio::spawn(run_port_checks(m.clone(), role, prober, tx, metrics));
    rx
}

/// Takes the port of a fresh master DOWN (refused at once) and returns its flips.
async fn down_master(
    h: HealthSettings,
) -> (
    Arc<FakeProber>,
    Arc<Master>,
    mpsc::UnboundedReceiver<(Instant, Flip)>,
) {
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut flips = checks(&m, prober.clone());
    settle_up(&mut flips, &m).await;
    prober.set(Shape::Refused);
    assert_eq!(flips.recv().await.unwrap().1, Flip::Down);
    (prober, m, flips)
}

/// Never more than [`MAX_OUTSTANDING_PINGS`] pings were outstanding at once.
fn assert_few_outstanding(prober: &FakeProber) {
    assert!(
        prober.max_live() <= MAX_OUTSTANDING_PINGS as u64,
        "{} pings outstanding at once",
        prober.max_live()
    );
}

/// The interop suite's bound: UP within `rise x downinter + 2 s` of the master's first answer.
fn interop_bound(h: &HealthSettings) -> Duration {
    h.downinter * h.rise + Duration::from_secs(2)
}

/// A restarted master whose workers start long after its ports, and answer the pings queued
/// meanwhile in order, `per_ping` each (the dropped ones too): the kept ping is the oldest, so
/// it is answered first; fresh pings beside it at doubling gaps, a few outstanding at most; UP
/// once the `rise` check's ping is answered behind the stale ones.
#[tokio::test(start_paused = true)]
async fn a_down_ports_ping_is_kept_outstanding_and_its_first_answer_passes_the_check() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let per_ping = Duration::from_millis(30);
    for wait_s in [7u64, 23, 40] {
        let (prober, m, mut flips) = down_master(h).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let serves_at = Instant::now() + Duration::from_secs(wait_s);
        prober.set(Shape::Queues {
            serves_at,
            per_ping,
        });
        let before = prober.count();
        tokio::time::sleep_until(serves_at - Duration::from_millis(1)).await;
        let sent = prober.count() - before;
        let most = 2 + wait_s.min(FRESH_PING_WINDOW.as_secs()) / (h.downinter * h.rise).as_secs();
        assert!(
            sent <= most,
            "wait {wait_s} s: {sent} pings while the workers were not up (at most {most}: one per check of rise x downinter, for FRESH_PING_WINDOW)"
        );
        assert_few_outstanding(&prober);
        let (at, flip) = flips.recv().await.unwrap();
        assert_eq!(flip, Flip::Up);
        // the kept ping first, then the `rise` check's ping behind the stale ones
        let bound =
            per_ping * (sent as u32 + 2) + h.fastinter * (h.rise - 1) + Duration::from_millis(50);
        assert!(
            at - serves_at <= bound,
            "wait {wait_s} s: UP {:?} after the workers started, bound {bound:?}",
            at - serves_at
        );
        assert!(at - serves_at <= interop_bound(&h));
        m.checks_stop.cancel();
    }
}

/// Issue 10 part 3: a ping sent just before Salt opened its request gate is dropped by the
/// master and never answered. The fresh ping sent beside it is answered once the master serves:
/// UP within `rise x downinter + 2 s` of the master's first answer, wherever that falls in the
/// check schedule (before the fresh pings, UP came only when the lost ping reached its 60 s
/// limit).
#[tokio::test(start_paused = true)]
async fn a_lost_kept_ping_does_not_delay_up_a_fresh_one_beside_it_is_answered() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    for serves_in_ms in [
        0u64, 300, 1_000, 2_500, 4_999, 5_200, 9_000, 29_000, 100_000,
    ] {
        let (prober, m, mut flips) = down_master(h).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        let serves_at = Instant::now() + Duration::from_millis(serves_in_ms);
        prober.set(Shape::SwallowsFirst { serves_at });
        let (at, flip) = flips.recv().await.unwrap();
        assert_eq!(flip, Flip::Up);
        let took = at - serves_at;
        assert!(
            took <= interop_bound(&h),
            "serves {serves_in_ms} ms after the lost ping: UP {took:?} after the master first answers, bound {:?}",
            interop_bound(&h)
        );
        assert_few_outstanding(&prober);
        m.checks_stop.cancel();
    }
}

/// Interop scenario 4 in CI: the restarted member lost saltgate's kept ping at its request gate,
/// then worked through its minions' `_auth` backlog for 30 s. The suite's own ping, sent beside
/// the lost one, was answered after that backlog; saltgate's fresh ping, replaced by a newer one
/// each check, went back to the end of the queue each time, and UP came 8.2 s after the suite's
/// answer. Fresh pings now keep their place: UP within `rise x downinter + 2 s` of the answer to a
/// ping sent when saltgate's first one was.
#[tokio::test(start_paused = true)]
async fn a_fresh_ping_keeps_its_place_in_a_restarted_masters_auth_backlog() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    for (backlog_s, load_per_s) in [(20u64, 14.0), (5, 18.0), (40, 10.0), (0, 0.0)] {
        let (prober, m, mut flips) = down_master(h).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        prober.set(Shape::Backlog {
            serves_at: Instant::now() + Duration::from_secs(1),
            backlog: Duration::from_secs(backlog_s),
            per_item: Duration::from_millis(50),
            load_per_s,
        });
        // the suite's ping goes out with saltgate's first one (the one the gate loses)
        let n = prober.count();
        while prober.count() == n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answered = prober.queue_ping();
        let (at, flip) = flips.recv().await.unwrap();
        assert_eq!(flip, Flip::Up);
        let after = at.saturating_duration_since(answered);
        assert!(
            after <= interop_bound(&h),
            "backlog {backlog_s} s, load {load_per_s}/s: UP {after:?} after the suite's ping was answered, bound {:?}",
            interop_bound(&h)
        );
        assert_few_outstanding(&prober);
        m.checks_stop.cancel();
    }
}

/// A master that never answers (its workers never start): fresh pings beside the kept one for
/// [`FRESH_PING_WINDOW`] at doubling gaps (2, 4, 8, 16, 24 s after it with checks every 2 s), then none
/// until the kept ones leave at [`KEPT_PING_LIMIT`]; never more than [`MAX_OUTSTANDING_PINGS`]
/// outstanding. A stopped master (no handshake) keeps nothing, so its checks go on every
/// `downinter`.
#[tokio::test(start_paused = true)]
async fn a_few_pings_outstanding_at_most_and_a_stopped_master_keeps_none() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let (prober, m, _flips) = down_master(h).await;
    prober.set(Shape::Queues {
        serves_at: Instant::now() + Duration::from_secs(100_000),
        per_ping: Duration::from_millis(1),
    });
    let before = prober.count();
    tokio::time::sleep(KEPT_PING_LIMIT - Duration::from_secs(5)).await;
    let sent = prober.count() - before;
    assert_eq!(
        sent,
        MAX_OUTSTANDING_PINGS as u64,
        "pings before the kept one's limit: the kept one and five fresh ones, at doubling gaps within FRESH_PING_WINDOW"
    );
    assert_eq!(prober.max_live(), MAX_OUTSTANDING_PINGS as u64);
    // the kept one leaves at its limit: the next window begins
    let before = prober.count();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        prober.count() > before,
        "pings again after the kept one's limit"
    );
    assert_eq!(prober.max_live(), MAX_OUTSTANDING_PINGS as u64);
    prober.set(Shape::Stopped);
    tokio::time::sleep(KEPT_PING_LIMIT + Duration::from_secs(1)).await;
    let before = prober.count();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sent = prober.count() - before;
    // downinter 1 s, each check a 1 s handshake deadline: about one a second, none kept
    assert!(sent >= 8, "{sent} checks in 10 s of a stopped master");
    assert!(!m.is_up());
    m.checks_stop.cancel();
}

/// Issue 12 item 1: probes that fail for want of a local resource (the reserve's retry too) are
/// not checks of the master: a healthy master is not marked DOWN however long it lasts; the
/// reserve is tried on each such check; a real failure afterwards counts at once.
#[tokio::test(start_paused = true)]
async fn a_local_resource_shortage_never_marks_a_master_down() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut flips = checks(&m, prober.clone());
    settle_up(&mut flips, &m).await;
    prober.set(Shape::NoDescriptors);
    let before = prober.count();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(flips.try_recv().is_err(), "a flip during the shortage");
    assert!(m.is_up());
    let probes = prober.count() - before;
    // Checks at `fastinter` (500 ms), each tried again on a reserved descriptor.
    assert!(probes >= 2 * 100, "{probes} probes in 60 s");
    prober.set(Shape::Refused);
    let (_, flip) = tokio::time::timeout(h.interval * (h.fall + 2), flips.recv())
        .await
        .expect("DOWN once the master really refuses")
        .unwrap();
    assert_eq!(flip, Flip::Down);
}

/// The busy rule: checks a busy master fails are not counted while it answers its minions.
#[path = "check_busy_tests.rs"]
mod busy;
