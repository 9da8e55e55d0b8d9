//! The execution functions: `test.ping`, `test.echo`, `test.arg`, `test.sleep`, `cmd.run`
//! (`cmd.run_all`, `cmd.retcode`), `grains.items`, `grains.get`, `grains.item`. Answers and
//! error texts follow Salt's (`salt/modules/test.py`, `cmdmod.py`, `grains.py`,
//! `salt/minion.py` `_thread_return`). An unknown function gets Salt's
//! `'x.y' is not available.` with retcode 1.
//!
//! Arguments arrive as Salt publishes them: positional strings (read as YAML scalars, as
//! Salt's `yamlify_arg` does for numbers, booleans and null) and one map flagged `__kwarg__`.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use saltgate_config::salt_minion::GrainValue;
use saltgate_wire::envelope::{self, text, Value};

use crate::grains::{get_path, HostGrains};
use crate::job::Job;

/// Salt's `EX_GENERIC`.
pub const EX_GENERIC: i64 = 1;

/// What a function produced, as the `_return` load carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub ret: Value,
    pub retcode: i64,
    pub success: bool,
    /// Salt's `out` (outputter) when Salt sets one.
    pub out: Option<&'static str>,
}

impl Outcome {
    fn ok(ret: Value) -> Self {
        Outcome {
            ret,
            retcode: 0,
            success: true,
            out: None,
        }
    }

    fn error(msg: String) -> Self {
        Outcome {
            ret: text(&msg),
            retcode: EX_GENERIC,
            success: false,
            out: Some("nested"),
        }
    }
}

/// What the functions may read about the minion running them.
#[derive(Debug, Clone)]
pub struct ExecContext {
    pub id: Arc<str>,
    pub host: Arc<HostGrains>,
    pub statics: Arc<Vec<(String, GrainValue)>>,
}

impl ExecContext {
    pub fn grains(&self) -> Value {
        self.host.for_minion(&self.id, &self.statics)
    }
}

/// Positional and keyword arguments of a job.
#[derive(Debug, Default)]
struct Args {
    pos: Vec<Value>,
    /// Positional arguments as published (before YAML typing): a command stays a string.
    raw: Vec<Value>,
    kw: Vec<(String, Value)>,
}

impl Args {
    fn of(job: &Job) -> Self {
        let mut a = Args::default();
        for v in &job.arg {
            if let Value::Map(entries) = v {
                if envelope::get(v, "__kwarg__") == Some(&Value::Boolean(true)) {
                    for (k, val) in entries {
                        if let Some(k) = envelope::as_str(k).filter(|k| *k != "__kwarg__") {
                            a.kw.push((k.to_owned(), val.clone()));
                        }
                    }
                    continue;
                }
            }
            a.pos.push(yamlify(v));
            a.raw.push(v.clone());
        }
        a
    }

    /// A named parameter given positionally (index `i`) or by keyword.
    fn get(&self, i: usize, name: &str) -> Option<&Value> {
        self.pos
            .get(i)
            .or_else(|| self.kw.iter().find(|(k, _)| k == name).map(|(_, v)| v))
    }

    fn kw_str(&self, name: &str) -> Option<String> {
        self.kw
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| value_string(v))
    }
}

/// Salt's `yamlify_arg` for the scalar cases: numbers, booleans and null become typed.
fn yamlify(v: &Value) -> Value {
    let Some(s) = envelope::as_str(v) else {
        return v.clone();
    };
    let t = s.trim();
    if t != s || t.is_empty() {
        return v.clone();
    }
    if let Ok(i) = t.parse::<i64>() {
        if !(t.len() > 1 && t.starts_with('0')) {
            return Value::from(i);
        }
    }
    if t.contains('.') && t.parse::<f64>().is_ok_and(f64::is_finite) {
        return Value::F64(t.parse().unwrap_or(0.0));
    }
    match t {
        "true" | "True" | "TRUE" => Value::Boolean(true),
        "false" | "False" | "FALSE" => Value::Boolean(false),
        "null" | "Null" | "NULL" | "None" | "~" => Value::Nil,
        _ => v.clone(),
    }
}

