//! Tagged tool calls: blocks between a begin and an end marker token (no section marker), the
//! body in one of four syntaxes ([`Body`]):
//! * Qwen hermes JSON `{"name": NAME, "arguments": {…}}` (Qwen3, Qwen3-MoE, Qwen3-Next);
//! * Qwen3.5's XML `<function=NAME>` with `<parameter=K>\nV\n</parameter>` blocks;
//! * GLM's `NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs;
//! * MiniMax-M2's `<invoke name="NAME">` elements of `<parameter name="K">V</parameter>`, one
//!   block holding every call of the turn.
//!
//! Values of the XML-like syntaxes are typed by the tool's schema. Qwen3.5 as Qwen's own
//! `qwen3_coder` parser does: a `string` parameter (or one the schema does not type) stays the
//! raw text; numbers, booleans, null, objects and arrays are decoded from JSON, and a value that
//! does not decode as its type makes the call malformed. GLM and MiniMax-M2 as their published
//! parsers do: a `string` parameter stays text (GLM: trimmed), any other value is decoded from
//! JSON when it decodes and kept as text when it does not (GLM also decodes parameters the
//! schema does not know; MiniMax keeps them as text).
//!
//! Whitespace between calls is formatting, dropped when another call or the end of the turn
//! follows; before anything else it is content again.

use std::collections::HashMap;

use serde_json::Value;

use super::TaggedMarkers;
use super::grammar::resolve_ref;
use super::parser::{Out, ParsedCall, is_blank, text_of, valid_name};
use crate::tokenizer::Tokenizer;

/// Which body the calls carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Body {
    Hermes,
    Xml,
    Glm,
    MiniMax,
}

#[derive(Debug)]
enum State {
    Outside,
    /// A call from its opening marker on.
    Call(Vec<u32>),
    /// After a call: the blank tokens since, held.
    AfterCall(Vec<u32>),
}

/// The tagged-call state machine.
#[derive(Debug)]
pub(super) struct TaggedParser {
    m: TaggedMarkers,
    body: Body,
    /// Each tool's `parameters` schema, by name (the value types of the XML-like bodies).
    schemas: HashMap<String, Value>,
    state: State,
    started: bool,
}

impl TaggedParser {
    pub(super) fn new(m: TaggedMarkers, body: Body, schemas: HashMap<String, Value>) -> Self {
        TaggedParser {
            m,
            body,
            schemas,
            state: State::Outside,
            started: false,
        }
    }

    pub(super) fn set_schemas(&mut self, schemas: HashMap<String, Value>) {
        self.schemas = schemas;
    }

    pub(super) fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<Out>) {
        let m = self.m;
        match &mut self.state {
            State::Outside => {
                if id == m.call_begin {
                    if !std::mem::replace(&mut self.started, true) {
                        out.push(Out::SectionStart);
                    }
                    self.state = State::Call(vec![id]);
                } else if id != m.call_end {
                    out.push(Out::Token(id));
                }
            }
            State::AfterCall(held) => {
                if id == m.call_begin {
                    self.state = State::Call(vec![id]);
                } else if is_blank(tok, id) {
                    held.push(id);
                } else if id == m.end_of_turn || tok.is_special(id) {
                    // The turn ends (GLM ends it with `<|user|>` as well as `<|observation|>`).
                    self.state = State::Outside;
                    out.push(Out::Token(id));
                } else {
                    out.extend(held.drain(..).map(Out::Token));
                    self.state = State::Outside;
                    self.push(tok, id, out);
                }
            }
            State::Call(raw) => {
                if id == m.call_end {
                    raw.push(id);
                    let raw = std::mem::take(raw);
                    self.state = State::AfterCall(Vec::new());
                    match self.parse(tok, &raw) {
                        Some(calls) => out.extend(calls.into_iter().map(Out::Call)),
                        None => out.push(Out::Malformed(raw)),
                    }
                } else if id == m.call_begin
                    || id == m.end_of_turn
                    || (tok.is_special(id) && !m.inner.is_some_and(|inner| inner.contains(&id)))
                {
                    // The call never closed: it is text; the marker is read afresh.
                    out.push(Out::Malformed(std::mem::take(raw)));
                    self.state = State::Outside;
                    self.push(tok, id, out);
                } else {
                    raw.push(id);
                }
            }
        }
    }

    pub(super) fn finish(&mut self, out: &mut Vec<Out>) {
        if let State::Call(raw) = &mut self.state {
            out.push(Out::Malformed(std::mem::take(raw)));
        }
        self.state = State::Outside;
    }

    /// The calls of a complete block `raw` (`<tool_call>` … `</tool_call>`); `None` when it
    /// is malformed or holds no call.
    fn parse(&self, tok: &Tokenizer, raw: &[u32]) -> Option<Vec<ParsedCall>> {
        let body = text_of(tok, raw.get(1..raw.len().checked_sub(1)?)?)?;
        match self.body {
            Body::Hermes => parse_hermes(&body).map(|c| vec![c]),
            Body::Xml => parse_xml(&body, &self.schemas).map(|c| vec![c]),
            Body::Glm => parse_glm(&body, &self.schemas).map(|c| vec![c]),
            Body::MiniMax => parse_minimax(&body, &self.schemas).filter(|c| !c.is_empty()),
        }
    }
}

