//! Forced-call grammars of the XML-like tagged formats, each written the way the family's
//! published chat template renders a call in history (so a forced call is what the model was
//! trained to write):
//! * Qwen3.5 / 3.6: `<tool_call>` `\n<function=NAME>\n` then per argument
//!   `<parameter=K>\nV\n</parameter>\n`, then `</function>\n` `</tool_call>`; calls joined by
//!   `\n`, then `<|im_end|>`;
//! * GLM-4.5 / 4.6: `<tool_call>` `NAME\n` then per argument `<arg_key>` `K` `</arg_key>` `\n`
//!   `<arg_value>` `V` `</arg_value>` `\n`, then `</tool_call>`; calls joined by `\n`, then
//!   `<|observation|>` (markers by id); GLM-4.7 and GLM-5 the same without any of those
//!   newlines (`TaggedMarkers::compact`, from the template);
//! * MiniMax-M2: one `<minimax:tool_call>` block, `\n`, then per call `<invoke name="NAME">\n`,
//!   per argument `<parameter name="K">V</parameter>\n`, `</invoke>\n`; then
//!   `</minimax:tool_call>` `[e~[`.
//!
//! * DeepSeek-V3.2 (DSML, as its native encoder writes history): `\n\n<｜DSML｜function_calls>\n`,
//!   per call `<｜DSML｜invoke name="NAME">\n`, per argument
//!   `<｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>\n` (raw text) or
//!   `string="false">JSON</｜DSML｜parameter>\n`, `</｜DSML｜invoke>`; calls joined by `\n`; then
//!   `\n</｜DSML｜function_calls>` `<｜end▁of▁sentence｜>`.
//!
//! Arguments follow the schema's `properties` in declared order: required ones must appear,
//! optional ones may be skipped, no other keys. A property that may be a string (or names no
//! type) takes raw text, its `enum`/`const` strings enforced exactly and its `minLength` /
//! `maxLength` in characters; the text cannot contain the closing tag (it ends at the first
//! one), and `pattern` and `format` are not enforced on raw text. Every other property takes `%json` valid against its schema (root
//! `$defs`/`definitions` attached), which the parsers decode back by the same schema. A schema
//! without `properties` takes no arguments here (tool_choice `auto` still parses any).

use serde_json::Value;

use super::dsml::DSML;
use super::grammar::{Lark, argument_sequence, json_rule, lit, not_tokens, tok};
use super::{DsmlMarkers, TaggedMarkers, ToolMarkers};

/// Which XML-like syntax the calls are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum XmlSyntax {
    Qwen,
    Glm,
    MiniMax,
}

impl XmlSyntax {
    /// The text around one argument: (before the key, between key and value, after the
    /// value), for the text syntaxes; GLM's markers are tokens.
    fn argument_frame(self, m: &TaggedMarkers, key: &str) -> (String, String) {
        match (self, m.inner) {
            (XmlSyntax::Qwen, _) => (lit(&format!("<parameter={key}>\n")), lit("\n</parameter>\n")),
            (XmlSyntax::MiniMax, _) => (lit(&format!("<parameter name=\"{key}\">")), lit("</parameter>\n")),
            (XmlSyntax::Glm, Some([ak, ak_end, av, av_end])) => {
                let nl = if m.compact { "" } else { "\"\\n\"" };
                (
                    format!("{} {} {} {nl} {}", tok(ak), lit(key), tok(ak_end), tok(av)),
                    format!("{} {nl}", tok(av_end)),
                )
            }
            (XmlSyntax::Glm, None) => (String::new(), String::new()),
        }
    }

    /// The raw-text value rule: text up to (and including) the argument's closing text, or
    /// for GLM (whose close is a token) the text alone; `len`: the string's `minLength` and
    /// `maxLength` in characters, when the schema bounds it.
    fn free_value(self, g: &mut Lark, m: &TaggedMarkers, len: Option<(u64, Option<u64>)>) -> String {
        let suffix = len.map_or(String::new(), |(lo, hi)| {
            format!("_{lo}_{}", hi.map_or("".into(), |h| h.to_string()))
        });
        let (name, body) = match (self, len) {
            (XmlSyntax::Qwen, _) => (format!("QWEN_TEXT{suffix}"), closed_text("\n</parameter>\n", len)),
            (XmlSyntax::MiniMax, _) => (
                format!("MINIMAX_TEXT{suffix}"),
                closed_text("</parameter>\n", len),
            ),
            (XmlSyntax::Glm, Some(_)) => (format!("GLM_TEXT{suffix}"), format!("/{}/", chars(len))),
            (XmlSyntax::Glm, None) => {
                let ids = ToolMarkers::Glm(*m).structural_ids();
                ("glm_text".to_string(), format!("{}*", not_tokens(&ids)))
            }
        };
        g.rule(&name, &body);
        name
    }
}

