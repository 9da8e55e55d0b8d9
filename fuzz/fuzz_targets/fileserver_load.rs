//! Arbitrary bytes as a decrypted request load through saltgate-master's file server (what a
//! minion's `_file_list`, `_serve_file`, `_file_hash`, … carry): never a panic, and never a
//! byte served from outside the root.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use saltgate_master::fileserver::{clean_rel, handle, Roots, COMMANDS};
use saltgate_master::metrics::Refusals;
use saltgate_wire::envelope;

fn roots() -> &'static Roots {
    static R: OnceLock<Roots> = OnceLock::new();
    R.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("sg-fuzz-fs-{}", std::process::id()));
        let root = base.join("root");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("top.sls"), "base: {}\n").unwrap();
        std::fs::write(base.join("secret"), "SECRET-OUTSIDE-ROOT").unwrap();
        let _ = std::os::unix::fs::symlink(base.join("secret"), root.join("leak"));
        let mut r = Roots::new();
        r.insert("base".into(), vec![root]);
        r.insert("__env__".into(), vec![PathBuf::from(base.join("__env__"))]);
        r
    })
}

static REFUSALS: Refusals = Refusals::new();

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(rel) = clean_rel(s) {
            assert!(!rel.starts_with('/') && !rel.split('/').any(|p| p == ".." || p.is_empty()));
        }
    }
    let Ok(load) = envelope::decode(data) else {
        return;
    };
    for cmd in COMMANDS {
        if let Some(reply) = handle(roots(), &REFUSALS, "fuzz", cmd, &load) {
            let bytes = envelope::encode(&reply);
            assert!(
                !bytes.windows(19).any(|w| w == b"SECRET-OUTSIDE-ROOT"),
                "served a file from outside the root"
            );
        }
    }
});
