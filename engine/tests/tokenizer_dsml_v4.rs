//! DeepSeek-V4's native prompt encoder against its published one: `encoding_dsv4.py`'s
//! `encode_messages` (fixtures/dsml-v4/golden.json, made by gen_dsml_v4.py after checking that
//! the encoder reproduces DeepSeek's four published `encoding/tests/test_output_*.txt`), on the
//! dsv4-flash tokenizer, which ships no chat template, as DeepSeek ships V4.

mod golden_support;

use std::path::Path;

use deltafin_engine::Error;
use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, DsmlVersion, Tokenizer};
use serde_json::{Value, json};

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dsml-v4/golden.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// OpenAI-shaped messages (an assistant with calls may have no `content`).
fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.as_object_mut().unwrap().entry("content").or_insert(json!(""));
            serde_json::from_value(m).unwrap()
        })
        .collect()
}

fn options(case: &Value) -> ChatOptions {
    let mut opts = ChatOptions {
        add_generation_prompt: true,
        tools: case["tools"].as_array().cloned(),
        ..ChatOptions::default()
    };
    opts.extra.insert("thinking".into(), case["thinking"].clone());
    if let Some(e) = case["reasoning_effort"].as_str() {
        opts.extra.insert("reasoning_effort".into(), json!(e));
    }
    opts
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&golden_support::fixture("dsv4-flash")).unwrap()
}

#[test]
fn a_deepseek_v4_checkpoint_renders_as_its_published_encoder() {
    let t = tokenizer();
    assert_eq!(t.dsml_version(), Some(DsmlVersion::V4));
    let golden = golden();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (msgs, opts) = (messages(&case["messages"]), options(case));
        assert_eq!(
            t.render_chat(&msgs, &opts).unwrap(),
            case["text"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(
            t.encode_chat(&msgs, &opts).unwrap(),
            golden_support::ids(&case["ids"]),
            "{name}"
        );
    }
}

#[test]
fn unknown_roles_and_bad_arguments_are_typed_errors() {
    let t = tokenizer();
    let mut opts = ChatOptions::default();
    let user = ChatMessage::new("user", "hi");
    let list_args = ChatMessage {
        role: "assistant".into(),
        tool_calls: Some(vec![
            json!({"type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}),
        ]),
        ..Default::default()
    };
    for msgs in [
        vec![user.clone(), list_args],
        vec![user.clone(), ChatMessage::new("narrator", "x")],
    ] {
        let e = t.encode_chat(&msgs, &opts).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
    opts.extra.insert("reasoning_effort".into(), json!("extreme"));
    let e = t.encode_chat(&[user], &opts).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}
