//! Tests of MultiMaster-PKI signing (`signing.rs`) against bytes made by real Salt 3008.5.

use std::os::unix::fs::PermissionsExt;

use saltgate_test_support::pki_fixture as fx;
use saltgate_wire::envelope::as_str;

use super::*;

fn config(dir: &Path) -> SaltMasterConfig {
    let mut c = SaltMasterConfig::with_defaults("mm1");
    c.pki_dir = dir.join("pki");
    c
}

fn with_fixture_keys(dir: &Path) -> SaltMasterConfig {
    let c = config(dir);
    std::fs::create_dir_all(&c.pki_dir).unwrap();
    std::fs::write(c.pki_dir.join("master_sign.pem"), fx::SIGN_PEM).unwrap();
    std::fs::write(c.pki_dir.join("master.pub"), fx::MASTER_PUB).unwrap();
    c
}

#[test]
fn pub_sig_at_auth_time_is_byte_for_byte_salts() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = with_fixture_keys(dir.path());
    c.signing.sign_pubkey = true;
    let ps = PubSig::load(&c).unwrap().expect("signing on");
    let pub_pem = clean_key(fx::MASTER_PUB);
    for (algo, want) in [
        (SigAlgo::Pkcs1v15Sha1, fx::SALT_SIG),
        (SigAlgo::Pkcs1v15Sha224, fx::SALT_SIG224),
    ] {
        let v = ps.value(&pub_pem, algo).unwrap();
        assert_eq!(as_str(&v), Some(want), "{algo:?}");
        // Kept, and the same the second time.
        assert_eq!(as_str(&ps.value(&pub_pem, algo).unwrap()), Some(want));
    }
    // Salt's signature verifies with the signing key's public half in Rust too.
    let sig = a2b_base64(fx::SALT_SIG.as_bytes()).unwrap();
    let vk = PublicKey::from_pem(fx::SIGN_PUB).unwrap();
    assert!(vk.verify(SigAlgo::Pkcs1v15Sha1, pub_pem.as_bytes(), &sig));
    assert!(!vk.verify(SigAlgo::Pkcs1v15Sha1, b"another key", &sig));
}

#[test]
fn off_by_default_and_signing_pair_created_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    assert!(PubSig::load(&c).unwrap().is_none());
    c.signing.sign_pubkey = true;
    c.signing.key_name = "mysign".into();
    let ps = PubSig::load(&c).unwrap().unwrap();
    assert!(matches!(ps, PubSig::Sign { .. }));
    let pem = c.pki_dir.join("mysign.pem");
    let pub_path = c.pki_dir.join("mysign.pub");
    assert_eq!(
        std::fs::metadata(&pem).unwrap().permissions().mode() & 0o777,
        0o400
    );
    // The created pair signs what its public half verifies.
    let v = ps.value("some key", SigAlgo::Pkcs1v15Sha1).unwrap();
    let sig = a2b_base64(as_str(&v).unwrap().as_bytes()).unwrap();
    let vk = PublicKey::from_pem(&std::fs::read_to_string(pub_path).unwrap()).unwrap();
    assert!(vk.verify(SigAlgo::Pkcs1v15Sha1, b"some key", &sig));
}

#[test]
fn signature_file_is_served_clean_and_its_absence_stops_the_master() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = with_fixture_keys(dir.path());
    c.signing.sign_pubkey = true;
    c.signing.use_signature_file = true;
    let e = PubSig::load(&c).unwrap_err();
    assert!(matches!(e, KeyError::SignatureMissing { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("mm1_pubkey_signature") && msg.contains("gen-signature"),
        "{msg}"
    );
    std::fs::write(c.pki_dir.join("mm1_pubkey_signature"), fx::SALT_SIG).unwrap();
    let ps = PubSig::load(&c).unwrap().unwrap();
    let v = ps.value("ignored", SigAlgo::Pkcs1v15Sha1).unwrap();
    assert_eq!(as_str(&v), Some(clean_key(fx::SALT_SIG).as_str()));
    // Without master_sign_pubkey the file is not even read.
    c.signing.sign_pubkey = false;
    assert!(PubSig::load(&c).unwrap().is_none());
}

#[test]
fn gen_signature_writes_salts_bytes_and_refuses_what_salt_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let c = with_fixture_keys(dir.path());
    let path = gen_signature(&c, &GenSignature::default()).unwrap();
    assert_eq!(path, c.pki_dir.join("mm1_pubkey_signature"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), fx::SALT_SIG);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o400
    );
    // A second run does not overwrite it.
    let e = gen_signature(&c, &GenSignature::default()).unwrap_err();
    assert!(matches!(e, GenSignatureError::Exists(_)), "{e}");
    // --signature-path and master_pubkey_signature name the file.
    let mut named = c.clone();
    named.signing.signature_file = Some("sig.b64".into());
    let out = dir.path().join("out");
    let opts = GenSignature {
        signature_dir: Some(out.clone()),
        ..Default::default()
    };
    let p = gen_signature(&named, &opts).unwrap();
    assert_eq!(p, out.join("sig.b64"));
    assert_eq!(std::fs::read_to_string(p).unwrap(), fx::SALT_SIG);
    // Named files that do not exist are refused with Salt's words.
    for (opts, want) in [
        (
            GenSignature {
                private: Some(dir.path().join("nope.pem")),
                signature_dir: Some(dir.path().join("o2")),
                ..Default::default()
            },
            "Private-key",
        ),
        (
            GenSignature {
                public: Some(dir.path().join("nope.pub")),
                ..Default::default()
            },
            "Public-key",
        ),
    ] {
        let e = gen_signature(&c, &opts).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("does not exist"), "{e}");
    }
}

#[test]
fn gen_signature_without_a_signing_key_needs_auto_create() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    std::fs::create_dir_all(&c.pki_dir).unwrap();
    std::fs::write(c.pki_dir.join("master.pub"), fx::MASTER_PUB).unwrap();
    let e = gen_signature(&c, &GenSignature::default()).unwrap_err();
    assert!(matches!(e, GenSignatureError::NoUsablePrivate(_)), "{e}");
    assert!(e.to_string().contains("--auto-create"));
    let opts = GenSignature {
        auto_create: true,
        ..Default::default()
    };
    let p = gen_signature(&c, &opts).unwrap();
    let sig = a2b_base64(&std::fs::read(p).unwrap()).unwrap();
    let vk =
        PublicKey::from_pem(&std::fs::read_to_string(c.pki_dir.join("master_sign.pub")).unwrap())
            .unwrap();
    let msg = clean_key(fx::MASTER_PUB);
    assert!(vk.verify(SigAlgo::Pkcs1v15Sha1, msg.as_bytes(), &sig));
}
