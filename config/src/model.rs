//! The validated runtime configuration: what the proxy runs from, whichever file it came from.
//!
//! Every value here has passed validation; defaults are filled in. Built by [`crate::yaml`] and by
//! [`crate::haproxy`]; turned back into YAML by [`crate::emit`].

use std::net::SocketAddr;
use std::time::Duration;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub global: Global,
    /// Health-check settings every master starts from (a master may override them).
    pub health: HealthSettings,
    pub masters: Vec<MasterConfig>,
    pub publish: ListenerConfig,
    pub request: ListenerConfig,
    pub admin: AdminConfig,
    /// Masters found in the Salt cluster's key directory (`discovery`). `None`: off.
    pub discovery: Option<Discovery>,
    /// Which minion is where (`presence:`).
    pub presence: crate::presence::PresenceConfig,
}

/// Discovery of masters from a Salt 3008 cluster's `cluster_pki_dir`: every `peers/<id>.pub` is a
/// master (its id is its address, as Salt uses it; or mapped in `peers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The cluster's `cluster_pki_dir`; `peers/*.pub` under it is watched (it may not exist yet).
    pub cluster_pki_dir: std::path::PathBuf,
    /// How often the directory is read.
    pub interval: Duration,
    /// Ports of a discovered master.
    pub publish_port: u16,
    pub request_port: u16,
    /// Peer id -> host, for ids that are not an address (in the order written).
    pub peers: Vec<(String, String)>,
}

impl Config {
    pub fn listeners(&self) -> [&ListenerConfig; 2] {
        [&self.publish, &self.request]
    }
    pub fn listener(&self, role: Role) -> &ListenerConfig {
        match role {
            Role::Publish => &self.publish,
            Role::Request => &self.request,
        }
    }

    /// Listening addresses used twice (publish, request, admin): `(field, problem, fix)` each.
    /// Checked by every loader, so YAML and HAProxy input agree on what is valid.
    pub fn address_conflicts(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        if self.admin.enabled
            && self
                .publish
                .bind
                .iter()
                .chain(&self.request.bind)
                .any(|a| *a == self.admin.bind)
        {
            out.push((
                "admin.bind".into(),
                format!("{} is also a Salt listener address", self.admin.bind),
                "give the admin listener its own port".into(),
            ));
        }
        for a in self
            .publish
            .bind
            .iter()
            .filter(|a| self.request.bind.contains(a))
        {
            out.push((
                "listeners.request.bind".into(),
                format!("{a} is also a publish address"),
                "give the publish and request listeners different ports".into(),
            ));
        }
        out
    }
}

/// Process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Global {
    /// Cap on client sessions over all listeners (HAProxy `global maxconn`). `None`: no cap.
    pub maxconn: Option<u32>,
    /// How long SIGTERM/SIGINT waits for live sessions to end before closing them.
    pub shutdown_grace: Duration,
    /// Raise the open-file limit to the hard limit at start (one session costs two descriptors).
    pub raise_nofile: bool,
    /// How long a drained (or removed) master's live sessions may continue before they are closed.
    pub drain_timeout: Duration,
    /// TCP_USER_TIMEOUT on both legs of every session: how long sent data may stay unacknowledged
    /// before the kernel drops the connection (a blackholed peer). `None`: the kernel's default.
    pub tcp_user_timeout: Option<Duration>,
    /// Worker threads of the proxy's runtime (HAProxy `nbthread`). `None`: one per CPU. Read at
    /// start only; a reload that changes it warns that it takes effect at the next restart.
    pub threads: Option<u16>,
    /// Salt's `transport` of the masters (top-level `transport:`; see [`crate::transport`]).
    pub transport: crate::transport::SaltTransport,
    /// Salt's `ssl` for the masters (top-level `ssl:`): the probes use TLS. `None`: plain.
    pub ssl: Option<crate::transport::SslConfig>,
}

