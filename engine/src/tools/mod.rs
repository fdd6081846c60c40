//! Native tool calls on token ids: which call syntax a tokenizer's model speaks
//! ([`ToolFormat`]), its marker token ids resolved once ([`ToolMarkers`]), a streaming parser of
//! generated ids into OpenAI-shaped call events ([`ToolCallParser`], [`ToolEvent`]), and lark
//! grammars that force a call or a JSON answer for constrained decoding ([`grammar`]).
//!
//! The three formats (agent-api.md §1–§3):
//! * **Kimi K2** (K2, K2-Thinking, Kimi-Linear): `<|tool_calls_section_begin|>` then per call
//!   `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`,
//!   then `<|tool_calls_section_end|>`; the id text is the OpenAI call id.
//! * **Kimi K3** (XTML): the `tools` element `<|open|>tools<|sep|>…<|close|>tools<|sep|>` holding
//!   `<|open|>call tool="NAME" index="N"<|sep|>` blocks of `<|open|>argument key="K" type="T"
//!   <|sep|>VALUE<|close|>argument<|sep|>` (or one raw `<|open|>json type="object"<|sep|>…`
//!   block) closed by `<|close|>call<|sep|>`; element names are plain text between the specials.
//! * **DeepSeek-V3**: `<｜tool▁calls▁begin｜>` then calls
//!   `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>` joined
//!   by `\n`, then `<｜tool▁calls▁end｜>`; the format has no id, so one is minted.
//! * **DeepSeek-V3.1**: the same markers, each call `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
//!   <｜tool▁call▁end｜>` with plain JSON arguments, calls not joined; chosen when the chat
//!   template renders history calls that way (no fenced JSON).
//! * **Qwen hermes** (Qwen3, Qwen3-MoE, Qwen3-Next): each call alone,
//!   `<tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call>` (`tagged`).
//! * **Qwen3.5 XML** (Qwen3.5/3.6): `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n
//!   </function>\n</tool_call>`, each value typed by the tool's schema (`tagged`).
//! * **GLM** (GLM-4.5/4.6/4.7, GLM-5): each call alone, `<tool_call>NAME\n<arg_key>K</arg_key>\n
//!   <arg_value>V</arg_value>\n…</tool_call>` (4.7 without the newlines), values typed by the
//!   schema (`tagged`).
//! * **gpt-oss harmony**: a message whose header names `to=functions.NAME` (channel or role
//!   part), its JSON body ended by `<|call|>` (`harmony`).
//! * **MiniMax-M2**: one `<minimax:tool_call>` block of `<invoke name="NAME">` elements holding
//!   `<parameter name="K">V</parameter>`, values typed by the schema (`tagged`).
//!
//! Invariants: markers are recognised by token id only (text that spells a marker stays text);
//! a call is reported only once it is complete and well formed, so a malformed call can still
//! come back as plain text (counted) and never half-streamed; no input panics.

mod dsml;
pub mod grammar;
mod grammar_xml;
mod harmony;
mod parser;
mod tagged;
mod xtml;

#[cfg(test)]
mod dsml_tests;
#[cfg(test)]
mod grammar_tests;
#[cfg(test)]
mod grammar_xml_tests;
#[cfg(test)]
mod harmony_tests;
#[cfg(test)]
mod tagged_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

pub use parser::ToolCallParser;

use crate::tokenizer::Tokenizer;

/// A model family's native tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    /// Kimi K2 / K2-Thinking / Kimi-Linear: `<|tool_calls_section_begin|>` … sections.
    KimiK2,
    /// Kimi K3: the XTML `tools` element.
    KimiK3,
    /// DeepSeek-V3 / V3-0324 / R1: `<｜tool▁calls▁begin｜>` … with fenced JSON arguments.
    DeepSeekV3,
    /// DeepSeek-V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`.
    DeepSeekV31,
    /// Qwen3 / Qwen3-MoE / Qwen3-Next: `<tool_call>{json}</tool_call>` (hermes).
    Hermes,
    /// Qwen3.5 / Qwen3.6: `<tool_call><function=NAME><parameter=K>V</parameter>…`.
    QwenXml,
    /// GLM-4.5 / 4.6 / 4.7 / GLM-5: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…`.
    Glm,
    /// MiniMax-M2: `<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter>…`.
    MiniMax,
    /// gpt-oss harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>…<|call|>`.
    Harmony,
    /// DeepSeek-V3.2 DSML: `<｜DSML｜function_calls>` blocks of `<｜DSML｜invoke name=…>` with
    /// `<｜DSML｜parameter name=… string="true|false">` (text markup, written by the native
    /// encoder of a checkpoint without a chat template).
    Dsml,
}

