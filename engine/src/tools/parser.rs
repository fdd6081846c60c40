//! The streaming tool-call parser: generated ids in, [`ToolEvent`]s out.
//!
//! Kimi K2 and DeepSeek-V3 share one shape (a section of calls, each call split in two by one
//! separator marker) and one state machine here; Kimi K3's XTML lives in `xtml`, the tagged
//! calls (Qwen, GLM, MiniMax-M2) in `tagged`, gpt-oss's harmony messages in `harmony`. A call is
//! buffered from its opening marker to its closing one and reported (start, the whole
//! arguments string, end) only when it parses; otherwise its ids come back as
//! [`ToolEvent::Malformed`]. Feeding ids one at a time or in any chunking gives the same events.

use std::sync::Arc;

use serde_json::Value;

use super::dsml::DsmlParser;
use super::harmony::HarmonyParser;
use super::tagged::{Body, TaggedParser};
use super::xtml::XtmlParser;
use super::{ToolEvent, ToolFormat, ToolMarkers, mint_call_id};
use crate::tokenizer::Tokenizer;

/// Parses the native tool calls of one response, fed the generated ids (after the generation
/// prompt) one at a time.
#[derive(Debug)]
pub struct ToolCallParser {
    tokenizer: Arc<Tokenizer>,
    format: ToolFormat,
    /// The format's structural ids, sorted ([`ToolMarkers::structural_ids`]).
    structural: Vec<u32>,
    machine: Machine,
    id_prefix: String,
    calls: usize,
    malformed: usize,
    withheld: usize,
}

#[derive(Debug)]
enum Machine {
    Section(SectionParser),
    Xtml(XtmlParser),
    Tagged(TaggedParser),
    Harmony(HarmonyParser),
    Dsml(DsmlParser),
}

/// A call as read from the output, before an index is assigned.
pub(super) struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What a format machine hands the parser.
pub(super) enum Out {
    Token(u32),
    SectionStart,
    Call(ParsedCall),
    Malformed(Vec<u32>),
    CutOff(Vec<u32>),
}

impl ToolCallParser {
    /// A parser for `markers`' format. `id_prefix` makes minted call ids unique per request
    /// (see [`mint_call_id`]). Every call gets a minted id, K2's too: K2's own
    /// `functions.NAME:IDX` restarts at 0 every turn, so clients that key calls by id (the
    /// Responses API's `call_id`, agent SDKs) would merge calls of different turns; the prompt
    /// side restores the native ids (`tokenizer::normalize_k2_tool_ids`), so the model sees
    /// exactly what it wrote.
    pub fn new(tokenizer: Arc<Tokenizer>, markers: ToolMarkers, id_prefix: String) -> Self {
        let machine = match markers {
            ToolMarkers::KimiK2(m) => Machine::Section(SectionParser::new(
                ToolFormat::KimiK2,
                SectionIds {
                    begin: m.section_begin,
                    end: m.section_end,
                    call_begin: m.call_begin,
                    call_end: m.call_end,
                    sep: m.argument_begin,
                    end_of_turn: m.end_of_turn,
                },
            )),
            ToolMarkers::DeepSeekV3(m) | ToolMarkers::DeepSeekV31(m) => Machine::Section(SectionParser::new(
                markers.format(),
                SectionIds {
                    begin: m.calls_begin,
                    end: m.calls_end,
                    call_begin: m.call_begin,
                    call_end: m.call_end,
                    sep: m.sep,
                    end_of_turn: m.end_of_sentence,
                },
            )),
            ToolMarkers::KimiK3(m) => Machine::Xtml(XtmlParser::new(m)),
            ToolMarkers::Hermes(m) => Machine::Tagged(TaggedParser::new(m, Body::Hermes, Default::default())),
            ToolMarkers::QwenXml(m) => Machine::Tagged(TaggedParser::new(m, Body::Xml, Default::default())),
            ToolMarkers::Glm(m) => Machine::Tagged(TaggedParser::new(m, Body::Glm, Default::default())),
            ToolMarkers::MiniMax(m) => {
                Machine::Tagged(TaggedParser::new(m, Body::MiniMax, Default::default()))
            }
            ToolMarkers::Harmony(m) => Machine::Harmony(HarmonyParser::new(m)),
            ToolMarkers::Dsml(m) => Machine::Dsml(DsmlParser::new(m.version)),
        };
        ToolCallParser {
            tokenizer,
            format: markers.format(),
            structural: markers.structural_ids(),
            machine,
            id_prefix,
            calls: 0,
            malformed: 0,
            withheld: 0,
        }
    }

