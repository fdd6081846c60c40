//! Per-tensor checksums of an install, `DIR/.deltafin/checksums.json`: the xxh3-64 of every
//! tensor's bytes, per shard file, recorded by `deltafin setup` and `deltafin doctor
//! --write-checksums` from the bytes on disk, and verified on every read from then on (out of
//! core the reader pool checks each completed read against [`ShardSums`]; in memory
//! [`verify_all`] checks every tensor at load). A flipped bit in an expert on a homelab disk, or
//! a same-size file replaced under a running server, becomes a typed error naming the tensor
//! instead of a wrong token.
//!
//! Per tensor (not per read range): the checksums do not depend on how an architecture groups
//! tensors or on the reader's layout, so one file serves every budget. A tensor that stacks a
//! layer's experts in its outer dimension (gpt-oss's `mlp.experts.gate_up_proj_blocks`, fused
//! Qwen experts: a name with `.experts.` not followed by an expert number) is read one expert at
//! a time out of core, so it also has one checksum per outer index ([`stacked_experts`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::safetensors::WeightIndex;
use crate::error::{Error, Result};

/// Format version of the checksums file.
pub const CHECKSUMS_FORMAT: u32 = 1;
/// The one algorithm used.
pub const ALGORITHM: &str = "xxh3-64";

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// One shard's recorded checksums.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardChecksums {
    /// The file's size when they were recorded.
    pub size: u64,
    /// Tensor name -> checksum, 16 hex digits.
    pub tensors: BTreeMap<String, String>,
    /// Stacked-expert tensor name -> the checksum of each outer index's bytes, in order.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slices: BTreeMap<String, Vec<String>>,
}

/// Whether tensor `name` of `shape` stacks experts in its outer dimension: `.experts.` followed
/// by a name, not an expert number, and at least two dimensions.
pub fn stacked_experts(name: &str, shape: &[usize]) -> bool {
    shape.len() >= 2
        && name
            .split_once(".experts.")
            .is_some_and(|(_, rest)| !rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// The checksum of each outer index of a stacked tensor's `bytes` (`outer` equal slices).
fn slice_sums(bytes: &[u8], outer: usize) -> Vec<u64> {
    bytes.chunks(bytes.len() / outer.max(1)).map(checksum).collect()
}

/// The checksums file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checksums {
    pub format: u32,
    pub algorithm: String,
    /// Shard name (relative to the model directory) -> its checksums.
    pub shards: BTreeMap<String, ShardChecksums>,
}

impl Checksums {
    /// Where `dir`'s checksums live.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(".deltafin").join("checksums.json")
    }

    /// Checksum every tensor of `index` from the bytes on disk (all cores).
    pub fn compute(index: &WeightIndex) -> Checksums {
        let mut names: Vec<&str> = index.names().collect();
        names.sort_unstable();
        type Sum = (usize, String, u64, Option<Vec<u64>>);
        let sums: Vec<Sum> = names
            .par_iter()
            .map(|name| {
                let info = index.info(name).expect("listed by the index");
                let blob = index.blob(info);
                let slices = stacked_experts(name, &info.shape).then(|| slice_sums(&blob, info.shape[0]));
                (info.shard, name.to_string(), checksum(&blob), slices)
            })
            .collect();
        let mut shards: BTreeMap<String, ShardChecksums> = BTreeMap::new();
        for (shard, name, sum, slices) in sums {
            let entry = shards
                .entry(index.shard_name(shard).to_string())
                .or_insert_with(|| ShardChecksums {
                    size: index.file_len(shard),
                    tensors: BTreeMap::new(),
                    slices: BTreeMap::new(),
                });
            if let Some(s) = slices {
                entry
                    .slices
                    .insert(name.clone(), s.iter().map(|h| format!("{h:016x}")).collect());
            }
            entry.tensors.insert(name, format!("{sum:016x}"));
        }
        Checksums {
            format: CHECKSUMS_FORMAT,
            algorithm: ALGORITHM.into(),
            shards,
        }
    }

    /// `dir`'s checksums, `Ok(None)` when none were recorded.
    pub fn load(dir: &Path) -> Result<Option<Checksums>> {
        let path = Self::path(dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let sums: Checksums = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        if sums.format != CHECKSUMS_FORMAT || sums.algorithm != ALGORITHM {
            return Err(Error::config(
                &path,
                "format",
                format!(
                    "format {} with {} is not this build's ({CHECKSUMS_FORMAT}, {ALGORITHM}): run `deltafin doctor --write-checksums`",
                    sums.format, sums.algorithm
                ),
            ));
        }
        Ok(Some(sums))
    }

    /// Write atomically (temporary file, fsync, rename).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = Self::path(dir);
        let parent = path.parent().expect("inside .deltafin");
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        super::write_atomic(&path, &serde_json::to_vec(self).expect("serializable"))
    }

    /// The checksums by shard number and file offset for the reader pool. Every tensor of the
    /// index must have one and every shard its recorded size, or the checksums are of another
    /// install: a typed error naming the first difference.
    pub fn for_index(&self, index: &WeightIndex) -> Result<ShardSums> {
        let path = Self::path(index.dir());
        let stale = |reason: String| Error::config(&path, "shards", reason);
        let shards = index.shard_paths().len();
        let mut out: Vec<Vec<TensorSum>> = vec![Vec::new(); shards];
        for shard in 0..shards {
            let name = index.shard_name(shard);
            let recorded = self
                .shards
                .get(name)
                .ok_or_else(|| stale(format!("no checksums for {name}")))?;
            if recorded.size != index.file_len(shard) {
                return Err(stale(format!(
                    "{name} is {} bytes, but its checksums were recorded for {} bytes",
                    index.file_len(shard),
                    recorded.size
                )));
            }
        }
        for name in index.names() {
            let info = index.info(name)?;
            let shard = index.shard_name(info.shard);
            let hex = self.shards[shard]
                .tensors
                .get(name)
                .ok_or_else(|| stale(format!("no checksum for tensor `{name}` in {shard}")))?;
            let hash = u64::from_str_radix(hex, 16)
                .map_err(|_| stale(format!("tensor `{name}`: `{hex}` is not a hex checksum")))?;
            out[info.shard].push(TensorSum {
                offset: info.offset,
                len: info.len,
                hash,
                name: name.into(),
                slice: false,
            });
            if stacked_experts(name, &info.shape) {
                let slices = self.shards[shard].slices.get(name).ok_or_else(|| {
                    stale(format!(
                        "no per-expert checksums for `{name}` in {shard}: run `deltafin doctor --write-checksums`"
                    ))
                })?;
                let outer = info.shape[0].max(1);
                if slices.len() != outer {
                    return Err(stale(format!(
                        "`{name}`: {} slice checksums for {outer} experts",
                        slices.len()
                    )));
                }
                let each = info.len / outer as u64;
                for (i, hex) in slices.iter().enumerate() {
                    let hash = u64::from_str_radix(hex, 16)
                        .map_err(|_| stale(format!("`{name}[{i}]`: `{hex}` is not a hex checksum")))?;
                    out[info.shard].push(TensorSum {
                        offset: info.offset + i as u64 * each,
                        len: each,
                        hash,
                        name: format!("{name}[{i}]").into(),
                        slice: true,
                    });
                }
            }
        }
        for list in &mut out {
            list.sort_unstable_by_key(|t| t.offset);
        }
        Ok(ShardSums(out))
    }
}

