//! Splits an HAProxy configuration into sections of tokenised lines.
//!
//! Tokens are separated by blanks; `#` starts a comment; `"..."` and `'...'` quote; `\` escapes the
//! next character. Indentation carries no meaning, as in HAProxy.

/// One directive: its 1-based line number and its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub no: u32,
    pub words: Vec<String>,
}

impl Line {
    pub fn word(&self, i: usize) -> Option<&str> {
        self.words.get(i).map(String::as_str)
    }
}

/// Tokenises one line. Errors name the column of an unterminated quote.
pub fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<(char, usize)> = None;
    let mut chars = line.char_indices();
    while let Some((i, ch)) = chars.next() {
        match (quote, ch) {
            (Some((q, _)), c) if c == q => quote = None,
            (Some(('"', _)), '\\') | (None, '\\') => {
                if let Some((_, next)) = chars.next() {
                    cur.push(next);
                }
                in_word = true;
            }
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some((ch, i + 1));
                in_word = true;
            }
            (None, '#') => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some((q, col)) = quote {
        return Err(format!("unterminated {q} quote starting at column {col}"));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_comments_quotes_and_escapes() {
        assert_eq!(
            tokenize("  server a 1.2.3.4:5 check # c").unwrap(),
            ["server", "a", "1.2.3.4:5", "check"]
        );
        assert_eq!(
            tokenize(r#"description "two words" x\ y"#).unwrap(),
            ["description", "two words", "x y"]
        );
        assert_eq!(tokenize("log 'a#b'").unwrap(), ["log", "a#b"]);
        assert!(tokenize("description \"open")
            .unwrap_err()
            .contains("column 13"));
        assert!(tokenize("   # only a comment").unwrap().is_empty());
    }
}
