//! The busy rule of the checks (issue 25): a master that answers its minions is busy, not hung.

use super::*;

/// Issue 25: a master busy with an `_auth` storm answers its minions but not the health ping in
/// time. While request sessions see it complete replies, such checks are not counted: it stays
/// UP however long the storm lasts. Once it answers nobody (its workers stuck), the same checks
/// take it DOWN in `fall` checks; a stopped master goes DOWN at the handshake stage even while
/// answers were seen just before.
#[tokio::test(start_paused = true)]
async fn a_busy_master_that_answers_its_minions_is_not_marked_down() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let metrics = Metrics::new();
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut rx = port_checks(&m, Role::Request, prober.clone(), metrics.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(m.is_up());
    // The storm: every ping waits past the timeout; the minions' replies keep coming.
    prober.set(Shape::Answers(h.timeout * 3));
    let answers = minions_answered(&m);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(m.is_up(), "{:?}", m.last_check(Role::Request));
    assert!(rx.try_recv().is_err(), "no flip while the master answers");
    let busy = metrics
        .check_busy
        .with_label_values(&["m1", "request"])
        .get();
    assert!(busy >= 10, "{busy} checks not counted in 120 s");
    assert!(
        m.last_check(Role::Request)
            .detail
            .contains("busy, not hung"),
        "{:?}",
        m.last_check(Role::Request)
    );
    // Its workers stuck: no more answers; DOWN after `fall` timed-out checks.
    answers.abort();
    let t0 = Instant::now();
    let ev = rx.recv().await.unwrap();
    assert_eq!(ev.flip, Flip::Down);
    let took = t0.elapsed();
    let bound = (h.interval.max(h.timeout) + h.timeout) * (h.fall + 1);
    assert!(
        took <= bound,
        "DOWN {took:?} after the answers stopped, bound {bound:?}"
    );
    m.checks_stop.cancel();

    // Stopped just after an answer was seen: the handshake stage fails, which no answer excuses.
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut flips = checks(&m, prober.clone());
    settle_up(&mut flips, &m).await;
    m.upstream.saw_answer();
    prober.set(Shape::Stopped);
    let t0 = Instant::now();
    let (at, flip) = flips.recv().await.unwrap();
    assert_eq!(flip, Flip::Down);
    assert!(at - t0 <= h.interval + h.handshake_timeout * h.fall + Duration::from_millis(10));
    m.checks_stop.cancel();
}

/// Issue 25: a salt-master's publish server on a host saturated by 5,000 minions authenticating
/// missed the 1 s greeting deadline while its request workers answered. Such checks are not
/// counted while the master answers its minions, for at most `PUBLISH_BUSY_GRACE` after the
/// port's last passed check: a publish server hung on its own still goes DOWN, later. With no
/// answers (a stopped master) the late greetings count at once.
#[tokio::test(start_paused = true)]
async fn a_late_publish_greeting_from_a_master_that_answers_is_not_counted_for_a_while() {
    late_publish_port(Shape::NoGreeting).await;
    late_publish_port(Shape::NoConnect).await;
}

async fn late_publish_port(late: Shape) {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut rx = port_checks(&m, Role::Publish, prober.clone(), Metrics::new());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(m.is_up());
    let answers = minions_answered(&m);
    prober.set(late);
    let t0 = Instant::now();
    tokio::time::sleep(PUBLISH_BUSY_GRACE - Duration::from_secs(5)).await;
    assert!(
        rx.try_recv().is_err(),
        "no flip within the grace while the master answers"
    );
    assert!(
        m.last_check(Role::Publish)
            .detail
            .contains("busy, not hung"),
        "{:?}",
        m.last_check(Role::Publish)
    );
    // Past the grace the late greetings count, answers or not.
    let ev = rx.recv().await.unwrap();
    assert_eq!(ev.flip, Flip::Down);
    let took = t0.elapsed();
    let bound = PUBLISH_BUSY_GRACE + (h.interval + h.timeout) * (h.fall + 1);
    assert!(
        took >= PUBLISH_BUSY_GRACE && took <= bound,
        "DOWN {took:?} after the greetings stopped, expected within {PUBLISH_BUSY_GRACE:?}..{bound:?}"
    );
    answers.abort();
    m.checks_stop.cancel();

    // No answers from the master: late greetings count from the first.
    let prober = FakeProber::new(Shape::Answers(Duration::from_millis(5)));
    let m = master(h);
    let mut rx = port_checks(&m, Role::Publish, prober.clone(), Metrics::new());
    tokio::time::sleep(Duration::from_secs(5)).await;
    prober.set(late);
    let t0 = Instant::now();
    let ev = rx.recv().await.unwrap();
    assert_eq!(ev.flip, Flip::Down);
    // As fast as before the late greetings were waited for: each check fails at the handshake
    // deadline when the master answers nobody (a stopped master).
    let bound = h.interval + h.handshake_timeout * h.fall + Duration::from_millis(10);
    assert!(
        t0.elapsed() <= bound,
        "DOWN {:?} after, bound {bound:?}",
        t0.elapsed()
    );
    m.checks_stop.cancel();
}

