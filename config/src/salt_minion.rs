//! Salt's minion configuration keys, as `saltgate-minion run -c minion.yaml` reads them.
//!
//! The file is a Salt minion config: the same keys, the same types and Salt's defaults
//! (`salt/config/__init__.py`, `DEFAULT_MINION_OPTS`). Keys saltgate-minion does not use are
//! accepted with a warning (Salt's own files carry dozens), never refused. Every error names the
//! file, line, key and fix. Plain data: no sockets, no files other than the one read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::error::{ConfigError, ConfigErrors, ConfigWarning, Position};

/// Salt's defaults for the keys below.
pub mod defaults {
    pub const MASTER: &str = "salt";
    pub const MASTER_PORT: u16 = 4506;
    pub const PUBLISH_PORT: u16 = 4505;
    pub const RANDOM_REAUTH_DELAY_S: u64 = 10;
    pub const ACCEPTANCE_WAIT_TIME_S: u64 = 10;
    pub const AUTH_TIMEOUT_S: u64 = 5;
    pub const AUTH_TRIES: u32 = 7;
    pub const PKI_DIR: &str = "/etc/salt/pki/minion";
    pub const RECON_DEFAULT_MS: u64 = 1000;
    pub const RECON_MAX_MS: u64 = 10000;
    pub const MINION_JID_QUEUE_HWM: usize = 100;
    pub const MASTER_SIGN_KEY_NAME: &str = "master_sign";
}

/// `master_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterType {
    /// One master, or a list of masters all used at once (hot multi-master).
    Str,
    /// A list of masters, one active at a time.
    Failover,
}

/// One entry of `master`: a host (name or IP) and its request port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterAddr {
    pub host: String,
    /// The request (`ret`) port: `host:port` in the entry, else `master_port`.
    pub port: u16,
}

impl std::fmt::Display for MasterAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A validated Salt minion configuration (the keys saltgate-minion uses).
#[derive(Debug, Clone, PartialEq)]
pub struct MinionConfig {
    /// `id`; `None` = the host name, as Salt uses the FQDN.
    pub id: Option<String>,
    pub masters: Vec<MasterAddr>,
    /// True when `master` was written as a list (hot multi-master with `master_type: str`).
    pub master_is_list: bool,
    pub master_port: u16,
    /// `publish_port`: `None` = the one the master announces in its `_auth` reply.
    pub publish_port: Option<u16>,
    pub master_type: MasterType,
    /// 0 = no detection of a dead master (Salt's default).
    pub master_alive_interval: Duration,
    pub random_master: bool,
    pub master_failback: bool,
    /// Defaults to `master_alive_interval` (Salt does the same).
    pub master_failback_interval: Duration,
    pub random_reauth_delay: Duration,
    pub acceptance_wait_time: Duration,
    /// 0 = no doubling.
    pub acceptance_wait_time_max: Duration,
    pub auth_timeout: Duration,
    pub auth_tries: u32,
    pub pki_dir: PathBuf,
    /// `master_finger`: the master key's fingerprint to pin on first contact.
    pub master_finger: Option<String>,
    pub recon_default: Duration,
    pub recon_max: Duration,
    pub recon_randomize: bool,
    pub minion_jid_queue_hwm: usize,
    /// `grains`: static grains merged over the collected ones.
    pub grains: Vec<(String, GrainValue)>,
    /// `source_address`: the local IP both connections to a master are dialled from.
    pub source_address: Option<std::net::IpAddr>,
    /// `verify_master_pubkey_sign`: the master must send `pub_sig`, a signature of its public
    /// key by `<pki_dir>/<master_sign_key_name>.pub`, verified on first contact and whenever the
    /// key changes (MultiMaster-PKI).
    pub verify_master_pubkey_sign: bool,
    /// `always_verify_signature`: verify `pub_sig` on every `_auth`, also when the key is the
    /// cached one.
    pub always_verify_signature: bool,
    /// `master_sign_key_name` (default `master_sign`): the verification key's file stem.
    pub master_sign_key_name: String,
    /// `transport`: zeromq (Salt's default) or tcp.
    pub transport: crate::transport::SaltTransport,
    /// `ssl` (tcp only): TLS to the masters, Salt's keys.
    pub ssl: Option<crate::transport::SslConfig>,
}

