//! Unit tests of RSA, OAEP, PKCS#1 v1.5, X9.31 and PEM (split out to keep rsa.rs short).

use std::sync::OnceLock;

use super::*;

/// One 2048-bit key for all unit tests (key generation is slow in debug builds).
fn key() -> &'static PrivateKey {
    static KEY: OnceLock<PrivateKey> = OnceLock::new();
    KEY.get_or_init(|| PrivateKey::generate(KEY_BITS).expect("keygen"))
}

#[test]
fn generated_key_is_2048_bits_and_pem_round_trips_in_salt_form() {
    let k = key();
    assert_eq!(k.size(), 256);
    let pem = k.to_pem().unwrap();
    assert!(pem.starts_with("-----BEGIN RSA PRIVATE KEY-----\n"));
    assert!(pem.ends_with("\n-----END RSA PRIVATE KEY-----\n"));
    assert!(pem.lines().all(|l| l.len() <= 64));
    let back = PrivateKey::from_pem(&pem).unwrap();
    assert_eq!(back.to_pem().unwrap(), pem);
    let pubpem = k.public_key().to_pem().unwrap();
    assert!(pubpem.starts_with("-----BEGIN PUBLIC KEY-----\n"));
    assert_eq!(PublicKey::from_pem(&pubpem).unwrap(), k.public_key());
    assert_eq!(k.public_key().to_clean_pem().unwrap(), pubpem.trim_end());
}

#[test]
fn oaep_sha1_and_sha224_round_trip() {
    let k = key();
    for algo in [EncAlgo::OaepSha1, EncAlgo::OaepSha224] {
        let ct = k.public_key().encrypt(algo, b"token").unwrap();
        assert_eq!(ct.len(), 256);
        assert_eq!(k.decrypt(algo, &ct).unwrap(), b"token");
    }
}

#[test]
fn oaep_decrypt_of_garbage_is_an_error() {
    assert!(key().decrypt(EncAlgo::OaepSha1, &[0u8; 256]).is_err());
    assert!(key().decrypt(EncAlgo::OaepSha1, &[1u8; 3]).is_err());
}

#[test]
fn pkcs1v15_signature_verifies_and_rejects_tampering() {
    let k = key();
    for algo in [SigAlgo::Pkcs1v15Sha1, SigAlgo::Pkcs1v15Sha224] {
        let sig = k.sign(algo, b"load bytes").unwrap();
        assert!(k.public_key().verify(algo, b"load bytes", &sig));
        assert!(!k.public_key().verify(algo, b"load bytez", &sig));
    }
}

#[test]
fn x931_private_encrypt_public_decrypt_round_trip() {
    let k = key();
    for msg in [&b"salt"[..], &[0xab; 64][..], &[7u8; 254][..], b""] {
        let sig = k.private_encrypt_x931(msg).unwrap();
        assert_eq!(sig.len(), 256);
        assert_eq!(k.public_key().public_decrypt_x931(&sig).unwrap(), msg);
    }
}

#[test]
fn x931_is_deterministic_like_salts_tok() {
    let k = key();
    assert_eq!(
        k.private_encrypt_x931(b"salt").unwrap(),
        k.private_encrypt_x931(b"salt").unwrap()
    );
}

#[test]
fn x931_rejects_too_long_messages_and_bad_signatures() {
    let k = key();
    assert!(matches!(
        k.private_encrypt_x931(&[0u8; 255]),
        Err(RsaError::TooLong { .. })
    ));
    let p = k.public_key();
    assert!(p.public_decrypt_x931(&[0u8; 10]).is_err());
    assert!(p.public_decrypt_x931(&[0xffu8; 256]).is_err());
    assert!(p.public_decrypt_x931(&[0x01u8; 256]).is_err());
}

#[test]
fn x931_padding_layout_matches_openssl() {
    assert_eq!(
        x931_pad(b"ab", 6).unwrap(),
        vec![0x6B, 0xBB, 0xBA, b'a', b'b', 0xCC]
    );
    assert_eq!(
        x931_pad(b"ab", 5).unwrap(),
        vec![0x6B, 0xBA, b'a', b'b', 0xCC]
    );
    assert_eq!(x931_pad(b"ab", 4).unwrap(), vec![0x6A, b'a', b'b', 0xCC]);
    for k in 4..8 {
        assert_eq!(x931_unpad(&x931_pad(b"ab", k).unwrap()).unwrap(), b"ab");
    }
    assert!(x931_unpad(&[0x6B, 0xBB, 0xCC]).is_err());
    assert!(x931_unpad(&[0x6C, 0xCC]).is_err());
    assert!(x931_unpad(&[]).is_err());
}

#[test]
fn algorithm_names_parse_as_salt_spells_them() {
    assert_eq!(EncAlgo::parse("OAEP-SHA1").unwrap(), EncAlgo::OaepSha1);
    assert_eq!(
        SigAlgo::parse("PKCS1v15-SHA224").unwrap(),
        SigAlgo::Pkcs1v15Sha224
    );
    assert!(EncAlgo::parse("OAEP-SHA256").is_err());
}

