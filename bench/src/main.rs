//! saltgate-bench: runs the side-by-side scenarios and prints the table (or JSON); see
//! docs/performance.md. `saltgate-bench __backend IP...` is the fake masters' child process.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;

use saltgate_bench::runner::{self, Plan, Scenario};
use saltgate_bench::scenarios::swarm::SwarmSize;
use saltgate_bench::scenarios::Ctx;
use saltgate_bench::scenarios::{authstorm, master};
use saltgate_bench::targets::{haproxy_version, Binaries, Net, ProxySettings, TargetKind};
use saltgate_bench::{backend, chart, report, BenchError};

#[derive(Parser)]
#[command(
    name = "saltgate-bench",
    about = "Side-by-side benchmarks: no proxy (direct), HAProxy and saltgate, interleaved and repeated",
    after_help = "Scenarios: idle, connect, rr, throughput, storm, swarm (all = these six);\n\
                  master and authstorm (real salt-master 3008.5, SALTGATE_VENV) run alone.\n\
                  CI smoke test: cargo run --release -p saltgate-bench -- --quick all"
)]
struct Cli {
    /// Scenarios to run (idle, connect, rr, throughput, storm, swarm, all).
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
    /// saltgate-master binary (swarm); default: built with saltgate, beside it.
    #[arg(long, env = "SALTGATE_MASTER_BIN")]
    master_bin: Option<PathBuf>,
    /// saltgate-minion binary (swarm); default: built with saltgate, beside it.
    #[arg(long, env = "SALTGATE_MINION_BIN")]
    minion_bin: Option<PathBuf>,
    /// swarm: simulated minions (default 1000; --quick 30).
    #[arg(long)]
    swarm_minions: Option<usize>,
    /// swarm: processes the minions are spread over (`saltgate-minion swarm --processes`;
    /// direct splits them over the three masters). One process holds at most 20,000 fds.
    #[arg(long, default_value_t = 1)]
    swarm_processes: usize,
    /// swarm: saltgate processes sharing the listeners (`reuse_port: true`), for more sessions
    /// than one process's 20,000 fds allow (two per session).
    #[arg(long, default_value_t = 1)]
    swarm_gates: usize,
    /// swarm: minions started per second, all processes together (default 500; --quick 200;
    /// master: 100).
    #[arg(long)]
    swarm_start_rate: Option<u32>,
    /// master: swarm sizes, comma-separated (each run against salt-master and saltgate-master).
    #[arg(long, default_value = "1000", value_delimiter = ',')]
    master_minions: Vec<usize>,
    /// master: which masters to run, comma-separated: `salt` (salt-master 3008.5), `saltgate`
    /// (saltgate-master). A size where salt-master cannot authenticate every minion in time costs
    /// its whole timeout; run `saltgate` alone for it.
    #[arg(long, default_value = "salt,saltgate", value_delimiter = ',')]
    master_kinds: Vec<String>,
    /// authstorm: swarm sizes, comma-separated (default 2000,5000; --quick 200).
    #[arg(long, value_delimiter = ',')]
    authstorm_minions: Vec<usize>,
    /// authstorm: ways, comma-separated: direct, haproxy, l4 (saltgate without auth_limit),
    /// limit (saltgate with auth_limit).
    #[arg(long, default_value = "direct,haproxy,l4,limit", value_delimiter = ',')]
    authstorm_ways: Vec<String>,
    /// authstorm: seconds to wait for every minion to authenticate (and for every test.ping
    /// return after the rotation); a capped run reports how many made it (default 300; --quick 60).
    #[arg(long)]
    authstorm_cap: Option<u64>,
    /// authstorm: `auth_limit.max_in_flight` of the limited way (a number or auto).
    #[arg(long, default_value = "auto")]
    authstorm_max_in_flight: String,
    /// authstorm: leave out the rotation storm (salt-key -d, then test.ping to all).
    #[arg(long)]
    authstorm_no_rotation: bool,
    /// authstorm: 1 (one salt-master) or the members of a real 3008 cluster (2 to 8; on the
    /// --net's .2, .3, ...).
    #[arg(long, default_value_t = 1)]
    authstorm_masters: usize,
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
    if cli.scenarios.iter().any(|s| s == "master") {
        return master_bench(cli, args);
    }
    if cli.scenarios.iter().any(|s| s == "authstorm") {
        return authstorm_bench(cli, args);
    }
    let mut scenarios = Vec::new();
    for s in &cli.scenarios {
        if s == "all" {
            scenarios.extend(Scenario::ALL);
        } else {
            scenarios.push(Scenario::parse(s).ok_or_else(|| {
                BenchError::Usage(format!(
                    "unknown scenario {s:?}: use idle, connect, rr, throughput, storm, swarm or all"
                ))
            })?);
        }
    }
    scenarios.dedup();
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