impl ToolFormat {
    /// The format the model speaks: by its marker tokens for Kimi and DeepSeek (checked K3, K2,
    /// DeepSeek-V3), and for Qwen's shared `<tool_call>` markers by what the chat template
    /// renders (`<function=` is Qwen3.5's XML; else hermes JSON). `None` without markers, or
    /// with Qwen markers but a template that renders no tool calls. DeepSeek-V3.2's native
    /// encoder teaches DSML, whatever V3 markers its vocabulary still holds.
    pub fn detect(tokenizer: &Tokenizer) -> Option<ToolFormat> {
        if tokenizer.is_dsml() {
            return Some(ToolFormat::Dsml);
        }
        let by_markers = [
            ToolFormat::KimiK3,
            ToolFormat::KimiK2,
            ToolFormat::DeepSeekV3,
            ToolFormat::MiniMax,
            ToolFormat::Glm,
            ToolFormat::Harmony,
        ]
        .into_iter()
        .find(|&f| ToolMarkers::resolve(f, tokenizer).is_ok());
        if by_markers == Some(ToolFormat::DeepSeekV3) {
            // V3.1's template writes `NAME<｜tool▁sep｜>ARGS`; V3's fences the JSON.
            let template = tokenizer.chat_template().map(|t| t.source());
            let v31 = template.is_some_and(|t| t.contains("<｜tool▁sep｜>") && !t.contains("```json"));
            return Some(if v31 {
                ToolFormat::DeepSeekV31
            } else {
                ToolFormat::DeepSeekV3
            });
        }
        if by_markers.is_some() {
            return by_markers;
        }
        ToolMarkers::resolve(ToolFormat::Hermes, tokenizer).ok()?;
        let template = tokenizer.chat_template()?.source();
        match (template.contains("<function="), template.contains("<tool_call>")) {
            (true, _) => Some(ToolFormat::QwenXml),
            (false, true) => Some(ToolFormat::Hermes),
            (false, false) => None,
        }
    }

    /// The metrics label of the format.
    pub fn label(self) -> &'static str {
        match self {
            ToolFormat::KimiK2 => "kimi_k2",
            ToolFormat::KimiK3 => "kimi_k3",
            ToolFormat::DeepSeekV3 => "deepseek_v3",
            ToolFormat::DeepSeekV31 => "deepseek_v31",
            ToolFormat::Hermes => "hermes",
            ToolFormat::QwenXml => "qwen_xml",
            ToolFormat::Glm => "glm",
            ToolFormat::MiniMax => "minimax_m2",
            ToolFormat::Harmony => "harmony",
            ToolFormat::Dsml => "dsml",
        }
    }

    /// The marker tokens [`ToolMarkers::resolve`] looks up for this format (optional ones,
    /// `<think>` and `<|endoftext|>`, included): what a tokenizer must carry to speak it.
    pub fn marker_tokens(self) -> &'static [&'static str] {
        const DEEPSEEK: &[&str] = &[
            "<｜end▁of▁sentence｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "<think>",
            "</think>",
        ];
        const QWEN: &[&str] = &[
            "<|endoftext|>",
            "<|im_end|>",
            "<tool_call>",
            "</tool_call>",
            "<think>",
            "</think>",
        ];
        match self {
            ToolFormat::KimiK2 => &[
                "<|im_end|>",
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
                "<think>",
                "</think>",
            ],
            ToolFormat::KimiK3 => &["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"],
            ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => DEEPSEEK,
            ToolFormat::Hermes | ToolFormat::QwenXml => QWEN,
            ToolFormat::Glm => &[
                "<|endoftext|>",
                "<|observation|>",
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
            ],
            ToolFormat::MiniMax => &[
                "[e~[",
                "<think>",
                "</think>",
                "<minimax:tool_call>",
                "</minimax:tool_call>",
            ],
            ToolFormat::Harmony => &[
                "<|endoftext|>",
                "<|start|>",
                "<|channel|>",
                "<|message|>",
                "<|constrain|>",
                "<|end|>",
                "<|call|>",
                "<|return|>",
            ],
            ToolFormat::Dsml => &["<｜end▁of▁sentence｜>", "<think>", "</think>"],
        }
    }

    /// Whether the family's chat template reads a history call's `arguments` as a mapping
    /// (`arguments.items()`, `|items`, `|tojson`), so the JSON string an OpenAI client sends
    /// is decoded before rendering ([`crate::tokenizer::arguments_as_objects`]). Kimi's and
    /// DeepSeek-V3's templates print the string as it was sent.
    pub fn history_arguments_as_objects(self) -> bool {
        !matches!(
            self,
            ToolFormat::KimiK2
                | ToolFormat::KimiK3
                | ToolFormat::DeepSeekV3
                | ToolFormat::DeepSeekV31
                | ToolFormat::Dsml
        )
    }
}

