//! Salt's key-state rules for `_auth` (`salt/master.py` `_auth_impl_sync`), as a pure decision,
//! plus `autosign_file` matching.
//!
//! `open_mode` is not implemented on purpose (the config refuses it), and `autoreject_file`,
//! `autosign_grains` and `max_minions` are not supported (see docs/master.md).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::keys::{same_key, KeyState};
use crate::target::glob_match;

/// What `_auth` does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthDecision {
    /// Reply with the keys; store the key as accepted first when `store` is set.
    Accept { store: bool },
    /// Store the key as pending (when `store`), reply `ret: True` ("wait").
    Pending { store: bool },
    /// Reply `ret: False`: the id's key is rejected.
    Rejected,
    /// Reply `ret: False` and record the offered key in `minions_denied`: it differs from the
    /// key already stored for the id.
    Denied,
}

impl AuthDecision {
    /// A short label for logs.
    pub fn label(&self) -> &'static str {
        match self {
            AuthDecision::Accept { .. } => "accept",
            AuthDecision::Pending { .. } => "pend",
            AuthDecision::Rejected => "reject",
            AuthDecision::Denied => "denied",
        }
    }
}

/// Salt's rules: `existing` is the stored key (accepted, pending or rejected), `offered` the key
/// in the request, `auto_sign` whether `auto_accept` or `autosign_file` matches the id.
pub fn decide(existing: Option<(KeyState, &str)>, offered: &str, auto_sign: bool) -> AuthDecision {
    match existing {
        Some((KeyState::Rejected, _)) => AuthDecision::Rejected,
        Some((KeyState::Accepted, stored)) => {
            if same_key(stored, offered) {
                AuthDecision::Accept { store: false }
            } else {
                AuthDecision::Denied
            }
        }
        Some((KeyState::Pending, stored)) => {
            if !same_key(stored, offered) {
                AuthDecision::Denied
            } else if auto_sign {
                AuthDecision::Accept { store: true }
            } else {
                AuthDecision::Pending { store: false }
            }
        }
        // `fetch` never returns denied; treat it as unknown.
        Some((KeyState::Denied, _)) | None => {
            if auto_sign {
                AuthDecision::Accept { store: true }
            } else {
                AuthDecision::Pending { store: true }
            }
        }
    }
}

/// Salt's `check_autosign` for `autosign_file`: the file must not be writable by group or
/// others (Salt's `check_permissions` without `permissive_pki_access`); each non-comment line is
/// an exact id, a glob, or a regular expression matched against the whole id.
pub fn autosign_file_matches(path: &Path, id: &str) -> bool {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "autosign_file unreadable; no autosign");
            return false;
        }
    };
    if meta.permissions().mode() & 0o022 != 0 {
        tracing::warn!(
            path = %path.display(),
            "autosign_file is writable by group or others; ignored (chmod 0600 it)"
        );
        return false;
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .any(|line| {
            line == id
                || glob_match(line, id)
                || regex::Regex::new(&format!("^(?:{line})$")).is_ok_and(|re| re.is_match(id))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----";
    const B: &str = "-----BEGIN PUBLIC KEY-----\nBBBB\n-----END PUBLIC KEY-----";

    #[test]
    fn salt_key_state_rules() {
        use AuthDecision as D;
        use KeyState as K;
        type Case<'a> = (Option<(KeyState, &'a str)>, &'a str, bool, AuthDecision);
        let cases: &[Case] = &[
            (None, A, false, D::Pending { store: true }),
            (None, A, true, D::Accept { store: true }),
            (Some((K::Pending, A)), A, false, D::Pending { store: false }),
            (Some((K::Pending, A)), A, true, D::Accept { store: true }),
            (Some((K::Pending, A)), B, false, D::Denied),
            (Some((K::Pending, A)), B, true, D::Denied),
            (Some((K::Accepted, A)), A, false, D::Accept { store: false }),
            (Some((K::Accepted, A)), B, true, D::Denied),
            (Some((K::Rejected, A)), A, true, D::Rejected),
            (Some((K::Rejected, A)), B, false, D::Rejected),
        ];
        for (existing, offered, auto, want) in cases {
            assert_eq!(
                decide(*existing, offered, *auto),
                *want,
                "{existing:?} {auto}"
            );
        }
    }

    #[test]
    fn keys_compare_after_clean_key() {
        let crlf = format!("\n{}\r\n", A.replace('\n', "\r\n"));
        assert_eq!(
            decide(Some((KeyState::Accepted, A)), &crlf, false),
            AuthDecision::Accept { store: false }
        );
    }

    #[test]
    fn autosign_file_lines_are_exact_glob_or_regex_and_permissions_matter() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("autosign.conf");
        std::fs::write(&f, "# comment\nexact-one\nweb*\n^db[0-9]+$\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(autosign_file_matches(&f, "exact-one"));
        assert!(autosign_file_matches(&f, "web12"));
        assert!(autosign_file_matches(&f, "db7"));
        assert!(!autosign_file_matches(&f, "comment"));
        assert!(!autosign_file_matches(&f, "mail1"));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            !autosign_file_matches(&f, "web12"),
            "world-writable file must be ignored"
        );
        assert!(!autosign_file_matches(&d.path().join("missing"), "web1"));
    }
}
