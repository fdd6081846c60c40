//! Lark grammars (llguidance dialect) for constrained decoding in the model's native syntax,
//! from right after the generation prompt through the end-of-turn token. Marker tokens are
//! written by id (`<[ID]>`), so text can never stand in for them and free text can never
//! contain them; JSON is written as inline `%json {schema}` rules.
//!
//! [`forced_call_grammar`] (`tool_choice` `required` or a named function) enforces:
//! * an optional reasoning prefix when the generation prompt opened one (`thinking`): any
//!   tokens but the format's markers, then the close (`</think>`; K3 `<|close|>think<|sep|>`);
//! * K3 only: the `response` element (opened by the grammar after thinking), closed empty; then
//!   the `tools` element. K2 and DeepSeek-V3 go straight to the section: a forced call is the
//!   whole answer;
//! * one call (`parallel == false`) or 1..=[`MAX_CALLS`] calls, each to an allowed function
//!   (the named one, or any of `tools`);
//! * K2: the id text `functions.NAME:IDX` with IDX counting from 0, then arguments that are
//!   JSON valid against the function's `parameters` schema;
//! * DeepSeek-V3: `function<｜tool▁sep｜>NAME\n```json\n` + schema-valid JSON + `\n```` per
//!   call, calls joined by `\n`; DeepSeek-V3.1: `NAME<｜tool▁sep｜>` + schema-valid JSON per
//!   call, not joined;
//! * K3: `call tool="NAME" index="N"` (N from 1) with argument blocks for the schema's
//!   `properties` in sorted key order (the order the K3 tool declaration shows the model):
//!   required properties must appear, optional ones may be skipped, no other keys. A property
//!   typed `string` is raw text without markers (its `enum`/`const` strings enforced exactly;
//!   `pattern`, `maxLength`, `format` are **not** enforced on raw strings); every other type
//!   gets `type="number|boolean|null|object|array"` (integer is written `number`) and a
//!   `%json` value valid against the property's schema (root `$defs`/`definitions` attached).
//!   A property with several or no types allows a block per type. A schema without
//!   `properties` allows any keys (`[A-Za-z0-9_.-]+`) with any values. Alternatively the
//!   model may write one raw `json type="object"` block, checked against the whole schema;
//! * gpt-oss (harmony): an optional `analysis` message first, then one call
//!   `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`, schema-valid JSON
//!   and `<|call|>` (one call per turn, whatever `parallel` says); a JSON answer goes on the
//!   `final` channel and ends with `<|return|>`;
//! * Qwen3.5 XML, GLM and MiniMax-M2: see `grammar_xml`;
//! * the end of the turn: K2 `<|tool_calls_section_end|><|im_end|>`, K3
//!   `<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>`, DeepSeek-V3
//!   `<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`.
//!
//! [`json_response_grammar`] (`response_format`) enforces the same reasoning prefix, then one
//! JSON value (any object for `json_object`, the schema for `json_schema`) as the answer, then
//! the end of the turn (K3: inside the `response` element, then its closing tags).
//!
//! JSON is held to one style, Python `json.dumps`'s `", "` / `": "` separators without free
//! whitespace (unless a schema sets its own `x-guidance` options), so a model cannot pad it
//! forever. Schemas are not interpreted here beyond the above; llguidance reports what it cannot
//! compile when the grammar is compiled (the caller turns that into a 400).

use serde_json::{Map, Value, json};

use super::grammar_xml::{XmlSyntax, dsml_calls, xml_calls};
use super::xtml::escape_attr;
use super::{DeepSeekMarkers, HarmonyMarkers, K2Markers, K3Markers, TaggedMarkers, ToolMarkers};

/// Most calls a parallel forced-call grammar admits in one turn.
pub const MAX_CALLS: usize = 32;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    /// The function name.
    pub name: String,
    /// Its JSON schema (`parameters`); `null` means no parameters.
    pub parameters: Value,
}

/// Which call the grammar forces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced {
    /// At least one call, to any of the tools.
    Required,
    /// A call to this function.
    Named(String),
}

