//! Targeting the master does to know which minions should answer: `glob`, `list`, `pcre`
//! against accepted key ids. The minions match again themselves (Salt's model).

/// fnmatch-style glob: `*`, `?`, `[abc]`, `[a-z]`, `[!abc]`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_at(&p, &t)
}

/// `salt-key`'s reading of a name argument: several globs joined by commas (`'web*,db1'`); true
/// when any of them matches `text`.
pub fn any_glob_match(globs: &str, text: &str) -> bool {
    globs.split(',').any(|g| glob_match(g, text))
}

fn glob_at(p: &[char], t: &[char]) -> bool {
    // Iterative with single-star backtracking: linear in practice, no recursion blow-up.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
                continue;
            }
            Some('?') => {
                pi += 1;
                ti += 1;
                continue;
            }
            Some('[') => {
                if let Some((matched, next)) = class_match(p, pi, t[ti]) {
                    if matched {
                        pi = next;
                        ti += 1;
                        continue;
                    }
                } else if t[ti] == '[' {
                    pi += 1;
                    ti += 1;
                    continue;
                }
            }
            Some(c) if *c == t[ti] => {
                pi += 1;
                ti += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns (matched, index after
/// the class), or `None` for an unterminated class (then `[` is literal).
fn class_match(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while let Some(&pc) = p.get(i) {
        if pc == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|e| *e != ']') {
            let hi = p[i + 2];
            if pc <= c && c <= hi {
                matched = true;
            }
            i += 3;
        } else {
            if pc == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

/// Salt's target types we support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetType {
    Glob,
    List,
    Pcre,
}

impl TargetType {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "glob" => Some(TargetType::Glob),
            "list" => Some(TargetType::List),
            "pcre" => Some(TargetType::Pcre),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            TargetType::Glob => "glob",
            TargetType::List => "list",
            TargetType::Pcre => "pcre",
        }
    }
}

/// A compiled target.
#[derive(Debug, Clone)]
pub enum Target {
    Glob(String),
    List(Vec<String>),
    Pcre(regex::Regex),
}

impl Target {
    /// Compiles `tgt` as `kind`; an invalid regular expression is an error naming it.
    pub fn new(kind: TargetType, tgt: &str) -> Result<Self, String> {
        Ok(match kind {
            TargetType::Glob => Target::Glob(tgt.to_string()),
            TargetType::List => Target::List(
                tgt.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            ),
            // Salt: `re.match(tgt, id)`: anchored at the start only.
            TargetType::Pcre => Target::Pcre(
                regex::RegexBuilder::new(&format!("^(?:{tgt})"))
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("invalid pcre target {tgt:?}: {e}"))?,
            ),
        })
    }

    pub fn matches(&self, id: &str) -> bool {
        match self {
            Target::Glob(g) => glob_match(g, id),
            Target::List(l) => l.iter().any(|x| x == id),
            Target::Pcre(re) => re.is_match(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_fnmatch() {
        for (p, t, want) in [
            ("*", "anything", true),
            ("web*", "web1", true),
            ("web*", "db1", false),
            ("w?b1", "web1", true),
            ("web[0-9]", "web7", true),
            ("web[!0-9]", "web7", false),
            ("*.example.com", "a.example.com", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("[", "[", true),
            ("", "", true),
        ] {
            assert_eq!(glob_match(p, t), want, "{p} vs {t}");
        }
    }

    #[test]
    fn list_and_pcre_targets() {
        let l = Target::new(TargetType::List, "a, b,c").unwrap();
        assert!(l.matches("b") && !l.matches("d"));
        let r = Target::new(TargetType::Pcre, "web[0-9]").unwrap();
        assert!(
            r.matches("web1x"),
            "anchored at the start only, like re.match"
        );
        assert!(!r.matches("xweb1"));
        assert!(Target::new(TargetType::Pcre, "(").is_err());
    }
}