/// `{"name": NAME, "arguments": {…}}` (arguments also as a JSON string holding an object).
fn parse_hermes(body: &str) -> Option<ParsedCall> {
    let Value::Object(call) = serde_json::from_str::<Value>(body.trim()).ok()? else {
        return None;
    };
    let name = valid_name(call.get("name")?.as_str()?)?;
    let arguments = match call.get("arguments").or_else(|| call.get("parameters"))? {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        v => v.clone(),
    };
    arguments.is_object().then(|| ParsedCall {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// `<function=NAME>` then `<parameter=K>\nV\n</parameter>` blocks, then `</function>`.
fn parse_xml(body: &str, schemas: &HashMap<String, Value>) -> Option<ParsedCall> {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let inner = rest.strip_suffix("</function>")?;
    let name = valid_name(name)?;
    let mut arguments = serde_json::Map::new();
    let mut rest = inner.trim_start();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<parameter=")?;
        let (key, after) = after.split_once('>')?;
        let (value, after) = after.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        arguments.insert(
            key.to_string(),
            typed_value(value, schema_type(schemas, name, key).as_deref())?,
        );
        rest = after.trim_start();
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(arguments).to_string(),
    })
}

/// `NAME` then `<arg_key>K</arg_key>` `<arg_value>V</arg_value>` pairs, whitespace between.
fn parse_glm(body: &str, schemas: &HashMap<String, Value>) -> Option<ParsedCall> {
    let (name, mut rest) = body.split_once("<arg_key>").map_or((body, ""), |(n, r)| (n, r));
    let name = valid_name(name)?;
    let mut arguments = serde_json::Map::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("</arg_key>")?;
        let after = after.trim_start().strip_prefix("<arg_value>")?;
        let (value, after) = after.split_once("</arg_value>")?;
        let (key, value) = (key.trim(), value.trim());
        let value = match schema_type(schemas, name, key).as_deref() {
            Some("string") => Value::String(value.to_string()),
            _ => lenient_value(value),
        };
        arguments.insert(key.to_string(), value);
        let after = after.trim_start();
        rest = match after.strip_prefix("<arg_key>") {
            Some(next) => next,
            None if after.is_empty() => "",
            None => return None,
        };
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(arguments).to_string(),
    })
}

/// `<invoke name="NAME">` elements of `<parameter name="K">V</parameter>`, whitespace between.
fn parse_minimax(body: &str, schemas: &HashMap<String, Value>) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let (name, after) = rest.strip_prefix("<invoke name=")?.split_once('>')?;
        let name = valid_name(unquote(name))?;
        let (mut inner, after) = after.split_once("</invoke>")?;
        let mut arguments = serde_json::Map::new();
        inner = inner.trim();
        while !inner.is_empty() {
            let (key, after) = inner.strip_prefix("<parameter name=")?.split_once('>')?;
            let (value, after) = after.split_once("</parameter>")?;
            let key = unquote(key);
            let value = value.trim();
            let value = match schema_type(schemas, name, key).as_deref() {
                None | Some("string") => Value::String(value.to_string()),
                Some(_) => lenient_value(value),
            };
            arguments.insert(key.to_string(), value);
            inner = after.trim();
        }
        calls.push(ParsedCall {
            name: name.to_string(),
            arguments: Value::Object(arguments).to_string(),
        });
        rest = after.trim();
    }
    Some(calls)
}

