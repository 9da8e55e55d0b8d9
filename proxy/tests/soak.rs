//! Issue 12, "Done when": a soak run of the saltgate binary under a small descriptor limit. A fleet
//! of publish sessions streams continuously from fake masters while a bounded flood of silent and
//! garbage-sending connections hits the publish listener, the request listener and the admin port.
//! Afterwards: every byte each master streamed reached its client in order, no fleet session was
//! closed, no master was ever marked DOWN (log and metrics), and saltgate accepts new clients.
//! Addresses: 127.12.2.x.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::api::scrape;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");
const IP: &str = "127.12.2.1";
/// Publish sessions of the fleet.
const FLEET: usize = 12;
/// The descriptor limit saltgate runs under: the fleet holds 2 per session, the flood the rest.
const NOFILE: u32 = 64;
/// One chunk of the stream, sent every [`EVERY`].
const CHUNK: usize = 2048;
const EVERY: Duration = Duration::from_millis(10);

/// The byte at `pos` of every stream: a position-dependent pattern, so a lost, repeated or
/// reordered chunk shows.
fn pattern(pos: u64) -> u8 {
    ((pos / CHUNK as u64) % 251) as u8 ^ (pos % 7) as u8
}

/// A publish port that streams the pattern to every connection until told to stop, then sends
/// FIN. Each connection first gets "<id>\n"; `sent[id]` counts what was written to it.
struct Streamer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<HashMap<u64, u64>>>,
}

impl Streamer {
    async fn start(ip: &str) -> Streamer {
        let l = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(HashMap::new()));
        let next = Arc::new(AtomicU64::new(1));
        let (st, se) = (stop.clone(), sent.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let id = next.fetch_add(1, Ordering::SeqCst) + u64::from(addr.port()) * 100_000;
                let (stop, sent) = (st.clone(), se.clone());
                tokio::spawn(async move {
                    if s.write_all(format!("{id}\n").as_bytes()).await.is_err() {
                        return;
                    }
                    sent.lock().unwrap().insert(id, 0);
                    let mut pos = 0u64;
                    let mut buf = vec![0u8; CHUNK];
                    while !stop.load(Ordering::SeqCst) {
                        for (i, b) in buf.iter_mut().enumerate() {
                            *b = pattern(pos + i as u64);
                        }
                        // A silent flood client never reads: give up on it, not on the others.
                        match tokio::time::timeout(Duration::from_secs(2), s.write_all(&buf)).await
                        {
                            Ok(Ok(())) => {}
                            _ => return,
                        }
                        pos += CHUNK as u64;
                        sent.lock().unwrap().insert(id, pos);
                        tokio::time::sleep(EVERY).await;
                    }
                    let _ = s.shutdown().await;
                    // Keep the socket until the client has read everything and closed.
                    let mut sink = [0u8; 1024];
                    while let Ok(n) = s.read(&mut sink).await {
                        if n == 0 {
                            break;
                        }
                    }
                });
            }
        });
        Streamer { addr, stop, sent }
    }
}

/// A fleet client: reads the id (and reports it in `ids`), then checks every byte against the pattern until EOF. Returns
/// (id, bytes received, whether EOF came before the masters were told to stop).
async fn fleet_client(
    proxy: SocketAddr,
    stopping: Arc<AtomicBool>,
    ids: Arc<Mutex<Vec<u64>>>,
) -> (u64, u64, bool) {
    let mut s = TcpStream::connect(proxy).await.expect("fleet connects");
    let id: u64 = read_line(&mut s).await.parse().expect("an id banner");
    ids.lock().unwrap().push(id);
    let mut buf = vec![0u8; 65536];
    let mut pos = 0u64;
    loop {
        let n = match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => panic!("fleet session {id}: read failed after {pos} bytes: {e}"),
            Err(_) => panic!("fleet session {id}: nothing for 20 s after {pos} bytes"),
        };
        if n == 0 {
            return (id, pos, !stopping.load(Ordering::SeqCst));
        }
        for &b in &buf[..n] {
            assert_eq!(b, pattern(pos), "fleet session {id}: wrong byte at {pos}");
            pos += 1;
        }
    }
}

/// Flood waves (each exhausts the descriptors, then lets go).
const WAVES: usize = 2;

