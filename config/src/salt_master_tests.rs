//! Tests of the salt-master file reader (`salt_master.rs`).
use super::*;

#[test]
fn empty_file_gives_salt_defaults() {
    let l = parse_salt_master("# nothing\n", None).unwrap();
    assert_eq!(l.config.publish_port, 4505);
    assert_eq!(l.config.ret_port, 4506);
    assert_eq!(l.config.interface.to_string(), "0.0.0.0");
    assert_eq!(l.config.keep_jobs_secs, 24 * 3600);
    assert!(!l.config.auto_accept);
    assert!(l.config.id.ends_with("_master"));
    assert_eq!(l.config.pki_dir, PathBuf::from("/etc/salt/pki/master"));
}

#[test]
fn known_keys_are_read() {
    let text = "id: m1\ninterface: 127.0.1.5\npublish_port: 14505\nret_port: 14506\n\
                pki_dir: /tmp/p\ncachedir: /tmp/c\nsock_dir: /tmp/s\nauto_accept: true\n\
                keep_jobs: 2\nfile_roots:\n  base:\n    - /srv/a\npillar_roots:\n  base: [/srv/p]\n";
    let c = parse_salt_master(text, None).unwrap().config;
    assert_eq!(c.id, "m1");
    assert_eq!(c.interface.to_string(), "127.0.1.5");
    assert_eq!((c.publish_port, c.ret_port), (14505, 14506));
    assert!(c.auto_accept);
    assert_eq!(c.keep_jobs_secs, 2 * 3600);
    assert_eq!(c.publish_session_secs, 86_400);
    assert!(c.rotate_aes_key);
    let r = parse_salt_master("publish_session: 0\nrotate_aes_key: False\n", None).unwrap();
    assert_eq!(r.config.publish_session_secs, 0);
    assert!(!r.config.rotate_aes_key);
    let secs = parse_salt_master("keep_jobs: 2\nkeep_jobs_seconds: 60\n", None)
        .unwrap()
        .config;
    assert_eq!(secs.keep_jobs_secs, 60);
    assert_eq!(c.pillar_roots["base"], vec![PathBuf::from("/srv/p")]);
    assert_eq!(c.file_roots["base"], vec![PathBuf::from("/srv/a")]);
}

#[test]
fn unknown_keys_are_warned_not_fatal() {
    let l = parse_salt_master("id: m\nfoo_bar: 1\nuser: root\nworker_threads: 5\n", None).unwrap();
    let msgs: Vec<String> = l.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains(":2:") && m.contains("foo_bar")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter().any(|m| m.contains("worker_threads")),
        "{msgs:?}"
    );
    assert!(!msgs.iter().any(|m| m.contains("user")), "{msgs:?}");
}

#[test]
fn open_mode_is_refused_with_its_line() {
    let e = parse_salt_master("id: m\nopen_mode: True\n", None).unwrap_err();
    let f = e.first();
    assert_eq!((f.field.as_str(), f.at.line), ("open_mode", 2));
    assert!(f.fix.contains("key accept"));
}

#[test]
fn bad_values_name_line_field_and_fix() {
    let e =
        parse_salt_master("id: m\npublish_port: seventy\n", Some(Path::new("m.yaml"))).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("m.yaml:2"), "{s}");
    assert!(s.contains("publish_port"), "{s}");
    let e = parse_salt_master("interface: not-an-ip\n", None).unwrap_err();
    assert_eq!(e.first().field, "interface");
    assert_eq!(e.first().at.line, 1);
    let e = parse_salt_master("publish_port: 4506\n", None).unwrap_err();
    assert_eq!(e.first().field, "ret_port");
    let e = parse_salt_master("id: ../etc\n", None).unwrap_err();
    assert_eq!(e.first().field, "id");
}

#[test]
fn the_metrics_endpoint_is_opt_in_and_its_address_checked() {
    assert_eq!(
        parse_salt_master("id: m\n", None)
            .unwrap()
            .config
            .metrics_bind,
        None
    );
    let c = parse_salt_master("id: m\nsaltgate_metrics_bind: '[::1]:9506'\n", None).unwrap();
    assert_eq!(c.config.metrics_bind, Some("[::1]:9506".parse().unwrap()));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    for bad in ["9506", "localhost:9506", "10.0.0.1"] {
        let text = format!("id: m\nsaltgate_metrics_bind: {bad}\n");
        let e = parse_salt_master(&text, None).unwrap_err();
        let f = e.first();
        assert_eq!(
            (f.field.as_str(), f.at.line),
            ("saltgate_metrics_bind", 2),
            "{bad}"
        );
        assert!(f.fix.contains("IP:PORT"), "{bad}: {}", f.fix);
    }
}

