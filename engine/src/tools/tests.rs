//! Parser tests on token-id sequences of each native format.

use super::test_support::{P, ids, setup};
use super::*;
use P::{S, T};

/// What a run produced: pass-through ids, calls `(index, id, name, arguments)`, malformed ids,
/// cut-off (withheld) ids.
#[derive(Debug, Default, PartialEq, Eq)]
struct Run {
    tokens: Vec<u32>,
    calls: Vec<(usize, String, String, String)>,
    malformed: Vec<Vec<u32>>,
    cut_off: Vec<Vec<u32>>,
    sections: usize,
}

fn collapse(events: &[ToolEvent]) -> Run {
    let mut r = Run::default();
    for e in events {
        match e {
            ToolEvent::Token(id) => r.tokens.push(*id),
            ToolEvent::SectionStart => r.sections += 1,
            ToolEvent::CallStart { index, id, name } => {
                assert_eq!(*index, r.calls.len(), "calls start in index order");
                r.calls.push((*index, id.clone(), name.clone(), String::new()));
            }
            ToolEvent::ArgumentsDelta { index, fragment } => r.calls[*index].3.push_str(fragment),
            ToolEvent::CallEnd { index } => assert_eq!(*index + 1, r.calls.len()),
            ToolEvent::Malformed(ids) => r.malformed.push(ids.clone()),
            ToolEvent::CutOff(ids) => r.cut_off.push(ids.clone()),
        }
    }
    r
}

/// Feed `ids` in chunks of `chunk` (0 = all at once through `push_all`) and collapse.
fn run_chunked(format: ToolFormat, input: &[u32], chunk: usize) -> (Run, Vec<ToolEvent>) {
    let (tok, markers) = setup(format);
    let mut p = ToolCallParser::new(tok, markers, "req".into());
    let mut events = Vec::new();
    if chunk == 0 {
        p.push_all(input, &mut events);
    } else {
        for piece in input.chunks(chunk) {
            p.push_all(piece, &mut events);
        }
    }
    p.finish(&mut events);
    let run = collapse(&events);
    assert_eq!(p.calls_seen(), run.calls.len());
    assert_eq!(p.malformed_calls(), run.malformed.len());
    assert_eq!(p.withheld_calls(), run.cut_off.len());
    (run, events)
}

/// Run and check that every chunking gives the same events.
fn run(format: ToolFormat, input: &[u32]) -> Run {
    let (one, events) = run_chunked(format, input, 1);
    for chunk in [0, 2, 3, 7] {
        assert_eq!(run_chunked(format, input, chunk).1, events, "chunk size {chunk}");
    }
    one
}

fn call(index: usize, id: &str, name: &str, args: &str) -> (usize, String, String, String) {
    (index, id.into(), name.into(), args.into())
}

#[test]
fn formats_are_detected_from_their_tokens() {
    let (k2, _) = setup(ToolFormat::KimiK2);
    let (k3, _) = setup(ToolFormat::KimiK3);
    let (ds, _) = setup(ToolFormat::DeepSeekV3);
    assert_eq!(ToolFormat::detect(&k2), Some(ToolFormat::KimiK2));
    assert_eq!(ToolFormat::detect(&k3), Some(ToolFormat::KimiK3));
    assert_eq!(ToolFormat::detect(&ds), Some(ToolFormat::DeepSeekV3));
    assert!(matches!(
        ToolMarkers::resolve(ToolFormat::KimiK2, &k3),
        Err(ToolError::MissingToken { .. })
    ));
    // The synthetic K2 byte tokenizer has K2's tool tokens at K2's offsets.
    let dir = tempfile::tempdir().unwrap();
    crate::synth::write_byte_tokenizer(dir.path()).unwrap();
    let synth = crate::tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(ToolFormat::detect(&synth), Some(ToolFormat::KimiK2));
}

#[test]
fn k2_calls_with_content_dotted_names_and_marker_text_in_arguments() {
    let (tok, _) = setup(ToolFormat::KimiK2);
    let args1 = r#"{"city": "Beijing", "note": "<|tool_call_end|><|tool_calls_section_end|>"}"#;
    let input = ids(
        &tok,
        &[
            T("Let me check."),
            S("<|tool_calls_section_begin|><|tool_call_begin|>"),
            T("functions.get_weather:0"),
            S("<|tool_call_argument_begin|>"),
            T(args1),
            S("<|tool_call_end|><|tool_call_begin|>"),
            T("functions.ns.tool.v2:1"),
            S("<|tool_call_argument_begin|>"),
            T("{}"),
            S("<|tool_call_end|><|tool_calls_section_end|><|im_end|>"),
        ],
    );
    let r = run(ToolFormat::KimiK2, &input);
    let mut content = tok.encode("Let me check.");
    content.push(tok.token_to_id("<|im_end|>").unwrap());
    assert_eq!(r.tokens, content);
    assert_eq!(
        r.calls,
        vec![
            call(0, "call_req_0", "get_weather", args1),
            call(1, "call_req_1", "ns.tool.v2", "{}"),
        ]
    );
    assert!(r.malformed.is_empty());
    assert_eq!(r.sections, 1);
}