impl Default for Global {
    fn default() -> Self {
        Self {
            maxconn: None,
            shutdown_grace: defaults::SHUTDOWN_GRACE,
            raise_nofile: true,
            drain_timeout: defaults::DRAIN_TIMEOUT,
            tcp_user_timeout: Some(defaults::TCP_USER_TIMEOUT),
            threads: None,
            transport: Default::default(),
            ssl: None,
        }
    }
}

/// The admin listener: health endpoints, `/metrics`, and the control API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub enabled: bool,
    /// Loopback by default: the API can drain masters.
    pub bind: SocketAddr,
    /// A file holding a bearer token; when set, every route but `/healthz` and `/readyz` needs it.
    pub token_file: Option<std::path::PathBuf>,
    /// The operator accepts an admin API reachable beyond loopback without a token
    /// (`admin.allow_unauthenticated: true`). Without it such a configuration is refused.
    pub allow_unauthenticated: bool,
    /// What one client can make the listener hold: connections, waits, deadlines.
    pub limits: AdminLimits,
}

/// Bounds on the admin listener's connections, so that probes (`/healthz`, `/ready`) keep
/// answering under a flood of idle or slow connections. Applied to new connections on reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections open at once (`admin.max_connections`); one more evicts the longest-idle one,
    /// or is closed at once when every one has a request in progress.
    pub max_connections: usize,
    /// Connections that have not sent their first byte yet (`admin.max_waiting`); they hold no
    /// connection slot, and one more evicts the longest-waiting one.
    pub max_waiting: usize,
    /// How long a client that has shown the token may take to send a request's headers, and
    /// to start the next request on a kept-alive connection (`admin.header_timeout`).
    pub header_timeout: Duration,
    /// The same for a connection that has not shown the token, counted from its connect and
    /// from its previous answer (`admin.unauthenticated_header_timeout`).
    pub unauthenticated_header_timeout: Duration,
    /// A connection is asked to close, after its request in progress, once it has been open
    /// this long (`admin.connection_lifetime`).
    pub connection_lifetime: Duration,
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            max_connections: defaults::ADMIN_MAX_CONNECTIONS,
            max_waiting: defaults::ADMIN_MAX_WAITING,
            header_timeout: defaults::ADMIN_HEADER_TIMEOUT,
            unauthenticated_header_timeout: defaults::ADMIN_UNAUTHENTICATED_HEADER_TIMEOUT,
            connection_lifetime: defaults::ADMIN_CONNECTION_LIFETIME,
        }
    }
}

impl AdminConfig {
    /// The API is on, reachable beyond loopback, and needs no token: anyone who can reach it can
    /// drain masters and close sessions. Only valid with `allow_unauthenticated`; the proxy warns
    /// about it at every start and reload.
    pub fn exposed_without_token(&self) -> bool {
        self.enabled && self.token_file.is_none() && !self.bind.ip().is_loopback()
    }

    /// Why this admin configuration must be refused, as `(problem, fix)`: exposed without a token
    /// and without `allow_unauthenticated`. Checked by the loaders; a caller that changes `bind`
    /// afterwards (such as `--admin-bind`) must check again.
    pub fn exposure_refusal(&self) -> Option<(String, String)> {
        if !self.exposed_without_token() || self.allow_unauthenticated {
            return None;
        }
        Some((
            format!(
                "the admin API on {} is reachable beyond loopback and has no token: anyone who reaches it can drain masters",
                self.bind
            ),
            "set admin.token_file to a file holding a bearer token, or bind it to 127.0.0.1; to accept the risk, set admin.allow_unauthenticated: true".into(),
        ))
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: SocketAddr::from(([127, 0, 0, 1], defaults::ADMIN_PORT)),
            token_file: None,
            allow_unauthenticated: false,
            limits: AdminLimits::default(),
        }
    }
}

