//! Raw-prompt parity: `Tokenizer::encode_prompt` is the model's own Hugging Face
//! `tokenizer(text)["input_ids"]` — BOS only where that tokenizer adds one
//! (fixtures/tokenizers/gen_prompts.py).

mod tokenizer_support;

use std::path::PathBuf;

use deltafin_engine::tokenizer::Tokenizer;
use tokenizer_support::*;

fn fixture_dir(name: &str) -> PathBuf {
    match name {
        "deepseek_tiny" | "kimi_tiny" => fixture(name),
        other => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(other),
    }
}

/// deepseek_tiny without its post-processor and with `add_bos_token: true` (as gen_prompts.py).
fn no_post_processor_variant() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("deepseek_tiny");
    let mut tj: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer.json")).unwrap()).unwrap();
    tj["post_processor"] = serde_json::Value::Null;
    std::fs::write(dir.path().join("tokenizer.json"), tj.to_string()).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).unwrap()).unwrap();
    cfg["add_bos_token"] = true.into();
    cfg["tokenizer_class"] = "LlamaTokenizerFast".into();
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn prompts_match_the_models_own_tokenizers() {
    let g = load_json("prompts_golden.json");
    let variant = no_post_processor_variant();
    let fixtures = g["fixtures"].as_object().unwrap();
    assert!(fixtures.len() >= 8);
    for (name, f) in fixtures {
        let dir = match name.as_str() {
            "deepseek_tiny_no_post_processor" => variant.path().to_path_buf(),
            other => fixture_dir(other),
        };
        let t = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        for case in f["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_ids(
                &format!("{name} {text:?}"),
                &t.encode_prompt(text),
                &ids(&case["ids"]),
            );
        }
    }
}

#[test]
fn bos_only_where_the_tokenizer_adds_one() {
    let ds = load_tokenizer("deepseek_tiny");
    let bos = ds.token_to_id("<｜begin▁of▁sentence｜>").unwrap();
    assert_eq!(ds.encode_prompt("Hi")[0], bos);
    assert_eq!(
        &ds.encode_prompt("Hi")[1..],
        ds.encode_with_special("Hi").as_slice()
    );
    let kimi = load_tokenizer("kimi_tiny");
    assert_eq!(kimi.encode_prompt("Hi"), kimi.encode_with_special("Hi"));
    assert!(
        kimi.bos_id().is_some(),
        "config names a BOS that the tokenizer never adds"
    );
}