    /// The same parser given each tool's `parameters` schema by name (the values of Qwen3.5's,
    /// GLM's and MiniMax-M2's XML-like calls are typed by it; the JSON formats ignore it).
    pub fn with_tool_schemas(mut self, schemas: std::collections::HashMap<String, Value>) -> Self {
        if let Machine::Tagged(p) = &mut self.machine {
            p.set_schemas(schemas);
        }
        self
    }

    /// Add one generated id; the events it completes are appended to `out`.
    pub fn push(&mut self, id: u32, out: &mut Vec<ToolEvent>) {
        let mut raw = Vec::new();
        match &mut self.machine {
            Machine::Section(p) => p.push(&self.tokenizer, id, &mut raw),
            Machine::Xtml(p) => p.push(&self.tokenizer, id, &mut raw),
            Machine::Tagged(p) => p.push(&self.tokenizer, id, &mut raw),
            Machine::Harmony(p) => p.push(&self.tokenizer, id, &mut raw),
            Machine::Dsml(p) => p.push(&self.tokenizer, id, &mut raw),
        }
        self.emit(raw, out);
    }

    /// Add several generated ids (e.g. accepted draft tokens); the same events as pushing
    /// them one at a time.
    pub fn push_all(&mut self, ids: &[u32], out: &mut Vec<ToolEvent>) {
        for &id in ids {
            self.push(id, out);
        }
    }

    /// The end of the output: whatever call markup is still held was cut off (by the token
    /// limit, a stop id or the context) and is withheld ([`ToolEvent::CutOff`]), never
    /// released as text.
    pub fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        let mut raw = Vec::new();
        match &mut self.machine {
            Machine::Section(p) => p.finish(&mut raw),
            Machine::Xtml(p) => p.finish(&mut raw),
            Machine::Tagged(p) => p.finish(&mut raw),
            Machine::Harmony(p) => p.finish(&self.tokenizer, &mut raw),
            Machine::Dsml(p) => p.finish(&mut raw),
        }
        let raw = raw
            .into_iter()
            .map(|o| match o {
                Out::Malformed(ids) => Out::CutOff(ids),
                o => o,
            })
            .collect();
        self.emit(raw, out);
    }

    /// Whether `id` is one of the format's marker tokens (special or not: GLM's and Qwen's
    /// are plain added tokens), which never belong in text made from a malformed call.
    pub fn is_marker(&self, id: u32) -> bool {
        self.structural.binary_search(&id).is_ok()
    }

    /// The text a malformed call shows under `--malformed-calls-as-text`: its ids without
    /// special and marker tokens, decoded, and for DSML (whose markers are text) without its
    /// tags.
    pub fn malformed_text(&self, ids: &[u32]) -> String {
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| !self.tokenizer.is_special(id) && !self.is_marker(id))
            .collect();
        let text = self.tokenizer.decode(&kept);
        match self.format {
            ToolFormat::Dsml => super::dsml::strip_tags(&text),
            _ => text,
        }
    }

    /// The format this parser reads.
    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// Calls cut off by the end of the output and withheld.
    pub fn withheld_calls(&self) -> usize {
        self.withheld
    }

    /// Calls reported so far.
    pub fn calls_seen(&self) -> usize {
        self.calls
    }

    /// Calls that did not parse and came back as text.
    pub fn malformed_calls(&self) -> usize {
        self.malformed
    }

    fn emit(&mut self, raw: Vec<Out>, out: &mut Vec<ToolEvent>) {
        for o in raw {
            match o {
                Out::Token(id) => out.push(ToolEvent::Token(id)),
                Out::SectionStart => out.push(ToolEvent::SectionStart),
                Out::Malformed(ids) => {
                    self.malformed += 1;
                    out.push(ToolEvent::Malformed(ids));
                }
                Out::CutOff(ids) => {
                    self.withheld += 1;
                    out.push(ToolEvent::CutOff(ids));
                }
                Out::Call(call) => {
                    let index = self.calls;
                    self.calls += 1;
                    let id = mint_call_id(&self.id_prefix, index);
                    out.push(ToolEvent::CallStart {
                        index,
                        id,
                        name: call.name,
                    });
                    out.push(ToolEvent::ArgumentsDelta {
                        index,
                        fragment: call.arguments,
                    });
                    out.push(ToolEvent::CallEnd { index });
                }
            }
        }
    }
}

