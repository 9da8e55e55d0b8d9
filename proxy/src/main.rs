//! The `saltgate` command: run the proxy, check a configuration, import an HAProxy configuration.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use saltgate_config::{emit, ConfigErrors, Format, Loaded};

#[derive(Parser)]
#[command(
    name = "saltgate",
    version,
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
    },
    /// Validate a configuration without starting (exit 0 valid, 1 invalid), like `haproxy -c`.
    CheckConfig {
        file: PathBuf,
        /// The file is an HAProxy configuration.
        #[arg(long)]
        haproxy: bool,
    },
    /// Convert an HAProxy configuration into saltgate YAML on standard output.
    ImportHaproxy { file: PathBuf },
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
        Cmd::ImportHaproxy { file } => match load(&file, Format::Haproxy) {
            Some(l) => {
                print!("{}", emit::to_yaml(&l.config, &file.display().to_string()));
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        Cmd::Run {
            config,
            haproxy_config,
        } => {
            init_logs(cli.log_format, &cli.log_level);
            let loaded = match (config, haproxy_config) {
                (Some(p), _) => saltgate_config::load(&p, Format::Yaml),
                (None, Some(p)) => saltgate_config::load(&p, Format::Haproxy),
                (None, None) => {
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
            match run(loaded) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn run(loaded: Loaded) -> Result<()> {
    if loaded.config.global.raise_nofile {
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(n) => tracing::info!(nofile = n, "open-file limit raised to the hard limit"),
            Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        let shutdown = shutdown_signal().context("installing signal handlers")?;
        let running =
            saltgate_proxy::start(loaded.config, saltgate_proxy::Options::default(), shutdown)
                .await?;
        running.wait().await;
        Ok(())
    })
}

/// Completes on SIGTERM or SIGINT. SIGHUP is logged and ignored until hot reload exists, so a stray
/// HUP does not kill the proxy.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::warn!(
                "SIGHUP received: configuration reload is not available in this version; ignoring"
            );
        }
    });
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
