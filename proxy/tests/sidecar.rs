//! Issue 10 part 6: `balance: first` with failback (the sidecar profile). Real loopback sockets on
//! 127.15.0.x, fake masters, real TCP health checks, clients that reconnect when closed (as
//! minions do).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::api::run_with;
use common::*;
use saltgate_config::{Balance, Config, Failback, Rebalance, Role};
use saltgate_proxy::Options;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

fn ip(last: u8) -> String {
    format!("127.15.0.{last}")
}

async fn cluster() -> FakeCluster {
    let mut masters = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let at = ip(2 + i as u8);
        masters.push((
            FakeMaster::start(name, &at, Behaviour::Echo).await,
            FakeMaster::start(name, &at, Behaviour::Echo).await,
        ));
    }
    FakeCluster { masters }
}

const FAILBACK: Duration = Duration::from_secs(2);

fn config(c: &FakeCluster) -> Config {
    let mut cfg = c.config();
    let bind = format!("{}:0", ip(1)).parse().unwrap();
    for l in [&mut cfg.publish, &mut cfg.request] {
        l.bind = vec![bind];
        l.balance = Balance::First;
        l.failback = Failback::After(FAILBACK);
    }
    cfg.admin.bind = bind;
    cfg.publish.rebalance = Rebalance {
        rate: 50,
        ..Rebalance::ON
    };
    cfg
}

/// The master each of `n` reconnecting publish clients is on ("" while reconnecting), and when
/// each close was seen.
#[derive(Default)]
struct Seen {
    on: Mutex<Vec<String>>,
    closes: Mutex<Vec<Instant>>,
}

fn clients(proxy: std::net::SocketAddr, n: usize, stop: Arc<AtomicBool>) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    seen.on.lock().unwrap().resize(n, String::new());
    for i in 0..n {
        let (seen, stop) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Ok(mut s)) =
                    tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(proxy)).await
                else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let (mut name, mut b) = (Vec::new(), [0u8; 64]);
                let closed_at = loop {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => break Instant::now(),
                        Ok(k) => {
                            name.extend_from_slice(&b[..k]);
                            if let Some(p) = name.iter().position(|c| *c == b'\n') {
                                seen.on.lock().unwrap()[i] =
                                    String::from_utf8_lossy(&name[..p]).into_owned();
                            }
                        }
                    }
                };
                seen.on.lock().unwrap()[i].clear();
                seen.closes.lock().unwrap().push(closed_at);
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..20u64))).await;
            }
        });
    }
    seen
}

fn on(seen: &Seen, m: &str) -> usize {
    seen.on.lock().unwrap().iter().filter(|x| *x == m).count()
}

/// Opens a request connection every 50 ms and records which master answered, and when.
fn prober(
    proxy: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
) -> Arc<Mutex<Vec<(Instant, String)>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            if let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(proxy)).await
            {
                let mut b = [0u8; 16];
                if let Ok(Ok(k)) =
                    tokio::time::timeout(Duration::from_secs(2), s.read(&mut b)).await
                {
                    let name = String::from_utf8_lossy(&b[..k]).trim().to_string();
                    if !name.is_empty() {
                        l.lock().unwrap().push((t, name));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    log
}

async fn wait_long(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_keeps_the_order_fails_over_and_fails_back_after_the_delay_only() {
    let n = 30;
    let c = cluster().await;
    let (r, _stop) = run_with(config(&c), Options::default()).await;
    wait_for("all masters UP", || r.masters().iter().all(|m| m.is_up())).await;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = clients(r.local_addrs(Role::Publish)[0], n, stop.clone());
    let requests = prober(r.local_addrs(Role::Request)[0], stop.clone());
    wait_long("every client on a, the first master", T, || {
        on(&seen, "a") == n
    })
    .await;
    wait_long("a request answered", T, || {
        !requests.lock().unwrap().is_empty()
    })
    .await;
    assert!(requests.lock().unwrap().iter().all(|(_, m)| m == "a"));

    // a fails: everyone goes to b, the next in order (not c).
    c.masters[0].0.stop();
    c.masters[0].1.stop();
    wait_long("every client on b", T, || on(&seen, "b") == n).await;
    assert_eq!(on(&seen, "c"), 0);
    let down_at = Instant::now();
    wait_long("requests answered by b", T, || {
        requests
            .lock()
            .unwrap()
            .iter()
            .any(|(t, m)| *t > down_at && m == "b")
    })
    .await;

    // a comes back: held behind b for the failback delay, then everything goes back to a.
    let closes_before = seen.closes.lock().unwrap().len();
    c.masters[0].0.restart().await;
    c.masters[0].1.restart().await;
    wait_long("a UP again", T, || r.master("a").unwrap().is_up()).await;
    let up_at = Instant::now();
    wait_long("every client back on a", T + FAILBACK, || {
        on(&seen, "a") == n
    })
    .await;
    let back = up_at.elapsed();
    stop.store(true, Ordering::Relaxed);

    // Nothing moved, and no new request went to a, before the delay. `up_at` is when this test saw
    // a UP, a little after the proxy did; 300 ms covers that and a request's own way to the
    // proxy on a loaded machine.
    let early = up_at + FAILBACK - Duration::from_millis(300);
    let moves = seen.closes.lock().unwrap()[closes_before..].to_vec();
    assert!(moves.len() >= n, "{} moves", moves.len());
    assert!(
        moves.iter().all(|t| *t >= early),
        "a publish session moved {:?} after a came UP (failback {FAILBACK:?})",
        moves
            .iter()
            .min()
            .map(|t| t.saturating_duration_since(up_at))
    );
    let reqs = requests.lock().unwrap().clone();
    assert!(
        reqs.iter()
            .filter(|(t, _)| *t > up_at && *t < early)
            .all(|(_, m)| m == "b"),
        "requests during the hold: {:?}",
        reqs.iter().filter(|(t, _)| *t > up_at).collect::<Vec<_>>()
    );
    let after = up_at + FAILBACK + Duration::from_millis(300);
    let late: Vec<_> = reqs.iter().filter(|(t, _)| *t > after).collect();
    assert!(
        late.iter().all(|(_, m)| m == "a"),
        "requests after the delay: {late:?}"
    );
    assert!(
        back < FAILBACK + Duration::from_secs(3),
        "{n} publish sessions back on a {back:?} after it came UP (rate 50/s)"
    );
    let counted = r.master("a").unwrap().session_count(Role::Publish);
    assert!(
        counted as usize >= n - 2,
        "the proxy's book: {counted} on a"
    );
}
