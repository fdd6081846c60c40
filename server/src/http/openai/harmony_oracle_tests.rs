//! gpt-oss output read as OpenAI's `openai-harmony` reads it: every completion of
//! `engine/tests/fixtures/harmony/golden.json` (`gen_harmony.py`: recipients in the channel or
//! the role header, `<|constrain|>json`, a call on the analysis channel, a preamble, two calls,
//! `<|return|>`) goes through the response parser on the gpt-oss fixture's tokenizer, one id at
//! a time as decoding feeds it. Harmony's messages map to the response as the chat API maps them: a message
//! to `functions.NAME` is a call with its text as arguments, other `analysis` messages are
//! `reasoning_content`, the rest (`final`, a `commentary` preamble) is `content`.

use std::path::Path;
use std::sync::Arc;

use deltafin_engine::tokenizer::Tokenizer;
use deltafin_engine::tools::ToolFormat;
use serde_json::Value;

use super::output::{Delta, OutputParser, reasoning_markers};

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/harmony/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What the chat API returns for harmony's messages: (reasoning, content, calls).
fn expected(messages: &[Value]) -> (String, String, Vec<(String, Value)>) {
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    for m in messages {
        let text = m["text"].as_str().unwrap();
        match (m["recipient"].as_str(), m["channel"].as_str()) {
            (Some(to), _) => {
                let name = to.strip_prefix("functions.").expect("a function recipient");
                calls.push((name.to_string(), serde_json::from_str(text).unwrap()));
            }
            (None, Some("analysis")) => reasoning.push_str(text),
            (None, _) => content.push_str(text),
        }
    }
    (reasoning, content, calls)
}

fn parse(tok: &Arc<Tokenizer>, ids: &[u32]) -> Delta {
    let prompt = tok.encode_with_special("<|start|>user<|message|>Hi<|end|><|start|>assistant");
    let mut p = OutputParser::new(tok.clone(), reasoning_markers(tok), &prompt, vec![]).with_tools(
        ToolFormat::Harmony,
        "h".into(),
        Default::default(),
    );
    let mut all = Delta::default();
    for &id in ids {
        all.extend(p.push(id));
    }
    all.extend(p.finish());
    assert_eq!(p.malformed_calls(), 0);
    all
}

#[test]
fn gpt_oss_output_reads_as_openai_harmony_parses_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/gpt-oss");
    let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
    let golden = golden();
    let cases = golden["parses"].as_array().unwrap();
    assert!(cases.len() >= 9);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let ids = tok.encode_with_special(case["completion"].as_str().unwrap());
        let (reasoning, content, calls) = expected(case["messages"].as_array().unwrap());
        let d = parse(&tok, &ids);
        assert_eq!(
            (d.reasoning.as_str(), d.content.as_str()),
            (&*reasoning, &*content),
            "{name}"
        );
        let got: Vec<(String, Value)> = d
            .tool_calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str(&c.arguments).unwrap();
                (c.name.clone().unwrap_or_default(), args)
            })
            .collect();
        assert_eq!(got, calls, "{name}");
    }
}