/// DeepSeek-V3.2 DSML marker ids: the markup itself is text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmlMarkers {
    /// Which encoder's block (`function_calls` on V3.2, `tool_calls` on V4).
    pub version: crate::tokenizer::DsmlVersion,
    /// `<｜end▁of▁sentence｜>`: the end of the turn.
    pub end_of_sentence: u32,
    /// `<think>` / `</think>`, when the tokenizer has them.
    pub think: Option<(u32, u32)>,
}

/// gpt-oss harmony marker ids (all specials).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyMarkers {
    /// `<|start|>`: a message's role header.
    pub start: u32,
    /// `<|channel|>`.
    pub channel: u32,
    /// `<|message|>`: the end of a header.
    pub message: u32,
    /// `<|constrain|>`: the content type of a call's body.
    pub constrain: u32,
    /// `<|end|>`: the end of a message.
    pub end: u32,
    /// `<|call|>`: the end of a call (and of the turn).
    pub call: u32,
    /// `<|return|>`: the end of the final answer (and of the turn).
    pub ret: u32,
    /// `<|endoftext|>`, when the tokenizer has it (it ends generation).
    pub endoftext: Option<u32>,
}

/// A tokenizer lacks a marker token of the requested format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The token `token` of `format` is not in the vocabulary.
    #[error("the tokenizer has no {format:?} tool-call token `{token}`")]
    MissingToken {
        /// The format asked for.
        format: ToolFormat,
        /// The token text that is missing.
        token: &'static str,
    },
    /// The format is written by a native prompt encoder this tokenizer does not use (DSML:
    /// DeepSeek-V3.2's, for a `deepseek_v32` checkpoint that ships no chat template).
    #[error("{format:?} is the format of a native prompt encoder this tokenizer does not use")]
    NotNativeEncoder {
        /// The format asked for.
        format: ToolFormat,
    },
}

/// Kimi K2 marker ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct K2Markers {
    /// `<|tool_calls_section_begin|>`.
    pub section_begin: u32,
    /// `<|tool_calls_section_end|>`.
    pub section_end: u32,
    /// `<|tool_call_begin|>`.
    pub call_begin: u32,
    /// `<|tool_call_argument_begin|>`.
    pub argument_begin: u32,
    /// `<|tool_call_end|>`.
    pub call_end: u32,
    /// `<|im_end|>`: the end of the assistant turn.
    pub end_of_turn: u32,
    /// `<think>` / `</think>` (K2-Thinking), when the tokenizer has them.
    pub think: Option<(u32, u32)>,
}

/// Kimi K3 (XTML) marker ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct K3Markers {
    /// `<|open|>`.
    pub open: u32,
    /// `<|close|>`.
    pub close: u32,
    /// `<|sep|>`.
    pub sep: u32,
    /// `<|end_of_msg|>`: the end of the assistant turn.
    pub end_of_msg: u32,
}

/// DeepSeek-V3 marker ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeepSeekMarkers {
    /// `<｜tool▁calls▁begin｜>`.
    pub calls_begin: u32,
    /// `<｜tool▁calls▁end｜>`.
    pub calls_end: u32,
    /// `<｜tool▁call▁begin｜>`.
    pub call_begin: u32,
    /// `<｜tool▁call▁end｜>`.
    pub call_end: u32,
    /// `<｜tool▁sep｜>`.
    pub sep: u32,
    /// `<｜end▁of▁sentence｜>`: the end of the assistant turn.
    pub end_of_sentence: u32,
    /// `<think>` / `</think>` (R1-style reasoning), when the tokenizer has them.
    pub think: Option<(u32, u32)>,
}

