//! DeepSeek-V3.2's and V4's DSML tool calls, read from the output as their published parsers do
//! (`encoding_dsv32.py` / `encoding_dsv4.py`, `parse_message_from_completion_text` /
//! `parse_tool_calls`; V4's block is `tool_calls` where V3.2's is `function_calls`):
//!
//! ```text
//! \n\n<｜DSML｜function_calls>
//! <｜DSML｜invoke name="NAME">
//! <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜function_calls><｜end▁of▁sentence｜>
//! ```
//!
//! The markup is text, not marker tokens, so the block is found in the decoded bytes: ids whose
//! text could still begin `\n\n<｜DSML｜function_calls` are held back until it is certain, and a
//! token can only be given out whole (a token that holds both answer text and the start of the
//! block goes to the block). A value with `string="true"` is the raw text; with `string="false"`
//! it is JSON, and a value that does not decode makes the call malformed (the reference pastes
//! it into the arguments unchecked). Each call is reported once its `</｜DSML｜invoke` arrives,
//! so a block cut off by `max_tokens` keeps its complete calls; a block must hold at least one
//! call, and only blank text may follow it before the end of the turn.

use serde_json::{Map, Value};

use super::parser::{Out, ParsedCall, is_blank, valid_name};
use crate::tokenizer::{DsmlVersion, Tokenizer};

/// The prefix of every DSML tag.
pub(super) const DSML: &str = "｜DSML｜";
const INVOKE: &str = "<｜DSML｜invoke";
const INVOKE_END: &str = "</｜DSML｜invoke";
const PARAM: &str = "<｜DSML｜parameter";
const PARAM_END: &str = "/｜DSML｜parameter";

#[derive(Debug)]
enum State {
    /// Answer text; the ids whose bytes could still start a block, held.
    Outside(Vec<u32>),
    /// A block from the token where it starts: its ids and their bytes (appended token by
    /// token); `skip`: bytes of that first token before the block; `emitted`: its calls
    /// reported so far (each as soon as its `</｜DSML｜invoke` arrives); `failed`: it can no
    /// longer parse, and the rest of it is taken in until its end, so none of its markup
    /// reaches the text.
    Block {
        raw: Vec<u32>,
        bytes: Vec<u8>,
        skip: usize,
        emitted: usize,
        failed: bool,
    },
    /// After a block: blank tokens are formatting until the end of the turn.
    After,
}

/// The DSML state machine.
#[derive(Debug)]
pub(super) struct DsmlParser {
    state: State,
    /// What opens a block (the reference's `tool_calls_start_token`) and what closes it.
    start: &'static str,
    end: &'static str,
}

impl DsmlParser {
    pub(super) fn new(version: DsmlVersion) -> Self {
        DsmlParser {
            state: State::Outside(Vec::new()),
            start: version.block_start(),
            end: version.block_end(),
        }
    }

