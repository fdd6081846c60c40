//! Leftmost-longest search for a fixed set of literal token strings (special tokens, added
//! tokens, chat control tokens).

use std::collections::HashMap;

/// A compiled set of literal strings with the id of each.
#[derive(Debug, Clone)]
pub(crate) struct LiteralSet {
    /// Alternation of the escaped literals, longest first, so that leftmost-first search is
    /// leftmost-longest. `None` when the set is empty.
    re: Option<regex::Regex>,
    ids: HashMap<String, u32>,
}

/// One occurrence: byte range and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    pub start: usize,
    pub end: usize,
    pub id: u32,
}

impl LiteralSet {
    /// The empty set.
    pub(crate) fn empty() -> Self {
        LiteralSet {
            re: None,
            ids: HashMap::new(),
        }
    }

    /// Build from `(text, id)` pairs; empty strings are ignored. Fails only if the alternation
    /// exceeds the regex size limit (reported as a string for the caller to wrap).
    pub(crate) fn new<'a>(items: impl IntoIterator<Item = (&'a str, u32)>) -> Result<Self, String> {
        let ids: HashMap<String, u32> = items
            .into_iter()
            .filter(|(s, _)| !s.is_empty())
            .map(|(s, id)| (s.to_owned(), id))
            .collect();
        if ids.is_empty() {
            return Ok(LiteralSet { re: None, ids });
        }
        let mut keys: Vec<&str> = ids.keys().map(String::as_str).collect();
        keys.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        let pattern = keys
            .iter()
            .map(|k| regex::escape(k))
            .collect::<Vec<_>>()
            .join("|");
        let re = regex::RegexBuilder::new(&pattern)
            .size_limit(1 << 26)
            .build()
            .map_err(|e| format!("cannot compile the special-token matcher: {e}"))?;
        Ok(LiteralSet { re: Some(re), ids })
    }

    /// The id of an exact member.
    pub(crate) fn get(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The leftmost-longest occurrence starting at or after byte `pos`.
    pub(crate) fn find_at(&self, text: &str, pos: usize) -> Option<Found> {
        let m = self.re.as_ref()?.find_at(text, pos)?;
        let id = *self.ids.get(m.as_str())?;
        Some(Found {
            start: m.start(),
            end: m.end(),
            id,
        })
    }

    /// Whether `text` contains any member.
    pub(crate) fn is_match(&self, text: &str) -> bool {
        self.re.as_ref().is_some_and(|re| re.is_match(text))
    }

    /// All non-overlapping leftmost-longest occurrences.
    pub(crate) fn find_iter<'s>(&'s self, text: &'s str) -> impl Iterator<Item = Found> + 's {
        let mut pos = 0;
        std::iter::from_fn(move || {
            let f = self.find_at(text, pos)?;
            pos = f.end;
            Some(f)
        })
    }

    /// The member strings (unordered).
    pub(crate) fn strings(&self) -> impl Iterator<Item = &str> {
        self.ids.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let set = LiteralSet::new([("<a>", 1), ("<a>b", 2), ("b<", 3)]).unwrap();
        let found: Vec<_> = set.find_iter("x<a>b<a>").map(|f| (f.start, f.id)).collect();
        assert_eq!(found, vec![(1, 2), (5, 1)]);
        assert!(LiteralSet::new([("", 1)]).unwrap().find_at("abc", 0).is_none());
    }
}
