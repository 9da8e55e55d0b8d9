//! The RSA public operation `s^e mod n` with Montgomery multiplication over 64-bit limbs.
//!
//! `num-bigint-dig`'s `modpow` (what the `rsa` crate's `rsa_encrypt` uses) runs a 4-bit window
//! over every bit of the exponent's top limb: for e = 65537 about 100 Montgomery products plus a
//! 4096-bit division. Square-and-multiply over e's 17 bits takes 18 products, plus R² mod n by
//! doublings and 3 squarings: a 2048-bit X9.31 verify took 272 µs and takes 62 µs (release, the
//! shared 2-core VM). The master verifies a minion's `tok` (X9.31, a public operation) on the
//! first request of each minion, so this was a fifth of its CPU on a job's first round of
//! returns (docs/master-performance.md).
//!
//! Only public values go through here (the key, a signature): no constant-time requirement.

use ::rsa::BigUint;

/// Little-endian 64-bit limbs of `x`, exactly `len` of them (`x` must fit).
fn limbs(x: &BigUint, len: usize) -> Vec<u64> {
    let bytes = x.to_bytes_le();
    let mut out = vec![0u64; len];
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        out[i] = u64::from_le_bytes(b);
    }
    out
}

fn from_limbs(l: &[u64]) -> BigUint {
    let bytes: Vec<u8> = l.iter().flat_map(|w| w.to_le_bytes()).collect();
    BigUint::from_bytes_le(&bytes)
}

/// `-n0⁻¹ mod 2⁶⁴` for odd `n0` (Newton: each step doubles the correct low bits).
fn neg_inv(n0: u64) -> u64 {
    let mut inv = n0; // correct to 3 bits: n0 * n0 ≡ 1 (mod 8)
    for _ in 0..5 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(n0.wrapping_mul(inv)));
    }
    inv.wrapping_neg()
}

/// `a ≥ b`, both `len` limbs.
fn geq(a: &[u64], b: &[u64]) -> bool {
    for (x, y) in a.iter().rev().zip(b.iter().rev()) {
        if x != y {
            return x > y;
        }
    }
    true
}

struct Mont<'a> {
    n: &'a [u64],
    n0inv: u64,
    /// Scratch: `n.len() + 1` limbs.
    t: Vec<u64>,
}

impl Mont<'_> {
    /// `out = a·b·R⁻¹ mod n` (CIOS, the multiply and reduce passes fused), for `a, b < n`.
    fn mul(&mut self, a: &[u64], b: &[u64], out: &mut [u64]) {
        let len = self.n.len();
        let (n, a) = (&self.n[..len], &a[..len]);
        let t = &mut self.t[..len + 1];
        t.fill(0);
        for &bi in b {
            let s = t[0] as u128 + a[0] as u128 * bi as u128;
            let mut c1 = (s >> 64) as u64;
            let m = (s as u64).wrapping_mul(self.n0inv);
            let s = (s as u64) as u128 + m as u128 * n[0] as u128;
            let mut c2 = (s >> 64) as u64;
            for j in 1..len {
                let s = t[j] as u128 + a[j] as u128 * bi as u128 + c1 as u128;
                c1 = (s >> 64) as u64;
                let s = (s as u64) as u128 + m as u128 * n[j] as u128 + c2 as u128;
                c2 = (s >> 64) as u64;
                t[j - 1] = s as u64;
            }
            let s = t[len] as u128 + c1 as u128 + c2 as u128;
            t[len - 1] = s as u64;
            t[len] = (s >> 64) as u64;
        }
        // t < 2n: one subtraction at most.
        if t[len] != 0 || geq(&t[..len], n) {
            sub_in_place(&mut t[..len], n);
        }
        out.copy_from_slice(&t[..len]);
    }
}

impl Mont<'_> {
    /// `R² mod n` (R = 2^(64·len)) for an `n` whose top bit is set, without a division (which
    /// costs as much as a dozen products): `R mod n = R − n`; `t` doublings give `2^t·R`; each
    /// Montgomery squaring doubles the exponent (`(2^a·R)²·R⁻¹ = 2^(2a)·R`), and `t·2^j = 64·len`
    /// squarings later that is `2^(64·len)·R = R²`.
    fn r_squared(&mut self) -> Vec<u64> {
        let n = self.n;
        let len = n.len();
        // R − n: the two's complement of n in len limbs.
        let mut x: Vec<u64> = n.iter().map(|w| !w).collect();
        for w in x.iter_mut() {
            let (v, carry) = w.overflowing_add(1);
            *w = v;
            if !carry {
                break;
            }
        }
        // Doublings are ~100 times cheaper than products: 2^j·t = 64·len with j ≤ 3.
        let bits = 64 * len;
        let j = bits.trailing_zeros().min(3);
        for _ in 0..bits >> j {
            // x = 2x mod n (x < n < 2^bits, so 2x < 2n: one subtraction at most).
            let top = x[len - 1] >> 63;
            for i in (1..len).rev() {
                x[i] = (x[i] << 1) | (x[i - 1] >> 63);
            }
            x[0] <<= 1;
            if top == 1 || geq(&x, n) {
                sub_in_place(&mut x, n);
            }
        }
        let mut tmp = vec![0u64; len];
        for _ in 0..j {
            self.mul(&x, &x, &mut tmp);
            std::mem::swap(&mut x, &mut tmp);
        }
        x
    }
}