/// Where a JSON answer goes and how the turn ends.
#[derive(Debug, Clone, Copy)]
pub enum Answer<'a> {
    /// A model with a native tool format (its channels and end-of-turn token).
    Native(&'a ToolMarkers),
    /// Plain content ended by `end_of_turn`; `think_close` ends reasoning, if the model has it.
    Plain {
        /// The end-of-turn token.
        end_of_turn: u32,
        /// The token closing reasoning (`</think>`), if any.
        think_close: Option<u32>,
    },
}

/// A grammar that cannot be built from the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// A call is forced but no tools were given.
    #[error("tool_choice forces a call but no tools are given")]
    NoTools,
    /// The named function is not among the tools.
    #[error("tool_choice names `{name}`, which is not among the tools")]
    UnknownTool {
        /// The requested name.
        name: String,
    },
    /// A function's parameters are not a JSON-schema object.
    #[error("the parameters of `{name}` must be a JSON schema object")]
    InvalidParameters {
        /// The function.
        name: String,
    },
    /// A `json_schema` that is not a JSON-schema object.
    #[error("the response schema must be a JSON schema object")]
    InvalidSchema,
    /// Reasoning was requested but the model has no reasoning markers.
    #[error("the model has no reasoning markers, so thinking cannot precede the constrained output")]
    NoThinkMarkers,
}

/// A lark grammar forcing a native tool call (see the module docs for what it enforces).
pub fn forced_call_grammar(
    markers: &ToolMarkers,
    tools: &[FunctionSpec],
    forced: Forced,
    parallel: bool,
    thinking: bool,
) -> Result<String, GrammarError> {
    let allowed: Vec<&FunctionSpec> = match &forced {
        Forced::Required if tools.is_empty() => return Err(GrammarError::NoTools),
        Forced::Required => tools.iter().collect(),
        Forced::Named(name) => {
            let found = tools.iter().find(|t| &t.name == name);
            vec![found.ok_or_else(|| GrammarError::UnknownTool { name: name.clone() })?]
        }
    };
    let schemas = allowed
        .iter()
        .map(|t| parameters_schema(t))
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<&str> = allowed.iter().map(|t| t.name.as_str()).collect();
    let calls = if parallel { MAX_CALLS } else { 1 };
    let mut g = Lark::default();
    let body = match markers {
        ToolMarkers::KimiK2(m) => k2_calls(&mut g, m, &names, &schemas, calls),
        ToolMarkers::DeepSeekV3(m) => deepseek_calls(&mut g, m, &names, &schemas, calls, false),
        ToolMarkers::DeepSeekV31(m) => deepseek_calls(&mut g, m, &names, &schemas, calls, true),
        ToolMarkers::KimiK3(m) => k3_calls(&mut g, m, &names, &schemas, calls),
        ToolMarkers::Hermes(m) => hermes_calls(&mut g, m, &names, &schemas, calls),
        ToolMarkers::QwenXml(m) => xml_calls(&mut g, XmlSyntax::Qwen, m, &names, &schemas, calls),
        ToolMarkers::Glm(m) => xml_calls(&mut g, XmlSyntax::Glm, m, &names, &schemas, calls),
        ToolMarkers::MiniMax(m) => xml_calls(&mut g, XmlSyntax::MiniMax, m, &names, &schemas, calls),
        ToolMarkers::Harmony(m) => harmony_call(&mut g, m, &names, &schemas),
        ToolMarkers::Dsml(m) => dsml_calls(&mut g, m, &names, &schemas, calls),
    };
    let prefix = reasoning_prefix(&mut g, Answer::Native(markers), thinking, true)?;
    g.rule("start", &format!("{prefix} {body}"));
    Ok(g.finish())
}

/// K2's calls section (rules into `g`; returns the section's expansion).
fn k2_calls(g: &mut Lark, m: &K2Markers, names: &[&str], schemas: &[Value], calls: usize) -> String {
    for (j, s) in schemas.iter().enumerate() {
        g.rule(&format!("args_{j}"), &json_rule(s));
    }
    for i in 0..calls {
        let alts: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(j, name)| {
                let id = lit(&format!("functions.{name}:{i}"));
                format!("{id} {} args_{j}", tok(m.argument_begin))
            })
            .collect();
        let body = format!("{} ({}) {}", tok(m.call_begin), alts.join(" | "), tok(m.call_end));
        g.rule(&format!("call_{i}"), &body);
    }
    g.chain("calls", calls, "");
    format!(
        "{} calls {} {}",
        tok(m.section_begin),
        tok(m.section_end),
        tok(m.end_of_turn)
    )
}

