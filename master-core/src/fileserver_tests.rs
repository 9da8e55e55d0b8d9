use super::*;

/// The refusal counters of the tests that do not check them.
static RF: Refusals = Refusals::new();

fn load(pairs: Vec<(&str, Value)>) -> Value {
    envelope::map(pairs)
}

fn s(v: &str) -> Value {
    text(v)
}

/// A root with `top.sls`, `web/init.sls`, `web/files/index.html`, an empty dir, a symlink
/// inside the root and one pointing outside it; plus a secret file outside the root.
fn tree() -> (tempfile::TempDir, Roots) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("salt");
    std::fs::create_dir_all(root.join("web/files")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::write(root.join("top.sls"), "base:\n  '*':\n    - web\n").unwrap();
    std::fs::write(root.join("web/init.sls"), "x: y\n").unwrap();
    std::fs::write(root.join("web/files/index.html"), vec![b'a'; 300_000]).unwrap();
    std::fs::write(d.path().join("secret"), "not for minions").unwrap();
    std::os::unix::fs::symlink("web/init.sls", root.join("alias.sls")).unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), root.join("leak")).unwrap();
    std::os::unix::fs::symlink(d.path(), root.join("up")).unwrap();
    let mut roots = Roots::new();
    roots.insert("base".into(), vec![root]);
    (d, roots)
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a.iter().map(|x| as_str(x).unwrap().to_string()).collect(),
        other => panic!("not a list: {other:?}"),
    }
}

#[test]
fn clean_rel_refuses_traversal_absolute_and_nul() {
    assert_eq!(clean_rel("./web//init.sls").unwrap(), "web/init.sls");
    assert_eq!(clean_rel("top.sls").unwrap(), "top.sls");
    for bad in [
        "../etc/passwd",
        "web/../../x",
        "..",
        "/etc/passwd",
        "a\0b",
        "",
        ".",
    ] {
        assert!(clean_rel(bad).is_err(), "{bad:?} must be refused");
    }
}

#[test]
fn lists_files_dirs_empty_dirs_and_inner_links_only() {
    let (_d, roots) = tree();
    let env = load(vec![("saltenv", s("base"))]);
    let files = strings(&handle(&roots, &RF, "m", "_file_list", &env).unwrap());
    assert_eq!(
        files,
        [
            "alias.sls",
            "top.sls",
            "web/files/index.html",
            "web/init.sls"
        ],
        "the links leading outside the root (leak, up) are not listed"
    );
    let dirs = strings(&handle(&roots, &RF, "m", "_dir_list", &env).unwrap());
    assert_eq!(dirs, ["empty", "web", "web/files"]);
    let empty = strings(&handle(&roots, &RF, "m", "_file_list_emptydirs", &env).unwrap());
    assert_eq!(empty, ["empty"]);
    let links = handle(&roots, &RF, "m", "_symlink_list", &env).unwrap();
    assert_eq!(links, Value::Map(vec![(s("alias.sls"), s("web/init.sls"))]));
    // prefix, as Salt filters it
    let web = load(vec![("saltenv", s("base")), ("prefix", s("/web/"))]);
    let files = strings(&handle(&roots, &RF, "m", "_file_list", &web).unwrap());
    assert_eq!(files, ["web/files/index.html", "web/init.sls"]);
    // an unknown saltenv, or none: empty, as Salt
    let other = load(vec![("saltenv", s("dev"))]);
    assert!(strings(&handle(&roots, &RF, "m", "_file_list", &other).unwrap()).is_empty());
    assert!(strings(&handle(&roots, &RF, "m", "_file_list", &load(vec![])).unwrap()).is_empty());
}

