//! Salt's `roots` file server on the request port: what a stock minion's `RemoteClient` asks for
//! `state.apply`, `cp.get_file`, `cp.list_master` and friends (`_file_list`, `_file_hash`,
//! `_serve_file`, `_master_opts`, …), answered from `file_roots` in the reply shapes of
//! `salt/fileserver/__init__.py` and `salt/fileserver/roots.py` (3008.5).
//!
//! Safer than Salt in two ways, both tested below: a path with a `..` component, an absolute
//! path or a NUL byte is refused (logged) before any path is built from it, and a symlink whose
//! target lies outside its root is neither listed nor served (Salt follows such links by default,
//! `fileserver_followsymlinks: True`). `file_ignore_regex`/`file_ignore_glob` and the hash cache
//! are not implemented: every file under a root is served and hashed on request.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use saltgate_wire::envelope::{self, as_str, get, text, Value};
use saltgate_wire::hex;
use sha2::{Digest, Sha256};

use crate::metrics::{Refusals, Refused};

/// Salt's master default `file_buffer_size`: the most `_serve_file` returns per request.
pub const FILE_BUFFER_SIZE: usize = 262_144;
/// Salt's master default `hash_type`.
pub const HASH_TYPE: &str = "sha256";
/// How deep a listing walks (a symlink loop inside a root stops here).
const MAX_DEPTH: usize = 64;

/// The file server commands this module answers.
pub const COMMANDS: &[&str] = &[
    "_file_envs",
    "_file_list",
    "_file_list_emptydirs",
    "_dir_list",
    "_symlink_list",
    "_file_hash",
    "_file_hash_and_stat",
    "_serve_file",
    "_file_find",
    "_master_opts",
];

/// `file_roots`: saltenv → directories, searched in order.
pub type Roots = BTreeMap<String, Vec<PathBuf>>;

/// Answers file server command `cmd` (one of [`COMMANDS`]) for minion `id`; `None` for any
/// other command.
pub fn handle(
    roots: &Roots,
    refusals: &Refusals,
    id: &str,
    cmd: &str,
    load: &Value,
) -> Option<Value> {
    Some(match cmd {
        // Salt's `envs()`: the `file_roots` keys, sorted.
        "_file_envs" => Value::Array(roots.keys().map(|e| text(e)).collect()),
        "_file_list" | "_file_list_emptydirs" | "_dir_list" | "_symlink_list" => {
            let Some(env) = get(load, "saltenv").map(env_string) else {
                return Some(empty_list(cmd));
            };
            let lists = walk_env(roots, &env);
            let prefix = get(load, "prefix").and_then(as_str).unwrap_or("");
            let prefix = prefix.trim_matches('/');
            let keep = |p: &String| prefix.is_empty() || p.starts_with(prefix);
            let strings = |s: BTreeSet<String>| {
                Value::Array(s.into_iter().filter(keep).map(|p| text(&p)).collect())
            };
            match cmd {
                "_file_list" => strings(lists.files),
                "_file_list_emptydirs" => strings(lists.empty_dirs),
                "_dir_list" => strings(lists.dirs),
                _ => Value::Map(
                    lists
                        .links
                        .into_iter()
                        .filter(|(k, _)| keep(k))
                        .map(|(k, v)| (text(&k), text(&v)))
                        .collect(),
                ),
            }
        }
        "_file_hash" => match find(roots, refusals, id, load) {
            Some(f) => hash_reply(&f.full).unwrap_or_else(|| text("")),
            None => text(""),
        },
        "_file_hash_and_stat" => match find(roots, refusals, id, load) {
            Some(f) => Value::Array(vec![
                hash_reply(&f.full).unwrap_or_else(|| text("")),
                stat_list(&f.full),
            ]),
            None => Value::Array(vec![text(""), Value::Nil]),
        },
        "_file_find" => match find(roots, refusals, id, load) {
            Some(f) => envelope::map(vec![
                ("path", text(&f.full.to_string_lossy())),
                ("rel", text(&f.rel)),
                ("stat", stat_list(&f.full)),
            ]),
            None => envelope::map(vec![("path", text("")), ("rel", text(""))]),
        },
        "_serve_file" => serve(roots, refusals, id, load),
        "_master_opts" => master_opts(roots, load),
        _ => return None,
    })
}

fn empty_list(cmd: &str) -> Value {
    if cmd == "_symlink_list" {
        Value::Map(Vec::new())
    } else {
        Value::Array(Vec::new())
    }
}

/// Salt stringifies a non-string saltenv (`str(load["saltenv"])`).
fn env_string(v: &Value) -> String {
    as_str(v).map_or_else(|| v.to_string(), str::to_string)
}