/// The exact UTF-8 text of `ids` (`None` if the bytes are not valid UTF-8).
pub(super) fn text_of(tokenizer: &Tokenizer, ids: &[u32]) -> Option<String> {
    String::from_utf8(tokenizer.decode_bytes(ids)).ok()
}

/// Whether `id` is text made of ASCII whitespace only (formatting between calls).
pub(super) fn is_blank(tokenizer: &Tokenizer, id: u32) -> bool {
    let b = tokenizer.decode_bytes(&[id]);
    !tokenizer.is_special(id) && !b.is_empty() && b.iter().all(u8::is_ascii_whitespace)
}

/// Whether `arguments` is a JSON object (what a function call's arguments must be).
pub(super) fn is_json_object(arguments: &str) -> bool {
    matches!(serde_json::from_str::<Value>(arguments), Ok(Value::Object(_)))
}

/// The markers of a section-shaped format (K2, DeepSeek-V3).
#[derive(Debug, Clone, Copy)]
struct SectionIds {
    begin: u32,
    end: u32,
    call_begin: u32,
    call_end: u32,
    /// K2 `<|tool_call_argument_begin|>`, DeepSeek `<｜tool▁sep｜>`.
    sep: u32,
    end_of_turn: u32,
}

impl SectionIds {
    fn is_marker(&self, id: u32) -> bool {
        [
            self.begin,
            self.end,
            self.call_begin,
            self.call_end,
            self.sep,
            self.end_of_turn,
        ]
        .contains(&id)
    }
}

#[derive(Debug)]
enum SectionState {
    Outside,
    Section,
    /// A call from its opening marker on; `sep_at` is the separator's position in `raw`.
    Call {
        raw: Vec<u32>,
        sep_at: Option<usize>,
    },
}

/// K2 / DeepSeek-V3 state machine.
#[derive(Debug)]
struct SectionParser {
    format: ToolFormat,
    ids: SectionIds,
    state: SectionState,
}

impl SectionParser {
    fn new(format: ToolFormat, ids: SectionIds) -> Self {
        SectionParser {
            format,
            ids,
            state: SectionState::Outside,
        }
    }

    fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<Out>) {
        let m = self.ids;
        match &mut self.state {
            SectionState::Outside => {
                if id == m.begin {
                    out.push(Out::SectionStart);
                    self.state = SectionState::Section;
                } else if id == m.call_begin {
                    // A call without its section marker: accept it as one.
                    out.push(Out::SectionStart);
                    self.state = SectionState::Call {
                        raw: vec![id],
                        sep_at: None,
                    };
                } else if [m.end, m.call_end, m.sep].contains(&id) {
                    // A stray closing marker: structure, not text; dropped.
                } else {
                    out.push(Out::Token(id));
                }
            }
            SectionState::Section => {
                if id == m.call_begin {
                    self.state = SectionState::Call {
                        raw: vec![id],
                        sep_at: None,
                    };
                } else if id == m.end {
                    self.state = SectionState::Outside;
                } else if id == m.end_of_turn {
                    self.state = SectionState::Outside;
                    out.push(Out::Token(id));
                } else if m.is_marker(id) || is_blank(tok, id) {
                    // Stray markers and the newlines that join calls.
                } else {
                    out.push(Out::Token(id));
                }
            }
            SectionState::Call { raw, sep_at } => {
                if id == m.call_end {
                    raw.push(id);
                    let (raw, sep_at) = (std::mem::take(raw), *sep_at);
                    self.state = SectionState::Section;
                    out.push(match parse_section_call(self.format, tok, &raw, sep_at) {
                        Some(call) => Out::Call(call),
                        None => Out::Malformed(raw),
                    });
                } else if id == m.sep && sep_at.is_none() {
                    *sep_at = Some(raw.len());
                    raw.push(id);
                } else if m.is_marker(id) || tok.is_special(id) {
                    // The call never closed: it is text; the marker is read afresh.
                    out.push(Out::Malformed(std::mem::take(raw)));
                    self.state = SectionState::Section;
                    self.push(tok, id, out);
                } else {
                    raw.push(id);
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Out>) {
        if let SectionState::Call { raw, .. } = &mut self.state {
            out.push(Out::Malformed(std::mem::take(raw)));
        }
        self.state = SectionState::Outside;
    }
}

/// Parse a complete call `raw` (opening marker … closing marker) of K2, DeepSeek-V3 or V3.1.
fn parse_section_call(
    format: ToolFormat,
    tok: &Tokenizer,
    raw: &[u32],
    sep_at: Option<usize>,
) -> Option<ParsedCall> {
    let sep_at = sep_at?;
    let head = text_of(tok, raw.get(1..sep_at)?)?;
    let body = text_of(tok, raw.get(sep_at + 1..raw.len().checked_sub(1)?)?)?;
    let call = match format {
        ToolFormat::KimiK2 => {
            // The model's own `functions.NAME:IDX` is checked but not kept: ids are minted.
            let (_, name) = parse_k2_id(&head)?;
            ParsedCall {
                name,
                arguments: body,
            }
        }
        ToolFormat::DeepSeekV31 => ParsedCall {
            name: valid_name(&head)?.to_string(),
            arguments: body.trim().to_string(),
        },
        _ => parse_deepseek(&head, &body)?,
    };
    is_json_object(&call.arguments).then_some(call)
}

/// A function name: trimmed, non-empty, without whitespace.
pub(super) fn valid_name(name: &str) -> Option<&str> {
    let name = name.trim();
    (!name.is_empty() && !name.contains(char::is_whitespace)).then_some(name)
}

/// A K2 call id `functions.NAME:IDX` (the `functions.` prefix optional) → (id, NAME). The name
/// is everything between the prefix and the last `:`, so it may contain `.` and `:`.
pub(super) fn parse_k2_id(head: &str) -> Option<(String, String)> {
    let id = head.trim();
    let (name, idx) = id.rsplit_once(':')?;
    let name = name.strip_prefix("functions.").unwrap_or(name);
    let valid_idx = !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit());
    let valid_name = !name.is_empty() && !name.contains(char::is_whitespace);
    (valid_idx && valid_name).then(|| (id.to_string(), name.to_string()))
}

/// A DeepSeek-V3 call: `head` is the type (`function`), `body` is ``NAME\n```json\nARGS\n``` ``.
/// A body without the fence is taken as `NAME\nARGS` (the V3.1 habit).
fn parse_deepseek(head: &str, body: &str) -> Option<ParsedCall> {
    if head.trim() != "function" {
        return None;
    }
    let (name, rest) = body.split_once('\n')?;
    let name = valid_name(name)?;
    let arguments = match rest.strip_prefix("```json\n") {
        Some(fenced) => fenced.trim_end().strip_suffix("```")?.strip_suffix('\n')?,
        None => rest.trim(),
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}
