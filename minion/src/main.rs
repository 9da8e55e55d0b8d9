//! `saltgate-minion`: run a minion from a Salt minion config, or a swarm of simulated minions.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use saltgate_config::salt_minion::{load_minion, split_host_port, MasterAddr};
use saltgate_minion::link::Stats;
use saltgate_minion::swarm::{self, SwarmOptions};
use saltgate_wire::transport::Transport;
use tokio::sync::watch;

#[derive(Parser)]
#[command(
    name = "saltgate-minion",
    version = env!("SALTGATE_VERSION"),
    about = "A Salt-wire-compatible minion"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one minion from a Salt minion config file.
    Run {
        /// The Salt minion config (YAML).
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
    },
    /// Validate a minion configuration without starting (exit 0 valid, 1 invalid), like
    /// `saltgate check-config`.
    CheckConfig {
        /// The Salt minion config (YAML).
        file: PathBuf,
    },
    /// Write the man pages (DIR/man) and bash/zsh completions (DIR/completions) made from this
    /// command line's definition; the Debian package ships them.
    #[command(hide = true)]
    GenDocs { dir: PathBuf },
    /// Run N simulated minions against one master.
    Swarm {
        /// How many minions.
        #[arg(long)]
        count: usize,
        /// The master: HOST or HOST:PORT (PORT = request port, default 4506).
        #[arg(long)]
        master: String,
        /// Minion ids are PREFIX0, PREFIX1, ...
        #[arg(long, default_value = "swarm-")]
        id_prefix: String,
        /// Index of the first minion id.
        #[arg(long, default_value_t = 0)]
        id_start: usize,
        /// Where keys are cached (`<id>.pem`, or `shared.pem`).
        #[arg(long, default_value = "./swarm-pki")]
        pki_dir: PathBuf,
        /// One key pair for every minion (a load-test shortcut; see docs/minion.md).
        #[arg(long)]
        shared_key: bool,
        /// Split the minions over K processes (each process is capped by its fd limit).
        #[arg(long, default_value_t = 1)]
        processes: usize,
        /// Seconds between progress lines.
        #[arg(long, default_value_t = 1.0)]
        report_every: f64,
        /// Progress and summary as JSON lines.
        #[arg(long)]
        json: bool,
        /// Stop after this many seconds (default: until SIGINT/SIGTERM).
        #[arg(long)]
        duration: Option<f64>,
        /// Minions started per second.
        #[arg(long, default_value_t = 200)]
        start_rate: u32,
        /// Seconds to wait before asking again while a key is pending.
        #[arg(long, default_value_t = 10.0)]
        acceptance_wait_time: f64,
        /// Publish port (default: what the master announces).
        #[arg(long)]
        publish_port: Option<u16>,
        /// Request pillar after each authentication, as a real minion does (costly on the master).
        #[arg(long)]
        pillar: bool,
        /// The master's transport (Salt's `transport`): zeromq, tcp or ws (plain; no TLS in a swarm).
        #[arg(long, default_value = "zeromq")]
        transport: String,
    },
}

/// A flag set on SIGTERM or SIGINT. The handlers are installed here, at once, not when the
/// spawned task first runs: a signal in between would kill the process without a clean stop.
fn stop_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let Ok(stop) = saltgate_wire::signals::stop_signal() else {
        return rx;
    };
    tokio::spawn(async move {
        stop.await;
        let _ = tx.send(true);
    });
    rx
}

fn secs(s: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .with_context(|| format!("{what}: {s} is not a number of seconds"))
}

