//! The `saltgate-master` binary: a thin CLI over the `saltgate_master` library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use saltgate_config::salt_master::{load_salt_master, SaltMasterConfig};
use saltgate_master::keys::{status_title, KeyState, KeyStore};
use saltgate_master::signing::{gen_signature, GenSignature};
use saltgate_master::target::any_glob_match;
use saltgate_master::{cli, jobs::JobCache, server};
use serde_json::{json, Value as Json};

#[derive(Parser)]
#[command(
    name = "saltgate-master",
    version = env!("SALTGATE_VERSION"),
    about = "A Salt-wire-compatible master"
)]
struct Cli {
    /// Salt master configuration file (YAML).
    #[arg(
        short = 'c',
        long = "config",
        global = true,
        default_value = "/etc/salt/master"
    )]
    config: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve minions until SIGINT/SIGTERM.
    Run,
    /// Validate a master configuration without starting (exit 0 valid, 1 invalid), like
    /// `saltgate check-config`.
    CheckConfig {
        /// The file to check (default: the --config file).
        file: Option<PathBuf>,
    },
    /// Write the man pages (DIR/man) and bash/zsh completions (DIR/completions) made from this
    /// command line's definition; the Debian package ships them.
    #[command(hide = true)]
    GenDocs { dir: PathBuf },
    /// Manage minion keys in the PKI directory (like salt-key; works with or without a running master).
    #[command(subcommand)]
    Key(KeyCmd),
    /// Publish a job through the running master and print the returns.
    Publish(PublishArgs),
    /// Look at the job cache.
    #[command(subcommand)]
    Jobs(JobsCmd),
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Out {
    Text,
    Json,
}

#[derive(Subcommand)]
enum KeyCmd {
    /// List keys by state: accepted, pending (unaccepted), rejected, denied.
    List {
        #[arg(long, value_enum, default_value = "text")]
        out: Out,
    },
    /// Accept pending keys: an id, a glob (`'web*'`), several joined by commas, or --all.
    Accept(IdOrAll),
    /// Reject pending keys: an id, a glob, several joined by commas, or --all.
    Reject(IdOrAll),
    /// Delete every key (denied included) of a minion, or of every minion a glob matches.
    Delete { id: String },
    /// Print key fingerprints, as `salt-key -F` (all keys) or `-f GLOB` (the keys whose name
    /// matches; the master's own are `master.pub` and `master.pem`).
    Finger {
        /// A minion id or key name; a glob, or several joined by commas.
        id: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        out: Out,
    },
    /// Sign the master public key for MultiMaster-PKI, as `salt-key --gen-signature`: writes
    /// base64 of the signature to `<pki_dir>/<master_pubkey_signature>` (default
    /// `<id>_pubkey_signature`), for `master_use_pubkey_signature`.
    GenSignature(GenSignatureArgs),
}

#[derive(Args)]
struct GenSignatureArgs {
    /// The private key to sign with (default `<pki_dir>/<master_sign_key_name>.pem`).
    #[arg(long = "priv")]
    private: Option<PathBuf>,
    /// The public key to sign (default `<pki_dir>/master.pub`).
    #[arg(long = "pub")]
    public: Option<PathBuf>,
    /// The directory to write the signature file to (default `pki_dir`).
    #[arg(long)]
    signature_path: Option<PathBuf>,
    /// Create the signing key pair when it does not exist yet.
    #[arg(long)]
    auto_create: bool,
    /// Key size for --auto-create (2048 or more; smaller is rounded up, as salt-key does).
    #[arg(long, default_value_t = 2048)]
    keysize: usize,
}

#[derive(Args)]
struct IdOrAll {
    id: Option<String>,
    #[arg(long, conflicts_with = "id")]
    all: bool,
}

#[derive(Args)]
struct PublishArgs {
    #[arg(long = "tgt-type", default_value = "glob", value_parser = ["glob", "list", "pcre"])]
    tgt_type: String,
    /// Seconds to wait for returns.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
    #[arg(long, value_enum, default_value = "text")]
    out: Out,
    target: String,
    function: String,
    /// Arguments; `key=value` becomes a keyword argument.
    #[arg(allow_hyphen_values = true)]
    args: Vec<String>,
}

#[derive(Subcommand)]
enum JobsCmd {
    /// JIDs in the job cache, with function, target and return count.
    List,
    /// One job's load and returns, as JSON.
    Show { jid: String },
}