    let swarm = scenarios.contains(&Scenario::Swarm);
    let need_build = (targets.contains(&TargetKind::Saltgate) && cli.saltgate_bin.is_none())
        || (swarm && (cli.master_bin.is_none() || cli.minion_bin.is_none()));
    let built = if need_build {
        Some(build_binaries()?)
    } else {
        None
    };
    let from_build = |name: &str| {
        built
            .as_ref()
            .map(|d| d.join(name))
            .unwrap_or_else(|| PathBuf::from(name))
    };
    let saltgate = cli.saltgate_bin.unwrap_or_else(|| from_build("saltgate"));
    let master = cli
        .master_bin
        .unwrap_or_else(|| from_build("saltgate-master"));
    let minion = cli
        .minion_bin
        .unwrap_or_else(|| from_build("saltgate-minion"));
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
        bins: Binaries {
            saltgate,
            haproxy,
            master,
            minion,
        },
        exe: std::env::current_exe().context("path of this executable")?,
        quick: cli.quick,
        settings: ProxySettings::default(),
        swarm: {
            let d = SwarmSize::default_for(cli.quick);
            SwarmSize {
                minions: cli.swarm_minions.unwrap_or(d.minions),
                processes: cli.swarm_processes.max(1),
                gates: cli.swarm_gates.max(1),
                start_rate: cli.swarm_start_rate.unwrap_or(d.start_rate),
            }
        },
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
    if let Some(dir) = emit(cli.json, cli.out.as_deref(), "report", &md, &json)? {
        let title = format!(
            "saltgate / HAProxy, medians of {} run(s), {} CPUs ({})",
            report.meta.repeat, report.meta.cpus, report.meta.finished_utc
        );
        if report.rows.iter().any(|r| r.ratio.is_some()) {
            chart::draw(&report.rows, &title, &dir.join("ratios.png"))?;
            eprintln!(
                "saltgate-bench: wrote {}/report.{{md,json}} and ratios.png",
                dir.display()
            );
        } else {
            // e.g. `--targets saltgate` (scripts/swarm-10k.sh): no HAProxy, so no ratio to draw.
            eprintln!(
                "saltgate-bench: wrote {}/report.{{md,json}} (no chart: no saltgate/HAProxy ratio in this run)",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The context of the real-Salt benches (`master`, `authstorm`): binaries given on the command
/// line, else those `built` (a directory of release binaries), else found on PATH; the swarm's
/// start rate defaults to `default_rate`.
fn salt_ctx(
    cli: &Cli,
    net: Net,
    built: Option<PathBuf>,
    haproxy: PathBuf,
    default_rate: u32,
) -> Result<Ctx> {
    let bin = |given: &Option<PathBuf>, name: &str| {
        given.clone().unwrap_or_else(|| {
            built
                .as_ref()
                .map(|d| d.join(name))
                .unwrap_or_else(|| PathBuf::from(name))
        })
    };
    Ok(Ctx {
        net,
        bins: Binaries {
            saltgate: bin(&cli.saltgate_bin, "saltgate"),
            haproxy,
            master: bin(&cli.master_bin, "saltgate-master"),
            minion: bin(&cli.minion_bin, "saltgate-minion"),
        },
        exe: std::env::current_exe().context("path of this executable")?,
        quick: cli.quick,
        settings: ProxySettings::default(),
        swarm: SwarmSize {
            minions: 0,
            processes: cli.swarm_processes.max(1),
            gates: 1,
            start_rate: cli.swarm_start_rate.unwrap_or(default_rate),
        },
    })
}

/// `saltgate-bench master`: salt-master 3008.5 beside saltgate-master (its own report).
fn master_bench(cli: Cli, args: &[String]) -> Result<()> {
    if cli.scenarios.len() != 1 {
        return Err(BenchError::Usage(
            "master runs alone: saltgate-bench master [--master-minions 1000,5000]".into(),
        )
        .into());
    }
    if cli.master_minions.is_empty() || cli.master_minions.contains(&0) || cli.repeat == 0 {
        return Err(
            BenchError::Usage("--master-minions needs sizes ≥ 1 and --repeat ≥ 1".into()).into(),
        );
    }
    let net = Net::parse(&cli.net)?;
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let built = if cli.master_bin.is_none() || cli.minion_bin.is_none() {
        Some(build_binaries()?)
    } else {
        None
    };
    let ctx = salt_ctx(&cli, net, built, PathBuf::from("haproxy"), 100)?;
    let repeat = if cli.quick { 1 } else { cli.repeat };
    let command = format!("saltgate-bench {}", args[1..].join(" "));
    let kinds = master::parse_kinds(&cli.master_kinds).map_err(BenchError::Usage)?;
    let report = runtime()?.block_on(master::bench(
        &ctx,
        &cli.master_minions,
        &kinds,
        repeat,
        command,
    ))?;
    let md = master::markdown(&report);
    let json = serde_json::to_string_pretty(&report).context("JSON")?;
    if let Some(dir) = emit(cli.json, cli.out.as_deref(), "master-report", &md, &json)? {
        eprintln!(
            "saltgate-bench: wrote {}/master-report.{{md,json}}",
            dir.display()
        );
    }
    Ok(())
}

/// `saltgate-bench authstorm`: N minions against one salt-master 3008.5, four ways (its own
/// report).
fn authstorm_bench(cli: Cli, args: &[String]) -> Result<()> {
    if cli.scenarios.len() != 1 {
        return Err(BenchError::Usage(
            "authstorm runs alone: saltgate-bench authstorm [--authstorm-minions 2000,5000]".into(),
        )
        .into());
    }
    let sizes = if cli.authstorm_minions.is_empty() {
        if cli.quick {
            vec![200]
        } else {
            vec![2000, 5000]
        }
    } else {
        cli.authstorm_minions.clone()
    };
    if sizes.contains(&0) {
        return Err(BenchError::Usage("--authstorm-minions needs sizes ≥ 1".into()).into());
    }
    let mif = cli.authstorm_max_in_flight.trim().to_string();
    if mif != "auto" && !mif.parse::<u32>().is_ok_and(|v| v >= 1) {
        return Err(BenchError::Usage(format!(
            "--authstorm-max-in-flight {mif:?}: use a number ≥ 1 or auto"
        ))
        .into());
    }
    let ways = authstorm::parse_ways(&cli.authstorm_ways).map_err(BenchError::Usage)?;
    if !(1..=8).contains(&cli.authstorm_masters) {
        return Err(BenchError::Usage(format!(
            "--authstorm-masters {}: use 1 (one salt-master) or 2 to 8 (a cluster)",
            cli.authstorm_masters
        ))
        .into());
    }
    let net = Net::parse(&cli.net)?;
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let saltgate_needed = ways.iter().any(|w| {
        matches!(
            w,
            authstorm::Way::SaltgateL4 | authstorm::Way::SaltgateLimit
        )
    });
    let built = if (saltgate_needed && cli.saltgate_bin.is_none()) || cli.minion_bin.is_none() {
        Some(build_binaries()?)
    } else {
        None
    };
    let haproxy = if ways.contains(&authstorm::Way::Haproxy) {
        find_haproxy(cli.haproxy_bin.clone())?
    } else {
        PathBuf::from("haproxy")
    };
    let ctx = salt_ctx(&cli, net, built, haproxy, 1000)?;
    let opts = authstorm::Options {
        sizes,
        ways,
        cap: std::time::Duration::from_secs(cli.authstorm_cap.unwrap_or(if cli.quick {
            60
        } else {
            300
        })),
        max_in_flight: mif,
        rotate: !cli.authstorm_no_rotation,
        masters: cli.authstorm_masters,
    };
    let command = format!("saltgate-bench {} ({})", args[1..].join(" "), git_commit());
    let report = runtime()?.block_on(authstorm::bench(&ctx, &opts, command))?;
    let md = saltgate_bench::scenarios::authstorm_report::markdown(&report);
    let json = serde_json::to_string_pretty(&report).context("JSON")?;
    if let Some(dir) = emit(cli.json, cli.out.as_deref(), "authstorm", &md, &json)? {
        eprintln!(
            "saltgate-bench: wrote {}/authstorm.{{md,json}}",
            dir.display()
        );
    }
    Ok(())
}

/// Prints the report (JSON with `--json`, else Markdown) and, with `--out DIR`, writes
/// `DIR/STEM.md` and `DIR/STEM.json`; returns the directory written to.
fn emit<'a>(
    as_json: bool,
    out: Option<&'a Path>,
    stem: &str,
    md: &str,
    json: &str,
) -> Result<Option<&'a Path>> {
    if as_json {
        println!("{json}");
    } else {
        print!("{md}");
    }
    let Some(dir) = out else { return Ok(None) };
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::write(dir.join(format!("{stem}.md")), md)?;
    std::fs::write(dir.join(format!("{stem}.json")), json)?;
    Ok(Some(dir))
}

/// The workspace root (this crate's parent).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The environment variables cargo sets when it runs a package's binary or test (and its build
/// scripts), which a build script may watch: not the user's own `CARGO_HOME`, `CARGO_TARGET_DIR`,
/// `CARGO_BUILD_*`, `CARGO_PROFILE_*`, ...
fn cargo_set_for_a_package(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "OUT_DIR"
        )
}

/// Builds the release `saltgate`, `saltgate-master` and `saltgate-minion` in this workspace
/// (all three whatever the scenarios need, see below); returns the directory they are in.
fn build_binaries() -> Result<PathBuf> {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Always the three packages, as the packages and the interop suite build them: the same
    // package set gives the same features, so one release build serves every later step.
    let args = [
        "build",
        "--release",
        "-p",
        "saltgate-proxy",
        "-p",
        "saltgate-master",
        "-p",
        "saltgate-minion",
    ];
    eprintln!(
        "saltgate-bench: {cargo} {} (in {})",
        args.join(" "),
        root.display()
    );
    let mut cmd = std::process::Command::new(&cargo);
    // Run from a test (`cargo test` sets these for the test process), the variables cargo sets
    // for a package would reach this cargo; build scripts that watch them (ring's:
    // `rerun-if-env-changed=CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...) would then see a change
    // and rebuild, here and again in the next build from a shell.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(cargo_set_for_a_package) {
            cmd.env_remove(&k);
        }
    }
    let status = cmd
        .args(args)
        .current_dir(&root)
        .status()
        .with_context(|| format!("run {cargo}"))?;
    if !status.success() {
        bail!(
            "cargo {} failed ({status}); or pass --saltgate-bin (and --master-bin, --minion-bin)",
            args.join(" ")
        );
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        Some(d) => root.join(d),
        None => root.join("target"),
    };
    let dir = target.join("release");
    for bin in ["saltgate", "saltgate-master", "saltgate-minion"] {
        if !dir.join(bin).exists() {
            bail!(
                "built, but {} does not exist; pass --saltgate-bin, --master-bin, --minion-bin",
                dir.join(bin).display()
            );
        }
    }
    Ok(dir)
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

#[cfg(test)]
mod tests {
    use super::cargo_set_for_a_package as set;

    #[test]
    fn only_the_variables_cargo_sets_for_a_package_are_left_out_of_the_release_build() {
        for k in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_EXE_saltgate-bench",
            "OUT_DIR",
        ] {
            assert!(
                set(k),
                "{k} is set by cargo for the test: it must not reach the build"
            );
        }
        for k in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "CARGO_PROFILE_RELEASE_LTO",
            "CARGO",
            "PATH",
        ] {
            assert!(!set(k), "{k} is the user's: it must reach the build");
        }
    }
}