fn value_string(v: &Value) -> Option<String> {
    match v {
        Value::String(_) | Value::Binary(_) => envelope::as_str(v).map(str::to_owned),
        Value::Integer(i) => Some(i.to_string()),
        Value::F64(f) => Some(f.to_string()),
        Value::Boolean(b) => Some(if *b { "True" } else { "False" }.to_owned()),
        _ => None,
    }
}

fn seconds(v: &Value) -> Option<f64> {
    match v {
        Value::Integer(i) => i.as_f64(),
        Value::F64(f) => Some(*f),
        other => value_string(other).and_then(|s| s.trim().parse::<f64>().ok()),
    }
    .filter(|s| s.is_finite() && *s >= 0.0)
    // Durations beyond ~30 years are as good as forever (and would overflow `Duration`).
    .map(|s| s.min(1e9))
}

fn missing_arg(fun: &str, name: &str) -> Outcome {
    let short = fun.rsplit('.').next().unwrap_or(fun);
    Outcome::error(format!(
        "Passed invalid arguments to {fun}: {short}() missing 1 required positional argument: '{name}'"
    ))
}

/// Runs `job.fun`.
pub async fn execute(job: &Job, ctx: &ExecContext) -> Outcome {
    let args = Args::of(job);
    match job.fun.as_str() {
        "test.ping" => Outcome::ok(Value::Boolean(true)),
        "test.true" => Outcome::ok(Value::Boolean(true)),
        "test.echo" => match args.get(0, "text") {
            Some(v) => Outcome::ok(v.clone()),
            None => missing_arg(&job.fun, "text"),
        },
        "test.version" => Outcome::ok(text(crate::grains::SALT_VERSION)),
        "test.arg" => Outcome::ok(test_arg(job, &args)),
        "test.sleep" => match args.get(0, "length").and_then(seconds) {
            Some(s) => {
                tokio::time::sleep(Duration::from_secs_f64(s.trunc())).await;
                Outcome::ok(Value::Boolean(true))
            }
            None => missing_arg(&job.fun, "length"),
        },
        "cmd.run" | "cmd.run_all" | "cmd.retcode" => {
            let cmd = args.raw.first().or_else(|| args.get(0, "cmd"));
            let Some(cmd) = cmd.and_then(value_string) else {
                return missing_arg(&job.fun, "cmd");
            };
            let timeout = args
                .kw
                .iter()
                .find(|(k, _)| k == "timeout")
                .and_then(|(_, v)| seconds(v));
            let cwd = args.kw_str("cwd");
            // cmd.run merges stderr into stdout (redirect_stderr=True); run_all keeps them apart.
            let merge = job.fun == "cmd.run";
            let r = run_shell(&cmd, cwd.as_deref(), timeout, merge).await;
            let mut o = Outcome::ok(Value::Nil);
            o.retcode = r.retcode;
            o.success = r.retcode == 0;
            o.ret = match job.fun.as_str() {
                "cmd.run" => text(&r.stdout),
                "cmd.retcode" => Value::from(r.retcode),
                _ => envelope::map(vec![
                    ("pid", Value::from(r.pid)),
                    ("retcode", Value::from(r.retcode)),
                    ("stdout", text(&r.stdout)),
                    ("stderr", text(&r.stderr)),
                ]),
            };
            o
        }
        "grains.items" => Outcome::ok(ctx.grains()),
        "grains.get" => match args.get(0, "key").and_then(value_string) {
            Some(key) => {
                let default = args.get(1, "default").cloned().unwrap_or(text(""));
                let delim = args.kw_str("delimiter").unwrap_or_else(|| ":".into());
                Outcome::ok(get_path(&ctx.grains(), &key, &delim, default))
            }
            None => missing_arg(&job.fun, "key"),
        },
        "grains.item" => {
            let g = ctx.grains();
            let items = args
                .pos
                .iter()
                .filter_map(value_string)
                .map(|k| {
                    let v = get_path(&g, &k, ":", text(""));
                    (text(&k), v)
                })
                .collect();
            Outcome::ok(Value::Map(items))
        }
        "grains.ls" => {
            let keys = match ctx.grains() {
                Value::Map(m) => m.into_iter().map(|(k, _)| k).collect(),
                _ => Vec::new(),
            };
            Outcome::ok(Value::Array(keys))
        }
        other => Outcome::error(format!("'{other}' is not available.")),
    }
}

