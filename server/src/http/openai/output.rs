//! One response's output (pure): token ids → tool calls (optional, [`OutputParser::with_tools`])
//! → reasoning split → UTF-8-safe detokenization per channel → stop strings on the answer.
//! Special tokens are never shown. Stop strings apply to `content` (the answer; all text for
//! completions), not to `reasoning_content` or tool-call arguments.
//!
//! With tools on, ids go through the native tool-call parser first: ids outside calls continue
//! to the reasoning split, a call becomes [`ToolCallDelta`]s (the first with index, id and
//! name and empty arguments, then argument fragments). No call markup ever reaches content: a
//! malformed call is dropped (or, with [`OutputParser::malformed_as_text`], shown as content
//! text with its marker tokens removed), and call markup the output ends inside (cut off by
//! `max_tokens`, a stop id or the context) is withheld; the finish reason says why it ended. A tool-call section ends the thinking even when the model
//! did not close it. The concatenation of every delta ([`Delta::extend`]) equals a
//! non-streamed run.

use std::collections::HashMap;
use std::sync::Arc;

use deltafin_engine::tokenizer::{IncrementalDecoder, Tokenizer};
use deltafin_engine::tools::{ToolCallParser, ToolEvent, ToolFormat, ToolMarkers};
use serde_json::Value;

use super::reasoning::{Channel, HarmonyMarkers, Markers, ReasoningSplit, Route, ThinkMarkers, XtmlMarkers};
use super::stop::StopMatcher;

/// One piece of a tool call, in the OpenAI streaming shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's position among this response's calls, from 0.
    pub index: usize,
    /// The call id (first piece only).
    pub id: Option<String>,
    /// The function name (first piece only).
    pub name: Option<String>,
    /// A fragment of the arguments JSON string (`""` in the first piece).
    pub arguments: String,
}

