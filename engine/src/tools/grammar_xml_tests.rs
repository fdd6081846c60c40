//! The forced-call grammars of Qwen3.5, GLM and MiniMax-M2 on the fixtures' tokenizers: each
//! admits the call as the family's template renders it, and everything it admits parses into
//! schema-valid arguments: required keys present, no unknown keys, enums and JSON types held,
//! one call without parallel calls, only the named tool when one is named.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::grammar::{Forced, FunctionSpec, forced_call_grammar};
use super::test_support::{P, calls_of, grammar_admits, ids, setup};
use super::{ToolCallParser, ToolFormat};

fn tools() -> Vec<FunctionSpec> {
    vec![
        FunctionSpec {
            name: "note".into(),
            parameters: json!({"type": "object", "properties": {"text": {"type": "string", "minLength": 2, "maxLength": 5}},
                "required": ["text"]}),
        },
        FunctionSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"]}),
        },
        FunctionSpec {
            name: "search".into(),
            parameters: json!({"type": "object", "properties": {"opts": {"$ref": "#/$defs/o"}},
                "required": ["opts"],
                "$defs": {"o": {"type": "object", "properties": {"n": {"type": "boolean"}}, "required": ["n"]}}}),
        },
    ]
}

/// One call's pieces in a format's own spelling: (name, [(key, value)]).
type Call<'a> = (&'a str, Vec<(&'a str, &'a str)>);

/// The ids of `calls` as the family's template writes them, through the end of the turn.
fn spelled(format: ToolFormat, calls: &[Call<'_>]) -> Vec<u32> {
    let (tok, _) = setup(format);
    let mut p: Vec<P<'_>> = Vec::new();
    let mut owned: Vec<String> = Vec::new();
    for (name, args) in calls {
        let mut text = String::new();
        match format {
            ToolFormat::QwenXml => {
                text += &format!("\n<function={name}>\n");
                for (k, v) in args {
                    text += &format!("<parameter={k}>\n{v}\n</parameter>\n");
                }
                text += "</function>\n";
            }
            ToolFormat::MiniMax => {
                text += &format!("<invoke name=\"{name}\">\n");
                for (k, v) in args {
                    text += &format!("<parameter name=\"{k}\">{v}</parameter>\n");
                }
                text += "</invoke>\n";
            }
            _ => {
                text += &format!("{name}\n");
                for (k, v) in args {
                    text += &format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n");
                }
            }
        }
        owned.push(text);
    }
    let (begin, end, eot) = match format {
        ToolFormat::QwenXml => ("<tool_call>", "</tool_call>", "<|im_end|>"),
        ToolFormat::MiniMax => ("<minimax:tool_call>", "</minimax:tool_call>", "[e~["),
        _ => ("<tool_call>", "</tool_call>", "<|observation|>"),
    };
    if format == ToolFormat::MiniMax {
        p.push(P::S(begin));
        p.push(P::T("\n"));
        owned.iter().for_each(|t| p.push(P::S(t)));
        p.push(P::S(end));
    } else {
        for (i, t) in owned.iter().enumerate() {
            if i > 0 {
                p.push(P::T("\n"));
            }
            p.extend([P::S(begin), P::S(t), P::S(end)]);
        }
    }
    p.push(P::S(eot));
    ids(&tok, &p)
}

/// Whether the forced grammar admits all of `ids` and is complete after them.
fn admits(format: ToolFormat, forced: Forced, parallel: bool, ids: &[u32]) -> bool {
    let (tok, markers) = setup(format);
    let lark = forced_call_grammar(&markers, &tools(), forced, parallel, false).expect("grammar");
    grammar_admits(&tok, &markers, &lark, ids)
}

/// The calls `ids` parse into, arguments as JSON.
fn parsed(format: ToolFormat, ids: &[u32]) -> Vec<(String, Value)> {
    let (tok, markers) = setup(format);
    let schemas: HashMap<String, Value> = tools().into_iter().map(|t| (t.name, t.parameters)).collect();
    let mut p = ToolCallParser::new(tok, markers, String::new()).with_tool_schemas(schemas);
    let mut ev = Vec::new();
    p.push_all(ids, &mut ev);
    p.finish(&mut ev);
    calls_of(&ev)
        .into_iter()
        .map(|(n, a)| (n, serde_json::from_str(&a).unwrap()))
        .collect()
}

const FORMATS: [ToolFormat; 3] = [ToolFormat::QwenXml, ToolFormat::Glm, ToolFormat::MiniMax];

#[test]
fn each_family_spelling_is_admitted_and_parses_schema_valid() {
    let weather: Call<'_> = (
        "get_weather",
        vec![("city", "San Francisco, CA"), ("days", "3"), ("unit", "c")],
    );
    let search: Call<'_> = ("search", vec![("opts", "{\"n\": true}")]);
    for format in FORMATS {
        let one = spelled(format, std::slice::from_ref(&weather));
        for parallel in [false, true] {
            assert!(
                admits(format, Forced::Required, parallel, &one),
                "{format:?} one call"
            );
        }
        assert_eq!(
            parsed(format, &one),
            vec![(
                "get_weather".to_string(),
                json!({"city": "San Francisco, CA", "days": 3, "unit": "c"})
            )],
            "{format:?}"
        );
        let two = spelled(format, &[weather.clone(), search.clone()]);
        assert!(
            admits(format, Forced::Required, true, &two),
            "{format:?} two calls"
        );
        assert!(
            !admits(format, Forced::Required, false, &two),
            "{format:?}: one call only"
        );
        assert_eq!(
            parsed(format, &two)[1],
            ("search".to_string(), json!({"opts": {"n": true}}))
        );
        let named = Forced::Named("search".into());
        assert!(admits(
            format,
            named.clone(),
            false,
            &spelled(format, std::slice::from_ref(&search))
        ));
        assert!(
            !admits(format, named, false, &one),
            "{format:?}: only the named tool"
        );
    }
}

