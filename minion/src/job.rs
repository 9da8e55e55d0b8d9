//! A job as the master publishes it, Salt's targeting (which minions run it), and the jid
//! de-duplication queue. Pure: no I/O.
//!
//! Targeting follows Salt's matchers (`salt/matchers/`): `glob` is `fnmatch` on the id,
//! `pcre` is `re.match` (anchored at the start only), `list` is a list or a comma-separated
//! string, `grain` is `key:glob` through nested grains (case-insensitive, as Salt's
//! `subdict_match`). Other target types (compound, nodegroup, ...) do not match: the master
//! only uses them when asked to, and a wrong "yes" would run a command where it must not.

use std::collections::VecDeque;

use saltgate_wire::envelope::{self, Value};

/// The fields of a publish we use (Salt requires `tgt`, `jid`, `fun`, `arg`).
#[derive(Debug, Clone)]
pub struct Job {
    pub jid: String,
    pub fun: String,
    pub arg: Vec<Value>,
    pub tgt: Value,
    pub tgt_type: String,
    pub user: Option<Value>,
    pub metadata: Option<Value>,
    pub master_id: Option<Value>,
    pub ret: Value,
    pub delimiter: String,
}

impl Job {
    /// Reads a decrypted publish; `None` if a required field is missing (Salt ignores those).
    pub fn parse(load: &Value) -> Option<Job> {
        let s = |k: &str| envelope::get(load, k).and_then(envelope::as_str);
        let arg = match envelope::get(load, "arg")? {
            Value::Array(a) => a.clone(),
            Value::Nil => Vec::new(),
            other => vec![other.clone()],
        };
        Some(Job {
            jid: s("jid")?.to_owned(),
            fun: s("fun")?.to_owned(),
            arg,
            tgt: envelope::get(load, "tgt")?.clone(),
            tgt_type: s("tgt_type").unwrap_or("glob").to_owned(),
            user: envelope::get(load, "user").cloned(),
            metadata: envelope::get(load, "metadata")
                .filter(|m| m.is_map())
                .cloned(),
            master_id: envelope::get(load, "master_id").cloned(),
            ret: envelope::get(load, "ret").cloned().unwrap_or(Value::Nil),
            delimiter: s("delimiter").unwrap_or(":").to_owned(),
        })
    }

    /// Whether this minion (`id`, `grains`) is targeted.
    pub fn targets(&self, id: &str, grains: impl FnOnce() -> Value) -> bool {
        match self.tgt_type.as_str() {
            "glob" => envelope::as_str(&self.tgt).is_some_and(|t| fnmatch(t, id)),
            "pcre" => envelope::as_str(&self.tgt).is_some_and(|t| {
                regex::Regex::new(&format!("^(?:{t})")).is_ok_and(|re| re.is_match(id))
            }),
            "list" => match &self.tgt {
                Value::Array(items) => items.iter().any(|i| envelope::as_str(i) == Some(id)),
                v => envelope::as_str(v).is_some_and(|t| t.split(',').any(|x| x.trim() == id)),
            },
            "grain" => envelope::as_str(&self.tgt)
                .is_some_and(|t| subdict_match(&grains(), t, &self.delimiter)),
            _ => false,
        }
    }
}

/// Python's `fnmatch.fnmatch` on POSIX (case-sensitive): `*`, `?`, `[seq]`, `[!seq]`.
pub fn fnmatch(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matcher with backtracking to the last `*`.
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => match class(&p, pi, n[ni]) {
                Some((true, end)) => Some(end),
                Some((false, _)) => None,
                // An unclosed `[` is a literal, as in Python.
                None => (n[ni] == '[').then_some(pi + 1),
            },
            Some(c) => (*c == n[ni]).then_some(pi + 1),
            None => None,
        };
        match step {
            Some(next) => {
                pi = next;
                ni += 1;
            }
            None => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns (matched, index after `]`).
fn class(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let ch = *p.get(i)?;
        if ch == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|e| *e != ']') {
            let end = p[i + 2];
            if ch <= c && c <= end {
                matched = true;
            }
            i += 3;
        } else {
            if ch == c {
                matched = true;
            }
            i += 1;
        }
    }
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::String(_) | Value::Binary(_) => envelope::as_str(v).map(str::to_owned),
        Value::Integer(i) => Some(i.to_string()),
        Value::F64(f) => Some(f.to_string()),
        Value::F32(f) => Some(f.to_string()),
        Value::Boolean(b) => Some(if *b { "True".into() } else { "False".into() }),
        _ => None,
    }
}