/// Output produced by one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// `reasoning_content` text.
    pub reasoning: String,
    /// `content` text.
    pub content: String,
    /// Tool-call pieces, in order.
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }

    /// Append `other`. A fragment (no id) is merged into the earlier piece of its call, so an
    /// accumulated `Delta` holds one complete entry per call.
    pub fn extend(&mut self, other: Delta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        for piece in other.tool_calls {
            match self.tool_calls.iter_mut().rfind(|c| c.index == piece.index) {
                Some(call) if piece.id.is_none() && piece.name.is_none() => {
                    call.arguments.push_str(&piece.arguments)
                }
                _ => self.tool_calls.push(piece),
            }
        }
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
    tools: Option<ToolCallParser>,
    events: Vec<ToolEvent>,
    /// Malformed calls come back as text without their markers (else dropped).
    malformed_as_text: bool,
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
            tools: None,
            malformed_as_text: false,
            events: Vec::new(),
        }
    }

    /// Return malformed calls as content text with their markers removed (off: dropped).
    pub fn malformed_as_text(mut self, on: bool) -> Self {
        self.malformed_as_text = on;
        self
    }

    /// Parse native tool calls of `format`; minted call ids start `call_{id_prefix}_` (make it
    /// unique per request). A tokenizer without the format's tokens leaves parsing off.
    pub fn with_tools(
        mut self,
        format: ToolFormat,
        id_prefix: String,
        schemas: HashMap<String, Value>,
    ) -> Self {
        match ToolMarkers::resolve(format, &self.tokenizer) {
            Ok(markers) => {
                let parser = ToolCallParser::new(self.tokenizer.clone(), markers, id_prefix);
                self.tools = Some(parser.with_tool_schemas(schemas))
            }
            Err(e) => tracing::warn!(error = %e, "tool-call parsing disabled"),
        }
        self
    }

    /// The metrics label of the tool-call format parsed (`none` without tools).
    pub fn tool_format_label(&self) -> &'static str {
        self.tools.as_ref().map_or("none", |t| t.format().label())
    }

    /// Tool calls parsed so far.
    pub fn tool_calls_seen(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolCallParser::calls_seen)
    }

    /// Tool calls that did not parse and were returned as text.
    pub fn malformed_calls(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolCallParser::malformed_calls)
    }

    /// Tool calls the output ended inside (withheld).
    pub fn withheld_calls(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolCallParser::withheld_calls)
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
        match &mut self.tools {
            Some(tools) => {
                let mut events = std::mem::take(&mut self.events);
                tools.push(id, &mut events);
                self.apply(&mut events, &mut d);
                self.events = events;
            }
            None => self.route(id, &mut d),
        }
        d
    }

    /// Handle the tool parser's events in order (`events` is left empty).
    fn apply(&mut self, events: &mut Vec<ToolEvent>, d: &mut Delta) {
        for event in events.drain(..) {
            if self.stopped() {
                break;
            }
            match event {
                ToolEvent::Token(id) => self.route(id, d),
                ToolEvent::SectionStart => {
                    self.flush_into(d);
                    self.split.leave_reasoning();
                }
                ToolEvent::CallStart { index, id, name } => {
                    self.flush_into(d);
                    d.tool_calls.push(ToolCallDelta {
                        index,
                        id: Some(id),
                        name: Some(name),
                        arguments: String::new(),
                    });
                }
                ToolEvent::ArgumentsDelta { index, fragment } => d.tool_calls.push(ToolCallDelta {
                    index,
                    arguments: fragment,
                    ..Default::default()
                }),
                ToolEvent::CallEnd { .. } => {}
                ToolEvent::Malformed(ids) => {
                    if self.malformed_as_text
                        && let Some(text) = self.tools.as_ref().map(|t| t.malformed_text(&ids))
                    {
                        self.flush_into(d);
                        d.content.push_str(&self.stop.push(&text));
                    }
                }
                // Markup the output ended inside: withheld, never shown as text.
                ToolEvent::CutOff(_) => {}
            }
        }
    }

    /// Route one id outside tool calls through the reasoning split.
    fn route(&mut self, id: u32, d: &mut Delta) {
        let tokenizer = &self.tokenizer;
        match self
            .split
            .route(id, tokenizer.is_special(id), &|ids| tokenizer.decode(ids))
        {
            Route::Hidden => self.flush_into(d),
            Route::Text(Channel::Reasoning) => d.reasoning.extend(self.reasoning.push(id)),
            Route::Text(Channel::Content) => self.content_text(id, d),
        }
    }

    fn content_text(&mut self, id: u32, d: &mut Delta) {
        if let Some(text) = self.content.push(id) {
            d.content.push_str(&self.stop.push(&text));
        }
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
        if self.stopped() {
            return d;
        }
        if let Some(tools) = &mut self.tools {
            let mut events = std::mem::take(&mut self.events);
            tools.finish(&mut events);
            self.apply(&mut events, &mut d);
            self.events = events;
        }
        if !self.stopped() {
            self.flush_into(&mut d);
            d.content.push_str(&self.stop.finish());
        }
        d
    }
}

