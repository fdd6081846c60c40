//! One response's output text (pure): token ids → reasoning split → UTF-8-safe detokenization
//! per channel → stop strings on the answer. Special tokens are never shown. Stop strings apply
//! to `content` (the answer; all text for completions), not to `reasoning_content`.

use std::sync::Arc;

use deltafin_engine::tokenizer::{IncrementalDecoder, Tokenizer};

use super::reasoning::{Channel, Markers, ReasoningSplit, Route, ThinkMarkers, XtmlMarkers};
use super::stop::StopMatcher;

/// Text produced by one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub reasoning: String,
    pub content: String,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    /// Append `other`.
    pub fn extend(&mut self, other: Delta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

/// The output state machine of one response.
#[derive(Debug)]
pub struct OutputParser {
    tokenizer: Arc<Tokenizer>,
    split: ReasoningSplit,
    reasoning: IncrementalDecoder,
    content: IncrementalDecoder,
    stop: StopMatcher,
}

impl OutputParser {
    /// `markers`: how the chat format marks thinking (chat only); `prompt`: the rendered prompt.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        markers: Option<Markers>,
        prompt: &[u32],
        stops: Vec<String>,
    ) -> Self {
        OutputParser {
            split: ReasoningSplit::new(markers, prompt),
            reasoning: IncrementalDecoder::new(tokenizer.clone()),
            content: IncrementalDecoder::new(tokenizer.clone()),
            stop: StopMatcher::new(stops),
            tokenizer,
        }
    }

    /// Whether a stop string ended the output.
    pub fn stopped(&self) -> bool {
        self.stop.matched()
    }

    /// Add one generated token.
    pub fn push(&mut self, id: u32) -> Delta {
        let mut d = Delta::default();
        if self.stopped() {
            return d;
        }
        match self.split.route(id, self.tokenizer.is_special(id)) {
            Route::Hidden => self.flush_into(&mut d),
            Route::Text(Channel::Reasoning) => d.reasoning.extend(self.reasoning.push(id)),
            Route::Text(Channel::Content) => {
                if let Some(text) = self.content.push(id) {
                    d.content = self.stop.push(&text);
                }
            }
        }
        d
    }

    /// Complete pending characters (at a marker, a hidden token, or the end).
    fn flush_into(&mut self, d: &mut Delta) {
        d.reasoning.extend(self.reasoning.flush());
        if let Some(text) = self.content.flush() {
            d.content.push_str(&self.stop.push(&text));
        }
    }

    /// The end of generation: everything still held back.
    pub fn finish(&mut self) -> Delta {
        let mut d = Delta::default();
        if !self.stopped() {
            self.flush_into(&mut d);
            d.content.push_str(&self.stop.finish());
        }
        d
    }
}

