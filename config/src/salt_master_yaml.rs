//! YAML plumbing of `salt_master.rs` (kept apart for its size): the top-level keys of a file
//! with their lines, and a serde error as a [`ConfigError`] naming the key.

use std::path::Path;

use crate::error::{ConfigError, Position};

/// The top-level keys of a block-style YAML mapping with their 1-based lines.
pub(super) fn top_level_keys(text: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let Some(first) = line.chars().next() else {
            continue;
        };
        if first.is_whitespace() || matches!(first, '#' | '-' | '{' | '[' | '}' | ']') {
            continue;
        }
        if let Some((key, _)) = line.split_once(':') {
            let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
            if !key.is_empty() {
                out.push((key.to_string(), u32::try_from(no + 1).unwrap_or(u32::MAX)));
            }
        }
    }
    out
}

pub(super) fn serde_error(e: &serde_saphyr::Error, text: &str, file: Option<&Path>) -> ConfigError {
    let (line, column) = e
        .location()
        .map(|l| {
            (
                u32::try_from(l.line()).unwrap_or(u32::MAX),
                u32::try_from(l.column()).unwrap_or(u32::MAX),
            )
        })
        .unwrap_or((0, 0));
    let display = e.to_string();
    let first = display.lines().next().unwrap_or("invalid YAML").trim();
    let message = first
        .strip_prefix("error: ")
        .map(|rest| match rest.split_once(": ") {
            Some((p, m)) if p.starts_with("line ") => m,
            _ => rest,
        })
        .unwrap_or(first)
        .to_string();
    let field = crate::yaml::yaml_path_at(text, line);
    let fix = if line == 0 {
        "check that the file is YAML"
    } else {
        "write a value of the type Salt expects for this key (see docs/master.md)"
    };
    ConfigError::new(Position::new(file, line, column), field, message, fix)
}