    pub(super) fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<Out>) {
        match &mut self.state {
            State::Outside(held) => {
                if tok.is_special(id) {
                    out.extend(held.drain(..).map(Out::Token));
                    out.push(Out::Token(id));
                    return;
                }
                held.push(id);
                self.scan(tok, out);
            }
            State::Block { raw, bytes, .. } => {
                if tok.is_special(id) {
                    // The block never closed: the marker is read afresh.
                    out.push(Out::Malformed(std::mem::take(raw)));
                    self.state = State::Outside(Vec::new());
                    return self.push(tok, id, out);
                }
                raw.push(id);
                bytes.extend(tok.decode_bytes(&[id]));
                self.try_close(out);
            }
            State::After => {
                // Blank text is formatting; the end of the turn and anything else are read as
                // answer text again.
                if !is_blank(tok, id) {
                    self.state = State::Outside(Vec::new());
                    self.push(tok, id, out);
                }
            }
        }
    }

    /// Give out the held ids that cannot begin a block; enter the block when one has begun.
    fn scan(&mut self, tok: &Tokenizer, out: &mut Vec<Out>) {
        let State::Outside(held) = &mut self.state else {
            return;
        };
        let bytes = tok.decode_bytes(held);
        let (keep_from, block) = match find(&bytes, self.start.as_bytes()) {
            Some(at) => (at, true),
            None => (
                bytes.len() - longest_prefix_suffix(&bytes, self.start.as_bytes()),
                false,
            ),
        };
        // Whole tokens before `keep_from` are answer text.
        let mut pos = 0;
        let mut first = 0;
        for &id in held.iter() {
            let len = tok.decode_bytes(&[id]).len();
            if pos + len > keep_from {
                break;
            }
            pos += len;
            first += 1;
        }
        out.extend(held.drain(..first).map(Out::Token));
        if block {
            self.state = State::Block {
                raw: std::mem::take(held),
                bytes: bytes[pos..].to_vec(),
                skip: keep_from - pos,
                emitted: 0,
                failed: false,
            };
            self.try_close(out);
        }
    }

    /// Report the calls the block holds so far; at its end, leave it (or give it up as
    /// malformed, once the whole block has arrived).
    fn try_close(&mut self, out: &mut Vec<Out>) {
        let (start, end_tag) = (self.start, self.end);
        let State::Block {
            raw,
            bytes,
            skip,
            emitted,
            failed,
        } = &mut self.state
        else {
            return;
        };
        let rest = &bytes[*skip + start.len()..];
        let end = find(rest, end_tag.as_bytes());
        if *failed {
            if end.is_some() {
                out.push(Out::Malformed(std::mem::take(raw)));
                self.state = State::After;
            }
            return;
        }
        let body = &rest[..end.unwrap_or(rest.len())];
        // A token may end inside a character: read the whole characters so far.
        let text = std::str::from_utf8(body)
            .or_else(|e| std::str::from_utf8(&body[..e.valid_up_to()]))
            .unwrap_or_default();
        let parsed = match end {
            Some(_) => parse_calls(&format!("{text}{end_tag}"), end_tag).filter(|c| !c.is_empty()),
            None => parse_calls(text, end_tag),
        };
        let trailing_ok = end.is_none_or(|e| rest[e + end_tag.len()..].iter().all(u8::is_ascii_whitespace));
        match parsed.filter(|_| trailing_ok) {
            Some(calls) => {
                for call in calls.into_iter().skip(*emitted) {
                    if *emitted == 0 {
                        out.push(Out::SectionStart);
                    }
                    *emitted += 1;
                    out.push(Out::Call(call));
                }
                if end.is_some() {
                    self.state = State::After;
                }
            }
            // Still arriving: take in the rest of the block first.
            None if end.is_none() => *failed = true,
            None => {
                out.push(Out::Malformed(std::mem::take(raw)));
                self.state = State::Outside(Vec::new());
            }
        }
    }

    pub(super) fn finish(&mut self, out: &mut Vec<Out>) {
        match std::mem::replace(&mut self.state, State::Outside(Vec::new())) {
            State::Outside(held) => out.extend(held.into_iter().map(Out::Token)),
            State::Block { raw, .. } => out.push(Out::Malformed(raw)),
            State::After => {}
        }
    }
}

/// The first position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest suffix of `bytes` that is a proper prefix of `start`.
fn longest_prefix_suffix(bytes: &[u8], start: &[u8]) -> usize {
    (1..start.len().min(bytes.len() + 1))
        .rev()
        .find(|&k| bytes.ends_with(&start[..k]))
        .unwrap_or(0)
}

/// The reference's `_read_until_stop`: the text from `at` to the earliest of `stops`, and the
/// position after it (`None`: no stop follows).
fn read_until<'a>(s: &'a str, at: usize, stops: &[&'static str]) -> Option<(&'a str, usize, &'static str)> {
    stops
        .iter()
        .filter_map(|stop| s[at..].find(stop).map(|p| (p, *stop)))
        .min_by_key(|(p, _)| *p)
        .map(|(p, stop)| (&s[at..at + p], at + p + stop.len(), stop))
}

/// The calls of a block's text after its opening (`\n\n<｜DSML｜function_calls` or
/// `…tool_calls`), read as `parse_tool_calls` reads it: each call once its `</｜DSML｜invoke` has
/// arrived. The text may stop anywhere (the block is still arriving) or end with the closing
/// tag `end`; `None`: malformed.
fn parse_calls(text: &str, end: &'static str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut at = 0;
    loop {
        let Some((between, next, stop)) = read_until(text, at, &[INVOKE, end]) else {
            // Still arriving: what follows must be able to become the next call or the end.
            let tail = &text[at..];
            let ok = [INVOKE, end]
                .iter()
                .any(|next| format!(">\n{next}").starts_with(tail));
            return ok.then_some(calls);
        };
        if between != ">\n" {
            return None;
        }
        if stop == end {
            return Some(calls);
        }
        let Some((head, mut next, mut stop)) = read_until(text, next, &[PARAM, INVOKE_END]) else {
            return Some(calls);
        };
        let name = valid_name(invoke_name(head)?)?.to_string();
        let mut arguments = Map::new();
        while stop == PARAM {
            let Some((param, after, _)) = read_until(text, next, &[PARAM_END]) else {
                return Some(calls);
            };
            let (key, value) = parameter(param)?;
            if arguments.insert(key.to_string(), value).is_some() {
                return None;
            }
            let Some((between, after, found)) = read_until(text, after, &[PARAM, INVOKE_END]) else {
                return Some(calls);
            };
            if between != ">\n" {
                return None;
            }
            (next, stop) = (after, found);
        }
        calls.push(ParsedCall {
            name,
            arguments: Value::Object(arguments).to_string(),
        });
        at = next;
    }
}

