//! Criterion benchmarks of the proxy's per-session hot paths: what every new session pays before
//! its first byte is relayed, and what every burst of traffic pays for its buffer.
//!
//! * `selection/<balance>/<masters>`: one `Selector::order` call (eligibility and ordering) over
//!   3, 16 and 64 UP masters, into a reused vector, as `session.rs` calls it.
//! * `snapshot/load_full` and `snapshot/load_guard`: reading the configuration snapshot in force
//!   (`DataPlane::load` takes `load_full`, an `Arc` clone; `load_guard` is arc-swap's cheaper
//!   borrowed guard, for comparison).
//! * `bufpool/pooled` against `bufpool/allocate`: a pump buffer from the warm pool and back, against
//!   allocating and freeing a zeroed 16 KiB buffer each time (what the pool saves a busy session).
//!
//! Run with `cargo bench -p saltgate-proxy --bench hot_paths`.

use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use saltgate_config::{Balance, HealthSettings, MasterConfig, Role};
use saltgate_proxy::master::Master;
use saltgate_proxy::pump::{BufPool, BUF_SIZE};
use tokio_util::sync::CancellationToken;

const MASTER_COUNTS: [usize; 3] = [3, 16, 64];

/// `n` masters, UP (no checks configured), weight 1, no maxconn.
fn masters(n: usize) -> Vec<Arc<Master>> {
    let parent = CancellationToken::new();
    (0..n)
        .map(|i| {
            let cfg = MasterConfig {
                name: format!("m{i}"),
                host: format!("10.0.{}.{}", i / 250, i % 250 + 1),
                publish_port: 4505,
                request_port: 4506,
                weight: 1,
                maxconn: None,
                backup: false,
                disabled: false,
                check: false,
                health: HealthSettings::default(),
            };
            let a: SocketAddr = format!("{}:4506", cfg.host).parse().unwrap();
            Arc::new(Master::new(cfg, [a, a], &parent))
        })
        .collect()
}

fn selection(c: &mut Criterion) {
    let mut g = c.benchmark_group("selection");
    let clients: Vec<IpAddr> = (0..256u32)
        .map(|i| IpAddr::from([10, 1, (i / 256) as u8, i as u8]))
        .collect();
    for balance in [Balance::RoundRobin, Balance::LeastConn, Balance::Source] {
        for n in MASTER_COUNTS {
            let ms = masters(n);
            let sel = saltgate_proxy::snapshot::for_balance(balance, n);
            let mut out = Vec::with_capacity(n);
            let mut k = 0usize;
            g.bench_with_input(BenchmarkId::new(format!("{balance:?}"), n), &ms, |b, ms| {
                b.iter(|| {
                    k = k.wrapping_add(1);
                    sel.order(ms, Role::Request, clients[k % clients.len()], &mut out);
                    black_box(out.first().copied())
                })
            });
        }
    }
    g.finish();
}

fn snapshot(c: &mut Criterion) {
    let mut g = c.benchmark_group("snapshot");
    let snap = ArcSwap::from_pointee(masters(16));
    g.bench_function("load_full", |b| {
        b.iter(|| black_box(snap.load_full().len()))
    });
    g.bench_function("load_guard", |b| b.iter(|| black_box(snap.load().len())));
    g.finish();
}

fn bufpool(c: &mut Criterion) {
    let mut g = c.benchmark_group("bufpool");
    let pool = BufPool::new(64);
    drop(pool.get());
    g.bench_function("pooled", |b| {
        b.iter(|| {
            let mut buf = pool.get();
            buf[0] = 1;
            black_box(&mut buf[..]).len()
        })
    });
    g.bench_function("allocate", |b| {
        b.iter(|| {
            // black_box on the buffer itself: otherwise the allocation may be optimised away.
            let mut buf = vec![0u8; BUF_SIZE].into_boxed_slice();
            buf[0] = 1;
            black_box(&mut buf[..]).len()
        })
    });
    g.finish();
}

criterion_group!(benches, selection, snapshot, bufpool);
criterion_main!(benches);
