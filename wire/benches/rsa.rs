//! Criterion benchmarks of a 2048-bit RSA private-key operation (two per master `_auth`): the
//! OpenSSL path `wire::rsa` takes against the `rsa` crate it took before, on the same key.
//! The numbers behind docs/wire.md, "RSA".
//!
//! Run with `cargo bench -p saltgate-wire --bench rsa`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rand_core_06::OsRng;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::{Oaep, Pkcs1v15Sign, RsaPrivateKey};
use saltgate_wire::rsa::{EncAlgo, PrivateKey, SigAlgo};
use sha1::{Digest, Sha1};

fn private_ops(c: &mut Criterion) {
    let ours = PrivateKey::generate(2048).expect("keygen");
    let (_, der) = saltgate_wire::pem::decode(&ours.to_pem().unwrap()).unwrap();
    let theirs = RsaPrivateKey::from_pkcs1_der(&der).unwrap();
    let token = ours
        .public_key()
        .encrypt(EncAlgo::OaepSha1, b"a minion's token")
        .unwrap();
    let load = vec![0x5au8; 600];
    let digest = Sha1::digest(&load);

    let mut g = c.benchmark_group("rsa_private_op");
    g.bench_function("oaep_decrypt/openssl", |b| {
        b.iter(|| ours.decrypt(EncAlgo::OaepSha1, black_box(&token)).unwrap())
    });
    g.bench_function("oaep_decrypt/rsa_crate_blinded", |b| {
        b.iter(|| {
            theirs
                .decrypt_blinded(&mut OsRng, Oaep::new::<Sha1>(), black_box(&token))
                .unwrap()
        })
    });
    g.bench_function("pkcs1v15_sign/openssl", |b| {
        b.iter(|| ours.sign(SigAlgo::Pkcs1v15Sha1, black_box(&load)).unwrap())
    });
    g.bench_function("pkcs1v15_sign/rsa_crate_blinded", |b| {
        b.iter(|| {
            theirs
                .sign_with_rng(&mut OsRng, Pkcs1v15Sign::new::<Sha1>(), black_box(&digest))
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, private_ops);
criterion_main!(benches);