/// DeepSeek's calls block: V3's `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` calls
/// joined by `\n`, or (`v31`) V3.1's `NAME<｜tool▁sep｜>ARGS` calls not joined, as each
/// template writes them.
fn deepseek_calls(
    g: &mut Lark,
    m: &DeepSeekMarkers,
    names: &[&str],
    schemas: &[Value],
    calls: usize,
    v31: bool,
) -> String {
    let mut alts = Vec::new();
    for (j, (name, s)) in names.iter().zip(schemas).enumerate() {
        g.rule(&format!("args_{j}"), &json_rule(s));
        alts.push(if v31 {
            format!("{} {} args_{j}", lit(name), tok(m.sep))
        } else {
            let head = format!(
                "\"function\" {} {}",
                tok(m.sep),
                lit(&format!("{name}\n```json\n"))
            );
            format!("{head} args_{j} {}", lit("\n```"))
        });
    }
    let call = format!("{} ({}) {}", tok(m.call_begin), alts.join(" | "), tok(m.call_end));
    for i in 0..calls {
        g.rule(&format!("call_{i}"), &call);
    }
    g.chain("calls", calls, if v31 { "" } else { "\"\\n\"" });
    format!(
        "{} calls {} {}",
        tok(m.calls_begin),
        tok(m.calls_end),
        tok(m.end_of_sentence)
    )
}

/// Qwen hermes calls: `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>` joined by
/// `\n`, then the end of the turn (the spacing of Qwen's chat template).
fn hermes_calls(g: &mut Lark, m: &TaggedMarkers, names: &[&str], schemas: &[Value], calls: usize) -> String {
    let mut alts = Vec::new();
    for (j, (name, s)) in names.iter().zip(schemas).enumerate() {
        g.rule(&format!("args_{j}"), &json_rule(s));
        let head = format!("\n{{\"name\": {}, \"arguments\": ", Value::from(*name));
        alts.push(format!("{} args_{j} {}", lit(&head), lit("}\n")));
    }
    let call = format!("{} ({}) {}", tok(m.call_begin), alts.join(" | "), tok(m.call_end));
    for i in 0..calls {
        g.rule(&format!("call_{i}"), &call);
    }
    g.chain("calls", calls, "\"\\n\"");
    format!("calls {}", tok(m.end_of_turn))
}

/// gpt-oss's call: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>` then
/// the JSON arguments and `<|call|>`. A harmony turn holds one call (`<|call|>` ends it), so
/// parallel calls change nothing.
fn harmony_call(g: &mut Lark, m: &HarmonyMarkers, names: &[&str], schemas: &[Value]) -> String {
    let alts: Vec<String> = names
        .iter()
        .zip(schemas)
        .enumerate()
        .map(|(j, (name, s))| {
            g.rule(&format!("args_{j}"), &json_rule(s));
            format!(
                "{} {} {} \"json\" {} args_{j} {}",
                tok(m.channel),
                lit(&format!("commentary to=functions.{name} ")),
                tok(m.constrain),
                tok(m.message),
                tok(m.call)
            )
        })
        .collect();
    format!("({})", alts.join(" | "))
}

/// K3's tools element, then the end of the message.
fn k3_calls(g: &mut Lark, m: &K3Markers, names: &[&str], schemas: &[Value], calls: usize) -> String {
    let x = Xtml(*m);
    g.rule("free", &x.free());
    for (j, s) in schemas.iter().enumerate() {
        k3_arguments(g, &x, j, s);
    }
    for i in 0..calls {
        let choices: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(j, name)| {
                let head = lit(&format!(
                    "call tool=\"{}\" index=\"{}\"",
                    escape_attr(name),
                    i + 1
                ));
                format!("{head} {} k3args_{j}", tok(m.sep))
            })
            .collect();
        let body = format!("{} ({}) {}", tok(m.open), choices.join(" | "), x.close("call"));
        g.rule(&format!("call_{i}"), &body);
    }
    g.chain("calls", calls, "");
    format!(
        "{} calls {} {} {}",
        x.open("tools"),
        x.close("tools"),
        x.close("message"),
        tok(m.end_of_msg)
    )
}