/// `a -= b` (mod 2^(64·len)).
fn sub_in_place(a: &mut [u64], b: &[u64]) {
    let mut borrow = 0u64;
    for (x, y) in a.iter_mut().zip(b) {
        let (d, b1) = x.overflowing_sub(*y);
        let (d, b2) = d.overflowing_sub(borrow);
        *x = d;
        borrow = u64::from(b1 || b2);
    }
}

/// `s^e mod n` for an odd `n`, `s < n`, `e ≥ 1`; `None` otherwise (the caller falls back to
/// the general routine).
pub(crate) fn public_op(s: &BigUint, e: &BigUint, n: &BigUint) -> Option<BigUint> {
    let len = n.bits().div_ceil(64);
    let e_bytes = e.to_bytes_be();
    if len == 0 || s >= n || e_bytes.iter().all(|&b| b == 0) {
        return None;
    }
    let nl = limbs(n, len);
    if nl[0] & 1 == 0 {
        return None;
    }
    let mut m = Mont {
        n: &nl,
        n0inv: neg_inv(nl[0]),
        t: vec![0; len + 1],
    };
    let rr = match n.bits() == 64 * len {
        true => m.r_squared(),
        false => limbs(&((BigUint::from(1u8) << (128 * len)) % n), len),
    };
    let mut base = vec![0u64; len];
    m.mul(&limbs(s, len), &rr, &mut base); // s·R
    let mut acc = base.clone();
    let mut tmp = vec![0u64; len];
    let bits = e.bits();
    for i in (0..bits - 1).rev() {
        m.mul(&acc, &acc, &mut tmp);
        std::mem::swap(&mut acc, &mut tmp);
        if e_bytes[e_bytes.len() - 1 - i / 8] >> (i % 8) & 1 == 1 {
            m.mul(&acc, &base, &mut tmp);
            std::mem::swap(&mut acc, &mut tmp);
        }
    }
    let mut one = vec![0u64; len];
    one[0] = 1;
    m.mul(&acc, &one, &mut tmp); // out of Montgomery form
    Some(from_limbs(&tmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::rsa::hazmat::rsa_encrypt;
    use ::rsa::traits::PublicKeyParts;
    use ::rsa::RsaPublicKey;

    #[test]
    fn neg_inv_inverts() {
        for n0 in [1u64, 3, 0xffff_ffff_ffff_ffff, 0x1234_5678_9abc_def1] {
            assert_eq!(n0.wrapping_mul(neg_inv(n0)), u64::MAX, "{n0:x}");
        }
    }

    #[test]
    fn r_squared_without_division_matches_the_division() {
        let key = crate::rsa::PrivateKey::generate(crate::rsa::KEY_BITS).unwrap();
        let n = RsaPublicKey::from(&key.0).n().clone();
        let nl = limbs(&n, 32);
        let mut m = Mont {
            n: &nl,
            n0inv: neg_inv(nl[0]),
            t: vec![0; 33],
        };
        let want = (BigUint::from(1u8) << 4096) % &n;
        assert_eq!(from_limbs(&m.r_squared()), want);
    }

    #[test]
    fn matches_the_rsa_crate_on_random_inputs_and_edges() {
        let key = crate::rsa::PrivateKey::generate(crate::rsa::KEY_BITS).unwrap();
        let p = RsaPublicKey::from(&key.0);
        let n = p.n().clone();
        let mut inputs = vec![
            BigUint::from(0u8),
            BigUint::from(1u8),
            BigUint::from(2u8),
            &n - BigUint::from(1u8),
        ];
        for _ in 0..20 {
            let mut b = [0u8; 256];
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
            inputs.push(BigUint::from_bytes_be(&b) % &n);
        }
        for s in &inputs {
            let want = rsa_encrypt(&p, s).unwrap();
            assert_eq!(public_op(s, p.e(), &n), Some(want));
        }
        // Other exponents (3, a multi-limb one) and a small odd modulus.
        for e in [3u64, 65537, 0x1_0000_0001] {
            let e = BigUint::from(e);
            let s = &inputs[7];
            assert_eq!(public_op(s, &e, &n), Some(s.modpow(&e, &n)));
        }
        let small = BigUint::from(1_000_003u64);
        let s = BigUint::from(123_456u64);
        let e = BigUint::from(65537u64);
        assert_eq!(public_op(&s, &e, &small), Some(s.modpow(&e, &small)));
        // Refused: s ≥ n, even n, e = 0.
        assert_eq!(public_op(&n, p.e(), &n), None);
        assert_eq!(public_op(&s, &e, &BigUint::from(1_000_004u64)), None);
        assert_eq!(public_op(&s, &BigUint::from(0u8), &small), None);
    }
}
