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
pub(crate) fn write_shards(
    dir: &Path,
    tensors: &[(TensorSpec, Fill)],
    shards: usize,
    seed: u64,
) -> Result<()> {
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
        write_atomic(
            &dir.join("model.safetensors.index.json"),
            index.to_string().as_bytes(),
        )?;
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
    /// I32 ids below this bound (a hash-routing table).
    Ids(u32),
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

/// Two uniforms in [0, 1) from one draw (24 bits each).
fn two_units(rng: &mut Rng) -> [f32; 2] {
    units(rng.next_u64())
}

/// Two uniforms in [0, 1) from the draw `u` (24 bits each).
fn units(u: u64) -> [f32; 2] {
    let scale = 1.0 / (1u32 << 24) as f32;
    [(u >> 40) as f32 * scale, ((u >> 16) & 0xFF_FFFF) as f32 * scale]
}

impl Fill {
    fn elem_size(self) -> usize {
        match self {
            Fill::Dense(_) | Fill::Norm | Fill::Uniform(..) => 2,
            Fill::Bias
            | Fill::SkewedBias(_)
            | Fill::Scale(_)
            | Fill::F32Uniform(..)
            | Fill::F32LogUniform(..)
            | Fill::Ids(_) => 4,
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
            let bufs: Vec<Vec<u8>> = batch
                .par_iter()
                .map(|&b| self.block(base, b, BLOCK.min(count - b * BLOCK), cols))
                .collect();
            for buf in bufs {
                out.write_all(&buf)?;
            }
        }
        Ok(())
    }

    /// Elements `block * BLOCK ..` (`n` of them) of a tensor. The bulk formats (BF16 weights,
    /// packed nibbles, FP8 codes, E8M0 scales) compute every draw from its index
    /// ([`Rng::nth_of`]); the result is the sequential stream's, byte for byte.
    fn block(self, base: u64, block: usize, n: usize, cols: usize) -> Vec<u8> {
        let state = base ^ (block as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        match self {
            Fill::Dense(g) => dense_block(state, n, g * (3.0 / cols as f32).sqrt()),
            Fill::Bytes => {
                let mut buf = vec![0u8; n];
                for (k, out) in buf.chunks_mut(8).enumerate() {
                    out.copy_from_slice(&Rng::nth_of(state, k as u64).to_le_bytes()[..out.len()]);
                }
                buf
            }
            Fill::Fp8 => (0..n as u64).map(|k| fp8_code(Rng::nth_of(state, k))).collect(),
            Fill::E8m0(e) => (0..n as u64)
                .map(|k| e - 1 + (Rng::nth_of(state, k) % 3) as u8)
                .collect(),
            _ => self.small_block(state, n),
        }
    }

    /// The other (small) fills, drawn sequentially.
    fn small_block(self, state: u64, n: usize) -> Vec<u8> {
        let mut rng = Rng::new(state);
        let mut buf = Vec::with_capacity(n * self.elem_size());
        let bf16 = |v: f32| half::bf16::from_f32(v).to_le_bytes();
        match self {
            Fill::Norm => (0..n).for_each(|_| buf.extend_from_slice(&bf16(1.0 + rng.symmetric(0.1)))),
            Fill::Bias => (0..n).for_each(|_| buf.extend_from_slice(&rng.symmetric(0.05).to_le_bytes())),
            Fill::SkewedBias(skew) => (0..n).for_each(|_| {
                let [u1, u2] = two_units(&mut rng);
                let normal = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                buf.extend_from_slice(&(rng.symmetric(0.002) + skew * normal).to_le_bytes())
            }),
            Fill::Scale(s) => {
                (0..n).for_each(|_| buf.extend_from_slice(&(s * (0.5 + rng.unit())).to_le_bytes()))
            }
            Fill::Uniform(lo, hi) => {
                (0..n).for_each(|_| buf.extend_from_slice(&bf16(lo + (hi - lo) * rng.unit())))
            }
            Fill::F32Uniform(lo, hi) => {
                (0..n).for_each(|_| buf.extend_from_slice(&(lo + (hi - lo) * rng.unit()).to_le_bytes()))
            }
            Fill::F32LogUniform(lo, hi) => {
                (0..n).for_each(|_| buf.extend_from_slice(&(lo + (hi - lo) * rng.unit()).ln().to_le_bytes()))
            }
            Fill::Ids(bound) => (0..n).for_each(|_| {
                buf.extend_from_slice(&((rng.next_u64() % bound.max(1) as u64) as i32).to_le_bytes())
            }),
            Fill::Shape(..) => unreachable!("written directly"),
            Fill::Dense(_) | Fill::Bytes | Fill::Fp8 | Fill::E8m0(_) => unreachable!("bulk fills"),
        }
        buf
    }
}

/// `n` BF16 values `(2u - 1) · a`, two per draw (high 24 bits first).
fn dense_block(state: u64, n: usize, a: f32) -> Vec<u8> {
    let bf16 = |u: f32| half::bf16::from_f32((u * 2.0 - 1.0) * a).to_le_bytes();
    let mut buf = vec![0u8; 2 * n];
    let mut pairs = buf.chunks_exact_mut(4);
    for (k, out) in (&mut pairs).enumerate() {
        let [hi, lo] = units(Rng::nth_of(state, k as u64));
        out[..2].copy_from_slice(&bf16(hi));
        out[2..].copy_from_slice(&bf16(lo));
    }
    let last = pairs.into_remainder();
    if !last.is_empty() {
        let [hi, _] = units(Rng::nth_of(state, (n / 2) as u64));
        last.copy_from_slice(&bf16(hi));
    }
    buf
}

/// An FP8 E4M3 code with a moderate exponent (never NaN) from a draw.
fn fp8_code(bits: u64) -> u8 {
    let exp = 4 + (bits % 6) as u8;
    ((bits >> 8) as u8 & 0x80) | (exp << 3) | ((bits >> 16) as u8 & 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_by_bytes_and_blocks_are_thread_independent() {
        let t: Vec<(TensorSpec, Fill)> = (0..10)
            .map(|i| dense(&format!("t{i}"), 4, 8 * (i + 1), 1.0))
            .collect();
        let parts = split_by_bytes(&t, 3);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), t.len());
        let spec = TensorSpec::new("w", Dtype::BF16, &[3, BLOCK]);
        let mut a = Vec::new();
        Fill::Dense(1.0).write(&spec, 1, &mut a).unwrap();
        assert_eq!(a.len(), spec.nbytes());
        let one = Fill::Dense(1.0).block(Rng::keyed(1, "w").next_u64(), 2, BLOCK, BLOCK);
        assert_eq!(
            &a[2 * 2 * BLOCK..],
            &one[..],
            "block 2 does not depend on blocks 0 and 1"
        );
    }

    /// The bulk fills as first written: one sequential stream of draws per block.
    fn sequential_block(fill: Fill, state: u64, n: usize, cols: usize) -> Vec<u8> {
        let mut rng = Rng::new(state);
        let mut buf = Vec::new();
        match fill {
            Fill::Dense(g) => {
                let a = g * (3.0 / cols as f32).sqrt();
                while buf.len() < 2 * n {
                    for u in two_units(&mut rng) {
                        if buf.len() < 2 * n {
                            buf.extend_from_slice(&half::bf16::from_f32((u * 2.0 - 1.0) * a).to_le_bytes());
                        }
                    }
                }
            }
            Fill::Bytes => {
                while buf.len() < n {
                    let take = (n - buf.len()).min(8);
                    buf.extend_from_slice(&rng.next_u64().to_le_bytes()[..take]);
                }
            }
            Fill::Fp8 => (0..n).for_each(|_| buf.push(fp8_code(rng.next_u64()))),
            Fill::E8m0(e) => (0..n).for_each(|_| buf.push(e - 1 + (rng.next_u64() % 3) as u8)),
            _ => unreachable!(),
        }
        buf
    }

    #[test]
    fn indexed_bulk_fills_equal_the_sequential_streams() {
        for fill in [Fill::Dense(1.5), Fill::Bytes, Fill::Fp8, Fill::E8m0(120)] {
            for n in [0, 1, 2, 7, 8, 9, 1001, 4096] {
                let base = 0x1234_5678_9ABC_DEF0u64;
                let state = base ^ 4u64.wrapping_mul(0xD1B5_4A32_D192_ED03);
                let want = sequential_block(fill, state, n, 96);
                assert_eq!(fill.block(base, 3, n, 96), want, "{fill:?} n={n}");
            }
        }
    }
}
