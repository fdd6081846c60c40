//! `quantization_config`: block FP8 (`quant_method: fp8`) and compressed-tensors
//! (`pack-quantized` INT4, `mxfp4-pack-quantized`). Which tensor is quantised is decided per
//! tensor from its stored dtype and companion tensors; this config supplies block and group sizes
//! and rejects schemes the kernels do not implement exactly.

use std::path::Path;

use serde_json::Value;

use super::Fields;
use crate::error::{Error, Result};

/// One entry of a compressed-tensors `ignore` list.
#[derive(Debug, Clone)]
pub enum IgnoreRule {
    /// A `re:` pattern, matched against the module name.
    Regex(regex::Regex),
    /// A plain module name (exact match).
    Exact(String),
}

impl IgnoreRule {
    /// Whether the module `name` is excluded from quantisation.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            IgnoreRule::Regex(r) => r.is_match(name),
            IgnoreRule::Exact(s) => s == name,
        }
    }
}

/// Quantisation schemes.
#[derive(Debug, Clone)]
pub enum Quantization {
    /// Plain BF16/F32 weights.
    None,
    /// DeepSeek block FP8 E4M3 with `weight_scale_inv` multipliers.
    Fp8Block { block_rows: usize, block_cols: usize },
    /// compressed-tensors symmetric group INT4 (`pack-quantized`).
    Int4PackQuantized {
        group_size: usize,
        ignore: Vec<IgnoreRule>,
    },
    /// compressed-tensors MXFP4 (`mxfp4-pack-quantized`).
    Mxfp4PackQuantized {
        group_size: usize,
        ignore: Vec<IgnoreRule>,
    },
    /// gpt-oss's `quant_method: mxfp4`: routed experts stored as `*_blocks` / `*_scales`
    /// (groups of 32, E8M0 scales); every other module plain.
    Mxfp4Experts,
}