/// A lark grammar for a JSON answer: any object (`schema: None`, `json_object`) or the schema
/// (`json_schema`), then the end of the turn.
pub fn json_response_grammar(
    answer: Answer<'_>,
    schema: Option<&Value>,
    thinking: bool,
) -> Result<String, GrammarError> {
    let schema = match schema {
        None => json!({"type": "object"}),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(Value::Bool(true)) => json!({}),
        Some(_) => return Err(GrammarError::InvalidSchema),
    };
    let mut g = Lark::default();
    g.rule("answer", &json_rule(&schema));
    let end = match answer {
        Answer::Native(ToolMarkers::KimiK3(m)) => {
            let x = Xtml(*m);
            format!(
                "{} {} {}",
                x.close("response"),
                x.close("message"),
                tok(m.end_of_msg)
            )
        }
        Answer::Native(m) => tok(m.end_of_turn()),
        Answer::Plain { end_of_turn, .. } => tok(end_of_turn),
    };
    let prefix = reasoning_prefix(&mut g, answer, thinking, false)?;
    g.rule("start", &format!("{prefix} answer {end}"));
    Ok(g.finish())
}

/// The text before the constrained part: reasoning and its close when `thinking`; for K3 the
/// `response` element up to where `calls` (tools) or the answer begins.
fn reasoning_prefix(
    g: &mut Lark,
    answer: Answer<'_>,
    thinking: bool,
    calls: bool,
) -> Result<String, GrammarError> {
    let (excluded, close) = match answer {
        // gpt-oss reasons in an `analysis` message of its own, which the prompt never opens:
        // it may come first; a JSON answer then goes on the `final` channel.
        Answer::Native(ToolMarkers::Harmony(m)) => {
            let free = not_tokens(&ToolMarkers::Harmony(*m).structural_ids());
            g.rule(
                "analysis",
                &format!(
                    "{} \"analysis\" {} {free}* {} {} \"assistant\"",
                    tok(m.channel),
                    tok(m.message),
                    tok(m.end),
                    tok(m.start)
                ),
            );
            let final_channel = format!("{} \"final\" {}", tok(m.channel), tok(m.message));
            return Ok(format!("analysis? {}", if calls { "" } else { &final_channel }));
        }
        Answer::Native(ToolMarkers::KimiK3(m)) => {
            let x = Xtml(*m);
            g.rule("free", &x.free());
            // A forced call is the whole answer, as on K2 and DeepSeek-V3: the response
            // element is closed empty (an unbounded free text before the call would let an
            // unsure model talk until `max_tokens` without ever calling).
            let response = if calls { x.close("response") } else { String::new() };
            return Ok(if thinking {
                format!("free {} {} {response}", x.close("think"), x.open("response"))
            } else {
                response
            });
        }
        Answer::Native(m) => (m.structural_ids(), m.think().map(|(_, close)| close)),
        Answer::Plain {
            end_of_turn,
            think_close,
        } => (
            vec![end_of_turn].into_iter().chain(think_close).collect(),
            think_close,
        ),
    };
    if !thinking {
        return Ok(String::new());
    }
    let close = close.ok_or(GrammarError::NoThinkMarkers)?;
    g.rule("reasoning", &format!("{}*", not_tokens(&excluded)));
    // Bounded: a model could otherwise pad with whitespace until `max_tokens`.
    g.rule("ws", "/[ \\t\\r\\n]{1,8}/");
    Ok(format!("reasoning {} ws?", tok(close)))
}

/// A function's parameters as a schema object (`null` or absent: no parameters).
fn parameters_schema(t: &FunctionSpec) -> Result<Value, GrammarError> {
    match &t.parameters {
        Value::Null => Ok(json!({"type": "object", "properties": {}})),
        Value::Object(_) => Ok(t.parameters.clone()),
        _ => Err(GrammarError::InvalidParameters { name: t.name.clone() }),
    }
}

/// The K3 XTML markers, for writing tags.
struct Xtml(K3Markers);