/// A static grain value from the config file.
#[derive(Debug, Clone, PartialEq)]
pub enum GrainValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<GrainValue>),
    Map(Vec<(String, GrainValue)>),
}

impl Default for MinionConfig {
    fn default() -> Self {
        use defaults::*;
        MinionConfig {
            id: None,
            masters: vec![MasterAddr {
                host: MASTER.into(),
                port: MASTER_PORT,
            }],
            master_is_list: false,
            master_port: MASTER_PORT,
            publish_port: None,
            master_type: MasterType::Str,
            master_alive_interval: Duration::ZERO,
            random_master: false,
            master_failback: false,
            master_failback_interval: Duration::ZERO,
            random_reauth_delay: Duration::from_secs(RANDOM_REAUTH_DELAY_S),
            acceptance_wait_time: Duration::from_secs(ACCEPTANCE_WAIT_TIME_S),
            acceptance_wait_time_max: Duration::ZERO,
            auth_timeout: Duration::from_secs(AUTH_TIMEOUT_S),
            auth_tries: AUTH_TRIES,
            pki_dir: PathBuf::from(PKI_DIR),
            master_finger: None,
            recon_default: Duration::from_millis(RECON_DEFAULT_MS),
            recon_max: Duration::from_millis(RECON_MAX_MS),
            recon_randomize: true,
            minion_jid_queue_hwm: MINION_JID_QUEUE_HWM,
            grains: Vec::new(),
            source_address: None,
            verify_master_pubkey_sign: false,
            always_verify_signature: false,
            master_sign_key_name: MASTER_SIGN_KEY_NAME.into(),
            transport: Default::default(),
            ssl: None,
        }
    }
}

/// A loaded minion configuration and what the operator should be told about it.
#[derive(Debug, Clone)]
pub struct LoadedMinion {
    pub config: MinionConfig,
    pub warnings: Vec<ConfigWarning>,
}

/// Any YAML value, kept loosely typed so that each key can be checked with its own message.
#[derive(Debug, Clone, PartialEq)]
enum Raw {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Raw>),
    Map(Vec<(String, Raw)>),
}

