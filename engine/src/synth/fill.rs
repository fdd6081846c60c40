//! Filling synthetic tensors and writing them as (optionally sharded) safetensors files.
//!
//! Tensor data is generated in fixed blocks of [`BLOCK`] elements, each from its own generator
//! keyed by (seed, tensor name, block number), several blocks at a time on all cores, so any
//! size writes at the speed of the disk's write path and the bytes never depend on the thread
//! count. Shards hold about equal bytes.

use std::io::Write;
use std::path::Path;

use rayon::prelude::*;
use serde_json::json;

use super::Rng;
use crate::error::{Error, Result};
use crate::weights::{Dtype, TensorSpec, write_atomic, write_safetensors};

/// Elements generated per independent block.
pub const BLOCK: usize = 1 << 20;

/// Write `tensors` into `shards` safetensors files in `dir` (with an index when more than one),
/// filling each tensor deterministically from `seed` and its name.
pub(crate) fn write_shards(dir: &Path, tensors: &[(TensorSpec, Fill)], shards: usize, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let shards = shards.max(1);
    let mut weight_map = serde_json::Map::new();
    for (s, part) in split_by_bytes(tensors, shards).into_iter().enumerate() {
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
        write_atomic(&dir.join("model.safetensors.index.json"), index.to_string().as_bytes())?;
    }
    Ok(())
}

/// Split the tensor list into at most `shards` consecutive, non-empty parts of about equal bytes.
pub(crate) fn split_by_bytes(tensors: &[(TensorSpec, Fill)], shards: usize) -> Vec<&[(TensorSpec, Fill)]> {
    let total: usize = tensors.iter().map(|(t, _)| t.nbytes()).sum();
    let mut parts = Vec::new();
    let (mut start, mut acc) = (0, 0usize);
    for (i, (t, _)) in tensors.iter().enumerate() {
        acc += t.nbytes();
        let left = tensors.len() - i - 1;
        let want = total * (parts.len() + 1) / shards;
        if parts.len() + 1 < shards && acc >= want && left > 0 {
            parts.push(&tensors[start..=i]);
            start = i + 1;
        }
    }
    parts.push(&tensors[start..]);
    parts
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
    /// F32 router selection bias: small balanced noise plus N(0, skew²) per expert.
    SkewedBias(f32),
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
    (TensorSpec::new(name, Dtype::BF16, &[rows, cols]), Fill::Dense(gain))
}

pub(crate) fn norm(name: &str, len: usize) -> (TensorSpec, Fill) {
    (TensorSpec::new(name, Dtype::BF16, &[len]), Fill::Norm)
}

/// Two uniforms in [0, 1) from one draw (24 bits each).
fn two_units(rng: &mut Rng) -> [f32; 2] {
    let u = rng.next_u64();
    let scale = 1.0 / (1u32 << 24) as f32;
    [(u >> 40) as f32 * scale, ((u >> 16) & 0xFF_FFFF) as f32 * scale]
}

impl Fill {
    fn elem_size(self) -> usize {
        match self {
            Fill::Dense(_) | Fill::Norm | Fill::Uniform(..) => 2,
            Fill::Bias | Fill::SkewedBias(_) | Fill::Scale(_) | Fill::F32Uniform(..) | Fill::F32LogUniform(..) => 4,
            Fill::Fp8 | Fill::Bytes | Fill::E8m0(_) => 1,
            Fill::Shape(..) => 8,
        }
    }

    pub(crate) fn write(self, spec: &TensorSpec, seed: u64, out: &mut dyn Write) -> std::io::Result<()> {
        if let Fill::Shape(r, c) = self {
            out.write_all(&(r as i64).to_le_bytes())?;
            return out.write_all(&(c as i64).to_le_bytes());
        }
        let count = spec.nbytes() / self.elem_size();
        let cols = *spec.shape.last().unwrap_or(&1);
        let base = Rng::keyed(seed, &spec.name).next_u64();
        let blocks: Vec<usize> = (0..count.div_ceil(BLOCK)).collect();
        for batch in blocks.chunks(8) {
            let bufs: Vec<Vec<u8>> =
                batch.par_iter().map(|&b| self.block(base, b, BLOCK.min(count - b * BLOCK), cols)).collect();
            for buf in bufs {
                out.write_all(&buf)?;
            }
        }
        Ok(())
    }

