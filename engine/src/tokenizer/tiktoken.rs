//! Kimi's tokenizer: a tiktoken rank file (`tiktoken.model`) plus 256 special tokens numbered from
//! the number of ranks, encoded the way `tokenization_kimi.py` drives tiktoken.
//!
//! Modes (see reference/model-formats.md §5.1):
//! * [`TiktokenBpe::encode_plain`]: `encode(text, allow_special_tokens=False)` — cuts, then
//!   ordinary BPE; special-token names are plain text.
//! * [`TiktokenBpe::encode_special`]: transformers' `tokenizer(text)` — split at the *named*
//!   specials of tokenizer_config.json, then each gap with the cuts and every special recognised.

use std::path::Path;

use base64::Engine as _;

use super::bpe::{self, RankMap};
use super::bytes::ByteMap;
use super::config::TokenizerConfig;
use super::pretok::{KimiSplitter, for_each_cut};
use super::specials::LiteralSet;
use crate::error::{Error, Result};

/// Number of special ids after the base ranks (the vocabulary is `num_base + 256`).
pub(crate) const NUM_SPECIAL: u32 = 256;

/// The tiktoken-rank BPE tokenizer.
#[derive(Debug)]
pub(crate) struct TiktokenBpe {
    ranks: RankMap,
    /// Token bytes of every id (base ranks, then specials' UTF-8 names), concatenated.
    token_bytes: Vec<u8>,
    /// `token_bytes` offsets: id `i` spans `offsets[i]..offsets[i + 1]`.
    offsets: Vec<u32>,
    num_base: u32,
    /// All 256 special names.
    specials: LiteralSet,
    /// The specials named in tokenizer_config.json (transformers' added tokens).
    named: LiteralSet,
    splitter: KimiSplitter,
}

impl TiktokenBpe {
    /// Load `tiktoken.model`; specials are named from `config` (`added_tokens_decoder`).
    pub(crate) fn load(path: &Path, config: Option<&TokenizerConfig>) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let bad = |reason: String| Error::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        let by_rank = parse_ranks(&text).map_err(bad)?;
        let num_base = u32::try_from(by_rank.len()).map_err(|_| bad("too many ranks".into()))?;
        let mut ranks = RankMap::default();
        ranks.reserve(by_rank.len());
        let mut token_bytes = Vec::new();
        let mut offsets = vec![0u32];
        for (rank, bytes) in by_rank.iter().enumerate() {
            if ranks.insert(bytes.clone(), rank as u32).is_some() {
                return Err(bad(format!(
                    "token {bytes:?} appears twice (second time with rank {rank})"
                )));
            }
            token_bytes.extend_from_slice(bytes);
            offsets.push(u32::try_from(token_bytes.len()).map_err(|_| bad("file too large".into()))?);
        }
        if let Some(b) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
            return Err(bad(format!(
                "the single byte 0x{b:02x} has no rank (all 256 bytes are required)"
            )));
        }
        let names = special_names(num_base, config);
        let mut seen = std::collections::HashSet::new();
        for (name, id) in &names {
            if !seen.insert(name.as_str()) {
                return Err(bad(format!(
                    "special token name `{name}` is used twice (id {id})"
                )));
            }
        }
        for (name, _) in &names {
            token_bytes.extend_from_slice(name.as_bytes());
            offsets.push(u32::try_from(token_bytes.len()).map_err(|_| bad("file too large".into()))?);
        }
        let specials = LiteralSet::new(names.iter().map(|(n, id)| (n.as_str(), *id))).map_err(bad)?;
        let named_ids: std::collections::HashSet<u32> = config
            .map(|c| c.added_tokens.iter().map(|t| t.id).collect())
            .unwrap_or_default();
        let named = LiteralSet::new(
            names
                .iter()
                .filter(|(_, id)| named_ids.contains(id))
                .map(|(n, id)| (n.as_str(), *id)),
        )
        .map_err(bad)?;
        let splitter = KimiSplitter::new().map_err(bad)?;
        Ok(TiktokenBpe {
            ranks,
            token_bytes,
            offsets,
            num_base,
            specials,
            named,
            splitter,
        })
    }

    /// One past the largest id.
    pub(crate) fn vocab_size(&self) -> usize {
        (self.num_base + NUM_SPECIAL) as usize
    }

    /// Whether `id` is one of the 256 specials.
    pub(crate) fn is_special(&self, id: u32) -> bool {
        (self.num_base..self.num_base + NUM_SPECIAL).contains(&id)
    }

    /// The special-token set (all 256 names).
    pub(crate) fn specials(&self) -> &LiteralSet {
        &self.specials
    }

    /// Raw bytes of `id` (a special's bytes are its name).
    pub(crate) fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = usize::try_from(id).ok()?;
        let (a, b) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.token_bytes.get(a as usize..b as usize)
    }

    /// The vocabulary string of `id`: GPT-2 byte alphabet for ranks, the name for specials.
    pub(crate) fn id_to_token(&self, id: u32) -> Option<String> {
        let bytes = self.token_bytes(id)?;
        if self.is_special(id) {
            return String::from_utf8(bytes.to_vec()).ok();
        }
        Some(ByteMap::get().encode(bytes))
    }

    /// Inverse of [`Self::id_to_token`].
    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        if let Some(id) = self.specials.get(token) {
            return Some(id);
        }
        let bytes = ByteMap::get().decode(token)?;
        self.ranks.get(&bytes).copied()
    }

    /// Plain text: special names are text.
    pub(crate) fn encode_plain(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        for_each_cut(text, |a, b| self.encode_ordinary(&text[a..b], &mut out));
        out
    }

    /// Trusted text: specials recognised (transformers' path for the Kimi tokenizer).
    pub(crate) fn encode_special(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut pos = 0;
        for found in self.named.find_iter(text) {
            self.encode_direct(&text[pos..found.start], &mut out);
            out.push(found.id);
            pos = found.end;
        }
        self.encode_direct(&text[pos..], &mut out);
        out
    }

    /// Kimi's `encode(text)` with `allowed_special="all"`: cuts, then specials within each cut.
    fn encode_direct(&self, text: &str, out: &mut Vec<u32>) {
        for_each_cut(text, |a, b| {
            let sub = &text[a..b];
            let mut pos = 0;
            for found in self.specials.find_iter(sub) {
                self.encode_ordinary(&sub[pos..found.start], out);
                out.push(found.id);
                pos = found.end;
            }
            self.encode_ordinary(&sub[pos..], out);
        });
    }

    /// tiktoken's `encode_ordinary` on one cut: pre-tokenize, then BPE each piece.
    fn encode_ordinary(&self, text: &str, out: &mut Vec<u32>) {
        self.splitter.split(text, |piece| {
            bpe::encode_piece(&self.ranks, piece.as_bytes(), out)
        });
    }
}

