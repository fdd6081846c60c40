//! The tagged formats end to end on the fixtures' tokenizers (Qwen3.5, GLM-4.5, MiniMax-M2):
//! the format chosen from the tokenizer and template, calls parsed from generated ids in any
//! chunking with the whitespace between them dropped, values typed by the schema, cut-off and
//! malformed calls, and the forced hermes grammar admitting Qwen's own spelling of a call.

use std::collections::HashMap;

use serde_json::json;

use super::grammar::{Forced, FunctionSpec, forced_call_grammar};
use super::test_support::{P, calls_of, glm, grammar_admits, ids, minimax, passed_text, qwen35, setup};
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
    calls_of(events)
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
fn the_forced_hermes_grammar_admits_qwens_own_call() {
    let (tok, markers) = setup(ToolFormat::Hermes);
    let tools = vec![FunctionSpec {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }];
    let lark = forced_call_grammar(&markers, &tools, Forced::Required, false, false).unwrap();
    let want = ids(
        &tok,
        &[
            P::S("<tool_call>"),
            P::T("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"),
            P::S("</tool_call>"),
            P::S("<|im_end|>"),
        ],
    );
    assert!(grammar_admits(&tok, &markers, &lark, &want));
}

/// Every chunking of `ids` parses to the same events as one id at a time; returns those.
fn events_in_every_chunking(
    format: ToolFormat,
    ids: &[u32],
    schemas: &HashMap<String, serde_json::Value>,
) -> Vec<ToolEvent> {
    let whole = events(format, ids, schemas.clone());
    for chunk in 2..=ids.len().min(9) {
        let (tok, markers) = setup(format);
        let mut p = ToolCallParser::new(tok, markers, "t".into()).with_tool_schemas(schemas.clone());
        let mut ev = Vec::new();
        for c in ids.chunks(chunk) {
            p.push_all(c, &mut ev);
        }
        p.finish(&mut ev);
        assert_eq!(ev, whole, "chunks of {chunk}");
    }
    whole
}

fn weather_schemas() -> HashMap<String, serde_json::Value> {
    HashMap::from([(
        "get_weather".to_string(),
        json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
               "opts": {"type": "object"}, "zip": {"type": "string"}}}),
    )])
}

fn content(tok: &crate::tokenizer::Tokenizer, ev: &[ToolEvent]) -> String {
    passed_text(tok, ev)
}

#[test]
fn glm_is_detected_and_its_calls_parse_typed_in_45_and_47_spacing() {
    let tok = glm();
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::Glm));
    let ids = ids(
        &tok,
        &[
            P::S("<think>"),
            P::T("Need weather."),
            P::S("</think>"),
            P::T("\nChecking."),
            // GLM-4.5's spacing, as its template renders a call.
            P::S("<tool_call>"),
            P::T("get_weather\n"),
            P::S("<arg_key>"),
            P::T("city"),
            P::S("</arg_key>"),
            P::T("\n"),
            P::S("<arg_value>"),
            P::T(" San Francisco "),
            P::S("</arg_value>"),
            P::T("\n"),
            P::S("<arg_key>"),
            P::T("days"),
            P::S("</arg_key>"),
            P::T("\n"),
            P::S("<arg_value>"),
            P::T("3"),
            P::S("</arg_value>"),
            P::T("\n"),
            P::S("<arg_key>"),
            P::T("zip"),
            P::S("</arg_key>"),
            P::S("<arg_value>"),
            P::T("007"),
            P::S("</arg_value>"),
            P::S("</tool_call>"),
            P::T("\n"),
            // GLM-4.7's: no newlines; a value that is not JSON stays text.
            P::S("<tool_call>"),
            P::T("get_weather"),
            P::S("<arg_key>"),
            P::T("opts"),
            P::S("</arg_key>"),
            P::S("<arg_value>"),
            P::T("{\"units\": \"metric\"}"),
            P::S("</arg_value>"),
            P::S("<arg_key>"),
            P::T("note"),
            P::S("</arg_key>"),
            P::S("<arg_value>"),
            P::T("not json"),
            P::S("</arg_value>"),
            P::S("</tool_call>"),
            P::S("<|observation|>"),
        ],
    );
    let ev = events_in_every_chunking(ToolFormat::Glm, &ids, &weather_schemas());
    assert_eq!(
        calls(&ev),
        vec![
            (
                "get_weather".to_string(),
                r#"{"city":"San Francisco","days":3,"zip":"007"}"#.to_string()
            ),
            (
                "get_weather".to_string(),
                r#"{"opts":{"units":"metric"},"note":"not json"}"#.to_string()
            ),
        ]
    );
    assert_eq!(
        content(&tok, &ev),
        "<think>Need weather.</think>\nChecking.<|observation|>"
    );
}

