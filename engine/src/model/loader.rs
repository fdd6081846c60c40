//! Turning checkpoint tensors into typed weights: a Linear in whichever stored format the
//! checkpoint uses (decided per tensor from its dtype and companion tensors, checked against the
//! quantisation config), norm vectors, and embedding tables. Every shape is checked here.
//!
//! Bytes come from the index's memory maps unless a [`BlobSource`] is given (the out-of-core
//! stores build the same layers over resident buffers, streamed arenas and cache slots), and
//! an architecture skips its routed experts when [`Loader::routed_experts`] is false (they are
//! then served by an expert provider instead).

use crate::config::{Checkpoint, Quantization};
use crate::error::{Error, Result};
use crate::kernels::{Format, Matrix, ScaleDtype};
use crate::weights::{Blob, BlobSource, Dtype, MappedSource, TensorInfo, WeightIndex};

/// How a checkpoint stores an RMSNorm's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormWeight {
    /// The norm multiplies by `w`.
    #[default]
    Plain,
    /// Zero-centred: the norm multiplies by `1 + w`, computed in f32 as HF does (Qwen3-Next,
    /// Qwen3.5 `Qwen3NextRMSNorm`).
    Centred,
}

/// Typed access to one checkpoint's tensors.
#[derive(Clone, Copy)]
pub struct Loader<'a> {
    pub index: &'a WeightIndex,
    prefix: &'a str,
    /// Inserted after a name's leading `model.` (see `Checkpoint::model_infix`).
    infix: &'a str,
    quant: &'a Quantization,
    source: &'a dyn BlobSource,
    routed_experts: bool,
    /// `(from, to)`: a name starting with `from` is read as `to` plus the rest, verbatim (a
    /// module published under its own root, e.g. Qwen3.5's `mtp.layers.0.` read as a decoder
    /// layer `model.layers.{L}.`).
    rename: Option<(&'a str, &'a str)>,
    /// How the checkpoint spells the names the layers ask for (HF's).
    naming: Naming,
}

/// A checkpoint's tensor naming: the layers ask for HF's names, and a family published under
/// its own names translates them here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Naming {
    /// HF's names, as asked.
    #[default]
    Hf,
    /// DeepSeek-V4's published names ([`super::names::deepseek_v4`]).
    DeepSeekV4,
}

impl std::fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("dir", &self.index.dir())
            .field("routed_experts", &self.routed_experts)
            .finish()
    }
}

impl<'a> Loader<'a> {
    pub fn new(index: &'a WeightIndex, spec: &'a Checkpoint) -> Self {
        Loader {
            infix: &spec.model_infix,
            ..Self::with_layout(index, &spec.tensor_prefix, &spec.quant)
        }
    }

    /// A loader for a checkpoint that is not a target model (a draft head): tensor names carry
    /// `prefix`, quantised Linears follow `quant`.
    pub fn with_layout(index: &'a WeightIndex, prefix: &'a str, quant: &'a Quantization) -> Self {
        Loader {
            index,
            prefix,
            infix: "",
            quant,
            source: &MappedSource,
            routed_experts: true,
            rename: None,
            naming: Naming::Hf,
        }
    }

    /// The same loader reading names that start with `from` as `to` plus the rest, verbatim.
    pub fn with_rename(self, from: &'a str, to: &'a str) -> Self {
        Loader {
            rename: Some((from, to)),
            ..self
        }
    }

    /// The same loader translating names with `naming`.
    pub fn with_naming(self, naming: Naming) -> Self {
        Loader { naming, ..self }
    }

    /// The same loader taking tensor bytes from `source`.
    pub fn with_source(self, source: &'a dyn BlobSource) -> Self {
        Loader { source, ..self }
    }

    /// The same loader, told whether layers should load their routed experts.
    pub fn with_routed_experts(self, routed_experts: bool) -> Self {
        Loader {
            routed_experts,
            ..self
        }
    }

    /// Whether architectures should load routed experts into their layers (false when an
    /// expert provider serves them).
    pub fn routed_experts(&self) -> bool {
        self.routed_experts
    }

    fn blob(&self, info: &TensorInfo) -> Result<Blob> {
        self.source.blob(self.index, info)
    }

    fn name(&self, name: &str) -> String {
        let translated;
        let name = match self.naming {
            Naming::Hf => name,
            Naming::DeepSeekV4 => {
                translated = super::names::deepseek_v4(name);
                translated.as_str()
            }
        };
        if let Some((from, to)) = self.rename
            && let Some(rest) = name.strip_prefix(from)
        {
            return format!("{to}{rest}");
        }
        match name.strip_prefix("model.") {
            Some(rest) if !self.infix.is_empty() => format!("{}model.{}{rest}", self.prefix, self.infix),
            _ => format!("{}{name}", self.prefix),
        }
    }