#[test]
fn pem_with_wrong_label_is_refused() {
    let err = PublicKey::from_pem("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----")
        .unwrap_err();
    assert!(matches!(err, RsaError::UnsupportedLabel(_)));
}

#[test]
fn fast_pkcs1v15_verify_agrees_with_the_rsa_crate() {
    use ::rsa::traits::PublicKeyParts;
    let k = key();
    let public = k.public_key();
    for algo in [SigAlgo::Pkcs1v15Sha1, SigAlgo::Pkcs1v15Sha224] {
        let sig = k.sign(algo, b"publish load").unwrap();
        let crate_says = |m: &[u8], s: &[u8]| {
            let (scheme, digest) = algo.scheme_and_digest(m);
            public.0.verify(scheme, &digest, s).is_ok()
        };
        assert!(public.verify(algo, b"publish load", &sig));
        assert!(crate_says(b"publish load", &sig));
        // Every single-bit flip of the signature fails both ways.
        for i in [0, 1, 17, sig.len() / 2, sig.len() - 1] {
            let mut bad = sig.clone();
            bad[i] ^= 0x01;
            assert_eq!(
                public.verify(algo, b"publish load", &bad),
                crate_says(b"publish load", &bad)
            );
            assert!(!public.verify(algo, b"publish load", &bad));
        }
        // Wrong length, zero, and a value at or above the modulus are refused.
        assert!(!public.verify(algo, b"publish load", &sig[1..]));
        assert!(!public.verify(algo, b"publish load", &vec![0u8; sig.len()]));
        let n = public.0.n().to_bytes_be();
        assert!(!public.verify(algo, b"publish load", &n));
        assert!(!public.verify(algo, b"publish load", &vec![0xFFu8; sig.len()]));
    }
    // A signature made with one hash does not pass as the other.
    let sig = k.sign(SigAlgo::Pkcs1v15Sha1, b"x").unwrap();
    assert!(!public.verify(SigAlgo::Pkcs1v15Sha224, b"x", &sig));
}

/// OpenSSL does the private-key operations and the encryption; the `rsa` crate, which did
/// them before and which real Salt's messages were checked against, must agree byte for byte:
/// PKCS#1 v1.5 signatures are deterministic, and each side decrypts what the other encrypts.
#[test]
fn openssl_operations_agree_with_the_rsa_crate() {
    use ::rsa::Oaep;
    let k = key();
    let public = k.public_key();
    for algo in [SigAlgo::Pkcs1v15Sha1, SigAlgo::Pkcs1v15Sha224] {
        for msg in [&b""[..], b"load", &[0x5a; 5000][..]] {
            let (scheme, digest) = algo.scheme_and_digest(msg);
            assert_eq!(
                k.sign(algo, msg).unwrap(),
                k.0.sign(scheme, &digest).unwrap(),
                "{algo:?}"
            );
        }
    }
    let padding_of = |algo| match algo {
        EncAlgo::OaepSha1 => Oaep::new::<Sha1>(),
        EncAlgo::OaepSha224 => Oaep::new::<Sha224>(),
    };
    for algo in [EncAlgo::OaepSha1, EncAlgo::OaepSha224] {
        let padding = || padding_of(algo);
        let ours = public.encrypt(algo, b"session key").unwrap();
        assert_eq!(k.0.decrypt(padding(), &ours).unwrap(), b"session key");
        assert_ne!(
            public.encrypt(algo, b"session key").unwrap(),
            ours,
            "fresh seed"
        );
        let theirs = public.0.encrypt(&mut OsRng, padding(), b"token").unwrap();
        assert_eq!(k.decrypt(algo, &theirs).unwrap(), b"token");
        // The other hash, or one flipped bit, does not decrypt (an error, not a panic).
        let other = match algo {
            EncAlgo::OaepSha1 => EncAlgo::OaepSha224,
            EncAlgo::OaepSha224 => EncAlgo::OaepSha1,
        };
        assert!(k.decrypt(other, &theirs).is_err());
        let mut flipped = theirs.clone();
        flipped[100] ^= 0x04;
        assert!(k.decrypt(algo, &flipped).is_err());
    }
    // Too long a message for OAEP with a 2048-bit key is an error.
    assert!(public.encrypt(EncAlgo::OaepSha1, &[0u8; 215]).is_err());
    assert!(public.encrypt(EncAlgo::OaepSha1, &[0u8; 214]).is_ok());
}

#[test]
fn a_pkcs8_private_key_works_in_openssl_too() {
    use ::rsa::pkcs8::EncodePrivateKey;
    let der = key().0.to_pkcs8_der().unwrap();
    let pem = crate::pem::encode("PRIVATE KEY", der.as_bytes());
    let k = PrivateKey::from_pem(&pem).unwrap();
    let ct = key().public_key().encrypt(EncAlgo::OaepSha1, b"x").unwrap();
    assert_eq!(k.decrypt(EncAlgo::OaepSha1, &ct).unwrap(), b"x");
    assert_eq!(
        k.sign(SigAlgo::Pkcs1v15Sha1, b"m").unwrap(),
        key().sign(SigAlgo::Pkcs1v15Sha1, b"m").unwrap()
    );
}
