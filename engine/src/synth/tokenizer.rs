//! A byte-level tokenizer in Kimi's `tiktoken.model` format: 256 single-byte ranks and the
//! Kimi special tokens at their offsets after the ranks, with a chat template. Two flavours:
//! K2 (the `<|im_*|>` specials and template) and K3 (the XTML structural specials of
//! `kimi-k3.md` §6: `[BOS]` +0, `[EOS]` +1, `<|end_of_msg|>` +2 = EOS, `<|open|>` +3,
//! `<|close|>` +4, `<|sep|>` +5, `[UNK]` +254, `[PAD]` +255, and the XTML message format).

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
    (11, "<|tool_calls_section_begin|>"),
    (12, "<|tool_calls_section_end|>"),
    (13, "<|tool_call_begin|>"),
    (14, "<|tool_call_argument_begin|>"),
    (15, "<|tool_call_end|>"),
    (17, "<|im_middle|>"),
    (22, "<think>"),
    (23, "</think>"),
    (254, "[UNK]"),
    (255, "[PAD]"),
];

/// K2's chat format in a small template of our own: a `tool_declare` turn with the tools as
/// compact JSON, assistant tool calls as `<|tool_calls_section_begin|>` sections with their ids
/// verbatim, tool results as `## Return of {id}` system turns.
const CHAT_TEMPLATE: &str = concat!(
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>{%- endif -%}",
    "{%- if messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>{%- endif -%}",
    "{%- for message in messages -%}",
    "{%- if message['role'] == 'tool' -%}",
    "<|im_system|>tool<|im_middle|>## Return of {{ message['tool_call_id'] }}\n{{ message['content'] }}<|im_end|>",
    "{%- else -%}",
    "<|im_{{ message['role'] }}|>{{ message['role'] }}<|im_middle|>{{ message['content'] }}",
    "{%- if message['tool_calls'] -%}<|tool_calls_section_begin|>",
    "{%- for tc in message['tool_calls'] -%}<|tool_call_begin|>{{ tc['id'] }}<|tool_call_argument_begin|>",
    "{{ tc['function']['arguments'] }}<|tool_call_end|>{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}",
    "<|im_end|>",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
);

/// K3 special tokens as offsets from the number of ranks (`163584 + offset` in the real
/// tokenizer). `<|end_of_msg|>` is the generation EOS.
pub const K3_SPECIALS: &[(usize, &str)] = &[
    (0, "[BOS]"),
    (1, "[EOS]"),
    (2, "<|end_of_msg|>"),
    (3, "<|open|>"),
    (4, "<|close|>"),
    (5, "<|sep|>"),
    (254, "[UNK]"),
    (255, "[PAD]"),
];

/// K3's XTML chat format: a message is `<|open|>message role="…"<|sep|>…<|close|>message<|sep|>
/// <|end_of_msg|>`; assistant turns wrap reasoning and answer in `think` / `response`
/// elements; the generation prompt opens an assistant message and its `think` element.
const K3_CHAT_TEMPLATE: &str = concat!(
    "{%- for message in messages -%}",
    "<|open|>message role=\"{{ message['role'] }}\"<|sep|>",
    "{%- if message['role'] == 'assistant' -%}",
    "<|open|>think<|sep|>{{ message['reasoning_content'] if message['reasoning_content'] is defined else '' }}",
    "<|close|>think<|sep|><|open|>response<|sep|>{{ message['content'] }}<|close|>response<|sep|>",
    "{%- else -%}{{ message['content'] }}{%- endif -%}",
    "<|close|>message<|sep|><|end_of_msg|>",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>{%- endif -%}",
);

/// Which special tokens and chat format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerFlavor {
    /// Kimi K2 (`<|im_*|>` chat format).
    K2,
    /// Kimi K3 (XTML chat format).
    K3,
}

/// Write `tiktoken.model` and `tokenizer_config.json` (K2 flavour) into `dir`. Returns the
/// vocabulary size (256 ranks + 256 special slots).
pub fn write_byte_tokenizer(dir: &Path) -> Result<usize> {
    write_byte_tokenizer_flavor(dir, TokenizerFlavor::K2)
}

/// Write a byte-level tokenizer of the given flavour into `dir`; returns the vocabulary size.
pub fn write_byte_tokenizer_flavor(dir: &Path, flavor: TokenizerFlavor) -> Result<usize> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let ranks: String = (0u8..=255)
        .map(|b| format!("{} {}\n", b64.encode([b]), b))
        .collect();
    write_atomic(&dir.join("tiktoken.model"), ranks.as_bytes())?;
    let (specials, template, eos) = match flavor {
        TokenizerFlavor::K2 => (KIMI_SPECIALS, CHAT_TEMPLATE, "[EOS]"),
        TokenizerFlavor::K3 => (K3_SPECIALS, K3_CHAT_TEMPLATE, "<|end_of_msg|>"),
    };
    let mut added = Map::new();
    for &(offset, name) in specials {
        added.insert(
            (256 + offset).to_string(),
            json!({"content": name, "special": true}),
        );
    }
    let config = json!({
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": eos,
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "added_tokens_decoder": added,
        "chat_template": template,
    });
    write_atomic(
        &dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config).expect("json").as_bytes(),
    )?;
    Ok(512)
}
