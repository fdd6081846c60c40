//! The safetensors index: parses the header of every `*.safetensors` shard in a model directory
//! (and cross-checks `model.safetensors.index.json` when present), validates every tensor's byte
//! range against its dtype/shape and the file length, and hands out tensors as `Blob`s over a
//! read-only memory map. Nothing is read beyond the headers until a tensor is used.
//!
//! A shard has a *name* (its path relative to the model directory, as `model.safetensors.index.json`
//! and a download manifest know it) and a *path* it is read from. They agree for a plain directory
//! ([`WeightIndex::open`]); a stream install's shards are read from their staged files elsewhere
//! ([`WeightIndex::open_shards`]) until they are complete.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::Deserialize;

use super::{Blob, Dtype};
use crate::error::{Error, Result};

/// Largest header we accept (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Where one tensor lives and what it is.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Full tensor name as in the header.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Index into the shard list.
    pub shard: usize,
    /// Absolute byte offset of the first element in the shard file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

#[derive(Debug)]
struct Shard {
    name: String,
    path: PathBuf,
    map: Arc<Mmap>,
}

/// A shard to index: its name relative to the model directory and the file to read it from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFile {
    pub name: String,
    pub path: PathBuf,
}

/// All tensors of a checkpoint directory.
#[derive(Debug)]
pub struct WeightIndex {
    dir: PathBuf,
    shards: Vec<Shard>,
    tensors: HashMap<String, TensorInfo>,
}

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

