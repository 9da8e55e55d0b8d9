//! Build script shared by the three binaries (`saltgate`, `saltgate-master`, `saltgate-minion`):
//! sets `SALTGATE_VERSION` to "<crate version> (commit <12 hex>)" for `--version`.
//!
//! The commit comes from `git rev-parse` in the workspace; `SALTGATE_GIT_COMMIT` in the build
//! environment wins (for builds from a source tarball whose commit is known). With neither (a
//! tarball, no git), the commit is "unknown". A checkout nested inside some other repository does
//! not borrow that repository's commit: git's top level must be this workspace.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=SALTGATE_GIT_COMMIT");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let ours = git(&root, &["rev-parse", "--show-toplevel"])
        .map(|top| Path::new(&top).canonicalize().ok() == root.canonicalize().ok())
        .unwrap_or(false);
    let commit = match std::env::var("SALTGATE_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ if ours => {
            // Rebuild when HEAD moves: HEAD itself, the branch it points at, and packed refs.
            for p in ["HEAD", "packed-refs"] {
                if let Some(f) = git(
                    &root,
                    &["rev-parse", "--path-format=absolute", "--git-path", p],
                ) {
                    println!("cargo:rerun-if-changed={f}");
                }
            }
            if let Some(r) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
                if let Some(f) = git(
                    &root,
                    &["rev-parse", "--path-format=absolute", "--git-path", &r],
                ) {
                    println!("cargo:rerun-if-changed={f}");
                }
            }
            git(&root, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
        _ => "unknown".into(),
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=SALTGATE_VERSION={version} (commit {commit})");
    println!("cargo:rustc-env=SALTGATE_COMMIT={commit}");
}
