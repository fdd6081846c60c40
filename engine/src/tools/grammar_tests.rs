//! Grammar tests: each grammar compiled by llguidance against the tokenizer's vocabulary; the
//! matcher must admit a native token sequence and reject invalid ones.

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory};
use serde_json::json;

use super::grammar::{
    Answer, Forced, FunctionSpec, GrammarError, forced_call_grammar, json_response_grammar,
};
use super::test_support::setup;
use super::{ToolCallParser, ToolEvent, ToolFormat, ToolMarkers};
use crate::tokenizer::Tokenizer;

fn tools() -> Vec<FunctionSpec> {
    vec![
        FunctionSpec {
            name: "get_weather".into(),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
                "additionalProperties": false
            }),
        },
        FunctionSpec {
            name: "ns.search".into(),
            parameters: json!({
                "type": "object",
                "properties": {"q": {"type": "string", "enum": ["a", "b"]}, "opts": {"$ref": "#/$defs/opts"}},
                "required": ["q", "opts"],
                "$defs": {"opts": {"type": "object", "properties": {"n": {"type": "boolean"}}, "required": ["n"]}}
            }),
        },
    ]
}

/// The constrain module's environment, with the format's structural ids marked (DeepSeek's
/// tool tokens are non-special added tokens).
fn env_for(tok: &std::sync::Arc<Tokenizer>, markers: &ToolMarkers) -> TokEnv {
    crate::constrain::token_env(tok.clone(), tok.vocab_size(), &markers.structural_ids()).expect("token env")
}

fn matcher(env: &TokEnv, lark: &str) -> Matcher {
    let mut f = ParserFactory::new_simple(env).expect("factory");
    f.quiet();
    let m = Matcher::new(f.create_parser(TopLevelGrammar::from_lark(lark.to_string())));
    assert_eq!(m.get_error(), None, "grammar compiles:\n{lark}");
    m
}

/// How many of `ids` the grammar admits in order, checked against the mask at every step;
/// and whether the grammar is complete after all of them.
fn admitted(env: &TokEnv, lark: &str, ids: &[u32]) -> (usize, bool) {
    let mut m = matcher(env, lark);
    for (i, &t) in ids.iter().enumerate() {
        let mask = m.compute_mask().expect("mask");
        if !mask.is_allowed(t) {
            return (i, false);
        }
        m.consume_token(t).expect("consume");
    }
    let done = m.is_stopped() || m.is_accepting().unwrap_or(false);
    (ids.len(), done)
}

fn accepts(env: &TokEnv, lark: &str, ids: &[u32]) {
    assert_eq!(
        admitted(env, lark, ids),
        (ids.len(), true),
        "accepted whole:\n{lark}"
    );
}

fn rejects(env: &TokEnv, lark: &str, ids: &[u32]) {
    let (n, done) = admitted(env, lark, ids);
    assert!(n < ids.len() || !done, "rejected: {n} of {} admitted", ids.len());
}

/// The calls `ids` parse into.
fn parse(tok: &std::sync::Arc<Tokenizer>, markers: ToolMarkers, ids: &[u32]) -> Vec<(String, String)> {
    let mut p = ToolCallParser::new(tok.clone(), markers, String::new());
    let mut ev = Vec::new();
    p.push_all(ids, &mut ev);
    p.finish(&mut ev);
    assert_eq!(p.malformed_calls(), 0);
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in ev {
        match e {
            ToolEvent::CallStart { name, .. } => calls.push((name, String::new())),
            ToolEvent::ArgumentsDelta { fragment, .. } => calls.last_mut().unwrap().1.push_str(&fragment),
            _ => {}
        }
    }
    calls
}

