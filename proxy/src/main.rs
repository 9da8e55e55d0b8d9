//! The `saltgate` command: run the proxy, check a configuration, import an HAProxy configuration.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::sync::Arc;

use saltgate_config::{emit, ConfigErrors, Format, Loaded};
use saltgate_proxy::ConfigSource;

#[derive(Parser)]
#[command(
    name = "saltgate",
    version = env!("SALTGATE_VERSION"),
    about = "A Salt-aware L4 proxy and load balancer for Salt master clusters"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log format: text (human) or json (one object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter when RUST_LOG is not set, e.g. `info` or `saltgate=debug`.
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the proxy (with no file: the embedded default, examples/saltgate.yaml).
    Run {
        /// saltgate YAML configuration.
        #[arg(long, conflicts_with = "haproxy_config")]
        config: Option<PathBuf>,
        /// An HAProxy configuration, used as it stands (drop-in).
        #[arg(long)]
        haproxy_config: Option<PathBuf>,
        /// Admin API address, overriding the file's admin.bind (`off` disables the API). Useful
        /// with --haproxy-config, which has no admin section.
        #[arg(long)]
        admin_bind: Option<String>,
        /// Health probe for every master, overriding the file: salt (default), zmtp or tcp
        /// (tcp for backends that are not Salt masters, e.g. in tests).
        #[arg(long)]
        probe: Option<String>,
    },
    /// Validate a configuration without starting (exit 0 valid, 1 invalid), like `haproxy -c`.
    CheckConfig {
        file: PathBuf,
        /// The file is an HAProxy configuration.
        #[arg(long)]
        haproxy: bool,
    },
    /// Convert an HAProxy configuration into saltgate YAML on standard output.
    ImportHaproxy {
        file: PathBuf,
        /// Salt's transport of the masters (their `transport`): zeromq (default), tcp or ws.
        /// HAProxy's file cannot say it; what cannot work with it is refused.
        #[arg(long, default_value = "zeromq")]
        transport: String,
        /// Reach the masters over TLS (Salt's `ssl`), trusting the CA certificates in this PEM
        /// file; written as `ssl: {ca_certs: FILE, cert_reqs: CERT_REQUIRED}` (edit the output for
        /// a client certificate).
        #[arg(long)]
        ssl_ca_certs: Option<PathBuf>,
        /// With --ssl-ca-certs: the name the masters' certificates carry, when it is not their
        /// address (`ssl.server_name`).
        #[arg(long, requires = "ssl_ca_certs")]
        ssl_server_name: Option<String>,
    },
    /// Write the man pages (DIR/man) and bash/zsh completions (DIR/completions) made from this
    /// command line's definition; the Debian package ships them.
    #[command(hide = true)]
    GenDocs { dir: PathBuf },
    /// Talk to a running saltgate's admin API.
    Ctl {
        /// Admin API address.
        #[arg(long, default_value = "127.0.0.1:9505")]
        admin: std::net::SocketAddr,
        /// File holding the admin bearer token.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// How long to wait for the admin API (such as 10s, 2m).
        #[arg(long, default_value = "10s", value_parser = parse_timeout)]
        timeout: std::time::Duration,
        #[command(subcommand)]
        action: CtlAction,
    },
}

#[derive(Subcommand)]
enum CtlAction {
    /// Masters, their state, sessions and last check.
    Status,
    /// Which minion is where: each minion's publish and request master (all pages).
    Minions,
    /// No new sessions to NAME; its sessions close at drain_timeout.
    Drain { name: String },
    /// No new sessions to NAME; its sessions close now.
    Disable { name: String },
    /// NAME takes new sessions again (when UP).
    Enable { name: String },
    /// Reload the configuration file.
    Reload,
    /// Exit 0 when saltgate is ready (both listeners serve, and a master is UP for each), else 1;
    /// prints one line saying why. For keepalived's track_script and other probes.
    Ready,
}

fn init_logs(format: LogFormat, level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colours only on a terminal: logs shipped to files or journald stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().flatten_event(true).with_current_span(false).init(),
    }
}

fn print_errors(e: &ConfigErrors) {
    for err in &e.0 {
        eprintln!("error: {err}");
    }
}

