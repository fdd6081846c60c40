//! Kimi's pre-tokenizer and input cuts (reference/model-formats.md §5.1).
//!
//! The pattern's first six alternatives run on the `regex` crate (which supports the `&&` class
//! intersections). The last two, `\s+(?!\S)|\s+`, need a look-ahead the crate lacks, so the
//! regex ends with a plain `\s+` and the look-ahead is applied afterwards: a whitespace run
//! matched by that last alternative that is followed by a non-space keeps all but its last
//! character (which then starts the next piece, e.g. `" word"`), unless it is one character long.
//! This is exactly the backtracking semantics of tiktoken's fancy-regex pattern.

/// The first six alternatives of Kimi's `pat_str`, then `\s+` for the last two.
const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+",
);

/// Characters per slice before any other cut (`TIKTOKEN_MAX_ENCODE_CHARS`).
const SLICE_CHARS: usize = 400_000;
/// Longest run of same-class (Python `str.isspace`) characters (`MAX_NO_WHITESPACES_CHARS`).
const RUN_CHARS: usize = 25_000;

/// The compiled Kimi pre-tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct KimiSplitter {
    re: regex::Regex,
}

impl KimiSplitter {
    /// Compile the pattern (a constant; an error here would be a build problem, reported as text).
    pub(crate) fn new() -> Result<Self, String> {
        let re = regex::RegexBuilder::new(KIMI_PATTERN)
            .size_limit(1 << 27)
            .dfa_size_limit(1 << 27)
            .build()
            .map_err(|e| format!("cannot compile the Kimi pre-tokenizer pattern: {e}"))?;
        Ok(KimiSplitter { re })
    }

    /// Call `f` on each piece of `text`, in order. Pieces cover `text` exactly.
    pub(crate) fn split<'t>(&self, text: &'t str, mut f: impl FnMut(&'t str)) {
        let mut pos = 0;
        while pos < text.len() {
            let Some(m) = self.re.find_at(text, pos) else {
                break;
            };
            let (start, mut end) = (m.start(), m.end());
            if end < text.len() && is_plain_space_run(m.as_str()) {
                // `\s+(?!\S)`: give the last whitespace char back to the following piece.
                if let Some((last, _)) = m.as_str().char_indices().last()
                    && last > 0
                {
                    end = start + last;
                }
            }
            f(&text[start..end]);
            pos = end;
        }
    }
}

/// A match of the final `\s+` alternative: all whitespace, not ending in CR/LF (a whitespace
/// match ending in CR/LF comes from `\s*[\r\n]+`, and `\s+` is only reached without CR/LF).
fn is_plain_space_run(s: &str) -> bool {
    !s.ends_with(['\r', '\n']) && s.chars().all(char::is_whitespace)
}

/// Python's `str.isspace()` for one character: Unicode White_Space plus U+001C..U+001F.
pub(crate) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Kimi's cuts: 400,000-char slices, each split so that no run of characters agreeing on
/// `str.isspace()` is longer than 25,000. Calls `f(start, end)` with byte offsets, in order;
/// for empty `text` it calls nothing.
pub(crate) fn for_each_cut(text: &str, mut f: impl FnMut(usize, usize)) {
    if text.is_empty() {
        return;
    }
    let mut in_slice = 0usize;
    let mut sub_start = 0usize;
    let mut run = 0usize;
    let mut run_space = false;
    for (i, c) in text.char_indices() {
        if in_slice == SLICE_CHARS {
            f(sub_start, i);
            sub_start = i;
            in_slice = 0;
        }
        let space = py_isspace(c);
        if in_slice == 0 {
            run_space = space;
            run = 0;
        }
        if space != run_space {
            run = 1;
            run_space = space;
        } else {
            run += 1;
            if run > RUN_CHARS {
                f(sub_start, i);
                sub_start = i;
                run = 1;
            }
        }
        in_slice += 1;
    }
    f(sub_start, text.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        let s = KimiSplitter::new().unwrap();
        let mut out = Vec::new();
        s.split(text, |p| out.push(p));
        out
    }

    #[test]
    fn whitespace_lookahead() {
        assert_eq!(pieces("a   b"), vec!["a", "  ", " b"]);
        assert_eq!(pieces("a b"), vec!["a", " b"]);
        assert_eq!(pieces("a  "), vec!["a", "  "]);
        assert_eq!(pieces("x \n y"), vec!["x", " \n", " y"]);
        assert_eq!(
            pieces("I'm 我们 12345"),
            vec!["I'm", " ", "我们", " ", "123", "45"]
        );
    }

    #[test]
    fn cuts_long_runs() {
        let text = "a".repeat(50_001);
        let mut cuts = Vec::new();
        for_each_cut(&text, |a, b| cuts.push((a, b)));
        assert_eq!(cuts, vec![(0, 25_000), (25_000, 50_000), (50_000, 50_001)]);
        assert!(py_isspace('\u{1c}') && !py_isspace('\u{200b}'));
    }
}
