//! Text from the network, made safe for a terminal: minion ids, client addresses and anything
//! else a peer chose, before a CLI prints it.
//!
//! A minion id is the minion's own choice; Salt refuses `/`, `\`, NUL and control characters in
//! one, but not Unicode's format characters. `U+202E` (right-to-left override) makes `evil` U+202E `gnp.exe`
//! display as `evilexe.png`; an escape sequence (`ESC [`) in a field could rewrite the screen. So
//! every CLI line that shows such text goes through [`terminal_safe`]: control characters (C0,
//! DEL, C1), bidi controls and invisible format characters become `\u{…}` escapes, and `\`
//! becomes `\\` (so an escape in the output cannot be forged by the input). Everything else,
//! accented letters and CJK included, is shown as is.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal raw.
pub fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Bidi: LRM, RLM, ALM; embeddings and overrides; isolates.
            '\u{200E}' | '\u{200F}' | '\u{061C}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                // Zero-width and invisible format characters, the BOM, line/paragraph separators.
                | '\u{200B}'..='\u{200D}'
                | '\u{2028}' | '\u{2029}'
                | '\u{2060}'..='\u{2064}'
                | '\u{FEFF}'
        )
}

/// `s` with every character [`is_unsafe_for_terminal`] written as `\u{hex}` and `\` as `\\`;
/// borrowed when there was nothing to escape.
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || is_unsafe_for_terminal(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if is_unsafe_for_terminal(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_and_control_characters_are_escaped_and_the_rest_is_kept() {
        for (raw, shown) in [
            ("web-01", "web-01"),
            ("évian-東京", "évian-東京"),
            ("evil\u{202E}gnp.exe", "evil\\u{202e}gnp.exe"),
            ("a\u{2066}b\u{2069}", "a\\u{2066}b\\u{2069}"),
            ("x\u{1b}[2Jy", "x\\u{1b}[2Jy"),
            ("tab\there", "tab\\u{9}here"),
            ("c1\u{9b}", "c1\\u{9b}"),
            ("zw\u{200B}j", "zw\\u{200b}j"),
            ("back\\u{202e}slash", "back\\\\u{202e}slash"),
        ] {
            assert_eq!(terminal_safe(raw), shown, "{raw:?}");
        }
        assert!(matches!(terminal_safe("plain"), Cow::Borrowed(_)));
    }
}