#[test]
fn minimax_is_detected_and_one_block_holds_several_typed_calls() {
    let tok = minimax();
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::MiniMax));
    let block = "\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo</parameter>\n\
<parameter name=\"days\">2</parameter>\n<parameter name=\"zip\">007</parameter>\n</invoke>\n\
<invoke name=\"get_time\">\n<parameter name=\"zone\">+01:00</parameter>\n</invoke>\n";
    let ids = ids(
        &tok,
        &[
            P::T("Let me check."),
            P::T("\n"),
            P::S("<minimax:tool_call>"),
            P::T(block),
            P::S("</minimax:tool_call>"),
            P::S("[e~["),
        ],
    );
    let ev = events_in_every_chunking(ToolFormat::MiniMax, &ids, &weather_schemas());
    assert_eq!(
        calls(&ev),
        vec![
            (
                "get_weather".to_string(),
                r#"{"city":"Oslo","days":2,"zip":"007"}"#.to_string()
            ),
            ("get_time".to_string(), r#"{"zone":"+01:00"}"#.to_string()),
        ]
    );
    assert_eq!(content(&tok, &ev), "Let me check.\n[e~[");
}

#[test]
fn glm_and_minimax_cut_off_or_malformed_blocks_never_become_calls() {
    for (format, pieces) in [
        (
            ToolFormat::MiniMax,
            vec![
                P::S("<minimax:tool_call>"),
                P::T("\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Os"),
            ],
        ),
        (
            ToolFormat::Glm,
            vec![
                P::S("<tool_call>"),
                P::T("get_weather\n"),
                P::S("<arg_key>"),
                P::T("ci"),
            ],
        ),
    ] {
        let (tok, _) = setup(format);
        let ev = events(format, &ids(&tok, &pieces), weather_schemas());
        assert!(
            calls(&ev).is_empty() && ev.iter().any(|e| matches!(e, ToolEvent::CutOff(_))),
            "{format:?}"
        );
    }
    for (format, pieces) in [
        (
            ToolFormat::MiniMax,
            vec![
                P::S("<minimax:tool_call>"),
                P::T("\n<invoke name=\"a b\">\n</invoke>\n"),
                P::S("</minimax:tool_call>"),
            ],
        ),
        (
            ToolFormat::MiniMax,
            vec![
                P::S("<minimax:tool_call>"),
                P::T("\n"),
                P::S("</minimax:tool_call>"),
            ],
        ),
        (
            ToolFormat::Glm,
            vec![
                P::S("<tool_call>"),
                P::T("f\n"),
                P::S("<arg_key>"),
                P::T("k"),
                P::S("</arg_key>"),
                P::S("</tool_call>"),
            ],
        ),
    ] {
        let (tok, _) = setup(format);
        let ev = events(format, &ids(&tok, &pieces), weather_schemas());
        assert!(
            calls(&ev).is_empty() && ev.iter().any(|e| matches!(e, ToolEvent::Malformed(_))),
            "{format:?}"
        );
    }
}

#[test]
fn a_call_written_inside_the_reasoning_is_still_a_call() {
    // Qwen3.5/3.6 sometimes call before closing `</think>` (peers lose such calls).
    let tok = qwen35();
    let input = ids(
        &tok,
        &[
            P::T("Let me look it up."),
            P::S("<tool_call>"),
            P::T("\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"),
            P::S("</tool_call>"),
            P::S("<|im_end|>"),
        ],
    );
    let ev = events_in_every_chunking(ToolFormat::QwenXml, &input, &weather_schemas());
    assert_eq!(
        calls(&ev),
        [("get_weather".to_string(), r#"{"city":"Oslo"}"#.to_string())]
    );
    assert!(
        ev.contains(&ToolEvent::SectionStart),
        "the reasoning split leaves the thinking"
    );
}