/// How a tokenizer's chat format marks thinking: harmony channels (`<|start|>`, `<|channel|>`,
/// `<|message|>` specials, gpt-oss), XTML (`<|open|>`, `<|close|>`, `<|sep|>` specials, Kimi
/// K3) or `<think>` / `</think>` tokens (specials in Kimi K2; added tokens that
/// are not special in Qwen3.5, GLM, MiniMax-M2 and DeepSeek); `None` if neither.
pub fn reasoning_markers(tokenizer: &Tokenizer) -> Option<Markers> {
    let id = |t: &str| tokenizer.token_to_id(t).filter(|&id| tokenizer.is_special(id));
    // `<think>` may be an added token that is not special (Qwen3.5, GLM, DeepSeek): a marker
    // when the text encodes to exactly that one id.
    let added = |t: &str| id(t).or_else(|| tokenizer.token_to_id(t).filter(|&i| tokenizer.encode(t) == [i]));
    if let Ok(ToolMarkers::Harmony(h)) = ToolMarkers::resolve(ToolFormat::Harmony, tokenizer) {
        return Some(Markers::Harmony(HarmonyMarkers {
            start: h.start,
            channel: h.channel,
            message: h.message,
            analysis: tokenizer.encode("analysis"),
        }));
    }
    if let (Some(open), Some(close), Some(sep)) = (id("<|open|>"), id("<|close|>"), id("<|sep|>")) {
        return Some(Markers::Xtml(XtmlMarkers {
            open,
            close,
            sep,
            think: tokenizer.encode("think"),
            response: tokenizer.encode("response"),
            tools: tokenizer.encode("tools"),
        }));
    }
    Some(Markers::Think(ThinkMarkers {
        open: added("<think>")?,
        close: added("</think>")?,
        newline: Some(tokenizer.encode("\n"))
            .filter(|n| n.len() == 1)
            .map(|n| n[0]),
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

    fn fixture(name: &str) -> Arc<Tokenizer> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../engine/tests/fixtures/tokenizers")
            .join(name);
        Arc::new(Tokenizer::from_dir(&dir).unwrap())
    }

    fn k3() -> Arc<Tokenizer> {
        let dir = tempfile::tempdir().unwrap();
        deltafin_engine::synth::write_byte_tokenizer_flavor(
            dir.path(),
            deltafin_engine::synth::TokenizerFlavor::K3,
        )
        .unwrap();
        Arc::new(Tokenizer::from_dir(dir.path()).unwrap())
    }

    /// Push `ids` one at a time; check the streamed tool-call shape (id and name with empty
    /// arguments first, then fragments only) and return the accumulated output.
    fn run_streamed(p: &mut OutputParser, ids: &[u32]) -> Delta {
        let mut steps: Vec<Delta> = ids.iter().map(|&id| p.push(id)).collect();
        steps.push(p.finish());
        let mut seen = std::collections::HashSet::new();
        let mut fragments: Vec<String> = Vec::new();
        for piece in steps.iter().flat_map(|d| &d.tool_calls) {
            if seen.insert(piece.index) {
                assert!(piece.id.is_some() && piece.name.is_some() && piece.arguments.is_empty());
                assert_eq!(piece.index, fragments.len());
                fragments.push(String::new());
            } else {
                assert!(piece.id.is_none() && piece.name.is_none());
                fragments[piece.index].push_str(&piece.arguments);
            }
        }
        let mut all = Delta::default();
        for d in steps {
            all.extend(d);
        }
        let merged: Vec<&str> = all.tool_calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(
            merged, fragments,
            "streamed fragments concatenate to the whole arguments"
        );
        all
    }

    fn calls(d: &Delta) -> Vec<(usize, &str, &str, &str)> {
        d.tool_calls
            .iter()
            .map(|c| {
                let id = c.id.as_deref().unwrap_or("");
                (c.index, id, c.name.as_deref().unwrap_or(""), c.arguments.as_str())
            })
            .collect()
    }

    #[test]
    fn k2_thinking_then_content_then_calls() {
        let tok = fixture("kimi_tiny");
        let markers = reasoning_markers(&tok);
        let Some(Markers::Think(m)) = markers.clone() else {
            panic!("kimi_tiny has think markers")
        };
        let s = |t: &str| tok.encode_with_special(t);
        let mut ids = tok.encode("weigh it");
        ids.push(m.close);
        ids.extend(tok.encode("Checking <|tool_call_begin|> now."));
        ids.extend(s("<|tool_calls_section_begin|><|tool_call_begin|>"));
        ids.extend(tok.encode("functions.get.weather:0"));
        ids.extend(s("<|tool_call_argument_begin|>"));
        ids.extend(tok.encode(r#"{"city": "Paris"}"#));
        ids.extend(s("<|tool_call_end|><|tool_call_begin|>"));
        ids.extend(tok.encode("functions.f:1"));
        ids.extend(s("<|tool_call_argument_begin|>"));
        ids.extend(tok.encode("{oops"));
        ids.extend(s("<|tool_call_end|><|tool_calls_section_end|><|im_end|>"));
        for as_text in [false, true] {
            let mut p = OutputParser::new(tok.clone(), markers.clone(), &[m.open], vec![])
                .with_tools(ToolFormat::KimiK2, "x".into(), Default::default())
                .malformed_as_text(as_text);
            let d = run_streamed(&mut p, &ids);
            assert_eq!(d.reasoning, "weigh it");
            // Text that only spells a marker stays; the malformed call's marker tokens never
            // reach content: it is dropped, or shown without them.
            let tail = if as_text { "functions.f:1{oops" } else { "" };
            assert_eq!(d.content, format!("Checking <|tool_call_begin|> now.{tail}"));
            assert_eq!(
                calls(&d),
                vec![(0, "call_x_0", "get.weather", r#"{"city": "Paris"}"#)]
            );
            assert_eq!((p.tool_calls_seen(), p.malformed_calls()), (1, 1));
        }
    }

    #[test]
    fn a_malformed_glm_call_as_text_loses_its_plain_added_marker_tokens() {
        // GLM's `<tool_call>`/`<arg_key>` are added tokens that are not special.
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/glm4-moe-fp8");
        let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
        let mut ids = tok.encode("Hi. ");
        ids.extend(
            tok.encode_with_special("<tool_call>f\n<arg_key>k</arg_key>\n</tool_call><|observation|>"),
        );
        for (as_text, want) in [(false, "Hi. "), (true, "Hi. f\nk\n")] {
            let mut p = OutputParser::new(tok.clone(), reasoning_markers(&tok), &[], vec![])
                .with_tools(ToolFormat::Glm, "x".into(), Default::default())
                .malformed_as_text(as_text);
            let d = run_streamed(&mut p, &ids);
            assert_eq!(d.content, want);
            assert_eq!((p.tool_calls_seen(), p.malformed_calls()), (0, 1));
        }
    }

    #[test]
    fn a_malformed_dsml_call_as_text_loses_its_tags() {
        // DeepSeek-V3.2 as shipped: no chat template, so its native encoder and DSML.
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/dsv32-dsa-bf16");
        let dir = tempfile::tempdir().unwrap();
        for f in ["tokenizer.json", "config.json"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let tok = Arc::new(Tokenizer::from_dir(dir.path()).unwrap());
        assert!(tok.is_dsml());
        let block = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" \
                     string=\"false\">two</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
        let mut ids = tok.encode("Hi.");
        ids.extend(tok.encode(block));
        ids.extend(tok.encode_with_special("<｜end▁of▁sentence｜>"));
        for (as_text, want) in [(false, "Hi."), (true, "Hi.\n\n\n\ntwo\n\n")] {
            let mut p = OutputParser::new(tok.clone(), None, &[], vec![])
                .with_tools(ToolFormat::Dsml, "x".into(), Default::default())
                .malformed_as_text(as_text);
            let d = run_streamed(&mut p, &ids);
            assert_eq!(d.content, want);
            assert_eq!((p.tool_calls_seen(), p.malformed_calls()), (0, 1));
        }
    }

    #[test]
    fn k2_a_section_inside_unclosed_thinking_still_gives_calls() {
        let tok = fixture("kimi_tiny");
        let markers = reasoning_markers(&tok);
        let Some(Markers::Think(m)) = markers.clone() else {
            panic!("think markers")
        };
        let mut ids = tok.encode("hmm");
        ids.extend(tok.encode_with_special("<|tool_calls_section_begin|><|tool_call_begin|>"));
        ids.extend(tok.encode("functions.a:0"));
        ids.extend(tok.encode_with_special("<|tool_call_argument_begin|>"));
        ids.extend(tok.encode("{}"));
        ids.extend(tok.encode_with_special("<|tool_call_end|><|tool_calls_section_end|>"));
        ids.extend(tok.encode("after"));
        let mut p = OutputParser::new(tok, markers, &[m.open], vec![]).with_tools(
            ToolFormat::KimiK2,
            "x".into(),
            Default::default(),
        );
        let d = run_streamed(&mut p, &ids);
        assert_eq!((d.reasoning.as_str(), d.content.as_str()), ("hmm", "after"));
        assert_eq!(calls(&d), vec![(0, "call_x_0", "a", "{}")]);
    }

    fn k3_output(think_close: bool) -> String {
        let close = if think_close { "<|close|>think<|sep|>" } else { "" };
        format!(
            "plan{close}<|open|>response<|sep|>Calling.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        )
    }

    #[test]
    fn k3_think_response_tools_and_the_implicit_think_close() {
        let tok = k3();
        let markers = reasoning_markers(&tok);
        let messages = [deltafin_engine::tokenizer::ChatMessage::new("user", "hi")];
        let opts = deltafin_engine::tokenizer::ChatOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let prompt = tok.encode_chat(&messages, &opts).unwrap();
        for think_close in [true, false] {
            let ids = tok.encode_with_special(&k3_output(think_close));
            let mut p = OutputParser::new(tok.clone(), markers.clone(), &prompt, vec![]).with_tools(
                ToolFormat::KimiK3,
                "r1".into(),
                Default::default(),
            );
            let d = run_streamed(&mut p, &ids);
            assert_eq!((d.reasoning.as_str(), d.content.as_str()), ("plan", "Calling."));
            assert_eq!(
                calls(&d),
                vec![(0, "call_r1_0", "get_weather", r#"{"city":"Paris","days":2}"#)]
            );
        }
        // Without tools the tools channel is hidden and nothing leaks into the answer.
        let ids = tok.encode_with_special(&k3_output(true));
        let d = run(
            &mut OutputParser::new(tok.clone(), markers, &prompt, vec![]),
            &ids,
        );
        assert_eq!(d.reasoning, "plan");
        assert!(d.content.starts_with("Calling.") && !d.content.contains("<|"));
        assert!(d.tool_calls.is_empty());
    }

    #[test]
    fn deepseek_content_then_calls() {
        let tok = fixture("deepseek_tiny");
        let s = |t: &str| tok.encode_with_special(t);
        let mut ids = tok.encode("Let me look.");
        ids.extend(s(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
        ));
        ids.extend(tok.encode("search\n```json\n{\"q\": \"a\\nb\"}\n```"));
        ids.extend(s("<｜tool▁call▁end｜>"));
        ids.extend(tok.encode("\n"));
        ids.extend(s("<｜tool▁call▁begin｜>function<｜tool▁sep｜>"));
        ids.extend(tok.encode("noop\n```json\n{}\n```"));
        ids.extend(s("<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"));
        let mut p = OutputParser::new(tok.clone(), reasoning_markers(&tok), &[], vec![]).with_tools(
            ToolFormat::DeepSeekV3,
            "q".into(),
            Default::default(),
        );
        let d = run_streamed(&mut p, &ids);
        assert_eq!(d.content, "Let me look.");
        assert_eq!(
            calls(&d),
            vec![
                (0, "call_q_0", "search", r#"{"q": "a\nb"}"#),
                (1, "call_q_1", "noop", "{}")
            ]
        );
    }

    #[test]
    fn stop_strings_do_not_touch_arguments_and_tools_off_is_unchanged() {
        let tok = fixture("kimi_tiny");
        let mut ids = tok.encode("a");
        ids.extend(tok.encode_with_special("<|tool_calls_section_begin|><|tool_call_begin|>"));
        ids.extend(tok.encode("functions.f:0"));
        ids.extend(tok.encode_with_special("<|tool_call_argument_begin|>"));
        ids.extend(tok.encode(r#"{"s": "STOP"}"#));
        ids.extend(tok.encode_with_special("<|tool_call_end|><|tool_calls_section_end|>"));
        let mut p = OutputParser::new(tok.clone(), None, &[], vec!["STOP".into()]).with_tools(
            ToolFormat::KimiK2,
            String::new(),
            Default::default(),
        );
        let d = run_streamed(&mut p, &ids);
        assert_eq!(d.content, "a");
        assert_eq!(calls(&d), vec![(0, "call_0", "f", r#"{"s": "STOP"}"#)]);
        // Tools off: the call is not parsed; specials hidden, its text is content up to STOP.
        let d = run(&mut OutputParser::new(tok, None, &[], vec!["STOP".into()]), &ids);
        assert!(d.tool_calls.is_empty());
        assert_eq!(d.content, r#"afunctions.f:0{"s": ""#);
    }
}