/// Health-check timing and thresholds, HAProxy's `inter`/`fastinter`/`downinter`/`rise`/`fall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSettings {
    /// Interval between checks while the port is steadily UP.
    pub interval: Duration,
    /// Interval while the state is in transition (UP with failures, DOWN with successes).
    pub fastinter: Duration,
    /// Interval while the port is steadily DOWN.
    pub downinter: Duration,
    /// Consecutive successes that bring a DOWN port UP.
    pub rise: u32,
    /// Consecutive failures that bring an UP port DOWN.
    pub fall: u32,
    /// How long one check may take (connect included) before it counts as a failure.
    pub timeout: Duration,
    /// How long the first stage of a `salt` or `zmtp` check may take: the connect and the master's
    /// ZMTP handshake, which libzmq's I/O thread answers even while Salt's workers are busy. A
    /// master that accepts the connect (the kernel does, from the listen backlog, even for a
    /// stopped process) but does not greet within this is stopped or hung: the check fails after
    /// this, not after `timeout`. Capped by `timeout`. Not used by the `tcp` probe.
    pub handshake_timeout: Duration,
    /// What a check does.
    pub probe: Probe,
}

/// How a master port is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Publish port: the ZMTP greeting arrives. Request port: a ZMTP REQ handshake and Salt's clear
    /// `ping`, answered (a 3008 cluster member answering `cluster_retry` is not ready: DOWN).
    Salt,
    /// Both ports: the peer's ZMTP greeting arrives.
    Zmtp,
    /// Both ports: a TCP connect succeeds (HAProxy's `check`).
    Tcp,
}

impl Probe {
    pub fn as_str(self) -> &'static str {
        match self {
            Probe::Salt => "salt",
            Probe::Zmtp => "zmtp",
            Probe::Tcp => "tcp",
        }
    }
    pub fn parse(s: &str) -> Option<Probe> {
        match s {
            "salt" => Some(Probe::Salt),
            "zmtp" => Some(Probe::Zmtp),
            "tcp" => Some(Probe::Tcp),
            _ => None,
        }
    }
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            interval: defaults::CHECK_INTERVAL,
            fastinter: defaults::CHECK_FASTINTER,
            downinter: defaults::CHECK_DOWNINTER,
            rise: defaults::RISE,
            fall: defaults::FALL,
            timeout: defaults::CHECK_TIMEOUT,
            handshake_timeout: defaults::HANDSHAKE_TIMEOUT,
            probe: Probe::Salt,
        }
    }
}

/// One Salt master: the unit of health, draining and affinity. It has a publish and a request port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterConfig {
    /// Unique name, used in logs, metrics and the admin API.
    pub name: String,
    /// Host name or IP address; resolved when the configuration is loaded into the proxy.
    pub host: String,
    pub publish_port: u16,
    pub request_port: u16,
    /// Relative share of new sessions (0: no new sessions).
    pub weight: u32,
    /// Cap on sessions per port on this master (HAProxy server `maxconn`). `None`: no cap.
    pub maxconn: Option<u32>,
    /// Used only when no non-backup master is UP.
    pub backup: bool,
    /// Starts administratively disabled (HAProxy `disabled`): no new sessions, still checked.
    pub disabled: bool,
    /// Health-check this master (HAProxy `check`). Without checks it is always considered UP.
    pub check: bool,
    pub health: HealthSettings,
}

impl MasterConfig {
    pub fn port(&self, role: Role) -> u16 {
        match role {
            Role::Publish => self.publish_port,
            Role::Request => self.request_port,
        }
    }
}

/// What a listener carries: Salt's publish channel (4505) or its request channel (4506).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Publish,
    Request,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::Publish, Role::Request];
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Publish => "publish",
            Role::Request => "request",
        }
    }
    pub fn default_port(self) -> u16 {
        match self {
            Role::Publish => 4505,
            Role::Request => 4506,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a listener picks a master for a new session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// Weighted round-robin over the masters that are UP (HAProxy `roundrobin`, `static-rr`).
    RoundRobin,
    /// The master with the fewest live sessions on this port, relative to its weight (`leastconn`).
    LeastConn,
    /// A hash of the client's IP address (`source`): the same minion lands on the same master on
    /// both ports while the set of UP masters does not change.
    Source,
    /// The first master in configuration order that is UP and below its `maxconn` (HAProxy
    /// `first`; weights other than 0 are ignored), with the listener's `failback`.
    First,
}

impl Balance {
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::RoundRobin => "roundrobin",
            Balance::LeastConn => "leastconn",
            Balance::Source => "source",
            Balance::First => "first",
        }
    }
}

