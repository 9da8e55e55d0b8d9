//! Criterion benchmarks: ZMTP frame encode/decode, Crypticle throughput, a publish's jid read
//! (fan-out dedup), and the presence sniffer on a real `_auth` stream.
//!
//! Run with `cargo bench -p saltgate-wire --bench wire`.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, map, text, RequestEnvelope};
use saltgate_wire::zmtp::frame::{encode_message, Frame, FrameDecoder};

const SIZES: [usize; 3] = [64, 4 * 1024, 256 * 1024];

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("zmtp_frame");
    for size in SIZES {
        let payload = Bytes::from(vec![0x5au8; size]);
        let parts = [Bytes::new(), payload.clone()];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("encode", size), &parts, |b, parts| {
            let mut buf = BytesMut::with_capacity(size + 32);
            b.iter(|| {
                buf.clear();
                encode_message(&mut buf, black_box(parts));
                black_box(buf.len())
            })
        });
        let mut wire = BytesMut::new();
        encode_message(&mut wire, &parts);
        let wire = wire.freeze();
        let dec = FrameDecoder::default();
        g.bench_with_input(BenchmarkId::new("decode", size), &wire, |b, wire| {
            b.iter(|| {
                let mut buf = BytesMut::from(&wire[..]);
                let mut n = 0;
                while let Ok(Some(Frame::Message { body, .. })) = dec.decode(&mut buf) {
                    n += body.len();
                }
                black_box(n)
            })
        });
    }
    g.finish();
}

fn crypticle(c: &mut Criterion) {
    let key = CrypticleKey::generate();
    let mut g = c.benchmark_group("crypticle");
    for size in SIZES {
        let data = vec![0x42u8; size];
        let crypticle = Crypticle::new(key.clone());
        let ct = crypticle.encrypt(&data);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("encrypt", size), &data, |b, data| {
            b.iter(|| black_box(crypticle.encrypt(black_box(data))))
        });
        g.bench_with_input(BenchmarkId::new("decrypt", size), &ct, |b, ct| {
            b.iter(|| black_box(crypticle.decrypt(black_box(ct))))
        });
    }
    // A typical job publish: dumps + envelope encode, and the reverse.
    let job = map(vec![
        ("fun", text("test.ping")),
        ("arg", rmpv::Value::Array(vec![])),
        ("tgt", text("*")),
        ("jid", text("20261122033708835052")),
        ("ret", text("")),
        ("tgt_type", text("glob")),
        ("user", text("root")),
    ]);
    let mut crypticle = Crypticle::new(key);
    g.throughput(Throughput::Elements(1));
    g.bench_function("dumps_job_and_envelope", |b| {
        b.iter(|| {
            let ct = crypticle.dumps(black_box(&job), None);
            black_box(RequestEnvelope::aes("minion", &ct).encode())
        })
    });
    let wire = RequestEnvelope::aes("minion", &crypticle.dumps(&job, None)).encode();
    g.bench_function("decode_envelope_and_loads_job", |b| {
        b.iter(|| {
            let env = RequestEnvelope::decode(black_box(&wire)).expect("envelope");
            let load = envelope::as_bytes(&env.load).expect("bytes").to_vec();
            black_box(crypticle.loads(&load, None).expect("loads"))
        })
    });
    g.finish();
}

/// What the fan-out's dedup costs per upstream message (`publish_job::publish_jid`: envelope
/// decode, one MAC check + decryption, borrowed decode of the job): a `test.ping` job, and jobs
/// whose `arg` carries 4 KiB and 64 KiB.
fn publish_jid(c: &mut Criterion) {
    use saltgate_wire::envelope::PublishEnvelope;
    use saltgate_wire::publish_job::publish_jid;
    let crypticle = Crypticle::new(CrypticleKey::generate());
    let mut g = c.benchmark_group("publish_jid");
    for arg in [0usize, 4 * 1024, 64 * 1024] {
        let job = map(vec![
            ("fun", text("test.ping")),
            ("arg", rmpv::Value::Array(vec![text(&"x".repeat(arg))])),
            ("tgt", text("*")),
            ("jid", text("20261122033708835052")),
            ("ret", text("")),
            ("tgt_type", text("glob")),
            ("user", text("root")),
        ]);
        let payload = PublishEnvelope {
            enc: "aes".into(),
            load: crypticle.dumps(&job, None),
            sig: None,
            sig_algo: None,
        }
        .encode();
        g.throughput(Throughput::Bytes(payload.len() as u64));
        g.bench_with_input(BenchmarkId::new("current_key", arg), &payload, |b, p| {
            b.iter(|| black_box(publish_jid(black_box(p), &[&crypticle]).expect("jid")))
        });
    }
    g.finish();
}

/// What presence costs a request connection: the sniffer over the bytes a libzmq REQ sent for
/// Salt's `_auth` (captured, see `fuzz/seeds/presence_sniffer/`), in one read and in 64-byte reads.
fn sniff(c: &mut Criterion) {
    use saltgate_wire::sniff::{Sniffer, DEFAULT_BUDGET};
    let stream = &include_bytes!("../../fuzz/seeds/presence_sniffer/salt_auth")[2..];
    let mut g = c.benchmark_group("sniff_auth");
    g.throughput(Throughput::Bytes(stream.len() as u64));
    for chunk in [stream.len(), 64] {
        g.bench_with_input(BenchmarkId::new("chunk", chunk), &chunk, |b, &chunk| {
            b.iter(|| {
                let mut s = Sniffer::new(DEFAULT_BUDGET);
                for piece in black_box(stream).chunks(chunk) {
                    s.feed(piece);
                }
                black_box(s.verdict().is_final())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, frames, crypticle, publish_jid, sniff);
criterion_main!(benches);
