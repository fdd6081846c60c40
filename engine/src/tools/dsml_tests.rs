//! DSML (DeepSeek-V3.2 without a chat template) end to end on the fixture's tokenizer: the
//! format chosen from the native encoder, blocks parsed from generated ids in any chunking with
//! nothing of the markup passed as text, cut-off and malformed blocks, and the forced grammar
//! admitting the encoder's own spelling of a call and refusing other spellings.

use serde_json::json;

use super::grammar::{Forced, FunctionSpec, forced_call_grammar};
use super::test_support::{P, calls_of, dsv4_native, dsv32_native, grammar_admits, ids, passed_text, setup};
use super::{ToolCallParser, ToolEvent, ToolFormat, ToolMarkers};

const EOS: &str = "<｜end▁of▁sentence｜>";

/// Two calls as the encoder writes them in history (`chat_tools_no_system` of dsml/golden.json).
const BLOCK: &str = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"zone\" string=\"true\">UTC</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

fn run(ids: &[u32], chunk: usize) -> Vec<ToolEvent> {
    let (tok, markers) = setup(ToolFormat::Dsml);
    let mut p = ToolCallParser::new(tok, markers, "t".into());
    let mut out = Vec::new();
    for c in ids.chunks(chunk) {
        p.push_all(c, &mut out);
    }
    p.finish(&mut out);
    out
}

#[test]
fn the_native_encoder_selects_dsml_and_a_templated_tokenizer_refuses_it() {
    let tok = dsv32_native();
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::Dsml));
    let templated = super::test_support::deepseek();
    assert!(ToolMarkers::resolve(ToolFormat::Dsml, &templated).is_err());
}

#[test]
fn dsml_blocks_parse_in_any_chunking_and_no_markup_reaches_the_text() {
    let tok = dsv32_native();
    let out = ids(&tok, &[P::T("Checking."), P::T(BLOCK), P::S(EOS)]);
    for chunk in [1, 2, 5, out.len()] {
        let events = run(&out, chunk);
        assert_eq!(
            calls_of(&events),
            vec![
                (
                    "get_weather".to_string(),
                    json!({"city": "Oslo", "days": 2}).to_string()
                ),
                ("get_time".to_string(), json!({"zone": "UTC"}).to_string()),
            ],
            "chunk {chunk}"
        );
        let text = passed_text(&tok, &events);
        assert!(text.starts_with("Checking"), "{text:?}");
        assert!(!text.replace(EOS, "").contains("<｜"), "{text:?}");
        assert!(events.iter().any(|e| matches!(e, ToolEvent::SectionStart)));
    }
}

#[test]
fn text_that_only_looks_like_a_block_start_is_given_back() {
    let tok = dsv32_native();
    let out = ids(&tok, &[P::T("a\n\n<b> and \n\n<｜DSM"), P::S(EOS)]);
    let events = run(&out, 1);
    assert!(calls_of(&events).is_empty());
    assert_eq!(
        passed_text(&tok, &events),
        format!("a\n\n<b> and \n\n<｜DSM{EOS}")
    );
}

#[test]
fn cut_off_and_malformed_blocks_never_become_calls_or_text() {
    let tok = dsv32_native();
    let mid = BLOCK
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| i >= BLOCK.len() / 2)
        .unwrap();
    let cut = &BLOCK[..mid];
    let events = run(&ids(&tok, &[P::T("Hm."), P::T(cut)]), 3);
    assert!(calls_of(&events).is_empty());
    assert!(events.iter().any(|e| matches!(e, ToolEvent::CutOff(_))));
    assert!(!passed_text(&tok, &events).contains("DSML"));
    let bad = BLOCK.replace("string=\"false\">2", "string=\"false\">two");
    let events = run(&ids(&tok, &[P::T(&bad), P::S(EOS)]), 4);
    assert!(calls_of(&events).is_empty());
    assert!(events.iter().any(|e| matches!(e, ToolEvent::Malformed(_))));
    // The block failed at its first invoke's close: the rest of it is taken in, not passed on.
    assert_eq!(passed_text(&tok, &events), EOS);
}

#[test]
fn the_forced_grammar_admits_the_encoders_spelling_only() {
    let tok = dsv32_native();
    let markers = ToolMarkers::resolve(ToolFormat::Dsml, &tok).unwrap();
    let tools = vec![
        FunctionSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]}),
        },
        FunctionSpec {
            name: "get_time".into(),
            parameters: json!({"type": "object", "properties": {"zone": {"enum": ["UTC", "local"]}}, "required": ["zone"]}),
        },
    ];
    let lark = forced_call_grammar(&markers, &tools, Forced::Required, true, false).unwrap();
    let good = ids(&tok, &[P::T(BLOCK), P::S(EOS)]);
    assert!(grammar_admits(&tok, &markers, &lark, &good), "{lark}");
    let one = forced_call_grammar(&markers, &tools, Forced::Required, false, false).unwrap();
    assert!(
        !grammar_admits(&tok, &markers, &one, &good),
        "parallel calls off: one call"
    );
    for bad in [
        BLOCK.replace("string=\"false\">2", "string=\"true\">2"),
        BLOCK.replace(">UTC<", ">utc<"),
        BLOCK.replace("\n</｜DSML｜function_calls>", "</｜DSML｜function_calls>"),
    ] {
        let ids = ids(&tok, &[P::T(&bad), P::S(EOS)]);
        assert!(!grammar_admits(&tok, &markers, &lark, &ids), "{bad:?}");
    }
}

/// DeepSeek-V4's block (`encoding_dsv4.py`): `tool_calls` where V3.2 has `function_calls`.
/// A V4 tokenizer reads V4 blocks as calls, forces them by grammar, and leaves V3.2's spelling
/// as text.
#[test]
fn deepseek_v4_reads_and_forces_its_tool_calls_block() {
    let tok = dsv4_native();
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::Dsml));
    let markers = ToolMarkers::resolve(ToolFormat::Dsml, &tok).unwrap();
    let v4 = BLOCK.replace("function_calls", "tool_calls");
    let out = ids(&tok, &[P::T("Checking."), P::T(&v4), P::S(EOS)]);
    for chunk in [1, 3, out.len()] {
        let mut p = ToolCallParser::new(tok.clone(), markers, "t".into());
        let mut events = Vec::new();
        for c in out.chunks(chunk) {
            p.push_all(c, &mut events);
        }
        p.finish(&mut events);
        let names: Vec<String> = calls_of(&events).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["get_weather", "get_time"], "chunk {chunk}");
        assert!(!passed_text(&tok, &events).contains("DSML"));
    }
    let old = ids(&tok, &[P::T(BLOCK), P::S(EOS)]);
    let mut p = ToolCallParser::new(tok.clone(), markers, "t".into());
    let mut events = Vec::new();
    p.push_all(&old, &mut events);
    p.finish(&mut events);
    assert!(calls_of(&events).is_empty(), "V3.2's block is not V4's");
    let tools = vec![FunctionSpec {
        name: "get_time".into(),
        parameters: json!({"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}),
    }];
    let lark = forced_call_grammar(&markers, &tools, Forced::Required, false, false).unwrap();
    let call = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"zone\" string=\"true\">UTC</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    assert!(
        grammar_admits(&tok, &markers, &lark, &ids(&tok, &[P::T(call), P::S(EOS)])),
        "{lark}"
    );
    let v32 = call.replace("tool_calls", "function_calls");
    assert!(!grammar_admits(
        &tok,
        &markers,
        &lark,
        &ids(&tok, &[P::T(&v32), P::S(EOS)])
    ));
}