/// An attribute value without its surrounding quotes.
fn unquote(s: &str) -> &str {
    let s = s.trim();
    ['"', '\'']
        .iter()
        .find_map(|&q| s.strip_prefix(q).and_then(|r| r.strip_suffix(q)))
        .unwrap_or(s)
}

/// The JSON-schema type of parameter `key` of tool `name`, when the schema gives one (a local
/// `$ref` to `#/$defs/…` or `#/definitions/…` is followed one level, as the grammars do).
fn schema_type(schemas: &HashMap<String, Value>, name: &str, key: &str) -> Option<String> {
    let schema = schemas.get(name)?;
    let prop = schema.get("properties")?.get(key)?;
    resolve_ref(prop, schema)
        .get("type")?
        .as_str()
        .map(str::to_string)
}

/// A value decoded from JSON when it decodes, else its text.
fn lenient_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// A parameter's text as its schema type says (`None` when it does not decode as that type).
fn typed_value(text: &str, kind: Option<&str>) -> Option<Value> {
    let decoded = || serde_json::from_str::<Value>(text.trim()).ok();
    match kind {
        None | Some("string") => Some(Value::String(text.to_string())),
        Some("integer") => decoded().filter(|v| v.is_i64() || v.is_u64()),
        Some("number") => decoded().filter(Value::is_number),
        Some("boolean") => decoded().filter(Value::is_boolean),
        Some("null") => decoded().filter(Value::is_null),
        Some("object") => decoded().filter(Value::is_object),
        Some("array") => decoded().filter(Value::is_array),
        Some(_) => Some(decoded().unwrap_or_else(|| Value::String(text.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hermes_bodies_parse_and_malformed_ones_do_not() {
        let c =
            parse_hermes("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n")
                .unwrap();
        assert_eq!(
            (c.name.as_str(), c.arguments.as_str()),
            ("get_weather", r#"{"city":"Oslo","days":2}"#)
        );
        let s = parse_hermes(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#).unwrap();
        assert_eq!(s.arguments, r#"{"a":1}"#);
        for bad in [
            r#"{"name": "f", "arguments": [1]}"#,
            r#"{"arguments": {}}"#,
            "{not json",
            r#"{"name": "a b", "arguments": {}}"#,
        ] {
            assert!(parse_hermes(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn qwen35_xml_values_are_typed_by_the_schema() {
        let schemas = HashMap::from([(
            "book".to_string(),
            json!({"type": "object", "properties": {
                "city": {"type": "string"}, "nights": {"type": "integer"}, "price": {"type": "number"},
                "pets": {"type": "boolean"}, "extras": {"type": "object"}, "code": {"type": "string"}}}),
        )]);
        let body = "\n<function=book>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=nights>\n3\n</parameter>\n\
<parameter=price>\n99.5\n</parameter>\n<parameter=pets>\ntrue\n</parameter>\n<parameter=extras>\n{\"wifi\": true}\n</parameter>\n\
<parameter=code>\n007\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n</function>\n";
        let c = parse_xml(body, &schemas).unwrap();
        assert_eq!(c.name, "book");
        let args: Value = serde_json::from_str(&c.arguments).unwrap();
        assert_eq!(
            args,
            json!({"city": "San Francisco", "nights": 3, "price": 99.5, "pets": true,
                   "extras": {"wifi": true}, "code": "007", "note": "line one\nline two"})
        );
        // A value that is not its type, an unclosed parameter, a missing function close.
        let bad = "<function=book>\n<parameter=nights>\nthree\n</parameter>\n</function>";
        assert!(parse_xml(bad, &schemas).is_none());
        assert!(parse_xml("<function=book>\n<parameter=city>\nOslo\n</function>", &schemas).is_none());
        assert!(parse_xml("<function=book>\n", &schemas).is_none());
        assert_eq!(
            parse_xml("<function=noargs>\n</function>", &schemas)
                .unwrap()
                .arguments,
            "{}"
        );
    }
}