#[test]
fn limits_default_to_safe_values_and_refuse_zero() {
    let c = parse_salt_master("id: m\n", None).unwrap().config;
    assert_eq!(c.limits, MasterLimits::default());
    assert_eq!(c.limits.max_clear_load, 64 * 1024);
    let c = parse_salt_master(
        "saltgate_max_clear_load: 1024\nsaltgate_cluster_max_unauthenticated: 3\nsaltgate_frame_timeout: 5\n",
        None,
    )
    .unwrap()
    .config;
    assert_eq!(
        (
            c.limits.max_clear_load,
            c.limits.cluster_max_unauthenticated
        ),
        (1024, 3)
    );
    assert_eq!(c.limits.frame_timeout_secs, 5);
    assert_eq!(
        MasterLimits::default().untrusted_queue_bytes,
        32 << 20,
        "the documented default"
    );
    let c = parse_salt_master("saltgate_untrusted_queue_bytes: 4194304\n", None)
        .unwrap()
        .config;
    assert_eq!(c.limits.untrusted_queue_bytes, 4 << 20);
    let e = parse_salt_master("saltgate_untrusted_queue_bytes: 0\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("saltgate_untrusted_queue_bytes"), "{e}");
    assert_eq!(MasterLimits::default().request_max_connections, None);
    let c = parse_salt_master(
        "saltgate_request_max_connections: 20000\nsaltgate_publish_max_connections: 30000\n",
        None,
    )
    .unwrap()
    .config;
    assert_eq!(c.limits.request_max_connections, Some(20_000));
    assert_eq!(c.limits.publish_max_connections, Some(30_000));
    let e = parse_salt_master("saltgate_publish_max_connections: 0\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("saltgate_publish_max_connections"), "{e}");
    let e = parse_salt_master("saltgate_write_timeout: 0\n", None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("saltgate_write_timeout") && e.contains("from 1 to"),
        "{e}"
    );
}

#[test]
fn cluster_needs_peers_and_a_secret_unless_insecure_flag() {
    let e = parse_salt_master("cluster_id: c\ncluster_peers: [10.0.0.2]\n", None).unwrap_err();
    assert_eq!(e.first().field, "cluster_secret");
    let e = parse_salt_master("cluster_id: c\ncluster_secret: s\n", None).unwrap_err();
    assert_eq!(e.first().field, "cluster_peers");
    let c = parse_salt_master(
        "cluster_id: c\ncluster_peers: [a]\ncluster_allow_insecure_empty_secret: true\n",
        None,
    )
    .unwrap()
    .config;
    assert!(c.cluster.unwrap().allow_insecure_empty_secret);
    let c = parse_salt_master(
        "pki_dir: /p\ncluster_id: c\ncluster_peers: [a]\ncluster_secret: hunter2\n",
        None,
    )
    .unwrap()
    .config;
    let cl = c.cluster.unwrap();
    assert_eq!(cl.pki_dir, PathBuf::from("/p"));
    assert_eq!(cl.pool_port, 4520);
    assert!(!format!("{cl:?}").contains("hunter2"));
}

#[test]
fn pubkey_signing_options_follow_salt_defaults_and_refuse_paths() {
    let c = parse_salt_master("id: m1\n", None).unwrap();
    assert_eq!(c.config.signing, PubkeySigning::default());
    assert_eq!(c.config.signing.key_name, "master_sign");
    assert_eq!(c.config.pubkey_signature_file(), "m1_pubkey_signature");
    let l = parse_salt_master(
        "id: m1\nmaster_sign_pubkey: True\nmaster_sign_key_name: mysign\n\
         master_pubkey_signature: sig.b64\nmaster_use_pubkey_signature: True\n",
        None,
    )
    .unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let s = &l.config.signing;
    assert!(s.sign_pubkey && s.use_signature_file);
    assert_eq!(s.key_name, "mysign");
    assert_eq!(l.config.pubkey_signature_file(), "sig.b64");
    let c = parse_salt_master("id: m1\nmaster_pubkey_signature: null\n", None).unwrap();
    assert_eq!(c.config.pubkey_signature_file(), "m1_pubkey_signature");
    for (text, field) in [
        ("master_pubkey_signature: ../x\n", "master_pubkey_signature"),
        (
            "master_pubkey_signature: /etc/sig\n",
            "master_pubkey_signature",
        ),
        ("master_sign_key_name: a/b\n", "master_sign_key_name"),
    ] {
        let e = parse_salt_master(text, None).unwrap_err();
        assert_eq!(
            (e.first().field.as_str(), e.first().at.line),
            (field, 1),
            "{text}"
        );
    }
}