fn load(path: &Path, format: Format) -> Option<Loaded> {
    match saltgate_config::load(path, format) {
        Ok(l) => {
            for w in &l.warnings {
                eprintln!("warning: {w}");
            }
            Some(l)
        }
        Err(e) => {
            print_errors(&e);
            None
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::CheckConfig { file, haproxy } => {
            let format = if haproxy {
                Format::Haproxy
            } else {
                Format::Yaml
            };
            match load(&file, format) {
                Some(l) => {
                    let c = &l.config;
                    let pre = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(saltgate_proxy::control::reload::preflight(c)),
                        Err(e) => {
                            eprintln!("error: cannot start the tokio runtime: {e}");
                            return ExitCode::FAILURE;
                        }
                    };
                    for w in &pre.warnings {
                        eprintln!("warning: {w}");
                    }
                    if !pre.errors.is_empty() {
                        for e in &pre.errors {
                            eprintln!("error: {e}");
                        }
                        return ExitCode::FAILURE;
                    }
                    eprintln!(
                        "configuration valid: {} master(s); publish on {:?}, request on {:?}",
                        c.masters.len(),
                        c.publish
                            .bind
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>(),
                        c.request
                            .bind
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                    );
                    ExitCode::SUCCESS
                }
                None => ExitCode::FAILURE,
            }
        }
        Cmd::GenDocs { dir } => match gen_docs(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: cannot write the docs into {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
        Cmd::ImportHaproxy {
            file,
            transport,
            ssl_ca_certs,
            ssl_server_name,
        } => match load(&file, Format::Haproxy) {
            Some(mut l) => {
                let Some(t) = saltgate_config::transport::SaltTransport::parse(&transport) else {
                    eprintln!(
                        "error: --transport: unknown transport {transport:?} (fix: use one of {}, the masters' own `transport`)",
                        saltgate_config::transport::TRANSPORTS.join(", ")
                    );
                    return ExitCode::FAILURE;
                };
                let ssl = ssl_ca_certs.map(|ca| saltgate_config::transport::SslConfig {
                    ca_certs: Some(ca),
                    server_name: ssl_server_name,
                    ..Default::default()
                });
                let problems = saltgate_config::set_transport(&mut l.config, t, ssl);
                if !problems.is_empty() {
                    for (field, message, fix) in problems {
                        let field = match field.as_str() {
                            "transport" => "--transport".to_string(),
                            "ssl" => "--ssl-ca-certs".to_string(),
                            _ => field,
                        };
                        eprintln!("error: {}: {field}: {message} (fix: {fix})", file.display());
                    }
                    return ExitCode::FAILURE;
                }
                print!("{}", emit::to_yaml(&l.config, &file.display().to_string()));
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        Cmd::Ctl {
            admin,
            token_file,
            timeout,
            action,
        } => ctl(admin, token_file, timeout, action),
        Cmd::Run {
            config,
            haproxy_config,
            admin_bind,
            probe,
        } => {
            init_logs(cli.log_format, &cli.log_level);
            let source = match (config, haproxy_config) {
                (Some(path), _) => Some(ConfigSource {
                    path,
                    format: Format::Yaml,
                }),
                (None, Some(path)) => Some(ConfigSource {
                    path,
                    format: Format::Haproxy,
                }),
                (None, None) => None,
            };
            let loaded = match &source {
                Some(src) => saltgate_config::load(&src.path, src.format),
                None => {
                    tracing::info!(
                        "no --config given: running the embedded default (examples/saltgate.yaml)"
                    );
                    saltgate_config::parse(
                        saltgate_config::EMBEDDED_DEFAULT,
                        Some(Path::new("<embedded default>")),
                        Format::Yaml,
                    )
                }
            };
            let loaded = match loaded {
                Ok(l) => l,
                Err(e) => {
                    for err in &e.0 {
                        tracing::error!("{err}");
                    }
                    return ExitCode::FAILURE;
                }
            };
            for w in &loaded.warnings {
                tracing::warn!("{w}");
            }
            let mut loaded = loaded;
            let mut ov = Overrides::default();
            match admin_bind.as_deref() {
                None => {}
                Some("off") => ov.admin = Some(None),
                Some(a) => match saltgate_config::addr::parse_bind(a) {
                    Ok(addr) => ov.admin = Some(Some(addr)),
                    Err(e) => {
                        tracing::error!("--admin-bind: {e}");
                        return ExitCode::FAILURE;
                    }
                },
            }
            if let Some(p) = probe.as_deref() {
                match saltgate_config::Probe::parse(p) {
                    Some(p) => ov.probe = Some(p),
                    None => {
                        tracing::error!("--probe: unknown probe {p:?}; use salt, zmtp or tcp");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ov.apply(&mut loaded.config);
            if let Some((problem, fix)) = loaded.config.admin.exposure_refusal() {
                tracing::error!("--admin-bind: {problem}; {fix}");
                return ExitCode::FAILURE;
            }
            match run(loaded, source, ov) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `gen-docs DIR`: one man page per command and subcommand in DIR/man, and the bash and zsh
/// completions in DIR/completions (`saltgate.bash`, `_saltgate`).
fn gen_docs(dir: &Path) -> std::io::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let (man, completions) = (dir.join("man"), dir.join("completions"));
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh] {
        clap_complete::generate_to(shell, &mut cmd, "saltgate", &completions)?;
    }
    Ok(())
}

/// How often the configuration file is polled for changes.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Command-line settings that win over the file, at start and at every reload.
#[derive(Default, Clone, Copy)]
struct Overrides {
    /// `--admin-bind`: `Some(None)` turns the admin API off, `Some(Some(addr))` moves it.
    admin: Option<Option<std::net::SocketAddr>>,
    /// `--probe`.
    probe: Option<saltgate_config::Probe>,
}

impl Overrides {
    fn apply(&self, c: &mut saltgate_config::Config) {
        match self.admin {
            None => {}
            Some(None) => c.admin.enabled = false,
            Some(Some(a)) => {
                c.admin.enabled = true;
                c.admin.bind = a;
            }
        }
        if let Some(p) = self.probe {
            c.health.probe = p;
            for m in &mut c.masters {
                m.health.probe = p;
            }
        }
    }
}

fn run(loaded: Loaded, source: Option<ConfigSource>, overrides: Overrides) -> Result<()> {
    if loaded.config.global.raise_nofile {
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(n) => tracing::info!(nofile = n, "open-file limit raised to the hard limit"),
            Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
        }
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = loaded.config.global.threads {
        rt.worker_threads(n.into());
    }
    let rt = rt
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        tracing::info!(
            worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
            "runtime started (global.threads; unset: one per CPU)"
        );
        let (shutdown, mut hup) = signals().context("installing signal handlers")?;
        let opts = saltgate_proxy::Options {
            source,
            watch: Some(WATCH_EVERY),
            override_config: Some(Arc::new(move |c: &mut saltgate_config::Config| {
                overrides.apply(c)
            })),
            ..Default::default()
        };
        let running = Arc::new(saltgate_proxy::start(loaded.config, opts, shutdown).await?);
        saltgate_proxy::notify::sd_notify("READY=1");
        let r = running.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = r.reload_from_source("SIGHUP").await;
            }
        });
        running.wait().await;
        Ok(())
    })
}

/// A future that completes on SIGTERM or SIGINT, and the SIGHUP stream (reload).
fn signals() -> std::io::Result<(
    impl std::future::Future<Output = ()> + Send + 'static,
    tokio::signal::unix::Signal,
)> {
    use tokio::signal::unix::{signal, SignalKind};
    let stop = saltgate_wire::signals::stop_signal()?;
    let hup = signal(SignalKind::hangup())?;
    let shutdown = async move {
        let which = stop.await;
        tracing::info!("{which} received");
    };
    Ok((shutdown, hup))
}

fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    match saltgate_config::duration::parse_duration(
        text,
        saltgate_config::duration::BareNumber::Refuse,
    ) {
        Ok(d) if d.is_zero() => Err("must be more than 0; such as 10s".into()),
        r => r,
    }
}

fn ctl(
    admin: std::net::SocketAddr,
    token_file: Option<PathBuf>,
    timeout: std::time::Duration,
    action: CtlAction,
) -> ExitCode {
    let token = match token_file
        .map(|p| {
            std::fs::read_to_string(&p)
                .map(|t| t.trim().to_string())
                .map_err(|e| (p, e))
        })
        .transpose()
    {
        Ok(t) => t,
        Err((p, e)) => {
            eprintln!("error: cannot read the token file {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    };
    let (method, path) = match &action {
        CtlAction::Minions => return ctl_minions(admin, token.as_deref(), timeout),
        CtlAction::Ready => return ctl_ready(admin, token.as_deref(), timeout),
        CtlAction::Status => ("GET", "/api/v1/masters".to_string()),
        CtlAction::Drain { name } => ("POST", format!("/api/v1/masters/{name}/drain")),
        CtlAction::Disable { name } => ("POST", format!("/api/v1/masters/{name}/disable")),
        CtlAction::Enable { name } => ("POST", format!("/api/v1/masters/{name}/enable")),
        CtlAction::Reload => ("POST", "/api/v1/reload".to_string()),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(saltgate_proxy::ctl::call(
        admin,
        method,
        &path,
        token.as_deref(),
        timeout,
    )) {
        Ok(v) => {
            match action {
                CtlAction::Status => print!("{}", saltgate_proxy::ctl::status_table(&v)),
                CtlAction::Minions | CtlAction::Ready => {}
                CtlAction::Reload => {
                    println!("reloaded: configuration generation {}", v["generation"])
                }
                _ => println!(
                    "{} {}: now {}",
                    v["action"].as_str().unwrap_or("?"),
                    v["master"].as_str().unwrap_or("?"),
                    v["state"].as_str().unwrap_or("?")
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `saltgate ctl ready`: exit 0 when ready, 1 otherwise, with one line on standard output saying
/// why (an unreachable API is "not ready" too: keepalived must not keep the VIP on a node whose
/// saltgate is gone).
fn ctl_ready(
    admin: std::net::SocketAddr,
    token: Option<&str>,
    timeout: std::time::Duration,
) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("not ready: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(saltgate_proxy::ctl::ready(admin, token, timeout)) {
        Ok((ready, why)) => {
            println!("{why}");
            if ready {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            println!("not ready: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `saltgate ctl minions`: every page of `/api/v1/minions` as one table.
fn ctl_minions(
    admin: std::net::SocketAddr,
    token: Option<&str>,
    timeout: std::time::Duration,
) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(saltgate_proxy::ctl::minions(admin, token, timeout)) {
        Ok(list) => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            print!("{}", saltgate_proxy::ctl::minions_table(&list, now_ms));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
