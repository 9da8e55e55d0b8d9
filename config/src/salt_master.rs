//! Salt's master configuration file (`/etc/salt/master`), as `saltgate-master` reads it.
//!
//! Owns the raw serde structs (with source spans), Salt's defaults, and the validation into
//! [`SaltMasterConfig`]. Keys Salt knows but `saltgate-master` does not use are accepted with a
//! warning, never an error, so an existing master file works unchanged. Errors name the file,
//! line, key and the fix. Does not touch the file system beyond reading the file.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::error::{ConfigError, ConfigErrors, ConfigWarning, Position};

type Sp<T> = Spanned<T>;

/// Salt's defaults (`salt/config/__init__.py`, `DEFAULT_MASTER_OPTS`).
pub mod defaults {
    pub const INTERFACE: &str = "0.0.0.0";
    pub const PUBLISH_PORT: u16 = 4505;
    pub const RET_PORT: u16 = 4506;
    pub const PKI_DIR: &str = "/etc/salt/pki/master";
    pub const CACHEDIR: &str = "/var/cache/salt/master";
    pub const SOCK_DIR: &str = "/var/run/salt/master";
    pub const KEEP_JOBS_HOURS: u64 = 24;
    pub const CLUSTER_POOL_PORT: u16 = 4520;
    pub const FILE_ROOT: &str = "/srv/salt";
    pub const PILLAR_ROOT: &str = "/srv/pillar";
    /// Our replay window for request nonces when `request_server_ttl` is 0 (Salt: no window).
    pub const NONCE_WINDOW_SECS: u64 = 600;
    /// Salt's `publish_session`: the publish key is rotated once a day.
    pub const PUBLISH_SESSION_SECS: u64 = 86_400;
    /// `saltgate_max_clear_load`: a clear request's largest frame. A `ping` is a few bytes and
    /// an `_auth` about 1 KiB (id, 451-byte public key, 256-byte token, nonce).
    pub const MAX_CLEAR_LOAD: u64 = 64 * 1024;
    /// `saltgate_untrusted_max_frame`: the largest frame on a request connection that has not
    /// yet sent a request its minion's session key decrypts.
    pub const UNTRUSTED_MAX_FRAME: u64 = 1024 * 1024;
    /// `saltgate_untrusted_queue_bytes`: bytes of received requests from connections not yet
    /// trusted that may wait for a handler, all connections together (5,000 `_auth` requests
    /// of about 1 KiB each fit six times over).
    pub const UNTRUSTED_QUEUE_BYTES: u64 = 32 * 1024 * 1024;
    /// `saltgate_frame_timeout`: a request frame must end this long after its first byte (a
    /// minion waits 60 s for a reply: a request still arriving then is for nobody).
    pub const FRAME_TIMEOUT_SECS: u64 = 60;
    /// `saltgate_write_timeout`: a reply that makes no progress this long closes the
    /// connection (Salt's ZMTP heartbeat timeout).
    pub const WRITE_TIMEOUT_SECS: u64 = 30;
    /// `saltgate_cluster_auth_timeout`: a cluster peer connection must deliver a frame that
    /// authenticates within this of its accept.
    pub const CLUSTER_AUTH_TIMEOUT_SECS: u64 = 10;
    /// `saltgate_cluster_max_unauthenticated`: peer connections not yet authenticated at once.
    pub const CLUSTER_MAX_UNAUTHENTICATED: u64 = 64;
    /// `master_sign_key_name`: the signing key pair `<name>.pem`/`<name>.pub` in `pki_dir`.
    pub const MASTER_SIGN_KEY_NAME: &str = "master_sign";
}

