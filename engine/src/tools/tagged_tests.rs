//! Qwen's tagged formats end to end on a real Qwen3.5 tokenizer: the format chosen from the
//! chat template, calls parsed from generated ids in any chunking with the whitespace between
//! them dropped, cut-off and malformed calls, and the forced hermes grammar admitting Qwen's own
//! spelling of a call.

use std::collections::HashMap;

use serde_json::json;

use super::grammar::{Forced, FunctionSpec, GrammarError, forced_call_grammar};
use super::test_support::{P, ids, qwen35, setup};
use super::{ToolCallParser, ToolEvent, ToolFormat, ToolMarkers};

fn events(format: ToolFormat, ids: &[u32], schemas: HashMap<String, serde_json::Value>) -> Vec<ToolEvent> {
    let (tok, markers) = setup(format);
    let mut p = ToolCallParser::new(tok, markers, "t".into()).with_tool_schemas(schemas);
    let mut out = Vec::new();
    p.push_all(ids, &mut out);
    p.finish(&mut out);
    out
}

fn calls(events: &[ToolEvent]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in events {
        match e {
            ToolEvent::CallStart { name, .. } => out.push((name.clone(), String::new())),
            ToolEvent::ArgumentsDelta { fragment, .. } => out.last_mut().unwrap().1 += fragment,
            _ => {}
        }
    }
    out
}

#[test]
fn the_qwen35_template_selects_the_xml_format() {
    let tok = qwen35();
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::QwenXml));
    let m = ToolMarkers::resolve(ToolFormat::Hermes, &tok).unwrap();
    assert!(m.think().is_some(), "Qwen3.5 reasons between <think> markers");
}

#[test]
fn qwen35_xml_calls_parse_typed_and_the_whitespace_between_them_is_dropped() {
    let tok = qwen35();
    let text = "Checking.";
    let out = ids(
        &tok,
        &[
            P::T(text),
            P::S("<tool_call>"),
            P::T(
                "\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n",
            ),
            P::S("</tool_call>"),
            P::T("\n"),
            P::S("<tool_call>"),
            P::T("\n<function=get_time>\n<parameter=zone>\n+01:00\n</parameter>\n</function>\n"),
            P::S("</tool_call>"),
            P::S("<|im_end|>"),
        ],
    );
    let schemas = HashMap::from([(
        "get_weather".to_string(),
        json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
    )]);
    for chunk in [1, 3, out.len()] {
        let (tok2, markers) = setup(ToolFormat::QwenXml);
        let mut p = ToolCallParser::new(tok2, markers, "t".into()).with_tool_schemas(schemas.clone());
        let mut ev = Vec::new();
        for c in out.chunks(chunk) {
            p.push_all(c, &mut ev);
        }
        p.finish(&mut ev);
        assert_eq!(
            calls(&ev),
            vec![
                (
                    "get_weather".to_string(),
                    r#"{"city":"Oslo","days":3}"#.to_string()
                ),
                ("get_time".to_string(), r#"{"zone":"+01:00"}"#.to_string()),
            ]
        );
        let tokens: Vec<u32> = ev
            .iter()
            .filter_map(|e| match e {
                ToolEvent::Token(t) => Some(*t),
                _ => None,
            })
            .collect();
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        let mut want = tok.encode(text);
        want.push(im_end);
        assert_eq!(
            tokens, want,
            "content keeps the text and the end of turn, not the newline between calls"
        );
    }
}

#[test]
fn hermes_calls_parse_and_cut_off_or_malformed_ones_never_become_calls() {
    let tok = qwen35();
    fn call(body: &str) -> Vec<P<'_>> {
        vec![P::S("<tool_call>"), P::T(body), P::S("</tool_call>")]
    }
    let good = ids(
        &tok,
        &call("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"),
    );
    let ev = events(ToolFormat::Hermes, &good, HashMap::new());
    assert_eq!(
        calls(&ev),
        vec![("get_weather".to_string(), r#"{"city":"Oslo"}"#.to_string())]
    );
    let bad = ids(&tok, &call("\n{\"name\": \"get_weather\", \"arguments\": [1]}\n"));
    let ev = events(ToolFormat::Hermes, &bad, HashMap::new());
    assert!(calls(&ev).is_empty() && ev.iter().any(|e| matches!(e, ToolEvent::Malformed(_))));
    let cut = ids(&tok, &[P::S("<tool_call>"), P::T("\n{\"name\": \"get_we")]);
    let ev = events(ToolFormat::Hermes, &cut, HashMap::new());
    assert!(calls(&ev).is_empty() && ev.iter().any(|e| matches!(e, ToolEvent::CutOff(_))));
}

#[test]
fn the_forced_hermes_grammar_admits_qwens_own_call_and_xml_is_not_forced() {
    let (tok, markers) = setup(ToolFormat::Hermes);
    let tools = vec![FunctionSpec {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }];
    let lark = forced_call_grammar(&markers, &tools, Forced::Required, false, false).unwrap();
    let env = crate::constrain::token_env(tok.clone(), tok.vocab_size(), &markers.structural_ids()).unwrap();
    let mut f = llguidance::ParserFactory::new_simple(&env).unwrap();
    f.quiet();
    let mut m =
        llguidance::Matcher::new(f.create_parser(llguidance::api::TopLevelGrammar::from_lark(lark.clone())));
    assert_eq!(m.get_error(), None, "{lark}");
    let want = ids(
        &tok,
        &[
            P::S("<tool_call>"),
            P::T("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"),
            P::S("</tool_call>"),
            P::S("<|im_end|>"),
        ],
    );
    for &t in &want {
        assert!(m.compute_mask().unwrap().is_allowed(t), "token {t} of {want:?}");
        m.consume_token(t).unwrap();
    }
    assert!(m.is_accepting().unwrap());
    let (_, xml) = setup(ToolFormat::QwenXml);
    let err = forced_call_grammar(&xml, &tools, Forced::Required, false, false).unwrap_err();
    assert!(
        matches!(
            err,
            GrammarError::NotForced {
                format: ToolFormat::QwenXml
            }
        ),
        "{err}"
    );
}
