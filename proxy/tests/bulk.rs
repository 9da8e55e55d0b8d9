//! Bulk transfers through the proxy (the path that splices on Linux, see `proxy/src/data/splice.rs`):
//! both directions at once, byte for byte, with half-close in either order, on both listeners
//! (the request listener's presence tap sees the first bytes through the copy path), and the
//! byte counters. Addresses: 127.22.1.x.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::api::{addr, run, scrape, value};
use common::*;
use saltgate_config::{HealthSettings, MasterConfig, Probe, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IP: &str = "127.22.1.1";
const MASTER_IP: &str = "127.22.1.2";

/// The `i`-th byte of a stream seeded by `seed`: a pattern that a shifted, lost or repeated
/// chunk cannot match.
fn byte(seed: u8, i: usize) -> u8 {
    (i as u64 ^ (i as u64 >> 8) ^ (i as u64 >> 17)).wrapping_mul(31) as u8 ^ seed
}

/// Writes `n` pattern bytes in uneven chunks, then half-closes.
async fn send(w: &mut (impl AsyncWriteExt + Unpin), seed: u8, n: usize) {
    let mut at = 0;
    let mut chunk = 1;
    while at < n {
        let len = chunk.min(n - at);
        let data: Vec<u8> = (at..at + len).map(|i| byte(seed, i)).collect();
        w.write_all(&data).await.expect("write");
        at += len;
        chunk = (chunk * 7 + 13) % 300_000 + 1;
    }
    w.shutdown().await.expect("half-close");
}

/// Reads to EOF; returns how many bytes came and the index of the first wrong one.
async fn receive(r: &mut (impl AsyncReadExt + Unpin), seed: u8) -> (usize, Option<usize>) {
    let mut buf = vec![0u8; 100_000];
    let (mut at, mut wrong) = (0usize, None);
    loop {
        let n = r.read(&mut buf).await.expect("read");
        if n == 0 {
            return (at, wrong);
        }
        if wrong.is_none() {
            wrong = (0..n)
                .find(|&k| buf[k] != byte(seed, at + k))
                .map(|k| at + k);
        }
        at += n;
    }
}

/// A master port: reads the client's stream (seed 1) to EOF and, at the same time, sends
/// `reply` bytes (seed 2), half-closing first when `close_first`, else after the client's EOF.
/// Reports (bytes received, first wrong byte) for each connection.
async fn master(
    reply: usize,
    close_first: bool,
) -> (
    SocketAddr,
    tokio::sync::mpsc::Receiver<(usize, Option<usize>)>,
) {
    let l = TcpListener::bind((MASTER_IP, 0)).await.unwrap();
    let at = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let got = if close_first {
                    send(&mut w, 2, reply).await;
                    receive(&mut r, 1).await
                } else {
                    let (got, ()) = tokio::join!(receive(&mut r, 1), async {
                        // Sends while receiving, closes only after the client's EOF (below).
                        let mut at = 0;
                        while at < reply {
                            let len = 65_536.min(reply - at);
                            let data: Vec<u8> = (at..at + len).map(|i| byte(2, i)).collect();
                            w.write_all(&data).await.expect("master write");
                            at += len;
                        }
                    });
                    w.shutdown().await.expect("master half-close");
                    got
                };
                let _ = tx.send(got).await;
            });
        }
    });
    (at, rx)
}

fn health() -> HealthSettings {
    HealthSettings {
        interval: Duration::from_secs(5),
        fastinter: Duration::from_secs(5),
        downinter: Duration::from_secs(5),
        rise: 1,
        fall: 3,
        timeout: Duration::from_secs(1),
        handshake_timeout: Duration::from_secs(1),
        probe: Probe::Tcp,
    }
}

/// One session per listener: `up` bytes client → master and `down` master → client at once.
async fn transfer(up: usize, down: usize, master_closes_first: bool) {
    let (publish, mut pub_rx) = master(down, master_closes_first).await;
    let (request, mut req_rx) = master(down, master_closes_first).await;
    let m = MasterConfig {
        name: "m".into(),
        check: true,
        health: health(),
        ..common::master_at(0, publish, request)
    };
    let (r, _stop, _prober) = run(config_on(IP, vec![m], health())).await;
    for (role, rx) in [(Role::Publish, &mut pub_rx), (Role::Request, &mut req_rx)] {
        let s = TcpStream::connect(addr(&r, role)).await.unwrap();
        let (mut cr, mut cw) = s.into_split();
        let (got, ()) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(receive(&mut cr, 2), send(&mut cw, 1, up))
        })
        .await
        .expect("transfer done");
        assert_eq!(got, (down, None), "{role}: master → client");
        let at_master = tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap();
        assert_eq!(at_master, (up, None), "{role}: client → master");
    }
    // The byte counters are published when a session ends.
    let admin = r.admin_addr().expect("admin API");
    for role in Role::ALL {
        for (dir, want) in [("in", up), ("out", down)] {
            let labels = [("listener", role.as_str()), ("direction", dir)];
            let mut seen = 0.0;
            for _ in 0..500 {
                seen = value(
                    &scrape(admin).await,
                    "saltgate_listener_bytes_total",
                    &labels,
                );
                if seen == want as f64 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(seen, want as f64, "{role} {dir} bytes counted");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_both_ways_at_once_are_byte_exact_client_closing_first() {
    transfer(24 << 20, 16 << 20, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_are_byte_exact_when_the_master_half_closes_first() {
    transfer(8 << 20, 20 << 20, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_empty_transfers_still_pass_half_close() {
    transfer(0, 3, false).await;
    transfer(100_000, 0, true).await;
}
