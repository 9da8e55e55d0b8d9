//! A YAML document read into a plain tree of nodes, each with its line, column and source text.
//!
//! saltgate's YAML loader validates this tree by hand instead of deserializing straight into typed
//! structs: serde stops at the first wrong type, unknown key or duplicate key, and the operator
//! should see every problem of a file in one run. Owns only the reading; [`crate::yaml`] decides
//! what is valid.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::{DuplicateKeyPolicy, Spanned};

/// One YAML node and where it was written.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub kind: Kind,
    /// 1-based; 0 when unknown.
    pub line: u32,
    pub column: u32,
    /// The node as written (quotes included), when the parser knows it; empty otherwise.
    pub source: String,
}

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in file order, duplicates kept (so they can be reported with both lines).
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// What kind of value this is, in the words of an error message.
    pub fn describe(&self) -> &'static str {
        match self.kind {
            Kind::Null => "no value",
            Kind::Bool(_) => "a true/false value",
            Kind::Int(_) => "a number",
            Kind::Float(_) => "a decimal number",
            Kind::Str(_) => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    /// The value for an error message: the scalar quoted, or what kind of value it is.
    pub fn shown(&self) -> String {
        self.scalar_text()
            .map(|t| format!("{t:?}"))
            .unwrap_or_else(|| self.describe().to_string())
    }

    /// Written in quotes (`"4505"`, `'x'`).
    pub fn quoted(&self) -> bool {
        self.source.starts_with('"') || self.source.starts_with('\'')
    }

    /// The scalar as text: a string's value, a number as written. `None` for null, lists, mappings.
    pub fn scalar_text(&self) -> Option<String> {
        match &self.kind {
            Kind::Str(s) => Some(s.clone()),
            Kind::Int(_) | Kind::Float(_) | Kind::Bool(_) if !self.source.trim().is_empty() => {
                Some(self.source.trim().to_string())
            }
            Kind::Int(n) => Some(n.to_string()),
            Kind::Float(f) => Some(f.to_string()),
            Kind::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }
}

/// The value half of a node, as serde hands it over (positions come from [`Spanned`]).
struct Value(Kind);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value(Kind::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value(Kind::Int(v.into())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value(Kind::Int(v.into())))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        Ok(Value(Kind::Int(v)))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        Ok(Value(Kind::Int(i128::try_from(v).unwrap_or(i128::MAX))))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value(Kind::Float(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value(Kind::Str(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value(Kind::Str(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value(Kind::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value(Kind::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Spanned<Value>>()? {
            out.push(v);
        }
        Ok(Value(Kind::Seq(out.into_iter().map(raw_node).collect())))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(k) = map.next_key::<Spanned<Value>>()? {
            let v = map.next_value::<Spanned<Value>>()?;
            out.push((raw_node(k), raw_node(v)));
        }
        Ok(Value(Kind::Map(out)))
    }
}

/// A node without its source text yet (filled in by [`attach_source`]).
fn raw_node(s: Spanned<Value>) -> Node {
    let span = s.referenced.span();
    let source = match (span.byte_offset(), span.byte_len()) {
        (Some(o), Some(l)) => format!("\u{0}{o}:{l}"),
        _ => String::new(),
    };
    Node {
        kind: s.value.0,
        line: clamp(s.referenced.line()),
        column: clamp(s.referenced.column()),
        source,
    }
}

/// Replaces the byte ranges recorded by [`raw_node`] with the text they cover.
fn attach_source(n: &mut Node, text: &str) {
    if let Some((o, l)) = n
        .source
        .strip_prefix('\u{0}')
        .and_then(|r| r.split_once(':'))
        .and_then(|(o, l)| Some((o.parse::<usize>().ok()?, l.parse::<usize>().ok()?)))
    {
        n.source = text
            .get(o..o.saturating_add(l))
            .unwrap_or_default()
            .to_string();
    } else {
        n.source.clear();
    }
    match &mut n.kind {
        Kind::Seq(items) => items.iter_mut().for_each(|i| attach_source(i, text)),
        Kind::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
            attach_source(k, text);
            attach_source(v, text);
        }),
        _ => {}
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads a YAML document into a tree. Fails only on YAML syntax (and on resource limits): wrong
/// types, unknown keys and duplicate keys are left for the validator to report, all of them.
pub(crate) fn read(text: &str) -> Result<Node, serde_saphyr::Error> {
    let options = serde_saphyr::options! {
        duplicate_keys: DuplicateKeyPolicy::PassThrough,
    };
    let root: Spanned<Value> = serde_saphyr::from_str_with_options(text, options)?;
    let mut node = raw_node(root);
    attach_source(&mut node, text);
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(n: &Node) -> &Vec<(Node, Node)> {
        match &n.kind {
            Kind::Map(m) => m,
            k => panic!("not a map: {k:?}"),
        }
    }

    #[test]
    fn scalars_keep_their_kind_position_and_source() {
        let t = "a: 1\nb: \"4505\"\nc: ~\nd: -3\ne: abc\nf: true\ng: 2.5\n";
        let root = read(t).unwrap();
        let m = map(&root);
        let got: Vec<_> = m
            .iter()
            .map(|(k, v)| {
                (
                    k.scalar_text().unwrap(),
                    v.describe(),
                    v.line,
                    v.column,
                    v.source.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), "a number", 1, 4, "1".into()),
                ("b".into(), "a string", 2, 4, "\"4505\"".into()),
                ("c".into(), "no value", 3, 4, "~".into()),
                ("d".into(), "a number", 4, 4, "-3".into()),
                ("e".into(), "a string", 5, 4, "abc".into()),
                ("f".into(), "a true/false value", 6, 4, "true".into()),
                ("g".into(), "a decimal number", 7, 4, "2.5".into()),
            ]
        );
        assert!(m[1].1.quoted());
        assert!(!m[0].1.quoted());
    }

    #[test]
    fn duplicate_keys_are_kept_for_the_validator() {
        let root = read("a: 1\nb: 2\na: 3\n").unwrap();
        let m = map(&root);
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].0.line, m[2].0.line), (1, 3));
    }

    #[test]
    fn nested_nodes_have_positions() {
        let root = read("masters:\n  - name: a\n    host: h\n").unwrap();
        let (_, seq) = &map(&root)[0];
        let Kind::Seq(items) = &seq.kind else {
            panic!()
        };
        let (k, v) = &map(&items[0])[1];
        assert_eq!((k.line, v.line, v.column), (3, 3, 11));
    }
}
