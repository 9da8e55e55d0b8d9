//! Configuration errors and warnings: every one names the file, the line, the field and the fix.
//!
//! Owns the error types shared by the YAML loader and the HAProxy importer. Does not decide what is
//! valid; the loaders do.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in a file something was found. Lines and columns are 1-based; 0 means unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub file: Option<PathBuf>,
    pub line: u32,
    pub column: u32,
}

impl Position {
    pub fn new(file: Option<&Path>, line: u32, column: u32) -> Self {
        Self {
            file: file.map(Path::to_path_buf),
            line,
            column,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self
            .file
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<config>".to_string());
        match (self.line, self.column) {
            (0, _) => write!(f, "{file}"),
            (l, 0) => write!(f, "{file}:{l}"),
            (l, c) => write!(f, "{file}:{l}:{c}"),
        }
    }
}

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub at: Position,
    /// The field (YAML path such as `listeners.publish.timeout_client`) or HAProxy directive.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

impl ConfigError {
    pub fn new(
        at: Position,
        field: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            at,
            field: field.into(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.at)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", Visible(&self.field))?;
        }
        write!(f, "{}", Visible(&self.message))?;
        if !self.fix.is_empty() {
            write!(f, "; {}", self.fix)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Writes a text quoted from the input with its control characters escaped (`\u{0}`), so that
/// an error about a NUL or an escape sequence shows the byte instead of nothing, or of a
/// terminal command.
struct Visible<'a>(&'a str);

impl fmt::Display for Visible<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The rule every terminal output follows (control, bidi and invisible format
        // characters escaped); `\` is kept as is: a message quotes the operator's own file.
        for c in self.0.chars() {
            if saltgate_display::is_unsafe_for_terminal(c) {
                write!(f, "{}", c.escape_unicode())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// All the problems found in one file; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn one(e: ConfigError) -> Self {
        Self(vec![e])
    }
    pub fn first(&self) -> &ConfigError {
        &self.0[0]
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Something accepted but worth telling the operator (an HAProxy directive with no meaning here, a
/// missing timeout that HAProxy would also warn about).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub at: Position,
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}