/// `test.arg`: `{"args": [...], "kwargs": {...}}`, kwargs including the `__pub_*` publish data
/// Salt passes to functions that take `**kwargs`.
fn test_arg(job: &Job, args: &Args) -> Value {
    let mut kw: Vec<(Value, Value)> = args.kw.iter().map(|(k, v)| (text(k), v.clone())).collect();
    let mut pub_kw = vec![
        ("__pub_fun", text(&job.fun)),
        ("__pub_jid", text(&job.jid)),
        ("__pub_tgt", job.tgt.clone()),
        ("__pub_tgt_type", text(&job.tgt_type)),
        ("__pub_arg", Value::Array(job.arg.clone())),
        ("__pub_ret", job.ret.clone()),
    ];
    if let Some(u) = &job.user {
        pub_kw.push(("__pub_user", u.clone()));
    }
    kw.extend(pub_kw.into_iter().map(|(k, v)| (text(k), v)));
    envelope::map(vec![
        ("args", Value::Array(args.pos.clone())),
        ("kwargs", Value::Map(kw)),
    ])
}

/// The result of a shell command.
#[derive(Debug, Clone, PartialEq)]
pub struct ShellResult {
    pub pid: u32,
    pub retcode: i64,
    pub stdout: String,
    pub stderr: String,
}

fn pipe() -> std::io::Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((r.into(), w.into()))
}

