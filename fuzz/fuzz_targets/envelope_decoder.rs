//! Arbitrary bytes through Salt's msgpack envelope decoders and the Crypticle decrypt path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, PublishEnvelope, Reply, RequestEnvelope, SaltExt};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = envelope::decode(data) {
        // Whatever decodes must re-encode to something that decodes and re-encodes the same
        // (compared as bytes: NaN floats are not equal to themselves).
        let once = envelope::encode(&v);
        let again = envelope::decode(&once).expect("re-encoded value decodes");
        assert_eq!(envelope::encode(&again), once);
        let _ = SaltExt::from_value(&v);
        let _ = PublishEnvelope::from_value(&v);
        let reply = Reply::from_value(v.clone());
        let _ = reply.is_cluster_retry();
        let _ = RequestEnvelope::from_value(envelope::salt_compat(v));
    }
    let _ = RequestEnvelope::decode(data);
    let mut c = Crypticle::new(
        CrypticleKey::from_key_string(
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc=",
        )
        .expect("static key"),
    );
    let _ = c.loads(data, Some("0123456789abcdef0123456789abcdef"));
    // Past the MAC: the same bytes as an authenticated plaintext (pickle::, nonce, serial, msgpack).
    let ct = c.encrypt(data);
    assert_eq!(c.decrypt(&ct).ok().as_deref(), Some(data));
    let _ = c.loads(&ct, None);
    let _ = c.loads(&ct, Some("0123456789abcdef0123456789abcdef"));
});