/// The directories of `saltenv`: its own entry, or `__env__`'s with the name substituted (as
/// Salt does). A saltenv that could change the directory (`/`, `..`, NUL) maps to nothing.
pub fn env_roots(roots: &Roots, saltenv: &str) -> Vec<PathBuf> {
    if let Some(dirs) = roots.get(saltenv) {
        return dirs.clone();
    }
    match roots.get("__env__") {
        Some(dirs) if !unsafe_env(saltenv) => dirs
            .iter()
            .map(|d| PathBuf::from(d.to_string_lossy().replace("__env__", saltenv)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether a saltenv name could leave the directory an `__env__` root puts it in.
fn unsafe_env(saltenv: &str) -> bool {
    saltenv.is_empty() || saltenv.contains(['/', '\\', '\0']) || saltenv == "." || saltenv == ".."
}

/// A requested path, checked: relative, no `..` component, no NUL. Returns the normalised
/// relative path (Salt's `os.path.normpath`: `./a//b` → `a/b`).
pub fn clean_rel(path: &str) -> Result<String, &'static str> {
    if path.contains('\0') {
        return Err("NUL byte in the path");
    }
    if path.starts_with('/') {
        return Err("absolute path");
    }
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => return Err("`..` in the path"),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path"),
        }
    }
    if parts.is_empty() {
        return Err("empty path");
    }
    Ok(parts.join("/"))
}

/// A file found under a root.
struct Found {
    full: PathBuf,
    rel: String,
}

/// Salt's `find_file`: the load's `path` (with `?saltenv=` honoured, `|` escaping as Salt's
/// `salt.utils.url`) in the load's saltenv, first root first. Refused paths are logged.
fn find(roots: &Roots, refusals: &Refusals, id: &str, load: &Value) -> Option<Found> {
    let raw = get(load, "path").and_then(as_str)?;
    let mut saltenv = get(load, "saltenv").map(env_string)?;
    let path = if let Some(escaped) = raw.strip_prefix('|') {
        escaped
    } else if let Some((p, query)) = raw.split_once('?') {
        for kv in query.split('&') {
            if let Some(("saltenv", v)) = kv.split_once('=') {
                saltenv = v.to_string();
            }
        }
        p
    } else {
        raw
    };
    let why = match clean_rel(path) {
        Err(why) => why,
        Ok(_) if unsafe_env(&saltenv) && !roots.contains_key(&saltenv) => {
            "saltenv name not usable in an __env__ root"
        }
        Ok(rel) => return find_in_roots(roots, refusals, id, &saltenv, rel),
    };
    refusals.count(Refused::FilePath);
    tracing::warn!(minion = %id, path = %raw.escape_debug(), saltenv = %saltenv.escape_debug(),
        reason = why, "file server: path refused");
    None
}

/// The first root of `saltenv` holding `rel` as a file inside the root. A path that leads out
/// of a root (a symlink) and is found in no other root is a refusal, counted once.
fn find_in_roots(
    roots: &Roots,
    refusals: &Refusals,
    id: &str,
    saltenv: &str,
    rel: String,
) -> Option<Found> {
    let mut escaped = false;
    for root in env_roots(roots, saltenv) {
        let full = root.join(&rel);
        if !full.exists() {
            continue;
        }
        if !inside(&root, &full) {
            escaped = true;
            tracing::warn!(minion = %id, path = %rel, root = %root.display(),
                "file server: path leads outside its root (symlink); not served");
        } else if full.is_file() {
            return Some(Found { full, rel });
        }
    }
    if escaped {
        refusals.count(Refused::FilePath);
    }
    None
}

/// Whether `full`, symlinks resolved, lies under `root` (resolved too).
fn inside(root: &Path, full: &Path) -> bool {
    match (root.canonicalize(), full.canonicalize()) {
        (Ok(r), Ok(f)) => f.starts_with(r),
        _ => false,
    }
}

fn hash_reply(path: &Path) -> Option<Value> {
    let mut h = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).ok()?, &mut h).ok()?;
    Some(envelope::map(vec![
        ("hash_type", text(HASH_TYPE)),
        ("hsum", text(&hex(&h.finalize()))),
    ]))
}

/// `list(os.stat(path))`: mode, ino, dev, nlink, uid, gid, size, atime, mtime, ctime.
fn stat_list(path: &Path) -> Value {
    match std::fs::metadata(path) {
        Ok(m) => Value::Array(
            [
                i64::from(m.mode()),
                m.ino() as i64,
                m.dev() as i64,
                m.nlink() as i64,
                i64::from(m.uid()),
                i64::from(m.gid()),
                m.size() as i64,
                m.atime(),
                m.mtime(),
                m.ctime(),
            ]
            .into_iter()
            .map(Value::from)
            .collect(),
        ),
        Err(_) => Value::Nil,
    }
}