fn read_all(mut f: std::fs::File) -> String {
    use std::io::Read;
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Runs `cmd` through `/bin/sh -c` as Salt's `cmd.run` does from the master (python_shell),
/// in its own process group (killed whole on timeout). Output is right-stripped (`rstrip`).
/// On timeout: stdout is Salt's `"<cmd> : Timed out after <t> seconds"`, retcode 1.
pub async fn run_shell(
    cmd: &str,
    cwd: Option<&str>,
    timeout: Option<f64>,
    merge_stderr: bool,
) -> ShellResult {
    let fail = |msg: String| ShellResult {
        pid: 0,
        retcode: EX_GENERIC,
        stdout: msg,
        stderr: String::new(),
    };
    let (out_r, out_w) = match pipe() {
        Ok(p) => p,
        Err(e) => return fail(format!("Unable to run command '{cmd}': {e}")),
    };
    let (err_r, err_w) = if merge_stderr {
        (None, out_w.try_clone())
    } else {
        match pipe() {
            Ok((r, w)) => (Some(r), Ok(w)),
            Err(e) => return fail(format!("Unable to run command '{cmd}': {e}")),
        }
    };
    let err_w = match err_w {
        Ok(w) => w,
        Err(e) => return fail(format!("Unable to run command '{cmd}': {e}")),
    };
    let mut c = tokio::process::Command::new("/bin/sh");
    c.arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w))
        .process_group(0)
        .kill_on_drop(true);
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            return fail(format!(
                "Unable to run command '{cmd}' with the context '{{}}', reason: {e}"
            ))
        }
    };
    // Our copies of the write ends are gone with `c`: the readers see EOF when the group exits.
    drop(c);
    let pid = child.id().unwrap_or(0);
    let out_task = tokio::task::spawn_blocking(move || read_all(out_r));
    let err_task = err_r.map(|r| tokio::task::spawn_blocking(move || read_all(r)));
    let limit = timeout.filter(|t| *t > 0.0).map(Duration::from_secs_f64);
    let status = match limit {
        Some(t) => tokio::time::timeout(t, child.wait()).await,
        None => Ok(child.wait().await),
    };
    let timed_out = status.is_err();
    if timed_out && pid > 0 {
        // SAFETY: kill(2) on the process group we created for this command only.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
        let _ = child.wait().await;
    }
    let stdout = out_task.await.unwrap_or_default();
    let stderr = match err_task {
        Some(t) => t.await.unwrap_or_default(),
        None => String::new(),
    };
    if timed_out {
        let t = timeout.unwrap_or(0.0);
        let t = if t.fract() == 0.0 {
            format!("{}", t as u64)
        } else {
            t.to_string()
        };
        return ShellResult {
            pid,
            retcode: 1,
            stdout: format!("{cmd} : Timed out after {t} seconds"),
            stderr: String::new(),
        };
    }
    let retcode = match status {
        Ok(Ok(s)) => s.code().map_or_else(
            || {
                use std::os::unix::process::ExitStatusExt;
                -i64::from(s.signal().unwrap_or(0))
            },
            i64::from,
        ),
        _ => EX_GENERIC,
    };
    ShellResult {
        pid,
        retcode,
        stdout: stdout.trim_end().to_owned(),
        stderr: stderr.trim_end().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_wire::envelope::map;

    fn ctx() -> ExecContext {
        ExecContext {
            id: "m1".into(),
            host: Arc::new(HostGrains::collect()),
            statics: Arc::new(Vec::new()),
        }
    }

    fn job(fun: &str, arg: Vec<Value>) -> Job {
        Job::parse(&map(vec![
            ("jid", text("20260101000000000001")),
            ("fun", text(fun)),
            ("arg", Value::Array(arg)),
            ("tgt", text("*")),
            ("user", text("root")),
        ]))
        .unwrap()
    }

    #[tokio::test]
    async fn test_functions_answer_like_salt() {
        let c = ctx();
        assert_eq!(
            execute(&job("test.ping", vec![]), &c).await,
            Outcome::ok(Value::Boolean(true))
        );
        assert_eq!(
            execute(&job("test.echo", vec![text("hi there")]), &c)
                .await
                .ret,
            text("hi there")
        );
        assert_eq!(
            execute(&job("test.echo", vec![text("42")]), &c).await.ret,
            Value::from(42)
        );
        let kw = map(vec![("__kwarg__", Value::Boolean(true)), ("k", text("v"))]);
        let r = execute(&job("test.arg", vec![text("a1"), kw]), &c)
            .await
            .ret;
        assert_eq!(
            envelope::get(&r, "args"),
            Some(&Value::Array(vec![text("a1")]))
        );
        let kwargs = envelope::get(&r, "kwargs").unwrap();
        assert_eq!(envelope::get(kwargs, "k"), Some(&text("v")));
        assert_eq!(envelope::get(kwargs, "__pub_fun"), Some(&text("test.arg")));
        let missing = execute(&job("nope.fun", vec![]), &c).await;
        assert_eq!(missing.ret, text("'nope.fun' is not available."));
        assert_eq!((missing.retcode, missing.success), (1, false));
        let bad = execute(&job("test.echo", vec![]), &c).await;
        assert_eq!(bad.retcode, 1);
        assert_eq!(
            execute(&job("grains.get", vec![text("id")]), &c).await.ret,
            text("m1")
        );
    }

    #[tokio::test]
    async fn cmd_run_merges_stderr_strips_and_reports_retcode() {
        let r = run_shell("echo out; echo err >&2; exit 3", None, None, true).await;
        assert_eq!(r.stdout, "out\nerr");
        assert_eq!(r.retcode, 3);
        let r = run_shell("echo out; echo err >&2", None, None, false).await;
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out", "err"));
        let c = ctx();
        let o = execute(&job("cmd.run", vec![text("echo hi")]), &c).await;
        assert_eq!((o.ret, o.retcode, o.success), (text("hi"), 0, true));
        let o = execute(&job("cmd.run", vec![text("false")]), &c).await;
        assert_eq!((o.retcode, o.success), (1, false));
        // An absurd timeout from the publisher is capped, not a panic.
        let kw = map(vec![
            ("__kwarg__", Value::Boolean(true)),
            ("timeout", Value::F64(1e300)),
        ]);
        let o = execute(&job("cmd.run", vec![text("echo ok"), kw]), &c).await;
        assert_eq!(o.ret, text("ok"));
    }

    #[tokio::test]
    async fn cmd_run_timeout_kills_the_command() {
        let start = std::time::Instant::now();
        let r = run_shell("sleep 30; echo never", None, Some(0.3), true).await;
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(
            r.stdout,
            "sleep 30; echo never : Timed out after 0.3 seconds"
        );
        assert_eq!(r.retcode, 1);
    }
}