/// Whether weight reads are verified against `DIR/.deltafin/checksums.json`
/// ([`Checksums`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChecksumMode {
    /// Verify when the install has checksums.
    #[default]
    Auto,
    /// Verify; an install without checksums is refused.
    Require,
    /// Do not verify (reads are still checked for length and file changes).
    Off,
}

impl std::str::FromStr for ChecksumMode {
    type Err = crate::error::UnknownChoice;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ChecksumMode::Auto),
            "on" => Ok(ChecksumMode::Require),
            "off" => Ok(ChecksumMode::Off),
            _ => Err(crate::error::UnknownChoice {
                what: "weight verification",
                input: s.into(),
                expected: "auto, on, off",
            }),
        }
    }
}

/// Verify every tensor of `index` against the install's checksums as `mode` says (the
/// in-memory load: the whole checkpoint is read once here, and every page of it is then the
/// bytes that were verified). Returns how many tensors were verified (`None`: not verified).
pub fn verify_all(index: &WeightIndex, mode: ChecksumMode) -> Result<Option<usize>> {
    let Some(sums) = load_for(index, mode)? else {
        return Ok(None);
    };
    let sums = sums.for_index(index)?;
    let shards = index.shard_paths();
    sums.0
        .par_iter()
        .enumerate()
        .flat_map(|(shard, list)| list.par_iter().filter(|t| !t.slice).map(move |t| (shard, t)))
        .try_for_each(|(shard, t)| {
            let blob = index.blob(index.info(&t.name)?);
            let actual = checksum(&blob);
            if actual == t.hash {
                return Ok(());
            }
            Err(Error::WeightsUnavailable {
                path: shards[shard].clone(),
                reason: format!(
                    "tensor `{}` does not match its recorded checksum (xxh3-64 {:016x}, read {actual:016x})",
                    t.name, t.hash
                ),
            })
        })?;
    Ok(Some(sums.0.iter().flatten().filter(|t| !t.slice).count()))
}

