//! Shared helpers for the tokenizer tests: fixture paths, JSON goldens, recipes, digests.
#![allow(dead_code)]

use std::path::PathBuf;

use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, Tokenizer};
use serde_json::Value;

/// `engine/tests/fixtures/tokenizers/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizers")
        .join(name)
}

/// Parse a JSON fixture file.
pub fn load_json(name: &str) -> Value {
    let path = fixture(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Load a fixture tokenizer directory.
pub fn load_tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_dir(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A list of ids from JSON.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The text of a `[[piece, times], ...]` recipe.
pub fn build_text(recipe: &Value) -> String {
    recipe
        .as_array()
        .expect("recipe")
        .iter()
        .map(|step| {
            step[0]
                .as_str()
                .expect("piece")
                .repeat(step[1].as_u64().expect("times") as usize)
        })
        .collect()
}

/// FNV-1a 64 over ids as little-endian u32 (the generators' `fnv1a64_ids`).
pub fn fnv1a64_ids(ids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// A chat case's messages and options.
pub fn chat_inputs(case: &Value) -> (Vec<ChatMessage>, ChatOptions) {
    let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).expect("messages");
    let tools = case["tools"].as_array().cloned();
    let extra = case["extra"].as_object().cloned().unwrap_or_default();
    let opts = ChatOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
        tools,
        extra,
        ..Default::default()
    };
    (messages, opts)
}

/// The first index where two id lists differ, for readable failures.
pub fn first_diff(a: &[u32], b: &[u32]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
}

/// Assert equal ids with context around the first difference.
pub fn assert_ids(label: &str, got: &[u32], want: &[u32]) {
    if let Some(i) = first_diff(got, want) {
        let lo = i.saturating_sub(3);
        panic!(
            "{label}: ids differ at {i} (got len {}, want len {}): got[{lo}..] = {:?}, want[{lo}..] = {:?}",
            got.len(),
            want.len(),
            &got[lo..got.len().min(i + 5)],
            &want[lo..want.len().min(i + 5)]
        );
    }
}
