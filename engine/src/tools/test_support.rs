//! Test fixtures: the tiny K2 / K3 / DeepSeek-V3 / Qwen3.5 / GLM / MiniMax-M2 / gpt-oss tokenizers with tool-call tokens
//! and id builders for the parser and grammar tests.

use std::path::Path;
use std::sync::Arc;

use super::{ToolFormat, ToolMarkers};
use crate::synth::{TokenizerFlavor, write_byte_tokenizer_flavor};
use crate::tokenizer::Tokenizer;

fn fixture(name: &str) -> Arc<Tokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizers")
        .join(name);
    Arc::new(Tokenizer::from_dir(&dir).expect("fixture tokenizer"))
}

/// `kimi_tiny`: a 1,024-rank BPE with K2's specials, tool tokens included.
pub fn k2() -> Arc<Tokenizer> {
    fixture("kimi_tiny")
}

/// `deepseek_tiny`: a byte-level BPE with DeepSeek-V3's (non-special) tool tokens.
pub fn deepseek() -> Arc<Tokenizer> {
    fixture("deepseek_tiny")
}

/// The synthetic K3 byte tokenizer (XTML specials).
pub fn k3() -> Arc<Tokenizer> {
    let dir = tempfile::tempdir().expect("tempdir");
    write_byte_tokenizer_flavor(dir.path(), TokenizerFlavor::K3).expect("write K3 tokenizer");
    Arc::new(Tokenizer::from_dir(dir.path()).expect("K3 tokenizer"))
}

fn model_fixture(name: &str) -> Arc<Tokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Arc::new(Tokenizer::from_dir(&dir).expect("fixture tokenizer"))
}

/// DeepSeek-V3.2 as DeepSeek ships it: the dsv32-dsa-bf16 fixture's tokenizer and config
/// without its chat template, so the native DSML encoder renders chats.
pub fn dsv32_native() -> Arc<Tokenizer> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dsv32-dsa-bf16");
    let dir = tempfile::tempdir().expect("temp dir");
    for f in ["tokenizer.json", "config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
    }
    let config = std::fs::read(src.join("tokenizer_config.json")).expect("read");
    let mut config: serde_json::Value = serde_json::from_slice(&config).expect("json");
    config.as_object_mut().expect("object").remove("chat_template");
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");
    Arc::new(Tokenizer::from_dir(dir.path()).expect("fixture tokenizer"))
}

/// The DeepSeek-V4 fixture's tokenizer, which ships no chat template (V4's DSML encoder).
pub fn dsv4_native() -> Arc<Tokenizer> {
    model_fixture("dsv4-flash")
}

/// The Qwen3.5 fixture's tokenizer (`<tool_call>` markers, `<think>`, the published Qwen3.5
/// chat template).
pub fn qwen35() -> Arc<Tokenizer> {
    model_fixture("qwen3.5-moe")
}

/// The GLM-4.5 fixture's tokenizer (GLM's tool and reasoning tokens, the published template).
pub fn glm() -> Arc<Tokenizer> {
    model_fixture("glm4-moe-fp8")
}

/// The gpt-oss fixture's tokenizer (harmony specials, the published template).
pub fn gpt_oss() -> Arc<Tokenizer> {
    model_fixture("gpt-oss")
}

/// The MiniMax-M2 fixture's tokenizer (`<minimax:tool_call>`, `<think>`, the published
/// template).
pub fn minimax() -> Arc<Tokenizer> {
    model_fixture("minimax-m2-fp8")
}

/// The tokenizer of `format` and its markers.
pub fn setup(format: ToolFormat) -> (Arc<Tokenizer>, ToolMarkers) {
    let tok = match format {
        ToolFormat::KimiK2 => k2(),
        ToolFormat::KimiK3 => k3(),
        ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => deepseek(),
        ToolFormat::Hermes | ToolFormat::QwenXml => qwen35(),
        ToolFormat::Glm => glm(),
        ToolFormat::MiniMax => minimax(),
        ToolFormat::Harmony => gpt_oss(),
        ToolFormat::Dsml => dsv32_native(),
    };
    let markers = ToolMarkers::resolve(format, &tok).expect("markers");
    (tok, markers)
}

/// Ids of a string made of trusted pieces: `Special(s)` pieces become marker ids, `Text(s)`
/// pieces plain text (each piece encoded alone).
#[derive(Clone, Copy)]
pub enum P<'a> {
    /// Marker text (encoded with specials recognised).
    S(&'a str),
    /// Plain text.
    T(&'a str),
}

/// Encode pieces.
pub fn ids(tok: &Tokenizer, pieces: &[P<'_>]) -> Vec<u32> {
    pieces
        .iter()
        .flat_map(|p| match p {
            P::S(s) => tok.encode_with_special(s),
            P::T(s) => tok.encode(s),
        })
        .collect()
}

/// The calls of `events` as (name, whole arguments).
pub fn calls_of(events: &[super::ToolEvent]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            super::ToolEvent::CallStart { name, .. } => out.push((name.clone(), String::new())),
            super::ToolEvent::ArgumentsDelta { fragment, .. } => {
                if let Some(last) = out.last_mut() {
                    last.1 += fragment;
                }
            }
            _ => {}
        }
    }
    out
}

/// The ids `events` passed through, decoded.
pub fn passed_text(tok: &Tokenizer, events: &[super::ToolEvent]) -> String {
    let ids: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            super::ToolEvent::Token(t) => Some(*t),
            _ => None,
        })
        .collect();
    tok.decode(&ids)
}

/// Whether the lark grammar `lark` (compiled against `tok` with `markers`' structural ids)
/// admits all of `ids`, checked against the mask at every step, and is complete after them.
pub fn grammar_admits(tok: &Arc<Tokenizer>, markers: &ToolMarkers, lark: &str, ids: &[u32]) -> bool {
    let env = crate::constrain::token_env(tok.clone(), tok.vocab_size(), &markers.structural_ids())
        .expect("token env");
    let mut f = llguidance::ParserFactory::new_simple(&env).expect("factory");
    f.quiet();
    let mut m =
        llguidance::Matcher::new(f.create_parser(llguidance::api::TopLevelGrammar::from_lark(lark.into())));
    assert_eq!(m.get_error(), None, "{lark}");
    for &t in ids {
        if m.is_stopped() || !m.compute_mask().expect("mask").is_allowed(t) {
            return false;
        }
        m.consume_token(t).expect("consume");
    }
    m.is_accepting().expect("accepting")
}