/// `(?s:.*)`, or `(?s:.{lo,hi})` for a bounded length.
fn chars(len: Option<(u64, Option<u64>)>) -> String {
    match len {
        None => "(?s:.*)".to_string(),
        Some((lo, hi)) => format!("(?s:.{{{lo},{}}})", hi.map_or(String::new(), |h| h.to_string())),
    }
}

/// A terminal: text without the tag `</parameter>` (of `len` characters when bounded), then
/// `close` (the tag with the whitespace around it that the template writes). The tag is
/// excluded wherever it is followed by more than `close` has after it, so the value can never
/// hold it (the parsers split at the first one).
fn closed_text(close: &str, len: Option<(u64, Option<u64>)>) -> String {
    closed_by(close, "</parameter>", len)
}

/// [`closed_text`] for any closing `tag` (DSML's `</｜DSML｜parameter>`).
fn closed_by(close: &str, tag: &str, len: Option<(u64, Option<u64>)>) -> String {
    let after = close.find(tag).map_or(0, |at| close.len() - at - tag.len());
    format!(
        "/{}{}/ & ~/(?s:.*){}(?s:.{{{},}})/",
        chars(len),
        regex_escape(close),
        regex_escape(tag),
        after + 1
    )
}

/// `s` as a literal inside a lark `/regex/`.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '/' => out.push_str("\\/"),
            c if "\\.+*?()|[]{}^$#&-~".contains(c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// The calls of an XML-like format (rules into `g`; returns the expansion from the first
/// call marker through the end of the turn).
pub(super) fn xml_calls(
    g: &mut Lark,
    syntax: XmlSyntax,
    m: &TaggedMarkers,
    names: &[&str],
    schemas: &[Value],
    calls: usize,
) -> String {
    let mut alts = Vec::new();
    for (j, (name, schema)) in names.iter().zip(schemas).enumerate() {
        xml_arguments(g, syntax, m, j, schema);
        alts.push(match syntax {
            XmlSyntax::Qwen => format!(
                "{} xargs_{j} {}",
                lit(&format!("\n<function={name}>\n")),
                lit("</function>\n")
            ),
            XmlSyntax::Glm if m.compact => format!("{} xargs_{j}", lit(name)),
            XmlSyntax::Glm => format!("{} xargs_{j}", lit(&format!("{name}\n"))),
            XmlSyntax::MiniMax => format!(
                "{} xargs_{j} {}",
                lit(&format!("<invoke name=\"{name}\">\n")),
                lit("</invoke>\n")
            ),
        });
    }
    let one = format!("({})", alts.join(" | "));
    match syntax {
        XmlSyntax::MiniMax => {
            for i in 0..calls {
                g.rule(&format!("call_{i}"), &one);
            }
            g.chain("calls", calls, "");
            format!(
                "{} \"\\n\" calls {} {}",
                tok(m.call_begin),
                tok(m.call_end),
                tok(m.end_of_turn)
            )
        }
        XmlSyntax::Qwen | XmlSyntax::Glm => {
            let call = format!("{} {one} {}", tok(m.call_begin), tok(m.call_end));
            for i in 0..calls {
                g.rule(&format!("call_{i}"), &call);
            }
            g.chain("calls", calls, if m.compact { "" } else { "\"\\n\"" });
            format!("calls {}", tok(m.end_of_turn))
        }
    }
}

/// The schema's `properties` keys, in declared order.
fn property_keys(schema: &Value) -> Vec<&String> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().collect())
        .unwrap_or_default()
}

/// The rule `xargs_{j}`: function `j`'s arguments, in the schema's declared order.
fn xml_arguments(g: &mut Lark, syntax: XmlSyntax, m: &TaggedMarkers, j: usize, schema: &Value) {
    let seq = argument_sequence(
        g,
        schema,
        &property_keys(schema),
        &format!("xarg_{j}"),
        |g, key, prop, resolved| {
            let value = xml_value(g, resolved, prop, |g, len| ValueRule {
                expr: syntax.free_value(g, m, len),
                closed: syntax != XmlSyntax::Glm,
                raw: true,
            });
            let (open, close) = syntax.argument_frame(m, key);
            let close = if value.closed { String::new() } else { close };
            format!("{open} {} {close}", value.expr)
        },
    );
    g.rule(&format!("xargs_{j}"), &seq);
}

