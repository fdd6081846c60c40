//! Just enough safetensors to plan a stream-mode install (pure): the header's tensor byte ranges,
//! which tensors are *routed experts* (`...layers.{L}...experts.{E}....`), and the coalesced byte
//! range(s) of each expert. Stacked expert tensors (`experts.gate_up_proj` holding every expert of
//! a layer) have no per-expert name and are treated as resident. The engine's own index
//! (`deltafin_engine::weights::WeightIndex`) stays the authority for loading; this module only
//! decides which bytes to fetch first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Largest header accepted (the format's own limit).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// One tensor's absolute byte range in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRange {
    pub name: String,
    pub start: u64,
    pub end: u64,
}

/// The key of a routed expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpertKey {
    pub layer: u32,
    pub expert: u32,
}

/// A contiguous byte range of one file holding (part of) one expert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertRange {
    pub layer: u32,
    pub expert: u32,
    pub file: String,
    pub start: u64,
    pub end: u64,
}

/// The header length from a file's first 8 bytes, checked against the file size.
pub fn header_len(first8: &[u8; 8], file_size: u64) -> Result<u64, String> {
    let n = u64::from_le_bytes(*first8);
    if n > MAX_HEADER_BYTES || n.checked_add(8).is_none_or(|e| e > file_size) {
        return Err(format!("header length {n} does not fit a {file_size}-byte file"));
    }
    Ok(n)
}

#[derive(Deserialize)]
struct RawEntry {
    data_offsets: [u64; 2],
}

/// Tensor ranges (absolute file offsets) from the JSON header of a `file_size`-byte file, sorted
/// by start offset.
pub fn parse_header(json: &[u8], file_size: u64) -> Result<Vec<TensorRange>, String> {
    let data_start = 8 + json.len() as u64;
    let raw: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let mut out = Vec::new();
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let e: RawEntry = serde_json::from_value(value).map_err(|e| format!("tensor `{name}`: {e}"))?;
        let [a, b] = e.data_offsets;
        let (start, end) = (data_start + a, data_start + b);
        if a > b || end > file_size {
            return Err(format!(
                "tensor `{name}`: data_offsets {a}..{b} outside the {file_size}-byte file"
            ));
        }
        out.push(TensorRange { name, start, end });
    }
    out.sort_by_key(|t| (t.start, t.end));
    Ok(out)
}

/// `(layer, expert)` when `name` is a per-expert tensor: it contains `.layers.{L}.` and a later
/// `.experts.{E}.` (DeepSeek-V3/Kimi-K2 `mlp.experts.{E}.`, Kimi K3 `block_sparse_moe.experts.{E}.`).
pub fn expert_key(name: &str) -> Option<ExpertKey> {
    let after_layers = name.find("layers.")? + "layers.".len();
    let rest = &name[after_layers..];
    let (layer, rest) = leading_number(rest)?;
    let pos = rest.find(".experts.")? + ".experts.".len();
    let (expert, tail) = leading_number(&rest[pos..])?;
    tail.starts_with('.').then_some(ExpertKey { layer, expert })
}

fn leading_number(s: &str) -> Option<(u32, &str)> {
    let n = s.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 {
        return None;
    }
    Some((s[..n].parse().ok()?, &s[n..]))
}

/// The routed experts of one file as coalesced byte ranges: consecutive tensors of the same expert
/// that touch each other become one range.
pub fn expert_ranges(file: &str, tensors: &[TensorRange]) -> Vec<ExpertRange> {
    let mut out: Vec<ExpertRange> = Vec::new();
    for t in tensors {
        let Some(key) = expert_key(&t.name) else { continue };
        if t.start == t.end {
            continue;
        }
        if let Some(last) = out.last_mut()
            && last.layer == key.layer
            && last.expert == key.expert
            && last.end == t.start
        {
            last.end = t.end;
            continue;
        }
        out.push(ExpertRange {
            layer: key.layer,
            expert: key.expert,
            file: file.to_string(),
            start: t.start,
            end: t.end,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        let k = |l, e| Some(ExpertKey { layer: l, expert: e });
        assert_eq!(
            expert_key("model.layers.3.mlp.experts.17.gate_proj.weight"),
            k(3, 17)
        );
        assert_eq!(
            expert_key("language_model.model.layers.12.block_sparse_moe.experts.895.w1.weight_packed"),
            k(12, 895)
        );
        assert_eq!(
            expert_key("model.layers.3.mlp.shared_experts.gate_proj.weight"),
            None
        );
        assert_eq!(expert_key("model.layers.3.mlp.experts.gate_up_proj"), None);
        assert_eq!(expert_key("model.layers.3.mlp.gate.weight"), None);
        assert_eq!(expert_key("model.embed_tokens.weight"), None);
        assert_eq!(expert_key("model.layers.3.mlp.experts.4"), None);
    }

    #[test]
    fn header_parse_and_bounds() {
        let json = br#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        let size = 8 + json.len() as u64 + 8;
        let t = parse_header(json, size).unwrap();
        assert_eq!(t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(t[0].start, 8 + json.len() as u64);
        assert!(parse_header(json, size - 1).is_err());
        assert!(parse_header(b"nope", 100).is_err());
        assert!(header_len(&10u64.to_le_bytes(), 17).is_err());
        assert_eq!(header_len(&10u64.to_le_bytes(), 18), Ok(10));
        assert!(header_len(&u64::MAX.to_le_bytes(), 18).is_err());
    }

    #[test]
    fn experts_coalesce_when_contiguous() {
        let t = |name: &str, s, e| TensorRange {
            name: name.into(),
            start: s,
            end: e,
        };
        let tensors = vec![
            t("model.layers.1.mlp.experts.0.down_proj.weight", 0, 10),
            t("model.layers.1.mlp.experts.0.gate_proj.weight", 10, 20),
            t("model.layers.1.mlp.experts.1.down_proj.weight", 20, 30),
            t("model.layers.1.mlp.gate.weight", 30, 40),
            t("model.layers.1.mlp.experts.1.up_proj.weight", 40, 50),
        ];
        let r = expert_ranges("f", &tensors);
        let spans: Vec<_> = r.iter().map(|r| (r.layer, r.expert, r.start, r.end)).collect();
        assert_eq!(spans, vec![(1, 0, 0, 20), (1, 1, 20, 30), (1, 1, 40, 50)]);
    }
}