/// Salt's `serve_file`: up to [`FILE_BUFFER_SIZE`] bytes from `loc`; `{"data": "", "dest": ""}`
/// when the file is not there. A `gzip` request is answered uncompressed (the minion
/// decompresses only when the reply carries `gzip`).
fn serve(roots: &Roots, refusals: &Refusals, id: &str, load: &Value) -> Value {
    let none = || envelope::map(vec![("data", text("")), ("dest", text(""))]);
    let Some(loc) = get(load, "loc").and_then(Value::as_u64) else {
        return none();
    };
    let Some(f) = find(roots, refusals, id, load) else {
        return none();
    };
    let chunk = (|| {
        let mut file = std::fs::File::open(&f.full).ok()?;
        file.seek(SeekFrom::Start(loc)).ok()?;
        let mut data = Vec::new();
        file.take(FILE_BUFFER_SIZE as u64)
            .read_to_end(&mut data)
            .ok()?;
        Some(data)
    })();
    match chunk {
        Some(data) => envelope::map(vec![("data", Value::Binary(data)), ("dest", text(&f.rel))]),
        None => {
            tracing::warn!(minion = %id, path = %f.full.display(), "file server: cannot read the file");
            none()
        }
    }
}

/// Salt's `_master_opts` with the master defaults (`env_only`: the first four keys only).
fn master_opts(roots: &Roots, load: &Value) -> Value {
    let envs: Vec<(Value, Value)> = roots
        .keys()
        .map(|e| (text(e), Value::Array(Vec::new())))
        .collect();
    let mut m = vec![
        ("file_roots", Value::Map(envs)),
        ("top_file_merging_strategy", text("merge")),
        ("env_order", Value::Array(Vec::new())),
        ("default_top", text("base")),
    ];
    let env_only = matches!(get(load, "env_only"), Some(Value::Boolean(true)));
    if !env_only {
        m.extend([
            ("renderer", text("jinja|yaml")),
            ("failhard", Value::Boolean(false)),
            ("state_top", text("salt://top.sls")),
            ("state_top_saltenv", Value::Nil),
            ("nodegroups", Value::Map(Vec::new())),
            ("state_auto_order", Value::Boolean(true)),
            ("state_events", Value::Boolean(false)),
            ("state_aggregate", Value::Boolean(false)),
            ("jinja_env", Value::Map(Vec::new())),
            ("jinja_sls_env", Value::Map(Vec::new())),
            ("jinja_lstrip_blocks", Value::Boolean(false)),
            ("jinja_trim_blocks", Value::Boolean(false)),
        ]);
    }
    envelope::map(m)
}

/// What one saltenv's roots hold (Salt's `_file_lists`).
#[derive(Default, Debug)]
pub struct Lists {
    pub files: BTreeSet<String>,
    pub dirs: BTreeSet<String>,
    pub empty_dirs: BTreeSet<String>,
    pub links: BTreeMap<String, String>,
}

/// Walks every root of `saltenv`, following symlinks that stay inside their root.
pub fn walk_env(roots: &Roots, saltenv: &str) -> Lists {
    let mut out = Lists::default();
    for root in env_roots(roots, saltenv) {
        let Ok(canon) = root.canonicalize() else {
            continue;
        };
        walk(&canon, &root, "", 0, &mut out);
    }
    out
}

/// Lists `dir` into `out`; whether it had any entry at all (Salt's empty dir: `os.listdir` is
/// empty). Past [`MAX_DEPTH`] or unreadable: not walked, not called empty.
fn walk(canon_root: &Path, dir: &Path, rel: &str, depth: usize, out: &mut Lists) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return true;
    };
    let mut any = false;
    for e in entries.flatten() {
        any = true;
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(false);
        if is_link {
            match path.canonicalize() {
                Ok(t) if t.starts_with(canon_root) => {
                    if let Ok(dest) = std::fs::read_link(&path) {
                        out.links
                            .insert(r.clone(), dest.to_string_lossy().into_owned());
                    }
                }
                // Outside the root, or dangling: not listed (Salt lists and follows it).
                _ => continue,
            }
        }
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            out.dirs.insert(r.clone());
            if !walk(canon_root, &path, &r, depth + 1, out) {
                out.empty_dirs.insert(r);
            }
        } else if meta.is_file() {
            out.files.insert(r);
        }
    }
    any
}

#[cfg(test)]
#[path = "fileserver_tests.rs"]
mod tests;
