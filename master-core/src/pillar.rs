//! Pillar data for `_pillar`: `top.sls` plus plain-YAML `.sls` files from `pillar_roots`.
//!
//! Only the `base` environment; `top.sls` maps glob targets to lists of sls names
//! (`{base: {'*': [common], 'web*': [web]}}`); `a.b` is `a/b.sls` or `a/b/init.sls`; maps are
//! merged deeply in listed order. Jinja and other renderers are not supported: a file holding
//! `{%` or `{{` is skipped with a warning. No roots or no `top.sls` gives an empty pillar.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::target::glob_match;

fn read_yaml(path: &Path) -> Option<Json> {
    let text = std::fs::read_to_string(path).ok()?;
    if text.contains("{%") || text.contains("{{") {
        tracing::warn!(path = %path.display(), "pillar file uses a template; renderers are not supported, skipped");
        return None;
    }
    if text.trim().is_empty() {
        return Some(Json::Object(Map::new()));
    }
    match serde_saphyr::from_str::<Json>(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "pillar file is not valid YAML, skipped");
            None
        }
    }
}

fn safe_sls(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_'))
        })
}

fn sls_path(roots: &[PathBuf], name: &str) -> Option<PathBuf> {
    if !safe_sls(name) {
        tracing::warn!(sls = name, "pillar sls name refused");
        return None;
    }
    let rel: PathBuf = name.split('.').collect();
    for root in roots {
        let file = root.join(&rel).with_extension("sls");
        if file.is_file() {
            return Some(file);
        }
        let init = root.join(&rel).join("init.sls");
        if init.is_file() {
            return Some(init);
        }
    }
    None
}

fn merge(into: &mut Json, from: Json) {
    match (into, from) {
        (Json::Object(a), Json::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (slot, other) => *slot = other,
    }
}

/// The pillar of minion `id` from `roots` (the `base` environment's directories).
pub fn compile(roots: &[PathBuf], id: &str) -> Json {
    let mut out = Json::Object(Map::new());
    let Some(top) = roots
        .iter()
        .map(|r| r.join("top.sls"))
        .find(|p| p.is_file())
        .and_then(|p| read_yaml(&p))
    else {
        return out;
    };
    let Some(Json::Object(base)) = top.get("base").cloned() else {
        return out;
    };
    for (tgt, names) in base {
        if !glob_match(&tgt, id) {
            continue;
        }
        let Json::Array(names) = names else { continue };
        for n in names {
            let Some(name) = n.as_str() else { continue };
            if let Some(v) = sls_path(roots, name).and_then(|p| read_yaml(&p)) {
                if v.is_object() {
                    merge(&mut out, v);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_targets_pick_and_merge_sls_files() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::write(
            r.join("top.sls"),
            "base:\n  '*':\n    - common\n  'web*':\n    - web.site\n",
        )
        .unwrap();
        std::fs::write(r.join("common.sls"), "a: 1\nnested: {x: 1, y: 2}\n").unwrap();
        std::fs::create_dir_all(r.join("web/site")).unwrap();
        std::fs::write(r.join("web/site/init.sls"), "nested: {y: 3}\nrole: web\n").unwrap();
        let roots = vec![r.to_path_buf()];
        assert_eq!(
            compile(&roots, "web1"),
            serde_json::json!({"a": 1, "nested": {"x": 1, "y": 3}, "role": "web"})
        );
        assert_eq!(
            compile(&roots, "db1"),
            serde_json::json!({"a": 1, "nested": {"x": 1, "y": 2}})
        );
    }

    #[test]
    fn missing_roots_templates_and_path_tricks_give_nothing() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            compile(&[d.path().join("none")], "m"),
            serde_json::json!({})
        );
        std::fs::write(
            d.path().join("top.sls"),
            "base:\n  '*': [evil, '..x', tpl]\n",
        )
        .unwrap();
        std::fs::write(d.path().join("tpl.sls"), "a: {{ grains.id }}\n").unwrap();
        assert_eq!(
            compile(&[d.path().to_path_buf()], "m"),
            serde_json::json!({})
        );
    }
}
