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
    /// This host is out of descriptors: every probe fails with EMFILE before reaching the master.
    NoDescriptors,
    /// Starting: the handshake comes at once, every ping is queued, and the workers answer the
    /// queue in order from `serves_at` on, `per_ping` each (abandoned pings included).
    Queues {
        serves_at: Instant,
        per_ping: Duration,
    },
}

struct FakeProber {
    shape: Mutex<Shape>,
    probes: std::sync::atomic::AtomicU64,
    /// When the last queued ping is answered (for [`Shape::Queues`]).
    last_answer: Mutex<Option<Instant>>,
}

impl FakeProber {
    fn new(shape: Shape) -> Arc<Self> {
        Arc::new(Self {
            shape: Mutex::new(shape),
            probes: Default::default(),
            last_answer: Mutex::new(None),
        })
    }
    fn count(&self) -> u64 {
        self.probes.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn set(&self, shape: Shape) {
        *self.shape.lock().unwrap() = shape;
    }
}

impl Prober for FakeProber {
    fn probe(
        &self,
        _addr: SocketAddr,
        _role: Role,
        h: HealthSettings,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
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
            _ => None,
        };
        Box::pin(async move {
            match shape {
                Shape::Queues { .. } => {
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
                    Err("no answer".into())
                }
                Shape::Stopped => {
                    tokio::time::sleep(h.handshake_timeout.min(h.timeout)).await;
                    Err("no ZMTP handshake".into())
                }
                Shape::Refused => Err("connect: refused".into()),
                Shape::NoDescriptors => Err(format!(
                    "{LOCAL_RESOURCE}: connect: Too many open files (os error 24)"
                )),
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

/// A restarted master whose workers start long after its ports: one ping is kept outstanding on
/// the DOWN port (not one per check, each lining up behind the stale ones), and its answer passes
/// the check as soon as it comes: UP within `(rise - 1) x fastinter` (plus the answers' own time)
/// of the workers' start, well inside the interop suite's bound `rise x downinter + 2 s`.
#[tokio::test(start_paused = true)]
async fn a_down_ports_ping_is_kept_outstanding_and_its_first_answer_passes_the_check() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let per_ping = Duration::from_millis(300);
    for wait_s in [7u64, 23, 40] {
        let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
        let m = master(h);
        let mut flips = checks(&m, prober.clone());
        settle_up(&mut flips, &m).await;
        prober.set(Shape::Refused);
        assert_eq!(flips.recv().await.unwrap().1, Flip::Down);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let serves_at = Instant::now() + Duration::from_secs(wait_s);
        prober.set(Shape::Queues {
            serves_at,
            per_ping,
        });
        let before = prober.count();
        tokio::time::sleep_until(serves_at - Duration::from_millis(1)).await;
        assert_eq!(
            prober.count() - before,
            1,
            "wait {wait_s} s: one ping outstanding while the workers are not up, not one per check"
        );
        let (at, flip) = flips.recv().await.unwrap();
        assert_eq!(flip, Flip::Up);
        let bound = h.fastinter * (h.rise - 1) + per_ping * 2 + Duration::from_millis(50);
        assert!(
            at - serves_at <= bound,
            "wait {wait_s} s: UP {:?} after the workers started, bound {bound:?}",
            at - serves_at
        );
        assert!(at - serves_at <= h.downinter * h.rise + Duration::from_secs(2));
        m.checks_stop.cancel();
    }
}

/// A kept ping that is never answered is replaced after [`KEPT_PING_LIMIT`]; a stopped master
/// (no handshake) keeps nothing, so its checks go on every `downinter`.
#[tokio::test(start_paused = true)]
async fn a_kept_ping_is_replaced_after_its_limit_and_a_stopped_master_keeps_none() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut flips = checks(&m, prober.clone());
    settle_up(&mut flips, &m).await;
    prober.set(Shape::Refused);
    assert_eq!(flips.recv().await.unwrap().1, Flip::Down);
    prober.set(Shape::Queues {
        serves_at: Instant::now() + Duration::from_secs(100_000),
        per_ping: Duration::from_millis(1),
    });
    let before = prober.count();
    tokio::time::sleep(KEPT_PING_LIMIT * 3 + Duration::from_secs(2)).await;
    let sent = prober.count() - before;
    assert!((3..=4).contains(&sent), "{sent} pings in 3 limits");
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