impl Xtml {
    fn open(&self, head: &str) -> String {
        format!("{} {} {}", tok(self.0.open), lit(head), tok(self.0.sep))
    }
    fn close(&self, name: &str) -> String {
        format!("{} {} {}", tok(self.0.close), lit(name), tok(self.0.sep))
    }
    /// Any tokens but the XTML markers.
    fn free(&self) -> String {
        let m = self.0;
        format!("{}*", not_tokens(&[m.open, m.close, m.sep, m.end_of_msg]))
    }
    /// An argument block of key `key`, type attribute `ty`, value rule `value`.
    fn argument(&self, key: &str, ty: &str, value: &str) -> String {
        let head = format!("argument key=\"{}\" type=\"{ty}\"", escape_attr(key));
        format!("{} {value} {}", self.open(&head), self.close("argument"))
    }
}

/// The rule `k3args_{j}`: the argument blocks of function `j` (see the module docs).
fn k3_arguments(g: &mut Lark, x: &Xtml, j: usize, schema: &Value) {
    let raw = format!(
        "{} {} {}",
        x.open("json type=\"object\""),
        json_rule(schema),
        x.close("json")
    );
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .filter(|p| !p.is_empty());
    let Some(props) = props else {
        g.rule("key_free", "/[A-Za-z0-9_.\\-]+/");
        g.rule("k3anyblock", &k3_free_block(x));
        g.rule(&format!("k3args_{j}"), &format!("k3anyblock* | {raw}"));
        return;
    };
    let mut keys: Vec<&String> = props.keys().collect();
    keys.sort();
    let seq = argument_sequence(
        g,
        schema,
        &keys,
        &format!("k3arg_{j}"),
        |_, key, prop, resolved| {
            let types = k3_types(resolved);
            let typed = types.len() < 6;
            let blocks: Vec<String> = types
                .into_iter()
                .map(|t| k3_value(x, key, t, prop, typed))
                .collect();
            blocks.join(" | ")
        },
    );
    g.rule(&format!("k3args_{j}"), &format!("{seq} | {raw}"));
}

/// The argument rules `{prefix}_{k}` of `schema`'s properties `keys`, in that order: `arg`
/// gives one's expansion from its key, its schema (root `$defs`/`definitions` attached) and
/// that schema with a local `$ref` resolved. Returns the sequence: required properties must
/// appear, optional ones may be skipped (`""` when there are none).
pub(super) fn argument_sequence(
    g: &mut Lark,
    schema: &Value,
    keys: &[&String],
    prefix: &str,
    mut arg: impl FnMut(&mut Lark, &str, &Value, &Value) -> String,
) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let defs = root_defs(schema);
    let props = schema.get("properties");
    let mut seq = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        let mut prop = props
            .and_then(|p| p.get(key.as_str()))
            .cloned()
            .unwrap_or(Value::Null);
        if let (Value::Object(p), Some(defs)) = (&mut prop, &defs) {
            for (name, d) in defs {
                p.entry(name.clone()).or_insert_with(|| d.clone());
            }
        }
        let resolved = resolve_ref(&prop, schema);
        let body = arg(g, key, &prop, &resolved);
        let rule = format!("{prefix}_{k}");
        g.rule(&rule, &body);
        seq.push(if required.contains(&key.as_str()) {
            rule
        } else {
            format!("{rule}?")
        });
    }
    if seq.is_empty() {
        "\"\"".to_string()
    } else {
        seq.join(" ")
    }
}

/// An argument block of any key and any type (schemas without `properties`).
fn k3_free_block(x: &Xtml) -> String {
    let m = x.0;
    let head = |ty: &str| {
        let tail = lit(&format!("\" type=\"{ty}\""));
        format!(
            "{} {} key_free {tail} {}",
            tok(m.open),
            lit("argument key=\""),
            tok(m.sep)
        )
    };
    let mut alts = vec![format!("{} free {}", head("string"), x.close("argument"))];
    for t in ["number", "boolean", "null", "object", "array"] {
        alts.push(format!(
            "{} {} {}",
            head(t),
            json_rule(&json!({"type": t})),
            x.close("argument")
        ));
    }
    alts.join(" | ")
}