/// The keys `saltgate-master` reads. Everything else is warned about and ignored.
const KNOWN_KEYS: &[&str] = &[
    "id",
    "interface",
    "publish_port",
    "ret_port",
    "pki_dir",
    "cachedir",
    "sock_dir",
    "auto_accept",
    "autosign_file",
    "open_mode",
    "keep_jobs",
    "keep_jobs_seconds",
    "file_roots",
    "pillar_roots",
    "worker_threads",
    "request_server_ttl",
    "publish_session",
    "rotate_aes_key",
    "cluster_id",
    "cluster_peers",
    "cluster_pki_dir",
    "cluster_pool_port",
    "cluster_secret",
    "cluster_allow_insecure_empty_secret",
    "saltgate_metrics_bind",
    "saltgate_max_clear_load",
    "saltgate_untrusted_max_frame",
    "saltgate_untrusted_queue_bytes",
    "saltgate_request_max_connections",
    "saltgate_publish_max_connections",
    "saltgate_frame_timeout",
    "saltgate_write_timeout",
    "saltgate_cluster_auth_timeout",
    "saltgate_cluster_max_unauthenticated",
    "master_sign_pubkey",
    "master_sign_key_name",
    "master_pubkey_signature",
    "master_use_pubkey_signature",
    "transport",
    "ssl",
    "disable_aes_with_tls",
];

/// Keys that do not change what a stock minion sees, accepted silently (common in real files).
const QUIET_KEYS: &[&str] = &[
    "user",
    "log_file",
    "log_level",
    "log_level_logfile",
    "key_logfile",
    "pidfile",
    "max_open_files",
    "sqlite_queue_dir",
];

#[derive(Debug, Default, Deserialize)]
struct RawSaltMaster {
    id: Option<Sp<String>>,
    interface: Option<Sp<String>>,
    publish_port: Option<Sp<u16>>,
    ret_port: Option<Sp<u16>>,
    pki_dir: Option<Sp<String>>,
    cachedir: Option<Sp<String>>,
    sock_dir: Option<Sp<String>>,
    auto_accept: Option<Sp<bool>>,
    autosign_file: Option<Sp<String>>,
    open_mode: Option<Sp<bool>>,
    keep_jobs: Option<Sp<u64>>,
    keep_jobs_seconds: Option<Sp<u64>>,
    file_roots: Option<Sp<BTreeMap<String, Vec<String>>>>,
    pillar_roots: Option<Sp<BTreeMap<String, Vec<String>>>>,
    worker_threads: Option<Sp<u32>>,
    request_server_ttl: Option<Sp<u64>>,
    publish_session: Option<Sp<u64>>,
    rotate_aes_key: Option<Sp<bool>>,
    cluster_id: Option<Sp<String>>,
    cluster_peers: Option<Sp<Vec<String>>>,
    cluster_pki_dir: Option<Sp<String>>,
    cluster_pool_port: Option<Sp<u16>>,
    cluster_secret: Option<Sp<String>>,
    cluster_allow_insecure_empty_secret: Option<Sp<bool>>,
    saltgate_metrics_bind: Option<Sp<String>>,
    saltgate_max_clear_load: Option<Sp<u64>>,
    saltgate_untrusted_max_frame: Option<Sp<u64>>,
    saltgate_untrusted_queue_bytes: Option<Sp<u64>>,
    saltgate_request_max_connections: Option<Sp<u64>>,
    saltgate_publish_max_connections: Option<Sp<u64>>,
    saltgate_frame_timeout: Option<Sp<u64>>,
    saltgate_write_timeout: Option<Sp<u64>>,
    saltgate_cluster_auth_timeout: Option<Sp<u64>>,
    saltgate_cluster_max_unauthenticated: Option<Sp<u64>>,
    master_sign_pubkey: Option<Sp<bool>>,
    master_sign_key_name: Option<Sp<String>>,
    master_pubkey_signature: Option<Sp<Option<String>>>,
    master_use_pubkey_signature: Option<Sp<bool>>,
    transport: Option<Sp<String>>,
    ssl: Option<Sp<Option<transport_keys::RawSsl>>>,
    disable_aes_with_tls: Option<Sp<bool>>,
}

/// MultiMaster-PKI: how the master signs its public key in `_auth` replies (Salt's
/// `master_sign_pubkey` and friends, `salt/crypt.py` `MasterKeys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubkeySigning {
    /// `master_sign_pubkey`: add `pub_sig` to every `_auth` reply (default false).
    pub sign_pubkey: bool,
    /// `master_sign_key_name` (default `master_sign`): the signing key pair's file stem in
    /// `pki_dir`, created on start when missing (unless a signature file is used).
    pub key_name: String,
    /// `master_pubkey_signature`: the pre-computed signature's file name in `pki_dir`; `None`
    /// is Salt's default, `<id>_pubkey_signature` (see [`SaltMasterConfig::pubkey_signature_file`]).
    pub signature_file: Option<String>,
    /// `master_use_pubkey_signature`: send the pre-computed signature file's content instead of
    /// signing (default false).
    pub use_signature_file: bool,
}

