//! saltgate's configuration: plain data, no sockets.
//!
//! - [`yaml`]: saltgate's own YAML file, validated into [`Config`].
//! - [`haproxy`]: the HAProxy subset that fronts Salt masters today, imported into [`Config`].
//! - [`emit`]: [`Config`] written back as commented YAML (`saltgate import-haproxy`).
//!
//! Every error names the file, line, field and fix ([`ConfigError`]).

pub mod addr;
pub mod duration;
pub mod emit;
pub mod error;
pub mod haproxy;
pub mod model;
pub mod salt_minion;
pub mod yaml;

use std::path::Path;

pub use error::{ConfigError, ConfigErrors, ConfigWarning, Position};
pub use model::*;

/// A loaded configuration and what the operator should be told about it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<ConfigWarning>,
}

/// The kind of file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Haproxy,
}

/// Reads and validates a configuration file.
pub fn load(path: &Path, format: Format) -> Result<Loaded, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors::one(ConfigError::new(
            Position::new(Some(path), 0, 0),
            "",
            format!("cannot read the file: {e}"),
            "check the path and its permissions",
        ))
    })?;
    parse(&text, Some(path), format)
}

/// Validates configuration text. `file` is used in messages only.
pub fn parse(text: &str, file: Option<&Path>, format: Format) -> Result<Loaded, ConfigErrors> {
    match format {
        Format::Yaml => yaml::parse_yaml(text, file).map(|config| Loaded {
            config,
            warnings: Vec::new(),
        }),
        Format::Haproxy => haproxy::parse_haproxy(text, file),
    }
}

/// The configuration `saltgate run` uses when given no file: three masters on loopback
/// (127.0.0.2-4), listeners on 127.0.0.1:4505/4506. Shipped as `examples/saltgate.yaml`.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../examples/saltgate.yaml");
