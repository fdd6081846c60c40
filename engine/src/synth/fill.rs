//! Filling synthetic tensors and writing them as (optionally sharded) safetensors files.

use std::io::Write;
use std::path::Path;

use serde_json::json;

use super::Rng;
use crate::error::{Error, Result};
use crate::weights::{Dtype, TensorSpec, write_atomic, write_safetensors};

/// Write `tensors` into `shards` safetensors files in `dir` (with an index when more than one),
/// filling each tensor deterministically from `seed` and its name.
pub(crate) fn write_shards(
    dir: &Path,
    tensors: &[(TensorSpec, Fill)],
    shards: usize,
    seed: u64,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let shards = shards.max(1);
    let per = tensors.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (s, part) in tensors.chunks(per).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", s + 1, shards)
        };
        let specs: Vec<TensorSpec> = part.iter().map(|(t, _)| t.clone()).collect();
        for t in &specs {
            weight_map.insert(t.name.clone(), json!(file));
        }
        write_safetensors(&dir.join(&file), &specs, &[("format", "pt")], |i, out| {
            let (spec, fill) = &part[i];
            fill.write(spec, seed, out)
        })?;
    }
    if shards > 1 {
        let index = json!({"metadata": {}, "weight_map": weight_map});
        write_atomic(
            &dir.join("model.safetensors.index.json"),
            index.to_string().as_bytes(),
        )?;
    }
    Ok(())
}

/// How a tensor's bytes are generated.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fill {
    /// BF16 uniform with this gain over `sqrt(3 / cols)`.
    Dense(f32),
    /// BF16 values near 1.
    Norm,
    /// F32 small router bias.
    Bias,
    /// FP8 codes with moderate exponents (never NaN).
    Fp8,
    /// F32 scale multipliers around this value.
    Scale(f32),
    /// Random bytes (packed INT4 nibbles: every code is valid).
    Bytes,
    /// BF16 uniform in [lo, hi).
    Uniform(f32, f32),
    /// I64 logical shape.
    Shape(usize, usize),
    /// F32 uniform in [lo, hi).
    F32Uniform(f32, f32),
    /// F32 `ln(u)` for `u` uniform in [lo, hi) (KDA `A_log`).
    F32LogUniform(f32, f32),
    /// E8M0 scale bytes `e - 1 ..= e + 1`.
    E8m0(u8),
}

pub(crate) fn dense(name: &str, rows: usize, cols: usize, gain: f32) -> (TensorSpec, Fill) {
    (
        TensorSpec::new(name, Dtype::BF16, &[rows, cols]),
        Fill::Dense(gain),
    )
}

pub(crate) fn norm(name: &str, len: usize) -> (TensorSpec, Fill) {
    (TensorSpec::new(name, Dtype::BF16, &[len]), Fill::Norm)
}

impl Fill {
    pub(crate) fn write(self, spec: &TensorSpec, seed: u64, out: &mut dyn Write) -> std::io::Result<()> {
        let mut rng = Rng::keyed(seed, &spec.name);
        let n = spec.shape.iter().product::<usize>();
        let cols = *spec.shape.last().unwrap_or(&1);
        let mut buf = Vec::with_capacity(spec.nbytes().min(1 << 20));
        let mut flush = |buf: &mut Vec<u8>, force: bool| -> std::io::Result<()> {
            if force || buf.len() >= 1 << 20 {
                out.write_all(buf)?;
                buf.clear();
            }
            Ok(())
        };
        let bf16 = |v: f32| half::bf16::from_f32(v).to_le_bytes();
        match self {
            Fill::Shape(r, c) => {
                buf.extend_from_slice(&(r as i64).to_le_bytes());
                buf.extend_from_slice(&(c as i64).to_le_bytes());
            }
            _ => {
                let count = if matches!(self, Fill::Bytes) {
                    spec.nbytes()
                } else {
                    n
                };
                for _ in 0..count {
                    match self {
                        Fill::Dense(g) => {
                            buf.extend_from_slice(&bf16(rng.symmetric(g * (3.0 / cols as f32).sqrt())))
                        }
                        Fill::Norm => buf.extend_from_slice(&bf16(1.0 + rng.symmetric(0.1))),
                        Fill::Bias => buf.extend_from_slice(&rng.symmetric(0.05).to_le_bytes()),
                        Fill::Fp8 => {
                            let bits = rng.next_u64();
                            let exp = 4 + (bits % 6) as u8;
                            buf.push(((bits >> 8) as u8 & 0x80) | (exp << 3) | ((bits >> 16) as u8 & 7));
                        }
                        Fill::Scale(s) => buf.extend_from_slice(&(s * (0.5 + rng.unit())).to_le_bytes()),
                        Fill::Bytes => buf.push(rng.next_u64() as u8),
                        Fill::Uniform(lo, hi) => buf.extend_from_slice(&bf16(lo + (hi - lo) * rng.unit())),
                        Fill::F32Uniform(lo, hi) => {
                            buf.extend_from_slice(&(lo + (hi - lo) * rng.unit()).to_le_bytes())
                        }
                        Fill::F32LogUniform(lo, hi) => {
                            buf.extend_from_slice(&(lo + (hi - lo) * rng.unit()).ln().to_le_bytes())
                        }
                        Fill::E8m0(e) => buf.push(e - 1 + (rng.next_u64() % 3) as u8),
                        Fill::Shape(..) => unreachable!(),
                    }
                    flush(&mut buf, false)?;
                }
            }
        }
        flush(&mut buf, true)
    }
}
