//! saltgate's configuration: plain data, no sockets.
//!
//! - [`yaml`]: saltgate's own YAML file, validated into [`Config`].
//! - [`haproxy`]: the HAProxy subset that fronts Salt masters today, imported into [`Config`].
//! - [`emit`]: [`Config`] written back as commented YAML (`saltgate import-haproxy`).
//!
//! Every error names the file, line, field and fix ([`ConfigError`]).

pub mod addr;
pub mod auth_limit;
pub mod discovery;
pub mod duration;
pub mod emit;
pub mod error;
pub mod haproxy;
pub mod model;
pub mod presence;
pub mod salt_master;
mod salt_master_limits;
pub mod salt_minion;
pub mod transport;
pub mod yaml;
mod yaml_auth_limit;
mod yaml_fanout;
mod yaml_health;
mod yaml_master_config;
mod yaml_policy;
mod yaml_presence;
mod yaml_queue;
mod yaml_replay;
mod yaml_ssl;
mod yaml_syntax;
mod yaml_transport;
mod yaml_tree;
mod yaml_values;

use std::path::Path;

pub use error::{ConfigError, ConfigErrors, ConfigWarning, Position};
pub use model::*;
pub use presence::PresenceConfig;
/// `transport` and `ssl` set from outside a file (`saltgate import-haproxy --transport`).
pub use yaml_transport::set_transport;

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
    let text = read_text(path).map_err(ConfigErrors::one)?;
    parse(&text, Some(path), format)
}

/// Reads a configuration file as UTF-8 text; the error says which of reading or decoding failed.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    let bytes = read_regular_file(path).map_err(|e| {
        use std::io::ErrorKind;
        let fix = match e.kind() {
            ErrorKind::NotFound => "check the path (no file by that name)",
            ErrorKind::PermissionDenied => "make the file readable by the user saltgate runs as",
            ErrorKind::IsADirectory => "name the configuration file, not its directory",
            ErrorKind::InvalidInput => "point saltgate at a regular file",
            _ => "check the path and its permissions",
        };
        ConfigError::new(
            Position::new(Some(path), 0, 0),
            "",
            format!("cannot read the file: {e}"),
            fix,
        )
    })?;
    decode(&bytes, Some(path))
}

/// Reads a regular file whole. Anything else (a FIFO, a socket, a device) is refused at once with
/// `InvalidInput` instead of blocking: the file is opened with `O_NONBLOCK`, which makes opening a
/// FIFO that has no writer return at once, and checked before any read.
pub fn read_regular_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, socket or device); saltgate reads its files whole and \
             will not wait on one",
        ));
    }
    let mut buf = Vec::with_capacity(meta.len().min(16 << 20) as usize);
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Configuration file bytes as text: refuses bytes that are not UTF-8, naming the first bad one.
pub fn decode(bytes: &[u8], file: Option<&Path>) -> Result<String, ConfigError> {
    std::str::from_utf8(bytes)
        .map(str::to_string)
        .map_err(|e| not_utf8(file, bytes, e))
}

/// Validates the bytes of a configuration file (as [`load`] does once it has read them).
pub fn parse_bytes(
    bytes: &[u8],
    file: Option<&Path>,
    format: Format,
) -> Result<Loaded, ConfigErrors> {
    let text = decode(bytes, file).map_err(ConfigErrors::one)?;
    parse(&text, file, format)
}

/// "Not UTF-8", with the byte offset, line and column of the first bad byte.
fn not_utf8(file: Option<&Path>, bytes: &[u8], e: std::str::Utf8Error) -> ConfigError {
    let offset = e.valid_up_to();
    let good = &bytes[..offset];
    let line = good.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = good.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    // Characters, not bytes: the column an editor shows.
    let column = std::str::from_utf8(&good[line_start..]).map_or(0, |s| s.chars().count()) + 1;
    let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    ConfigError::new(
        Position::new(file, clamp(line), clamp(column)),
        "",
        format!(
            "the file is not UTF-8: byte 0x{:02x} at byte offset {offset} cannot start or continue a character",
            bytes.get(offset).copied().unwrap_or(0)
        ),
        "save the file as UTF-8 (for example: iconv -f latin1 -t utf-8 FILE > FILE.new), or remove the character",
    )
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
