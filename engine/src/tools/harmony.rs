//! gpt-oss's harmony messages, read for tool calls. The output after the generation prompt
//! `<|start|>assistant` is a run of messages: a header (`<|channel|>NAME`, optional recipient
//! and content type), `<|message|>`, the body, and a terminator (`<|end|>`, `<|call|>` or
//! `<|return|>`); a later message opens with `<|start|>` and its role.
//!
//! A message whose header names a recipient `to=functions.NAME`, in the channel part
//! (`<|channel|>commentary to=functions.NAME <|constrain|>json`) or in the role part
//! (`<|start|>assistant to=functions.NAME<|channel|>commentary json`, the way gpt-oss's template
//! writes history), is a call: its body up to `<|call|>` is the JSON arguments, whatever the
//! channel (models also put calls on `analysis`). Every other message passes through, header
//! included, for the reasoning split to route (`analysis` is reasoning; `final` and
//! `commentary` without a recipient are content). Headers are held until `<|message|>`, so a
//! call's header never reaches the client.

use serde_json::Value;

use super::HarmonyMarkers;
use super::parser::{Out, ParsedCall, text_of};
use crate::tokenizer::Tokenizer;

/// Longest header held before it is given up as malformed (tokens).
const MAX_HEADER_TOKENS: usize = 64;

#[derive(Debug)]
enum State {
    /// A header from its first id (`<|start|>`, or the output's start), held.
    Header(Vec<u32>),
    /// The body of a message that is not a call: passed through.
    Body,
    /// A call's header and body, held until `<|call|>`; the function name.
    Call(Vec<u32>, String),
}

/// The harmony state machine.
#[derive(Debug)]
pub(super) struct HarmonyParser {
    m: HarmonyMarkers,
    state: State,
    started: bool,
}

impl HarmonyParser {
    pub(super) fn new(m: HarmonyMarkers) -> Self {
        HarmonyParser {
            m,
            // The generation prompt ends with `<|start|>assistant`: a header comes first.
            state: State::Header(Vec::new()),
            started: false,
        }
    }

    pub(super) fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<Out>) {
        let m = self.m;
        match &mut self.state {
            State::Header(held) => {
                held.push(id);
                if id == m.message {
                    let held = std::mem::take(held);
                    match recipient(tok, &held) {
                        Some(name) => {
                            if !std::mem::replace(&mut self.started, true) {
                                out.push(Out::SectionStart);
                            }
                            self.state = State::Call(held, name);
                        }
                        None => {
                            out.extend(held.into_iter().map(Out::Token));
                            self.state = State::Body;
                        }
                    }
                } else if [m.end, m.call, m.ret].contains(&id) || held.len() > MAX_HEADER_TOKENS {
                    // Not a header after all: the ids are ordinary output.
                    let held = std::mem::take(held);
                    out.extend(held.into_iter().map(Out::Token));
                    self.state = State::Body;
                }
            }
            State::Body => {
                if id == m.start {
                    self.state = State::Header(vec![id]);
                } else {
                    out.push(Out::Token(id));
                }
            }
            State::Call(raw, name) => {
                raw.push(id);
                if id == m.call || id == m.end {
                    let raw = std::mem::take(raw);
                    let at = raw
                        .iter()
                        .position(|&t| t == m.message)
                        .map_or(raw.len(), |p| p + 1);
                    let args = text_of(tok, &raw[at..raw.len() - 1])
                        .and_then(|body| serde_json::from_str::<Value>(body.trim()).ok())
                        .filter(Value::is_object);
                    out.push(match args {
                        Some(a) => Out::Call(ParsedCall {
                            name: std::mem::take(name),
                            arguments: a.to_string(),
                        }),
                        None => Out::Malformed(raw),
                    });
                    self.state = State::Body;
                } else if tok.is_special(id) && id != m.constrain {
                    out.push(Out::Malformed(std::mem::take(raw)));
                    self.state = State::Body;
                }
            }
        }
    }

    pub(super) fn finish(&mut self, tok: &Tokenizer, out: &mut Vec<Out>) {
        match std::mem::replace(&mut self.state, State::Body) {
            State::Call(raw, _) => out.push(Out::Malformed(raw)),
            // A call's header the output ended in is withheld; any other header is hidden.
            State::Header(held) if text_of(tok, &held).is_some_and(|t| t.contains("to=")) => {
                out.push(Out::Malformed(held))
            }
            _ => {}
        }
    }
}

/// The function a header addresses (`to=functions.NAME`), if any.
fn recipient(tok: &Tokenizer, header: &[u32]) -> Option<String> {
    let text = text_of(tok, header)?;
    let (_, rest) = text.split_once("to=functions.")?;
    let name: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '<')
        .collect();
    (!name.is_empty()).then_some(name)
}