    /// Elements `block * BLOCK ..` (`n` of them) of a tensor.
    fn block(self, base: u64, block: usize, n: usize, cols: usize) -> Vec<u8> {
        let mut rng = Rng::new(base ^ (block as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mut buf = Vec::with_capacity(n * self.elem_size());
        let bf16 = |v: f32| half::bf16::from_f32(v).to_le_bytes();
        match self {
            Fill::Dense(g) => {
                let a = g * (3.0 / cols as f32).sqrt();
                while buf.len() < 2 * n {
                    for u in two_units(&mut rng) {
                        if buf.len() < 2 * n {
                            buf.extend_from_slice(&bf16((u * 2.0 - 1.0) * a));
                        }
                    }
                }
            }
            Fill::Norm => (0..n).for_each(|_| buf.extend_from_slice(&bf16(1.0 + rng.symmetric(0.1)))),
            Fill::Bias => (0..n).for_each(|_| buf.extend_from_slice(&rng.symmetric(0.05).to_le_bytes())),
            Fill::SkewedBias(skew) => (0..n).for_each(|_| {
                let [u1, u2] = two_units(&mut rng);
                let normal = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                buf.extend_from_slice(&(rng.symmetric(0.002) + skew * normal).to_le_bytes())
            }),
            Fill::Fp8 => (0..n).for_each(|_| {
                let bits = rng.next_u64();
                let exp = 4 + (bits % 6) as u8;
                buf.push(((bits >> 8) as u8 & 0x80) | (exp << 3) | ((bits >> 16) as u8 & 7));
            }),
            Fill::Scale(s) => (0..n).for_each(|_| buf.extend_from_slice(&(s * (0.5 + rng.unit())).to_le_bytes())),
            Fill::Bytes => {
                while buf.len() < n {
                    let take = (n - buf.len()).min(8);
                    buf.extend_from_slice(&rng.next_u64().to_le_bytes()[..take]);
                }
            }
            Fill::Uniform(lo, hi) => (0..n).for_each(|_| buf.extend_from_slice(&bf16(lo + (hi - lo) * rng.unit()))),
            Fill::F32Uniform(lo, hi) => (0..n).for_each(|_| buf.extend_from_slice(&(lo + (hi - lo) * rng.unit()).to_le_bytes())),
            Fill::F32LogUniform(lo, hi) => {
                (0..n).for_each(|_| buf.extend_from_slice(&(lo + (hi - lo) * rng.unit()).ln().to_le_bytes()))
            }
            Fill::E8m0(e) => (0..n).for_each(|_| buf.push(e - 1 + (rng.next_u64() % 3) as u8)),
            Fill::Shape(..) => unreachable!("written directly"),
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_by_bytes_and_blocks_are_thread_independent() {
        let t: Vec<(TensorSpec, Fill)> = (0..10).map(|i| dense(&format!("t{i}"), 4, 8 * (i + 1), 1.0)).collect();
        let parts = split_by_bytes(&t, 3);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), t.len());
        let spec = TensorSpec::new("w", Dtype::BF16, &[3, BLOCK]);
        let mut a = Vec::new();
        Fill::Dense(1.0).write(&spec, 1, &mut a).unwrap();
        assert_eq!(a.len(), spec.nbytes());
        let one = Fill::Dense(1.0).block(Rng::keyed(1, "w").next_u64(), 2, BLOCK, BLOCK);
        assert_eq!(&a[2 * 2 * BLOCK..], &one[..], "block 2 does not depend on blocks 0 and 1");
    }
}