impl Default for PubkeySigning {
    fn default() -> Self {
        PubkeySigning {
            sign_pubkey: false,
            key_name: defaults::MASTER_SIGN_KEY_NAME.to_string(),
            signature_file: None,
            use_signature_file: false,
        }
    }
}

/// Salt 3008 cluster settings (`cluster_id` set).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub cluster_id: String,
    /// Peer master addresses (`host` or `host:port`; port defaults to `cluster_pool_port`).
    pub peers: Vec<String>,
    pub pki_dir: PathBuf,
    pub pool_port: u16,
    /// The join pre-shared key. Never printed by `Debug`.
    pub secret: String,
    /// Allows an empty `cluster_secret` (Salt does, silently; we refuse unless this is set).
    pub allow_insecure_empty_secret: bool,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("cluster_id", &self.cluster_id)
            .field("peers", &self.peers)
            .field("pki_dir", &self.pki_dir)
            .field("pool_port", &self.pool_port)
            .field("secret", &"<masked>")
            .field(
                "allow_insecure_empty_secret",
                &self.allow_insecure_empty_secret,
            )
            .finish()
    }
}

/// A validated master configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaltMasterConfig {
    /// The master id (Salt default: `<hostname>_master`).
    pub id: String,
    pub interface: IpAddr,
    pub publish_port: u16,
    pub ret_port: u16,
    pub pki_dir: PathBuf,
    pub cachedir: PathBuf,
    pub sock_dir: PathBuf,
    pub auto_accept: bool,
    pub autosign_file: Option<PathBuf>,
    /// Seconds a job stays in the job cache (0 = never pruned, as in Salt): `keep_jobs_seconds`
    /// (Salt 3006+) or `keep_jobs` hours (older name, default 24 h).
    pub keep_jobs_secs: u64,
    pub file_roots: BTreeMap<String, Vec<PathBuf>>,
    pub pillar_roots: BTreeMap<String, Vec<PathBuf>>,
    /// Replay window for request timestamps and nonces, seconds.
    pub request_window_secs: u64,
    /// Seconds a publish (AES) key lives before it is rotated (`publish_session`, Salt's default
    /// 86400; 0 = only on key changes).
    pub publish_session_secs: u64,
    /// Rotate the publish key when a key is deleted or rejected (`rotate_aes_key`, default true):
    /// a removed minion can no longer read publishes.
    pub rotate_aes_key: bool,
    pub cluster: Option<ClusterConfig>,
    /// Where the Prometheus metrics endpoint listens (`saltgate_metrics_bind`, a saltgate
    /// extension Salt does not have); `None`: no endpoint.
    pub metrics_bind: Option<SocketAddr>,
    /// MultiMaster-PKI signing of the master public key.
    pub signing: PubkeySigning,
    /// What an unauthenticated client can make the master hold (saltgate extensions).
    pub limits: MasterLimits,
    /// `transport`, `ssl`, `disable_aes_with_tls`.
    pub transport: MasterTransport,
}

pub use crate::salt_master_limits::MasterLimits;

impl Default for MasterLimits {
    fn default() -> Self {
        MasterLimits {
            max_clear_load: defaults::MAX_CLEAR_LOAD as usize,
            untrusted_max_frame: defaults::UNTRUSTED_MAX_FRAME as usize,
            untrusted_queue_bytes: defaults::UNTRUSTED_QUEUE_BYTES as usize,
            request_max_connections: None,
            publish_max_connections: None,
            frame_timeout_secs: defaults::FRAME_TIMEOUT_SECS,
            write_timeout_secs: defaults::WRITE_TIMEOUT_SECS,
            cluster_auth_timeout_secs: defaults::CLUSTER_AUTH_TIMEOUT_SECS,
            cluster_max_unauthenticated: defaults::CLUSTER_MAX_UNAUTHENTICATED as usize,
        }
    }
}