#[test]
fn schema_violations_are_not_admitted() {
    let bad: [Call<'_>; 5] = [
        ("get_weather", vec![("city", "Oslo")]), // required unit missing
        ("get_weather", vec![("city", "Oslo"), ("unit", "kelvin")]), // not in the enum
        (
            "get_weather",
            vec![("city", "Oslo"), ("days", "three"), ("unit", "c")],
        ), // not an integer
        ("get_weather", vec![("city", "Oslo"), ("unit", "c"), ("zip", "1")]), // unknown key
        ("search", vec![("opts", "{\"n\": 1}")]), // $ref type held
    ];
    for format in FORMATS {
        for call in &bad {
            let ids = spelled(format, std::slice::from_ref(call));
            assert!(
                !admits(format, Forced::Required, true, &ids),
                "{format:?} {call:?}"
            );
        }
    }
}

#[test]
fn a_string_value_ends_at_its_first_closing_tag() {
    for format in [ToolFormat::QwenXml, ToolFormat::MiniMax] {
        let sneaky: Call<'_> = ("get_weather", vec![("city", "a</parameter>\nb"), ("unit", "c")]);
        let ids = spelled(format, &[sneaky]);
        assert!(!admits(format, Forced::Required, true, &ids), "{format:?}");
        let fine: Call<'_> = (
            "get_weather",
            vec![("city", "<b>Oslo</b> </param"), ("unit", "f")],
        );
        let ids = spelled(format, &[fine]);
        assert!(admits(format, Forced::Required, true, &ids), "{format:?}");
        assert_eq!(parsed(format, &ids)[0].1["city"], json!("<b>Oslo</b> </param"));
    }
}

#[test]
fn string_lengths_are_held_in_characters() {
    for format in FORMATS {
        for (text, ok) in [("ab", true), ("héllo", true), ("a", false), ("abcdef", false)] {
            let ids = spelled(format, &[("note", vec![("text", text)])]);
            assert_eq!(
                admits(format, Forced::Required, false, &ids),
                ok,
                "{format:?} {text:?}"
            );
        }
    }
}

#[test]
fn glm_47_templates_get_the_compact_spelling() {
    // The GLM fixture's tokenizer with GLM-4.7's published template (as in tool-parity/).
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures.join("glm4-moe-fp8").join(f), dir.path().join(f)).unwrap();
    }
    std::fs::copy(
        fixtures.join("tool-parity/glm-4.7.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .unwrap();
    let tok = std::sync::Arc::new(crate::tokenizer::Tokenizer::from_dir(dir.path()).unwrap());
    let m47 = super::ToolMarkers::resolve(ToolFormat::Glm, &tok).unwrap();
    let (_, m45) = setup(ToolFormat::Glm);
    let compact = |m: &super::ToolMarkers| matches!(m, super::ToolMarkers::Glm(t) if t.compact);
    assert!(compact(&m47) && !compact(&m45));
    let spelled_47 = |calls: &[(&str, &str)]| {
        let mut p = Vec::new();
        for (name, city) in calls {
            p.extend([
                P::S("<tool_call>"),
                P::T(name),
                P::S("<arg_key>"),
                P::T("city"),
                P::S("</arg_key>"),
            ]);
            p.extend([
                P::S("<arg_value>"),
                P::T(city),
                P::S("</arg_value>"),
                P::S("</tool_call>"),
            ]);
        }
        p.push(P::S("<|observation|>"));
        ids(&tok, &p)
    };
    let tools = [FunctionSpec {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }];
    let lark = forced_call_grammar(&m47, &tools, Forced::Required, true, false).unwrap();
    assert!(grammar_admits(
        &tok,
        &m47,
        &lark,
        &spelled_47(&[("get_weather", "Oslo")])
    ));
    assert!(grammar_admits(
        &tok,
        &m47,
        &lark,
        &spelled_47(&[("get_weather", "Oslo"), ("get_weather", "Rome")])
    ));
    // GLM-4.5's newlines are not 4.7's spelling.
    let spelled_45 = spelled(ToolFormat::Glm, &[("get_weather", vec![("city", "Oslo")])]);
    assert!(!grammar_admits(&tok, &m47, &lark, &spelled_45));
}