/// The marker ids of a tagged format: calls between a begin and an end marker (Qwen's hermes
/// and XML, GLM, MiniMax-M2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedMarkers {
    /// `<tool_call>` (MiniMax: `<minimax:tool_call>`).
    pub call_begin: u32,
    /// `</tool_call>` (MiniMax: `</minimax:tool_call>`).
    pub call_end: u32,
    /// The end of the assistant turn: `<|im_end|>` (Qwen), `<|observation|>` (GLM, after
    /// calls), `[e~[` (MiniMax).
    pub end_of_turn: u32,
    /// `<think>` / `</think>`, when the tokenizer has them.
    pub think: Option<(u32, u32)>,
    /// GLM's `<arg_key>`, `</arg_key>`, `<arg_value>`, `</arg_value>`: marker tokens that
    /// belong inside a call.
    pub inner: Option<[u32; 4]>,
    /// GLM-4.7's spelling (also GLM-5's), as its chat template writes calls: no newlines
    /// between a call's parts or between calls (GLM-4.5/4.6 put one after each part).
    pub compact: bool,
    /// `<|endoftext|>`, when the tokenizer has it: it ends generation, so it never belongs in
    /// free text either.
    pub endoftext: Option<u32>,
}

/// The id of `format`'s marker `token`, or the typed error naming it.
fn marker(tokenizer: &Tokenizer, format: ToolFormat, token: &'static str) -> Result<u32, ToolError> {
    tokenizer
        .token_to_id(token)
        .ok_or(ToolError::MissingToken { format, token })
}

/// The marker ids of one format, resolved from a tokenizer once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolMarkers {
    /// Kimi K2.
    KimiK2(K2Markers),
    /// Kimi K3.
    KimiK3(K3Markers),
    /// DeepSeek-V3.
    DeepSeekV3(DeepSeekMarkers),
    /// DeepSeek-V3.1 (the same markers).
    DeepSeekV31(DeepSeekMarkers),
    /// Qwen hermes.
    Hermes(TaggedMarkers),
    /// Qwen3.5 XML.
    QwenXml(TaggedMarkers),
    /// GLM.
    Glm(TaggedMarkers),
    /// MiniMax-M2.
    MiniMax(TaggedMarkers),
    /// gpt-oss harmony.
    Harmony(HarmonyMarkers),
    /// DeepSeek-V3.2 DSML.
    Dsml(DsmlMarkers),
}

impl ToolMarkers {
    /// Look up `format`'s marker tokens in `tokenizer`.
    pub fn resolve(format: ToolFormat, tokenizer: &Tokenizer) -> Result<ToolMarkers, ToolError> {
        let id = |token: &'static str| marker(tokenizer, format, token);
        let pair = |a: &'static str, b: &'static str| id(a).ok().zip(id(b).ok());
        Ok(match format {
            ToolFormat::KimiK2 => ToolMarkers::KimiK2(K2Markers {
                section_begin: id("<|tool_calls_section_begin|>")?,
                section_end: id("<|tool_calls_section_end|>")?,
                call_begin: id("<|tool_call_begin|>")?,
                argument_begin: id("<|tool_call_argument_begin|>")?,
                call_end: id("<|tool_call_end|>")?,
                end_of_turn: id("<|im_end|>")?,
                think: pair("<think>", "</think>"),
            }),
            ToolFormat::KimiK3 => {
                let open = id("<|open|>")?;
                let close = id("<|close|>")?;
                let sep = id("<|sep|>")?;
                // The XTML markers are specials; a tokenizer with them as text is not K3.
                if ![open, close, sep].iter().all(|&t| tokenizer.is_special(t)) {
                    return Err(ToolError::MissingToken {
                        format,
                        token: "<|open|>",
                    });
                }
                ToolMarkers::KimiK3(K3Markers {
                    open,
                    close,
                    sep,
                    end_of_msg: id("<|end_of_msg|>")?,
                })
            }
            ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => {
                let m = DeepSeekMarkers {
                    calls_begin: id("<｜tool▁calls▁begin｜>")?,
                    calls_end: id("<｜tool▁calls▁end｜>")?,
                    call_begin: id("<｜tool▁call▁begin｜>")?,
                    call_end: id("<｜tool▁call▁end｜>")?,
                    sep: id("<｜tool▁sep｜>")?,
                    end_of_sentence: id("<｜end▁of▁sentence｜>")?,
                    think: pair("<think>", "</think>"),
                };
                match format {
                    ToolFormat::DeepSeekV3 => ToolMarkers::DeepSeekV3(m),
                    _ => ToolMarkers::DeepSeekV31(m),
                }
            }
            ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Glm | ToolFormat::MiniMax => {
                Self::tagged(format, tokenizer)?
            }
            ToolFormat::Harmony => Self::harmony(tokenizer)?,
            ToolFormat::Dsml if let Some(version) = tokenizer.dsml_version() => {
                ToolMarkers::Dsml(DsmlMarkers {
                    version,
                    end_of_sentence: id("<｜end▁of▁sentence｜>")?,
                    think: pair("<think>", "</think>"),
                })
            }
            ToolFormat::Dsml => return Err(ToolError::NotNativeEncoder { format }),
        })
    }

