//! The transport seam holds: outside `wire`, the sources of proxy, master-core and minion reach
//! Salt's transports only through `saltgate_wire::transport`, never by naming `zmtp`, `probe` or
//! `sniff` (ZeroMQ's implementation of the seam). Their tests may (they are ZeroMQ peers).

use std::path::{Path, PathBuf};

/// Paths that name ZeroMQ's implementation instead of the seam.
const FORBIDDEN: [&str; 3] = [
    "saltgate_wire::zmtp",
    "saltgate_wire::probe",
    "saltgate_wire::sniff",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a line: without a `//` comment (doc comments may mention the modules).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// Lines of `text` that name a forbidden path, as `(line number, line)`.
fn offenders(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    // `use saltgate_wire::{zmtp, ..}` spread over lines: track the open brace of a wire import.
    let mut in_wire_group = false;
    for (i, line) in text.lines().enumerate() {
        let c = code(line).replace(' ', "");
        if c.contains("saltgate_wire::{") {
            in_wire_group = true;
        }
        let grouped = in_wire_group
            && c.split([',', '{', '}']).any(|w| {
                ["zmtp", "probe", "sniff"]
                    .iter()
                    .any(|m| w == *m || w.strip_prefix(m).is_some_and(|r| r.starts_with("::")))
            });
        if grouped || FORBIDDEN.iter().any(|f| c.contains(f)) {
            found.push((i + 1, line.trim().to_string()));
        }
        if in_wire_group && c.contains(';') {
            in_wire_group = false;
        }
    }
    found
}

#[test]
fn the_offender_check_sees_the_spellings_it_forbids() {
    assert_eq!(offenders("use saltgate_wire::zmtp::Frame;").len(), 1);
    assert_eq!(
        offenders("let x = saltgate_wire::probe::salt_ping;").len(),
        1
    );
    assert_eq!(
        offenders("use saltgate_wire::{\n    envelope,\n    zmtp::Frame,\n};").len(),
        1
    );
    assert_eq!(offenders("use saltgate_wire::{envelope, sniff};").len(), 1);
    assert_eq!(
        offenders("use saltgate_wire::{probe::salt_ping, envelope};").len(),
        1
    );
    assert!(offenders("use saltgate_wire::{envelope, probes};").is_empty());
    assert!(offenders("use saltgate_wire::transport::zeromq::Frame;").is_empty());
    assert!(offenders("/// see [`saltgate_wire::zmtp`]").is_empty());
    assert!(offenders("let label = \"zmtp_protocol\";").is_empty());
}

#[test]
fn proxy_master_and_minion_sources_name_only_the_seam() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["proxy", "master-core", "minion"] {
        let src = root.join(krate).join("src");
        assert!(src.is_dir(), "{} is missing", src.display());
        rust_files(&src, &mut files);
    }
    assert!(!files.is_empty());
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (n, line) in offenders(&text) {
            bad.push(format!("{}:{n}: {line}", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "these name ZeroMQ's implementation; use saltgate_wire::transport (the seam) or, for \
         byte-level ZMTP, saltgate_wire::transport::zeromq:\n{}",
        bad.join("\n")
    );
}