impl Quantization {
    pub(crate) fn parse(value: &Value, path: &Path) -> Result<Quantization> {
        let map = value
            .as_object()
            .ok_or_else(|| Error::config(path, "quantization_config", "expected an object"))?;
        let f = Fields {
            map,
            path,
            scope: "quantization_config.",
        };
        match f.opt_str("quant_method")? {
            Some("fp8") => {
                if let Some(fmt) = f.opt_str("fmt")?
                    && !matches!(fmt, "e4m3" | "float8_e4m3fn")
                {
                    return Err(f.err("fmt", format!("unsupported FP8 format `{fmt}` (supported: e4m3)")));
                }
                let block = f
                    .get("weight_block_size")
                    .ok_or_else(|| f.err("weight_block_size", "missing"))?;
                let dims: Vec<usize> = block
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_u64().map(|n| n as usize)).collect())
                    .unwrap_or_default();
                match dims[..] {
                    [r, c] if r > 0 && c > 0 => Ok(Quantization::Fp8Block {
                        block_rows: r,
                        block_cols: c,
                    }),
                    _ => Err(f.err(
                        "weight_block_size",
                        format!("expected two positive integers, found {block}"),
                    )),
                }
            }
            Some("compressed-tensors") => Self::parse_compressed(f),
            Some("mxfp4") => Ok(Quantization::Mxfp4Experts),
            Some(other) => Err(f.err(
                "quant_method",
                format!("unsupported `{other}` (supported: fp8, compressed-tensors, mxfp4)"),
            )),
            None => Err(f.err("quant_method", "missing")),
        }
    }

    fn parse_compressed(f: Fields<'_>) -> Result<Quantization> {
        let format = f.opt_str("format")?.ok_or_else(|| f.err("format", "missing"))?;
        let groups = f
            .get("config_groups")
            .and_then(Value::as_object)
            .ok_or_else(|| f.err("config_groups", "missing"))?;
        if groups.len() != 1 {
            return Err(f.err(
                "config_groups",
                format!("expected exactly one group, found {}", groups.len()),
            ));
        }
        let (name, group) = groups.iter().next().expect("one group");
        let scope = format!("quantization_config.config_groups.{name}.weights.");
        let weights = group
            .get("weights")
            .and_then(Value::as_object)
            .ok_or_else(|| f.err("config_groups", "group has no `weights`"))?;
        let w = Fields {
            map: weights,
            path: f.path,
            scope: &scope,
        };
        for key in ["input_activations", "output_activations"] {
            if group.get(key).is_some_and(|v| !v.is_null()) {
                return Err(f.err(
                    "config_groups",
                    format!("{key} quantisation is not supported (weights only, exact)"),
                ));
            }
        }
        if f.get("kv_cache_scheme").is_some() {
            return Err(f.err(
                "kv_cache_scheme",
                "KV-cache quantisation is not supported (the cache is kept in f32)",
            ));
        }
        let num_bits = w.usize("num_bits")?;
        let kind = w.opt_str("type")?.unwrap_or("int");
        let strategy = w.opt_str("strategy")?.unwrap_or("group");
        let group_size = w.usize("group_size")?;
        if num_bits != 4 {
            return Err(w.err(
                "num_bits",
                format!("{num_bits}-bit weights are not supported (supported: 4)"),
            ));
        }
        if strategy != "group" {
            return Err(w.err(
                "strategy",
                format!("`{strategy}` is not supported (supported: group)"),
            ));
        }
        if w.opt_bool("symmetric")? == Some(false) {
            return Err(w.err(
                "symmetric",
                "asymmetric (zero-point) quantisation is not supported",
            ));
        }
        if w.opt_bool("dynamic")? == Some(true) {
            return Err(w.err("dynamic", "dynamic quantisation is not supported"));
        }
        if let Some(order) = w.opt_str("actorder")? {
            return Err(w.err(
                "actorder",
                format!("`{order}` activation ordering is not supported"),
            ));
        }
        if let Some(scale) = w.opt_str("scale_dtype")?
            && format == "mxfp4-pack-quantized"
            && scale != "torch.uint8"
        {
            return Err(w.err(
                "scale_dtype",
                format!("`{scale}` is not supported for MXFP4 (supported: torch.uint8, E8M0)"),
            ));
        }
        let ignore = parse_ignore(f)?;
        match (format, kind) {
            ("pack-quantized", "int") => Ok(Quantization::Int4PackQuantized { group_size, ignore }),
            ("mxfp4-pack-quantized", "float") => Ok(Quantization::Mxfp4PackQuantized { group_size, ignore }),
            _ => Err(f.err(
                "format",
                format!("unsupported `{format}` with weight type `{kind}`"),
            )),
        }
    }

    /// The ignore list (empty for non-compressed-tensors schemes).
    pub fn ignore(&self) -> &[IgnoreRule] {
        match self {
            Quantization::Int4PackQuantized { ignore, .. }
            | Quantization::Mxfp4PackQuantized { ignore, .. } => ignore,
            _ => &[],
        }
    }
}

fn parse_ignore(f: Fields<'_>) -> Result<Vec<IgnoreRule>> {
    let Some(list) = f.get("ignore") else {
        return Ok(Vec::new());
    };
    let items = list
        .as_array()
        .ok_or_else(|| f.err("ignore", "expected a list"))?;
    items
        .iter()
        .map(|item| {
            let s = item
                .as_str()
                .ok_or_else(|| f.err("ignore", format!("expected strings, found {item}")))?;
            match s.strip_prefix("re:") {
                Some(pattern) => regex::Regex::new(&format!("^(?:{pattern})$"))
                    .map(IgnoreRule::Regex)
                    .map_err(|e| f.err("ignore", format!("bad regex `{pattern}`: {e}"))),
                None => Ok(IgnoreRule::Exact(s.to_string())),
            }
        })
        .collect()
}