/// `check-config`: every error names the file, line and key (exit 1); warnings (keys Salt has
/// that this minion ignores) are printed and do not fail the check.
fn check_config(path: &std::path::Path) -> std::process::ExitCode {
    match load_minion(path) {
        Ok(l) => {
            for w in &l.warnings {
                eprintln!("warning: {w}");
            }
            let c = &l.config;
            let masters: Vec<String> = c.masters.iter().map(|m| m.to_string()).collect();
            eprintln!(
                "configuration valid: id {}; master(s) {}; pki_dir {}",
                c.id.as_deref().unwrap_or("<hostname>"),
                masters.join(", "),
                c.pki_dir.display()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            for err in &e.0 {
                eprintln!("error: {err}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// `gen-docs DIR`: one man page per command and subcommand in DIR/man, and the bash and zsh
/// completions in DIR/completions (`saltgate-minion.bash`, `_saltgate-minion`).
fn gen_docs(dir: &std::path::Path) -> std::io::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let (man, completions) = (dir.join("man"), dir.join("completions"));
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh] {
        clap_complete::generate_to(shell, &mut cmd, "saltgate-minion", &completions)?;
    }
    Ok(())
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    match &cli.cmd {
        Cmd::CheckConfig { file } => return Ok(check_config(file)),
        Cmd::GenDocs { dir } => {
            gen_docs(dir).with_context(|| format!("writing the docs into {}", dir.display()))?;
            return Ok(std::process::ExitCode::SUCCESS);
        }
        _ => {}
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SALTGATE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs shipped to files or journald stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Runtime::new()
        .context("starting the tokio runtime")?
        .block_on(serve(cli.cmd))?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn serve(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::CheckConfig { .. } | Cmd::GenDocs { .. } => Ok(()),
        Cmd::Run { config } => {
            let loaded = load_minion(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
            for w in &loaded.warnings {
                tracing::warn!("{w}");
            }
            let stop = stop_signal();
            saltgate_minion::runner::run(loaded.config, Arc::new(Stats::default()), stop)
                .await
                .context("minion failed")?;
            Ok(())
        }
        Cmd::Swarm {
            count,
            master,
            id_prefix,
            id_start,
            pki_dir,
            shared_key,
            processes,
            report_every,
            json,
            duration,
            start_rate,
            acceptance_wait_time,
            publish_port,
            pillar,
            transport,
        } => {
            let transport = match transport.parse::<Transport>() {
                Ok(t) => t,
                Err(e) => bail!("--{e}"),
            };
            let (host, port) = split_host_port(&master)
                .map_err(|e| anyhow::anyhow!("--master: {e}; write HOST or HOST:PORT"))?;
            if count == 0 {
                bail!("--count must be at least 1");
            }
            let opts = SwarmOptions {
                count,
                master: MasterAddr {
                    host,
                    port: port.unwrap_or(4506),
                },
                id_prefix,
                id_start,
                pki_dir,
                shared_key,
                report_every: secs(report_every, "--report-every")?,
                json,
                duration: duration.map(|d| secs(d, "--duration")).transpose()?,
                start_rate,
                acceptance_wait_time: secs(acceptance_wait_time, "--acceptance-wait-time")?,
                publish_port,
                pillar,
                transport,
            };
            let stop = stop_signal();
            let summary = if processes > 1 {
                multi_process(opts.clone(), processes, stop).await?
            } else {
                swarm::run_swarm(opts.clone(), stop).await?
            };
            swarm::print_record(&summary, opts.json, true);
            Ok(())
        }
    }
}

/// Splits the swarm over `k` child processes (each re-runs this binary with part of the id
/// range and `--json`) and sums their progress lines.
async fn multi_process(
    opts: SwarmOptions,
    k: usize,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<serde_json::Value> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe().context("cannot find our own executable")?;
    let k = k.min(opts.count);
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, serde_json::Value)>(1024);
    let mut children = Vec::new();
    let mut start = opts.id_start;
    for i in 0..k {
        let n = opts.count / k + usize::from(i < opts.count % k);
        let mut c = tokio::process::Command::new(&exe);
        c.arg("swarm")
            .args(["--count", &n.to_string()])
            .args(["--master", &opts.master.to_string()])
            .args(["--id-prefix", &opts.id_prefix])
            .args(["--id-start", &start.to_string()])
            .arg("--pki-dir")
            .arg(&opts.pki_dir)
            .args([
                "--report-every",
                &opts.report_every.as_secs_f64().to_string(),
            ])
            .args([
                "--start-rate",
                &(opts.start_rate / k as u32).max(1).to_string(),
            ])
            .args([
                "--acceptance-wait-time",
                &opts.acceptance_wait_time.as_secs_f64().to_string(),
            ])
            .arg("--json")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if opts.shared_key {
            c.arg("--shared-key");
        }
        if let Some(d) = opts.duration {
            c.args(["--duration", &d.as_secs_f64().to_string()]);
        }
        if opts.pillar {
            c.arg("--pillar");
        }
        c.args(["--transport", opts.transport.as_str()]);
        if let Some(p) = opts.publish_port {
            c.args(["--publish-port", &p.to_string()]);
        }
        start += n;
        let mut child = c.spawn().context("cannot start a swarm process")?;
        let out = child.stdout.take().context("child stdout")?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    let _ = tx.send((i, v)).await;
                }
            }
        });
        children.push(child);
    }
    drop(tx);
    let mut latest: Vec<Option<serde_json::Value>> = vec![None; k];
    let mut done = vec![false; k];
    let sum = |latest: &[Option<serde_json::Value>]| {
        let mut total = serde_json::json!({"elapsed_s": started.elapsed().as_secs_f64(), "minions": opts.count});
        for key in [
            "connected",
            "authenticated",
            "jobs_answered",
            "publishes_received",
            "jobs_started",
            "return_retries",
            "returns_failed",
            "errors",
            "auth_timeouts",
            "auth_retries",
            "auth_pending",
            "start_events",
            "rss_kib",
        ] {
            let s: i64 = latest
                .iter()
                .flatten()
                .filter_map(|v| v.get(key)?.as_i64())
                .sum();
            total[key] = serde_json::json!(s);
        }
        total["receipt_buckets"] =
            serde_json::json!(saltgate_minion::latency::sum_lines(latest.iter().flatten()));
        let rss = total["rss_kib"].as_i64().unwrap_or(0);
        total["rss_bytes_per_minion"] = serde_json::json!(rss * 1024 / opts.count as i64);
        total["processes"] = serde_json::json!(k);
        total
    };
    let mut report = tokio::time::interval(opts.report_every);
    report.tick().await;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some((i, v)) => {
                    if v.get("summary").is_some() { done[i] = true; }
                    latest[i] = Some(v);
                    if done.iter().all(|d| *d) { break; }
                }
                None => break,
            },
            _ = report.tick() => swarm::print_record(&sum(&latest), opts.json, false),
            _ = stop.changed() => {
                for c in &children {
                    if let Some(pid) = c.id() {
                        // SAFETY: signalling our own child by pid.
                        unsafe { libc::kill(pid as i32, libc::SIGTERM); }
                    }
                }
            }
        }
    }
    for mut c in children {
        let _ = c.wait().await;
    }
    Ok(sum(&latest))
}
