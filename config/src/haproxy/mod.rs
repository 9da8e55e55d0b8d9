//! The HAProxy subset that fronts Salt masters today, read as HAProxy reads it and turned into
//! saltgate's [`Config`](crate::model::Config) by [`convert`].
//!
//! Supported: `global`, `defaults`, `frontend`, `backend` and `listen` sections in TCP mode, with the
//! directives listed in the README's migration guide. Directives that mean nothing to saltgate (such
//! as `log global`, `mode tcp`, `daemon`) are accepted, some with a warning; anything else is an
//! error naming the line and what to do instead.

mod convert;
mod lex;

use std::path::Path;
use std::time::Duration;

use self::server_options::{SERVER_OPTIONS, SERVER_OPTIONS_WITH_ARGUMENT};
use crate::addr::split_host_port;
use crate::duration::{parse_duration, BareNumber};
use crate::error::{ConfigError, ConfigErrors, ConfigWarning, Position};
use crate::model::Balance;
use crate::Loaded;

pub use lex::{tokenize, Line};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Defaults,
    Frontend,
    Backend,
    Listen,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Defaults => "defaults",
            Kind::Frontend => "frontend",
            Kind::Backend => "backend",
            Kind::Listen => "listen",
        }
    }
    fn has_frontend(self) -> bool {
        matches!(self, Kind::Defaults | Kind::Frontend | Kind::Listen)
    }
    fn has_backend(self) -> bool {
        matches!(self, Kind::Defaults | Kind::Backend | Kind::Listen)
    }
}

/// A value and the line it was set on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct At<T> {
    v: T,
    line: u32,
}

/// Options on a `server` or `default-server` line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ServerOpts {
    check: Option<bool>,
    inter: Option<Duration>,
    fastinter: Option<Duration>,
    downinter: Option<Duration>,
    rise: Option<u32>,
    fall: Option<u32>,
    maxconn: Option<u32>,
    weight: Option<u32>,
    backup: Option<bool>,
    disabled: Option<bool>,
    shutdown_sessions: Option<bool>,
}

impl ServerOpts {
    /// `self` over `base`: what a server line sets wins over `default-server`.
    fn over(&self, base: &ServerOpts) -> ServerOpts {
        ServerOpts {
            check: self.check.or(base.check),
            inter: self.inter.or(base.inter),
            fastinter: self.fastinter.or(base.fastinter),
            downinter: self.downinter.or(base.downinter),
            rise: self.rise.or(base.rise),
            fall: self.fall.or(base.fall),
            maxconn: self.maxconn.or(base.maxconn),
            weight: self.weight.or(base.weight),
            backup: self.backup.or(base.backup),
            disabled: self.disabled.or(base.disabled),
            shutdown_sessions: self.shutdown_sessions.or(base.shutdown_sessions),
        }
    }
}

#[derive(Debug, Clone)]
struct Server {
    name: String,
    host: String,
    port: Option<u16>,
    opts: ServerOpts,
    line: u32,
}

/// A `defaults`, `frontend`, `backend` or `listen` section, with what it inherited from `defaults`.
#[derive(Debug, Clone)]
struct Proxy {
    kind: Kind,
    name: String,
    line: u32,
    mode_http: Option<At<bool>>,
    binds: Vec<At<String>>,
    /// A `bind` line of this section has `freebind`.
    freebind: bool,
    tcplog: Option<bool>,
    timeout_client: Option<At<Duration>>,
    timeout_server: Option<At<Duration>>,
    timeout_connect: Option<At<Duration>>,
    timeout_client_fin: Option<At<Duration>>,
    timeout_server_fin: Option<At<Duration>>,
    timeout_tunnel: Option<At<Duration>>,
    timeout_check: Option<At<Duration>>,
    timeout_queue: Option<At<Duration>>,
    default_backend: Option<At<String>>,
    balance: Option<At<Balance>>,
    retries: Option<u32>,
    maxconn: Option<u32>,
    backlog: Option<u32>,
    default_server: ServerOpts,
    servers: Vec<Server>,
}

impl Proxy {
    fn new(kind: Kind, name: String, line: u32, defaults: &Proxy) -> Proxy {
        Proxy {
            kind,
            name,
            line,
            binds: Vec::new(),
            freebind: false,
            servers: Vec::new(),
            default_backend: if kind.has_frontend() {
                defaults.default_backend.clone()
            } else {
                None
            },
            ..defaults.clone()
        }
    }