/// What happens to a master's live sessions on this listener when the master is marked DOWN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMasterDown {
    /// Close them, at `close_rate` per second (HAProxy `on-marked-down shutdown-sessions`).
    Close,
    /// Leave them until they end by themselves (HAProxy's default).
    Keep,
    /// Request listener only: keep the minion's connection and move it to another UP master,
    /// re-sending the request the old master never answered (docs/request-continuity.md). Also
    /// applies when the master resets or closes the connection. Paced at `close_rate`.
    Migrate,
}

impl OnMasterDown {
    pub fn as_str(self) -> &'static str {
        match self {
            OnMasterDown::Close => "close",
            OnMasterDown::Keep => "keep",
            OnMasterDown::Migrate => "migrate",
        }
    }
}

/// What a listener does with a minion's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListenerMode {
    /// Layer 4: one master connection per minion connection, bytes pumped both ways.
    #[default]
    L4,
    /// Publish listener only: saltgate is the minions' PUB peer and relays what every UP master
    /// publishes (one upstream SUB per master) to every minion. See docs/fanout.md.
    Fanout,
}

impl ListenerMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerMode::L4 => "l4",
            ListenerMode::Fanout => "fanout",
        }
    }
}

/// A listener: where minions connect for one role, and how their sessions are handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub role: Role,
    pub bind: Vec<SocketAddr>,
    /// `l4` (default) or `fanout` (publish listener only).
    pub mode: ListenerMode,
    /// `mode: fanout` only: the Salt cluster's `cluster_pki_dir`, whose `.aes` (the cluster's
    /// publish key) lets the hub read each job's `jid` and forward only the first copy of a job
    /// that every master publishes. `None` (default): every copy is forwarded. See docs/fanout.md.
    pub dedup_cluster_pki_dir: Option<std::path::PathBuf>,
    /// `mode: fanout` only: each minion session's queue in messages (Salt's `pub_hwm`, 1000);
    /// a copy beyond it is dropped for that session and counted, never waited for. Read when a
    /// session attaches: a reload applies to the sessions that connect after it.
    pub hwm: u32,
    /// `mode: fanout` only: what one minion may make the hub hold (issue 31). A minion sends
    /// the hub only its READY, SUBSCRIBE/CANCEL and PING/PONG: small frames, few topics.
    pub fanout_limits: FanoutLimits,
    /// `mode: fanout` only: the jobs of the last `replay_window` kept and sent again to a minion
    /// whose publish session comes back (docs/ha.md, "Replay on reconnect"). `None`: off.
    pub replay: Option<ReplayConfig>,
    pub balance: Balance,
    /// Idle timeout on the client side (HAProxy `timeout client`). `None`: never.
    pub timeout_client: Option<Duration>,
    /// Idle timeout on the master side (HAProxy `timeout server`). `None`: never.
    pub timeout_server: Option<Duration>,
    /// Idle timeout once the client has half-closed (HAProxy `timeout client-fin`).
    pub timeout_client_fin: Option<Duration>,
    /// Idle timeout once the master has half-closed (HAProxy `timeout server-fin`).
    pub timeout_server_fin: Option<Duration>,
    /// How long one connect attempt to a master may take (HAProxy `timeout connect`).
    pub timeout_connect: Duration,
    /// Further connect attempts after a failed one, each to the next candidate (HAProxy `retries`).
    pub retries: u32,
    /// Cap on live sessions on this listener; over it, new connections wait in the kernel backlog.
    pub maxconn: Option<u32>,
    /// How long a client may wait in the listener's queue for a master below its `maxconn`
    /// (HAProxy `timeout queue`). `None`: `timeout_connect`, as HAProxy when it is unset.
    pub timeout_queue: Option<Duration>,
    /// Clients that may wait in the listener's queue when every master that could take them is at
    /// its `maxconn`; over it, a client is closed at once (`queue-full`). 0: no queue (`no-master`).
    pub maxqueue: u32,
    /// Listen backlog.
    pub backlog: u32,
    pub on_master_down: OnMasterDown,
    /// `on_master_down: migrate`: the largest unanswered request (bytes, ZMTP framing included)
    /// kept for re-sending; a bigger one is not replayed and its session closes as with `close`.
    pub migrate_buffer: u32,
    /// `_auth` pacing per master (request only; `None`: off). See [`crate::auth_limit`].
    pub auth_limit: Option<crate::auth_limit::AuthLimit>,
    /// Sessions per second closed when a master goes DOWN (0: all at once).
    pub close_rate: u32,
    /// One log line per closed session (HAProxy `option tcplog`).
    pub access_log: bool,
    /// Moving publish sessions onto a master that came back UP or was added (publish only).
    pub rebalance: Rebalance,
    /// `balance: first`: when a master that came back UP regains its place in the order.
    pub failback: Failback,
    /// SO_REUSEPORT on the listening sockets: several saltgate processes may share the port.
    pub reuse_port: bool,
    /// IP_FREEBIND on the listening sockets (HAProxy's `bind ... freebind`): the bind address may
    /// be one the host does not hold yet, such as a VIP that keepalived moves (docs/ha.md).
    pub freebind: bool,
}

