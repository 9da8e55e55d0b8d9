//! Minion id validation: every id from the network or the command line passes here before any
//! path is built from it.
//!
//! Salt's own check (`salt.utils.verify.valid_id`) refuses `/`, `\` and NUL and then relies on
//! `clean_path`; we refuse more, up front: control characters, `..` anywhere, a leading `.`
//! (hidden files such as `.aes` live next to key files), and ids over 255 bytes (a file name).

use thiserror::Error;

/// The longest id we accept: one path component on Linux.
pub const MAX_ID_LEN: usize = 255;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum IdError {
    #[error("empty minion id")]
    Empty,
    #[error("minion id is {0} bytes; at most 255 are allowed")]
    TooLong(usize),
    #[error("minion id contains {0:?}, which is not allowed")]
    BadChar(char),
    #[error("minion id contains \"..\"")]
    DotDot,
    #[error("minion id starts with '.'")]
    LeadingDot,
}

/// Checks that `id` is safe to use as one file name under the PKI and cache directories.
pub fn validate_minion_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong(id.len()));
    }
    if let Some(c) = id
        .chars()
        .find(|c| matches!(c, '/' | '\\' | '\0') || c.is_control())
    {
        return Err(IdError::BadChar(c));
    }
    if id.contains("..") {
        return Err(IdError::DotDot);
    }
    if id.starts_with('.') {
        return Err(IdError::LeadingDot);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_tricks_and_control_characters_are_refused() {
        for bad in [
            "", "../etc", "a/b", "a\\b", "a\0b", "..", ".", ".aes", "a..b", "a\nb", "a\x7fb",
        ] {
            assert!(validate_minion_id(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            validate_minion_id(&"a".repeat(256)),
            Err(IdError::TooLong(256))
        );
    }

    #[test]
    fn ordinary_ids_pass() {
        for ok in [
            "web1",
            "web-1.example.com",
            "db_2",
            "m\u{e9}lange",
            &"a".repeat(255),
        ] {
            assert_eq!(validate_minion_id(ok), Ok(()), "{ok:?}");
        }
    }
}
