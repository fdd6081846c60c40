//! gpt-oss harmony on the gpt-oss fixture's tokenizer: calls with the recipient in the channel
//! or the role header (and on the analysis channel) parse in any chunking, everything else
//! passes through for the reasoning split, cut-off and malformed calls never become calls, and
//! the forced grammar admits the canonical call after an optional analysis message.

use serde_json::json;

use super::grammar::{Answer, Forced, FunctionSpec, forced_call_grammar, json_response_grammar};
use super::test_support::{calls_of, grammar_admits, passed_text, setup};
use super::{ToolCallParser, ToolEvent, ToolFormat};

const CALL: &str =
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";

/// The events of `text` (specials by id), fed in chunks of `chunk`.
fn events(text: &str, chunk: usize) -> Vec<ToolEvent> {
    let (tok, markers) = setup(ToolFormat::Harmony);
    let ids = tok.encode_with_special(text);
    let mut p = ToolCallParser::new(tok, markers, "t".into());
    let mut ev = Vec::new();
    for c in ids.chunks(chunk) {
        p.push_all(c, &mut ev);
    }
    p.finish(&mut ev);
    ev
}

fn calls(ev: &[ToolEvent]) -> Vec<(String, String)> {
    calls_of(ev)
}

fn passed(ev: &[ToolEvent]) -> String {
    passed_text(&setup(ToolFormat::Harmony).0, ev)
}

#[test]
fn the_harmony_tokens_select_the_format() {
    let (tok, _) = setup(ToolFormat::Harmony);
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::Harmony));
}

#[test]
fn calls_parse_with_the_recipient_in_the_channel_or_the_role_header() {
    let analysis = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant";
    let cases = [
        format!("{analysis}{CALL}"),
        CALL.to_string(),
        format!(
            "{analysis} to=functions.get_weather<|channel|>commentary json<|message|>{{\"city\": \"Oslo\"}}<|call|>"
        ),
        // On the analysis channel, as models also write it.
        "<|channel|>analysis to=functions.get_weather<|message|>{\"city\": \"Oslo\"}<|call|>".to_string(),
    ];
    for text in &cases {
        let n = setup(ToolFormat::Harmony).0.encode_with_special(text).len();
        // Every chunk size (chunk k splits at every multiple of k), the whole at once.
        for chunk in (1..=n).chain([1000]) {
            let ev = events(text, chunk);
            assert_eq!(
                calls(&ev),
                [("get_weather".to_string(), r#"{"city":"Oslo"}"#.to_string())],
                "{text} in chunks of {chunk}"
            );
            assert!(
                !passed(&ev).contains("to=functions"),
                "a call's header never passes: {text}"
            );
        }
    }
    // The analysis message before a call passes through whole, for the reasoning split.
    assert_eq!(
        passed(&events(&cases[0], 3)),
        "<|channel|>analysis<|message|>Need weather.<|end|>"
    );
}

#[test]
fn answers_pass_through_and_bad_calls_never_become_calls() {
    let answer = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|return|>";
    let ev = events(answer, 4);
    assert!(calls(&ev).is_empty());
    assert_eq!(passed(&ev), answer);
    let cut = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"ci";
    let ev = events(cut, 1);
    assert!(calls(&ev).is_empty() && ev.iter().any(|e| matches!(e, ToolEvent::CutOff(_))));
    let header_cut = events("<|channel|>commentary to=functions.get_wea", 1);
    assert!(header_cut.iter().any(|e| matches!(e, ToolEvent::CutOff(_))));
    assert_eq!(passed(&header_cut), "");
    let bad = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>[1]<|call|>";
    let ev = events(bad, 1);
    assert!(calls(&ev).is_empty() && ev.iter().any(|e| matches!(e, ToolEvent::Malformed(_))));
}

#[test]
fn the_forced_grammar_admits_a_call_after_optional_analysis_and_json_goes_final() {
    let (tok, markers) = setup(ToolFormat::Harmony);
    let tools = vec![
        FunctionSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
        FunctionSpec {
            name: "get_time".into(),
            parameters: json!({"type": "object", "properties": {}}),
        },
    ];
    let admits =
        |lark: &str, text: &str| grammar_admits(&tok, &markers, lark, &tok.encode_with_special(text));
    for parallel in [false, true] {
        let g = forced_call_grammar(&markers, &tools, Forced::Required, parallel, false).unwrap();
        assert!(admits(&g, CALL));
        assert!(admits(
            &g,
            &format!("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant{CALL}")
        ));
        assert!(!admits(&g, &format!("{CALL}{CALL}")), "one call per turn");
        assert!(!admits(&g, "<|channel|>final<|message|>Sunny.<|return|>"));
        assert!(
            !admits(&g, &CALL.replace("{\"city\": \"Oslo\"}", "{}")),
            "schema held"
        );
    }
    let named =
        forced_call_grammar(&markers, &tools, Forced::Named("get_time".into()), false, false).unwrap();
    assert!(!admits(&named, CALL));
    assert!(admits(
        &named,
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>"
    ));
    let answer = json_response_grammar(Answer::Native(&markers), None, false).unwrap();
    assert!(admits(&answer, "<|channel|>final<|message|>{\"a\": 1}<|return|>"));
    assert!(admits(
        &answer,
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>{}<|return|>"
    ));
    assert!(!admits(&answer, "<|channel|>final<|message|>[1]<|return|>"));
}
