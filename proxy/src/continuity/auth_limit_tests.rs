use super::*;
use saltgate_config::auth_limit::AuthLimit;

fn fixed(n: u32) -> AuthLimit {
    AuthLimit {
        max_in_flight: MaxInFlight::Fixed(n),
        max_wait: Duration::from_secs(5),
        max_queue: 100,
        ..AuthLimit::default()
    }
}

/// [`fixed`] with a `max_wait` long enough that only the gate's order and its late check decide.
fn patient(n: u32) -> AuthLimit {
    AuthLimit {
        max_wait: Duration::from_secs(60),
        ..fixed(n)
    }
}

fn admitted(e: Result<Entry, Dropped>) -> AuthPermit {
    match e {
        Ok(Entry::Admitted(p)) => p,
        _ => panic!("expected an admission"),
    }
}

fn queued(e: Result<Entry, Dropped>) -> Queued {
    match e {
        Ok(Entry::Queued(q)) => q,
        _ => panic!("expected a place in the queue"),
    }
}

#[tokio::test(start_paused = true)]
async fn waiting_auth_are_admitted_first_in_first_out() {
    let limits = AuthLimits::new(&Registry::new());
    let g = limits.gate("m1", &fixed(1));
    let first = admitted(g.enter(100));
    let mut waiting: Vec<Queued> = (0..3).map(|_| queued(g.enter(100))).collect();
    assert_eq!((g.in_flight(), g.queued()), (1, 3));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    // Started in reverse order: the queue order (enter) decides, not who polls first.
    for (i, mut q) in waiting.drain(..).enumerate().rev() {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let p = q.wait(Duration::from_secs(60)).await.expect("admitted");
            tx.send(i).unwrap();
            // Holds its place until the next one is told to go.
            tokio::time::sleep(Duration::from_millis(10)).await;
            p.answered();
        }));
    }
    tokio::task::yield_now().await;
    drop(first);
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, vec![0, 1, 2]);
    for t in tasks {
        t.await.unwrap();
    }
    let v = g.view();
    assert_eq!((v.in_flight, v.queued, v.admitted), (0, 0, 4));
}