/// A property's value expansion, and whether it already includes the argument's closing
/// text (the raw-text terminals of Qwen and MiniMax end with it).
struct ValueRule {
    expr: String,
    closed: bool,
    /// A string written as raw text (DSML's `string="true"`), not JSON.
    raw: bool,
}

/// The value of one property: its `enum`/`const` strings, raw text when it may be a string or
/// names no type, else `%json` of the property.
fn xml_value(
    g: &mut Lark,
    resolved: &Value,
    prop: &Value,
    free: impl FnOnce(&mut Lark, Option<(u64, Option<u64>)>) -> ValueRule,
) -> ValueRule {
    let types: Vec<&str> = match resolved.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let strings: Option<Vec<&str>> = match (resolved.get("const"), resolved.get("enum")) {
        (Some(Value::String(c)), _) => Some(vec![c.as_str()]),
        (_, Some(Value::Array(e))) if e.iter().all(Value::is_string) => {
            Some(e.iter().filter_map(Value::as_str).collect())
        }
        _ => None,
    };
    if let Some(strings) = strings.filter(|s| !s.is_empty()) {
        let alts: Vec<String> = strings.iter().map(|s| lit(s)).collect();
        return ValueRule {
            expr: format!("({})", alts.join(" | ")),
            closed: false,
            raw: true,
        };
    }
    if types.is_empty() || types.contains(&"string") {
        let lo = resolved.get("minLength").and_then(Value::as_u64);
        let hi = resolved.get("maxLength").and_then(Value::as_u64);
        let len = (lo.is_some() || hi.is_some()).then(|| (lo.unwrap_or(0), hi));
        return free(g, len);
    }
    ValueRule {
        expr: json_rule(prop),
        closed: false,
        raw: false,
    }
}

/// DeepSeek-V3.2's DSML block (rules into `g`; returns the expansion from the block's opening
/// text through the end of the turn).
pub(super) fn dsml_calls(
    g: &mut Lark,
    m: &DsmlMarkers,
    names: &[&str],
    schemas: &[Value],
    calls: usize,
) -> String {
    let close = format!("</{DSML}parameter>\n");
    let mut alts = Vec::new();
    for (j, (name, schema)) in names.iter().zip(schemas).enumerate() {
        let seq = argument_sequence(
            g,
            schema,
            &property_keys(schema),
            &format!("darg_{j}"),
            |g, key, prop, resolved| {
                let open =
                    |string: &str| lit(&format!("<{DSML}parameter name=\"{key}\" string=\"{string}\">"));
                let value = xml_value(g, resolved, prop, |g, len| {
                    let suffix = len.map_or(String::new(), |(lo, hi)| {
                        format!("_{lo}_{}", hi.map_or("".into(), |h| h.to_string()))
                    });
                    let rule = format!("DSML_TEXT{suffix}");
                    g.rule(&rule, &closed_by(&close, &format!("</{DSML}parameter>"), len));
                    ValueRule {
                        expr: rule,
                        closed: true,
                        raw: true,
                    }
                });
                // Raw text (its terminal ends with the close) and `enum`/`const` strings are
                // `string="true"`; every other value is JSON.
                let string = value.raw;
                let tail = if value.closed { String::new() } else { lit(&close) };
                format!(
                    "{} {} {tail}",
                    open(if string { "true" } else { "false" }),
                    value.expr
                )
            },
        );
        g.rule(&format!("dargs_{j}"), &seq);
        alts.push(format!(
            "{} dargs_{j} {}",
            lit(&format!("<{DSML}invoke name=\"{name}\">\n")),
            lit(&format!("</{DSML}invoke>"))
        ));
    }
    let one = format!("({})", alts.join(" | "));
    for i in 0..calls {
        g.rule(&format!("call_{i}"), &one);
    }
    g.chain("calls", calls, "\"\\n\"");
    // The `\n` before the closing tag is its own literal, like the `\n` between calls: one
    // literal `\n</…>` would make the lexer take `\n<` for the close and refuse the next call.
    format!(
        "{} calls \"\\n\" {} {}",
        lit(&format!("{}>\n", m.version.block_start())),
        lit(m.version.block_end()),
        tok(m.end_of_sentence)
    )
}