    fn empty_defaults() -> Proxy {
        Proxy {
            kind: Kind::Defaults,
            name: String::new(),
            line: 0,
            mode_http: None,
            binds: Vec::new(),
            freebind: false,
            tcplog: None,
            timeout_client: None,
            timeout_server: None,
            timeout_connect: None,
            timeout_client_fin: None,
            timeout_server_fin: None,
            timeout_tunnel: None,
            timeout_check: None,
            timeout_queue: None,
            default_backend: None,
            balance: None,
            retries: None,
            maxconn: None,
            backlog: None,
            default_server: ServerOpts::default(),
            servers: Vec::new(),
        }
    }
}

/// Global settings saltgate maps.
#[derive(Debug, Clone, Default)]
struct GlobalSection {
    maxconn: Option<u32>,
    nbthread: Option<u32>,
    hard_stop_after: Option<Duration>,
}

/// The parsed file, before it is turned into a [`crate::model::Config`].
#[derive(Debug)]
struct Parsed {
    global: GlobalSection,
    proxies: Vec<Proxy>,
}

struct Parser<'a> {
    file: Option<&'a Path>,
    /// Column of each line's first word (index 0 is line 1): where an error on that line points.
    columns: Vec<u32>,
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigWarning>,
}

impl Parser<'_> {
    fn pos(&self, line: u32) -> Position {
        let column = line
            .checked_sub(1)
            .and_then(|i| self.columns.get(i as usize))
            .copied()
            .unwrap_or(0);
        Position::new(self.file, line, column)
    }
    fn error(
        &mut self,
        line: u32,
        field: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let at = self.pos(line);
        self.errors.push(ConfigError::new(at, field, message, fix));
    }
    fn warn(&mut self, line: u32, message: impl Into<String>) {
        let at = self.pos(line);
        self.warnings.push(ConfigWarning {
            at,
            message: message.into(),
        });
    }

    fn arg<'l>(&mut self, l: &'l Line, i: usize, what: &str) -> Option<&'l str> {
        let v = l.word(i);
        if v.is_none() {
            let d = field_for(l, i);
            self.error(
                l.no,
                &d,
                format!("'{d}' needs {what}"),
                format!("write '{d} <{what}>'"),
            );
        }
        v
    }

    fn duration(&mut self, l: &Line, i: usize) -> Option<Duration> {
        let d = field_for(l, i);
        let v = self.arg(l, i, "a time")?;
        match parse_duration(v, BareNumber::Millis) {
            Ok(t) => Some(t),
            Err(m) => {
                self.error(
                    l.no,
                    &d,
                    m,
                    "write a number with a unit such as 10s, 1m or 500ms",
                );
                None
            }
        }
    }

    /// A time that must not be zero (check intervals).
    fn positive_duration(&mut self, l: &Line, i: usize) -> Option<Duration> {
        let d = self.duration(l, i)?;
        if d.is_zero() {
            let what = field_for(l, i);
            self.error(
                l.no,
                &what,
                "must be greater than zero",
                "write a positive time such as 2s",
            );
            return None;
        }
        Some(d)
    }

    fn number(&mut self, l: &Line, i: usize, min: u32, max: u32) -> Option<u32> {
        let d = field_for(l, i);
        let v = self.arg(l, i, "a number")?;
        let problem = match v.parse::<i128>() {
            Ok(n) if (i128::from(min)..=i128::from(max)).contains(&n) => {
                return u32::try_from(n).ok()
            }
            Ok(n) => format!("{n} is out of range"),
            Err(_) => format!("{v:?} is not a whole number"),
        };
        self.error(
            l.no,
            &d,
            problem,
            format!("write a whole number from {min} to {max}"),
        );
        None
    }

    fn extra_words(&mut self, l: &Line, n: usize) {
        if l.words.len() > n {
            let d = l.words[..n].join(" ");
            self.error(
                l.no,
                &d,
                format!("unexpected {:?} after '{d}'", l.words[n]),
                format!("remove it; '{d}' takes {} word(s) here", n - 1),
            );
        }
    }

    fn global(&mut self, g: &mut GlobalSection, l: &Line) {
        let w0 = l.words[0].as_str();
        match w0 {
            "maxconn" => g.maxconn = self.number(l, 1, 1, u32::MAX),
            "hard-stop-after" => g.hard_stop_after = self.duration(l, 1),
            "nbthread" => g.nbthread = self.number(l, 1, 1, 1024),
            "log" | "log-tag" | "log-send-hostname" => self.warn(l.no, format!("global '{w0}' ignored: saltgate logs to stderr (text or --log-format json); point your log shipper there")),
            "daemon" | "master-worker" | "user" | "group" | "uid" | "gid" | "chroot" | "pidfile" | "nbproc" | "node" | "description" => {
                self.warn(l.no, format!("global '{w0}' ignored: run saltgate under a service manager (see the systemd unit in examples/)"))
            }
            "stats" => self.warn(l.no, "global 'stats' ignored: saltgate's state is on its admin API and /metrics"),
            "ulimit-n" => self.warn(l.no, "global 'ulimit-n' ignored: saltgate raises its open-file limit to the hard limit at start"),
            "ca-base" | "crt-base" | "spread-checks" => self.warn(l.no, format!("global '{w0}' ignored: it has no meaning for saltgate's TCP proxying")),
            w if w.starts_with("ssl-") || w.starts_with("tune.") => self.warn(l.no, format!("global '{w}' ignored: it has no meaning for saltgate's TCP proxying")),
            _ => self.error(l.no, w0, format!("global directive '{w0}' is not supported"), "remove it; the supported global directives are maxconn, nbthread and hard-stop-after (see the README's migration guide)"),
        }
    }

    /// One directive inside a defaults/frontend/backend/listen section.
    fn proxy(&mut self, p: &mut Proxy, l: &Line) {
        let k = p.kind;
        let w0 = l.words[0].as_str();
        let w1 = l.word(1).unwrap_or("");
        let wrong_section = |this: &mut Self, fix: &str| {
            this.error(
                l.no,
                w0,
                format!("'{w0}' is not allowed in a {} section", k.as_str()),
                fix.to_string(),
            );
        };
        match w0 {
            "mode" => match w1 {
                "tcp" => p.mode_http = Some(At { v: false, line: l.no }),
                "http" => p.mode_http = Some(At { v: true, line: l.no }),
                _ => self.error(l.no, "mode", format!("unknown mode {w1:?}"), "write 'mode tcp'"),
            },
            "log" => {
                if w1 != "global" {
                    self.warn(l.no, "'log' target ignored: saltgate logs to stderr");
                }
            }
            "description" => {}
            "option" | "no" => self.option(p, l),
            "timeout" => {
                let Some(d) = self.duration(l, 2) else { return };
                if l.words.len() > 3 {
                    self.extra_words(l, 3);
                    return;
                }
                // HAProxy reads a zero timeout as "no timeout"; connect and check need one.
                // A zero `timeout queue` would let clients wait forever: saltgate bounds the wait.
                if d.is_zero() && matches!(w1, "connect" | "check" | "queue") {
                    self.error(l.no, &format!("timeout {w1}"), "must be greater than zero", "write a positive time such as 5s");
                    return;
                }
                let at = Some(At { v: d, line: l.no });
                match w1 {
                    "client" if k.has_frontend() => p.timeout_client = at,
                    "client-fin" if k.has_frontend() => p.timeout_client_fin = at,
                    "server" if k.has_backend() => p.timeout_server = at,
                    "server-fin" if k.has_backend() => p.timeout_server_fin = at,
                    "connect" if k.has_backend() => p.timeout_connect = at,
                    "tunnel" if k.has_backend() => p.timeout_tunnel = at,
                    "check" if k.has_backend() => p.timeout_check = at,
                    "queue" if k.has_backend() => p.timeout_queue = at,
                    "client" | "client-fin" | "server" | "server-fin" | "connect" | "tunnel" | "check" | "queue" => {
                        wrong_section(self, "move it to the frontend (client side) or backend (server side) section")
                    }
                    "http-request" | "http-keep-alive" | "tarpit" => self.warn(l.no, format!("'timeout {w1}' ignored: HTTP only")),
                    _ => self.error(l.no, "timeout", format!("unknown timeout {w1:?}"), "use client, server, connect, client-fin, server-fin, tunnel, check or queue"),
                }
            }
            "bind" if matches!(k, Kind::Frontend | Kind::Listen) => {
                let Some(addrs) = self.arg(l, 1, "an address") else { return };
                for a in addrs.split(',') {
                    p.binds.push(At { v: a.to_string(), line: l.no });
                }
                for opt in &l.words[2..] {
                    match opt.as_str() {
                        "freebind" => p.freebind = true,
                        "v4v6" | "v6only" | "transparent" | "defer-accept" | "tfo" => self.warn(l.no, format!("bind option '{opt}' ignored")),
                        _ => self.error(l.no, "bind", format!("bind option '{opt}' is not supported"), "remove it; saltgate binds plain TCP (no ssl, no accept-proxy)"),
                    }
                }
            }
            "default_backend" if k.has_frontend() => {
                if let Some(b) = self.arg(l, 1, "a backend name") {
                    p.default_backend = Some(At { v: b.to_string(), line: l.no });
                }
                self.extra_words(l, 2);
            }
            "use_backend" => self.error(l.no, w0, "content switching is not supported", "use 'default_backend': saltgate has one publish and one request backend"),
            "balance" if k.has_backend() => match crate::yaml::parse_balance(w1) {
                Some(b) => p.balance = Some(At { v: b, line: l.no }),
                None => self.error(l.no, "balance", format!("balance {w1:?} is not supported"), "use roundrobin, static-rr, leastconn, source or first"),
            },
            "hash-type" if k.has_backend() => self.warn(l.no, "'hash-type' ignored: saltgate's source balancing is always a consistent hash"),
            "retries" if k.has_backend() => p.retries = self.number(l, 1, 0, 100),
            "maxconn" if k.has_frontend() => p.maxconn = self.number(l, 1, 1, u32::MAX),
            "backlog" if k.has_frontend() => p.backlog = self.number(l, 1, 1, 1 << 20),
            "fullconn" if k.has_backend() => self.warn(l.no, "'fullconn' ignored: saltgate has no dynamic maxconn"),
            "default-server" if k.has_backend() => {
                let mut opts = ServerOpts::default();
                self.server_opts(&mut opts, l, 1);
                p.default_server = opts.over(&p.default_server);
            }
            "server" if matches!(k, Kind::Backend | Kind::Listen) => self.server(p, l),
            "errorfile" | "http-request" | "http-response" | "http-check" | "compression" | "cookie" | "capture" if k == Kind::Defaults => {
                self.warn(l.no, format!("'{w0}' ignored: HTTP only"))
            }
            "acl" | "tcp-request" | "tcp-response" | "stick-table" | "stick" | "http-request" | "http-response" | "use-server" => self.error(
                l.no,
                w0,
                format!("'{w0}' is not supported"),
                "remove it; for minion affinity use 'balance source'",
            ),
            "bind" | "default_backend" | "balance" | "retries" | "maxconn" | "backlog" | "server" | "default-server" | "fullconn" | "hash-type" => {
                wrong_section(self, "move it to the section HAProxy expects it in (bind/maxconn: frontend; server/balance/retries: backend)")
            }
            _ => self.error(l.no, w0, format!("directive '{w0}' is not supported"), "remove it or see the README's migration guide for what saltgate understands"),
        }
    }

    fn option(&mut self, p: &mut Proxy, l: &Line) {
        let negated = l.words[0] == "no";
        let (name_idx, what) = if negated {
            (2, l.word(1))
        } else {
            (1, Some("option"))
        };
        if what != Some("option") {
            self.error(
                l.no,
                "no",
                "'no' must be followed by 'option'",
                "write 'no option <name>'",
            );
            return;
        }
        let Some(name) = self.arg(l, name_idx, "an option name") else {
            return;
        };
        match name {
            "tcplog" => p.tcplog = Some(!negated),
            "redispatch" | "tcpka" | "clitcpka" | "srvtcpka" | "tcp-check" | "log-health-checks" | "splice-auto" | "splice-request" | "splice-response" | "tcp-smart-accept" | "tcp-smart-connect" => {}
            "dontlognull" => self.warn(l.no, "'option dontlognull' ignored: saltgate logs every session (health checks are not sessions)"),
            "httplog" | "forwardfor" | "http-server-close" | "httpclose" | "http-keep-alive" | "http-buffer-request" | "httpchk" if p.kind == Kind::Defaults => {
                self.warn(l.no, format!("'option {name}' ignored: HTTP only"))
            }
            "httpchk" => self.error(l.no, "option httpchk", "HTTP health checks do not apply to Salt's ports", "remove it; saltgate checks masters with TCP connects (Salt-aware checks come with the wire crate)"),
            _ => self.error(l.no, &format!("option {name}"), format!("'option {name}' is not supported"), "remove it or see the README's migration guide"),
        }
    }

    fn server(&mut self, p: &mut Proxy, l: &Line) {
        let (Some(name), Some(addr)) = (self.arg(l, 1, "a name"), self.arg(l, 2, "an address"))
        else {
            return;
        };
        let (host, port) = match split_host_port(addr) {
            Ok(hp) => hp,
            Err(m) => {
                self.error(
                    l.no,
                    &format!("server {name}"),
                    m,
                    "write the address as HOST or HOST:PORT",
                );
                return;
            }
        };
        let mut opts = ServerOpts::default();
        self.server_opts(&mut opts, l, 3);
        let opts = opts.over(&p.default_server);
        if p.servers.iter().any(|s| s.name == name) {
            self.error(
                l.no,
                &format!("server {name}"),
                format!(
                    "duplicate server name {name:?} in {} {}",
                    p.kind.as_str(),
                    p.name
                ),
                "give every server its own name",
            );
        }
        p.servers.push(Server {
            name: name.to_string(),
            host,
            port,
            opts,
            line: l.no,
        });
    }

    fn server_opts(&mut self, o: &mut ServerOpts, l: &Line, from: usize) {
        let mut i = from;
        while i < l.words.len() {
            let w = l.words[i].as_str();
            match w {
                "check" => o.check = Some(true),
                "no-check" => o.check = Some(false),
                "backup" => o.backup = Some(true),
                "no-backup" => o.backup = Some(false),
                "disabled" => o.disabled = Some(true),
                "enabled" => o.disabled = Some(false),
                "inter" => {
                    o.inter = self.positive_duration(l, i + 1);
                    i += 1;
                }
                "fastinter" => {
                    o.fastinter = self.positive_duration(l, i + 1);
                    i += 1;
                }
                "downinter" => {
                    o.downinter = self.positive_duration(l, i + 1);
                    i += 1;
                }
                "rise" => {
                    o.rise = self.number(l, i + 1, 1, 1000);
                    i += 1;
                }
                "fall" => {
                    o.fall = self.number(l, i + 1, 1, 1000);
                    i += 1;
                }
                "maxconn" => {
                    o.maxconn = self.number(l, i + 1, 0, u32::MAX);
                    i += 1;
                }
                "weight" => {
                    o.weight = self.number(l, i + 1, 0, 256);
                    i += 1;
                }
                "maxqueue" => {
                    self.warn(l.no, "'maxqueue' ignored: saltgate bounds the queue per listener (listeners.<role>.maxqueue in YAML, default 1024), not per master");
                    i += 1;
                }
                "on-marked-down" => {
                    match l.word(i + 1) {
                        Some("shutdown-sessions") => o.shutdown_sessions = Some(true),
                        other => self.error(
                            l.no,
                            "on-marked-down",
                            format!("on-marked-down {:?} is not supported", other.unwrap_or("")),
                            "use 'on-marked-down shutdown-sessions'",
                        ),
                    }
                    i += 1;
                }
                _ => {
                    self.error(
                        l.no,
                        w,
                        format!("server option '{w}' is not supported"),
                        "remove it; saltgate understands check, inter, fastinter, downinter, rise, fall, maxconn, weight, backup, disabled and on-marked-down shutdown-sessions",
                    );
                    // Keep checking the rest of the line, skipping the refused option's argument
                    // (`slowstart 10s`) so it is not reported as an option of its own.
                    let takes_argument = SERVER_OPTIONS_WITH_ARGUMENT.contains(&w)
                        || l.word(i + 1).is_some_and(|n| {
                            n.starts_with(|c: char| c.is_ascii_digit())
                                && !SERVER_OPTIONS.contains(&n)
                        });
                    if takes_argument {
                        i += 1;
                    }
                }
            }
            i += 1;
        }
    }
}