#[test]
fn serve_file_chunks_from_loc_and_refuses_what_leads_outside() {
    let (dir, roots) = tree();
    let req = |path: &str, loc: u64| {
        load(vec![
            ("path", s(path)),
            ("saltenv", s("base")),
            ("loc", Value::from(loc)),
        ])
    };
    let chunk = |v: &Value| match get(v, "data") {
        Some(Value::Binary(b)) => b.len(),
        Some(v) if as_str(v) == Some("") => 0,
        other => panic!("data: {other:?}"),
    };
    let first = handle(
        &roots,
        &RF,
        "m",
        "_serve_file",
        &req("web/files/index.html", 0),
    )
    .unwrap();
    assert_eq!(chunk(&first), FILE_BUFFER_SIZE);
    assert_eq!(
        get(&first, "dest").and_then(as_str),
        Some("web/files/index.html")
    );
    let rest = handle(
        &roots,
        &RF,
        "m",
        "_serve_file",
        &req("web/files/index.html", FILE_BUFFER_SIZE as u64),
    )
    .unwrap();
    assert_eq!(chunk(&rest), 300_000 - FILE_BUFFER_SIZE);
    let end = handle(
        &roots,
        &RF,
        "m",
        "_serve_file",
        &req("web/files/index.html", 300_000),
    )
    .unwrap();
    assert_eq!(
        chunk(&end),
        0,
        "past the end: empty data ends the minion's loop"
    );
    let none = envelope::map(vec![("data", s("")), ("dest", s(""))]);
    // Each refusal is counted: a path that is not clean, or one leading out of its root.
    let counted = Refusals::new();
    for bad in [
        "leak",
        "up/secret",
        "../secret",
        "/etc/passwd",
        "nothere.sls",
    ] {
        assert_eq!(
            handle(&roots, &counted, "m", "_serve_file", &req(bad, 0)).unwrap(),
            none,
            "{bad}"
        );
    }
    // leak and up/secret leave the root; ../secret and /etc/passwd are not clean; a missing
    // file is no refusal.
    assert_eq!(counted.get(Refused::FilePath), 4);
    // A saltenv that would leave an `__env__` root: refused before any path is built.
    let mut env_roots = roots.clone();
    env_roots.insert("__env__".into(), vec![dir.path().join("envs/__env__")]);
    let up = load(vec![
        ("path", s("top.sls")),
        ("saltenv", s("..")),
        ("loc", Value::from(0)),
    ]);
    assert_eq!(
        handle(&env_roots, &counted, "m", "_serve_file", &up).unwrap(),
        none
    );
    assert_eq!(counted.get(Refused::FilePath), 5);
    // ?saltenv= in the path is honoured, as Salt's find_file does
    let q = load(vec![
        ("path", s("top.sls?saltenv=base")),
        ("saltenv", s("dev")),
        ("loc", Value::from(0)),
    ]);
    assert_eq!(
        chunk(&handle(&roots, &RF, "m", "_serve_file", &q).unwrap()),
        23
    );
}

#[test]
fn hash_and_stat_match_the_file() {
    let (_d, roots) = tree();
    let req = |path: &str| load(vec![("path", s(path)), ("saltenv", s("base"))]);
    let h = handle(&roots, &RF, "m", "_file_hash", &req("top.sls")).unwrap();
    assert_eq!(get(&h, "hash_type").and_then(as_str), Some("sha256"));
    let want = saltgate_wire::hex(&Sha256::digest(b"base:\n  '*':\n    - web\n"));
    assert_eq!(get(&h, "hsum").and_then(as_str), Some(want.as_str()));
    assert_eq!(
        handle(&roots, &RF, "m", "_file_hash", &req("leak")).unwrap(),
        s("")
    );
    let hs = handle(&roots, &RF, "m", "_file_hash_and_stat", &req("top.sls")).unwrap();
    let Value::Array(a) = hs else { panic!() };
    let Value::Array(st) = &a[1] else {
        panic!("{:?}", a[1])
    };
    assert_eq!(st.len(), 10);
    assert_eq!(st[6].as_i64(), Some(23), "st_size");
    let missing = handle(&roots, &RF, "m", "_file_hash_and_stat", &req("x")).unwrap();
    assert_eq!(missing, Value::Array(vec![s(""), Value::Nil]));
}

#[test]
fn env_template_substitutes_only_safe_names() {
    let mut roots = Roots::new();
    roots.insert("__env__".into(), vec![PathBuf::from("/srv/__env__/salt")]);
    assert_eq!(
        env_roots(&roots, "dev"),
        vec![PathBuf::from("/srv/dev/salt")]
    );
    for bad in ["..", "a/b", "", "x\0"] {
        assert!(env_roots(&roots, bad).is_empty(), "{bad:?}");
    }
}

#[test]
fn master_opts_has_salts_keys() {
    let (_d, roots) = tree();
    let full = handle(&roots, &RF, "m", "_master_opts", &load(vec![])).unwrap();
    assert_eq!(
        get(&full, "state_top").and_then(as_str),
        Some("salt://top.sls")
    );
    assert_eq!(get(&full, "renderer").and_then(as_str), Some("jinja|yaml"));
    let Some(Value::Map(fr)) = get(&full, "file_roots") else {
        panic!()
    };
    assert_eq!(fr, &vec![(s("base"), Value::Array(vec![]))]);
    let only = handle(
        &roots,
        &RF,
        "m",
        "_master_opts",
        &load(vec![("env_only", Value::Boolean(true))]),
    )
    .unwrap();
    let Value::Map(m) = only else { panic!() };
    assert_eq!(m.len(), 4);
}
