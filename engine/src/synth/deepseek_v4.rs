//! Synthetic DeepSeek-V4 checkpoints in the published layout (`deepseek_v4`, DeepSeek's names and
//! config spelling): FP4 routed experts (I8 codes with an F8_E8M0 scale per 32), block FP8 with
//! F8_E8M0 `scale` on the attention, indexer query and shared-expert Linears, BF16 compressors,
//! router, embedding and head, F32 hyper-connection parameters, sinks and position biases; and,
//! as V4-Flash ships it, one multi-token-prediction block (`mtp.0.*`, DeepSeek's `MTPBlock`) of
//! the kind the `compress_ratios` entry after the last layer names.

use std::path::Path;

use serde_json::{Value, json};

use super::fill::{Fill, dense, norm, write_shards};
use super::write_byte_tokenizer;
use crate::error::Result;
use crate::weights::{Dtype, TensorSpec, write_atomic};

/// How one Linear's tensors are written.
type Linear = fn(&mut Vec<(TensorSpec, Fill)>, &str, usize, usize);

/// Shape of a synthetic DeepSeek-V4 checkpoint.
#[derive(Debug, Clone)]
pub struct DeepseekV4Synth {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub rope: usize,
    pub q_lora: usize,
    pub o_groups: usize,
    pub o_rank: usize,
    pub window: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// Compressed sparse and heavily compressed attention's ratios.
    pub ratios: (usize, usize),
    pub experts: usize,
    pub top_k: usize,
    pub moe_intermediate: usize,
    pub hash_layers: usize,
    pub hc: usize,
    pub max_position: usize,
    /// Write the MTP block (`mtp.0.*`) after the decoder layers.
    pub mtp: bool,
    pub shards: usize,
    pub seed: u64,
}

impl DeepseekV4Synth {
    /// DeepSeek-V4-Flash's shapes (hidden 4096, 64 heads of 512 with one K=V head, Q-LoRA
    /// 1024, 8 output groups of rank 1024, window 128, the 64 × 128 indexer keeping 512, ratios
    /// 4 and 128, 256 FP4 experts of width 2048, top-6, a shared expert, 3 hash layers, 4
    /// streams), `layers` layers in V4-Flash's published schedule (see [`Self::ratio`]).
    pub fn flash(layers: usize) -> Self {
        DeepseekV4Synth {
            hidden: 4096,
            layers,
            heads: 64,
            head_dim: 512,
            rope: 64,
            q_lora: 1024,
            o_groups: 8,
            o_rank: 1024,
            window: 128,
            index_heads: 64,
            index_head_dim: 128,
            index_topk: 512,
            ratios: (4, 128),
            experts: 256,
            top_k: 6,
            moe_intermediate: 2048,
            hash_layers: 3,
            hc: 4,
            max_position: 65_536,
            mtp: true,
            shards: 4,
            seed: 0xD5F4,
        }
    }

    /// V4-Flash's per-position state shapes with little compute, for context-memory
    /// measurements at long lengths: the published head, indexer-key and rope widths, window,
    /// ratios, top-k and layer schedule (so the attention state per position and per sequence
    /// is V4-Flash's), with hidden 256, 2 heads, 2 index heads and 8 narrow experts.
    pub fn narrow(self) -> Self {
        DeepseekV4Synth {
            hidden: 256,
            heads: 2,
            q_lora: 64,
            o_groups: 2,
            o_rank: 128,
            index_heads: 2,
            experts: 8,
            moe_intermediate: 64,
            ..self
        }
    }

    fn vocab(&self) -> usize {
        512
    }

    /// Layer `l`'s compression ratio as V4-Flash publishes its `compress_ratios`: the first two
    /// layers the sliding window only, then compressed sparse on even and heavily compressed on
    /// odd layers.
    fn ratio(&self, l: usize) -> usize {
        match l {
            // The MTP block (V4-Flash's entry after its last layer: 0).
            l if l >= self.layers => 0,
            0 | 1 => 0,
            l if l % 2 == 0 => self.ratios.0,
            _ => self.ratios.1,
        }
    }