/// Issue 25, the AES rotation storm at 5,000 minions: the publish server of a saturated
/// salt-master greeted late for longer than `PUBLISH_BUSY_GRACE`. A greeting that comes, late,
/// shows the publish server runs: while the master answers its minions, such checks are never
/// counted, however long it lasts. With no answers they count (a late greeting is still a failed
/// check), and one on time passes.
#[tokio::test(start_paused = true)]
async fn a_publish_server_that_greets_late_while_the_master_answers_is_never_marked_down() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let late = Shape::Greets(h.handshake_timeout + (h.timeout - h.handshake_timeout) / 2);
    let metrics = Metrics::new();
    let prober = FakeProber::new(Shape::Greets(Duration::from_millis(5)));
    let m = master(h);
    let mut rx = port_checks(&m, Role::Publish, prober.clone(), metrics.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(m.is_up());
    let answers = minions_answered(&m);
    prober.set(late);
    tokio::time::sleep(PUBLISH_BUSY_GRACE * 4).await;
    assert!(
        rx.try_recv().is_err(),
        "no flip while it greets late and the master answers"
    );
    let detail = m.last_check(Role::Publish).detail;
    assert!(
        detail.contains("busy, not hung") && detail.contains(LATE_GREETING),
        "{detail}"
    );
    let busy = metrics
        .check_busy
        .with_label_values(&["m1", "publish"])
        .get();
    assert!(
        busy >= 20,
        "{busy} checks not counted in {:?}",
        PUBLISH_BUSY_GRACE * 4
    );
    // The master answers nobody any more: the late greetings count.
    answers.abort();
    let t0 = Instant::now();
    let ev = rx.recv().await.unwrap();
    assert_eq!(ev.flip, Flip::Down);
    assert!(t0.elapsed() <= (h.interval + h.timeout) * (h.fall + 1));
    // On time again: UP.
    prober.set(Shape::Greets(Duration::from_millis(5)));
    let ev = rx.recv().await.unwrap();
    assert_eq!(ev.flip, Flip::Up);
    m.checks_stop.cancel();
}

/// The master completes a reply to a minion every 300 ms (as request sessions see it) until
/// the task is aborted.
fn minions_answered(m: &Arc<Master>) -> tokio::task::JoinHandle<()> {
    let m = m.clone();
    tokio::spawn(async move {
        loop {
            m.upstream.saw_answer();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// The grace for a publish port with no greeting at all counts from the last check its publish
/// server answered, late ones included: a saturated publish server that greets late, then not
/// at all for a while, then late again, stays UP while the master answers; one that stops
/// greeting for longer than the grace goes DOWN.
#[tokio::test(start_paused = true)]
async fn the_publish_grace_counts_from_the_last_greeting_late_or_not() {
    let h = HealthSettings {
        probe: Probe::Salt,
        ..HealthSettings::default()
    };
    let late = Shape::Greets(h.handshake_timeout + (h.timeout - h.handshake_timeout) / 2);
    let never = Shape::Greets(h.timeout * 2);
    let prober = FakeProber::new(Shape::Greets(Duration::from_millis(5)));
    let m = master(h);
    let mut rx = port_checks(&m, Role::Publish, prober.clone(), Metrics::new());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let answers = minions_answered(&m);
    let spell = PUBLISH_BUSY_GRACE * 2 / 3;
    for _ in 0..3 {
        prober.set(late);
        tokio::time::sleep(spell).await;
        prober.set(never);
        tokio::time::sleep(spell).await;
    }
    assert!(
        rx.try_recv().is_err(),
        "no flip: every silence was shorter than the grace, counted from the last late greeting"
    );
    let t0 = Instant::now();
    let ev = rx.recv().await.unwrap();
    assert_eq!(ev.flip, Flip::Down);
    let took = t0.elapsed() + spell;
    assert!(
        took >= PUBLISH_BUSY_GRACE
            && took <= PUBLISH_BUSY_GRACE + (h.interval + h.timeout) * (h.fall + 1),
        "DOWN {took:?} after the last greeting"
    );
    answers.abort();
    m.checks_stop.cancel();
}

use crate::select::test_peers::zmtp_greeter as greeter;

/// The real publish probe waits up to `timeout` for the greeting: on time it passes, late it
/// reports [`Stage::LateGreeting`] (what the busy rule excuses for as long as the master answers),
/// never [`Stage::NoGreeting`] (excused only within the grace).
#[tokio::test]
async fn the_publish_probe_tells_a_late_greeting_from_none() {
    let h = HealthSettings {
        probe: Probe::Salt,
        handshake_timeout: Duration::from_millis(150),
        timeout: Duration::from_millis(900),
        ..HealthSettings::default()
    };
    let on_time = greeter(Some(Duration::ZERO)).await;
    SaltProbes
        .probe(on_time, Role::Publish, h)
        .await
        .expect("a prompt greeting passes");
    let late = greeter(Some(Duration::from_millis(400))).await;
    let e = SaltProbes.probe(late, Role::Publish, h).await.unwrap_err();
    assert_eq!(e.stage, Stage::LateGreeting, "{e}");
    assert!(e.detail.contains("handshake_timeout 150ms"), "{e}");
    let never = greeter(None).await;
    let began = Instant::now();
    let e = SaltProbes.probe(never, Role::Publish, h).await.unwrap_err();
    assert_eq!(e.stage, Stage::NoGreeting, "{e}");
    assert!(
        began.elapsed() >= h.timeout,
        "gave up after {:?}",
        began.elapsed()
    );
    // The request port's `zmtp` probe keeps the handshake deadline.
    let h = HealthSettings {
        probe: Probe::Zmtp,
        ..h
    };
    let e = SaltProbes.probe(late, Role::Request, h).await.unwrap_err();
    assert_eq!(e.stage, Stage::Failed, "{e}");
}