impl SaltMasterConfig {
    /// Salt's defaults, with `id` as given.
    pub fn with_defaults(id: &str) -> Self {
        let roots = |p: &str| BTreeMap::from([("base".to_string(), vec![PathBuf::from(p)])]);
        SaltMasterConfig {
            id: id.to_string(),
            interface: IpAddr::from([0, 0, 0, 0]),
            publish_port: defaults::PUBLISH_PORT,
            ret_port: defaults::RET_PORT,
            pki_dir: defaults::PKI_DIR.into(),
            cachedir: defaults::CACHEDIR.into(),
            sock_dir: defaults::SOCK_DIR.into(),
            auto_accept: false,
            autosign_file: None,
            keep_jobs_secs: defaults::KEEP_JOBS_HOURS * 3600,
            file_roots: roots(defaults::FILE_ROOT),
            pillar_roots: roots(defaults::PILLAR_ROOT),
            request_window_secs: defaults::NONCE_WINDOW_SECS,
            publish_session_secs: defaults::PUBLISH_SESSION_SECS,
            rotate_aes_key: true,
            cluster: None,
            metrics_bind: None,
            limits: MasterLimits::default(),
            signing: PubkeySigning::default(),
            transport: MasterTransport::default(),
        }
    }

    /// The pre-computed signature's file name in `pki_dir`: `master_pubkey_signature`, else
    /// Salt 3008's default `<id>_pubkey_signature` (`MasterKeys.__init__`; Salt's tutorial says
    /// `master_pubkey_signature`, its code uses the id).
    pub fn pubkey_signature_file(&self) -> String {
        self.signing
            .signature_file
            .clone()
            .unwrap_or_else(|| format!("{}_pubkey_signature", self.id))
    }
}

/// A parsed master file and what the operator should be told about it.
#[derive(Debug, Clone)]
pub struct LoadedSaltMaster {
    pub config: SaltMasterConfig,
    pub warnings: Vec<ConfigWarning>,
}

/// Reads and validates a Salt master configuration file.
pub fn load_salt_master(path: &Path) -> Result<LoadedSaltMaster, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors::one(ConfigError::new(
            Position::new(Some(path), 0, 0),
            "",
            format!("cannot read the master configuration: {e}"),
            "check the path given with -c and its permissions",
        ))
    })?;
    parse_salt_master(&text, Some(path))
}

fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}_master")
}

