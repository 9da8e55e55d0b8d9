//! Publish signatures verified once per process for every link that receives the same bytes.
//!
//! A swarm's thousands of simulated minions all receive the same publish, signed by the same
//! master key: on a real fleet each minion verifies it on its own CPU, in parallel. Verifying it
//! once per swarm process keeps the swarm's CPU from standing in for theirs (at 5,000 minions it
//! was a quarter of the swarm's CPU for a `test.ping`). The result is a pure function of
//! (key, load, signature), so a hit is exactly what the RSA operation would say.

use std::sync::{Arc, Mutex};

use saltgate_wire::rsa::{PublicKey, SigAlgo};

/// The most recent verifications (a publish reaches every link within moments).
const KEEP: usize = 16;

struct Entry {
    key: Arc<PublicKey>,
    algo: SigAlgo,
    load: Vec<u8>,
    sig: Vec<u8>,
    ok: bool,
}

#[derive(Default)]
pub struct SigCache(Mutex<Vec<Entry>>);

impl std::fmt::Debug for SigCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigCache(..)")
    }
}

impl SigCache {
    /// `key.verify(algo, load, sig)`, from the cache when the same triple was verified lately.
    pub fn verify(&self, key: &Arc<PublicKey>, algo: SigAlgo, load: &[u8], sig: &[u8]) -> bool {
        {
            let entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
            let hit = entries.iter().find(|e| {
                e.sig == sig
                    && e.algo == algo
                    && e.load == load
                    && (Arc::ptr_eq(&e.key, key) || *e.key == **key)
            });
            if let Some(e) = hit {
                return e.ok;
            }
        }
        let ok = key.verify(algo, load, sig);
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= KEEP {
            entries.remove(0);
        }
        entries.push(Entry {
            key: key.clone(),
            algo,
            load: load.to_vec(),
            sig: sig.to_vec(),
            ok,
        });
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_wire::rsa::PrivateKey;

    #[test]
    fn a_cached_answer_is_the_answer_for_exactly_that_triple() {
        let k = PrivateKey::generate(1024).unwrap();
        let other = PrivateKey::generate(1024).unwrap();
        let (pk, opk) = (Arc::new(k.public_key()), Arc::new(other.public_key()));
        let algo = SigAlgo::Pkcs1v15Sha1;
        let load = b"publish load".to_vec();
        let sig = k.sign(algo, &load).unwrap();
        let c = SigCache::default();
        assert!(c.verify(&pk, algo, &load, &sig));
        // Same triple again (another link's copy of the key): still true.
        assert!(c.verify(&Arc::new(k.public_key()), algo, &load, &sig));
        // Any one part different is verified on its own, and fails.
        assert!(!c.verify(&opk, algo, &load, &sig));
        assert!(!c.verify(&pk, algo, b"publish loaf", &sig));
        let mut bad = sig.clone();
        bad[10] ^= 1;
        assert!(!c.verify(&pk, algo, &load, &bad));
        assert!(!c.verify(&pk, SigAlgo::Pkcs1v15Sha224, &load, &sig));
        // A failure is cached as a failure.
        assert!(!c.verify(&pk, algo, &load, &bad));
    }
}