/// What one minion session may make the fan-out hub hold (`listeners.publish` in `mode:
/// fanout`). A frame or a SUBSCRIBE past a limit, or a frame that takes too long, closes the
/// session (counted in `saltgate_fanout_sessions_cut_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanoutLimits {
    /// `max_frame`: the largest frame a minion may send (bytes).
    pub max_frame: u32,
    /// `max_topics`: distinct topics one session may subscribe to.
    pub max_topics: u32,
    /// `max_topic_bytes`: bytes of those topics together.
    pub max_topic_bytes: u32,
    /// `frame_timeout`: longest a frame may take from its first byte to its last.
    pub frame_timeout: Duration,
}

/// `listeners.publish.replay_window` and its bounds (fan-out only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayConfig {
    /// `replay_window`: how long a job is kept for replay (at most 60 s).
    pub window: Duration,
    /// `replay_max_jobs`: jobs kept at most (at most 100, Salt's `minion_jid_queue_hwm`).
    pub max_jobs: u32,
    /// `replay_max_bytes`: bytes of those jobs at most.
    pub max_bytes: u64,
    /// `replay_peer`: the other node's admin address (`IP:PORT`). While its `/ready` fails, a
    /// minion this node never served is sent the jobs published since the peer was last ready
    /// (a failover: its session sat on the dead node). `None`: no failover replay.
    pub peer: Option<std::net::SocketAddr>,
}

impl ReplayConfig {
    pub fn with_window(window: Duration) -> Self {
        ReplayConfig {
            window,
            max_jobs: defaults::REPLAY_MAX_JOBS,
            max_bytes: defaults::REPLAY_MAX_BYTES,
            peer: None,
        }
    }
}

impl Default for FanoutLimits {
    fn default() -> Self {
        FanoutLimits {
            max_frame: defaults::FANOUT_MAX_FRAME,
            max_topics: defaults::FANOUT_MAX_TOPICS,
            max_topic_bytes: defaults::FANOUT_MAX_TOPIC_BYTES,
            frame_timeout: defaults::FANOUT_FRAME_TIMEOUT,
        }
    }
}