impl WeightIndex {
    /// Index every `*.safetensors` file directly inside `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
            .collect();
        files.sort();
        let shards: Vec<ShardFile> = files
            .into_iter()
            .map(|path| ShardFile {
                name: path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                path,
            })
            .collect();
        Self::open_shards(dir, &shards)
    }

    /// Index the model in `dir` whose shards are read from the given files (in this order), e.g.
    /// a stream install's staged shards. `dir` still holds `config.json` and, if any,
    /// `model.safetensors.index.json`, which is checked against the shard *names*.
    pub fn open_shards(dir: &Path, shards: &[ShardFile]) -> Result<Self> {
        if shards.is_empty() {
            return Err(Error::Safetensors {
                path: dir.to_path_buf(),
                reason: "no *.safetensors files".into(),
            });
        }
        let mut index = WeightIndex {
            dir: dir.to_path_buf(),
            shards: Vec::new(),
            tensors: HashMap::new(),
        };
        for s in shards {
            index.add_shard(s.name.clone(), s.path.clone())?;
        }
        index.check_index_json()?;
        Ok(index)
    }

    fn add_shard(&mut self, name: String, path: PathBuf) -> Result<()> {
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        let bad = |reason: String| Error::Safetensors {
            path: path.clone(),
            reason,
        };
        if file_len < 8 {
            return Err(bad(format!(
                "file is {file_len} bytes, shorter than the 8-byte header length"
            )));
        }
        // SAFETY: the map is read-only and private to this process; checkpoint files are treated
        // as immutable while a model is loaded (documented in docs/storage.md). Every access is
        // bounds-checked against the validated header below.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let header_len = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        if header_len > MAX_HEADER_BYTES || header_len > file_len - 8 {
            return Err(bad(format!(
                "header length {header_len} does not fit in a {file_len}-byte file"
            )));
        }
        let header = &map[8..8 + header_len as usize];
        let raw: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(header).map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        for (name, value) in raw {
            if name == "__metadata__" {
                continue;
            }
            let entry: RawEntry =
                serde_json::from_value(value).map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
            let dtype = Dtype::parse(&entry.dtype)
                .ok_or_else(|| bad(format!("tensor `{name}`: unknown dtype `{}`", entry.dtype)))?;
            let [start, end] = entry.data_offsets;
            let numel = entry
                .shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
            let want = numel.and_then(|n| n.checked_mul(dtype.size() as u64));
            if end < start || want != Some(end - start) {
                return Err(bad(format!(
                    "tensor `{name}`: data_offsets {start}..{end} do not match {dtype} {:?}",
                    entry.shape
                )));
            }
            if data_start + end > file_len {
                return Err(Error::Truncated {
                    path,
                    tensor: name,
                    needed: data_start + end,
                    actual: file_len,
                });
            }
            if let Some(prev) = self.tensors.get(&name) {
                let other = &self.shards[prev.shard].path;
                return Err(bad(format!(
                    "tensor `{name}` also appears in {}",
                    other.display()
                )));
            }
            let info = TensorInfo {
                name: name.clone(),
                dtype,
                shape: entry.shape,
                shard,
                offset: data_start + start,
                len: end - start,
            };
            self.tensors.insert(name, info);
        }
        self.shards.push(Shard {
            name,
            path,
            map: Arc::new(map),
        });
        Ok(())
    }

    /// When `model.safetensors.index.json` exists, every shard it names must exist and hold the
    /// tensors it lists (a missing shard is an incomplete download).
    fn check_index_json(&self) -> Result<()> {
        let path = self.dir.join("model.safetensors.index.json");
        let Ok(text) = std::fs::read(&path) else {
            return Ok(());
        };
        let index: IndexJson = serde_json::from_slice(&text).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        for (name, file) in &index.weight_map {
            let Some(info) = self.tensors.get(name) else {
                let shard = self.dir.join(file);
                if !self.shards.iter().any(|s| &s.name == file) {
                    return Err(Error::Safetensors {
                        path: shard,
                        reason: format!("shard listed in {} is missing", path.display()),
                    });
                }
                return Err(Error::MissingTensor {
                    dir: self.dir.clone(),
                    name: name.clone(),
                });
            };
            let actual = &self.shards[info.shard];
            if actual.name != *file {
                return Err(Error::Safetensors {
                    path: path.clone(),
                    reason: format!(
                        "tensor `{name}` is listed in {file} but found in {}",
                        actual.path.display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Metadata of a tensor, or `MissingTensor`.
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            dir: self.dir.clone(),
            name: name.to_string(),
        })
    }

    /// All tensor names (unordered).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Paths of every shard, in shard-number order (`TensorInfo::shard` indexes this list).
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    /// Name of shard `shard` relative to the model directory (`model-00001-of-00002.safetensors`).
    pub fn shard_name(&self, shard: usize) -> &str {
        &self.shards[shard].name
    }

    /// Length in bytes of shard `shard`'s file.
    pub fn file_len(&self, shard: usize) -> u64 {
        self.shards[shard].map.len() as u64
    }

    /// Path of the shard holding a tensor.
    pub fn shard_path(&self, info: &TensorInfo) -> &Path {
        &self.shards[info.shard].path
    }

    /// Metadata of a tensor after checking its shape and that its dtype is one of `dtypes`.
    pub fn expect(&self, name: &str, dtypes: &[Dtype], shape: &[usize]) -> Result<&TensorInfo> {
        let info = self.info(name)?;
        let path = self.shard_path(info).to_path_buf();
        if !dtypes.contains(&info.dtype) {
            let expected = dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(" or ");
            return Err(Error::TensorDtype {
                path,
                name: name.into(),
                expected,
                found: info.dtype.name().into(),
            });
        }
        if info.shape != shape {
            return Err(Error::TensorShape {
                path,
                name: name.into(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        Ok(info)
    }

    /// The bytes of a tensor.
    pub fn blob(&self, info: &TensorInfo) -> Blob {
        let map: Arc<dyn AsRef<[u8]> + Send + Sync> = self.shards[info.shard].map.clone();
        Blob::new(map, info.offset as usize..(info.offset + info.len) as usize)
    }

    /// A small tensor decoded to f32 (F32, BF16 or F16 storage), e.g. norms and biases.
    pub fn f32_vec(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let info = self.expect(name, &[Dtype::F32, Dtype::BF16, Dtype::F16], shape)?;
        Ok(Self::decode_f32(info, &self.blob(info)))
    }

    /// Decode the bytes of a float tensor (F32, BF16 or F16 storage; checked by the caller) to f32.
    pub fn decode_f32(info: &TensorInfo, blob: &[u8]) -> Vec<f32> {
        match info.dtype {
            Dtype::F32 => blob
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::BF16 => blob
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            Dtype::F8E8M0 => blob.iter().map(|&e| ue8m0(e)).collect(),
            _ => blob
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }
}

/// A UE8M0 scale's value: `2^(e - 127)` exactly (`e = 0` is `2^-127`, a subnormal), NaN for
/// `e = 255` (OCP MX).
pub fn ue8m0(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(1 << 22),
        e => f32::from_bits((e as u32) << 23),
    }
}