/// How a tokenizer's chat format marks thinking: XTML (`<|open|>`, `<|close|>`, `<|sep|>`
/// specials, Kimi K3) or `<think>` / `</think>` specials (Kimi K2, DeepSeek-R1); `None` if
/// neither.
pub fn reasoning_markers(tokenizer: &Tokenizer) -> Option<Markers> {
    let id = |t: &str| tokenizer.token_to_id(t).filter(|&id| tokenizer.is_special(id));
    if let (Some(open), Some(close), Some(sep)) = (id("<|open|>"), id("<|close|>"), id("<|sep|>")) {
        let (think, response) = (tokenizer.encode("think"), tokenizer.encode("response"));
        return Some(Markers::Xtml(XtmlMarkers {
            open,
            close,
            sep,
            think,
            response,
        }));
    }
    Some(Markers::Think(ThinkMarkers {
        open: id("<think>")?,
        close: id("</think>")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> (tempfile::TempDir, Arc<Tokenizer>) {
        let dir = tempfile::tempdir().unwrap();
        deltafin_engine::synth::write_byte_tokenizer(dir.path()).unwrap();
        let t = Tokenizer::from_dir(dir.path()).unwrap();
        (dir, Arc::new(t))
    }

    fn run(p: &mut OutputParser, ids: &[u32]) -> Delta {
        let mut all = Delta::default();
        for &id in ids {
            all.extend(p.push(id));
        }
        all.extend(p.finish());
        all
    }

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn thinking_goes_to_reasoning_and_specials_are_hidden() {
        let (_d, tok) = tokenizer();
        let Some(Markers::Think(m)) = reasoning_markers(&tok) else {
            panic!("K2 byte tokenizer has <think> markers")
        };
        let eos = tok.eos_id().unwrap();
        let mut ids = vec![m.open];
        ids.extend(bytes("let me think é"));
        ids.push(m.close);
        ids.extend(bytes("answer <think> literal"));
        ids.push(eos);
        let d = run(
            &mut OutputParser::new(tok.clone(), Some(Markers::Think(m)), &[1], vec![]),
            &ids,
        );
        assert_eq!(d.reasoning, "let me think é");
        assert_eq!(d.content, "answer <think> literal");
        // Starting inside the thinking (the prompt ended with the open marker).
        let mut ids = bytes("r");
        ids.push(m.close);
        ids.extend(bytes("c"));
        let d = run(
            &mut OutputParser::new(tok.clone(), Some(Markers::Think(m)), &[m.open], vec![]),
            &ids,
        );
        assert_eq!((d.reasoning.as_str(), d.content.as_str()), ("r", "c"));
        // Without markers everything is content.
        let d = run(
            &mut OutputParser::new(tok, None, &[], vec![]),
            &[m.open, 104, 105],
        );
        assert_eq!((d.reasoning.as_str(), d.content.as_str()), ("", "hi"));
    }

    #[test]
    fn stop_strings_cut_the_answer_but_not_the_reasoning() {
        let (_d, tok) = tokenizer();
        let Some(Markers::Think(m)) = reasoning_markers(&tok) else {
            panic!("think markers")
        };
        let mut ids = vec![m.open];
        ids.extend(bytes("STOP inside thinking"));
        ids.push(m.close);
        ids.extend(bytes("yes STOP no"));
        let mut p = OutputParser::new(tok, Some(Markers::Think(m)), &[], vec!["STOP".into()]);
        let mut all = Delta::default();
        for &id in &ids {
            all.extend(p.push(id));
            if p.stopped() {
                break;
            }
        }
        assert!(p.stopped());
        all.extend(p.finish());
        assert_eq!(all.reasoning, "STOP inside thinking");
        assert_eq!(all.content, "yes ");
    }

    #[test]
    fn kimi_k3_xtml_output_splits_into_reasoning_and_answer() {
        let dir = tempfile::tempdir().unwrap();
        deltafin_engine::synth::write_byte_tokenizer_flavor(
            dir.path(),
            deltafin_engine::synth::TokenizerFlavor::K3,
        )
        .unwrap();
        let tok = Arc::new(Tokenizer::from_dir(dir.path()).unwrap());
        let markers = reasoning_markers(&tok);
        assert!(matches!(markers, Some(Markers::Xtml(_))));
        let messages = [deltafin_engine::tokenizer::ChatMessage::new("user", "hi")];
        let opts = deltafin_engine::tokenizer::ChatOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let prompt = tok.encode_chat(&messages, &opts).unwrap();
        let output =
            "first I think<|close|>think<|sep|><|open|>response<|sep|>the answer<|close|>response<|sep|>";
        let ids = tok.encode_with_special(output);
        let d = run(&mut OutputParser::new(tok, markers, &prompt, vec![]), &ids);
        assert_eq!(
            (d.reasoning.as_str(), d.content.as_str()),
            ("first I think", "the answer")
        );
    }

    #[test]
    fn split_multibyte_characters_are_emitted_whole() {
        let (_d, tok) = tokenizer();
        let mut p = OutputParser::new(tok, None, &[], vec![]);
        let ids = bytes("é");
        assert_eq!(p.push(ids[0]), Delta::default());
        assert_eq!(p.push(ids[1]).content, "é");
        // A dangling partial character becomes U+FFFD at the end.
        p.push(0xC3);
        assert_eq!(p.finish().content, "\u{FFFD}");
    }
}
