//! `tokenizer.json` byte-level BPE tokenizers (DeepSeek-V3, Qwen3) through the `tokenizers` crate.
//!
//! Two instances of the same file: one extracts every added token (transformers' default), the
//! other sets `encode_special_tokens` so that added tokens flagged `special` are encoded as text
//! (transformers' `split_special_tokens=True`). Decoding is done here from a per-id byte table
//! built with the ByteLevel decoder's rule, so `decode_bytes` is exact.

use std::collections::HashSet;
use std::path::Path;

use tokenizers::{DecoderWrapper, Model, Normalizer, OffsetType, PreTokenizedString, PreTokenizer};

use super::bytes::ByteMap;
use crate::error::{Error, Result};

/// A loaded tokenizer.json.
pub(crate) struct HfBackend {
    with_added: tokenizers::Tokenizer,
    split_special: tokenizers::Tokenizer,
    token_bytes: Vec<u8>,
    /// Id `i` spans `offsets[i]..offsets[i + 1]` of `token_bytes`.
    offsets: Vec<u32>,
    /// Whether id `i` has a token (tokenizer.json may leave holes).
    present: Vec<bool>,
    special_ids: HashSet<u32>,
    /// All added tokens `(content, id, special)`.
    added: Vec<(String, u32, bool)>,
}

impl std::fmt::Debug for HfBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfBackend")
            .field("vocab_size", &self.vocab_size())
            .field("added_tokens", &self.added.len())
            .field("special_tokens", &self.special_ids.len())
            .finish()
    }
}

impl HfBackend {
    /// Load and validate `path`.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let mut with_added = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| bad(format!("cannot load tokenizer.json: {e}")))?;
        match with_added.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {}
            other => {
                let name = other.map_or_else(|| "none".to_owned(), |d| format!("{d:?}"));
                return Err(bad(format!(
                    "unsupported decoder {name}; only byte-level BPE (ByteLevel decoder) is supported"
                )));
            }
        }
        with_added.with_truncation(None).map_err(|e| bad(e.to_string()))?;
        with_added.with_padding(None);
        let map = ByteMap::get();
        if let Some(b) = (0..=255u8).find(|&b| {
            with_added
                .get_model()
                .token_to_id(&map.char_of(b).to_string())
                .is_none()
        }) {
            return Err(bad(format!(
                "the byte-level token for byte 0x{b:02x} is missing from the vocabulary"
            )));
        }
        let mut split_special = with_added.clone();
        split_special.set_encode_special_tokens(true);
        let mut added: Vec<(String, u32, bool)> = with_added
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (t.content, id, t.special))
            .collect();
        added.sort_by_key(|a| a.1);
        let special_ids: HashSet<u32> = added.iter().filter(|a| a.2).map(|a| a.1).collect();
        let vocab_size = with_added
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let (token_bytes, offsets, present) = byte_table(&with_added, vocab_size).map_err(bad)?;
        Ok(HfBackend {
            with_added,
            split_special,
            token_bytes,
            offsets,
            present,
            special_ids,
            added,
        })
    }

    /// One past the largest id.
    pub(crate) fn vocab_size(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub(crate) fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// All added tokens `(content, id, special)`, by id.
    pub(crate) fn added_tokens(&self) -> &[(String, u32, bool)] {
        &self.added
    }

    pub(crate) fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = usize::try_from(id).ok()?;
        if !*self.present.get(i)? {
            return None;
        }
        let (a, b) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.token_bytes.get(a as usize..b as usize)
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<String> {
        self.with_added.id_to_token(id)
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.with_added.token_to_id(token)
    }

    /// `split_special_tokens=True`: special added tokens are text, other added tokens are not.
    pub(crate) fn encode_plain(&self, text: &str) -> Result<Vec<u32>, String> {
        encode_ids(&self.split_special, text)
    }

    /// Every added token recognised.
    pub(crate) fn encode_special(&self, text: &str) -> Result<Vec<u32>, String> {
        encode_ids(&self.with_added, text)
    }

    /// transformers' `tokenizer(text)["input_ids"]`: every added token recognised, then the
    /// tokenizer.json post-processor (`add_special_tokens=True`; e.g. DeepSeek-V3's BOS template).
    /// transformers 5 drops tokenizer_config.json's `add_bos_token`/`add_eos_token` when a
    /// tokenizer.json exists, so the post-processor alone decides (none: nothing is added).
    pub(crate) fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        let encoding = self
            .with_added
            .encode_fast(text, true)
            .map_err(|e| e.to_string())?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Normalizer, pre-tokenizer and model only: no added token at all (transformers'
    /// `_encode_without_added_tokens`).
    pub(crate) fn encode_no_added(&self, text: &str) -> Result<Vec<u32>, String> {
        let tk = &self.with_added;
        let mut normalized = tokenizers::NormalizedString::from(text);
        if let Some(n) = tk.get_normalizer() {
            n.normalize(&mut normalized).map_err(|e| e.to_string())?;
        }
        let mut pre = PreTokenizedString::from(normalized);
        if let Some(p) = tk.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(|e| e.to_string())?;
        }
        pre.tokenize(|n| tk.get_model().tokenize(n.get()))
            .map_err(|e| e.to_string())?;
        let encoding = pre
            .into_encoding(None, 0, OffsetType::None)
            .map_err(|e| e.to_string())?;
        Ok(encoding.get_ids().to_vec())
    }
}

fn encode_ids(tk: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    let encoding = tk.encode_fast(text, false).map_err(|e| e.to_string())?;
    Ok(encoding.get_ids().to_vec())
}

/// Bytes of every id under the ByteLevel decoder: a token whose characters all belong to the
/// byte alphabet decodes to those bytes, any other token to its own UTF-8.
type ByteTable = (Vec<u8>, Vec<u32>, Vec<bool>);

fn byte_table(tk: &tokenizers::Tokenizer, vocab_size: usize) -> Result<ByteTable, String> {
    let map = ByteMap::get();
    let too_large = || "vocabulary too large".to_owned();
    let mut bytes = Vec::new();
    let mut offsets = Vec::with_capacity(vocab_size + 1);
    let mut present = Vec::with_capacity(vocab_size);
    for id in 0..vocab_size {
        offsets.push(u32::try_from(bytes.len()).map_err(|_| too_large())?);
        let token = tk.id_to_token(u32::try_from(id).map_err(|_| too_large())?);
        present.push(token.is_some());
        if let Some(token) = token {
            match map.decode(&token) {
                Some(raw) => bytes.extend_from_slice(&raw),
                None => bytes.extend_from_slice(token.as_bytes()),
            }
        }
    }
    offsets.push(u32::try_from(bytes.len()).map_err(|_| too_large())?);
    Ok((bytes, offsets, present))
}
