//! YAML syntax errors in saltgate's words: the position, the key path at a line, and a fix per kind
//! of syntax mistake; and the key path at a line (also used by the Salt master and minion files).

use std::path::Path;

use crate::error::{ConfigError, Position};

/// A YAML syntax error: where it is and how such errors are usually fixed.
pub(crate) fn syntax_error(
    e: &serde_saphyr::Error,
    text: &str,
    file: Option<&Path>,
) -> ConfigError {
    let (line, column) = e
        .location()
        .map(|l| (clamp(l.line()), clamp(l.column())))
        .unwrap_or((0, 0));
    let display = e.to_string();
    let first = display.lines().next().unwrap_or("invalid YAML").trim();
    // "error: line 4 column 14: did not find expected key" -> "did not find expected key"
    let detail = first
        .strip_prefix("error: ")
        .map(|rest| match rest.split_once(": ") {
            Some((pos, m)) if pos.starts_with("line ") => m,
            _ => rest,
        })
        .unwrap_or(first);
    let lower = detail.to_ascii_lowercase();
    let too_big = ["budget", "limit", "recursion"]
        .iter()
        .any(|w| lower.contains(w));
    let fix = if too_big {
        "the file is too large or too deeply nested for a saltgate configuration: check that it is the right file"
    } else if lower.contains("tab") {
        "indent with spaces: YAML does not allow tabs for indentation"
    } else if lower.contains("mapping values are not allowed") {
        "a value contains ': ' or a key is indented too deep: quote the value, or line the key up with its neighbours"
    } else if lower.contains("quote") || lower.contains("scalar") && lower.contains("end") {
        "a quoted value is not closed: find where it starts above this point and close it (or escape the quote inside it)"
    } else if lower.contains("alias") || lower.contains("anchor") {
        "define the anchor (&name) before using it (*name), or quote a value that starts with '*' or '&'"
    } else if line == 0 {
        "check that the file is a YAML configuration (see examples/saltgate.yaml)"
    } else {
        "check the indentation (spaces, keys of one mapping lined up) and the ': ' after each key; quote values that start with '*', '&', '!', '{', '[', '@' or '%'"
    };
    ConfigError::new(
        Position::new(file, line, column),
        yaml_path_at(text, line),
        if too_big {
            format!("YAML not read: {detail}")
        } else {
            format!("YAML syntax error: {detail}")
        },
        fix,
    )
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The YAML key path (`listeners.publish.retries`, `masters[1].host`) of the key on `line`.
/// Good enough for block-style configuration files; flow style yields the enclosing key.
pub fn yaml_path_at(text: &str, line: u32) -> String {
    // (indent, segment, is_list_index)
    let mut stack: Vec<(usize, String, bool)> = Vec::new();
    for (no, raw) in text.lines().enumerate() {
        if no as u32 >= line {
            break;
        }
        let content = raw.split(" #").next().unwrap_or("");
        let trimmed = content.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("---") {
            continue;
        }
        let mut indent = content.len() - trimmed.len();
        let mut rest = trimmed;
        if rest == "-" || rest.starts_with("- ") {
            while stack.last().is_some_and(|t| t.0 > indent) {
                stack.pop();
            }
            match stack.last_mut() {
                Some(top) if top.2 && top.0 == indent => {
                    let n: usize = top
                        .1
                        .trim_matches(|c| c == '[' || c == ']')
                        .parse()
                        .unwrap_or(0);
                    top.1 = format!("[{}]", n + 1);
                }
                _ => stack.push((indent, "[0]".to_string(), true)),
            }
            rest = rest.get(2..).unwrap_or("").trim_start();
            indent += 2;
        }
        if let Some((key, _)) = rest.split_once(':') {
            let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
            if key.is_empty() || key.contains(' ') && !key.starts_with('"') {
                continue;
            }
            while stack.last().is_some_and(|t| t.0 >= indent) {
                stack.pop();
            }
            stack.push((indent, key.to_string(), false));
        }
    }
    let mut out = String::new();
    for (_, seg, is_index) in stack {
        if !is_index && !out.is_empty() {
            out.push('.');
        }
        out.push_str(&seg);
    }
    out
}