fn load_config(path: &std::path::Path) -> Result<SaltMasterConfig> {
    let loaded = load_salt_master(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    Ok(loaded.config)
}

fn keystore(c: &SaltMasterConfig) -> KeyStore {
    KeyStore::new(
        c.cluster
            .as_ref()
            .map(|cl| cl.pki_dir.clone())
            .unwrap_or_else(|| c.pki_dir.clone()),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if matches!(cli.cmd, Cmd::Run) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .init();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("saltgate-master: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main(cli: Cli) -> Result<ExitCode> {
    match &cli.cmd {
        Cmd::CheckConfig { file } => return Ok(check_config(file.as_ref().unwrap_or(&cli.config))),
        Cmd::GenDocs { dir } => {
            gen_docs(dir).with_context(|| format!("writing the docs into {}", dir.display()))?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let config = load_config(&cli.config)?;
    match cli.cmd {
        Cmd::CheckConfig { .. } | Cmd::GenDocs { .. } => Ok(ExitCode::SUCCESS),
        Cmd::Run => run(config),
        Cmd::Key(k) => key(&config, k),
        Cmd::Publish(p) => publish(&config, p),
        Cmd::Jobs(j) => jobs(&config, j),
    }
}

/// `check-config`: every error names the file, line and key (exit 1); warnings are printed and do
/// not fail the check, as Salt ignores keys it does not use.
fn check_config(path: &std::path::Path) -> ExitCode {
    match load_salt_master(path) {
        Ok(l) => {
            for w in &l.warnings {
                eprintln!("warning: {w}");
            }
            let c = &l.config;
            eprintln!(
                "configuration valid: id {}; publish on {}:{}, ret on {}:{}; pki_dir {}, cachedir {}, sock_dir {}",
                c.id,
                c.interface,
                c.publish_port,
                c.interface,
                c.ret_port,
                c.pki_dir.display(),
                c.cachedir.display(),
                c.sock_dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            for err in &e.0 {
                eprintln!("error: {err}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `gen-docs DIR`: one man page per command and subcommand in DIR/man, and the bash and zsh
/// completions in DIR/completions (`saltgate-master.bash`, `_saltgate-master`).
fn gen_docs(dir: &std::path::Path) -> std::io::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let (man, completions) = (dir.join("man"), dir.join("completions"));
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh] {
        clap_complete::generate_to(shell, &mut cmd, "saltgate-master", &completions)?;
    }
    Ok(())
}

fn run(config: SaltMasterConfig) -> Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async {
        // The handlers are installed now, before the listeners are bound and READY=1 is sent: a
        // future that installed them when first polled left a window after READY=1 in which a
        // SIGTERM killed the process without STOPPING=1 (or a clean shutdown).
        let stop = saltgate_wire::signals::stop_signal()
            .context("installing the SIGTERM and SIGINT handlers")?;
        let shutdown = async move {
            stop.await;
            saltgate_wire::sd_notify::notify("STOPPING=1");
        };
        server::run(config, shutdown, |b| {
            let cluster = b
                .cluster
                .map(|c| format!(" cluster={c}"))
                .unwrap_or_default();
            println!(
                "saltgate-master ready ret={} publish={} socket={}{cluster}",
                b.ret,
                b.publish,
                b.cli_socket.display()
            );
            // Type=notify: the listeners are bound and the CLI socket is open.
            saltgate_wire::sd_notify::notify("READY=1");
        })
        .await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn key(c: &SaltMasterConfig, cmd: KeyCmd) -> Result<ExitCode> {
    let ks = keystore(c);
    match cmd {
        KeyCmd::List { out } => {
            let l = ks.list()?;
            match out {
                Out::Json => println!("{}", serde_json::to_string_pretty(&l)?),
                Out::Text => {
                    for state in [
                        KeyState::Accepted,
                        KeyState::Denied,
                        KeyState::Pending,
                        KeyState::Rejected,
                    ] {
                        println!("{}", status_title(state.dir()));
                        for id in l.ids(state) {
                            println!("{}", safe(id));
                        }
                    }
                }
            }
        }
        KeyCmd::Accept(a) => {
            let ids = pending_ids(&ks, a)?;
            each_key(ids, "accepted", |id| Ok(ks.accept(id)?)).1?;
        }
        KeyCmd::Reject(a) => {
            let ids = pending_ids(&ks, a)?;
            let (changed, done) = each_key(ids, "rejected", |id| Ok(ks.reject(id)?));
            if changed {
                request_rotation(c);
            }
            done?;
        }
        KeyCmd::Delete { id: arg } => {
            let ids = named_ids(&arg, &ks.list()?.all(), None)?;
            let (changed, done) = each_key(ids, "deleted", |id| {
                if !ks.delete(id)? {
                    bail!("no key for minion {id:?}");
                }
                Ok(())
            });
            if changed {
                request_rotation(c);
            }
            done?;
        }
        KeyCmd::GenSignature(a) => {
            let opts = GenSignature {
                private: a.private,
                public: a.public,
                signature_dir: a.signature_path,
                auto_create: a.auto_create,
                keysize: Some(a.keysize),
            };
            let path = gen_signature(c, &opts)?;
            println!("Signature written to {}", path.display());
        }
        KeyCmd::Finger { id, out } => {
            // The master's own keys sit beside the minion keys: `pki_dir`, or in a cluster
            // `cluster_pki_dir` with cluster.pem/cluster.pub, the key its minions see (as
            // salt-key lists them).
            let f = ks.fingers(ks.root(), id.as_deref().unwrap_or("*"))?;
            match out {
                Out::Json => println!("{}", serde_json::to_string_pretty(&f)?),
                Out::Text => {
                    for (status, keys) in &f {
                        println!("{}", status_title(status));
                        for (name, finger) in keys {
                            println!("{}:  {finger}", safe(name));
                        }
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The pending keys that `accept`/`reject` name: `--all`, or an id or globs ([`named_ids`]).
fn pending_ids(ks: &KeyStore, a: IdOrAll) -> Result<Vec<String>> {
    let pending = ks.list()?.minions_pre;
    match a.id {
        Some(arg) => named_ids(&arg, &pending, Some("unaccepted")),
        None if a.all => Ok(pending),
        None => bail!("name a minion id, or pass --all"),
    }
}

/// The ids that `arg` names among `candidates`, as `salt-key -a/-r/-d` reads it: a plain id
/// stands for itself (the key store then checks it and names the state it is in); a glob (`*`,
/// `?`, `[...]`), or several ids or globs joined by commas, stands for every candidate it matches
/// (names that match none are skipped), and matching nothing at all is an error (Salt prints the
/// same words but exits 0).
fn named_ids(arg: &str, candidates: &[String], state: Option<&str>) -> Result<Vec<String>> {
    if !arg.contains(['*', '?', '[', ',']) {
        return Ok(vec![arg.to_string()]);
    }
    let ids: Vec<String> = candidates
        .iter()
        .filter(|id| any_glob_match(arg, id))
        .cloned()
        .collect();
    if ids.is_empty() {
        let state = state.map(|s| format!("{s} ")).unwrap_or_default();
        bail!("the key glob {arg:?} does not match any {state}keys");
    }
    Ok(ids)
}

/// Applies `act` to every id and prints Salt's `Key for minion ID <done>.` for each that worked.
/// A failure does not stop the others (as `salt-key` goes on): every failure is named in the
/// error returned at the end, beside whether any key changed.
fn each_key(
    ids: Vec<String>,
    done: &str,
    mut act: impl FnMut(&str) -> Result<()>,
) -> (bool, Result<()>) {
    let (mut changed, mut failed) = (false, Vec::new());
    for id in ids {
        match act(&id) {
            Ok(()) => {
                changed = true;
                println!("Key for minion {} {done}.", safe(&id));
            }
            Err(e) => failed.push(safe(&format!("{id}: {e:#}")).into_owned()),
        }
    }
    if failed.is_empty() {
        return (changed, Ok(()));
    }
    let why = failed.join("; ");
    (
        changed,
        Err(anyhow::anyhow!("{} key(s) not {done}: {why}", failed.len())),
    )
}

/// After a key is deleted or rejected: ask the running master to rotate the publish key, as
/// `salt-key` does (`rotate_aes_key`), so the minion can no longer read publishes.
fn request_rotation(c: &SaltMasterConfig) {
    if !c.rotate_aes_key {
        return;
    }
    if let Err(e) = saltgate_master::rotate::request_rotation(&c.cachedir, &c.id) {
        eprintln!(
            "warning: the publish key will not be rotated ({e}); the removed minion can read \
             publishes until the master restarts or publish_session runs out"
        );
    }
}

/// Salt's CLI turns `k=v` into a keyword argument and YAML-ish scalars into values.
fn parse_arg(a: &str) -> (Option<String>, Json) {
    let scalar = |s: &str| -> Json {
        if let Ok(i) = s.parse::<i64>() {
            return json!(i);
        }
        match s {
            "True" | "true" => json!(true),
            "False" | "false" => json!(false),
            "None" | "null" => Json::Null,
            _ => json!(s),
        }
    };
    if let Some((k, v)) = a.split_once('=') {
        if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return (Some(k.to_string()), scalar(v));
        }
    }
    (None, scalar(a))
}

fn publish(c: &SaltMasterConfig, p: PublishArgs) -> Result<ExitCode> {
    let mut arg = Vec::new();
    let mut kwargs = serde_json::Map::new();
    for a in &p.args {
        match parse_arg(a) {
            (Some(k), v) => {
                kwargs.insert(k, v);
            }
            (None, v) => arg.push(v),
        }
    }
    if !kwargs.is_empty() {
        kwargs.insert("__kwarg__".into(), json!(true));
        arg.push(Json::Object(kwargs));
    }
    if !(p.timeout.is_finite() && p.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let req = json!({
        "tgt": p.target, "tgt_type": p.tgt_type, "fun": p.function, "arg": arg,
        "timeout_secs": p.timeout, "user": user,
    });
    let socket = server::cli_socket_path(c);
    let rt = tokio::runtime::Runtime::new()?;
    let outcome = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::try_from_secs_f64(p.timeout)
                    .unwrap_or(cli::MAX_TIMEOUT)
                    .min(cli::MAX_TIMEOUT)
                    + Duration::from_secs(30),
                cli::publish(&socket, &req),
            )
            .await
            .unwrap_or_else(|_| Err("no answer from the master".into()))
        })
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut all = serde_json::Map::new();
    for r in &outcome.returns {
        all.insert(
            r.minion.clone(),
            r.record.get("return").cloned().unwrap_or(Json::Null),
        );
    }
    match p.out {
        Out::Json => println!("{}", serde_json::to_string_pretty(&Json::Object(all))?),
        Out::Text => {
            for (m, r) in &all {
                println!("{}:", safe(m));
                let text = match r {
                    Json::String(s) => s.clone(),
                    other => serde_json::to_string_pretty(other)?,
                };
                for line in text.lines() {
                    println!("    {}", safe(line));
                }
            }
        }
    }
    if outcome.expected.is_empty() {
        // Salt's master assigns no jid then; ours has published the job (and, in a cluster,
        // so have its peers): say so, with the jid, and exit as `salt` does with no return.
        eprintln!(
            "No minions matched the target. The job was published as jid {}, but no accepted \
             minion matches it, so none will run it.",
            outcome.jid
        );
        eprintln!("ERROR: No return received");
        return Ok(ExitCode::from(2));
    }
    for m in &outcome.missing {
        eprintln!("{}: Minion did not return. [No response]", safe(m));
    }
    eprintln!("jid: {}", outcome.jid);
    Ok(if outcome.missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Text a minion or a client chose, made safe for the terminal (control and bidi characters
/// escaped: wire's one function, which `saltgate ctl` uses too).
fn safe(s: &str) -> std::borrow::Cow<'_, str> {
    saltgate_wire::display::terminal_safe(s)
}

fn jobs(c: &SaltMasterConfig, cmd: JobsCmd) -> Result<ExitCode> {
    let cache = JobCache::new(&c.cachedir);
    match cmd {
        JobsCmd::List => {
            for jid in cache.list()? {
                let job = cache.show(&jid)?;
                let load = &job["load"];
                println!(
                    "{jid}  {}  {}  {}/{} returned",
                    safe(load["fun"].as_str().unwrap_or("?")),
                    safe(load["tgt"].as_str().unwrap_or("?")),
                    job["returns"].as_object().map_or(0, |o| o.len()),
                    load["minions"].as_array().map_or(0, |a| a.len()),
                );
            }
        }
        JobsCmd::Show { jid } => println!("{}", serde_json::to_string_pretty(&cache.show(&jid)?)?),
    }
    Ok(ExitCode::SUCCESS)
}