/// Parse `base64 rank` lines; returns the tokens indexed by rank (ranks must be 0..n, each once).
fn parse_ranks(text: &str) -> std::result::Result<Vec<Vec<u8>>, String> {
    // Dense ranks: each is below the number of entries, which bounds the table's size.
    let entries = text.lines().filter(|l| !l.trim().is_empty()).count();
    let mut by_rank: Vec<Option<Vec<u8>>> = vec![None; entries];
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(b64), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!("line {}: expected `<base64 token> <rank>`", lineno + 1));
        };
        let token = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("line {}: invalid base64 `{b64}`: {e}", lineno + 1))?;
        if token.is_empty() {
            return Err(format!("line {}: empty token", lineno + 1));
        }
        let rank: usize = rank
            .parse()
            .map_err(|_| format!("line {}: invalid rank `{rank}`", lineno + 1))?;
        let Some(slot) = by_rank.get_mut(rank) else {
            return Err(format!(
                "line {}: rank {rank} is out of range (ranks must be 0..{entries})",
                lineno + 1
            ));
        };
        if slot.replace(token).is_some() {
            return Err(format!("line {}: rank {rank} appears twice", lineno + 1));
        }
    }
    if by_rank.is_empty() {
        return Err("no ranks (empty file)".into());
    }
    by_rank
        .into_iter()
        .enumerate()
        .map(|(rank, t)| t.ok_or_else(|| format!("rank {rank} is missing (ranks must be 0..n without gaps)")))
        .collect()
}

/// Names of ids `num_base .. num_base + 256`: from `added_tokens_decoder`, else
/// `<|reserved_token_{id}|>`.
fn special_names(num_base: u32, config: Option<&TokenizerConfig>) -> Vec<(String, u32)> {
    (num_base..num_base + NUM_SPECIAL)
        .map(|id| {
            let named = config.and_then(|c| c.added_tokens.iter().find(|t| t.id == id));
            (
                named.map_or_else(|| format!("<|reserved_token_{id}|>"), |t| t.content.clone()),
                id,
            )
        })
        .collect()
}
