//! saltgate-bench: runs the side-by-side scenarios and prints the table (or JSON); see
//! docs/performance.md. `saltgate-bench __backend IP...` is the fake masters' child process.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;

use saltgate_bench::runner::{self, Plan, Scenario};
use saltgate_bench::scenarios::Ctx;
use saltgate_bench::targets::{haproxy_version, Binaries, Net, ProxySettings, TargetKind};
use saltgate_bench::{backend, chart, report, BenchError};

#[derive(Parser)]
#[command(
    name = "saltgate-bench",
    about = "Side-by-side benchmarks: no proxy (direct), HAProxy and saltgate, interleaved and repeated",
    after_help = "Scenarios: idle, connect, rr, throughput, storm (all = these five); swarm is not built yet.\n\
                  CI smoke test: cargo run --release -p saltgate-bench -- --quick all"
)]
struct Cli {
    /// Scenarios to run (idle, connect, rr, throughput, storm, all).
    #[arg(default_value = "all")]
    scenarios: Vec<String>,
    /// Smoke version of every scenario: small N, one repeat; checks that it runs, not figures.
    #[arg(long)]
    quick: bool,
    /// Rounds per scenario (each round runs every target once); medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Print JSON (rows, every sample, the machine's load) instead of the Markdown table.
    #[arg(long)]
    json: bool,
    /// Also write report.md, report.json and ratios.png into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Targets, comma-separated: direct, haproxy, saltgate.
    #[arg(long, default_value = "direct,haproxy,saltgate", value_delimiter = ',')]
    targets: Vec<String>,
    /// Loopback /24 the bench uses (first three octets).
    #[arg(long, env = "SALTGATE_BENCH_NET", default_value = "127.0.3")]
    net: String,
    /// saltgate binary; default: `cargo build --release -p saltgate-proxy` in this workspace,
    /// then CARGO_TARGET_DIR (or target)/release/saltgate.
    #[arg(long, env = "SALTGATE_BIN")]
    saltgate_bin: Option<PathBuf>,
    /// HAProxy binary; default: haproxy on PATH or /usr/sbin/haproxy (installed with apt-get
    /// if missing).
    #[arg(long)]
    haproxy_bin: Option<PathBuf>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = if args.get(1).map(String::as_str) == Some("__backend") {
        backend_child(&args[2..])
    } else {
        bench(Cli::parse(), &args)
    };
    if let Err(e) = result {
        eprintln!("saltgate-bench: error: {e:#}");
        let code = match e.downcast_ref::<BenchError>() {
            Some(BenchError::Usage(_)) | Some(BenchError::NotYet(_)) => 2,
            _ => 1,
        };
        std::process::exit(code);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(saltgate_bench::procfs::cpus().max(2))
        .enable_all()
        .build()
        .context("tokio runtime")
}

fn backend_child(args: &[String]) -> Result<()> {
    let ips: Vec<IpAddr> = args
        .iter()
        .map(|a| a.parse().with_context(|| format!("backend: bad IP {a:?}")))
        .collect::<Result<_>>()?;
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    runtime()?.block_on(backend::child_main(ips))?;
    Ok(())
}

fn bench(cli: Cli, args: &[String]) -> Result<()> {
    let mut scenarios = Vec::new();
    for s in &cli.scenarios {
        if s == "all" {
            scenarios.extend(Scenario::ALL);
        } else {
            scenarios.push(Scenario::parse(s).ok_or_else(|| {
                BenchError::Usage(format!(
                    "unknown scenario {s:?}: use idle, connect, rr, throughput, storm or all"
                ))
            })?);
        }
    }
    scenarios.dedup();
    if scenarios.contains(&Scenario::Swarm) {
        // Refused before anything is built or started.
        return Err(runner::swarm_not_yet().into());
    }
    let targets: Vec<TargetKind> = cli
        .targets
        .iter()
        .map(|t| {
            TargetKind::parse(t).ok_or_else(|| {
                BenchError::Usage(format!(
                    "unknown target {t:?}: use direct, haproxy or saltgate"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    if targets.is_empty() || cli.repeat == 0 {
        return Err(BenchError::Usage("need at least one target and --repeat ≥ 1".into()).into());
    }
    let repeat = if cli.quick { 1 } else { cli.repeat };
    let net = Net::parse(&cli.net)?;
    let _ = rlimit::increase_nofile_limit(u64::MAX);

    let saltgate = if targets.contains(&TargetKind::Saltgate) {
        match cli.saltgate_bin {
            Some(p) => p,
            None => build_saltgate()?,
        }
    } else {
        PathBuf::from("saltgate")
    };
    let haproxy = if targets.contains(&TargetKind::Haproxy) {
        find_haproxy(cli.haproxy_bin)?
    } else {
        PathBuf::from("haproxy")
    };
    let saltgate_version = if targets.contains(&TargetKind::Saltgate) {
        format!("{} ({})", saltgate.display(), git_commit())
    } else {
        "not run".into()
    };
    let haproxy_version = if targets.contains(&TargetKind::Haproxy) {
        haproxy_version(&haproxy)
    } else {
        "not run".into()
    };
    let ctx = Ctx {
        net,
        bins: Binaries { saltgate, haproxy },
        exe: std::env::current_exe().context("path of this executable")?,
        quick: cli.quick,
        settings: ProxySettings::default(),
    };
    let plan = Plan {
        scenarios,
        targets,
        repeat,
        command: format!("saltgate-bench {}", args[1..].join(" ")),
        saltgate_version,
        haproxy_version,
    };
    let report = runtime()?.block_on(runner::run(&ctx, &plan))?;
    let md = report::markdown(&report);
    let json = serde_json::to_string_pretty(&report).context("JSON")?;
    if cli.json {
        println!("{json}");
    } else {
        print!("{md}");
    }
    if let Some(dir) = &cli.out {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        std::fs::write(dir.join("report.md"), &md)?;
        std::fs::write(dir.join("report.json"), &json)?;
        let title = format!(
            "saltgate / HAProxy, medians of {} run(s), {} CPUs ({})",
            report.meta.repeat, report.meta.cpus, report.meta.finished_utc
        );
        chart::draw(&report.rows, &title, &dir.join("ratios.png"))?;
        eprintln!(
            "saltgate-bench: wrote {}/report.{{md,json}} and ratios.png",
            dir.display()
        );
    }
    Ok(())
}

/// The workspace root (this crate's parent).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn build_saltgate() -> Result<PathBuf> {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!(
        "saltgate-bench: cargo build --release -p saltgate-proxy (in {})",
        root.display()
    );
    let status = std::process::Command::new(&cargo)
        .args(["build", "--release", "-p", "saltgate-proxy"])
        .current_dir(&root)
        .status()
        .with_context(|| format!("run {cargo}"))?;
    if !status.success() {
        bail!("cargo build --release -p saltgate-proxy failed ({status}); or pass --saltgate-bin");
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        Some(d) => root.join(d),
        None => root.join("target"),
    };
    let bin = target.join("release").join("saltgate");
    if !bin.exists() {
        bail!(
            "built saltgate but {} does not exist; pass --saltgate-bin",
            bin.display()
        );
    }
    Ok(bin)
}

fn find_haproxy(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("haproxy"))
                .find(|f| f.exists())
        })
        .unwrap_or(None);
    if let Some(p) = on_path.or_else(|| {
        let p = PathBuf::from("/usr/sbin/haproxy");
        p.exists().then_some(p)
    }) {
        return Ok(p);
    }
    eprintln!("saltgate-bench: haproxy not found; apt-get install -y haproxy");
    let status = std::process::Command::new("apt-get")
        .args(["install", "-y", "haproxy"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("run apt-get (is this Debian?)")?;
    let p = PathBuf::from("/usr/sbin/haproxy");
    if !status.success() || !p.exists() {
        bail!("could not install haproxy (apt-get install -y haproxy: {status}); install it, pass --haproxy-bin, or leave it out with --targets direct,saltgate");
    }
    Ok(p)
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("commit {}", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "commit unknown".into())
}