impl Raw {
    fn kind(&self) -> &'static str {
        match self {
            Raw::Null => "nothing",
            Raw::Bool(_) => "a boolean",
            Raw::Int(_) => "a number",
            Raw::Float(_) => "a number",
            Raw::Str(_) => "a string",
            Raw::List(_) => "a list",
            Raw::Map(_) => "a mapping",
        }
    }

    fn to_grain(&self) -> GrainValue {
        match self {
            Raw::Null => GrainValue::Null,
            Raw::Bool(b) => GrainValue::Bool(*b),
            Raw::Int(i) => GrainValue::Int(*i),
            Raw::Float(f) => GrainValue::Float(*f),
            Raw::Str(s) => GrainValue::Str(s.clone()),
            Raw::List(l) => GrainValue::List(l.iter().map(Raw::to_grain).collect()),
            Raw::Map(m) => {
                GrainValue::Map(m.iter().map(|(k, v)| (k.clone(), v.to_grain())).collect())
            }
        }
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        Raw::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(i64::try_from(v)
            .map(Raw::Int)
            .unwrap_or(Raw::Float(v as f64)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Raw>()? {
            out.push(v);
        }
        Ok(Raw::List(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<Raw, Raw>()? {
            let k = match k {
                Raw::Str(s) => s,
                Raw::Int(i) => i.to_string(),
                Raw::Bool(b) => b.to_string(),
                other => format!("{other:?}"),
            };
            out.push((k, v));
        }
        Ok(Raw::Map(out))
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

type Entry = (Spanned<String>, Spanned<Raw>);

/// The top level: an ordered list of keys with their positions (an empty file is no keys).
struct RawDoc(Vec<Entry>);

impl<'de> Deserialize<'de> for RawDoc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawDoc;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping of Salt minion options (key: value)")
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawDoc, E> {
                Ok(RawDoc(Vec::new()))
            }
            fn visit_none<E: de::Error>(self) -> Result<RawDoc, E> {
                Ok(RawDoc(Vec::new()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawDoc, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = map.next_entry::<Spanned<String>, Spanned<Raw>>()? {
                    out.push(e);
                }
                Ok(RawDoc(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// Salt minion keys saltgate-minion knows it does not implement (warned as "ignored").
const KNOWN_IGNORED: &[&str] = &[
    "log_level",
    "log_file",
    "log_level_logfile",
    "cachedir",
    "sock_dir",
    "user",
    "pidfile",
    "ipv6",
    "retry_dns",
    "retry_dns_count",
    "master_tries",
    "rejected_retry",
    "auth_safemode",
    "ping_interval",
    "tcp_keepalive",
    "tcp_keepalive_idle",
    "tcp_keepalive_cnt",
    "tcp_keepalive_intvl",
    "file_roots",
    "pillar_roots",
    "file_client",
    "startup_states",
    "schedule",
    "return",
    "sign_pub_messages",
    "zmq_filtering",
    "multiprocessing",
    "process_count_max",
    "minion_sign_messages",
    "hash_type",
    "keysize",
];

struct Checker<'a> {
    file: Option<&'a Path>,
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigWarning>,
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Checker<'_> {
    fn at<T>(&self, s: &Spanned<T>) -> Position {
        Position::new(
            self.file,
            clamp(s.referenced.line()),
            clamp(s.referenced.column()),
        )
    }

    fn err<T>(&mut self, s: &Spanned<T>, key: &str, message: impl Into<String>, fix: &str) {
        let at = self.at(s);
        self.errors.push(ConfigError::new(at, key, message, fix));
    }

    fn boolean(&mut self, v: &Spanned<Raw>, key: &str) -> Option<bool> {
        match &v.value {
            Raw::Bool(b) => Some(*b),
            // Salt reads these through YAML 1.1, where yes/no/on/off are booleans.
            Raw::Str(s) => match s.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" => Some(true),
                "false" | "no" | "off" => Some(false),
                _ => {
                    self.err(
                        v,
                        key,
                        format!("{s:?} is not a boolean"),
                        "write True or False",
                    );
                    None
                }
            },
            other => {
                let m = format!("expected a boolean, found {}", other.kind());
                self.err(v, key, m, "write True or False");
                None
            }
        }
    }

    /// A non-negative whole number (Salt writes these as ints; a numeric string is accepted).
    fn number(&mut self, v: &Spanned<Raw>, key: &str, max: u64) -> Option<u64> {
        let n = match &v.value {
            Raw::Int(i) if *i >= 0 => Some(*i as u64),
            Raw::Float(f) if *f >= 0.0 && f.fract() == 0.0 => Some(*f as u64),
            Raw::Str(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        match n {
            Some(n) if n <= max => Some(n),
            _ => {
                let m = match &v.value {
                    Raw::Int(_) | Raw::Float(_) | Raw::Str(_) => {
                        format!("{} is not a whole number from 0 to {max}", show(&v.value))
                    }
                    other => format!("expected a number, found {}", other.kind()),
                };
                self.err(v, key, m, &format!("write a whole number from 0 to {max}"));
                None
            }
        }
    }

    /// Seconds as Salt writes them (ints; fractions accepted).
    fn seconds(&mut self, v: &Spanned<Raw>, key: &str) -> Option<Duration> {
        const MAX: f64 = 10.0 * 365.0 * 86400.0;
        match &v.value {
            Raw::Int(i) if *i >= 0 && (*i as f64) <= MAX => Some(Duration::from_secs(*i as u64)),
            Raw::Float(f) if *f >= 0.0 && *f <= MAX => Some(Duration::from_secs_f64(*f)),
            other => {
                let m = format!("{} is not a number of seconds", show(other));
                self.err(v, key, m, "write a number of seconds, e.g. 10");
                None
            }
        }
    }

    fn millis(&mut self, v: &Spanned<Raw>, key: &str) -> Option<Duration> {
        self.number(v, key, 86_400_000).map(Duration::from_millis)
    }

    fn port(&mut self, v: &Spanned<Raw>, key: &str) -> Option<u16> {
        match self.number(v, key, 65535) {
            Some(0) => {
                self.err(
                    v,
                    key,
                    "port 0 is not a master port",
                    "write the port the master listens on",
                );
                None
            }
            Some(p) => Some(p as u16),
            None => None,
        }
    }

    fn text(&mut self, v: &Spanned<Raw>, key: &str, fix: &str) -> Option<String> {
        match &v.value {
            Raw::Str(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Raw::Int(i) => Some(i.to_string()),
            other => {
                let m = format!("expected a non-empty string, found {}", show(other));
                self.err(v, key, m, fix);
                None
            }
        }
    }
}

fn show(r: &Raw) -> String {
    match r {
        Raw::Str(s) => format!("{s:?}"),
        Raw::Int(i) => i.to_string(),
        Raw::Float(f) => f.to_string(),
        Raw::Bool(b) => b.to_string(),
        other => other.kind().to_string(),
    }
}

pub use crate::addr::split_host_port;

#[path = "salt_minion_transport.rs"]
mod keys;

/// Reads and validates a Salt minion configuration file.
pub fn load_minion(path: &Path) -> Result<LoadedMinion, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors::one(ConfigError::new(
            Position::new(Some(path), 0, 0),
            "",
            format!("cannot read the file: {e}"),
            "check the path and its permissions",
        ))
    })?;
    parse_minion(&text, Some(path))
}

/// Validates Salt minion configuration text. `file` is used in messages only.
pub fn parse_minion(text: &str, file: Option<&Path>) -> Result<LoadedMinion, ConfigErrors> {
    let doc: RawDoc = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (clamp(l.line()), clamp(l.column())))
            .unwrap_or((0, 0));
        let msg = e.to_string();
        let first = msg
            .lines()
            .next()
            .unwrap_or("invalid YAML")
            .trim()
            .to_string();
        ConfigErrors::one(ConfigError::new(
            Position::new(file, line, column),
            crate::yaml::yaml_path_at(text, line),
            first,
            "a Salt minion config is a YAML mapping of options, e.g. `master: 10.0.0.1`",
        ))
    })?;
    let mut c = Checker {
        file,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let mut cfg = MinionConfig::default();
    let mut master: Option<&Spanned<Raw>> = None;
    let mut failback_interval = None;
    let mut ssl_node = None;
    let mut seen: Vec<&str> = Vec::new();
    for (k, v) in &doc.0 {
        let key = k.value.as_str();
        if seen.contains(&key) {
            c.err(k, key, "the key appears twice", "keep one of them");
            continue;
        }
        seen.push(key);
        match key {
            "id" => {
                if let Some(id) = c.text(v, key, "write the minion's id, e.g. id: web1") {
                    if id.contains(['/', '\\', '\0']) || id == "." || id == ".." {
                        c.err(
                            v,
                            key,
                            format!("{id:?} is not a valid minion id"),
                            "use no '/', '\\' or NUL",
                        );
                    } else {
                        cfg.id = Some(id);
                    }
                }
            }
            "master" => master = Some(v),
            "master_port" => cfg.master_port = c.port(v, key).unwrap_or(cfg.master_port),
            "publish_port" => cfg.publish_port = c.port(v, key).or(cfg.publish_port),
            "master_type" => match &v.value {
                Raw::Str(s) if s == "str" => cfg.master_type = MasterType::Str,
                Raw::Str(s) if s == "failover" => cfg.master_type = MasterType::Failover,
                other => {
                    let m = format!("master_type {} is not supported", show(other));
                    c.err(
                        v,
                        key,
                        m,
                        "use str (one master or hot multi-master) or failover",
                    );
                }
            },
            "master_alive_interval" => {
                cfg.master_alive_interval = c.seconds(v, key).unwrap_or_default()
            }
            "random_master" | "master_shuffle" => {
                if key == "master_shuffle" {
                    c.warnings.push(ConfigWarning {
                        at: c.at(k),
                        message: "master_shuffle is deprecated in Salt; use random_master".into(),
                    });
                }
                if let Some(b) = c.boolean(v, key) {
                    cfg.random_master |= b;
                }
            }
            "master_failback" => cfg.master_failback = c.boolean(v, key).unwrap_or(false),
            "master_failback_interval" => failback_interval = c.seconds(v, key),
            "random_reauth_delay" => {
                cfg.random_reauth_delay = c.seconds(v, key).unwrap_or(cfg.random_reauth_delay)
            }
            "acceptance_wait_time" => {
                cfg.acceptance_wait_time = c.seconds(v, key).unwrap_or(cfg.acceptance_wait_time)
            }
            "acceptance_wait_time_max" => {
                cfg.acceptance_wait_time_max = c.seconds(v, key).unwrap_or_default()
            }
            "auth_timeout" => match c.seconds(v, key) {
                Some(d) if d.is_zero() => c.err(
                    v,
                    key,
                    "must be greater than zero",
                    "write a number of seconds, e.g. 5",
                ),
                Some(d) => cfg.auth_timeout = d,
                None => {}
            },
            "auth_tries" => {
                cfg.auth_tries = c
                    .number(v, key, 1_000_000)
                    .map_or(cfg.auth_tries, |n| n as u32)
            }
            "pki_dir" => {
                if let Some(p) = c.text(v, key, "write a directory, e.g. /etc/salt/pki/minion") {
                    cfg.pki_dir = PathBuf::from(p);
                }
            }
            "master_finger" => match &v.value {
                Raw::Null => {}
                Raw::Str(s) if s.is_empty() => {}
                Raw::Str(s) if valid_finger(s) => cfg.master_finger = Some(s.to_lowercase()),
                other => {
                    let m = format!("{} is not a key fingerprint", show(other));
                    c.err(
                        v,
                        key,
                        m,
                        "copy the master's `salt-key -F master` output: hex pairs separated by ':'",
                    );
                }
            },
            "source_address" => match &v.value {
                Raw::Null => {}
                Raw::Str(t) if t.trim().is_empty() => {}
                Raw::Str(t) => match t.trim().parse() {
                    Ok(ip) => cfg.source_address = Some(ip),
                    Err(_) => c.err(
                        v,
                        key,
                        format!("{t:?} is not an IP address"),
                        "write a local IP address of this host, e.g. source_address: 10.0.0.5",
                    ),
                },
                other => {
                    let m = format!("expected an IP address, found {}", other.kind());
                    c.err(v, key, m, "write a local IP address, e.g. 10.0.0.5");
                }
            },
            "verify_master_pubkey_sign" => {
                cfg.verify_master_pubkey_sign = c.boolean(v, key).unwrap_or(false)
            }
            "always_verify_signature" => {
                cfg.always_verify_signature = c.boolean(v, key).unwrap_or(false)
            }
            "master_sign_key_name" => {
                if let Some(name) = c.text(
                    v,
                    key,
                    "write the key's name without .pub, e.g. master_sign",
                ) {
                    let name = name.trim().to_string();
                    if name.is_empty()
                        || name == "."
                        || name == ".."
                        || name.contains(['/', '\\', '\0'])
                    {
                        c.err(
                            v,
                            key,
                            format!("{name:?} is not a key file name"),
                            "write the verification key's file name in pki_dir without .pub, \
                             e.g. master_sign",
                        );
                    } else {
                        cfg.master_sign_key_name = name;
                    }
                }
            }
            "transport" => cfg.transport = keys::transport(&mut c, v).unwrap_or_default(),
            "ssl" => (ssl_node, cfg.ssl) = (Some(v), keys::ssl(&mut c, v)),
            "disable_aes_with_tls" => keys::disable_aes_with_tls(&mut c, v),
            "recon_default" => cfg.recon_default = c.millis(v, key).unwrap_or(cfg.recon_default),
            "recon_max" => cfg.recon_max = c.millis(v, key).unwrap_or(cfg.recon_max),
            "recon_randomize" => cfg.recon_randomize = c.boolean(v, key).unwrap_or(true),
            "minion_jid_queue_hwm" => {
                cfg.minion_jid_queue_hwm = c
                    .number(v, key, 1_000_000)
                    .map_or(cfg.minion_jid_queue_hwm, |n| n as usize)
            }
            "grains" => match &v.value {
                Raw::Map(m) => {
                    cfg.grains = m.iter().map(|(k, v)| (k.clone(), v.to_grain())).collect()
                }
                Raw::Null => {}
                other => {
                    let m = format!("expected a mapping, found {}", other.kind());
                    c.err(v, key, m, "write grains as `grains: {role: web}`");
                }
            },
            other if KNOWN_IGNORED.contains(&other) => c.warnings.push(ConfigWarning {
                at: c.at(k),
                message: format!(
                    "{other}: a Salt minion option saltgate-minion does not use; ignored"
                ),
            }),
            other => c.warnings.push(ConfigWarning {
                at: c.at(k),
                message: format!("{other}: unknown option; ignored (check the spelling)"),
            }),
        }
    }
    keys::check(&mut c, cfg.transport, ssl_node);
    if let Some(v) = master {
        let entries: Vec<&Raw> = match &v.value {
            Raw::List(l) => {
                cfg.master_is_list = true;
                l.iter().collect()
            }
            other => vec![other],
        };
        let mut masters = Vec::new();
        for e in entries {
            let text = match e {
                Raw::Str(s) => s.clone(),
                other => {
                    let m = format!("{} is not a master address", show(other));
                    c.err(v, "master", m, "write a host name or IP, or a list of them");
                    continue;
                }
            };
            match split_host_port(&text) {
                Ok((host, port)) => {
                    let m = MasterAddr {
                        host,
                        port: port.unwrap_or(cfg.master_port),
                    };
                    if masters.contains(&m) {
                        c.err(
                            v,
                            "master",
                            format!("{m} is listed twice"),
                            "list each master once",
                        );
                    } else {
                        masters.push(m);
                    }
                }
                Err(m) => c.err(
                    v,
                    "master",
                    m,
                    "write HOST or HOST:PORT (PORT = the request port)",
                ),
            }
        }
        if masters.is_empty() && c.errors.is_empty() {
            c.err(
                v,
                "master",
                "no master is listed",
                "write at least one master address",
            );
        }
        cfg.masters = masters;
        if cfg.master_type == MasterType::Failover && !cfg.master_is_list {
            c.err(
                v,
                "master",
                "master_type failover needs a list of masters",
                "write master as a list, e.g. master: [m1, m2]",
            );
        }
    } else if cfg.master_type == MasterType::Failover {
        c.errors.push(ConfigError::new(
            Position::new(file, 0, 0),
            "master",
            "master_type failover needs a list of masters",
            "add master: [m1, m2]",
        ));
    }
    cfg.master_failback_interval = failback_interval
        .filter(|d| !d.is_zero())
        .unwrap_or(cfg.master_alive_interval);
    if cfg.master_failback && cfg.master_failback_interval.is_zero() {
        c.warnings.push(ConfigWarning {
            at: Position::new(file, 0, 0),
            message: "master_failback without master_alive_interval or master_failback_interval \
                      never fails back (as in Salt); set master_alive_interval"
                .into(),
        });
    }
    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    Ok(LoadedMinion {
        config: cfg,
        warnings: c.warnings,
    })
}

fn valid_finger(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() >= 16
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
#[path = "salt_minion_tests.rs"]
mod tests;