    /// Whether `{prefix}{name}` exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains(&self.name(name))
    }

    /// A 1-D float vector (norm weights, biases) widened to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self
            .index
            .expect(&self.name(name), &[Dtype::F32, Dtype::BF16, Dtype::F16], &[len])?;
        Ok(WeightIndex::decode_f32(info, &self.blob(info)?))
    }

    /// A float tensor of exactly `shape` (e.g. `[C, 1, K]` conv weights) widened to f32.
    /// Like every tensor, its bytes come from the loader's source (so out-of-core layouts
    /// record and serve it).
    pub fn floats(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let info = self
            .index
            .expect(&self.name(name), &[Dtype::F32, Dtype::BF16, Dtype::F16], shape)?;
        Ok(WeightIndex::decode_f32(info, &self.blob(info)?))
    }

    /// An integer table `[rows, cols]` (I32 or I64) of ids below `limit`, e.g. DeepSeek-V4's
    /// hash-routing `tid2eid` (token id → expert ids).
    pub fn id_table(&self, name: &str, (rows, cols): (usize, usize), limit: usize) -> Result<Vec<u32>> {
        let full = self.name(name);
        let info = self
            .index
            .expect(&full, &[Dtype::I32, Dtype::I64], &[rows, cols])?;
        let blob = self.blob(info)?;
        if self.source.records_only() {
            return Ok(vec![0; rows * cols]); // recorded for the read layout only
        }
        let ids = decode_ints(info.dtype, &blob);
        match ids.iter().position(|&v| v < 0 || v as usize >= limit) {
            None => Ok(ids.into_iter().map(|v| v as u32).collect()),
            Some(i) => Err(Error::TensorDtype {
                path: self.index.shard_path(info).to_path_buf(),
                name: full,
                expected: format!("ids below {limit}"),
                found: format!("{} at row {}", ids[i], i / cols.max(1)),
            }),
        }
    }

    /// A float tensor of any shape, with its stored shape (for weights that broadcast).
    pub fn floats_any_shape(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let shape = self.index.info(&self.name(name))?.shape.clone();
        Ok((shape.clone(), self.floats(name, &shape)?))
    }

    /// The shard path holding `name` (for error messages).
    pub fn path_of(&self, name: &str) -> std::path::PathBuf {
        let full = self.name(name);
        self.index
            .info(&full)
            .map(|i| self.index.shard_path(i).to_path_buf())
            .unwrap_or_default()
    }

    /// `name` with the checkpoint's tensor prefix (for error messages).
    pub fn full_name(&self, name: &str) -> String {
        self.name(name)
    }

    /// A plain (unquantised) BF16/F32 matrix, e.g. embeddings and routers.
    pub fn dense(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let full = self.name(name);
        let info = self
            .index
            .expect(&full, &[Dtype::BF16, Dtype::F32], &[rows, cols])?;
        let format = if info.dtype == Dtype::BF16 {
            Format::Bf16
        } else {
            Format::F32
        };
        Matrix::new(format, rows, cols, self.blob(info)?, None)
    }

    /// Expert `e`'s slice of a tensor stacked over `experts` in its outermost dimension, whose
    /// remaining dimensions are `inner`: the same tensor narrowed to that expert's bytes (so an
    /// out-of-core layout records and reads only them).
    fn expert_slice(
        &self,
        name: &str,
        dtypes: &[Dtype],
        experts: usize,
        e: usize,
        inner: &[usize],
    ) -> Result<TensorInfo> {
        let full = self.name(name);
        let shape: Vec<usize> = std::iter::once(experts).chain(inner.iter().copied()).collect();
        let info = self.index.expect(&full, dtypes, &shape)?;
        let each = info.len / experts as u64;
        Ok(TensorInfo {
            shape: inner.to_vec(),
            offset: info.offset + e as u64 * each,
            len: each,
            ..info.clone()
        })
    }

    /// Expert `e`'s `[rows, cols]` MXFP4 matrix from gpt-oss's stacked `{name}_blocks`
    /// (`U8 [experts, rows, cols / 32, 16]`, two E2M1 values per byte, low nibble first) and
    /// `{name}_scales` (`U8 [experts, rows, cols / 32]`, E8M0), used as stored: that is exactly
    /// [`Format::Mxfp4`] with groups of 32.
    pub fn stacked_mxfp4(
        &self,
        name: &str,
        experts: usize,
        e: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        const GROUP: usize = 32;
        let blocks = self.name(&format!("{name}_blocks"));
        if !cols.is_multiple_of(GROUP) {
            return Err(self.unexpected(&blocks, &format!("in-features {cols} not divisible by 32")));
        }
        let data = self.expert_slice(
            &format!("{name}_blocks"),
            &[Dtype::U8],
            experts,
            e,
            &[rows, cols / GROUP, GROUP / 2],
        )?;
        let scales = self.expert_slice(
            &format!("{name}_scales"),
            &[Dtype::U8],
            experts,
            e,
            &[rows, cols / GROUP],
        )?;
        let format = Format::Mxfp4 { group: GROUP };
        Matrix::new(format, rows, cols, self.blob(&data)?, Some(self.blob(&scales)?))
    }

    /// Rows `rows` of expert `e`'s `[total_rows, cols]` matrix in a BF16/F32 tensor stacked
    /// `[experts, total_rows, cols]` (HF's fused `experts.gate_up_proj` / `experts.down_proj`),
    /// as stored: the tensor narrowed to those rows' bytes.
    pub fn stacked_dense(
        &self,
        name: &str,
        (experts, e): (usize, usize),
        (total_rows, cols): (usize, usize),
        rows: std::ops::Range<usize>,
    ) -> Result<Matrix> {
        let info = self.expert_slice(name, &[Dtype::BF16, Dtype::F32], experts, e, &[total_rows, cols])?;
        let row_bytes = (cols * info.dtype.size()) as u64;
        let part = TensorInfo {
            shape: vec![rows.len(), cols],
            offset: info.offset + rows.start as u64 * row_bytes,
            len: rows.len() as u64 * row_bytes,
            ..info.clone()
        };
        let format = if part.dtype == Dtype::BF16 {
            Format::Bf16
        } else {
            Format::F32
        };
        Matrix::new(format, rows.len(), cols, self.blob(&part)?, None)
    }

    /// An RMSNorm weight of `len` values in the form the norm multiplies by.
    pub fn norm(&self, name: &str, len: usize, form: NormWeight) -> Result<Vec<f32>> {
        let mut w = self.vector(name, len)?;
        if form == NormWeight::Centred {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        Ok(w)
    }

    /// Row `e` of a float tensor `[experts, len]` (per-expert biases) widened to f32.
    pub fn stacked_vector(&self, name: &str, experts: usize, e: usize, len: usize) -> Result<Vec<f32>> {
        let dtypes = [Dtype::F32, Dtype::BF16, Dtype::F16];
        let info = self.expert_slice(name, &dtypes, experts, e, &[len])?;
        Ok(WeightIndex::decode_f32(&info, &self.blob(&info)?))
    }

    /// The Linear `module` (`out x in`) in its stored format.
    pub fn linear(&self, module: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let packed = self.name(&format!("{module}.weight_packed"));
        if self.index.contains(&packed) {
            return self.packed(module, &packed, rows, cols);
        }
        let weight = self.name(&format!("{module}.weight"));
        if self.index.info(&weight).is_ok_and(|i| i.dtype == Dtype::I8) {
            return self.fp4(module, &weight, rows, cols);
        }
        let info = self
            .index
            .expect(&weight, &[Dtype::BF16, Dtype::F32, Dtype::F8E4M3], &[rows, cols])?;
        match info.dtype {
            Dtype::F8E4M3 => {
                let Quantization::Fp8Block {
                    block_rows,
                    block_cols,
                } = *self.quant
                else {
                    return Err(self.unexpected(
                        &weight,
                        "F8_E4M3 weights need quantization_config.quant_method fp8",
                    ));
                };
                let scale_name = self.scale_name(module);
                let scale_shape = [rows.div_ceil(block_rows), cols.div_ceil(block_cols)];
                let scale_dtypes = [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8E8M0];
                let scale = self.index.expect(&scale_name, &scale_dtypes, &scale_shape)?;
                let format = Format::Fp8Block {
                    block_rows,
                    block_cols,
                };
                Matrix::new(format, rows, cols, self.blob(info)?, Some(self.f32_blob(scale)?))
            }
            Dtype::BF16 => Matrix::new(Format::Bf16, rows, cols, self.blob(info)?, None),
            _ => Matrix::new(Format::F32, rows, cols, self.blob(info)?, None),
        }
    }

    /// A block scale's name: HF's `weight_scale_inv`, or DeepSeek's `scale` (V4's published
    /// checkpoints, UE8M0).
    fn scale_name(&self, module: &str) -> String {
        let hf = self.name(&format!("{module}.weight_scale_inv"));
        let deepseek = self.name(&format!("{module}.scale"));
        // Neither: the error names the spelling the checkpoint's naming uses.
        let published = self.index.contains(&deepseek) || self.naming == Naming::DeepSeekV4;
        match self.index.contains(&hf) || !published {
            true => hf,
            false => deepseek,
        }
    }

    /// DeepSeek-V4's FP4 Linear: `weight` `I8 [out, in/2]`, two E2M1 values per byte (low nibble
    /// the even column), and `scale` `F8_E8M0 [out, in/32]`: byte for byte [`Format::Mxfp4`]
    /// with groups of 32 (the E8M0 scale read as stored).
    fn fp4(&self, module: &str, weight: &str, rows: usize, cols: usize) -> Result<Matrix> {
        const GROUP: usize = 32;
        if !cols.is_multiple_of(GROUP) {
            return Err(self.unexpected(weight, &format!("in-features {cols} not divisible by 32")));
        }
        let data = self.index.expect(weight, &[Dtype::I8], &[rows, cols / 2])?;
        let scale_name = self.name(&format!("{module}.scale"));
        let scale = self
            .index
            .expect(&scale_name, &[Dtype::F8E8M0, Dtype::U8], &[rows, cols / GROUP])?;
        let format = Format::Mxfp4 { group: GROUP };
        Matrix::new(format, rows, cols, self.blob(data)?, Some(self.blob(scale)?))
    }

    fn packed(&self, module: &str, packed: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let scale_name = self.name(&format!("{module}.weight_scale"));
        match *self.quant {
            Quantization::Int4PackQuantized { group_size, .. } => {
                if !cols.is_multiple_of(group_size) || !group_size.is_multiple_of(8) {
                    return Err(self.unexpected(
                        packed,
                        &format!("in-features {cols} not divisible by group {group_size}"),
                    ));
                }
                let data = self.index.expect(packed, &[Dtype::I32], &[rows, cols / 8])?;
                let scale = self.index.expect(
                    &scale_name,
                    &[Dtype::BF16, Dtype::F16, Dtype::F32],
                    &[rows, cols / group_size],
                )?;
                self.check_weight_shape(module, rows, cols)?;
                let scale_dtype = match scale.dtype {
                    Dtype::BF16 => ScaleDtype::Bf16,
                    Dtype::F16 => ScaleDtype::F16,
                    _ => ScaleDtype::F32,
                };
                let format = Format::Int4Group {
                    group: group_size,
                    scale: scale_dtype,
                };
                Matrix::new(format, rows, cols, self.blob(data)?, Some(self.blob(scale)?))
            }
            Quantization::Mxfp4PackQuantized { group_size, .. } => {
                if !cols.is_multiple_of(group_size) || !group_size.is_multiple_of(2) {
                    return Err(self.unexpected(
                        packed,
                        &format!("in-features {cols} not divisible by group {group_size}"),
                    ));
                }
                let data = self.index.expect(packed, &[Dtype::U8], &[rows, cols / 2])?;
                let scale = self
                    .index
                    .expect(&scale_name, &[Dtype::U8], &[rows, cols / group_size])?;
                let format = Format::Mxfp4 { group: group_size };
                Matrix::new(format, rows, cols, self.blob(data)?, Some(self.blob(scale)?))
            }
            _ => Err(self.unexpected(
                packed,
                "packed weights need a compressed-tensors quantization_config",
            )),
        }
    }

    /// compressed-tensors stores the logical shape beside packed weights; it must agree.
    fn check_weight_shape(&self, module: &str, rows: usize, cols: usize) -> Result<()> {
        let name = self.name(&format!("{module}.weight_shape"));
        if !self.index.contains(&name) {
            return Ok(());
        }
        let info = self.index.expect(&name, &[Dtype::I64, Dtype::I32], &[2])?;
        let blob = self.blob(info)?;
        if self.source.records_only() {
            return Ok(()); // recorded for the read layout; the value is checked when built from it
        }
        let dims = decode_ints(info.dtype, &blob);
        if dims != [rows as i64, cols as i64] {
            return Err(Error::TensorShape {
                path: self.index.shard_path(info).to_path_buf(),
                name: format!("{name} (value)"),
                expected: vec![rows, cols],
                found: dims.iter().map(|&d| d.max(0) as usize).collect(),
            });
        }
        Ok(())
    }

    /// A float tensor's bytes as f32: as stored when F32, else widened (exactly: BF16 and F16
    /// values are all f32 values), as Qwen's FP8 releases store `weight_scale_inv` in BF16.
    fn f32_blob(&self, info: &TensorInfo) -> Result<Blob> {
        let blob = self.blob(info)?;
        if info.dtype == Dtype::F32 {
            return Ok(blob);
        }
        let wide = WeightIndex::decode_f32(info, &blob);
        Ok(Blob::from_vec(
            wide.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ))
    }

    fn unexpected(&self, name: &str, reason: &str) -> Error {
        let path = self
            .index
            .info(name)
            .map(|i| self.index.shard_path(i).to_path_buf())
            .unwrap_or_default();
        Error::TensorDtype {
            path,
            name: name.to_string(),
            expected: reason.to_string(),
            found: "incompatible".into(),
        }
    }
}

/// Little-endian I64 (or, for any other dtype, I32) elements widened to i64.
fn decode_ints(dtype: Dtype, bytes: &[u8]) -> Vec<i64> {
    match dtype {
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
    }
}