/// The install's checksums as `mode` wants them: `None` when off or (auto) not recorded; an
/// error when required and not recorded.
pub fn load_for(index: &WeightIndex, mode: ChecksumMode) -> Result<Option<Checksums>> {
    if mode == ChecksumMode::Off {
        return Ok(None);
    }
    match Checksums::load(index.dir())? {
        Some(sums) => Ok(Some(sums)),
        None if mode == ChecksumMode::Require => Err(Error::config(
            Checksums::path(index.dir()),
            "checksums",
            "checksums are required (--verify-weights on) but none were recorded: run `deltafin doctor --write-checksums`",
        )),
        None => Ok(None),
    }
}

/// One tensor's place in its shard and its checksum.
#[derive(Debug, Clone)]
pub struct TensorSum {
    pub offset: u64,
    pub len: u64,
    pub hash: u64,
    pub name: Arc<str>,
    /// One expert's slice of a stacked tensor (`name[i]`), checked out of core; in memory the
    /// whole tensor's checksum covers it.
    pub slice: bool,
}

/// Checksums by shard number, each list sorted by file offset.
#[derive(Debug, Clone, Default)]
pub struct ShardSums(pub Vec<Vec<TensorSum>>);

/// A tensor whose bytes differ from its recorded checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub tensor: String,
    /// The tensor's file range.
    pub range: std::ops::Range<u64>,
    pub expected: u64,
    pub actual: u64,
}

impl ShardSums {
    /// Check every tensor lying wholly inside `bytes`, which hold shard `shard` from file
    /// offset `offset` on (tensors only partly inside are not checked: a layout always reads
    /// its tensors whole). Returns the number checked, or the first mismatch.
    pub fn verify(&self, shard: usize, offset: u64, bytes: &[u8]) -> std::result::Result<usize, Mismatch> {
        let Some(list) = self.0.get(shard) else {
            return Ok(0);
        };
        let end = offset + bytes.len() as u64;
        let first = list.partition_point(|t| t.offset < offset);
        let mut checked = 0;
        for t in list[first..].iter().take_while(|t| t.offset < end) {
            if t.offset + t.len > end {
                continue;
            }
            let at = (t.offset - offset) as usize;
            let actual = checksum(&bytes[at..at + t.len as usize]);
            if actual != t.hash {
                return Err(Mismatch {
                    tensor: t.name.to_string(),
                    range: t.offset..t.offset + t.len,
                    expected: t.hash,
                    actual,
                });
            }
            checked += 1;
        }
        Ok(checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(list: &[(u64, &[u8], &str)]) -> ShardSums {
        ShardSums(vec![
            list.iter()
                .map(|&(offset, bytes, name)| TensorSum {
                    offset,
                    len: bytes.len() as u64,
                    hash: checksum(bytes),
                    name: name.into(),
                    slice: false,
                })
                .collect(),
        ])
    }

    #[test]
    fn stacked_expert_tensors_are_named_by_the_convention() {
        assert!(stacked_experts(
            "model.layers.0.mlp.experts.gate_up_proj_blocks",
            &[8, 64, 2, 16]
        ));
        assert!(stacked_experts(
            "model.layers.0.mlp.experts.down_proj_bias",
            &[8, 64]
        ));
        assert!(stacked_experts(
            "model.language_model.layers.3.mlp.experts.gate_up_proj",
            &[4, 8, 2]
        ));
        assert!(!stacked_experts(
            "model.layers.0.mlp.experts.3.up_proj.weight",
            &[32, 64]
        ));
        assert!(!stacked_experts(
            "model.layers.0.block_sparse_moe.experts.5.w1.weight",
            &[32, 64]
        ));
        assert!(!stacked_experts("model.layers.0.mlp.experts.e_bias", &[8]));
        assert!(!stacked_experts("model.layers.0.mlp.gate.weight", &[8, 64]));
        let bytes: Vec<u8> = (0..40).collect();
        let s = slice_sums(&bytes, 4);
        assert_eq!(
            s,
            vec![
                checksum(&bytes[..10]),
                checksum(&bytes[10..20]),
                checksum(&bytes[20..30]),
                checksum(&bytes[30..])
            ]
        );
    }

    #[test]
    fn verifies_whole_tensors_inside_a_range_and_names_a_mismatch() {
        let file: Vec<u8> = (0..100u8).collect();
        let s = sums(&[
            (10, &file[10..30], "a"),
            (30, &file[30..60], "b"),
            (70, &file[70..90], "c"),
        ]);
        // A range holding a and b wholly, c partly: two checked.
        assert_eq!(s.verify(0, 8, &file[8..80]), Ok(2));
        assert_eq!(s.verify(0, 0, &file), Ok(3));
        assert_eq!(s.verify(1, 0, &file), Ok(0), "a shard without checksums");
        let mut bad = file.clone();
        bad[45] ^= 1;
        let m = s.verify(0, 0, &bad).unwrap_err();
        assert_eq!(m.tensor, "b");
        assert_eq!(m.expected, checksum(&file[30..60]));
        assert_ne!(m.actual, m.expected);
    }
}