/// Parses and validates master configuration text. `file` is used in messages only.
pub fn parse_salt_master(
    text: &str,
    file: Option<&Path>,
) -> Result<LoadedSaltMaster, ConfigErrors> {
    let has_content = text.lines().any(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#') && t != "---"
    });
    let raw: RawSaltMaster = if has_content {
        serde_saphyr::from_str(text).map_err(|e| ConfigErrors::one(serde_error(&e, text, file)))?
    } else {
        RawSaltMaster::default()
    };
    let mut warnings = Vec::new();
    for (key, line) in top_level_keys(text) {
        if QUIET_KEYS.contains(&key.as_str()) {
            continue;
        }
        if !KNOWN_KEYS.contains(&key.as_str()) {
            warnings.push(ConfigWarning {
                at: Position::new(file, line, 1),
                message: format!("{key}: not used by saltgate-master; ignored"),
            });
        }
    }
    let mut errors = Vec::new();
    let at = |s: &Position| s.clone();
    let pos = |line: u64, col: u64| {
        Position::new(
            file,
            u32::try_from(line).unwrap_or(u32::MAX),
            u32::try_from(col).unwrap_or(u32::MAX),
        )
    };
    macro_rules! span {
        ($s:expr) => {
            pos($s.referenced.line(), $s.referenced.column())
        };
    }

    let id = match &raw.id {
        Some(s) if s.value.trim().is_empty() => {
            errors.push(ConfigError::new(
                span!(s),
                "id",
                "empty master id",
                "write a name for this master, or remove the key to use <hostname>_master",
            ));
            String::new()
        }
        Some(s) if !safe_name(s.value.trim()) => {
            errors.push(ConfigError::new(
                span!(s),
                "id",
                format!("master id {:?} is not a safe file name", s.value),
                "use letters, digits, '-', '_' and '.' only",
            ));
            String::new()
        }
        Some(s) => s.value.trim().to_string(),
        None => default_id(),
    };
    let mut c = SaltMasterConfig::with_defaults(&id);
    if let Some(s) = &raw.interface {
        match s.value.trim().parse::<IpAddr>() {
            Ok(ip) => c.interface = ip,
            Err(_) => errors.push(ConfigError::new(
                span!(s),
                "interface",
                format!("{:?} is not an IP address", s.value),
                "write the address to listen on, e.g. 0.0.0.0 or 10.0.0.5",
            )),
        }
    }
    // Port 0 asks the OS for a free port (tests); the bound port is what minions are told.
    if let Some(p) = &raw.publish_port {
        c.publish_port = p.value;
    }
    if let Some(p) = &raw.ret_port {
        c.ret_port = p.value;
    }
    if c.publish_port == c.ret_port && c.ret_port != 0 {
        errors.push(ConfigError::new(
            raw.ret_port
                .as_ref()
                .map(|p| span!(p))
                .unwrap_or_else(|| pos(0, 0)),
            "ret_port",
            format!("publish_port and ret_port are both {}", c.ret_port),
            "give the publish and request ports different numbers",
        ));
    }
    for (field, raw_dir, slot) in [
        ("pki_dir", &raw.pki_dir, &mut c.pki_dir),
        ("cachedir", &raw.cachedir, &mut c.cachedir),
        ("sock_dir", &raw.sock_dir, &mut c.sock_dir),
    ] {
        if let Some(d) = raw_dir {
            if d.value.trim().is_empty() {
                errors.push(ConfigError::new(
                    span!(d),
                    field,
                    "empty path",
                    "write a directory path, or remove the key for Salt's default",
                ));
            } else {
                *slot = PathBuf::from(d.value.trim());
            }
        }
    }
    if let Some(v) = &raw.auto_accept {
        c.auto_accept = v.value;
    }
    if let Some(v) = &raw.autosign_file {
        if !v.value.trim().is_empty() {
            c.autosign_file = Some(PathBuf::from(v.value.trim()));
        }
    }
    if let Some(v) = &raw.open_mode {
        if v.value {
            errors.push(ConfigError::new(
                span!(v),
                "open_mode",
                "open_mode accepts any key for any id, so anyone can impersonate any minion",
                "remove open_mode; accept keys with `saltgate-master key accept`, or use \
                 auto_accept/autosign_file",
            ));
        }
    }
    if let Some(v) = &raw.keep_jobs {
        c.keep_jobs_secs = v.value.saturating_mul(3600);
    }
    if let Some(v) = &raw.keep_jobs_seconds {
        c.keep_jobs_secs = v.value;
    }
    if let Some(v) = &raw.request_server_ttl {
        if v.value > 0 {
            c.request_window_secs = v.value;
        }
    }
    // The limits: each a positive whole number, at most `max`.
    const MAX_FRAME: u64 = 64 * 1024 * 1024;
    let mut lim = MasterLimits::default();
    let mut clear = lim.max_clear_load as u64;
    let mut untrusted = lim.untrusted_max_frame as u64;
    let mut untrusted_queue = lim.untrusted_queue_bytes as u64;
    let mut cluster_cap = lim.cluster_max_unauthenticated as u64;
    let mut request_cap = 0u64;
    let mut publish_cap = 0u64;
    for (field, raw_v, slot, max, unit) in [
        (
            "saltgate_max_clear_load",
            &raw.saltgate_max_clear_load,
            &mut clear,
            MAX_FRAME,
            "bytes",
        ),
        (
            "saltgate_untrusted_max_frame",
            &raw.saltgate_untrusted_max_frame,
            &mut untrusted,
            MAX_FRAME,
            "bytes",
        ),
        (
            "saltgate_untrusted_queue_bytes",
            &raw.saltgate_untrusted_queue_bytes,
            &mut untrusted_queue,
            1 << 40,
            "bytes",
        ),
        (
            "saltgate_frame_timeout",
            &raw.saltgate_frame_timeout,
            &mut lim.frame_timeout_secs,
            86_400,
            "seconds",
        ),
        (
            "saltgate_write_timeout",
            &raw.saltgate_write_timeout,
            &mut lim.write_timeout_secs,
            86_400,
            "seconds",
        ),
        (
            "saltgate_cluster_auth_timeout",
            &raw.saltgate_cluster_auth_timeout,
            &mut lim.cluster_auth_timeout_secs,
            3600,
            "seconds",
        ),
        (
            "saltgate_request_max_connections",
            &raw.saltgate_request_max_connections,
            &mut request_cap,
            10_000_000,
            "connections",
        ),
        (
            "saltgate_publish_max_connections",
            &raw.saltgate_publish_max_connections,
            &mut publish_cap,
            10_000_000,
            "connections",
        ),
        (
            "saltgate_cluster_max_unauthenticated",
            &raw.saltgate_cluster_max_unauthenticated,
            &mut cluster_cap,
            1_000_000,
            "connections",
        ),
    ] {
        if let Some(v) = raw_v {
            if v.value == 0 || v.value > max {
                errors.push(ConfigError::new(
                    span!(v),
                    field,
                    format!("{} is out of range", v.value),
                    format!("write a number of {unit} from 1 to {max}, or remove the key for the default"),
                ));
            } else {
                *slot = v.value;
            }
        }
    }
    lim.max_clear_load = clear as usize;
    lim.untrusted_max_frame = untrusted as usize;
    lim.untrusted_queue_bytes = usize::try_from(untrusted_queue).unwrap_or(usize::MAX);
    // Unset (0 here): no cap but the descriptor limit.
    lim.request_max_connections = (request_cap > 0).then_some(request_cap as usize);
    lim.publish_max_connections = (publish_cap > 0).then_some(publish_cap as usize);
    lim.cluster_max_unauthenticated = cluster_cap as usize;
    c.limits = lim;
    if let Some(v) = &raw.publish_session {
        c.publish_session_secs = v.value;
    }
    if let Some(v) = &raw.rotate_aes_key {
        c.rotate_aes_key = v.value;
    }
    for (field, raw_roots, slot) in [
        ("file_roots", &raw.file_roots, &mut c.file_roots),
        ("pillar_roots", &raw.pillar_roots, &mut c.pillar_roots),
    ] {
        if let Some(r) = raw_roots {
            let mut out = BTreeMap::new();
            for (env, dirs) in &r.value {
                if !safe_name(env) {
                    errors.push(ConfigError::new(
                        span!(r),
                        format!("{field}.{env}"),
                        format!("environment name {env:?} is not a plain name"),
                        "use letters, digits, '-', '_' and '.' (e.g. base)",
                    ));
                    continue;
                }
                out.insert(env.clone(), dirs.iter().map(PathBuf::from).collect());
            }
            *slot = out;
        }
    }
    if let Some(b) = &raw.saltgate_metrics_bind {
        match b.value.trim().parse::<SocketAddr>() {
            Ok(a) => c.metrics_bind = Some(a),
            Err(_) => errors.push(ConfigError::new(
                span!(b),
                "saltgate_metrics_bind",
                format!("{:?} is not an address and port", b.value),
                "write IP:PORT, e.g. 127.0.0.1:9506 ('[::1]:9506', quoted, for IPv6), or remove \
                 the key to serve no metrics",
            )),
        }
    }
    if let Some(v) = &raw.master_sign_pubkey {
        c.signing.sign_pubkey = v.value;
    }
    if let Some(v) = &raw.master_use_pubkey_signature {
        c.signing.use_signature_file = v.value;
    }
    if let Some(v) = &raw.master_sign_key_name {
        let name = v.value.trim();
        if safe_name(name) {
            c.signing.key_name = name.to_string();
        } else {
            errors.push(ConfigError::new(
                span!(v),
                "master_sign_key_name",
                format!("{:?} is not a key file name", v.value),
                "write the signing key pair's name without .pem/.pub (letters, digits, '-', '_', \
                 '.'), e.g. master_sign",
            ));
        }
    }
    if let Some(v) = &raw.master_pubkey_signature {
        match v.value.as_deref().map(str::trim) {
            None | Some("") => {}
            Some(name) if safe_name(name) => c.signing.signature_file = Some(name.to_string()),
            Some(name) => errors.push(ConfigError::new(
                span!(v),
                "master_pubkey_signature",
                format!("{name:?} is not a file name inside pki_dir"),
                "write the signature file's name only (it lives in pki_dir, as in Salt), e.g. \
                 master_pubkey_signature",
            )),
        }
    }
    if let Some(w) = &raw.worker_threads {
        warnings.push(ConfigWarning {
            at: span!(w),
            message: format!(
                "worker_threads: {} ignored; saltgate-master serves requests on an async runtime \
                 sized to the machine",
                w.value
            ),
        });
    }
    if let Some(cid) = &raw.cluster_id {
        let mut cl = ClusterConfig {
            cluster_id: cid.value.trim().to_string(),
            peers: Vec::new(),
            pki_dir: c.pki_dir.clone(),
            pool_port: defaults::CLUSTER_POOL_PORT,
            secret: String::new(),
            allow_insecure_empty_secret: raw
                .cluster_allow_insecure_empty_secret
                .as_ref()
                .is_some_and(|v| v.value),
        };
        if !safe_name(&cl.cluster_id) {
            errors.push(ConfigError::new(
                span!(cid),
                "cluster_id",
                format!("{:?} is not a plain name", cid.value),
                "use letters, digits, '-', '_' and '.'",
            ));
        }
        match &raw.cluster_peers {
            Some(p) if !p.value.is_empty() => {
                for peer in &p.value {
                    if peer.trim().is_empty() || peer.contains(char::is_whitespace) {
                        errors.push(ConfigError::new(
                            span!(p),
                            "cluster_peers",
                            format!("invalid peer address {peer:?}"),
                            "list each peer master as host or host:port",
                        ));
                    }
                }
                cl.peers = p.value.iter().map(|s| s.trim().to_string()).collect();
            }
            other => errors.push(ConfigError::new(
                other
                    .as_ref()
                    .map(|p| span!(p))
                    .unwrap_or_else(|| span!(cid)),
                "cluster_peers",
                "a cluster needs its peers listed",
                "list the other masters' addresses under cluster_peers",
            )),
        }
        if let Some(d) = &raw.cluster_pki_dir {
            cl.pki_dir = PathBuf::from(d.value.trim());
        }
        if let Some(p) = &raw.cluster_pool_port {
            cl.pool_port = p.value;
        }
        match &raw.cluster_secret {
            Some(s) => cl.secret = s.value.clone(),
            None => cl.secret = String::new(),
        }
        if cl.secret.is_empty() && !cl.allow_insecure_empty_secret {
            errors.push(ConfigError::new(
                raw.cluster_secret
                    .as_ref()
                    .map(|s| span!(s))
                    .unwrap_or_else(|| span!(cid)),
                "cluster_secret",
                "an empty cluster_secret lets any host join the cluster",
                "set cluster_secret to a long random string on every master (or, for a lab \
                 only, cluster_allow_insecure_empty_secret: true)",
            ));
        }
        c.cluster = Some(cl);
    } else if let Some(p) = &raw.cluster_peers {
        warnings.push(ConfigWarning {
            at: at(&span!(p)),
            message: "cluster_peers: ignored without cluster_id".to_string(),
        });
    }
    let raw_transport = transport_keys::RawTransport {
        transport: raw.transport.as_ref(),
        ssl: raw.ssl.as_ref(),
        disable_aes_with_tls: raw.disable_aes_with_tls.as_ref(),
    };
    c.transport = transport_keys::read(raw_transport, file, &mut errors, &mut warnings);
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(LoadedSaltMaster {
        config: c,
        warnings,
    })
}

/// Ids, environment and cluster names: what may become one path component.
fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s != "."
        && s != ".."
        && s.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'))
}

#[path = "salt_master_yaml.rs"]
mod yaml_text;
use yaml_text::{serde_error, top_level_keys};

#[path = "salt_master_transport.rs"]
mod transport_keys;
pub use transport_keys::MasterTransport;

#[cfg(test)]
#[path = "salt_master_tests.rs"]
mod tests;