    /// The `config.json` contents, in DeepSeek's spelling.
    pub fn config(&self) -> Value {
        let entries = self.layers + usize::from(self.mtp);
        let ratios: Vec<usize> = (0..entries).map(|l| self.ratio(l)).collect();
        let mut c = json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": self.vocab(),
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "qk_rope_head_dim": self.rope,
            "q_lora_rank": self.q_lora,
            "o_groups": self.o_groups,
            "o_lora_rank": self.o_rank,
            "sliding_window": self.window,
            "index_n_heads": self.index_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "compress_ratios": ratios,
            "compress_rate_csa": self.ratios.0,
            "compress_rate_hca": self.ratios.1,
            "num_hash_layers": self.hash_layers,
            "num_nextn_predict_layers": usize::from(self.mtp),
            "n_routed_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "n_shared_experts": 1,
            "moe_intermediate_size": self.moe_intermediate,
            "scoring_func": "sqrtsoftplus",
            "norm_topk_prob": true,
            "routed_scaling_factor": 1.5,
            "swiglu_limit": 10.0,
            "hc_mult": self.hc,
            "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": self.max_position,
        });
        let rest = json!({
            "rope_theta": 10000.0,
            "compress_rope_theta": 160000.0,
            "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                "beta_fast": 32.0, "beta_slow": 1.0},
            "tie_word_embeddings": false,
            "bos_token_id": 256,
            "eos_token_id": 257,
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                "activation_scheme": "dynamic", "weight_block_size": [128, 128], "expert_dtype": "fp4"},
            "deltafin_synthetic": true,
        });
        if let (Some(map), Value::Object(rest)) = (c.as_object_mut(), rest) {
            map.extend(rest);
        }
        c
    }

    /// An E8M0 exponent giving codes of magnitude up to `top` about `1 / sqrt(cols)` in size.
    fn exponent(cols: usize, top: f32) -> u8 {
        (127.0 - ((cols as f32).sqrt() * top).log2().ceil()) as u8
    }

    fn fp8(t: &mut Vec<(TensorSpec, Fill)>, module: &str, rows: usize, cols: usize) {
        t.push((
            TensorSpec::new(format!("{module}.weight"), Dtype::F8E4M3, &[rows, cols]),
            Fill::Fp8,
        ));
        let scales = [rows.div_ceil(128), cols.div_ceil(128)];
        let spec = TensorSpec::new(format!("{module}.scale"), Dtype::F8E8M0, &scales);
        t.push((spec, Fill::E8m0(Self::exponent(cols, 8.0))));
    }

    fn fp4(t: &mut Vec<(TensorSpec, Fill)>, module: &str, rows: usize, cols: usize) {
        t.push((
            TensorSpec::new(format!("{module}.weight"), Dtype::I8, &[rows, cols / 2]),
            Fill::Bytes,
        ));
        let spec = TensorSpec::new(format!("{module}.scale"), Dtype::F8E8M0, &[rows, cols / 32]);
        t.push((spec, Fill::E8m0(Self::exponent(cols, 6.0))));
    }

    fn f32s(t: &mut Vec<(TensorSpec, Fill)>, name: &str, shape: &[usize], (lo, hi): (f32, f32)) {
        t.push((TensorSpec::new(name, Dtype::F32, shape), Fill::F32Uniform(lo, hi)));
    }

    fn hyper(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (n, h) = (self.hc, self.hidden);
        Self::f32s(t, &format!("{p}_fn"), &[(2 + n) * n, n * h], (-0.01, 0.01));
        Self::f32s(t, &format!("{p}_base"), &[(2 + n) * n], (-0.5, 0.5));
        Self::f32s(t, &format!("{p}_scale"), &[3], (0.5, 1.5));
    }

    /// A window pooler's tensors below `p` (`c` series of `d`).
    fn compressor(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, (c, d, ratio): (usize, usize, usize)) {
        t.push(dense(&format!("{p}.wkv.weight"), c * d, self.hidden, 1.0));
        t.push(dense(&format!("{p}.wgate.weight"), c * d, self.hidden, 1.0));
        Self::f32s(t, &format!("{p}.ape"), &[ratio, c * d], (-0.5, 0.5));
        t.push(norm(&format!("{p}.norm.weight"), d));
    }

    /// Layer `l`'s attention below `p` (`layers.{l}`, or `mtp.0` for the MTP block).
    fn attention(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, l: usize) {
        let (h, hd, a) = (self.hidden, self.head_dim, format!("{p}.attn"));
        Self::fp8(t, &format!("{a}.wq_a"), self.q_lora, h);
        t.push(norm(&format!("{a}.q_norm.weight"), self.q_lora));
        Self::fp8(t, &format!("{a}.wq_b"), self.heads * hd, self.q_lora);
        Self::fp8(t, &format!("{a}.wkv"), hd, h);
        t.push(norm(&format!("{a}.kv_norm.weight"), hd));
        let g = self.o_groups;
        Self::fp8(t, &format!("{a}.wo_a"), g * self.o_rank, self.heads * hd / g);
        Self::fp8(t, &format!("{a}.wo_b"), h, g * self.o_rank);
        Self::f32s(t, &format!("{a}.attn_sink"), &[self.heads], (-0.5, 0.5));
        let ratio = self.ratio(l);
        if ratio == self.ratios.0 {
            self.compressor(t, &format!("{a}.compressor"), (2, hd, ratio));
            let ix = format!("{a}.indexer");
            self.compressor(t, &format!("{ix}.compressor"), (2, self.index_head_dim, ratio));
            Self::fp8(
                t,
                &format!("{ix}.wq_b"),
                self.index_heads * self.index_head_dim,
                self.q_lora,
            );
            t.push(dense(
                &format!("{ix}.weights_proj.weight"),
                self.index_heads,
                h,
                1.0,
            ));
        } else if ratio > 0 {
            self.compressor(t, &format!("{a}.compressor"), (1, hd, ratio));
        }
    }

    fn ffn(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, l: usize) {
        let (h, f) = (self.hidden, format!("{p}.ffn"));
        t.push(dense(&format!("{f}.gate.weight"), self.experts, h, 1.0));
        if l < self.hash_layers.min(self.layers) {
            let spec = TensorSpec::new(
                format!("{f}.gate.tid2eid"),
                Dtype::I32,
                &[self.vocab(), self.top_k],
            );
            t.push((spec, Fill::Ids(self.experts as u32)));
        } else {
            let spec = TensorSpec::new(format!("{f}.gate.bias"), Dtype::F32, &[self.experts]);
            t.push((spec, Fill::SkewedBias(0.0)));
        }
        for e in 0..self.experts {
            self.expert(t, &format!("{f}.experts.{e}"), Self::fp4);
        }
        self.expert(t, &format!("{f}.shared_experts"), Self::fp8);
    }

    fn expert(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, linear: Linear) {
        let (h, w) = (self.hidden, self.moe_intermediate);
        linear(t, &format!("{p}.w1"), w, h);
        linear(t, &format!("{p}.w3"), w, h);
        linear(t, &format!("{p}.w2"), h, w);
    }

    fn tensors(&self) -> Vec<(TensorSpec, Fill)> {
        let (h, v, n) = (self.hidden, self.vocab(), self.hc);
        let mut t = vec![dense("embed.weight", v, h, (h as f32).sqrt())];
        for l in 0..self.layers {
            self.block(&mut t, &format!("layers.{l}"), l);
        }
        t.push(norm("norm.weight", h));
        t.push(dense("head.weight", v, h, 4.0));
        Self::hyper_head(&mut t, "", (n, h));
        if self.mtp {
            self.mtp_block(&mut t);
        }
        t
    }

    /// One decoder block below `p`: its norms, hyper-connections, attention and MoE.
    fn block(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, l: usize) {
        let h = self.hidden;
        t.push(norm(&format!("{p}.attn_norm.weight"), h));
        t.push(norm(&format!("{p}.ffn_norm.weight"), h));
        self.hyper(t, &format!("{p}.hc_attn"));
        self.hyper(t, &format!("{p}.hc_ffn"));
        self.attention(t, p, l);
        self.ffn(t, p, l);
    }

    /// A hyper head (`{p}hc_head_*`) folding `n` streams of width `h`.
    fn hyper_head(t: &mut Vec<(TensorSpec, Fill)>, p: &str, (n, h): (usize, usize)) {
        Self::f32s(t, &format!("{p}hc_head_fn"), &[n, n * h], (-0.01, 0.01));
        Self::f32s(t, &format!("{p}hc_head_base"), &[n], (-0.5, 0.5));
        Self::f32s(t, &format!("{p}hc_head_scale"), &[1], (0.5, 1.5));
    }

    /// DeepSeek's `MTPBlock` as published (`mtp.0.*`): one decoder block (a routed, not hashed,
    /// MoE), `e_proj` / `h_proj` in block FP8, `enorm`, `hnorm`, `norm` and its own hyper head.
    fn mtp_block(&self, t: &mut Vec<(TensorSpec, Fill)>) {
        let h = self.hidden;
        self.block(t, "mtp.0", self.layers);
        Self::fp8(t, "mtp.0.e_proj", h, h);
        Self::fp8(t, "mtp.0.h_proj", h, h);
        for n in ["enorm", "hnorm", "norm"] {
            t.push(norm(&format!("mtp.0.{n}.weight"), h));
        }
        Self::hyper_head(t, "mtp.0.", (self.hc, h));
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors().iter().map(|(t, _)| t.nbytes() as u64).sum()
    }

    /// Bytes of one routed expert.
    pub fn expert_bytes(&self) -> u64 {
        let mut t = Vec::new();
        self.expert(&mut t, "x", Self::fp4);
        t.iter().map(|(t, _)| t.nbytes() as u64).sum()
    }

    /// Write the checkpoint (config, shards, index, tokenizer) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_shards(dir, &self.tensors(), self.shards, self.seed)?;
        write_byte_tokenizer(dir)?;
        let config = serde_json::to_string_pretty(&self.config()).expect("json");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}
