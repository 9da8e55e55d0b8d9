//! PEM text exactly as Salt writes and compares it.
//!
//! Salt writes private keys as PKCS#1 `BEGIN RSA PRIVATE KEY` and public keys as SPKI
//! `BEGIN PUBLIC KEY`, base64 in 64-column lines, `\n` endings, one trailing newline (what
//! Python `cryptography` emits). Keys are compared as text after [`clean_key`] (stripped, `\n`
//! line endings, no trailing newline), so byte-exact text matters. [`pem_finger`] is Salt's
//! `master_finger` fingerprint.

use base64::Engine;
use sha2::{Digest, Sha256};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PemError {
    #[error("no PEM BEGIN line")]
    NoBegin,
    #[error("no matching END line for {0:?}")]
    NoEnd(String),
    #[error("PEM body is not base64")]
    BadBase64,
}

/// Salt's `clean_key`: `"\n".join(key.strip().splitlines())`.
pub fn clean_key(key: &str) -> String {
    key.trim()
        .lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Encodes DER as PEM with 64-column lines and a trailing newline.
pub fn encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Decodes the first PEM block: its label and DER bytes. Tolerates `\r\n` and surrounding text.
pub fn decode(text: &str) -> Result<(String, Vec<u8>), PemError> {
    let mut lines = text.lines().map(str::trim);
    let label = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
        .ok_or(PemError::NoBegin)?
        .to_owned();
    let end = format!("-----END {label}-----");
    let mut body = String::new();
    let mut ended = false;
    for line in lines {
        if line == end {
            ended = true;
            break;
        }
        body.push_str(line);
    }
    if !ended {
        return Err(PemError::NoEnd(label));
    }
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| PemError::BadBase64)?;
    Ok((label, der))
}

/// Salt's `pem_finger` for a key file's text: sha256 over the non-blank lines between the
/// BEGIN and END lines (each with its `\n`), as colon-separated hex pairs.
pub fn pem_finger(pem: &str) -> String {
    let lines: Vec<&str> = pem
        .split_inclusive('\n')
        .filter(|l| !l.trim().is_empty())
        .collect();
    let inner = match lines.len() {
        0..=2 => &[][..],
        n => lines.get(1..n - 1).unwrap_or(&[]),
    };
    let mut h = Sha256::new();
    for l in inner {
        h.update(l.replace("\r\n", "\n").as_bytes());
    }
    let hex: Vec<String> = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    hex.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_key_strips_and_normalises_line_endings() {
        assert_eq!(
            clean_key("\n-----A-----\r\nxyz\r\n-----B-----\n\n"),
            "-----A-----\nxyz\n-----B-----"
        );
    }

    #[test]
    fn encode_wraps_at_64_columns_with_trailing_newline() {
        let pem = encode("PUBLIC KEY", &[0u8; 60]);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN PUBLIC KEY-----");
        assert_eq!(lines[1].len(), 64);
        assert_eq!(lines[2].len(), 16);
        assert_eq!(lines[3], "-----END PUBLIC KEY-----");
        assert!(pem.ends_with("-----\n"));
        assert_eq!(decode(&pem).unwrap(), ("PUBLIC KEY".into(), vec![0u8; 60]));
    }

    #[test]
    fn decode_rejects_missing_end_and_bad_base64() {
        assert_eq!(decode("nothing"), Err(PemError::NoBegin));
        assert_eq!(
            decode("-----BEGIN X-----\nAAAA\n"),
            Err(PemError::NoEnd("X".into()))
        );
        assert_eq!(
            decode("-----BEGIN X-----\n!!\n-----END X-----"),
            Err(PemError::BadBase64)
        );
    }

    #[test]
    fn finger_hashes_body_lines_with_newlines() {
        let pem = "-----BEGIN PUBLIC KEY-----\nAAAA\nBBBB\n-----END PUBLIC KEY-----\n";
        let mut h = Sha256::new();
        h.update(b"AAAA\nBBBB\n");
        let want: Vec<String> = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(pem_finger(pem), want.join(":"));
    }
}