/// Bytes streamed so far to each of the sessions `ids`.
fn fleet_progress(masters: &[(Streamer, Arc<FakeMaster>)], ids: &[u64]) -> Vec<u64> {
    ids.iter()
        .map(|id| {
            masters
                .iter()
                .find_map(|(p, _)| p.sent.lock().unwrap().get(id).copied())
                .unwrap_or(0)
        })
        .collect()
}

/// Kills the child (by its PID) when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log_text(log: &std::path::Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

async fn wait_log(log: &std::path::Path, what: &str, times: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while log_text(log).matches(what).count() < times {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {times} × {what:?} in the log:\n{}",
            log_text(log)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sum of the samples of `name` whose labels include `labels` (0 when there is none).
fn sum(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Opens `n` connections to `to` (those the kernel takes: some land in the backlog); garbage
/// ones write junk first. Bounded: each connect waits at most 200 ms.
async fn flood(to: SocketAddr, n: usize, garbage: bool, held: &mut Vec<TcpStream>) {
    for i in 0..n {
        let Ok(Ok(mut s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(to)).await
        else {
            continue;
        };
        if garbage {
            let junk: Vec<u8> = (0..512u32).map(|j| (j * 31 + i as u32 * 7) as u8).collect();
            let _ = tokio::time::timeout(Duration::from_millis(100), s.write_all(&junk)).await;
        }
        held.push(s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_under_a_small_descriptor_limit_costs_the_fleet_nothing() {
    let masters = [
        (
            Streamer::start("127.12.2.2").await,
            FakeMaster::start("a", "127.12.2.2", Behaviour::Echo).await,
        ),
        (
            Streamer::start("127.12.2.3").await,
            FakeMaster::start("b", "127.12.2.3", Behaviour::Echo).await,
        ),
    ];
    let publish = SocketAddr::from(([127, 12, 2, 1], free_port(IP)));
    let request = SocketAddr::from(([127, 12, 2, 1], free_port(IP)));
    let admin = SocketAddr::from(([127, 12, 2, 1], free_port(IP)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saltgate.yaml");
    let log = dir.path().join("saltgate.log");
    let mut yaml = String::from(
        "global:\n  raise_nofile: false\nhealth:\n  interval: 20ms\n  fall: 2\n  rise: 2\n  timeout: 1s\nmasters:\n",
    );
    for (i, (p, r)) in masters.iter().enumerate() {
        yaml += &format!(
            "  - name: m{i}\n    host: {}\n    publish_port: {}\n    request_port: {}\n",
            p.addr.ip(),
            p.addr.port(),
            r.addr.port()
        );
    }
    yaml += &format!(
        "listeners:\n  publish:\n    bind: {publish}\n  request:\n    bind: {request}\nadmin:\n  bind: {admin}\n"
    );
    std::fs::write(&path, yaml).unwrap();
    let _child = Child(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {NOFILE} && exec {BIN} --log-level info,saltgate_proxy::check=debug run --probe tcp --config {} >{} 2>&1",
                path.display(),
                log.display()
            ))
            .spawn()
            .unwrap(),
    );
    wait_log(&log, "configuration in force", 1).await;

    // The fleet: every session streaming before the flood starts.
    let stopping = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(Mutex::new(Vec::new()));
    let fleet: Vec<_> = (0..FLEET)
        .map(|_| tokio::spawn(fleet_client(publish, stopping.clone(), ids.clone())))
        .collect();
    wait_for("the fleet connected", || ids.lock().unwrap().len() == FLEET).await;
    let ids: Vec<u64> = ids.lock().unwrap().clone();
    wait_for("the fleet streaming", || {
        fleet_progress(&masters, &ids).iter().all(|&n| n > 0)
    })
    .await;
    // The flood, bounded, in waves: silent and garbage connections on both listeners and the
    // admin port. Each wave is held until saltgate met the exhaustion, more than `fall` checks in a
    // row ran into it, and every fleet session streamed another 150 chunks (1.5 s) meanwhile.
    for wave in 1..=WAVES {
        let mut held = Vec::new();
        for to in [request, publish, admin] {
            flood(to, 40, false, &mut held).await;
            flood(to, 15, true, &mut held).await;
        }
        wait_log(&log, "out of local resources", wave).await;
        wait_log(&log, "met the local resource shortage", 6 * wave).await;
        let before = fleet_progress(&masters, &ids);
        wait_for("the fleet streaming through the flood", || {
            let text = log_text(&log);
            assert!(
                !text.contains("marked DOWN"),
                "a master was marked DOWN by the flood:\n{text}"
            );
            fleet_progress(&masters, &ids)
                .iter()
                .zip(&before)
                .all(|(now, then)| now - then >= 150 * CHUNK as u64)
        })
        .await;
        eprintln!("soak: wave {wave}: {} flood connections held", held.len());
        drop(held);
        wait_log(&log, "local resources available again", wave).await;
    }

    // Recovered: new clients are served on both listeners, the admin API answers. saltgate
    // closes its side of the flood as it reads the EOFs, so the first client after the flood may
    // still meet the shortage: recovery is a condition, reached within a few seconds.
    let recovered = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Some(id) = served_after_flood(request, publish).await {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("new clients served within 15 s of the flood");
    assert!(
        recovered.parse::<u64>().is_ok(),
        "a publish banner: {recovered:?}"
    );
    let s = scrape(admin).await;
    assert_eq!(
        sum(&s, "saltgate_master_state_changes_total", &[("to", "down")]),
        0.0,
        "no master was ever marked DOWN"
    );
    for m in ["m0", "m1"] {
        assert_eq!(
            sum(
                &s,
                "saltgate_master_state",
                &[("master", m), ("state", "up")]
            ),
            1.0
        );
    }
    assert_eq!(
        sum(
            &s,
            "saltgate_master_sessions_closed_total",
            &[("port", "publish"), ("reason", "master-down")]
        ),
        0.0
    );
    // The exhaustion is counted as the host's (checks and connects that met it), never as a
    // master's connect error; and logged once per episode, not once per failure.
    let local = sum(&s, "saltgate_local_resource_errors_total", &[]);
    assert!(local > 0.0, "the exhaustion was not counted");
    assert_eq!(
        sum(&s, "saltgate_master_connect_errors_total", &[]),
        0.0,
        "a local resource error counted as a master's connect error"
    );
    let episodes = log_text(&log)
        .matches("out of local resources (descriptors")
        .count();
    eprintln!("soak: {local} local resource errors, logged in {episodes} episode line(s)");
    assert!(
        episodes >= WAVES && (episodes as f64) * 5.0 <= local,
        "{episodes} episode lines for {local} local resource errors"
    );

    // The end: the masters stop and close; each fleet client has every byte its master sent.
    stopping.store(true, Ordering::SeqCst);
    for (p, _) in &masters {
        p.stop.store(true, Ordering::SeqCst);
    }
    let mut total = 0;
    for f in fleet {
        let (id, got, early) = f.await.expect("fleet client");
        assert!(
            !early,
            "fleet session {id} was closed during the soak after {got} bytes"
        );
        let sent = masters
            .iter()
            .find_map(|(p, _)| p.sent.lock().unwrap().get(&id).copied())
            .expect("a master knows the session");
        assert_eq!(got, sent, "fleet session {id}: bytes lost");
        total += got;
    }
    let text = log_text(&log);
    assert!(!text.contains("marked DOWN"), "{text}");
    eprintln!("soak: {FLEET} sessions, {total} bytes streamed, every byte delivered");
}

/// One echo through the request listener (after the echo master's name line) and one publish
/// banner, or `None` if either fails.
async fn served_after_flood(request: SocketAddr, publish: SocketAddr) -> Option<String> {
    let mut c = TcpStream::connect(request).await.ok()?;
    banner(&mut c).await?;
    c.write_all(b"after the flood").await.ok()?;
    let mut back = [0u8; 15];
    tokio::time::timeout(Duration::from_secs(2), c.read_exact(&mut back))
        .await
        .ok()?
        .ok()?;
    if &back != b"after the flood" {
        return None;
    }
    let mut p = TcpStream::connect(publish).await.ok()?;
    banner(&mut p).await
}

/// The first line a fake master sends, or `None` if the connection fails or stays silent.
async fn banner(s: &mut TcpStream) -> Option<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut b))
        .await
        .ok()?
        .is_ok()
    {
        if b[0] == b'\n' {
            return String::from_utf8(line).ok();
        }
        line.push(b[0]);
    }
    None
}
