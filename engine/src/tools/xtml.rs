//! Kimi K3 (XTML) tool calls. A tag is `<|open|>` or `<|close|>`, a plain-text head (the
//! element name and ` key="value"` attributes), then `<|sep|>`. Outside the `tools` element
//! every id passes through (the reasoning split reads the `think` / `response` elements); an
//! `<|open|>` is held only while its head can still become `tools`, then released. Inside, calls
//! are buffered until `<|close|>call<|sep|>` and turned into a JSON arguments object: a
//! `type="string"` value is the raw text, any other type is JSON text, and one raw
//! `<|open|>json type="object"<|sep|>…<|close|>json<|sep|>` block is the whole arguments.
//! Attribute values reverse the renderer's escapes (`&quot;`, then `&amp;`).

use super::K3Markers;
use super::parser::{Out, ParsedCall, is_blank, is_json_object, text_of};
use crate::tokenizer::Tokenizer;

/// Longest tag head (in tokens) before the tag is given up.
const MAX_HEAD_TOKENS: usize = 256;

/// A tag being read: whether it opens, and its ids from the `<|open|>`/`<|close|>` on.
#[derive(Debug)]
struct Tag {
    open: bool,
    ids: Vec<u32>,
}

#[derive(Debug)]
enum ValueKind {
    Argument { key: String, string: bool },
    Json,
}

/// A call being read.
#[derive(Debug, Default)]
struct CallBuf {
    raw: Vec<u32>,
    name: Option<String>,
    /// `(key, JSON text of the value)` in the model's order.
    members: Vec<(String, String)>,
    raw_json: Option<String>,
    /// The value being read and its ids.
    value: Option<(ValueKind, Vec<u32>)>,
    bad: bool,
}

#[derive(Debug)]
enum State {
    Outside,
    Tools,
    Call(CallBuf),
}

/// The K3 state machine.
#[derive(Debug)]
pub(super) struct XtmlParser {
    m: K3Markers,
    state: State,
    tag: Option<Tag>,
}

impl XtmlParser {
    pub(super) fn new(m: K3Markers) -> Self {
        XtmlParser {
            m,
            state: State::Outside,
            tag: None,
        }
    }

    pub(super) fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<Out>) {
        if let Some(tag) = &mut self.tag {
            if id == self.m.sep {
                let mut tag = self.tag.take().unwrap_or(Tag {
                    open: false,
                    ids: Vec::new(),
                });
                tag.ids.push(id);
                self.on_tag(tok, tag, out);
                return;
            }
            if id != self.m.open && id != self.m.close && !tok.is_special(id) {
                tag.ids.push(id);
                let outside = matches!(self.state, State::Outside);
                if (outside && !could_be_tools(tok, &tag.ids[1..])) || tag.ids.len() > MAX_HEAD_TOKENS {
                    self.broken_tag(out);
                }
                return;
            }
            // A tag interrupted by another marker: not a tag; the marker is read afresh.
            self.broken_tag(out);
        }
        if let State::Call(call) = &mut self.state
            && let Some((_, value)) = &mut call.value
            && id != self.m.close
        {
            if id == self.m.open || id == self.m.sep || tok.is_special(id) {
                call.bad = true;
                self.end_call(out);
                self.push(tok, id, out);
            } else {
                value.push(id);
                call.raw.push(id);
            }
            return;
        }
        if id == self.m.open || (id == self.m.close && !matches!(self.state, State::Outside)) {
            self.tag = Some(Tag {
                open: id == self.m.open,
                ids: vec![id],
            });
            return;
        }
        self.on_plain(tok, id, out);
    }

    pub(super) fn finish(&mut self, out: &mut Vec<Out>) {
        if matches!(self.state, State::Tools)
            && let Some(tag) = self.tag.take()
        {
            // The output ended inside a tag of the tools element (a call cut off).
            out.push(Out::Malformed(tag.ids));
        }
        if self.tag.is_some() {
            self.broken_tag(out);
        }
        if let State::Call(call) = &mut self.state {
            call.bad = true;
            self.end_call(out);
        }
        self.state = State::Outside;
    }

    /// A non-marker id outside any tag.
    fn on_plain(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<Out>) {
        match &mut self.state {
            State::Outside => out.push(Out::Token(id)),
            State::Tools if id == self.m.end_of_msg => {
                self.state = State::Outside;
                out.push(Out::Token(id));
            }
            State::Tools if is_blank(tok, id) => {}
            State::Tools => out.push(Out::Token(id)),
            State::Call(call) if id == self.m.end_of_msg || tok.is_special(id) => {
                call.bad = true;
                self.end_call(out);
                self.state = State::Outside;
                out.push(Out::Token(id));
            }
            State::Call(call) => {
                call.bad |= !is_blank(tok, id);
                call.raw.push(id);
            }
        }
    }

    /// The held tag is not a tag after all.
    fn broken_tag(&mut self, out: &mut Vec<Out>) {
        let Some(tag) = self.tag.take() else { return };
        match &mut self.state {
            State::Call(call) => {
                call.bad = true;
                call.raw.extend(tag.ids);
            }
            _ => out.extend(tag.ids.into_iter().map(Out::Token)),
        }
    }

    /// A complete tag (ids from the open/close marker through `<|sep|>`).
    fn on_tag(&mut self, tok: &Tokenizer, tag: Tag, out: &mut Vec<Out>) {
        let head = text_of(tok, &tag.ids[1..tag.ids.len() - 1]).and_then(|h| parse_head(&h));
        let (name, attrs) = head.unwrap_or_default();
        match &mut self.state {
            State::Outside if tag.open && name == "tools" && attrs.is_empty() => {
                self.state = State::Tools;
                out.push(Out::SectionStart);
            }
            State::Tools if tag.open && name == "call" => {
                self.state = State::Call(CallBuf {
                    name: attr(&attrs, "tool"),
                    bad: attr(&attrs, "tool").is_none_or(|n| n.is_empty()),
                    raw: tag.ids,
                    ..CallBuf::default()
                });
            }
            State::Tools if !tag.open && name == "tools" => self.state = State::Outside,
            State::Tools => {
                // Anything else ends the tools element without its closing tag.
                self.state = State::Outside;
                out.extend(tag.ids.into_iter().map(Out::Token));
            }
            State::Outside => out.extend(tag.ids.into_iter().map(Out::Token)),
            State::Call(call) => {
                if call.value.is_some() {
                    close_value(tok, call, tag.open, &name);
                    call.raw.extend(tag.ids);
                } else if tag.open && name == "argument" {
                    let key = attr(&attrs, "key");
                    let ty = attr(&attrs, "type");
                    call.bad |= key.is_none() || ty.is_none();
                    call.value = Some((
                        ValueKind::Argument {
                            key: key.unwrap_or_default(),
                            string: ty.as_deref() == Some("string"),
                        },
                        Vec::new(),
                    ));
                    call.raw.extend(tag.ids);
                } else if tag.open && name == "json" {
                    call.value = Some((ValueKind::Json, Vec::new()));
                    call.raw.extend(tag.ids);
                } else if !tag.open && name == "call" {
                    call.raw.extend(tag.ids);
                    self.end_call(out);
                } else {
                    // The call never closed: it is text; the tag is read afresh.
                    call.bad = true;
                    self.end_call(out);
                    self.on_tag(tok, tag, out);
                }
            }
        }
    }

    /// Report the current call (or its ids as malformed) and return to the tools element.
    fn end_call(&mut self, out: &mut Vec<Out>) {
        let State::Call(call) = std::mem::replace(&mut self.state, State::Tools) else {
            return;
        };
        match build_call(&call) {
            Some(c) => out.push(Out::Call(c)),
            None => out.push(Out::Malformed(call.raw)),
        }
    }
}