/// With `balance: first`, a master that comes back UP is held behind the masters that stayed UP
/// until it has been UP for the delay (`failback: 30s`), or for good (`failback: false`, until the
/// masters ahead of it in use are gone). Publish sessions then move back to it as the
/// listener's `rebalance` says (at its rate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failback {
    After(Duration),
    Never,
}

/// Rebalancing of publish sessions: when a master comes back UP (or is added), sessions are
/// moved to it (closed with reason `rebalanced`; the minion reconnects and is placed on the least
/// loaded master) while the spread exceeds `tolerance_pct`, at most `rate` per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebalance {
    pub enabled: bool,
    /// How far (percent of its weighted share) a master's session count may be from its share.
    pub tolerance_pct: u32,
    /// Most sessions moved per second (at least 1).
    pub rate: u32,
    /// How long a master must stay UP before sessions are moved to it.
    pub delay: Duration,
}

impl Rebalance {
    /// On (the publish listener's default).
    pub const ON: Rebalance = Rebalance {
        enabled: true,
        tolerance_pct: defaults::REBALANCE_TOLERANCE_PCT,
        rate: defaults::REBALANCE_RATE,
        delay: defaults::REBALANCE_DELAY,
    };
    /// Off (the request listener: its sessions are short and rebalance themselves).
    pub const OFF: Rebalance = Rebalance {
        enabled: false,
        ..Rebalance::ON
    };
}

impl ListenerConfig {
    /// How long a client may wait in the queue: `timeout_queue`, else `timeout_connect` (HAProxy:
    /// "if unspecified, the same value as the backend's connection timeout").
    pub fn queue_timeout(&self) -> Duration {
        self.timeout_queue.unwrap_or(self.timeout_connect)
    }

    /// The listener defaults for a role, as saltgate's YAML fills them in.
    pub fn defaults_for(role: Role) -> Self {
        let idle = match role {
            Role::Publish => defaults::PUBLISH_IDLE,
            Role::Request => defaults::REQUEST_IDLE,
        };
        Self {
            role,
            bind: vec![SocketAddr::from(([0, 0, 0, 0], role.default_port()))],
            mode: ListenerMode::L4,
            dedup_cluster_pki_dir: None,
            hwm: defaults::FANOUT_HWM,
            fanout_limits: FanoutLimits::default(),
            replay: None,
            balance: Balance::RoundRobin,
            timeout_client: Some(idle),
            timeout_server: Some(idle),
            timeout_client_fin: None,
            timeout_server_fin: None,
            timeout_connect: defaults::CONNECT_TIMEOUT,
            retries: defaults::RETRIES,
            maxconn: None,
            timeout_queue: None,
            maxqueue: defaults::MAXQUEUE,
            backlog: defaults::BACKLOG,
            on_master_down: OnMasterDown::Close,
            migrate_buffer: defaults::MIGRATE_BUFFER,
            auth_limit: None,
            close_rate: defaults::CLOSE_RATE,
            access_log: true,
            rebalance: match role {
                Role::Publish => Rebalance::ON,
                Role::Request => Rebalance::OFF,
            },
            failback: Failback::After(defaults::FAILBACK),
            reuse_port: false,
            freebind: false,
        }
    }
}