/// How an error names the word before position `i` of a line: the directive's words for most
/// (`timeout client`), but only the server's name and the option on a long server line
/// (`server rserve1 rise`).
fn field_for(l: &Line, i: usize) -> String {
    let i = i.min(l.words.len());
    match l.word(0) {
        Some("server") if i > 3 => format!("server {} {}", l.words[1], l.words[i - 1]),
        Some("default-server") if i > 2 => format!("default-server {}", l.words[i - 1]),
        _ => l.words[..i].join(" "),
    }
}

/// Parses an HAProxy configuration and converts it into saltgate's [`Config`](crate::model::Config).
pub fn parse_haproxy(text: &str, file: Option<&Path>) -> Result<Loaded, ConfigErrors> {
    let mut ps = Parser {
        file,
        columns: text
            .lines()
            .map(|l| {
                let indent = l.chars().take_while(|c| c.is_whitespace()).count();
                u32::try_from(indent + 1).unwrap_or(u32::MAX)
            })
            .collect(),
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let parsed = parse_sections(&mut ps, text);
    // Convert even when lines were refused, so one run also reports what the conversion finds
    // (a missing backend, a master in one backend only, HTTP mode, ...).
    let line_errors = ps.errors.len();
    let config = convert::convert(&mut ps, &parsed);
    if !ps.errors.is_empty() {
        let mut errors = ps.errors;
        // A refused line already has its error: a conversion error on the same line repeats it.
        let refused: Vec<u32> = errors[..line_errors].iter().map(|e| e.at.line).collect();
        let mut i = 0;
        errors.retain(|e| {
            i += 1;
            i <= line_errors || e.at.line == 0 || !refused.contains(&e.at.line)
        });
        // File order; errors that belong to no line (the file as a whole) last.
        errors.sort_by_key(|e| (e.at.line == 0, e.at.line));
        return Err(ConfigErrors(errors));
    }
    match config {
        Some(config) => Ok(Loaded {
            config,
            warnings: ps.warnings,
        }),
        None => Err(ConfigErrors::one(ConfigError::new(
            Position::new(file, 0, 0),
            "",
            "no usable configuration",
            "see the README's migration guide",
        ))),
    }
}

fn parse_sections(ps: &mut Parser<'_>, text: &str) -> Parsed {
    let mut global = GlobalSection::default();
    let mut defaults = Proxy::empty_defaults();
    let mut proxies: Vec<Proxy> = Vec::new();
    // Which section the following lines belong to: None before any, Some(None) = global.
    enum Cur {
        Nothing,
        Global,
        Defaults,
        Proxy,
        Ignored,
    }
    let mut cur = Cur::Nothing;
    for (i, raw) in text.lines().enumerate() {
        let no = i as u32 + 1;
        let words = match tokenize(raw) {
            Ok(w) => w,
            Err(m) => {
                ps.error(no, "", m, "close the quote or escape it with a backslash");
                continue;
            }
        };
        if words.is_empty() {
            continue;
        }
        let l = Line { no, words };
        let w0 = l.words[0].as_str();
        match w0 {
            "global" => {
                cur = Cur::Global;
                continue;
            }
            "defaults" => {
                // An anonymous defaults section replaces the previous one, as in HAProxy.
                defaults = Proxy::empty_defaults();
                defaults.line = no;
                cur = Cur::Defaults;
                continue;
            }
            "frontend" | "backend" | "listen" => {
                let kind = match w0 {
                    "frontend" => Kind::Frontend,
                    "backend" => Kind::Backend,
                    _ => Kind::Listen,
                };
                let Some(name) = l.word(1) else {
                    ps.error(
                        no,
                        w0,
                        format!("'{w0}' needs a name"),
                        format!("write '{w0} <name>'"),
                    );
                    cur = Cur::Ignored;
                    continue;
                };
                if l.words.len() > 2 {
                    ps.error(
                        no,
                        w0,
                        format!(
                            "'{w0} {name}' takes no further words (found {:?})",
                            l.words[2]
                        ),
                        "put bind addresses on their own 'bind' line",
                    );
                }
                if proxies.iter().any(|p| {
                    p.name == name
                        && (p.kind == kind || p.kind == Kind::Listen || kind == Kind::Listen)
                }) {
                    ps.error(
                        no,
                        w0,
                        format!("duplicate {w0} name {name:?}"),
                        "give every section its own name",
                    );
                }
                proxies.push(Proxy::new(kind, name.to_string(), no, &defaults));
                cur = Cur::Proxy;
                continue;
            }
            "userlist" | "peers" | "resolvers" | "mailers" | "program" | "http-errors"
            | "cache" | "ring" | "log-forward" => {
                ps.error(no, w0, format!("section '{w0}' is not supported"), "remove the section; saltgate needs only global, defaults, frontend, backend and listen");
                cur = Cur::Ignored;
                continue;
            }
            _ => {}
        }
        match cur {
            Cur::Nothing => ps.error(
                no,
                w0,
                format!("'{w0}' appears before any section"),
                "put it inside a global, defaults, frontend, backend or listen section",
            ),
            Cur::Global => ps.global(&mut global, &l),
            Cur::Defaults => ps.proxy(&mut defaults, &l),
            Cur::Proxy => {
                if let Some(p) = proxies.last_mut() {
                    ps.proxy(p, &l);
                }
            }
            Cur::Ignored => {}
        }
    }
    Parsed { global, proxies }
}

mod server_options;
#[cfg(test)]
mod tests;