/// Whether a tag head read so far (`ids` after `<|open|>`) can still become `tools`.
fn could_be_tools(tok: &Tokenizer, ids: &[u32]) -> bool {
    b"tools".starts_with(&tok.decode_bytes(ids))
}

/// The closing tag of a value: it must close the element the value opened.
fn close_value(tok: &Tokenizer, call: &mut CallBuf, open: bool, name: &str) {
    let Some((kind, ids)) = call.value.take() else {
        return;
    };
    let Some(text) = text_of(tok, &ids) else {
        call.bad = true;
        return;
    };
    match kind {
        ValueKind::Argument { key, string } if !open && name == "argument" => {
            let value = if string {
                serde_json::to_string(&text).unwrap_or_default()
            } else if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
                text.trim().to_string()
            } else {
                call.bad = true;
                return;
            };
            call.members.push((key, value));
        }
        ValueKind::Json if !open && name == "json" && call.raw_json.is_none() => call.raw_json = Some(text),
        _ => call.bad = true,
    }
}

/// The arguments JSON of a complete call, if it is well formed.
fn build_call(call: &CallBuf) -> Option<ParsedCall> {
    if call.bad || call.value.is_some() {
        return None;
    }
    let arguments = match &call.raw_json {
        Some(raw) if call.members.is_empty() && is_json_object(raw) => raw.clone(),
        Some(_) => return None,
        None => {
            let members: Vec<String> = call
                .members
                .iter()
                .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).unwrap_or_default()))
                .collect();
            format!("{{{}}}", members.join(","))
        }
    };
    Some(ParsedCall {
        name: call.name.clone()?,
        arguments,
    })
}

/// Split a tag head `name key="v" …` into the name and unescaped attributes.
pub(super) fn parse_head(head: &str) -> Option<(String, Vec<(String, String)>)> {
    let (name, mut rest) = match head.find(' ') {
        Some(i) => (&head[..i], &head[i..]),
        None => (head, ""),
    };
    let mut attrs = Vec::new();
    while !rest.is_empty() {
        let after = rest.strip_prefix(' ')?;
        let (key, value_and_rest) = after.split_once("=\"")?;
        let (value, tail) = value_and_rest.split_once('"')?;
        if key.is_empty() || key.contains([' ', '"']) {
            return None;
        }
        attrs.push((key.to_string(), unescape_attr(value)));
        rest = tail;
    }
    Some((name.to_string(), attrs))
}

fn attr(attrs: &[(String, String)], key: &str) -> Option<String> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// Reverse the renderer's attribute escapes: `&quot;` first, then `&amp;`.
pub(super) fn unescape_attr(value: &str) -> String {
    value.replace("&quot;", "\"").replace("&amp;", "&")
}

/// The renderer's attribute escapes: `&` → `&amp;`, then `"` → `&quot;`.
pub(super) fn escape_attr(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}