#[test]
fn k2_forced_calls() {
    let (tok, markers) = setup(ToolFormat::KimiK2);
    let env = env_for(&tok, &markers);
    let s = |t: &str| tok.encode_with_special(t);
    let g = forced_call_grammar(&markers, &tools(), Forced::Required, true, false).unwrap();
    let two = s(concat!(
        r#"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "days": 2}<|tool_call_end|>"#,
        r#"<|tool_call_begin|>functions.ns.search:1<|tool_call_argument_begin|>{"q": "a", "opts": {"n": true}}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"#
    ));
    accepts(&env, &g, &two);
    assert_eq!(
        parse(&tok, markers, &two),
        vec![
            ("get_weather".into(), r#"{"city": "Paris", "days": 2}"#.into()),
            ("ns.search".into(), r#"{"q": "a", "opts": {"n": true}}"#.into())
        ]
    );
    let call = |id: &str, args: &str| {
        s(&format!(
            "<|tool_calls_section_begin|><|tool_call_begin|>{id}<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
        ))
    };
    accepts(&env, &g, &call("functions.get_weather:0", r#"{"city": "x"}"#));
    rejects(&env, &g, &call("functions.other:0", r#"{"city": "x"}"#));
    rejects(&env, &g, &call("functions.get_weather:1", r#"{"city": "x"}"#));
    rejects(&env, &g, &call("functions.get_weather:0", r#"{"city": 3}"#));
    rejects(&env, &g, &call("functions.get_weather:0", r#"{"days": 3}"#));
    rejects(
        &env,
        &g,
        &call("functions.get_weather:0", r#"{"city": "x", "days": 0}"#),
    );
    rejects(
        &env,
        &g,
        &call("functions.ns.search:0", r#"{"q": "c", "opts": {"n": true}}"#),
    );
    rejects(
        &env,
        &g,
        &call("functions.ns.search:0", r#"{"q": "a", "opts": {}}"#),
    );
    rejects(&env, &g, &s("Sure.<|tool_calls_section_begin|>"));
    // The first token can only open the section.
    let mut m = matcher(&env, &g);
    let mask = m.compute_mask().unwrap();
    assert_eq!(mask.num_set(), 1);
    assert!(mask.is_allowed(s("<|tool_calls_section_begin|>")[0]));
    // A named, single call.
    let g = forced_call_grammar(
        &markers,
        &tools(),
        Forced::Named("ns.search".into()),
        false,
        false,
    )
    .unwrap();
    rejects(&env, &g, &two);
    accepts(
        &env,
        &g,
        &call("functions.ns.search:0", r#"{"q": "b", "opts": {"n": false}}"#),
    );
    rejects(&env, &g, &call("functions.get_weather:0", r#"{"city": "x"}"#));
}

#[test]
fn k2_thinking_must_close_before_the_calls() {
    let (tok, markers) = setup(ToolFormat::KimiK2);
    let env = env_for(&tok, &markers);
    let g = forced_call_grammar(&markers, &tools(), Forced::Required, false, true).unwrap();
    let s = |t: &str| tok.encode_with_special(t);
    let body = r#"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "P"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"#;
    accepts(&env, &g, &s(&format!("let me think</think>{body}")));
    accepts(&env, &g, &s(&format!("</think>\n\n{body}")));
    rejects(&env, &g, &s(&format!("no close {body}")));
}

#[test]
fn k3_forced_calls_after_think_and_response() {
    let (tok, markers) = setup(ToolFormat::KimiK3);
    let env = env_for(&tok, &markers);
    let s = |t: &str| tok.encode_with_special(t);
    let g = forced_call_grammar(&markers, &tools(), Forced::Required, true, true).unwrap();
    let arg = |k: &str, ty: &str, v: &str| {
        format!("<|open|>argument key=\"{k}\" type=\"{ty}\"<|sep|>{v}<|close|>argument<|sep|>")
    };
    let out = |calls: &str| {
        s(&format!(
            "plan<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>{calls}<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        ))
    };
    let call = |name: &str, i: usize, body: &str| {
        format!("<|open|>call tool=\"{name}\" index=\"{i}\"<|sep|>{body}<|close|>call<|sep|>")
    };
    let weather = call(
        "get_weather",
        1,
        &(arg("city", "string", "Paris \"x\"\n") + &arg("days", "number", "3")),
    );
    let search = call(
        "ns.search",
        2,
        &(arg("opts", "object", r#"{"n": true}"#) + &arg("q", "string", "a")),
    );
    let both = out(&(weather.clone() + &search));
    accepts(&env, &g, &both);
    // A forced call is the whole answer: no response text before it.
    let chatty = s("plan<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|>");
    assert!(!admitted(&env, &g, &chatty).1 || admitted(&env, &g, &chatty).0 < chatty.len());
    assert_eq!(
        parse(&tok, markers, &both),
        vec![
            (
                "get_weather".into(),
                r#"{"city":"Paris \"x\"\n","days":3}"#.into()
            ),
            ("ns.search".into(), r#"{"opts":{"n": true},"q":"a"}"#.into())
        ]
    );
    let raw = call(
        "get_weather",
        1,
        r#"<|open|>json type="object"<|sep|>{"city": "P"}<|close|>json<|sep|>"#,
    );
    accepts(&env, &g, &out(&raw));
    // Missing required key, wrong type attribute, invalid value, unknown key, wrong index.
    rejects(
        &env,
        &g,
        &out(&call("get_weather", 1, &arg("days", "number", "3"))),
    );
    rejects(
        &env,
        &g,
        &out(&call("get_weather", 1, &arg("city", "number", "3"))),
    );
    rejects(
        &env,
        &g,
        &out(&call(
            "get_weather",
            1,
            &(arg("city", "string", "P") + &arg("days", "number", "0")),
        )),
    );
    rejects(
        &env,
        &g,
        &out(&call(
            "get_weather",
            1,
            &(arg("city", "string", "P") + &arg("zip", "string", "1")),
        )),
    );
    rejects(
        &env,
        &g,
        &out(&call("get_weather", 2, &arg("city", "string", "P"))),
    );
    rejects(
        &env,
        &g,
        &out(&call(
            "ns.search",
            1,
            &(arg("opts", "object", "{}") + &arg("q", "string", "a")),
        )),
    );
    rejects(
        &env,
        &g,
        &out(&call(
            "ns.search",
            1,
            &(arg("opts", "object", r#"{"n": true}"#) + &arg("q", "string", "c")),
        )),
    );
    // The tools element cannot open inside the thinking (the think channel must close first).
    rejects(&env, &g, &s(&format!("plan<|open|>tools<|sep|>{weather}")));
    // Thinking off: the prompt opened the response element.
    let g = forced_call_grammar(
        &markers,
        &tools(),
        Forced::Named("get_weather".into()),
        false,
        false,
    )
    .unwrap();
    accepts(
        &env,
        &g,
        &s(&format!(
            "<|close|>response<|sep|><|open|>tools<|sep|>{weather}<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        )),
    );
}

#[test]
fn k3_schemas_without_properties_allow_free_keys() {
    let (tok, markers) = setup(ToolFormat::KimiK3);
    let env = env_for(&tok, &markers);
    let free = [FunctionSpec {
        name: "any".into(),
        parameters: serde_json::Value::Null,
    }];
    let g = forced_call_grammar(&markers, &free, Forced::Required, false, false).unwrap();
    let out = |body: &str| {
        tok.encode_with_special(&format!(
            "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"any\" index=\"1\"<|sep|>{body}<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        ))
    };
    accepts(&env, &g, &out(""));
    accepts(
        &env,
        &g,
        &out("<|open|>argument key=\"k.1\" type=\"array\"<|sep|>[1, 2]<|close|>argument<|sep|>"),
    );
    rejects(
        &env,
        &g,
        &out("<|open|>argument key=\"k\" type=\"array\"<|sep|>nope<|close|>argument<|sep|>"),
    );
}

#[test]
fn deepseek_forced_calls_and_marker_ids_never_inside_json() {
    let (tok, markers) = setup(ToolFormat::DeepSeekV3);
    let env = env_for(&tok, &markers);
    let g = forced_call_grammar(&markers, &tools(), Forced::Required, true, false).unwrap();
    let s = |t: &str| tok.encode_with_special(t);
    let call = |name: &str, args: &str| {
        format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>")
    };
    let two = s(&format!(
        "<｜tool▁calls▁begin｜>{}\n{}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        call("get_weather", r#"{"city": "Paris"}"#),
        call("ns.search", r#"{"q": "b", "opts": {"n": false}}"#)
    ));
    accepts(&env, &g, &two);
    assert_eq!(parse(&tok, markers, &two).len(), 2);
    let one = |args: &str| {
        s(&format!(
            "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
            call("get_weather", args)
        ))
    };
    accepts(&env, &g, &one(r#"{"city": "P"}"#));
    rejects(&env, &g, &one(r#"{"city": 1}"#));
    // The marker token inside a JSON string is refused (its text would be fine).
    let end = s("<｜tool▁call▁end｜>");
    let mut inside = s(
        r#"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
```json
{"city": ""#,
    );
    inside.extend(&end);
    rejects(&env, &g, &inside);
    let mut spelled = inside[..inside.len() - 1].to_vec();
    spelled.extend(tok.encode("<｜tool"));
    spelled.extend(tok.encode("▁call▁end｜>\"}\n```"));
    spelled.extend(s("<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"));
    accepts(&env, &g, &spelled);
}

#[test]
fn json_answers_for_each_format() {
    for format in [
        ToolFormat::KimiK2,
        ToolFormat::KimiK3,
        ToolFormat::DeepSeekV3,
        ToolFormat::Hermes,
        ToolFormat::Glm,
        ToolFormat::MiniMax,
        ToolFormat::Dsml,
    ] {
        let (tok, markers) = setup(format);
        let env = env_for(&tok, &markers);
        let s = |t: &str| tok.encode_with_special(t);
        let end = match format {
            ToolFormat::KimiK2 | ToolFormat::Hermes | ToolFormat::QwenXml => "<|im_end|>",
            ToolFormat::KimiK3 => "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
            ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 | ToolFormat::Dsml => "<｜end▁of▁sentence｜>",
            ToolFormat::Glm => "<|observation|>",
            ToolFormat::MiniMax => "[e~[",
            ToolFormat::Harmony => unreachable!("harmony answers are tested in harmony_tests"),
        };
        let any = json_response_grammar(Answer::Native(&markers), None, false).unwrap();
        accepts(&env, &any, &s(&format!(r#"{{"a": [1, {{"b": null}}]}}{end}"#)));
        rejects(&env, &any, &s(&format!("[1]{end}")));
        rejects(&env, &any, &s(&format!("hi {{}}{end}")));
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let g = json_response_grammar(Answer::Native(&markers), Some(&schema), false).unwrap();
        accepts(&env, &g, &s(&format!(r#"{{"n": 4}}{end}"#)));
        rejects(&env, &g, &s(&format!(r#"{{"n": "4"}}{end}"#)));
        rejects(
            &env,
            &g,
            &s(r#"{"n": 4}"#)
                .into_iter()
                .chain(tok.encode("x"))
                .collect::<Vec<_>>(),
        );
    }
    // K3 with thinking: reasoning, then the response element holds the JSON.
    let (tok, markers) = setup(ToolFormat::KimiK3);
    let env = env_for(&tok, &markers);
    let g = json_response_grammar(Answer::Native(&markers), None, true).unwrap();
    accepts(
        &env,
        &g,
        &tok.encode_with_special(
            "hmm<|close|>think<|sep|><|open|>response<|sep|>{}<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
        ),
    );
    // Plain: content then the given end-of-turn id; thinking needs a close marker.
    let (tok, markers) = setup(ToolFormat::DeepSeekV3);
    let env = env_for(&tok, &markers);
    let eos = markers.end_of_turn();
    let think_close = tok.token_to_id("</think>");
    let g = json_response_grammar(
        Answer::Plain {
            end_of_turn: eos,
            think_close,
        },
        None,
        true,
    )
    .unwrap();
    accepts(
        &env,
        &g,
        &tok.encode_with_special("x</think>\n{}<｜end▁of▁sentence｜>"),
    );
    assert_eq!(
        json_response_grammar(
            Answer::Plain {
                end_of_turn: eos,
                think_close: None
            },
            None,
            true
        ),
        Err(GrammarError::NoThinkMarkers)
    );
}

#[test]
fn bad_requests_are_typed_errors() {
    let (_, markers) = setup(ToolFormat::KimiK2);
    assert_eq!(
        forced_call_grammar(&markers, &[], Forced::Required, false, false),
        Err(GrammarError::NoTools)
    );
    assert_eq!(
        forced_call_grammar(&markers, &tools(), Forced::Named("nope".into()), false, false),
        Err(GrammarError::UnknownTool { name: "nope".into() })
    );
    let bad = [FunctionSpec {
        name: "f".into(),
        parameters: json!([1]),
    }];
    assert_eq!(
        forced_call_grammar(&markers, &bad, Forced::Required, false, false),
        Err(GrammarError::InvalidParameters { name: "f".into() })
    );
    assert_eq!(
        json_response_grammar(Answer::Native(&markers), Some(&json!("x")), false),
        Err(GrammarError::InvalidSchema)
    );
}

/// A grammar's text with characters of three UTF-8 bytes, written by a model one byte token at
/// a time (the fixtures' tokenizers have no merges for them): llguidance tokenizes the bytes it
/// forces from the middle of a character, which must not be made lossy.
#[test]
fn forced_text_with_three_byte_characters_is_admitted_byte_by_byte() {
    let (tok, markers) = setup(ToolFormat::MiniMax);
    for text in ["｜", "中文", "€5", "<｜DSML｜invoke"] {
        let ids = tok.encode(text);
        assert!(ids.len() > text.chars().count(), "{text}: split into byte tokens");
        let lark = format!("start: {}", serde_json::to_string(text).unwrap());
        assert!(
            super::test_support::grammar_admits(&tok, &markers, &lark, &ids),
            "{text}"
        );
        let other = format!("start: {}", serde_json::to_string("€").unwrap());
        assert_eq!(
            super::test_support::grammar_admits(&tok, &markers, &other, &ids),
            text == "€"
        );
    }
}