/// `name="NAME">\n` after optional whitespace (Python's `$` also allows one more newline).
fn invoke_name(head: &str) -> Option<&str> {
    let rest = head.trim_start().strip_prefix("name=\"")?;
    let rest = rest.strip_suffix('\n').unwrap_or(rest);
    rest.strip_suffix("\">\n")
        .or_else(|| rest.strip_suffix("\">"))
        .filter(|_| head.ends_with(">\n") || head.ends_with(">\n\n"))
}

/// ` name="K" string="true|false">V<`: the key and the typed value.
fn parameter(param: &str) -> Option<(&str, Value)> {
    let rest = param.strip_prefix(" name=\"")?.strip_suffix('<')?;
    let (key, rest) = rest.split_once("\" string=\"")?;
    let (string, value) = rest.split_once("\">")?;
    let value = match string {
        "true" => Value::String(value.to_string()),
        "false" => serde_json::from_str(value).ok()?,
        _ => return None,
    };
    Some((key, value))
}

/// `text` without its DSML tags (`<｜DSML｜…>` and `</｜DSML｜…>`, attributes included): what a
/// malformed block shows as text, its markers removed as the marker tokens of the other formats
/// are. A tag the text ends inside is removed to the end.
pub(super) fn strip_tags(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(DSML) {
        let open = match rest[..at].strip_suffix("</") {
            Some(before) => before.len(),
            None => rest[..at].strip_suffix('<').map_or(at, str::len),
        };
        if open == at {
            // `｜DSML｜` outside a tag: text.
            out.push_str(&rest[..at + DSML.len()]);
            rest = &rest[at + DSML.len()..];
            continue;
        }
        out.push_str(&rest[..open]);
        rest = rest[at..].find('>').map_or("", |end| &rest[at + end + 1..]);
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = DsmlVersion::V32.block_start();
    const END: &str = DsmlVersion::V32.block_end();

    const CALL: &str = ">\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Oslo, \"NO\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n\n</｜DSML｜invoke>\n";

    #[test]
    fn a_block_reads_as_the_reference_reads_it() {
        let calls = parse_calls(&format!("{CALL}{END}"), END).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo, \"NO\"","days":2}"#);
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("get_time", "{}")
        );
    }

    #[test]
    fn malformed_blocks_are_refused() {
        for bad in [
            "",
            ">\n",
            CALL.replacen("string=\"false\">2", "string=\"false\">two", 1)
                .as_str(),
            CALL.replacen("string=\"true\"", "string=\"yes\"", 1).as_str(),
            CALL.replacen("\"days\"", "\"city\"", 1).as_str(),
            CALL.replacen(">\n<｜DSML｜invoke", "> <｜DSML｜invoke", 1)
                .as_str(),
            CALL.replacen("name=\"get_weather\"", "name=\"get weather\"", 1)
                .as_str(),
        ] {
            let calls = parse_calls(&format!("{bad}{END}"), END);
            assert!(calls.is_none_or(|c| c.is_empty()), "{bad:?}");
        }
    }

    #[test]
    fn stripping_leaves_the_text_between_the_tags() {
        let text = format!("Sure.\n\n<｜DSML｜function_calls{CALL}{END}");
        assert_eq!(strip_tags(&text), "Sure.\n\n\n\nOslo, \"NO\"\n2\n\n\n\n\n");
        assert_eq!(
            strip_tags("a ｜DSML｜ b <｜DSML｜invoke name=\"x"),
            "a ｜DSML｜ b "
        );
        assert_eq!(strip_tags("no tags"), "no tags");
    }

    #[test]
    fn a_block_still_arriving_gives_its_complete_calls() {
        let cut = CALL.find("<｜DSML｜invoke name=\"get_time\"").unwrap();
        assert_eq!(parse_calls(&CALL[..cut], END).unwrap().len(), 1);
        assert_eq!(parse_calls(">", END).unwrap().len(), 0);
        assert!(parse_calls(">x", END).is_none());
        assert_eq!(parse_calls(">\n<｜DSM", END).unwrap().len(), 0);
    }

    #[test]
    fn the_held_suffix_is_the_longest_possible_block_start() {
        assert_eq!(longest_prefix_suffix(b"Done.\n", START.as_bytes()), 1);
        assert_eq!(longest_prefix_suffix(b"Done.\n\n<", START.as_bytes()), 3);
        assert_eq!(longest_prefix_suffix(b"Done.", START.as_bytes()), 0);
        assert_eq!(longest_prefix_suffix(b"\n\n<x", START.as_bytes()), 0);
    }
}