    /// The markers of a tagged format (Qwen's two, GLM, MiniMax-M2).
    fn tagged(format: ToolFormat, tokenizer: &Tokenizer) -> Result<ToolMarkers, ToolError> {
        let id = |token: &'static str| marker(tokenizer, format, token);
        let (begin, end, end_of_turn) = match format {
            ToolFormat::Glm => ("<tool_call>", "</tool_call>", "<|observation|>"),
            ToolFormat::MiniMax => ("<minimax:tool_call>", "</minimax:tool_call>", "[e~["),
            _ => ("<tool_call>", "</tool_call>", "<|im_end|>"),
        };
        let inner = match format {
            ToolFormat::Glm => Some([
                id("<arg_key>")?,
                id("</arg_key>")?,
                id("<arg_value>")?,
                id("</arg_value>")?,
            ]),
            _ => None,
        };
        let m = TaggedMarkers {
            call_begin: id(begin)?,
            call_end: id(end)?,
            end_of_turn: id(end_of_turn)?,
            think: id("<think>").ok().zip(id("</think>").ok()),
            inner,
            // GLM-4.7's template writes `</arg_key><arg_value>` with nothing between.
            compact: inner.is_some()
                && tokenizer
                    .chat_template()
                    .is_some_and(|t| t.source().contains("</arg_key><arg_value>")),
            endoftext: tokenizer.token_to_id("<|endoftext|>"),
        };
        Ok(match format {
            ToolFormat::Hermes => ToolMarkers::Hermes(m),
            ToolFormat::QwenXml => ToolMarkers::QwenXml(m),
            ToolFormat::Glm => ToolMarkers::Glm(m),
            _ => ToolMarkers::MiniMax(m),
        })
    }

    /// gpt-oss's harmony markers (all specials; a tokenizer with them as text is not harmony).
    fn harmony(tokenizer: &Tokenizer) -> Result<ToolMarkers, ToolError> {
        let id = |token: &'static str| marker(tokenizer, ToolFormat::Harmony, token);
        let m = HarmonyMarkers {
            start: id("<|start|>")?,
            channel: id("<|channel|>")?,
            message: id("<|message|>")?,
            constrain: id("<|constrain|>")?,
            end: id("<|end|>")?,
            call: id("<|call|>")?,
            ret: id("<|return|>")?,
            endoftext: tokenizer.token_to_id("<|endoftext|>"),
        };
        let ids = [m.start, m.channel, m.message, m.constrain, m.end, m.call, m.ret];
        if !ids.iter().all(|&t| tokenizer.is_special(t)) {
            return Err(ToolError::MissingToken {
                format: ToolFormat::Harmony,
                token: "<|channel|>",
            });
        }
        Ok(ToolMarkers::Harmony(m))
    }

    /// Which format these markers belong to.
    pub fn format(&self) -> ToolFormat {
        match self {
            ToolMarkers::KimiK2(_) => ToolFormat::KimiK2,
            ToolMarkers::KimiK3(_) => ToolFormat::KimiK3,
            ToolMarkers::DeepSeekV3(_) => ToolFormat::DeepSeekV3,
            ToolMarkers::DeepSeekV31(_) => ToolFormat::DeepSeekV31,
            ToolMarkers::Hermes(_) => ToolFormat::Hermes,
            ToolMarkers::QwenXml(_) => ToolFormat::QwenXml,
            ToolMarkers::Glm(_) => ToolFormat::Glm,
            ToolMarkers::MiniMax(_) => ToolFormat::MiniMax,
            ToolMarkers::Harmony(_) => ToolFormat::Harmony,
            ToolMarkers::Dsml(_) => ToolFormat::Dsml,
        }
    }