#[tokio::test(start_paused = true)]
async fn each_master_has_its_own_limit() {
    let limits = AuthLimits::new(&Registry::new());
    let a = limits.gate("a", &fixed(2));
    let b = limits.gate("b", &fixed(1));
    let _a1 = admitted(a.enter(100));
    let _a2 = admitted(a.enter(100));
    let _a3 = queued(a.enter(100));
    // `a` is full; `b` is not.
    let _b1 = admitted(b.enter(100));
    let _b2 = queued(b.enter(100));
    assert_eq!((a.in_flight(), a.queued()), (2, 1));
    assert_eq!((b.in_flight(), b.queued()), (1, 1));
    // The same master's gate is found again, and a reload raises its limit.
    let a2 = limits.gate("a", &fixed(3));
    assert!(Arc::ptr_eq(&a, &a2));
    assert_eq!(a.limit(), 3);
    assert_eq!(limits.views().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_auth_whose_minion_closes_leaves_the_queue_and_the_next_goes() {
    let limits = AuthLimits::new(&Registry::new());
    let g = limits.gate("m1", &fixed(1));
    let p = admitted(g.enter(100));
    let gone = queued(g.enter(100));
    let mut next = queued(g.enter(100));
    drop(gone); // the minion closed its connection
    assert_eq!(g.queued(), 1);
    assert_eq!(g.view().dropped_minion_closed, 1);
    drop(p);
    let p2 = next
        .wait(Duration::from_secs(5))
        .await
        .expect("next admitted");
    assert_eq!((g.in_flight(), g.queued()), (1, 0));
    drop(next);
    // Admitted, then dropped: not counted as a drop.
    assert_eq!(g.view().dropped_minion_closed, 1);
    drop(p2);
    assert_eq!(g.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_auth_is_dropped_when_it_is_older_than_max_wait_and_over_max_queue() {
    let limits = AuthLimits::new(&Registry::new());
    let g = limits.gate("m1", &fixed(1));
    let _p = admitted(g.enter(2));
    let mut old = queued(g.enter(2));
    tokio::time::advance(Duration::from_secs(3)).await;
    let mut young = queued(g.enter(2));
    assert_eq!(g.enter(2).err(), Some(Dropped::QueueFull));
    let t0 = Instant::now();
    assert_eq!(
        old.wait(Duration::from_secs(5)).await.err(),
        Some(Dropped::MaxWait)
    );
    // Its age counts from when it was queued, not from the wait call.
    assert_eq!(Instant::now() - t0, Duration::from_secs(2));
    drop(old);
    let v = g.view();
    assert_eq!(
        (v.dropped_max_wait, v.dropped_queue_full, v.queued),
        (1, 1, 1)
    );
    assert_eq!(
        young.wait(Duration::from_secs(5)).await.err(),
        Some(Dropped::MaxWait)
    );
    assert_eq!(g.view().dropped_max_wait, 2);
    // Saltgate closing the session (shutdown, master DOWN) is not a drop.
    let q = queued(g.enter(2));
    q.abandon(None);
    let v = g.view();
    assert_eq!(
        (v.dropped_max_wait, v.dropped_minion_closed, v.queued),
        (2, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_lower_limit_is_kept_by_forgetting_permits_as_they_come_back() {
    let limits = AuthLimits::new(&Registry::new());
    let g = limits.gate("m1", &fixed(3));
    let ps: Vec<AuthPermit> = (0..3).map(|_| admitted(g.enter(10))).collect();
    limits.gate("m1", &fixed(1));
    let mut q = queued(g.enter(10));
    drop(ps);
    // Two came back as debt; one went to the waiting one.
    let p = q.wait(Duration::from_secs(1)).await.expect("admitted");
    assert!(matches!(g.enter(10), Ok(Entry::Queued(_))));
    drop(p);
    assert!(matches!(g.enter(10), Ok(Entry::Admitted(_))));
}

#[tokio::test(start_paused = true)]
async fn auto_grows_while_answers_are_quick_and_cuts_when_they_are_slow() {
    let limits = AuthLimits::new(&Registry::new());
    let cfg = AuthLimit::default();
    assert_eq!(cfg.max_in_flight, MaxInFlight::Auto);
    let g = limits.gate("m1", &cfg);
    assert_eq!(g.limit(), AUTO_START);
    // Full and quick (well within auth_timeout / 8): one more per `limit` answers.
    for _ in 0..AUTO_START {
        let ps: Vec<AuthPermit> = (0..g.limit()).map(|_| admitted(g.enter(10))).collect();
        tokio::time::advance(Duration::from_millis(10)).await;
        for p in ps {
            p.answered();
        }
    }
    assert!(g.limit() > AUTO_START, "{}", g.limit());
    let before = g.limit();
    let p = admitted(g.enter(10));
    tokio::time::advance(cfg.auth_timeout / 2).await;
    p.answered();
    assert_eq!(g.limit(), before - before / 4);
}

#[tokio::test(start_paused = true)]
async fn a_turn_that_comes_too_late_for_the_minions_auth_timeout_is_dropped() {
    let limits = AuthLimits::new(&Registry::new());
    let cfg = patient(1);
    let g = limits.gate("m1", &cfg);
    // The master answers in 2 s.
    let p = admitted(g.enter(10));
    tokio::time::advance(Duration::from_secs(2)).await;
    p.answered();
    let p = admitted(g.enter(10));
    let mut late = queued(g.enter(10));
    let mut next = queued(g.enter(10));
    // 3.5 s of waiting + 2 s at the master > auth_timeout (5 s): dropped, the place goes on.
    tokio::time::advance(Duration::from_millis(3500)).await;
    drop(p);
    assert_eq!(late.wait(cfg.max_wait).await.err(), Some(Dropped::MaxWait));
    // `next` waited as long: dropped too; a fresh one is admitted.
    assert_eq!(next.wait(cfg.max_wait).await.err(), Some(Dropped::MaxWait));
    let _p = admitted(g.enter(10));
    assert_eq!(g.view().dropped_max_wait, 2);
}

#[tokio::test(start_paused = true)]
async fn past_a_quarter_of_auth_timeout_in_the_queue_the_newest_auth_goes_first() {
    let limits = AuthLimits::new(&Registry::new());
    let cfg = patient(1);
    let g = limits.gate("m1", &cfg);
    let p = admitted(g.enter(10));
    let mut old = queued(g.enter(10));
    // The oldest has waited past auth_timeout / 4 (5 s / 4) when the place comes back.
    tokio::time::advance(lifo_after(cfg.auth_timeout) + Duration::from_millis(1)).await;
    let mut newer = queued(g.enter(10));
    let mut newest = queued(g.enter(10));
    drop(p);
    let p = newest
        .wait(Duration::from_secs(60))
        .await
        .expect("the newest goes first");
    assert_eq!((g.in_flight(), g.queued()), (1, 2));
    // The next place: the oldest has still waited too long; the next newest goes.
    drop(p);
    let p = newer
        .wait(Duration::from_secs(60))
        .await
        .expect("then the next newest");
    drop(p);
    // Alone in the queue, the old one goes last (unless its turn is too late: it is not yet).
    let p = old
        .wait(Duration::from_secs(60))
        .await
        .expect("then the old one");
    assert_eq!(g.view().admitted, 4);
    drop(p);
}

#[tokio::test(start_paused = true)]
async fn a_place_given_to_a_waiter_that_left_goes_to_the_next() {
    let limits = AuthLimits::new(&Registry::new());
    let g = limits.gate("m1", &fixed(1));
    let p = admitted(g.enter(10));
    let gone = queued(g.enter(10));
    let mut next = queued(g.enter(10));
    // The place is sent to `gone` (the oldest) before it notices; its minion then leaves.
    drop(p);
    drop(gone);
    let p = next
        .wait(Duration::from_secs(5))
        .await
        .expect("the place went on to the next");
    assert_eq!((g.in_flight(), g.queued()), (1, 0));
    drop(p);
    drop(next);
    assert_eq!(g.in_flight(), 0);
    assert!(matches!(g.enter(10), Ok(Entry::Admitted(_))));
}