/// A property schema that is only a local `$ref` (`#/$defs/N`, `#/definitions/N`) resolved
/// one level against the root (to learn its type); otherwise the property itself.
pub(super) fn resolve_ref(prop: &Value, root: &Value) -> Value {
    let target = prop
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer));
    match target {
        Some(t) if prop.get("type").is_none() => t.clone(),
        _ => prop.clone(),
    }
}

/// One block of property `key` with JSON-schema type `t`; `typed`: the schema names its
/// types, so the value is also held to `t` (else only to the property's schema).
fn k3_value(x: &Xtml, key: &str, t: &str, prop: &Value, typed: bool) -> String {
    if t == "string" {
        let strings: Option<Vec<String>> = match (prop.get("const"), prop.get("enum")) {
            (Some(Value::String(c)), _) => Some(vec![lit(c)]),
            (_, Some(Value::Array(e))) => Some(e.iter().filter_map(Value::as_str).map(lit).collect()),
            _ => None,
        };
        let value = match strings {
            Some(s) if !s.is_empty() => format!("({})", s.join(" | ")),
            _ => "free".to_string(),
        };
        return x.argument(key, "string", &value);
    }
    let mut value = prop.clone();
    if let (Value::Object(o), true) = (&mut value, typed) {
        o.insert("type".into(), Value::String(t.into()));
    }
    let attr = if t == "integer" { "number" } else { t };
    x.argument(key, attr, &json_rule(&value))
}

/// The JSON-schema types a property allows (all when it says none).
fn k3_types(prop: &Value) -> Vec<&str> {
    const ALL: [&str; 6] = ["string", "number", "boolean", "null", "object", "array"];
    match prop.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => match prop.get("enum").or(prop.get("const")) {
            Some(Value::Array(vals)) if vals.iter().all(Value::is_string) => vec!["string"],
            Some(Value::String(_)) => vec!["string"],
            _ => ALL.to_vec(),
        },
    }
}

/// The root `$defs` / `definitions` to re-attach to property schemas.
fn root_defs(schema: &Value) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for key in ["$defs", "definitions"] {
        if let Some(d) = schema.get(key) {
            out.insert(key.to_string(), d.clone());
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The special token `id`.
pub(super) fn tok(id: u32) -> String {
    format!("<[{id}]>")
}

/// Any single token except `ids`.
pub(super) fn not_tokens(ids: &[u32]) -> String {
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!("<[^{}]>", list.join(","))
}

/// A lark string literal (lark strings use JSON syntax).
pub(super) fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// An inline JSON-schema rule. Unless the schema sets its own `x-guidance` options, the JSON
/// is written in one fixed style, Python `json.dumps`'s `", "` / `": "` (how the native
/// formats' arguments look), with no free whitespace: free whitespace would let a model pad
/// forever.
pub(super) fn json_rule(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Some(o) = schema.as_object_mut()
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    format!("%json {}", serde_json::to_string(&schema).unwrap_or_default())
}

/// Rules under construction; each name is written once.
#[derive(Default)]
pub(super) struct Lark {
    rules: Vec<(String, String)>,
}

impl Lark {
    pub(super) fn rule(&mut self, name: &str, body: &str) {
        if !self.rules.iter().any(|(n, _)| n == name) {
            self.rules.push((name.to_string(), body.to_string()));
        }
    }

    /// `{name}` = `call_0 (SEP call_1 (SEP call_2 …)?)?` over `n` calls.
    pub(super) fn chain(&mut self, name: &str, n: usize, sep: &str) {
        for i in (0..n).rev() {
            let body = if i + 1 == n {
                format!("call_{i}")
            } else {
                format!("call_{i} ({sep} {name}_{})?", i + 1)
            };
            let rule = if i == 0 {
                name.to_string()
            } else {
                format!("{name}_{i}")
            };
            self.rule(&rule, &body);
        }
    }

    fn finish(self) -> String {
        let (start, rest): (Vec<_>, Vec<_>) = self.rules.into_iter().partition(|(n, _)| n == "start");
        start
            .into_iter()
            .chain(rest)
            .map(|(n, b)| format!("{n}: {b}\n"))
            .collect()
    }
}