/// Named defaults, shared by the loaders and documented in the README.
pub mod defaults {
    use std::time::Duration;
    /// Between check starts while a port is steadily UP. A check that outlasts it is followed at
    /// once by the next (intervals count from the start of the previous check).
    pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
    /// While in transition (UP with failures, DOWN with successes, before the first result). At or
    /// below [`HANDSHAKE_TIMEOUT`], so the `fall` checks of a hung master run back to back:
    /// detected within `interval + fall x handshake_timeout` (4 s with these defaults).
    pub const CHECK_FASTINTER: Duration = Duration::from_millis(500);
    /// While a port is steadily DOWN: a restarted master is UP within about
    /// `downinter + (rise - 1) x fastinter` of answering its first check.
    pub const CHECK_DOWNINTER: Duration = Duration::from_secs(1);
    /// One check, connect included. Salt's `ping` goes through the master's worker pool, which
    /// can take seconds on a busy master: HAProxy's habit (timeout = inter) is too tight for it.
    pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
    /// The connect and the ZMTP handshake of a check (answered by libzmq's I/O thread, busy
    /// workers or not): a stopped master fails here, a busy one passes and gets `timeout`.
    pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
    pub const RISE: u32 = 2;
    pub const FALL: u32 = 3;
    pub const RETRIES: u32 = 3;
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    pub const PUBLISH_IDLE: Duration = Duration::from_secs(86_400);
    pub const REQUEST_IDLE: Duration = Duration::from_secs(60);
    pub const BACKLOG: u32 = 1024;
    /// Clients waiting per listener for a master below its `maxconn` (each holds a descriptor).
    pub const MAXQUEUE: u32 = 1024;
    /// `listeners.publish.hwm` (fan-out): Salt's `pub_hwm` default.
    pub const FANOUT_HWM: u32 = 1000;
    /// Largest `listeners.publish.hwm`: a million queued messages per session is already far
    /// more memory than any minion is worth.
    pub const MAX_FANOUT_HWM: u32 = 1_000_000;
    /// `listeners.publish.max_frame` (fan-out): the frame limit of saltgate's own PUB socket
    /// (wire's `PUB_DEFAULT_MAX_FRAME_SIZE`). A minion's largest frame is its READY (~100
    /// bytes) or a SUBSCRIBE to its hashed id (64 bytes). Salt sets no `ZMQ_MAXMSGSIZE`
    /// (libzmq: unlimited).
    pub const FANOUT_MAX_FRAME: u32 = 8 * 1024;
    /// `listeners.publish.max_topics` (fan-out): a Salt minion subscribes to 1 to 3 topics.
    pub const FANOUT_MAX_TOPICS: u32 = 64;
    /// `listeners.publish.max_topic_bytes` (fan-out).
    pub const FANOUT_MAX_TOPIC_BYTES: u32 = 8 * 1024;
    /// `listeners.publish.frame_timeout` (fan-out): a minion's frames are a few bytes.
    pub const FANOUT_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
    /// Longest `listeners.publish.replay_window`.
    pub const REPLAY_WINDOW_MAX: Duration = Duration::from_secs(60);
    /// `replay_max_jobs` and its maximum: Salt's `minion_jid_queue_hwm` (a minion remembers
    /// the last 100 jids it ran; a job older than that could run twice).
    pub const REPLAY_MAX_JOBS: u32 = 100;
    /// `replay_max_bytes`.
    pub const REPLAY_MAX_BYTES: u64 = 16 * 1024 * 1024;
    /// Highest `max_frame` and `max_topic_bytes` (the largest frame the ZMTP codec takes).
    pub const FANOUT_LIMIT_MAX: u32 = 64 * 1024 * 1024;
    pub const CLOSE_RATE: u32 = 500;
    /// `migrate_buffer`: most Salt requests are a few KiB; big job returns go over it.
    pub const MIGRATE_BUFFER: u32 = 1024 * 1024;
    /// Highest `migrate_buffer` (the largest ZMTP frame saltgate's codec takes).
    pub const MIGRATE_BUFFER_MAX: u32 = 64 * 1024 * 1024;
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    pub const WEIGHT: u32 = 1;
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
    pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);
    pub const ADMIN_PORT: u16 = 9505;
    pub const ADMIN_MAX_CONNECTIONS: usize = 64;
    pub const ADMIN_MAX_WAITING: usize = 256;
    pub const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
    pub const ADMIN_UNAUTHENTICATED_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
    pub const ADMIN_CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
    pub const REBALANCE_TOLERANCE_PCT: u32 = 10;
    pub const REBALANCE_RATE: u32 = 50;
    pub const REBALANCE_DELAY: Duration = Duration::from_secs(10);
    pub const FAILBACK: Duration = Duration::from_secs(30);
    pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(2);
}
