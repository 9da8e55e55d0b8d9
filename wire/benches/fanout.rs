//! Publish fan-out to 1,000 subscribers: the framing work per publish, before and after
//! encode-once.
//!
//! * `per_subscriber` — what `Publisher::publish` cost before: each subscriber's connection
//!   driver framed the message into its own write buffer (one copy of the payload each).
//! * `encode_once` — now: the message is framed once into a shared `Bytes` and each
//!   subscriber's queue gets a reference (one copy in all).
//!
//! Run with `cargo bench -p saltgate-wire --bench fanout`.

use std::hint::black_box;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use saltgate_wire::zmtp::frame::encode_message;

const SUBSCRIBERS: usize = 1000;
const SIZES: [usize; 3] = [256, 4 * 1024, 64 * 1024];

fn fanout(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish_fanout_1000");
    for size in SIZES {
        let parts: Vec<Bytes> = vec![Bytes::from_static(b"topic"), Bytes::from(vec![7u8; size])];
        g.throughput(Throughput::Bytes((size * SUBSCRIBERS) as u64));
        // Before: an Arc of the parts per queue, then one framing copy per connection buffer.
        let mut wbufs: Vec<BytesMut> = (0..SUBSCRIBERS)
            .map(|_| BytesMut::with_capacity(size + 32))
            .collect();
        g.bench_with_input(
            BenchmarkId::new("per_subscriber", size),
            &parts,
            |b, parts| {
                b.iter(|| {
                    let msg: Arc<[Bytes]> = parts.clone().into();
                    for wbuf in wbufs.iter_mut() {
                        let queued = msg.clone();
                        wbuf.clear();
                        encode_message(wbuf, &queued);
                        black_box(wbuf.len());
                    }
                })
            },
        );
        // After: framed once, a reference per queue.
        g.bench_with_input(BenchmarkId::new("encode_once", size), &parts, |b, parts| {
            b.iter(|| {
                let total: usize = parts.iter().map(|p| 9 + p.len()).sum();
                let mut buf = BytesMut::with_capacity(total);
                encode_message(&mut buf, parts);
                let framed = buf.freeze();
                for _ in 0..SUBSCRIBERS {
                    black_box(framed.clone());
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
