//! A byte-level tokenizer in Kimi's `tiktoken.model` format: 256 single-byte ranks, the Kimi
//! special tokens at their K2 offsets, and a K2-style chat template.

use std::path::Path;

use base64::Engine as _;
use serde_json::{Map, json};

use crate::error::Result;
use crate::weights::write_atomic;

/// K2 special tokens as offsets from the number of ranks.
pub const KIMI_SPECIALS: &[(usize, &str)] = &[
    (0, "[BOS]"),
    (1, "[EOS]"),
    (2, "<|im_end|>"),
    (3, "<|im_user|>"),
    (4, "<|im_assistant|>"),
    (6, "<|start_header_id|>"),
    (7, "<|end_header_id|>"),
    (9, "[EOT]"),
    (10, "<|im_system|>"),
    (17, "<|im_middle|>"),
    (22, "<think>"),
    (23, "</think>"),
    (254, "[UNK]"),
    (255, "[PAD]"),
];

const CHAT_TEMPLATE: &str = "{%- if messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>{%- endif -%}{%- for message in messages -%}<|im_{{ message['role'] }}|>{{ message['role'] }}<|im_middle|>{{ message['content'] }}<|im_end|>{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}";

/// Write `tiktoken.model` and `tokenizer_config.json` into `dir`. Returns the vocabulary size
/// (256 ranks + 256 special slots).
pub fn write_byte_tokenizer(dir: &Path) -> Result<usize> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let ranks: String = (0u8..=255).map(|b| format!("{} {}\n", b64.encode([b]), b)).collect();
    write_atomic(&dir.join("tiktoken.model"), ranks.as_bytes())?;
    let mut added = Map::new();
    for &(offset, name) in KIMI_SPECIALS {
        added.insert((256 + offset).to_string(), json!({"content": name, "special": true}));
    }
    let config = json!({
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    });
    write_atomic(&dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&config).expect("json").as_bytes())?;
    Ok(512)
}