#[test]
fn k2_malformed_calls_come_back_as_text_and_later_calls_still_parse() {
    let (tok, _) = setup(ToolFormat::KimiK2);
    let bad_json = ids(
        &tok,
        &[
            S("<|tool_call_begin|>"),
            T("functions.f:0"),
            S("<|tool_call_argument_begin|>"),
            T(r#"{"a": 1"#),
            S("<|tool_call_end|>"),
        ],
    );
    let no_index = ids(
        &tok,
        &[
            S("<|tool_call_begin|>"),
            T("call00003"),
            S("<|tool_call_argument_begin|>"),
            T("{}"),
            S("<|tool_call_end|>"),
        ],
    );
    let unclosed = ids(
        &tok,
        &[
            S("<|tool_call_begin|>"),
            T("functions.g:2"),
            S("<|tool_call_argument_begin|>"),
            T(r#"{"x": 2}"#),
        ],
    );
    let good = ids(
        &tok,
        &[
            S("<|tool_call_begin|>"),
            T("functions.h:3"),
            S("<|tool_call_argument_begin|>"),
            T(r#"{"ok": true}"#),
            S("<|tool_call_end|>"),
        ],
    );
    let section_begin = tok.token_to_id("<|tool_calls_section_begin|>").unwrap();
    let section_end = tok.token_to_id("<|tool_calls_section_end|>").unwrap();
    let mut input = vec![section_begin];
    for part in [&bad_json, &no_index, &unclosed, &good] {
        input.extend(part);
    }
    input.push(section_end);
    let r = run(ToolFormat::KimiK2, &input);
    assert_eq!(r.malformed, vec![bad_json, no_index, unclosed]);
    assert_eq!(r.calls, vec![call(0, "call_req_0", "h", r#"{"ok": true}"#)]);
    assert!(r.tokens.is_empty());
    // A call cut off by the end of the output is withheld: neither a call nor text.
    let mut cut = vec![section_begin];
    cut.extend(&good[..good.len() - 1]);
    let r = run(ToolFormat::KimiK2, &cut);
    assert!(r.malformed.is_empty() && r.calls.is_empty() && r.tokens.is_empty());
    assert_eq!(r.cut_off.len(), 1, "{r:?}");
    assert!(r.cut_off[0].ends_with(&good[..good.len() - 1]), "{r:?}");
}

#[test]
fn k2_marker_text_outside_a_call_stays_text() {
    let (tok, _) = setup(ToolFormat::KimiK2);
    let input = tok.encode("<|tool_calls_section_begin|><|tool_call_begin|>functions.x:0");
    let r = run(ToolFormat::KimiK2, &input);
    assert_eq!(r.tokens, input);
    assert!(r.calls.is_empty() && r.malformed.is_empty() && r.sections == 0);
}

#[test]
fn k2_ids_keep_the_name_between_the_prefix_and_the_last_colon() {
    use super::parser::parse_k2_id;
    let got = |s: &str| parse_k2_id(s).map(|(_, n)| n);
    assert_eq!(got("functions.get_weather:0").as_deref(), Some("get_weather"));
    assert_eq!(got(" functions.a.b:c:12 ").as_deref(), Some("a.b:c"));
    assert_eq!(got("search:1").as_deref(), Some("search"));
    assert_eq!(got("functions.x"), None);
    assert_eq!(got("functions.:1"), None);
    assert_eq!(got("functions.x:1a"), None);
    assert_eq!(got("functions.a b:1"), None);
}

fn k3_call(name: &str, body: &[P<'static>]) -> Vec<P<'static>> {
    let head: &'static str = Box::leak(format!("call tool=\"{name}\" index=\"1\"").into_boxed_str());
    let mut v = vec![S("<|open|>"), T(head), S("<|sep|>")];
    v.extend(body.iter().copied());
    v.extend([S("<|close|>"), T("call"), S("<|sep|>")]);
    v
}

fn k3_arg(key: &'static str, ty: &'static str, value: &'static str) -> Vec<P<'static>> {
    let head: &'static str = Box::leak(format!("argument key=\"{key}\" type=\"{ty}\"").into_boxed_str());
    vec![
        S("<|open|>"),
        T(head),
        S("<|sep|>"),
        T(value),
        S("<|close|>"),
        T("argument"),
        S("<|sep|>"),
    ]
}

fn k3_tools(calls: Vec<Vec<P<'static>>>) -> Vec<P<'static>> {
    let mut v = vec![S("<|open|>"), T("tools"), S("<|sep|>")];
    v.extend(calls.into_iter().flatten());
    v.extend([S("<|close|>"), T("tools"), S("<|sep|>")]);
    v
}

#[test]
fn k3_calls_build_json_arguments_and_everything_else_passes_through() {
    let (tok, _) = setup(ToolFormat::KimiK3);
    let before = "I think<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>";
    let after = "<|close|>message<|sep|><|end_of_msg|>";
    let mut body: Vec<P<'static>> = Vec::new();
    body.extend(k3_arg("city", "string", "Paris <|close|>argument<|sep|> \"x\"\n"));
    body.extend(k3_arg("days", "number", "3"));
    body.extend(k3_arg("opts", "object", "{\n  \"deep\": [1, null]\n}"));
    body.extend(k3_arg("say &quot;hi&quot; &amp;", "boolean", "true"));
    let raw = k3_call(
        "raw",
        &[
            S("<|open|>"),
            T("json type=\"object\""),
            S("<|sep|>"),
            T(r#"{"a": [1]}"#),
            S("<|close|>"),
            T("json"),
            S("<|sep|>"),
        ],
    );
    let mut pieces = vec![S(before)];
    pieces.extend(k3_tools(vec![
        k3_call("get.weather", &body),
        k3_call("none", &[]),
        raw,
    ]));
    pieces.push(S(after));
    let input = ids(&tok, &pieces);
    let r = run(ToolFormat::KimiK3, &input);
    let mut outside = tok.encode_with_special(before);
    outside.extend(tok.encode_with_special(after));
    assert_eq!(r.tokens, outside);
    assert!(r.malformed.is_empty(), "{:?}", r.malformed);
    assert_eq!(
        r.calls,
        vec![
            call(
                0,
                "call_req_0",
                "get.weather",
                r#"{"city":"Paris <|close|>argument<|sep|> \"x\"\n","days":3,"opts":{
  "deep": [1, null]
},"say \"hi\" &":true}"#
            ),
            call(1, "call_req_1", "none", "{}"),
            call(2, "call_req_2", "raw", r#"{"a": [1]}"#),
        ]
    );
    assert_eq!(r.sections, 1);
    for (_, _, _, args) in &r.calls {
        serde_json::from_str::<serde_json::Value>(args).expect("valid JSON arguments");
    }
}

#[test]
fn k3_partial_tags_are_held_until_decided() {
    let (tok, markers) = setup(ToolFormat::KimiK3);
    let mut p = ToolCallParser::new(tok.clone(), markers, String::new());
    let mut ev = Vec::new();
    let open = tok.token_to_id("<|open|>").unwrap();
    p.push(open, &mut ev);
    for b in tok.encode("too") {
        p.push(b, &mut ev);
    }
    assert!(ev.is_empty(), "a possible `tools` tag is held: {ev:?}");
    p.push(tok.encode("x")[0], &mut ev);
    let mut expected = vec![open];
    expected.extend(tok.encode("toox"));
    assert_eq!(
        collapse(&ev).tokens,
        expected,
        "released once it cannot be `tools`"
    );
    // `<|open|>response` is released at its first letter.
    ev.clear();
    p.push(open, &mut ev);
    p.push(tok.encode("r")[0], &mut ev);
    assert_eq!(collapse(&ev).tokens.len(), 2);
}

#[test]
fn k3_malformed_calls_come_back_as_text() {
    let (tok, _) = setup(ToolFormat::KimiK3);
    let bad_number = k3_call("f", &k3_arg("n", "number", "three"));
    let good = k3_call("g", &k3_arg("s", "string", "ok"));
    let mut unclosed = vec![S("<|open|>"), T("call tool=\"h\" index=\"3\""), S("<|sep|>")];
    unclosed.extend(k3_arg("s", "string", "x"));
    let junk = k3_call("j", &[T("stray text")]);
    let input = ids(
        &tok,
        &k3_tools(vec![bad_number.clone(), good, junk.clone(), unclosed.clone()]),
    );
    let r = run(ToolFormat::KimiK3, &input);
    assert_eq!(r.calls, vec![call(0, "call_req_0", "g", r#"{"s":"ok"}"#)]);
    assert_eq!(
        r.malformed,
        vec![ids(&tok, &bad_number), ids(&tok, &junk), ids(&tok, &unclosed)]
    );
    // Output ending inside a call: withheld, neither a call nor text.
    let cut = ids(
        &tok,
        &[
            S("<|open|>"),
            T("tools"),
            S("<|sep|>"),
            S("<|open|>"),
            T("call tool=\"k\""),
        ],
    );
    let r = run(ToolFormat::KimiK3, &cut);
    assert!(
        r.malformed.is_empty() && r.calls.is_empty() && r.tokens.is_empty(),
        "{r:?}"
    );
    assert_eq!(r.cut_off.len(), 1);
}

#[test]
fn k3_tag_heads_parse_and_escape() {
    use super::xtml::{escape_attr, parse_head, unescape_attr};
    let (name, attrs) = parse_head(r#"argument key="a &quot;b&quot; &amp;amp;" type="string""#).unwrap();
    assert_eq!(name, "argument");
    assert_eq!(attrs[0], ("key".into(), "a \"b\" &amp;".into()));
    assert_eq!(attrs[1], ("type".into(), "string".into()));
    assert_eq!(parse_head("tools").unwrap(), ("tools".into(), vec![]));
    assert!(parse_head(r#"call tool="x"#).is_none());
    let s = r#"a"b&quot;c&"#;
    assert_eq!(unescape_attr(&escape_attr(s)), s);
}

#[test]
fn deepseek_calls_joined_by_newlines() {
    let (tok, _) = setup(ToolFormat::DeepSeekV3);
    let args1 = "{\n  \"city\": \"Paris\",\n  \"text\": \"```json\\n<｜tool\"\n}";
    let input = ids(
        &tok,
        &[
            T("Sure."),
            S("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
            T("function"),
            S("<｜tool▁sep｜>"),
            T("get.weather\n```json\n"),
            T(args1),
            T("\n```"),
            S("<｜tool▁call▁end｜>"),
            T("\n"),
            S("<｜tool▁call▁begin｜>"),
            T("function"),
            S("<｜tool▁sep｜>"),
            T("noop\n```json\n{}\n```"),
            S("<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"),
        ],
    );
    let r = run(ToolFormat::DeepSeekV3, &input);
    let mut content = tok.encode("Sure.");
    content.push(tok.token_to_id("<｜end▁of▁sentence｜>").unwrap());
    assert_eq!(r.tokens, content);
    assert_eq!(
        r.calls,
        vec![
            call(0, "call_req_0", "get.weather", args1),
            call(1, "call_req_1", "noop", "{}")
        ]
    );
    assert!(r.malformed.is_empty());
}

#[test]
fn deepseek_malformed_calls_and_spelled_markers() {
    let (tok, _) = setup(ToolFormat::DeepSeekV3);
    let call_ids = |ty: &'static str, body: &'static str| {
        ids(
            &tok,
            &[
                S("<｜tool▁call▁begin｜>"),
                T(ty),
                S("<｜tool▁sep｜>"),
                T(body),
                S("<｜tool▁call▁end｜>"),
            ],
        )
    };
    let bad_json = call_ids("function", "f\n```json\n{\"a\":\n```");
    let bad_type = call_ids("class", "f\n```json\n{}\n```");
    let no_fence_end = call_ids("function", "f\n```json\n{}\n");
    let good = call_ids("function", "g\n```json\n{\"b\": 2}\n```");
    let begin = tok.token_to_id("<｜tool▁calls▁begin｜>").unwrap();
    let mut input = vec![begin];
    for c in [&bad_json, &bad_type, &no_fence_end, &good] {
        input.extend(c);
    }
    let r = run(ToolFormat::DeepSeekV3, &input);
    assert_eq!(r.malformed, vec![bad_json, bad_type, no_fence_end]);
    assert_eq!(r.calls, vec![call(0, "call_req_0", "g", "{\"b\": 2}")]);
    // A marker spelled in plain text (split so the added token cannot match) is text.
    let mut spelled = tok.encode("<｜tool▁calls");
    spelled.extend(tok.encode("▁begin｜>"));
    assert!(!spelled.contains(&begin));
    let r = run(ToolFormat::DeepSeekV3, &spelled);
    assert_eq!(r.tokens, spelled);
}

#[test]
fn deepseek_v31_is_chosen_by_its_template_and_its_calls_parse() {
    // deepseek_tiny with a template that writes history calls as V3.1's does.
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/deepseek_tiny");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).unwrap()).unwrap();
    config["chat_template"] = serde_json::json!(
        "{% for m in messages %}{% for tool in m['tool_calls'] or [] %}{{'<｜tool▁call▁begin｜>' + \
         tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}\
         {% endfor %}{% endfor %}"
    );
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let v31 = crate::tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(ToolFormat::detect(&v31), Some(ToolFormat::DeepSeekV31));
    let (tok, _) = setup(ToolFormat::DeepSeekV31);
    assert_eq!(
        ToolFormat::detect(&tok),
        Some(ToolFormat::DeepSeekV3),
        "V3's fenced template"
    );
    let input = ids(
        &tok,
        &[
            T("Sure."),
            S("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
            T("get_weather"),
            S("<｜tool▁sep｜>"),
            T("{\"city\": \"Paris\"}"),
            S("<｜tool▁call▁end｜><｜tool▁call▁begin｜>"),
            T("noop"),
            S("<｜tool▁sep｜>"),
            T("{}"),
            S("<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"),
        ],
    );
    let r = run(ToolFormat::DeepSeekV31, &input);
    assert_eq!(
        r.calls,
        vec![
            call(0, "call_req_0", "get_weather", "{\"city\": \"Paris\"}"),
            call(1, "call_req_1", "noop", "{}")
        ]
    );
    // V3's spelling is not V3.1's: the name would be `function`, the arguments not JSON.
    let v3 = ids(
        &tok,
        &[
            S("<｜tool▁call▁begin｜>"),
            T("function"),
            S("<｜tool▁sep｜>"),
            T("f\n```json\n{}\n```"),
            S("<｜tool▁call▁end｜>"),
        ],
    );
    let r = run(ToolFormat::DeepSeekV31, &v3);
    assert!(r.calls.is_empty() && r.malformed.len() == 1);
    // The forced grammar admits V3.1's own spelling, one call or several.
    let (_, markers) = setup(ToolFormat::DeepSeekV31);
    let tools = [grammar::FunctionSpec {
        name: "get_weather".into(),
        parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }];
    let begin = ids(&tok, &[S("<｜tool▁calls▁begin｜>")]);
    let one = ids(
        &tok,
        &[
            S("<｜tool▁call▁begin｜>"),
            T("get_weather"),
            S("<｜tool▁sep｜>"),
            T("{\"city\": \"Paris\"}"),
            S("<｜tool▁call▁end｜>"),
        ],
    );
    let end = ids(&tok, &[S("<｜tool▁calls▁end｜><｜end▁of▁sentence｜>")]);
    let env = crate::constrain::token_env(tok.clone(), tok.vocab_size(), &markers.structural_ids()).unwrap();
    for (parallel, calls, ok) in [(false, 1, true), (true, 2, true), (false, 2, false)] {
        let lark = grammar::forced_call_grammar(&markers, &tools, grammar::Forced::Required, parallel, false)
            .unwrap();
        let mut f = llguidance::ParserFactory::new_simple(&env).unwrap();
        f.quiet();
        let mut m =
            llguidance::Matcher::new(f.create_parser(llguidance::api::TopLevelGrammar::from_lark(lark)));
        let seq: Vec<u32> = begin
            .iter()
            .copied()
            .chain((0..calls).flat_map(|_| one.clone()))
            .chain(end.clone())
            .collect();
        let admitted = seq.iter().all(|&t| {
            let allowed = !m.is_stopped() && m.compute_mask().unwrap().is_allowed(t);
            allowed && m.consume_token(t).is_ok()
        });
        assert_eq!(
            admitted && m.is_accepting().unwrap(),
            ok,
            "parallel {parallel}, {calls} calls"
        );
    }
}

#[test]
fn marker_tokens_name_every_marker_a_format_resolves() {
    for format in [
        ToolFormat::KimiK2,
        ToolFormat::KimiK3,
        ToolFormat::DeepSeekV3,
        ToolFormat::DeepSeekV31,
        ToolFormat::Hermes,
        ToolFormat::QwenXml,
        ToolFormat::Glm,
        ToolFormat::MiniMax,
        ToolFormat::Harmony,
    ] {
        let (tok, markers) = setup(format);
        for id in markers.structural_ids() {
            let text = tok.id_to_token(id).unwrap();
            assert!(
                format.marker_tokens().contains(&text.as_str()),
                "{format:?}: {text}"
            );
        }
    }
}

#[test]
fn minted_ids() {
    assert_eq!(mint_call_id("", 3), "call_3");
    assert_eq!(mint_call_id("abc", 0), "call_abc_0");
}