    /// The reasoning markers, when the format's tokenizer has them.
    pub fn think(&self) -> Option<(u32, u32)> {
        match self {
            ToolMarkers::KimiK2(m) => m.think,
            ToolMarkers::DeepSeekV3(m) | ToolMarkers::DeepSeekV31(m) => m.think,
            ToolMarkers::Dsml(m) => m.think,
            ToolMarkers::KimiK3(_) | ToolMarkers::Harmony(_) => None,
            ToolMarkers::Hermes(t)
            | ToolMarkers::QwenXml(t)
            | ToolMarkers::Glm(t)
            | ToolMarkers::MiniMax(t) => t.think,
        }
    }

    /// The token that ends the assistant turn in this format.
    pub fn end_of_turn(&self) -> u32 {
        match self {
            ToolMarkers::KimiK2(m) => m.end_of_turn,
            ToolMarkers::KimiK3(m) => m.end_of_msg,
            ToolMarkers::DeepSeekV3(m) | ToolMarkers::DeepSeekV31(m) => m.end_of_sentence,
            ToolMarkers::Dsml(m) => m.end_of_sentence,
            ToolMarkers::Harmony(m) => m.ret,
            ToolMarkers::Hermes(t)
            | ToolMarkers::QwenXml(t)
            | ToolMarkers::Glm(t)
            | ToolMarkers::MiniMax(t) => t.end_of_turn,
        }
    }

    /// Every structural id of the format (markers that never belong inside free text).
    pub fn structural_ids(&self) -> Vec<u32> {
        let mut ids = match self {
            ToolMarkers::KimiK2(m) => vec![
                m.section_begin,
                m.section_end,
                m.call_begin,
                m.argument_begin,
                m.call_end,
                m.end_of_turn,
            ],
            ToolMarkers::KimiK3(m) => vec![m.open, m.close, m.sep, m.end_of_msg],
            ToolMarkers::Dsml(m) => vec![m.end_of_sentence],
            ToolMarkers::Harmony(m) => {
                let mut ids = vec![m.start, m.channel, m.message, m.constrain, m.end, m.call, m.ret];
                ids.extend(m.endoftext);
                ids
            }
            ToolMarkers::DeepSeekV3(m) | ToolMarkers::DeepSeekV31(m) => vec![
                m.calls_begin,
                m.calls_end,
                m.call_begin,
                m.call_end,
                m.sep,
                m.end_of_sentence,
            ],
            ToolMarkers::Hermes(t)
            | ToolMarkers::QwenXml(t)
            | ToolMarkers::Glm(t)
            | ToolMarkers::MiniMax(t) => {
                let mut ids = vec![t.call_begin, t.call_end, t.end_of_turn];
                ids.extend(t.inner.into_iter().flatten());
                ids.extend(t.endoftext);
                ids
            }
        };
        ids.extend(self.think().into_iter().flat_map(|(a, b)| [a, b]));
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// One step of parsed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// A token outside every call (content, reasoning, other markers): handle it as ordinary
    /// output. Released in order, possibly later than pushed (a held-back partial marker).
    Token(u32),
    /// A tool-call section began (the model left its reasoning, if it was in it).
    SectionStart,
    /// A complete, well-formed call begins: its OpenAI id and function name.
    CallStart {
        /// Position of the call among this response's calls, from 0.
        index: usize,
        /// The OpenAI `tool_calls[].id` (K2: the model's `functions.NAME:IDX`; else minted).
        id: String,
        /// The function name.
        name: String,
    },
    /// A piece of the call's arguments JSON string; the pieces concatenate to the whole.
    ArgumentsDelta {
        /// The call's index.
        index: usize,
        /// The next piece of the arguments string.
        fragment: String,
    },
    /// The call is complete.
    CallEnd {
        /// The call's index.
        index: usize,
    },
    /// A call that did not parse: its ids, markers included, to be shown as text.
    Malformed(Vec<u32>),
    /// Call markup the output ended inside (the token limit, a stop id, the context): its ids,
    /// which are withheld — never content, never a call.
    CutOff(Vec<u32>),
}

/// The OpenAI id minted for call `index` of a response whose callers chose `prefix`
/// (request-unique, e.g. the completion id): `call_{prefix}_{index}`, or `call_{index}`.
pub fn mint_call_id(prefix: &str, index: usize) -> String {
    if prefix.is_empty() {
        format!("call_{index}")
    } else {
        format!("call_{prefix}_{index}")
    }
}
