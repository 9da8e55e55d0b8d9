//! Unit tests of the envelope codecs (split out to keep envelope.rs short).

use super::*;

#[test]
fn clear_ping_encodes_exactly_as_salt_expects() {
    let bytes = RequestEnvelope::ping().encode();
    let mut want = Vec::new();
    want.extend_from_slice(b"\x83\xa3enc\xa5clear\xa4load\x81\xa3cmd\xa4ping\xa7version\x03");
    assert_eq!(bytes, want);
}

#[test]
fn str_typed_binary_load_decodes_as_bytes() {
    // What Python msgpack.packb({"enc":"aes","load":b"\xff\x00\x80"}, use_bin_type=False) emits.
    let wire = b"\x82\xa3enc\xa3aes\xa4load\xa3\xff\x00\x80";
    let env = RequestEnvelope::decode(wire).unwrap();
    assert_eq!(env.enc, "aes");
    assert_eq!(env.load_bytes(), Some(&b"\xff\x00\x80"[..]));
}

#[test]
fn bin_typed_keys_and_values_are_accepted_like_str() {
    let wire = b"\x83\xc4\x03enc\xc4\x05clear\xc4\x04load\x80\xc4\x07version\x03";
    let env = RequestEnvelope::decode(wire).unwrap();
    assert_eq!(env.enc, "clear");
    assert_eq!(env.version, Some(3));
    assert_eq!(env.load, Value::Map(vec![]));
}

#[test]
fn unknown_request_keys_are_kept() {
    let mut env = RequestEnvelope::aes("minion1", b"\x01\x02");
    env.extra.push((text("future"), Value::from(1)));
    let back = RequestEnvelope::decode(&env.encode()).unwrap();
    assert_eq!(back, env);
}

#[test]
fn request_without_load_is_an_error() {
    let err = RequestEnvelope::decode(b"\x81\xa3enc\xa5clear").unwrap_err();
    assert_eq!(err, EnvelopeError::Missing("load"));
    assert_eq!(
        RequestEnvelope::decode(b"\x93\x01\x02\x03").unwrap_err(),
        EnvelopeError::NotAMap
    );
}

#[test]
fn cluster_retry_reply_means_not_ready() {
    let v = map(vec![
        ("enc", text("clear")),
        (
            "load",
            map(vec![
                ("ret", Value::Boolean(false)),
                ("cluster_retry", Value::Boolean(true)),
            ]),
        ),
    ]);
    let reply = Reply::decode(&salt_bytes(&v)).unwrap();
    assert!(reply.is_cluster_retry());
}

#[test]
fn bad_load_reply_is_text_and_ping_echo_is_plain() {
    assert_eq!(
        Reply::decode(b"\xa8bad load").unwrap(),
        Reply::Text("bad load".into())
    );
    let echo = Reply::decode(&encode(&map(vec![("cmd", text("ping"))]))).unwrap();
    assert!(matches!(echo, Reply::Plain(_)));
    assert!(!echo.is_cluster_retry());
    assert!(matches!(
        Reply::decode(b"\xa2\xff\xfe").unwrap(),
        Reply::Encrypted(_)
    ));
}

#[test]
fn publish_envelope_round_trips_and_accepts_str_typed_sig() {
    let p = PublishEnvelope {
        enc: "aes".into(),
        load: vec![0xff, 1, 2],
        sig: Some(vec![9; 256]),
        sig_algo: Some("PKCS1v15-SHA1".into()),
    };
    assert_eq!(PublishEnvelope::decode(&p.encode()).unwrap(), p);
    let compat = encode(&salt_compat(p.to_value()));
    assert_eq!(PublishEnvelope::decode(&compat).unwrap(), p);
}

#[test]
fn salt_compat_turns_bin_into_str_typed_raw() {
    let v = salt_compat(map(vec![("k", bin(b"\xff"))]));
    assert_eq!(encode(&v), b"\x81\xa1k\xa1\xff");
}

#[test]
fn datetime_ext_78_round_trips() {
    let ext = SaltExt::Datetime("20261122T03:37:08.835052".into());
    let v = decode(&encode(&ext.to_value())).unwrap();
    assert_eq!(SaltExt::from_value(&v), Some(ext));
}

#[test]
fn constant_ext_79_decodes_python_packing() {
    // msgpack.dumps(("NOT_SET", None), use_bin_type=True) == b"\x92\xa7NOT_SET\xc0"
    let v = Value::Ext(79, b"\x92\xa7NOT_SET\xc0".to_vec());
    assert_eq!(
        SaltExt::from_value(&v),
        Some(SaltExt::Constant {
            name: "NOT_SET".into(),
            value: Value::Nil
        })
    );
    assert_eq!(SaltExt::from_value(&Value::Ext(79, vec![0xc1])), None);
}

#[test]
fn trailing_bytes_and_truncation_are_errors() {
    assert_eq!(decode(b"\x01\x02"), Err(EnvelopeError::TrailingBytes(1)));
    assert!(decode(b"\xa5ab").is_err());
    assert!(decode(b"").is_err());
    assert!(decode(b"\xdd\xff\xff\xff\xff").is_err());
}

#[test]
fn nesting_deeper_than_the_limit_is_rejected() {
    let deep = vec![0x91u8; MAX_DEPTH + 10];
    assert!(decode(&deep).is_err());
}

fn salt_bytes(v: &Value) -> Vec<u8> {
    encode(&salt_compat(v.clone()))
}
