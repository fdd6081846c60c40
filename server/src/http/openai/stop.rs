//! Stop strings on detokenized text (pure). Text that could still turn into a stop string is
//! held back, so a partial stop string is never emitted; once one matches, the text before it
//! is the last output and generation ends.

/// Matches any of a set of stop strings across pushes.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Default::default()
        }
    }

    /// Whether a stop string has matched.
    pub fn matched(&self) -> bool {
        self.matched
    }

    /// Add text; returns what may be emitted now. After a match it returns nothing.
    pub fn push(&mut self, text: &str) -> String {
        if self.matched {
            return String::new();
        }
        if self.stops.is_empty() {
            return text.to_string();
        }
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.matched = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = self
            .stops
            .iter()
            .map(|s| self.partial_suffix(s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// Longest proper prefix of `stop` that the held text ends with (on character boundaries).
    fn partial_suffix(&self, stop: &str) -> usize {
        (1..stop.len())
            .rev()
            .filter(|&k| stop.is_char_boundary(k))
            .find(|&k| self.held.ends_with(&stop[..k]))
            .unwrap_or(0)
    }

    /// End of output: the held text is released (it did not become a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let emitted = m.push(p);
            // Nothing emitted may end in a way that is later revealed to be a stop string.
            out.push_str(&emitted);
            for s in stops.iter().filter(|s| !s.is_empty()) {
                assert!(!out.contains(s), "emitted a stop string: {out:?}");
            }
        }
        if !m.matched() {
            out.push_str(&m.finish());
        }
        (out, m.matched())
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_never_emitted() {
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
        assert_eq!(run(&["END"], &["abc E", "N", "x"]), ("abc ENx".into(), false));
        assert_eq!(run(&["END"], &["abc EN"]), ("abc EN".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["xyz", "b"], &["aaxy", "zb"]), ("aa".into(), true));
        assert_eq!(run(&["\n\n", "."], &["one\n", "\ntwo."]), ("one".into(), true));
    }

    #[test]
    fn partial_prefixes_are_held_only_while_they_can_match() {
        let mut m = StopMatcher::new(vec!["stop".into()]);
        assert_eq!(m.push("non-st"), "non-");
        assert_eq!(m.push("x"), "stx");
        assert_eq!(m.push("s"), "");
        assert_eq!(m.push("top"), "");
        assert!(m.matched());
        assert_eq!(m.push("more"), "");
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
        assert_eq!(run(&["日本"], &["今日", "は日", "本"]), ("今日は".into(), true));
        assert_eq!(run(&["🙂x"], &["a🙂", "b"]), ("a🙂b".into(), false));
    }

    #[test]
    fn no_stops_pass_everything_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    }
}