/// Salt's `subdict_match`: `a:b:glob` walks nested maps; lists match if any element does.
pub fn subdict_match(data: &Value, target: &str, delimiter: &str) -> bool {
    let parts: Vec<&str> = target.split(delimiter).collect();
    // Try every split between the key path and the pattern (a pattern may contain the delimiter).
    for i in 1..parts.len() {
        let pattern = parts[i..].join(delimiter);
        let mut node = data;
        let mut found = true;
        for key in &parts[..i] {
            match envelope::get(node, key) {
                Some(n) => node = n,
                None => {
                    found = false;
                    break;
                }
            }
        }
        if found && value_matches(node, &pattern) {
            return true;
        }
    }
    false
}

fn value_matches(v: &Value, pattern: &str) -> bool {
    let pat = pattern.to_lowercase();
    match v {
        Value::Array(items) => items.iter().any(|i| value_matches(i, pattern)),
        Value::Map(entries) => entries
            .iter()
            .any(|(k, _)| envelope::as_str(k).is_some_and(|k| fnmatch(&pat, &k.to_lowercase()))),
        other => value_text(other).is_some_and(|t| fnmatch(&pat, &t.to_lowercase())),
    }
}

/// The last `hwm` jids seen (Salt's `minion_jid_queue_hwm`): a publish seen twice (hot
/// multi-master with a shared job bus, or a replay) runs once.
#[derive(Debug, Default)]
pub struct JidQueue {
    hwm: usize,
    seen: VecDeque<Box<str>>,
}

impl JidQueue {
    pub fn new(hwm: usize) -> Self {
        JidQueue {
            hwm: hwm.max(1),
            seen: VecDeque::new(),
        }
    }

    /// Records `jid`; false if it was already there.
    pub fn insert(&mut self, jid: &str) -> bool {
        if self.seen.iter().any(|j| &**j == jid) {
            return false;
        }
        if self.seen.len() >= self.hwm {
            self.seen.pop_front();
        }
        self.seen.push_back(jid.into());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_wire::envelope::{map, text};

    #[test]
    fn fnmatch_behaves_like_python() {
        for (p, n, want) in [
            ("*", "web1", true),
            ("web*", "web1", true),
            ("web?", "web12", false),
            ("w[a-f]b1", "web1", true),
            ("w[!e]b1", "web1", false),
            ("*1", "web1", true),
            ("*x*", "web1", false),
            ("", "", true),
            ("[", "[", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
        ] {
            assert_eq!(fnmatch(p, n), want, "{p} vs {n}");
        }
    }

    fn job(tgt: Value, tgt_type: &str) -> Job {
        Job::parse(&map(vec![
            ("jid", text("1")),
            ("fun", text("test.ping")),
            ("arg", Value::Array(vec![])),
            ("tgt", tgt),
            ("tgt_type", text(tgt_type)),
        ]))
        .unwrap()
    }

    #[test]
    fn targeting_by_glob_list_pcre_and_grain() {
        let grains = || {
            map(vec![
                ("os", text("Debian")),
                ("roles", Value::Array(vec![text("web"), text("db")])),
                ("nested", map(vec![("k", text("v:w"))])),
            ])
        };
        let yes = |j: Job| assert!(j.targets("web1", grains), "{j:?}");
        let no = |j: Job| assert!(!j.targets("web1", grains), "{j:?}");
        yes(job(text("web*"), "glob"));
        no(job(text("db*"), "glob"));
        yes(job(Value::Array(vec![text("a"), text("web1")]), "list"));
        yes(job(text("a,web1"), "list"));
        no(job(text("web"), "list"));
        yes(job(text("w.b"), "pcre"));
        no(job(text("eb"), "pcre"));
        yes(job(text("os:debian"), "grain"));
        yes(job(text("roles:db"), "grain"));
        yes(job(text("nested:k:v:*"), "grain"));
        no(job(text("os:Ubuntu"), "grain"));
        no(job(text("web1"), "compound"));
    }

    #[test]
    fn jobs_without_required_fields_are_ignored() {
        assert!(Job::parse(&map(vec![("fun", text("test.ping"))])).is_none());
    }

    #[test]
    fn jid_queue_drops_duplicates_and_forgets_beyond_hwm() {
        let mut q = JidQueue::new(2);
        assert!(q.insert("a"));
        assert!(!q.insert("a"));
        assert!(q.insert("b"));
        assert!(q.insert("c"));
        assert!(q.insert("a"), "a was pushed out by the high-water mark");
    }
}
